//! One segment: a `.log` file of record batches plus its `.index` and
//! `.timeindex`, with the indexes mirrored in memory.
//!
//! Invariants (asserted where cheap):
//! * `size_bytes` is the committed length of the `.log`: every byte below it
//!   was written completely and belongs to a whole batch.
//! * batches have strictly increasing offsets, all `>= base_offset`, and
//!   `next_offset` is one past the last batch's last offset (`base_offset`
//!   when empty).
//! * index entries on disk equal the in-memory entries.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::batch::{check_crc, BatchHeader, BATCH_HEADER_LEN};
use crate::index::{
    decode_offset_index, decode_time_index, lookup_position, BatchMeta, Indexer, OffsetEntry, TimeEntry,
    OFFSET_ENTRY_LEN, TIME_ENTRY_LEN,
};

pub(crate) const LOG_SUFFIX: &str = "log";
pub(crate) const INDEX_SUFFIX: &str = "index";
pub(crate) const TIME_INDEX_SUFFIX: &str = "timeindex";

/// `dir/<20-digit base offset>.<suffix>`, Kafka's naming.
pub(crate) fn segment_path(dir: &Path, base_offset: i64, suffix: &str) -> PathBuf {
    dir.join(format!("{base_offset:020}.{suffix}"))
}

/// Write handles of the active segment. Appends use `O_APPEND`, so after a
/// failed write is truncated away the next write lands at the right place.
struct ActiveFiles {
    log: File,
    offset_index: File,
    time_index: File,
}

/// Decoded `.index` and `.timeindex` entries.
type Indexes = (Vec<OffsetEntry>, Vec<TimeEntry>);

/// How much to trust a segment's files when loading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoadMode {
    /// A sealed segment: use the indexes if they pass the sanity checks,
    /// otherwise rebuild them; never truncate.
    Sealed,
    /// The last segment after a clean shutdown: like `Sealed`, but a torn
    /// tail found on the way is truncated.
    LastClean,
    /// The last segment after an unclean shutdown: check every batch's CRC,
    /// truncate at the first bad one, rebuild the indexes.
    LastRecover,
}

pub(crate) struct Segment {
    pub base_offset: i64,
    dir: PathBuf,
    /// Shared with read plans, which keep a deleted segment readable.
    pub reader: Arc<File>,
    active: Option<ActiveFiles>,
    pub size_bytes: u64,
    pub next_offset: i64,
    pub offset_index: Vec<OffsetEntry>,
    pub time_index: Vec<TimeEntry>,
    pub indexer: Indexer,
    /// Max timestamp of the first batch: the reference for `segment.ms`.
    pub first_batch_max_timestamp_ms: Option<i64>,
    /// Caller clock when this process created the segment, if it did.
    pub created_ms: Option<i64>,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("base_offset", &self.base_offset)
            .field("size_bytes", &self.size_bytes)
            .field("next_offset", &self.next_offset)
            .finish()
    }
}

/// What one append did to the segment.
pub(crate) struct SegmentAppend {
    pub position: u64,
}

/// Result of scanning batch headers through a segment.
struct Scan {
    valid_bytes: u64,
    /// Why the scan stopped before the end, if it did.
    stop: Option<String>,
}

impl Segment {
    /// Creates empty files for a new active segment (replacing leftovers).
    pub fn create(dir: &Path, base_offset: i64, now_ms: Option<i64>) -> io::Result<Segment> {
        for suffix in [LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
            File::create(segment_path(dir, base_offset, suffix))?;
        }
        let reader = Arc::new(File::open(segment_path(dir, base_offset, LOG_SUFFIX))?);
        let mut segment = Segment {
            base_offset,
            dir: dir.to_path_buf(),
            reader,
            active: None,
            size_bytes: 0,
            next_offset: base_offset,
            offset_index: Vec::new(),
            time_index: Vec::new(),
            indexer: Indexer::new(base_offset),
            first_batch_max_timestamp_ms: None,
            created_ms: now_ms,
        };
        segment.activate()?;
        Ok(segment)
    }

    /// Loads an existing segment, repairing its indexes (and, in `Recover`
    /// mode, its tail) as needed.
    pub fn load(dir: &Path, base_offset: i64, mode: LoadMode, interval_bytes: u64) -> io::Result<Segment> {
        let reader = Arc::new(File::open(segment_path(dir, base_offset, LOG_SUFFIX))?);
        let size_bytes = reader.metadata()?.len();
        let mut segment = Segment {
            base_offset,
            dir: dir.to_path_buf(),
            reader,
            active: None,
            size_bytes,
            next_offset: base_offset,
            offset_index: Vec::new(),
            time_index: Vec::new(),
            indexer: Indexer::new(base_offset),
            first_batch_max_timestamp_ms: None,
            created_ms: None,
        };
        let trusted = mode != LoadMode::LastRecover && segment.load_trusted()?;
        if !trusted {
            let verify_crc = mode == LoadMode::LastRecover;
            segment.rebuild(interval_bytes, verify_crc, mode != LoadMode::Sealed)?;
        }
        // Not `size_bytes`: a rebuild may have cut the log.
        segment.first_batch_max_timestamp_ms =
            read_header_at(&segment.reader, 0, segment.size_bytes)?.map(|h| h.max_timestamp);
        Ok(segment)
    }

    pub fn path(&self, suffix: &str) -> PathBuf {
        segment_path(&self.dir, self.base_offset, suffix)
    }

    pub fn is_empty(&self) -> bool {
        self.size_bytes == 0
    }

    /// Opens the write handles; the segment becomes appendable.
    pub fn activate(&mut self) -> io::Result<()> {
        if self.active.is_some() {
            return Ok(());
        }
        let open = |suffix| OpenOptions::new().append(true).open(self.path(suffix));
        self.active = Some(ActiveFiles {
            log: open(LOG_SUFFIX)?,
            offset_index: open(INDEX_SUFFIX)?,
            time_index: open(TIME_INDEX_SUFFIX)?,
        });
        Ok(())
    }

    /// Kafka's `onBecomeInactiveSegment`: record the final max timestamp in
    /// the time index, then drop the write handles.
    pub fn seal(&mut self) -> io::Result<()> {
        self.append_final_time_entry()?;
        self.active = None;
        Ok(())
    }

    /// Appends the segment's max timestamp to the time index if it is newer
    /// than the last entry (done at roll and at clean close, like Kafka).
    pub fn append_final_time_entry(&mut self) -> io::Result<()> {
        let entry = self
            .indexer
            .time_entry_if_newer(self.base_offset, self.time_index.last().copied());
        if let (Some(entry), Some(files)) = (entry, self.active.as_mut()) {
            files.time_index.write_all(&entry.encode())?;
            self.time_index.push(entry);
        }
        Ok(())
    }

    /// Trusts the on-disk indexes if they pass the sanity checks, then scans
    /// the tail after the last offset-index entry for the next offset and max
    /// timestamp. Returns false if anything is off (caller rebuilds).
    fn load_trusted(&mut self) -> io::Result<bool> {
        let Some((offset_index, time_index)) = self.read_indexes()? else {
            return Ok(false);
        };
        let start = offset_index.last().map_or(0, |e| u64::from(e.position));
        let expected_first = offset_index
            .last()
            .map(|e| self.base_offset + i64::from(e.relative_offset));
        let mut indexer = Indexer::new(self.base_offset);
        if let Some(last) = time_index.last() {
            indexer.max_timestamp_ms = last.timestamp_ms;
            indexer.offset_of_max_timestamp = self.base_offset + i64::from(last.relative_offset);
        }
        let mut next_offset = self.base_offset;
        let mut first_last_offset = None;
        let scan = scan_batches(
            &self.reader,
            self.base_offset,
            start,
            self.size_bytes,
            false,
            |h, _| {
                first_last_offset.get_or_insert(h.last_offset());
                next_offset = h.last_offset() + 1;
                if h.max_timestamp > indexer.max_timestamp_ms {
                    indexer.max_timestamp_ms = h.max_timestamp;
                    indexer.offset_of_max_timestamp = h.last_offset();
                }
            },
        )?;
        if let Some(why) = scan.stop {
            tracing::warn!(segment = %self.path(LOG_SUFFIX).display(), %why, "segment tail invalid; rebuilding");
            return Ok(false);
        }
        if expected_first.is_some() && expected_first != first_last_offset {
            tracing::warn!(segment = %self.path(INDEX_SUFFIX).display(), "last index entry does not match the log; rebuilding");
            return Ok(false);
        }
        self.offset_index = offset_index;
        self.time_index = time_index;
        self.indexer = indexer;
        self.next_offset = next_offset;
        Ok(true)
    }

    /// Reads and checks both index files; `None` if either needs a rebuild.
    fn read_indexes(&self) -> io::Result<Option<Indexes>> {
        // More entries than batches can fit in the log means garbage; checking
        // first also bounds what we read into memory.
        let max_entries = self.size_bytes / BATCH_HEADER_LEN as u64 + 1;
        let offset_bytes = read_if_small(&self.path(INDEX_SUFFIX), max_entries * OFFSET_ENTRY_LEN as u64)?;
        let time_bytes = read_if_small(&self.path(TIME_INDEX_SUFFIX), max_entries * TIME_ENTRY_LEN as u64)?;
        let (Some(offset_bytes), Some(time_bytes)) = (offset_bytes, time_bytes) else {
            tracing::warn!(segment = %self.path(LOG_SUFFIX).display(), "index missing or oversized; rebuilding");
            return Ok(None);
        };
        let decoded = decode_offset_index(&offset_bytes, self.size_bytes)
            .and_then(|o| decode_time_index(&time_bytes).map(|t| (o, t)));
        match decoded {
            Ok(pair) => Ok(Some(pair)),
            Err(why) => {
                tracing::warn!(segment = %self.path(LOG_SUFFIX).display(), why, "index corrupt; rebuilding");
                Ok(None)
            }
        }
    }

    /// Rebuilds the indexes by scanning batch headers (Kafka's
    /// `LogSegment.recover`). With `verify_crc`, also checks every batch's
    /// CRC; with `truncate`, cuts the `.log` at the first invalid batch.
    fn rebuild(&mut self, interval_bytes: u64, verify_crc: bool, truncate: bool) -> io::Result<()> {
        let base = self.base_offset;
        let mut indexer = Indexer::new(base);
        let mut offset_index = Vec::new();
        let mut time_index: Vec<TimeEntry> = Vec::new();
        let mut next_offset = base;
        let scan = scan_batches(&self.reader, base, 0, self.size_bytes, verify_crc, |h, pos| {
            let meta = batch_meta(h, pos);
            let (o, t) = indexer.on_batch(meta, base, interval_bytes, time_index.last().copied());
            offset_index.extend(o);
            time_index.extend(t);
            next_offset = h.last_offset() + 1;
        })?;
        time_index.extend(indexer.time_entry_if_newer(base, time_index.last().copied()));
        if let Some(why) = scan.stop {
            self.cut_log(scan.valid_bytes, &why, truncate)?;
        }
        self.offset_index = offset_index;
        self.time_index = time_index;
        self.indexer = indexer;
        self.next_offset = next_offset;
        self.write_index_files()
    }

    /// Handles a scan that stopped early: in recovery, truncate the torn
    /// tail; otherwise only index the valid prefix (reads past it will fail).
    fn cut_log(&mut self, valid_bytes: u64, why: &str, truncate: bool) -> io::Result<()> {
        let path = self.path(LOG_SUFFIX);
        if !truncate {
            tracing::warn!(segment = %path.display(), why, valid_bytes, "invalid data inside a sealed segment");
            return Ok(());
        }
        tracing::warn!(
            segment = %path.display(), why, valid_bytes,
            truncated_bytes = self.size_bytes - valid_bytes,
            "truncating log after the last valid batch"
        );
        let file = OpenOptions::new().write(true).open(&path)?;
        file.set_len(valid_bytes)?;
        file.sync_all()?;
        self.size_bytes = valid_bytes;
        Ok(())
    }

    /// Replaces both index files with the in-memory entries, atomically.
    fn write_index_files(&mut self) -> io::Result<()> {
        let offset_bytes: Vec<u8> = self.offset_index.iter().flat_map(|e| e.encode()).collect();
        let time_bytes: Vec<u8> = self.time_index.iter().flat_map(|e| e.encode()).collect();
        write_atomically(&self.path(INDEX_SUFFIX), &offset_bytes)?;
        write_atomically(&self.path(TIME_INDEX_SUFFIX), &time_bytes)?;
        // The old write handles point at the replaced inodes.
        if self.active.take().is_some() {
            self.activate()?;
        }
        Ok(())
    }

    /// Appends batches whose offsets were already assigned. On error the
    /// files are cut back to their old sizes (best effort) and the in-memory
    /// state is unchanged.
    pub fn append(
        &mut self,
        records: &[u8],
        headers: &[BatchHeader],
        interval_bytes: u64,
    ) -> io::Result<SegmentAppend> {
        let position = self.size_bytes;
        let mut indexer = self.indexer;
        let (mut new_offsets, mut new_times) = (Vec::new(), Vec::new());
        let mut pos = position;
        for h in headers {
            let meta = batch_meta(h, pos);
            let last_time = new_times.last().or(self.time_index.last()).copied();
            let (o, t) = indexer.on_batch(meta, self.base_offset, interval_bytes, last_time);
            new_offsets.extend(o);
            new_times.extend(t);
            pos += h.total_len() as u64;
        }
        assert_eq!(pos, position + records.len() as u64, "headers describe records");
        self.write_or_undo(records, &new_offsets, &new_times)?;
        self.size_bytes = pos;
        self.next_offset = headers.last().map_or(self.next_offset, |h| h.last_offset() + 1);
        self.offset_index.extend(new_offsets);
        self.time_index.extend(new_times);
        self.indexer = indexer;
        if self.first_batch_max_timestamp_ms.is_none() {
            self.first_batch_max_timestamp_ms = headers.first().map(|h| h.max_timestamp);
        }
        Ok(SegmentAppend { position })
    }

    fn write_or_undo(
        &mut self,
        records: &[u8],
        offsets: &[OffsetEntry],
        times: &[TimeEntry],
    ) -> io::Result<()> {
        let old_offset_len = (self.offset_index.len() * OFFSET_ENTRY_LEN) as u64;
        let old_time_len = (self.time_index.len() * TIME_ENTRY_LEN) as u64;
        let old_size = self.size_bytes;
        let files = self.active.as_mut().expect("append to an active segment");
        let offset_bytes: Vec<u8> = offsets.iter().flat_map(|e| e.encode()).collect();
        let time_bytes: Vec<u8> = times.iter().flat_map(|e| e.encode()).collect();
        let result = files
            .log
            .write_all(records)
            .and_then(|()| files.offset_index.write_all(&offset_bytes))
            .and_then(|()| files.time_index.write_all(&time_bytes));
        if let Err(e) = result {
            // Never leave the files claiming data the log does not have.
            let _ = files.log.set_len(old_size);
            let _ = files.offset_index.set_len(old_offset_len);
            let _ = files.time_index.set_len(old_time_len);
            return Err(e);
        }
        Ok(())
    }

    /// fsyncs the `.log` and both indexes.
    pub fn sync(&self) -> io::Result<()> {
        match &self.active {
            Some(files) => {
                files.log.sync_data()?;
                files.offset_index.sync_data()?;
                files.time_index.sync_data()
            }
            None => {
                // fsync through any descriptor flushes the file's dirty pages.
                self.reader.sync_data()?;
                File::open(self.path(INDEX_SUFFIX))?.sync_data()?;
                File::open(self.path(TIME_INDEX_SUFFIX))?.sync_data()
            }
        }
    }

    /// Removes every batch whose last offset is >= `offset`, rebuilds the
    /// indexes, and leaves the segment active.
    pub fn truncate_to(&mut self, offset: i64, interval_bytes: u64) -> io::Result<()> {
        let start = u64::from(lookup_position(&self.offset_index, offset - self.base_offset));
        let mut cut = self.size_bytes;
        let mut found = false;
        scan_batches(
            &self.reader,
            self.base_offset,
            start,
            self.size_bytes,
            false,
            |h, pos| {
                if !found && h.last_offset() >= offset {
                    cut = pos;
                    found = true;
                }
            },
        )?;
        let file = OpenOptions::new().write(true).open(self.path(LOG_SUFFIX))?;
        file.set_len(cut)?;
        self.size_bytes = cut;
        self.rebuild(interval_bytes, false, true)?;
        self.first_batch_max_timestamp_ms =
            read_header_at(&self.reader, 0, self.size_bytes)?.map(|h| h.max_timestamp);
        self.activate()
    }

    /// Deletes the segment's files. Open read plans keep reading the
    /// unlinked `.log` through their `Arc<File>`.
    pub fn delete_files(&self) -> io::Result<()> {
        Segment::delete_files_of(&self.dir, self.base_offset)
    }

    /// Deletes the files of the segment at `base_offset` in `dir`, those
    /// that exist.
    pub fn delete_files_of(dir: &Path, base_offset: i64) -> io::Result<()> {
        for suffix in [LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
            match fs::remove_file(segment_path(dir, base_offset, suffix)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }
}

fn batch_meta(h: &BatchHeader, position: u64) -> BatchMeta {
    BatchMeta {
        last_offset: h.last_offset(),
        max_timestamp_ms: h.max_timestamp,
        // Segments are capped at i32::MAX bytes (LogConfig::check, roll).
        position: u32::try_from(position).expect("segment position fits in u32"),
        size_bytes: h.total_len() as u32,
    }
}

/// Walks batches from `from` to `end`, calling `visit(header, position)` for
/// each valid one. Stops at the first invalid batch: bad header, a batch
/// running past `end`, offsets not increasing or outside the segment's int32
/// range, or (with `verify_crc`) a CRC mismatch.
fn scan_batches(
    file: &File,
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
            file.read_exact_at(&mut body, pos)?;
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
pub(crate) fn read_header_at(file: &File, pos: u64, end: u64) -> io::Result<Option<BatchHeader>> {
    if pos >= end {
        return Ok(None);
    }
    if end - pos < BATCH_HEADER_LEN as u64 {
        return Err(invalid_data(format!("partial batch header at {pos}")));
    }
    let mut buf = [0u8; BATCH_HEADER_LEN];
    file.read_exact_at(&mut buf, pos)?;
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
fn read_if_small(path: &Path, max_len: u64) -> io::Result<Option<Vec<u8>>> {
    match fs::metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
        Ok(meta) if meta.len() > max_len => Ok(None),
        Ok(_) => fs::read(path).map(Some),
    }
}

/// Temp file + fsync + rename, so a crash leaves the old or the new file.
/// Leftover `.tmp` files are removed by `PartitionLog::open`.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = PathBuf::from(tmp_name);
    let mut file = File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    fs::rename(&tmp, path)
}
