//! Idempotent producers: producer id allocation and the per-partition
//! sequence state that turns retries into duplicates instead of copies.
//!
//! The rules follow Kafka's (KIP-98, KIP-360, and Kafka 2.5+'s
//! `ProducerAppendInfo.checkSequence`): a producer id owns an epoch; within
//! an epoch, batch sequences must follow each other without gaps; a batch
//! equal to one of the last [`RETAINED_BATCHES`] is a retry and is answered
//! with its original offset; an older epoch is fenced. A producer this
//! partition has no state for (new, or expired) may start at any sequence.
//!
//! Transactions: a producer's first transactional batch here opens its
//! transaction at that offset, and the coordinator's marker closes it. The
//! oldest open transaction bounds the partition's last stable offset.
//!
//! The state survives restarts and retention in producer-state snapshots:
//! Kafka's `.snapshot` file format (version 1, CRC-32C; see
//! `docs/format.md`), written at each roll and at clean shutdown. A
//! producer is forgotten after `producer.id.expiration.ms` without writes.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};

use std::sync::Arc;

use keel_log::batch::{increment_sequence, BatchHeader};
use keel_log::storage::{read_file, write_atomically, Storage};
use keel_protocol::ResponseError;

/// How many recent batches per producer are remembered for duplicate
/// detection: clients keep at most five requests in flight per partition.
pub const RETAINED_BATCHES: usize = 5;

/// The producer id of a batch from a non-idempotent producer (Kafka treats
/// every negative id as none).
pub const NO_PRODUCER_ID: i64 = -1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BatchMeta {
    first_seq: i32,
    last_seq: i32,
    first_offset: i64,
    last_offset: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ProducerEntry {
    epoch: i16,
    batches: VecDeque<BatchMeta>,
    /// Broker clock at the producer's last write (what expiration uses).
    last_write_ms: i64,
    /// The epoch of the transaction coordinator that wrote this
    /// producer's last marker here (-1: none yet).
    coordinator_epoch: i32,
    /// The offset of the first batch of the producer's open transaction
    /// in this partition.
    txn_first_offset: Option<i64>,
}

impl ProducerEntry {
    fn new(epoch: i16, now_ms: i64) -> ProducerEntry {
        ProducerEntry {
            epoch,
            batches: VecDeque::new(),
            last_write_ms: now_ms,
            coordinator_epoch: -1,
            txn_first_offset: None,
        }
    }
}

/// A producer as DescribeProducers reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerInfo {
    pub producer_id: i64,
    pub epoch: i16,
    pub last_sequence: i32,
    pub last_timestamp_ms: i64,
    pub coordinator_epoch: i32,
    /// The first offset of its open transaction here, or -1.
    pub txn_start_offset: i64,
}

/// What ending a transaction in this partition completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompletedTxn {
    /// The first offset of the transaction's data here (none when the
    /// producer wrote nothing in it here).
    pub first_offset: Option<i64>,
}

/// What to do with an incoming batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceCheck {
    /// New data: append it.
    Append,
    /// A retry of a batch already in the log at this base offset.
    Duplicate { first_offset: i64 },
    /// Refused with this Kafka error.
    Reject(ResponseError),
}

/// Sequence state of every producer that wrote to one partition.
#[derive(Debug, Default, Clone)]
pub struct ProducerStates {
    producers: HashMap<i64, ProducerEntry>,
    /// Open transactions: first offset -> producer id. The smallest key is
    /// the first unstable offset (what bounds the last stable offset).
    ongoing: BTreeMap<i64, i64>,
}

impl ProducerStates {
    /// Decides whether a batch is new, a retry, or out of order.
    pub fn check(&self, h: &BatchHeader) -> SequenceCheck {
        if h.producer_id < 0 {
            return SequenceCheck::Append;
        }
        let Some(entry) = self.producers.get(&h.producer_id) else {
            // No state (a new producer, or one whose state expired or was
            // lost with its data): any sequence starts it, as in Kafka 2.5+.
            return SequenceCheck::Append;
        };
        if h.producer_epoch < entry.epoch {
            return SequenceCheck::Reject(ResponseError::InvalidProducerEpoch);
        }
        if entry.txn_first_offset.is_some() && !h.is_transactional() {
            // Kafka's rule: an open transaction's producer may not write
            // outside it.
            return SequenceCheck::Reject(ResponseError::InvalidTxnState);
        }
        if h.producer_epoch > entry.epoch {
            return if h.base_sequence == 0 {
                SequenceCheck::Append
            } else {
                SequenceCheck::Reject(ResponseError::OutOfOrderSequenceNumber)
            };
        }
        let last_seq = h.last_sequence();
        if let Some(b) = entry
            .batches
            .iter()
            .find(|b| b.first_seq == h.base_sequence && b.last_seq == last_seq)
        {
            return SequenceCheck::Duplicate {
                first_offset: b.first_offset,
            };
        }
        match entry.batches.back() {
            Some(last) if increment_sequence(last.last_seq, 1) != h.base_sequence => {
                SequenceCheck::Reject(ResponseError::OutOfOrderSequenceNumber)
            }
            _ => SequenceCheck::Append,
        }
    }

    /// Records a batch written at `first_offset` at broker time `now_ms`.
    /// Also used to rebuild the state from the log at start-up.
    pub fn record(&mut self, h: &BatchHeader, first_offset: i64, now_ms: i64) {
        if h.producer_id < 0 {
            return;
        }
        let entry = self
            .producers
            .entry(h.producer_id)
            .or_insert_with(|| ProducerEntry::new(h.producer_epoch, now_ms));
        if h.producer_epoch != entry.epoch {
            entry.epoch = h.producer_epoch;
            entry.batches.clear();
        }
        if h.is_transactional() && entry.txn_first_offset.is_none() {
            entry.txn_first_offset = Some(first_offset);
            self.ongoing.insert(first_offset, h.producer_id);
        }
        if entry.batches.len() == RETAINED_BATCHES {
            entry.batches.pop_front();
        }
        entry.batches.push_back(BatchMeta {
            first_seq: h.base_sequence,
            last_seq: h.last_sequence(),
            first_offset,
            last_offset: first_offset + i64::from(h.last_offset_delta),
        });
        entry.last_write_ms = entry.last_write_ms.max(now_ms);
    }

    /// A copy of one producer's state, to restore if a write fails.
    pub fn snapshot(&self, producer_id: i64) -> ProducerSnapshot {
        ProducerSnapshot {
            producer_id,
            entry: self.producers.get(&producer_id).cloned(),
        }
    }

    /// The states as they were before the changes `undo` recorded (in the
    /// order they were made), leaving these as they are.
    pub fn before(&self, undo: &[ProducerSnapshot]) -> ProducerStates {
        let mut before = self.clone();
        for snapshot in undo.iter().rev() {
            before.restore(snapshot.clone());
        }
        before
    }

    pub fn restore(&mut self, snapshot: ProducerSnapshot) {
        let id = snapshot.producer_id;
        let old = match snapshot.entry {
            Some(e) => {
                if let Some(first) = e.txn_first_offset {
                    self.ongoing.insert(first, id);
                }
                self.producers.insert(id, e)
            }
            None => self.producers.remove(&id),
        };
        let restored_first = self.producers.get(&id).and_then(|e| e.txn_first_offset);
        if let Some(first) = old.and_then(|e| e.txn_first_offset) {
            if Some(first) != restored_first {
                self.ongoing.remove(&first);
            }
        }
    }

    /// Whether a marker of `producer_id` at `epoch`, from a coordinator at
    /// `coordinator_epoch`, may end its transaction here: an older
    /// producer epoch is a zombie's, an older coordinator epoch a deposed
    /// coordinator's (TRANSACTION_COORDINATOR_FENCED).
    pub fn check_marker(
        &self,
        producer_id: i64,
        epoch: i16,
        coordinator_epoch: i32,
    ) -> Result<(), ResponseError> {
        match self.producers.get(&producer_id) {
            Some(e) if epoch < e.epoch => Err(ResponseError::InvalidProducerEpoch),
            Some(e) if coordinator_epoch < e.coordinator_epoch => {
                Err(ResponseError::TransactionCoordinatorFenced)
            }
            _ => Ok(()),
        }
    }

    /// Records a transaction marker of `producer_id` at `epoch` (written
    /// at `offset`): its open transaction here, if any, is over. Also
    /// used to rebuild the state from the log at start-up.
    pub fn record_marker(
        &mut self,
        producer_id: i64,
        epoch: i16,
        coordinator_epoch: i32,
        now_ms: i64,
    ) -> CompletedTxn {
        let entry = self
            .producers
            .entry(producer_id)
            .or_insert_with(|| ProducerEntry::new(epoch, now_ms));
        if epoch != entry.epoch {
            entry.epoch = epoch;
            entry.batches.clear();
        }
        entry.coordinator_epoch = coordinator_epoch;
        entry.last_write_ms = entry.last_write_ms.max(now_ms);
        let first_offset = entry.txn_first_offset.take();
        if let Some(first) = first_offset {
            self.ongoing.remove(&first);
        }
        CompletedTxn { first_offset }
    }

    /// Whether the producer's transaction at `epoch` has written here and
    /// not ended.
    pub fn in_open_transaction(&self, producer_id: i64, epoch: i16) -> bool {
        self.producers
            .get(&producer_id)
            .is_some_and(|e| e.epoch == epoch && e.txn_first_offset.is_some())
    }

    /// The first offset of the oldest open transaction: nothing at or
    /// after it is stable yet.
    pub fn first_unstable_offset(&self) -> Option<i64> {
        self.ongoing.keys().next().copied()
    }

    /// Every producer's state, for DescribeProducers.
    pub fn describe(&self) -> Vec<ProducerInfo> {
        let mut out: Vec<ProducerInfo> = self.producers.keys().filter_map(|id| self.info(*id)).collect();
        out.sort_by_key(|p| p.producer_id);
        out
    }

    /// One producer's state, for DescribeProducers, if this partition has
    /// any.
    pub fn info(&self, producer_id: i64) -> Option<ProducerInfo> {
        let e = self.producers.get(&producer_id)?;
        Some(ProducerInfo {
            producer_id,
            epoch: e.epoch,
            last_sequence: e.batches.back().map_or(-1, |b| b.last_seq),
            last_timestamp_ms: e.last_write_ms,
            coordinator_epoch: e.coordinator_epoch,
            txn_start_offset: e.txn_first_offset.unwrap_or(-1),
        })
    }

    /// Forgets producers that have not written for `expiration_ms`
    /// (`producer.id.expiration.ms`). Returns how many.
    pub fn expire(&mut self, now_ms: i64, expiration_ms: i64) -> usize {
        // A producer with an open transaction is kept until it ends, as in
        // Kafka: its marker is still to come.
        let before = self.producers.len();
        self.producers.retain(|_, e| {
            e.txn_first_offset.is_some() || now_ms.saturating_sub(e.last_write_ms) < expiration_ms
        });
        before - self.producers.len()
    }

    /// Producer id -> last offset of its newest batch.
    pub fn last_offsets(&self) -> HashMap<i64, i64> {
        self.producers
            .iter()
            .filter_map(|(id, p)| Some((*id, p.batches.back()?.last_offset)))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.producers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }

    /// Kafka's producer snapshot (version 1): the last batch of every
    /// producer, sorted by producer id.
    pub fn encode_snapshot(&self) -> Vec<u8> {
        let mut ids: Vec<_> = self.producers.keys().copied().collect();
        ids.sort_unstable();
        let mut out = Vec::with_capacity(10 + ids.len() * SNAPSHOT_ENTRY_LEN);
        out.extend_from_slice(&SNAPSHOT_VERSION.to_be_bytes());
        out.extend_from_slice(&[0; 4]); // CRC, below
        out.extend_from_slice(&(ids.len() as i32).to_be_bytes());
        for id in ids {
            let e = &self.producers[&id];
            // A producer known only from a marker has no batch: Kafka
            // writes sequence and offset -1 for it.
            let (last_seq, last_offset, offset_delta) = match e.batches.back() {
                Some(b) => (b.last_seq, b.last_offset, (b.last_offset - b.first_offset) as i32),
                None => (-1, -1, 0),
            };
            out.extend_from_slice(&id.to_be_bytes());
            out.extend_from_slice(&e.epoch.to_be_bytes());
            out.extend_from_slice(&last_seq.to_be_bytes());
            out.extend_from_slice(&last_offset.to_be_bytes());
            out.extend_from_slice(&offset_delta.to_be_bytes());
            out.extend_from_slice(&e.last_write_ms.to_be_bytes());
            out.extend_from_slice(&e.coordinator_epoch.to_be_bytes());
            out.extend_from_slice(&e.txn_first_offset.unwrap_or(-1).to_be_bytes());
        }
        let crc = crc32c::crc32c(&out[SNAPSHOT_ENTRIES_AT..]);
        out[2..6].copy_from_slice(&crc.to_be_bytes());
        out
    }

    /// Decodes a snapshot written by [`ProducerStates::encode_snapshot`] or
    /// by Kafka. Each producer's last batch becomes its one retained batch.
    pub fn decode_snapshot(bytes: &[u8]) -> Result<ProducerStates, String> {
        let read = |at: usize, n: usize| bytes.get(at..at + n).ok_or("snapshot truncated");
        let version = i16::from_be_bytes(read(0, 2)?.try_into().map_err(|_| "version")?);
        if version != SNAPSHOT_VERSION {
            return Err(format!("snapshot version {version} is not {SNAPSHOT_VERSION}"));
        }
        let crc = u32::from_be_bytes(read(2, 4)?.try_into().map_err(|_| "crc")?);
        let actual = crc32c::crc32c(bytes.get(SNAPSHOT_ENTRIES_AT..).ok_or("snapshot truncated")?);
        if crc != actual {
            return Err(format!("snapshot CRC {crc:#x} does not match {actual:#x}"));
        }
        let count = i32::from_be_bytes(read(6, 4)?.try_into().map_err(|_| "count")?);
        let count = usize::try_from(count).map_err(|_| "negative count")?;
        if bytes.len() != 10 + count.saturating_mul(SNAPSHOT_ENTRY_LEN) {
            return Err("snapshot length does not match its count".into());
        }
        let mut states = ProducerStates::default();
        for i in 0..count {
            let e = &bytes[10 + i * SNAPSHOT_ENTRY_LEN..10 + (i + 1) * SNAPSHOT_ENTRY_LEN];
            let i64_at = |at: usize| i64::from_be_bytes(e[at..at + 8].try_into().unwrap_or_default());
            let i32_at = |at: usize| i32::from_be_bytes(e[at..at + 4].try_into().unwrap_or_default());
            let id = i64_at(0);
            let epoch = i16::from_be_bytes([e[8], e[9]]);
            let last_seq = i32_at(10);
            let last_offset = i64_at(14);
            let offset_delta = i32_at(22);
            let last_write_ms = i64_at(26);
            let coordinator_epoch = i32_at(34);
            let txn_first_offset = Some(i64_at(38)).filter(|o| *o >= 0);
            let first_seq = decrement_sequence(last_seq, offset_delta.max(0));
            let batches = if last_offset < 0 {
                VecDeque::new()
            } else {
                VecDeque::from([BatchMeta {
                    first_seq,
                    last_seq,
                    first_offset: last_offset - i64::from(offset_delta.max(0)),
                    last_offset,
                }])
            };
            if let Some(first) = txn_first_offset {
                states.ongoing.insert(first, id);
            }
            states.producers.insert(
                id,
                ProducerEntry {
                    epoch,
                    batches,
                    last_write_ms,
                    coordinator_epoch,
                    txn_first_offset,
                },
            );
        }
        Ok(states)
    }
}

/// Kafka's `DefaultRecordBatch.decrementSequence`: the first sequence of
/// a batch from its last, wrapping below 0 to `i32::MAX`.
fn decrement_sequence(sequence: i32, decrement: i32) -> i32 {
    if sequence < 0 {
        return sequence;
    }
    if sequence < decrement {
        return i32::MAX - (decrement - sequence) + 1;
    }
    sequence - decrement
}

const SNAPSHOT_VERSION: i16 = 1;
/// The CRC covers everything from here (the entries array) to the end.
const SNAPSHOT_ENTRIES_AT: usize = 6;
/// id 8, epoch 2, last sequence 4, last offset 8, offset delta 4,
/// timestamp 8, coordinator epoch 4, transaction first offset 8.
const SNAPSHOT_ENTRY_LEN: usize = 46;

/// One producer's state as it was before an append (see [`ProducerStates::restore`]).
#[derive(Debug, Clone)]
pub struct ProducerSnapshot {
    producer_id: i64,
    entry: Option<ProducerEntry>,
}

/// Hands out producer ids in blocks. The end of the current block is
/// persisted before any id from it is used, so ids are never reused after a
/// crash (unused ids of a block are skipped).
pub struct ProducerIdAllocator {
    storage: Arc<dyn Storage>,
    path: PathBuf,
    next: i64,
    block_end: i64,
}

/// Ids reserved per write of the block file.
const ID_BLOCK: i64 = 1000;

impl ProducerIdAllocator {
    /// Opens the block file at `path` (none yet: ids start at 0).
    pub fn open_with(storage: Arc<dyn Storage>, path: &Path) -> std::io::Result<ProducerIdAllocator> {
        let next = match read_file(storage.as_ref(), path)? {
            Some(bytes) => std::str::from_utf8(&bytes)
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok())
                .ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("{}: not a producer id", path.display()),
                    )
                })?,
            None => 0,
        };
        Ok(ProducerIdAllocator {
            storage,
            path: path.to_path_buf(),
            next,
            block_end: next,
        })
    }

    /// The lowest id this allocator has not handed out and never will
    /// hand out again from blocks it reserved before.
    pub fn floor(&self) -> i64 {
        self.block_end
    }

    /// Records that ids below `end` may have been handed out elsewhere
    /// (from a cluster's blocks), so this allocator never hands them out
    /// (a synchronous write, when `end` is above what it reserved).
    pub fn reserve_through(&mut self, end: i64) -> std::io::Result<()> {
        if end > self.block_end {
            write_atomically(self.storage.as_ref(), &self.path, end.to_string().as_bytes())?;
            self.block_end = end;
            self.next = self.next.max(end);
        }
        Ok(())
    }

    /// The next unused producer id. Does a small synchronous write once per
    /// [`ID_BLOCK`] ids; callers run it off the async threads.
    pub fn allocate(&mut self) -> std::io::Result<i64> {
        if self.next >= self.block_end {
            let end = self.next + ID_BLOCK;
            write_atomically(self.storage.as_ref(), &self.path, end.to_string().as_bytes())?;
            self.block_end = end;
        }
        let id = self.next;
        self.next += 1;
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(pid: i64, epoch: i16, seq: i32, count: i32) -> BatchHeader {
        let mut builder = keel_log::testing::BatchBuilder::new(0).producer(pid, epoch, seq);
        for _ in 0..count {
            builder = builder.record(Some(b"k"), Some(b"v"));
        }
        let bytes = builder.build();
        BatchHeader::parse(&bytes).unwrap()
    }

    #[test]
    fn sequences_duplicates_gaps_and_fencing() {
        let mut s = ProducerStates::default();
        let b0 = header(7, 0, 0, 3);
        assert_eq!(s.check(&b0), SequenceCheck::Append);
        s.record(&b0, 100, 0);
        assert_eq!(s.check(&b0), SequenceCheck::Duplicate { first_offset: 100 });
        let b1 = header(7, 0, 3, 2);
        assert_eq!(s.check(&b1), SequenceCheck::Append);
        s.record(&b1, 103, 0);
        let gap = header(7, 0, 9, 1);
        assert_eq!(
            s.check(&gap),
            SequenceCheck::Reject(ResponseError::OutOfOrderSequenceNumber)
        );
        let stale = header(7, -1, 5, 1);
        assert_eq!(
            s.check(&stale),
            SequenceCheck::Reject(ResponseError::InvalidProducerEpoch)
        );
        let bumped = header(7, 1, 0, 1);
        assert_eq!(s.check(&bumped), SequenceCheck::Append);
        // A producer with no state here may start anywhere (Kafka 2.5+).
        assert_eq!(s.check(&header(8, 0, 4, 1)), SequenceCheck::Append);
        let bumped_mid = header(7, 2, 5, 1);
        assert_eq!(
            s.check(&bumped_mid),
            SequenceCheck::Reject(ResponseError::OutOfOrderSequenceNumber)
        );
        let plain = header(NO_PRODUCER_ID, -1, -1, 1);
        assert_eq!(s.check(&plain), SequenceCheck::Append);
    }

    #[test]
    fn only_recent_batches_are_remembered_and_snapshots_restore() {
        let mut s = ProducerStates::default();
        for i in 0..10 {
            s.record(&header(1, 0, i, 1), i64::from(i), 0);
        }
        assert_eq!(
            s.check(&header(1, 0, 9, 1)),
            SequenceCheck::Duplicate { first_offset: 9 }
        );
        assert_eq!(
            s.check(&header(1, 0, 2, 1)),
            SequenceCheck::Reject(ResponseError::OutOfOrderSequenceNumber)
        );
        let snap = s.snapshot(1);
        s.record(&header(1, 0, 10, 1), 10, 0);
        s.restore(snap);
        assert_eq!(s.check(&header(1, 0, 10, 1)), SequenceCheck::Append);
    }

    #[test]
    fn snapshots_round_trip_in_kafkas_format_and_expiry_forgets() {
        let mut s = ProducerStates::default();
        s.record(&header(9, 3, 0, 4), 100, 1_000);
        s.record(&header(9, 3, 4, 2), 104, 2_000);
        s.record(&header(5, 0, i32::MAX, 1), 7, 3_000);
        let bytes = s.encode_snapshot();
        assert_eq!(bytes.len(), 10 + 2 * 46);
        assert_eq!(&bytes[..2], &[0, 1], "version 1");
        let back = ProducerStates::decode_snapshot(&bytes).unwrap();
        assert_eq!(back.len(), 2);
        // The last batch survives: its retry is a duplicate, the next is in sequence.
        assert_eq!(
            back.check(&header(9, 3, 4, 2)),
            SequenceCheck::Duplicate { first_offset: 104 }
        );
        assert_eq!(back.check(&header(9, 3, 6, 1)), SequenceCheck::Append);
        assert_eq!(
            back.check(&header(9, 3, 9, 1)),
            SequenceCheck::Reject(ResponseError::OutOfOrderSequenceNumber)
        );
        assert_eq!(back.check(&header(5, 0, 0, 1)), SequenceCheck::Append, "wraps");
        assert_eq!(decrement_sequence(1, 3), i32::MAX - 1);
        assert_eq!(increment_sequence(decrement_sequence(1, 3), 3), 1);
        let mut bad = bytes.clone();
        bad[20] ^= 1;
        assert!(ProducerStates::decode_snapshot(&bad).unwrap_err().contains("CRC"));
        assert!(ProducerStates::decode_snapshot(&bytes[..30]).is_err());
        let mut back = back;
        assert_eq!(back.expire(3_500, 1_000), 1, "producer 9 last wrote at 2000");
        assert_eq!(back.len(), 1);
    }

    fn txn_header(pid: i64, epoch: i16, seq: i32) -> BatchHeader {
        let bytes = keel_log::testing::BatchBuilder::new(0)
            .producer(pid, epoch, seq)
            .transactional(true)
            .record(Some(b"k"), Some(b"v"))
            .build();
        BatchHeader::parse(&bytes).unwrap()
    }

    #[test]
    fn open_transactions_bound_stability_and_survive_snapshots() {
        let mut s = ProducerStates::default();
        assert_eq!(s.first_unstable_offset(), None);
        s.record(&txn_header(1, 0, 0), 10, 0);
        s.record(&txn_header(1, 0, 1), 12, 0);
        s.record(&txn_header(2, 3, 0), 11, 0);
        assert_eq!(s.first_unstable_offset(), Some(10), "the oldest open transaction");
        // Outside its transaction the producer may not write.
        assert_eq!(
            s.check(&header(1, 0, 2, 1)),
            SequenceCheck::Reject(ResponseError::InvalidTxnState)
        );
        // A snapshot carries the open transactions and the coordinator epochs.
        let back = ProducerStates::decode_snapshot(&s.encode_snapshot()).unwrap();
        assert_eq!(back.first_unstable_offset(), Some(10));
        assert_eq!(s.record_marker(1, 0, 5, 0).first_offset, Some(10));
        assert_eq!(s.first_unstable_offset(), Some(11));
        // A marker from an older epoch is a zombie's.
        assert_eq!(s.check_marker(2, 2, 5), Err(ResponseError::InvalidProducerEpoch));
        // One from an older coordinator is a deposed coordinator's.
        assert_eq!(
            s.check_marker(1, 0, 4),
            Err(ResponseError::TransactionCoordinatorFenced)
        );
        assert_eq!(s.check_marker(1, 0, 5), Ok(()));
        // A marker with a bumped epoch fences the producer's older batches.
        assert_eq!(s.record_marker(2, 4, 5, 0).first_offset, Some(11));
        assert_eq!(
            s.check(&txn_header(2, 3, 1)),
            SequenceCheck::Reject(ResponseError::InvalidProducerEpoch)
        );
        assert_eq!(s.first_unstable_offset(), None);
        // A producer known only from a marker survives a snapshot.
        assert_eq!(s.record_marker(9, 0, 5, 0).first_offset, None);
        let back = ProducerStates::decode_snapshot(&s.encode_snapshot()).unwrap();
        assert_eq!(back.describe().len(), 3);
        assert!(back.describe().iter().all(|p| p.coordinator_epoch == 5));
        // Undoing a failed write forgets the transaction it opened.
        let mut s = ProducerStates::default();
        let undo = s.snapshot(4);
        s.record(&txn_header(4, 0, 0), 20, 0);
        s.restore(undo);
        assert_eq!(s.first_unstable_offset(), None);
    }

    #[test]
    fn id_blocks_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("producer-ids");
        let disk = keel_log::DiskStorage::shared;
        let mut a = ProducerIdAllocator::open_with(disk(), &path).unwrap();
        assert_eq!(a.allocate().unwrap(), 0);
        assert_eq!(a.allocate().unwrap(), 1);
        let mut b = ProducerIdAllocator::open_with(disk(), &path).unwrap();
        assert_eq!(b.allocate().unwrap(), ID_BLOCK);
    }

    /// Ids a cluster handed this directory are never handed out by the
    /// directory alone, now or after a restart.
    #[test]
    fn ids_reserved_from_a_cluster_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("producer-ids");
        let disk = keel_log::DiskStorage::shared;
        let mut a = ProducerIdAllocator::open_with(disk(), &path).unwrap();
        assert_eq!(a.allocate().unwrap(), 0);
        a.reserve_through(7000).unwrap();
        assert_eq!(a.floor(), 7000);
        assert_eq!(a.allocate().unwrap(), 7000);
        a.reserve_through(10).unwrap(); // lower: nothing changes
        assert_eq!(a.allocate().unwrap(), 7001);
        let mut b = ProducerIdAllocator::open_with(disk(), &path).unwrap();
        assert!(b.allocate().unwrap() >= 7000 + ID_BLOCK);
    }

    /// No id handed out before a power cut is handed out again after it,
    /// whatever the cut kept of unsynced writes, and a crash at any
    /// storage step of a block's write leaves a file that opens.
    #[test]
    fn ids_are_never_reused_across_power_loss() {
        use keel_log::faults::{FaultEffect, FaultOp, FaultRule, FaultyStorage};
        use keel_log::sim::SimStorage;
        let seed = keel_log::testing::test_seed();
        let dir = Path::new("/data/__keel_meta");
        let path = dir.join("producer-ids");
        for round in 0..64u64 {
            let sim = SimStorage::new();
            sim.create_dir_all(dir).unwrap();
            sim.sync_dir(Path::new("/")).unwrap();
            sim.sync_dir(Path::new("/data")).unwrap();
            let mut handed_out = Vec::new();
            let mut a = ProducerIdAllocator::open_with(Arc::new(sim.clone()), &path).unwrap();
            for _ in 0..(round * 37) % 2_500 {
                handed_out.push(a.allocate().unwrap());
            }
            // The next block's write crashes at one of its storage steps.
            let faults = FaultyStorage::new(Arc::new(sim.clone()));
            faults.add(
                FaultRule::new(FaultOp::Any, FaultEffect::Crash)
                    .skip(round % 6)
                    .times(1),
            );
            let mut b = ProducerIdAllocator::open_with(Arc::new(faults), &path).unwrap();
            let _ = b.allocate();
            sim.power_loss(seed.wrapping_add(round));
            let mut c = ProducerIdAllocator::open_with(Arc::new(sim.clone()), &path).unwrap();
            let next = c.allocate().unwrap();
            assert!(
                handed_out.iter().all(|id| *id < next),
                "seed {seed} round {round}: id {next} was handed out before the power cut"
            );
        }
    }
}
