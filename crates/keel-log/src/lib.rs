//! Keel's partition log: one directory per topic-partition holding Kafka
//! record-batch v2 segments (`.log`), offset indexes (`.index`) and time
//! indexes (`.timeindex`) in Apache Kafka's exact on-disk format
//! (`docs/format.md`).
//!
//! The crate knows nothing about sockets, requests, producers or topics. Its
//! caller holds a [`PartitionLog`] behind a per-partition mutex; reads are
//! split into a planning step that does no I/O ([`PartitionLog::read_plan`])
//! and an execution step done outside the lock ([`ReadPlan::execute`]).
//!
//! Offsets named here:
//! * *log start offset*: the first offset readable; only moves forward
//!   (retention, DeleteRecords) except through [`PartitionLog::truncate_to`].
//! * *log end offset*: the next offset to assign; moves forward on append and
//!   back only through [`PartitionLog::truncate_to`] and recovery.
//! * *flushed offset*: every offset below it has been fsynced.

pub mod batch;
mod config;
mod error;
mod index;
mod partition;
mod read;
mod segment;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tiered;

pub use batch::{BatchError, BatchHeader};
pub use config::{LogConfig, ReadIo};
pub use error::{AppendError, DeleteRecordsError, OpenError, ReadError};
pub use index::SegmentIndex;
pub use partition::{
    AppendInfo, PartitionLog, RetentionOutcome, SealedSegment, CLEAN_SHUTDOWN_FILE, LOG_START_OFFSET_FILE,
};
pub use read::{
    drop_cached_pages, find_timestamp_in_windows, probe_direct_io, read_uncached, read_windows, HeaderScan,
    ReadPlan, ScanHint, TimestampPlan,
};
pub use tiered::{Tier, TierState, TieredSegment};
