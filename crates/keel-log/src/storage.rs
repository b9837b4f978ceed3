//! The storage seam: every file operation of segments, indexes, manifests,
//! producer-state snapshots and the group log goes through [`Storage`] and
//! the [`StoredFile`]s it opens.
//!
//! [`DiskStorage`] is the real filesystem. [`crate::faults::FaultyStorage`]
//! wraps any storage and injects slow writes, EIO, ENOSPC, EMFILE, short
//! writes and a crash at a chosen step; [`crate::sim::SimStorage`] (with the
//! `testing` feature) is an in-memory filesystem that remembers what was
//! fsynced, so a test can cut the power and see what survives.
//!
//! The seam is narrow on purpose: positional reads and writes, length,
//! fsync, and the few namespace operations the log needs. Kafka semantics
//! live above it.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::num::NonZeroU64;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;

/// How [`Storage::open`] opens a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Read only; the file must exist.
    Read,
    /// Read and write; the file must exist.
    Write,
    /// Read and write; created if missing, emptied if present.
    Create,
}

/// One entry of [`Storage::read_dir`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: String,
    pub is_dir: bool,
    /// When the entry last changed, where the storage keeps the time
    /// (`None`: unknown).
    pub modified: Option<SystemTime>,
}

/// Namespace operations. Paths are absolute or relative to the process's
/// working directory, as `std::fs` takes them.
pub trait Storage: Send + Sync + fmt::Debug + 'static {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn StoredFile>>;
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Atomically replaces `to` if it exists.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    fn remove_dir_all(&self, path: &Path) -> io::Result<()>;
    fn read_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>>;
    /// Makes the directory's entries (creations, renames, unlinks) durable.
    fn sync_dir(&self, path: &Path) -> io::Result<()>;
    /// The file's length, `None` if it does not exist.
    fn file_len(&self, path: &Path) -> io::Result<Option<u64>>;
}

/// An open file.
#[expect(
    clippy::len_without_is_empty,
    reason = "a file's length is an I/O call, not a collection's size"
)]
pub trait StoredFile: Send + Sync + fmt::Debug {
    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize>;
    /// Up to `len` bytes at `pos` (fewer only at the end of the file) that
    /// do not stay in the page cache: O_DIRECT when `direct` and the
    /// filesystem takes it, otherwise a positional read whose pages are
    /// then dropped.
    fn read_uncached(&self, pos: u64, len: u64, direct: bool) -> io::Result<Bytes>;
    fn write_at(&self, buf: &[u8], pos: u64) -> io::Result<usize>;
    fn set_len(&self, len: u64) -> io::Result<()>;
    fn len(&self) -> io::Result<u64>;
    /// fsync of the data (and the size).
    fn sync_data(&self) -> io::Result<()>;
    /// Advice: drop the file's clean pages from the page cache.
    fn drop_cache(&self);
    /// The OS file, where there is one (page-cache residency statistics).
    fn std_file(&self) -> Option<&File> {
        None
    }
}

/// Writes all of `buf` at `pos`, retrying short writes.
pub fn write_all_at(file: &dyn StoredFile, mut buf: &[u8], mut pos: u64) -> io::Result<()> {
    while !buf.is_empty() {
        match file.write_at(buf, pos) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "write returned 0")),
            Ok(n) => {
                buf = &buf[n..];
                pos += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Fills `buf` from `pos`; an `UnexpectedEof` error if the file ends first.
pub fn read_exact_at(file: &dyn StoredFile, mut buf: &mut [u8], mut pos: u64) -> io::Result<()> {
    while !buf.is_empty() {
        match file.read_at(buf, pos) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "file ends early")),
            Ok(n) => {
                buf = &mut buf[n..];
                pos += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The whole file, `None` if it does not exist.
pub fn read_file(storage: &dyn Storage, path: &Path) -> io::Result<Option<Vec<u8>>> {
    let file = match storage.open(path, OpenMode::Read) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let len = usize::try_from(file.len()?).map_err(|_| io::Error::other("file too large"))?;
    let mut buf = vec![0u8; len];
    read_exact_at(file.as_ref(), &mut buf, 0)?;
    Ok(Some(buf))
}

/// Temp file + fsync + rename + fsync of the directory: a crash leaves the
/// old or the new file, and a returned `Ok` means the new one is durable.
/// Leftover `.tmp` files are removed by whoever lists the directory. A
/// failed fsync comes back marked (see [`is_sync_error`]).
pub fn write_atomically(storage: &dyn Storage, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = tmp_path(path);
    let file = storage.open(&tmp, OpenMode::Create)?;
    write_all_at(file.as_ref(), bytes, 0)?;
    file.sync_data().map_err(sync_error)?;
    drop(file);
    storage.rename(&tmp, path)?;
    sync_parent(storage, path).map_err(sync_error)
}

/// Marks an error as a failed fsync: after one the page cache cannot be
/// trusted, unlike after a failed open or write.
fn sync_error(e: io::Error) -> io::Error {
    io::Error::new(e.kind(), SyncFailed(e.to_string()))
}

/// The inner error of a failed fsync.
#[derive(Debug)]
struct SyncFailed(String);

impl fmt::Display for SyncFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "fsync failed: {}", self.0)
    }
}

impl std::error::Error for SyncFailed {}

/// True if `e` came from a failed fsync in [`write_atomically`].
pub fn is_sync_error(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<SyncFailed>())
}

/// fsyncs the directory holding `path`.
pub fn sync_parent(storage: &dyn Storage, path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => storage.sync_dir(parent),
        _ => storage.sync_dir(Path::new(".")),
    }
}

pub(crate) fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".tmp");
    PathBuf::from(name)
}

/// Removes a file; one already gone counts as removed.
pub fn remove_if_exists(storage: &dyn Storage, path: &Path) -> io::Result<()> {
    match storage.remove_file(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

// ------------------------------------------------------------------ disk

/// The real filesystem.
#[derive(Debug, Default, Clone, Copy)]
pub struct DiskStorage;

impl DiskStorage {
    pub fn shared() -> Arc<dyn Storage> {
        Arc::new(DiskStorage)
    }
}

impl Storage for DiskStorage {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn StoredFile>> {
        let mut options = OpenOptions::new();
        match mode {
            OpenMode::Read => options.read(true),
            OpenMode::Write => options.read(true).write(true),
            OpenMode::Create => options.read(true).write(true).create(true).truncate(true),
        };
        Ok(Arc::new(DiskFile(options.open(path)?)))
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::create_dir_all(path)
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::remove_dir_all(path)
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(path)? {
            let entry = entry?;
            let Ok(name) = entry.file_name().into_string() else {
                continue; // Keel never writes names that are not UTF-8.
            };
            let meta = entry.metadata()?;
            out.push(DirEntry {
                name,
                is_dir: meta.is_dir(),
                modified: meta.modified().ok(),
            });
        }
        Ok(out)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }

    fn file_len(&self, path: &Path) -> io::Result<Option<u64>> {
        match fs::metadata(path) {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// A file on disk.
#[derive(Debug)]
pub struct DiskFile(pub File);

/// Alignment of O_DIRECT offsets, lengths and buffers: the largest logical
/// block size in common use.
pub const DIRECT_ALIGN: usize = 4096;

impl StoredFile for DiskFile {
    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize> {
        self.0.read_at(buf, pos)
    }

    fn read_uncached(&self, pos: u64, len: u64, direct: bool) -> io::Result<Bytes> {
        if direct {
            match open_direct(&self.0) {
                Ok(d) => return read_aligned(&d, pos, len),
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => {}
                Err(e) => return Err(e),
            }
        }
        let mut buf = vec![0u8; usize::try_from(len).map_err(|_| io::Error::other("read too large"))?];
        let mut got = 0;
        while got < buf.len() {
            match self.0.read_at(&mut buf[got..], pos + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        buf.truncate(got);
        // Advice only: a failure changes nothing about the data read.
        let _ = rustix::fs::fadvise(&self.0, pos, NonZeroU64::new(len), rustix::fs::Advice::DontNeed);
        Ok(Bytes::from(buf))
    }

    fn write_at(&self, buf: &[u8], pos: u64) -> io::Result<usize> {
        self.0.write_at(buf, pos)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn drop_cache(&self) {
        let _ = rustix::fs::fadvise(&self.0, 0, None, rustix::fs::Advice::DontNeed);
    }

    fn std_file(&self) -> Option<&File> {
        Some(&self.0)
    }
}

/// The file again, opened with O_DIRECT (through `/proc/self/fd`, so a
/// file deleted since it was opened stays readable).
fn open_direct(file: &File) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// Up to `len` bytes at `pos` (fewer at the end of the file), read with
/// O_DIRECT: offset, length and buffer aligned to [`DIRECT_ALIGN`]. The
/// alignment comes from over-allocating, so no unsafe code is needed.
fn read_aligned(file: &File, pos: u64, len: u64) -> io::Result<Bytes> {
    let align = DIRECT_ALIGN as u64;
    let start = pos / align * align;
    let lead = (pos - start) as usize;
    let span = (lead as u64 + len).div_ceil(align) * align;
    let span = usize::try_from(span).map_err(|_| io::Error::other("read too large"))?;
    let mut raw = vec![0u8; span + DIRECT_ALIGN];
    let shift = raw.as_ptr().align_offset(DIRECT_ALIGN);
    let aligned = &mut raw[shift..shift + span];
    let mut got = 0usize;
    while got < span {
        let n = file.read_at(&mut aligned[got..], start + got as u64)?;
        got += n;
        // A short read that is not a whole number of blocks is the end of
        // the file; another read would be misaligned.
        if n == 0 || n % DIRECT_ALIGN != 0 {
            break;
        }
    }
    let available = got.saturating_sub(lead).min(len as usize);
    Ok(Bytes::from(raw).slice(shift + lead..shift + lead + available))
}

/// Whether files in `dir` can be read with O_DIRECT: writes a probe file,
/// reads it back directly, removes it.
pub fn probe_direct_io(dir: &Path) -> io::Result<()> {
    probe_direct_io_at(&dir.join(".keel_direct_io_probe"))
}

/// [`probe_direct_io`] with the probe file at `path` (overwritten, then
/// removed), for probes that must not meet the broker's own.
pub fn probe_direct_io_at(path: &Path) -> io::Result<()> {
    let result = (|| {
        fs::write(path, vec![7u8; DIRECT_ALIGN])?;
        let file = File::open(path)?;
        let data = read_aligned(&open_direct(&file)?, 0, DIRECT_ALIGN as u64)?;
        if data.len() != DIRECT_ALIGN || data.iter().any(|b| *b != 7) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "O_DIRECT probe read back wrong data",
            ));
        }
        Ok(())
    })();
    let _ = fs::remove_file(path);
    result
}

/// Up to `len` bytes of `file` at `pos` that do not stay cached: for
/// reading whole files (tier copies, colder-tier segments).
pub fn read_uncached(file: &File, pos: u64, len: u64) -> io::Result<Bytes> {
    DiskFile(file.try_clone()?).read_uncached(pos, len, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_writes_replace_and_leave_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let s = DiskStorage;
        let path = dir.path().join("f");
        write_atomically(&s, &path, b"one").unwrap();
        write_atomically(&s, &path, b"two!").unwrap();
        assert_eq!(read_file(&s, &path).unwrap().unwrap(), b"two!");
        assert_eq!(s.file_len(&path).unwrap(), Some(4));
        assert!(s.file_len(&tmp_path(&path)).unwrap().is_none());
        assert!(read_file(&s, &dir.path().join("none")).unwrap().is_none());
        let names: Vec<_> = s
            .read_dir(dir.path())
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, vec!["f".to_string()]);
    }

    #[test]
    fn positional_io_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let s = DiskStorage;
        let f = s.open(&dir.path().join("f"), OpenMode::Create).unwrap();
        write_all_at(f.as_ref(), b"hello world", 0).unwrap();
        write_all_at(f.as_ref(), b"W", 6).unwrap();
        let mut buf = [0u8; 11];
        read_exact_at(f.as_ref(), &mut buf, 0).unwrap();
        assert_eq!(&buf, b"hello World");
        assert_eq!(&f.read_uncached(6, 100, true).unwrap()[..], b"World");
        assert_eq!(&f.read_uncached(0, 5, false).unwrap()[..], b"hello");
        f.set_len(5).unwrap();
        assert_eq!(f.len().unwrap(), 5);
        assert!(read_exact_at(f.as_ref(), &mut buf, 0).is_err());
    }
}
