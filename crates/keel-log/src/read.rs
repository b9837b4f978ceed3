//! The I/O half of reads. A plan is made from the partition's in-memory
//! view without I/O and executed outside any lock with positional reads
//! (no mmap, no sendfile) of the segment's file, opened when the plan runs:
//! with O_DIRECT into aligned buffers, or through the page cache and then
//! dropped from it ([`ReadIo`]). The plan's end position is the segment's
//! committed size when planned, so execution never sees a batch that was
//! still being written. A segment deleted before the plan runs reads as
//! `NotFound`; one deleted while its file is open stays readable.

use std::fs::File;
use std::io;
use std::sync::Arc;

use bytes::Bytes;

use crate::batch::{check_crc, first_record_at_or_after, BatchHeader};
use crate::config::ReadIo;
use crate::segment::{invalid_data, read_header_at, SegmentFile};
use crate::storage::{read_exact_at, StoredFile};
use crate::tiered::TieredSegment;

/// A planned fetch from one segment. `Send + 'static`.
#[derive(Debug, Clone)]
pub struct ReadPlan {
    /// Set when the offsets are only in a colder tier: the tier store
    /// executes the plan ([`ReadPlan::execute`] refuses it).
    pub(crate) tiered: Option<TieredSegment>,
    pub(crate) file: Option<Arc<SegmentFile>>,
    pub(crate) start_position: u64,
    pub(crate) end_position: u64,
    pub(crate) target_offset: i64,
    pub(crate) max_bytes: usize,
    pub(crate) io: ReadIo,
    /// Where the first window should end: a batch boundary, so the read
    /// takes whole batches (see `index::window_end`).
    pub(crate) window_end: Option<u64>,
}

/// Smallest direct read: enough to find the target batch from an index
/// entry (`index.interval.bytes` apart) in one read.
const DIRECT_MIN_WINDOW: u64 = 64 * 1024;

impl ReadPlan {
    pub(crate) fn empty(target_offset: i64, max_bytes: usize) -> Self {
        ReadPlan {
            tiered: None,
            file: None,
            start_position: 0,
            end_position: 0,
            target_offset,
            max_bytes,
            io: ReadIo::Buffered,
            window_end: None,
        }
    }

    pub(crate) fn tiered(segment: TieredSegment, target_offset: i64, max_bytes: usize) -> Self {
        ReadPlan {
            end_position: segment.size_bytes,
            tiered: Some(segment),
            file: None,
            start_position: 0,
            target_offset,
            max_bytes,
            io: ReadIo::Direct,
            window_end: None,
        }
    }

    /// True if the plan reads nothing (the offset was the log end offset).
    pub fn is_empty(&self) -> bool {
        self.file.is_none() && self.tiered.is_none()
    }

    pub fn target_offset(&self) -> i64 {
        self.target_offset
    }

    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// The colder copy this plan reads, if the offsets are only there.
    pub fn tiered_segment(&self) -> Option<&TieredSegment> {
        self.tiered.as_ref()
    }

    /// The local segment file this plan reads (none for a colder copy or
    /// an empty plan).
    pub fn file_path(&self) -> Option<&std::path::Path> {
        self.file.as_deref().map(SegmentFile::path)
    }

    /// Byte position in the segment where the read starts.
    pub fn start_position(&self) -> u64 {
        self.start_position
    }

    /// Whole batches starting with the one holding the target offset, up to
    /// `max_bytes` in total but always at least one batch (KIP-74). May stop
    /// at the end of the plan's segment; the caller fetches again from there.
    /// Every returned batch's CRC is checked (data is checked twice: when
    /// produced and when read back). Corrupt data is an `InvalidData` error.
    pub fn execute(&self) -> io::Result<Bytes> {
        self.execute_scan().map(|r| r.bytes)
    }

    /// [`ReadPlan::execute`], plus where the data after the returned batches
    /// starts: passed to the next plan of a sequential scan
    /// ([`crate::LogReader::read_plan_after`]), it starts exactly there
    /// instead of at the index entry before (which, with fetches of a batch
    /// or two, would read every batch twice). Also says how many bytes the
    /// read took from the file, which budgets charge.
    pub fn execute_scan(&self) -> io::Result<ScanRead> {
        if let Some(t) = &self.tiered {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "segment {} is in the {} tier: read it through the tier store",
                    t.base_offset,
                    t.tier.name()
                ),
            ));
        }
        let Some(segment) = &self.file else {
            return Ok(ScanRead::default());
        };
        let file = segment.open()?;
        let mut disk_bytes = 0u64;
        let (position, bytes) = match self.io {
            ReadIo::Buffered => self.execute_buffered(file.as_ref(), &mut disk_bytes),
            io => read_windows_at(
                self.start_position,
                self.end_position,
                self.target_offset,
                self.max_bytes,
                self.window_end,
                |pos, len| {
                    let got = file.read_uncached(pos, len, io == ReadIo::Direct)?;
                    disk_bytes += got.len() as u64;
                    Ok(got)
                },
            ),
        }?;
        let hint = last_offset_of(&bytes).map(|last| ScanHint {
            file: Arc::downgrade(segment),
            next_offset: last + 1,
            position: position + bytes.len() as u64,
        });
        Ok(ScanRead {
            bytes,
            hint,
            disk_bytes,
        })
    }

    fn execute_buffered(&self, file: &dyn StoredFile, disk_bytes: &mut u64) -> io::Result<(u64, Bytes)> {
        let end = self.end_position;
        let Some((pos, first)) = find_batch(file, self.start_position, end, |h| {
            h.last_offset() >= self.target_offset
        })?
        else {
            return Ok((end, Bytes::new()));
        };
        let first_len = first.total_len() as u64;
        let want = (self.max_bytes as u64).max(first_len).min(end - pos);
        let mut buf = vec![0u8; want as usize];
        read_exact_at(file, &mut buf, pos)?;
        *disk_bytes += want;
        let keep = whole_batches_len(&buf, pos)?;
        buf.truncate(keep);
        Ok((pos, Bytes::from(buf)))
    }
}

/// What [`ReadPlan::execute_scan`] read.
#[derive(Debug, Clone, Default)]
pub struct ScanRead {
    /// Whole, CRC-checked batches.
    pub bytes: Bytes,
    /// Where the scan continues (see [`ScanHint`]).
    pub hint: Option<ScanHint>,
    /// Bytes read from the file, including what was read and not returned.
    pub disk_bytes: u64,
}

/// Where a sequential scan of a segment continues: the file position of the
/// batch holding `next_offset` (see [`ReadPlan::execute_scan`]) in that
/// segment file. A file the cleaner replaced is another file, so its hints
/// no longer apply.
#[derive(Debug, Clone)]
pub struct ScanHint {
    pub(crate) file: std::sync::Weak<SegmentFile>,
    pub(crate) next_offset: i64,
    pub(crate) position: u64,
}

impl ScanHint {
    pub fn next_offset(&self) -> i64 {
        self.next_offset
    }
}

/// The last offset of the last of `batches`, if any.
fn last_offset_of(batches: &[u8]) -> Option<i64> {
    let mut at = 0;
    let mut last = None;
    while let Ok(header) = BatchHeader::parse(&batches[at..]) {
        last = Some(header.last_offset());
        at += header.total_len();
        if at >= batches.len() {
            break;
        }
    }
    last
}

/// Asks the kernel to drop a file's clean pages from the page cache; dirty
/// pages are queued for writeback instead, and go on a later call. Advice
/// only: nothing about the file's contents depends on it.
pub fn drop_cached_pages(file: &File) {
    let _ = rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::DontNeed);
}

/// Scans headers from `pos` for the first batch matching `pred`.
fn find_batch(
    file: &dyn StoredFile,
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

/// Whole batches from `[start, end)` of a segment, starting with the one
/// holding `target_offset`, up to `max_bytes` (at least one batch),
/// CRC-checked, read in windows by `read(position, len)`, which may return
/// fewer bytes only at the end of the data. The first window ends at
/// `window_end` when given (a batch boundary from the index), so a scan
/// reads each batch once. Used for direct file reads and for colder tiers
/// (ranged reads of a file or an object).
pub fn read_windows(
    start: u64,
    end: u64,
    target_offset: i64,
    max_bytes: usize,
    window_end: Option<u64>,
    read: impl FnMut(u64, u64) -> io::Result<Bytes>,
) -> io::Result<Bytes> {
    read_windows_at(start, end, target_offset, max_bytes, window_end, read).map(|(_, bytes)| bytes)
}

/// [`read_windows`], with the position of the first returned batch.
fn read_windows_at(
    start: u64,
    end: u64,
    target_offset: i64,
    max_bytes: usize,
    window_end: Option<u64>,
    mut read: impl FnMut(u64, u64) -> io::Result<Bytes>,
) -> io::Result<(u64, Bytes)> {
    let mut pos = start;
    let mut window = match window_end {
        // Unless the data ends within reach: then read to its end.
        Some(at) if at > start && start.saturating_add(max_bytes as u64) < end => at - start,
        _ => (max_bytes as u64).max(DIRECT_MIN_WINDOW),
    };
    while pos < end {
        let asked = window.min(end - pos);
        let buf = read(pos, asked)?;
        if buf.is_empty() {
            return Err(invalid_data(format!("data ends at {pos}, before {end}")));
        }
        let mut at = 0usize;
        let mut found = None;
        while let Ok(header) = BatchHeader::parse(&buf[at..]) {
            if header.last_offset() >= target_offset {
                found = Some(header);
                break;
            }
            at += header.total_len();
            if at >= buf.len() {
                break;
            }
        }
        let Some(header) = found else {
            if at == 0 {
                return Err(invalid_data(format!("no batch header at {pos}")));
            }
            pos += at as u64;
            if pos > end {
                return Err(invalid_data(format!(
                    "a batch before {pos} runs past the end {end}"
                )));
            }
            continue;
        };
        let first_len = header.total_len();
        let batch_at = pos + at as u64;
        if batch_at + first_len as u64 > end {
            // A length no read can satisfy (a corrupt length field):
            // reading on would never make progress.
            return Err(invalid_data(format!(
                "batch at {batch_at} claims {first_len} bytes, past the end {end}"
            )));
        }
        if buf.len() - at < first_len {
            if (buf.len() as u64) < asked {
                // The file holds less than planned (it is shorter than its
                // recorded size): reading again would never make progress.
                return Err(invalid_data(format!(
                    "data ends at {}, inside the batch at {batch_at} (planned to {end})",
                    pos + buf.len() as u64
                )));
            }
            // The first batch runs past the window: read from it.
            pos += at as u64;
            window = (first_len as u64).max(max_bytes as u64);
            continue;
        }
        let take = (buf.len() - at).min(first_len.max(max_bytes));
        let batches = buf.slice(at..at + take);
        let keep = whole_batches_len(&batches, pos + at as u64)?;
        return Ok((pos + at as u64, batches.slice(..keep)));
    }
    Ok((end, Bytes::new()))
}

#[cfg(test)]
mod window_tests {
    use super::*;
    use crate::testing::simple_batch;

    /// Four batches of two records, offsets 0 to 7.
    fn four_batches() -> Vec<u8> {
        let mut data = Vec::new();
        for i in 0..4 {
            let mut b = simple_batch(2, 100, i);
            crate::batch::set_base_offset(&mut b, i * 2);
            data.extend(b);
        }
        data
    }

    /// Windows over `data`, failing the test if a read loop does not end.
    fn read(data: &[u8], target: i64, max_bytes: usize) -> io::Result<Bytes> {
        let data = Bytes::copy_from_slice(data);
        let mut calls = 0;
        read_windows(0, data.len() as u64, target, max_bytes, None, |pos, len| {
            calls += 1;
            assert!(calls < 1000, "the window loop does not end");
            Ok(data.slice(pos as usize..(pos + len) as usize))
        })
    }

    #[test]
    fn a_file_shorter_than_planned_ends_the_read_with_an_error() {
        let data = four_batches();
        let planned = data.len() as u64;
        let short = Bytes::copy_from_slice(&data[..data.len() - 50]);
        let mut calls = 0;
        let got = read_windows(0, planned, 7, 100, None, |pos, len| {
            calls += 1;
            assert!(calls < 1000, "the window loop does not end");
            let end = (pos + len).min(short.len() as u64);
            Ok(short.slice(pos.min(end) as usize..end as usize))
        });
        assert!(got.is_err(), "{got:?}");
    }

    #[test]
    fn corrupt_lengths_end_the_read_with_an_error() {
        let data = four_batches();
        assert!(read(&data, 7, 1 << 20).is_ok());
        let len_at = 8; // batchLength of the first batch
        for claimed in [i32::MAX, 1 << 20, 70_000] {
            let mut bad = data.clone();
            bad[len_at..len_at + 4].copy_from_slice(&claimed.to_be_bytes());
            // The corrupt batch is the one asked for, or one skipped on the way.
            for target in [0, 7] {
                let got = read(&bad, target, 100);
                assert!(got.is_err(), "claimed {claimed}, target {target}: {got:?}");
            }
        }
    }
}

/// Like [`TimestampPlan::execute`] over windows of a segment read by
/// `read(position, len)` (see [`read_windows`]).
pub fn find_timestamp_in_windows(
    start: u64,
    end: u64,
    timestamp_ms: i64,
    log_start_offset: i64,
    mut read: impl FnMut(u64, u64) -> io::Result<Bytes>,
) -> io::Result<Option<(i64, i64)>> {
    let mut pos = start;
    let mut window = DIRECT_MIN_WINDOW;
    while pos < end {
        let buf = read(pos, window.min(end - pos))?;
        let mut at = 0usize;
        // Length of a batch the window cut, to read whole next time.
        let mut cut = None;
        while at < buf.len() {
            let Ok(header) = BatchHeader::parse(&buf[at..]) else {
                break;
            };
            let len = header.total_len();
            let Some(batch) = buf.get(at..at + len) else {
                cut = Some(len as u64);
                break;
            };
            if header.max_timestamp >= timestamp_ms {
                check_crc(batch, &header)
                    .map_err(|e| invalid_data(format!("batch at {}: {e}", pos + at as u64)))?;
                let (offset, timestamp) = first_record_at_or_after(batch, &header, timestamp_ms)
                    .unwrap_or((header.base_offset, header.max_timestamp));
                return Ok(Some((offset.max(log_start_offset), timestamp)));
            }
            at += len;
        }
        if at == 0 {
            match cut {
                Some(len) if len > window => window = len,
                _ => return Err(invalid_data(format!("no whole batch at {pos}"))),
            }
        }
        pos += at as u64;
    }
    Ok(None)
}

/// A planned ListOffsets-by-timestamp lookup in one segment. `Send + 'static`.
#[derive(Debug, Clone)]
pub struct TimestampPlan {
    /// Set when the segment is only in a colder tier: the tier store
    /// executes the plan.
    pub(crate) tiered: Option<TieredSegment>,
    pub(crate) file: Option<Arc<SegmentFile>>,
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
        let Some(segment) = &self.file else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the segment is in a colder tier: look it up through the tier store",
            ));
        };
        let file = segment.open()?;
        let file = file.as_ref();
        let found = find_batch(file, self.start_position, self.end_position, |h| {
            h.max_timestamp >= self.timestamp_ms
        })?;
        let Some((pos, h)) = found else { return Ok(None) };
        let mut batch = vec![0u8; h.total_len()];
        read_exact_at(file, &mut batch, pos)?;
        // Exact record for uncompressed batches, as Kafka answers; compressed
        // batches are answered at batch granularity.
        let (offset, timestamp) = first_record_at_or_after(&batch, &h, self.timestamp_ms)
            .unwrap_or((h.base_offset, h.max_timestamp));
        Ok(Some((offset.max(self.log_start_offset), timestamp)))
    }

    /// The colder copy to look in, if the segment is only there.
    pub fn tiered_segment(&self) -> Option<&TieredSegment> {
        self.tiered.as_ref()
    }

    pub fn timestamp_ms(&self) -> i64 {
        self.timestamp_ms
    }

    pub fn log_start_offset(&self) -> i64 {
        self.log_start_offset
    }
}

/// Batch headers from a starting offset to the end of the log as planned,
/// read one header at a time (records are not read). Used by the broker to
/// rebuild producer state. Stops before damaged data. Yields at most one
/// error, then ends.
#[derive(Debug)]
pub struct HeaderScan {
    /// `(file, next position, end position)` per remaining segment.
    pub(crate) segments: std::collections::VecDeque<(Arc<SegmentFile>, u64, u64)>,
    pub(crate) from_offset: i64,
    pub(crate) open: Option<Arc<dyn StoredFile>>,
    /// Where the batch returned last lies: `(file, position, length)`.
    pub(crate) last: Option<(Arc<dyn StoredFile>, u64, usize)>,
}

impl HeaderScan {
    /// The whole batch whose header was returned last (for the few whose
    /// records matter to the caller, such as transaction markers).
    pub fn read_last_batch(&self) -> io::Result<Vec<u8>> {
        let Some((file, pos, len)) = &self.last else {
            return Err(io::Error::other("no batch was scanned yet"));
        };
        let mut buf = vec![0u8; *len];
        crate::storage::read_exact_at(file.as_ref(), &mut buf, *pos)?;
        Ok(buf)
    }
}

impl Iterator for HeaderScan {
    type Item = io::Result<BatchHeader>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let (segment, pos, end) = self.segments.front_mut()?;
            let file = match &self.open {
                Some(f) => Arc::clone(f),
                None => match segment.open() {
                    Ok(f) => {
                        self.open = Some(Arc::clone(&f));
                        f
                    }
                    Err(e) => {
                        self.segments.clear();
                        return Some(Err(e));
                    }
                },
            };
            match read_header_at(file.as_ref(), *pos, *end) {
                Err(e) => {
                    self.segments.clear();
                    return Some(Err(e));
                }
                Ok(None) => {
                    self.segments.pop_front();
                    self.open = None;
                }
                Ok(Some(header)) => {
                    self.last = Some((file, *pos, header.total_len()));
                    *pos += header.total_len() as u64;
                    if header.last_offset() >= self.from_offset {
                        return Some(Ok(header));
                    }
                }
            }
        }
    }
}
