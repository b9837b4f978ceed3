//! The I/O half of reads. A plan is made under the partition lock without
//! I/O and executed outside it with positional reads (`read_at`: no mmap, no
//! sendfile) on a shared `Arc<File>`. The plan's end position is the
//! segment's committed size when planned, so execution never sees a batch
//! that was still being written; and a segment deleted meanwhile stays
//! readable because the open file keeps its inode alive.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use bytes::Bytes;

use crate::batch::{check_crc, first_record_at_or_after, BatchHeader};
use crate::segment::{invalid_data, read_header_at};

/// A planned fetch from one segment. `Send + 'static`.
#[derive(Debug, Clone)]
pub struct ReadPlan {
    pub(crate) file: Option<Arc<File>>,
    pub(crate) start_position: u64,
    pub(crate) end_position: u64,
    pub(crate) target_offset: i64,
    pub(crate) max_bytes: usize,
}

impl ReadPlan {
    pub(crate) fn empty(target_offset: i64, max_bytes: usize) -> Self {
        ReadPlan {
            file: None,
            start_position: 0,
            end_position: 0,
            target_offset,
            max_bytes,
        }
    }

    /// True if the plan reads nothing (the offset was the log end offset).
    pub fn is_empty(&self) -> bool {
        self.file.is_none()
    }

    pub fn target_offset(&self) -> i64 {
        self.target_offset
    }

    /// Whole batches starting with the one holding the target offset, up to
    /// `max_bytes` in total but always at least one batch (KIP-74). May stop
    /// at the end of the plan's segment; the caller fetches again from there.
    /// Every returned batch's CRC is checked (data is checked twice: when
    /// produced and when read back). Corrupt data is an `InvalidData` error.
    pub fn execute(&self) -> io::Result<Bytes> {
        let Some(file) = &self.file else {
            return Ok(Bytes::new());
        };
        let end = self.end_position;
        let Some((pos, first)) = find_batch(file, self.start_position, end, |h| {
            h.last_offset() >= self.target_offset
        })?
        else {
            return Ok(Bytes::new());
        };
        let first_len = first.total_len() as u64;
        let want = (self.max_bytes as u64).max(first_len).min(end - pos);
        let mut buf = vec![0u8; want as usize];
        file.read_exact_at(&mut buf, pos)?;
        let keep = whole_batches_len(&buf, pos)?;
        buf.truncate(keep);
        Ok(Bytes::from(buf))
    }
}

/// Scans headers from `pos` for the first batch matching `pred`.
fn find_batch(
    file: &File,
    mut pos: u64,
    end: u64,
    pred: impl Fn(&BatchHeader) -> bool,
) -> io::Result<Option<(u64, BatchHeader)>> {
    while let Some(header) = read_header_at(file, pos, end)? {
        if pred(&header) {
            return Ok(Some((pos, header)));
        }
        pos += header.total_len() as u64;
    }
    Ok(None)
}

/// Length of the prefix of `buf` made of whole, CRC-valid batches. The first
/// batch is known to be whole.
fn whole_batches_len(buf: &[u8], file_pos: u64) -> io::Result<usize> {
    let mut at = 0;
    while at < buf.len() {
        let rest = &buf[at..];
        let Ok(header) = BatchHeader::parse(rest) else {
            // A header cut by the max_bytes limit; the first one never is.
            break;
        };
        let Some(batch) = rest.get(..header.total_len()) else {
            break;
        };
        check_crc(batch, &header)
            .map_err(|e| invalid_data(format!("batch at {}: {e}", file_pos + at as u64)))?;
        at += header.total_len();
    }
    if at == 0 {
        return Err(invalid_data(format!("invalid batch at {file_pos}")));
    }
    Ok(at)
}

/// A planned ListOffsets-by-timestamp lookup in one segment. `Send + 'static`.
#[derive(Debug, Clone)]
pub struct TimestampPlan {
    pub(crate) file: Arc<File>,
    pub(crate) start_position: u64,
    pub(crate) end_position: u64,
    pub(crate) timestamp_ms: i64,
    pub(crate) log_start_offset: i64,
}

impl TimestampPlan {
    /// `(offset, timestamp)` of the first record whose timestamp is >= the
    /// target (raised to the log start offset). In an uncompressed batch
    /// that is the exact record, as in Kafka; a compressed batch is answered
    /// with its base offset and max timestamp, so a consumer may see a few
    /// older records of that batch first.
    pub fn execute(&self) -> io::Result<Option<(i64, i64)>> {
        let found = find_batch(&self.file, self.start_position, self.end_position, |h| {
            h.max_timestamp >= self.timestamp_ms
        })?;
        let Some((pos, h)) = found else { return Ok(None) };
        let mut batch = vec![0u8; h.total_len()];
        self.file.read_exact_at(&mut batch, pos)?;
        // Exact record for uncompressed batches, as Kafka answers; compressed
        // batches are answered at batch granularity.
        let (offset, timestamp) = first_record_at_or_after(&batch, &h, self.timestamp_ms)
            .unwrap_or((h.base_offset, h.max_timestamp));
        Ok(Some((offset.max(self.log_start_offset), timestamp)))
    }
}

/// Batch headers from a starting offset to the end of the log as planned,
/// read one header at a time (records are not read). Used by the broker to
/// rebuild producer state. Yields at most one error, then ends.
#[derive(Debug)]
pub struct HeaderScan {
    /// `(file, next position, end position)` per remaining segment.
    pub(crate) segments: std::collections::VecDeque<(Arc<File>, u64, u64)>,
    pub(crate) from_offset: i64,
}

impl Iterator for HeaderScan {
    type Item = io::Result<BatchHeader>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let (file, pos, end) = self.segments.front_mut()?;
            match read_header_at(file, *pos, *end) {
                Err(e) => {
                    self.segments.clear();
                    return Some(Err(e));
                }
                Ok(None) => {
                    self.segments.pop_front();
                }
                Ok(Some(header)) => {
                    *pos += header.total_len() as u64;
                    if header.last_offset() >= self.from_offset {
                        return Some(Ok(header));
                    }
                }
            }
        }
    }
}
