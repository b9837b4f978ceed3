//! One consumer group of Kafka's consumer protocol (KIP-848): members
//! heartbeat with their subscription, the coordinator computes every
//! member's target assignment with a server-side assignor, and each member
//! reconciles towards its target one step per heartbeat, revoking before
//! it is assigned partitions that others still hold. No I/O and no clock:
//! operations take `now_ms`.
//!
//! Epochs: the group epoch moves when membership, a subscription or a
//! subscribed topic's partition count changes; the target assignment is
//! recomputed when it is behind the group epoch (`assignment_epoch`); a
//! member's epoch moves to the assignment epoch once it has revoked what
//! its target no longer holds. A partition is handed to a member only when
//! no other member holds it or is revoking it, so no partition is ever
//! held by two members at once.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use keel_protocol::ResponseError;
use uuid::Uuid;

use super::assignor::{self, Assignor};
use super::consumer_records::{self as persisted, ConsumerGroupView, CurrentAssignment, MemberMetadata};
use super::records::GroupRecord;

mod classic;
pub use classic::{MigrationPolicy, CONSUMER_PROTOCOL_TYPE};

/// Partitions by topic id.
pub type Assignment = BTreeMap<Uuid, BTreeSet<i32>>;

/// A topic as the group sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicInfo {
    pub id: Uuid,
    pub partitions: i32,
}

/// The broker's topics by name, when a heartbeat came.
pub type Topics = BTreeMap<String, TopicInfo>;

/// The member epoch a member leaves with, and a static member's temporary
/// leave.
pub const LEAVE_EPOCH: i32 = -1;
pub const STATIC_LEAVE_EPOCH: i32 = -2;

/// `group.consumer.*` settings.
#[derive(Debug, Clone)]
pub struct ConsumerGroupConfig {
    pub session_timeout_ms: i32,
    pub heartbeat_interval_ms: i32,
    /// `group.consumer.assignors`; the first is the default.
    pub assignors: Vec<Assignor>,
    pub max_size: usize,
    /// `group.consumer.migration.policy`: whether a group moves between
    /// the classic and the consumer protocol while it has members.
    pub migration: MigrationPolicy,
}

impl Default for ConsumerGroupConfig {
    fn default() -> Self {
        ConsumerGroupConfig {
            session_timeout_ms: 45_000,
            heartbeat_interval_ms: 5_000,
            assignors: vec![Assignor::Uniform, Assignor::Range],
            max_size: usize::MAX,
            migration: MigrationPolicy::Bidirectional,
        }
    }
}

/// Where a member is in its reconciliation (Kafka's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    /// Holds its target at the assignment epoch.
    Stable,
    /// Must give up partitions its target no longer holds before it moves
    /// to the new epoch.
    UnrevokedPartitions,
    /// At the new epoch, waiting for partitions other members still hold.
    UnreleasedPartitions,
}

#[derive(Debug, Clone)]
pub struct Member {
    pub id: String,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub rebalance_timeout_ms: i32,
    pub subscribed_names: Vec<String>,
    pub subscribed_regex: Option<String>,
    /// `subscribed_regex` compiled (anchored), once per change.
    pub subscribed_pattern: Option<regex::Regex>,
    pub server_assignor: Option<String>,
    pub epoch: i32,
    pub previous_epoch: i32,
    pub state: MemberState,
    /// The partitions it holds.
    pub assigned: Assignment,
    /// The partitions it must revoke (still its own until it says so).
    pub revoking: Assignment,
    session_deadline_ms: i64,
    revoke_deadline_ms: Option<i64>,
    /// A static member that left with `STATIC_LEAVE_EPOCH`: its place is
    /// kept for its instance id until its session times out.
    pub left_static: bool,
    /// The epoch and assignment the last response carried: an assignment
    /// is sent again only when it changes.
    sent: Option<(i32, Assignment)>,
    /// Set for a member of the classic protocol (JoinGroup, SyncGroup,
    /// Heartbeat) that the group hosts.
    pub classic: Option<ClassicMember>,
}

/// What a classic-protocol member of a consumer group keeps besides a
/// consumer member's fields.
#[derive(Debug, Clone)]
pub struct ClassicMember {
    pub session_timeout_ms: i32,
    /// Its assignment strategies with their subscription metadata, in its
    /// order of preference; it is answered in the first one's name.
    pub protocols: Vec<(String, Bytes)>,
    /// It was told to rejoin (REBALANCE_IN_PROGRESS): it is removed if it
    /// has not joined again by then.
    rejoin_deadline_ms: Option<i64>,
    /// It joined: it is removed if it has not synced by then.
    sync_deadline_ms: Option<i64>,
}

/// A ConsumerGroupHeartbeat, its optional fields `None` when the member
/// did not send them (unchanged since its last heartbeat).
#[derive(Debug, Clone, Default)]
pub struct Heartbeat {
    pub member_id: String,
    pub member_epoch: i32,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub rebalance_timeout_ms: i32,
    pub subscribed_names: Option<Vec<String>>,
    pub subscribed_regex: Option<String>,
    pub server_assignor: Option<String>,
    /// The partitions the member holds now.
    pub owned: Option<Assignment>,
    pub client_id: String,
    pub client_host: String,
    /// The group's own session timeout and heartbeat interval (its group
    /// configs), over the coordinator's.
    pub overrides: GroupOverrides,
}

/// A group's own values of the configs the coordinator applies, where set
/// (`consumer.session.timeout.ms`, `consumer.heartbeat.interval.ms`, set
/// with IncrementalAlterConfigs on the GROUP resource).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupOverrides {
    pub session_timeout_ms: Option<i32>,
    pub heartbeat_interval_ms: Option<i32>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HeartbeatAnswer {
    pub member_id: String,
    pub member_epoch: i32,
    pub heartbeat_interval_ms: i32,
    /// The partitions the member is to hold, when they changed.
    pub assignment: Option<Assignment>,
}

/// A refused heartbeat: Kafka's error and message.
pub type Refusal = (ResponseError, Option<String>);

/// The group's state as ConsumerGroupDescribe and ListGroups name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumerGroupState {
    Empty,
    Reconciling,
    Stable,
}

impl ConsumerGroupState {
    pub fn name(self) -> &'static str {
        match self {
            ConsumerGroupState::Empty => "Empty",
            ConsumerGroupState::Reconciling => "Reconciling",
            ConsumerGroupState::Stable => "Stable",
        }
    }
}

#[derive(Debug, Clone)]
pub struct ConsumerGroup {
    pub id: String,
    /// Moves with membership, subscriptions and subscribed topics.
    pub epoch: i32,
    /// The group epoch the target assignment was computed at.
    pub assignment_epoch: i32,
    pub members: BTreeMap<String, Member>,
    /// Every member's target assignment.
    pub target: BTreeMap<String, Assignment>,
    /// The subscribed topics as the target was computed for them.
    subscribed_topics: Topics,
    /// Their hash ([`persisted::metadata_hash`]), persisted with the epoch.
    subscribed_hash: i64,
    /// Restored from the group log: `subscribed_topics` is not known until
    /// the next heartbeat brings the broker's topics (it moves the epoch
    /// only if their hash changed meanwhile).
    topics_unknown: bool,
    /// The group as the group log has it (or will, once the records last
    /// taken from [`ConsumerGroup::changes`] are written).
    persisted: ConsumerGroupView,
    /// The assignor the target was computed with.
    pub assignor: Assignor,
    config: ConsumerGroupConfig,
}

impl Member {
    /// A member that has just joined: no partitions, epoch 0.
    fn new(id: &str, rebalance_timeout_ms: i32) -> Member {
        Member {
            id: id.to_string(),
            instance_id: None,
            rack_id: None,
            client_id: String::new(),
            client_host: String::new(),
            rebalance_timeout_ms,
            subscribed_names: Vec::new(),
            subscribed_regex: None,
            subscribed_pattern: None,
            server_assignor: None,
            epoch: 0,
            previous_epoch: 0,
            state: MemberState::Stable,
            assigned: Assignment::new(),
            revoking: Assignment::new(),
            session_deadline_ms: 0,
            revoke_deadline_ms: None,
            left_static: false,
            sent: None,
            classic: None,
        }
    }
}

fn refuse(error: ResponseError, message: impl Into<String>) -> Refusal {
    (error, Some(message.into()))
}

impl ConsumerGroup {
    /// The session timeout and heartbeat interval members follow from
    /// their next heartbeat on (the group's configs, or the coordinator's).
    pub fn set_timeouts(&mut self, session_timeout_ms: i32, heartbeat_interval_ms: i32) {
        self.config.session_timeout_ms = session_timeout_ms;
        self.config.heartbeat_interval_ms = heartbeat_interval_ms;
    }

    pub fn new(id: &str, config: ConsumerGroupConfig) -> ConsumerGroup {
        let assignor = config.assignors.first().copied().unwrap_or(Assignor::Uniform);
        ConsumerGroup {
            id: id.to_string(),
            epoch: 0,
            assignment_epoch: 0,
            members: BTreeMap::new(),
            target: BTreeMap::new(),
            subscribed_hash: persisted::metadata_hash(&Topics::new()),
            subscribed_topics: Topics::new(),
            topics_unknown: false,
            persisted: ConsumerGroupView::default(),
            assignor,
            config,
        }
    }

    /// Rebuilds a group from the group log. Members come back with a fresh
    /// session, so those whose clients are gone expire; a member without
    /// its metadata record is not one.
    pub fn restore(
        id: &str,
        view: &ConsumerGroupView,
        config: ConsumerGroupConfig,
        now_ms: i64,
    ) -> ConsumerGroup {
        let mut g = ConsumerGroup::new(id, config);
        (g.epoch, g.subscribed_hash) = view.epoch.unwrap_or((0, g.subscribed_hash));
        g.assignment_epoch = view.target_epoch.unwrap_or(0);
        for (member_id, meta) in &view.members {
            let current = view.current.get(member_id).cloned().unwrap_or_default();
            let state = match current.state {
                1 => MemberState::UnrevokedPartitions,
                2 => MemberState::UnreleasedPartitions,
                _ => MemberState::Stable,
            };
            let session_ms = meta
                .classic
                .as_ref()
                .map_or(g.config.session_timeout_ms, |(session, _)| *session);
            let member = Member {
                instance_id: meta.instance_id.clone(),
                rack_id: meta.rack_id.clone(),
                client_id: meta.client_id.clone(),
                client_host: meta.client_host.clone(),
                subscribed_names: meta.subscribed_names.clone(),
                subscribed_regex: meta.subscribed_regex.clone(),
                subscribed_pattern: meta.subscribed_regex.as_ref().and_then(|p| compile_pattern(p)),
                server_assignor: meta.server_assignor.clone(),
                epoch: current.epoch,
                previous_epoch: current.previous_epoch,
                state,
                assigned: current.assigned,
                revoking: current.revoking,
                session_deadline_ms: now_ms + i64::from(session_ms),
                revoke_deadline_ms: (state == MemberState::UnrevokedPartitions)
                    .then(|| now_ms + i64::from(meta.rebalance_timeout_ms.max(0))),
                classic: meta.classic.as_ref().map(|(session, protocols)| ClassicMember {
                    session_timeout_ms: *session,
                    protocols: protocols.clone(),
                    rejoin_deadline_ms: None,
                    sync_deadline_ms: None,
                }),
                ..Member::new(member_id, meta.rebalance_timeout_ms)
            };
            g.target.insert(
                member_id.clone(),
                view.targets.get(member_id).cloned().unwrap_or_default(),
            );
            g.members.insert(member_id.clone(), member);
        }
        g.assignor = g.preferred_assignor();
        g.topics_unknown = true;
        g.persisted = g.view();
        g
    }

    /// The group as the group log holds it.
    pub fn view(&self) -> ConsumerGroupView {
        let members = self.members.values();
        ConsumerGroupView {
            epoch: Some((self.epoch, self.subscribed_hash)),
            target_epoch: Some(self.assignment_epoch),
            members: members
                .clone()
                .map(|m| {
                    let meta = MemberMetadata {
                        instance_id: m.instance_id.clone(),
                        rack_id: m.rack_id.clone(),
                        client_id: m.client_id.clone(),
                        client_host: m.client_host.clone(),
                        subscribed_names: m.subscribed_names.clone(),
                        subscribed_regex: m.subscribed_regex.clone(),
                        rebalance_timeout_ms: m.rebalance_timeout_ms,
                        server_assignor: m.server_assignor.clone(),
                        classic: m
                            .classic
                            .as_ref()
                            .map(|c| (c.session_timeout_ms, c.protocols.clone())),
                    };
                    (m.id.clone(), meta)
                })
                .collect(),
            targets: members
                .clone()
                .map(|m| (m.id.clone(), self.target.get(&m.id).cloned().unwrap_or_default()))
                .collect(),
            current: members
                .map(|m| {
                    let state = match m.state {
                        MemberState::Stable => 0,
                        MemberState::UnrevokedPartitions => 1,
                        MemberState::UnreleasedPartitions => 2,
                    };
                    let current = CurrentAssignment {
                        epoch: m.epoch,
                        previous_epoch: m.previous_epoch,
                        state,
                        assigned: m.assigned.clone(),
                        revoking: m.revoking.clone(),
                    };
                    (m.id.clone(), current)
                })
                .collect(),
        }
    }

    /// The records that bring the group log up to the group's state; the
    /// caller writes them in the order it takes them.
    pub fn changes(&mut self) -> Vec<GroupRecord> {
        let now = self.view();
        let records = ConsumerGroupView::diff(&self.id, &self.persisted, &now);
        self.persisted = now;
        records
    }

    /// The tombstones that remove the group from the group log.
    pub fn tombstones(&mut self) -> Vec<GroupRecord> {
        let gone = ConsumerGroupView::default();
        let records = ConsumerGroupView::diff(&self.id, &self.persisted, &gone);
        self.persisted = gone;
        records
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    pub fn state(&self) -> ConsumerGroupState {
        if self.members.is_empty() {
            ConsumerGroupState::Empty
        } else if self
            .members
            .values()
            .all(|m| m.epoch == self.assignment_epoch && m.state == MemberState::Stable)
        {
            ConsumerGroupState::Stable
        } else {
            ConsumerGroupState::Reconciling
        }
    }

    /// Handles a ConsumerGroupHeartbeat (its fields checked by the caller).
    pub fn heartbeat(
        &mut self,
        hb: Heartbeat,
        topics: &Topics,
        now_ms: i64,
    ) -> Result<HeartbeatAnswer, Refusal> {
        if hb.member_epoch == LEAVE_EPOCH || hb.member_epoch == STATIC_LEAVE_EPOCH {
            return self.leave(&hb, topics);
        }
        if let Some(name) = &hb.server_assignor {
            if !self.config.assignors.iter().any(|a| a.name() == name) {
                return Err(refuse(
                    ResponseError::UnsupportedAssignor,
                    format!(
                        "Assignor {name} is not supported. Supported assignors: {}.",
                        self.assignor_names()
                    ),
                ));
            }
        }
        let mut changed = if hb.member_epoch == 0 {
            self.join(&hb)?
        } else {
            self.check_epoch(&hb)?;
            false
        };
        changed |= self.update_member(&hb, now_ms);
        self.advance_epochs(changed, topics);
        self.reconcile(&hb.member_id, hb.owned.as_ref(), now_ms);
        let member = self
            .members
            .get_mut(&hb.member_id)
            .expect("a member that heartbeats is in the group");
        let now_sent = (member.epoch, member.assigned.clone());
        let assignment =
            (hb.owned.is_some() || member.sent.as_ref() != Some(&now_sent)).then(|| now_sent.1.clone());
        member.sent = Some(now_sent);
        Ok(HeartbeatAnswer {
            member_id: member.id.clone(),
            member_epoch: member.epoch,
            heartbeat_interval_ms: self.config.heartbeat_interval_ms,
            assignment,
        })
    }

    /// Moves the group epoch when membership or a subscription changed
    /// (`changed`) or the subscribed topics did, and recomputes the target
    /// when it is behind.
    fn advance_epochs(&mut self, mut changed: bool, topics: &Topics) {
        let subscribed = self.subscribed(topics);
        if self.topics_unknown || subscribed != self.subscribed_topics {
            let hash = persisted::metadata_hash(&subscribed);
            changed |= hash != self.subscribed_hash;
            self.subscribed_hash = hash;
            self.subscribed_topics = subscribed;
            self.topics_unknown = false;
        }
        if changed {
            self.epoch += 1;
        }
        if self.epoch > self.assignment_epoch {
            self.compute_target(topics);
        }
    }

    fn assignor_names(&self) -> String {
        let names: Vec<&str> = self.config.assignors.iter().map(|a| a.name()).collect();
        names.join(", ")
    }

    /// A member joining (epoch 0), new or again; true if membership changed.
    fn join(&mut self, hb: &Heartbeat) -> Result<bool, Refusal> {
        let known = self.members.contains_key(&hb.member_id);
        if !known && self.members.len() >= self.config.max_size {
            return Err(refuse(
                ResponseError::GroupMaxSizeReached,
                format!(
                    "The consumer group has reached its maximum capacity of {} members.",
                    self.config.max_size
                ),
            ));
        }
        // A static member coming back under a new member id takes the
        // place (epoch, partitions, target) of the one that left with
        // `STATIC_LEAVE_EPOCH`, without a rebalance; one still there keeps
        // its instance id.
        if let Some(instance) = &hb.instance_id {
            let holder = self
                .members
                .values()
                .find(|m| m.id != hb.member_id && m.instance_id.as_ref() == Some(instance))
                .map(|m| (m.id.clone(), m.left_static));
            match holder {
                Some((old, true)) => {
                    self.replace_static(&old, &hb.member_id);
                    return Ok(false);
                }
                Some((_, false)) => {
                    return Err(refuse(
                        ResponseError::UnreleasedInstanceId,
                        format!("Static member with instance id {instance} is not released yet."),
                    ))
                }
                None => {}
            }
        }
        match self.members.get_mut(&hb.member_id) {
            // Rejoining: it starts again from nothing.
            Some(m) => {
                m.epoch = 0;
                m.previous_epoch = 0;
                m.state = MemberState::Stable;
                m.assigned.clear();
                m.revoking.clear();
                m.revoke_deadline_ms = None;
                m.left_static = false;
                m.sent = None;
            }
            None => {
                self.members.insert(
                    hb.member_id.clone(),
                    Member::new(&hb.member_id, hb.rebalance_timeout_ms),
                );
            }
        }
        Ok(!known)
    }

    /// A known member's epoch: its own, or the one before when the owned
    /// partitions show that it missed the last response.
    fn check_epoch(&self, hb: &Heartbeat) -> Result<(), Refusal> {
        let Some(m) = self.members.get(&hb.member_id).filter(|m| m.classic.is_none()) else {
            return Err(refuse(
                ResponseError::UnknownMemberId,
                format!("Member {} is not a member of group {}.", hb.member_id, self.id),
            ));
        };
        let missed_response = hb.member_epoch == m.previous_epoch
            && hb
                .owned
                .as_ref()
                .is_some_and(|owned| contains_all(&m.assigned, owned));
        if hb.member_epoch == m.epoch || missed_response {
            return Ok(());
        }
        let (relation, epoch) = if hb.member_epoch > m.epoch {
            ("greater", hb.member_epoch)
        } else {
            ("smaller", hb.member_epoch)
        };
        Err(refuse(
            ResponseError::FencedMemberEpoch,
            format!(
                "The consumer group member has a {relation} member epoch ({epoch}) than the one known by the \
                 group coordinator ({}). The member must abandon all its partitions and rejoin.",
                m.epoch
            ),
        ))
    }

    /// Takes the heartbeat's fields; true if the subscription or the
    /// assignor changed.
    fn update_member(&mut self, hb: &Heartbeat, now_ms: i64) -> bool {
        let session_ms = i64::from(self.config.session_timeout_ms);
        let m = self
            .members
            .get_mut(&hb.member_id)
            .expect("checked or joined above");
        let mut changed = false;
        if let Some(names) = &hb.subscribed_names {
            let mut names = names.clone();
            names.sort();
            names.dedup();
            changed |= names != m.subscribed_names;
            m.subscribed_names = names;
        }
        if let Some(regex) = &hb.subscribed_regex {
            let regex = (!regex.is_empty()).then(|| regex.clone());
            if regex != m.subscribed_regex {
                changed = true;
                m.subscribed_pattern = regex.as_ref().and_then(|p| compile_pattern(p));
                m.subscribed_regex = regex;
            }
        }
        if hb.server_assignor.is_some() && hb.server_assignor != m.server_assignor {
            m.server_assignor = hb.server_assignor.clone();
            changed = true;
        }
        if hb.instance_id.is_some() {
            m.instance_id = hb.instance_id.clone();
        }
        if hb.rack_id.is_some() {
            m.rack_id = hb.rack_id.clone();
        }
        if hb.rebalance_timeout_ms > 0 {
            m.rebalance_timeout_ms = hb.rebalance_timeout_ms;
        }
        m.client_id = hb.client_id.clone();
        m.client_host = hb.client_host.clone();
        m.session_deadline_ms = now_ms + session_ms;
        changed
    }

    fn leave(&mut self, hb: &Heartbeat, topics: &Topics) -> Result<HeartbeatAnswer, Refusal> {
        let Some(m) = self
            .members
            .get_mut(&hb.member_id)
            .filter(|m| m.classic.is_none())
        else {
            return Err(refuse(
                ResponseError::UnknownMemberId,
                format!("Member {} is not a member of group {}.", hb.member_id, self.id),
            ));
        };
        // A static member leaving for a while keeps its place until its
        // session times out.
        if hb.member_epoch == STATIC_LEAVE_EPOCH && m.instance_id.is_some() {
            m.left_static = true;
        } else {
            self.remove(&hb.member_id);
            self.compute_target(topics);
        }
        Ok(HeartbeatAnswer {
            member_id: hb.member_id.clone(),
            member_epoch: hb.member_epoch,
            heartbeat_interval_ms: 0,
            assignment: None,
        })
    }

    /// Moves the place of a static member that left to the member id that
    /// rejoins with its instance id.
    fn replace_static(&mut self, old: &str, new: &str) {
        let Some(mut m) = self.members.remove(old) else {
            return;
        };
        m.id = new.to_string();
        m.left_static = false;
        m.sent = None;
        if let Some(target) = self.target.remove(old) {
            self.target.insert(new.to_string(), target);
        }
        self.members.insert(new.to_string(), m);
    }

    /// Removes a member (its partitions are free for others at once) and
    /// moves the group epoch.
    fn remove(&mut self, member_id: &str) {
        if self.members.remove(member_id).is_some() {
            self.target.remove(member_id);
            self.epoch += 1;
        }
    }

    /// The topics some member subscribes to (by name or pattern) that
    /// exist.
    fn subscribed(&self, topics: &Topics) -> Topics {
        let mut out = Topics::new();
        for m in self.members.values() {
            for (name, info) in assignor::member_topics(m, topics) {
                out.insert(name, info);
            }
        }
        out
    }

    /// The target assignment at the group epoch, with the assignor most
    /// members ask for (else `group.consumer.assignors`' first).
    fn compute_target(&mut self, topics: &Topics) {
        self.assignor = self.preferred_assignor();
        let subscriptions: BTreeMap<String, Topics> = self
            .members
            .values()
            .map(|m| (m.id.clone(), assignor::member_topics(m, topics)))
            .collect();
        self.target = self.assignor.assign(&subscriptions, &self.target);
        self.assignment_epoch = self.epoch;
    }

    /// The assignor most members ask for, else `group.consumer.assignors`'
    /// first.
    fn preferred_assignor(&self) -> Assignor {
        let mut votes: BTreeMap<&str, usize> = BTreeMap::new();
        for m in self.members.values() {
            if let Some(a) = &m.server_assignor {
                *votes.entry(a.as_str()).or_default() += 1;
            }
        }
        let chosen = votes
            .iter()
            .max_by_key(|(name, n)| (**n, std::cmp::Reverse(**name)))
            .and_then(|(name, _)| Assignor::parse(name));
        chosen.unwrap_or_else(|| {
            self.config
                .assignors
                .first()
                .copied()
                .unwrap_or(Assignor::Uniform)
        })
    }

    /// One step of a member towards its target (Kafka's current
    /// assignment builder).
    fn reconcile(&mut self, member_id: &str, owned: Option<&Assignment>, now_ms: i64) {
        let target = self.target.get(member_id).cloned().unwrap_or_default();
        let held_by_others = self.held_by_others(member_id);
        let assignment_epoch = self.assignment_epoch;
        let Some(m) = self.members.get_mut(member_id) else {
            return;
        };
        match m.state {
            MemberState::UnrevokedPartitions => {
                let revoked = owned.is_some_and(|o| !intersects(o, &m.revoking));
                if !revoked {
                    return;
                }
                m.revoking.clear();
                m.revoke_deadline_ms = None;
            }
            MemberState::Stable if m.epoch == assignment_epoch => return,
            MemberState::Stable | MemberState::UnreleasedPartitions => {}
        }
        let kept = intersection(&m.assigned, &target);
        let revoking = difference(&m.assigned, &target);
        if !revoking.is_empty() {
            m.assigned = kept;
            m.revoking = revoking;
            m.state = MemberState::UnrevokedPartitions;
            m.revoke_deadline_ms = Some(now_ms + i64::from(m.rebalance_timeout_ms.max(0)));
            return;
        }
        let wanted = difference(&target, &kept);
        let free = difference(&wanted, &held_by_others);
        let waiting = free != wanted;
        m.assigned = union(&kept, &free);
        if m.epoch != assignment_epoch {
            m.previous_epoch = m.epoch;
            m.epoch = assignment_epoch;
        }
        m.state = if waiting {
            MemberState::UnreleasedPartitions
        } else {
            MemberState::Stable
        };
    }

    /// The partitions other members hold or are revoking.
    fn held_by_others(&self, member_id: &str) -> Assignment {
        let mut held = Assignment::new();
        for m in self.members.values().filter(|m| m.id != member_id) {
            held = union(&held, &union(&m.assigned, &m.revoking));
        }
        held
    }

    /// Removes members whose session expired or who did not revoke in
    /// their rebalance timeout; true if any went.
    pub fn tick(&mut self, topics: &Topics, now_ms: i64) -> bool {
        let gone: Vec<String> = self
            .members
            .values()
            .filter(|m| {
                std::iter::once(Some(m.session_deadline_ms))
                    .chain(m.classic_deadlines())
                    .chain([m.revoke_deadline_ms])
                    .flatten()
                    .any(|d| d <= now_ms)
            })
            .map(|m| m.id.clone())
            .collect();
        for id in &gone {
            tracing::info!(group = %self.id, member = %id, "removing a consumer group member whose session or rebalance timed out");
            self.remove(id);
        }
        // A restored group recomputes its target at the next heartbeat,
        // with the broker's topics.
        if !gone.is_empty() && !self.topics_unknown {
            self.compute_target(topics);
        }
        !gone.is_empty()
    }

    pub fn next_deadline_ms(&self) -> Option<i64> {
        self.members
            .values()
            .flat_map(|m| {
                [Some(m.session_deadline_ms), m.revoke_deadline_ms]
                    .into_iter()
                    .chain(m.classic_deadlines())
            })
            .flatten()
            .min()
    }

    /// Checks an OffsetCommit (or a transactional one) against the group:
    /// from a member at its current epoch, or, with no member id and a
    /// negative epoch, to an empty group.
    pub fn validate_commit(&self, member_id: &str, member_epoch: i32) -> Result<(), ResponseError> {
        if member_epoch < 0 && member_id.is_empty() && self.members.is_empty() {
            return Ok(());
        }
        let m = self
            .members
            .get(member_id)
            .ok_or(ResponseError::UnknownMemberId)?;
        // A classic member commits with its generation, which is its epoch.
        if m.classic.is_some() && member_epoch != m.epoch {
            return Err(ResponseError::IllegalGeneration);
        }
        if member_epoch > m.epoch {
            return Err(ResponseError::FencedMemberEpoch);
        }
        if member_epoch < m.epoch {
            return Err(ResponseError::StaleMemberEpoch);
        }
        Ok(())
    }

    /// Checks an OffsetFetch that names a member (v9): the member at its
    /// current epoch, as Kafka checks it.
    pub fn validate_fetch(&self, member_id: &str, member_epoch: i32) -> Result<(), ResponseError> {
        let m = self
            .members
            .get(member_id)
            .ok_or(ResponseError::UnknownMemberId)?;
        if member_epoch != m.epoch {
            return Err(ResponseError::StaleMemberEpoch);
        }
        Ok(())
    }

    /// The subscribed topics as the group last saw them.
    pub fn known_topics(&self) -> Topics {
        self.subscribed_topics.clone()
    }

    /// The topic names some member subscribes to now (offsets of other
    /// topics may expire).
    pub fn subscribed_topic_names(&self) -> BTreeSet<String> {
        if self.topics_unknown {
            // Restored and not heartbeated yet: the names members
            // subscribe to (topics matched by a pattern are known only
            // once the broker's topics are).
            return self
                .members
                .values()
                .flat_map(|m| m.subscribed_names.iter().cloned())
                .collect();
        }
        self.subscribed_topics.keys().cloned().collect()
    }
}

/// A member's topic pattern, matched against whole names.
fn compile_pattern(pattern: &str) -> Option<regex::Regex> {
    regex::Regex::new(&format!("^(?:{pattern})$")).ok()
}

fn union(a: &Assignment, b: &Assignment) -> Assignment {
    let mut out = a.clone();
    for (topic, partitions) in b {
        out.entry(*topic).or_default().extend(partitions);
    }
    out
}

fn intersection(a: &Assignment, b: &Assignment) -> Assignment {
    let mut out = Assignment::new();
    for (topic, partitions) in a {
        if let Some(other) = b.get(topic) {
            let both: BTreeSet<i32> = partitions.intersection(other).copied().collect();
            if !both.is_empty() {
                out.insert(*topic, both);
            }
        }
    }
    out
}

fn difference(a: &Assignment, b: &Assignment) -> Assignment {
    let mut out = Assignment::new();
    for (topic, partitions) in a {
        let rest: BTreeSet<i32> = match b.get(topic) {
            Some(other) => partitions.difference(other).copied().collect(),
            None => partitions.clone(),
        };
        if !rest.is_empty() {
            out.insert(*topic, rest);
        }
    }
    out
}

fn intersects(a: &Assignment, b: &Assignment) -> bool {
    !intersection(a, b).is_empty()
}

fn contains_all(outer: &Assignment, inner: &Assignment) -> bool {
    difference(inner, outer).is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    fn topics(n: i32) -> Topics {
        Topics::from([(
            "t".to_string(),
            TopicInfo {
                id: Uuid::from_u128(7),
                partitions: n,
            },
        )])
    }

    fn join(id: &str) -> Heartbeat {
        Heartbeat {
            member_id: id.into(),
            member_epoch: 0,
            rebalance_timeout_ms: 30_000,
            subscribed_names: Some(vec!["t".into()]),
            owned: Some(Assignment::new()),
            ..Heartbeat::default()
        }
    }

    fn beat(id: &str, epoch: i32, owned: &Assignment) -> Heartbeat {
        Heartbeat {
            member_id: id.into(),
            member_epoch: epoch,
            rebalance_timeout_ms: 30_000,
            owned: Some(owned.clone()),
            ..Heartbeat::default()
        }
    }

    fn partitions(a: &Assignment) -> usize {
        a.values().map(BTreeSet::len).sum()
    }

    /// No partition is held (assigned or being revoked) by two members.
    fn held_once(g: &ConsumerGroup) {
        let mut seen = BTreeSet::new();
        for m in g.members.values() {
            for (t, ps) in union(&m.assigned, &m.revoking) {
                for p in ps {
                    assert!(seen.insert((t, p)), "{t}-{p} held twice: {:?}", g.members);
                }
            }
        }
    }

    #[test]
    fn a_second_member_gets_partitions_only_after_the_first_revokes_them() {
        let t = topics(4);
        let mut g = ConsumerGroup::new("g", ConsumerGroupConfig::default());
        let a1 = g.heartbeat(join("m1"), &t, 0).unwrap();
        assert_eq!(
            (a1.member_epoch, partitions(a1.assignment.as_ref().unwrap())),
            (1, 4)
        );
        let m1_owned = a1.assignment.unwrap();

        // m2 joins: its share is still m1's, so it gets the new epoch and nothing yet.
        let a2 = g.heartbeat(join("m2"), &t, 10).unwrap();
        assert_eq!(
            (a2.member_epoch, a2.assignment.clone()),
            (2, Some(Assignment::new()))
        );
        held_once(&g);

        // m1 is asked to give two up, at its old epoch.
        let r1 = g.heartbeat(beat("m1", 1, &m1_owned), &t, 20).unwrap();
        let kept = r1.assignment.unwrap();
        assert_eq!((r1.member_epoch, partitions(&kept)), (1, 2));
        assert_eq!(g.state(), ConsumerGroupState::Reconciling);
        // Until it says they are gone, m2 still waits.
        let w2 = g.heartbeat(beat("m2", 2, &Assignment::new()), &t, 25).unwrap();
        assert_eq!(w2.assignment, Some(Assignment::new()));
        held_once(&g);

        let r1 = g.heartbeat(beat("m1", 1, &kept), &t, 30).unwrap();
        assert_eq!(r1.member_epoch, 2);
        let r2 = g.heartbeat(beat("m2", 2, &Assignment::new()), &t, 40).unwrap();
        assert_eq!(partitions(r2.assignment.as_ref().unwrap()), 2);
        held_once(&g);
        assert_eq!(g.state(), ConsumerGroupState::Stable);

        // Leaving frees its partitions for the other at once.
        let left = g.heartbeat(beat("m1", LEAVE_EPOCH, &kept), &t, 50).unwrap();
        assert_eq!(left.member_epoch, LEAVE_EPOCH);
        let r2 = g
            .heartbeat(beat("m2", 2, &r2.assignment.unwrap()), &t, 60)
            .unwrap();
        assert_eq!(
            (r2.member_epoch, partitions(r2.assignment.as_ref().unwrap())),
            (3, 4)
        );
    }

    #[test]
    fn unknown_members_and_wrong_epochs_are_refused() {
        let t = topics(2);
        let mut g = ConsumerGroup::new("g", ConsumerGroupConfig::default());
        let a = g.heartbeat(join("m1"), &t, 0).unwrap();
        let owned = a.assignment.unwrap();
        let err = |r: Result<HeartbeatAnswer, Refusal>| r.unwrap_err().0;
        assert_eq!(
            err(g.heartbeat(beat("nobody", 1, &owned), &t, 1)),
            ResponseError::UnknownMemberId
        );
        assert_eq!(
            err(g.heartbeat(beat("m1", 5, &owned), &t, 1)),
            ResponseError::FencedMemberEpoch
        );
        // The epoch before the current one is accepted only with the
        // partitions the member holds, proof that it missed an answer.
        g.heartbeat(join("m2"), &t, 2).unwrap();
        let m1 = g.members["m1"].clone();
        if m1.epoch != 1 {
            assert!(g
                .heartbeat(beat("m1", m1.previous_epoch, &m1.assigned), &t, 3)
                .is_ok());
        }
        let mut bad = ConsumerGroup::new("g", ConsumerGroupConfig::default());
        let mut hb = join("m1");
        hb.server_assignor = Some("sticky".into());
        assert_eq!(err(bad.heartbeat(hb, &t, 0)), ResponseError::UnsupportedAssignor);
        // Commits: only at the member's epoch.
        assert_eq!(g.validate_commit("m1", g.members["m1"].epoch), Ok(()));
        assert_eq!(g.validate_commit("m1", 0), Err(ResponseError::StaleMemberEpoch));
        assert_eq!(g.validate_commit("m1", 99), Err(ResponseError::FencedMemberEpoch));
        assert_eq!(g.validate_commit("", -1), Err(ResponseError::UnknownMemberId));
    }

    #[test]
    fn a_silent_member_leaves_after_its_session_timeout() {
        let t = topics(3);
        let config = ConsumerGroupConfig {
            session_timeout_ms: 1000,
            ..ConsumerGroupConfig::default()
        };
        let mut g = ConsumerGroup::new("g", config);
        g.heartbeat(join("m1"), &t, 0).unwrap();
        g.heartbeat(join("m2"), &t, 500).unwrap();
        assert_eq!(g.next_deadline_ms(), Some(1000));
        assert!(!g.tick(&t, 999));
        assert!(g.tick(&t, 1000));
        assert_eq!(g.members.keys().collect::<Vec<_>>(), vec!["m2"]);
        assert_eq!(partitions(&g.target["m2"]), 3);
    }

    /// What each live client believes: its epoch and the partitions it holds.
    type Clients = BTreeMap<String, (i32, Assignment)>;

    /// One heartbeat of a client as Kafka's consumer sends it: joining at
    /// epoch 0, and, when fenced, dropping its partitions and joining again.
    /// With `lost`, the answer does not reach it.
    fn client_beat(g: &mut ConsumerGroup, clients: &mut Clients, id: &str, t: &Topics, now: i64, lost: bool) {
        let (epoch, owned) = clients[id].clone();
        let hb = if epoch == 0 {
            join(id)
        } else {
            beat(id, epoch, &owned)
        };
        let a = match g.heartbeat(hb, t, now) {
            Ok(a) => a,
            Err((ResponseError::FencedMemberEpoch, _)) => {
                clients.insert(id.to_string(), (0, Assignment::new()));
                g.heartbeat(join(id), t, now).unwrap()
            }
            Err(e) => panic!("{id} at epoch {epoch} refused: {e:?}"),
        };
        if !lost {
            let owned = a.assignment.unwrap_or_else(|| clients[id].1.clone());
            clients.insert(id.to_string(), (a.member_epoch, owned));
        }
    }

    #[test]
    fn a_static_member_that_leaves_for_a_while_gets_its_partitions_back_without_a_rebalance() {
        let t = topics(4);
        let mut g = ConsumerGroup::new("g", ConsumerGroupConfig::default());
        let mut j1 = join("m1");
        j1.instance_id = Some("host-1".into());
        let a1 = g.heartbeat(j1.clone(), &t, 0).unwrap();
        let a2 = g.heartbeat(join("m2"), &t, 10).unwrap();
        // Settle: m1 revokes, both hold two.
        let r1 = g
            .heartbeat(beat("m1", a1.member_epoch, &a1.assignment.unwrap()), &t, 20)
            .unwrap();
        let kept = r1.assignment.unwrap();
        let r1 = g.heartbeat(beat("m1", r1.member_epoch, &kept), &t, 30).unwrap();
        g.heartbeat(beat("m2", a2.member_epoch, &Assignment::new()), &t, 40)
            .unwrap();
        assert_eq!(g.state(), ConsumerGroupState::Stable);
        let epoch = g.epoch;
        let mut leave = beat("m1", STATIC_LEAVE_EPOCH, &kept);
        leave.instance_id = Some("host-1".into());
        assert_eq!(
            g.heartbeat(leave, &t, 50).unwrap().member_epoch,
            STATIC_LEAVE_EPOCH
        );
        // Its place is kept: no new epoch, its partitions stay its own.
        assert_eq!(g.epoch, epoch);
        let mut back = join("m1-new");
        back.instance_id = Some("host-1".into());
        let again = g.heartbeat(back, &t, 60).unwrap();
        assert_eq!(
            (again.member_epoch, again.assignment),
            (r1.member_epoch, Some(kept))
        );
        assert!(!g.members.contains_key("m1"));
        assert_eq!(g.epoch, epoch);
        // Another member with that instance id while it is there.
        let mut clash = join("m10");
        clash.instance_id = Some("host-1".into());
        assert_eq!(
            g.heartbeat(clash, &t, 65).unwrap_err().0,
            ResponseError::UnreleasedInstanceId
        );
        // Unless its session times out first: then it goes, with a rebalance.
        let mut gone = beat("m1-new", again.member_epoch, &Assignment::new());
        gone.member_epoch = STATIC_LEAVE_EPOCH;
        gone.instance_id = Some("host-1".into());
        g.heartbeat(gone, &t, 70).unwrap();
        let before = g.epoch;
        assert!(g.tick(&t, 60 + 45_000));
        assert!(!g.members.contains_key("m1-new") && g.epoch > before);
    }

    /// A member subscribed by pattern gets the partitions of every topic
    /// whose whole name matches (internal `__` topics never), and moves
    /// when the pattern changes.
    #[test]
    fn a_regex_subscription_matches_whole_names() {
        let info = |n: u128, partitions| TopicInfo {
            id: Uuid::from_u128(n),
            partitions,
        };
        let t = Topics::from([
            ("orders".to_string(), info(1, 2)),
            ("orders-eu".to_string(), info(2, 1)),
            ("old-orders".to_string(), info(3, 1)),
            ("__orders".to_string(), info(4, 1)),
        ]);
        let mut g = ConsumerGroup::new("g", ConsumerGroupConfig::default());
        let mut hb = join("m");
        hb.subscribed_names = None;
        hb.subscribed_regex = Some("orders.*".into());
        let a = g.heartbeat(hb, &t, 0).unwrap();
        let held = a.assignment.unwrap();
        assert_eq!(
            held.keys().copied().collect::<Vec<_>>(),
            vec![Uuid::from_u128(1), Uuid::from_u128(2)]
        );
        let mut again = beat("m", a.member_epoch, &held);
        again.subscribed_regex = Some("old-.*".into());
        let a = g.heartbeat(again, &t, 10).unwrap();
        // Revoke first, then the new topic.
        let kept = a.assignment.unwrap();
        assert!(kept.is_empty());
        let a = g.heartbeat(beat("m", a.member_epoch, &kept), &t, 20).unwrap();
        assert_eq!(
            a.assignment.unwrap().keys().copied().collect::<Vec<_>>(),
            vec![Uuid::from_u128(3)]
        );
    }

    /// Members join, leave, lose responses and heartbeat in random order,
    /// each reporting what it was last given: no partition is ever held
    /// twice, and once every member heartbeats a few times without change
    /// the group is stable with every partition held once.
    #[test]
    fn random_membership_never_holds_a_partition_twice_and_converges() {
        let seed = keel_log::testing::test_seed();
        let mut rng = SmallRng::seed_from_u64(seed);
        for _round in 0..50 {
            let t = topics(rng.gen_range(1..12));
            let mut g = ConsumerGroup::new("g", ConsumerGroupConfig::default());
            let mut clients = Clients::new();
            let mut next = 0;
            let mut now = 0;
            for _step in 0..60 {
                now += 10;
                let choice = rng.gen_range(0..10);
                let pick = |clients: &Clients, rng: &mut SmallRng| {
                    clients
                        .keys()
                        .nth(rng.gen_range(0..clients.len()))
                        .unwrap()
                        .clone()
                };
                if choice == 0 || clients.is_empty() {
                    next += 1;
                    let id = format!("m{next}");
                    clients.insert(id.clone(), (0, Assignment::new()));
                    client_beat(&mut g, &mut clients, &id, &t, now, false);
                } else if choice == 1 && clients.len() > 1 {
                    let id = pick(&clients, &mut rng);
                    let (_, owned) = clients.remove(&id).unwrap();
                    g.heartbeat(beat(&id, LEAVE_EPOCH, &owned), &t, now).unwrap();
                } else {
                    let id = pick(&clients, &mut rng);
                    let lost = rng.gen_range(0..8) == 0;
                    client_beat(&mut g, &mut clients, &id, &t, now, lost);
                }
                held_once(&g);
                // What the clients hold is never held twice either.
                let mut seen = BTreeSet::new();
                for (_, owned) in clients.values() {
                    for (t, ps) in owned {
                        for p in ps {
                            assert!(seen.insert((*t, *p)), "seed {seed}: clients hold {t}-{p} twice");
                        }
                    }
                }
            }
            for _ in 0..4 {
                for id in clients.keys().cloned().collect::<Vec<_>>() {
                    now += 10;
                    client_beat(&mut g, &mut clients, &id, &t, now, false);
                }
            }
            assert_eq!(g.state(), ConsumerGroupState::Stable, "seed {seed}");
            let held: usize = clients.values().map(|(_, o)| partitions(o)).sum();
            assert_eq!(held, t["t"].partitions as usize, "seed {seed}");
        }
    }
}
