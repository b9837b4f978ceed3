//! One consumer group under Kafka's classic protocol: membership, the
//! join / sync rebalance phases, heartbeats and session expiry.
//!
//! This is a state machine without I/O and without a clock: every operation
//! takes `now_ms`, and a request that must wait for the rebalance gets a
//! [`WaiterId`]; a later operation (another member's join, a timer tick)
//! answers it with a [`Completion`], which the caller takes with
//! [`Group::take_completions`] and delivers. A waiter the group no longer
//! holds ([`Group::held_waiters`]) without having answered it is gone: its
//! member was replaced or sent the request again. Persisting the assignment
//! is the caller's job:
//! [`Group::sync`] hands the leader a [`SyncOutcome::Persist`] and the caller
//! reports back through [`Group::assignment_persisted`].
//!
//! States (Kafka's names, reported by DescribeGroups and ListGroups):
//!
//! ```text
//!   Empty --join--> PreparingRebalance --all joined / timeout--> CompletingRebalance
//!                        ^                                          | leader's assignment
//!                        |                                          v persisted
//!                        +---- member joins, leaves or expires ---- Stable
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use bytes::Bytes;
use keel_protocol::ResponseError;

use super::records::{subscribed_topics, GroupMetadata, MemberMetadata};
use super::MemberDescription;

/// Timeouts and limits shared by every group (Kafka's `group.*` broker
/// configs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupConfig {
    /// `group.min.session.timeout.ms` / `group.max.session.timeout.ms`.
    pub min_session_timeout_ms: i32,
    pub max_session_timeout_ms: i32,
    /// `group.initial.rebalance.delay.ms`: how long the first rebalance of
    /// an empty group waits for more members.
    pub initial_rebalance_delay_ms: i32,
    /// `group.max.size`.
    pub max_size: usize,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig {
            min_session_timeout_ms: 6_000,
            max_session_timeout_ms: 1_800_000,
            initial_rebalance_delay_ms: 3_000,
            max_size: usize::MAX,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
    /// Deleted; the coordinator drops the group right after.
    Dead,
}

impl GroupState {
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
            GroupState::Dead => "Dead",
        }
    }
}

/// A JoinGroup request, decoded.
#[derive(Debug, Clone)]
pub struct JoinParams {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    /// Assignment strategies in the member's order of preference, each
    /// with its subscription metadata.
    pub protocols: Vec<(String, Bytes)>,
    /// JoinGroup v4+: a new dynamic member first gets its id with
    /// MEMBER_ID_REQUIRED and must join again with it.
    pub require_known_member_id: bool,
}

/// What a JoinGroup request is answered with.
#[derive(Debug, Clone, Default)]
pub struct JoinResult {
    pub error: Option<ResponseError>,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub leader: String,
    pub member_id: String,
    /// Every member with its metadata for the chosen protocol; only the
    /// leader gets them, to compute the assignment.
    pub members: Vec<JoinedMember>,
}

#[derive(Debug, Clone)]
pub struct JoinedMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub metadata: Bytes,
}

impl JoinResult {
    pub fn error(error: ResponseError, member_id: &str) -> JoinResult {
        JoinResult {
            error: Some(error),
            generation: -1,
            member_id: member_id.to_string(),
            ..JoinResult::default()
        }
    }
}

/// What a SyncGroup request is answered with: the member's assignment.
pub type SyncResult = Result<SyncAnswer, ResponseError>;

#[derive(Debug, Clone)]
pub struct SyncAnswer {
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignment: Bytes,
}

/// A member moving between a classic and a consumer group (KIP-848 online
/// migration).
#[derive(Debug, Clone)]
pub struct MigratingMember {
    pub id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    /// Its strategies with their metadata, in its order of preference.
    pub protocols: Vec<(String, Bytes)>,
    /// Its subscription under the group's strategy.
    pub subscription: Bytes,
    pub assignment: Bytes,
}

/// A request waiting for the rebalance to move on. Unique across groups
/// and their incarnations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WaiterId {
    /// The group's incarnation (random, per `Group` value).
    group: u64,
    n: u64,
}

/// An answer to a waiting request.
#[derive(Debug)]
pub enum Completion {
    Join(WaiterId, JoinResult),
    Sync(WaiterId, SyncResult),
}

/// Either an answer now or one that arrives, as a [`Completion`] for the
/// waiter, when the rebalance moves on.
#[derive(Debug)]
pub enum Answer<T> {
    Now(T),
    Later(WaiterId),
}

/// The result of [`Group::sync`].
#[derive(Debug)]
pub enum SyncOutcome {
    Answer(Answer<SyncResult>),
    /// The leader sent the assignment: persist `metadata`, then call
    /// [`Group::assignment_persisted`]; the answer arrives for `answer`.
    Persist {
        metadata: GroupMetadata,
        generation: i32,
        answer: WaiterId,
    },
}

fn take_waiter(incarnation: u64, next: &mut u64) -> WaiterId {
    *next += 1;
    WaiterId {
        group: incarnation,
        n: *next,
    }
}

/// One member of the group.
#[derive(Debug)]
struct Member {
    instance_id: Option<String>,
    client_id: String,
    client_host: String,
    session_timeout_ms: i32,
    rebalance_timeout_ms: i32,
    protocols: Vec<(String, Bytes)>,
    assignment: Bytes,
    /// Order of arrival: the first member still present leads.
    seq: u64,
    /// Set while the member's JoinGroup waits for the join phase to end.
    join_waiter: Option<WaiterId>,
    /// Set while the member's SyncGroup waits for the leader's assignment.
    sync_waiter: Option<WaiterId>,
    /// The member is removed if no heartbeat arrives before this, unless
    /// it is waiting in a join or sync (the rebalance timeout bounds those).
    session_deadline_ms: i64,
}

impl Member {
    fn metadata_for(&self, protocol: &str) -> Bytes {
        self.protocols
            .iter()
            .find(|(name, _)| name == protocol)
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    }

    fn heartbeat(&mut self, now_ms: i64) {
        self.session_deadline_ms = now_ms + i64::from(self.session_timeout_ms);
    }
}

/// The initial delayed join of an empty group (Kafka's `InitialDelayedJoin`):
/// the join phase ends when a delay passes with no new member, or when the
/// rebalance timeout is used up.
#[derive(Debug, Clone, Copy)]
struct InitialDelay {
    deadline_ms: i64,
    remaining_ms: i64,
    new_member_joined: bool,
}

#[derive(Debug)]
pub struct Group {
    pub id: String,
    config: GroupConfig,
    state: GroupState,
    /// When `state` was entered; the offsets of an empty group expire
    /// relative to it.
    state_since_ms: i64,
    generation: i32,
    protocol_type: Option<String>,
    /// The assignment strategy chosen for the current generation.
    protocol: Option<String>,
    leader: Option<String>,
    members: BTreeMap<String, Member>,
    /// Member ids handed out with MEMBER_ID_REQUIRED and not joined yet,
    /// with the time they are forgotten.
    pending_members: HashMap<String, i64>,
    /// group.instance.id -> member id, for the static members.
    static_members: HashMap<String, String>,
    /// PreparingRebalance: the join phase ends by this time at the latest.
    join_deadline_ms: Option<i64>,
    initial_delay: Option<InitialDelay>,
    /// CompletingRebalance: members that have not sent SyncGroup by then
    /// are removed.
    sync_deadline_ms: Option<i64>,
    /// CompletingRebalance: the leader's assignment is being persisted.
    assignment_in_flight: bool,
    next_seq: u64,
    /// This value's incarnation, and the next waiter's number in it.
    incarnation: u64,
    next_waiter: u64,
    /// Answers to waiting requests, not yet taken by the caller.
    completions: Vec<Completion>,
}

impl Group {
    pub fn new(id: &str, config: GroupConfig, now_ms: i64) -> Group {
        Group {
            id: id.to_string(),
            config,
            state: GroupState::Empty,
            state_since_ms: now_ms,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            pending_members: HashMap::new(),
            static_members: HashMap::new(),
            join_deadline_ms: None,
            initial_delay: None,
            sync_deadline_ms: None,
            assignment_in_flight: false,
            next_seq: 0,
            incarnation: uuid::Uuid::new_v4().as_u64_pair().0,
            next_waiter: 0,
            completions: Vec::new(),
        }
    }

    /// A new waiter for a request that waits for the rebalance.
    fn new_waiter(&mut self) -> WaiterId {
        take_waiter(self.incarnation, &mut self.next_waiter)
    }

    /// The answers to waiting requests since the last call.
    pub fn take_completions(&mut self) -> Vec<Completion> {
        std::mem::take(&mut self.completions)
    }

    /// The waiters requests still wait as.
    pub fn held_waiters(&self) -> HashSet<WaiterId> {
        self.members
            .values()
            .flat_map(|m| [m.join_waiter, m.sync_waiter])
            .flatten()
            .collect()
    }

    /// Rebuilds a group from its persisted metadata. Members come back
    /// Stable with a fresh session, so those whose clients are gone expire.
    pub fn restore(meta: &GroupMetadata, config: GroupConfig, now_ms: i64) -> Group {
        let mut group = Group::new(&meta.group, config, now_ms);
        group.generation = meta.generation;
        group.protocol_type = (!meta.protocol_type.is_empty()).then(|| meta.protocol_type.clone());
        group.protocol = meta.protocol.clone();
        group.leader = meta.leader.clone();
        if meta.current_state_timestamp_ms >= 0 {
            group.state_since_ms = meta.current_state_timestamp_ms;
        }
        let protocol = meta.protocol.clone().unwrap_or_default();
        for m in &meta.members {
            let seq = group.take_seq();
            let member = Member {
                instance_id: m.instance_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                session_timeout_ms: m.session_timeout_ms,
                rebalance_timeout_ms: m.rebalance_timeout_ms,
                protocols: vec![(protocol.clone(), m.subscription.clone())],
                assignment: m.assignment.clone(),
                seq,
                join_waiter: None,
                sync_waiter: None,
                session_deadline_ms: now_ms + i64::from(m.session_timeout_ms),
            };
            if let Some(instance) = &m.instance_id {
                group.static_members.insert(instance.clone(), m.member_id.clone());
            }
            group.members.insert(m.member_id.clone(), member);
        }
        if !group.members.is_empty() {
            group.set_state(GroupState::Stable, now_ms);
        }
        group
    }

    /// The group as persisted: written when an assignment is agreed and
    /// when the group becomes empty.
    pub fn metadata(&self) -> GroupMetadata {
        let protocol = self.protocol.clone().unwrap_or_default();
        GroupMetadata {
            group: self.id.clone(),
            protocol_type: self.protocol_type.clone().unwrap_or_default(),
            generation: self.generation,
            protocol: self.protocol.clone(),
            leader: self.leader.clone(),
            current_state_timestamp_ms: self.state_since_ms,
            members: self
                .members
                .iter()
                .map(|(id, m)| MemberMetadata {
                    member_id: id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    session_timeout_ms: m.session_timeout_ms,
                    subscription: m.metadata_for(&protocol),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        }
    }

    pub fn state(&self) -> GroupState {
        self.state
    }

    pub fn state_since_ms(&self) -> i64 {
        self.state_since_ms
    }

    pub fn generation(&self) -> i32 {
        self.generation
    }

    pub fn protocol_type(&self) -> Option<&str> {
        self.protocol_type.as_deref()
    }

    pub fn protocol(&self) -> Option<&str> {
        self.protocol.as_deref()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Members as DescribeGroups shows them: metadata and assignment only
    /// in Stable, as in Kafka.
    pub fn describe_members(&self) -> Vec<MemberDescription> {
        let stable = self.state == GroupState::Stable;
        let protocol = self.protocol.clone().unwrap_or_default();
        self.members
            .iter()
            .map(|(id, m)| {
                let (metadata, assignment) = if stable {
                    (m.metadata_for(&protocol), m.assignment.clone())
                } else {
                    (Bytes::new(), Bytes::new())
                };
                MemberDescription {
                    member_id: id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    metadata,
                    assignment,
                }
            })
            .collect()
    }

    /// For a consumer-protocol group, the topics its members subscribe to
    /// (read from their subscription metadata); `None` for other protocol
    /// types, whose metadata Keel cannot read.
    pub fn subscribed_topics(&self) -> Option<BTreeSet<String>> {
        if self.protocol_type.as_deref() != Some("consumer") {
            return None;
        }
        let protocol = self.protocol.clone().unwrap_or_default();
        let topics = self
            .members
            .values()
            .filter_map(|m| subscribed_topics(&m.metadata_for(&protocol)))
            .flatten()
            .collect();
        Some(topics)
    }

    fn take_seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    fn set_state(&mut self, state: GroupState, now_ms: i64) {
        self.state = state;
        self.state_since_ms = now_ms;
    }

    pub fn member_count(&self) -> usize {
        self.members.len()
    }

    /// The members as a consumer group takes them over (the online
    /// upgrade): the generation, and each member with its subscription
    /// under the group's strategy (its first one if no join phase has
    /// ended yet).
    pub fn migrating_members(&self) -> (i32, Vec<MigratingMember>) {
        let members = self
            .members
            .iter()
            .map(|(id, m)| MigratingMember {
                id: id.clone(),
                instance_id: m.instance_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                session_timeout_ms: m.session_timeout_ms,
                rebalance_timeout_ms: m.rebalance_timeout_ms,
                protocols: m.protocols.clone(),
                subscription: match &self.protocol {
                    Some(p) => m.metadata_for(p),
                    None => m.protocols.first().map(|(_, md)| md.clone()).unwrap_or_default(),
                },
                assignment: m.assignment.clone(),
            })
            .collect();
        (self.generation, members)
    }

    /// Ends the group once a consumer group has taken its members over:
    /// requests waiting in a join or sync phase are told to join again.
    pub fn hand_over(&mut self, now_ms: i64) {
        self.end(ResponseError::RebalanceInProgress, now_ms);
    }

    /// A classic group taking over a consumer group's members (the online
    /// downgrade): at the group epoch as generation with their partitions,
    /// then rebalancing, so every member joins again.
    pub fn take_over(
        id: &str,
        config: GroupConfig,
        (generation, protocol): (i32, String),
        members: Vec<MigratingMember>,
        now_ms: i64,
    ) -> Group {
        let mut group = Group::new(id, config, now_ms);
        group.generation = generation;
        group.protocol_type = Some("consumer".to_string());
        group.protocol = Some(protocol);
        group.leader = members.first().map(|m| m.id.clone());
        for m in members {
            let seq = group.take_seq();
            if let Some(instance) = &m.instance_id {
                group.static_members.insert(instance.clone(), m.id.clone());
            }
            let member = Member {
                instance_id: m.instance_id,
                client_id: m.client_id,
                client_host: m.client_host,
                session_timeout_ms: m.session_timeout_ms,
                rebalance_timeout_ms: m.rebalance_timeout_ms,
                protocols: m.protocols,
                assignment: m.assignment,
                seq,
                join_waiter: None,
                sync_waiter: None,
                session_deadline_ms: now_ms + i64::from(m.session_timeout_ms),
            };
            group.members.insert(m.id, member);
        }
        group.set_state(GroupState::Stable, now_ms);
        group.prepare_rebalance(now_ms);
        group
    }

    /// Marks the group deleted: every waiting request is told so.
    pub fn kill(&mut self, now_ms: i64) {
        self.end(ResponseError::CoordinatorNotAvailable, now_ms);
    }

    /// Answers every waiting join and sync with `error`; the group is Dead.
    fn end(&mut self, error: ResponseError, now_ms: i64) {
        for (id, m) in &mut self.members {
            if let Some(w) = m.join_waiter.take() {
                self.completions
                    .push(Completion::Join(w, JoinResult::error(error, id)));
            }
            if let Some(w) = m.sync_waiter.take() {
                self.completions.push(Completion::Sync(w, Err(error)));
            }
        }
        self.members.clear();
        self.static_members.clear();
        self.pending_members.clear();
        self.set_state(GroupState::Dead, now_ms);
    }

    /// Handles a JoinGroup request (timeouts already validated).
    pub fn join(&mut self, p: JoinParams, now_ms: i64) -> Answer<JoinResult> {
        if self.state == GroupState::Dead {
            return Answer::Now(JoinResult::error(
                ResponseError::CoordinatorNotAvailable,
                &p.member_id,
            ));
        }
        if !self.supports(&p) {
            return Answer::Now(JoinResult::error(
                ResponseError::InconsistentGroupProtocol,
                &p.member_id,
            ));
        }
        if p.member_id.is_empty() {
            self.join_new(p, now_ms)
        } else {
            self.join_known(p, now_ms)
        }
    }

    /// An empty group takes any protocol; otherwise the type must match and
    /// one strategy must be supported by every other member too.
    fn supports(&self, p: &JoinParams) -> bool {
        if p.protocol_type.is_empty() || p.protocols.is_empty() {
            return false;
        }
        if self.members.is_empty() {
            return true;
        }
        if self.protocol_type.as_deref() != Some(p.protocol_type.as_str()) {
            return false;
        }
        p.protocols.iter().any(|(name, _)| {
            self.members
                .iter()
                .filter(|(id, _)| **id != p.member_id)
                .all(|(_, m)| m.protocols.iter().any(|(n, _)| n == name))
        })
    }

    fn join_new(&mut self, p: JoinParams, now_ms: i64) -> Answer<JoinResult> {
        if let Some(instance) = &p.instance_id {
            if let Some(old_id) = self.static_members.get(instance).cloned() {
                return self.replace_static_member(&old_id, p, now_ms);
            }
        }
        if self.members.len() + self.pending_members.len() >= self.config.max_size {
            return Answer::Now(JoinResult::error(ResponseError::GroupMaxSizeReached, ""));
        }
        let prefix = p.instance_id.as_deref().unwrap_or(&p.client_id);
        let member_id = format!("{prefix}-{}", uuid::Uuid::new_v4());
        if p.require_known_member_id && p.instance_id.is_none() {
            let forget_at_ms = now_ms + i64::from(p.session_timeout_ms);
            self.pending_members.insert(member_id.clone(), forget_at_ms);
            return Answer::Now(JoinResult::error(ResponseError::MemberIdRequired, &member_id));
        }
        self.add_member_and_rebalance(member_id, p, now_ms)
    }

    fn add_member_and_rebalance(
        &mut self,
        member_id: String,
        p: JoinParams,
        now_ms: i64,
    ) -> Answer<JoinResult> {
        let waiter = self.new_waiter();
        let seq = self.take_seq();
        if let Some(instance) = &p.instance_id {
            self.static_members.insert(instance.clone(), member_id.clone());
        }
        if self.protocol_type.is_none() || self.members.is_empty() {
            self.protocol_type = Some(p.protocol_type.clone());
        }
        let member = Member {
            instance_id: p.instance_id,
            client_id: p.client_id,
            client_host: p.client_host,
            session_timeout_ms: p.session_timeout_ms,
            rebalance_timeout_ms: p.rebalance_timeout_ms,
            protocols: p.protocols,
            assignment: Bytes::new(),
            seq,
            join_waiter: Some(waiter),
            sync_waiter: None,
            session_deadline_ms: now_ms + i64::from(p.session_timeout_ms),
        };
        self.members.insert(member_id, member);
        if let Some(delay) = &mut self.initial_delay {
            delay.new_member_joined = true;
        }
        if self.state == GroupState::PreparingRebalance {
            self.extend_join_deadline();
            self.check_join_complete(now_ms);
        } else {
            self.prepare_rebalance(now_ms);
        }
        Answer::Later(waiter)
    }

    fn join_known(&mut self, p: JoinParams, now_ms: i64) -> Answer<JoinResult> {
        let member_id = p.member_id.clone();
        if self.pending_members.remove(&member_id).is_some() {
            return self.add_member_and_rebalance(member_id, p, now_ms);
        }
        if let Err(e) = self.check_member(&member_id, p.instance_id.as_deref()) {
            return Answer::Now(JoinResult::error(e, &member_id));
        }
        let state = self.state;
        let is_leader = self.is_leader(&member_id);
        let member = self.members.get_mut(&member_id).expect("checked above");
        let unchanged = member.protocols == p.protocols;
        match state {
            GroupState::CompletingRebalance if unchanged => {
                member.heartbeat(now_ms);
                Answer::Now(self.join_result_for(&member_id))
            }
            GroupState::Stable if unchanged && !is_leader => {
                member.heartbeat(now_ms);
                Answer::Now(self.join_result_for(&member_id))
            }
            GroupState::PreparingRebalance | GroupState::CompletingRebalance | GroupState::Stable => {
                let waiter = take_waiter(self.incarnation, &mut self.next_waiter);
                update_member(member, p, now_ms);
                member.join_waiter = Some(waiter);
                if state == GroupState::PreparingRebalance {
                    self.check_join_complete(now_ms);
                } else {
                    self.prepare_rebalance(now_ms);
                }
                Answer::Later(waiter)
            }
            GroupState::Empty | GroupState::Dead => {
                Answer::Now(JoinResult::error(ResponseError::UnknownMemberId, &member_id))
            }
        }
    }

    /// A static member came back with a new client instance: the new one
    /// takes the old one's place (and assignment); the old one is fenced.
    fn replace_static_member(&mut self, old_id: &str, p: JoinParams, now_ms: i64) -> Answer<JoinResult> {
        let instance = p.instance_id.clone().expect("static member");
        let mut member = self.members.remove(old_id).expect("static members are members");
        if let Some(w) = member.join_waiter.take() {
            self.completions.push(Completion::Join(
                w,
                JoinResult::error(ResponseError::FencedInstanceId, old_id),
            ));
        }
        if let Some(w) = member.sync_waiter.take() {
            self.completions
                .push(Completion::Sync(w, Err(ResponseError::FencedInstanceId)));
        }
        let new_id = format!("{instance}-{}", uuid::Uuid::new_v4());
        if self.leader.as_deref() == Some(old_id) {
            self.leader = Some(new_id.clone());
        }
        self.static_members.insert(instance, new_id.clone());
        let unchanged = member.protocols == p.protocols;
        update_member(&mut member, p, now_ms);
        self.members.insert(new_id.clone(), member);
        match self.state {
            GroupState::Stable if unchanged => {
                // Kafka's static membership promise: a restarted member with
                // the same subscription gets its old assignment without a
                // rebalance (SyncGroup answers it from the stored state).
                let mut result = self.join_result_for(&new_id);
                result.members.clear();
                Answer::Now(result)
            }
            _ => {
                let waiter = self.new_waiter();
                self.members.get_mut(&new_id).expect("inserted").join_waiter = Some(waiter);
                if self.state == GroupState::PreparingRebalance {
                    self.check_join_complete(now_ms);
                } else {
                    self.prepare_rebalance(now_ms);
                }
                Answer::Later(waiter)
            }
        }
    }

    fn is_leader(&self, member_id: &str) -> bool {
        self.leader.as_deref() == Some(member_id)
    }

    /// UNKNOWN_MEMBER_ID or FENCED_INSTANCE_ID, as Kafka checks them.
    fn check_member(&self, member_id: &str, instance_id: Option<&str>) -> Result<(), ResponseError> {
        if let Some(instance) = instance_id {
            match self.static_members.get(instance) {
                Some(current) if current != member_id => return Err(ResponseError::FencedInstanceId),
                None if self.members.contains_key(member_id) => return Err(ResponseError::FencedInstanceId),
                None => return Err(ResponseError::UnknownMemberId),
                Some(_) => {}
            }
        }
        match self.members.get(member_id) {
            None => Err(ResponseError::UnknownMemberId),
            Some(m) if m.instance_id.is_some() && m.instance_id.as_deref() != instance_id => {
                Err(ResponseError::FencedInstanceId)
            }
            Some(_) => Ok(()),
        }
    }

    fn max_rebalance_timeout_ms(&self) -> i64 {
        self.members
            .values()
            .map(|m| i64::from(m.rebalance_timeout_ms))
            .max()
            .unwrap_or(0)
    }

    /// Starts a join phase: every member must join again.
    fn prepare_rebalance(&mut self, now_ms: i64) {
        for m in self.members.values_mut() {
            if let Some(w) = m.sync_waiter.take() {
                self.completions
                    .push(Completion::Sync(w, Err(ResponseError::RebalanceInProgress)));
            }
        }
        self.assignment_in_flight = false;
        self.sync_deadline_ms = None;
        let from_empty = self.state == GroupState::Empty;
        self.set_state(GroupState::PreparingRebalance, now_ms);
        let rebalance_ms = self.max_rebalance_timeout_ms();
        self.join_deadline_ms = Some(now_ms + rebalance_ms);
        let delay_ms = i64::from(self.config.initial_rebalance_delay_ms);
        self.initial_delay = (from_empty && delay_ms > 0).then(|| InitialDelay {
            deadline_ms: now_ms + delay_ms.min(rebalance_ms),
            remaining_ms: (rebalance_ms - delay_ms).max(0),
            new_member_joined: false,
        });
        self.check_join_complete(now_ms);
    }

    /// A member joining mid-phase may bring a longer rebalance timeout.
    fn extend_join_deadline(&mut self) {
        let latest = self.state_since_ms + self.max_rebalance_timeout_ms();
        if let Some(deadline) = &mut self.join_deadline_ms {
            *deadline = (*deadline).max(latest);
        }
    }

    /// Ends the join phase once every member (and every member id handed
    /// out) has joined, unless the initial delay is still running.
    fn check_join_complete(&mut self, now_ms: i64) {
        if self.state != GroupState::PreparingRebalance || self.initial_delay.is_some() {
            return;
        }
        let all_joined =
            self.pending_members.is_empty() && self.members.values().all(|m| m.join_waiter.is_some());
        if all_joined {
            self.complete_join(now_ms);
        }
    }

    /// Ends the join phase: members that did not join are dropped (static
    /// ones stay, as in Kafka), the generation advances, the protocol is
    /// chosen and every waiting JoinGroup is answered.
    fn complete_join(&mut self, now_ms: i64) {
        let absent: Vec<String> = self
            .members
            .iter()
            .filter(|(_, m)| m.join_waiter.is_none() && m.instance_id.is_none())
            .map(|(id, _)| id.clone())
            .collect();
        for id in absent {
            self.members.remove(&id);
        }
        self.join_deadline_ms = None;
        self.initial_delay = None;
        self.generation += 1;
        if self.members.is_empty() {
            self.protocol = None;
            self.leader = None;
            self.set_state(GroupState::Empty, now_ms);
            return;
        }
        self.protocol = self.select_protocol();
        if !self.leader.as_ref().is_some_and(|l| self.members.contains_key(l)) {
            self.leader = self
                .members
                .iter()
                .filter(|(_, m)| m.join_waiter.is_some())
                .min_by_key(|(_, m)| m.seq)
                .or_else(|| self.members.iter().min_by_key(|(_, m)| m.seq))
                .map(|(id, _)| id.clone());
        }
        self.set_state(GroupState::CompletingRebalance, now_ms);
        self.sync_deadline_ms = Some(now_ms + self.max_rebalance_timeout_ms());
        let ids: Vec<String> = self.members.keys().cloned().collect();
        for id in ids {
            let result = self.join_result_for(&id);
            let member = self.members.get_mut(&id).expect("listed above");
            member.heartbeat(now_ms);
            if let Some(w) = member.join_waiter.take() {
                self.completions.push(Completion::Join(w, result));
            }
        }
    }

    /// Kafka's choice: among the strategies every member supports, the one
    /// most members list first (ties broken by name for determinism).
    fn select_protocol(&self) -> Option<String> {
        let first = self.members.values().next()?;
        let candidates: Vec<&String> = first
            .protocols
            .iter()
            .map(|(n, _)| n)
            .filter(|n| {
                self.members
                    .values()
                    .all(|m| m.protocols.iter().any(|(x, _)| x == *n))
            })
            .collect();
        let votes = |name: &String| {
            self.members
                .values()
                .filter(|m| {
                    m.protocols
                        .iter()
                        .map(|(n, _)| n)
                        .find(|n| candidates.contains(n))
                        == Some(name)
                })
                .count()
        };
        candidates
            .iter()
            .max_by(|a, b| votes(a).cmp(&votes(b)).then_with(|| b.cmp(a)))
            .map(|n| (*n).clone())
    }

    fn join_result_for(&self, member_id: &str) -> JoinResult {
        let protocol = self.protocol.clone().unwrap_or_default();
        let members = if self.is_leader(member_id) {
            let mut all: Vec<(&String, &Member)> = self.members.iter().collect();
            all.sort_by_key(|(_, m)| m.seq);
            all.into_iter()
                .map(|(id, m)| JoinedMember {
                    member_id: id.clone(),
                    instance_id: m.instance_id.clone(),
                    metadata: m.metadata_for(&protocol),
                })
                .collect()
        } else {
            Vec::new()
        };
        JoinResult {
            error: None,
            generation: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol.clone(),
            leader: self.leader.clone().unwrap_or_default(),
            member_id: member_id.to_string(),
            members,
        }
    }

    /// Handles a SyncGroup request.
    pub fn sync(
        &mut self,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
        protocol: (Option<&str>, Option<&str>),
        assignments: Vec<(String, Bytes)>,
        now_ms: i64,
    ) -> SyncOutcome {
        let now = |r: SyncResult| SyncOutcome::Answer(Answer::Now(r));
        if self.state == GroupState::Dead {
            return now(Err(ResponseError::CoordinatorNotAvailable));
        }
        if let Err(e) = self.check_member(member_id, instance_id) {
            return now(Err(e));
        }
        if generation != self.generation {
            return now(Err(ResponseError::IllegalGeneration));
        }
        let (protocol_type, protocol_name) = protocol;
        if protocol_type.is_some_and(|t| Some(t) != self.protocol_type.as_deref())
            || protocol_name.is_some_and(|n| Some(n) != self.protocol.as_deref())
        {
            return now(Err(ResponseError::InconsistentGroupProtocol));
        }
        match self.state {
            GroupState::PreparingRebalance => now(Err(ResponseError::RebalanceInProgress)),
            GroupState::Stable => {
                let member = self.members.get_mut(member_id).expect("checked");
                member.heartbeat(now_ms);
                let assignment = member.assignment.clone();
                now(Ok(self.sync_answer(assignment)))
            }
            GroupState::CompletingRebalance => self.sync_completing(member_id, assignments, now_ms),
            GroupState::Empty | GroupState::Dead => now(Err(ResponseError::UnknownMemberId)),
        }
    }

    fn sync_completing(
        &mut self,
        member_id: &str,
        assignments: Vec<(String, Bytes)>,
        now_ms: i64,
    ) -> SyncOutcome {
        let waiter = self.new_waiter();
        let member = self.members.get_mut(member_id).expect("checked");
        member.heartbeat(now_ms);
        member.sync_waiter = Some(waiter);
        if !self.is_leader(member_id) || self.assignment_in_flight {
            return SyncOutcome::Answer(Answer::Later(waiter));
        }
        let mut by_member: HashMap<String, Bytes> = assignments.into_iter().collect();
        for (id, m) in &mut self.members {
            m.assignment = by_member.remove(id).unwrap_or_default();
        }
        self.assignment_in_flight = true;
        SyncOutcome::Persist {
            metadata: self.metadata(),
            generation: self.generation,
            answer: waiter,
        }
    }

    fn sync_answer(&self, assignment: Bytes) -> SyncAnswer {
        SyncAnswer {
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol.clone(),
            assignment,
        }
    }

    /// The leader's assignment for `generation` was persisted (`Ok`) or
    /// not. On success the group is Stable and every waiting SyncGroup gets
    /// its assignment; on failure they get `error` and the group rebalances.
    pub fn assignment_persisted(&mut self, generation: i32, result: Result<(), ResponseError>, now_ms: i64) {
        if self.state != GroupState::CompletingRebalance || self.generation != generation {
            return;
        }
        self.assignment_in_flight = false;
        match result {
            Ok(()) => {
                self.set_state(GroupState::Stable, now_ms);
                self.sync_deadline_ms = None;
                let answers: Vec<(String, SyncAnswer)> = self
                    .members
                    .iter()
                    .map(|(id, m)| (id.clone(), self.sync_answer(m.assignment.clone())))
                    .collect();
                for (id, answer) in answers {
                    let m = self.members.get_mut(&id).expect("listed above");
                    if let Some(w) = m.sync_waiter.take() {
                        self.completions.push(Completion::Sync(w, Ok(answer)));
                    }
                }
            }
            Err(error) => {
                for m in self.members.values_mut() {
                    m.assignment = Bytes::new();
                    if let Some(w) = m.sync_waiter.take() {
                        self.completions.push(Completion::Sync(w, Err(error)));
                    }
                }
                self.prepare_rebalance(now_ms);
            }
        }
    }

    /// Handles a Heartbeat request.
    pub fn heartbeat(
        &mut self,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
        now_ms: i64,
    ) -> Result<(), ResponseError> {
        if self.state == GroupState::Dead {
            return Err(ResponseError::CoordinatorNotAvailable);
        }
        self.check_member(member_id, instance_id)?;
        if generation != self.generation {
            return Err(ResponseError::IllegalGeneration);
        }
        self.members
            .get_mut(member_id)
            .expect("checked")
            .heartbeat(now_ms);
        match self.state {
            GroupState::PreparingRebalance => Err(ResponseError::RebalanceInProgress),
            GroupState::Empty => Err(ResponseError::UnknownMemberId),
            _ => Ok(()),
        }
    }

    /// Validates an OffsetCommit against the group (Kafka's rules for
    /// classic groups), refreshing the member's session if it is one.
    pub fn validate_commit(
        &mut self,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
        now_ms: i64,
    ) -> Result<(), ResponseError> {
        if self.state == GroupState::Dead {
            return Err(ResponseError::CoordinatorNotAvailable);
        }
        if generation < 0 && self.state == GroupState::Empty {
            // A commit from outside any generation (assign() or an admin
            // tool) is allowed while the group has no members.
            return Ok(());
        }
        self.check_member(member_id, instance_id)?;
        if generation != self.generation {
            return Err(ResponseError::IllegalGeneration);
        }
        if self.state == GroupState::CompletingRebalance {
            return Err(ResponseError::RebalanceInProgress);
        }
        self.members
            .get_mut(member_id)
            .expect("checked")
            .heartbeat(now_ms);
        Ok(())
    }

    /// Checks a TxnOffsetCommit (KIP-447): the member and generation it
    /// names, if any, must be current. Requests before v3 name neither and
    /// are taken as they are.
    pub fn validate_txn_commit(
        &self,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> Result<(), ResponseError> {
        if self.state == GroupState::Dead {
            return Err(ResponseError::CoordinatorNotAvailable);
        }
        if !member_id.is_empty() || instance_id.is_some() {
            self.check_member(member_id, instance_id)?;
        }
        if generation >= 0 && generation != self.generation {
            return Err(ResponseError::IllegalGeneration);
        }
        Ok(())
    }

    /// Handles one member of a LeaveGroup request. With only an instance
    /// id (admin tools removing static members), the member is found by it.
    pub fn leave(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        now_ms: i64,
    ) -> Result<(), ResponseError> {
        if self.state == GroupState::Dead {
            return Err(ResponseError::CoordinatorNotAvailable);
        }
        let id = match instance_id {
            Some(instance) => match self.static_members.get(instance) {
                None => return Err(ResponseError::UnknownMemberId),
                Some(current) if !member_id.is_empty() && current != member_id => {
                    return Err(ResponseError::FencedInstanceId)
                }
                Some(current) => current.clone(),
            },
            None => {
                if self.pending_members.remove(member_id).is_some() {
                    self.check_join_complete(now_ms);
                    return Ok(());
                }
                self.check_member(member_id, None)?;
                member_id.to_string()
            }
        };
        self.remove_member(&id, now_ms);
        Ok(())
    }

    fn remove_member(&mut self, member_id: &str, now_ms: i64) {
        let Some(mut member) = self.members.remove(member_id) else {
            return;
        };
        if let Some(instance) = &member.instance_id {
            self.static_members.remove(instance);
        }
        if let Some(w) = member.join_waiter.take() {
            self.completions.push(Completion::Join(
                w,
                JoinResult::error(ResponseError::UnknownMemberId, member_id),
            ));
        }
        if let Some(w) = member.sync_waiter.take() {
            self.completions
                .push(Completion::Sync(w, Err(ResponseError::UnknownMemberId)));
        }
        if self.leader.as_deref() == Some(member_id) {
            self.leader = self
                .members
                .iter()
                .min_by_key(|(_, m)| m.seq)
                .map(|(id, _)| id.clone());
        }
        match self.state {
            GroupState::Stable | GroupState::CompletingRebalance => self.prepare_rebalance(now_ms),
            GroupState::PreparingRebalance => self.check_join_complete(now_ms),
            GroupState::Empty | GroupState::Dead => {}
        }
    }

    /// The earliest time at which [`Group::tick`] has work to do.
    pub fn next_deadline_ms(&self) -> Option<i64> {
        let sessions = self
            .members
            .values()
            .filter(|m| m.join_waiter.is_none() && m.sync_waiter.is_none())
            .map(|m| m.session_deadline_ms);
        let pending = self.pending_members.values().copied();
        let phase = [
            self.join_deadline_ms,
            self.initial_delay.map(|d| d.deadline_ms),
            self.sync_deadline_ms,
        ];
        sessions.chain(pending).chain(phase.into_iter().flatten()).min()
    }

    /// Applies every timeout due at `now_ms`: expired sessions, forgotten
    /// member ids, the end of the initial delay, of the join phase and of
    /// the sync phase. Returns true if the group became Empty (its
    /// metadata should be persisted).
    pub fn tick(&mut self, now_ms: i64) -> bool {
        let was_empty = self.state == GroupState::Empty;
        self.pending_members.retain(|_, forget_at| *forget_at > now_ms);
        let expired: Vec<String> = self
            .members
            .iter()
            .filter(|(_, m)| {
                m.join_waiter.is_none() && m.sync_waiter.is_none() && m.session_deadline_ms <= now_ms
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            tracing::info!(group = %self.id, member = %id, "member session expired");
            self.remove_member(&id, now_ms);
        }
        self.tick_initial_delay(now_ms);
        if self.state == GroupState::PreparingRebalance && self.join_deadline_ms.is_some_and(|d| d <= now_ms)
        {
            self.complete_join(now_ms);
        }
        if self.state == GroupState::PreparingRebalance {
            self.check_join_complete(now_ms);
        }
        if self.state == GroupState::CompletingRebalance && self.sync_deadline_ms.is_some_and(|d| d <= now_ms)
        {
            let lagging: Vec<String> = self
                .members
                .iter()
                .filter(|(_, m)| m.sync_waiter.is_none())
                .map(|(id, _)| id.clone())
                .collect();
            self.sync_deadline_ms = None;
            for id in lagging {
                tracing::info!(group = %self.id, member = %id, "member did not sync in time");
                self.remove_member(&id, now_ms);
            }
        }
        !was_empty && self.state == GroupState::Empty
    }

    fn tick_initial_delay(&mut self, now_ms: i64) {
        let Some(delay) = self.initial_delay else {
            return;
        };
        if delay.deadline_ms > now_ms {
            return;
        }
        if delay.new_member_joined && delay.remaining_ms > 0 {
            let next_ms = i64::from(self.config.initial_rebalance_delay_ms).min(delay.remaining_ms);
            self.initial_delay = Some(InitialDelay {
                deadline_ms: now_ms + next_ms,
                remaining_ms: delay.remaining_ms - next_ms,
                new_member_joined: false,
            });
        } else {
            self.initial_delay = None;
            self.complete_join(now_ms);
        }
    }
}

fn update_member(member: &mut Member, p: JoinParams, now_ms: i64) {
    member.protocols = p.protocols;
    member.session_timeout_ms = p.session_timeout_ms;
    member.rebalance_timeout_ms = p.rebalance_timeout_ms;
    member.client_id = p.client_id;
    member.client_host = p.client_host;
    member.heartbeat(now_ms);
}

#[cfg(test)]
mod tests {
    //! The state machine alone: no runtime, no channels, the time given.

    use super::*;

    const SESSION_MS: i32 = 10_000;

    fn params(member_id: &str) -> JoinParams {
        JoinParams {
            member_id: member_id.into(),
            instance_id: None,
            client_id: "client".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout_ms: SESSION_MS,
            rebalance_timeout_ms: 30_000,
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), Bytes::from_static(b"meta"))],
            require_known_member_id: false,
        }
    }

    fn later<T>(answer: Answer<T>) -> WaiterId {
        match answer {
            Answer::Later(w) => w,
            Answer::Now(_) => panic!("answered at once"),
        }
    }

    fn joined(completions: Vec<Completion>) -> Vec<(WaiterId, JoinResult)> {
        completions
            .into_iter()
            .map(|c| match c {
                Completion::Join(w, r) => (w, r),
                Completion::Sync(w, r) => panic!("a sync answer for {w:?}: {r:?}"),
            })
            .collect()
    }

    #[test]
    fn waiting_joins_are_answered_as_completions_when_the_join_phase_ends() {
        let config = GroupConfig {
            initial_rebalance_delay_ms: 100,
            ..GroupConfig::default()
        };
        let mut g = Group::new("g", config, 0);
        let a = later(g.join(params(""), 0));
        let b = later(g.join(params(""), 10));
        assert_ne!(a, b);
        assert!(
            g.take_completions().is_empty(),
            "the initial delay holds the join phase open"
        );
        assert!(g.held_waiters().contains(&a) && g.held_waiters().contains(&b));
        // A member joined during the initial delay: it runs once more.
        assert!(!g.tick(200));
        assert!(g.take_completions().is_empty());
        assert!(!g.tick(400));
        let answered = joined(g.take_completions());
        let waiters: std::collections::HashSet<WaiterId> = answered.iter().map(|(w, _)| *w).collect();
        assert_eq!(waiters, [a, b].into());
        for (_, r) in &answered {
            assert_eq!((r.error, r.generation), (None, 1));
        }
        assert!(
            !g.held_waiters().contains(&a) && !g.held_waiters().contains(&b),
            "answered waiters are let go"
        );
        assert!(g.take_completions().is_empty(), "taken once");
        // Waiters are unique across incarnations of a group id.
        let mut again = Group::new("g", config, 0);
        let c = later(again.join(params(""), 0));
        assert!(!g.held_waiters().contains(&c) && c != a);
    }

    #[test]
    fn a_join_sent_again_lets_the_first_waiter_go_unanswered() {
        let config = GroupConfig {
            initial_rebalance_delay_ms: 100,
            ..GroupConfig::default()
        };
        let mut g = Group::new("g", config, 0);
        let first = later(g.join(params(""), 0));
        later(g.join(params(""), 0));
        assert!(!g.tick(200));
        assert!(!g.tick(400));
        let (_, r) = joined(g.take_completions())
            .into_iter()
            .find(|(w, _)| *w == first)
            .expect("answered");
        // One member joins again with a new subscription (a new rebalance,
        // which waits for the other) and, while waiting, sends its
        // JoinGroup once more.
        let changed = || JoinParams {
            protocols: vec![("range".into(), Bytes::from_static(b"other"))],
            ..params(&r.member_id)
        };
        let second = later(g.join(changed(), 500));
        let third = later(g.join(changed(), 510));
        assert!(
            g.held_waiters().contains(&third) && !g.held_waiters().contains(&second),
            "the newer request waits"
        );
        assert!(g.take_completions().is_empty(), "neither is answered yet");
    }
}
