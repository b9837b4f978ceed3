//! The transaction coordinator: Kafka's transaction protocol for
//! transactional producers (KIP-98, with KIP-360's epoch recovery and
//! KIP-890's transactions v2).
//!
//! * [`state`]: one transactional id's state machine (no I/O, no clock);
//! * [`records`]: the transaction log's record schemas (Kafka's
//!   `__transaction_state`);
//! * this module: every id under one mutex, and the transaction log
//!   (`__keel_meta/transactions`, a [`crate::metalog`] log bounded by
//!   snapshots) that every state change is written to before it takes
//!   effect.
//!
//! The coordinator decides and persists; writing the markers into the
//! partitions is the broker's (`handlers::txn`), which reports back with
//! [`TxnCoordinator::complete`]. A single node coordinates every id, with
//! coordinator epoch 0. Locking: `txns` is never held across I/O or an
//! `.await`; an id whose next state is being written is `pending`.

pub mod records;
pub mod state;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use keel_protocol::ResponseError;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::codec::RecordError;
use crate::metalog::{Durability, MetaLog, Table};
pub use crate::partitioned::Owns;
use keel_log::clock::Clock;
use records::TxnRecord;
use state::{EndDecision, InitDecision, TxnEntry, TxnState, TxnStatus};

/// The coordinator epoch of every marker Keel writes: one node, never
/// re-elected.
pub const COORDINATOR_EPOCH: i32 = 0;

/// The partition a transaction takes in to commit a group's offsets (Kafka
/// names the group's `__consumer_offsets` partition; Keel keeps every
/// group in one group log, and calls it partition 0).
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";
pub const OFFSETS_PARTITION: i32 = 0;

pub fn offsets_partition() -> (String, i32) {
    (OFFSETS_TOPIC.to_string(), OFFSETS_PARTITION)
}

/// Settings from the broker's `transaction.*` configs.
#[derive(Debug, Clone, Copy)]
pub struct TxnConfig {
    /// `transaction.max.timeout.ms`.
    pub max_timeout_ms: i32,
    /// `transactional.id.expiration.ms`.
    pub id_expiration_ms: i64,
    /// `transaction.state.log.segment.bytes`: the log's segment size and
    /// how much it grows between snapshots.
    pub log_segment_bytes: u64,
}

/// Every transactional id the log holds.
#[derive(Debug, Default)]
pub struct TxnTable {
    pub txns: BTreeMap<String, TxnState>,
}

impl Table for TxnTable {
    type Record = TxnRecord;
    const NAME: &'static str = "txn-log";

    fn apply(&mut self, record: TxnRecord) {
        match record.value {
            Some(v) => self.txns.insert(record.transactional_id, v),
            None => self.txns.remove(&record.transactional_id),
        };
    }

    fn records(&self) -> Vec<TxnRecord> {
        self.txns
            .iter()
            .map(|(id, v)| TxnRecord {
                transactional_id: id.clone(),
                value: Some(v.clone()),
            })
            .collect()
    }

    fn encode(record: &TxnRecord) -> (Bytes, Option<Bytes>) {
        (record.encode_key(), record.encode_value())
    }

    fn decode(key: &[u8], value: Option<&[u8]>) -> Result<TxnRecord, RecordError> {
        TxnRecord::decode(key, value)
    }
}

impl crate::partitioned::Partitioned for TxnTable {
    fn split(
        entries: &[crate::metalog::Entry<TxnRecord>],
        _table: &TxnTable,
        partition_of: &dyn Fn(&str) -> i32,
    ) -> (
        crate::partitioned::ByPartition<TxnRecord>,
        Vec<std::collections::BTreeSet<i32>>,
    ) {
        crate::partitioned::split_records(entries, |r| r.transactional_id.as_str(), partition_of)
    }

    fn apply_written(&mut self, entry: crate::metalog::Entry<TxnRecord>, written: &dyn Fn(&str) -> bool) {
        if let crate::metalog::Entry::Records(records) = entry {
            for r in records.into_iter().filter(|r| written(&r.transactional_id)) {
                self.apply(r);
            }
        }
    }

    fn part(&self, keep: &dyn Fn(&str) -> bool) -> TxnTable {
        TxnTable {
            txns: self
                .txns
                .iter()
                .filter(|(id, _)| keep(id))
                .map(|(id, s)| (id.clone(), s.clone()))
                .collect(),
        }
    }

    fn keys(&self) -> usize {
        self.txns.len()
    }
}

/// What InitProducerId came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitOutcome {
    /// Call again with a freshly allocated producer id.
    NeedProducerId,
    /// The producer id and epoch to answer with.
    Ready(i64, i16),
    /// An open transaction is being aborted first (this PrepareAbort is
    /// persisted): write its markers and answer CONCURRENT_TRANSACTIONS.
    AbortFirst(TxnState),
}

/// What EndTxn came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndOutcome {
    /// Call again with a freshly allocated producer id (transactions v2,
    /// epoch exhausted).
    NeedProducerId,
    /// A retry of an end that is done: answer with this id and epoch.
    Done(i64, i16),
    /// This Prepare state is persisted: answer with its
    /// [`TxnState::handed_out`] id and epoch, then write its markers.
    Prepared(TxnState),
}

/// One transaction as DescribeTransactions and ListTransactions report it.
#[derive(Debug, Clone)]
pub struct TxnDescription {
    pub transactional_id: String,
    pub state: TxnState,
}

pub struct TxnCoordinator {
    txns: Mutex<HashMap<String, TxnEntry>>,
    /// Woken whenever an id's state is written (or its write failed), for
    /// the implicit adds waiting for their id to be free.
    changed: Notify,
    store: MetaLog<TxnTable>,
    config: TxnConfig,
    clock: Arc<dyn Clock>,
    /// In a cluster, the ids whose partition this coordinator holds: an
    /// id it knows nothing of is another coordinator's (NOT_COORDINATOR),
    /// not an unknown one. One node holds every id.
    holds: Option<Owns>,
}

impl TxnCoordinator {
    /// Loads the transaction log through `storage`. Blocking.
    pub fn open_with(
        storage: Arc<dyn keel_log::Storage>,
        dir: &Path,
        config: TxnConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<TxnCoordinator, crate::metalog::OpenError> {
        let log_config = crate::metalog::log_config(config.log_segment_bytes);
        let store: MetaLog<TxnTable> = MetaLog::open_with(
            storage,
            dir,
            log_config,
            config.log_segment_bytes,
            Durability::Written,
        )?;
        Ok(TxnCoordinator::with_store(store, config, clock, None))
    }

    /// A cluster's transaction coordinator, whose log goes to `sink` (the
    /// partitions of `__transaction_state`); it holds no id until
    /// [`TxnCoordinator::load`] hands it a partition's, and `holds` says
    /// which ids' partitions it holds.
    pub fn open_sink(
        sink: Box<dyn crate::metalog::Sink<TxnTable>>,
        holds: Owns,
        config: TxnConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<TxnCoordinator, crate::metalog::OpenError> {
        let store = MetaLog::with_sink(TxnTable::default(), sink)?;
        Ok(TxnCoordinator::with_store(store, config, clock, Some(holds)))
    }

    fn with_store(
        store: MetaLog<TxnTable>,
        config: TxnConfig,
        clock: Arc<dyn Clock>,
        holds: Option<Owns>,
    ) -> TxnCoordinator {
        let txns = store.with_table(|t| t.txns.iter().map(|(id, s)| (id.clone(), settled(s))).collect());
        TxnCoordinator {
            txns: Mutex::new(txns),
            changed: Notify::new(),
            store,
            config,
            clock,
            holds,
        }
    }

    /// `id`'s entry, if it has one; an id without one whose partition
    /// another coordinator holds is NOT_COORDINATOR (its partition was let
    /// go after the request was routed here).
    fn entry<'a>(
        &self,
        txns: &'a HashMap<String, TxnEntry>,
        id: &str,
    ) -> Result<Option<&'a TxnEntry>, ResponseError> {
        match txns.get(id) {
            None if self.holds.as_ref().is_some_and(|holds| !holds(id)) => Err(ResponseError::NotCoordinator),
            entry => Ok(entry),
        }
    }

    /// Takes in the ids of one partition of a cluster's transaction log,
    /// as its records rebuild them (`table`): they replace whatever this
    /// coordinator held of the ids `owns` says are that partition's.
    /// Returns the transactions among them whose markers were not all
    /// written (their last coordinator died or lost the partition while it
    /// wrote them): the caller writes them again, as after a restart.
    pub async fn load(&self, table: TxnTable, owns: Owns) -> Vec<(String, TxnState)> {
        let loaded: Vec<(String, TxnState)> =
            table.txns.iter().map(|(id, s)| (id.clone(), s.clone())).collect();
        let keep = Arc::clone(&owns);
        self.store
            .update(move |t| {
                t.txns.retain(|id, _| !keep(id));
                t.txns.extend(table.txns);
            })
            .await;
        {
            let mut txns = self.txns.lock();
            txns.retain(|id, _| !owns(id));
            txns.extend(loaded.iter().map(|(id, s)| (id.clone(), settled(s))));
        }
        self.changed.notify_waiters();
        loaded.into_iter().filter(|(_, s)| markers_due(s)).collect()
    }

    /// Lets go of the ids `owns` says: their partition of a cluster's
    /// transaction log is led by another broker now. The table goes first
    /// (in the log writer's order, after any write in flight), so a write
    /// answered after this does not bring its id back (see `persist`).
    pub async fn unload(&self, owns: Owns) {
        let keep = Arc::clone(&owns);
        self.store.update(move |t| t.txns.retain(|id, _| !keep(id))).await;
        self.txns.lock().retain(|id, _| !owns(id));
        self.changed.notify_waiters();
    }

    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Flushes and closes the transaction log. Blocking.
    pub fn close(&self) {
        self.store.close();
    }

    /// Marks `id` pending with `next` as the state being written (a new
    /// id is inserted), then writes it and applies it. A failed write
    /// leaves the old state (or no entry) and is COORDINATOR_NOT_AVAILABLE.
    async fn persist(&self, id: &str, next: TxnState) -> Result<(), ResponseError> {
        let record = TxnRecord {
            transactional_id: id.to_string(),
            value: Some(next.clone()),
        };
        let written = self.store.write(vec![record]).await;
        let applied = {
            let mut txns = self.txns.lock();
            match written {
                // In a cluster the id's partition may have been let go
                // while the write was answered (`unload`): its state is
                // the next leader's now.
                Ok(()) if !self.store.with_table(|t| t.txns.get(id) == Some(&next)) => {
                    txns.remove(id);
                    Err(ResponseError::NotCoordinator)
                }
                Ok(()) => {
                    txns.insert(
                        id.to_string(),
                        TxnEntry {
                            state: next,
                            pending: false,
                        },
                    );
                    Ok(())
                }
                Err(e) => {
                    tracing::error!(transactional_id = id, error = %e, "cannot persist a transaction state");
                    match txns.get_mut(id) {
                        Some(entry) if !is_placeholder(entry) => entry.pending = false,
                        _ => drop(txns.remove(id)),
                    }
                    Err(ResponseError::CoordinatorNotAvailable)
                }
            }
        };
        self.changed.notify_waiters();
        applied
    }

    /// Marks an id pending under the lock; inserts a placeholder for a
    /// new one (answered CONCURRENT_TRANSACTIONS until written).
    fn begin(txns: &mut HashMap<String, TxnEntry>, id: &str, next: &TxnState) {
        txns.entry(id.to_string())
            .or_insert_with(|| TxnEntry {
                state: TxnState {
                    producer_id: -1,
                    ..next.clone()
                },
                pending: true,
            })
            .pending = true;
    }

    /// InitProducerId with a transactional id; `server_version` is the
    /// `transaction.version` the broker finalized.
    pub async fn init_producer_id(
        &self,
        id: &str,
        timeout_ms: i32,
        expected: Option<(i64, i16)>,
        fresh_producer_id: Option<i64>,
        server_version: i16,
    ) -> Result<InitOutcome, ResponseError> {
        if timeout_ms <= 0 || timeout_ms > self.config.max_timeout_ms {
            return Err(ResponseError::InvalidTransactionTimeout);
        }
        let now = self.now_ms();
        let decision = {
            let mut txns = self.txns.lock();
            let decision = state::init(
                self.entry(&txns, id)?,
                timeout_ms,
                expected,
                fresh_producer_id,
                server_version,
                now,
            )?;
            if let InitDecision::Persist(next) | InitDecision::AbortOngoing(next) = &decision {
                Self::begin(&mut txns, id, next);
            }
            decision
        };
        match decision {
            InitDecision::NeedProducerId => Ok(InitOutcome::NeedProducerId),
            InitDecision::Persist(next) => {
                let (pid, epoch) = (next.producer_id, next.producer_epoch);
                self.persist(id, next).await?;
                Ok(InitOutcome::Ready(pid, epoch))
            }
            InitDecision::AbortOngoing(next) => {
                self.persist(id, next.clone()).await?;
                Ok(InitOutcome::AbortFirst(next))
            }
        }
    }

    /// AddPartitionsToTxn and AddOffsetsToTxn (`client_version` 0), and the
    /// implicit add of transactions v2 (Produce v12+, TxnOffsetCommit v5+).
    pub async fn add_partitions(
        &self,
        id: &str,
        producer_id: i64,
        epoch: i16,
        partitions: &[(String, i32)],
        client_version: i16,
        fenced: ResponseError,
    ) -> Result<(), ResponseError> {
        let now = self.now_ms();
        let next = {
            let mut txns = self.txns.lock();
            let entry = state::check_producer(self.entry(&txns, id)?, producer_id, epoch, fenced)?;
            let Some(next) = state::add_partitions(entry, partitions, client_version, now)? else {
                return Ok(());
            };
            Self::begin(&mut txns, id, &next);
            next
        };
        self.persist(id, next).await
    }

    /// The implicit add of a produce (transactions v2, Produce v12+) of
    /// every partition it writes, which waits up to `max_wait` while the id
    /// is busy (CONCURRENT_TRANSACTIONS): another state being written, or
    /// the last transaction's markers. Kafka's broker retries the add for
    /// `add.partitions.to.txn.retry.backoff.max.ms` for the same reason (a
    /// client starts its next transaction as soon as the last one's end is
    /// answered); this wakes on each state change instead of polling.
    pub async fn add_for_produce(
        &self,
        id: &str,
        (producer_id, epoch): (i64, i16),
        partitions: &[(String, i32)],
        max_wait: Duration,
    ) -> Result<(), ResponseError> {
        let deadline = tokio::time::Instant::now() + max_wait;
        loop {
            // Registered before the state is looked at, so that a change
            // between the look and the wait is not missed.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let added = self
                .add_partitions(
                    id,
                    producer_id,
                    epoch,
                    partitions,
                    state::TRANSACTION_VERSION_2,
                    ResponseError::ProducerFenced,
                )
                .await;
            match added {
                Err(ResponseError::ConcurrentTransactions) => {
                    if tokio::time::timeout_at(deadline, changed).await.is_err() {
                        return Err(ResponseError::ConcurrentTransactions);
                    }
                }
                other => return other,
            }
        }
    }

    /// Whether `partition` is in the open transaction of `id` with this
    /// producer id and epoch: what a transactional produce must find
    /// (Kafka's partition verification, KIP-890 part 1).
    pub fn verify(
        &self,
        id: &str,
        producer_id: i64,
        epoch: i16,
        partition: &(String, i32),
    ) -> Result<(), ResponseError> {
        // Asked by the partition's leader or the group's coordinator,
        // which in a cluster need not be the id's coordinator: an id not
        // held here is not in a transaction this broker can vouch for.
        let txns = self.txns.lock();
        let entry = state::check_producer(
            txns.get(id),
            producer_id,
            epoch,
            ResponseError::InvalidProducerEpoch,
        )?;
        let s = &entry.state;
        if s.status == TxnStatus::Ongoing && s.partitions.contains(partition) {
            Ok(())
        } else {
            Err(ResponseError::InvalidTxnState)
        }
    }

    /// EndTxn: v5+ (`v2`) under transactions v2's rules, which bump the
    /// epoch at every end.
    pub async fn end_txn(
        &self,
        id: &str,
        (producer_id, epoch): (i64, i16),
        commit: bool,
        v2: bool,
        fresh_producer_id: Option<i64>,
        fenced: ResponseError,
    ) -> Result<EndOutcome, ResponseError> {
        let now = self.now_ms();
        let next = {
            let mut txns = self.txns.lock();
            let decision = if v2 {
                state::end_v2(
                    self.entry(&txns, id)?,
                    producer_id,
                    epoch,
                    commit,
                    fresh_producer_id,
                    now,
                )?
            } else {
                let entry = state::check_producer(self.entry(&txns, id)?, producer_id, epoch, fenced)?;
                state::end(entry, commit, now)?
            };
            match decision {
                EndDecision::NeedProducerId => return Ok(EndOutcome::NeedProducerId),
                EndDecision::Done => {
                    let s = &txns.get(id).ok_or(ResponseError::InvalidProducerIdMapping)?.state;
                    return Ok(EndOutcome::Done(s.producer_id, s.producer_epoch));
                }
                EndDecision::Prepare(next) => {
                    Self::begin(&mut txns, id, &next);
                    next
                }
            }
        };
        self.persist(id, next.clone()).await?;
        Ok(EndOutcome::Prepared(next))
    }

    /// Every marker of `prepared` is written: the transaction is complete.
    /// Does nothing if `id` has moved on meanwhile.
    pub async fn complete(&self, id: &str, prepared: &TxnState) -> Result<(), ResponseError> {
        let next = {
            let mut txns = self.txns.lock();
            match txns.get(id) {
                Some(e) if !e.pending && e.state == *prepared => {}
                _ => return Ok(()),
            }
            let next = state::complete(prepared, self.now_ms());
            Self::begin(&mut txns, id, &next);
            next
        };
        self.persist(id, next).await
    }

    /// Aborts (persists PrepareAbort, under a bumped epoch) every open
    /// transaction past its timeout; returns them for their markers.
    /// `server_version` is the `transaction.version` the broker finalized.
    pub async fn abort_timed_out(&self, server_version: i16) -> Vec<(String, TxnState)> {
        let now = self.now_ms();
        let due: Vec<(String, TxnState)> = {
            let mut txns = self.txns.lock();
            let due: Vec<_> = txns
                .iter()
                .filter_map(|(id, e)| Some((id.clone(), state::timed_out(e, server_version, now)?)))
                .collect();
            for (id, next) in &due {
                Self::begin(&mut txns, id, next);
            }
            due
        };
        let mut aborted = Vec::new();
        for (id, next) in due {
            tracing::info!(transactional_id = %id, producer_id = next.producer_id, "aborting a transaction past its timeout");
            if self.persist(&id, next.clone()).await.is_ok() {
                aborted.push((id, next));
            }
        }
        aborted
    }

    /// Forgets ids idle past `transactional.id.expiration.ms`.
    pub async fn expire_ids(&self) {
        let now = self.now_ms();
        let expired: Vec<String> = {
            let mut txns = self.txns.lock();
            let ids: Vec<String> = txns
                .iter()
                .filter(|(_, e)| state::expired(e, now, self.config.id_expiration_ms))
                .map(|(id, _)| id.clone())
                .collect();
            for id in &ids {
                if let Some(e) = txns.get_mut(id) {
                    e.pending = true;
                }
            }
            ids
        };
        for id in expired {
            let tombstone = TxnRecord {
                transactional_id: id.clone(),
                value: None,
            };
            let written = self.store.write(vec![tombstone]).await;
            let mut txns = self.txns.lock();
            if written.is_ok() {
                txns.remove(&id);
            } else if let Some(e) = txns.get_mut(&id) {
                e.pending = false;
            }
        }
    }

    /// Transactions whose markers were not all written when the broker
    /// stopped: the caller writes them again.
    pub fn unfinished(&self) -> Vec<(String, TxnState)> {
        self.txns
            .lock()
            .iter()
            .filter(|(_, e)| markers_due(&e.state))
            .map(|(id, e)| (id.clone(), e.state.clone()))
            .collect()
    }

    /// One transactional id's persisted state.
    pub fn describe(&self, id: &str) -> Option<TxnState> {
        self.txns
            .lock()
            .get(id)
            .filter(|e| !is_placeholder(e))
            .map(|e| e.state.clone())
    }

    /// Every transactional id with a persisted state.
    pub fn describe_all(&self) -> Vec<TxnDescription> {
        let txns = self.txns.lock();
        let mut out: Vec<TxnDescription> = txns
            .iter()
            .filter(|(_, e)| !is_placeholder(e))
            .map(|(id, e)| TxnDescription {
                transactional_id: id.clone(),
                state: e.state.clone(),
            })
            .collect();
        out.sort_by(|a, b| a.transactional_id.cmp(&b.transactional_id));
        out
    }
}

/// Whether a transaction is prepared and its markers are to be written.
fn markers_due(state: &TxnState) -> bool {
    matches!(state.status, TxnStatus::PrepareCommit | TxnStatus::PrepareAbort)
}

/// A persisted state, with no write in flight.
fn settled(state: &TxnState) -> TxnEntry {
    TxnEntry {
        state: state.clone(),
        pending: false,
    }
}

/// An id whose first state is still being written.
fn is_placeholder(entry: &TxnEntry) -> bool {
    entry.pending && entry.state.producer_id < 0
}

#[cfg(test)]
mod tests;
