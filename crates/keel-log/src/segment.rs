//! One segment: a `.log` file of record batches, its offset and time
//! indexes (kept in memory, written to `.index` / `.timeindex` when the
//! segment is sealed and at clean close), and how a segment is loaded or
//! recovered at start-up.
//!
//! Invariants (asserted where cheap):
//! * `size_bytes` is the committed length of the `.log`: every byte below it
//!   was written completely and belongs to a whole batch.
//! * batches have strictly increasing offsets, all `>= base_offset`, and
//!   `next_offset` is one past the last batch's last offset (`base_offset`
//!   when empty).
//! * a sealed segment's index files, once its seal is durable, equal the
//!   in-memory entries.

// Loading reads bytes from disk: bad bytes are errors or damage, never panics.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::batch::{check_crc, BatchHeader, BATCH_HEADER_LEN};
use crate::index::{
    decode_offset_index, decode_time_index, BatchMeta, Indexer, OffsetEntry, TimeEntry, OFFSET_ENTRY_LEN,
    TIME_ENTRY_LEN,
};
use crate::storage::{read_exact_at, remove_if_exists, OpenMode, Storage, StoredFile};

pub(crate) const LOG_SUFFIX: &str = "log";
pub(crate) const INDEX_SUFFIX: &str = "index";
pub(crate) const TIME_INDEX_SUFFIX: &str = "timeindex";
/// Kafka's aborted-transaction index (see [`crate::txnindex`]).
pub(crate) const TXN_INDEX_SUFFIX: &str = "txnindex";

/// `dir/<20-digit base offset>.<suffix>`, Kafka's naming.
pub(crate) fn segment_path(dir: &Path, base_offset: i64, suffix: &str) -> PathBuf {
    dir.join(format!("{base_offset:020}.{suffix}"))
}

/// A segment's `.log` file: `dir/<20-digit base offset>.log`.
pub fn log_path(dir: &Path, base_offset: i64) -> PathBuf {
    segment_path(dir, base_offset, LOG_SUFFIX)
}

/// A segment's `.log`, opened when used. The active segment pins its
/// handle (it is written); a sealed segment's descriptor stays open only
/// while a read or a copy holds it, so a broker with many partitions keeps
/// one descriptor per partition, not one per segment.
pub struct SegmentFile {
    storage: Arc<dyn Storage>,
    path: PathBuf,
    handles: Mutex<Handles>,
}

#[derive(Default)]
struct Handles {
    pinned: Option<Arc<dyn StoredFile>>,
    shared: Option<Weak<dyn StoredFile>>,
}

impl std::fmt::Debug for SegmentFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentFile").field("path", &self.path).finish()
    }
}

impl SegmentFile {
    pub(crate) fn new(storage: Arc<dyn Storage>, path: PathBuf) -> SegmentFile {
        SegmentFile {
            storage,
            path,
            handles: Mutex::new(Handles::default()),
        }
    }

    pub(crate) fn pinned(
        storage: Arc<dyn Storage>,
        path: PathBuf,
        handle: Arc<dyn StoredFile>,
    ) -> SegmentFile {
        let file = SegmentFile::new(storage, path);
        file.handles.lock().pinned = Some(handle);
        file
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open file: the pinned or a shared handle, or a new read-only
    /// one. Does I/O (an `open`) when none is open: call it where blocking
    /// is fine. The lock is not held across the `open`.
    pub fn open(&self) -> io::Result<Arc<dyn StoredFile>> {
        {
            let h = self.handles.lock();
            if let Some(p) = &h.pinned {
                return Ok(Arc::clone(p));
            }
            if let Some(f) = h.shared.as_ref().and_then(Weak::upgrade) {
                return Ok(f);
            }
        }
        let opened = self.storage.open(&self.path, OpenMode::Read)?;
        let mut h = self.handles.lock();
        if let Some(f) = h.shared.as_ref().and_then(Weak::upgrade) {
            return Ok(f);
        }
        h.shared = Some(Arc::downgrade(&opened));
        Ok(opened)
    }

    /// Keeps `handle` open for as long as this file lives: reads planned
    /// on it keep reading these bytes after the path names another file
    /// (a cleaned segment swapped in under the same name).
    pub(crate) fn pin(&self, handle: Arc<dyn StoredFile>) {
        self.handles.lock().pinned = Some(handle);
    }

    /// The open file if one is, without opening it.
    pub(crate) fn if_open(&self) -> Option<Arc<dyn StoredFile>> {
        let h = self.handles.lock();
        h.pinned
            .clone()
            .or_else(|| h.shared.as_ref().and_then(Weak::upgrade))
    }

    /// The segment is sealed and durable: keep its descriptor only while
    /// someone reads it.
    pub(crate) fn unpin(&self) {
        let mut h = self.handles.lock();
        if let Some(p) = h.pinned.take() {
            h.shared = Some(Arc::downgrade(&p));
        }
    }
}

/// Invalid data found inside a segment that recovery may not cut (it lies
/// below the recovery point, so it was durable once): reads stop there
/// with an error instead of serving it or skipping past it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    pub valid_bytes: u64,
    pub reason: String,
}

/// A segment as the partition's view holds it: everything reads need, in
/// memory.
#[derive(Debug)]
pub(crate) struct SegMeta {
    pub base_offset: i64,
    pub file: Arc<SegmentFile>,
    pub size_bytes: u64,
    pub next_offset: i64,
    pub offset_index: Vec<OffsetEntry>,
    pub time_index: Vec<TimeEntry>,
    pub indexer: Indexer,
    /// Max timestamp of the first batch: the reference for `segment.ms`.
    pub first_batch_max_timestamp_ms: Option<i64>,
    /// Caller clock when this process created the segment, if it did.
    pub created_ms: Option<i64>,
    pub damage: Option<Damage>,
    /// Sealed, its index files written and everything fsynced.
    pub durable: bool,
    /// The transactions aborted by markers in this segment (its
    /// `.txnindex`), in marker order.
    pub aborted: Vec<crate::txnindex::AbortedTxn>,
}

impl SegMeta {
    fn empty(base_offset: i64, file: Arc<SegmentFile>) -> SegMeta {
        SegMeta {
            base_offset,
            file,
            size_bytes: 0,
            next_offset: base_offset,
            offset_index: Vec::new(),
            time_index: Vec::new(),
            indexer: Indexer::new(base_offset),
            first_batch_max_timestamp_ms: None,
            created_ms: None,
            damage: None,
            durable: false,
            aborted: Vec::new(),
        }
    }

    /// A cleaned segment about to replace sealed ones: durable already.
    pub(crate) fn cleaned(base_offset: i64, file: Arc<SegmentFile>) -> SegMeta {
        let mut meta = SegMeta::empty(base_offset, file);
        meta.durable = true;
        meta
    }

    pub fn is_empty(&self) -> bool {
        self.size_bytes == 0
    }

    /// The index images as Kafka's files hold them, with the final time
    /// entry a seal adds (Kafka's `onBecomeInactiveSegment`).
    pub fn index_images(&self) -> (Vec<u8>, Vec<u8>) {
        let offsets: Vec<u8> = self.offset_index.iter().flat_map(|e| e.encode()).collect();
        let final_entry = self
            .indexer
            .time_entry_if_newer(self.base_offset, self.time_index.last().copied());
        let times: Vec<u8> = self
            .time_index
            .iter()
            .chain(final_entry.as_ref())
            .flat_map(|e| e.encode())
            .collect();
        (offsets, times)
    }

    /// What the mover copies of this sealed segment: its log file and its
    /// index images.
    pub fn sealed_segment(&self) -> crate::SealedSegment {
        let (index, time_index) = self.index_images();
        crate::SealedSegment {
            base_offset: self.base_offset,
            next_offset: self.next_offset,
            size_bytes: self.size_bytes,
            max_timestamp_ms: self.indexer.max_timestamp_ms,
            offset_of_max_timestamp: self.indexer.offset_of_max_timestamp,
            log: Arc::clone(&self.file),
            index: bytes::Bytes::from(index),
            time_index: bytes::Bytes::from(time_index),
            aborted: self.aborted.clone(),
        }
    }

    /// Adds the final time entry to the in-memory index (at seal).
    pub fn add_final_time_entry(&mut self) {
        let entry = self
            .indexer
            .time_entry_if_newer(self.base_offset, self.time_index.last().copied());
        self.time_index.extend(entry);
    }
}

/// Creates an empty `.log` for a new active segment (replacing a leftover
/// of the same name) and returns it with its write handle. On failure
/// nothing is left behind.
pub(crate) fn create(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    base_offset: i64,
    now_ms: Option<i64>,
) -> io::Result<(SegMeta, Arc<dyn StoredFile>)> {
    let path = segment_path(dir, base_offset, LOG_SUFFIX);
    let handle = match storage.open(&path, OpenMode::Create) {
        Ok(h) => h,
        Err(e) => {
            let _ = remove_if_exists(storage.as_ref(), &path);
            return Err(e);
        }
    };
    // Stale index files of an earlier segment at this base would be
    // trusted at the next clean open.
    for suffix in [INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
        if let Err(e) = remove_if_exists(storage.as_ref(), &segment_path(dir, base_offset, suffix)) {
            drop(handle);
            let _ = remove_if_exists(storage.as_ref(), &path);
            return Err(e);
        }
    }
    let file = Arc::new(SegmentFile::pinned(
        Arc::clone(storage),
        path,
        Arc::clone(&handle),
    ));
    let mut meta = SegMeta::empty(base_offset, file);
    meta.created_ms = now_ms;
    Ok((meta, handle))
}

/// How to load a segment found at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoadMode {
    /// Below the recovery point (or after a clean shutdown): use the index
    /// files if they pass the sanity checks, otherwise rebuild them from
    /// the batch headers. Invalid data is reported as damage, never cut.
    Trusted,
    /// The last segment after a clean shutdown: like `Trusted`, but a torn
    /// tail is cut (a clean shutdown left none, so it is debris).
    TrustedLast,
    /// At or above the recovery point after an unclean shutdown: check
    /// every batch's CRC, cut at the first invalid one, rebuild the indexes.
    Recover,
}

/// A loaded segment and whether recovery cut its tail.
pub(crate) struct Loaded {
    pub meta: SegMeta,
    pub truncated: bool,
    /// The indexes were rebuilt from the log (the files were missing,
    /// corrupt, or not trusted).
    pub rebuilt: bool,
}

/// Result of scanning batch headers through a segment.
struct Scan {
    valid_bytes: u64,
    /// Why the scan stopped before the end, if it did.
    stop: Option<String>,
}

/// Loads the segment at `base_offset` in `dir`.
pub(crate) fn load(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    base_offset: i64,
    mode: LoadMode,
    interval_bytes: u64,
) -> io::Result<Loaded> {
    let path = segment_path(dir, base_offset, LOG_SUFFIX);
    let handle = storage.open(&path, OpenMode::Read)?;
    let file = Arc::new(SegmentFile::new(Arc::clone(storage), path));
    let mut meta = SegMeta::empty(base_offset, file);
    meta.size_bytes = handle.len()?;
    let mut truncated = false;
    let trusted =
        mode != LoadMode::Recover && load_indexes(storage.as_ref(), dir, &mut meta, handle.as_ref())?;
    if !trusted {
        let verify_crc = mode == LoadMode::Recover;
        let scan = rebuild(&mut meta, handle.as_ref(), interval_bytes, verify_crc)?;
        if let Some(why) = scan.stop {
            let cut = mode != LoadMode::Trusted;
            let path = segment_path(dir, base_offset, LOG_SUFFIX);
            if cut {
                tracing::warn!(
                    segment = %path.display(), why, valid_bytes = scan.valid_bytes,
                    truncated_bytes = meta.size_bytes - scan.valid_bytes,
                    "truncating the log after the last valid batch"
                );
                let w = storage.open(&path, OpenMode::Write)?;
                w.set_len(scan.valid_bytes)?;
                w.sync_data()?;
                meta.size_bytes = scan.valid_bytes;
                truncated = true;
            } else {
                tracing::error!(
                    segment = %path.display(), why, valid_bytes = scan.valid_bytes,
                    size_bytes = meta.size_bytes,
                    "invalid data inside a segment below the recovery point: reads of its offsets \
                     from this position fail; the rest of the log is served"
                );
                meta.damage = Some(Damage {
                    valid_bytes: scan.valid_bytes,
                    reason: why,
                });
            }
        }
    }
    let valid_end = meta.damage.as_ref().map_or(meta.size_bytes, |d| d.valid_bytes);
    meta.aborted = crate::txnindex::read(storage.as_ref(), dir, base_offset)?;
    // A recovery cut takes the aborts whose markers it cut with it.
    meta.aborted.retain(|e| e.last_offset < meta.next_offset);
    meta.first_batch_max_timestamp_ms = match read_header_at(handle.as_ref(), 0, valid_end) {
        Ok(h) => h.map(|h| h.max_timestamp),
        Err(e) if e.kind() == io::ErrorKind::InvalidData => None,
        Err(e) => return Err(e),
    };
    Ok(Loaded {
        meta,
        truncated,
        rebuilt: !trusted,
    })
}

/// Trusts the index files if they pass the sanity checks, then scans the
/// tail after the last offset-index entry for the next offset and max
/// timestamp. Returns false if anything is off (the caller rebuilds).
fn load_indexes(
    storage: &dyn Storage,
    dir: &Path,
    meta: &mut SegMeta,
    file: &dyn StoredFile,
) -> io::Result<bool> {
    let base = meta.base_offset;
    // More entries than batches can fit in the log means garbage; checking
    // first also bounds what is read into memory.
    let max_entries = meta.size_bytes / BATCH_HEADER_LEN as u64 + 1;
    let offset_bytes = read_if_small(
        storage,
        &segment_path(dir, base, INDEX_SUFFIX),
        max_entries * OFFSET_ENTRY_LEN as u64,
    )?;
    let time_bytes = read_if_small(
        storage,
        &segment_path(dir, base, TIME_INDEX_SUFFIX),
        max_entries * TIME_ENTRY_LEN as u64,
    )?;
    let (Some(offset_bytes), Some(time_bytes)) = (offset_bytes, time_bytes) else {
        tracing::warn!(segment = %meta.file.path().display(), "index missing or oversized; rebuilding");
        return Ok(false);
    };
    let decoded = decode_offset_index(&offset_bytes, meta.size_bytes)
        .and_then(|o| decode_time_index(&time_bytes).map(|t| (o, t)));
    let (offset_index, time_index) = match decoded {
        Ok(pair) => pair,
        Err(why) => {
            tracing::warn!(segment = %meta.file.path().display(), why, "index corrupt; rebuilding");
            return Ok(false);
        }
    };
    let start = offset_index.last().map_or(0, |e| u64::from(e.position));
    let expected_first = offset_index.last().map(|e| base + i64::from(e.relative_offset));
    let mut indexer = Indexer::new(base);
    if let Some(last) = time_index.last() {
        indexer.max_timestamp_ms = last.timestamp_ms;
        indexer.offset_of_max_timestamp = base + i64::from(last.relative_offset);
    }
    let mut next_offset = base;
    let mut first_last_offset = None;
    let scan = scan_batches(file, base, start, meta.size_bytes, false, |h, _| {
        first_last_offset.get_or_insert(h.last_offset());
        next_offset = h.last_offset() + 1;
        if h.max_timestamp > indexer.max_timestamp_ms {
            indexer.max_timestamp_ms = h.max_timestamp;
            indexer.offset_of_max_timestamp = h.last_offset();
        }
    })?;
    if let Some(why) = scan.stop {
        tracing::warn!(segment = %meta.file.path().display(), %why, "segment tail invalid; rebuilding");
        return Ok(false);
    }
    if expected_first.is_some() && expected_first != first_last_offset {
        tracing::warn!(segment = %meta.file.path().display(), "last index entry does not match the log; rebuilding");
        return Ok(false);
    }
    if offset_index.is_empty() && next_offset == base && meta.size_bytes > 0 {
        return Ok(false);
    }
    meta.offset_index = offset_index;
    meta.time_index = time_index;
    meta.indexer = indexer;
    meta.next_offset = next_offset;
    Ok(true)
}

/// Rebuilds the in-memory indexes by scanning batch headers (Kafka's
/// `LogSegment.recover`); with `verify_crc`, also checks every batch's
/// CRC. Returns where and why the scan stopped, if early.
fn rebuild(
    meta: &mut SegMeta,
    file: &dyn StoredFile,
    interval_bytes: u64,
    verify_crc: bool,
) -> io::Result<Scan> {
    let base = meta.base_offset;
    let mut indexer = Indexer::new(base);
    let mut offset_index = Vec::new();
    let mut time_index: Vec<TimeEntry> = Vec::new();
    let mut next_offset = base;
    let scan = scan_batches(file, base, 0, meta.size_bytes, verify_crc, |h, pos| {
        let (o, t) = indexer.on_batch(
            batch_meta(h, pos),
            base,
            interval_bytes,
            time_index.last().copied(),
        );
        offset_index.extend(o);
        time_index.extend(t);
        next_offset = h.last_offset() + 1;
    })?;
    meta.offset_index = offset_index;
    meta.time_index = time_index;
    meta.indexer = indexer;
    meta.next_offset = next_offset;
    Ok(scan)
}

/// The index entry data of one batch. Positions fit in u32: segments are
/// capped at `i32::MAX` bytes (the log rolls before), and loading stops
/// scanning at that size.
pub(crate) fn batch_meta(h: &BatchHeader, position: u64) -> BatchMeta {
    BatchMeta {
        last_offset: h.last_offset(),
        max_timestamp_ms: h.max_timestamp,
        position: u32::try_from(position).unwrap_or(u32::MAX),
        size_bytes: h.total_len() as u32,
    }
}

/// Walks batches from `from` to `end`, calling `visit(header, position)` for
/// each valid one. Stops at the first invalid batch: bad header, a batch
/// running past `end`, offsets not increasing or outside the segment's int32
/// range, a position past what Kafka's index can address, or (with
/// `verify_crc`) a CRC mismatch.
fn scan_batches(
    file: &dyn StoredFile,
    base_offset: i64,
    from: u64,
    end: u64,
    verify_crc: bool,
    mut visit: impl FnMut(&BatchHeader, u64),
) -> io::Result<Scan> {
    let mut pos = from;
    let mut prev_last_offset = base_offset - 1;
    let mut body = Vec::new();
    while pos < end {
        let stop = |why: String| {
            Ok(Scan {
                valid_bytes: pos,
                stop: Some(why),
            })
        };
        if pos > i32::MAX as u64 {
            return stop(format!("position {pos} beyond what an index can address"));
        }
        let header = match read_header_at(file, pos, end) {
            Ok(Some(h)) => h,
            Ok(None) => break,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => return stop(e.to_string()),
            Err(e) => return Err(e),
        };
        if header.base_offset <= prev_last_offset {
            return stop(format!("offset {} not increasing", header.base_offset));
        }
        if header.last_offset() - base_offset > i64::from(i32::MAX) {
            return stop(format!(
                "offset {} beyond the segment range",
                header.last_offset()
            ));
        }
        if verify_crc {
            body.resize(header.total_len(), 0);
            read_exact_at(file, &mut body, pos)?;
            if let Err(e) = check_crc(&body, &header) {
                return stop(e.to_string());
            }
        }
        visit(&header, pos);
        prev_last_offset = header.last_offset();
        pos += header.total_len() as u64;
    }
    Ok(Scan {
        valid_bytes: pos,
        stop: None,
    })
}

/// Reads and parses the batch header at `pos`. `None` at `end`; an
/// `InvalidData` error if the bytes there are not a whole batch before `end`.
pub(crate) fn read_header_at(file: &dyn StoredFile, pos: u64, end: u64) -> io::Result<Option<BatchHeader>> {
    if pos >= end {
        return Ok(None);
    }
    if end - pos < BATCH_HEADER_LEN as u64 {
        return Err(invalid_data(format!("partial batch header at {pos}")));
    }
    let mut buf = [0u8; BATCH_HEADER_LEN];
    match read_exact_at(file, &mut buf, pos) {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            return Err(invalid_data(format!(
                "file ends inside the batch header at {pos}"
            )))
        }
        other => other?,
    }
    let header = BatchHeader::parse(&buf).map_err(|e| invalid_data(format!("at {pos}: {e}")))?;
    if header.total_len() as u64 > end - pos {
        return Err(invalid_data(format!("batch at {pos} runs past the end")));
    }
    Ok(Some(header))
}

pub(crate) fn invalid_data(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// The file's bytes, or `None` if it is missing or longer than `max_len`.
fn read_if_small(storage: &dyn Storage, path: &Path, max_len: u64) -> io::Result<Option<Vec<u8>>> {
    match storage.file_len(path)? {
        None => Ok(None),
        Some(len) if len > max_len => Ok(None),
        Some(_) => crate::storage::read_file(storage, path),
    }
}

/// Deletes the files of the segment at `base_offset` in `dir`, those that
/// exist. Open handles keep reading an unlinked `.log`.
pub(crate) fn delete_files(storage: &dyn Storage, dir: &Path, base_offset: i64) -> io::Result<()> {
    for suffix in [LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX] {
        remove_if_exists(storage, &segment_path(dir, base_offset, suffix))?;
    }
    Ok(())
}

/// Cuts a segment at the batch holding `offset`: the position of the
/// first batch whose last offset is >= `offset`, scanning from `start`.
pub(crate) fn cut_position(
    file: &dyn StoredFile,
    meta: &SegMeta,
    start: u64,
    offset: i64,
) -> io::Result<u64> {
    let mut cut = meta.size_bytes;
    let mut found = false;
    scan_batches(file, meta.base_offset, start, meta.size_bytes, false, |h, pos| {
        if !found && h.last_offset() >= offset {
            cut = pos;
            found = true;
        }
    })?;
    Ok(cut)
}

/// Rebuilds a segment's in-memory indexes from its file (after a cut).
pub(crate) fn reindex(meta: &mut SegMeta, file: &dyn StoredFile, interval_bytes: u64) -> io::Result<()> {
    let scan = rebuild(meta, file, interval_bytes, false)?;
    if let Some(why) = scan.stop {
        return Err(invalid_data(format!(
            "reindexing {}: {why}",
            meta.file.path().display()
        )));
    }
    meta.first_batch_max_timestamp_ms = read_header_at(file, 0, meta.size_bytes)?.map(|h| h.max_timestamp);
    Ok(())
}
