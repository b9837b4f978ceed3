//! The group coordinator: Kafka's classic consumer group protocol, the
//! consumer protocol (KIP-848), and committed offsets.
//!
//! * [`group`]: one classic group's membership state machine (no I/O, no
//!   clock);
//! * [`consumer`]: one consumer-protocol group's state machine, and
//!   [`assignor`] its server-side assignors;
//! * [`store`]: the group log that persists offsets and group metadata;
//! * [`records`]: that log's record schemas (Kafka's `__consumer_offsets`).
//!
//! Locking: `groups` guards every group's in-memory state and is never held
//! across I/O or an `.await`; writes to the group log are queued
//! (`MetaLog::submit`) before it is released, so the log has every
//! group's changes in the order they were made, and awaited after. A
//! single node coordinates every group, so FindCoordinator always names
//! this broker.

pub mod assignor;
mod classic;
pub mod consumer;
pub mod consumer_records;
pub mod embedded;
pub mod group;
pub mod records;
pub mod store;

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use keel_protocol::ResponseError;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::metalog::{Durability, Entry};
use classic::{Awaited, ClassicGroups, ClassicMutex};
use consumer::{ConsumerGroup, ConsumerGroupConfig, ConsumerGroupState, Heartbeat, HeartbeatAnswer, Topics};
use group::{Answer, Group, GroupConfig, GroupState, JoinParams, JoinResult, SyncOutcome, SyncResult};
use keel_log::marker::{Marker, TxnWrite};
use records::{CommittedOffset, GroupRecord};
use store::{GroupStore, GroupTable, StoreError};

/// What a JoinGroup to a group id that is (or was) a consumer group comes
/// to; `W` is a queued write of the group log.
enum ConsumerJoin<W> {
    /// The consumer group hosts the member: the answer, and the write of
    /// the group's records.
    Hosted(JoinResult, W),
    /// A classic group takes the join, with the write of the tombstones of
    /// the empty consumer group it replaces, if there was one.
    Classic(Box<JoinParams>, Option<W>),
}

use keel_log::clock::Clock;

/// Coordinator settings, from the broker's `group.*` and `offsets.*`
/// configs.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    pub group: GroupConfig,
    /// `group.consumer.*`: groups of the consumer protocol.
    pub consumer: ConsumerGroupConfig,
    /// `offsets.retention.minutes`, in ms.
    pub offsets_retention_ms: i64,
    /// `offsets.retention.check.interval.ms`.
    pub offsets_retention_check_interval_ms: i64,
    /// `offset.metadata.max.bytes`.
    pub offset_metadata_max_bytes: usize,
    /// `offsets.topic.segment.bytes`: the group log's segment size, and
    /// how much it grows between snapshots.
    pub log_segment_bytes: u64,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            group: GroupConfig::default(),
            consumer: ConsumerGroupConfig::default(),
            offsets_retention_ms: 7 * 24 * 60 * 60 * 1000,
            offsets_retention_check_interval_ms: 600_000,
            offset_metadata_max_bytes: 4096,
            log_segment_bytes: 100 * 1024 * 1024,
        }
    }
}

/// A group as DescribeGroups reports it.
#[derive(Debug, Clone)]
pub struct GroupDescription {
    pub state: GroupState,
    pub protocol_type: String,
    pub protocol: String,
    pub members: Vec<MemberDescription>,
}

#[derive(Debug, Clone)]
pub struct MemberDescription {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub metadata: Bytes,
    pub assignment: Bytes,
}

/// One partition's committed offset as OffsetFetch answers it.
pub type FetchedOffset = (String, i32, Result<Option<CommittedOffset>, ResponseError>);

/// One partition's offset to commit.
#[derive(Debug, Clone)]
pub struct OffsetToCommit {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
}

pub struct GroupCoordinator {
    /// Classic groups, and every group id with offsets and no consumer
    /// group. Locked before `consumer_groups` when both are.
    groups: ClassicMutex,
    /// Consumer-protocol groups, also once empty (until deleted, their
    /// offsets expire, or a classic member joins), and the classic members
    /// they host after an online upgrade. Each change is written to the
    /// group log (queued under this lock, so in its order) before it is
    /// answered; after a restart members go on at their epochs.
    consumer_groups: Mutex<HashMap<String, ConsumerGroup>>,
    store: GroupStore,
    config: CoordinatorConfig,
    clock: Arc<dyn Clock>,
    /// Wakes the timer task: a deadline may have moved earlier.
    timer: Notify,
    /// Transactional offsets being checked with their transaction's
    /// coordinator, by guard token (see [`TxnOffsetsGuard`]).
    verifying: Arc<Mutex<HashMap<u64, TxnWrite>>>,
}

/// Tokens of [`TxnOffsetsGuard`]s.
static NEXT_GUARD: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Kafka's verification guard (KIP-890) for a TxnOffsetCommit: taken before
/// the transaction's coordinator is asked whether the group's offsets
/// partition is in the transaction, and checked when the offsets are
/// queued to the group log. A marker queued in between that ends the
/// transaction voids it, so the offsets are refused rather than left
/// pending with no marker to end them.
pub struct TxnOffsetsGuard {
    verifying: Arc<Mutex<HashMap<u64, TxnWrite>>>,
    token: u64,
}

impl Drop for TxnOffsetsGuard {
    fn drop(&mut self) {
        self.verifying.lock().remove(&self.token);
    }
}

impl GroupCoordinator {
    /// Loads the group log on the real filesystem and rebuilds every
    /// group. Blocking.
    pub fn open(
        dir: &Path,
        config: CoordinatorConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<GroupCoordinator, crate::metalog::OpenError> {
        GroupCoordinator::open_with(keel_log::DiskStorage::shared(), dir, config, clock)
    }

    /// Loads the group log through `storage` and rebuilds every group.
    /// Blocking.
    pub fn open_with(
        storage: Arc<dyn keel_log::Storage>,
        dir: &Path,
        config: CoordinatorConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<GroupCoordinator, crate::metalog::OpenError> {
        let log_config = crate::metalog::log_config(config.log_segment_bytes);
        let store = GroupStore::open_with(
            storage,
            dir,
            log_config,
            config.log_segment_bytes,
            Durability::Written,
        )?;
        GroupCoordinator::with_store(store, config, clock)
    }

    /// A coordinator whose group log goes to `sink` (a cluster's
    /// partitions of `__consumer_offsets`), holding no group until
    /// [`GroupCoordinator::load`] brings a partition's.
    pub fn open_sink(
        sink: Box<dyn crate::metalog::Sink<GroupTable>>,
        config: CoordinatorConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<GroupCoordinator, crate::metalog::OpenError> {
        let store = GroupStore::with_sink(GroupTable::default(), sink)?;
        GroupCoordinator::with_store(store, config, clock)
    }

    fn with_store(
        store: GroupStore,
        config: CoordinatorConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<GroupCoordinator, crate::metalog::OpenError> {
        let (groups, consumer_groups) = store.with_table(|table| restore(table, &config, clock.now_ms()));
        Ok(GroupCoordinator {
            groups: ClassicMutex::new(groups),
            consumer_groups: Mutex::new(consumer_groups),
            store,
            config,
            clock,
            timer: Notify::new(),
            verifying: Arc::new(Mutex::new(HashMap::new())),
        })
    }

    /// Takes a [`TxnOffsetsGuard`] for offsets of `write`'s transaction,
    /// before its coordinator is asked about them.
    pub fn txn_offsets_guard(&self, write: TxnWrite) -> TxnOffsetsGuard {
        let token = NEXT_GUARD.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.verifying.lock().insert(token, write);
        TxnOffsetsGuard {
            verifying: Arc::clone(&self.verifying),
            token,
        }
    }

    /// Takes in the groups of one partition of a cluster's group log, as
    /// its records rebuild them (`table`): they replace whatever this
    /// coordinator held of the groups `owns` says are that partition's.
    /// Members go on at their epochs and generations, with fresh session
    /// deadlines, as after a restart.
    pub async fn load(&self, table: GroupTable, owns: crate::partitioned::Owns) {
        let (loaded, loaded_consumer) = restore(&table, &self.config, self.now_ms());
        let keep = Arc::clone(&owns);
        self.store
            .update(move |t| {
                t.retain_groups(|g| !keep(g));
                t.merge(table);
            })
            .await;
        let mut groups = self.groups.lock();
        let mut consumer_groups = self.consumer_groups.lock();
        drop_groups(&mut groups, &mut consumer_groups, &*owns);
        groups.extend(loaded);
        consumer_groups.extend(loaded_consumer);
        drop(consumer_groups);
        drop(groups);
        self.timer.notify_one();
    }

    /// Lets go of the groups `owns` says: their partition of a cluster's
    /// group log is led by another broker now. Requests waiting on them
    /// are dropped (their clients find the new coordinator).
    pub async fn unload(&self, owns: crate::partitioned::Owns) {
        {
            let mut groups = self.groups.lock();
            let mut consumer_groups = self.consumer_groups.lock();
            drop_groups(&mut groups, &mut consumer_groups, &*owns);
        }
        self.store.update(move |t| t.retain_groups(|g| !owns(g))).await;
    }

    fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Handles JoinGroup; waits for the join phase to end when it must.
    /// A consumer group with members hosts the member (KIP-848 online
    /// migration); `topics` are the broker's, for its assignor.
    pub async fn join(&self, group_id: &str, params: JoinParams, topics: &Topics) -> JoinResult {
        let member_id = params.member_id.clone();
        let error = |e| JoinResult {
            error: Some(e),
            generation: -1,
            member_id: member_id.clone(),
            ..JoinResult::default()
        };
        if group_id.is_empty() {
            return error(ResponseError::InvalidGroupId);
        }
        let limits = self.config.group;
        if params.session_timeout_ms < limits.min_session_timeout_ms
            || params.session_timeout_ms > limits.max_session_timeout_ms
        {
            return error(ResponseError::InvalidSessionTimeout);
        }
        let step = {
            let mut groups = self.groups.lock();
            let mut consumer = self.consumer_groups.lock();
            let step = self.join_consumer_group(&mut consumer, group_id, params, topics);
            drop(consumer);
            match step {
                ConsumerJoin::Hosted(result, written) => Ok((result, written)),
                ConsumerJoin::Classic(params, conversion) => {
                    if !groups.contains_key(group_id) && !params.member_id.is_empty() {
                        return error(ResponseError::UnknownMemberId);
                    }
                    let now = self.now_ms();
                    let group = groups
                        .entry(group_id.to_string())
                        .or_insert_with(|| Group::new(group_id, limits, now));
                    let answer = group.join(*params, now);
                    Err((conversion, groups.join_answer(group_id, answer)))
                }
            }
        };
        let (conversion, answer) = match step {
            Ok((result, written)) => {
                self.timer.notify_one();
                return match written.await {
                    Ok(()) => result,
                    Err(e) => {
                        tracing::error!(group = group_id, error = %e, "cannot persist a member's join");
                        error(ResponseError::CoordinatorNotAvailable)
                    }
                };
            }
            Err(classic) => classic,
        };
        self.timer.notify_one();
        if let Some(written) = conversion {
            if let Err(e) = written.await {
                tracing::error!(group = group_id, error = %e, "cannot persist a group's conversion");
            }
        }
        match answer {
            Awaited::Now(result) => result,
            Awaited::Later(rx) => rx.await.unwrap_or_else(|_| error(ResponseError::UnknownMemberId)),
        }
    }

    /// A JoinGroup to a group id that is (or was) a consumer group; the
    /// caller holds both locks.
    fn join_consumer_group(
        &self,
        consumer: &mut HashMap<String, ConsumerGroup>,
        group_id: &str,
        params: JoinParams,
        topics: &Topics,
    ) -> ConsumerJoin<impl std::future::Future<Output = Result<(), StoreError>>> {
        match consumer.get_mut(group_id) {
            Some(g) if !g.is_empty() => {
                let result = g.classic_join(params, topics, self.now_ms());
                ConsumerJoin::Hosted(result, self.store.submit(Entry::Records(g.changes())))
            }
            // The empty consumer group's records go; the classic group that
            // replaces it writes its own when it has an assignment.
            Some(g) => {
                let written = self.store.submit(Entry::Records(g.tombstones()));
                consumer.remove(group_id);
                ConsumerJoin::Classic(Box::new(params), Some(written))
            }
            None => ConsumerJoin::Classic(Box::new(params), None),
        }
    }

    /// Handles SyncGroup; the leader's assignment is persisted before any
    /// member gets its share. A classic member of a consumer group gets
    /// the partitions the group's assignor gave it.
    #[allow(clippy::too_many_arguments)]
    pub async fn sync(
        &self,
        group_id: &str,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
        protocol: (Option<&str>, Option<&str>),
        assignments: Vec<(String, Bytes)>,
        topics: &Topics,
    ) -> SyncResult {
        if let Some(g) = self.consumer_groups.lock().get_mut(group_id) {
            return g.classic_sync(
                member_id,
                instance_id,
                generation,
                protocol,
                topics,
                self.now_ms(),
            );
        }
        let (outcome, awaited) = {
            let mut groups = self.groups.lock();
            let Some(group) = groups.get_mut(group_id) else {
                return Err(ResponseError::UnknownMemberId);
            };
            let outcome = group.sync(
                generation,
                member_id,
                instance_id,
                protocol,
                assignments,
                self.now_ms(),
            );
            match outcome {
                SyncOutcome::Answer(answer) => (None, groups.sync_answer(group_id, answer)),
                SyncOutcome::Persist {
                    metadata,
                    generation,
                    answer,
                } => (
                    Some((metadata, generation)),
                    groups.sync_answer(group_id, Answer::Later(answer)),
                ),
            }
        };
        self.timer.notify_one();
        let rx = match (outcome, awaited) {
            (_, Awaited::Now(result)) => return result,
            (None, Awaited::Later(rx)) => rx,
            (Some((metadata, generation)), Awaited::Later(answer)) => {
                let record = GroupRecord::Group {
                    group: group_id.to_string(),
                    value: Some(metadata),
                };
                let written = self.persist(group_id, vec![record], "the assignment").await;
                if let Some(group) = self.groups.lock().get_mut(group_id) {
                    group.assignment_persisted(generation, written, self.now_ms());
                }
                self.timer.notify_one();
                answer
            }
        };
        rx.await.unwrap_or(Err(ResponseError::UnknownMemberId))
    }

    /// Handles ConsumerGroupHeartbeat. An empty classic group (offsets
    /// only) becomes a consumer group; one with members of the consumer
    /// protocol type too, its members hosted (the online upgrade, persisted
    /// as the classic group's tombstone before the answer). When the last
    /// consumer-protocol member leaves, the classic members left become a
    /// classic group again.
    pub async fn consumer_heartbeat(
        &self,
        group_id: &str,
        hb: Heartbeat,
        topics: &Topics,
    ) -> Result<HeartbeatAnswer, consumer::Refusal> {
        let (answer, written) = self.consumer_heartbeat_now(group_id, hb, topics);
        written.await.map_err(|e| {
            tracing::error!(group = group_id, error = %e, "cannot persist a consumer group's change");
            (ResponseError::CoordinatorNotAvailable, None)
        })?;
        answer
    }

    /// The heartbeat, under the locks; -> also its records, queued before
    /// the locks go, so the log has each group's changes in their order.
    fn consumer_heartbeat_now(
        &self,
        group_id: &str,
        hb: Heartbeat,
        topics: &Topics,
    ) -> (
        Result<HeartbeatAnswer, consumer::Refusal>,
        impl std::future::Future<Output = Result<(), StoreError>>,
    ) {
        let mut classic = self.groups.lock();
        let mut consumer = self.consumer_groups.lock();
        let mut records = Vec::new();
        let answer =
            self.consumer_heartbeat_locked(&mut classic, &mut consumer, group_id, hb, topics, &mut records);
        let written = self.store.submit(Entry::Records(records));
        drop(consumer);
        drop(classic);
        self.timer.notify_one();
        (answer, written)
    }

    fn consumer_heartbeat_locked(
        &self,
        classic: &mut ClassicGroups,
        consumer: &mut HashMap<String, ConsumerGroup>,
        group_id: &str,
        hb: Heartbeat,
        topics: &Topics,
        records: &mut Vec<GroupRecord>,
    ) -> Result<HeartbeatAnswer, consumer::Refusal> {
        let now = self.now_ms();
        if let Some(g) = classic.get_mut(group_id).filter(|g| !g.is_empty()) {
            let not_consumer = || {
                (
                    ResponseError::GroupIdNotFound,
                    Some(format!("Group {group_id} is not a consumer group.")),
                )
            };
            let policy = self.config.consumer.migration;
            if hb.member_epoch != 0 {
                return Err(not_consumer());
            }
            let refusal = if !policy.upgrades() {
                Some("the online upgrade is disabled")
            } else if g.protocol_type() != Some(consumer::CONSUMER_PROTOCOL_TYPE) {
                Some("the group does not use the consumer embedded protocol")
            } else if g.member_count() >= self.config.consumer.max_size {
                Some("the group size exceeds the consumer group maximum size")
            } else {
                None
            };
            if let Some(why) = refusal {
                tracing::info!(
                    group = group_id,
                    "cannot upgrade the classic group to a consumer group: {why}"
                );
                return Err(not_consumer());
            }
            let (generation, members) = g.migrating_members();
            let converted = ConsumerGroup::from_classic(
                group_id,
                generation,
                members,
                topics,
                self.config.consumer.clone(),
                now,
            )?;
            g.hand_over(now);
            classic.remove_group(group_id);
            records.extend(self.metadata_tombstone(group_id));
            tracing::info!(
                group = group_id,
                generation,
                "upgraded the classic group to a consumer group"
            );
            consumer.insert(group_id.to_string(), converted);
        }
        if hb.member_epoch != 0 && !consumer.contains_key(group_id) {
            // Unknown here (after a restart, say): the member rejoins.
            return Err((
                ResponseError::UnknownMemberId,
                Some(format!(
                    "Member {} is not a member of group {group_id}.",
                    hb.member_id
                )),
            ));
        }
        let leaving = hb.member_epoch < 0;
        if !consumer.contains_key(group_id) {
            // An empty classic group (offsets only) gives way, its
            // metadata tombstoned as Kafka does.
            if classic.remove_group(group_id).is_some() {
                records.extend(self.metadata_tombstone(group_id));
            }
            let fresh = ConsumerGroup::new(group_id, self.config.consumer.clone());
            consumer.insert(group_id.to_string(), fresh);
        }
        let group = consumer.get_mut(group_id).expect("inserted above");
        let defaults = &self.config.consumer;
        group.set_timeouts(
            hb.overrides
                .session_timeout_ms
                .unwrap_or(defaults.session_timeout_ms),
            hb.overrides
                .heartbeat_interval_ms
                .unwrap_or(defaults.heartbeat_interval_ms),
        );
        let answer = group.heartbeat(hb, topics, now);
        if answer.is_ok() {
            records.extend(group.changes());
        }
        if leaving {
            records.extend(self.maybe_downgrade(classic, consumer, group_id, topics, now));
        }
        answer
    }

    /// Turns a consumer group that has only classic members left into a
    /// classic group, which rebalances (the online downgrade). The caller
    /// holds both locks. -> the consumer group's tombstones.
    fn maybe_downgrade(
        &self,
        classic: &mut ClassicGroups,
        consumer: &mut HashMap<String, ConsumerGroup>,
        group_id: &str,
        topics: &Topics,
        now: i64,
    ) -> Vec<GroupRecord> {
        let Some(g) = consumer.get_mut(group_id).filter(|g| g.downgradable()) else {
            return Vec::new();
        };
        if g.members.len() > self.config.group.max_size {
            tracing::info!(
                group = group_id,
                "cannot downgrade the consumer group to a classic group: its size is greater than the classic group maximum size"
            );
            return Vec::new();
        }
        let (generation, protocol, members) = g.to_classic(topics);
        let tombstones = g.tombstones();
        consumer.remove(group_id);
        tracing::info!(
            group = group_id,
            generation,
            "downgraded the consumer group to a classic group"
        );
        let group = Group::take_over(group_id, self.config.group, (generation, protocol), members, now);
        classic.insert(group_id.to_string(), group);
        tombstones
    }

    /// A consumer group as ConsumerGroupDescribe reports it; `Err` when the
    /// id is a classic group (or unknown).
    pub fn describe_consumer(&self, group_id: &str) -> Result<ConsumerGroup, (ResponseError, String)> {
        if let Some(g) = self.consumer_groups.lock().get(group_id) {
            return Ok(g.clone());
        }
        match self.groups.lock().get(group_id) {
            Some(g) if !g.is_empty() => Err((
                ResponseError::GroupIdNotFound,
                format!("Group {group_id} is not a consumer group."),
            )),
            _ => Err((
                ResponseError::GroupIdNotFound,
                format!("Group {group_id} not found."),
            )),
        }
    }

    /// Consumer groups with members: (id, state).
    pub fn list_consumer(&self) -> Vec<(String, ConsumerGroupState)> {
        let mut out: Vec<(String, ConsumerGroupState)> = self
            .consumer_groups
            .lock()
            .values()
            .map(|g| (g.id.clone(), g.state()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Checks an OffsetFetch from a member (v9 names one) of a consumer
    /// group; one from no member (an admin tool), or to another group,
    /// passes.
    pub fn validate_consumer_fetch(
        &self,
        group_id: &str,
        member_id: Option<&str>,
        member_epoch: i32,
    ) -> Result<(), ResponseError> {
        if member_id.is_none() && member_epoch < 0 {
            return Ok(());
        }
        match self.consumer_groups.lock().get(group_id) {
            Some(g) => g.validate_fetch(member_id.unwrap_or(""), member_epoch),
            None => Ok(()),
        }
    }

    /// Checks a commit to a consumer group, if `group_id` is one.
    fn admit_consumer_commit(
        &self,
        group_id: &str,
        member_id: &str,
        epoch: i32,
    ) -> Option<Result<(), ResponseError>> {
        self.consumer_groups
            .lock()
            .get(group_id)
            .map(|g| g.validate_commit(member_id, epoch))
    }

    /// Writes records to the group log; a failure is COORDINATOR_NOT_AVAILABLE
    /// for the client (it retries) and an error in the broker's log.
    async fn persist(
        &self,
        group_id: &str,
        records: Vec<GroupRecord>,
        what: &str,
    ) -> Result<(), ResponseError> {
        self.store.write(records).await.map_err(|e| {
            tracing::error!(group = group_id, error = %e, "cannot persist {what}");
            ResponseError::CoordinatorNotAvailable
        })
    }

    pub fn heartbeat(
        &self,
        group_id: &str,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> Result<(), ResponseError> {
        if let Some(g) = self.consumer_groups.lock().get_mut(group_id) {
            let result = g.classic_heartbeat(member_id, instance_id, generation, self.now_ms());
            self.timer.notify_one();
            return result;
        }
        let mut groups = self.groups.lock();
        let group = groups.get_mut(group_id).ok_or(ResponseError::UnknownMemberId)?;
        group.heartbeat(generation, member_id, instance_id, self.now_ms())
    }

    /// Handles LeaveGroup: one result per leaving member.
    pub async fn leave(
        &self,
        group_id: &str,
        members: &[(String, Option<String>)],
        topics: &Topics,
    ) -> Vec<Result<(), ResponseError>> {
        let (results, written) = self.leave_now(group_id, members, topics);
        if let Err(e) = written.await {
            tracing::error!(group = group_id, error = %e, "cannot persist members leaving");
            return vec![Err(ResponseError::CoordinatorNotAvailable); members.len()];
        }
        results
    }

    /// The leave, under the locks; -> also its records, queued.
    fn leave_now(
        &self,
        group_id: &str,
        members: &[(String, Option<String>)],
        topics: &Topics,
    ) -> (
        Vec<Result<(), ResponseError>>,
        impl std::future::Future<Output = Result<(), StoreError>>,
    ) {
        let mut groups = self.groups.lock();
        let now = self.now_ms();
        {
            let mut consumer = self.consumer_groups.lock();
            if let Some(g) = consumer.get_mut(group_id) {
                let results = members
                    .iter()
                    .map(|(member_id, instance_id)| {
                        g.classic_leave(member_id, instance_id.as_deref(), topics)
                    })
                    .collect();
                let mut records = g.changes();
                records.extend(self.maybe_downgrade(&mut groups, &mut consumer, group_id, topics, now));
                let written = self.store.submit(Entry::Records(records));
                drop(consumer);
                drop(groups);
                self.timer.notify_one();
                return (results, written);
            }
        }
        let was_empty = groups.get(group_id).map(|g| g.state() == GroupState::Empty);
        let results = members
            .iter()
            .map(|(member_id, instance_id)| match groups.get_mut(group_id) {
                None => Err(ResponseError::UnknownMemberId),
                Some(group) => group.leave(member_id, instance_id.as_deref(), now),
            })
            .collect();
        // The last member gone, the group is Empty: persisted as the timer
        // persists a group its sessions emptied, or after a restart (or a
        // failover) the members would be back, and a new member would wait
        // out their sessions.
        let records = match (was_empty, groups.get(group_id)) {
            (Some(false), Some(g)) if g.state() == GroupState::Empty => vec![GroupRecord::Group {
                group: group_id.to_string(),
                value: Some(g.metadata()),
            }],
            _ => Vec::new(),
        };
        let written = self.store.submit(Entry::Records(records));
        drop(groups);
        self.timer.notify_one();
        (results, written)
    }

    /// Handles OffsetCommit for partitions of existing topics. `Err` is a
    /// group-level error that applies to every partition.
    pub async fn commit_offsets(
        &self,
        group_id: &str,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
        offsets: Vec<OffsetToCommit>,
        version: i16,
    ) -> Result<Vec<Result<(), ResponseError>>, ResponseError> {
        // A commit with a generation to a group that does not exist: from
        // v9 (KIP-848) Kafka answers GROUP_ID_NOT_FOUND.
        let unknown = if version >= 9 {
            ResponseError::GroupIdNotFound
        } else {
            ResponseError::IllegalGeneration
        };
        match self.admit_consumer_commit(group_id, member_id, generation) {
            Some(admitted) => admitted?,
            None => self.admit_commit(group_id, generation, unknown, |group, now| {
                group.validate_commit(generation, member_id, instance_id, now)
            })?,
        }
        let (results, records) = self.offset_records(group_id, offsets);
        self.persist(group_id, records, "offsets").await?;
        Ok(results)
    }

    /// Handles TxnOffsetCommit: the offsets are written in the producer's
    /// transaction and become the group's committed offsets only when its
    /// commit marker is written ([`GroupCoordinator::end_transaction`]).
    /// The caller has checked the producer against the transaction.
    #[allow(clippy::too_many_arguments)]
    pub async fn commit_transactional_offsets(
        &self,
        group_id: &str,
        (producer_id, producer_epoch): (i64, i16),
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
        offsets: Vec<OffsetToCommit>,
        guard: &TxnOffsetsGuard,
    ) -> Result<Vec<Result<(), ResponseError>>, ResponseError> {
        match self.admit_consumer_commit(group_id, member_id, generation) {
            Some(admitted) => admitted?,
            None => self.admit_commit(
                group_id,
                generation,
                ResponseError::IllegalGeneration,
                |group, _| group.validate_txn_commit(generation, member_id, instance_id),
            )?,
        }
        let (results, records) = self.offset_records(group_id, offsets);
        let entry = Entry::Transactional {
            producer_id,
            producer_epoch,
            records,
        };
        // Queued under the guards' lock, as markers are: a marker that
        // ended the transaction is either behind these offsets (and ends
        // them) or voided the guard (and they are refused).
        let written = {
            let verifying = self.verifying.lock();
            if !verifying.contains_key(&guard.token) {
                return Err(ResponseError::InvalidTxnState);
            }
            self.store.submit(entry)
        };
        written.await.map_err(|e| {
            tracing::error!(group = group_id, error = %e, "cannot persist transactional offsets");
            ResponseError::CoordinatorNotAvailable
        })?;
        Ok(results)
    }

    /// Writes a transaction marker into the group log: the producer's
    /// pending offsets become committed (or are dropped).
    pub async fn end_transaction(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        marker: Marker,
    ) -> Result<(), StoreError> {
        let entry = Entry::Marker {
            producer_id,
            producer_epoch,
            marker,
        };
        let written = {
            let mut verifying = self.verifying.lock();
            verifying.retain(|_, w| !w.ended_by(producer_id, producer_epoch));
            self.store.submit(entry)
        };
        written.await
    }

    /// Checks a commit against its group; a group that does not exist
    /// comes into being, Empty, for a commit from outside any generation
    /// (assign() and admin tools), as in Kafka.
    fn admit_commit(
        &self,
        group_id: &str,
        generation: i32,
        unknown: ResponseError,
        validate: impl FnOnce(&mut Group, i64) -> Result<(), ResponseError>,
    ) -> Result<(), ResponseError> {
        if group_id.is_empty() {
            return Err(ResponseError::InvalidGroupId);
        }
        let now = self.now_ms();
        let mut groups = self.groups.lock();
        match groups.get_mut(group_id) {
            Some(group) => validate(group, now),
            None if generation < 0 => {
                groups.insert(group_id.to_string(), Group::new(group_id, self.config.group, now));
                Ok(())
            }
            None => Err(unknown),
        }
    }

    /// The records of a commit, and each partition's result (metadata
    /// over `offset.metadata.max.bytes` is refused).
    fn offset_records(
        &self,
        group_id: &str,
        offsets: Vec<OffsetToCommit>,
    ) -> (Vec<Result<(), ResponseError>>, Vec<GroupRecord>) {
        let now = self.now_ms();
        let max_metadata = self.config.offset_metadata_max_bytes;
        let mut results = Vec::with_capacity(offsets.len());
        let mut records = Vec::new();
        for o in offsets {
            if o.metadata.len() > max_metadata {
                results.push(Err(ResponseError::OffsetMetadataTooLarge));
                continue;
            }
            results.push(Ok(()));
            records.push(GroupRecord::Offset {
                group: group_id.to_string(),
                topic: o.topic,
                partition: o.partition,
                value: Some(CommittedOffset {
                    offset: o.offset,
                    leader_epoch: o.leader_epoch,
                    metadata: o.metadata,
                    commit_timestamp_ms: now,
                }),
            });
        }
        (results, records)
    }

    /// Committed offsets of a group: of the given partitions, or of every
    /// partition when `partitions` is `None`.
    pub fn fetch_offsets(
        &self,
        group_id: &str,
        partitions: Option<&[(String, i32)]>,
    ) -> Vec<(String, i32, Option<CommittedOffset>)> {
        self.fetch_offsets_stable(group_id, partitions, false)
            .into_iter()
            .map(|(t, p, v)| (t, p, v.unwrap_or(None)))
            .collect()
    }

    /// [`GroupCoordinator::fetch_offsets`] for OffsetFetch: with
    /// `require_stable` (KIP-447), a partition an open transaction holds
    /// an offset for is UNSTABLE_OFFSET_COMMIT (the client retries).
    pub fn fetch_offsets_stable(
        &self,
        group_id: &str,
        partitions: Option<&[(String, i32)]>,
        require_stable: bool,
    ) -> Vec<FetchedOffset> {
        self.store.with_table(|table| {
            let committed = table.offsets.get(group_id);
            let stable = |t: &str, p: i32, v: Option<&CommittedOffset>| {
                if require_stable && table.has_pending(group_id, t, p) {
                    Err(ResponseError::UnstableOffsetCommit)
                } else {
                    Ok(v.cloned())
                }
            };
            match partitions {
                Some(wanted) => wanted
                    .iter()
                    .map(|(t, p)| {
                        let value = committed.and_then(|c| c.get(&(t.clone(), *p)));
                        (t.clone(), *p, stable(t, *p, value))
                    })
                    .collect(),
                None => committed
                    .into_iter()
                    .flatten()
                    .map(|((t, p), v)| (t.clone(), *p, stable(t, *p, Some(v))))
                    .collect(),
            }
        })
    }

    /// Offsets committed at or after `since_ms` (ms since the epoch), as
    /// `(group, topic, partition, offset)`: the readers reader-aware
    /// tiering keeps segments for.
    pub fn committed_since(&self, since_ms: i64) -> Vec<(String, String, i32, i64)> {
        self.store.with_table(|table| {
            table
                .offsets
                .iter()
                .flat_map(|(group, offsets)| {
                    offsets
                        .iter()
                        .filter(|(_, v)| v.commit_timestamp_ms >= since_ms)
                        .map(move |((t, p), v)| (group.clone(), t.clone(), *p, v.offset))
                })
                .collect()
        })
    }

    /// The groups each client is a member of, by its client id and host
    /// (classic and consumer-protocol groups alike): how `/stats` names the
    /// group behind a partition's reader.
    pub fn groups_by_client(&self) -> HashMap<(String, String), Vec<String>> {
        let mut out: HashMap<(String, String), Vec<String>> = HashMap::new();
        for (id, ..) in self.list() {
            for m in self.describe(&id).map(|d| d.members).unwrap_or_default() {
                out.entry((m.client_id, m.client_host))
                    .or_default()
                    .push(id.clone());
            }
        }
        for g in self.consumer_groups.lock().values() {
            for m in g.members.values() {
                out.entry((m.client_id.clone(), m.client_host.clone()))
                    .or_default()
                    .push(g.id.clone());
            }
        }
        for groups in out.values_mut() {
            groups.sort();
            groups.dedup();
        }
        out
    }

    /// Every group: `(id, protocol type, state)`.
    pub fn list(&self) -> Vec<(String, String, GroupState)> {
        let groups = self.groups.lock();
        let mut out: Vec<_> = groups
            .values()
            .filter(|g| g.state() != GroupState::Dead)
            .map(|g| {
                (
                    g.id.clone(),
                    g.protocol_type().unwrap_or("").to_string(),
                    g.state(),
                )
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    pub fn describe(&self, group_id: &str) -> Option<GroupDescription> {
        let groups = self.groups.lock();
        let g = groups.get(group_id)?;
        let members = g.describe_members();
        Some(GroupDescription {
            state: g.state(),
            protocol_type: g.protocol_type().unwrap_or("").to_string(),
            protocol: if g.state() == GroupState::Stable {
                g.protocol().unwrap_or("").to_string()
            } else {
                String::new()
            },
            members,
        })
    }

    /// Handles DeleteGroups: only groups without members can go; their
    /// offsets and metadata are deleted with them.
    pub async fn delete_groups(&self, ids: &[String]) -> Vec<Result<(), ResponseError>> {
        let mut results = Vec::with_capacity(ids.len());
        let mut records = Vec::new();
        let written = {
            let mut groups = self.groups.lock();
            let mut consumer = self.consumer_groups.lock();
            let now = self.now_ms();
            for id in ids {
                if let Some(g) = consumer.get_mut(id) {
                    let result = if g.is_empty() {
                        records.extend(g.tombstones());
                        consumer.remove(id);
                        records.extend(self.tombstones(id));
                        Ok(())
                    } else {
                        Err(ResponseError::NonEmptyGroup)
                    };
                    results.push(result);
                    continue;
                }
                let result = match groups.get_mut(id) {
                    None => Err(ResponseError::GroupIdNotFound),
                    Some(g) if g.state() == GroupState::Dead => Err(ResponseError::GroupIdNotFound),
                    Some(g) if !g.is_empty() => Err(ResponseError::NonEmptyGroup),
                    Some(g) => {
                        g.kill(now);
                        groups.remove_group(id);
                        records.extend(self.tombstones(id));
                        Ok(())
                    }
                };
                results.push(result);
            }
            self.store.submit(Entry::Records(records))
        };
        if let Err(e) = written.await {
            tracing::error!(error = %e, "cannot persist group deletion");
            for r in results.iter_mut().filter(|r| r.is_ok()) {
                *r = Err(ResponseError::CoordinatorNotAvailable);
            }
        }
        results
    }

    /// Tombstones for a group's metadata and every committed offset.
    fn tombstones(&self, group_id: &str) -> Vec<GroupRecord> {
        self.store
            .with_table(|table| {
                let offsets = table
                    .offsets
                    .get(group_id)
                    .into_iter()
                    .flatten()
                    .map(|((t, p), _)| GroupRecord::Offset {
                        group: group_id.to_string(),
                        topic: t.clone(),
                        partition: *p,
                        value: None,
                    });
                offsets.collect::<Vec<_>>()
            })
            .into_iter()
            .chain(self.metadata_tombstone(group_id))
            .collect()
    }

    /// The tombstone of a classic group's persisted metadata, if it has
    /// any.
    fn metadata_tombstone(&self, group_id: &str) -> Option<GroupRecord> {
        self.store
            .with_table(|t| t.groups.contains_key(group_id))
            .then(|| GroupRecord::Group {
                group: group_id.to_string(),
                value: None,
            })
    }

    /// Removes every group's committed offsets of a deleted topic (Kafka's
    /// `onPartitionsDeleted`). Returns how many were removed.
    pub async fn remove_topic_offsets(&self, topic: &str) -> Result<usize, StoreError> {
        let records: Vec<GroupRecord> = self.store.with_table(|table| {
            table
                .offsets
                .iter()
                .flat_map(|(group, offsets)| {
                    offsets
                        .keys()
                        .filter(|(t, _)| t == topic)
                        .map(move |(t, p)| GroupRecord::Offset {
                            group: group.clone(),
                            topic: t.clone(),
                            partition: *p,
                            value: None,
                        })
                })
                .collect()
        });
        let n = records.len();
        self.store.write(records).await?;
        Ok(n)
    }

    /// Handles OffsetDelete. Offsets of topics an active consumer group is
    /// subscribed to cannot be deleted.
    pub async fn delete_offsets(
        &self,
        group_id: &str,
        partitions: &[(String, i32)],
    ) -> Result<Vec<Result<(), ResponseError>>, ResponseError> {
        let consumer_subscribed = self.consumer_groups.lock().get(group_id).map(|g| {
            if g.is_empty() {
                BTreeSet::new()
            } else {
                g.subscribed_topic_names()
            }
        });
        let subscribed: BTreeSet<String> = if let Some(s) = consumer_subscribed {
            s
        } else {
            let groups = self.groups.lock();
            let group = groups.get(group_id).ok_or(ResponseError::GroupIdNotFound)?;
            if group.is_empty() {
                BTreeSet::new()
            } else {
                group.subscribed_topics().ok_or(ResponseError::NonEmptyGroup)?
            }
        };
        let mut results = Vec::with_capacity(partitions.len());
        let mut records = Vec::new();
        let committed = self.fetch_offsets(group_id, Some(partitions));
        for (topic, partition, value) in committed {
            if subscribed.contains(&topic) {
                results.push(Err(ResponseError::GroupSubscribedToTopic));
                continue;
            }
            results.push(Ok(()));
            if value.is_some() {
                records.push(GroupRecord::Offset {
                    group: group_id.to_string(),
                    topic,
                    partition,
                    value: None,
                });
            }
        }
        self.persist(group_id, records, "offset deletion").await?;
        Ok(results)
    }

    /// Applies due timeouts in every group; -> the write, queued, of what
    /// changed (consumer groups' records, classic groups that became
    /// empty).
    fn tick(&self) -> impl std::future::Future<Output = Result<(), StoreError>> {
        let now = self.now_ms();
        let mut groups = self.groups.lock();
        let mut records = self.tick_consumer(&mut groups, now);
        records.extend(
            groups
                .values_mut()
                .filter(|g| g.next_deadline_ms().is_some_and(|d| d <= now))
                .filter_map(|g| {
                    g.tick(now).then(|| GroupRecord::Group {
                        group: g.id.clone(),
                        value: Some(g.metadata()),
                    })
                }),
        );
        self.store.submit(Entry::Records(records))
    }

    /// Session and rebalance timeouts of consumer groups.
    fn tick_consumer(&self, classic: &mut ClassicGroups, now: i64) -> Vec<GroupRecord> {
        let mut records = Vec::new();
        let mut consumer = self.consumer_groups.lock();
        let due: Vec<String> = consumer
            .values()
            .filter(|g| g.next_deadline_ms().is_some_and(|d| d <= now))
            .map(|g| g.id.clone())
            .collect();
        for id in due {
            let Some(g) = consumer.get_mut(&id) else { continue };
            // The target is recomputed for the topics the group knew; the
            // next heartbeat brings the broker's current ones.
            let topics = g.known_topics();
            if g.tick(&topics, now) {
                records.extend(g.changes());
                records.extend(self.maybe_downgrade(classic, &mut consumer, &id, &topics, now));
            }
        }
        records
    }

    fn next_deadline_ms(&self) -> Option<i64> {
        let classic = self
            .groups
            .lock()
            .values()
            .filter_map(Group::next_deadline_ms)
            .min();
        let consumer = self
            .consumer_groups
            .lock()
            .values()
            .filter_map(ConsumerGroup::next_deadline_ms)
            .min();
        classic.into_iter().chain(consumer).min()
    }

    /// `offsets.retention.minutes`: offsets of an empty group expire that
    /// long after it became empty (after their commit, for groups that
    /// never had members); offsets of topics a live consumer group no
    /// longer subscribes to expire that long after their commit. An empty
    /// group left without offsets is deleted. -> the write of the
    /// tombstones, queued under the locks.
    fn expire_offsets(&self) -> impl std::future::Future<Output = Result<(), StoreError>> {
        let now = self.now_ms();
        let retention_ms = self.config.offsets_retention_ms;
        let mut groups = self.groups.lock();
        let mut consumer = self.consumer_groups.lock();
        let mut records = Vec::new();
        let mut emptied = Vec::new();
        self.store.with_table(|table| {
            // Consumer groups: offsets expire that long after their commit
            // once the group is empty or no longer subscribes to their
            // topic (Kafka's rule for them); an empty group without
            // offsets goes.
            for group in consumer.values() {
                let subscribed = group.subscribed_topic_names();
                let remaining = expire(
                    &group.id,
                    table.offsets.get(&group.id),
                    &mut records,
                    |topic, v| {
                        (group.is_empty() || !subscribed.contains(topic))
                            && v.commit_timestamp_ms + retention_ms <= now
                    },
                );
                if group.is_empty() && remaining == 0 {
                    emptied.push(group.id.clone());
                }
            }
            for group in groups.values() {
                let subscribed = (!group.is_empty()).then(|| group.subscribed_topics()).flatten();
                let remaining = expire(
                    &group.id,
                    table.offsets.get(&group.id),
                    &mut records,
                    |topic, v| {
                        if group.is_empty() {
                            let since = if group.protocol_type().is_some() {
                                group.state_since_ms().max(v.commit_timestamp_ms)
                            } else {
                                v.commit_timestamp_ms
                            };
                            since + retention_ms <= now
                        } else {
                            subscribed.as_ref().is_some_and(|s| !s.contains(topic))
                                && v.commit_timestamp_ms + retention_ms <= now
                        }
                    },
                );
                if group.is_empty() && remaining == 0 && group.state() == GroupState::Empty {
                    emptied.push(group.id.clone());
                }
            }
        });
        for id in emptied {
            tracing::info!(group = %id, "removing empty group without offsets");
            if let Some(mut g) = consumer.remove(&id) {
                records.extend(g.tombstones());
            }
            if let Some(mut g) = groups.remove_group(&id) {
                g.kill(now);
            }
            records.extend(self.metadata_tombstone(&id));
        }
        self.store.submit(Entry::Records(records))
    }

    /// Runs group timeouts and offset expiry until the runtime stops.
    pub fn spawn_timers(self: &Arc<Self>) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                let written = me.tick();
                if let Err(e) = written.await {
                    tracing::error!(error = %e, "cannot persist group state");
                }
                let wait_ms = me
                    .next_deadline_ms()
                    .map_or(60_000, |d| (d - me.now_ms()).clamp(1, 60_000));
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(wait_ms as u64)) => {}
                    _ = me.timer.notified() => {}
                }
            }
        });
        let me = Arc::clone(self);
        let every = Duration::from_millis(self.config.offsets_retention_check_interval_ms.max(1) as u64);
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(every);
            interval.tick().await;
            loop {
                interval.tick().await;
                let written = me.expire_offsets();
                if let Err(e) = written.await {
                    tracing::error!(error = %e, "cannot persist expired offsets");
                }
            }
        });
    }

    /// Flushes and closes the group log. Blocking.
    pub fn close(&self) {
        self.store.close();
    }
}

/// Tombstones, into `records`, for the offsets of `group` that `expired`
/// picks (by topic and committed value); -> how many remain.
fn expire(
    group: &str,
    offsets: Option<&store::GroupOffsets>,
    records: &mut Vec<GroupRecord>,
    expired: impl Fn(&str, &CommittedOffset) -> bool,
) -> usize {
    let mut remaining = 0;
    for ((topic, partition), v) in offsets.into_iter().flatten() {
        if expired(topic, v) {
            records.push(GroupRecord::Offset {
                group: group.to_string(),
                topic: topic.clone(),
                partition: *partition,
                value: None,
            });
        } else {
            remaining += 1;
        }
    }
    remaining
}

/// The groups a group log's table holds, as live groups: consumer groups
/// where it has their records, classic groups for the rest (and for every
/// group with offsets only).
fn restore(
    table: &GroupTable,
    config: &CoordinatorConfig,
    now: i64,
) -> (HashMap<String, Group>, HashMap<String, ConsumerGroup>) {
    let mut groups = HashMap::new();
    let mut consumer_groups = HashMap::new();
    for (id, view) in &table.consumer {
        let g = ConsumerGroup::restore(id, view, config.consumer.clone(), now);
        consumer_groups.insert(id.to_string(), g);
    }
    for meta in table
        .groups
        .values()
        .filter(|m| !consumer_groups.contains_key(&m.group))
    {
        groups.insert(meta.group.clone(), Group::restore(meta, config.group, now));
    }
    for id in table
        .offsets
        .keys()
        .filter(|id| !consumer_groups.contains_key(*id))
    {
        groups
            .entry(id.clone())
            .or_insert_with(|| Group::new(id, config.group, now));
    }
    (groups, consumer_groups)
}

/// Removes the groups `owns` says from the live groups.
fn drop_groups(
    groups: &mut ClassicGroups,
    consumer_groups: &mut HashMap<String, ConsumerGroup>,
    owns: &dyn Fn(&str) -> bool,
) {
    let classic: Vec<String> = groups.keys().filter(|g| owns(g)).cloned().collect();
    for id in classic {
        groups.remove_group(&id);
    }
    consumer_groups.retain(|g, _| !owns(g));
}

#[cfg(test)]
mod tests;
