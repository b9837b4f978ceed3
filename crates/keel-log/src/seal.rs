//! [`Sealer`]: the work a roll leaves behind, done off the append path.
//!
//! When the active segment rolls, its `.index` and `.timeindex` still have
//! to be written and the segment fsynced. Appends do not wait for that: the
//! roll queues the work here and a background thread runs it
//! ([`Sealer::run_pending`]), in roll order, without any lock the writer
//! or readers need. After each sealed segment is durable, the partition's
//! recovery point file moves to its end, so a start-up after power loss
//! recovers only the segments after it. Producer-state snapshots the
//! caller queues are written here too.
//!
//! A failed fsync here makes the log untrusted (the page cache may hold
//! data the disk lost): the sealer remembers it and the writer refuses
//! further appends. Any other failure (no descriptor left, a full disk)
//! leaves the work queued for the next run. A fenced sealer (the partition
//! is being deleted) does nothing more in its directory.

use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::segment::{segment_path, INDEX_SUFFIX, TIME_INDEX_SUFFIX};
use crate::storage::{remove_if_exists, write_atomically, Storage, StoredFile};
use crate::view::LogReader;

/// The recovery point: "0\n<offset>\n" (version, value). Every segment
/// below the one holding it was fsynced with its indexes.
pub const RECOVERY_POINT_FILE: &str = "recovery-point";
pub(crate) const OFFSET_FILE_VERSION: &str = "0";
/// Producer-state snapshots: `<offset, 20 digits>.snapshot`.
pub(crate) const SNAPSHOT_SUFFIX: &str = "snapshot";
/// Snapshots kept per partition (the newest).
const SNAPSHOTS_KEPT: usize = 2;

pub(crate) enum SealWork {
    Segment {
        base_offset: i64,
        next_offset: i64,
        handle: Arc<dyn StoredFile>,
        index: Vec<u8>,
        time_index: Vec<u8>,
        aborted: Vec<crate::txnindex::AbortedTxn>,
    },
    Snapshot {
        offset: i64,
        bytes: Vec<u8>,
    },
}

#[derive(Default)]
struct SealIo {
    fenced: bool,
}

/// The seal queue of one partition log, shared with background threads.
pub struct Sealer {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    view: LogReader,
    queue: Mutex<VecDeque<SealWork>>,
    /// Held across the queued work's I/O: serializes runs, and fencing
    /// waits for a run in progress. Only blocking threads wait on it, and
    /// never the writer's appends (they only read `failed`).
    io: Mutex<SealIo>,
    /// Why the log is untrusted, once an fsync failed. Its own lock, held
    /// for in-memory work only.
    failed: Mutex<Option<String>>,
    /// Everything below this offset is durable through seals.
    durable_offset: AtomicI64,
    /// Files were created in the directory since it was last fsynced.
    dir_dirty: AtomicBool,
    /// Producer snapshots above this offset are kept however many there
    /// are: copies of the segments ending there are still to be made, each
    /// with its snapshot ([`crate::PartitionLog::keep_snapshots_after`]).
    keep_snapshots_after: AtomicI64,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer")
            .field("dir", &self.dir)
            .field("pending", &self.queue.lock().len())
            .finish()
    }
}

impl Sealer {
    pub(crate) fn new(storage: Arc<dyn Storage>, dir: &Path, view: LogReader, durable_offset: i64) -> Sealer {
        Sealer {
            storage,
            dir: dir.to_path_buf(),
            view,
            queue: Mutex::new(VecDeque::new()),
            io: Mutex::new(SealIo::default()),
            failed: Mutex::new(None),
            durable_offset: AtomicI64::new(durable_offset),
            dir_dirty: AtomicBool::new(false),
            keep_snapshots_after: AtomicI64::new(i64::MAX),
        }
    }

    pub(crate) fn push(&self, work: SealWork) {
        self.queue.lock().push_back(work);
    }

    /// True if work is queued.
    pub fn has_pending(&self) -> bool {
        !self.queue.lock().is_empty()
    }

    pub(crate) fn durable_offset(&self) -> i64 {
        self.durable_offset.load(Ordering::Acquire)
    }

    pub(crate) fn keep_snapshots_after(&self, offset: i64) {
        self.keep_snapshots_after.store(offset, Ordering::Release);
    }

    pub(crate) fn snapshots_kept_after(&self) -> i64 {
        self.keep_snapshots_after.load(Ordering::Acquire)
    }

    pub(crate) fn note_dir_dirty(&self) {
        self.dir_dirty.store(true, Ordering::Release);
    }

    pub(crate) fn take_dir_dirty(&self) -> bool {
        self.dir_dirty.swap(false, Ordering::AcqRel)
    }

    /// Why the log is untrusted, if a seal's I/O failed.
    pub fn failure(&self) -> Option<String> {
        self.failed.lock().clone()
    }

    pub(crate) fn set_failed(&self, why: String) {
        self.failed.lock().get_or_insert(why);
    }

    /// Truncation took the log below what seals made durable.
    pub(crate) fn lower_durable(&self, offset: i64) {
        self.durable_offset.fetch_min(offset, Ordering::AcqRel);
    }

    /// Stops all further work in the directory; waits for a run in
    /// progress. Queued work is dropped.
    pub fn fence(&self) {
        let mut io = self.io.lock();
        io.fenced = true;
        self.queue.lock().clear();
    }

    /// Does the queued work, oldest first. Blocking. Returns how many items
    /// it did. After an error, [`Sealer::failure`] says whether the log is
    /// no longer trusted (a failed fsync); otherwise the work stays queued
    /// for the next run.
    pub fn run_pending(&self) -> io::Result<usize> {
        let io = self.io.lock();
        if io.fenced {
            return Ok(0);
        }
        if let Some(why) = self.failure() {
            return Err(io::Error::other(format!("the log is offline: {why}")));
        }
        let mut done = 0;
        loop {
            let Some(work) = self.queue.lock().pop_front() else {
                return Ok(done);
            };
            match self.run(&work) {
                Ok(()) => done += 1,
                Err(SealError::Sync(e)) => {
                    self.set_failed(e.to_string());
                    tracing::error!(dir = %self.dir.display(), error = %e, "an fsync of a seal failed; the log goes offline");
                    return Err(e);
                }
                Err(SealError::Other(e)) => {
                    tracing::warn!(dir = %self.dir.display(), error = %e, "a seal failed; it will be retried");
                    self.queue.lock().push_front(work);
                    return Err(e);
                }
            }
        }
    }

    fn run(&self, work: &SealWork) -> Result<(), SealError> {
        let storage = self.storage.as_ref();
        match work {
            SealWork::Segment {
                base_offset,
                next_offset,
                handle,
                index,
                time_index,
                aborted,
            } => {
                let (base_offset, next_offset) = (*base_offset, *next_offset);
                // A segment retention already removed needs nothing more.
                let present = self
                    .view
                    .state
                    .read()
                    .segments
                    .iter()
                    .any(|s| s.base_offset == base_offset);
                if !present {
                    return Ok(());
                }
                // The directory fsyncs of these atomic writes also make the
                // segment files created since the last one durable.
                self.dir_dirty.store(false, Ordering::Release);
                handle.sync_data().map_err(SealError::Sync)?;
                // Every page of the sealed file is clean now, so this drops
                // them all. Reads of sealed segments bypass the page cache,
                // and a drop pass before this fsync skips pages still dirty
                // or under writeback: on a slow disk they would stay.
                handle.drop_cache();
                let index_path = segment_path(&self.dir, base_offset, INDEX_SUFFIX);
                write_atomically(storage, &index_path, index).map_err(classify)?;
                let time_path = segment_path(&self.dir, base_offset, TIME_INDEX_SUFFIX);
                write_atomically(storage, &time_path, time_index).map_err(classify)?;
                crate::txnindex::write(storage, &self.dir, base_offset, aborted).map_err(classify)?;
                let point = self.dir.join(RECOVERY_POINT_FILE);
                write_offset_file(storage, &point, next_offset).map_err(classify)?;
                let mut st = self.view.state.write();
                if let Some(s) = st.segments.iter_mut().find(|s| s.base_offset == base_offset) {
                    s.durable = true;
                    s.file.unpin();
                }
                drop(st);
                self.durable_offset.fetch_max(next_offset, Ordering::AcqRel);
                Ok(())
            }
            SealWork::Snapshot { offset, bytes } => {
                write_snapshot(storage, &self.dir, *offset, bytes, self.snapshots_kept_after())
                    .map_err(classify)
            }
        }
    }
}

/// Why a seal failed: an fsync (the log can no longer be trusted) or
/// anything else (retried).
enum SealError {
    Sync(io::Error),
    Other(io::Error),
}

/// An atomic write fails in its fsyncs (file or directory) or elsewhere;
/// only the storage knows which, so the errors of the fsync steps say so.
fn classify(e: io::Error) -> SealError {
    if crate::storage::is_sync_error(&e) {
        SealError::Sync(e)
    } else {
        SealError::Other(e)
    }
}

/// Writes an offset file ("0\n<offset>\n") atomically.
pub(crate) fn write_offset_file(storage: &dyn Storage, path: &Path, offset: i64) -> io::Result<()> {
    let text = format!("{OFFSET_FILE_VERSION}\n{offset}\n");
    write_atomically(storage, path, text.as_bytes())
}

/// Reads an offset file; `None` if missing or unreadable (with a warning).
pub(crate) fn read_offset_file(storage: &dyn Storage, path: &Path) -> io::Result<Option<i64>> {
    let Some(bytes) = crate::storage::read_file(storage, path)? else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(&bytes);
    let mut lines = text.lines();
    let parsed = match (lines.next(), lines.next()) {
        (Some(OFFSET_FILE_VERSION), Some(value)) => value.trim().parse::<i64>().ok(),
        _ => None,
    };
    if parsed.is_none() {
        tracing::warn!(file = %path.display(), "ignoring an unreadable offset file");
    }
    Ok(parsed.filter(|v| *v >= 0))
}

pub(crate) fn snapshot_path(dir: &Path, offset: i64) -> PathBuf {
    dir.join(format!("{offset:020}.{SNAPSHOT_SUFFIX}"))
}

/// Writes a snapshot atomically, then removes the others but the newest
/// few and those above `keep_after` (still to be copied beside their
/// segments).
pub(crate) fn write_snapshot(
    storage: &dyn Storage,
    dir: &Path,
    offset: i64,
    bytes: &[u8],
    keep_after: i64,
) -> io::Result<()> {
    write_atomically(storage, &snapshot_path(dir, offset), bytes)?;
    let mut offsets = crate::partition::list_snapshots(storage, dir)?;
    offsets.sort_unstable();
    let excess = offsets.len().saturating_sub(SNAPSHOTS_KEPT);
    for old in offsets[..excess].iter().filter(|o| **o <= keep_after) {
        remove_if_exists(storage, &snapshot_path(dir, *old))?;
    }
    Ok(())
}
