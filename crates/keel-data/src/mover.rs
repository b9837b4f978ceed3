//! The mover: takes sealed segments from the fast tier to the colder one
//! their topic uses, within `keel.tier.move.bytes.per.sec`.
//!
//! Each pass, in order:
//! 1. deletes the colder copies the manifests mark `Deleting` (retention,
//!    DeleteRecords, rolled-back copies, cold copies the cleaner replaced:
//!    those `file.delete.delay.ms` after their swap), then forgets them;
//! 2. copies sealed segments without a colder copy, oldest first within a
//!    partition, partitions in turn, one segment at a time: `begin_copy`
//!    (persisted) -> copy and verify (no partition lock held) ->
//!    `finish_copy`, or `abort_copy` on failure;
//! 3. in a cluster, records the partition's copies in the object store in
//!    the coordination store, for the partition's next leader
//!    ([`crate::takeover`]), and forgets a copy there before deleting it;
//! 4. after each copy, deletes local copies that are no longer needed:
//!    past the topic's `local.retention.bytes` / `local.retention.ms`, then,
//!    oldest first across all partitions, while the fast tier holds more
//!    than `keel.tier.fast.max.bytes`; but not a segment a reader is in or
//!    about to read ([`crate::tiering`]), within an allowance over the
//!    budget.
//!
//! Every `keel.tier.orphan.grace.ms` it also sweeps each tier for copies
//! under this cluster's prefix that no manifest names and that are older
//! than that grace: copies of deleted topics, and writes an object store
//! finished after the broker crashed and rolled their copy back. The
//! copies of a partition whose manifest cannot be read (its log is
//! unavailable) are kept, and so are those a cleaning pass has stored but
//! not yet swapped in (`Tiers::hold_uncommitted`), however long storing
//! them took.
//!
//! A partition whose log is unavailable (offline, closed by a shutdown, or
//! deleted during the pass) is left alone for the rest of the pass and the
//! others are moved; passes count such partitions and name them in the log
//! at most once a minute. A failing tier (an object store that does not
//! answer) makes passes back off exponentially, up to a minute; produce and
//! fetch never wait for the mover. A fast tier over its budget with nothing
//! left to release is logged, with the mover's last error, at most once a
//! minute.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keel_cluster::logs::Forget;
use keel_log::{PartitionLog, SealedSegment, Tier};
use keel_tier::IoClass;
use parking_lot::Mutex;

use crate::partition::{Partition, Unavailable};
use crate::plane::DataPlane;
use crate::policy::TierPolicy;
use crate::tiering::{holder, CommittedOffsets, Hold, Mark, OVER_BUDGET_PERCENT, RECENT_MS};
use crate::topics::Topic;

const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Offsets groups committed recently, as readers, by `(topic, partition)`.
type CommitMarks = std::collections::HashMap<(String, i32), Vec<Mark>>;
const WARN_EVERY: Duration = Duration::from_secs(60);

/// The mover's state, shared with stats.
#[derive(Debug)]
pub struct Mover {
    interval: Duration,
    /// `keel.tier.fast.max.bytes` (dynamic).
    fast_max_bytes: AtomicI64,
    /// Local bytes of every partition at the end of the last pass.
    pub fast_bytes: AtomicU64,
    /// Local bytes already copied to a colder tier (releasable).
    pub fast_copied_bytes: AtomicU64,
    pub released_segments: AtomicU64,
    pub released_bytes: AtomicU64,
    pub failed_passes: AtomicU64,
    /// Passes finished, failed ones included.
    pub passes: AtomicU64,
    pub over_budget: AtomicBool,
    pub orphans_deleted: AtomicU64,
    /// Partitions passes left alone because their log was unavailable
    /// (offline, closed or deleted), counted once per pass.
    pub partitions_set_aside: AtomicU64,
    /// Free and total bytes of the fast tier's filesystem at the last pass.
    pub fast_fs_free_bytes: AtomicU64,
    pub fast_fs_total_bytes: AtomicU64,
    backoff_ms: AtomicU64,
    orphan_grace: Duration,
    last_sweep: Mutex<Option<Instant>>,
    last_over_budget_log: Mutex<Option<Instant>>,
    last_fs_full_log: Mutex<Option<Instant>>,
    last_set_aside_log: Mutex<Option<Instant>>,
    /// The group coordinator's committed offsets, once the broker has one:
    /// readers that hold segments ([`crate::tiering`]).
    committed: std::sync::OnceLock<Arc<dyn CommittedOffsets>>,
    /// `keel.tier.reader.window.bytes`.
    reader_window_bytes: AtomicU64,
    /// Their recent commits, when last read.
    commits: Mutex<Option<(Instant, Duration, Arc<CommitMarks>)>>,
    /// Partitions whose oldest local segment the last pass kept for a
    /// reader, and those segments' bytes.
    pub reader_holds: AtomicU64,
    pub reader_held_bytes: AtomicU64,
    /// Segments released although a reader was within reach of them: the
    /// fast tier past its budget by more than the readers' allowance, or
    /// its filesystem low.
    pub reader_hold_overrides: AtomicU64,
}

/// Below this share of free space the fast tier's filesystem is reported as
/// filling up.
const FAST_FS_LOW_FREE: f64 = 0.10;

impl Mover {
    pub fn new(interval: Duration, fast_max_bytes: i64, orphan_grace: Duration) -> Mover {
        Mover {
            orphans_deleted: AtomicU64::new(0),
            partitions_set_aside: AtomicU64::new(0),
            last_set_aside_log: Mutex::new(None),
            fast_fs_free_bytes: AtomicU64::new(0),
            fast_fs_total_bytes: AtomicU64::new(0),
            orphan_grace,
            last_sweep: Mutex::new(None),
            last_fs_full_log: Mutex::new(None),
            interval,
            fast_max_bytes: AtomicI64::new(fast_max_bytes),
            fast_bytes: AtomicU64::new(0),
            fast_copied_bytes: AtomicU64::new(0),
            released_segments: AtomicU64::new(0),
            released_bytes: AtomicU64::new(0),
            failed_passes: AtomicU64::new(0),
            passes: AtomicU64::new(0),
            over_budget: AtomicBool::new(false),
            backoff_ms: AtomicU64::new(0),
            last_over_budget_log: Mutex::new(None),
            committed: std::sync::OnceLock::new(),
            commits: Mutex::new(None),
            reader_window_bytes: AtomicU64::new(crate::tiering::WINDOW_BYTES),
            reader_holds: AtomicU64::new(0),
            reader_held_bytes: AtomicU64::new(0),
            reader_hold_overrides: AtomicU64::new(0),
        }
    }

    /// How far behind a segment a reader may be and still hold it on the
    /// fast tier, and the most a hold keeps (0: readers hold nothing).
    pub fn reader_window_bytes(&self) -> u64 {
        self.reader_window_bytes.load(Ordering::Relaxed)
    }

    /// Sets `keel.tier.reader.window.bytes`, from the next pass on.
    pub fn set_reader_window_bytes(&self, bytes: u64) {
        self.reader_window_bytes.store(bytes, Ordering::Relaxed);
    }

    /// Gives the mover the group coordinator's committed offsets (once;
    /// later calls are ignored).
    pub fn set_committed_offsets(&self, committed: Arc<dyn CommittedOffsets>) {
        let _ = self.committed.set(committed);
    }

    pub fn fast_max_bytes(&self) -> i64 {
        self.fast_max_bytes.load(Ordering::Relaxed)
    }

    /// Takes new budgets (dynamic broker configs); a copy in progress
    /// continues at the new rate.
    pub fn reconfigure(&self, fast_max_bytes: i64) {
        self.fast_max_bytes.store(fast_max_bytes, Ordering::Relaxed);
    }

    /// Current back-off after failures (0 when healthy).
    pub fn backoff_ms(&self) -> u64 {
        self.backoff_ms.load(Ordering::Relaxed)
    }
}

/// Bytes fetches read from segments kept on the fast tier for readers,
/// over every partition: reads the colder tier was spared.
pub fn held_read_bytes(data: &DataPlane) -> u64 {
    data.topics
        .all()
        .iter()
        .flat_map(|t| t.partitions.iter())
        .map(|p| p.held_read_bytes.load(Ordering::Relaxed))
        .sum()
}

/// Runs passes forever (until the runtime stops).
pub async fn run(data: Arc<DataPlane>) {
    let mover = &data.mover;
    let mut backoff = Duration::ZERO;
    loop {
        tokio::time::sleep(mover.interval.max(backoff)).await;
        match pass(&data).await {
            Ok(()) => backoff = Duration::ZERO,
            Err(e) => {
                mover.failed_passes.fetch_add(1, Ordering::Relaxed);
                backoff = (backoff * 2).clamp(Duration::from_secs(1), MAX_BACKOFF);
                tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "tier mover: pass failed");
            }
        }
        mover
            .backoff_ms
            .store(backoff.as_millis() as u64, Ordering::Relaxed);
        mover.passes.fetch_add(1, Ordering::Relaxed);
    }
}

/// One partition with its topic's tier policy.
struct Target {
    topic: Arc<Topic>,
    partition: Arc<Partition>,
    policy: TierPolicy,
    /// Why the partition's log was unavailable during this pass, once it
    /// was: the pass leaves it alone from then on.
    set_aside: Mutex<Option<Unavailable>>,
}

impl Target {
    fn is_set_aside(&self) -> bool {
        self.set_aside.lock().is_some()
    }
}

fn targets(data: &DataPlane) -> Vec<Target> {
    let mut out = Vec::new();
    for topic in data.topics.all() {
        let policy = data.policies.tier_policy(&topic.meta.configs);
        for p in &topic.partitions {
            // In a cluster, a partition's segments are its leader's to move.
            if data.wal.is_some() && p.claimed_epoch().is_none() {
                continue;
            }
            out.push(Target {
                topic: Arc::clone(&topic),
                partition: Arc::clone(p),
                policy,
                set_aside: Mutex::new(None),
            });
        }
    }
    out
}

/// The targets a pass still works on.
fn available(targets: &[Target]) -> impl Iterator<Item = &Target> {
    targets.iter().filter(|t| !t.is_set_aside())
}

/// Why a pass's step on one partition did not happen.
#[derive(Debug)]
enum StepError {
    /// The partition's log is offline, closed or deleted: the pass sets it
    /// aside and goes on with the others.
    Unavailable(Unavailable),
    /// A tier, or the log's own I/O, failed: the pass stops and backs off.
    Failed(std::io::Error),
}

impl From<std::io::Error> for StepError {
    fn from(e: std::io::Error) -> StepError {
        StepError::Failed(e)
    }
}

type StepResult<T> = Result<T, StepError>;

/// A step's outcome for the pass: `None` when the partition was set aside.
fn settle<T>(t: &Target, step: StepResult<T>) -> std::io::Result<Option<T>> {
    match step {
        Ok(v) => Ok(Some(v)),
        Err(StepError::Unavailable(why)) => {
            t.set_aside.lock().get_or_insert(why);
            Ok(None)
        }
        Err(StepError::Failed(e)) => Err(e),
    }
}

/// Runs `f` on a partition's log on a blocking thread (the partition lock
/// may be held by a write, and manifest updates fsync).
async fn on_log<T: Send + 'static>(
    p: &Arc<Partition>,
    f: impl FnOnce(&mut PartitionLog) -> T + Send + 'static,
) -> StepResult<T> {
    let p = Arc::clone(p);
    tokio::task::spawn_blocking(move || p.with_log(f))
        .await
        .map_err(|e| std::io::Error::other(format!("mover task failed: {e}")))?
        .map_err(StepError::Unavailable)
}

/// [`on_log`] for a step that can fail.
async fn try_on_log<T: Send + 'static>(
    p: &Arc<Partition>,
    f: impl FnOnce(&mut PartitionLog) -> std::io::Result<T> + Send + 'static,
) -> StepResult<T> {
    Ok(on_log(p, f).await??)
}

/// One pass now (the background task runs one every
/// `keel.tier.check.interval.ms`).
pub async fn pass(data: &DataPlane) -> std::io::Result<()> {
    let targets = targets(data);
    let result = pass_over(data, &targets).await;
    note_set_aside(data, &targets);
    result
}

async fn pass_over(data: &DataPlane, targets: &[Target]) -> std::io::Result<()> {
    let mut first_error = None;
    // 1. Deletions.
    for t in available(targets) {
        settle(t, delete_marked(data, t, &mut first_error).await)?;
    }
    // 2. Copies, each followed by releases.
    release(data, targets).await?;
    for t in available(targets) {
        // In a cluster, records wait in the WAL until a sealed segment in
        // the object store holds them: an old active segment is rolled.
        if let Some(wal) = &data.wal {
            let age = i64::try_from(wal.settings().segment_roll.as_millis()).unwrap_or(i64::MAX);
            let p = Arc::clone(&t.partition);
            let rolled = tokio::task::spawn_blocking(move || p.roll_if_older(age)).await;
            if let Ok(Err(why)) = rolled {
                tracing::debug!(topic = %t.topic.meta.name, partition = t.partition.index, %why, "tier mover: no roll");
            }
        }
        if let Some(tier) = t.policy.tier.filter(|_| t.policy.copy) {
            settle(t, copy_partition(data, targets, t, tier).await)?;
        } else if t
            .partition
            .keeps_uncopied_snapshots
            .swap(false, Ordering::Relaxed)
        {
            // Copies stopped (remote.log.copy.disable, a tier change): the
            // log keeps only its newest snapshots again.
            settle(
                t,
                on_log(&t.partition, |log| log.keep_snapshots_after(i64::MAX)).await,
            )?;
        }
        // In a cluster, the copies are recorded for the next leader.
        if let Err(why) = crate::takeover::publish_copies(data, &t.partition).await {
            first_error.get_or_insert(std::io::Error::other(why));
        }
    }
    release(data, targets).await?;
    check_fast_space(data);
    let sweep_due = data
        .mover
        .last_sweep
        .lock()
        .is_none_or(|at| at.elapsed() >= data.mover.orphan_grace);
    if sweep_due {
        *data.mover.last_sweep.lock() = Some(Instant::now());
        if let Err(e) = sweep_orphans(data).await {
            first_error.get_or_insert(e);
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Deletes a partition's copies its manifest marks `Deleting`. A tier
/// that fails to delete one is noted in `first_error`, and the others go
/// on.
async fn delete_marked(
    data: &DataPlane,
    t: &Target,
    first_error: &mut Option<std::io::Error>,
) -> StepResult<()> {
    let pending = on_log(&t.partition, |log| log.pending_deletes()).await?;
    for segment in pending {
        if !data.tiers.has(segment.tier) {
            continue; // A tier no longer configured: keep the record.
        }
        // Copies are forgotten in order, so the recorded ones never leave
        // a gap: one that cannot be forgotten stops this partition's.
        match crate::takeover::forget_copy(data, &t.partition, &segment).await {
            Ok(Forget::Gone) => {}
            // Replaced (the cleaner, a tier change) while its records are
            // still in the log: a rebuild may need this copy, so it stays.
            Ok(Forget::Needed) => continue,
            Ok(Forget::Fenced) => break, // another leader's now
            Err(why) => {
                first_error.get_or_insert(std::io::Error::other(why));
                break;
            }
        }
        match data.tiers.delete(&segment).await {
            Ok(()) => {
                let object = segment.object.clone();
                try_on_log(&t.partition, move |log| log.forget_deleted(&object)).await?;
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    Ok(())
}

/// Copies a partition's sealed segments, oldest first, releasing local
/// copies after each.
async fn copy_partition(data: &DataPlane, targets: &[Target], t: &Target, tier: Tier) -> StepResult<()> {
    // In a cluster each copy carries the producer snapshot at its end: the
    // log keeps those of the segments still to copy.
    let snapshots = tier == Tier::Remote && data.wal.is_some();
    let candidates = on_log(&t.partition, move |log| {
        if snapshots {
            log.keep_snapshots_of_uncopied();
        }
        log.copy_candidates()
    })
    .await?;
    t.partition
        .keeps_uncopied_snapshots
        .store(snapshots, Ordering::Relaxed);
    // In a cluster, only what is committed is copied (and so released).
    let ceiling = t.partition.retention_ceiling();
    for segment in candidates.into_iter().take_while(|s| s.next_offset <= ceiling) {
        if !copies_now(data, t) {
            break;
        }
        if let Err(e) = copy_one(data, t, tier, &segment).await {
            if let StepError::Failed(e) = &e {
                tracing::warn!(
                    topic = %t.topic.meta.name, partition = t.partition.index, base_offset = segment.base_offset,
                    tier = tier.name(), error = %e, "tier mover: copy failed"
                );
            }
            return Err(e);
        }
        release(data, targets).await?;
    }
    Ok(())
}

/// Counts the partitions this pass set aside, and names them in the log at
/// most once a minute: an offline partition stays offline until a restart,
/// and every pass meets it again.
fn note_set_aside(data: &DataPlane, targets: &[Target]) {
    let aside: Vec<(&Target, Unavailable)> = targets
        .iter()
        .filter_map(|t| t.set_aside.lock().clone().map(|why| (t, why)))
        .collect();
    let Some((first, why)) = aside.first() else {
        return;
    };
    let mover = &data.mover;
    mover
        .partitions_set_aside
        .fetch_add(aside.len() as u64, Ordering::Relaxed);
    let mut last = mover.last_set_aside_log.lock();
    if last.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
        *last = Some(Instant::now());
        tracing::warn!(
            partitions = aside.len(),
            topic = %first.topic.meta.name,
            partition = first.partition.index,
            reason = %why.0,
            "tier mover: partitions whose log is unavailable (offline, closed or deleted) are left \
             alone; the others are moved"
        );
    }
}

/// Whether the topic's configs, as they are now, still have segments
/// copied: a pass lists its candidates once, and an operator may set
/// `remote.log.copy.disable` or turn the tier off while it copies them.
fn copies_now(data: &DataPlane, t: &Target) -> bool {
    data.topics
        .get(&t.topic.meta.name)
        .filter(|now| now.meta.topic_id == t.topic.meta.topic_id)
        .is_some_and(|now| {
            let policy = data.policies.tier_policy(&now.meta.configs);
            policy.copy && policy.tier == t.policy.tier
        })
}

async fn copy_one(data: &DataPlane, t: &Target, tier: Tier, segment: &SealedSegment) -> StepResult<()> {
    let object = object_name(&data.cluster_id, &t.topic, t.partition.index, segment.base_offset);
    let (s, o) = (segment.clone(), object.clone());
    match on_log(&t.partition, move |log| log.begin_copy(&s, tier, o)).await? {
        Ok(_) => {}
        // Retention or DeleteRecords removed it since the candidates were listed.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    let mut copied = data
        .tiers
        .copy(tier, segment, &object, data.io.budget(IoClass::TierMove))
        .await;
    if copied.is_ok() && tier == Tier::Remote && data.wal.is_some() {
        copied = put_producer_snapshot(data, t, segment, &object).await;
    }
    let o = object.clone();
    match copied {
        Ok(()) => {
            let kept = try_on_log(&t.partition, move |log| log.finish_copy(&o)).await?;
            tracing::debug!(object = %object, kept, "tier mover: copied");
            Ok(())
        }
        Err(e) => {
            // A partition gone meanwhile rolls its `copying` entry back at
            // start-up, or has no manifest left: the copy is an orphan.
            match on_log(&t.partition, move |log| log.abort_copy(&o)).await {
                Ok(aborted) => aborted?,
                Err(StepError::Unavailable(_)) => {}
                Err(StepError::Failed(e)) => return Err(e.into()),
            }
            Err(e.into())
        }
    }
}

/// Puts the producer-state snapshot at the segment's end beside its copy
/// in the object store (`<object>.snapshot`), for a leader that rebuilds
/// the partition from there ([`crate::takeover`]). None if neither the log
/// nor a replaced copy has it (the rebuilt state then comes from the WAL
/// alone).
async fn put_producer_snapshot(
    data: &DataPlane,
    t: &Target,
    segment: &SealedSegment,
    object: &str,
) -> std::io::Result<()> {
    match producer_snapshot(data, &t.partition, segment.next_offset, object).await? {
        Some(bytes) => data.tiers.put_remote(&format!("{object}.snapshot"), bytes).await,
        None => Ok(()),
    }
}

/// The producer-state snapshot at `end`, for the copy `object` of a
/// segment ending there: the log's own (written when the segment ending
/// there rolled), or else the one beside another copy in the object store
/// that ends there. A cleaned segment ends where the last segment it
/// replaces ends, and a log rebuilt from the object store has no local
/// snapshots of the copies it started from.
pub(crate) async fn producer_snapshot(
    data: &DataPlane,
    partition: &Arc<Partition>,
    end: i64,
    object: &str,
) -> std::io::Result<Option<bytes::Bytes>> {
    // The roll queued the snapshot after the segment's seal: run what is
    // queued, so a segment sealed a moment ago has its snapshot written.
    let read = move |log: &mut PartitionLog| {
        log.complete_seals()?;
        log.read_producer_snapshot(end)
    };
    match on_log(partition, read).await {
        Ok(read) => {
            if let Some(bytes) = read? {
                return Ok(Some(bytes.into()));
            }
        }
        Err(StepError::Unavailable(why)) => return Err(std::io::Error::other(why.0)),
        Err(StepError::Failed(e)) => return Err(e),
    }
    let others = partition
        .reader()
        .map(|r| r.tiered_segments())
        .unwrap_or_default();
    for other in others
        .iter()
        .filter(|o| o.tier == Tier::Remote && o.next_offset == end && o.object != object)
    {
        if let Some(bytes) = data
            .tiers
            .get_remote(&format!("{}.snapshot", other.object))
            .await?
        {
            return Ok(Some(bytes));
        }
    }
    Ok(None)
}

/// `<cluster id>/<topic>-<topic id>/<partition>/<base offset>-<random>`:
/// independent of local paths, never reused (a retried copy gets a new
/// name), and under the cluster's own prefix, so clusters sharing a bucket
/// never touch each other's copies.
pub fn object_name(cluster_id: &str, topic: &Topic, partition: i32, base_offset: i64) -> String {
    format!(
        "{}{base_offset:020}-{}",
        partition_prefix(cluster_id, topic, partition),
        uuid::Uuid::new_v4().simple()
    )
}

/// The prefix of every copy of one partition's segments.
fn partition_prefix(cluster_id: &str, topic: &Topic, partition: i32) -> String {
    format!(
        "{cluster_id}/{}-{}/{partition}/",
        topic.meta.name,
        topic.meta.topic_id.simple()
    )
}

/// The readers of each target's partition that may hold its segments:
/// fetch positions seen and group commits made in the last
/// [`RECENT_MS`].
fn reader_marks(data: &DataPlane, targets: &[Target], now_ms: i64) -> Vec<Arc<[Mark]>> {
    let commits = recent_commits(&data.mover, now_ms);
    targets
        .iter()
        .map(|t| {
            let fetches = t
                .partition
                .readers
                .positions()
                .into_iter()
                .filter(|p| now_ms - p.at_ms <= RECENT_MS)
                .map(|p| Mark {
                    who: format!("{} {}:{}", p.reader.client_id, p.reader.address, p.reader.port),
                    offset: p.offset,
                });
            let key = (t.topic.meta.name.to_string(), t.partition.index);
            let groups = commits.get(&key).into_iter().flatten().cloned();
            fetches.chain(groups).collect()
        })
        .collect()
}

/// Reading the groups' commits walks every group's offsets: when that
/// took longer than [`COMMITS_SLOW`], what it read serves the passes of
/// the next [`COMMITS_FRESH`].
const COMMITS_SLOW: Duration = Duration::from_millis(1);
const COMMITS_FRESH: Duration = Duration::from_secs(10);

/// The groups' recent commits by `(topic, partition)`.
fn recent_commits(mover: &Mover, now_ms: i64) -> Arc<CommitMarks> {
    let mut cached = mover.commits.lock();
    if let Some((at, took, marks)) = &*cached {
        if *took >= COMMITS_SLOW && at.elapsed() < COMMITS_FRESH {
            return Arc::clone(marks);
        }
    }
    let started = Instant::now();
    let mut marks = CommitMarks::new();
    for c in mover
        .committed
        .get()
        .map(|c| c.committed_since(now_ms - RECENT_MS))
        .unwrap_or_default()
    {
        marks.entry((c.topic, c.partition)).or_default().push(Mark {
            who: format!("group {}", c.group),
            offset: c.offset,
        });
    }
    let marks = Arc::new(marks);
    *cached = Some((started, started.elapsed(), Arc::clone(&marks)));
    marks
}

/// A partition's local segments that may go, oldest first (`(base, next,
/// bytes, max timestamp)`).
type Releasable = Vec<(i64, i64, u64, i64)>;

/// The hold on `segments[i..n]` (the stretch releasing would have taken)
/// if a reader is within `window` bytes of `segments[i]` and the stretch is
/// at most `window`: a reader stuck in place holds no more than that.
fn hold_from(segments: &Releasable, i: usize, n: usize, marks: &[Mark], window: u64) -> Option<Hold> {
    let (base, next, size, _) = *segments.get(i)?;
    let kept = &segments[i..n.max(i + 1).min(segments.len())];
    let kept_bytes: u64 = kept.iter().map(|s| s.2).sum();
    if window == 0 || kept_bytes > window {
        return None;
    }
    let reader = holder(base, next, size, marks, window)?;
    Some(Hold {
        base_offset: base,
        next_offset: kept.last().map_or(next, |s| s.1),
        size_bytes: kept_bytes,
        holder: reader.clone(),
    })
}

/// When readers may hold segments: the fast tier within
/// `keel.tier.fast.max.bytes` and the share over it
/// ([`OVER_BUDGET_PERCENT`]), and its filesystem not low.
#[derive(Debug, Clone, Copy)]
struct Allowance {
    /// `keel.tier.reader.window.bytes` (0: readers hold nothing).
    window: u64,
    /// The budget with its share over it (`None`: no budget).
    cap: Option<u64>,
    /// The most all holds together keep: half the fast tier's free space,
    /// and without a budget also a tenth of its filesystem.
    held_cap: Option<u64>,
    /// The fast tier's filesystem under [`HOLD_MIN_FREE`] free.
    space_low: bool,
}

/// Below this share of free space on the fast tier's filesystem, readers
/// hold nothing.
const HOLD_MIN_FREE: f64 = 0.05;

impl Allowance {
    fn of(data: &DataPlane) -> Allowance {
        let mover = &data.mover;
        Allowance::from_parts(
            mover.reader_window_bytes(),
            mover.fast_max_bytes(),
            mover.fast_fs_free_bytes.load(Ordering::Relaxed),
            mover.fast_fs_total_bytes.load(Ordering::Relaxed),
        )
    }

    /// From the window, the fast budget (-1: none) and the fast tier's
    /// filesystem's free and total bytes (0: unknown).
    fn from_parts(window: u64, budget: i64, free: u64, total: u64) -> Allowance {
        let known = total > 0;
        Allowance {
            window,
            cap: u64::try_from(budget).ok().map(with_allowance),
            held_cap: known.then(|| {
                let share = if budget < 0 {
                    total / 100 * OVER_BUDGET_PERCENT
                } else {
                    u64::MAX
                };
                (free / 2).min(share)
            }),
            space_low: known && (free as f64) < HOLD_MIN_FREE * total as f64,
        }
    }

    /// Whether readers may hold segments with the fast tier at `fast`
    /// bytes and holds keeping `held` bytes in all.
    fn holds(&self, fast: u64, held: u64) -> bool {
        !self.space_low
            && self.cap.is_none_or(|cap| fast <= cap)
            && self.held_cap.is_none_or(|cap| held <= cap)
    }
}

/// What a release step decided for one partition.
#[derive(Debug, Default)]
struct Released {
    count: u64,
    bytes: u64,
    /// Segments released although a reader was within reach.
    overrides: u64,
    held: Option<Hold>,
}

/// Deletes local copies no longer needed (see the module docs), except
/// the segments readers are about to read ([`crate::tiering`]).
async fn release(data: &DataPlane, targets: &[Target]) -> std::io::Result<()> {
    let now = data.clock.now_ms();
    let allowance = Allowance::of(data);
    let marks = if allowance.window > 0 {
        reader_marks(data, targets, now)
    } else {
        vec![Arc::from([]); targets.len()]
    };
    let mut fast = sum_over(targets, |log| log.size_bytes()).await?;
    let mut holds: Vec<Option<Hold>> = vec![None; targets.len()];
    let mut held = 0;
    for (i, t) in targets.iter().enumerate() {
        let Some(r) = release_past_retention(t, Arc::clone(&marks[i]), allowance, (fast, held), now).await?
        else {
            continue;
        };
        held += r.held.as_ref().map_or(0, |h| h.size_bytes);
        note_released(data, (r.count, r.bytes));
        fast = fast.saturating_sub(r.bytes);
        data.mover
            .reader_hold_overrides
            .fetch_add(r.overrides, Ordering::Relaxed);
        holds[i] = r.held;
    }
    fast = release_over_budget(data, targets, &marks, (allowance, held), fast, &mut holds).await?;
    let (mut count, mut bytes) = (0, 0);
    for (t, hold) in targets.iter().zip(holds) {
        if let Some(h) = &hold {
            count += 1;
            bytes += h.size_bytes;
        }
        t.partition.set_tier_hold(hold);
    }
    data.mover.reader_holds.store(count, Ordering::Relaxed);
    data.mover.reader_held_bytes.store(bytes, Ordering::Relaxed);
    finish_release(data, targets, fast, bytes).await
}

/// A partition's local retention: its oldest segments past
/// `local.retention.bytes` / `local.retention.ms` go, up to the first a
/// reader is about to read while readers may hold. `None`: the partition
/// was set aside.
async fn release_past_retention(
    t: &Target,
    marks: Arc<[Mark]>,
    allowance: Allowance,
    (fast, held): (u64, u64),
    now: i64,
) -> std::io::Result<Option<Released>> {
    let policy = t.policy;
    if t.is_set_aside() || (policy.local_retention_bytes < 0 && policy.local_retention_ms < 0) {
        return Ok(None);
    }
    let released = try_on_log(&t.partition, move |log| {
        let segments = log.releasable_segments(u64::MAX);
        let mut size = log.size_bytes();
        let past = segments
            .iter()
            .take_while(|(_, _, bytes, max_ts)| {
                let over_bytes = policy.local_retention_bytes >= 0
                    && size.saturating_sub(*bytes) as i64 >= policy.local_retention_bytes;
                let too_old = policy.local_retention_ms >= 0
                    && *max_ts >= 0
                    && now - *max_ts > policy.local_retention_ms;
                size = size.saturating_sub(*bytes);
                over_bytes || too_old
            })
            .count();
        let mut r = Released::default();
        for k in 0..past {
            if let Some(hold) = hold_from(&segments, k, past, &marks, allowance.window) {
                if allowance.holds(fast.saturating_sub(r.bytes), held + hold.size_bytes) {
                    r.held = Some(hold);
                    break;
                }
                r.overrides += 1;
            }
            r.bytes += log.release_local(segments[k].0)?;
            r.count += 1;
        }
        Ok(r)
    })
    .await;
    settle(t, released)
}

/// The fast tier's budget: oldest first across partitions while it is
/// over, passing over the segments readers hold while they may. Returns
/// the fast tier's bytes after.
async fn release_over_budget(
    data: &DataPlane,
    targets: &[Target],
    marks: &[Arc<[Mark]>],
    (allowance, held): (Allowance, u64),
    mut fast: u64,
    holds: &mut [Option<Hold>],
) -> std::io::Result<u64> {
    let Ok(budget) = u64::try_from(data.mover.fast_max_bytes()) else {
        return Ok(fast);
    };
    while fast > budget {
        let excess = fast - budget;
        let mut oldest: Option<(usize, i64, i64)> = None;
        let mut oldest_held: Option<(usize, i64, i64, Hold)> = None;
        for (i, t) in targets.iter().enumerate() {
            if t.is_set_aside() {
                continue;
            }
            let m = Arc::clone(&marks[i]);
            let first = settle(
                t,
                on_log(&t.partition, move |log| {
                    // The stretch the budget would take from this
                    // partition alone.
                    let segments = log.releasable_segments(excess);
                    let n = segments.len();
                    segments
                        .first()
                        .map(|s| (s.0, s.3, hold_from(&segments, 0, n, &m, allowance.window)))
                })
                .await,
            )?;
            let Some(Some((base, max_ts, held))) = first else {
                continue;
            };
            match held {
                None if oldest.is_none_or(|(_, _, ts)| max_ts < ts) => oldest = Some((i, base, max_ts)),
                Some(hold) if oldest_held.as_ref().is_none_or(|(_, _, ts, _)| max_ts < *ts) => {
                    oldest_held = Some((i, base, max_ts, hold));
                }
                _ => {}
            }
        }
        let (i, base) = match (oldest, oldest_held) {
            (Some((i, base, _)), held) => {
                if let Some((j, .., hold)) = held {
                    holds[j] = Some(hold);
                }
                (i, base)
            }
            (None, Some((j, base, _, hold))) => {
                if allowance.holds(fast, held) {
                    holds[j] = Some(hold);
                    break;
                }
                data.mover.reader_hold_overrides.fetch_add(1, Ordering::Relaxed);
                holds[j] = None;
                (j, base)
            }
            (None, None) => break,
        };
        let t = &targets[i];
        // Set aside meanwhile: look again without it.
        let Some(freed) = settle(
            t,
            try_on_log(&t.partition, move |log| log.release_local(base)).await,
        )?
        else {
            continue;
        };
        note_released(data, (1, freed));
        fast = fast.saturating_sub(freed);
    }
    Ok(fast)
}

/// Records what the fast tier holds after a release, and says when it is
/// over its budget with nothing to release (`held`: bytes readers hold,
/// which may take it over).
async fn finish_release(data: &DataPlane, targets: &[Target], fast: u64, held: u64) -> std::io::Result<()> {
    let budget = data.mover.fast_max_bytes();
    let copied = sum_over(targets, |log| log.local_copied_bytes()).await?;
    let mover = &data.mover;
    mover.fast_bytes.store(fast, Ordering::Relaxed);
    mover.fast_copied_bytes.store(copied, Ordering::Relaxed);
    // Held segments may take the fast tier over its budget, within their
    // allowance: that alone is not a fast tier over budget.
    let over = u64::try_from(budget).is_ok_and(|b| fast.saturating_sub(held) > b || fast > with_allowance(b));
    mover.over_budget.store(over, Ordering::Relaxed);
    // Copies are what make room: the I/O governor keeps them a higher floor.
    data.io.set_urgent(keel_tier::IoClass::TierMove, over);
    if over {
        let mut last = mover.last_over_budget_log.lock();
        if last.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
            *last = Some(Instant::now());
            tracing::warn!(
                fast_bytes = fast,
                budget_bytes = budget,
                last_error = data.tiers.stats().last_error.unwrap_or_default(),
                "fast tier over keel.tier.fast.max.bytes and nothing copied left to release: \
                 segments are waiting to be copied to a colder tier (or no colder tier applies)"
            );
        }
    }
    Ok(())
}

fn note_released(data: &DataPlane, (count, bytes): (u64, u64)) {
    if count > 0 {
        data.mover.released_segments.fetch_add(count, Ordering::Relaxed);
        data.mover.released_bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// The sum of `f` over the partitions still available (an unavailable log's
/// bytes are not known).
async fn sum_over(targets: &[Target], f: fn(&PartitionLog) -> u64) -> std::io::Result<u64> {
    let mut total = 0;
    for t in available(targets) {
        total += settle(t, on_log(&t.partition, move |log| f(log)).await)?.unwrap_or(0);
    }
    Ok(total)
}

/// Deletes copies under this cluster's prefix that no manifest names and
/// that are older than the grace (see the module docs). A partition whose
/// manifest cannot be read now (its log is unavailable) keeps all its
/// copies.
async fn sweep_orphans(data: &DataPlane) -> std::io::Result<()> {
    for tier in [Tier::Capacity, Tier::Remote] {
        if !data.tiers.has(tier) {
            continue;
        }
        let listed = data.tiers.list_copies(tier, &data.cluster_id).await?;
        if listed.is_empty() {
            continue;
        }
        // Read after listing: a copy begun meanwhile is in its manifest, or
        // younger than the grace.
        let mut known = std::collections::HashSet::new();
        let mut unread = Vec::new();
        let held = targets(data);
        for t in &held {
            let names = on_log(&t.partition, move |log| {
                log.tiered_segments()
                    .iter()
                    .filter(|s| s.tier == tier)
                    .map(|s| s.object.clone())
                    .collect::<Vec<_>>()
            })
            .await;
            match names {
                Ok(names) => known.extend(names),
                Err(StepError::Unavailable(_)) => {
                    unread.push(partition_prefix(&data.cluster_id, &t.topic, t.partition.index));
                }
                Err(StepError::Failed(e)) => return Err(e),
            }
        }
        // In a cluster, the copies of partitions other brokers lead are
        // theirs to sweep.
        let mine: Option<Vec<String>> = data.wal.is_some().then(|| {
            held.iter()
                .map(|t| partition_prefix(&data.cluster_id, &t.topic, t.partition.index))
                .collect()
        });
        let grace_ms = data.mover.orphan_grace.as_millis() as u64;
        for (object, age_ms) in listed {
            let others = mine
                .as_ref()
                .is_some_and(|mine| !mine.iter().any(|prefix| object.starts_with(prefix.as_str())));
            if known.contains(&object)
                || age_ms < grace_ms
                || others
                || unread.iter().any(|prefix| object.starts_with(prefix.as_str()))
            {
                continue;
            }
            tracing::info!(tier = tier.name(), object = %object, age_ms, "deleting a copy no manifest names");
            data.tiers.delete_orphan(tier, &object).await?;
            data.mover.orphans_deleted.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// The fast tier's budget with the share over it readers may hold.
fn with_allowance(budget: u64) -> u64 {
    budget.saturating_add(budget / 100 * OVER_BUDGET_PERCENT)
}

/// Records the fast tier's free space and says so, at most once a minute,
/// when it runs low while segments wait to move.
fn check_fast_space(data: &DataPlane) {
    let Some((free, total)) = keel_tier::filesystem_space(&data.data_dir) else {
        return;
    };
    let mover = &data.mover;
    mover.fast_fs_free_bytes.store(free, Ordering::Relaxed);
    mover.fast_fs_total_bytes.store(total, Ordering::Relaxed);
    if total == 0 || (free as f64) >= FAST_FS_LOW_FREE * total as f64 {
        return;
    }
    let mut last = mover.last_fs_full_log.lock();
    if last.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
        *last = Some(Instant::now());
        tracing::warn!(
            dir = %data.data_dir.display(),
            free_bytes = free,
            total_bytes = total,
            fast_bytes = mover.fast_bytes.load(Ordering::Relaxed),
            releasable_bytes = mover.fast_copied_bytes.load(Ordering::Relaxed),
            mover_backoff_ms = mover.backoff_ms(),
            last_error = data.tiers.stats().last_error.unwrap_or_default(),
            "fast tier filesystem below 10% free: produce fails when it is full; \
             check that the mover is copying (keel stats) or lower keel.tier.fast.max.bytes"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: u64 = crate::tiering::WINDOW_BYTES;

    #[test]
    fn a_hold_keeps_the_stretch_release_would_take_and_no_more_than_a_window() {
        // Four 256 MiB segments of 1,000 offsets each; a reader in the
        // second.
        let seg = 256u64 << 20;
        let segments: Releasable = (0..4).map(|i| (i * 1000, (i + 1) * 1000, seg, 0)).collect();
        let marks = [Mark {
            who: "group g".into(),
            offset: 1500,
        }];
        // The first segment is passed: nothing holds it.
        assert_eq!(hold_from(&segments, 0, 3, &marks, W), None);
        // From the second, the stretch releasing would take (to the third).
        let hold = hold_from(&segments, 1, 3, &marks, W).expect("held");
        assert_eq!(
            (hold.base_offset, hold.next_offset, hold.size_bytes),
            (1000, 3000, 2 * seg)
        );
        assert_eq!(hold.holder.who, "group g");
        // A stretch of more than a window is not held: a stuck reader does
        // not keep the fast tier growing.
        let big: Releasable = (0..6).map(|i| (i * 1000, (i + 1) * 1000, seg, 0)).collect();
        assert_eq!(hold_from(&big, 1, 6, &marks, W), None);
        assert!(
            hold_from(&big, 1, 5, &marks, W).is_some(),
            "exactly a window is held"
        );
    }

    #[test]
    fn readers_may_hold_within_a_tenth_over_the_budget_and_not_when_space_is_low() {
        let allowance = |cap, held_cap, space_low| Allowance {
            window: W,
            cap,
            held_cap,
            space_low,
        };
        let within = allowance(Some(with_allowance(1000)), None, false);
        assert!(within.holds(1100, 1100) && !within.holds(1101, 0));
        assert!(allowance(None, None, false).holds(u64::MAX, u64::MAX));
        assert!(!allowance(None, None, true).holds(0, 0));
        // Without a budget, all holds together keep a tenth of the disk and
        // half of what is free, whichever is less; nothing under 5 % free.
        let unbudgeted = Allowance::from_parts(W, -1, 300, 1000);
        assert!(unbudgeted.holds(u64::MAX, 100) && !unbudgeted.holds(0, 101));
        assert!(Allowance::from_parts(W, -1, 120, 1000).holds(0, 60));
        assert!(!Allowance::from_parts(W, -1, 120, 1000).holds(0, 61));
        assert!(!Allowance::from_parts(W, -1, 49, 1000).holds(0, 0));
        // With one, the budget's tenth over it; an unknown filesystem does
        // not stop holds.
        let budgeted = Allowance::from_parts(W, 1000, 0, 0);
        assert!(budgeted.holds(1100, u64::MAX) && !budgeted.holds(1101, 0));
        assert_eq!(with_allowance(u64::MAX), u64::MAX);
    }
}
