//! A coordinator's log: its state as records in a partition log of
//! Keel's own (under `__keel_meta/`), applied in order to an in-memory
//! table. The group coordinator keeps committed offsets and groups in one,
//! the transaction coordinator its transactions in another; ACLs, SCRAM
//! credentials and client quotas each have one too.
//!
//! A log can also hold transactional writes (the group log's offsets
//! committed in a producer's transaction, as Kafka's `__consumer_offsets`
//! does): a transactional batch under the producer's id and epoch, held by
//! the table until the producer's COMMIT or ABORT marker, a control batch
//! in the same log.
//!
//! One writer thread owns the log. Writes queue up and are appended
//! together (group commit); each is acknowledged after its batch is in the
//! segment file (fsynced too, for a [`Durability::Synced`] log) and applied
//! to the in-memory table, so a write that was acknowledged is visible to
//! the next read of the table and survives a crash of the process. A write
//! answered with an error has an unknown outcome, as a timed-out write to
//! Kafka has: if its batch reached the file before the error (a failed
//! fsync after it), the next start replays it.
//!
//! The log does not grow without bound: after `snapshot_bytes` of appends,
//! the writer writes the whole live table to a snapshot file
//! (`snapshots/<offset>.snapshot`: record batches of the same records,
//! written to a temporary name, fsynced, renamed) and drops the log below
//! that offset. Start-up loads the newest snapshot and replays the log from
//! the snapshot's offset.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use keel_log::batch::validate_batches;
use keel_log::marker::{marker_batch, Marker};
use keel_log::storage::{read_file, remove_if_exists, sync_parent, write_atomically, Storage};
use keel_log::{LogConfig, PartitionLog};
use keel_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use parking_lot::Mutex;
use tokio::sync::oneshot;

use keel_log::clock::now_ms;

use crate::codec::RecordError;

/// The in-memory state a coordinator log holds, and its record schema.
pub trait Table: Default + Send + 'static {
    type Record: Clone + Send + 'static;
    /// Names the log in thread names and messages.
    const NAME: &'static str;
    /// Applies one record, in log order.
    fn apply(&mut self, record: Self::Record);
    /// Records that rebuild the whole table (a snapshot's contents).
    fn records(&self) -> Vec<Self::Record>;
    /// A record's key and value (a `None` value is a tombstone).
    fn encode(record: &Self::Record) -> (Bytes, Option<Bytes>);
    fn decode(key: &[u8], value: Option<&[u8]>) -> Result<Self::Record, RecordError>;
    /// Applies a record written in producer `producer_id`'s transaction:
    /// it takes effect when the producer's commit marker does. Tables
    /// that take no transactional writes keep this default, which applies
    /// it at once.
    fn apply_transactional(&mut self, producer_id: i64, producer_epoch: i16, record: Self::Record) {
        let _ = (producer_id, producer_epoch);
        self.apply(record);
    }
    /// Applies the marker that ends producer `producer_id`'s transaction.
    fn end_transaction(&mut self, producer_id: i64, producer_epoch: i16, commit: bool) {
        let _ = (producer_id, producer_epoch, commit);
    }
    /// The records of transactions still open, `(producer id, epoch,
    /// records)`: a snapshot keeps them transactional.
    fn transactional_records(&self) -> Vec<(i64, i16, Vec<Self::Record>)> {
        Vec::new()
    }
}

/// One write to a coordinator log.
#[derive(Debug, Clone)]
pub enum Entry<R> {
    /// Records that take effect at once.
    Records(Vec<R>),
    /// Records in a producer's open transaction.
    Transactional {
        producer_id: i64,
        producer_epoch: i16,
        records: Vec<R>,
    },
    /// The end of a producer's transaction.
    Marker {
        producer_id: i64,
        producer_epoch: i16,
        marker: Marker,
    },
}

impl<R> Entry<R> {
    fn is_empty(&self) -> bool {
        match self {
            Entry::Records(r) | Entry::Transactional { records: r, .. } => r.is_empty(),
            Entry::Marker { .. } => false,
        }
    }

    /// Applies this entry to `table`, in log order.
    pub fn apply_to<T: Table<Record = R>>(self, table: &mut T) {
        match self {
            Entry::Records(records) => records.into_iter().for_each(|r| table.apply(r)),
            Entry::Transactional {
                producer_id,
                producer_epoch,
                records,
            } => {
                for r in records {
                    table.apply_transactional(producer_id, producer_epoch, r);
                }
            }
            Entry::Marker {
                producer_id,
                producer_epoch,
                marker,
            } => table.end_transaction(producer_id, producer_epoch, marker.commit),
        }
    }
}

/// Why a write to a coordinator log failed (reported to clients as
/// COORDINATOR_NOT_AVAILABLE).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError(pub String);

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "coordinator log: {}", self.0)
    }
}

/// Why a coordinator log did not open. Each names the path it concerns.
#[derive(Debug)]
pub enum OpenError {
    /// A file operation failed.
    Io { path: PathBuf, error: io::Error },
    /// The partition log under it did not open.
    Log {
        path: PathBuf,
        error: keel_log::OpenError,
    },
    /// A snapshot or a logged record does not decode: a damaged file, or
    /// one a newer version wrote.
    Corrupt { path: PathBuf, why: String },
    /// The log starts past every snapshot: the records before its start
    /// are nowhere.
    Gap { path: PathBuf, log_start: i64 },
    /// The writer thread could not be started.
    Writer(io::Error),
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::Io { path, error } => write!(f, "{}: {error}", path.display()),
            OpenError::Log { path, error } => write!(f, "{}: {error}", path.display()),
            OpenError::Corrupt { path, why } => write!(f, "{}: {why}", path.display()),
            OpenError::Gap { path, log_start } => write!(
                f,
                "{}: the log starts at offset {log_start} but no snapshot covers the records before it",
                path.display()
            ),
            OpenError::Writer(error) => write!(f, "cannot start a coordinator log's writer: {error}"),
        }
    }
}

impl std::error::Error for OpenError {}

/// Acknowledges one write once it is in the log and applied.
type WriteAck = oneshot::Sender<Result<(), StoreError>>;

/// A change to the table made outside the log, in the writer's order.
pub type Update<T> = Box<dyn FnOnce(&mut T) + Send>;

/// What became of one entry a sink was given.
pub enum Outcome<T> {
    /// Written: it is applied to the table.
    Written,
    /// Not written (or not known to be).
    Failed(StoreError),
    /// Written in part, by a sink that spreads an entry over several logs:
    /// `apply` makes the written part's change to the table; the entry's
    /// writer is answered `error`.
    Partly { apply: Update<T>, error: StoreError },
}

enum Command<T: Table> {
    Write {
        entry: Entry<T::Record>,
        reply: WriteAck,
    },
    Update {
        change: Update<T>,
        done: oneshot::Sender<()>,
    },
    Close {
        done: mpsc::Sender<()>,
    },
}

/// A coordinator log's partition settings: segments of `segment_bytes`,
/// never deleted by retention (snapshots bound the log instead).
pub fn log_config(segment_bytes: u64) -> LogConfig {
    LogConfig {
        segment_bytes,
        retention_ms: -1,
        ..LogConfig::default()
    }
}

/// When a write to a coordinator log is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Once it is in the segment file: it survives a crash of the process
    /// but not a power cut that comes before the log's next fsync (a roll,
    /// a snapshot, a clean close), as Kafka's `__consumer_offsets` and
    /// `__transaction_state` with Kafka's flush defaults.
    Written,
    /// Once it is fsynced: it survives a power cut, as a change to Kafka's
    /// metadata log (ACLs, SCRAM credentials, quotas) does. Writes queued
    /// together share one fsync.
    Synced,
}

/// Where a coordinator log's writes go, on the log's writer thread (its
/// only writer). [`MetaLog::open_with`] keeps them in a partition log of
/// Keel's own with snapshot files ([`LocalSink`]); a broker of a cluster
/// gives its group coordinator one that writes them into the partitions
/// of `__consumer_offsets`, which fail over with their leaders.
pub trait Sink<T: Table>: Send + 'static {
    /// Writes `entries`, in order, as durably as the log promises; blocking.
    /// `table` is the state before them. It may be locked only briefly:
    /// readers wait on it. Returns each entry's outcome: what was written
    /// is applied to the table, in order, and each entry's writer gets
    /// its own answer.
    fn append(&mut self, entries: &[Entry<T::Record>], table: &Mutex<T>) -> Vec<Outcome<T>>;
    /// Called after each group of writes (applied, `wrote`) and when no
    /// write came for a while: flushes that are due, snapshots.
    fn tend(&mut self, table: &Mutex<T>, wrote: bool);
    /// Flushes and closes.
    fn close(&mut self);
}

/// A coordinator's log: records of `T`, applied to a `T` in memory.
pub struct MetaLog<T: Table> {
    commands: Mutex<Option<mpsc::Sender<Command<T>>>>,
    table: Arc<Mutex<T>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

const SNAPSHOT_SUFFIX: &str = "snapshot";
/// Records per batch in a snapshot file.
const SNAPSHOT_BATCH_RECORDS: usize = 4096;
/// How often the writer checks `flush.ms` while idle.
const FLUSH_CHECK: Duration = Duration::from_millis(100);

impl<T: Table> MetaLog<T> {
    /// [`MetaLog::open_with`] on the real filesystem.
    pub fn open(
        dir: &Path,
        log_config: LogConfig,
        snapshot_bytes: u64,
        durability: Durability,
    ) -> Result<MetaLog<T>, OpenError> {
        MetaLog::open_with(
            keel_log::DiskStorage::shared(),
            dir,
            log_config,
            snapshot_bytes,
            durability,
        )
    }

    /// A small log of a store of its own (the ACLs, the SCRAM credentials,
    /// the client quotas): segments roll and snapshots are taken every
    /// `bytes`, and each write is fsynced before it is answered, as a
    /// change to Kafka's metadata log is. Blocking.
    pub fn open_synced(storage: Arc<dyn Storage>, dir: &Path, bytes: u64) -> Result<MetaLog<T>, OpenError> {
        MetaLog::open_with(storage, dir, log_config(bytes), bytes, Durability::Synced)
    }

    /// Loads the newest snapshot, replays the log after it and starts the
    /// writer thread. Every file operation goes through `storage`. Blocking.
    pub fn open_with(
        storage: Arc<dyn Storage>,
        dir: &Path,
        log_config: LogConfig,
        snapshot_bytes: u64,
        durability: Durability,
    ) -> Result<MetaLog<T>, OpenError> {
        let snapshots = dir.join("snapshots");
        let created = storage
            .create_dir_all(&snapshots)
            .and_then(|()| sync_parent(storage.as_ref(), &snapshots))
            .and_then(|()| sync_parent(storage.as_ref(), dir));
        created.map_err(|error| OpenError::Io {
            path: snapshots.clone(),
            error,
        })?;
        let (snapshot_offset, mut table) = load_snapshot(storage.as_ref(), &snapshots)?;
        let log_dir = dir.join("log");
        let log = PartitionLog::open_with(Arc::clone(&storage), &log_dir, log_config).map_err(|error| {
            OpenError::Log {
                path: log_dir.clone(),
                error,
            }
        })?;
        if log.log_start_offset() > snapshot_offset {
            return Err(OpenError::Gap {
                path: log_dir,
                log_start: log.log_start_offset(),
            });
        }
        let replayed = replay(&log, snapshot_offset, &mut table).map_err(|why| OpenError::Corrupt {
            path: log_dir.clone(),
            why,
        })?;
        tracing::info!(
            log = T::NAME,
            snapshot_offset,
            replayed,
            "loaded a coordinator log"
        );
        let sink = LocalSink {
            log,
            storage,
            snapshots,
            bytes_since_snapshot: 0,
            snapshot_bytes,
            durability,
        };
        MetaLog::with_sink(table, Box::new(sink))
    }

    /// A log of `table` whose writes go to `sink`: starts the writer
    /// thread.
    pub fn with_sink(table: T, sink: Box<dyn Sink<T>>) -> Result<MetaLog<T>, OpenError> {
        let table = Arc::new(Mutex::new(table));
        let (tx, rx) = mpsc::channel();
        let mut writer = Writer {
            sink,
            table: Arc::clone(&table),
        };
        let handle = std::thread::Builder::new()
            .name(format!("keel-{}", T::NAME))
            .spawn(move || writer.run(rx))
            .map_err(OpenError::Writer)?;
        Ok(MetaLog {
            commands: Mutex::new(Some(tx)),
            table,
            writer: Mutex::new(Some(handle)),
        })
    }

    /// Appends records; resolves once they are in the log file and applied.
    pub async fn write(&self, records: Vec<T::Record>) -> Result<(), StoreError> {
        self.write_entry(Entry::Records(records)).await
    }

    /// Appends one entry; resolves once it is in the log file and applied.
    pub async fn write_entry(&self, entry: Entry<T::Record>) -> Result<(), StoreError> {
        self.submit(entry).await
    }

    /// Queues one entry now, so that entries queued under a caller's lock
    /// are written in that lock's order; the future resolves once it is
    /// in the log file and applied.
    pub fn submit(
        &self,
        entry: Entry<T::Record>,
    ) -> impl std::future::Future<Output = Result<(), StoreError>> + Send + 'static {
        let queued = if entry.is_empty() {
            None
        } else {
            let (reply, rx) = oneshot::channel();
            let sent = match &*self.commands.lock() {
                Some(tx) => tx.send(Command::Write { entry, reply }).is_ok(),
                None => false,
            };
            Some(if sent {
                Ok(rx)
            } else {
                Err(StoreError("closed".into()))
            })
        };
        async move {
            match queued {
                None => Ok(()),
                Some(Err(e)) => Err(e),
                Some(Ok(rx)) => rx
                    .await
                    .unwrap_or_else(|_| Err(StoreError("writer stopped".into()))),
            }
        }
    }

    /// Reads the table (no I/O happens under this lock).
    pub fn with_table<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        f(&self.table.lock())
    }

    /// Changes the table outside the log, after every write queued
    /// before it is applied: for a sink whose log holds parts of the table
    /// that come and go (a cluster's group log loads and drops the groups
    /// of the partitions its broker leads). Resolves once it is made
    /// (at once if the log is closed).
    pub fn update(
        &self,
        change: impl FnOnce(&mut T) + Send + 'static,
    ) -> impl std::future::Future<Output = ()> {
        let (done, rx) = oneshot::channel();
        if let Some(tx) = &*self.commands.lock() {
            let _ = tx.send(Command::Update {
                change: Box::new(change),
                done,
            });
        }
        async move {
            let _ = rx.await;
        }
    }

    /// Flushes and closes the log and stops the writer. Blocking.
    pub fn close(&self) {
        let Some(tx) = self.commands.lock().take() else {
            return;
        };
        let (done, wait) = mpsc::channel();
        if tx.send(Command::Close { done }).is_ok() {
            let _ = wait.recv();
        }
        if let Some(handle) = self.writer.lock().take() {
            let _ = handle.join();
        }
    }
}

impl<T: Table> Drop for MetaLog<T> {
    fn drop(&mut self) {
        self.close();
    }
}

/// The writer thread: takes the queued writes in groups, has the sink
/// write each group, then applies it to the table and answers.
struct Writer<T: Table> {
    sink: Box<dyn Sink<T>>,
    table: Arc<Mutex<T>>,
}

impl<T: Table> Writer<T> {
    fn run(&mut self, rx: mpsc::Receiver<Command<T>>) {
        loop {
            let first = match rx.recv_timeout(FLUSH_CHECK) {
                Ok(c) => c,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    self.sink.tend(&self.table, false);
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return self.close(None),
            };
            let mut writes = Vec::new();
            let mut close = None;
            for command in std::iter::once(first).chain(rx.try_iter()) {
                match command {
                    Command::Write { entry, reply } => writes.push((entry, reply)),
                    Command::Update { change, done } => {
                        self.write(std::mem::take(&mut writes));
                        change(&mut self.table.lock());
                        let _ = done.send(());
                    }
                    Command::Close { done } => close = Some(done),
                }
            }
            self.write(writes);
            if close.is_some() {
                return self.close(close);
            }
            self.sink.tend(&self.table, true);
        }
    }

    fn write(&mut self, writes: Vec<(Entry<T::Record>, WriteAck)>) {
        if writes.is_empty() {
            return;
        }
        let (entries, replies): (Vec<_>, Vec<_>) = writes.into_iter().unzip();
        let outcomes = self.sink.append(&entries, &self.table);
        let mut answers = Vec::with_capacity(outcomes.len());
        {
            let mut table = self.table.lock();
            for (entry, outcome) in entries.into_iter().zip(outcomes) {
                answers.push(match outcome {
                    Outcome::Written => {
                        entry.apply_to(&mut *table);
                        Ok(())
                    }
                    Outcome::Failed(e) => Err(e),
                    Outcome::Partly { apply, error } => {
                        apply(&mut *table);
                        Err(error)
                    }
                });
            }
        }
        for (reply, answer) in replies.into_iter().zip(answers) {
            let _ = reply.send(answer);
        }
    }

    fn close(&mut self, done: Option<mpsc::Sender<()>>) {
        self.sink.close();
        if let Some(done) = done {
            let _ = done.send(());
        }
    }
}

/// A coordinator log in a partition log of Keel's own (under
/// `__keel_meta/`), bounded by snapshot files.
pub struct LocalSink {
    log: PartitionLog,
    storage: Arc<dyn Storage>,
    snapshots: PathBuf,
    bytes_since_snapshot: u64,
    snapshot_bytes: u64,
    durability: Durability,
}

impl<T: Table> Sink<T> for LocalSink {
    fn append(&mut self, entries: &[Entry<T::Record>], _table: &Mutex<T>) -> Vec<Outcome<T>> {
        // One batch for the lot: all of them are written, or none.
        let result = self.append_all::<T>(entries);
        entries
            .iter()
            .map(|_| match &result {
                Ok(()) => Outcome::Written,
                Err(e) => Outcome::Failed(e.clone()),
            })
            .collect()
    }

    fn tend(&mut self, table: &Mutex<T>, wrote: bool) {
        if self.log.needs_time_flush(now_ms()) {
            if let Err(e) = self.log.flush() {
                tracing::error!(log = T::NAME, error = %e, "cannot flush a coordinator log");
            }
        }
        if wrote && self.bytes_since_snapshot >= self.snapshot_bytes {
            if let Err(e) = self.snapshot(table) {
                tracing::error!(log = T::NAME, error = %e, "cannot snapshot a coordinator log; it keeps growing");
            }
        }
    }

    fn close(&mut self) {
        if let Err(e) = self.log.close() {
            tracing::error!(log = T::NAME, error = %e, "cannot close a coordinator log");
        }
    }
}

impl LocalSink {
    fn append_all<T: Table>(&mut self, entries: &[Entry<T::Record>]) -> Result<(), StoreError> {
        let mut buf = encode_entries::<T>(entries, now_ms()).map_err(StoreError)?;
        let headers = validate_batches(&buf).map_err(|e| StoreError(e.to_string()))?;
        let info = self
            .log
            .append(&mut buf, &headers, now_ms())
            .map_err(|e| StoreError(e.to_string()))?;
        self.bytes_since_snapshot += buf.len() as u64;
        if info.rolled {
            // This thread is the log's only writer: its seals (index
            // files, fsync of the rolled segment) are done here, after the
            // append they followed.
            self.log.complete_seals().map_err(|e| StoreError(e.to_string()))?;
        }
        if self.durability == Durability::Synced {
            self.log.flush().map_err(|e| StoreError(e.to_string()))?;
        }
        Ok(())
    }

    /// Writes the whole table as of the log end offset to a snapshot file,
    /// then drops the log below that offset.
    ///
    /// The log is fsynced first: a power cut must never leave a snapshot
    /// at offset S with the log ending below S, or the records written
    /// after the restart would get offsets the snapshot already covers,
    /// and the next start (loading the snapshot, replaying from S) would
    /// skip them.
    fn snapshot<T: Table>(&mut self, table: &Mutex<T>) -> io::Result<()> {
        self.log.flush()?;
        let offset = self.log.log_end_offset();
        // This thread is the only writer: the table cannot change while
        // the snapshot is written. Open transactions stay transactional,
        // for the markers after the snapshot's offset.
        let (records, open) = {
            let table = table.lock();
            (table.records(), table.transactional_records())
        };
        let contents = encode_snapshot::<T>(&records, open, now_ms()).map_err(io::Error::other)?;
        let storage = self.storage.as_ref();
        write_atomically(storage, &snapshot_path(&self.snapshots, offset), &contents)?;
        for (older, path) in list_snapshots(storage, &self.snapshots)? {
            if older < offset {
                remove_if_exists(storage, &path)?;
            }
        }
        self.log.delete_records_before(offset).map_err(io::Error::other)?;
        self.bytes_since_snapshot = 0;
        tracing::info!(
            log = T::NAME,
            offset,
            bytes = contents.len(),
            "wrote a coordinator log snapshot"
        );
        Ok(())
    }
}

/// The batches that rebuild a table: its records, then each open
/// transaction's records as a transactional batch of its producer (so the
/// markers after them still end them).
pub fn encode_snapshot<T: Table>(
    records: &[T::Record],
    open: Vec<(i64, i16, Vec<T::Record>)>,
    now_ms: i64,
) -> Result<Vec<u8>, String> {
    let mut contents = Vec::new();
    for chunk in records.chunks(SNAPSHOT_BATCH_RECORDS) {
        contents.extend_from_slice(&encode_batch::<T>(chunk.iter(), None, now_ms)?);
    }
    for (producer_id, producer_epoch, records) in open {
        let producer = Some((producer_id, producer_epoch));
        contents.extend_from_slice(&encode_batch::<T>(records.iter(), producer, now_ms)?);
    }
    Ok(contents)
}

fn snapshot_path(dir: &Path, offset: i64) -> PathBuf {
    dir.join(format!("{offset:020}.{SNAPSHOT_SUFFIX}"))
}

/// Snapshot files by offset, oldest first. Leftover temporary files from a
/// crash mid-snapshot are removed.
pub fn list_snapshots(storage: &dyn Storage, dir: &Path) -> io::Result<Vec<(i64, PathBuf)>> {
    let mut found = Vec::new();
    for entry in storage.read_dir(dir)? {
        let path = dir.join(&entry.name);
        match path.extension().and_then(|e| e.to_str()) {
            Some(SNAPSHOT_SUFFIX) => {
                if let Some(offset) = path
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .and_then(|s| s.parse().ok())
                {
                    found.push((offset, path));
                }
            }
            Some("tmp") => remove_if_exists(storage, &path)?,
            _ => {}
        }
    }
    found.sort();
    Ok(found)
}

/// The newest snapshot: its offset (0 if none) and table.
fn load_snapshot<T: Table>(storage: &dyn Storage, dir: &Path) -> Result<(i64, T), OpenError> {
    let snapshots = list_snapshots(storage, dir).map_err(|error| OpenError::Io {
        path: dir.to_path_buf(),
        error,
    })?;
    let Some((offset, path)) = snapshots.last() else {
        return Ok((0, T::default()));
    };
    let bytes = read_file(storage, path)
        .and_then(|b| b.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "vanished")))
        .map_err(|error| OpenError::Io {
            path: path.clone(),
            error,
        })?;
    let corrupt = |why: String| OpenError::Corrupt {
        path: path.clone(),
        why,
    };
    let mut table = T::default();
    validate_batches(&bytes).map_err(|e| corrupt(e.to_string()))?;
    for (_, entry) in decode_records::<T>(Bytes::from(bytes)).map_err(corrupt)? {
        entry.apply_to(&mut table);
    }
    Ok((*offset, table))
}

/// Applies every record at or after `from` in the log. Returns how many.
fn replay<T: Table>(log: &PartitionLog, from: i64, table: &mut T) -> Result<usize, String> {
    let mut next = from.max(log.log_start_offset());
    let mut count = 0;
    while next < log.log_end_offset() {
        let plan = log.read_plan(next, 1 << 20).map_err(|e| e.to_string())?;
        if plan.is_empty() {
            break;
        }
        let bytes = plan.execute().map_err(|e| e.to_string())?;
        let mut last = next - 1;
        for (offset, entry) in decode_records::<T>(bytes)? {
            last = last.max(offset);
            if offset >= next {
                entry.apply_to(table);
                count += 1;
            }
        }
        if last < next {
            return Err(format!("{}: no progress reading at offset {next}", T::NAME));
        }
        next = last + 1;
    }
    Ok(count)
}

/// One record or marker of a coordinator log, at its offset.
pub type Decoded<T> = (i64, Entry<<T as Table>::Record>);

/// Decodes whole record batches into `(offset, entry)` pairs, one record
/// or marker each.
pub fn decode_records<T: Table>(mut bytes: Bytes) -> Result<Vec<Decoded<T>>, String> {
    let sets = RecordBatchDecoder::decode_all(&mut bytes).map_err(|e| format!("{} batch: {e}", T::NAME))?;
    let mut out = Vec::new();
    for record in sets.into_iter().flat_map(|s| s.records) {
        let Some(key) = &record.key else {
            return Err(format!("{} record without a key", T::NAME));
        };
        let entry = if record.control {
            let marker = keel_log::marker::parse_record(key, record.value.as_deref())
                .map_err(|e| format!("{} marker: {e}", T::NAME))?;
            let Some(marker) = marker else {
                continue; // a control record of another kind
            };
            Entry::Marker {
                producer_id: record.producer_id,
                producer_epoch: record.producer_epoch,
                marker,
            }
        } else {
            let decoded =
                T::decode(key, record.value.as_deref()).map_err(|e| format!("{} record: {e}", T::NAME))?;
            if record.transactional {
                Entry::Transactional {
                    producer_id: record.producer_id,
                    producer_epoch: record.producer_epoch,
                    records: vec![decoded],
                }
            } else {
                Entry::Records(vec![decoded])
            }
        };
        out.push((record.offset, entry));
    }
    Ok(out)
}

/// The batches of `entries`, in order: consecutive plain writes share one
/// batch, each transactional write and marker has its own.
pub fn encode_entries<T: Table>(entries: &[Entry<T::Record>], now_ms: i64) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut plain: Vec<&T::Record> = Vec::new();
    for entry in entries {
        let batch = match entry {
            Entry::Records(records) => {
                plain.extend(records);
                continue;
            }
            Entry::Transactional {
                producer_id,
                producer_epoch,
                records,
            } => encode_batch::<T>(records.iter(), Some((*producer_id, *producer_epoch)), now_ms)?,
            Entry::Marker {
                producer_id,
                producer_epoch,
                marker,
            } => marker_batch(*producer_id, *producer_epoch, *marker, now_ms),
        };
        if !plain.is_empty() {
            out.extend(encode_batch::<T>(plain.drain(..), None, now_ms)?);
        }
        out.extend(batch);
    }
    if !plain.is_empty() {
        out.extend(encode_batch::<T>(plain.into_iter(), None, now_ms)?);
    }
    Ok(out)
}

/// One uncompressed v2 batch of the records, offsets from 0 (the log
/// assigns real ones); transactional under `producer`'s id and epoch when
/// given.
pub fn encode_batch<'a, T: Table>(
    records: impl Iterator<Item = &'a T::Record>,
    producer: Option<(i64, i16)>,
    now_ms: i64,
) -> Result<Vec<u8>, String> {
    let (producer_id, producer_epoch) = producer.unwrap_or((-1, -1));
    let records: Vec<Record> = records
        .enumerate()
        .map(|(i, r)| {
            let (key, value) = T::encode(r);
            Record {
                transactional: producer.is_some(),
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id,
                producer_epoch,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                // The encoder starts a new batch wherever offset minus
                // sequence changes: counting up from the batch's base
                // sequence, -1 (none), keeps the records in one batch, so
                // a write is all there after a crash or not at all.
                sequence: i as i32 - 1,
                timestamp: now_ms,
                key: Some(key),
                value,
                headers: Default::default(),
            }
        })
        .collect();
    let mut buf = BytesMut::new();
    let options = RecordEncodeOptions {
        version: 2,
        compression: Compression::None,
    };
    RecordBatchEncoder::encode(&mut buf, &records, &options).map_err(|e| e.to_string())?;
    Ok(buf.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records of strings, keyed by themselves.
    #[derive(Default)]
    struct Names;

    impl Table for Names {
        type Record = String;
        const NAME: &'static str = "names";
        fn apply(&mut self, _: String) {}
        fn records(&self) -> Vec<String> {
            Vec::new()
        }
        fn encode(record: &String) -> (Bytes, Option<Bytes>) {
            (Bytes::from(record.clone()), None)
        }
        fn decode(key: &[u8], _: Option<&[u8]>) -> Result<String, RecordError> {
            String::from_utf8(key.to_vec()).map_err(|e| RecordError(e.to_string()))
        }
    }

    /// A crash keeps a write whole or not at all only if it is one batch:
    /// consecutive plain writes share one, each transactional write and
    /// marker has its own, however many records each holds.
    #[test]
    fn each_write_is_one_batch() {
        let records = |n: usize| (0..n).map(|i| format!("r{i}")).collect::<Vec<_>>();
        let marker = Marker {
            commit: true,
            coordinator_epoch: 0,
        };
        let entries = vec![
            Entry::Records(records(5)),
            Entry::Records(records(3)),
            Entry::Transactional {
                producer_id: 7,
                producer_epoch: 1,
                records: records(4),
            },
            Entry::Marker {
                producer_id: 7,
                producer_epoch: 1,
                marker,
            },
            Entry::Records(records(SNAPSHOT_BATCH_RECORDS + 1)),
        ];
        let bytes = encode_entries::<Names>(&entries, 1_000).unwrap();
        let counts: Vec<i32> = validate_batches(&bytes)
            .unwrap()
            .iter()
            .map(|h| h.last_offset_delta + 1)
            .collect();
        assert_eq!(counts, vec![8, 4, 1, SNAPSHOT_BATCH_RECORDS as i32 + 1]);
        let decoded = decode_records::<Names>(Bytes::from(bytes)).unwrap();
        assert_eq!(decoded.len(), 8 + 4 + 1 + SNAPSHOT_BATCH_RECORDS + 1);
    }
}
