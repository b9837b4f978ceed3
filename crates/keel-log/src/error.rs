//! One small error enum per operation boundary.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Why [`crate::PartitionLog::open`] failed. Bad on-disk data is repaired
/// (truncated or rebuilt), not reported here; only I/O and config errors are.
#[derive(Debug)]
pub enum OpenError {
    Io { path: PathBuf, source: io::Error },
    InvalidConfig(&'static str),
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::Io { path, source } => {
                write!(f, "opening partition log at {}: {source}", path.display())
            }
            OpenError::InvalidConfig(why) => write!(f, "invalid log config: {why}"),
        }
    }
}

impl std::error::Error for OpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OpenError::Io { source, .. } => Some(source),
            OpenError::InvalidConfig(_) => None,
        }
    }
}

/// Why [`crate::PartitionLog::append`] failed. After an error the log holds
/// exactly what it held before the call, except after `Offline`.
#[derive(Debug)]
pub enum AppendError {
    /// The write failed and was undone; the log is usable.
    Io(io::Error),
    /// The log's files can no longer be trusted (an fsync failed, or a
    /// failed write could not be undone): this and every later write fail.
    Offline(String),
    /// No batches given.
    Empty,
    /// The headers do not describe `records` (their lengths do not add up).
    HeadersMismatch {
        headers_bytes: usize,
        records_bytes: usize,
    },
    /// Offsets would pass `i64::MAX`, or one append spans more than 2^31
    /// offsets (more than one segment can index).
    OffsetOverflow,
}

impl fmt::Display for AppendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AppendError::Io(e) => write!(f, "append I/O error: {e}"),
            AppendError::Offline(why) => write!(f, "the log is offline: {why}"),
            AppendError::Empty => write!(f, "append of no batches"),
            AppendError::HeadersMismatch {
                headers_bytes,
                records_bytes,
            } => write!(
                f,
                "batch headers cover {headers_bytes} bytes but records hold {records_bytes}"
            ),
            AppendError::OffsetOverflow => write!(f, "offset overflow"),
        }
    }
}

impl std::error::Error for AppendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AppendError::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for AppendError {
    fn from(e: io::Error) -> Self {
        AppendError::Io(e)
    }
}

/// Why a read could not be planned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    /// The offset is outside `[log_start, log_end]`.
    OffsetOutOfRange { log_start: i64, log_end: i64 },
    /// The offset lies in data found invalid below the recovery point.
    Damaged {
        segment_base_offset: i64,
        position: u64,
        reason: String,
    },
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::OffsetOutOfRange { log_start, log_end } => {
                write!(f, "offset out of range [{log_start}, {log_end}]")
            }
            ReadError::Damaged {
                segment_base_offset,
                position,
                reason,
            } => write!(
                f,
                "segment {segment_base_offset} is damaged from byte {position}: {reason}"
            ),
        }
    }
}

impl std::error::Error for ReadError {}

/// Why [`crate::PartitionLog::delete_records_before`] failed.
#[derive(Debug)]
pub enum DeleteRecordsError {
    /// The offset is beyond the log end offset.
    OffsetOutOfRange {
        offset: i64,
        log_end: i64,
    },
    /// The log's cleanup policy has no `delete`: its records are kept
    /// until compacted (Kafka's POLICY_VIOLATION).
    PolicyViolation,
    Io(io::Error),
}

impl fmt::Display for DeleteRecordsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeleteRecordsError::OffsetOutOfRange { offset, log_end } => {
                write!(f, "offset {offset} is beyond the log end offset {log_end}")
            }
            DeleteRecordsError::PolicyViolation => {
                write!(f, "records cannot be deleted under the configured cleanup policy")
            }
            DeleteRecordsError::Io(e) => write!(f, "delete records I/O error: {e}"),
        }
    }
}

impl std::error::Error for DeleteRecordsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DeleteRecordsError::Io(e) => Some(e),
            DeleteRecordsError::OffsetOutOfRange { .. } | DeleteRecordsError::PolicyViolation => None,
        }
    }
}

impl From<io::Error> for DeleteRecordsError {
    fn from(e: io::Error) -> Self {
        DeleteRecordsError::Io(e)
    }
}
