//! [`PartitionLog`]: the writer of one topic-partition directory.
//!
//! One owner writes (the caller serializes appends and maintenance); every
//! reader goes through the shared [`LogReader`]. File I/O happens outside
//! the view's lock: the writer writes first and then publishes what it
//! wrote, so a read planned meanwhile sees the old state, never a torn one.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::batch::{set_base_offset, BatchHeader, NO_TIMESTAMP};
use crate::config::LogConfig;
use crate::error::{AppendError, DeleteRecordsError, OpenError};
use crate::index::{relative, OFFSET_ENTRY_LEN, TIME_ENTRY_LEN};
use crate::seal::{
    read_offset_file, snapshot_path, write_offset_file, write_snapshot, SealWork, Sealer,
    RECOVERY_POINT_FILE, SNAPSHOT_SUFFIX,
};
use crate::segment::{
    self, batch_meta, segment_path, LoadMode, SegMeta, INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
};
use crate::storage::{
    read_file, remove_if_exists, sync_parent, write_all_at, write_atomically, DiskStorage, OpenMode, Storage,
    StoredFile,
};
use crate::tiered::{read_manifest, write_manifest, Tier, TierState, TieredSegment};
use crate::txnindex::AbortedTxn;
use crate::view::{LogReader, ViewState};

/// Written by [`PartitionLog::close`], removed by [`PartitionLog::open`]:
/// its presence means no segment needs a recovery scan.
pub const CLEAN_SHUTDOWN_FILE: &str = ".keel_clean_shutdown";
/// The log start offset set by DeleteRecords: "0\n<offset>\n" (version, value).
pub const LOG_START_OFFSET_FILE: &str = "log-start-offset";

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
    /// True if the active segment rolled before this append (its seal is
    /// queued: see [`PartitionLog::sealer`]).
    pub rolled: bool,
    /// Where the append's time went.
    pub times: AppendTimes,
}

/// The time an append spent in each of its steps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AppendTimes {
    /// Rolling to a new segment (creating its files), when it rolled.
    pub roll: Option<Duration>,
    /// Writing the batches to the segment and publishing them.
    pub write: Duration,
    /// The fsync `flush.messages` / `flush.ms` asked for, when one ran.
    pub flush: Option<Duration>,
}

/// What [`PartitionLog::apply_retention`] deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionOutcome {
    pub deleted_segments: usize,
    pub deleted_bytes: u64,
    pub log_start_offset: i64,
}

/// The writer of one partition log. Not internally synchronized: the
/// caller owns it (behind a lock only writers and maintenance wait on);
/// readers use [`PartitionLog::reader`].
#[derive(Debug)]
pub struct PartitionLog {
    dir: PathBuf,
    config: LogConfig,
    storage: Arc<dyn Storage>,
    view: LogReader,
    /// Write handle of the active segment's `.log` (pinned in its file).
    active: Arc<dyn StoredFile>,
    sealer: Arc<Sealer>,
    /// Shared with cleaning passes, which use the directory by its path
    /// without the writer's lock; retiring the log closes it.
    dir_fence: Arc<crate::fence::DirFence>,
    /// Every offset below this has been fsynced by a flush of this writer.
    flushed_offset: i64,
    unflushed_messages: u64,
    /// Caller clock at the first append since the last flush.
    first_unflushed_append_ms: Option<i64>,
    /// The clean-shutdown marker is on disk.
    closed: bool,
    /// A failed fsync (or a failed undo of a failed write) left the files
    /// untrusted: every later write is refused.
    failed: Option<String>,
    /// The newest producer-state snapshot found at open, until taken.
    producer_snapshot: Option<(i64, Vec<u8>)>,
    /// Files of deleted segments, held open until the deadline so reads
    /// planned before the deletion still find them (Kafka's
    /// `file.delete.delay.ms`).
    graveyard: Vec<(std::time::Instant, Arc<dyn StoredFile>)>,
    /// Cold copies the cleaner replaced, by object name, and until when
    /// they stay in their tier: a read planned against one before the
    /// swap still finds it (`file.delete.delay.ms`, as for local files).
    /// Only this process's reads can be in flight, so a restart forgets
    /// them.
    replaced_cold: Vec<(Instant, String)>,
}

/// Whether `segment` has a colder copy in `tiered` (being made, or made)
/// that is not being deleted.
fn has_colder_copy(tiered: &[TieredSegment], segment: &SegMeta) -> bool {
    tiered
        .iter()
        .any(|t| t.base_offset == segment.base_offset && t.state != TierState::Deleting)
}

/// Segment base offsets and snapshot offsets found in a directory.
struct Listing {
    bases: Vec<i64>,
    snapshots: Vec<i64>,
}

impl PartitionLog {
    /// Opens (creating if needed) the partition directory `dir` on the real
    /// filesystem. See [`PartitionLog::open_with`].
    pub fn open(dir: &Path, config: LogConfig) -> Result<PartitionLog, OpenError> {
        PartitionLog::open_with(DiskStorage::shared(), dir, config)
    }

    /// Opens (creating if needed) the partition directory `dir`, repairing
    /// what a crash may have left: stray temp files, missing or corrupt
    /// indexes, and, unless the clean-shutdown marker is present, torn data
    /// in every segment from the one holding the recovery point on (cut at
    /// the first invalid batch, later segments deleted). Invalid data below
    /// the recovery point is reported and left in place; reads stop there.
    pub fn open_with(
        storage: Arc<dyn Storage>,
        dir: &Path,
        config: LogConfig,
    ) -> Result<PartitionLog, OpenError> {
        config.check().map_err(OpenError::InvalidConfig)?;
        let io_err = |source| OpenError::Io {
            path: dir.to_path_buf(),
            source,
        };
        let Repaired {
            clean,
            tiered,
            listing,
            cold_end,
        } = repair_dir(storage.as_ref(), dir).map_err(io_err)?;
        let stored_start =
            read_offset_file(storage.as_ref(), &dir.join(LOG_START_OFFSET_FILE)).map_err(io_err)?;
        let recovery_point =
            read_offset_file(storage.as_ref(), &dir.join(RECOVERY_POINT_FILE)).map_err(io_err)?;
        let loaded = load_segments(
            &storage,
            dir,
            &listing.bases,
            clean,
            recovery_point,
            &config,
            stored_start.or(cold_end),
        )
        .map_err(io_err)?;
        let segments = loaded.segments;
        let log_end_offset = segments.last().expect("at least one segment").next_offset;
        let first_base = tiered
            .iter()
            .find(|t| t.is_cold())
            .map_or(segments[0].base_offset, |t| t.base_offset);
        let log_start_offset = stored_start
            .unwrap_or(first_base)
            .clamp(first_base, log_end_offset);
        // Recovery cut the log below its durable start (the records below
        // it were deleted before they were fsynced). Offsets below the
        // start may have been read, or covered by a snapshot of the state
        // they held, so they are never handed out again: the log restarts
        // empty at its start, as Kafka's log loader does.
        let restart_at = stored_start.filter(|stored| *stored > log_end_offset);
        // A new log needs none (without a recovery point, recovery starts at
        // the first segment), unless a stale one from an earlier log is there.
        let stale_point = loaded.created && recovery_point.is_some();
        if (!clean && !loaded.created) || stale_point {
            write_offset_file(storage.as_ref(), &dir.join(RECOVERY_POINT_FILE), log_end_offset)
                .map_err(io_err)?;
        }
        let producer_snapshot =
            newest_snapshot(storage.as_ref(), dir, &listing.snapshots, log_end_offset).map_err(io_err)?;
        let state = ViewState {
            segments,
            tiered,
            log_start_offset,
            read_io: config.read_io,
        };
        let mut log = PartitionLog::writer(storage, dir, config, state, producer_snapshot).map_err(io_err)?;
        if let Some(start) = restart_at {
            tracing::warn!(
                dir = %dir.display(),
                log_end_offset,
                log_start_offset = start,
                "recovery left the log ending below its start offset; restarting it empty at the start offset"
            );
            log.truncate_fully_and_start_at(start).map_err(io_err)?;
        }
        Ok(log)
    }

    /// The writer of the log in `dir` that `state` describes, once
    /// recovery has loaded its segments: it opens the active segment for
    /// writing and pins it in the view, and counts everything in the log
    /// as flushed.
    fn writer(
        storage: Arc<dyn Storage>,
        dir: &Path,
        config: LogConfig,
        state: ViewState,
        producer_snapshot: Option<(i64, Vec<u8>)>,
    ) -> io::Result<PartitionLog> {
        let last = state.segments.last().expect("at least one segment");
        let log_end_offset = last.next_offset;
        let active = storage.open(&segment_path(dir, last.base_offset, LOG_SUFFIX), OpenMode::Write)?;
        let durable_through = state
            .segments
            .iter()
            .take_while(|s| s.durable)
            .last()
            .map_or(i64::MIN, |s| s.next_offset);
        let active_file = Arc::clone(&last.file);
        let view = LogReader::new(dir, state);
        let pinned = Arc::new(segment::SegmentFile::pinned(
            Arc::clone(&storage),
            active_file.path().to_path_buf(),
            Arc::clone(&active),
        ));
        view.state.write().active_mut().file = pinned;
        let sealer = Arc::new(Sealer::new(
            Arc::clone(&storage),
            dir,
            view.clone(),
            durable_through,
        ));
        Ok(PartitionLog {
            dir: dir.to_path_buf(),
            config,
            storage,
            view,
            active,
            sealer,
            dir_fence: Arc::default(),
            flushed_offset: log_end_offset,
            unflushed_messages: 0,
            first_unflushed_append_ms: None,
            closed: false,
            failed: None,
            producer_snapshot,
            graveyard: Vec::new(),
            replaced_cold: Vec::new(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config(&self) -> &LogConfig {
        &self.config
    }

    /// Replaces the settings, as when a topic's configs are altered at run
    /// time. They apply from the next append, roll check, flush and
    /// retention pass; segments already written keep their size. How files
    /// are read (`read_io`) is decided at open and kept.
    pub fn set_config(&mut self, config: LogConfig) -> Result<(), &'static str> {
        config.check()?;
        self.config = LogConfig {
            read_io: self.config.read_io,
            ..config
        };
        Ok(())
    }

    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// The read side, shared with readers on any thread.
    pub fn reader(&self) -> &LogReader {
        &self.view
    }

    /// The seal queue, for a background thread to run
    /// ([`Sealer::run_pending`]) after a roll.
    pub fn sealer(&self) -> &Arc<Sealer> {
        &self.sealer
    }

    pub fn log_start_offset(&self) -> i64 {
        self.view.log_start_offset()
    }

    pub fn log_end_offset(&self) -> i64 {
        self.view.log_end_offset()
    }

    /// Every offset below this has been fsynced.
    pub fn flushed_offset(&self) -> i64 {
        self.flushed_offset.max(self.sealer.durable_offset())
    }

    pub fn unflushed_messages(&self) -> u64 {
        self.unflushed_messages
    }

    pub fn size_bytes(&self) -> u64 {
        self.view.size_bytes()
    }

    pub fn segment_count(&self) -> usize {
        self.view.segment_count()
    }

    pub fn segment_base_offsets(&self) -> Vec<i64> {
        self.view.segment_base_offsets()
    }

    /// Why the log refuses writes, if it does (a failed fsync).
    pub fn failure(&self) -> Option<String> {
        self.failed.clone().or_else(|| self.sealer.failure())
    }

    /// The newest producer-state snapshot found at open (at or below the
    /// log end offset): `(offset, bytes)`. Taken once.
    /// The producer-state snapshot file at `offset` (written when the
    /// segment ending there rolled), if it is still on disk.
    pub fn read_producer_snapshot(&self, offset: i64) -> io::Result<Option<Vec<u8>>> {
        read_file(self.storage.as_ref(), &snapshot_path(&self.dir, offset))
    }

    pub fn take_producer_snapshot(&mut self) -> Option<(i64, Vec<u8>)> {
        self.producer_snapshot.take()
    }

    /// Queues a producer-state snapshot at `offset` (the state of every
    /// batch below it) for the sealer to write.
    pub fn queue_producer_snapshot(&self, offset: i64, bytes: Vec<u8>) {
        self.sealer.push(SealWork::Snapshot { offset, bytes });
    }

    fn check_writable(&self) -> io::Result<()> {
        match self.failure() {
            Some(why) => Err(io::Error::other(format!("the log is offline: {why}"))),
            None => Ok(()),
        }
    }

    /// Passes on the result of a durable write; a failed fsync in it takes
    /// the log offline.
    fn durably(&mut self, result: io::Result<()>) -> io::Result<()> {
        if let Err(e) = &result {
            if crate::storage::is_sync_error(e) {
                self.fail("fsync", e);
            }
        }
        result
    }

    /// Remembers that the files can no longer be trusted.
    fn fail(&mut self, what: &str, e: &io::Error) {
        let why = format!("{what}: {e}");
        tracing::error!(dir = %self.dir.display(), %why, "the log goes offline");
        self.failed.get_or_insert(why.clone());
        self.sealer.set_failed(why);
    }

    /// Appends validated batches (see [`crate::batch::validate_batches`]),
    /// rewriting their base offsets so they get contiguous offsets from the
    /// log end offset. One `write` for the whole buffer, into one segment:
    /// the caller may concatenate several producers' batches (group commit)
    /// as long as they span at most 2^31 offsets. The partition leader epoch
    /// field is left as given: setting it is the caller's job.
    ///
    /// On an error the log is as it was: nothing was published and the
    /// bytes written were cut away. [`AppendError::Offline`] means the
    /// files can no longer be trusted (a failed fsync); every later write
    /// fails too.
    pub fn append(
        &mut self,
        records: &mut [u8],
        headers: &[BatchHeader],
        now_ms: i64,
    ) -> Result<AppendInfo, AppendError> {
        if let Some(why) = self.failure() {
            return Err(AppendError::Offline(why));
        }
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
        let started = Instant::now();
        let rolled = self.maybe_roll(
            records.len() as u64,
            headers.len(),
            last_offset,
            max_timestamp_ms,
            now_ms,
        )?;
        if self.closed {
            remove_if_exists(self.storage.as_ref(), &self.dir.join(CLEAN_SHUTDOWN_FILE))?;
            self.storage.sync_dir(&self.dir)?;
            self.closed = false;
        }
        let rolled_at = Instant::now();
        let assigned = assign_offsets(records, headers, base_offset);
        let (segment_base_offset, position) = self.write_batches(records, &assigned)?;
        let written_at = Instant::now();
        let records_count: u64 = headers.iter().map(|h| h.records_count.max(0) as u64).sum();
        let flushed = self.note_unflushed(records_count, now_ms)?;
        let times = AppendTimes {
            roll: rolled.then(|| rolled_at - started),
            write: written_at - rolled_at,
            flush: flushed.then(|| written_at.elapsed()),
        };
        Ok(AppendInfo {
            base_offset,
            last_offset,
            max_timestamp_ms,
            segment_base_offset,
            position,
            records_count,
            flushed,
            rolled,
            times,
        })
    }

    /// Records a transaction aborted by the marker at `txn.last_offset`,
    /// in the `.txnindex` of the segment holding that marker. The caller
    /// adds one after appending each ABORT marker of a transaction that
    /// wrote here, and again for every marker it replays at start-up (an
    /// entry already present is not added twice). An entry for an active
    /// segment is written with its seal or at close; one for a sealed
    /// segment rewrites its file now. Markers outside the local segments
    /// (already cut or moved away) are ignored.
    pub fn add_aborted_txn(&mut self, txn: AbortedTxn) -> io::Result<()> {
        let sealed = {
            let mut st = self.view.state.write();
            let active_base = st.active().base_offset;
            let Some(seg) = st
                .segments
                .iter_mut()
                .find(|s| s.base_offset <= txn.last_offset && txn.last_offset < s.next_offset)
            else {
                return Ok(());
            };
            if seg.aborted.iter().any(|e| e.last_offset == txn.last_offset) {
                return Ok(());
            }
            seg.aborted.push(txn);
            seg.aborted.sort_by_key(|e| e.last_offset);
            (seg.base_offset != active_base).then(|| (seg.base_offset, seg.aborted.clone()))
        };
        match sealed {
            Some((base, entries)) => crate::txnindex::write(self.storage.as_ref(), &self.dir, base, &entries),
            None => Ok(()),
        }
    }

    /// Writes batches with assigned offsets at the end of the active
    /// segment, then publishes them (size, next offset, index entries).
    fn write_batches(&mut self, records: &[u8], assigned: &[BatchHeader]) -> Result<(i64, u64), AppendError> {
        let interval = self.config.index_interval_bytes;
        let (base, position, mut indexer, last_time) = {
            let st = self.view.state.read();
            let a = st.active();
            (
                a.base_offset,
                a.size_bytes,
                a.indexer,
                a.time_index.last().copied(),
            )
        };
        let mut new_offsets = Vec::new();
        let mut new_times = Vec::new();
        let mut pos = position;
        for h in assigned {
            // maybe_roll made the active segment hold the whole range.
            relative(h.last_offset(), base).ok_or(AppendError::OffsetOverflow)?;
            let last = new_times.last().copied().or(last_time);
            let (o, t) = indexer.on_batch(batch_meta(h, pos), base, interval, last);
            new_offsets.extend(o);
            new_times.extend(t);
            pos += h.total_len() as u64;
        }
        if let Err(e) = write_all_at(self.active.as_ref(), records, position) {
            // Never leave bytes the log does not count: they would be read
            // by recovery as a torn tail at best.
            if let Err(undo) = self.active.set_len(position) {
                self.fail("cutting back a failed write", &undo);
                return Err(AppendError::Offline(format!(
                    "write failed ({e}) and could not be undone ({undo})"
                )));
            }
            return Err(AppendError::Io(e));
        }
        let mut st = self.view.state.write();
        let a = st.active_mut();
        a.size_bytes = pos;
        a.next_offset = assigned.last().map_or(a.next_offset, |h| h.last_offset() + 1);
        a.offset_index.extend(new_offsets);
        a.time_index.extend(new_times);
        a.indexer = indexer;
        if a.first_batch_max_timestamp_ms.is_none() {
            a.first_batch_max_timestamp_ms = assigned.first().map(|h| h.max_timestamp);
        }
        Ok((base, position))
    }

    /// Counts records for the flush policy; fsyncs on `flush_messages`.
    fn note_unflushed(&mut self, records_count: u64, now_ms: i64) -> Result<bool, AppendError> {
        self.unflushed_messages = self.unflushed_messages.saturating_add(records_count);
        self.first_unflushed_append_ms.get_or_insert(now_ms);
        if self.unflushed_messages >= self.config.flush_messages {
            self.flush().map_err(|e| AppendError::Offline(e.to_string()))?;
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
    ) -> Result<bool, AppendError> {
        let should_roll = {
            let st = self.view.state.read();
            let active = st.active();
            let config = &self.config;
            if active.is_empty() {
                false
            } else {
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
                too_big || too_old || index_full || offset_overflow
            }
        };
        if should_roll {
            self.roll(now_ms).map_err(AppendError::Io)?;
        }
        // A fresh segment starts at the log end, so a range of at most 2^31
        // offsets fits it.
        let base = self.view.state.read().active().base_offset;
        if last_offset - base > i64::from(i32::MAX) {
            return Err(AppendError::OffsetOverflow);
        }
        Ok(should_roll)
    }

    /// Rolls the active segment if it holds records and was created at
    /// least `max_age_ms` ago (one loaded at start-up counts from its first
    /// check): a cluster's leader seals it so that it goes to the object
    /// store. Whether it rolled.
    pub fn roll_if_older(&mut self, now_ms: i64, max_age_ms: i64) -> io::Result<bool> {
        self.check_writable()?;
        let due = {
            let mut st = self.view.state.write();
            let active = st.active_mut();
            if active.is_empty() {
                return Ok(false);
            }
            let created = *active.created_ms.get_or_insert(now_ms);
            now_ms.saturating_sub(created) >= max_age_ms
        };
        if due {
            self.roll(now_ms)?;
        }
        Ok(due)
    }

    /// Creates the next segment at the log end offset, then seals the
    /// active one: its final time entry, and its index files and fsync
    /// queued for the sealer. If the new segment cannot be created, nothing
    /// changes and nothing is left behind.
    fn roll(&mut self, now_ms: i64) -> io::Result<()> {
        let log_end_offset = self.log_end_offset();
        let (meta, handle) = segment::create(&self.storage, &self.dir, log_end_offset, Some(now_ms))?;
        self.sealer.note_dir_dirty();
        let old = std::mem::replace(&mut self.active, handle);
        let work = {
            let mut st = self.view.state.write();
            let sealed = st.active_mut();
            sealed.add_final_time_entry();
            let (index, time_index) = sealed.index_images();
            let work = SealWork::Segment {
                base_offset: sealed.base_offset,
                next_offset: sealed.next_offset,
                handle: old,
                index,
                time_index,
                aborted: sealed.aborted.clone(),
            };
            st.segments.push(meta);
            work
        };
        self.sealer.push(work);
        Ok(())
    }

    /// Runs the queued seal work now (index files, fsync, recovery point).
    /// The broker runs it on a background thread instead.
    pub fn complete_seals(&mut self) -> io::Result<usize> {
        self.sealer.run_pending()
    }

    /// fsyncs everything appended so far: sealed segments rolled since (with
    /// their index files), the active segment, and the directory if segment
    /// files were created. A failure takes the log offline.
    pub fn flush(&mut self) -> io::Result<()> {
        self.check_writable()?;
        let result = (|| {
            self.sealer.run_pending()?;
            self.active.sync_data()?;
            if self.sealer.take_dir_dirty() {
                self.storage.sync_dir(&self.dir)?;
            }
            Ok(())
        })();
        if let Err(e) = result {
            self.fail("fsync", &e);
            return Err(e);
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

    // ------------------------------------------------------ reads (forwarded)

    /// See [`LogReader::read_plan`].
    pub fn read_plan(&self, offset: i64, max_bytes: usize) -> Result<crate::ReadPlan, crate::ReadError> {
        self.view.read_plan(offset, max_bytes)
    }

    /// See [`LogReader::read_plan_after`].
    pub fn read_plan_after(
        &self,
        offset: i64,
        max_bytes: usize,
        hint: Option<crate::ScanHint>,
    ) -> Result<crate::ReadPlan, crate::ReadError> {
        self.view.read_plan_after(offset, max_bytes, hint)
    }

    /// See [`LogReader::offset_for_timestamp`].
    pub fn offset_for_timestamp(&self, timestamp_ms: i64) -> io::Result<Option<(i64, i64)>> {
        self.view.offset_for_timestamp(timestamp_ms)
    }

    /// See [`LogReader::max_timestamp`].
    pub fn max_timestamp(&self) -> Option<(i64, i64)> {
        self.view.max_timestamp()
    }

    /// See [`LogReader::batch_headers`].
    pub fn batch_headers(&self, from_offset: i64) -> crate::HeaderScan {
        self.view.batch_headers(from_offset)
    }

    pub fn tiered_segments(&self) -> Vec<TieredSegment> {
        self.view.tiered_segments()
    }

    pub fn cold_bytes(&self) -> u64 {
        self.view.cold_bytes()
    }

    pub fn total_bytes(&self) -> u64 {
        self.view.total_bytes()
    }

    pub fn local_copied_bytes(&self) -> u64 {
        self.view.local_copied_bytes()
    }

    // ------------------------------------------------------------ compaction

    /// What a cleaning pass reads (see [`crate::clean`]); the pass runs
    /// without this log's lock, and stops touching the directory's path
    /// once the log is retired.
    pub fn clean_source(&self) -> crate::clean::CleanSource {
        crate::clean::CleanSource {
            storage: Arc::clone(&self.storage),
            dir: self.dir.clone(),
            fence: Arc::clone(&self.dir_fence),
            view: self.view.clone(),
            segment_bytes: self.config.segment_bytes,
            index_interval_bytes: self.config.index_interval_bytes,
            direct: self.config.read_io == crate::ReadIo::Direct,
            read_window: crate::clean::DEFAULT_READ_WINDOW,
            producers: std::collections::HashMap::new(),
            cold: None,
            stable_end: i64::MAX,
        }
    }

    /// Swaps a cleaned group in for the segments it replaces, with Kafka's
    /// protocol: `.cleaned` (fsynced) becomes `.swap` (the commit point,
    /// fsynced directory), the old files go (fsynced directory), then the
    /// swap takes the first segment's name and gets its index files. A
    /// crash at any step is finished or undone at the next open
    /// ([`crate::clean::recover_swaps`]). Returns false, and leaves
    /// everything as it was, if the segments changed since the pass read
    /// them. Reads planned on the old files keep reading them.
    ///
    /// A group of cold segments was stored in their tier by the pass; its
    /// swap is one manifest change ([`PartitionLog::commit_cleaned_cold`]).
    pub fn commit_cleaned(&mut self, group: crate::clean::CleanedGroup) -> io::Result<bool> {
        self.check_writable()?;
        if let Some(stored) = group.stored.clone() {
            return self.commit_cleaned_cold(group, stored);
        }
        let base = group.base_offset();
        let local_file = |r: &crate::clean::SegmentRef| match &r.source {
            crate::clean::Source::Local(file) => Some(Arc::clone(file)),
            crate::clean::Source::Cold(_) => None,
        };
        let at = {
            let st = self.view.state.read();
            let sealed = st.segments.len() - 1;
            let at = st.segments[..sealed].iter().position(|s| s.base_offset == base);
            let same = at.is_some_and(|at| {
                at + group.replaced.len() <= sealed
                    && group.replaced.iter().zip(&st.segments[at..]).all(|(r, s)| {
                        local_file(r).is_some_and(|f| Arc::ptr_eq(&f, &s.file))
                            && r.size_bytes == s.size_bytes
                            && s.durable
                    })
            });
            match at {
                Some(at) if same => at,
                _ => return Ok(false),
            }
        };
        // A colder copy of a replaced segment (being made, or made) would
        // be taken for the cleaned segment, which starts at the same
        // offset: it goes first, before the swap can be decided.
        let mut tiered = self.view.tiered_segments();
        let replaced: Vec<i64> = group.replaced.iter().map(|r| r.base_offset).collect();
        let mut copies = 0;
        for t in tiered
            .iter_mut()
            .filter(|t| t.state != TierState::Deleting && t.state != TierState::Cold)
            .filter(|t| replaced.contains(&t.base_offset))
        {
            t.state = TierState::Deleting;
            copies += 1;
        }
        if copies > 0 {
            self.publish_manifest(tiered)?;
        }
        for old in &group.replaced {
            if let Some(file) = local_file(old) {
                file.pin(file.open()?);
            }
        }
        // The cleaned segment keeps the aborts of the ones it replaces. Its
        // `.txnindex` is written over the first one's before the commit
        // point: a rolled-back swap reads back only the entries inside
        // that segment's own range (see `segment::load`).
        let aborted: Vec<AbortedTxn> = {
            let st = self.view.state.read();
            st.segments[at..at + group.replaced.len()]
                .iter()
                .flat_map(|s| s.aborted.iter().copied())
                .collect()
        };
        crate::txnindex::write(self.storage.as_ref(), &self.dir, base, &aborted)?;
        let swap = crate::clean::swap_path(&self.dir, base);
        self.storage.rename(&group.cleaned_path, &swap)?;
        let committed = self.storage.sync_dir(&self.dir);
        self.durably(committed)?;
        let mut meta = group.meta(Arc::new(segment::SegmentFile::new(
            Arc::clone(&self.storage),
            segment_path(&self.dir, base, LOG_SUFFIX),
        )));
        meta.aborted = aborted;
        // From here on the swap is decided: a failure leaves it to the
        // next open to finish, and the log offline until then.
        if let Err(e) = self.finish_swap(&group.replaced, &swap, &meta) {
            self.fail("swapping in a cleaned segment", &e);
            return Err(e);
        }
        let mut st = self.view.state.write();
        st.segments.splice(at..at + group.replaced.len(), [meta]);
        Ok(true)
    }

    /// Swaps a cleaned group of cold segments, already stored in their
    /// tier as `stored`, in for them: one manifest change (atomic) makes
    /// the new copy `Cold` and the old ones `Deleting` (the mover deletes
    /// them). False if the old copies are no longer the log's.
    fn commit_cleaned_cold(
        &mut self,
        group: crate::clean::CleanedGroup,
        stored: TieredSegment,
    ) -> io::Result<bool> {
        let mut tiered = self.view.tiered_segments();
        let mut objects = Vec::new();
        for r in &group.replaced {
            let crate::clean::Source::Cold(old) = &r.source else {
                return Ok(false);
            };
            if !tiered.iter().any(|t| t.object == old.object && t.is_cold()) {
                return Ok(false);
            }
            objects.push(old.object.clone());
        }
        for t in tiered.iter_mut().filter(|t| objects.contains(&t.object)) {
            t.state = TierState::Deleting;
        }
        let now = Instant::now();
        let until = now + Duration::from_millis(self.config.file_delete_delay_ms);
        self.replaced_cold.retain(|(at, _)| *at > now);
        self.replaced_cold
            .extend(objects.iter().map(|object| (until, object.clone())));
        tiered.push(TieredSegment {
            state: TierState::Cold,
            ..stored
        });
        tiered.sort_by_key(|t| t.base_offset);
        self.publish_manifest(tiered)?;
        crate::storage::remove_if_exists(self.storage.as_ref(), &group.cleaned_path)?;
        Ok(true)
    }

    /// Steps 3 to 5 of [`PartitionLog::commit_cleaned`]: the old files go,
    /// the swap file takes the segment's name, its index files are written.
    fn finish_swap(
        &self,
        replaced: &[crate::clean::SegmentRef],
        swap: &Path,
        meta: &SegMeta,
    ) -> io::Result<()> {
        let storage = self.storage.as_ref();
        let base = meta.base_offset;
        crate::clean::remove_replaced(storage, &self.dir, base, replaced.iter().map(|s| s.base_offset))?;
        storage.rename(swap, &segment_path(&self.dir, base, LOG_SUFFIX))?;
        storage.sync_dir(&self.dir)?;
        let (offsets, times) = meta.index_images();
        write_atomically(storage, &segment_path(&self.dir, base, INDEX_SUFFIX), &offsets)?;
        write_atomically(storage, &segment_path(&self.dir, base, TIME_INDEX_SUFFIX), &times)
    }

    // ------------------------------------------------ retention and deletes

    /// Deletes sealed segments (never the active one), oldest first: those
    /// whose max timestamp is more than `retention_ms` before `now_ms`, then
    /// while the log would still be at least `retention_bytes` without the
    /// oldest segment (Kafka's rules; only under the `delete` cleanup
    /// policy, so a compact-only log is never deleted by age or size), and
    /// those wholly below the log start offset. Segments without timestamps are never deleted by time; a
    /// segment whose seal is not durable yet waits for it.
    /// The whole log counts, oldest first: the segments whose only copy is
    /// in a colder tier, then the local ones.
    pub fn apply_retention(&mut self, now_ms: i64) -> io::Result<RetentionOutcome> {
        self.apply_retention_below(now_ms, i64::MAX)
    }

    /// [`PartitionLog::apply_retention`], deleting no segment that ends
    /// past `ceiling` (in a cluster, the committed offset: a segment not
    /// yet committed is not the log's yet).
    pub fn apply_retention_below(&mut self, now_ms: i64, ceiling: i64) -> io::Result<RetentionOutcome> {
        self.check_writable()?;
        self.prune_graveyard();
        let (candidates, cold_count, total, below_start) = {
            let st = self.view.state.read();
            // (size, max timestamp) of every deletable segment, oldest first.
            let local = st.segments[..st.segments.len() - 1]
                .iter()
                .take_while(|s| s.durable && s.next_offset <= ceiling);
            let candidates: Vec<(u64, i64)> = st
                .cold()
                .map(|t| (t.size_bytes, t.max_timestamp_ms))
                .chain(local.clone().map(|s| (s.size_bytes, s.indexer.max_timestamp_ms)))
                .collect();
            let below_start = st
                .cold()
                .take_while(|t| t.next_offset <= st.log_start_offset)
                .count()
                + local.take_while(|s| s.next_offset <= st.log_start_offset).count();
            let total = st.segments.iter().map(|s| s.size_bytes).sum::<u64>()
                + st.cold().map(|t| t.size_bytes).sum::<u64>();
            (candidates, st.cold().count(), total, below_start)
        };
        let mut count = 0;
        let delete = self.config.cleanup.delete;
        if delete && self.config.retention_ms >= 0 {
            count = candidates
                .iter()
                .take_while(|(_, ts)| *ts >= 0 && now_ms.saturating_sub(*ts) > self.config.retention_ms)
                .count();
        }
        if delete && self.config.retention_bytes >= 0 {
            let mut excess = total as i64 - self.config.retention_bytes;
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
        let count = count.max(below_start);
        let cold_deleted = count.min(cold_count);
        let mut deleted_bytes = self.retire_cold(cold_deleted)?;
        deleted_bytes += self.delete_oldest(count - cold_deleted)?;
        Ok(RetentionOutcome {
            deleted_segments: count,
            deleted_bytes,
            log_start_offset: self.log_start_offset(),
        })
    }

    /// Marks the `count` oldest cold segments for deletion from their tier
    /// and advances the log start past them.
    fn retire_cold(&mut self, count: usize) -> io::Result<u64> {
        if count == 0 {
            return Ok(0);
        }
        let mut tiered = self.view.tiered_segments();
        let mut bytes = 0;
        for t in tiered.iter_mut().filter(|t| t.is_cold()).take(count) {
            t.state = TierState::Deleting;
            bytes += t.size_bytes;
        }
        self.publish_manifest(tiered)?;
        self.view.state.write().advance_start_to_first_readable();
        Ok(bytes)
    }

    /// Writes the manifest, then publishes it.
    fn publish_manifest(&mut self, tiered: Vec<TieredSegment>) -> io::Result<()> {
        let written = write_manifest(self.storage.as_ref(), &self.dir, &tiered);
        self.durably(written)?;
        self.view.state.write().tiered = tiered;
        Ok(())
    }

    /// Deletes up to `count` oldest local segments (only sealed, durable
    /// ones) and advances the log start.
    fn delete_oldest(&mut self, count: usize) -> io::Result<u64> {
        let end = {
            let st = self.view.state.read();
            let deletable = st.segments[..st.segments.len() - 1]
                .iter()
                .take_while(|s| s.durable)
                .count();
            let count = count.min(deletable);
            if count == 0 {
                return Ok(0);
            }
            st.segments[count].base_offset
        };
        // Colder copies of these segments (being made or made) go too; the
        // manifest says so before the local files go.
        let mut tiered = self.view.tiered_segments();
        let mut manifest_changed = false;
        for t in tiered.iter_mut().filter(|t| t.next_offset <= end) {
            if matches!(t.state, TierState::Copying | TierState::Both) {
                t.state = TierState::Deleting;
                manifest_changed = true;
            }
        }
        if manifest_changed {
            self.publish_manifest(tiered)?;
        }
        let removed: Vec<SegMeta> = {
            let mut st = self.view.state.write();
            let n = st.segments.iter().take_while(|s| s.base_offset < end).count();
            let removed = st.segments.drain(..n).collect();
            st.advance_start_to_first_readable();
            removed
        };
        let mut deleted_bytes = 0;
        for segment in removed {
            deleted_bytes += segment.size_bytes;
            self.bury(&segment);
            segment::delete_files(self.storage.as_ref(), &self.dir, segment.base_offset)?;
        }
        Ok(deleted_bytes)
    }

    /// Closes the files of deleted segments whose delay is over, so their
    /// space is freed (retention runs call it too).
    fn prune_graveyard(&mut self) {
        let now = std::time::Instant::now();
        self.graveyard.retain(|(until, _)| *until > now);
    }

    /// Keeps a segment's file open for `file_delete_delay_ms` after its
    /// deletion, and closes the files whose time is up. Best effort: a
    /// file that cannot be opened is just deleted (a read planned before
    /// then finds it gone: `NotFound`).
    fn bury(&mut self, segment: &SegMeta) {
        self.prune_graveyard();
        let now = std::time::Instant::now();
        let delay = std::time::Duration::from_millis(self.config.file_delete_delay_ms);
        if delay.is_zero() {
            return;
        }
        let file = segment
            .file
            .if_open()
            .map(Ok)
            .unwrap_or_else(|| segment.file.open());
        if let Ok(file) = file {
            self.graveyard.push((now + delay, file));
        }
    }

    /// DeleteRecords: makes `offset` the log start offset (persisted) and
    /// deletes the sealed segments wholly below it (those whose seal is not
    /// durable yet go at a later retention pass). No-op if not an advance.
    pub fn delete_records_before(&mut self, offset: i64) -> Result<(), DeleteRecordsError> {
        self.check_writable()?;
        if !self.config.cleanup.delete {
            return Err(DeleteRecordsError::PolicyViolation);
        }
        let log_end = self.log_end_offset();
        if offset > log_end {
            return Err(DeleteRecordsError::OffsetOutOfRange { offset, log_end });
        }
        if offset <= self.log_start_offset() {
            return Ok(());
        }
        let written = write_offset_file(
            self.storage.as_ref(),
            &self.dir.join(LOG_START_OFFSET_FILE),
            offset,
        );
        self.durably(written)?;
        let (cold_below, local_below) = {
            let mut st = self.view.state.write();
            st.log_start_offset = offset;
            let cold_below = st.cold().take_while(|t| t.next_offset <= offset).count();
            let local_below = st
                .segments
                .windows(2)
                .take_while(|p| p[1].base_offset <= offset)
                .count();
            (cold_below, local_below)
        };
        self.retire_cold(cold_below)?;
        self.delete_oldest(local_below)?;
        Ok(())
    }

    /// Removes every batch whose last offset is >= `offset` (a batch that
    /// straddles `offset` goes too, so the new log end offset can be below
    /// `offset`). Below the log start offset, empties the log and restarts it
    /// at `offset`. The only way offsets move backwards.
    pub fn truncate_to(&mut self, offset: i64) -> io::Result<()> {
        self.check_writable()?;
        if offset >= self.log_end_offset() {
            return Ok(());
        }
        // Queued seals name segments this may remove.
        self.sealer.run_pending()?;
        let (start, first_base) = {
            let st = self.view.state.read();
            (st.log_start_offset, st.segments[0].base_offset)
        };
        if offset < start || offset < first_base {
            // Offsets only in a colder tier cannot be cut there: start over.
            return self.truncate_fully_and_start_at(offset);
        }
        // Colder copies of what is cut (made or being made) hold data the
        // log no longer has: they go, before the local files change.
        let mut tiered = self.view.tiered_segments();
        let mut stale = false;
        for t in tiered.iter_mut().filter(|t| t.next_offset > offset) {
            if matches!(t.state, TierState::Copying | TierState::Both) {
                t.state = TierState::Deleting;
                stale = true;
            }
        }
        if stale {
            self.publish_manifest(tiered)?;
        }
        let popped: Vec<SegMeta> = {
            let mut st = self.view.state.write();
            let keep = st.segments.partition_point(|s| s.base_offset <= offset).max(1);
            st.segments.drain(keep..).collect()
        };
        let reactivate = !popped.is_empty();
        for s in &popped {
            self.bury(s);
            segment::delete_files(self.storage.as_ref(), &self.dir, s.base_offset)?;
        }
        if reactivate {
            self.reactivate_last()?;
        }
        self.cut_active(offset)?;
        let cut = self.log_end_offset();
        self.view
            .state
            .write()
            .active_mut()
            .aborted
            .retain(|e| e.last_offset < cut);
        let log_end = self.log_end_offset();
        self.flushed_offset = self.flushed_offset.min(log_end);
        self.sealer.lower_durable(log_end);
        let base = self.view.state.read().active().base_offset;
        let written = write_offset_file(self.storage.as_ref(), &self.dir.join(RECOVERY_POINT_FILE), base);
        self.durably(written)?;
        if self.log_start_offset() > log_end {
            // A batch straddling the log start was cut; persist the lower
            // start so a reopen does not clamp it back up later.
            let path = self.dir.join(LOG_START_OFFSET_FILE);
            let written = write_offset_file(self.storage.as_ref(), &path, log_end);
            self.durably(written)?;
            self.view.state.write().log_start_offset = log_end;
        }
        Ok(())
    }

    /// Makes the last (sealed) segment the active one again, after the
    /// segments after it were cut: a write handle, pinned, and its index
    /// files gone (they are written again at its next seal or close).
    fn reactivate_last(&mut self) -> io::Result<()> {
        let base = self.view.state.read().active().base_offset;
        let path = segment_path(&self.dir, base, LOG_SUFFIX);
        let handle = self.storage.open(&path, OpenMode::Write)?;
        for suffix in [INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
            remove_if_exists(self.storage.as_ref(), &segment_path(&self.dir, base, suffix))?;
        }
        let pinned = segment::SegmentFile::pinned(Arc::clone(&self.storage), path, Arc::clone(&handle));
        {
            let mut st = self.view.state.write();
            let a = st.active_mut();
            a.file = Arc::new(pinned);
            a.durable = false;
        }
        self.active = handle;
        Ok(())
    }

    /// Cuts the active segment at the batch holding `offset`, rebuilds its
    /// indexes and publishes it.
    fn cut_active(&mut self, offset: i64) -> io::Result<()> {
        let interval = self.config.index_interval_bytes;
        let mut meta = {
            let st = self.view.state.read();
            let a = st.active();
            let mut copy = SegMeta {
                base_offset: a.base_offset,
                file: Arc::clone(&a.file),
                size_bytes: a.size_bytes,
                next_offset: a.next_offset,
                offset_index: a.offset_index.clone(),
                time_index: Vec::new(),
                indexer: a.indexer,
                first_batch_max_timestamp_ms: None,
                created_ms: a.created_ms,
                damage: None,
                durable: false,
                aborted: a.aborted.clone(),
            };
            copy.time_index.clone_from(&a.time_index);
            copy
        };
        let start = u64::from(crate::index::lookup_position(
            &meta.offset_index,
            offset - meta.base_offset,
        ));
        let cut = segment::cut_position(self.active.as_ref(), &meta, start, offset)?;
        self.active.set_len(cut)?;
        self.active.sync_data()?;
        meta.size_bytes = cut;
        segment::reindex(&mut meta, self.active.as_ref(), interval)?;
        let mut st = self.view.state.write();
        *st.active_mut() = meta;
        Ok(())
    }

    fn truncate_fully_and_start_at(&mut self, offset: i64) -> io::Result<()> {
        let mut tiered = self.view.tiered_segments();
        for t in tiered.iter_mut() {
            t.state = TierState::Deleting;
        }
        self.start_over(offset, offset, tiered)
    }

    /// Empties the local log and starts it again at `offset`, with `cold`
    /// as its cold segments (copies another writer of the partition made
    /// in a colder tier, following one another up to `offset`) and its
    /// start at `start` (at or past `offset` when there are none): a
    /// partition whose log is rebuilt from the object store. This log's own copies are deleted from their tiers, except
    /// those `cold` names.
    pub fn restart_at(&mut self, start: i64, offset: i64, cold: Vec<TieredSegment>) -> io::Result<()> {
        self.check_writable()?;
        let follows = cold.windows(2).all(|w| w[0].next_offset == w[1].base_offset);
        // Without cold segments the log may start inside its first batch
        // (a DeleteRecords offset).
        let ends = cold.last().map_or(offset, |c| c.next_offset);
        let starts_in = cold.first().map_or(start >= offset, |c| c.base_offset <= start);
        if !follows || ends != offset || !starts_in {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cold segments that do not run from {start} to {offset}"),
            ));
        }
        self.sealer.run_pending()?;
        let mut tiered: Vec<TieredSegment> = self
            .view
            .tiered_segments()
            .into_iter()
            .filter(|t| !cold.iter().any(|c| c.object == t.object))
            .map(|mut t| {
                t.state = TierState::Deleting;
                t
            })
            .collect();
        tiered.extend(cold.into_iter().map(|mut c| {
            c.state = TierState::Cold;
            c
        }));
        tiered.sort_by_key(|t| t.base_offset);
        self.start_over(start, offset, tiered)
    }

    /// Replaces the manifest with `tiered`, then every local segment with
    /// an empty one at `offset`, the log starting at `start`.
    fn start_over(&mut self, start: i64, offset: i64, tiered: Vec<TieredSegment>) -> io::Result<()> {
        // A cleaning pass begun on the old log neither writes files into
        // the new one nor a checkpoint: its fence is retired first (the
        // pass ends `Skip::Retired`).
        self.dir_fence.retire();
        self.dir_fence = Arc::default();
        self.publish_manifest(tiered)?;
        let (meta, handle) = segment::create(&self.storage, &self.dir, offset, None)?;
        let old: Vec<SegMeta> = {
            let mut st = self.view.state.write();
            let old = std::mem::replace(&mut st.segments, vec![meta]);
            st.log_start_offset = start;
            old
        };
        self.active = handle;
        for s in old.iter().filter(|s| s.base_offset != offset) {
            self.bury(s);
            segment::delete_files(self.storage.as_ref(), &self.dir, s.base_offset)?;
        }
        // Producer state describes batches that are gone: an empty log has
        // none (Kafka's producer state truncates fully too).
        for snapshot in list_snapshots(self.storage.as_ref(), &self.dir)? {
            remove_if_exists(self.storage.as_ref(), &snapshot_path(&self.dir, snapshot))?;
        }
        self.producer_snapshot = None;
        // So does the cleaner's: none of the records it called clean are
        // here (those replayed into the log next never were deduplicated).
        remove_if_exists(
            self.storage.as_ref(),
            &self.dir.join(crate::clean::CLEANER_CHECKPOINT_FILE),
        )?;
        self.storage.sync_dir(&self.dir)?;
        let storage = Arc::clone(&self.storage);
        let written = write_offset_file(storage.as_ref(), &self.dir.join(LOG_START_OFFSET_FILE), start)
            .and_then(|()| write_offset_file(storage.as_ref(), &self.dir.join(RECOVERY_POINT_FILE), offset));
        self.durably(written)?;
        self.sealer.lower_durable(offset);
        self.flushed_offset = offset;
        self.unflushed_messages = 0;
        self.first_unflushed_append_ms = None;
        Ok(())
    }

    /// Flushes, writes the active segment's index files (like Kafka's
    /// `LogSegment.close`), moves the recovery point to the log end and
    /// writes the clean-shutdown marker, so the next open skips recovery.
    /// An append after `close` removes the marker again.
    pub fn close(&mut self) -> io::Result<()> {
        self.close_with(None)
    }

    /// [`PartitionLog::close`], writing a producer-state snapshot at the
    /// log end before the clean-shutdown marker, once what it covers is
    /// durable: the seals and the active segment's `.txnindex` come first,
    /// because start-up replays only the batches after the newest
    /// snapshot, and an abort below it whose entry was still in memory
    /// would be lost after a crash.
    pub fn close_with_producer_snapshot(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.close_with(Some(bytes))
    }

    fn close_with(&mut self, producer_snapshot: Option<&[u8]>) -> io::Result<()> {
        self.flush()?;
        let (base, index, time_index, aborted, log_end) = {
            let st = self.view.state.read();
            let a = st.active();
            let (index, time_index) = a.index_images();
            (a.base_offset, index, time_index, a.aborted.clone(), a.next_offset)
        };
        let storage = Arc::clone(&self.storage);
        let storage = storage.as_ref();
        let written = write_atomically(storage, &segment_path(&self.dir, base, INDEX_SUFFIX), &index)
            .and_then(|()| {
                let path = segment_path(&self.dir, base, TIME_INDEX_SUFFIX);
                write_atomically(storage, &path, &time_index)
            })
            .and_then(|()| crate::txnindex::write(storage, &self.dir, base, &aborted))
            .and_then(|()| match producer_snapshot {
                Some(bytes) => write_snapshot(
                    storage,
                    &self.dir,
                    log_end,
                    bytes,
                    self.sealer.snapshots_kept_after(),
                ),
                None => Ok(()),
            })
            .and_then(|()| write_offset_file(storage, &self.dir.join(RECOVERY_POINT_FILE), log_end))
            .and_then(|()| write_atomically(storage, &self.dir.join(CLEAN_SHUTDOWN_FILE), b""));
        self.durably(written)?;
        self.closed = true;
        Ok(())
    }

    /// Fences the log and renames its directory to
    /// `<name>.<unique>-delete` beside it (Kafka's name for a log being
    /// deleted), made durable in the parent. Nothing of this log touches
    /// the old path afterwards (its queued seals are dropped, and a
    /// cleaning pass in progress is refused from then on), so a new log may
    /// be created there at once.
    /// Returns the new path, to remove with [`remove_retired`], and the
    /// colder copies, which the caller deletes from their tiers.
    pub fn retire(self, unique: &str) -> io::Result<(PathBuf, Vec<TieredSegment>)> {
        self.rename_away(&format!("{unique}-delete"))
    }

    /// Fences the log as [`PartitionLog::retire`] does, but renames its
    /// directory to `<name>.<unique>-stray` (Kafka's name for a log no
    /// topic owns): kept, never deleted by Keel.
    pub fn set_aside(self, unique: &str) -> io::Result<PathBuf> {
        self.rename_away(&format!("{unique}-stray")).map(|(dir, _)| dir)
    }

    fn rename_away(self, suffix: &str) -> io::Result<(PathBuf, Vec<TieredSegment>)> {
        self.sealer.fence();
        self.dir_fence.retire();
        let tiered = self.view.tiered_segments();
        let name = self
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let retired = self.dir.with_file_name(format!("{name}.{suffix}"));
        let storage = Arc::clone(&self.storage);
        let dir = self.dir.clone();
        drop(self);
        storage.rename(&dir, &retired)?;
        sync_parent(storage.as_ref(), &dir)?;
        Ok((retired, tiered))
    }

    /// Removes the partition directory and everything in it. Returns the
    /// colder copies, which the caller deletes from their tiers.
    pub fn delete(self) -> io::Result<Vec<TieredSegment>> {
        let storage = Arc::clone(&self.storage);
        let (retired, tiered) = self.retire("0")?;
        remove_retired(storage.as_ref(), &retired)?;
        Ok(tiered)
    }

    // ------------------------------------------------------------- tiers

    /// Sealed, durable local segments without a colder copy (made or being
    /// made), oldest first: what the mover copies next.
    /// Keeps every producer-state snapshot above `offset` from now on (at
    /// least the newest two are always kept; `i64::MAX`: only those).
    pub fn keep_snapshots_after(&self, offset: i64) {
        self.sealer.keep_snapshots_after(offset);
    }

    /// Keeps the producer-state snapshots of the segments without a colder
    /// copy (from the oldest sealed one, or the active one): a mover that
    /// puts each segment's snapshot beside its copy in the object store
    /// finds every one it needs, however far behind the log it is.
    pub fn keep_snapshots_of_uncopied(&self) {
        let st = self.view.state.read();
        let oldest = st
            .segments
            .iter()
            .find(|s| !has_colder_copy(&st.tiered, s))
            .map(|s| s.base_offset);
        self.sealer
            .keep_snapshots_after(oldest.unwrap_or_else(|| self.log_end_offset() - 1));
    }

    pub fn copy_candidates(&self) -> Vec<SealedSegment> {
        let st = self.view.state.read();
        st.segments[..st.segments.len() - 1]
            .iter()
            .take_while(|s| s.durable)
            .filter(|s| !has_colder_copy(&st.tiered, s) && !s.is_empty() && s.damage.is_none())
            .map(SegMeta::sealed_segment)
            .collect()
    }

    /// Records, durably, that `segment` is being copied to `tier` as
    /// `object`. The copy itself is the caller's, outside any lock.
    pub fn begin_copy(
        &mut self,
        segment: &SealedSegment,
        tier: Tier,
        object: String,
    ) -> io::Result<TieredSegment> {
        self.check_writable()?;
        let mut tiered = {
            let st = self.view.state.read();
            let sealed = &st.segments[..st.segments.len() - 1];
            if !sealed.iter().any(|s| s.base_offset == segment.base_offset) {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no sealed local segment at {}", segment.base_offset),
                ));
            }
            if !crate::tiered::valid_object_name(&object) || st.tiered.iter().any(|t| t.object == object) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("bad or reused object name {object:?}"),
                ));
            }
            st.tiered.clone()
        };
        let entry = segment.tiered(tier, TierState::Copying, object);
        tiered.push(entry.clone());
        tiered.sort_by_key(|t| t.base_offset);
        self.publish_manifest(tiered)?;
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
        let mut tiered = self.view.tiered_segments();
        let before = tiered.len();
        tiered.retain(|t| !(t.object == object && t.state == TierState::Deleting));
        if tiered.len() != before {
            self.publish_manifest(tiered)?;
        }
        Ok(())
    }

    fn set_state(&mut self, object: &str, from: TierState, to: TierState) -> io::Result<bool> {
        self.check_writable()?;
        let mut tiered = self.view.tiered_segments();
        let Some(t) = tiered.iter_mut().find(|t| t.object == object && t.state == from) else {
            return Ok(false);
        };
        t.state = to;
        self.publish_manifest(tiered)?;
        Ok(true)
    }

    /// Gives up the colder tier `tier`, as Kafka does when a topic's remote
    /// storage is turned off with `remote.log.delete.on.disable=true`:
    /// offsets held only there are deleted (the log start offset moves past
    /// them, persisted first), and copies there of segments still held
    /// locally are marked for deletion. The mover deletes both from the
    /// tier. Returns the log start offset.
    pub fn discard_tier(&mut self, tier: Tier) -> io::Result<i64> {
        self.check_writable()?;
        let only_there = {
            let st = self.view.state.read();
            st.cold().filter(|t| t.tier == tier).map(|t| t.next_offset).max()
        };
        if let Some(start) = only_there {
            self.delete_records_before(start).map_err(|e| match e {
                DeleteRecordsError::Io(e) => e,
                other => io::Error::other(other.to_string()),
            })?;
        }
        let mut tiered = self.view.tiered_segments();
        let mut marked = false;
        for t in tiered
            .iter_mut()
            .filter(|t| t.tier == tier && matches!(t.state, TierState::Both | TierState::Copying))
        {
            t.state = TierState::Deleting;
            marked = true;
        }
        if marked {
            self.publish_manifest(tiered)?;
        }
        Ok(self.log_start_offset())
    }

    /// Colder copies waiting to be deleted from their tier, but those the
    /// cleaner replaced less than `file.delete.delay.ms` ago.
    pub fn pending_deletes(&self) -> Vec<TieredSegment> {
        let now = Instant::now();
        let kept = |t: &TieredSegment| {
            self.replaced_cold
                .iter()
                .any(|(until, object)| *until > now && *object == t.object)
        };
        self.view
            .tiered_segments()
            .into_iter()
            .filter(|t| t.state == TierState::Deleting && !kept(t))
            .collect()
    }

    /// The oldest local segment, if it is sealed and has a verified colder
    /// copy, so its local files may go: `(base offset, bytes, max timestamp)`.
    pub fn oldest_releasable(&self) -> Option<(i64, u64, i64)> {
        let st = self.view.state.read();
        if st.segments.len() < 2 {
            return None;
        }
        let s = &st.segments[0];
        let copied = st
            .tiered
            .iter()
            .any(|t| t.base_offset == s.base_offset && t.state == TierState::Both);
        copied.then_some((s.base_offset, s.size_bytes, s.indexer.max_timestamp_ms))
    }

    /// The local segments that may go, oldest first, in the order they
    /// would: the sealed ones from the oldest on that have a verified
    /// colder copy, up to the first that has none, and no more once they
    /// add up to `up_to_bytes`. Each as `(base offset, next segment's base
    /// offset, bytes, max timestamp)`.
    pub fn releasable_segments(&self, up_to_bytes: u64) -> Vec<(i64, i64, u64, i64)> {
        let st = self.view.state.read();
        let copied: std::collections::HashSet<i64> = st
            .tiered
            .iter()
            .filter(|t| t.state == TierState::Both)
            .map(|t| t.base_offset)
            .collect();
        let mut total = 0u64;
        st.segments
            .windows(2)
            .map_while(|pair| {
                let (s, next) = (&pair[0], &pair[1]);
                if total >= up_to_bytes || !copied.contains(&s.base_offset) {
                    return None;
                }
                total = total.saturating_add(s.size_bytes);
                Some((
                    s.base_offset,
                    next.base_offset,
                    s.size_bytes,
                    s.indexer.max_timestamp_ms,
                ))
            })
            .collect()
    }

    /// Deletes the local files of the oldest segment (see
    /// [`PartitionLog::oldest_releasable`]); its offsets are read from the
    /// colder tier from now on. Returns the bytes freed locally.
    pub fn release_local(&mut self, base_offset: i64) -> io::Result<u64> {
        self.check_writable()?;
        if self.oldest_releasable().map(|(base, ..)| base) != Some(base_offset) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("segment {base_offset} is not the oldest local segment with a colder copy"),
            ));
        }
        let mut tiered = self.view.tiered_segments();
        let entry = tiered
            .iter_mut()
            .find(|t| t.base_offset == base_offset && t.state == TierState::Both)
            .expect("checked by oldest_releasable");
        entry.state = TierState::Cold;
        let written = write_manifest(self.storage.as_ref(), &self.dir, &tiered);
        self.durably(written)?;
        let segment = {
            let mut st = self.view.state.write();
            st.tiered = tiered;
            st.segments.remove(0)
        };
        self.bury(&segment);
        segment::delete_files(self.storage.as_ref(), &self.dir, base_offset)?;
        Ok(segment.size_bytes)
    }
}

/// Removes a directory [`PartitionLog::retire`] renamed. Blocking.
pub fn remove_retired(storage: &dyn Storage, retired: &Path) -> io::Result<()> {
    match storage.remove_dir_all(retired) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// A sealed local segment the mover may copy: durable, with its index
/// images from memory. Its file stays readable even if retention deletes
/// the segment while it is open.
#[derive(Debug, Clone)]
pub struct SealedSegment {
    pub base_offset: i64,
    pub next_offset: i64,
    pub size_bytes: u64,
    pub max_timestamp_ms: i64,
    pub offset_of_max_timestamp: i64,
    pub log: Arc<segment::SegmentFile>,
    pub index: Bytes,
    pub time_index: Bytes,
    /// Its aborted-transaction index entries (a `.txnindex` image when
    /// copied), oldest first.
    pub aborted: Vec<crate::txnindex::AbortedTxn>,
}

impl SealedSegment {
    /// The manifest entry of this segment's copy `object` in `tier`.
    pub fn tiered(&self, tier: Tier, state: TierState, object: String) -> TieredSegment {
        TieredSegment {
            base_offset: self.base_offset,
            next_offset: self.next_offset,
            size_bytes: self.size_bytes,
            max_timestamp_ms: self.max_timestamp_ms,
            offset_of_max_timestamp: self.offset_of_max_timestamp,
            tier,
            state,
            object,
            aborted: self.aborted.clone(),
        }
    }
}

/// What [`repair_dir`] leaves in a partition directory.
struct Repaired {
    /// The clean-shutdown marker was there (it is removed now).
    clean: bool,
    /// The tier manifest.
    tiered: Vec<TieredSegment>,
    listing: Listing,
    /// Where the segments read from a colder tier end.
    cold_end: Option<i64>,
}

/// Creates `dir` if needed and repairs what a crash may have left in it
/// before its segments are loaded: takes the clean-shutdown marker, rolls
/// back interrupted copies to a colder tier, finishes or undoes the
/// cleaner's interrupted swaps, removes stray files, and deletes the local
/// copies of segments moved to a colder tier.
fn repair_dir(storage: &dyn Storage, dir: &Path) -> io::Result<Repaired> {
    ensure_dir(storage, dir)?;
    let clean = take_clean_marker(storage, dir)?;
    let mut tiered = read_manifest(storage, dir)?;
    let manifest_changed = recover_tier_moves(dir, &mut tiered);
    crate::clean::recover_swaps(storage, dir)?;
    let mut listing = list_dir(storage, dir)?;
    let cold_end = tiered.iter().filter(|t| t.is_cold()).map(|t| t.next_offset).max();
    if let Some(cold_end) = cold_end {
        // A segment whose colder copy became the only one: a crash
        // came between the manifest saying so and its deletion.
        for base in listing.bases.iter().filter(|b| **b < cold_end) {
            tracing::info!(dir = %dir.display(), base, "finishing deletion of a local copy moved to a colder tier");
            segment::delete_files(storage, dir, *base)?;
        }
        listing.bases.retain(|b| *b >= cold_end);
    }
    if manifest_changed {
        write_manifest(storage, dir, &tiered)?;
    }
    Ok(Repaired {
        clean,
        tiered,
        listing,
        cold_end,
    })
}

/// Start-up half of the tier lifecycle: a copy that was being made when the
/// process stopped is rolled back (its remains are deleted by the mover, and
/// the segment is copied again under a new name). Returns whether the
/// manifest changed.
fn recover_tier_moves(dir: &Path, tiered: &mut [TieredSegment]) -> bool {
    let mut changed = false;
    for t in tiered.iter_mut().filter(|t| t.state == TierState::Copying) {
        tracing::info!(dir = %dir.display(), object = %t.object, "rolling back an interrupted copy to the {} tier", t.tier.name());
        t.state = TierState::Deleting;
        changed = true;
    }
    changed
}

/// Checks that `headers` describe `records` and span at most 2^31
/// offsets; returns the offsets they use.
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
    let offsets: i64 = headers.iter().map(|h| i64::from(h.last_offset_delta) + 1).sum();
    if offsets - 1 > i64::from(i32::MAX) {
        return Err(AppendError::OffsetOverflow);
    }
    Ok(offsets)
}

/// Rewrites each batch's base offset; returns the headers as written.
fn assign_offsets(records: &mut [u8], headers: &[BatchHeader], base_offset: i64) -> Vec<BatchHeader> {
    let mut next = base_offset;
    let mut pos = 0;
    let mut assigned = Vec::with_capacity(headers.len());
    for h in headers {
        let len = h.total_len();
        set_base_offset(&mut records[pos..pos + len], next);
        let written = BatchHeader {
            base_offset: next,
            ..*h
        };
        next = written.last_offset() + 1;
        assigned.push(written);
        pos += len;
    }
    assigned
}

/// The segments loaded at open, and whether the first one was created.
struct LoadedSegments {
    segments: Vec<SegMeta>,
    created: bool,
}

/// Loads the segments named by `bases` (sorted), or creates the first one.
/// After an unclean shutdown, every segment from the one holding the
/// recovery point on is recovered (CRC scan, cut at the first invalid
/// batch); a cut deletes every later segment (Kafka's rule: the log has
/// no holes), and what recovery kept is fsynced.
fn load_segments(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    bases: &[i64],
    clean: bool,
    recovery_point: Option<i64>,
    config: &LogConfig,
    fresh_start: Option<i64>,
) -> io::Result<LoadedSegments> {
    let interval = config.index_interval_bytes;
    if bases.is_empty() {
        let (meta, _) = segment::create(storage, dir, fresh_start.unwrap_or(0).max(0), None)?;
        storage.sync_dir(dir)?;
        return Ok(LoadedSegments {
            segments: vec![meta],
            created: true,
        });
    }
    let first_recovered = match (clean, recovery_point) {
        (true, _) => bases.len(),
        (false, None) => 0,
        (false, Some(rp)) => bases.partition_point(|b| *b <= rp).saturating_sub(1),
    };
    let mut segments: Vec<SegMeta> = Vec::with_capacity(bases.len());
    for (i, &base) in bases.iter().enumerate() {
        let last = i + 1 == bases.len();
        let mode = match (i >= first_recovered, last) {
            (true, _) => LoadMode::Recover,
            (false, true) => LoadMode::TrustedLast,
            (false, false) => LoadMode::Trusted,
        };
        let loaded = segment::load(storage, dir, base, mode, interval)?;
        let mut meta = loaded.meta;
        meta.durable = !last && mode != LoadMode::Recover;
        if loaded.rebuilt && meta.durable {
            // Missing or corrupt index files: write back what was rebuilt.
            let (index, time_index) = meta.index_images();
            write_atomically(storage.as_ref(), &segment_path(dir, base, INDEX_SUFFIX), &index)?;
            write_atomically(
                storage.as_ref(),
                &segment_path(dir, base, TIME_INDEX_SUFFIX),
                &time_index,
            )?;
        }
        segments.push(meta);
        // A recovered segment that ends short of the next one lost its tail
        // (at a batch boundary, so nothing looked torn): the log has no
        // holes, so what follows goes too. Keel's segments start where the
        // previous one ended.
        let hole = mode == LoadMode::Recover && !last && meta_end(&segments) < bases[i + 1];
        if (loaded.truncated || hole) && !last {
            for later in &bases[i + 1..] {
                tracing::warn!(dir = %dir.display(), base = later, "deleting a segment after a recovered cut");
                segment::delete_files(storage.as_ref(), dir, *later)?;
            }
            break;
        }
    }
    if first_recovered < segments.len() {
        make_recovered_durable(storage.as_ref(), dir, &mut segments[first_recovered..])?;
    }
    Ok(LoadedSegments {
        segments,
        created: false,
    })
}

/// One past the last offset of the last loaded segment.
fn meta_end(segments: &[SegMeta]) -> i64 {
    segments.last().map_or(0, |s| s.next_offset)
}

/// fsyncs what recovery kept, and writes the index files of the recovered
/// segments that are sealed: from now on they are below the recovery point.
fn make_recovered_durable(storage: &dyn Storage, dir: &Path, recovered: &mut [SegMeta]) -> io::Result<()> {
    let n = recovered.len();
    for (i, s) in recovered.iter_mut().enumerate() {
        let file = storage.open(&segment_path(dir, s.base_offset, LOG_SUFFIX), OpenMode::Write)?;
        file.sync_data()?;
        if i + 1 < n {
            s.add_final_time_entry();
            let (index, time_index) = s.index_images();
            write_atomically(storage, &segment_path(dir, s.base_offset, INDEX_SUFFIX), &index)?;
            write_atomically(
                storage,
                &segment_path(dir, s.base_offset, TIME_INDEX_SUFFIX),
                &time_index,
            )?;
            crate::txnindex::write(storage, dir, s.base_offset, &s.aborted)?;
            s.durable = true;
        }
    }
    storage.sync_dir(dir)
}

/// Creates `dir` if missing, durably (its entry in the parent is fsynced).
fn ensure_dir(storage: &dyn Storage, dir: &Path) -> io::Result<()> {
    match storage.read_dir(dir) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            storage.create_dir_all(dir)?;
            sync_parent(storage, dir)
        }
        Err(e) => Err(e),
    }
}

/// Base offsets of the `.log` files in `dir` and of the snapshots, sorted;
/// removes stray temp files and index files without a `.log`.
fn list_dir(storage: &dyn Storage, dir: &Path) -> io::Result<Listing> {
    let mut bases = Vec::new();
    let mut snapshots = Vec::new();
    let mut orphans = Vec::new();
    for entry in storage.read_dir(dir)? {
        let name = entry.name;
        let path = dir.join(&name);
        if entry.is_dir {
            continue;
        }
        if STRAY_SUFFIXES.iter().any(|s| name.ends_with(s)) {
            tracing::warn!(file = %path.display(), "removing stray file");
            remove_if_exists(storage, &path)?;
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
            SNAPSHOT_SUFFIX => snapshots.push(base),
            INDEX_SUFFIX | TIME_INDEX_SUFFIX | TXN_INDEX_SUFFIX => orphans.push((base, path)),
            _ => {}
        }
    }
    bases.sort_unstable();
    snapshots.sort_unstable();
    for (base, path) in orphans {
        if bases.binary_search(&base).is_err() {
            tracing::warn!(file = %path.display(), "removing index without a log");
            remove_if_exists(storage, &path)?;
        }
    }
    Ok(Listing { bases, snapshots })
}

/// Offsets of the producer-state snapshots in `dir`.
pub(crate) fn list_snapshots(storage: &dyn Storage, dir: &Path) -> io::Result<Vec<i64>> {
    Ok(storage
        .read_dir(dir)?
        .into_iter()
        .filter_map(|e| {
            let (stem, ext) = e.name.split_once('.')?;
            (ext == SNAPSHOT_SUFFIX)
                .then(|| parse_base_offset(stem))
                .flatten()
        })
        .collect())
}

/// The newest snapshot at or below `log_end`; snapshots above it describe
/// data recovery cut, and are deleted.
fn newest_snapshot(
    storage: &dyn Storage,
    dir: &Path,
    snapshots: &[i64],
    log_end: i64,
) -> io::Result<Option<(i64, Vec<u8>)>> {
    for &offset in snapshots.iter().filter(|o| **o > log_end) {
        tracing::info!(dir = %dir.display(), offset, "removing a producer snapshot above the log end");
        remove_if_exists(storage, &snapshot_path(dir, offset))?;
    }
    for &offset in snapshots.iter().rev().filter(|o| **o <= log_end) {
        if let Some(bytes) = read_file(storage, &snapshot_path(dir, offset))? {
            return Ok(Some((offset, bytes)));
        }
    }
    Ok(None)
}

/// Kafka's file stem: exactly 20 decimal digits.
fn parse_base_offset(stem: &str) -> Option<i64> {
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok()
}

/// Removes the clean-shutdown marker; returns whether it was there.
fn take_clean_marker(storage: &dyn Storage, dir: &Path) -> io::Result<bool> {
    let path = dir.join(CLEAN_SHUTDOWN_FILE);
    let present = storage.file_len(&path)?.is_some();
    if present {
        storage.remove_file(&path)?;
        storage.sync_dir(dir)?;
    }
    Ok(present)
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
                let read = plan.execute_scan().unwrap();
                assert_eq!(read.bytes, cold.execute().unwrap(), "same data either way");
                served += read.bytes.len() as u64;
                offset = read.hint.as_ref().unwrap().next_offset();
                hint = read.hint;
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
