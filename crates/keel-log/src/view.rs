//! [`LogReader`]: the read side of a partition log, shared by every
//! thread that reads it.
//!
//! The partition's segments, tier manifest and log start offset live in
//! one in-memory view behind a lock that is only ever held for in-memory
//! work: the writer ([`crate::PartitionLog`]) does its file I/O first and
//! then publishes the result under the lock. Async request handlers plan
//! reads and answer ListOffsets from the view, so a write or fsync that
//! stalls on a slow disk never blocks them.

use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::config::ReadIo;
use crate::error::ReadError;
use crate::index::{lookup_position, lookup_time, window_end};
use crate::read::{HeaderScan, ReadPlan, ScanHint, TimestampPlan};
use crate::segment::{SegMeta, SegmentFile};
use crate::tiered::{TierState, TieredSegment};

/// The view's contents.
#[derive(Debug)]
pub(crate) struct ViewState {
    /// The local (fast tier) segments, sorted by base offset; never empty;
    /// the last one is the active one.
    pub segments: Vec<SegMeta>,
    /// Colder copies, sorted by base offset (the tier manifest). The `Cold`
    /// ones are contiguous and end where `segments` begins.
    pub tiered: Vec<TieredSegment>,
    /// First readable offset; >= the first readable segment's base offset.
    /// Only moves forward, except through truncation.
    pub log_start_offset: i64,
    pub read_io: ReadIo,
}

impl ViewState {
    pub fn active(&self) -> &SegMeta {
        self.segments.last().expect("a log has at least one segment")
    }

    pub fn active_mut(&mut self) -> &mut SegMeta {
        self.segments.last_mut().expect("a log has at least one segment")
    }

    pub fn log_end_offset(&self) -> i64 {
        self.active().next_offset
    }

    pub fn cold(&self) -> impl Iterator<Item = &TieredSegment> {
        self.tiered.iter().filter(|t| t.is_cold())
    }

    pub fn first_cold_base(&self) -> Option<i64> {
        self.cold().next().map(|t| t.base_offset)
    }

    /// Moves the log start up to the first readable offset.
    pub fn advance_start_to_first_readable(&mut self) {
        let first_base = self.first_cold_base().unwrap_or(self.segments[0].base_offset);
        self.log_start_offset = self.log_start_offset.max(first_base);
    }
}

/// The read side of a partition log: cheap to clone, `Send + Sync`.
#[derive(Debug, Clone)]
pub struct LogReader {
    dir: Arc<PathBuf>,
    pub(crate) state: Arc<RwLock<ViewState>>,
}

/// Where the segment holding an offset is.
enum Holder<'a> {
    Segment(&'a SegMeta),
    Damaged(&'a SegMeta),
    None,
}

impl LogReader {
    pub(crate) fn new(dir: &Path, state: ViewState) -> LogReader {
        LogReader {
            dir: Arc::new(dir.to_path_buf()),
            state: Arc::new(RwLock::new(state)),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn log_start_offset(&self) -> i64 {
        self.state.read().log_start_offset
    }

    pub fn log_end_offset(&self) -> i64 {
        self.state.read().log_end_offset()
    }

    /// Bytes of the local segments.
    pub fn size_bytes(&self) -> u64 {
        self.state.read().segments.iter().map(|s| s.size_bytes).sum()
    }

    pub fn segment_count(&self) -> usize {
        self.state.read().segments.len()
    }

    /// Base offsets of the local segments, oldest first.
    pub fn segment_base_offsets(&self) -> Vec<i64> {
        self.state.read().segments.iter().map(|s| s.base_offset).collect()
    }

    /// `(base offset, next offset)` of every local segment, oldest first.
    pub fn segment_ranges(&self) -> Vec<(i64, i64)> {
        self.state
            .read()
            .segments
            .iter()
            .map(|s| (s.base_offset, s.next_offset))
            .collect()
    }

    /// Local segments whose data is damaged below the recovery point:
    /// `(base offset, valid bytes, reason)`.
    pub fn damaged_segments(&self) -> Vec<(i64, u64, String)> {
        self.state
            .read()
            .segments
            .iter()
            .filter_map(|s| {
                s.damage
                    .as_ref()
                    .map(|d| (s.base_offset, d.valid_bytes, d.reason.clone()))
            })
            .collect()
    }

    /// The segment files whose base offset is at least `from_base_offset`,
    /// with their base offsets, for work done outside any lock (dropping
    /// written data from the page cache, residency statistics).
    pub fn segment_files_from(&self, from_base_offset: i64) -> Vec<(i64, Arc<SegmentFile>)> {
        self.state
            .read()
            .segments
            .iter()
            .filter(|s| s.base_offset >= from_base_offset)
            .map(|s| (s.base_offset, Arc::clone(&s.file)))
            .collect()
    }

    /// Base offset of the oldest local segment not yet sealed and fsynced
    /// (at the latest the active segment's).
    pub fn oldest_not_durable(&self) -> i64 {
        let st = self.state.read();
        st.segments
            .iter()
            .find(|s| !s.durable)
            .map_or_else(|| st.active().base_offset, |s| s.base_offset)
    }

    /// Every colder copy the manifest records, oldest first.
    pub fn tiered_segments(&self) -> Vec<TieredSegment> {
        self.state.read().tiered.clone()
    }

    /// Bytes of the segments read from a colder tier.
    pub fn cold_bytes(&self) -> u64 {
        self.state.read().cold().map(|t| t.size_bytes).sum()
    }

    /// The whole log: local segments and those only in a colder tier.
    pub fn total_bytes(&self) -> u64 {
        let st = self.state.read();
        st.segments.iter().map(|s| s.size_bytes).sum::<u64>() + st.cold().map(|t| t.size_bytes).sum::<u64>()
    }

    /// Bytes of local segments that also have a verified colder copy (what
    /// releasing local copies could free).
    pub fn local_copied_bytes(&self) -> u64 {
        let st = self.state.read();
        st.segments
            .iter()
            .filter(|s| {
                st.tiered
                    .iter()
                    .any(|t| t.base_offset == s.base_offset && t.state == TierState::Both)
            })
            .map(|s| s.size_bytes)
            .sum()
    }

    /// The aborted transactions a read of `[from_offset, upper_offset)`
    /// must be told about (Kafka's `collectAbortedTxns`): those whose
    /// first batch is below `upper_offset` and whose marker is at or after
    /// `from_offset`, oldest first: of local segments, and of cold ones
    /// from the tier manifest.
    pub fn aborted_txns(&self, from_offset: i64, upper_offset: i64) -> Vec<crate::AbortedTxn> {
        let st = self.state.read();
        let cold = st
            .cold()
            .filter(|t| t.next_offset > from_offset)
            .flat_map(|t| t.aborted.iter().copied());
        let local = st
            .segments
            .iter()
            .filter(|s| s.next_offset > from_offset)
            .flat_map(|s| s.aborted.iter().copied());
        let entries = cold.chain(local);
        crate::txnindex::overlapping(entries, from_offset, upper_offset)
    }

    /// Plans a fetch at `offset` without doing I/O. `offset == log end`
    /// gives an empty plan; outside `[log start, log end]` is an error.
    pub fn read_plan(&self, offset: i64, max_bytes: usize) -> Result<ReadPlan, ReadError> {
        self.read_plan_after(offset, max_bytes, None)
    }

    /// [`LogReader::read_plan`] for the next step of a sequential scan:
    /// with the hint the previous step's [`ReadPlan::execute_scan`] gave
    /// (ignored unless it is for this offset), the plan starts exactly at
    /// the batch holding `offset`.
    pub fn read_plan_after(
        &self,
        offset: i64,
        max_bytes: usize,
        hint: Option<ScanHint>,
    ) -> Result<ReadPlan, ReadError> {
        let st = self.state.read();
        let log_end = st.log_end_offset();
        if offset < st.log_start_offset || offset > log_end {
            return Err(ReadError::OffsetOutOfRange {
                log_start: st.log_start_offset,
                log_end,
            });
        }
        if offset < st.segments[0].base_offset {
            let cold = st
                .cold()
                .find(|t| t.base_offset <= offset && offset < t.next_offset);
            return Ok(match cold {
                Some(t) => ReadPlan::tiered(t.clone(), offset, max_bytes),
                None => ReadPlan::empty(offset, max_bytes),
            });
        }
        let segment = match segment_holding(&st.segments, offset) {
            Holder::Segment(s) => s,
            Holder::None => return Ok(ReadPlan::empty(offset, max_bytes)),
            Holder::Damaged(s) => {
                let damage = s.damage.as_ref().expect("damaged segments carry their damage");
                return Err(ReadError::Damaged {
                    segment_base_offset: s.base_offset,
                    position: damage.valid_bytes,
                    reason: damage.reason.clone(),
                });
            }
        };
        let indexed = u64::from(lookup_position(
            &segment.offset_index,
            offset - segment.base_offset,
        ));
        let end = segment
            .damage
            .as_ref()
            .map_or(segment.size_bytes, |d| d.valid_bytes);
        let start = match hint {
            Some(h)
                if std::ptr::eq(h.file.as_ptr(), Arc::as_ptr(&segment.file))
                    && h.next_offset == offset
                    && h.position >= indexed
                    && h.position < end =>
            {
                h.position
            }
            _ => indexed,
        };
        let active = std::ptr::eq(segment, st.active());
        let io = match st.read_io {
            // A direct read of the file being appended to holds its inode
            // lock (ext4, XFS) until the read completes, and appends wait for
            // it; read that one through the page cache (and drop the pages).
            ReadIo::Direct if active => ReadIo::BufferedDontNeed,
            io => io,
        };
        Ok(ReadPlan {
            tiered: None,
            file: Some(Arc::clone(&segment.file)),
            start_position: start,
            end_position: end,
            target_offset: offset,
            max_bytes,
            io,
            window_end: window_end(&segment.offset_index, start, max_bytes),
        })
    }

    /// Plans a ListOffsets-by-timestamp lookup without I/O (Kafka's
    /// `fetchOffsetByTimestamp`): `None` if no batch is that recent.
    pub fn timestamp_plan(&self, timestamp_ms: i64) -> Option<TimestampPlan> {
        let st = self.state.read();
        if let Some(t) = st.cold().find(|t| t.max_timestamp_ms >= timestamp_ms) {
            return Some(TimestampPlan {
                file: None,
                tiered: Some(t.clone()),
                start_position: 0,
                end_position: t.size_bytes,
                timestamp_ms,
                log_start_offset: st.log_start_offset,
            });
        }
        let segment = st
            .segments
            .iter()
            .find(|s| s.indexer.max_timestamp_ms >= timestamp_ms && !s.is_empty())?;
        let relative = lookup_time(&segment.time_index, timestamp_ms);
        let start = lookup_position(&segment.offset_index, i64::from(relative));
        Some(TimestampPlan {
            file: Some(Arc::clone(&segment.file)),
            tiered: None,
            start_position: u64::from(start),
            end_position: segment
                .damage
                .as_ref()
                .map_or(segment.size_bytes, |d| d.valid_bytes),
            timestamp_ms,
            log_start_offset: st.log_start_offset,
        })
    }

    /// [`LogReader::timestamp_plan`] and its execution in one call. Does
    /// I/O: call it where blocking is fine, or use the plan.
    pub fn offset_for_timestamp(&self, timestamp_ms: i64) -> io::Result<Option<(i64, i64)>> {
        match self.timestamp_plan(timestamp_ms) {
            Some(plan) => plan.execute(),
            None => Ok(None),
        }
    }

    /// `(max timestamp, offset)`: the largest batch max timestamp in the log
    /// and the last offset of the first batch that has it. No I/O.
    pub fn max_timestamp(&self) -> Option<(i64, i64)> {
        let st = self.state.read();
        let cold = st.cold().map(|t| (t.max_timestamp_ms, t.offset_of_max_timestamp));
        let local = st
            .segments
            .iter()
            .map(|s| (s.indexer.max_timestamp_ms, s.indexer.offset_of_max_timestamp));
        let mut best: Option<(i64, i64)> = None;
        for (ts, offset) in cold.chain(local) {
            if ts >= 0 && best.is_none_or(|(b, _)| ts > b) {
                best = Some((ts, offset));
            }
        }
        best
    }

    /// Batch headers from the batch holding `from_offset` to the current log
    /// end, read lazily by the returned iterator (which does I/O). Damaged
    /// data is skipped: the scan ends each segment where its damage starts.
    pub fn batch_headers(&self, from_offset: i64) -> HeaderScan {
        let st = self.state.read();
        let first = st
            .segments
            .partition_point(|s| s.base_offset <= from_offset)
            .saturating_sub(1);
        let segments: VecDeque<_> = st.segments[first..]
            .iter()
            .map(|s| {
                let start = lookup_position(&s.offset_index, from_offset - s.base_offset);
                let end = s.damage.as_ref().map_or(s.size_bytes, |d| d.valid_bytes);
                (Arc::clone(&s.file), u64::from(start), end)
            })
            .collect();
        HeaderScan {
            segments,
            from_offset,
            open: None,
            last: None,
        }
    }
}

/// The segment whose offsets include `offset`: the last one starting at or
/// before it, if `offset` is below its end; a damaged one if `offset` lies
/// in what its damage hides; otherwise the next one after it (offsets a
/// log skips, as compaction leaves them, are read from the next batch).
fn segment_holding(segments: &[SegMeta], offset: i64) -> Holder<'_> {
    let after = segments.partition_point(|s| s.base_offset <= offset);
    let Some(from) = after.checked_sub(1) else {
        return Holder::None;
    };
    let s = &segments[from];
    if offset < s.next_offset {
        return Holder::Segment(s);
    }
    if s.damage.is_some() {
        return Holder::Damaged(s);
    }
    match segments[from + 1..].iter().find(|s| offset < s.next_offset) {
        Some(s) => Holder::Segment(s),
        None => Holder::None,
    }
}
