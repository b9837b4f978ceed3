//! The share group coordinator (KIP-932): Kafka's queues. Many members
//! read the same partitions; each record is acquired by one member at a
//! time, under a lock that runs out, and acknowledged one by one.
//!
//! * [`group`]: one share group's membership and its `simple` assignor;
//! * [`partition`]: one share partition's records, the state machine at
//!   the heart of it;
//! * share sessions (here): what partitions a member's ShareFetch
//!   requests cover, and their epochs.
//!
//! Locking: one mutex guards every share group, share partition and
//! session. It is never held across I/O or an `.await`: the broker reads
//! the log first, then acquires what it read under the lock. A change of
//! a share partition queues its new state on the share log
//! ([`store`]) before the lock is released, so the log has the changes in
//! the order they were made; acknowledgements are answered once theirs
//! is written. Time comes
//! in as `now_ms`; the broker sweeps expired locks and members
//! ([`ShareCoordinator::sweep`]) and a fetch waiting for records wakes on
//! [`ShareCoordinator::changes`], which moves whenever records become
//! available again.

pub mod group;
pub mod partition;
pub mod store;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use keel_protocol::ResponseError;
use parking_lot::Mutex;
use tokio::sync::watch;
use uuid::Uuid;

use crate::groups::consumer::Topics;
use crate::metalog::{log_config, Durability, Entry, MetaLog, OpenError, StoreError};
use group::{ShareGroup, ShareGroupConfig, ShareGroupState, ShareHeartbeat, ShareHeartbeatAnswer};
use keel_log::storage::Storage;
use partition::{AckError, AckType, Acquired, LogRead, ShareCounts, ShareLimits, SharePartition};
use store::{ShareRecord, ShareTable};

/// The share session epoch that opens a session, and the one that closes it.
pub const INITIAL_EPOCH: i32 = 0;
pub const FINAL_EPOCH: i32 = -1;

/// A share partition's key: the group, the topic's id, the partition.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShareKey {
    pub group: String,
    pub topic_id: Uuid,
    pub partition: i32,
}

/// An error and its message, as the response carries them.
pub type ShareError = (ResponseError, String);

/// What one member's ShareFetch requests cover.
#[derive(Debug, Clone)]
struct ShareSession {
    /// The epoch the next request must carry.
    epoch: i32,
    partitions: BTreeSet<(Uuid, i32)>,
    /// The connection the session lives on: it ends with it.
    connection: u64,
}

/// One acknowledgement batch of a request.
#[derive(Debug, Clone)]
pub struct AckBatch {
    pub first_offset: i64,
    pub last_offset: i64,
    pub types: Vec<AckType>,
}

/// A share group as ShareGroupDescribe reports it.
#[derive(Debug, Clone)]
pub struct ShareGroupDescription {
    pub group_id: String,
    pub state: ShareGroupState,
    pub epoch: i32,
    pub assignment_epoch: i32,
    pub members: Vec<group::ShareMember>,
}

/// One share partition's numbers, for `/stats` and `keel stats`.
#[derive(Debug, Clone)]
pub struct SharePartitionStats {
    pub key: ShareKey,
    pub start_offset: i64,
    pub end_offset: i64,
    pub counts: ShareCounts,
}

#[derive(Default)]
struct State {
    groups: BTreeMap<String, ShareGroup>,
    partitions: HashMap<ShareKey, SharePartition>,
    sessions: HashMap<(String, String), ShareSession>,
}

pub struct ShareCoordinator {
    state: Mutex<State>,
    /// Per group with fetches waiting: moves when records of the group's
    /// share partitions may have become available again.
    changes: Mutex<HashMap<String, watch::Sender<u64>>>,
    /// Where share partitions' states are kept (`None`: in memory only).
    log: Option<MetaLog<ShareTable>>,
}

/// A queued write of the share log: resolves once it is in the log file.
pub type Write = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send>>;

impl ShareCoordinator {
    /// A coordinator whose share state lives in memory only (tests).
    pub fn in_memory() -> ShareCoordinator {
        ShareCoordinator {
            state: Mutex::new(State::default()),
            changes: Mutex::default(),
            log: None,
        }
    }

    /// The coordinator with its share log under `dir`: every share
    /// partition as it was last written. Writes are acknowledged once in
    /// the log file, as the group log's are. Blocking.
    pub fn open_with(
        storage: Arc<dyn Storage>,
        dir: &Path,
        segment_bytes: u64,
    ) -> Result<ShareCoordinator, OpenError> {
        let log: MetaLog<ShareTable> = MetaLog::open_with(
            storage,
            dir,
            log_config(segment_bytes),
            segment_bytes,
            Durability::Written,
        )?;
        let partitions = log.with_table(|t| {
            t.partitions
                .iter()
                .map(|(k, s)| (k.clone(), SharePartition::restore(s)))
                .collect()
        });
        // A group with share state is there after a restart, empty until
        // its members join again.
        let groups = partitions_groups(&partitions);
        Ok(ShareCoordinator {
            state: Mutex::new(State {
                partitions,
                groups,
                ..State::default()
            }),
            changes: Mutex::default(),
            log: Some(log),
        })
    }

    /// Queues `key`'s state as it is now (under the state lock, so writes
    /// keep the order of changes).
    fn persist(&self, key: &ShareKey, sp: &SharePartition) -> Write {
        match &self.log {
            None => Box::pin(async { Ok(()) }),
            Some(log) => Box::pin(log.submit(Entry::Records(vec![ShareRecord {
                key: key.clone(),
                state: Some(sp.persisted()),
            }]))),
        }
    }

    /// Flushes and closes the share log. Blocking.
    pub fn close(&self) {
        if let Some(log) = &self.log {
            log.close();
        }
    }

    /// A receiver that sees a change whenever records of `group`'s share
    /// partitions were released or acknowledged, a lock of theirs ran
    /// out or a session of the group closed. Other groups' changes do not
    /// wake it.
    pub fn changes(&self, group: &str) -> watch::Receiver<u64> {
        let mut changes = self.changes.lock();
        match changes.get(group) {
            Some(tx) => tx.subscribe(),
            None => {
                let (tx, rx) = watch::channel(0);
                changes.insert(group.to_string(), tx);
                rx
            }
        }
    }

    /// Wakes `group`'s waiting fetches; forgets groups no fetch waits on.
    fn changed(&self, group: &str) {
        let mut changes = self.changes.lock();
        if let Some(tx) = changes.get(group) {
            if tx.receiver_count() == 0 {
                changes.remove(group);
            } else {
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }

    pub fn has_group(&self, group: &str) -> bool {
        self.state.lock().groups.contains_key(group)
    }

    /// One ShareGroupHeartbeat. A joining member creates its group.
    pub fn heartbeat(
        &self,
        group_id: &str,
        hb: ShareHeartbeat,
        topics: &Topics,
        config: &ShareGroupConfig,
        now_ms: i64,
    ) -> Result<ShareHeartbeatAnswer, ShareError> {
        let mut state = self.state.lock();
        // A member of a group this coordinator does not have (its
        // membership is not kept across restarts) joins again.
        if hb.member_epoch != 0 && !state.groups.contains_key(group_id) {
            return Err((
                ResponseError::UnknownMemberId,
                format!(
                    "Member {} is not a member of share group {group_id}.",
                    hb.member_id
                ),
            ));
        }
        let group = state
            .groups
            .entry(group_id.to_string())
            .or_insert_with(|| ShareGroup::new(group_id));
        group.heartbeat(hb, topics, config, now_ms)
    }

    /// The group's assigned partitions that have no share state yet.
    pub fn uninitialized(&self, group_id: &str) -> Vec<(Uuid, i32)> {
        let state = self.state.lock();
        let Some(group) = state.groups.get(group_id) else {
            return Vec::new();
        };
        group
            .assigned_partitions()
            .into_iter()
            .filter(|(t, p)| !state.partitions.contains_key(&key(group_id, *t, *p)))
            .collect()
    }

    pub fn is_initialized(&self, key: &ShareKey) -> bool {
        self.state.lock().partitions.contains_key(key)
    }

    /// Gives a share partition its start offset, unless it has one.
    pub fn initialize(&self, key: ShareKey, start_offset: i64) -> Write {
        let mut state = self.state.lock();
        if state.partitions.contains_key(&key) {
            return Box::pin(async { Ok(()) });
        }
        let sp = SharePartition::new(start_offset);
        let write = self.persist(&key, &sp);
        state.partitions.insert(key, sp);
        write
    }

    /// Opens, continues or closes `member`'s share session with one
    /// ShareFetch or ShareAcknowledge (`fetch: false`: it cannot open or
    /// change one); returns the partitions the session covers.
    #[expect(clippy::too_many_arguments, reason = "a request's session fields")]
    pub fn session(
        &self,
        group_id: &str,
        member: &str,
        epoch: i32,
        add: &[(Uuid, i32)],
        forget: &[(Uuid, i32)],
        has_acks: bool,
        connection: u64,
        max_sessions: usize,
    ) -> Result<Vec<(Uuid, i32)>, ShareError> {
        let mut state = self.state.lock();
        let id = (group_id.to_string(), member.to_string());
        match epoch {
            INITIAL_EPOCH => {
                if has_acks {
                    return Err((
                        ResponseError::InvalidRequest,
                        "Acknowledge data present in the initial ShareFetch request.".into(),
                    ));
                }
                state.sessions.remove(&id);
                if state.sessions.len() >= max_sessions {
                    return Err((
                        ResponseError::ShareSessionLimitReached,
                        format!("The broker holds its maximum of {max_sessions} share sessions."),
                    ));
                }
                let partitions: BTreeSet<(Uuid, i32)> = add.iter().copied().collect();
                let out = partitions.iter().copied().collect();
                state.sessions.insert(
                    id,
                    ShareSession {
                        epoch: 1,
                        partitions,
                        connection,
                    },
                );
                Ok(out)
            }
            FINAL_EPOCH => {
                let s = state.sessions.get(&id).ok_or_else(session_not_found)?;
                Ok(s.partitions.iter().chain(add).copied().collect())
            }
            _ => {
                let s = state.sessions.get_mut(&id).ok_or_else(session_not_found)?;
                if s.epoch != epoch {
                    return Err((
                        ResponseError::InvalidShareSessionEpoch,
                        format!("The share session expected epoch {}, got {epoch}.", s.epoch),
                    ));
                }
                s.partitions.extend(add.iter().copied());
                for f in forget {
                    s.partitions.remove(f);
                }
                s.epoch = if s.epoch == i32::MAX { 1 } else { s.epoch + 1 };
                s.connection = connection;
                Ok(s.partitions.iter().copied().collect())
            }
        }
    }

    /// Ends `member`'s share session and releases what it holds in
    /// `group_id`'s share partitions.
    pub fn close_session(&self, group_id: &str, member: &str, limits: &dyn Fn(&str) -> ShareLimits) {
        let mut state = self.state.lock();
        state.sessions.remove(&(group_id.to_string(), member.to_string()));
        self.release_member(&mut state, group_id, member, limits);
        drop(state);
        self.changed(group_id);
    }

    /// Releases what `member` holds in `group`'s share partitions. The
    /// writes are not waited for: what they say a restart also does.
    fn release_member(
        &self,
        state: &mut State,
        group: &str,
        member: &str,
        limits: &dyn Fn(&str) -> ShareLimits,
    ) {
        let limits = limits(group);
        for (key, sp) in state.partitions.iter_mut().filter(|(k, _)| k.group == group) {
            if sp.release_member(member, &limits) > 0 {
                drop(self.persist(key, sp));
            }
        }
    }

    /// A connection closed: the sessions on it end, and their members'
    /// records are released.
    pub fn close_connection(&self, connection: u64, limits: &dyn Fn(&str) -> ShareLimits) {
        let mut state = self.state.lock();
        let ended: Vec<(String, String)> = state
            .sessions
            .iter()
            .filter(|(_, s)| s.connection == connection)
            .map(|(k, _)| k.clone())
            .collect();
        if ended.is_empty() {
            return;
        }
        for (group, member) in &ended {
            state.sessions.remove(&(group.clone(), member.clone()));
            self.release_member(&mut state, group, member, limits);
        }
        drop(state);
        for (group, _) in &ended {
            self.changed(group);
        }
    }

    /// Where the next read of `key`'s log begins (see
    /// [`SharePartition::next_fetch_offset`]); `None` also when it has no
    /// share state.
    pub fn next_fetch_offset(&self, key: &ShareKey, limits: &ShareLimits, now_ms: i64) -> Option<i64> {
        let mut state = self.state.lock();
        state.partitions.get_mut(key)?.next_fetch_offset(limits, now_ms)
    }

    /// The log's start offset moved past records in flight.
    pub fn skip_to(&self, key: &ShareKey, log_start_offset: i64) {
        let mut state = self.state.lock();
        if let Some(sp) = state.partitions.get_mut(key) {
            if sp.start_offset() < log_start_offset {
                sp.skip_to(log_start_offset);
                drop(self.persist(key, sp));
            }
        }
    }

    /// Acquires what a read holds for `member` (see
    /// [`SharePartition::acquire`]).
    pub fn acquire(
        &self,
        key: &ShareKey,
        member: &Arc<str>,
        read: LogRead<'_>,
        max_records: usize,
        limits: &ShareLimits,
        now_ms: i64,
    ) -> (Vec<Acquired>, Write) {
        let mut state = self.state.lock();
        let Some(sp) = state.partitions.get_mut(key) else {
            return (Vec::new(), Box::pin(async { Ok(()) }));
        };
        let acquired = sp.acquire(member, read, max_records, limits, now_ms);
        // Each acquisition counts a delivery: written, so a restart does
        // not hand a record out past the limit.
        let write = if acquired.is_empty() {
            Box::pin(async { Ok(()) }) as Write
        } else {
            self.persist(key, sp)
        };
        (acquired, write)
    }

    /// Applies `member`'s acknowledgement batches to one share partition,
    /// all or none (see [`SharePartition::acknowledge_all`]); answered once
    /// the change is in the share log.
    pub async fn acknowledge(
        &self,
        key: &ShareKey,
        member: &str,
        batches: &[AckBatch],
        limits: &ShareLimits,
        now_ms: i64,
    ) -> Result<(), ShareError> {
        let (outcome, write) = self.acknowledge_now(key, member, batches, limits, now_ms);
        write.await.map_err(|e| {
            (
                ResponseError::CoordinatorNotAvailable,
                format!("the share log could not be written: {e}"),
            )
        })?;
        outcome
    }

    fn acknowledge_now(
        &self,
        key: &ShareKey,
        member: &str,
        batches: &[AckBatch],
        limits: &ShareLimits,
        now_ms: i64,
    ) -> (Result<(), ShareError>, Write) {
        let mut state = self.state.lock();
        let Some(sp) = state.partitions.get_mut(key) else {
            let none = (
                ResponseError::InvalidRecordState,
                "The share partition has no records in flight.".to_string(),
            );
            return (Err(none), Box::pin(async { Ok(()) }));
        };
        let all: Vec<(i64, i64, &[AckType])> = batches
            .iter()
            .map(|b| (b.first_offset, b.last_offset, b.types.as_slice()))
            .collect();
        let expired_before = sp.lock_expiries();
        let outcome = sp
            .acknowledge_all(member, &all, limits, now_ms)
            .map_err(|e| match e {
                AckError::InvalidRecordState(m) => (ResponseError::InvalidRecordState, m),
                AckError::InvalidRequest(m) => (ResponseError::InvalidRequest, m),
            });
        // Renewing a lock changes nothing the share log keeps (locks do
        // not survive a restart) and frees nothing: as in Kafka, nothing
        // is written and no waiting fetch is woken for it. Locks that ran
        // out on the way (any operation releases them) are a change.
        let changed = (outcome.is_ok()
            && batches
                .iter()
                .any(|b| b.types.iter().any(|t| *t != AckType::Renew)))
            || sp.lock_expiries() != expired_before;
        let write = if changed {
            self.persist(key, sp)
        } else {
            Box::pin(async { Ok(()) }) as Write
        };
        drop(state);
        // Released records, or room under the in-flight limit: a waiting
        // fetch may find something now.
        if changed {
            self.changed(&key.group);
        }
        (outcome, write)
    }

    /// Releases the locks that ran out and removes the members whose
    /// session timed out; returns when the next lock runs out. `topics`
    /// (the broker's topics, for the groups' new assignments) is asked for
    /// only when a member is removed; `limits` once per group, and
    /// `config` (a group's membership settings) once per group with
    /// members.
    pub fn sweep(
        &self,
        topics: &dyn Fn() -> Topics,
        config: &dyn Fn(&str) -> ShareGroupConfig,
        limits: &dyn Fn(&str) -> ShareLimits,
        now_ms: i64,
    ) -> Option<i64> {
        let mut state = self.state.lock();
        let mut expired_in: BTreeSet<String> = BTreeSet::new();
        let mut next: Option<i64> = None;
        let mut by_group: HashMap<String, ShareLimits> = HashMap::new();
        for (k, sp) in state.partitions.iter_mut() {
            let group_limits = by_group
                .entry(k.group.clone())
                .or_insert_with(|| limits(&k.group));
            if sp.expire(group_limits, now_ms) > 0 {
                drop(self.persist(k, sp));
                expired_in.insert(k.group.clone());
            }
            next = next.into_iter().chain(sp.next_deadline_ms()).min();
        }
        let timed_out: Vec<(String, ShareGroupConfig)> = state
            .groups
            .values()
            .filter(|g| !g.members.is_empty())
            .map(|g| (g.group_id.clone(), config(&g.group_id)))
            .filter(|(id, c)| state.groups.get(id).is_some_and(|g| g.has_timed_out(c, now_ms)))
            .collect();
        if !timed_out.is_empty() {
            let topics = topics();
            for (id, c) in timed_out {
                if let Some(group) = state.groups.get_mut(&id) {
                    group.expire_members(&topics, &c, now_ms);
                }
            }
        }
        drop(state);
        for group in &expired_in {
            self.changed(group);
        }
        next
    }

    pub fn list(&self) -> Vec<(String, ShareGroupState)> {
        let state = self.state.lock();
        state
            .groups
            .values()
            .map(|g| (g.group_id.clone(), g.state()))
            .collect()
    }

    pub fn describe(&self, group_id: &str) -> Option<ShareGroupDescription> {
        let state = self.state.lock();
        let g = state.groups.get(group_id)?;
        Some(ShareGroupDescription {
            group_id: g.group_id.clone(),
            state: g.state(),
            epoch: g.epoch,
            assignment_epoch: g.assignment_epoch,
            members: g.members.values().cloned().collect(),
        })
    }

    /// The start offset of each of `group`'s share partitions, in key
    /// order; `None` if there is no such share group.
    pub fn group_offsets(&self, group: &str) -> Option<Vec<(Uuid, i32, i64)>> {
        let state = self.state.lock();
        state.groups.get(group)?;
        let mut out: Vec<(Uuid, i32, i64)> = state
            .partitions
            .iter()
            .filter(|(k, _)| k.group == group)
            .map(|(k, sp)| (k.topic_id, k.partition, sp.start_offset()))
            .collect();
        out.sort();
        Some(out)
    }

    /// A share partition's start offset, if it has share state.
    pub fn start_offset(&self, key: &ShareKey) -> Option<i64> {
        self.state
            .lock()
            .partitions
            .get(key)
            .map(SharePartition::start_offset)
    }

    /// A share partition's start offset and how many records past it are
    /// done with (acknowledged or archived), if it has share state: what
    /// its lag is counted from (KIP-1226).
    pub fn start_and_done(&self, key: &ShareKey) -> Option<(i64, i64)> {
        self.state.lock().partitions.get(key).map(|sp| {
            let c = sp.counts();
            let done = i64::try_from(c.acknowledged + c.archived).unwrap_or(i64::MAX);
            (sp.start_offset(), done)
        })
    }

    /// Refuses a change of a group that does not exist or has members.
    fn check_known_and_empty(state: &State, group: &str) -> Result<(), ShareError> {
        if !state.groups.contains_key(group) {
            return Err((
                ResponseError::GroupIdNotFound,
                format!("Group {group} not found."),
            ));
        }
        Self::check_empty(state, group)
    }

    /// Refuses a change of `group`'s offsets while it has members.
    fn check_empty(state: &State, group: &str) -> Result<(), ShareError> {
        match state.groups.get(group) {
            Some(g) if !g.members.is_empty() => Err((
                ResponseError::NonEmptyGroup,
                format!(
                    "The share group {group} has members: its offsets can change only while it is empty."
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Sets the start offsets of an empty share group's partitions
    /// (AlterShareGroupOffsets; `kafka-share-groups --reset-offsets`):
    /// each starts again there with nothing in flight. A group that does
    /// not exist is created, empty.
    pub fn reset_offsets(&self, group: &str, offsets: &[(Uuid, i32, i64)]) -> Result<Write, ShareError> {
        let mut state = self.state.lock();
        Self::check_empty(&state, group)?;
        state
            .groups
            .entry(group.to_string())
            .or_insert_with(|| ShareGroup::new(group));
        let mut records = Vec::with_capacity(offsets.len());
        for &(topic_id, partition, start) in offsets {
            let k = key(group, topic_id, partition);
            let sp = state
                .partitions
                .entry(k.clone())
                .or_insert_with(|| SharePartition::new(start));
            sp.reset(start);
            records.push(ShareRecord {
                key: k,
                state: Some(sp.persisted()),
            });
        }
        Ok(self.write(records))
    }

    /// Removes an empty share group's state for `topics`
    /// (DeleteShareGroupOffsets): their share partitions start again at
    /// the log end when next assigned.
    pub fn delete_offsets(&self, group: &str, topics: &[Uuid]) -> Result<Write, ShareError> {
        let mut state = self.state.lock();
        Self::check_known_and_empty(&state, group)?;
        let gone: Vec<ShareKey> = state
            .partitions
            .keys()
            .filter(|k| k.group == group && topics.contains(&k.topic_id))
            .cloned()
            .collect();
        Ok(self.remove(&mut state, gone))
    }

    /// Deletes an empty share group and its share state (DeleteGroups).
    pub fn delete_group(&self, group: &str) -> Result<Write, ShareError> {
        let mut state = self.state.lock();
        Self::check_known_and_empty(&state, group)?;
        state.groups.remove(group);
        state.sessions.retain(|(g, _), _| g != group);
        let gone: Vec<ShareKey> = state
            .partitions
            .keys()
            .filter(|k| k.group == group)
            .cloned()
            .collect();
        Ok(self.remove(&mut state, gone))
    }

    /// Removes share partitions, with their tombstones.
    fn remove(&self, state: &mut State, keys: Vec<ShareKey>) -> Write {
        let records = keys
            .into_iter()
            .map(|k| {
                state.partitions.remove(&k);
                ShareRecord { key: k, state: None }
            })
            .collect();
        self.write(records)
    }

    /// Queues records on the share log (under the state lock).
    fn write(&self, records: Vec<ShareRecord>) -> Write {
        match &self.log {
            Some(log) if !records.is_empty() => Box::pin(log.submit(Entry::Records(records))),
            _ => done(),
        }
    }

    /// `key`'s state as the share log keeps it.
    pub fn persisted(&self, key: &ShareKey) -> Option<store::ShareState> {
        self.state
            .lock()
            .partitions
            .get(key)
            .map(SharePartition::persisted)
    }

    /// Every share partition's offsets and counts, in key order.
    pub fn partition_stats(&self) -> Vec<SharePartitionStats> {
        let state = self.state.lock();
        let mut out: Vec<SharePartitionStats> = state
            .partitions
            .iter()
            .map(|(k, sp)| SharePartitionStats {
                key: k.clone(),
                start_offset: sp.start_offset(),
                end_offset: sp.end_offset(),
                counts: sp.counts(),
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }
}

fn partitions_groups(partitions: &HashMap<ShareKey, SharePartition>) -> BTreeMap<String, ShareGroup> {
    partitions
        .keys()
        .map(|k| (k.group.clone(), ShareGroup::new(&k.group)))
        .collect()
}

fn done() -> Write {
    Box::pin(async { Ok(()) })
}

pub fn key(group: &str, topic_id: Uuid, partition: i32) -> ShareKey {
    ShareKey {
        group: group.to_string(),
        topic_id,
        partition,
    }
}

fn session_not_found() -> ShareError {
    (
        ResponseError::ShareSessionNotFound,
        "The share session was not found.".into(),
    )
}
