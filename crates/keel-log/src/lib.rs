//! Keel's partition log: one directory per topic-partition holding Kafka
//! record-batch v2 segments (`.log`), offset indexes (`.index`) and time
//! indexes (`.timeindex`) in Apache Kafka's exact on-disk format
//! (`docs/format.md`).
//!
//! The crate knows nothing about sockets, requests, producers or topics. Its
//! caller owns a [`PartitionLog`] (the writer) behind a lock only writers
//! wait on; readers share its [`LogReader`], whose in-memory view is never
//! locked across I/O. Reads are split into a planning step that does no I/O
//! ([`LogReader::read_plan`]) and an execution step ([`ReadPlan::execute`]).
//! Every file operation goes through the [`storage`] seam.
//!
//! Offsets named here:
//! * *log start offset*: the first offset readable; only moves forward
//!   (retention, DeleteRecords) except through [`PartitionLog::truncate_to`].
//! * *log end offset*: the next offset to assign; moves forward on append and
//!   back only through [`PartitionLog::truncate_to`] and recovery.
//! * *flushed offset*: every offset below it has been fsynced.
//! * *recovery point*: persisted; every segment below the one holding it
//!   is durable with its indexes. After an unclean stop, segments from
//!   there on are recovered.

pub mod batch;
pub mod clean;
pub mod clock;
pub mod codec;
mod config;
mod error;
pub mod faults;
mod fence;
mod index;
pub mod inspect;
pub mod marker;
mod partition;
pub mod plan;
mod read;
pub mod records;
mod seal;
mod segment;
#[cfg(any(test, feature = "testing"))]
pub mod sim;
pub mod storage;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tiered;
pub mod txnindex;
mod view;

pub use batch::{BatchError, BatchHeader};
pub use config::{CleanupPolicy, LogConfig, ReadIo};
pub use error::{AppendError, DeleteRecordsError, OpenError, ReadError};
pub use index::SegmentIndex;
pub use partition::{
    remove_retired, AppendInfo, AppendTimes, PartitionLog, RetentionOutcome, SealedSegment,
    CLEAN_SHUTDOWN_FILE, LOG_START_OFFSET_FILE,
};
pub use read::{
    drop_cached_pages, find_timestamp_in_windows, read_windows, HeaderScan, ReadPlan, ScanHint, ScanRead,
    TimestampPlan,
};
pub use seal::{Sealer, RECOVERY_POINT_FILE};
pub use segment::{log_path, Damage, SegmentFile};
pub use storage::{probe_direct_io, probe_direct_io_at, read_uncached, DiskStorage, Storage, StoredFile};
pub use tiered::{Tier, TierState, TieredSegment};
pub use txnindex::AbortedTxn;
pub use view::LogReader;
