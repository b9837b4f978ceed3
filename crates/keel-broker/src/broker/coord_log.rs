//! A cluster's coordinator logs: the group coordinator's records
//! (committed offsets, group metadata, consumer groups, transactional
//! offsets and their markers) in the partitions of `__consumer_offsets`,
//! and the transaction coordinator's (each transactional id's state) in
//! those of `__transaction_state`, as Kafka keeps them. A key's records
//! (a group's, a transactional id's) go to the partition it falls in
//! (`catalog::coordinator_partition`), which the data plane leads like any
//! other partition: a write is acknowledged once the WAL committed it, and
//! when its broker dies the partition, rebuilt from the object store,
//! brings the key to its new leader.
//!
//! The broker loads a partition's keys when it takes the partition's
//! leadership (its records, read from the log start, rebuild them:
//! [`CoordinatorLog::read`], then the coordinator's `load`) and lets go of
//! them when it loses it. Until a partition is loaded its keys' requests
//! are answered COORDINATOR_LOAD_IN_PROGRESS, and the log refuses writes
//! to it.
//!
//! A partition's log is bounded as the one-node logs are: after
//! `offsets.topic.segment.bytes` (`transaction.state.log.segment.bytes`)
//! of writes, the keys it holds are written again (a snapshot, in the
//! same record schemas) and the log start is moved to the snapshot's first
//! offset (recorded in the cluster, as DeleteRecords does), so the WAL and
//! segment copies below it are collected.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use keel_coord::metalog::{encode_entries, encode_snapshot, Entry, Outcome, Sink, StoreError};
use keel_coord::partitioned::{apply_batches, Owns, Partitioned};
use keel_data::partition::Partition;
use keel_data::plane::DataPlane;
use keel_log::clock::now_ms;
use parking_lot::{Mutex, RwLock};

use super::catalog::{coordinator_partition, GROUPS_TOPIC, TRANSACTIONS_TOPIC};
use crate::Broker;

/// How much of a partition a load reads at a time.
const LOAD_CHUNK: usize = 1 << 20;

/// The partitions of one coordinators' topic this broker has loaded.
pub struct CoordinatorLog<T> {
    /// `__consumer_offsets` or `__transaction_state`.
    topic: &'static str,
    started: OnceLock<Started>,
    /// The topic's partition count, once known.
    partitions: AtomicI32,
    loaded: RwLock<BTreeMap<i32, Arc<Partition>>>,
    /// The partitions whose keys the coordinator holds: the loaded ones,
    /// and those set to be read again (`reload`), whose keys it holds
    /// until they are (or until they are let go).
    held: Mutex<BTreeSet<i32>>,
    /// Bytes written to each loaded partition since its last snapshot
    /// (its size when loaded).
    written: Mutex<BTreeMap<i32, u64>>,
    snapshot_bytes: u64,
    /// How long a write waits for its commit (`offsets.commit.timeout.ms`).
    timeout: Duration,
    pub stats: CoordinatorLogStats,
    table: std::marker::PhantomData<fn() -> T>,
}

/// What a coordinator log did, for `/stats` and `/metrics`.
#[derive(Default)]
pub struct CoordinatorLogStats {
    /// Partitions loaded (their keys read from their log).
    pub loads: AtomicU64,
    /// Snapshots written.
    pub snapshots: AtomicU64,
    /// Writes to a partition that failed (answered
    /// COORDINATOR_NOT_AVAILABLE).
    pub write_failures: AtomicU64,
    /// Partitions read again after a failed write.
    pub reloads: AtomicU64,
}

struct Started {
    handle: tokio::runtime::Handle,
    data: Arc<DataPlane>,
}

impl<T: Partitioned> CoordinatorLog<T> {
    pub fn new(topic: &'static str, snapshot_bytes: u64, timeout: Duration) -> Arc<CoordinatorLog<T>> {
        Arc::new(CoordinatorLog {
            topic,
            started: OnceLock::new(),
            partitions: AtomicI32::new(0),
            loaded: RwLock::new(BTreeMap::new()),
            held: Mutex::new(BTreeSet::new()),
            written: Mutex::new(BTreeMap::new()),
            snapshot_bytes: snapshot_bytes.max(1),
            timeout,
            stats: CoordinatorLogStats::default(),
            table: std::marker::PhantomData,
        })
    }

    /// Called once the broker runs: writes go through `data` on `handle`.
    pub fn start(&self, handle: tokio::runtime::Handle, data: Arc<DataPlane>) {
        let _ = self.started.set(Started { handle, data });
    }

    /// The partition the key (a group, a transactional id) falls in.
    pub fn partition_of(&self, key: &str) -> i32 {
        coordinator_partition(key, self.partitions.load(Ordering::Acquire))
    }

    /// Whether this broker has loaded partition `index`'s keys.
    pub fn is_loaded(&self, index: i32) -> bool {
        self.loaded.read().contains_key(&index)
    }

    /// The loaded partitions, for `/stats`.
    pub fn loaded(&self) -> Vec<i32> {
        self.loaded.read().keys().copied().collect()
    }

    /// The sink the coordinator writes through.
    pub fn sink(self: &Arc<Self>) -> Box<dyn Sink<T>> {
        Box::new(ClusterSink {
            log: Arc::clone(self),
        })
    }

    /// Takes partition `index`'s keys for not loaded: its requests are
    /// answered COORDINATOR_LOAD_IN_PROGRESS and writes to it refused
    /// until the broker's next pass over its leaderships reads them again
    /// from its log (`load` replaces what the coordinator held of them).
    fn reload(&self, index: i32) {
        if self.loaded.write().remove(&index).is_some() {
            self.written.lock().remove(&index);
            self.stats.reloads.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                partition = index,
                topic = self.topic,
                "a write to a coordinator's partition failed: its keys are read again from its log"
            );
        }
    }

    /// The log's partitions and counters, for `/stats`.
    pub fn stats_json(&self) -> serde_json::Value {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        serde_json::json!({
            "partitions": self.loaded(),
            "loads": n(&self.stats.loads),
            "snapshots": n(&self.stats.snapshots),
            "write_failures": n(&self.stats.write_failures),
            "reloads": n(&self.stats.reloads),
        })
    }

    /// Whether the coordinator holds a key's partition (see `held`).
    pub fn holds(self: &Arc<Self>) -> Owns {
        let log = Arc::clone(self);
        Arc::new(move |key: &str| log.held.lock().contains(&log.partition_of(key)))
    }

    /// Whether a key is partition `index`'s.
    pub fn owns(self: &Arc<Self>, index: i32) -> Owns {
        let log = Arc::clone(self);
        Arc::new(move |key: &str| log.partition_of(key) == index)
    }

    /// Reads `partition` (one of the topic's `count`), which this broker
    /// just took the leadership of, from its log start to its high
    /// watermark: the table its records rebuild, for the coordinator's
    /// `load`; then [`CoordinatorLog::loaded_now`].
    pub async fn read(&self, partition: &Arc<Partition>, count: i32) -> Result<(T, u64), String> {
        self.partitions.store(count, Ordering::Release);
        let part = Arc::clone(partition);
        let topic = self.topic;
        tokio::task::spawn_blocking(move || read_table(topic, &part))
            .await
            .map_err(|e| e.to_string())?
    }

    /// The coordinator has taken partition `index`'s keys in (`keys` of
    /// them, `bytes` read, since `started`): the partition takes writes and
    /// its keys' requests from now on.
    pub fn loaded_now(
        &self,
        index: i32,
        partition: &Arc<Partition>,
        keys: usize,
        bytes: u64,
        started: std::time::Instant,
    ) {
        self.loaded.write().insert(index, Arc::clone(partition));
        self.held.lock().insert(index);
        self.written.lock().insert(index, bytes);
        self.stats.loads.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            topic = self.topic,
            partition = index,
            keys,
            bytes,
            ms = started.elapsed().as_millis() as u64,
            "loaded a coordinator's partition"
        );
    }

    /// Marks partition `index` not loaded; false if the coordinator holds
    /// none of its keys (it was neither loaded nor set to be read again).
    pub fn let_go(&self, index: i32) -> bool {
        self.loaded.write().remove(&index);
        if !self.held.lock().remove(&index) {
            return false;
        }
        self.written.lock().remove(&index);
        tracing::info!(
            topic = self.topic,
            partition = index,
            "let go of a coordinator's partition"
        );
        true
    }
}

/// The table a partition's records rebuild, and how many bytes they take.
fn read_table<T: Partitioned>(topic: &str, partition: &Partition) -> Result<(T, u64), String> {
    let mut table = T::default();
    let (mut next, end) = (partition.log_start_offset(), partition.high_watermark());
    let mut bytes = 0;
    while next < end {
        let read = partition.read_blocking(next, LOAD_CHUNK)?;
        if read.is_empty() {
            return Err(format!(
                "{topic}-{}: nothing to read at offset {next}, below the high watermark {end}",
                partition.index
            ));
        }
        bytes += read.len() as u64;
        match apply_batches(&mut table, read, next)? {
            Some(last) if last >= next => next = last + 1,
            _ => return Err(format!("{topic}: no progress reading at offset {next}")),
        }
    }
    Ok((table, bytes))
}

/// A coordinator's writes, on its log's writer thread.
struct ClusterSink<T> {
    log: Arc<CoordinatorLog<T>>,
}

impl<T: Partitioned> ClusterSink<T> {
    fn started(&self) -> Result<&Started, StoreError> {
        self.log
            .started
            .get()
            .ok_or_else(|| StoreError("the broker has not started".into()))
    }

    fn partition(&self, index: i32) -> Result<Arc<Partition>, StoreError> {
        self.log.loaded.read().get(&index).cloned().ok_or_else(|| {
            StoreError(format!(
                "partition {index} of {} is not led by this broker",
                self.log.topic
            ))
        })
    }

    /// Writes a partition's snapshot and moves its log start to it.
    fn snapshot(&self, index: i32, table: &Mutex<T>) -> Result<(), StoreError> {
        let started = self.started()?;
        let partition = self.partition(index)?;
        let (records, open) = {
            let part = table
                .lock()
                .part(&|key: &str| self.log.partition_of(key) == index);
            (part.records(), part.transactional_records())
        };
        let buf = encode_snapshot::<T>(&records, open, now_ms()).map_err(StoreError)?;
        let bytes = buf.len() as u64;
        let timeout = self.log.timeout;
        let data = &started.data;
        let start = started.handle.block_on(async {
            let start = if buf.is_empty() {
                partition.high_watermark()
            } else {
                write_durably(&partition, buf, timeout).await?
            };
            let part = Arc::clone(&partition);
            tokio::task::spawn_blocking(move || {
                part.with_log(|log| log.delete_records_before(start).map_err(|e| e.to_string()))
                    .map_err(|e| e.to_string())
                    .and_then(|r| r)
            })
            .await
            .map_err(|e| StoreError(e.to_string()))?
            .map_err(StoreError)?;
            match keel_data::takeover::record_log_start(data, &partition).await {
                Ok(true) => Ok(start),
                Ok(false) => Err(StoreError("this broker no longer leads the partition".into())),
                Err(why) => Err(StoreError(why)),
            }
        })?;
        self.log.stats.snapshots.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            topic = self.log.topic,
            partition = index,
            offset = start,
            bytes,
            "wrote a snapshot of a coordinator's partition"
        );
        Ok(())
    }
}

/// Appends a coordinator's batches and waits for their commit: their base
/// offset.
async fn write_durably(
    partition: &Arc<Partition>,
    buf: Vec<u8>,
    timeout: Duration,
) -> Result<i64, StoreError> {
    let headers = keel_log::batch::validate_batches(&buf).map_err(|e| StoreError(e.to_string()))?;
    let appended = partition
        .append_unchecked(Bytes::from(buf), headers)
        .await
        .map_err(|f| StoreError(f.message))?;
    partition
        .wait_durable(&appended, timeout)
        .await
        .map_err(|e| StoreError(format!("not committed: {e:?}")))?;
    Ok(appended.base_offset)
}

impl<T: Partitioned> Sink<T> for ClusterSink<T> {
    fn append(&mut self, entries: &[Entry<T::Record>], table: &Mutex<T>) -> Vec<Outcome<T>> {
        let Some(started) = self.log.started.get() else {
            let e = StoreError("the broker has not started".into());
            return entries.iter().map(|_| Outcome::Failed(e.clone())).collect();
        };
        let (split, touched) = {
            let table = table.lock();
            T::split(entries, &table, &|key| self.log.partition_of(key))
        };
        // Each partition's part is written on its own, all at once.
        let mut outcomes: BTreeMap<i32, Result<(), StoreError>> = BTreeMap::new();
        let mut writes = Vec::with_capacity(split.len());
        for (index, part) in split {
            let prepared = self.partition(index).and_then(|partition| {
                let buf = encode_entries::<T>(&part, now_ms()).map_err(StoreError)?;
                Ok((partition, buf))
            });
            match prepared {
                Ok((partition, buf)) => writes.push((index, partition, buf)),
                Err(e) => {
                    outcomes.insert(index, Err(e));
                }
            }
        }
        let timeout = self.log.timeout;
        let results = started.handle.block_on(async {
            let tasks: Vec<_> = writes
                .into_iter()
                .map(|(index, partition, buf)| {
                    let len = buf.len() as u64;
                    let task = tokio::spawn(async move { write_durably(&partition, buf, timeout).await });
                    (index, len, task)
                })
                .collect();
            let mut results = Vec::with_capacity(tasks.len());
            for (index, len, task) in tasks {
                let result = task.await.unwrap_or_else(|e| Err(StoreError(e.to_string())));
                results.push((index, len, result));
            }
            results
        });
        // A partition whose write failed may hold it all the same (a
        // commit that timed out, then came through): its keys are read
        // again from its log (see `reload`), which is the truth.
        let mut reload = BTreeSet::new();
        {
            let mut written = self.log.written.lock();
            for (index, len, result) in results {
                match &result {
                    Ok(_) => {
                        if let Some(bytes) = written.get_mut(&index) {
                            *bytes += len;
                        }
                    }
                    Err(_) => {
                        self.log.stats.write_failures.fetch_add(1, Ordering::Relaxed);
                        reload.insert(index);
                    }
                }
                outcomes.insert(index, result.map(|_| ()));
            }
        }
        let answers = entries
            .iter()
            .zip(touched)
            .map(|(entry, partitions)| {
                let failed: BTreeSet<i32> = partitions
                    .iter()
                    .filter(|p| outcomes.get(p).is_some_and(Result::is_err))
                    .copied()
                    .collect();
                let Some(error) = failed
                    .iter()
                    .find_map(|p| outcomes.get(p).and_then(|r| r.clone().err()))
                else {
                    return Outcome::Written;
                };
                if failed.len() == partitions.len() {
                    return Outcome::Failed(error);
                }
                if !matches!(entry, Entry::Records(_)) {
                    // A transaction's part in some partitions only: the
                    // table keeps one epoch per producer and cannot hold
                    // that; the partitions that took it are read again.
                    reload.extend(partitions.difference(&failed));
                    return Outcome::Failed(error);
                }
                // Plain records: what reached the partitions that took it
                // is in their logs, and the table takes that part.
                let log = Arc::clone(&self.log);
                let written = move |key: &str| !failed.contains(&log.partition_of(key));
                let entry = entry.clone();
                Outcome::Partly {
                    apply: Box::new(move |table: &mut T| table.apply_written(entry, &written)),
                    error,
                }
            })
            .collect();
        for index in reload {
            self.log.reload(index);
        }
        answers
    }

    fn tend(&mut self, table: &Mutex<T>, _wrote: bool) {
        let due: Vec<i32> = self
            .log
            .written
            .lock()
            .iter()
            .filter(|(_, bytes)| **bytes >= self.log.snapshot_bytes)
            .map(|(index, _)| *index)
            .collect();
        for index in due {
            let snapshot = self.snapshot(index, table);
            // Next after as many bytes again (also when it failed).
            if let Some(bytes) = self.log.written.lock().get_mut(&index) {
                *bytes = 0;
            }
            if let Err(e) = snapshot {
                tracing::warn!(topic = self.log.topic, partition = index, error = %e, "cannot snapshot a coordinator's partition");
            }
        }
    }

    fn close(&mut self) {}
}

/// Loads partition `index` (of `count`) of the coordinators' topic
/// `topic`, which this broker just took the leadership of: its keys go to
/// their coordinator, and then the partition takes their requests. A
/// transaction it holds prepared has its markers written again.
pub async fn load(
    broker: &Arc<Broker>,
    topic: &str,
    partition: &Arc<Partition>,
    index: i32,
    count: i32,
) -> Result<(), String> {
    let started = std::time::Instant::now();
    if topic == GROUPS_TOPIC {
        let log = &broker.group_log;
        let (table, bytes) = log.read(partition, count).await?;
        let keys = table.keys();
        broker.groups.load(table, log.owns(index)).await;
        log.loaded_now(index, partition, keys, bytes, started);
    } else if topic == TRANSACTIONS_TOPIC {
        let log = &broker.txn_log;
        let (table, bytes) = log.read(partition, count).await?;
        let keys = table.keys();
        let unfinished = broker.txns.load(table, log.owns(index)).await;
        log.loaded_now(index, partition, keys, bytes, started);
        for (id, prepared) in unfinished {
            tracing::info!(transactional_id = %id, status = prepared.status.name(), "finishing a transaction its last coordinator prepared");
            crate::handlers::markers::spawn_markers(broker, id, prepared);
        }
    }
    Ok(())
}

/// Lets go of the keys of partition `index` of the coordinators' topic
/// `topic`, which another broker leads now (or this one's session ended).
pub async fn unload(broker: &Arc<Broker>, topic: &str, index: i32) {
    if topic == GROUPS_TOPIC {
        let log = &broker.group_log;
        if log.let_go(index) {
            broker.groups.unload(log.owns(index)).await;
        }
    } else if topic == TRANSACTIONS_TOPIC {
        let log = &broker.txn_log;
        if log.let_go(index) {
            broker.txns.unload(log.owns(index)).await;
        }
    }
}
