//! The colder tiers: capacity directories and the object store.
//!
//! [`Tiers`] copies sealed segments into a colder tier (paced, then read
//! back and verified), reads segments that are only there (the indexes
//! fetched whole and cached, the data with ranged reads), finds timestamps
//! in them, and deletes copies. A copy is named by its manifest object name
//! (`keel_log::tiered`), never by a local path: its files are
//! `<object>.log`, `<object>.index` and `<object>.timeindex` under a
//! capacity directory or the object store's root, and `<object>.txnindex`
//! (Kafka's aborted-transaction index) for a segment with aborted
//! transactions.
//!
//! Capacity files (and a `file://` object store, which is a directory too)
//! are read with direct I/O (`keel_log::read_uncached`), so they never enter
//! the page cache; S3 reads are ranged GETs. S3 copies are multipart
//! uploads; one interrupted by a crash leaves an incomplete upload behind,
//! which the bucket's AbortIncompleteMultipartUpload lifecycle rule removes.
//! Reads are blocking calls, made on the cold-read executor's threads; the
//! object store's async client runs them on the runtime handle given at
//! construction.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use keel_log::batch::check_crc;
use keel_log::storage::{read_file, sync_parent, write_all_at, OpenMode, Storage, StoredFile};
use keel_log::{
    find_timestamp_in_windows, read_windows, BatchHeader, SealedSegment, SegmentFile, SegmentIndex, Tier,
    TieredSegment,
};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutPayload, WriteMultipart};
use parking_lot::Mutex;
use tokio::runtime::Handle;

use crate::cold::ColdRead;
use crate::io::Budget;

/// The files a copy may have (`.txnindex` only with aborted transactions).
/// A copy's files. `snapshot` is the producer-state snapshot at the
/// segment's end, which a cluster's leader puts beside each segment it
/// copies to the object store (Kafka's remote storage keeps one too).
const COPY_SUFFIXES: [&str; 5] = ["log", "index", "timeindex", "txnindex", "snapshot"];
/// Bytes moved per step of a copy or verification (and per multipart part).
const CHUNK: u64 = 8 << 20;
/// Memory for cached indexes of colder-tier segments, broker-wide.
const INDEX_CACHE_BYTES: usize = 64 << 20;

/// Settings of `keel.tier.remote`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RemoteSettings {
    /// `file:///absolute/dir` or `s3://bucket[/prefix]`.
    pub url: String,
    /// S3 endpoint (for S3-compatible servers); empty: AWS.
    pub endpoint: String,
    pub region: String,
    pub access_key_id: String,
    pub secret_access_key: String,
}

/// Counters since start-up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TierStats {
    pub copies: u64,
    pub copied_bytes: u64,
    pub copy_failures: u64,
    pub reads: u64,
    pub read_bytes: u64,
    pub read_failures: u64,
    pub deletes: u64,
    pub delete_failures: u64,
    pub index_cache_bytes: u64,
    pub last_error: Option<String>,
}

/// One colder tier's storage.
#[derive(Debug)]
enum Store {
    Dirs(Dirs),
    Objects {
        store: Arc<dyn ObjectStore>,
        describe: String,
    },
}

#[derive(Debug)]
pub struct Tiers {
    capacity: Option<Store>,
    remote: Option<Store>,
    /// Runs the object store client for blocking reads.
    runtime: Option<Handle>,
    indexes: Mutex<IndexCache>,
    copies: AtomicU64,
    copied_bytes: AtomicU64,
    copy_failures: AtomicU64,
    reads: AtomicU64,
    read_bytes: AtomicU64,
    read_failures: AtomicU64,
    deletes: AtomicU64,
    delete_failures: AtomicU64,
    last_error: Mutex<Option<String>>,
    /// Copies written before any manifest names them, by object name, with
    /// how many holds each has (see [`Tiers::hold_uncommitted`]).
    uncommitted: Arc<Mutex<HashMap<String, usize>>>,
}

/// Keeps a copy out of [`Tiers::list_copies`] until dropped: a copy that
/// is written before its manifest entry, and whose write may outlast
/// the orphan grace.
#[derive(Debug)]
pub struct UncommittedCopy {
    object: String,
    uncommitted: Arc<Mutex<HashMap<String, usize>>>,
}

impl Drop for UncommittedCopy {
    fn drop(&mut self) {
        let mut held = self.uncommitted.lock();
        if let Some(n) = held.get_mut(&self.object) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.object);
            }
        }
    }
}

impl Tiers {
    /// Tiers over `capacity_dirs` (none: no capacity tier) and the object
    /// store of `remote` (`None`: no remote tier). Capacity dirs and a
    /// `file://` store are reached through `storage`. An object store needs
    /// to be opened inside a tokio runtime, which then runs its client.
    pub fn new(
        storage: Arc<dyn Storage>,
        capacity_dirs: &[PathBuf],
        remote: Option<&RemoteSettings>,
    ) -> io::Result<Tiers> {
        let capacity = if capacity_dirs.is_empty() {
            None
        } else {
            for dir in capacity_dirs {
                storage
                    .create_dir_all(dir)
                    .map_err(|e| io::Error::new(e.kind(), format!("capacity dir {}: {e}", dir.display())))?;
            }
            Some(Store::Dirs(Dirs {
                roots: capacity_dirs.to_vec(),
                storage: Arc::clone(&storage),
            }))
        };
        let remote = remote.map(|r| open_remote(&storage, r)).transpose()?;
        let runtime = Handle::try_current().ok();
        if remote.is_some() && runtime.is_none() {
            return Err(io::Error::other("an object store tier needs a tokio runtime"));
        }
        Ok(Tiers {
            capacity,
            remote,
            runtime,
            indexes: Mutex::new(IndexCache::default()),
            copies: AtomicU64::new(0),
            copied_bytes: AtomicU64::new(0),
            copy_failures: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
            read_failures: AtomicU64::new(0),
            deletes: AtomicU64::new(0),
            delete_failures: AtomicU64::new(0),
            last_error: Mutex::new(None),
            uncommitted: Arc::default(),
        })
    }

    pub fn has(&self, tier: Tier) -> bool {
        self.store(tier).is_ok()
    }

    /// Where a tier's copies go, for logs.
    pub fn describe(&self, tier: Tier) -> String {
        match self.store(tier) {
            Ok(Store::Dirs(dirs)) if tier == Tier::Remote => format!("file://{}", dirs.roots[0].display()),
            Ok(Store::Dirs(dirs)) => {
                let dirs: Vec<_> = dirs.roots.iter().map(|d| d.display().to_string()).collect();
                dirs.join(",")
            }
            Ok(Store::Objects { describe, .. }) => describe.clone(),
            Err(_) => "none".into(),
        }
    }

    fn store(&self, tier: Tier) -> io::Result<&Store> {
        match tier {
            Tier::Capacity => self.capacity.as_ref(),
            Tier::Remote => self.remote.as_ref(),
        }
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("no {} tier is configured", tier.name()),
            )
        })
    }

    pub fn stats(&self) -> TierStats {
        TierStats {
            copies: self.copies.load(Ordering::Relaxed),
            copied_bytes: self.copied_bytes.load(Ordering::Relaxed),
            copy_failures: self.copy_failures.load(Ordering::Relaxed),
            reads: self.reads.load(Ordering::Relaxed),
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            read_failures: self.read_failures.load(Ordering::Relaxed),
            deletes: self.deletes.load(Ordering::Relaxed),
            delete_failures: self.delete_failures.load(Ordering::Relaxed),
            index_cache_bytes: self.indexes.lock().bytes as u64,
            last_error: self.last_error.lock().clone(),
        }
    }

    fn note_error(&self, what: &str, e: &io::Error) {
        *self.last_error.lock() = Some(format!("{what}: {e}"));
    }

    /// Copies `segment` into `tier` as `object`, paced by `budget` (reads of
    /// the source and of the copy both count), then reads the copy back and
    /// checks every batch's CRC and offsets and the index files' bytes.
    pub async fn copy(
        &self,
        tier: Tier,
        segment: &SealedSegment,
        object: &str,
        budget: &Budget,
    ) -> io::Result<()> {
        let result = self.copy_and_verify(tier, segment, object, budget).await;
        match &result {
            Ok(()) => {
                self.copies.fetch_add(1, Ordering::Relaxed);
                self.copied_bytes.fetch_add(segment.size_bytes, Ordering::Relaxed);
            }
            Err(e) => {
                self.copy_failures.fetch_add(1, Ordering::Relaxed);
                self.note_error(&format!("copy of {object} to the {} tier", tier.name()), e);
            }
        }
        result
    }

    async fn copy_and_verify(
        &self,
        tier: Tier,
        segment: &SealedSegment,
        object: &str,
        budget: &Budget,
    ) -> io::Result<()> {
        let store = self.store(tier)?;
        let index = segment.index.clone();
        let time_index = segment.time_index.clone();
        let txn_index = Bytes::from(keel_log::txnindex::encode(&segment.aborted));
        store.put(&format!("{object}.index"), index.clone()).await?;
        store
            .put(&format!("{object}.timeindex"), time_index.clone())
            .await?;
        if !txn_index.is_empty() {
            store
                .put(&format!("{object}.txnindex"), txn_index.clone())
                .await?;
        }
        store
            .put_file(&format!("{object}.log"), &segment.log, segment.size_bytes, budget)
            .await?;

        // Read everything back.
        if store.get(&format!("{object}.index")).await? != index
            || store.get(&format!("{object}.timeindex")).await? != time_index
            || (!txn_index.is_empty() && store.get(&format!("{object}.txnindex")).await? != txn_index)
        {
            return Err(invalid(format!("{object}: index files differ after the copy")));
        }
        let name = format!("{object}.log");
        let mut pos = 0u64;
        let mut next_offset = segment.base_offset;
        let mut want = CHUNK;
        while pos < segment.size_bytes {
            let len = want.min(segment.size_bytes - pos);
            budget.take(len).await;
            let buf = store.get_range(&name, pos, len).await?;
            let mut at = 0usize;
            while let Ok(header) = BatchHeader::parse(&buf[at..]) {
                let Some(batch) = buf.get(at..at + header.total_len()) else {
                    break;
                };
                check_crc(batch, &header)
                    .map_err(|e| invalid(format!("{name} at {}: {e}", pos + at as u64)))?;
                if header.base_offset < next_offset || header.last_offset() >= segment.next_offset {
                    return Err(invalid(format!(
                        "{name} at {}: offsets out of order",
                        pos + at as u64
                    )));
                }
                next_offset = header.last_offset() + 1;
                at += header.total_len();
            }
            if at == 0 {
                let header =
                    BatchHeader::parse(&buf).map_err(|e| invalid(format!("{name} at {pos}: {e}")))?;
                if header.total_len() as u64 <= len {
                    return Err(invalid(format!("{name} at {pos}: copy is short")));
                }
                want = header.total_len() as u64;
                continue;
            }
            want = CHUNK;
            pos += at as u64;
        }
        if next_offset != segment.next_offset {
            return Err(invalid(format!(
                "{name}: copy ends at offset {next_offset}, expected {}",
                segment.next_offset
            )));
        }
        Ok(())
    }

    /// Deletes a copy's files; those already gone count as deleted.
    pub async fn delete(&self, segment: &TieredSegment) -> io::Result<()> {
        self.indexes.lock().remove(&segment.object);
        let result = async {
            let store = self.store(segment.tier)?;
            for suffix in COPY_SUFFIXES {
                store.delete(&format!("{}.{suffix}", segment.object)).await?;
            }
            Ok(())
        }
        .await;
        match &result {
            Ok(()) => self.deletes.fetch_add(1, Ordering::Relaxed),
            Err(e) => {
                self.note_error(&format!("delete of {}", segment.object), e);
                self.delete_failures.fetch_add(1, Ordering::Relaxed)
            }
        };
        result
    }

    /// Holds `object` out of [`Tiers::list_copies`] until the returned
    /// guard is dropped. For a copy written before any manifest names it
    /// (a cleaned group of cold segments): take the hold before its first
    /// file is written and drop it only once the manifest naming it is
    /// written, or the copy deleted. The orphan sweep reads the manifests
    /// after listing, so it meets such a copy either held or named,
    /// however long the write and its read-back take.
    pub fn hold_uncommitted(&self, object: &str) -> UncommittedCopy {
        *self.uncommitted.lock().entry(object.to_string()).or_insert(0) += 1;
        UncommittedCopy {
            object: object.to_string(),
            uncommitted: Arc::clone(&self.uncommitted),
        }
    }

    /// Every copy in `tier`, by object name, with the age of its newest
    /// file in milliseconds (for finding copies no manifest names: leftovers
    /// of deleted topics and of writes that finished after a crash).
    /// Only copies under `prefix` (`<prefix>/<topic>-<id>/<partition>/...`),
    /// by their full names, and not those held by
    /// [`Tiers::hold_uncommitted`] when the listing ends.
    pub async fn list_copies(&self, tier: Tier, prefix: &str) -> io::Result<HashMap<String, u64>> {
        let store = self.store(tier)?;
        let mut files = Vec::new();
        match store {
            Store::Dirs(dirs) => {
                let dirs = dirs.clone();
                let prefix = prefix.to_string();
                files = blocking(move || dirs.files_under(&prefix)).await?;
            }
            Store::Objects { store, .. } => {
                // Three levels below the prefix: <topic>-<id>/<partition>/<files>.
                let mut prefixes = vec![Some(object_path(prefix)?)];
                for _ in 0..3 {
                    let mut next = Vec::new();
                    for prefix in &prefixes {
                        let listed = store
                            .list_with_delimiter(prefix.as_ref())
                            .await
                            .map_err(io_error)?;
                        for meta in listed.objects {
                            let age = keel_log::clock::now_ms()
                                .saturating_sub(meta.last_modified.timestamp_millis());
                            files.push((meta.location.to_string(), age.max(0) as u64));
                        }
                        next.extend(listed.common_prefixes.into_iter().map(Some));
                    }
                    prefixes = next;
                }
            }
        }
        let mut copies: HashMap<String, u64> = HashMap::new();
        for (name, age) in files {
            let Some((stem, suffix)) = name.rsplit_once('.') else {
                continue;
            };
            if COPY_SUFFIXES.contains(&suffix) {
                let youngest = copies.entry(stem.to_string()).or_insert(age);
                *youngest = (*youngest).min(age);
            }
        }
        // After the listing: a hold dropped before this point was dropped
        // after its manifest was written, which the caller reads next.
        let held = self.uncommitted.lock();
        copies.retain(|object, _| !held.contains_key(object));
        Ok(copies)
    }

    /// Every object under `prefix` in the object store, by full name,
    /// with its age in milliseconds (for finding WAL objects no index
    /// names).
    pub async fn list_remote(&self, prefix: &str) -> io::Result<Vec<(String, u64)>> {
        match self.store(Tier::Remote)? {
            Store::Dirs(dirs) => {
                let (dirs, prefix) = (dirs.clone(), prefix.to_string());
                blocking(move || dirs.files_under(&prefix)).await
            }
            Store::Objects { store, .. } => {
                let mut files = Vec::new();
                let mut prefixes = vec![object_path(prefix)?];
                while let Some(prefix) = prefixes.pop() {
                    let listed = store.list_with_delimiter(Some(&prefix)).await.map_err(io_error)?;
                    for meta in listed.objects {
                        let age =
                            keel_log::clock::now_ms().saturating_sub(meta.last_modified.timestamp_millis());
                        files.push((meta.location.to_string(), age.max(0) as u64));
                    }
                    prefixes.extend(listed.common_prefixes);
                }
                Ok(files)
            }
        }
    }

    /// Writes `bytes` as the whole object `name` in the object store
    /// (`keel.tier.remote`), durably: a WAL object of a cluster.
    pub async fn put_remote(&self, name: &str, bytes: Bytes) -> io::Result<()> {
        self.store(Tier::Remote)?.put(name, bytes).await
    }

    /// `len` bytes at `pos` of the object `name` in the object store.
    pub async fn read_remote(&self, name: &str, pos: u64, len: u64) -> io::Result<Bytes> {
        self.store(Tier::Remote)?.get_range(name, pos, len).await
    }

    /// The whole object `name` in the object store, `None` if there is none.
    pub async fn get_remote(&self, name: &str) -> io::Result<Option<Bytes>> {
        match self.store(Tier::Remote)?.get(name).await {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Deletes the object `name` from the object store; one that is gone
    /// already is not an error.
    pub async fn delete_remote(&self, name: &str) -> io::Result<()> {
        self.store(Tier::Remote)?.delete(name).await
    }

    /// Deletes the files of a copy no manifest names.
    pub async fn delete_orphan(&self, tier: Tier, object: &str) -> io::Result<()> {
        let store = self.store(tier)?;
        for suffix in COPY_SUFFIXES {
            store.delete(&format!("{object}.{suffix}")).await?;
        }
        Ok(())
    }

    /// Whole batches of a colder-tier segment from the one holding
    /// `offset`, up to `max_bytes` (at least one), CRC-checked. Blocking:
    /// call it from a blocking thread (the cold-read executor).
    pub fn read_blocking(
        &self,
        segment: &TieredSegment,
        offset: i64,
        max_bytes: usize,
    ) -> io::Result<ColdRead> {
        let mut disk_bytes = 0u64;
        let result = (|| {
            let index = self.index_blocking(segment)?;
            let store = self.store(segment.tier)?;
            let name = format!("{}.log", segment.object);
            let start = index.position_of(offset);
            read_windows(
                start,
                segment.size_bytes,
                offset,
                max_bytes,
                index.window_end(start, max_bytes),
                |pos, len| {
                    let got = self.get_range_blocking(store, &name, pos, len)?;
                    disk_bytes += got.len() as u64;
                    Ok(got)
                },
            )
        })();
        self.count_read(&segment.object, &result);
        result.map(|bytes| ColdRead { bytes, disk_bytes })
    }

    /// `len` bytes of a colder-tier segment's log from `pos` (fewer only
    /// at its end), for the log cleaner. Blocking.
    pub fn read_range_blocking(&self, segment: &TieredSegment, pos: u64, len: u64) -> io::Result<Bytes> {
        let result = (|| {
            let store = self.store(segment.tier)?;
            self.get_range_blocking(store, &format!("{}.log", segment.object), pos, len)
        })();
        self.count_read(&segment.object, &result);
        result
    }

    /// The byte positions a colder-tier segment's offset index names.
    /// Blocking.
    pub fn positions_blocking(&self, segment: &TieredSegment) -> io::Result<Vec<u32>> {
        Ok(self.index_blocking(segment)?.positions())
    }

    /// ListOffsets by timestamp in a colder-tier segment: `(offset,
    /// timestamp)` of the first record at or after `timestamp_ms`.
    /// Blocking, like [`Tiers::read_blocking`].
    pub fn find_timestamp_blocking(
        &self,
        segment: &TieredSegment,
        timestamp_ms: i64,
        log_start_offset: i64,
    ) -> io::Result<Option<(i64, i64)>> {
        let index = self.index_blocking(segment)?;
        let store = self.store(segment.tier)?;
        let name = format!("{}.log", segment.object);
        find_timestamp_in_windows(
            index.position_for_timestamp(timestamp_ms),
            segment.size_bytes,
            timestamp_ms,
            log_start_offset,
            |pos, len| self.get_range_blocking(store, &name, pos, len),
        )
    }

    fn count_read(&self, object: &str, result: &io::Result<Bytes>) {
        match result {
            Ok(bytes) => {
                self.reads.fetch_add(1, Ordering::Relaxed);
                self.read_bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
            }
            Err(e) => {
                self.read_failures.fetch_add(1, Ordering::Relaxed);
                self.note_error(&format!("read of {object}"), e);
            }
        }
    }

    fn get_range_blocking(&self, store: &Store, name: &str, pos: u64, len: u64) -> io::Result<Bytes> {
        match store {
            Store::Dirs(dirs) => dirs.read_range(name, pos, len),
            Store::Objects { .. } => self.block_on(store.get_range(name, pos, len)),
        }
    }

    fn block_on<T>(&self, f: impl std::future::Future<Output = io::Result<T>>) -> io::Result<T> {
        match &self.runtime {
            Some(runtime) => runtime.block_on(f),
            None => Err(io::Error::other("no runtime for the object store")),
        }
    }

    fn index_blocking(&self, segment: &TieredSegment) -> io::Result<Arc<SegmentIndex>> {
        if let Some(index) = self.indexes.lock().get(&segment.object) {
            return Ok(index);
        }
        let store = self.store(segment.tier)?;
        let fetch = |suffix: &str| -> io::Result<Bytes> {
            let name = format!("{}.{suffix}", segment.object);
            match store {
                Store::Dirs(dirs) => dirs.read(&name),
                Store::Objects { .. } => self.block_on(store.get(&name)),
            }
        };
        let index = SegmentIndex::decode(
            segment.base_offset,
            segment.size_bytes,
            &fetch("index")?,
            &fetch("timeindex")?,
        )
        .map_err(|why| invalid(format!("{}: bad index: {why}", segment.object)))?;
        let index = Arc::new(index);
        self.indexes
            .lock()
            .insert(segment.object.clone(), Arc::clone(&index));
        Ok(index)
    }
}

impl Store {
    async fn put(&self, name: &str, bytes: Bytes) -> io::Result<()> {
        match self {
            Store::Dirs(dirs) => {
                let (dirs, name) = (dirs.clone(), name.to_string());
                blocking(move || dirs.write(&name, &bytes)).await
            }
            Store::Objects { store, .. } => {
                store
                    .put(&object_path(name)?, PutPayload::from_bytes(bytes))
                    .await
                    .map_err(io_error)?;
                Ok(())
            }
        }
    }

    /// Copies `len` bytes of `src` (read uncached, chunk by chunk, each
    /// chunk paced) to `name`.
    async fn put_file(
        &self,
        name: &str,
        src: &Arc<SegmentFile>,
        len: u64,
        budget: &Budget,
    ) -> io::Result<()> {
        let src = {
            let segment = Arc::clone(src);
            blocking(move || segment.open()).await?
        };
        let chunks = (0..len.div_ceil(CHUNK)).map(|i| (i * CHUNK, CHUNK.min(len - i * CHUNK)));
        match self {
            Store::Dirs(dirs) => {
                let (dirs, name) = (dirs.clone(), name.to_string());
                let (dst, path) = {
                    let dirs = dirs.clone();
                    blocking(move || dirs.create(&name)).await?
                };
                for (pos, n) in chunks {
                    budget.take(n).await;
                    let (src, dst) = (Arc::clone(&src), Arc::clone(&dst));
                    blocking(move || write_all_at(dst.as_ref(), &src.read_uncached(pos, n, true)?, pos))
                        .await?;
                }
                blocking(move || dirs.finish(dst.as_ref(), &path)).await
            }
            Store::Objects { store, .. } => {
                let upload = store.put_multipart(&object_path(name)?).await.map_err(io_error)?;
                let mut writer = WriteMultipart::new_with_chunk_size(upload, CHUNK as usize);
                for (pos, n) in chunks {
                    budget.take(n).await;
                    let src = Arc::clone(&src);
                    let data = blocking(move || src.read_uncached(pos, n, true)).await;
                    let data = match data {
                        Ok(data) => data,
                        Err(e) => {
                            let _ = writer.abort().await;
                            return Err(e);
                        }
                    };
                    if let Err(e) = writer.wait_for_capacity(2).await {
                        let _ = writer.abort().await;
                        return Err(io_error(e));
                    }
                    writer.put(data);
                }
                writer.finish().await.map_err(io_error)?;
                Ok(())
            }
        }
    }

    async fn get(&self, name: &str) -> io::Result<Bytes> {
        match self {
            Store::Dirs(dirs) => {
                let (dirs, name) = (dirs.clone(), name.to_string());
                blocking(move || dirs.read(&name)).await
            }
            Store::Objects { store, .. } => store
                .get(&object_path(name)?)
                .await
                .map_err(io_error)?
                .bytes()
                .await
                .map_err(io_error),
        }
    }

    async fn get_range(&self, name: &str, pos: u64, len: u64) -> io::Result<Bytes> {
        match self {
            Store::Dirs(dirs) => {
                let (dirs, name) = (dirs.clone(), name.to_string());
                blocking(move || dirs.read_range(&name, pos, len)).await
            }
            Store::Objects { store, .. } => store
                .get_range(&object_path(name)?, pos..pos + len)
                .await
                .map_err(io_error),
        }
    }

    async fn delete(&self, name: &str) -> io::Result<()> {
        match self {
            Store::Dirs(dirs) => {
                let (dirs, name) = (dirs.clone(), name.to_string());
                blocking(move || dirs.delete(&name)).await
            }
            Store::Objects { store, .. } => match store.delete(&object_path(name)?).await {
                Err(object_store::Error::NotFound { .. }) => Ok(()),
                other => other.map_err(io_error),
            },
        }
    }
}

fn open_remote(storage: &Arc<dyn Storage>, settings: &RemoteSettings) -> io::Result<Store> {
    let url = settings.url.as_str();
    let bad = |why: &str| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("keel.tier.remote={url:?}: {why}"),
        )
    };
    if let Some(path) = url.strip_prefix("file://") {
        if !path.starts_with('/') {
            return Err(bad("a file:// URL needs an absolute path (file:///dir)"));
        }
        // A directory store, like a capacity dir: files written under their
        // final names (so a rolled-back copy leaves nothing behind) and read
        // with direct I/O.
        storage.create_dir_all(Path::new(path))?;
        return Ok(Store::Dirs(Dirs {
            roots: vec![PathBuf::from(path)],
            storage: Arc::clone(storage),
        }));
    }
    if let Some(rest) = url.strip_prefix("s3://") {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("no bucket"));
        }
        let mut builder = object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket);
        if !settings.endpoint.is_empty() {
            builder = builder
                .with_endpoint(&settings.endpoint)
                .with_allow_http(settings.endpoint.starts_with("http://"))
                .with_virtual_hosted_style_request(false);
        }
        if !settings.region.is_empty() {
            builder = builder.with_region(&settings.region);
        }
        if !settings.access_key_id.is_empty() {
            builder = builder
                .with_access_key_id(&settings.access_key_id)
                .with_secret_access_key(&settings.secret_access_key);
        }
        let store: Arc<dyn ObjectStore> = Arc::new(builder.build().map_err(io_error)?);
        let store: Arc<dyn ObjectStore> = match prefix.trim_matches('/') {
            "" => store,
            prefix => Arc::new(object_store::prefix::PrefixStore::new(store, prefix)),
        };
        return Ok(Store::Objects {
            store,
            describe: url.to_string(),
        });
    }
    Err(bad("expected file:///dir or s3://bucket[/prefix]"))
}

fn object_path(name: &str) -> io::Result<ObjectPath> {
    ObjectPath::parse(name).map_err(|e| invalid(format!("object name {name:?}: {e}")))
}

fn io_error(e: object_store::Error) -> io::Error {
    let kind = match &e {
        object_store::Error::NotFound { .. } => io::ErrorKind::NotFound,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, e.to_string())
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> io::Result<T> + Send + 'static) -> io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(io::Error::other(format!("tier task failed: {e}"))))
}

/// Directories holding copies as files (capacity dirs, a `file://` store),
/// reached through the storage seam.
#[derive(Debug, Clone)]
struct Dirs {
    roots: Vec<PathBuf>,
    storage: Arc<dyn Storage>,
}

impl Dirs {
    /// The path of `name` in the dir holding it.
    fn locate(&self, name: &str) -> io::Result<PathBuf> {
        for root in &self.roots {
            let path = root.join(name);
            if self.storage.file_len(&path)?.is_some() {
                return Ok(path);
            }
        }
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{name} is in no capacity dir"),
        ))
    }

    /// Where a new file goes: next to the copy's other files if any exist,
    /// else in the dir with the most free space.
    fn place(&self, name: &str) -> io::Result<PathBuf> {
        let object = name.rsplit_once('.').map_or(name, |(stem, _)| stem);
        let mut sibling = None;
        'roots: for root in &self.roots {
            for suffix in COPY_SUFFIXES {
                if self
                    .storage
                    .file_len(&root.join(format!("{object}.{suffix}")))?
                    .is_some()
                {
                    sibling = Some(root);
                    break 'roots;
                }
            }
        }
        let root = match sibling {
            Some(root) => root,
            None => self
                .roots
                .iter()
                .max_by_key(|d| free_bytes(d))
                .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no capacity dir"))?,
        };
        let path = root.join(name);
        if let Some(parent) = path.parent() {
            self.storage.create_dir_all(parent)?;
        }
        Ok(path)
    }

    fn read(&self, name: &str) -> io::Result<Bytes> {
        let path = self.locate(name)?;
        read_file(self.storage.as_ref(), &path)?
            .map(Bytes::from)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{} is gone", path.display())))
    }

    /// `len` bytes at `pos`, read with direct I/O where the filesystem
    /// allows it.
    fn read_range(&self, name: &str, pos: u64, len: u64) -> io::Result<Bytes> {
        let path = self.locate(name)?;
        self.storage
            .open(&path, OpenMode::Read)?
            .read_uncached(pos, len, true)
    }

    fn write(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        let (file, path) = self.create(name)?;
        write_all_at(file.as_ref(), bytes, 0)?;
        self.finish(file.as_ref(), &path)
    }

    /// A new, empty file for `name`, and its path.
    fn create(&self, name: &str) -> io::Result<(Arc<dyn StoredFile>, PathBuf)> {
        let path = self.place(name)?;
        Ok((self.storage.open(&path, OpenMode::Create)?, path))
    }

    /// fsyncs a written file and its directory, and drops its pages from
    /// the page cache (a copy is cold data).
    fn finish(&self, file: &dyn StoredFile, path: &Path) -> io::Result<()> {
        file.sync_data()?;
        file.drop_cache();
        sync_parent(self.storage.as_ref(), path)
    }

    /// Removes `name` from every dir; a missing file is not an error.
    fn delete(&self, name: &str) -> io::Result<()> {
        for root in &self.roots {
            match self.storage.remove_file(&root.join(name)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    /// Every file under `prefix` in every dir, as (name relative to its
    /// dir, age in ms). A file whose storage keeps no times has age 0, so
    /// no sweep takes it for an old orphan.
    fn files_under(&self, prefix: &str) -> io::Result<Vec<(String, u64)>> {
        let mut out = Vec::new();
        for root in &self.roots {
            let mut stack = vec![root.join(prefix)];
            while let Some(dir) = stack.pop() {
                let entries = match self.storage.read_dir(&dir) {
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    other => other?,
                };
                for entry in entries {
                    let path = dir.join(&entry.name);
                    if entry.is_dir {
                        stack.push(path);
                    } else if let Ok(rel) = path.strip_prefix(root) {
                        let age = entry
                            .modified
                            .and_then(|m| m.elapsed().ok())
                            .map_or(0, |d| d.as_millis() as u64);
                        out.push((rel.to_string_lossy().into_owned(), age));
                    }
                }
            }
        }
        Ok(out)
    }
}

/// Bytes free and total of the filesystem holding `dir`.
pub fn filesystem_space(dir: &Path) -> Option<(u64, u64)> {
    let s = rustix::fs::statvfs(dir).ok()?;
    Some((
        s.f_bavail.saturating_mul(s.f_frsize),
        s.f_blocks.saturating_mul(s.f_frsize),
    ))
}

fn free_bytes(dir: &Path) -> u64 {
    rustix::fs::statvfs(dir).map_or(0, |s| s.f_bavail.saturating_mul(s.f_frsize))
}

/// Decoded indexes of colder-tier segments, oldest evicted first, within
/// [`INDEX_CACHE_BYTES`].
#[derive(Debug, Default)]
struct IndexCache {
    map: HashMap<String, Arc<SegmentIndex>>,
    order: VecDeque<String>,
    bytes: usize,
}

impl IndexCache {
    fn get(&self, object: &str) -> Option<Arc<SegmentIndex>> {
        self.map.get(object).cloned()
    }

    fn insert(&mut self, object: String, index: Arc<SegmentIndex>) {
        if self.map.contains_key(&object) {
            return;
        }
        self.bytes += index.memory_bytes();
        self.map.insert(object.clone(), index);
        self.order.push_back(object);
        while self.bytes > INDEX_CACHE_BYTES && self.order.len() > 1 {
            let oldest = self.order.pop_front().expect("more than one");
            self.remove(&oldest);
        }
    }

    fn remove(&mut self, object: &str) {
        if let Some(index) = self.map.remove(object) {
            self.bytes -= index.memory_bytes();
            self.order.retain(|o| o != object);
        }
    }
}
