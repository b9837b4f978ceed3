//! The group log: committed offsets and group metadata, persisted as record
//! batches in a partition log of Keel's own (`__keel_meta/groups/log`), in
//! the record schemas of Kafka's `__consumer_offsets` ([`super::records`]).
//!
//! One writer thread owns the log. Writes from every group queue up and are
//! appended together (group commit); each is acknowledged after its batch is
//! in the segment file and applied to the in-memory table, so a commit that
//! was acknowledged is visible to the next OffsetFetch and survives a crash
//! of the process.
//!
//! The log does not grow without bound: after `snapshot_bytes` of appends,
//! the writer writes the whole live table to a snapshot file
//! (`snapshots/<offset>.snapshot`: record batches of the same records,
//! written to a temporary name, fsynced, renamed) and drops the log below
//! that offset. Start-up loads the newest snapshot and replays the log from
//! the snapshot's offset.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use keel_log::batch::validate_batches;
use keel_log::storage::{read_file, remove_if_exists, sync_parent, write_atomically, Storage};
use keel_log::{LogConfig, PartitionLog};
use keel_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::records::{CommittedOffset, GroupMetadata, GroupRecord};
use crate::time::now_ms;

/// Committed offsets of one group, by `(topic, partition)`.
pub type GroupOffsets = BTreeMap<(String, i32), CommittedOffset>;

/// Everything the group log holds, as of its last applied record.
#[derive(Debug, Default, Clone)]
pub struct GroupTable {
    pub offsets: BTreeMap<String, GroupOffsets>,
    pub groups: BTreeMap<String, GroupMetadata>,
}

impl GroupTable {
    fn apply(&mut self, record: GroupRecord) {
        match record {
            GroupRecord::Offset {
                group,
                topic,
                partition,
                value: Some(v),
            } => {
                self.offsets
                    .entry(group)
                    .or_default()
                    .insert((topic, partition), v);
            }
            GroupRecord::Offset {
                group,
                topic,
                partition,
                value: None,
            } => {
                if let Some(offsets) = self.offsets.get_mut(&group) {
                    offsets.remove(&(topic, partition));
                    if offsets.is_empty() {
                        self.offsets.remove(&group);
                    }
                }
            }
            GroupRecord::Group {
                group,
                value: Some(v),
            } => {
                self.groups.insert(group, v);
            }
            GroupRecord::Group { group, value: None } => {
                self.groups.remove(&group);
            }
        }
    }

    fn records(&self) -> impl Iterator<Item = GroupRecord> + '_ {
        let groups = self.groups.iter().map(|(g, v)| GroupRecord::Group {
            group: g.clone(),
            value: Some(v.clone()),
        });
        let offsets = self.offsets.iter().flat_map(|(g, offsets)| {
            offsets.iter().map(move |((t, p), v)| GroupRecord::Offset {
                group: g.clone(),
                topic: t.clone(),
                partition: *p,
                value: Some(v.clone()),
            })
        });
        groups.chain(offsets)
    }
}

/// Why a write to the group log failed (reported to clients as
/// COORDINATOR_NOT_AVAILABLE).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError(pub String);

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "group log: {}", self.0)
    }
}

/// Acknowledges one write once it is in the log and applied.
type WriteAck = oneshot::Sender<Result<(), StoreError>>;

enum Command {
    Write {
        records: Vec<GroupRecord>,
        reply: WriteAck,
    },
    Close {
        done: mpsc::Sender<()>,
    },
}

pub struct GroupStore {
    commands: Mutex<Option<mpsc::Sender<Command>>>,
    table: Arc<Mutex<GroupTable>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

const SNAPSHOT_SUFFIX: &str = "snapshot";
/// Records per batch in a snapshot file.
const SNAPSHOT_BATCH_RECORDS: usize = 4096;
/// How often the writer checks `flush.ms` while idle.
const FLUSH_CHECK: Duration = Duration::from_millis(100);

impl GroupStore {
    /// [`GroupStore::open_with`] on the real filesystem.
    pub fn open(dir: &Path, log_config: LogConfig, snapshot_bytes: u64) -> Result<GroupStore, String> {
        GroupStore::open_with(keel_log::DiskStorage::shared(), dir, log_config, snapshot_bytes)
    }

    /// Loads the newest snapshot, replays the log after it and starts the
    /// writer thread. Every file operation goes through `storage`. Blocking.
    pub fn open_with(
        storage: Arc<dyn Storage>,
        dir: &Path,
        log_config: LogConfig,
        snapshot_bytes: u64,
    ) -> Result<GroupStore, String> {
        let snapshots = dir.join("snapshots");
        let created = storage
            .create_dir_all(&snapshots)
            .and_then(|()| sync_parent(storage.as_ref(), &snapshots))
            .and_then(|()| sync_parent(storage.as_ref(), dir));
        created.map_err(|e| format!("{}: {e}", snapshots.display()))?;
        let (snapshot_offset, mut table) = load_snapshot(storage.as_ref(), &snapshots)?;
        let log_dir = dir.join("log");
        let log = PartitionLog::open_with(Arc::clone(&storage), &log_dir, log_config)
            .map_err(|e| format!("{}: {e}", log_dir.display()))?;
        if log.log_start_offset() > snapshot_offset {
            return Err(format!(
                "{}: the log starts at offset {} but no snapshot covers the records before it",
                log_dir.display(),
                log.log_start_offset()
            ));
        }
        let replayed = replay(&log, snapshot_offset, &mut table)?;
        tracing::info!(
            groups = table.groups.len(),
            offset_groups = table.offsets.len(),
            snapshot_offset,
            replayed,
            "loaded the group log"
        );
        let table = Arc::new(Mutex::new(table));
        let (tx, rx) = mpsc::channel();
        let mut writer = Writer {
            log,
            storage,
            snapshots,
            table: Arc::clone(&table),
            bytes_since_snapshot: 0,
            snapshot_bytes,
        };
        let handle = std::thread::Builder::new()
            .name("keel-group-log".into())
            .spawn(move || writer.run(rx))
            .map_err(|e| format!("cannot start the group log writer: {e}"))?;
        Ok(GroupStore {
            commands: Mutex::new(Some(tx)),
            table,
            writer: Mutex::new(Some(handle)),
        })
    }

    /// Appends records; resolves once they are in the log file and applied.
    pub async fn write(&self, records: Vec<GroupRecord>) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        let (reply, rx) = oneshot::channel();
        let sent = match &*self.commands.lock() {
            Some(tx) => tx.send(Command::Write { records, reply }).is_ok(),
            None => false,
        };
        if !sent {
            return Err(StoreError("closed".into()));
        }
        rx.await
            .unwrap_or_else(|_| Err(StoreError("writer stopped".into())))
    }

    /// Reads the table (no I/O happens under this lock).
    pub fn with_table<R>(&self, f: impl FnOnce(&GroupTable) -> R) -> R {
        f(&self.table.lock())
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

impl Drop for GroupStore {
    fn drop(&mut self) {
        self.close();
    }
}

struct Writer {
    log: PartitionLog,
    storage: Arc<dyn Storage>,
    snapshots: PathBuf,
    table: Arc<Mutex<GroupTable>>,
    bytes_since_snapshot: u64,
    snapshot_bytes: u64,
}

impl Writer {
    fn run(&mut self, rx: mpsc::Receiver<Command>) {
        loop {
            let first = match rx.recv_timeout(FLUSH_CHECK) {
                Ok(c) => c,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    self.flush_if_due();
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return self.close(None),
            };
            let mut writes = Vec::new();
            let mut close = None;
            for command in std::iter::once(first).chain(rx.try_iter()) {
                match command {
                    Command::Write { records, reply } => writes.push((records, reply)),
                    Command::Close { done } => close = Some(done),
                }
            }
            self.write(writes);
            if close.is_some() {
                return self.close(close);
            }
            self.flush_if_due();
            if self.bytes_since_snapshot >= self.snapshot_bytes {
                if let Err(e) = self.snapshot() {
                    tracing::error!(error = %e, "cannot snapshot the group log; it keeps growing");
                }
            }
        }
    }

    fn write(&mut self, writes: Vec<(Vec<GroupRecord>, WriteAck)>) {
        if writes.is_empty() {
            return;
        }
        let records: Vec<&GroupRecord> = writes.iter().flat_map(|(r, _)| r.iter()).collect();
        let result = self.append(&records);
        if result.is_ok() {
            let mut table = self.table.lock();
            for r in records {
                table.apply(r.clone());
            }
        }
        for (_, reply) in writes {
            let _ = reply.send(result.clone());
        }
    }

    fn append(&mut self, records: &[&GroupRecord]) -> Result<(), StoreError> {
        let mut buf = encode_batch(records.iter().copied(), now_ms()).map_err(StoreError)?;
        let headers = validate_batches(&buf).map_err(|e| StoreError(e.to_string()))?;
        let info = self
            .log
            .append(&mut buf, &headers, now_ms())
            .map_err(|e| StoreError(e.to_string()))?;
        self.bytes_since_snapshot += buf.len() as u64;
        if info.rolled {
            // This thread is the group log's only writer: its seals (index
            // files, fsync of the rolled segment) are done here, after the
            // append they followed.
            self.log.complete_seals().map_err(|e| StoreError(e.to_string()))?;
        }
        Ok(())
    }

    fn flush_if_due(&mut self) {
        if self.log.needs_time_flush(now_ms()) {
            if let Err(e) = self.log.flush() {
                tracing::error!(error = %e, "cannot flush the group log");
            }
        }
    }

    /// Writes the whole table as of the log end offset to a snapshot file,
    /// then drops the log below that offset.
    fn snapshot(&mut self) -> io::Result<()> {
        let offset = self.log.log_end_offset();
        let table = self.table.lock().clone();
        let mut contents = Vec::new();
        let records: Vec<GroupRecord> = table.records().collect();
        for chunk in records.chunks(SNAPSHOT_BATCH_RECORDS) {
            let batch = encode_batch(chunk.iter(), now_ms()).map_err(io::Error::other)?;
            contents.extend_from_slice(&batch);
        }
        let storage = self.storage.as_ref();
        write_atomically(storage, &snapshot_path(&self.snapshots, offset), &contents)?;
        for (older, path) in list_snapshots(storage, &self.snapshots)? {
            if older < offset {
                remove_if_exists(storage, &path)?;
            }
        }
        self.log.delete_records_before(offset).map_err(io::Error::other)?;
        self.bytes_since_snapshot = 0;
        tracing::info!(offset, bytes = contents.len(), "wrote a group log snapshot");
        Ok(())
    }

    fn close(&mut self, done: Option<mpsc::Sender<()>>) {
        if let Err(e) = self.log.close() {
            tracing::error!(error = %e, "cannot close the group log");
        }
        if let Some(done) = done {
            let _ = done.send(());
        }
    }
}

fn snapshot_path(dir: &Path, offset: i64) -> PathBuf {
    dir.join(format!("{offset:020}.{SNAPSHOT_SUFFIX}"))
}

/// Snapshot files by offset, oldest first. Leftover temporary files from a
/// crash mid-snapshot are removed.
fn list_snapshots(storage: &dyn Storage, dir: &Path) -> io::Result<Vec<(i64, PathBuf)>> {
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
fn load_snapshot(storage: &dyn Storage, dir: &Path) -> Result<(i64, GroupTable), String> {
    let snapshots = list_snapshots(storage, dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let Some((offset, path)) = snapshots.last() else {
        return Ok((0, GroupTable::default()));
    };
    let bytes = read_file(storage, path)
        .and_then(|b| b.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "vanished")))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut table = GroupTable::default();
    validate_batches(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    for record in decode_records(Bytes::from(bytes)).map_err(|e| format!("{}: {e}", path.display()))? {
        table.apply(record.1);
    }
    Ok((*offset, table))
}

/// Applies every record at or after `from` in the log. Returns how many.
fn replay(log: &PartitionLog, from: i64, table: &mut GroupTable) -> Result<usize, String> {
    let mut next = from.max(log.log_start_offset());
    let mut count = 0;
    while next < log.log_end_offset() {
        let plan = log.read_plan(next, 1 << 20).map_err(|e| e.to_string())?;
        if plan.is_empty() {
            break;
        }
        let bytes = plan.execute().map_err(|e| e.to_string())?;
        let mut last = next - 1;
        for (offset, record) in decode_records(bytes)? {
            last = last.max(offset);
            if offset >= next {
                table.apply(record);
                count += 1;
            }
        }
        if last < next {
            return Err(format!("group log: no progress reading at offset {next}"));
        }
        next = last + 1;
    }
    Ok(count)
}

/// Decodes whole record batches into `(offset, record)` pairs.
fn decode_records(mut bytes: Bytes) -> Result<Vec<(i64, GroupRecord)>, String> {
    let sets = RecordBatchDecoder::decode_all(&mut bytes).map_err(|e| format!("group log batch: {e}"))?;
    let mut out = Vec::new();
    for record in sets.into_iter().flat_map(|s| s.records) {
        let Some(key) = &record.key else {
            return Err("group log record without a key".into());
        };
        let decoded = GroupRecord::decode(key, record.value.as_deref()).map_err(|e| e.to_string())?;
        out.push((record.offset, decoded));
    }
    Ok(out)
}

/// One uncompressed v2 batch of the records, offsets from 0 (the log
/// assigns real ones).
fn encode_batch<'a>(records: impl Iterator<Item = &'a GroupRecord>, now_ms: i64) -> Result<Vec<u8>, String> {
    let records: Vec<Record> = records
        .enumerate()
        .map(|(i, r)| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: -1,
            timestamp: now_ms,
            key: Some(r.encode_key()),
            value: r.encode_value(),
            headers: Default::default(),
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

    fn offset_record(group: &str, partition: i32, offset: i64) -> GroupRecord {
        GroupRecord::Offset {
            group: group.into(),
            topic: "t".into(),
            partition,
            value: Some(CommittedOffset {
                offset,
                leader_epoch: -1,
                metadata: String::new(),
                commit_timestamp_ms: 1,
            }),
        }
    }

    fn small_log() -> LogConfig {
        LogConfig {
            segment_bytes: 4096,
            ..LogConfig::default()
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().build().unwrap()
    }

    #[test]
    fn batches_are_valid_kafka_batches() {
        let r = offset_record("g", 0, 5);
        let batch = encode_batch([&r].into_iter(), 7).unwrap();
        let header = keel_log::batch::BatchHeader::parse(&batch).unwrap();
        assert_eq!(header.records_count, 1);
        keel_log::batch::check_crc(&batch, &header).unwrap();
    }

    #[test]
    fn writes_survive_reopen_and_snapshots_bound_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let rt = runtime();
        {
            let store = GroupStore::open(dir.path(), small_log(), 8192).unwrap();
            for i in 0..2000 {
                rt.block_on(store.write(vec![offset_record("g", i % 4, i64::from(i))]))
                    .unwrap();
            }
            rt.block_on(store.write(vec![offset_record("gone", 0, 1)]))
                .unwrap();
            rt.block_on(store.write(vec![GroupRecord::Offset {
                group: "gone".into(),
                topic: "t".into(),
                partition: 0,
                value: None,
            }]))
            .unwrap();
            store.close();
        }
        let log_bytes: u64 = std::fs::read_dir(dir.path().join("log"))
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        // 2000 commits of ~100 bytes each were written; the snapshots keep
        // the log to a few segments.
        assert!(log_bytes < 64 * 1024, "group log holds {log_bytes} bytes");
        assert!(
            !list_snapshots(&keel_log::DiskStorage, &dir.path().join("snapshots"))
                .unwrap()
                .is_empty()
        );
        let store = GroupStore::open(dir.path(), small_log(), 8192).unwrap();
        store.with_table(|t| {
            let g = &t.offsets["g"];
            for p in 0..4 {
                assert_eq!(g[&("t".to_string(), p)].offset, i64::from(1996 + p));
            }
            assert!(!t.offsets.contains_key("gone"));
        });
        store.close();
    }

    #[test]
    fn a_torn_tail_loses_only_unacknowledged_records() {
        let dir = tempfile::tempdir().unwrap();
        let rt = runtime();
        let store = GroupStore::open(dir.path(), LogConfig::default(), u64::MAX).unwrap();
        rt.block_on(store.write(vec![offset_record("g", 0, 10)])).unwrap();
        // Reopened as after a crash (no clean-shutdown marker), with
        // garbage appended as a torn write would leave it.
        drop(store);
        std::fs::remove_file(dir.path().join("log").join(keel_log::CLEAN_SHUTDOWN_FILE)).unwrap();
        let segment = std::fs::read_dir(dir.path().join("log"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "log"))
            .unwrap();
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().append(true).open(&segment).unwrap();
        f.write_all(&[0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 1]).unwrap();
        let store = GroupStore::open(dir.path(), LogConfig::default(), u64::MAX).unwrap();
        store.with_table(|t| assert_eq!(t.offsets["g"][&("t".to_string(), 0)].offset, 10));
        rt.block_on(store.write(vec![offset_record("g", 0, 11)])).unwrap();
        store.close();
    }
}
