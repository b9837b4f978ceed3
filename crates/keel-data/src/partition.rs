//! One topic-partition: its log, its producers' sequence state, the append
//! pipeline (group commit) and the long-poll wake-ups.
//!
//! Locking:
//! * `writer` guards the log's writer and the producer state. It is held
//!   across an append's `write` (and its fsync when the flush policy says
//!   so) and by maintenance (retention, the mover's manifest steps). Only
//!   blocking threads wait on it.
//! * Reads (fetch planning, ListOffsets, stats) go through the log's
//!   [`LogReader`], whose lock is only ever held for in-memory work; the
//!   producers' state as DescribeProducers reports it is published by the
//!   writer after each write ([`PublishedProducers`]), under a lock held
//!   for in-memory work too. So a write or fsync stalled on a slow disk
//!   delays that partition's appends and nothing else: no request thread
//!   waits on it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::readers::{Reader, Readers};
use crate::scan::{FetchAt, ReadId, ReadOrder, ScanCore, ScanSettings, ScanSummary, Step, Waiter};
use bytes::Bytes;
use keel_log::batch::BatchHeader;
use keel_log::marker::{Marker, TxnWrite};
use keel_log::{
    AbortedTxn, AppendError, AppendTimes, LogConfig, LogReader, PartitionLog, ReadError, ReadPlan, Storage,
};
use keel_protocol::ResponseError;
use keel_tier::{Chunks, ColdRead, ColdReads, IoClass, IoScheduler, PartitionTail, Tiers};
use parking_lot::{Mutex, RwLock};
use tokio::sync::{oneshot, Notify};

use crate::health::DirHealth;
use crate::producers::{ProducerInfo, ProducerSnapshot, ProducerStates, SequenceCheck};
use crate::replica::{NotDurable, Replica, Term};
use crate::wal::{Group, Wal};
use keel_log::clock::Clock;

/// The leader epoch a single node's batches are stamped with (see
/// [`crate::leadership`]); in a cluster, the epoch of the claim.
const LEADER_EPOCH: i32 = crate::leadership::SINGLE_NODE_EPOCH;

/// Offsets of an append as acknowledged to the producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    pub base_offset: i64,
    pub log_start_offset: i64,
    pub trace: AppendTrace,
    /// In a cluster, the term it was written in: acks=all waits for its
    /// commit ([`Partition::wait_durable`]).
    pub term: Option<Term>,
}

/// Where an append's time went, and where its batches were written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendTrace {
    /// Waiting in the partition's append queue for its writer thread.
    pub queue: Duration,
    /// Waiting for the writer lock.
    pub lock: Duration,
    /// After the write, before the answer: caching the batches, moving the
    /// high watermark, waking the fetches waiting for it.
    pub publish: Duration,
    /// When the writer answered; the request resumes some time later, on
    /// a request thread.
    pub answered: Instant,
    /// `None` when nothing was written for it (a duplicate).
    pub written: Option<Written>,
}

/// An append's batches in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// The log's steps, shared by the group written with this append.
    pub times: AppendTimes,
    /// The segment written, and the position of this append's first batch.
    pub segment_base_offset: i64,
    pub position: u64,
}

/// Why a produce to this partition failed: a Kafka error for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendFailure {
    pub error: ResponseError,
    pub message: String,
}

/// Why a read could not be planned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadFailure {
    OffsetOutOfRange,
    /// The partition or its log dir is offline, or its data is damaged.
    Storage(String),
}

impl ReadFailure {
    /// As the error a cold read's waiters get: an offset out of range as
    /// `NotFound` (what a read of a segment retention deleted meanwhile
    /// returns).
    fn to_io(&self) -> std::io::Error {
        match self {
            ReadFailure::OffsetOutOfRange => {
                std::io::Error::new(std::io::ErrorKind::NotFound, "the offset is out of range")
            }
            ReadFailure::Storage(why) => std::io::Error::other(why.clone()),
        }
    }
}

/// A check a transactional batch must pass in the partition writer, in
/// queue order, just before its offsets are planned: whether its
/// transaction is still open with this partition in it. Checked earlier,
/// the transaction could end (its marker queued and written here) before
/// the batch was queued, and the batch would open a transaction here that
/// no coordinator ever ends, pinning the last stable offset (Kafka's
/// verification guard, KIP-890). It must not block: it reads the
/// coordinator's state in memory, or the partition's producer state it is
/// given.
pub type Verify = Box<dyn FnOnce(&ProducerStates) -> Result<(), AppendFailure> + Send>;

/// The check of a batch whose producer had its transaction at this epoch
/// open here when the request came (see [`Partition::in_open_transaction`]):
/// it belongs to that transaction if it is still open when the writer
/// takes the batch, else it is `refused`. Kafka asks the coordinator
/// nothing for such a batch either: the partition joined the transaction
/// with the producer's first batch in it.
pub fn open_transaction_check(producer_id: i64, producer_epoch: i16, refused: AppendFailure) -> Verify {
    Box::new(move |producers| {
        if producers.in_open_transaction(producer_id, producer_epoch) {
            Ok(())
        } else {
            Err(refused)
        }
    })
}

struct PendingAppend {
    records: Bytes,
    headers: Vec<BatchHeader>,
    /// Set when the batch is a transaction marker the coordinator writes.
    marker: Option<Marker>,
    /// Set for a transactional batch: checked before it is planned.
    verify: Option<Verify>,
    /// Set for a coordinator's own records (see [`Partition::append_unchecked`]):
    /// written without the producer checks.
    unchecked: bool,
    reply: oneshot::Sender<Result<Appended, AppendFailure>>,
    enqueued: Instant,
}

impl PendingAppend {
    /// Offsets the batches use.
    fn offsets(&self) -> i64 {
        self.headers
            .iter()
            .map(|h| i64::from(h.last_offset_delta) + 1)
            .sum()
    }
}

#[derive(Default)]
struct AppendQueue {
    items: Vec<PendingAppend>,
    /// True while a blocking task is draining the queue.
    writer_active: bool,
}

/// Why [`Partition::with_log`] did not run: the partition's log is
/// offline (its log dir failed, or it could not be opened), closed by a
/// shutdown, or the topic was deleted. Not a failure of the step that
/// asked, which the caller can skip; the failures of the step itself are
/// what `f` returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable(pub String);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the partition's log is unavailable: {}", self.0)
    }
}

impl std::error::Error for Unavailable {}

impl From<Unavailable> for std::io::Error {
    fn from(e: Unavailable) -> std::io::Error {
        std::io::Error::other(e)
    }
}

/// Why appends are refused for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closed {
    /// The broker is shutting down (the clean-shutdown marker is written).
    Shutdown,
    /// The topic was deleted: the log was fenced and renamed away.
    Deleted,
}

struct Writer {
    /// `None` when the log could not be opened (the partition is offline)
    /// or was taken away by a deletion.
    log: Option<PartitionLog>,
    producers: ProducerStates,
    closed: Option<Closed>,
}

/// Each producer's state as of the last write, for DescribeProducers and
/// `/stats`, which request threads answer. The writer publishes the
/// producers a group named once its write is done (or undone), as it
/// publishes the high watermark, and every producer when the state is
/// loaded or expired; the lock is held for that in-memory work only, so a
/// reader never waits for a write or an fsync.
#[derive(Default)]
struct PublishedProducers(Mutex<std::collections::BTreeMap<i64, ProducerInfo>>);

impl PublishedProducers {
    /// Publishes the state of `ids`: a producer `producers` no longer has
    /// (an undone first write) is removed.
    fn update(&self, producers: &ProducerStates, ids: &[i64]) {
        let mut published = self.0.lock();
        for &id in ids {
            match producers.info(id) {
                Some(info) => published.insert(id, info),
                None => published.remove(&id),
            };
        }
    }

    /// Publishes every producer, replacing what was published.
    fn replace(&self, producers: &ProducerStates) {
        let all = producers
            .describe()
            .into_iter()
            .map(|i| (i.producer_id, i))
            .collect();
        *self.0.lock() = all;
    }
}

pub struct Partition {
    pub topic: Arc<str>,
    pub topic_id: uuid::Uuid,
    pub index: i32,
    dir: PathBuf,
    /// The log's settings: the topic's configs over the broker's defaults.
    config: Mutex<LogConfig>,
    storage: Arc<dyn Storage>,
    writer: Mutex<Writer>,
    /// The producers as of the last write; only the writer updates it.
    published_producers: PublishedProducers,
    /// The log's read side; replaced when the log is reloaded.
    reader: RwLock<Option<LogReader>>,
    /// The health of the log dir this partition lives in.
    health: Arc<DirHealth>,
    /// Why this partition alone is unavailable (its log failed to open).
    offline: Mutex<Option<String>>,
    queue: Mutex<AppendQueue>,
    /// Fetches waiting for data; each is woken once per append.
    waiters: Mutex<Vec<Arc<Notify>>>,
    /// The high watermark: every offset below it is written and readable.
    /// One replica, so it equals the log end offset. Only moves forward,
    /// except when retention or truncation resets the log.
    high_watermark: AtomicI64,
    /// The last stable offset: every offset below it is readable and its
    /// transaction (if any) decided. The high watermark, or the first
    /// offset of the oldest open transaction if that is lower. Published
    /// with the high watermark, after the tail cache holds the batches.
    last_stable_offset: AtomicI64,
    log_start_offset: AtomicI64,
    /// The newest batches, in the broker's tail cache.
    tail: PartitionTail,
    /// Fetched bytes served from the tail cache and from the log files.
    pub cache_read_bytes: AtomicU64,
    pub cold_read_bytes: AtomicU64,
    /// Which segments the page-cache passes cover.
    page_cache_marks: Mutex<PageCacheMarks>,
    /// The broker's cold-read executor (reads below the tail cache).
    cold: Arc<ColdReads>,
    /// The I/O classes' budgets; appends count as live I/O.
    io: Arc<IoScheduler>,
    /// The colder tiers, which serve the offsets no longer in the fast tier.
    tiers: Arc<Tiers>,
    /// The reads below the tail cache, shared by the readers riding the
    /// same stretch of the log (see [`crate::scan`]).
    scan: Mutex<Scan>,
    /// Where recent cold reads ended, so the next read of each sequential
    /// scan starts exactly at its batch (`keel_log::ScanHint`).
    scan_hints: Mutex<Vec<keel_log::ScanHint>>,
    /// A background thread is running the log's queued seals.
    sealing: Arc<AtomicBool>,
    /// What the log cleaner did here (compacted topics).
    pub cleaning: Mutex<crate::cleaning::Cleaning>,
    /// Who read this partition recently, and where.
    pub readers: Readers,
    /// The local segments the mover's last pass kept on the fast tier for
    /// a reader ([`crate::tiering`]), and the bytes reads took from such
    /// segments: reads of the colder tier the holds saved.
    tier_hold: Mutex<Option<crate::tiering::Hold>>,
    pub held_read_bytes: AtomicU64,
    clock: Arc<dyn Clock>,
    /// In a cluster: where written groups go to be made durable, and the
    /// claim they are written under. `None` for one node.
    wal: Option<Arc<Wal>>,
    replica: Replica,
    /// In a cluster: the copies in the object store this broker recorded
    /// in the coordination store (see [`crate::takeover`]).
    pub(crate) published: Mutex<std::collections::HashSet<String>>,
    /// The log keeps the producer snapshots of its segments not yet
    /// copied to the object store (`PartitionLog::keep_snapshots_of_uncopied`),
    /// for the mover to put beside their copies.
    pub(crate) keeps_uncopied_snapshots: std::sync::atomic::AtomicBool,
    /// In a cluster: the log start this broker last recorded there.
    pub(crate) recorded_start: AtomicI64,
    /// Transactional batches being checked with a coordinator on another
    /// broker, by guard token. A marker queued for the producer that ends
    /// the guarded batch's transaction removes its guard (see
    /// [`VerificationGuard`]).
    verifying: Mutex<HashMap<u64, TxnWrite>>,
}

/// Tokens of [`VerificationGuard`]s.
static NEXT_GUARD: AtomicU64 = AtomicU64::new(1);

/// Kafka's verification guard (KIP-890), for a transactional batch whose
/// coordinator is another broker: taken before the coordinator is asked
/// whether the batch's transaction holds this partition, and checked by
/// the partition writer just before the batch is planned. A marker
/// queued in between that ends the batch's transaction (its batch would
/// open one here no coordinator ends) voids it; the marker of the
/// producer's previous transaction, still on its way, does not. So does a
/// change of leadership: markers written while another broker led the
/// partition voided nothing here.
pub struct VerificationGuard {
    partition: Arc<Partition>,
    token: u64,
    /// The leadership term it was taken in (its generation; `None` for
    /// one node).
    term: Option<u64>,
}

impl VerificationGuard {
    /// The writer's check: the guard still holds, else `refused`; in
    /// another term than it was taken in, NOT_LEADER_OR_FOLLOWER (the
    /// client retries, and the batch is checked again).
    pub fn into_verify(self, refused: AppendFailure) -> Verify {
        Box::new(move |_| {
            if self.partition.replica.term().map(|t| t.generation) != self.term {
                Err(AppendFailure {
                    error: ResponseError::NotLeaderOrFollower,
                    message: format!(
                        "the leadership of {}-{} changed while a transactional batch was checked",
                        self.partition.topic, self.partition.index
                    ),
                })
            } else if self.partition.verifying.lock().contains_key(&self.token) {
                Ok(())
            } else {
                Err(refused)
            }
        })
    }
}

impl std::fmt::Debug for VerificationGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "VerificationGuard({}-{} #{})",
            self.partition.topic, self.partition.index, self.token
        )
    }
}

impl Drop for VerificationGuard {
    fn drop(&mut self) {
        self.partition.verifying.lock().remove(&self.token);
    }
}

/// A partition's shared scan: readers are fetch connections, and a fetch
/// waits for a read's data on a channel.
type Scan = ScanCore<Reader, oneshot::Sender<std::io::Result<Bytes>>>;

impl Waiter for oneshot::Sender<std::io::Result<Bytes>> {
    fn is_waiting(&self) -> bool {
        !self.is_closed()
    }
}

/// Scan hints kept per partition: one per concurrent sequential scan.
const SCAN_HINTS: usize = 8;

/// A read of the log files for a fetch, to be run with
/// [`DiskRead::spawn`]. Other fetches at its offset may wait for it; one
/// dropped without being run answers them with no data.
pub struct DiskRead {
    partition: Arc<Partition>,
    id: ReadId,
    plan: Option<ReadPlan>,
    rx: Option<oneshot::Receiver<std::io::Result<Bytes>>>,
}

impl DiskRead {
    pub fn plan(&self) -> &ReadPlan {
        self.plan.as_ref().expect("a read not yet run has its plan")
    }

    /// Runs the read on the cold executor; its data arrives on the
    /// returned channel (and goes to the fetches that waited for it).
    pub fn spawn(mut self) -> oneshot::Receiver<std::io::Result<Bytes>> {
        let plan = self.plan.take().expect("a read is run once");
        self.partition.run_read(self.id, plan);
        self.rx.take().expect("a read is run once")
    }
}

impl Drop for DiskRead {
    /// A read never run answers the fetches that waited for it with no
    /// data (they ask again), and is held for nobody.
    fn drop(&mut self) {
        if self.plan.is_some() {
            self.partition.finish_read(self.id, Ok(Bytes::new()));
        }
    }
}

impl std::fmt::Debug for DiskRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskRead")
            .field("id", &self.id)
            .field("plan", &self.plan)
            .finish()
    }
}

/// Where a fetch's bytes come from.
#[derive(Debug)]
pub enum ReadSource {
    /// Whole batches from the tail cache: no disk read.
    Memory(Chunks),
    /// Whole batches read before (a read-ahead, or another reader's read):
    /// no disk read now.
    ReadAhead(Chunks),
    /// A planned read of the log files, executed without any lock.
    Disk(DiskRead),
    /// A read of this offset is in flight; its bytes arrive here.
    Pending(oneshot::Receiver<std::io::Result<Bytes>>),
}

/// What a partition is made of: where it lives and the broker's shared parts.
pub struct PartitionParts {
    pub topic: Arc<str>,
    pub topic_id: uuid::Uuid,
    pub index: i32,
    pub dir: PathBuf,
    pub config: LogConfig,
    pub storage: Arc<dyn Storage>,
    pub health: Arc<DirHealth>,
    pub tail: PartitionTail,
    pub cold: Arc<ColdReads>,
    pub io: Arc<IoScheduler>,
    pub tiers: Arc<Tiers>,
    /// The time appends, markers and producer state are stamped with.
    pub clock: Arc<dyn Clock>,
    /// In a cluster, the broker's WAL: the high watermark is the committed
    /// offset, and nothing is written until the partition is claimed.
    pub wal: Option<Arc<Wal>>,
}

/// An append in its partition's queue, its place in the write order
/// fixed; [`Queued::outcome`] waits for the write.
pub struct Queued {
    done: oneshot::Receiver<Result<Appended, AppendFailure>>,
}

impl Queued {
    /// The append's outcome, once the writer has written (or refused) it.
    pub async fn outcome(self) -> Result<Appended, AppendFailure> {
        self.done.await.unwrap_or_else(|_| {
            Err(storage_failure(
                "the partition's writer failed on this request; the partition was reloaded".into(),
            ))
        })
    }
}

impl Partition {
    /// Opens (and recovers) the log and loads producer state: the newest
    /// snapshot, then the batch headers after it. Blocking: run off the
    /// async threads.
    pub fn open(parts: PartitionParts) -> Result<Partition, OpenFailure> {
        let (log, producers) = open_log(&parts.storage, &parts.dir, &parts.config, parts.clock.now_ms())?;
        let reader = log.reader().clone();
        let (hw, start) = (reader.log_end_offset(), reader.log_start_offset());
        let lso = stable_offset(&producers, hw);
        let p = Partition::assemble(parts, Some(log), producers, None);
        *p.reader.write() = Some(reader);
        match p.wal {
            // Nothing is known committed until the partition is claimed.
            Some(_) => p.store_offsets(start, start, start),
            None => p.store_offsets(hw, lso, start),
        }
        Ok(p)
    }

    /// A partition whose log could not be opened: every request for it is
    /// answered with KAFKA_STORAGE_ERROR, and the rest of the broker serves.
    pub fn offline(parts: PartitionParts, reason: String) -> Partition {
        Partition::assemble(parts, None, ProducerStates::default(), Some(reason))
    }

    fn assemble(
        parts: PartitionParts,
        log: Option<PartitionLog>,
        producers: ProducerStates,
        offline: Option<String>,
    ) -> Partition {
        let published = PublishedProducers::default();
        published.replace(&producers);
        let scan_pool = parts.cold.scan_pool();
        Partition {
            topic: parts.topic,
            topic_id: parts.topic_id,
            index: parts.index,
            dir: parts.dir,
            config: Mutex::new(parts.config),
            storage: parts.storage,
            published_producers: published,
            writer: Mutex::new(Writer {
                log,
                producers,
                closed: None,
            }),
            reader: RwLock::new(None),
            health: parts.health,
            offline: Mutex::new(offline),
            queue: Mutex::new(AppendQueue::default()),
            waiters: Mutex::new(Vec::new()),
            high_watermark: AtomicI64::new(0),
            last_stable_offset: AtomicI64::new(0),
            log_start_offset: AtomicI64::new(0),
            tail: parts.tail,
            cache_read_bytes: AtomicU64::new(0),
            cold_read_bytes: AtomicU64::new(0),
            page_cache_marks: Mutex::new(PageCacheMarks::default()),
            cold: parts.cold,
            io: parts.io,
            tiers: parts.tiers,
            scan: Mutex::new(ScanCore::new(ScanSettings::of(scan_pool.policy()), scan_pool)),
            scan_hints: Mutex::new(Vec::new()),
            sealing: Arc::new(AtomicBool::new(false)),
            cleaning: Mutex::new(crate::cleaning::Cleaning::default()),
            readers: Readers::default(),
            tier_hold: Mutex::new(None),
            held_read_bytes: AtomicU64::new(0),
            clock: parts.clock,
            wal: parts.wal,
            replica: Replica::default(),
            published: Mutex::new(std::collections::HashSet::new()),
            keeps_uncopied_snapshots: std::sync::atomic::AtomicBool::new(false),
            recorded_start: AtomicI64::new(-1),
            verifying: Mutex::new(HashMap::new()),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn high_watermark(&self) -> i64 {
        self.high_watermark.load(Ordering::Acquire)
    }

    pub fn last_stable_offset(&self) -> i64 {
        self.last_stable_offset.load(Ordering::Acquire)
    }

    /// The aborted transactions a `read_committed` read of
    /// `[from_offset, upper_offset)` must be told about.
    pub fn aborted_txns(&self, from_offset: i64, upper_offset: i64) -> Vec<AbortedTxn> {
        self.reader()
            .map(|r| r.aborted_txns(from_offset, upper_offset))
            .unwrap_or_default()
    }

    pub fn log_start_offset(&self) -> i64 {
        self.log_start_offset.load(Ordering::Acquire)
    }

    /// The log's read side, unless the partition is offline.
    pub fn reader(&self) -> Option<LogReader> {
        self.reader.read().clone()
    }

    /// Why the partition cannot serve, if it cannot: its log dir is
    /// offline, or its own log could not be opened.
    pub fn unavailable(&self) -> Option<String> {
        self.health
            .offline_reason()
            .map(|why| format!("log dir {} is offline: {why}", self.health.path().display()))
            .or_else(|| self.offline.lock().clone())
    }

    /// Appends validated batches. Concurrent calls are grouped: whoever
    /// finds no writer running drains the queue on a blocking thread, in
    /// arrival order, with one write per drained group.
    pub async fn append(
        self: &Arc<Self>,
        records: Bytes,
        headers: Vec<BatchHeader>,
    ) -> Result<Appended, AppendFailure> {
        self.queue(records, headers, None)?.outcome().await
    }

    /// Puts validated batches in the append queue now (see
    /// [`Partition::append`]): their place in the partition's write order
    /// is fixed when this returns, before the write. With `verify`, a
    /// transactional batch is refused unless it passes when the writer
    /// takes it (see [`Verify`]). Refused at once if the partition is
    /// unavailable.
    pub fn queue(
        self: &Arc<Self>,
        records: Bytes,
        headers: Vec<BatchHeader>,
        verify: Option<Verify>,
    ) -> Result<Queued, AppendFailure> {
        self.enqueue(records, headers, None, verify, false)
    }

    /// Appends a coordinator's own batches to a partition of its internal
    /// topic (`__consumer_offsets`): the coordinator orders and checks its
    /// writes itself (its transactional records and markers are its
    /// table's, not a producer's sequence), so they take offsets without
    /// the producer checks and leave the partition's producer state alone.
    pub async fn append_unchecked(
        self: &Arc<Self>,
        records: Bytes,
        headers: Vec<BatchHeader>,
    ) -> Result<Appended, AppendFailure> {
        self.enqueue(records, headers, None, None, true)?.outcome().await
    }

    /// Takes a [`VerificationGuard`] for a transactional batch, before its
    /// coordinator is asked about it.
    pub fn verification_guard(self: &Arc<Self>, batch: TxnWrite) -> VerificationGuard {
        let token = NEXT_GUARD.fetch_add(1, Ordering::Relaxed);
        self.verifying.lock().insert(token, batch);
        VerificationGuard {
            partition: Arc::clone(self),
            token,
            term: self.replica.term().map(|t| t.generation),
        }
    }

    /// Appends the marker that ends `producer_id`'s transaction here
    /// (commit or abort), through the same queue as produce requests. The
    /// guards of the batches whose transaction it ends are void from here
    /// on: such a batch queued behind the marker belongs to no transaction
    /// it checked.
    pub async fn write_marker(
        self: &Arc<Self>,
        producer_id: i64,
        producer_epoch: i16,
        marker: Marker,
    ) -> Result<Appended, AppendFailure> {
        self.verifying
            .lock()
            .retain(|_, g| !g.ended_by(producer_id, producer_epoch));
        let batch = keel_log::marker::marker_batch(producer_id, producer_epoch, marker, self.clock.now_ms());
        let headers = keel_log::batch::validate_batches(&batch).map_err(|e| AppendFailure {
            error: ResponseError::UnknownServerError,
            message: format!("a marker batch does not validate: {e}"),
        })?;
        self.enqueue(Bytes::from(batch), headers, Some(marker), None, false)?
            .outcome()
            .await
    }

    fn enqueue(
        self: &Arc<Self>,
        records: Bytes,
        headers: Vec<BatchHeader>,
        marker: Option<Marker>,
        verify: Option<Verify>,
        unchecked: bool,
    ) -> Result<Queued, AppendFailure> {
        if let Some(why) = self.unavailable() {
            return Err(AppendFailure {
                error: ResponseError::KafkaStorageError,
                message: why,
            });
        }
        let (reply, done) = oneshot::channel();
        let start_writer = {
            let mut q = self.queue.lock();
            q.items.push(PendingAppend {
                records,
                headers,
                marker,
                verify,
                unchecked,
                reply,
                enqueued: Instant::now(),
            });
            !std::mem::replace(&mut q.writer_active, true)
        };
        if start_writer {
            let me = Arc::clone(self);
            tokio::task::spawn_blocking(move || me.drain_queue());
        }
        Ok(Queued { done })
    }

    /// Writes queued appends until the queue is empty. A panic while
    /// writing a group fails that group's requests (their reply channels
    /// close) and reloads the log from disk; the partition keeps taking
    /// appends.
    fn drain_queue(self: Arc<Self>) {
        loop {
            let items = {
                let mut q = self.queue.lock();
                if q.items.is_empty() {
                    q.writer_active = false;
                    return;
                }
                std::mem::take(&mut q.items)
            };
            for group in split_by_offsets(items) {
                let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    Arc::clone(&self).write_group(group)
                }));
                if written.is_err() {
                    self.reload("a panic while appending");
                }
            }
            self.spawn_seals();
        }
    }

    /// Writes one group of pending appends and replies to each.
    fn write_group(self: Arc<Self>, group: Vec<PendingAppend>) {
        let picked = Instant::now();
        let mut st = self.writer.lock();
        let locked = Instant::now();
        let refused = self.refusal(&st);
        // One node has no terms: no lock taken for it on the append path.
        let term = self.wal.as_ref().and_then(|_| self.replica.term());
        if let Some(why) = refused.or_else(|| self.cluster_refusal(term)) {
            drop(st);
            for item in group {
                let _ = item.reply.send(Err(why.clone()));
            }
            return;
        }
        let Writer { log, producers, .. } = &mut *st;
        let log = log.as_mut().expect("refusal() checked the log is open");
        let first_offset = log.log_end_offset();
        // One time for the group: its producer state and its write.
        let now = self.clock.now_ms();
        let mut plan = plan_group(producers, group, first_offset, now, (picked, locked));
        let epoch = term.map_or(LEADER_EPOCH, |t| t.epoch);
        stamp_leader_epoch(&mut plan.buf, &plan.headers, epoch);
        let (failure, written, written_at) = self.write_planned(log, producers, &mut plan, first_offset, now);
        let (end, start) = (log.log_end_offset(), log.log_start_offset());
        let lso = stable_offset(producers, end);
        self.published_producers.update(producers, &plan.named);
        match (term, plan.written.take()) {
            (None, _) => self.store_offsets(end, lso, start),
            (Some(term), written) => {
                self.store_log_start(start);
                if let Some(records) = written.filter(|_| self.replica.written(term.generation, end, lso)) {
                    self.hand_to_wal(term, first_offset, end, records);
                }
            }
        }
        drop(st);
        self.wake_waiters();
        let answered = Instant::now();
        let publish = written_at.map_or(Duration::ZERO, |at| answered - at);
        for (reply, result, waited) in plan.replies {
            let result = match (&failure, result) {
                (Some(f), Ok((offset, _))) if offset >= first_offset => Err(f.clone()),
                (_, r) => r.map(|(base_offset, at)| Appended {
                    base_offset,
                    log_start_offset: start,
                    term,
                    trace: AppendTrace {
                        // This append's own batches start `at` bytes into
                        // the group's write.
                        written: at.zip(written).map(|(at, w)| Written {
                            position: w.position + at,
                            ..w
                        }),
                        publish,
                        answered,
                        ..waited
                    },
                }),
            };
            let _ = reply.send(result);
        }
    }

    /// Writes a planned group's batches (if any) in one append: on success
    /// counts them, caches them in the tail and indexes them; on failure
    /// rolls the producer state back (and takes the dir offline for a
    /// failed fsync). Returns the failure, where the batches went and when.
    fn write_planned(
        &self,
        log: &mut PartitionLog,
        producers: &mut ProducerStates,
        plan: &mut GroupPlan,
        first_offset: i64,
        now: i64,
    ) -> (Option<AppendFailure>, Option<Written>, Option<Instant>) {
        if plan.buf.is_empty() {
            return (None, None, None);
        }
        let appended = log.append(&mut plan.buf, &plan.headers, now);
        let written_at = Some(Instant::now());
        match appended {
            Ok(info) => {
                let written = Written {
                    times: info.times,
                    segment_base_offset: info.segment_base_offset,
                    position: info.position,
                };
                assert_eq!(
                    info.base_offset, first_offset,
                    "log assigned offsets the plan did not expect"
                );
                let buf = Bytes::from(std::mem::take(&mut plan.buf));
                self.io.budget(IoClass::Live).count(buf.len() as u64);
                // Cached before the high watermark moves, so a fetch woken
                // by this append finds the batches in memory.
                self.tail
                    .insert(cached_batches(buf.clone(), &plan.headers, first_offset));
                if self.wal.is_some() {
                    plan.written = Some(buf);
                }
                self.index_appended(log, producers, &info, &plan.undo, &plan.aborted);
                (None, Some(written), written_at)
            }
            Err(e) => {
                for snapshot in std::mem::take(&mut plan.undo).into_iter().rev() {
                    producers.restore(snapshot);
                }
                if let AppendError::Offline(why) = &e {
                    self.health.take_offline(why);
                }
                (Some(storage_failure(e.to_string())), None, written_at)
            }
        }
    }

    /// In a cluster, why appends are refused now: the partition is not
    /// claimed (NOT_LEADER_OR_FOLLOWER; the client asks for metadata and
    /// tries again), or the WAL is full of writes the object store has not
    /// taken (NOT_ENOUGH_REPLICAS, retriable).
    fn cluster_refusal(&self, term: Option<Term>) -> Option<AppendFailure> {
        let wal = self.wal.as_ref()?;
        if term.is_none() {
            return Some(AppendFailure {
                error: ResponseError::NotLeaderOrFollower,
                message: "this broker has not taken the partition's leadership yet".into(),
            });
        }
        (!wal.has_room()).then(|| AppendFailure {
            error: ResponseError::NotEnoughReplicas,
            message: format!(
                "{} bytes of writes are waiting for the object store",
                wal.unwritten_bytes()
            ),
        })
    }

    /// Hands a written group to the WAL (see [`crate::wal`]).
    fn hand_to_wal(self: &Arc<Self>, term: Term, base_offset: i64, end_offset: i64, records: Bytes) {
        let Some(wal) = &self.wal else {
            return;
        };
        wal.push(Group {
            partition: Arc::clone(self),
            topic_id: self.topic_id,
            generation: term.generation,
            epoch: term.epoch,
            base_offset,
            end_offset,
            records,
        });
    }

    /// Why appends are refused now, if they are.
    fn refusal(&self, st: &Writer) -> Option<AppendFailure> {
        let (error, message) = match st.closed {
            Some(Closed::Shutdown) => (
                ResponseError::NotLeaderOrFollower,
                "the broker is shutting down".to_string(),
            ),
            Some(Closed::Deleted) => (
                ResponseError::UnknownTopicOrPartition,
                "the topic was deleted".to_string(),
            ),
            None => match (self.unavailable(), &st.log) {
                (Some(why), _) => (ResponseError::KafkaStorageError, why),
                (None, None) => (
                    ResponseError::KafkaStorageError,
                    "the partition's log is not open".to_string(),
                ),
                (None, Some(_)) => return None,
            },
        };
        Some(AppendFailure { error, message })
    }

    /// After a group's append: the producer snapshot a roll asks for, and
    /// the aborted-transaction entries of its ABORT markers.
    fn index_appended(
        &self,
        log: &mut PartitionLog,
        producers: &ProducerStates,
        info: &keel_log::AppendInfo,
        undo: &[ProducerSnapshot],
        aborted: &[AbortedTxn],
    ) {
        if info.rolled {
            // The state at the new segment's base offset (the group rolled
            // before its first batch), as Kafka snapshots at each roll:
            // start-up replays the whole active segment, so the
            // aborted-transaction entries of its markers (held in memory
            // until its seal) are rebuilt after a crash.
            assert_eq!(
                info.segment_base_offset, info.base_offset,
                "a roll precedes the group"
            );
            let before = producers.before(undo);
            log.queue_producer_snapshot(info.base_offset, before.encode_snapshot());
        }
        let indexed = aborted.iter().try_for_each(|txn| log.add_aborted_txn(*txn));
        if let Err(e) = indexed {
            // The segment's own entries stay in memory and are written at
            // its seal; only a restored entry of a sealed segment could
            // fail here.
            tracing::error!(topic = %self.topic, partition = self.index, error = %e, "cannot write an aborted-transaction index");
        }
    }

    /// Drops the in-memory log and producer state and opens the log again
    /// from disk (recovering what an unfinished write left), after a panic
    /// left them in an unknown state. If that fails the partition goes
    /// offline. Blocking.
    fn reload(&self, why: &str) {
        tracing::error!(topic = %self.topic, partition = self.index, why, "reloading the partition's log");
        let mut st = self.writer.lock();
        if let Some(old) = st.log.take() {
            // The old log's queued seals must not run beside the new one.
            old.sealer().fence();
        }
        if st.closed.is_some() {
            return;
        }
        self.tail.clear();
        // Before the new log is in and after (below): no fetch is served
        // what was read from the old one.
        self.forget_scans();
        let config = self.config.lock().clone();
        match open_log(&self.storage, &self.dir, &config, self.clock.now_ms()) {
            Ok((log, producers)) => {
                let reader = log.reader().clone();
                let (hw, start) = (reader.log_end_offset(), reader.log_start_offset());
                let lso = stable_offset(&producers, hw);
                st.log = Some(log);
                self.published_producers.replace(&producers);
                st.producers = producers;
                *self.reader.write() = Some(reader);
                match self.replica.term() {
                    // What the panic left uncommitted is cut by the next
                    // claim; until then the partition takes no write.
                    Some(term) if self.wal.is_some() => {
                        self.replica.end_term(term.generation);
                        self.store_log_start(start);
                    }
                    _ if self.wal.is_some() => self.store_log_start(start),
                    _ => self.store_offsets(hw, lso, start),
                }
                drop(st);
                self.forget_scans();
                self.wake_waiters();
            }
            Err(e) => {
                tracing::error!(topic = %self.topic, partition = self.index, error = %e, "the partition goes offline");
                *self.offline.lock() = Some(e.to_string());
            }
        }
    }

    /// Runs the log's queued seals (index files and fsync of rolled
    /// segments, producer snapshots) on a blocking thread, unless one is
    /// already doing it. Appends never wait for them. Called after appends,
    /// and by the broker's flush timer so that a seal that failed for want
    /// of a descriptor or disk space is retried.
    pub fn spawn_seals(self: &Arc<Self>) {
        let sealer = match self.writer.try_lock().as_deref() {
            Some(Writer { log: Some(log), .. }) if log.sealer().has_pending() => Arc::clone(log.sealer()),
            // Busy: the writer spawns the seals itself after its append.
            _ => return,
        };
        if self.sealing.swap(true, Ordering::AcqRel) {
            return;
        }
        // The task holds no reference to the partition, so dropping the
        // partition is never held up by a seal in progress.
        let (sealing, health) = (Arc::clone(&self.sealing), Arc::clone(&self.health));
        let name = format!("{}-{}", self.topic, self.index);
        let run = move || {
            loop {
                let failed = sealer.run_pending().is_err();
                if let Some(why) = sealer.failure() {
                    health.take_offline(&format!("{name}: {why}"));
                }
                sealing.store(false, Ordering::Release);
                if failed {
                    // Retried by the broker's flush timer, not in a loop.
                    return;
                }
                // Work queued after the run looked: take it, unless another
                // thread already did.
                if !sealer.has_pending() || sealing.swap(true, Ordering::AcqRel) {
                    return;
                }
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => drop(handle.spawn_blocking(run)),
            Err(_) => run(),
        }
    }

    /// Wakes the fetches waiting for an append.
    fn wake_waiters(&self) {
        for w in std::mem::take(&mut *self.waiters.lock()) {
            w.notify_one();
        }
    }

    /// Publishes the offsets readers see. Callers hold the writer lock (or
    /// own the partition, at open), so publications happen in the order
    /// the writer computed them. The high watermark, the last stable
    /// offset and the log start offset never move back: if one would, an
    /// invariant is broken, and the broker stops here (in release builds
    /// too) rather than show consumers a log that shrank or records that
    /// were deleted.
    fn store_offsets(&self, high_watermark: i64, last_stable_offset: i64, log_start_offset: i64) {
        self.store_watermarks(high_watermark, last_stable_offset);
        let was = self.log_start_offset.swap(log_start_offset, Ordering::AcqRel);
        assert!(
            log_start_offset >= was,
            "{}-{}: the log start offset would move back from {was} to {log_start_offset}",
            self.topic,
            self.index
        );
    }

    /// The high watermark and last stable offset alone (see
    /// [`Partition::store_offsets`]).
    fn store_watermarks(&self, high_watermark: i64, last_stable_offset: i64) {
        assert!(
            last_stable_offset <= high_watermark,
            "{}-{}: last stable offset {last_stable_offset} above the high watermark {high_watermark}",
            self.topic,
            self.index
        );
        let was = self.high_watermark.swap(high_watermark, Ordering::AcqRel);
        assert!(
            high_watermark >= was,
            "{}-{}: the high watermark would move back from {was} to {high_watermark}",
            self.topic,
            self.index
        );
        let was = self.last_stable_offset.swap(last_stable_offset, Ordering::AcqRel);
        assert!(
            last_stable_offset >= was,
            "{}-{}: the last stable offset would move back from {was} to {last_stable_offset}",
            self.topic,
            self.index
        );
    }

    /// Publishes a new log start offset alone (in a cluster, where the high
    /// watermark moves with commits).
    fn store_log_start(&self, log_start_offset: i64) {
        self.log_start_offset
            .fetch_max(log_start_offset, Ordering::AcqRel);
    }

    /// The offset retention, the mover and DeleteRecords must not pass: the
    /// committed offset in a cluster; none for one node, whose every
    /// written record is the log's.
    pub fn retention_ceiling(&self) -> i64 {
        match self.wal {
            Some(_) => self.high_watermark(),
            None => i64::MAX,
        }
    }

    /// Whether this broker may serve the partition as its leader in
    /// `epoch`: always for one node; in a cluster once it has claimed the
    /// partition in that epoch.
    pub fn serves_in(&self, epoch: i32) -> bool {
        self.wal.is_none() || self.replica.term().is_some_and(|t| t.epoch == epoch)
    }

    /// The leader epoch this broker has claimed the partition in, if any.
    pub fn claimed_epoch(&self) -> Option<i32> {
        self.replica.term().map(|t| t.epoch)
    }

    /// The revision of this broker's claim of the partition, while it
    /// leads it: what its records of segment copies and log starts in the
    /// coordination store compare.
    pub fn claimed_revision(&self) -> Option<i64> {
        self.replica.claimed_at()
    }

    /// Takes the partition's leadership in `epoch`, its log committed up
    /// to `committed` (the claim in the coordination store, made by the
    /// caller at `revision`): what the local log holds past it was never
    /// committed, never read and never acknowledged, and is cut; then the
    /// committed offset becomes the high watermark and appends are taken.
    /// Refused if the local log ends below the committed offset (its
    /// records are only in the object store). Blocking.
    ///
    /// `rebuilt`: the log was just rebuilt from the object store
    /// ([`Partition::restart_log`], [`Partition::replay`]), so its producer
    /// state is read from it again.
    pub fn take_leadership(
        &self,
        epoch: i32,
        committed: i64,
        revision: i64,
        rebuilt: bool,
    ) -> Result<(), String> {
        let mut st = self.writer.lock();
        if let Some(why) = self.refusal(&st) {
            return Err(why.message);
        }
        let log = st.log.as_mut().expect("refusal() checked the log is open");
        let end = log.log_end_offset();
        if committed < log.log_start_offset() {
            return Err(format!(
                "the committed offset {committed} is below the local log's start {}",
                log.log_start_offset()
            ));
        }
        if end < committed {
            return Err(format!(
                "the local log ends at {end}, below the committed offset {committed}: \
                 its records after {end} are in the object store only"
            ));
        }
        if end > committed || rebuilt {
            if end > committed {
                tracing::warn!(
                    topic = %self.topic, partition = self.index, from = committed, to = end, epoch,
                    "cutting uncommitted records from the local log before leading"
                );
                log.truncate_to(committed).map_err(|e| e.to_string())?;
            }
            // Seals the replay's rolls queued: done before the log's files
            // are read again.
            log.complete_seals().map_err(|e| e.to_string())?;
            // Producer state as of the cut: reopened from the log.
            let config = self.config.lock().clone();
            let (log, producers) = open_log(&self.storage, &self.dir, &config, self.clock.now_ms())
                .map_err(|e| e.to_string())?;
            if let Some(old) = st.log.take() {
                // The old log's seals must not run beside the new one.
                old.sealer().fence();
            }
            self.tail.clear();
            self.forget_scans();
            *self.reader.write() = Some(log.reader().clone());
            self.published_producers.replace(&producers);
            st.log = Some(log);
            st.producers = producers;
            self.forget_scans();
        }
        let Writer { log, producers, .. } = &*st;
        let start = log.as_ref().map_or(0, |l| l.log_start_offset());
        if let Some(log) = log {
            // Until the mover's next pass names them, the snapshots of
            // segments not yet copied are kept (a log just opened keeps
            // only its newest two).
            log.keep_snapshots_of_uncopied();
            self.keeps_uncopied_snapshots.store(true, Ordering::Relaxed);
        }
        let lso = stable_offset(producers, committed);
        self.replica.claim(epoch, (committed, revision), || {
            self.store_log_start(start);
            self.store_watermarks(committed, lso);
        });
        drop(st);
        self.wake_waiters();
        Ok(())
    }

    /// Empties the local log to rebuild it from the object store: it
    /// starts at `start`, with `cold` (segments in the object store) up to
    /// `offset`, where the records replayed from WAL objects
    /// ([`Partition::replay`]) go. The partition must not be led here.
    ///
    /// `snapshot`: the producer-state snapshot at `offset`, if the object
    /// store has one (else the state is read from the replayed records).
    pub fn restart_log(
        &self,
        (start, offset): (i64, i64),
        cold: Vec<keel_log::TieredSegment>,
        snapshot: Option<Vec<u8>>,
    ) -> Result<(), String> {
        let mut st = self.writer.lock();
        if let Some(why) = self.refusal(&st) {
            return Err(why.message);
        }
        if self.replica.term().is_some() {
            return Err("the partition is led here".into());
        }
        let log = st.log.as_mut().expect("refusal() checked the log is open");
        self.forget_scans();
        log.restart_at(start, offset, cold).map_err(|e| e.to_string())?;
        // Producer state below `offset` is the snapshot's (or none): the
        // reopen at the claim reads the rest from `offset` on.
        let snapshot = snapshot
            .filter(|bytes| match ProducerStates::decode_snapshot(bytes) {
                Ok(_) => true,
                Err(why) => {
                    tracing::warn!(topic = %self.topic, partition = self.index, offset, %why, "ignoring a producer snapshot from the object store");
                    false
                }
            })
            .unwrap_or_else(|| ProducerStates::default().encode_snapshot());
        log.queue_producer_snapshot(offset, snapshot);
        log.complete_seals().map_err(|e| e.to_string())?;
        self.tail.clear();
        self.forget_scans();
        Ok(())
    }

    /// Rolls the active segment once it is `max_age_ms` old, writing the
    /// producer snapshot at the roll: in a cluster, so that the mover
    /// copies its records to the object store and the WAL objects holding
    /// them can be deleted. Whether it rolled.
    pub fn roll_if_older(&self, max_age_ms: i64) -> Result<bool, String> {
        let mut st = self.writer.lock();
        if let Some(why) = self.refusal(&st) {
            return Err(why.message);
        }
        let Writer { log, producers, .. } = &mut *st;
        let log = log.as_mut().expect("refusal() checked the log is open");
        let end = log.log_end_offset();
        let rolled = log
            .roll_if_older(self.clock.now_ms(), max_age_ms)
            .map_err(|e| e.to_string())?;
        if rolled {
            log.queue_producer_snapshot(end, producers.encode_snapshot());
        }
        Ok(rolled)
    }

    /// Appends `batches` (whole batches in Kafka's format, offsets and
    /// leader epochs as their leader wrote them) at the end of a log
    /// being rebuilt; they must start where it ends.
    pub fn replay(&self, batches: &[u8]) -> Result<(), String> {
        let mut st = self.writer.lock();
        if let Some(why) = self.refusal(&st) {
            return Err(why.message);
        }
        if self.replica.term().is_some() {
            return Err("the partition is led here".into());
        }
        let headers =
            keel_log::batch::validate_batches(batches).map_err(|e| format!("a WAL object's batches: {e}"))?;
        let log = st.log.as_mut().expect("refusal() checked the log is open");
        let end = log.log_end_offset();
        let mut next = end;
        for h in &headers {
            if h.base_offset != next {
                return Err(format!(
                    "a WAL batch at offset {} where the rebuilt log needs offset {next}",
                    h.base_offset
                ));
            }
            next = h.last_offset() + 1;
        }
        let mut records = batches.to_vec();
        log.append(&mut records, &headers, self.clock.now_ms())
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Ends this broker's leadership term, if it has one: nothing written
    /// past the committed offset will be acknowledged (see
    /// [`crate::replica`]).
    pub fn give_up_leadership(&self) {
        if let Some(term) = self.replica.term() {
            self.replica.end_term(term.generation);
        }
    }

    /// Waits until the append `a` is committed (the high watermark passed
    /// it), at most `timeout`: acks=all in a cluster. At once for one node,
    /// whose appends are durable as written.
    pub async fn wait_durable(&self, a: &Appended, timeout: Duration) -> Result<(), NotDurable> {
        let Some(term) = a.term else {
            return Ok(());
        };
        self.replica.wait(term.generation, a.base_offset, timeout).await
    }

    pub(crate) fn replica_revision(&self, generation: u64) -> Option<i64> {
        self.replica.revision(generation)
    }

    /// The WAL committed this partition's groups of `generation` up to
    /// `end`, at `revision`.
    pub(crate) fn on_committed(&self, generation: u64, end: i64, revision: i64) {
        self.replica.committed(generation, end, revision, |hw, lso| {
            self.store_watermarks(hw, lso)
        });
        self.wake_waiters();
    }

    /// The cluster refused this partition's commits of `generation`.
    pub(crate) fn on_fenced(&self, generation: u64) -> bool {
        self.replica.end_term(generation)
    }

    /// Registers a fetch to be woken by the next append. Entries of fetches
    /// that have finished are pruned here, so idle partitions do not collect
    /// them.
    pub fn register_waiter(&self, waiter: &Arc<Notify>) {
        let mut w = self.waiters.lock();
        w.retain(|n| Arc::strong_count(n) > 1);
        if !w.iter().any(|n| Arc::ptr_eq(n, waiter)) {
            w.push(Arc::clone(waiter));
        }
    }

    /// Plans a read from the view (no I/O, no writer lock).
    pub fn read_plan(&self, offset: i64, max_bytes: usize) -> Result<ReadPlan, ReadFailure> {
        let reader = self.available_reader()?;
        let hint = self
            .scan_hints
            .lock()
            .iter()
            .find(|h| h.next_offset() == offset)
            .cloned();
        reader
            .read_plan_after(offset, max_bytes, hint)
            .map_err(|e| match e {
                ReadError::OffsetOutOfRange { .. } => ReadFailure::OffsetOutOfRange,
                damaged @ ReadError::Damaged { .. } => {
                    ReadFailure::Storage(format!("{}-{}: {damaged}", self.topic, self.index))
                }
            })
    }

    fn available_reader(&self) -> Result<LogReader, ReadFailure> {
        if let Some(why) = self.unavailable() {
            return Err(ReadFailure::Storage(why));
        }
        self.reader()
            .ok_or_else(|| ReadFailure::Storage("the partition's log is not open".into()))
    }

    /// Resolves `reader`'s fetch at `offset` to its source: the tail cache
    /// when the offset is in its run (below the high watermark), else the
    /// partition's shared scan: data read before, a read in flight from
    /// the offset, or a read of the files (see [`crate::scan`]). The
    /// partition notes where the reader read ([`Readers`]).
    ///
    /// `committed` reads (`read_committed`) end at the last stable offset;
    /// batches at or past it that a file read returns are the caller's to
    /// cut (`Chunks::below`).
    pub fn read(
        self: &Arc<Self>,
        reader: &Reader,
        offset: i64,
        max_bytes: usize,
        committed: bool,
    ) -> Result<ReadSource, ReadFailure> {
        self.readers.note(reader, offset, self.clock.now_ms());
        if let Some(why) = self.unavailable() {
            return Err(ReadFailure::Storage(why));
        }
        let (start, hw) = (self.log_start_offset(), self.high_watermark());
        let end = if committed { self.last_stable_offset() } else { hw };
        if offset >= end && offset <= hw && offset >= start {
            // Nothing to read yet. Planning a file read here would race an
            // append landing meanwhile: its batches would come from disk
            // (they are in the tail cache) and before the high watermark
            // moved. The fetch is woken by that append (or marker) instead.
            return Ok(ReadSource::Memory(Chunks::default()));
        }
        if offset >= start && offset < end {
            if let Some(bytes) = self.tail.read(offset, end, max_bytes) {
                self.cache_read_bytes
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                self.scan.lock().leave(reader);
                return Ok(ReadSource::Memory(bytes));
            }
        } else {
            // Out of range, unless the log moved meanwhile: the plan says.
            self.read_plan(offset, max_bytes)?;
            if offset >= hw {
                // Written here but not committed yet (a cluster's log runs
                // ahead of its high watermark): nothing to read yet.
                return Ok(ReadSource::Memory(Chunks::default()));
            }
        }
        self.read_below_tail(reader, offset, max_bytes)
    }

    /// A fetch below the tail cache, through the shared scan.
    fn read_below_tail(
        self: &Arc<Self>,
        reader: &Reader,
        offset: i64,
        max_bytes: usize,
    ) -> Result<ReadSource, ReadFailure> {
        let (tx, rx) = oneshot::channel();
        let at = FetchAt {
            offset,
            max_bytes,
            now_ms: self.clock.now_ms(),
            ahead_limit: self.ahead_limit(),
            contended: self.cold.contended(),
        };
        let step = self.scan.lock().fetch(reader, at, tx);
        tracing::trace!(topic = %self.topic, partition = self.index, client = %reader.client_id, offset, contended = at.contended, step = step.name(), "shared scan");
        match step {
            Step::Serve { data, ahead } => {
                self.cold_read_bytes
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
                if let Some(order) = ahead {
                    self.read_ahead(order);
                }
                Ok(ReadSource::ReadAhead(data))
            }
            Step::Wait => Ok(ReadSource::Pending(rx)),
            // Paced (a reader ahead of a lead that will reach it): no data
            // now; the fetch waits as at the log end, and asks again.
            Step::Defer => Ok(ReadSource::Memory(Chunks::default())),
            Step::Read(order) => match self.read_plan(offset, max_bytes) {
                Ok(plan) if plan.is_empty() => {
                    self.finish_read(order.id, Ok(Bytes::new()));
                    Ok(ReadSource::Memory(Chunks::default()))
                }
                Ok(plan) => Ok(ReadSource::Disk(DiskRead {
                    partition: Arc::clone(self),
                    id: order.id,
                    plan: Some(plan),
                    rx: Some(rx),
                })),
                Err(failure) => {
                    self.finish_read(order.id, Err(failure.to_io()));
                    Err(failure)
                }
            },
        }
    }

    /// Where read-ahead stops: the tail cache's first offset, or the high
    /// watermark.
    fn ahead_limit(&self) -> i64 {
        let hw = self.high_watermark();
        self.tail.first_offset().map_or(hw, |first| first.min(hw))
    }

    /// Runs a read the scan ordered ahead of the fetches that will ask.
    fn read_ahead(self: &Arc<Self>, order: ReadOrder) {
        match self.read_plan(order.offset, order.max_bytes) {
            Ok(plan) if plan.is_empty() => self.finish_read(order.id, Ok(Bytes::new())),
            Ok(plan) => self.run_read(order.id, plan),
            Err(failure) => self.finish_read(order.id, Err(failure.to_io())),
        }
    }

    /// Runs a planned read on the cold executor, then hands its data to
    /// the scan.
    fn run_read(self: &Arc<Self>, id: ReadId, plan: ReadPlan) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let result = me.cold.read(me.plan_reader(plan)).await;
            me.finish_read(id, result);
        });
    }

    /// A read completed: the fetches that waited for it get its data, it
    /// is held for the readers behind, and the read-ahead it calls for
    /// starts (before the waiters get their answer, so their next fetch
    /// finds it in flight).
    fn finish_read(self: &Arc<Self>, id: ReadId, result: std::io::Result<Bytes>) {
        let (now, limit) = (self.clock.now_ms(), self.ahead_limit());
        let data = result.as_ref().ok().cloned();
        let done = self.scan.lock().complete(id, data, now, limit);
        if let Some(order) = done.ahead {
            self.read_ahead(order);
        }
        if done.wake {
            // A paced reader's long poll ends: its data is here.
            self.wake_waiters();
        }
        for (waiter, data) in done.deliveries {
            let answer = match (data, &result) {
                (Some(bytes), _) => Ok(bytes),
                (None, Err(e)) => Err(std::io::Error::new(e.kind(), e.to_string())),
                (None, Ok(_)) => Err(std::io::Error::other("the read failed")),
            };
            let _ = waiter.send(answer);
        }
    }

    /// The log changed under the scans (reopened, truncated, rebuilt):
    /// nothing read before is served again, and no scan hint holds.
    fn forget_scans(&self) {
        self.scan.lock().clear();
        self.scan_hints.lock().clear();
    }

    /// Drops held scan data of readers gone idle, and below the log start.
    pub fn tick_scan(&self) {
        self.scan
            .lock()
            .tick(self.clock.now_ms(), self.log_start_offset());
    }

    /// How long `reader` was paced in its scan below the tail cache so
    /// far, and whether it is paced now; `None` for a reader not there.
    pub fn scan_pacing(&self, reader: &Reader) -> Option<(i64, bool)> {
        self.scan.lock().slowed(reader)
    }

    /// What the shared scan holds now.
    pub fn scan_summary(&self) -> ScanSummary {
        self.scan.lock().summary()
    }

    /// The blocking read of a plan: the local file, or the colder tier that
    /// holds its offsets. Says how many bytes it took from the disk.
    ///
    /// A read whose batches hold no record (a cleaned segment can end up
    /// as one emptied batch) goes on into the segments after it, within
    /// `max_bytes`: librdkafka takes a fetch without a record for a
    /// message too large to fetch.
    fn plan_reader(
        self: &Arc<Self>,
        plan: ReadPlan,
    ) -> impl FnOnce() -> std::io::Result<ColdRead> + Send + 'static {
        let me = Arc::clone(self);
        move || {
            let max_bytes = plan.max_bytes();
            let mut read = me.read_planned(&plan)?;
            for _ in 0..MAX_EMPTY_READS {
                let remaining = max_bytes.saturating_sub(read.bytes.len());
                let next = match next_offset_after(&read.bytes) {
                    Some(next) if remaining > 0 && holds_no_record(&read.bytes) => next,
                    _ => break,
                };
                if next >= me.high_watermark() {
                    break;
                }
                let Ok(plan) = me.read_plan(next, remaining) else {
                    break;
                };
                let more = me.read_planned(&plan)?;
                if more.bytes.is_empty() {
                    break;
                }
                let mut joined = Vec::with_capacity(read.bytes.len() + more.bytes.len());
                joined.extend_from_slice(&read.bytes);
                joined.extend_from_slice(&more.bytes);
                read = ColdRead {
                    bytes: Bytes::from(joined),
                    disk_bytes: read.disk_bytes + more.disk_bytes,
                };
            }
            Ok(read)
        }
    }

    /// Reads whole batches from `offset`, about `max_bytes` of them (empty
    /// at the log end), from the local log or the colder tier that holds
    /// them. Blocking: for a coordinator loading its partition's records.
    pub fn read_blocking(&self, offset: i64, max_bytes: usize) -> Result<Bytes, String> {
        let plan = self.read_plan(offset, max_bytes).map_err(|e| match e {
            ReadFailure::OffsetOutOfRange => {
                format!("{}-{}: offset {offset} is out of range", self.topic, self.index)
            }
            ReadFailure::Storage(why) => why,
        })?;
        if plan.is_empty() {
            return Ok(Bytes::new());
        }
        self.read_planned(&plan)
            .map(|read| read.bytes)
            .map_err(|e| format!("{}-{}: {e}", self.topic, self.index))
    }

    /// The blocking read of one plan: the local file, or the colder tier.
    fn read_planned(&self, plan: &ReadPlan) -> std::io::Result<ColdRead> {
        match plan.tiered_segment() {
            Some(segment) => self
                .tiers
                .read_blocking(segment, plan.target_offset(), plan.max_bytes()),
            None => {
                let read = plan.execute_scan()?;
                let target = plan.target_offset();
                if self
                    .tier_hold
                    .lock()
                    .as_ref()
                    .is_some_and(|h| (h.base_offset..h.next_offset).contains(&target))
                {
                    self.held_read_bytes
                        .fetch_add(read.bytes.len() as u64, Ordering::Relaxed);
                }
                if let Some(hint) = read.hint {
                    let mut hints = self.scan_hints.lock();
                    hints.retain(|h| h.next_offset() != hint.next_offset());
                    if hints.len() >= SCAN_HINTS {
                        hints.remove(0);
                    }
                    hints.push(hint);
                }
                Ok(ColdRead {
                    bytes: read.bytes,
                    disk_bytes: read.disk_bytes,
                })
            }
        }
    }

    /// The blocking ListOffsets-by-timestamp lookup of a plan, local or in
    /// a colder tier.
    pub fn timestamp_reader(
        &self,
        plan: keel_log::TimestampPlan,
    ) -> impl FnOnce() -> std::io::Result<Option<(i64, i64)>> + Send + 'static {
        let tiers = Arc::clone(&self.tiers);
        move || match plan.tiered_segment() {
            Some(segment) => {
                tiers.find_timestamp_blocking(segment, plan.timestamp_ms(), plan.log_start_offset())
            }
            None => plan.execute(),
        }
    }

    /// Drops written segment data from the page cache (see
    /// [`PageCacheMarks`] for which segments a pass covers). The tail cache
    /// holds the newest data; the page cache holds none of it for long.
    /// Blocking.
    pub fn drop_written_pages(&self) {
        let Some(reader) = self.reader() else { return };
        let from = self.page_cache_marks.lock().from();
        for (_, file) in &reader.segment_files_from(from) {
            if let Ok(f) = file.open() {
                f.drop_cache();
            }
        }
        self.page_cache_marks.lock().passed(reader.oldest_not_durable());
    }

    /// `(bytes of this partition's segment files in the page cache, their
    /// size)`, measured with mincore. Blocking (one mmap per segment).
    pub fn page_cache_residency(&self) -> (u64, u64) {
        let Some(reader) = self.reader() else {
            return (0, 0);
        };
        reader
            .segment_files_from(i64::MIN)
            .iter()
            .filter_map(|(_, f)| {
                let f = f.open().ok()?;
                keel_tier::resident::resident_bytes(f.std_file()?).ok()
            })
            .fold((0, 0), |(r, s), (fr, fs)| (r + fr, s + fs))
    }

    /// The segments the mover keeps on the fast tier for a reader, if any.
    pub fn tier_hold(&self) -> Option<crate::tiering::Hold> {
        self.tier_hold.lock().clone()
    }

    /// What the mover's pass decided ([`crate::tiering`]).
    pub fn set_tier_hold(&self, hold: Option<crate::tiering::Hold>) {
        *self.tier_hold.lock() = hold;
    }

    /// Counts bytes a read plan of this partition returned from the files.
    pub fn note_cold_read(&self, bytes: u64) {
        self.cold_read_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Plans a ListOffsets-by-timestamp lookup from the view (no I/O).
    pub fn timestamp_plan(&self, timestamp_ms: i64) -> Result<Option<keel_log::TimestampPlan>, ReadFailure> {
        Ok(self.available_reader()?.timestamp_plan(timestamp_ms))
    }

    /// Flushes the log, writes a producer snapshot and its clean-shutdown
    /// marker, and refuses every later append. Blocking.
    pub fn close(&self) -> std::io::Result<()> {
        let mut st = self.writer.lock();
        st.closed.get_or_insert(Closed::Shutdown);
        let Writer { log, producers, .. } = &mut *st;
        let Some(log) = log.as_mut() else { return Ok(()) };
        if log.failure().is_some() {
            return Ok(()); // An untrusted log is recovered at the next start.
        }
        log.close_with_producer_snapshot(&producers.encode_snapshot())
    }

    /// Fences the partition for deletion: refuses every later append and
    /// maintenance step and returns its log (after any write in progress),
    /// for the caller to retire. Blocking.
    pub fn fence(&self) -> Option<PartitionLog> {
        let mut st = self.writer.lock();
        st.closed = Some(Closed::Deleted);
        st.log.take()
    }

    /// Runs `f` on the log's writer under the partition's writer lock, then
    /// publishes the offsets. For maintenance that only this partition's
    /// appends wait on: call it from a blocking thread. Refused, without
    /// running `f`, if the partition is offline, closed or deleted.
    pub fn with_log<T>(&self, f: impl FnOnce(&mut PartitionLog) -> T) -> Result<T, Unavailable> {
        let mut st = self.writer.lock();
        if let Some(why) = self.refusal(&st) {
            return Err(Unavailable(why.message));
        }
        let log = st.log.as_mut().expect("refusal() checked the log is open");
        let out = f(log);
        if let Some(why) = log.failure() {
            self.health.take_offline(&why);
        }
        let (hw, start) = (log.log_end_offset(), log.log_start_offset());
        if self.wal.is_some() {
            // The high watermark is the committed offset.
            self.store_log_start(start);
        } else {
            let lso = stable_offset(&st.producers, hw);
            self.store_offsets(hw, lso, start);
        }
        drop(st);
        Ok(out)
    }

    /// Applies altered topic configs: the open log takes them at once (its
    /// next append, roll check, flush and retention pass), and a reload or
    /// reopen uses them. Waits for an append in progress. Blocking.
    pub fn set_log_config(&self, config: LogConfig) -> Result<(), &'static str> {
        let mut st = self.writer.lock();
        if let Some(log) = st.log.as_mut() {
            log.set_config(config.clone())?;
        }
        *self.config.lock() = config;
        Ok(())
    }

    /// Drops the tail cache's batches below `offset`, which the cleaner has
    /// rewritten: reads of them go to the cleaned files.
    pub fn forget_cached_below(&self, offset: i64) {
        self.tail.forget_below(offset);
        self.forget_scanned_below(offset);
    }

    /// Drops what the shared scan read below `offset` (see
    /// [`ScanCore::invalidate_below`]): the cleaner is about to rewrite it.
    pub fn forget_scanned_below(&self, offset: i64) {
        self.scan.lock().invalidate_below(offset);
    }

    /// Forgets producers idle for `expiration_ms`. Returns how many.
    /// Waits for an append in progress. Blocking.
    pub fn expire_producers(&self, now_ms: i64, expiration_ms: i64) -> usize {
        let mut st = self.writer.lock();
        let expired = st.producers.expire(now_ms, expiration_ms);
        if expired > 0 {
            self.published_producers.replace(&st.producers);
        }
        expired
    }

    /// Producer id -> last offset of its newest batch here.
    pub fn producer_last_offsets(&self) -> std::collections::HashMap<i64, i64> {
        self.writer.lock().producers.last_offsets()
    }

    /// Every producer this partition has state for as of its last write
    /// (DescribeProducers), by producer id. Never waits for a write.
    /// Whether the producer's transaction at `producer_epoch` had written
    /// here and not ended, as of the last append: its next batch needs no
    /// coordinator's word (see [`open_transaction_check`]).
    pub fn in_open_transaction(&self, producer_id: i64, producer_epoch: i16) -> bool {
        self.published_producers
            .0
            .lock()
            .get(&producer_id)
            .is_some_and(|p| p.epoch == producer_epoch && p.txn_start_offset >= 0)
    }

    pub fn describe_producers(&self) -> Vec<ProducerInfo> {
        self.published_producers.0.lock().values().copied().collect()
    }

    /// How many producers this partition had state for at its last write.
    /// Never waits for a write.
    pub fn producer_count(&self) -> usize {
        self.published_producers.0.lock().len()
    }
}

/// Why a partition's log did not open.
#[derive(Debug)]
pub enum OpenFailure {
    /// The log's segments did not open or recover.
    Log {
        dir: PathBuf,
        error: keel_log::OpenError,
    },
    /// The producer state could not be rebuilt from the log.
    Producers { dir: PathBuf, error: std::io::Error },
}

impl std::fmt::Display for OpenFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenFailure::Log { dir, error } => write!(f, "{}: {error}", dir.display()),
            OpenFailure::Producers { dir, error } => {
                write!(f, "{}: producer state: {error}", dir.display())
            }
        }
    }
}

impl std::error::Error for OpenFailure {}

/// Opens a partition's log and loads its producer state: the newest
/// snapshot, then every batch header after it.
fn open_log(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    config: &LogConfig,
    now: i64,
) -> Result<(PartitionLog, ProducerStates), OpenFailure> {
    let mut log = PartitionLog::open_with(Arc::clone(storage), dir, config.clone()).map_err(|error| {
        OpenFailure::Log {
            dir: dir.to_path_buf(),
            error,
        }
    })?;
    let producers = load_producers(&mut log, now).map_err(|error| OpenFailure::Producers {
        dir: dir.to_path_buf(),
        error,
    })?;
    Ok((log, producers))
}

/// Producer state from the newest snapshot and the batches after it. A
/// snapshot that does not decode is ignored (with a warning) and the state
/// is rebuilt from the whole log instead.
fn load_producers(log: &mut PartitionLog, now: i64) -> std::io::Result<ProducerStates> {
    let (mut producers, from) = match log.take_producer_snapshot() {
        Some((offset, bytes)) => match ProducerStates::decode_snapshot(&bytes) {
            Ok(states) => (states, offset),
            Err(why) => {
                tracing::warn!(dir = %log.dir().display(), offset, %why, "ignoring a producer snapshot");
                (ProducerStates::default(), log.log_start_offset())
            }
        },
        None => (ProducerStates::default(), log.log_start_offset()),
    };
    let mut scan = log.batch_headers(from.max(log.log_start_offset()));
    let mut aborted = Vec::new();
    while let Some(header) = scan.next() {
        let header = header?;
        if !header.is_control() {
            producers.record(&header, header.base_offset, now);
            continue;
        }
        let batch = scan.read_last_batch()?;
        let marker = keel_log::marker::read_marker(&batch, &header)
            .map_err(|why| std::io::Error::new(std::io::ErrorKind::InvalidData, why))?;
        if let Some(marker) = marker {
            aborted.extend(end_transaction(
                &mut producers,
                &header,
                marker,
                header.base_offset,
                now,
            ));
        }
    }
    // The `.txnindex` of the segments written before the replay's start
    // holds these already; those after it get them back here.
    for txn in aborted {
        log.add_aborted_txn(txn)?;
    }
    Ok(producers)
}

/// Which segments a page-cache pass covers: every one not yet durable
/// (sealed and fsynced) at any of the last [`PageCacheMarks::PASSES`]
/// passes, so each segment gets passes until some seconds after its seal's
/// fsync. Advice to drop skips pages still dirty, under writeback or
/// otherwise busy; on a disk slower than the appends a rolled segment's
/// pages are all of that until its seal, and some stay busy for a moment
/// after it. Segments durable before that were dropped by earlier passes.
/// The first pass after start-up covers every segment.
#[derive(Debug, Default)]
struct PageCacheMarks {
    /// The oldest segment not durable at each recent pass, newest last.
    recent: std::collections::VecDeque<i64>,
}

impl PageCacheMarks {
    const PASSES: usize = 5;

    /// The base offset a pass starts from.
    fn from(&self) -> i64 {
        self.recent.front().copied().unwrap_or(i64::MIN)
    }

    /// Notes a pass, with the oldest segment then not durable.
    fn passed(&mut self, oldest_not_durable: i64) {
        if self.recent.len() == Self::PASSES {
            self.recent.pop_front();
        }
        self.recent.push_back(oldest_not_durable);
    }
}

/// Splits queued appends into groups that each span at most 2^31 offsets
/// (what one append to the log may), keeping their order.
fn split_by_offsets(items: Vec<PendingAppend>) -> Vec<Vec<PendingAppend>> {
    const MAX_GROUP_OFFSETS: i64 = 1 << 31;
    let mut groups: Vec<Vec<PendingAppend>> = Vec::new();
    let mut span = 0i64;
    for item in items {
        let n = item.offsets();
        match groups.last_mut() {
            Some(g) if span + n <= MAX_GROUP_OFFSETS => {
                span += n;
                g.push(item);
            }
            _ => {
                span = n;
                groups.push(vec![item]);
            }
        }
    }
    groups
}

/// A group of appends planned against the producer state: the bytes to
/// write and their headers, each append's answer so far, and what the
/// write needs to index or undo.
struct GroupPlan {
    buf: Vec<u8>,
    headers: Vec<BatchHeader>,
    /// Producer state as it was before each change, newest last.
    undo: Vec<crate::producers::ProducerSnapshot>,
    /// Transactions the group's ABORT markers end.
    aborted: Vec<AbortedTxn>,
    /// Producer ids the group's batches name.
    named: Vec<i64>,
    /// Each append's reply, its base offset and byte position in `buf`
    /// (none when nothing of it is written) or its refusal, and its waits.
    replies: Vec<(GroupReply, PlannedAnswer, AppendTrace)>,
    /// The batches as written, kept for the WAL in a cluster.
    written: Option<Bytes>,
}

type GroupReply = oneshot::Sender<Result<Appended, AppendFailure>>;

/// An append's base offset and its bytes' position in the group's write,
/// or its refusal.
type PlannedAnswer = Result<(i64, Option<u64>), AppendFailure>;

/// Plans each append of a group in order, from `first_offset`: verified
/// (transactional batches), checked against its producer's sequence and
/// epoch (or planned as a marker), given its offsets.
fn plan_group(
    producers: &mut ProducerStates,
    group: Vec<PendingAppend>,
    first_offset: i64,
    now: i64,
    (picked, locked): (Instant, Instant),
) -> GroupPlan {
    let mut plan = GroupPlan {
        buf: Vec::new(),
        headers: Vec::new(),
        undo: Vec::new(),
        aborted: Vec::new(),
        named: Vec::new(),
        replies: Vec::with_capacity(group.len()),
        written: None,
    };
    let mut next_offset = first_offset;
    for mut item in group {
        plan.named
            .extend(item.headers.iter().map(|h| h.producer_id).filter(|id| *id >= 0));
        let verified = item.verify.take().map_or(Ok(()), |verify| verify(producers));
        let planned = match (verified, item.marker) {
            (Err(refused), _) => Err(refused),
            (Ok(()), None) if item.unchecked => Ok(Planned::Append(item.offsets())),
            (Ok(()), Some(marker)) => {
                plan_marker(producers, &item.headers, marker, next_offset, now, &mut plan.undo).map(|p| {
                    match p {
                        MarkerPlan::Write(txn) => {
                            plan.aborted.extend(txn);
                            Planned::Append(1)
                        }
                        MarkerPlan::Nothing => Planned::Nothing(next_offset),
                    }
                })
            }
            (Ok(()), None) => plan_item(producers, &item.headers, next_offset, now, &mut plan.undo),
        };
        let waited = AppendTrace {
            queue: picked.saturating_duration_since(item.enqueued),
            lock: locked - picked,
            publish: Duration::ZERO,
            answered: picked,
            written: None,
        };
        match planned {
            Ok(Planned::Append(n)) => {
                let at = Some(plan.buf.len() as u64);
                plan.replies.push((item.reply, Ok((next_offset, at)), waited));
                next_offset += n;
                plan.buf.extend_from_slice(&item.records);
                plan.headers.extend(item.headers);
            }
            Ok(Planned::Duplicate(offset) | Planned::Nothing(offset)) => {
                plan.replies.push((item.reply, Ok((offset, None)), waited));
            }
            Err(e) => plan.replies.push((item.reply, Err(e), waited)),
        }
    }
    plan
}

enum Planned {
    /// New data consuming this many offsets.
    Append(i64),
    Duplicate(i64),
    /// Nothing to write (a marker with nothing to end here); answered with
    /// the log end offset.
    Nothing(i64),
}

/// Applies sequence checks to one request's batches, recording them in the
/// producer state as if written at `base_offset` (undone on write failure).
/// A request whose batches are not all accepted records none of them.
fn plan_item(
    producers: &mut ProducerStates,
    headers: &[BatchHeader],
    base_offset: i64,
    now_ms: i64,
    undo: &mut Vec<crate::producers::ProducerSnapshot>,
) -> Result<Planned, AppendFailure> {
    let mut offset = base_offset;
    let mark = undo.len();
    let refuse = |producers: &mut ProducerStates, undo: &mut Vec<_>, failure: AppendFailure| {
        for snapshot in undo.drain(mark..).rev() {
            producers.restore(snapshot);
        }
        Err(failure)
    };
    for (i, h) in headers.iter().enumerate() {
        match producers.check(h) {
            SequenceCheck::Append => {}
            SequenceCheck::Duplicate { first_offset } if i == 0 => {
                return Ok(Planned::Duplicate(first_offset))
            }
            SequenceCheck::Duplicate { .. } => {
                let failure = AppendFailure {
                    error: ResponseError::DuplicateSequenceNumber,
                    message: "a request mixed new and retried batches".into(),
                };
                return refuse(producers, undo, failure);
            }
            SequenceCheck::Reject(error) => {
                let message = format!(
                    "producer {} epoch {} sequence {} refused",
                    h.producer_id, h.producer_epoch, h.base_sequence
                );
                return refuse(producers, undo, AppendFailure { error, message });
            }
        }
        undo.push(producers.snapshot(h.producer_id));
        producers.record(h, offset, now_ms);
        offset += i64::from(h.last_offset_delta) + 1;
    }
    Ok(Planned::Append(offset - base_offset))
}

/// What a transaction marker does to a partition.
enum MarkerPlan {
    /// Write it; it aborts this transaction here, for the `.txnindex`.
    Write(Option<AbortedTxn>),
    /// The producer never wrote here (or was forgotten): there is no
    /// transaction to end and no epoch to fence, so nothing is written.
    /// Markers are addressed by topic name; this keeps a late marker of a
    /// deleted topic out of a re-created topic of the same name.
    Nothing,
}

/// Checks a transaction marker against the producer state and records
/// it as if written at `offset` (undone on write failure).
fn plan_marker(
    producers: &mut ProducerStates,
    headers: &[BatchHeader],
    marker: Marker,
    offset: i64,
    now_ms: i64,
    undo: &mut Vec<crate::producers::ProducerSnapshot>,
) -> Result<MarkerPlan, AppendFailure> {
    let h = headers.first().ok_or_else(|| AppendFailure {
        error: ResponseError::UnknownServerError,
        message: "a marker without its batch".into(),
    })?;
    if producers.info(h.producer_id).is_none() {
        return Ok(MarkerPlan::Nothing);
    }
    producers
        .check_marker(h.producer_id, h.producer_epoch, marker.coordinator_epoch)
        .map_err(|error| AppendFailure {
            error,
            message: format!(
                "a marker of producer {} epoch {} (coordinator epoch {}) is older than the producer's state",
                h.producer_id, h.producer_epoch, marker.coordinator_epoch
            ),
        })?;
    undo.push(producers.snapshot(h.producer_id));
    Ok(MarkerPlan::Write(end_transaction(
        producers, h, marker, offset, now_ms,
    )))
}

/// Records the marker `h` written at `offset` in the producer state (live
/// or replayed at start-up). Returns the `.txnindex` entry of the
/// transaction it aborts here, if it aborts one that wrote here.
fn end_transaction(
    producers: &mut ProducerStates,
    h: &BatchHeader,
    marker: Marker,
    offset: i64,
    now_ms: i64,
) -> Option<AbortedTxn> {
    let done = producers.record_marker(h.producer_id, h.producer_epoch, marker.coordinator_epoch, now_ms);
    let first_offset = done.first_offset.filter(|_| !marker.commit)?;
    Some(AbortedTxn {
        producer_id: h.producer_id,
        first_offset,
        last_offset: offset,
        last_stable_offset: producers.first_unstable_offset().unwrap_or(offset + 1),
    })
}

/// The last stable offset given the producers' open transactions.
fn stable_offset(producers: &ProducerStates, high_watermark: i64) -> i64 {
    producers
        .first_unstable_offset()
        .map_or(high_watermark, |first| first.min(high_watermark))
}

/// The offset after the last whole batch in `bytes`.
/// How many reads past segments of record-less batches one fetch makes.
const MAX_EMPTY_READS: usize = 64;

/// Whether every whole batch in `bytes` is empty (records count 0).
fn holds_no_record(bytes: &[u8]) -> bool {
    let mut at = 0;
    while let Ok(h) = BatchHeader::parse(&bytes[at..]) {
        if at + h.total_len() > bytes.len() {
            break;
        }
        if h.records_count != 0 {
            return false;
        }
        at += h.total_len();
    }
    true
}

fn next_offset_after(bytes: &[u8]) -> Option<i64> {
    let mut at = 0;
    let mut next = None;
    while let Ok(h) = BatchHeader::parse(&bytes[at..]) {
        if at + h.total_len() > bytes.len() {
            break;
        }
        next = Some(h.last_offset() + 1);
        at += h.total_len();
    }
    next
}

/// Splits an appended buffer into its batches with their assigned offsets,
/// sharing the buffer (no copy).
fn cached_batches(buf: Bytes, headers: &[BatchHeader], first_offset: i64) -> Vec<(i64, i64, Bytes)> {
    let mut out = Vec::with_capacity(headers.len());
    let (mut at, mut base) = (0, first_offset);
    for h in headers {
        let last = base + i64::from(h.last_offset_delta);
        out.push((base, last, buf.slice(at..at + h.total_len())));
        at += h.total_len();
        base = last + 1;
    }
    out
}

/// Sets the partition leader epoch of every batch, as a Kafka leader does
/// (producers send -1). The field is outside the CRC.
fn stamp_leader_epoch(buf: &mut [u8], headers: &[BatchHeader], epoch: i32) {
    let mut at = 0;
    for h in headers {
        keel_log::batch::set_partition_leader_epoch(&mut buf[at..], epoch);
        at += h.total_len();
    }
}

fn storage_failure(message: String) -> AppendFailure {
    tracing::error!(%message, "append failed");
    AppendFailure {
        error: ResponseError::KafkaStorageError,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::PageCacheMarks;

    #[test]
    fn a_segment_gets_page_cache_passes_until_some_after_its_seal() {
        let mut marks = PageCacheMarks::default();
        assert_eq!(marks.from(), i64::MIN, "the first pass covers every segment");
        // Segment 0 is active, then rolled at offset 100 and not yet sealed.
        marks.passed(0);
        marks.passed(0);
        marks.passed(0);
        assert_eq!(marks.from(), 0);
        // Its seal completes: 100 is the oldest segment not durable. Segment
        // 0 is still covered by the next PASSES passes, then no longer.
        for pass in 0..PageCacheMarks::PASSES {
            assert_eq!(marks.from(), 0, "pass {pass} after the seal");
            marks.passed(100);
        }
        assert_eq!(marks.from(), 100);
    }
}
