//! Offset and time indexes, kept in memory and mirrored byte for byte in
//! Kafka's `.index` / `.timeindex` files (no preallocation: a file is exactly
//! its entries). Reads never touch the files.
//!
//! `.index` entry (8 bytes, big-endian): relative offset i32, position i32.
//! The relative offset is that of the *last* record of the batch starting at
//! `position` (Kafka's `LogSegment.append` semantics).
//! `.timeindex` entry (12 bytes, big-endian): timestamp i64, relative offset
//! i32 of the batch that holds the segment's max timestamp so far.

// Parsing code: bad bytes are errors, never panics.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use crate::batch::NO_TIMESTAMP;

pub(crate) const OFFSET_ENTRY_LEN: usize = 8;
pub(crate) const TIME_ENTRY_LEN: usize = 12;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OffsetEntry {
    /// Offset minus the segment's base offset; fits Kafka's int32.
    pub relative_offset: u32,
    /// Byte position of the batch start in the `.log` file.
    pub position: u32,
}

impl OffsetEntry {
    pub fn encode(&self) -> [u8; OFFSET_ENTRY_LEN] {
        let mut out = [0u8; OFFSET_ENTRY_LEN];
        out[..4].copy_from_slice(&self.relative_offset.to_be_bytes());
        out[4..].copy_from_slice(&self.position.to_be_bytes());
        out
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimeEntry {
    pub timestamp_ms: i64,
    pub relative_offset: u32,
}

impl TimeEntry {
    pub fn encode(&self) -> [u8; TIME_ENTRY_LEN] {
        let mut out = [0u8; TIME_ENTRY_LEN];
        out[..8].copy_from_slice(&self.timestamp_ms.to_be_bytes());
        out[8..].copy_from_slice(&self.relative_offset.to_be_bytes());
        out
    }
}

/// Decodes and sanity-checks an `.index` file image. `Err` carries the reason
/// the index must be rebuilt.
pub(crate) fn decode_offset_index(
    bytes: &[u8],
    log_size_bytes: u64,
) -> Result<Vec<OffsetEntry>, &'static str> {
    if !bytes.chunks_exact(OFFSET_ENTRY_LEN).remainder().is_empty() {
        return Err("length is not a multiple of 8");
    }
    let mut entries: Vec<OffsetEntry> = Vec::with_capacity(bytes.len() / OFFSET_ENTRY_LEN);
    for chunk in bytes.chunks_exact(OFFSET_ENTRY_LEN) {
        let relative_offset = i32_at(chunk, 0);
        let position = i32_at(chunk, 4);
        if relative_offset < 0 || position < 0 {
            return Err("negative entry");
        }
        let entry = OffsetEntry {
            relative_offset: relative_offset as u32,
            position: position as u32,
        };
        if u64::from(entry.position) >= log_size_bytes {
            return Err("position beyond the log");
        }
        if let Some(prev) = entries.last() {
            if entry.relative_offset <= prev.relative_offset || entry.position <= prev.position {
                return Err("entries not strictly increasing");
            }
        }
        entries.push(entry);
    }
    Ok(entries)
}

/// Decodes and sanity-checks a `.timeindex` file image.
pub(crate) fn decode_time_index(bytes: &[u8]) -> Result<Vec<TimeEntry>, &'static str> {
    if !bytes.chunks_exact(TIME_ENTRY_LEN).remainder().is_empty() {
        return Err("length is not a multiple of 12");
    }
    let mut entries: Vec<TimeEntry> = Vec::with_capacity(bytes.len() / TIME_ENTRY_LEN);
    for chunk in bytes.chunks_exact(TIME_ENTRY_LEN) {
        let timestamp_ms = i64::from_be_bytes(array_at(chunk, 0));
        let relative_offset = i32_at(chunk, 8);
        if relative_offset < 0 {
            return Err("negative relative offset");
        }
        let entry = TimeEntry {
            timestamp_ms,
            relative_offset: relative_offset as u32,
        };
        if let Some(prev) = entries.last() {
            if entry.timestamp_ms < prev.timestamp_ms || entry.relative_offset < prev.relative_offset {
                return Err("entries decreasing");
            }
        }
        entries.push(entry);
    }
    Ok(entries)
}

/// Position to start scanning for `relative_target`: the greatest entry whose
/// offset is <= the target, else the segment start.
pub(crate) fn lookup_position(entries: &[OffsetEntry], relative_target: i64) -> u32 {
    let idx = entries.partition_point(|e| i64::from(e.relative_offset) <= relative_target);
    match idx {
        0 => 0,
        i => entries[i - 1].position,
    }
}

/// A read window's end on a batch boundary: the greatest indexed batch
/// start in `(start, start + max_bytes]`, else the first one past that (a
/// first batch larger than `max_bytes` is still read whole); `None` when no
/// indexed batch starts after `start`. Reading up to it takes whole batches,
/// so no partial batch at a window's end is read twice.
pub(crate) fn window_end(entries: &[OffsetEntry], start: u64, max_bytes: usize) -> Option<u64> {
    let limit = start.saturating_add(max_bytes as u64);
    let idx = entries.partition_point(|e| u64::from(e.position) <= limit);
    let within = idx
        .checked_sub(1)
        .map(|i| u64::from(entries[i].position))
        .filter(|end| *end > start);
    within.or_else(|| entries.get(idx).map(|e| u64::from(e.position)))
}

/// Relative offset to start a timestamp search from: that of the greatest
/// entry whose timestamp is <= the target, else the segment start.
pub(crate) fn lookup_time(entries: &[TimeEntry], timestamp_ms: i64) -> u32 {
    let idx = entries.partition_point(|e| e.timestamp_ms <= timestamp_ms);
    match idx {
        0 => 0,
        i => entries[i - 1].relative_offset,
    }
}

/// A segment's decoded `.index` and `.timeindex`, for segments read from a
/// colder tier (whose indexes are fetched whole and kept in memory).
#[derive(Debug, Clone, Default)]
pub struct SegmentIndex {
    base_offset: i64,
    offsets: Vec<OffsetEntry>,
    times: Vec<TimeEntry>,
}

impl SegmentIndex {
    /// Decodes both index images of the segment at `base_offset` whose
    /// `.log` is `log_size_bytes` long. A bad image is an error; the tier
    /// copy was verified when it was made.
    pub fn decode(
        base_offset: i64,
        log_size_bytes: u64,
        index: &[u8],
        time_index: &[u8],
    ) -> Result<SegmentIndex, &'static str> {
        Ok(SegmentIndex {
            base_offset,
            offsets: decode_offset_index(index, log_size_bytes)?,
            times: decode_time_index(time_index)?,
        })
    }

    /// Bytes held in memory.
    pub fn memory_bytes(&self) -> usize {
        self.offsets.len() * std::mem::size_of::<OffsetEntry>()
            + self.times.len() * std::mem::size_of::<TimeEntry>()
    }

    /// The byte positions the offset index names, in order.
    pub fn positions(&self) -> Vec<u32> {
        self.offsets.iter().map(|e| e.position).collect()
    }

    /// Where to start scanning for `offset`.
    pub fn position_of(&self, offset: i64) -> u64 {
        u64::from(lookup_position(&self.offsets, offset - self.base_offset))
    }

    /// Where a read of `max_bytes` from `start` should end to take whole
    /// batches (see [`window_end`]).
    pub fn window_end(&self, start: u64, max_bytes: usize) -> Option<u64> {
        window_end(&self.offsets, start, max_bytes)
    }

    /// Where to start scanning for the first batch with a timestamp at or
    /// after `timestamp_ms`.
    pub fn position_for_timestamp(&self, timestamp_ms: i64) -> u64 {
        let relative = lookup_time(&self.times, timestamp_ms);
        u64::from(lookup_position(&self.offsets, i64::from(relative)))
    }
}

/// The per-segment state of Kafka's index-entry rule, shared by append and
/// rebuild so both produce identical indexes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Indexer {
    pub bytes_since_last_entry: u64,
    /// Largest batch max timestamp in the segment, or -1.
    pub max_timestamp_ms: i64,
    /// Last offset of the batch holding `max_timestamp_ms` (absolute).
    pub offset_of_max_timestamp: i64,
}

/// One batch as the indexer sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchMeta {
    pub last_offset: i64,
    pub max_timestamp_ms: i64,
    pub position: u32,
    pub size_bytes: u32,
}

impl Indexer {
    pub fn new(base_offset: i64) -> Self {
        Indexer {
            bytes_since_last_entry: 0,
            max_timestamp_ms: NO_TIMESTAMP,
            offset_of_max_timestamp: base_offset,
        }
    }

    /// Kafka's `LogSegment.append` loop body: track the max timestamp; once
    /// more than `interval_bytes` were written since the last entry, emit an
    /// offset entry for this batch and a time entry if the max grew.
    pub fn on_batch(
        &mut self,
        meta: BatchMeta,
        base_offset: i64,
        interval_bytes: u64,
        last_time_entry: Option<TimeEntry>,
    ) -> (Option<OffsetEntry>, Option<TimeEntry>) {
        if meta.max_timestamp_ms > self.max_timestamp_ms {
            self.max_timestamp_ms = meta.max_timestamp_ms;
            self.offset_of_max_timestamp = meta.last_offset;
        }
        let mut out = (None, None);
        if self.bytes_since_last_entry > interval_bytes {
            out.0 = Some(OffsetEntry {
                relative_offset: in_segment(meta.last_offset, base_offset),
                position: meta.position,
            });
            out.1 = self.time_entry_if_newer(base_offset, last_time_entry);
            self.bytes_since_last_entry = 0;
        }
        self.bytes_since_last_entry += u64::from(meta.size_bytes);
        out
    }

    /// Kafka's `TimeIndex.maybeAppend`: only when the max timestamp grew.
    pub fn time_entry_if_newer(
        &self,
        base_offset: i64,
        last_time_entry: Option<TimeEntry>,
    ) -> Option<TimeEntry> {
        let last_ts = last_time_entry.map_or(NO_TIMESTAMP, |e| e.timestamp_ms);
        (self.max_timestamp_ms > last_ts).then(|| TimeEntry {
            timestamp_ms: self.max_timestamp_ms,
            relative_offset: in_segment(self.offset_of_max_timestamp, base_offset),
        })
    }
}

/// `offset - base` as a Kafka relative offset, if it fits int32.
pub(crate) fn relative(offset: i64, base_offset: i64) -> Option<u32> {
    let rel = offset.checked_sub(base_offset)?;
    (0..=i64::from(i32::MAX)).contains(&rel).then_some(rel as u32)
}

/// [`relative`] for offsets known to be in the segment: appends check the
/// range before indexing and loading stops at the first batch outside it,
/// so failure is a broken in-memory invariant.
fn in_segment(offset: i64, base_offset: i64) -> u32 {
    relative(offset, base_offset)
        .unwrap_or_else(|| panic!("offset {offset} outside the segment at {base_offset}"))
}

fn array_at<const N: usize>(buf: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&buf[at..at + N]);
    out
}

fn i32_at(buf: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(array_at(buf, at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_encode_as_kafka() {
        let e = OffsetEntry {
            relative_offset: 0x01020304,
            position: 0x0a0b0c0d,
        };
        assert_eq!(e.encode(), [1, 2, 3, 4, 0xa, 0xb, 0xc, 0xd]);
        let t = TimeEntry {
            timestamp_ms: 0x0102030405060708,
            relative_offset: 9,
        };
        assert_eq!(t.encode(), [1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 9]);
    }

    #[test]
    fn decode_rejects_bad_images() {
        let a = OffsetEntry {
            relative_offset: 5,
            position: 100,
        };
        let b = OffsetEntry {
            relative_offset: 9,
            position: 200,
        };
        let mut img = [a.encode(), b.encode()].concat();
        assert_eq!(decode_offset_index(&img, 300), Ok(vec![a, b]));
        assert!(decode_offset_index(&img, 200).is_err());
        assert!(decode_offset_index(&img[..7], 300).is_err());
        img.extend_from_slice(&a.encode());
        assert!(decode_offset_index(&img, 300).is_err());
        assert!(decode_time_index(&[0u8; 13]).is_err());
    }

    #[test]
    fn lookups_floor() {
        let entries = [
            OffsetEntry {
                relative_offset: 10,
                position: 100,
            },
            OffsetEntry {
                relative_offset: 20,
                position: 200,
            },
        ];
        assert_eq!(lookup_position(&entries, 5), 0);
        assert_eq!(lookup_position(&entries, 10), 100);
        assert_eq!(lookup_position(&entries, 19), 100);
        assert_eq!(lookup_position(&entries, 25), 200);
    }
}
