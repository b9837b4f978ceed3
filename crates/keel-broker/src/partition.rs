//! One topic-partition: its log, its producers' sequence state, the append
//! pipeline (group commit) and the long-poll wake-ups.
//!
//! Locking: `state` guards the log and producer state. It is held for
//! in-memory work and for the one `write` of a group commit; reads take it
//! only to plan (no I/O) and read the file after releasing it. Nothing
//! outside this partition ever waits on it.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use keel_log::batch::BatchHeader;
use keel_log::{LogConfig, PartitionLog, ReadError, ReadPlan};
use keel_protocol::ResponseError;
use keel_tier::{Chunks, ColdReads, PartitionTail, Tiers};
use parking_lot::Mutex;
use tokio::sync::{oneshot, Notify};

use crate::producers::{ProducerStates, SequenceCheck};
use crate::time::now_ms;

/// The leader epoch of every Keel partition: one node, never re-elected.
pub const LEADER_EPOCH: i32 = 0;

/// Offsets of an append as acknowledged to the producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    pub base_offset: i64,
    pub log_start_offset: i64,
}

/// Why a produce to this partition failed: a Kafka error for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendFailure {
    pub error: ResponseError,
    pub message: String,
}

struct PendingAppend {
    records: Bytes,
    headers: Vec<BatchHeader>,
    reply: oneshot::Sender<Result<Appended, AppendFailure>>,
}

#[derive(Default)]
struct AppendQueue {
    items: Vec<PendingAppend>,
    /// True while a blocking task is draining the queue.
    writer_active: bool,
}

struct PartitionState {
    log: PartitionLog,
    producers: ProducerStates,
    /// Set by [`Partition::close`]; no append may follow the clean-shutdown
    /// marker.
    closed: bool,
}

pub struct Partition {
    pub topic: Arc<str>,
    pub index: i32,
    state: Mutex<PartitionState>,
    queue: Mutex<AppendQueue>,
    /// Fetches waiting for data; each is woken once per append.
    waiters: Mutex<Vec<Arc<Notify>>>,
    /// The high watermark: every offset below it is written and readable.
    /// One replica, so it equals the log end offset. Only moves forward,
    /// except when retention or truncation resets the log.
    high_watermark: AtomicI64,
    log_start_offset: AtomicI64,
    /// The newest batches, in the broker's tail cache.
    tail: PartitionTail,
    /// Fetched bytes served from the tail cache and from the log files.
    pub cache_read_bytes: AtomicU64,
    pub cold_read_bytes: AtomicU64,
    /// Base offsets of the active segment at the last two page-cache passes.
    page_cache_marks: Mutex<(i64, i64)>,
    /// The broker's cold-read executor (reads below the tail cache).
    cold: Arc<ColdReads>,
    /// The colder tiers, which serve the offsets no longer in the fast tier.
    tiers: Arc<Tiers>,
    /// Read-ahead: the next chunk of a sequential scan below the tail, read
    /// before it is asked for.
    read_ahead: Mutex<ReadAhead>,
    /// Where the last cold read ended, so the next read of a sequential
    /// scan starts exactly at its batch (`keel_log::ScanHint`).
    scan_hint: Mutex<Option<keel_log::ScanHint>>,
}

/// The read-ahead slot of one partition.
enum ReadAhead {
    Empty,
    /// Being read; fetches asking for `offset` meanwhile wait for it rather
    /// than read the same bytes again.
    InFlight {
        offset: i64,
        waiters: Vec<oneshot::Sender<std::io::Result<Bytes>>>,
    },
    /// Read and held (its bytes reserved in the pool) for the next fetch at
    /// `offset`.
    Ready {
        offset: i64,
        bytes: Bytes,
    },
}

/// Where a fetch's bytes come from.
#[derive(Debug)]
pub enum ReadSource {
    /// Whole batches from the tail cache (or held read-ahead): no disk read.
    Memory(Chunks),
    /// A planned read of the log files, executed without the partition lock.
    Disk(ReadPlan),
    /// The read-ahead of this offset is in flight; its bytes arrive here.
    Pending(oneshot::Receiver<std::io::Result<Bytes>>),
}

impl Partition {
    /// Opens (and recovers) the log and rebuilds producer state from the
    /// batch headers of its newest data. Blocking: run off the async threads.
    pub fn open(
        topic: Arc<str>,
        index: i32,
        dir: &std::path::Path,
        config: LogConfig,
        tail: PartitionTail,
        cold: Arc<ColdReads>,
        tiers: Arc<Tiers>,
    ) -> Result<Partition, String> {
        let log = PartitionLog::open(dir, config).map_err(|e| format!("{}: {e}", dir.display()))?;
        let producers = rebuild_producers(&log).map_err(|e| format!("{}: {e}", dir.display()))?;
        let (hw, start) = (log.log_end_offset(), log.log_start_offset());
        Ok(Partition {
            topic,
            index,
            state: Mutex::new(PartitionState {
                log,
                producers,
                closed: false,
            }),
            queue: Mutex::new(AppendQueue::default()),
            waiters: Mutex::new(Vec::new()),
            high_watermark: AtomicI64::new(hw),
            log_start_offset: AtomicI64::new(start),
            tail,
            cache_read_bytes: AtomicU64::new(0),
            cold_read_bytes: AtomicU64::new(0),
            page_cache_marks: Mutex::new((0, 0)),
            cold,
            tiers,
            read_ahead: Mutex::new(ReadAhead::Empty),
            scan_hint: Mutex::new(None),
        })
    }

    pub fn high_watermark(&self) -> i64 {
        self.high_watermark.load(Ordering::Acquire)
    }

    pub fn log_start_offset(&self) -> i64 {
        self.log_start_offset.load(Ordering::Acquire)
    }

    /// Appends validated batches. Concurrent calls are grouped: whoever
    /// finds no writer running drains the queue on a blocking thread, in
    /// arrival order, with one write per drained group.
    pub async fn append(
        self: &Arc<Self>,
        records: Bytes,
        headers: Vec<BatchHeader>,
    ) -> Result<Appended, AppendFailure> {
        let (reply, done) = oneshot::channel();
        let start_writer = {
            let mut q = self.queue.lock();
            q.items.push(PendingAppend {
                records,
                headers,
                reply,
            });
            !std::mem::replace(&mut q.writer_active, true)
        };
        if start_writer {
            let me = Arc::clone(self);
            tokio::task::spawn_blocking(move || me.drain_queue());
        }
        done.await
            .unwrap_or_else(|_| Err(storage_failure("append task ended without a reply".into())))
    }

    fn drain_queue(&self) {
        loop {
            let group = {
                let mut q = self.queue.lock();
                if q.items.is_empty() {
                    q.writer_active = false;
                    return;
                }
                std::mem::take(&mut q.items)
            };
            self.write_group(group);
        }
    }

    /// Writes one group of pending appends and replies to each.
    fn write_group(&self, group: Vec<PendingAppend>) {
        let mut replies = Vec::with_capacity(group.len());
        let mut st = self.state.lock();
        if st.closed {
            for item in group {
                let _ = item.reply.send(Err(AppendFailure {
                    error: ResponseError::NotLeaderOrFollower,
                    message: "the broker is shutting down".into(),
                }));
            }
            return;
        }
        let first_offset = st.log.log_end_offset();
        let mut next_offset = first_offset;
        let mut buf = Vec::new();
        let mut headers = Vec::new();
        let mut undo = Vec::new();
        for item in group {
            match plan_item(&mut st.producers, &item.headers, next_offset, &mut undo) {
                Ok(Planned::Append(n)) => {
                    replies.push((item.reply, Ok(next_offset)));
                    next_offset += n;
                    buf.extend_from_slice(&item.records);
                    headers.extend(item.headers);
                }
                Ok(Planned::Duplicate(offset)) => replies.push((item.reply, Ok(offset))),
                Err(e) => replies.push((item.reply, Err(e))),
            }
        }
        stamp_leader_epoch(&mut buf, &headers);
        let written = if buf.is_empty() {
            Ok(())
        } else {
            st.log.append(&mut buf, &headers, now_ms()).map(|info| {
                assert_eq!(
                    info.base_offset, first_offset,
                    "log assigned offsets the plan did not expect"
                );
                // Cached before the high watermark moves, so a fetch woken
                // by this append finds the batches in memory.
                self.tail
                    .insert(cached_batches(Bytes::from(buf), &headers, first_offset));
            })
        };
        let failure = written.err().map(|e| {
            for snapshot in undo.into_iter().rev() {
                st.producers.restore(snapshot);
            }
            storage_failure(e.to_string())
        });
        let (hw, start) = (st.log.log_end_offset(), st.log.log_start_offset());
        drop(st);
        self.publish(hw, start);
        for (reply, result) in replies {
            let result = match (&failure, result) {
                (Some(f), Ok(offset)) if offset >= first_offset => Err(f.clone()),
                (_, r) => r.map(|base_offset| Appended {
                    base_offset,
                    log_start_offset: start,
                }),
            };
            let _ = reply.send(result);
        }
    }

    fn publish(&self, high_watermark: i64, log_start_offset: i64) {
        self.high_watermark.store(high_watermark, Ordering::Release);
        self.log_start_offset.store(log_start_offset, Ordering::Release);
        for w in std::mem::take(&mut *self.waiters.lock()) {
            w.notify_one();
        }
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

    /// Plans a read under the lock; the caller executes it without the lock.
    pub fn read_plan(&self, offset: i64, max_bytes: usize) -> Result<ReadPlan, ReadError> {
        let hint = *self.scan_hint.lock();
        self.state.lock().log.read_plan_after(offset, max_bytes, hint)
    }

    /// Resolves a fetch at `offset` to its source: the tail cache when the
    /// offset is in its run (below the high watermark), the read-ahead slot
    /// when a scan reached it, else a read plan of the files.
    pub fn read(self: &Arc<Self>, offset: i64, max_bytes: usize) -> Result<ReadSource, ReadError> {
        let (start, hw) = (self.log_start_offset(), self.high_watermark());
        if offset == hw && offset >= start {
            // Nothing to read yet. Planning a file read here would race an
            // append landing meanwhile: its batches would come from disk
            // (they are in the tail cache) and before the high watermark
            // moved. The fetch is woken by that append instead.
            return Ok(ReadSource::Memory(Chunks::default()));
        }
        if offset >= start && offset < hw {
            if let Some(bytes) = self.tail.read(offset, hw, max_bytes) {
                self.cache_read_bytes
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                return Ok(ReadSource::Memory(bytes));
            }
            if let Some(source) = self.take_read_ahead(offset, max_bytes) {
                return Ok(source);
            }
        }
        self.read_plan(offset, max_bytes).map(ReadSource::Disk)
    }

    /// The read-ahead of `offset`, if it is held (data now) or in flight (a
    /// channel its data will arrive on).
    /// Taking held data starts the read-ahead of the chunk after it.
    fn take_read_ahead(self: &Arc<Self>, offset: i64, max_bytes: usize) -> Option<ReadSource> {
        let mut slot = self.read_ahead.lock();
        match &mut *slot {
            ReadAhead::Ready { offset: at, .. } if *at == offset => {
                let ReadAhead::Ready { bytes, .. } = std::mem::replace(&mut *slot, ReadAhead::Empty) else {
                    unreachable!("matched above");
                };
                drop(slot);
                self.cold.release_read_ahead(bytes.len() as u64, true);
                self.cold_read_bytes
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                if let Some(next) = next_offset_after(&bytes) {
                    self.read_ahead_from(next, max_bytes);
                }
                Some(ReadSource::Memory(bytes.into()))
            }
            ReadAhead::InFlight { offset: at, waiters } if *at == offset => {
                let (tx, rx) = oneshot::channel();
                waiters.push(tx);
                Some(ReadSource::Pending(rx))
            }
            _ => None,
        }
    }

    /// Keeps `bytes` read at `offset` for the next fetch, if the slot is
    /// free (or holds stale data) and the pool has room.
    fn offer_read_ahead(&self, offset: i64, bytes: Bytes) {
        let mut slot = self.read_ahead.lock();
        if matches!(*slot, ReadAhead::InFlight { .. }) || bytes.is_empty() {
            return;
        }
        if !self.cold.reserve_read_ahead(bytes.len() as u64) {
            return;
        }
        if let ReadAhead::Ready { bytes: old, .. } =
            std::mem::replace(&mut *slot, ReadAhead::Ready { offset, bytes })
        {
            self.cold.release_read_ahead(old.len() as u64, false);
        }
    }

    /// The blocking read of a plan: the local file, or the colder tier that
    /// holds its offsets.
    fn plan_reader(
        self: &Arc<Self>,
        plan: ReadPlan,
    ) -> impl FnOnce() -> std::io::Result<Bytes> + Send + 'static {
        let me = Arc::clone(self);
        move || match plan.tiered_segment() {
            Some(segment) => me
                .tiers
                .read_blocking(segment, plan.target_offset(), plan.max_bytes()),
            None => {
                let (bytes, hint) = plan.execute_scan()?;
                if hint.is_some() {
                    *me.scan_hint.lock() = hint;
                }
                Ok(bytes)
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

    /// Runs a planned read on the cold executor. The answer comes on the
    /// returned channel; if nobody is listening any more (the fetch was
    /// answered without it at its deadline) it is kept for the next fetch
    /// at `offset`. After a delivered read the next chunk is read ahead, so
    /// a sequential backfill keeps the device busy between its fetches.
    pub fn spawn_cold_read(
        self: &Arc<Self>,
        offset: i64,
        plan: ReadPlan,
        max_bytes: usize,
    ) -> oneshot::Receiver<std::io::Result<Bytes>> {
        let (tx, rx) = oneshot::channel();
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let result = me.cold.read(max_bytes, me.plan_reader(plan)).await;
            if tx.is_closed() {
                if let Ok(bytes) = result {
                    me.offer_read_ahead(offset, bytes);
                }
                return;
            }
            // The read-ahead is marked in flight before the fetch gets its
            // answer, so the next fetch finds it and waits for it.
            if let Some(next) = result.as_ref().ok().and_then(|b| next_offset_after(b)) {
                me.read_ahead_from(next, max_bytes);
            }
            let _ = tx.send(result);
        });
        rx
    }

    /// Reads the chunk at `offset` ahead of the fetch that will ask for it,
    /// unless the tail cache holds it or the slot is busy with it. Held data
    /// of another offset is stale (the scan moved past it) and is freed; one
    /// read-ahead per partition is in flight at a time.
    fn read_ahead_from(self: &Arc<Self>, offset: i64, max_bytes: usize) {
        let in_tail = self.tail.first_offset().is_some_and(|first| offset >= first);
        if in_tail || offset >= self.high_watermark() {
            return;
        }
        {
            let mut slot = self.read_ahead.lock();
            match &*slot {
                ReadAhead::InFlight { .. } => return,
                ReadAhead::Ready { offset: at, .. } if *at == offset => return,
                ReadAhead::Ready { bytes, .. } => self.cold.release_read_ahead(bytes.len() as u64, false),
                ReadAhead::Empty => {}
            }
            *slot = ReadAhead::InFlight {
                offset,
                waiters: Vec::new(),
            };
        }
        let Ok(plan) = self.read_plan(offset, max_bytes) else {
            *self.read_ahead.lock() = ReadAhead::Empty;
            return;
        };
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let result = me.cold.read(max_bytes, me.plan_reader(plan)).await;
            me.finish_read_ahead(offset, result, max_bytes);
        });
    }

    /// A read-ahead completed: the fetches that waited for it get its data
    /// (and the scan reads on), or it is held for the next fetch.
    fn finish_read_ahead(self: &Arc<Self>, offset: i64, result: std::io::Result<Bytes>, max_bytes: usize) {
        let waiters = {
            let mut slot = self.read_ahead.lock();
            match std::mem::replace(&mut *slot, ReadAhead::Empty) {
                ReadAhead::InFlight { offset: at, waiters } if at == offset => waiters,
                other => {
                    *slot = other;
                    Vec::new()
                }
            }
        };
        match result {
            Ok(bytes) => {
                if waiters.iter().all(|w| w.is_closed()) {
                    self.offer_read_ahead(offset, bytes);
                    return;
                }
                // Marked in flight before the waiters get their answer, so
                // their next fetch finds it.
                if let Some(next) = next_offset_after(&bytes) {
                    self.read_ahead_from(next, max_bytes);
                }
                self.cold.note_read_ahead_hit();
                for w in waiters {
                    let _ = w.send(Ok(bytes.clone()));
                }
            }
            Err(e) => {
                for w in waiters {
                    let _ = w.send(Err(std::io::Error::new(e.kind(), e.to_string())));
                }
            }
        }
    }

    /// Drops written segment data from the page cache: every segment active
    /// in the last two passes (earlier ones were dropped then), so each one
    /// gets a pass after its last write has been written back. The first
    /// pass after start-up covers every segment. The tail cache holds the
    /// newest data; the page cache holds none of it for long. Blocking.
    pub fn drop_written_pages(&self) {
        let from = self.page_cache_marks.lock().0;
        let (files, active) = {
            let st = self.state.lock();
            let active = st.log.segment_base_offsets().last().copied().unwrap_or(0);
            (st.log.segment_files_from(from), active)
        };
        for (_, file) in &files {
            keel_log::drop_cached_pages(file);
        }
        let mut marks = self.page_cache_marks.lock();
        *marks = (marks.1, active);
    }

    /// `(bytes of this partition's segment files in the page cache, their
    /// size)`, measured with mincore. Blocking (one mmap per segment).
    pub fn page_cache_residency(&self) -> (u64, u64) {
        let files = self.state.lock().log.segment_files_from(i64::MIN);
        files
            .iter()
            .filter_map(|(_, f)| keel_tier::resident::resident_bytes(f).ok())
            .fold((0, 0), |(r, s), (fr, fs)| (r + fr, s + fs))
    }

    /// Counts bytes a read plan of this partition returned from the files.
    pub fn note_cold_read(&self, bytes: u64) {
        self.cold_read_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Plans a ListOffsets-by-timestamp lookup under the lock (no I/O).
    pub fn timestamp_plan(&self, timestamp_ms: i64) -> Option<keel_log::TimestampPlan> {
        self.state.lock().log.timestamp_plan(timestamp_ms)
    }

    /// Flushes the log, writes its clean-shutdown marker and refuses every
    /// later append. Blocking.
    pub fn close(&self) -> std::io::Result<()> {
        let mut st = self.state.lock();
        st.closed = true;
        st.log.close()
    }

    /// Runs `f` on the log under the partition lock. For short in-memory
    /// work or maintenance that only this partition waits on.
    pub fn with_log<T>(&self, f: impl FnOnce(&mut PartitionLog) -> T) -> T {
        let mut st = self.state.lock();
        let out = f(&mut st.log);
        let (hw, start) = (st.log.log_end_offset(), st.log.log_start_offset());
        drop(st);
        self.high_watermark.store(hw, Ordering::Release);
        self.log_start_offset.store(start, Ordering::Release);
        out
    }
}

enum Planned {
    /// New data consuming this many offsets.
    Append(i64),
    Duplicate(i64),
}

/// Applies sequence checks to one request's batches, recording them in the
/// producer state as if written at `base_offset` (undone on write failure).
fn plan_item(
    producers: &mut ProducerStates,
    headers: &[BatchHeader],
    base_offset: i64,
    undo: &mut Vec<crate::producers::ProducerSnapshot>,
) -> Result<Planned, AppendFailure> {
    // Clients send one batch per partition per request; a request with
    // several is checked as a whole: all new, or the first is a retry.
    let mut offset = base_offset;
    for (i, h) in headers.iter().enumerate() {
        match producers.check(h) {
            SequenceCheck::Append => {}
            SequenceCheck::Duplicate { first_offset } if i == 0 => {
                return Ok(Planned::Duplicate(first_offset))
            }
            SequenceCheck::Duplicate { .. } => {
                return Err(AppendFailure {
                    error: ResponseError::DuplicateSequenceNumber,
                    message: "a request mixed new and retried batches".into(),
                })
            }
            SequenceCheck::Reject(error) => {
                let message = format!(
                    "producer {} epoch {} sequence {} refused",
                    h.producer_id, h.producer_epoch, h.base_sequence
                );
                return Err(AppendFailure { error, message });
            }
        }
        undo.push(producers.snapshot(h.producer_id));
        producers.record(h, offset);
        offset += i64::from(h.last_offset_delta) + 1;
    }
    Ok(Planned::Append(offset - base_offset))
}

/// The offset after the last whole batch in `bytes`.
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
fn stamp_leader_epoch(buf: &mut [u8], headers: &[BatchHeader]) {
    let mut at = 0;
    for h in headers {
        keel_log::batch::set_partition_leader_epoch(&mut buf[at..], LEADER_EPOCH);
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

/// Rebuilds producer sequence state from the batch headers in the log.
fn rebuild_producers(log: &PartitionLog) -> std::io::Result<ProducerStates> {
    let mut producers = ProducerStates::default();
    for header in log.batch_headers(log.log_start_offset()) {
        let header = header?;
        producers.record(&header, header.base_offset);
    }
    Ok(producers)
}
