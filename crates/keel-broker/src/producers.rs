//! Idempotent producers: producer id allocation and the per-partition
//! sequence state that turns retries into duplicates instead of copies.
//!
//! The rules follow Kafka's (KIP-98, KIP-360): a producer id owns an epoch;
//! within an epoch, batch sequences must follow each other without gaps; a
//! batch equal to one of the last [`RETAINED_BATCHES`] is a retry and is
//! answered with its original offset; an older epoch is fenced.

use std::collections::{HashMap, VecDeque};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use keel_log::batch::{increment_sequence, BatchHeader};
use keel_protocol::ResponseError;

/// How many recent batches per producer are remembered for duplicate
/// detection: clients keep at most five requests in flight per partition.
pub const RETAINED_BATCHES: usize = 5;

/// The producer id of a batch from a non-idempotent producer.
pub const NO_PRODUCER_ID: i64 = -1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BatchMeta {
    first_seq: i32,
    last_seq: i32,
    first_offset: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ProducerEntry {
    epoch: i16,
    batches: VecDeque<BatchMeta>,
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
}

impl ProducerStates {
    /// Decides whether a batch is new, a retry, or out of order.
    pub fn check(&self, h: &BatchHeader) -> SequenceCheck {
        if h.producer_id == NO_PRODUCER_ID {
            return SequenceCheck::Append;
        }
        let Some(entry) = self.producers.get(&h.producer_id) else {
            return if h.base_sequence == 0 {
                SequenceCheck::Append
            } else {
                SequenceCheck::Reject(ResponseError::OutOfOrderSequenceNumber)
            };
        };
        if h.producer_epoch < entry.epoch {
            return SequenceCheck::Reject(ResponseError::InvalidProducerEpoch);
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

    /// Records a batch written at `first_offset`. Also used to rebuild the
    /// state from the log at start-up.
    pub fn record(&mut self, h: &BatchHeader, first_offset: i64) {
        if h.producer_id == NO_PRODUCER_ID {
            return;
        }
        let entry = self
            .producers
            .entry(h.producer_id)
            .or_insert_with(|| ProducerEntry {
                epoch: h.producer_epoch,
                batches: VecDeque::new(),
            });
        if h.producer_epoch != entry.epoch {
            entry.epoch = h.producer_epoch;
            entry.batches.clear();
        }
        if entry.batches.len() == RETAINED_BATCHES {
            entry.batches.pop_front();
        }
        entry.batches.push_back(BatchMeta {
            first_seq: h.base_sequence,
            last_seq: h.last_sequence(),
            first_offset,
        });
    }

    /// A copy of one producer's state, to restore if a write fails.
    pub fn snapshot(&self, producer_id: i64) -> ProducerSnapshot {
        ProducerSnapshot {
            producer_id,
            entry: self.producers.get(&producer_id).cloned(),
        }
    }

    pub fn restore(&mut self, snapshot: ProducerSnapshot) {
        match snapshot.entry {
            Some(e) => self.producers.insert(snapshot.producer_id, e),
            None => self.producers.remove(&snapshot.producer_id),
        };
    }

    pub fn len(&self) -> usize {
        self.producers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }
}

/// One producer's state as it was before an append (see [`ProducerStates::restore`]).
#[derive(Debug, Clone)]
pub struct ProducerSnapshot {
    producer_id: i64,
    entry: Option<ProducerEntry>,
}

/// Hands out producer ids in blocks. The end of the current block is
/// persisted before any id from it is used, so ids are never reused after a
/// crash (unused ids of a block are skipped).
#[derive(Debug)]
pub struct ProducerIdAllocator {
    path: PathBuf,
    next: i64,
    block_end: i64,
}

/// Ids reserved per write of the block file.
const ID_BLOCK: i64 = 1000;

impl ProducerIdAllocator {
    pub fn open(path: &Path) -> std::io::Result<ProducerIdAllocator> {
        let next = match fs::read_to_string(path) {
            Ok(s) => s.trim().parse::<i64>().map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: {e}", path.display()),
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        Ok(ProducerIdAllocator {
            path: path.to_path_buf(),
            next,
            block_end: next,
        })
    }

    /// The next unused producer id. Does a small synchronous write once per
    /// [`ID_BLOCK`] ids; callers run it off the async threads.
    pub fn allocate(&mut self) -> std::io::Result<i64> {
        if self.next >= self.block_end {
            let end = self.next + ID_BLOCK;
            write_atomically(&self.path, end.to_string().as_bytes())?;
            self.block_end = end;
        }
        let id = self.next;
        self.next += 1;
        Ok(id)
    }
}

/// Replaces `path` with `contents` so that a crash leaves either the old or
/// the new file: write a temporary file, fsync it, rename, fsync the dir.
pub fn write_atomically(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(contents)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
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
        s.record(&b0, 100);
        assert_eq!(s.check(&b0), SequenceCheck::Duplicate { first_offset: 100 });
        let b1 = header(7, 0, 3, 2);
        assert_eq!(s.check(&b1), SequenceCheck::Append);
        s.record(&b1, 103);
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
        assert_eq!(
            s.check(&header(8, 0, 4, 1)),
            SequenceCheck::Reject(ResponseError::OutOfOrderSequenceNumber)
        );
        let plain = header(NO_PRODUCER_ID, -1, -1, 1);
        assert_eq!(s.check(&plain), SequenceCheck::Append);
    }

    #[test]
    fn only_recent_batches_are_remembered_and_snapshots_restore() {
        let mut s = ProducerStates::default();
        for i in 0..10 {
            s.record(&header(1, 0, i, 1), i64::from(i));
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
        s.record(&header(1, 0, 10, 1), 10);
        s.restore(snap);
        assert_eq!(s.check(&header(1, 0, 10, 1)), SequenceCheck::Append);
    }

    #[test]
    fn id_blocks_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("producer-ids");
        let mut a = ProducerIdAllocator::open(&path).unwrap();
        assert_eq!(a.allocate().unwrap(), 0);
        assert_eq!(a.allocate().unwrap(), 1);
        let mut b = ProducerIdAllocator::open(&path).unwrap();
        assert_eq!(b.allocate().unwrap(), ID_BLOCK);
    }
}
