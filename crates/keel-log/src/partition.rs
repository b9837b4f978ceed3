//! [`PartitionLog`]: the segments of one topic-partition directory.

use std::collections::VecDeque;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::batch::{set_base_offset, BatchHeader, NO_TIMESTAMP};
use crate::config::{LogConfig, ReadIo};
use crate::error::{AppendError, DeleteRecordsError, OpenError, ReadError};
use crate::index::{lookup_position, lookup_time, window_end, OFFSET_ENTRY_LEN, TIME_ENTRY_LEN};
use crate::read::{HeaderScan, ReadPlan, ScanHint, TimestampPlan};
use crate::segment::{write_atomically, LoadMode, Segment, LOG_SUFFIX};
use crate::tiered::{read_manifest, write_manifest, Tier, TierState, TieredSegment};

/// Written by [`PartitionLog::close`], removed by [`PartitionLog::open`]:
/// its presence means the last segment needs no CRC recovery scan.
pub const CLEAN_SHUTDOWN_FILE: &str = ".keel_clean_shutdown";
/// The log start offset set by DeleteRecords: "0\n<offset>\n" (version, value).
pub const LOG_START_OFFSET_FILE: &str = "log-start-offset";
const LOG_START_OFFSET_VERSION: &str = "0";

/// Leftovers of interrupted renames, deletions and rewrites.
const STRAY_SUFFIXES: [&str; 4] = [".tmp", ".deleted", ".cleaned", ".swap"];

/// What an append did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendInfo {
    /// Offset given to the first record of the first batch. Batch `i` starts
    /// at this plus the sum of `last_offset_delta + 1` of the batches before.
    pub base_offset: i64,
    /// Offset of the last record appended.
    pub last_offset: i64,
    /// Largest batch max timestamp among the appended batches (-1 if none).
    pub max_timestamp_ms: i64,
    /// Segment the batches went to, and their byte position in its `.log`.
    pub segment_base_offset: i64,
    pub position: u64,
    /// Sum of the batches' records counts.
    pub records_count: u64,
    /// True if this append was fsynced because of `flush_messages`.
    pub flushed: bool,
}

/// What [`PartitionLog::apply_retention`] deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionOutcome {
    pub deleted_segments: usize,
    pub deleted_bytes: u64,
    pub log_start_offset: i64,
}

/// The log of one partition. Not internally synchronized: the caller holds it
/// behind a mutex and does read I/O outside it via [`ReadPlan`].
#[derive(Debug)]
pub struct PartitionLog {
    dir: PathBuf,
    config: LogConfig,
    /// The local (fast tier) segments, sorted by base offset; never empty;
    /// the last one is the active one.
    segments: Vec<Segment>,
    /// Colder copies, sorted by base offset (the tier manifest). The `Cold`
    /// ones are contiguous and end where `segments` begins.
    tiered: Vec<TieredSegment>,
    /// First readable offset; >= the first readable segment's base offset.
    log_start_offset: i64,
    /// Every offset below this has been fsynced (or was found on disk at open).
    flushed_offset: i64,
    unflushed_messages: u64,
    /// Caller clock at the first append since the last flush.
    first_unflushed_append_ms: Option<i64>,
    /// Sealed segments rolled since the last flush, still to fsync.
    unflushed_sealed: Vec<i64>,
    /// New segment files were created since the directory was last fsynced.
    dir_dirty: bool,
    /// The clean-shutdown marker is on disk.
    closed: bool,
}

impl PartitionLog {
    /// Opens (creating if needed) the partition directory `dir`, repairing
    /// what a crash may have left: stray temp files, missing or corrupt
    /// indexes, and, unless the clean-shutdown marker is present, a torn tail
    /// in the last segment.
    pub fn open(dir: &Path, config: LogConfig) -> Result<PartitionLog, OpenError> {
        config.check().map_err(OpenError::InvalidConfig)?;
        let io_err = |source| OpenError::Io {
            path: dir.to_path_buf(),
            source,
        };
        fs::create_dir_all(dir).map_err(io_err)?;
        let clean = take_clean_marker(dir).map_err(io_err)?;
        let mut tiered = read_manifest(dir).map_err(io_err)?;
        let manifest_changed = recover_tier_moves(dir, &mut tiered).map_err(io_err)?;
        let mut bases = list_segments(dir).map_err(io_err)?;
        let cold_end = tiered.iter().filter(|t| t.is_cold()).map(|t| t.next_offset).max();
        if let Some(cold_end) = cold_end {
            // A segment whose colder copy became the only one: a crash
            // came between the manifest saying so and its deletion.
            for base in bases.iter().filter(|b| **b < cold_end) {
                tracing::info!(dir = %dir.display(), base, "finishing deletion of a local copy moved to a colder tier");
                Segment::delete_files_of(dir, *base).map_err(io_err)?;
            }
            bases.retain(|b| *b >= cold_end);
        }
        if manifest_changed {
            write_manifest(dir, &tiered).map_err(io_err)?;
        }
        let stored_start = read_log_start_offset(dir).map_err(io_err)?;
        let fresh_start = stored_start.or(cold_end);
        let segments = load_segments(dir, &bases, clean, &config, fresh_start).map_err(io_err)?;
        let last = segments.last().expect("at least one segment");
        let log_end_offset = last.next_offset;
        let first_base = first_cold_base(&tiered).unwrap_or(segments[0].base_offset);
        let log_start_offset = stored_start
            .unwrap_or(first_base)
            .clamp(first_base, log_end_offset);
        if stored_start.is_some_and(|stored| stored > log_end_offset) {
            // Recovery cut below the stored start; persist the lower value so
            // it does not jump back up once appends pass it again.
            write_log_start_offset(dir, log_start_offset).map_err(io_err)?;
        }
        if !clean {
            // What recovery kept is what we call flushed from now on.
            last.sync().map_err(io_err)?;
        }
        Ok(PartitionLog {
            dir: dir.to_path_buf(),
            config,
            segments,
            tiered,
            log_start_offset,
            flushed_offset: log_end_offset,
            unflushed_messages: 0,
            first_unflushed_append_ms: None,
            unflushed_sealed: Vec::new(),
            dir_dirty: false,
            closed: false,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config(&self) -> &LogConfig {
        &self.config
    }

    pub fn log_start_offset(&self) -> i64 {
        self.log_start_offset
    }

    pub fn log_end_offset(&self) -> i64 {
        self.active().next_offset
    }

    pub fn flushed_offset(&self) -> i64 {
        self.flushed_offset
    }

    pub fn unflushed_messages(&self) -> u64 {
        self.unflushed_messages
    }

    pub fn size_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.size_bytes).sum()
    }

    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// Base offsets of the segments, oldest first.
    pub fn segment_base_offsets(&self) -> Vec<i64> {
        self.segments.iter().map(|s| s.base_offset).collect()
    }

    fn active(&self) -> &Segment {
        self.segments.last().expect("at least one segment")
    }

    /// The segment files whose base offset is at least `from_base_offset`,
    /// with their base offsets, for work done outside the partition lock
    /// (dropping written data from the page cache).
    pub fn segment_files_from(&self, from_base_offset: i64) -> Vec<(i64, Arc<File>)> {
        self.segments
            .iter()
            .filter(|s| s.base_offset >= from_base_offset)
            .map(|s| (s.base_offset, Arc::clone(&s.reader)))
            .collect()
    }

    fn active_mut(&mut self) -> &mut Segment {
        self.segments.last_mut().expect("at least one segment")
    }

    /// Appends validated batches (see [`crate::batch::validate_batches`]),
    /// rewriting their base offsets so they get contiguous offsets from the
    /// log end offset. One `write` for the whole buffer: the caller may
    /// concatenate several producers' batches (group commit). The partition
    /// leader epoch field is left as given: setting it is the caller's job.
    pub fn append(
        &mut self,
        records: &mut [u8],
        headers: &[BatchHeader],
        now_ms: i64,
    ) -> Result<AppendInfo, AppendError> {
        let offsets_needed = check_append(records, headers)?;
        let base_offset = self.log_end_offset();
        let last_offset = base_offset
            .checked_add(offsets_needed - 1)
            .ok_or(AppendError::OffsetOverflow)?;
        let max_timestamp_ms = headers
            .iter()
            .map(|h| h.max_timestamp)
            .max()
            .unwrap_or(NO_TIMESTAMP);
        self.maybe_roll(
            records.len() as u64,
            headers.len(),
            last_offset,
            max_timestamp_ms,
            now_ms,
        )?;
        if self.closed {
            remove_if_exists(&self.dir.join(CLEAN_SHUTDOWN_FILE))?;
            self.closed = false;
        }
        let assigned = assign_offsets(records, headers, base_offset);
        let interval = self.config.index_interval_bytes;
        let segment = self.active_mut();
        let done = segment.append(records, &assigned, interval)?;
        let segment_base_offset = segment.base_offset;
        assert_eq!(
            self.log_end_offset(),
            last_offset + 1,
            "log end offset advanced by the batches"
        );
        let records_count: u64 = headers.iter().map(|h| h.records_count as u64).sum();
        let flushed = self.note_unflushed(records_count, now_ms)?;
        Ok(AppendInfo {
            base_offset,
            last_offset,
            max_timestamp_ms,
            segment_base_offset,
            position: done.position,
            records_count,
            flushed,
        })
    }

    /// Counts records for the flush policy; fsyncs on `flush_messages`.
    fn note_unflushed(&mut self, records_count: u64, now_ms: i64) -> io::Result<bool> {
        self.unflushed_messages = self.unflushed_messages.saturating_add(records_count);
        self.first_unflushed_append_ms.get_or_insert(now_ms);
        if self.unflushed_messages >= self.config.flush_messages {
            self.flush()?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Rolls to a new segment if the active one is non-empty and the append
    /// would overflow it (bytes, index entries, int32 relative offsets) or it
    /// is older than `segment_ms` (Kafka's `LogSegment.shouldRoll`).
    fn maybe_roll(
        &mut self,
        len_bytes: u64,
        batches: usize,
        last_offset: i64,
        max_timestamp_ms: i64,
        now_ms: i64,
    ) -> io::Result<()> {
        let config = &self.config;
        let active = self.active();
        if active.is_empty() {
            return Ok(());
        }
        let new_size = active.size_bytes + len_bytes;
        let too_big = new_size > config.segment_bytes || new_size > i32::MAX as u64;
        let waited_ms = match active.first_batch_max_timestamp_ms {
            Some(first_ms) if first_ms >= 0 => max_timestamp_ms.saturating_sub(first_ms),
            _ => active.created_ms.map_or(0, |c| now_ms.saturating_sub(c)),
        };
        let too_old = waited_ms > config.segment_ms;
        // An append adds at most one entry per batch to each index, and
        // sealing one more time entry; neither file may pass the limit.
        let offset_entries = (active.offset_index.len() + batches) as u64;
        let time_entries = (active.time_index.len() + batches + 1) as u64;
        let index_full = offset_entries * OFFSET_ENTRY_LEN as u64 > config.segment_index_bytes
            || time_entries * TIME_ENTRY_LEN as u64 > config.segment_index_bytes;
        let offset_overflow = last_offset - active.base_offset > i64::from(i32::MAX);
        if too_big || too_old || index_full || offset_overflow {
            self.roll(now_ms)?;
        }
        Ok(())
    }

    /// Seals the active segment and starts a new one at the log end offset.
    fn roll(&mut self, now_ms: i64) -> io::Result<()> {
        let log_end_offset = self.log_end_offset();
        let active = self.active_mut();
        active.seal()?;
        let sealed_base = active.base_offset;
        if self.flushed_offset < log_end_offset {
            self.unflushed_sealed.push(sealed_base);
        }
        let segment = match Segment::create(&self.dir, log_end_offset, Some(now_ms)) {
            Ok(segment) => segment,
            Err(e) => {
                // Keep appending to the old segment rather than have no
                // active one.
                self.active_mut().activate()?;
                return Err(e);
            }
        };
        self.segments.push(segment);
        self.dir_dirty = true;
        Ok(())
    }

    /// fsyncs everything appended so far: sealed segments rolled since the
    /// last flush, the active segment and its indexes, and the directory if
    /// segment files were created.
    pub fn flush(&mut self) -> io::Result<()> {
        for base in std::mem::take(&mut self.unflushed_sealed) {
            if let Some(segment) = self.segments.iter().find(|s| s.base_offset == base) {
                segment.sync()?;
            }
        }
        self.active().sync()?;
        if self.dir_dirty {
            File::open(&self.dir)?.sync_all()?;
            self.dir_dirty = false;
        }
        let log_end_offset = self.log_end_offset();
        assert!(
            log_end_offset >= self.flushed_offset,
            "flushed offset only moves forward"
        );
        self.flushed_offset = log_end_offset;
        self.unflushed_messages = 0;
        self.first_unflushed_append_ms = None;
        Ok(())
    }

    /// True when unflushed data is at least `flush_ms` old by the caller's
    /// clock; the caller then calls [`PartitionLog::flush`].
    pub fn needs_time_flush(&self, now_ms: i64) -> bool {
        self.first_unflushed_append_ms
            .is_some_and(|first| now_ms.saturating_sub(first) >= self.config.flush_ms)
    }

    /// Plans a fetch at `offset` without doing I/O. `offset == log end`
    /// gives an empty plan; outside `[log start, log end]` is an error.
    pub fn read_plan(&self, offset: i64, max_bytes: usize) -> Result<ReadPlan, ReadError> {
        self.read_plan_after(offset, max_bytes, None)
    }

    /// [`PartitionLog::read_plan`] for the next step of a sequential scan:
    /// with the hint the previous step's [`ReadPlan::execute_scan`] gave
    /// (ignored unless it is for this offset), the plan starts exactly at
    /// the batch holding `offset`.
    pub fn read_plan_after(
        &self,
        offset: i64,
        max_bytes: usize,
        hint: Option<ScanHint>,
    ) -> Result<ReadPlan, ReadError> {
        let log_end = self.log_end_offset();
        if offset < self.log_start_offset || offset > log_end {
            return Err(ReadError::OffsetOutOfRange {
                log_start: self.log_start_offset,
                log_end,
            });
        }
        if offset < self.segments[0].base_offset {
            let cold = self
                .cold()
                .find(|t| t.base_offset <= offset && offset < t.next_offset);
            return Ok(match cold {
                Some(t) => ReadPlan::tiered(t.clone(), offset, max_bytes),
                None => ReadPlan::empty(offset, max_bytes),
            });
        }
        let Some(segment) = self.segment_holding(offset) else {
            return Ok(ReadPlan::empty(offset, max_bytes));
        };
        let indexed = u64::from(lookup_position(
            &segment.offset_index,
            offset - segment.base_offset,
        ));
        let start = match hint {
            Some(h)
                if h.segment_base == segment.base_offset
                    && h.next_offset == offset
                    && h.position >= indexed
                    && h.position < segment.size_bytes =>
            {
                h.position
            }
            _ => indexed,
        };
        let active = std::ptr::eq(segment, self.active());
        let io = match self.config.read_io {
            // A direct read of the file being appended to holds its inode
            // lock (ext4, XFS) until the read completes, and appends wait for
            // it; read that one through the page cache (and drop the pages).
            ReadIo::Direct if active => ReadIo::BufferedDontNeed,
            io => io,
        };
        Ok(ReadPlan {
            tiered: None,
            file: Some(segment.reader.clone()),
            start_position: start,
            end_position: segment.size_bytes,
            target_offset: offset,
            max_bytes,
            io,
            window_end: window_end(&segment.offset_index, start, max_bytes),
            segment_base: segment.base_offset,
        })
    }

    /// The segment whose offsets include `offset`, if any.
    fn segment_holding(&self, offset: i64) -> Option<&Segment> {
        let after = self.segments.partition_point(|s| s.base_offset <= offset);
        let from = after.checked_sub(1)?;
        self.segments[from..].iter().find(|s| offset < s.next_offset)
    }

    /// Plans a ListOffsets-by-timestamp lookup without I/O (Kafka's
    /// `fetchOffsetByTimestamp`): `None` if no batch is that recent.
    pub fn timestamp_plan(&self, timestamp_ms: i64) -> Option<TimestampPlan> {
        if let Some(t) = self.cold().find(|t| t.max_timestamp_ms >= timestamp_ms) {
            return Some(TimestampPlan {
                file: None,
                tiered: Some(t.clone()),
                start_position: 0,
                end_position: t.size_bytes,
                timestamp_ms,
                log_start_offset: self.log_start_offset,
            });
        }
        let segment = self
            .segments
            .iter()
            .find(|s| s.indexer.max_timestamp_ms >= timestamp_ms && !s.is_empty())?;
        let relative = lookup_time(&segment.time_index, timestamp_ms);
        let start = lookup_position(&segment.offset_index, i64::from(relative));
        Some(TimestampPlan {
            file: Some(segment.reader.clone()),
            tiered: None,
            start_position: u64::from(start),
            end_position: segment.size_bytes,
            timestamp_ms,
            log_start_offset: self.log_start_offset,
        })
    }

    /// [`PartitionLog::timestamp_plan`] and its execution in one call. Does
    /// I/O: call it outside the partition lock or use the plan.
    pub fn offset_for_timestamp(&self, timestamp_ms: i64) -> io::Result<Option<(i64, i64)>> {
        match self.timestamp_plan(timestamp_ms) {
            Some(plan) => plan.execute(),
            None => Ok(None),
        }
    }

    /// `(max timestamp, offset)`: the largest batch max timestamp in the log
    /// and the last offset of the first batch that has it. No I/O.
    pub fn max_timestamp(&self) -> Option<(i64, i64)> {
        let cold = self
            .cold()
            .map(|t| (t.max_timestamp_ms, t.offset_of_max_timestamp));
        let local = self
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
    /// end, read lazily by the returned iterator (which does I/O).
    pub fn batch_headers(&self, from_offset: i64) -> HeaderScan {
        let first = self
            .segments
            .partition_point(|s| s.base_offset <= from_offset)
            .saturating_sub(1);
        let segments: VecDeque<_> = self.segments[first..]
            .iter()
            .map(|s| {
                let start = lookup_position(&s.offset_index, from_offset - s.base_offset);
                (s.reader.clone(), u64::from(start), s.size_bytes)
            })
            .collect();
        HeaderScan {
            segments,
            from_offset,
        }
    }

    /// Deletes sealed segments (never the active one), oldest first: those
    /// whose max timestamp is more than `retention_ms` before `now_ms`, then
    /// while the log would still be at least `retention_bytes` without the
    /// oldest segment (Kafka's rules). Segments without timestamps are never
    /// deleted by time.
    /// The whole log counts, oldest first: the segments whose only copy is
    /// in a colder tier, then the local ones.
    pub fn apply_retention(&mut self, now_ms: i64) -> io::Result<RetentionOutcome> {
        // (size, max timestamp) of every deletable segment, oldest first.
        let candidates: Vec<(u64, i64)> = self
            .cold()
            .map(|t| (t.size_bytes, t.max_timestamp_ms))
            .chain(
                self.segments[..self.segments.len() - 1]
                    .iter()
                    .map(|s| (s.size_bytes, s.indexer.max_timestamp_ms)),
            )
            .collect();
        let mut count = 0;
        if self.config.retention_ms >= 0 {
            count = candidates
                .iter()
                .take_while(|(_, ts)| *ts >= 0 && now_ms.saturating_sub(*ts) > self.config.retention_ms)
                .count();
        }
        if self.config.retention_bytes >= 0 {
            let mut excess = self.total_bytes() as i64 - self.config.retention_bytes;
            excess -= candidates[..count]
                .iter()
                .map(|(size, _)| *size as i64)
                .sum::<i64>();
            for (size, _) in &candidates[count..] {
                if excess - (*size as i64) < 0 {
                    break;
                }
                excess -= *size as i64;
                count += 1;
            }
        }
        let cold_count = count.min(self.cold().count());
        let mut deleted_bytes = self.retire_cold(cold_count)?;
        deleted_bytes += self.delete_oldest(count - cold_count)?;
        Ok(RetentionOutcome {
            deleted_segments: count,
            deleted_bytes,
            log_start_offset: self.log_start_offset,
        })
    }

    /// Marks the `count` oldest cold segments for deletion from their tier
    /// and advances the log start past them.
    fn retire_cold(&mut self, count: usize) -> io::Result<u64> {
        if count == 0 {
            return Ok(0);
        }
        let mut bytes = 0;
        for t in self.tiered.iter_mut().filter(|t| t.is_cold()).take(count) {
            t.state = TierState::Deleting;
            bytes += t.size_bytes;
        }
        write_manifest(&self.dir, &self.tiered)?;
        self.advance_start_to_first_readable();
        Ok(bytes)
    }

    fn advance_start_to_first_readable(&mut self) {
        let first_base = first_cold_base(&self.tiered).unwrap_or(self.segments[0].base_offset);
        self.log_start_offset = self.log_start_offset.max(first_base);
    }

    /// Deletes the `count` oldest segments and advances the log start.
    fn delete_oldest(&mut self, count: usize) -> io::Result<u64> {
        assert!(count < self.segments.len(), "never delete the active segment");
        if count == 0 {
            return Ok(0);
        }
        let end = self.segments[count].base_offset;
        // Colder copies of these segments (being made or made) go too; the
        // manifest says so before the local files go.
        let mut manifest_changed = false;
        for t in self.tiered.iter_mut().filter(|t| t.next_offset <= end) {
            if matches!(t.state, TierState::Copying | TierState::Both) {
                t.state = TierState::Deleting;
                manifest_changed = true;
            }
        }
        if manifest_changed {
            write_manifest(&self.dir, &self.tiered)?;
        }
        let mut deleted_bytes = 0;
        for segment in self.segments.drain(..count) {
            deleted_bytes += segment.size_bytes;
            segment.delete_files()?;
            self.unflushed_sealed.retain(|b| *b != segment.base_offset);
        }
        self.advance_start_to_first_readable();
        Ok(deleted_bytes)
    }

    /// DeleteRecords: makes `offset` the log start offset (persisted) and
    /// deletes the sealed segments wholly below it. No-op if not an advance.
    pub fn delete_records_before(&mut self, offset: i64) -> Result<(), DeleteRecordsError> {
        let log_end = self.log_end_offset();
        if offset > log_end {
            return Err(DeleteRecordsError::OffsetOutOfRange { offset, log_end });
        }
        if offset <= self.log_start_offset {
            return Ok(());
        }
        write_log_start_offset(&self.dir, offset)?;
        self.log_start_offset = offset;
        let cold_below = self.cold().take_while(|t| t.next_offset <= offset).count();
        self.retire_cold(cold_below)?;
        let below = self
            .segments
            .windows(2)
            .take_while(|pair| pair[1].base_offset <= offset)
            .count();
        self.delete_oldest(below)?;
        Ok(())
    }

    /// Removes every batch whose last offset is >= `offset` (a batch that
    /// straddles `offset` goes too, so the new log end offset can be below
    /// `offset`). Below the log start offset, empties the log and restarts it
    /// at `offset`. The only way offsets move backwards.
    pub fn truncate_to(&mut self, offset: i64) -> io::Result<()> {
        if offset >= self.log_end_offset() {
            return Ok(());
        }
        if offset < self.log_start_offset || offset < self.segments[0].base_offset {
            // Offsets only in a colder tier cannot be cut there: start over.
            return self.truncate_fully_and_start_at(offset);
        }
        while self.segments.len() > 1 && self.active().base_offset > offset {
            let segment = self.segments.pop().expect("more than one segment");
            segment.delete_files()?;
        }
        let interval = self.config.index_interval_bytes;
        self.active_mut().truncate_to(offset, interval)?;
        let log_end = self.log_end_offset();
        self.unflushed_sealed.retain(|b| *b < log_end);
        self.flushed_offset = self.flushed_offset.min(log_end);
        if self.log_start_offset > log_end {
            // A batch straddling the log start was cut; persist the lower
            // start so a reopen does not clamp it back up later.
            write_log_start_offset(&self.dir, log_end)?;
            self.log_start_offset = log_end;
        }
        Ok(())
    }

    fn truncate_fully_and_start_at(&mut self, offset: i64) -> io::Result<()> {
        self.retire_all_tiered()?;
        for segment in self.segments.drain(..) {
            segment.delete_files()?;
        }
        self.segments.push(Segment::create(&self.dir, offset, None)?);
        write_log_start_offset(&self.dir, offset)?;
        self.log_start_offset = offset;
        self.flushed_offset = offset;
        self.unflushed_sealed.clear();
        self.unflushed_messages = 0;
        self.first_unflushed_append_ms = None;
        self.dir_dirty = true;
        Ok(())
    }

    /// Flushes, records the active segment's max timestamp in its time index
    /// (like Kafka's `LogSegment.close`) and writes the clean-shutdown
    /// marker, so the next open skips the recovery scan. An append after
    /// `close` removes the marker again.
    pub fn close(&mut self) -> io::Result<()> {
        self.active_mut().append_final_time_entry()?;
        self.flush()?;
        write_atomically(&self.dir.join(CLEAN_SHUTDOWN_FILE), b"")?;
        File::open(&self.dir)?.sync_all()?;
        self.closed = true;
        Ok(())
    }

    /// Removes the partition directory and everything in it. Returns the
    /// colder copies, which the caller deletes from their tiers.
    pub fn delete(mut self) -> io::Result<Vec<TieredSegment>> {
        let tiered = std::mem::take(&mut self.tiered);
        let dir = self.dir.clone();
        drop(self);
        fs::remove_dir_all(dir)?;
        Ok(tiered)
    }

    // ------------------------------------------------------------- tiers

    /// Every colder copy the manifest records, oldest first.
    pub fn tiered_segments(&self) -> &[TieredSegment] {
        &self.tiered
    }

    /// Segments whose only copy is in a colder tier, oldest first.
    fn cold(&self) -> impl Iterator<Item = &TieredSegment> {
        self.tiered.iter().filter(|t| t.is_cold())
    }

    /// Bytes of the segments read from a colder tier.
    pub fn cold_bytes(&self) -> u64 {
        self.cold().map(|t| t.size_bytes).sum()
    }

    /// The whole log: local segments and those only in a colder tier.
    pub fn total_bytes(&self) -> u64 {
        self.size_bytes() + self.cold_bytes()
    }

    /// Bytes of local segments that also have a verified colder copy (what
    /// releasing local copies could free).
    pub fn local_copied_bytes(&self) -> u64 {
        self.segments
            .iter()
            .filter(|s| {
                self.tiered
                    .iter()
                    .any(|t| t.base_offset == s.base_offset && t.state == TierState::Both)
            })
            .map(|s| s.size_bytes)
            .sum()
    }

    /// Sealed local segments without a colder copy (made or being made),
    /// oldest first: what the mover copies next.
    pub fn copy_candidates(&self) -> Vec<SealedSegment> {
        let covered = |s: &Segment| {
            self.tiered
                .iter()
                .any(|t| t.base_offset == s.base_offset && t.state != TierState::Deleting)
        };
        self.segments[..self.segments.len() - 1]
            .iter()
            .filter(|s| !covered(s) && !s.is_empty())
            .map(|s| SealedSegment {
                base_offset: s.base_offset,
                next_offset: s.next_offset,
                size_bytes: s.size_bytes,
                max_timestamp_ms: s.indexer.max_timestamp_ms,
                offset_of_max_timestamp: s.indexer.offset_of_max_timestamp,
                log: Arc::clone(&s.reader),
                index_path: s.path(crate::segment::INDEX_SUFFIX),
                time_index_path: s.path(crate::segment::TIME_INDEX_SUFFIX),
            })
            .collect()
    }

    /// Records, durably, that `segment` is being copied to `tier` as
    /// `object`. The copy itself is the caller's, outside the lock.
    pub fn begin_copy(
        &mut self,
        segment: &SealedSegment,
        tier: Tier,
        object: String,
    ) -> io::Result<TieredSegment> {
        let sealed = &self.segments[..self.segments.len() - 1];
        if !sealed.iter().any(|s| s.base_offset == segment.base_offset) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no sealed local segment at {}", segment.base_offset),
            ));
        }
        if !crate::tiered::valid_object_name(&object) || self.tiered.iter().any(|t| t.object == object) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bad or reused object name {object:?}"),
            ));
        }
        let entry = TieredSegment {
            base_offset: segment.base_offset,
            next_offset: segment.next_offset,
            size_bytes: segment.size_bytes,
            max_timestamp_ms: segment.max_timestamp_ms,
            offset_of_max_timestamp: segment.offset_of_max_timestamp,
            tier,
            state: TierState::Copying,
            object,
        };
        self.tiered.push(entry.clone());
        self.tiered.sort_by_key(|t| t.base_offset);
        write_manifest(&self.dir, &self.tiered)?;
        Ok(entry)
    }

    /// The copy `object` is complete and verified: `Copying` -> `Both`.
    /// False if the segment was deleted meanwhile (the entry is then
    /// `Deleting` and the caller's copy is removed like any other).
    pub fn finish_copy(&mut self, object: &str) -> io::Result<bool> {
        self.set_state(object, TierState::Copying, TierState::Both)
    }

    /// The copy `object` failed: its remains are to be deleted.
    pub fn abort_copy(&mut self, object: &str) -> io::Result<()> {
        self.set_state(object, TierState::Copying, TierState::Deleting)
            .map(drop)
    }

    /// The colder copy `object` is deleted from its tier: forget it.
    pub fn forget_deleted(&mut self, object: &str) -> io::Result<()> {
        let before = self.tiered.len();
        self.tiered
            .retain(|t| !(t.object == object && t.state == TierState::Deleting));
        if self.tiered.len() != before {
            write_manifest(&self.dir, &self.tiered)?;
        }
        Ok(())
    }

    fn set_state(&mut self, object: &str, from: TierState, to: TierState) -> io::Result<bool> {
        let Some(t) = self
            .tiered
            .iter_mut()
            .find(|t| t.object == object && t.state == from)
        else {
            return Ok(false);
        };
        t.state = to;
        write_manifest(&self.dir, &self.tiered)?;
        Ok(true)
    }

    /// Colder copies waiting to be deleted from their tier.
    pub fn pending_deletes(&self) -> Vec<TieredSegment> {
        self.tiered
            .iter()
            .filter(|t| t.state == TierState::Deleting)
            .cloned()
            .collect()
    }

    /// The oldest local segment, if it is sealed and has a verified colder
    /// copy, so its local files may go: `(base offset, bytes, max timestamp)`.
    pub fn oldest_releasable(&self) -> Option<(i64, u64, i64)> {
        if self.segments.len() < 2 {
            return None;
        }
        let s = &self.segments[0];
        let copied = self
            .tiered
            .iter()
            .any(|t| t.base_offset == s.base_offset && t.state == TierState::Both);
        copied.then_some((s.base_offset, s.size_bytes, s.indexer.max_timestamp_ms))
    }

    /// Deletes the local files of the oldest segment (see
    /// [`PartitionLog::oldest_releasable`]); its offsets are read from the
    /// colder tier from now on. Returns the bytes freed locally.
    pub fn release_local(&mut self, base_offset: i64) -> io::Result<u64> {
        if self.oldest_releasable().map(|(base, ..)| base) != Some(base_offset) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("segment {base_offset} is not the oldest local segment with a colder copy"),
            ));
        }
        let entry = self
            .tiered
            .iter_mut()
            .find(|t| t.base_offset == base_offset && t.state == TierState::Both)
            .expect("checked by oldest_releasable");
        entry.state = TierState::Cold;
        write_manifest(&self.dir, &self.tiered)?;
        let segment = self.segments.remove(0);
        self.unflushed_sealed.retain(|b| *b != base_offset);
        segment.delete_files()?;
        Ok(segment.size_bytes)
    }

    fn retire_all_tiered(&mut self) -> io::Result<()> {
        let mut changed = false;
        for t in self.tiered.iter_mut().filter(|t| t.state != TierState::Deleting) {
            t.state = TierState::Deleting;
            changed = true;
        }
        if changed {
            write_manifest(&self.dir, &self.tiered)?;
        }
        Ok(())
    }
}

/// A sealed local segment the mover may copy. Its files are immutable; the
/// `.log` handle stays readable even if retention deletes the segment.
#[derive(Debug, Clone)]
pub struct SealedSegment {
    pub base_offset: i64,
    pub next_offset: i64,
    pub size_bytes: u64,
    pub max_timestamp_ms: i64,
    pub offset_of_max_timestamp: i64,
    pub log: Arc<File>,
    pub index_path: PathBuf,
    pub time_index_path: PathBuf,
}

/// Base offset of the oldest segment read from a colder tier.
fn first_cold_base(tiered: &[TieredSegment]) -> Option<i64> {
    tiered.iter().find(|t| t.is_cold()).map(|t| t.base_offset)
}

/// Start-up half of the tier lifecycle: a copy that was being made when the
/// process stopped is rolled back (its remains are deleted by the mover, and
/// the segment is copied again under a new name). Returns whether the
/// manifest changed.
fn recover_tier_moves(dir: &Path, tiered: &mut [TieredSegment]) -> io::Result<bool> {
    let mut changed = false;
    for t in tiered.iter_mut().filter(|t| t.state == TierState::Copying) {
        tracing::info!(dir = %dir.display(), object = %t.object, "rolling back an interrupted copy to the {} tier", t.tier.name());
        t.state = TierState::Deleting;
        changed = true;
    }
    Ok(changed)
}

/// Checks that `headers` describe `records`; returns the offsets they use.
fn check_append(records: &[u8], headers: &[BatchHeader]) -> Result<i64, AppendError> {
    if headers.is_empty() {
        return Err(AppendError::Empty);
    }
    let headers_bytes: usize = headers.iter().map(BatchHeader::total_len).sum();
    if headers_bytes != records.len() {
        return Err(AppendError::HeadersMismatch {
            headers_bytes,
            records_bytes: records.len(),
        });
    }
    Ok(headers.iter().map(|h| i64::from(h.last_offset_delta) + 1).sum())
}

/// Rewrites each batch's base offset; returns the headers as written.
fn assign_offsets(records: &mut [u8], headers: &[BatchHeader], base_offset: i64) -> Vec<BatchHeader> {
    let mut next = base_offset;
    let mut pos = 0;
    let mut assigned = Vec::with_capacity(headers.len());
    for h in headers {
        let len = h.total_len();
        set_base_offset(&mut records[pos..pos + len], next);
        assigned.push(BatchHeader {
            base_offset: next,
            ..*h
        });
        next = assigned[assigned.len() - 1].last_offset() + 1;
        pos += len;
    }
    assigned
}

/// Loads the segments named by `bases` (sorted), or creates the first one.
fn load_segments(
    dir: &Path,
    bases: &[i64],
    clean: bool,
    config: &LogConfig,
    stored_start: Option<i64>,
) -> io::Result<Vec<Segment>> {
    let interval = config.index_interval_bytes;
    if bases.is_empty() {
        return Ok(vec![Segment::create(
            dir,
            stored_start.unwrap_or(0).max(0),
            None,
        )?]);
    }
    let mut segments = Vec::with_capacity(bases.len());
    for (i, &base) in bases.iter().enumerate() {
        let mode = match (i + 1 == bases.len(), clean) {
            (false, _) => LoadMode::Sealed,
            (true, true) => LoadMode::LastClean,
            (true, false) => LoadMode::LastRecover,
        };
        segments.push(Segment::load(dir, base, mode, interval)?);
    }
    segments.last_mut().expect("non-empty").activate()?;
    Ok(segments)
}

/// Base offsets of the `.log` files in `dir`, sorted; removes stray temp
/// files and index files without a `.log`.
fn list_segments(dir: &Path) -> io::Result<Vec<i64>> {
    let mut bases = Vec::new();
    let mut orphans = Vec::new();
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if STRAY_SUFFIXES.iter().any(|s| name.ends_with(s)) {
            tracing::warn!(file = %path.display(), "removing stray file");
            remove_if_exists(&path)?;
            continue;
        }
        let Some((stem, ext)) = name.split_once('.') else {
            continue;
        };
        let Some(base) = parse_base_offset(stem) else {
            continue;
        };
        match ext {
            LOG_SUFFIX => bases.push(base),
            "index" | "timeindex" => orphans.push((base, path)),
            _ => {}
        }
    }
    bases.sort_unstable();
    for (base, path) in orphans {
        if bases.binary_search(&base).is_err() {
            tracing::warn!(file = %path.display(), "removing index without a log");
            remove_if_exists(&path)?;
        }
    }
    Ok(bases)
}

/// Kafka's file stem: exactly 20 decimal digits.
fn parse_base_offset(stem: &str) -> Option<i64> {
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok()
}

/// Removes the clean-shutdown marker; returns whether it was there.
fn take_clean_marker(dir: &Path) -> io::Result<bool> {
    let path = dir.join(CLEAN_SHUTDOWN_FILE);
    let present = path.exists();
    if present {
        remove_if_exists(&path)?;
        File::open(dir)?.sync_all()?;
    }
    Ok(present)
}

fn read_log_start_offset(dir: &Path) -> io::Result<Option<i64>> {
    let path = dir.join(LOG_START_OFFSET_FILE);
    let text = match fs::read_to_string(&path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.kind() == io::ErrorKind::InvalidData => String::new(),
        other => other?,
    };
    let mut lines = text.lines();
    let parsed = match (lines.next(), lines.next()) {
        (Some(LOG_START_OFFSET_VERSION), Some(value)) => value.trim().parse::<i64>().ok(),
        _ => None,
    };
    if parsed.is_none() {
        tracing::warn!(file = %path.display(), "ignoring unreadable log start offset file");
    }
    Ok(parsed.filter(|v| *v >= 0))
}

fn write_log_start_offset(dir: &Path, offset: i64) -> io::Result<()> {
    let text = format!("{LOG_START_OFFSET_VERSION}\n{offset}\n");
    write_atomically(&dir.join(LOG_START_OFFSET_FILE), text.as_bytes())?;
    File::open(dir)?.sync_all()
}

fn remove_if_exists(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod scan_tests {
    use super::*;
    use crate::batch::validate_batches;
    use crate::testing::simple_batch;

    /// A sequential scan that passes each read's hint to the next plan
    /// starts every read exactly at its batch and ends it on a batch
    /// boundary: the windows it asks for add up to the data, once.
    #[test]
    fn hinted_scans_plan_each_batch_once() {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            index_interval_bytes: 512,
            ..LogConfig::default()
        };
        let mut log = PartitionLog::open(dir.path(), config).unwrap();
        for i in 0..60 {
            let mut buf = simple_batch(5, 80 + i % 7, i as i64);
            let headers = validate_batches(&buf).unwrap();
            log.append(&mut buf, &headers, 0).unwrap();
        }
        let size = log.size_bytes();
        for max_bytes in [600usize, 1500, 5000] {
            let (mut offset, mut planned, mut served, mut hint) = (0, 0u64, 0u64, None);
            let mut index_starts_earlier = 0;
            while offset < log.log_end_offset() {
                let plan = log.read_plan_after(offset, max_bytes, hint).unwrap();
                let cold = log.read_plan(offset, max_bytes).unwrap();
                // One segment, read in order: the batch holding `offset`
                // starts where the data served so far ends.
                assert_eq!(
                    plan.start_position, served,
                    "max_bytes {max_bytes}, offset {offset}"
                );
                index_starts_earlier += usize::from(cold.start_position < served);
                planned += plan.window_end.unwrap_or(size) - plan.start_position;
                let (bytes, next) = plan.execute_scan().unwrap();
                assert_eq!(bytes, cold.execute().unwrap(), "same data either way");
                served += bytes.len() as u64;
                hint = next;
                offset = next.unwrap().next_offset();
            }
            assert_eq!(served, size);
            assert!(
                planned <= size + size / 20,
                "max_bytes {max_bytes}: planned {planned} for {size}"
            );
            assert!(
                index_starts_earlier > 0,
                "without the hint, reads start at an earlier batch"
            );
        }
    }
}
