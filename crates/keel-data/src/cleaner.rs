//! The log cleaner: compacts the partitions of topics whose
//! `cleanup.policy` includes `compact` (the passes themselves are
//! `keel_log::clean`).
//!
//! `log.cleaner.threads` threads of their own, at the bulk threads' lower
//! CPU priority, each with an equal part of `log.cleaner.dedupe.buffer.size`
//! for its key map (allocated for a pass, sized to what the pass can use,
//! and given back after it). Each round a thread assesses every compacted
//! partition no other thread is cleaning and runs one pass on the one that
//! needs it most: any partition with a dirty record older than
//! `max.compaction.lag.ms` first, then the highest dirty ratio at or above
//! `min.cleanable.dirty.ratio`, as Kafka's cleaner chooses. With nothing to
//! clean it sleeps `log.cleaner.backoff.ms`.
//!
//! A pass reads and writes without the partition's writer lock, paced by
//! `log.cleaner.io.max.bytes.per.second` (every byte read is drawn from that
//! budget), reading around the page cache; only the swap of each cleaned
//! group takes the lock, briefly. What each partition's passes did, and why
//! a partition is not cleanable, is kept for `/stats`.
//!
//! The settings but `log.cleaner.enable` are dynamic broker configs, as in
//! Kafka: a new budget reaches a pass in progress; more threads start at
//! once, and threads beyond a smaller count stop after their current pass;
//! each thread sizes its key map again before its next pass.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use keel_log::clean::{ColdSegments, KeyMap, PassOptions, PassStats};
use keel_log::{SealedSegment, Tier, TierState, TieredSegment};
use keel_tier::IoClass;
use parking_lot::Mutex;

use crate::cleaning::Cleaning;
use crate::partition::Partition;
use crate::plane::DataPlane;
use crate::policy::CleanerSettings;
use crate::topics::Topic;

/// How often a sleeping thread checks whether the broker is stopping.
const STOP_CHECK: Duration = Duration::from_millis(100);

/// How long, at least, a partition whose pass failed on a colder tier
/// waits before the next (`log.cleaner.backoff.ms` if that is longer).
const TIER_RETRY: Duration = Duration::from_secs(1);

/// The cleaner's shared state and broker-wide counters.
#[derive(Debug)]
pub struct Cleaner {
    settings: Mutex<CleanerSettings>,
    /// Which thread slots have a thread running (thread `i` stops when
    /// `i` is no longer below `log.cleaner.threads`).
    running: Mutex<Vec<bool>>,
    /// Where passes wait for their budget; set when the threads start.
    runtime: OnceLock<tokio::runtime::Handle>,
    stopping: AtomicBool,
    /// Partitions a thread is cleaning (by address), so no two threads
    /// clean one partition.
    busy: Mutex<Vec<usize>>,
    pub passes: AtomicU64,
    pub failed_passes: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub bytes_reclaimed: AtomicU64,
    pub records_removed: AtomicU64,
    /// Time passes waited for the I/O budget.
    pub throttled_us: AtomicU64,
}

impl Cleaner {
    pub fn new(settings: CleanerSettings) -> Cleaner {
        Cleaner {
            settings: Mutex::new(settings),
            running: Mutex::new(Vec::new()),
            runtime: OnceLock::new(),
            stopping: AtomicBool::new(false),
            busy: Mutex::new(Vec::new()),
            passes: AtomicU64::new(0),
            failed_passes: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            bytes_reclaimed: AtomicU64::new(0),
            records_removed: AtomicU64::new(0),
            throttled_us: AtomicU64::new(0),
        }
    }

    /// The settings in force.
    pub fn settings(&self) -> CleanerSettings {
        self.settings.lock().clone()
    }

    /// The key-map budget of one thread.
    pub fn map_bytes_per_thread(&self) -> usize {
        let s = self.settings.lock();
        s.dedupe_buffer_bytes / s.threads.max(1)
    }

    /// Stops the threads after their current pass.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    pub fn to_json(&self) -> serde_json::Value {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let s = self.settings();
        serde_json::json!({
            "enabled": s.enabled,
            "threads": s.threads,
            "threads_running": self.running.lock().iter().filter(|on| **on).count(),
            "dedupe_buffer_bytes": s.dedupe_buffer_bytes,
            "map_keys_per_thread": KeyMap::with_budget(self.map_bytes_per_thread()).budget_entries(),
            "io_bytes_per_sec": s.io_bytes_per_sec,
            "passes": load(&self.passes),
            "failed_passes": load(&self.failed_passes),
            "bytes_read": load(&self.bytes_read),
            "bytes_written": load(&self.bytes_written),
            "bytes_reclaimed": load(&self.bytes_reclaimed),
            "records_removed": load(&self.records_removed),
            "throttled_ms": load(&self.throttled_us) / 1000,
        })
    }
}

/// Starts the cleaner threads (none if `log.cleaner.enable=false`). Call
/// from within the runtime: passes wait for their I/O budget on it.
pub fn spawn(data: &Arc<DataPlane>) {
    let cleaner = &data.cleaner;
    if !cleaner.settings().enabled {
        tracing::info!("log cleaner disabled (log.cleaner.enable=false)");
        return;
    }
    let _ = cleaner.runtime.set(tokio::runtime::Handle::current());
    start_threads(data);
}

/// Takes new settings (dynamic broker configs): the budget at once, the
/// thread count and key-map size from each thread's next pass.
/// `log.cleaner.enable` stays as the broker started.
pub fn reconfigure(data: &Arc<DataPlane>, mut settings: CleanerSettings) {
    let cleaner = &data.cleaner;
    data.io.set_budget(IoClass::Cleaning, settings.io_bytes_per_sec);
    {
        let mut current = cleaner.settings.lock();
        settings.enabled = current.enabled;
        *current = settings;
    }
    start_threads(data);
}

/// Starts a thread in every slot below `log.cleaner.threads` that has none.
fn start_threads(data: &Arc<DataPlane>) {
    let cleaner = &data.cleaner;
    let settings = cleaner.settings();
    let Some(runtime) = cleaner.runtime.get() else {
        return;
    };
    if !settings.enabled {
        return;
    }
    let mut running = cleaner.running.lock();
    if running.len() < settings.threads {
        running.resize(settings.threads, false);
    }
    for (slot, on) in running.iter_mut().enumerate().take(settings.threads) {
        if *on {
            continue;
        }
        let weak = Arc::downgrade(data);
        let runtime = runtime.clone();
        let spawned = std::thread::Builder::new()
            .name("keel-cleaner".into())
            .spawn(move || {
                keel_tier::priority::lower_pool_thread("cleaner", slot == 0);
                run(&weak, &runtime, slot);
            });
        match spawned {
            Ok(_) => *on = true,
            Err(e) => tracing::error!(error = %e, "cannot start a log cleaner thread"),
        }
    }
}

fn run(data: &Weak<DataPlane>, runtime: &tokio::runtime::Handle, slot: usize) {
    // The key map and the budget it was made for.
    let mut map: Option<(usize, KeyMap)> = None;
    loop {
        let Some(b) = data.upgrade() else { return };
        if b.cleaner.stopping.load(Ordering::Relaxed) {
            return;
        }
        {
            let mut running = b.cleaner.running.lock();
            if slot >= b.cleaner.settings().threads {
                running[slot] = false;
                tracing::info!(slot, "log cleaner thread stopped (log.cleaner.threads lowered)");
                return;
            }
        }
        let budget = b.cleaner.map_bytes_per_thread();
        let map = match &mut map {
            Some((made_for, m)) if *made_for == budget => m,
            _ => &mut map.insert((budget, KeyMap::with_budget(budget))).1,
        };
        let cleaned = clean_neediest(&b, map, runtime);
        map.release();
        let backoff = Duration::from_millis(b.cleaner.settings().backoff_ms);
        drop(b);
        if !cleaned {
            let until = Instant::now() + backoff;
            while Instant::now() < until {
                std::thread::sleep(STOP_CHECK.min(until.saturating_duration_since(Instant::now())));
                match data.upgrade() {
                    Some(b) if !b.cleaner.stopping.load(Ordering::Relaxed) => {}
                    _ => return,
                }
            }
        }
    }
}

/// A partition chosen for a pass.
struct Candidate {
    partition: Arc<Partition>,
    source: keel_log::clean::CleanSource,
    /// The pass's way to the colder tiers, if it has one.
    cold: Option<Arc<ColdAccess>>,
    options: PassOptions,
    /// Overdue logs first, then by dirty ratio.
    score: f64,
}

/// Assesses every compacted partition and runs one pass on the one that
/// needs it most. Returns whether a pass ran.
fn clean_neediest(data: &Arc<DataPlane>, map: &mut KeyMap, runtime: &tokio::runtime::Handle) -> bool {
    let cleaner = &data.cleaner;
    let now = data.clock.now_ms();
    let mut best: Option<Candidate> = None;
    for topic in data.topics.all() {
        let settings = match data.policies.compaction(&topic.meta.configs) {
            Ok(c) if c.enabled => c,
            _ => continue,
        };
        let options = PassOptions {
            now_ms: now,
            min_compaction_lag_ms: settings.min_compaction_lag_ms,
            max_compaction_lag_ms: settings.max_compaction_lag_ms,
            min_cleanable_dirty_ratio: settings.min_cleanable_dirty_ratio,
            delete_retention_ms: settings.delete_retention_ms,
        };
        for p in &topic.partitions {
            let resting = {
                let c = p.cleaning.lock();
                c.uncleanable || c.retry_at_ms.is_some_and(|at| now < at)
            };
            if resting || p.unavailable().is_some() || cleaner.busy.lock().contains(&key(p)) {
                continue;
            }
            // In a cluster, a partition's log is its leader's to clean: its
            // copies in the object store are recorded for the next leader.
            if data.wal.is_some() && p.claimed_epoch().is_none() {
                continue;
            }
            // Read before the log's view: it only grows, so every segment
            // below it is settled in the view the pass reads.
            let stable = p.last_stable_offset();
            let Ok(source) = p.with_log(|log| log.clean_source()) else {
                continue;
            };
            let mut source = source
                .with_read_window(cleaner.settings().io_buffer_bytes)
                .with_stable_end(stable);
            let mut cold = None;
            if data.tiers.has(Tier::Capacity) || data.tiers.has(Tier::Remote) {
                let access = ColdAccess::new(data, runtime, &topic, p.index);
                source = source.with_cold(Arc::clone(&access) as Arc<dyn ColdSegments>);
                cold = Some(access);
            }
            match source.assess(&options) {
                Ok(Ok(a)) => {
                    p.cleaning.lock().assessed(&a);
                    let score = if a.overdue {
                        1.0 + a.dirty_ratio
                    } else {
                        a.dirty_ratio
                    };
                    if best.as_ref().is_none_or(|b| score > b.score) {
                        best = Some(Candidate {
                            partition: Arc::clone(p),
                            source,
                            cold,
                            options,
                            score,
                        });
                    }
                }
                Ok(Err(skip)) => p.cleaning.lock().skipped(&skip),
                Err(e) => {
                    let mut c = p.cleaning.lock();
                    c.not_cleanable = Some(format!("cannot read the log: {e}"));
                    c.last_error = Some(e.to_string());
                }
            }
        }
    }
    let Some(chosen) = best else { return false };
    let id = key(&chosen.partition);
    {
        let mut busy = cleaner.busy.lock();
        if busy.contains(&id) {
            return true; // Another thread took it meanwhile; look again.
        }
        busy.push(id);
    }
    pass(data, map, runtime, chosen);
    cleaner.busy.lock().retain(|b| *b != id);
    true
}

/// A pass's way to the colder tiers (the capacity tier, and in a cluster
/// the object store): reads through the tiers, and a cleaned group stored
/// as a new copy, paced by the cleaner's budget.
pub struct ColdAccess {
    data: Arc<DataPlane>,
    runtime: tokio::runtime::Handle,
    topic: Arc<Topic>,
    partition: i32,
    /// The copies this pass stored, kept from the orphan sweep: no
    /// manifest names one until its swap. The pass owns this (through its
    /// `CleanSource`) and drops it when it ends, after the swap or the
    /// discard of each.
    stored: Mutex<Vec<keel_tier::UncommittedCopy>>,
    /// Whether one of its reads or writes of a colder tier failed.
    failed: AtomicBool,
}

impl ColdAccess {
    pub fn new(
        data: &Arc<DataPlane>,
        runtime: &tokio::runtime::Handle,
        topic: &Arc<Topic>,
        partition: i32,
    ) -> Arc<ColdAccess> {
        Arc::new(ColdAccess {
            data: Arc::clone(data),
            runtime: runtime.clone(),
            topic: Arc::clone(topic),
            partition,
            stored: Mutex::new(Vec::new()),
            failed: AtomicBool::new(false),
        })
    }

    /// Whether a read or write of a colder tier failed (a pass that fails
    /// so is tried again later: an object store may answer again).
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Notes a failed tier operation in `failed`.
    fn noted<T>(&self, result: std::io::Result<T>) -> std::io::Result<T> {
        if result.is_err() {
            self.failed.store(true, Ordering::Relaxed);
        }
        result
    }
}

impl ColdSegments for ColdAccess {
    fn positions(&self, segment: &TieredSegment) -> std::io::Result<Vec<u32>> {
        self.noted(self.data.tiers.positions_blocking(segment))
    }

    fn read(&self, segment: &TieredSegment, pos: u64, len: u64) -> std::io::Result<Bytes> {
        self.noted(self.data.tiers.read_range_blocking(segment, pos, len))
    }

    fn store(&self, tier: Tier, segment: &SealedSegment) -> std::io::Result<TieredSegment> {
        let b = &self.data;
        let object =
            crate::mover::object_name(&b.cluster_id, &self.topic, self.partition, segment.base_offset);
        self.stored.lock().push(b.tiers.hold_uncommitted(&object));
        let stored = self.runtime.block_on(async {
            b.tiers
                .copy(tier, segment, &object, b.io.budget(IoClass::Cleaning))
                .await?;
            // In a cluster, a leader rebuilding the log from the object
            // store starts its producer state from the last copy's
            // snapshot: the cleaned copy carries the one at its end.
            if tier == Tier::Remote && b.wal.is_some() {
                let partition = self
                    .topic
                    .partitions
                    .get(self.partition as usize)
                    .ok_or_else(|| std::io::Error::other("the partition is gone"))?;
                let end = segment.next_offset;
                if let Some(bytes) = crate::mover::producer_snapshot(b, partition, end, &object).await? {
                    b.tiers.put_remote(&format!("{object}.snapshot"), bytes).await?;
                }
            }
            std::io::Result::Ok(())
        });
        self.noted(stored)?;
        Ok(segment.tiered(tier, TierState::Cold, object))
    }

    fn discard(&self, segment: &TieredSegment) -> std::io::Result<()> {
        self.noted(self.runtime.block_on(self.data.tiers.delete(segment)))
    }
}

fn key(p: &Arc<Partition>) -> usize {
    Arc::as_ptr(p) as usize
}

fn pass(data: &DataPlane, map: &mut KeyMap, runtime: &tokio::runtime::Handle, c: Candidate) {
    let cleaner = &data.cleaner;
    let p = &c.partition;
    let started = Instant::now();
    let mut budget = |bytes: u64| {
        let waited = runtime.block_on(data.io.budget(IoClass::Cleaning).take(bytes));
        cleaner
            .throttled_us
            .fetch_add(waited.as_micros() as u64, Ordering::Relaxed);
    };
    let mut commit = |group: keel_log::clean::CleanedGroup| {
        let end = group.next_offset();
        // The shared scans forget what they read below `end` before the
        // swap as well as after it (`forget_cached_below`): no fetch joins
        // data from both sides of it.
        p.forget_scanned_below(end);
        // Deleted (or offline) meanwhile: there is no log to swap into, and
        // the pass ends as one whose log changed.
        let Ok(swapped) = p.with_log(|log| log.commit_cleaned(group)) else {
            return Ok(false);
        };
        let swapped = swapped?;
        if swapped {
            p.forget_cached_below(end);
        }
        Ok(swapped)
    };
    let source = c.source.with_producers(p.producer_last_offsets());
    let outcome = source.clean(map, &c.options, &mut budget, &mut commit);
    let elapsed = started.elapsed();
    let mut cleaning = p.cleaning.lock();
    match outcome {
        Ok(Ok(stats)) => {
            record(cleaner, &mut cleaning, &stats, map.budget_entries());
            cleaning.last_pass_ms = Some(data.clock.now_ms());
            cleaning.last_pass_duration_ms = elapsed.as_millis() as u64;
            tracing::info!(
                topic = %p.topic, partition = p.index,
                reclaimed_bytes = stats.bytes_reclaimed, removed_records = stats.records_removed,
                read_bytes = stats.bytes_read, map_keys = stats.map_entries,
                map_start = stats.map_start, map_end = stats.map_end,
                clean_end = stats.checkpoint.clean_end, took_ms = elapsed.as_millis() as u64,
                "cleaned"
            );
        }
        Ok(Err(skip)) => cleaning.skipped(&skip),
        Err(e) if c.cold.as_ref().is_some_and(|cold| cold.failed()) => {
            cleaner.failed_passes.fetch_add(1, Ordering::Relaxed);
            cleaning.failed_passes += 1;
            cleaning.last_error = Some(e.to_string());
            let wait = TIER_RETRY.max(Duration::from_millis(cleaner.settings().backoff_ms));
            let at = data.clock.now_ms() + i64::try_from(wait.as_millis()).unwrap_or(i64::MAX);
            cleaning.retry_at_ms = Some(at);
            cleaning.not_cleanable = Some(format!("a colder tier failed; cleaning again in {wait:?}: {e}"));
            tracing::warn!(
                topic = %p.topic, partition = p.index, error = %e, retry_in_ms = wait.as_millis() as u64,
                "cleaning pass failed on a colder tier; trying again later"
            );
        }
        Err(e) => {
            cleaner.failed_passes.fetch_add(1, Ordering::Relaxed);
            cleaning.failed_passes += 1;
            cleaning.last_error = Some(e.to_string());
            cleaning.uncleanable = true;
            cleaning.not_cleanable = Some(format!("uncleanable until restart: a pass failed: {e}"));
            tracing::warn!(
                topic = %p.topic, partition = p.index, error = %e,
                "cleaning pass failed; the partition is uncleanable until restart"
            );
        }
    }
}

fn record(cleaner: &Cleaner, cleaning: &mut Cleaning, stats: &PassStats, map_capacity: usize) {
    let add = |counter: &AtomicU64, n: u64| counter.fetch_add(n, Ordering::Relaxed);
    add(&cleaner.passes, 1);
    add(&cleaner.bytes_read, stats.bytes_read);
    add(&cleaner.bytes_written, stats.bytes_written);
    add(&cleaner.bytes_reclaimed, stats.bytes_reclaimed);
    add(&cleaner.records_removed, stats.records_removed);
    cleaning.passes += 1;
    cleaning.bytes_read += stats.bytes_read;
    cleaning.bytes_written += stats.bytes_written;
    cleaning.bytes_reclaimed += stats.bytes_reclaimed;
    cleaning.records_removed += stats.records_removed;
    cleaning.dirty_ratio = stats.dirty_ratio;
    cleaning.map_keys = stats.map_entries as u64;
    cleaning.map_fill = if map_capacity == 0 {
        0.0
    } else {
        stats.map_entries as f64 / map_capacity as f64
    };
    cleaning.clean_end = Some(stats.checkpoint.clean_end);
    cleaning.not_cleanable = None;
}
