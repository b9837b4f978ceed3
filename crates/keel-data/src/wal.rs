//! The broker's write-ahead log in the object store, in a cluster.
//!
//! Partitions hand every group of batches they write (after the local
//! write) to the broker's one [`Wal`]. While no object is being written or
//! committed it writes them at once; else it gathers them for
//! `keel.cluster.wal.linger.ms` or until `keel.cluster.wal.object.bytes`,
//! writes them as one object, `<cluster id>/wal/<node.id>/<run>-<n>.wal`
//! (the batches as the partitions' logs hold them, one partition's run
//! after another), then commits it in the coordination store
//! ([`keel_cluster::logs`]): the object's index and each partition's new
//! high watermark, in one transaction that every partition's claim and the
//! broker's session guard. Only then do the partitions publish the new high
//! watermark and answer their acks=all producers. Up to four objects are
//! written at once, and committed one at a time in the order they were
//! gathered, so a partition's commits never overtake each other.
//!
//! A write or commit that fails is retried until it lands, or until the
//! partitions' terms end (their producers are then told to go elsewhere);
//! while the object store is away, appends wait, and past
//! `keel.cluster.wal.buffer.max.bytes` of unwritten groups they are
//! refused (NOT_ENOUGH_REPLICAS) rather than held in memory.
//!
//! The controller collects what nobody needs any more, every
//! `keel.cluster.wal.gc.interval.ms` ([`Wal::collect_garbage`]): a WAL
//! object every range of which is below its partition's sealed segments in
//! the object store (or its log start), or of a deleted topic, is deleted
//! with its index keys; so are a deleted topic's commit keys and segment
//! copies. An object with one partition whose records are not in a sealed
//! segment yet is kept whole. A WAL object no index names and older than
//! [`ORPHAN_AGE`] is deleted too: its broker crashed between the write and
//! the commit, or its partitions' terms ended first. No commit lands that
//! late: a broker attempts an object's commit only until
//! [`COMMIT_GIVE_UP`] after the write (then its producers are told to go
//! elsewhere, as when its term ends), and objects are listed before the
//! index is read. A pass whose index holds a key Keel cannot read deletes
//! no object no index names. Likewise an object some parts of which were
//! committed and others given up is collected, once older than
//! [`ORPHAN_AGE`], when the ranges of its committed parts are covered.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use keel_cluster::logs::{CommitPart, PartOutcome, WalRange};
use keel_cluster::Membership;
use keel_tier::Tiers;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::partition::Partition;

/// Backoff between attempts of a failed write or commit.
const RETRY_MIN: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(1);
/// Objects being written to the object store at once.
const IN_FLIGHT: usize = 4;
/// How long after its write an object's commit is tried.
pub const COMMIT_GIVE_UP: Duration = Duration::from_secs(300);
/// How old (by the object store's clock against the controller's) an
/// object no index names must be to be deleted: well past
/// [`COMMIT_GIVE_UP`], as long as the controller's clock runs less than
/// 55 minutes ahead of the object store's.
pub const ORPHAN_AGE: Duration = Duration::from_secs(3600);

/// `keel.cluster.wal.*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalSettings {
    /// How long the first group of an object waits for others.
    pub linger: Duration,
    /// An object is written once it holds this many bytes.
    pub object_bytes: usize,
    /// Appends are refused while this many bytes are unwritten.
    pub buffer_max_bytes: usize,
    /// How often the controller deletes what the WAL no longer needs.
    pub gc_interval: Duration,
    /// A led partition's active segment is rolled once this old, so that
    /// its records reach a sealed segment in the object store.
    pub segment_roll: Duration,
}

/// A group of batches one partition wrote, waiting for its object.
pub(crate) struct Group {
    pub partition: Arc<Partition>,
    pub topic_id: uuid::Uuid,
    pub generation: u64,
    pub epoch: i32,
    pub base_offset: i64,
    pub end_offset: i64,
    pub records: Bytes,
}

#[derive(Default)]
struct Gathering {
    groups: Vec<Group>,
    bytes: usize,
    since: Option<Instant>,
}

/// Counters since start-up, for `/stats` and `/metrics`.
#[derive(Debug, Default)]
pub struct WalStats {
    pub objects: AtomicU64,
    pub bytes: AtomicU64,
    pub write_failures: AtomicU64,
    pub commit_failures: AtomicU64,
    /// Total time of successful object writes and of commits.
    pub write_nanos: AtomicU64,
    pub commit_nanos: AtomicU64,
    /// Groups whose term ended before their commit.
    pub fenced_groups: AtomicU64,
    /// What garbage collection deleted (this broker, as controller):
    /// WAL objects and their bytes, and the coordination store's keys.
    pub collected_objects: AtomicU64,
    pub collected_bytes: AtomicU64,
    pub collected_keys: AtomicU64,
    /// WAL objects no index named, deleted past [`ORPHAN_AGE`].
    pub collected_orphans: AtomicU64,
}

pub struct Wal {
    membership: Arc<Membership>,
    tiers: Arc<Tiers>,
    /// Where every broker's objects are (`<cluster id>/wal/`).
    cluster_prefix: String,
    /// Where this broker's are.
    prefix: String,
    /// Names this process's objects apart from those of its earlier runs.
    run: u64,
    next: AtomicU64,
    settings: Mutex<WalSettings>,
    gathering: Mutex<Gathering>,
    /// Bytes handed in and not yet committed (or dropped).
    unwritten: AtomicU64,
    /// Objects gathered and not yet committed.
    writing: AtomicUsize,
    wake: Notify,
    pub stats: WalStats,
}

impl Wal {
    pub fn new(
        membership: Arc<Membership>,
        tiers: Arc<Tiers>,
        cluster_id: &str,
        settings: WalSettings,
    ) -> Wal {
        let node = membership.me().node_id;
        Wal {
            membership,
            tiers,
            cluster_prefix: format!("{cluster_id}/wal/"),
            prefix: format!("{cluster_id}/wal/{node}/"),
            run: keel_log::clock::now_ms().max(0) as u64,
            next: AtomicU64::new(0),
            settings: Mutex::new(settings),
            gathering: Mutex::new(Gathering::default()),
            unwritten: AtomicU64::new(0),
            writing: AtomicUsize::new(0),
            wake: Notify::new(),
            stats: WalStats::default(),
        }
    }

    /// The cluster membership the WAL commits through.
    pub fn membership(&self) -> &Arc<Membership> {
        &self.membership
    }

    pub fn settings(&self) -> WalSettings {
        *self.settings.lock()
    }

    pub fn set_settings(&self, settings: WalSettings) {
        *self.settings.lock() = settings;
        self.wake.notify_one();
    }

    /// Whether another append may be written now: false while the groups
    /// not yet in the object store exceed the buffer.
    pub fn has_room(&self) -> bool {
        self.unwritten.load(Ordering::Acquire) < self.settings.lock().buffer_max_bytes as u64
    }

    /// Bytes written by partitions and not yet committed.
    pub fn unwritten_bytes(&self) -> u64 {
        self.unwritten.load(Ordering::Acquire)
    }

    /// Waits until every group handed in is committed (or dropped), at
    /// most `timeout`: a clean shutdown's last writes. Whether it is.
    pub async fn drain(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.unwritten_bytes() > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            self.wake.notify_one();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        true
    }

    pub(crate) fn push(&self, group: Group) {
        let n = group.records.len();
        self.unwritten.fetch_add(n as u64, Ordering::AcqRel);
        let full = {
            let mut g = self.gathering.lock();
            g.since.get_or_insert_with(Instant::now);
            g.bytes += n;
            g.groups.push(group);
            g.bytes >= self.settings.lock().object_bytes || g.groups.len() == 1
        };
        if full {
            self.wake.notify_one();
        }
    }

    /// Collects garbage every `keel.cluster.wal.gc.interval.ms` while this
    /// broker is the controller, until the task is dropped.
    pub async fn collect_garbage_forever(self: Arc<Self>) {
        loop {
            let interval = self.settings.lock().gc_interval;
            tokio::time::sleep(interval).await;
            if let Err(why) = self.collect_garbage().await {
                tracing::warn!(error = %why, "WAL garbage collection failed; trying again later");
            }
        }
    }

    /// One pass of garbage collection, if this broker is the controller
    /// (see the module docs). Each object is deleted before its keys, so a
    /// failure leaves keys naming a deleted object, below every range a
    /// rebuild reads, never an object no key names.
    pub async fn collect_garbage(&self) -> Result<(), String> {
        let m = &self.membership;
        if m.controller().map(|c| c.node_id) != Some(m.me().node_id) || m.is_fenced() {
            return Ok(());
        }
        // WAL objects older than ORPHAN_AGE: none of their parts can still
        // be committed (a broker gives up an object's commit long before).
        // A listing that fails holds up no other collection: without it
        // no object counts as settled, and no orphan is looked for.
        let (mut old, listing) = match self.old_objects().await {
            Ok(old) => (old, None),
            Err(why) => (Default::default(), Some(why)),
        };
        let garbage = m.garbage(&old).await.map_err(|e| e.to_string())?;
        let count = |keys: usize| {
            self.stats
                .collected_keys
                .fetch_add(keys as u64, Ordering::Relaxed)
        };
        let mut failed = None;
        for (object, bytes, keys) in &garbage.wal {
            // One object the store will not delete does not hold the others up.
            if let Err(e) = self.tiers.delete_remote(object).await {
                failed.get_or_insert(format!("deleting WAL object {object}: {e}"));
                continue;
            }
            m.delete_keys(keys).await.map_err(|e| e.to_string())?;
            old.remove(object);
            self.stats.collected_objects.fetch_add(1, Ordering::Relaxed);
            self.stats.collected_bytes.fetch_add(*bytes, Ordering::Relaxed);
            count(keys.len());
        }
        for (segment, key) in &garbage.segments {
            let copy = crate::takeover::tiered(segment);
            if let Err(e) = self.tiers.delete(&copy).await {
                failed.get_or_insert(format!("deleting a deleted topic's segment {}: {e}", copy.object));
                continue;
            }
            m.delete_keys(std::slice::from_ref(key))
                .await
                .map_err(|e| e.to_string())?;
            count(1);
        }
        m.delete_keys(&garbage.commits).await.map_err(|e| e.to_string())?;
        count(garbage.commits.len());
        match listing {
            Some(why) => {
                failed.get_or_insert(why);
            }
            None => {
                if let Err(why) = self.collect_orphans(old).await {
                    failed.get_or_insert(why);
                }
            }
        }
        if let Some(why) = failed {
            return Err(why);
        }
        if !garbage.wal.is_empty() || !garbage.segments.is_empty() {
            tracing::debug!(
                objects = garbage.wal.len(),
                segments = garbage.segments.len(),
                commits = garbage.commits.len(),
                "collected WAL garbage"
            );
        }
        Ok(())
    }

    /// The WAL objects in the object store older than [`ORPHAN_AGE`].
    async fn old_objects(&self) -> Result<std::collections::HashSet<String>, String> {
        let listed = self
            .tiers
            .list_remote(&self.cluster_prefix)
            .await
            .map_err(|e| format!("listing WAL objects: {e}"))?;
        Ok(listed
            .into_iter()
            .filter(|(name, age)| name.ends_with(".wal") && *age >= ORPHAN_AGE.as_millis() as u64)
            .map(|(name, _)| name)
            .collect())
    }

    /// Deletes the WAL objects no index names among `old` (those older
    /// than [`ORPHAN_AGE`]). Listed before the index is read: an object
    /// committed meanwhile is in the index read after.
    async fn collect_orphans(&self, old: std::collections::HashSet<String>) -> Result<(), String> {
        if old.is_empty() {
            return Ok(());
        }
        let Some(indexed) = self.membership.wal_objects().await.map_err(|e| e.to_string())? else {
            return Err("a WAL index key does not read: no uncommitted object is deleted".to_string());
        };
        for name in old.into_iter().filter(|n| !indexed.contains(n)) {
            self.tiers
                .delete_remote(&name)
                .await
                .map_err(|e| format!("deleting WAL object {name} no index names: {e}"))?;
            self.stats.collected_orphans.fetch_add(1, Ordering::Relaxed);
            tracing::info!(object = %name, "deleted a WAL object no commit names (written, never committed)");
        }
        Ok(())
    }

    /// Writes and commits objects until the task is dropped: up to
    /// [`IN_FLIGHT`] objects are written at once, and committed in the
    /// order they were gathered, one at a time.
    pub async fn run(self: Arc<Self>) {
        let (queue, mut written) =
            tokio::sync::mpsc::channel::<(tokio::task::JoinHandle<Option<Written>>, u64)>(IN_FLIGHT);
        let me = Arc::clone(&self);
        tokio::spawn(async move {
            while let Some((writing, bytes)) = written.recv().await {
                if let Ok(Some(object)) = writing.await {
                    me.commit(object).await;
                }
                me.unwritten.fetch_sub(bytes, Ordering::AcqRel);
                me.writing.fetch_sub(1, Ordering::AcqRel);
                me.wake.notify_one();
            }
        });
        loop {
            let groups = self.next_object().await;
            let bytes: u64 = groups.iter().map(|g| g.records.len() as u64).sum();
            let me = Arc::clone(&self);
            self.writing.fetch_add(1, Ordering::AcqRel);
            let writing = tokio::spawn(async move { me.write(groups).await });
            if queue.send((writing, bytes)).await.is_err() {
                return;
            }
        }
    }

    /// The groups of the next object: waits for a first group, then for the
    /// linger or a full object.
    async fn next_object(&self) -> Vec<Group> {
        loop {
            let wake = self.wake.notified();
            tokio::pin!(wake);
            wake.as_mut().enable();
            let (since, bytes) = {
                let g = self.gathering.lock();
                (g.since, g.bytes)
            };
            let settings = *self.settings.lock();
            match since {
                // Nothing being written or committed: no reason to wait
                // for company.
                Some(at)
                    if bytes >= settings.object_bytes
                        || at.elapsed() >= settings.linger
                        || self.writing.load(Ordering::Acquire) == 0 =>
                {
                    let mut g = self.gathering.lock();
                    g.since = None;
                    g.bytes = 0;
                    return std::mem::take(&mut g.groups);
                }
                Some(at) => {
                    let _ = tokio::time::timeout(settings.linger.saturating_sub(at.elapsed()), wake).await;
                }
                None => wake.await,
            }
        }
    }

    /// Writes one object to the object store, retrying until it lands or
    /// none of its parts' terms is current any more.
    async fn write(&self, groups: Vec<Group>) -> Option<Written> {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let id = format!("{:020}-{seq:020}", self.run);
        let object = format!("{}{id}.wal", self.prefix);
        let mut parts = merge(groups);
        let body = layout(&mut parts);
        let mut backoff = RETRY_MIN;
        loop {
            parts.retain(|p| self.still_current(p));
            if parts.is_empty() {
                return None;
            }
            let started = Instant::now();
            match self.tiers.put_remote(&object, body.clone()).await {
                Ok(()) => {
                    self.stats
                        .write_nanos
                        .fetch_add(nanos(started), Ordering::Relaxed);
                    self.stats.objects.fetch_add(1, Ordering::Relaxed);
                    self.stats.bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
                    break;
                }
                Err(e) => {
                    self.stats.write_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(object = %object, error = %e, "cannot write a WAL object; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(RETRY_MAX);
                }
            }
        }
        Some(Written {
            object,
            id,
            parts,
            written_at: Instant::now(),
        })
    }

    /// Commits a written object (see [`keel_cluster::logs::commit`]),
    /// retrying while the coordination store does not answer.
    async fn commit(&self, written: Written) {
        let Written {
            object,
            id,
            mut parts,
            written_at,
        } = written;
        let mut backoff = RETRY_MIN;
        // The parts asked, fixed once: a retry asks exactly the same, so a
        // transaction whose answer was lost is recognised by its index key.
        // A part whose term ends meanwhile is refused by its compare.
        parts.retain(|p| self.still_current(p));
        let commits: Vec<(usize, CommitPart)> = parts
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let revision = p.partition.replica_revision(p.generation)?;
                Some((
                    i,
                    CommitPart {
                        range: p.range.clone(),
                        revision,
                        log_start: p.partition.log_start_offset(),
                    },
                ))
            })
            .collect();
        if commits.is_empty() {
            return;
        }
        let asked: Vec<CommitPart> = commits.iter().map(|(_, c)| c.clone()).collect();
        loop {
            // Before every attempt, the first too (an object may wait
            // long behind an earlier one's write): past this, garbage
            // collection may have deleted the object.
            if written_at.elapsed() >= COMMIT_GIVE_UP {
                self.stats.commit_failures.fetch_add(1, Ordering::Relaxed);
                tracing::error!(object = %object, "a WAL object was not committed within {COMMIT_GIVE_UP:?} of its write; giving it up");
                for p in &parts {
                    self.fence(p, "its WAL object could not be committed in time");
                }
                return;
            }
            let started = Instant::now();
            match self.membership.commit_wal(&object, &id, &asked).await {
                Ok(Some(outcomes)) => {
                    self.stats
                        .commit_nanos
                        .fetch_add(nanos(started), Ordering::Relaxed);
                    for ((i, _), outcome) in commits.iter().zip(outcomes) {
                        let p = &parts[*i];
                        match outcome {
                            PartOutcome::Committed(revision) => {
                                p.partition
                                    .on_committed(p.generation, p.range.end_offset, revision)
                            }
                            PartOutcome::Fenced => self.fence(p, "another leader claimed the partition"),
                        }
                    }
                    return;
                }
                Ok(None) => {
                    for p in &parts {
                        self.fence(p, "this broker's session is not confirmed");
                    }
                    return;
                }
                Err(e) => {
                    self.stats.commit_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(object = %object, error = %e, "cannot commit a WAL object; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(RETRY_MAX);
                }
            }
        }
    }

    fn still_current(&self, p: &Part) -> bool {
        let current = p.partition.replica_revision(p.generation).is_some();
        if !current {
            self.stats.fenced_groups.fetch_add(1, Ordering::Relaxed);
        }
        current
    }

    fn fence(&self, p: &Part, why: &str) {
        self.stats.fenced_groups.fetch_add(1, Ordering::Relaxed);
        if p.partition.on_fenced(p.generation) {
            tracing::warn!(
                topic = %p.partition.topic, partition = p.partition.index, epoch = p.range.leader_epoch,
                why, "the partition's writes since its last commit will not be acknowledged"
            );
        }
    }
}

/// An object in the object store, not yet committed.
struct Written {
    object: String,
    id: String,
    parts: Vec<Part>,
    written_at: Instant,
}

/// One partition's groups of one term in an object, merged.
struct Part {
    partition: Arc<Partition>,
    generation: u64,
    range: WalRange,
    records: Vec<Bytes>,
}

/// Merges each partition's groups (consecutive, in one term) into one
/// part, in the order partitions first appear.
fn merge(groups: Vec<Group>) -> Vec<Part> {
    let mut parts: Vec<Part> = Vec::new();
    let mut at: HashMap<(*const Partition, u64), usize> = HashMap::new();
    for g in groups {
        let key = (Arc::as_ptr(&g.partition), g.generation);
        match at.get(&key) {
            Some(&i)
                if parts[i].range.end_offset == g.base_offset && parts[i].range.leader_epoch == g.epoch =>
            {
                let p = &mut parts[i];
                p.range.end_offset = g.end_offset;
                p.range.length += g.records.len() as u64;
                p.records.push(g.records);
            }
            _ => {
                at.insert(key, parts.len());
                parts.push(Part {
                    range: WalRange {
                        topic_id: g.topic_id,
                        partition: g.partition.index,
                        leader_epoch: g.epoch,
                        base_offset: g.base_offset,
                        end_offset: g.end_offset,
                        position: 0,
                        length: g.records.len() as u64,
                    },
                    partition: g.partition,
                    generation: g.generation,
                    records: vec![g.records],
                });
            }
        }
    }
    parts
}

/// The object's bytes: each part's batches in turn, its position set.
fn layout(parts: &mut [Part]) -> Bytes {
    let total: u64 = parts.iter().map(|p| p.range.length).sum();
    let mut body = BytesMut::with_capacity(total as usize);
    for p in parts.iter_mut() {
        p.range.position = body.len() as u64;
        for r in p.records.drain(..) {
            body.extend_from_slice(&r);
        }
    }
    body.freeze()
}

fn nanos(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}
