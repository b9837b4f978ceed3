//! Classic-protocol members in a consumer group (KIP-848 online
//! migration), as Kafka 4.x hosts them:
//!
//! * **Upgrade.** A consumer-protocol member joining a classic group that
//!   has members turns it into a consumer group ([`ConsumerGroup::from_classic`]).
//!   Every classic member keeps its generation as its member epoch and its
//!   last assignment as its target, so nothing moves until the new member
//!   joins and the group epoch moves.
//! * **Hosting.** The classic members go on with JoinGroup, SyncGroup,
//!   Heartbeat and LeaveGroup. Their partitions come from the group's
//!   server-side assignor: a JoinGroup takes the subscription (and the
//!   partitions the member still owns) from the embedded consumer protocol
//!   and reconciles the member one step, and the SyncGroup that follows
//!   returns its partitions. A Heartbeat answers REBALANCE_IN_PROGRESS when
//!   the member must join again: the group epoch moved, it must revoke, or
//!   partitions it waits for are free.
//! * **Downgrade.** When the last consumer-protocol member leaves and
//!   classic members remain, the group becomes a classic group again
//!   ([`ConsumerGroup::to_classic`]) and rebalances.
//!
//! `group.consumer.migration.policy` says which moves are allowed.

use std::collections::BTreeMap;

use bytes::Bytes;
use keel_protocol::ResponseError;

use super::{
    difference, Assignment, ClassicMember, ConsumerGroup, ConsumerGroupConfig, Member, MemberState, Refusal,
    Topics,
};
use crate::groups::embedded::{self, Subscription, TopicPartitions};
use crate::groups::group::{JoinParams, JoinResult, MigratingMember, SyncAnswer, SyncResult};

/// The embedded protocol type of consumers.
pub const CONSUMER_PROTOCOL_TYPE: &str = "consumer";

/// `group.consumer.migration.policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigrationPolicy {
    Bidirectional,
    Upgrade,
    Downgrade,
    Disabled,
}

impl MigrationPolicy {
    pub const NAMES: [&'static str; 4] = ["bidirectional", "upgrade", "downgrade", "disabled"];

    /// Kafka's values, in any case.
    pub fn parse(value: &str) -> Option<MigrationPolicy> {
        match value.to_ascii_lowercase().as_str() {
            "bidirectional" => Some(MigrationPolicy::Bidirectional),
            "upgrade" => Some(MigrationPolicy::Upgrade),
            "downgrade" => Some(MigrationPolicy::Downgrade),
            "disabled" => Some(MigrationPolicy::Disabled),
            _ => None,
        }
    }

    pub fn upgrades(self) -> bool {
        matches!(self, MigrationPolicy::Bidirectional | MigrationPolicy::Upgrade)
    }

    pub fn downgrades(self) -> bool {
        matches!(self, MigrationPolicy::Bidirectional | MigrationPolicy::Downgrade)
    }
}

/// Partitions by topic name -> by topic id; topics the broker no longer has
/// are dropped.
fn by_id(partitions: &TopicPartitions, topics: &Topics) -> Assignment {
    let mut out = Assignment::new();
    for (name, ps) in partitions {
        if let Some(info) = topics.get(name) {
            let valid = ps.iter().copied().filter(|p| (0..info.partitions).contains(p));
            out.entry(info.id).or_default().extend(valid);
        }
    }
    out.retain(|_, ps| !ps.is_empty());
    out
}

/// Partitions by topic id -> by topic name, for the embedded protocol.
fn by_name(assignment: &Assignment, topics: &Topics) -> TopicPartitions {
    let names: BTreeMap<_, &String> = topics.iter().map(|(name, info)| (info.id, name)).collect();
    assignment
        .iter()
        .filter_map(|(id, ps)| {
            names
                .get(id)
                .map(|n| ((*n).clone(), ps.iter().copied().collect()))
        })
        .collect()
}

fn first_protocol(m: &Member) -> Option<&(String, Bytes)> {
    m.classic.as_ref().and_then(|c| c.protocols.first())
}

impl Member {
    /// The classic member's join and sync deadlines.
    pub(super) fn classic_deadlines(&self) -> [Option<i64>; 2] {
        match &self.classic {
            Some(c) => [c.rejoin_deadline_ms, c.sync_deadline_ms],
            None => [None, None],
        }
    }

    fn new_classic(id: &str, p: &JoinParams) -> Member {
        Member {
            instance_id: p.instance_id.clone(),
            client_id: p.client_id.clone(),
            client_host: p.client_host.clone(),
            classic: Some(ClassicMember {
                session_timeout_ms: p.session_timeout_ms,
                protocols: p.protocols.clone(),
                rejoin_deadline_ms: None,
                sync_deadline_ms: None,
            }),
            ..Member::new(id, p.rebalance_timeout_ms)
        }
    }
}

impl ConsumerGroup {
    /// A classic group's members as a consumer group (the online upgrade):
    /// each at the classic generation, Stable, its last assignment its
    /// target. Refused when a member's embedded protocol does not parse,
    /// or its assignment carries user data a server-side assignor would
    /// lose (Kafka's refusals).
    pub fn from_classic(
        id: &str,
        generation: i32,
        members: Vec<MigratingMember>,
        topics: &Topics,
        config: ConsumerGroupConfig,
        now_ms: i64,
    ) -> Result<ConsumerGroup, Refusal> {
        let malformed = || {
            (
                ResponseError::GroupIdNotFound,
                Some(format!(
                    "Cannot upgrade the classic group {id} to consumer group because the embedded consumer protocol is malformed."
                )),
            )
        };
        let mut group = ConsumerGroup::new(id, config);
        group.epoch = generation;
        group.assignment_epoch = generation;
        for m in members {
            let assigned = if m.assignment.is_empty() {
                Assignment::new()
            } else {
                let (partitions, user_data) =
                    embedded::parse_assignment(&m.assignment).map_err(|_| malformed())?;
                if user_data {
                    return Err((
                        ResponseError::UnsupportedVersion,
                        Some("userData from a custom assignor would be lost".into()),
                    ));
                }
                by_id(&partitions, topics)
            };
            let subscription = Subscription::parse(&m.subscription).map_err(|_| malformed())?;
            let mut names = subscription.topics;
            names.sort();
            names.dedup();
            let member = Member {
                instance_id: m.instance_id,
                rack_id: subscription.rack_id,
                client_id: m.client_id,
                client_host: m.client_host,
                subscribed_names: names,
                epoch: generation,
                previous_epoch: generation,
                assigned: assigned.clone(),
                session_deadline_ms: now_ms + i64::from(m.session_timeout_ms),
                classic: Some(ClassicMember {
                    session_timeout_ms: m.session_timeout_ms,
                    protocols: m.protocols,
                    rejoin_deadline_ms: None,
                    sync_deadline_ms: None,
                }),
                ..Member::new(&m.id, m.rebalance_timeout_ms)
            };
            group.target.insert(m.id.clone(), assigned);
            group.members.insert(m.id, member);
        }
        group.subscribed_topics = group.subscribed(topics);
        Ok(group)
    }

    /// Whether the group, with members, has only classic ones left: it
    /// becomes a classic group again if the policy allows.
    pub fn downgradable(&self) -> bool {
        self.config.migration.downgrades()
            && !self.members.is_empty()
            && self.members.values().all(|m| m.classic.is_some())
    }

    /// The group as a classic group's members (the online downgrade): the
    /// group epoch as generation, the strategy every member supports (the
    /// first member's preference first), and each member's partitions in
    /// the embedded protocol.
    pub fn to_classic(&self, topics: &Topics) -> (i32, String, Vec<MigratingMember>) {
        let classic: Vec<&Member> = self.members.values().filter(|m| m.classic.is_some()).collect();
        let supported_by_all = |name: &str| {
            classic.iter().all(|m| {
                m.classic
                    .as_ref()
                    .is_some_and(|c| c.protocols.iter().any(|(n, _)| n == name))
            })
        };
        let protocol = classic
            .first()
            .and_then(|m| m.classic.as_ref())
            .and_then(|c| {
                c.protocols
                    .iter()
                    .map(|(n, _)| n.clone())
                    .find(|n| supported_by_all(n))
                    .or_else(|| c.protocols.first().map(|(n, _)| n.clone()))
            })
            .unwrap_or_default();
        let members = classic
            .into_iter()
            .map(|m| {
                let c = m.classic.as_ref().expect("filtered above");
                let subscription = c
                    .protocols
                    .iter()
                    .find(|(n, _)| *n == protocol)
                    .or(c.protocols.first())
                    .map(|(_, metadata)| metadata.clone())
                    .unwrap_or_default();
                let version = embedded::subscription_version(&subscription);
                MigratingMember {
                    id: m.id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    session_timeout_ms: c.session_timeout_ms,
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    protocols: c.protocols.clone(),
                    subscription,
                    assignment: embedded::encode_assignment(version, &by_name(&m.assigned, topics)),
                }
            })
            .collect();
        (self.epoch, protocol, members)
    }

    /// Whether the classic protocols of a joining member fit the group:
    /// the consumer protocol type, and a strategy every other classic
    /// member supports.
    fn supports_classic(&self, p: &JoinParams) -> bool {
        if p.protocol_type != CONSUMER_PROTOCOL_TYPE || p.protocols.is_empty() {
            return false;
        }
        let others: Vec<&ClassicMember> = self
            .members
            .values()
            .filter(|m| m.id != p.member_id)
            .filter_map(|m| m.classic.as_ref())
            .collect();
        p.protocols
            .iter()
            .any(|(name, _)| others.iter().all(|c| c.protocols.iter().any(|(n, _)| n == name)))
    }

    /// Handles a classic member's JoinGroup (Kafka's
    /// `classicGroupJoinToConsumerGroup`): answered at once, with the
    /// member's epoch as the generation, no leader and no member list (the
    /// group assigns, not the member).
    pub fn classic_join(&mut self, p: JoinParams, topics: &Topics, now_ms: i64) -> JoinResult {
        let mut member_id = p.member_id.clone();
        let unknown = member_id.is_empty();
        if unknown {
            let prefix = p.instance_id.as_deref().unwrap_or(&p.client_id);
            member_id = format!("{prefix}-{}", uuid::Uuid::new_v4());
        }
        let is_new = !self.members.contains_key(&member_id);
        if is_new && p.instance_id.is_none() && self.members.len() >= self.config.max_size {
            return JoinResult::error(ResponseError::GroupMaxSizeReached, &member_id);
        }
        if !self.supports_classic(&p) {
            return JoinResult::error(ResponseError::InconsistentGroupProtocol, &member_id);
        }
        if unknown && p.require_known_member_id && p.instance_id.is_none() {
            return JoinResult::error(ResponseError::MemberIdRequired, &member_id);
        }
        let Ok(subscription) = Subscription::parse(&p.protocols[0].1) else {
            return JoinResult::error(ResponseError::InconsistentGroupProtocol, &member_id);
        };
        // A static member: a new instance (no member id) takes the old
        // one's place; another member id with the same instance is fenced.
        if let Some(instance) = &p.instance_id {
            let holder = self
                .members
                .values()
                .find(|m| m.id != member_id && m.instance_id.as_ref() == Some(instance))
                .map(|m| (m.id.clone(), m.left_static));
            match holder {
                Some((old, left)) if unknown || left => self.replace_static(&old, &member_id),
                Some(_) => return JoinResult::error(ResponseError::FencedInstanceId, &member_id),
                None => {}
            }
        }
        let is_new = !self.members.contains_key(&member_id);
        if is_new {
            self.members
                .insert(member_id.clone(), Member::new_classic(&member_id, &p));
        }
        let mut names = subscription.topics.clone();
        names.sort();
        names.dedup();
        let m = self.members.get_mut(&member_id).expect("inserted above");
        let changed = is_new || names != m.subscribed_names;
        m.subscribed_names = names;
        m.subscribed_regex = None;
        m.subscribed_pattern = None;
        m.rack_id = subscription.rack_id.clone();
        m.instance_id = p.instance_id.clone();
        m.rebalance_timeout_ms = p.rebalance_timeout_ms;
        m.client_id = p.client_id.clone();
        m.client_host = p.client_host.clone();
        m.left_static = false;
        m.session_deadline_ms = now_ms + i64::from(p.session_timeout_ms);
        m.classic = Some(ClassicMember {
            session_timeout_ms: p.session_timeout_ms,
            protocols: p.protocols.clone(),
            rejoin_deadline_ms: None,
            sync_deadline_ms: Some(now_ms + i64::from(p.rebalance_timeout_ms.max(0))),
        });
        self.advance_epochs(changed, topics);
        let owned = by_id(&subscription.owned, topics);
        self.reconcile(&member_id, Some(&owned), now_ms);
        let m = &self.members[&member_id];
        JoinResult {
            error: None,
            generation: m.epoch,
            protocol_type: Some(CONSUMER_PROTOCOL_TYPE.to_string()),
            protocol_name: Some(p.protocols[0].0.clone()),
            leader: String::new(),
            member_id,
            members: Vec::new(),
        }
    }

    /// The classic member a request names, by instance id when it has
    /// one (Kafka's `validateConsumerGroupMember`).
    fn classic_member(&self, member_id: &str, instance_id: Option<&str>) -> Result<&Member, ResponseError> {
        let m = match instance_id {
            None => self
                .members
                .get(member_id)
                .ok_or(ResponseError::UnknownMemberId)?,
            Some(instance) => self.static_member(instance, Some(member_id))?,
        };
        if m.classic.is_none() {
            return Err(ResponseError::UnknownMemberId);
        }
        Ok(m)
    }

    /// The member with `instance` id; FENCED_INSTANCE_ID if it is not
    /// `member_id` (any member id passes when `None`).
    fn static_member(&self, instance: &str, member_id: Option<&str>) -> Result<&Member, ResponseError> {
        let m = self
            .members
            .values()
            .find(|m| m.instance_id.as_deref() == Some(instance))
            .ok_or(ResponseError::UnknownMemberId)?;
        if member_id.is_some_and(|id| id != m.id) {
            return Err(ResponseError::FencedInstanceId);
        }
        Ok(m)
    }

    /// Starts the member's rejoin deadline (its rebalance timeout) unless
    /// one runs.
    fn ask_to_rejoin(&mut self, member_id: &str, now_ms: i64) -> ResponseError {
        if let Some(m) = self.members.get_mut(member_id) {
            let timeout = i64::from(m.rebalance_timeout_ms.max(0));
            if let Some(c) = &mut m.classic {
                c.rejoin_deadline_ms.get_or_insert(now_ms + timeout);
            }
        }
        ResponseError::RebalanceInProgress
    }

    /// Handles a classic member's SyncGroup: its current partitions, in
    /// the embedded protocol version of its subscription.
    pub fn classic_sync(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
        (protocol_type, protocol_name): (Option<&str>, Option<&str>),
        topics: &Topics,
        now_ms: i64,
    ) -> SyncResult {
        let m = self.classic_member(member_id, instance_id)?;
        if generation != m.epoch {
            return Err(ResponseError::IllegalGeneration);
        }
        let (name, metadata) = first_protocol(m).cloned().unwrap_or_default();
        if protocol_type.is_some_and(|t| t != CONSUMER_PROTOCOL_TYPE)
            || protocol_name.is_some_and(|n| n != name)
        {
            return Err(ResponseError::InconsistentGroupProtocol);
        }
        // A new rebalance: join again, unless the member is still revoking
        // (it rejoins when it has).
        if self.epoch > m.epoch && m.state != MemberState::UnrevokedPartitions {
            return Err(self.ask_to_rejoin(member_id, now_ms));
        }
        let assignment = embedded::encode_assignment(
            embedded::subscription_version(&metadata),
            &by_name(&m.assigned, topics),
        );
        let session_ms = self.classic_session_ms(member_id);
        let m = self.members.get_mut(member_id).expect("found above");
        m.session_deadline_ms = now_ms + session_ms;
        if let Some(c) = &mut m.classic {
            c.sync_deadline_ms = None;
        }
        Ok(SyncAnswer {
            protocol_type: Some(CONSUMER_PROTOCOL_TYPE.to_string()),
            protocol_name: Some(name),
            assignment,
        })
    }

    fn classic_session_ms(&self, member_id: &str) -> i64 {
        self.members
            .get(member_id)
            .and_then(|m| m.classic.as_ref())
            .map_or(0, |c| i64::from(c.session_timeout_ms))
    }

    /// Handles a classic member's Heartbeat: REBALANCE_IN_PROGRESS when it
    /// must join again (the group epoch moved, it must revoke, or the
    /// partitions it waits for are free).
    pub fn classic_heartbeat(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
        now_ms: i64,
    ) -> Result<(), ResponseError> {
        let m = self.classic_member(member_id, instance_id)?;
        if generation != m.epoch {
            return Err(ResponseError::IllegalGeneration);
        }
        let rejoin = m.epoch < self.epoch
            || m.state == MemberState::UnrevokedPartitions
            || (m.state == MemberState::UnreleasedPartitions && !self.waiting_on_unreleased(m));
        let session_ms = self.classic_session_ms(member_id);
        if let Some(m) = self.members.get_mut(member_id) {
            m.session_deadline_ms = now_ms + session_ms;
        }
        if rejoin {
            return Err(self.ask_to_rejoin(member_id, now_ms));
        }
        Ok(())
    }

    /// Whether partitions of the member's target that it does not hold yet
    /// are still held (or being revoked) by others.
    fn waiting_on_unreleased(&self, m: &Member) -> bool {
        let target = self.target.get(&m.id).cloned().unwrap_or_default();
        let pending = difference(&target, &m.assigned);
        let held = self.held_by_others(&m.id);
        !difference(&pending, &difference(&pending, &held)).is_empty()
    }

    /// Handles a classic member's LeaveGroup (by member id, or by instance
    /// id alone from an admin tool).
    pub fn classic_leave(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        topics: &Topics,
    ) -> Result<(), ResponseError> {
        let id = match instance_id {
            // By instance id alone from an admin tool.
            Some(instance) => {
                let named = (!member_id.is_empty()).then_some(member_id);
                self.static_member(instance, named)?.id.clone()
            }
            None => member_id.to_string(),
        };
        self.classic_member(&id, None)?;
        self.remove(&id);
        self.compute_target(topics);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};
    use uuid::Uuid;

    use super::*;
    use crate::groups::consumer::{ConsumerGroupState, Heartbeat, TopicInfo, LEAVE_EPOCH};

    const T: Uuid = Uuid::from_u128(9);

    fn topics(n: i32) -> Topics {
        Topics::from([("t".to_string(), TopicInfo { id: T, partitions: n })])
    }

    /// How a client of either protocol behaves.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Kind {
        Consumer,
        /// Revokes everything before it joins again.
        Eager,
        /// Keeps what it owns across a join and reports it.
        Cooperative,
    }

    struct Client {
        kind: Kind,
        epoch: i32,
        owned: BTreeSet<i32>,
    }

    fn join_params(id: &str, owned: &BTreeSet<i32>) -> JoinParams {
        let owned: TopicPartitions = if owned.is_empty() {
            vec![]
        } else {
            vec![("t".into(), owned.iter().copied().collect())]
        };
        let subscription = Subscription {
            version: 3,
            topics: vec!["t".into()],
            owned,
            rack_id: None,
        };
        JoinParams {
            member_id: id.into(),
            instance_id: None,
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout_ms: 45_000,
            rebalance_timeout_ms: 30_000,
            protocol_type: CONSUMER_PROTOCOL_TYPE.into(),
            protocols: vec![("cooperative-sticky".into(), subscription.encode())],
            require_known_member_id: false,
        }
    }

    fn classic_join(g: &mut ConsumerGroup, id: &str, c: &mut Client, t: &Topics, now: i64) {
        if c.kind == Kind::Eager {
            c.owned.clear();
        }
        let r = g.classic_join(join_params(id, &c.owned), t, now);
        assert_eq!(r.error, None);
        c.epoch = r.generation;
        match g.classic_sync(id, None, r.generation, (None, None), t, now) {
            Ok(a) => {
                let (parts, _) = embedded::parse_assignment(&a.assignment).unwrap();
                c.owned = parts.into_iter().flat_map(|(_, ps)| ps).collect();
            }
            Err(e) => assert_eq!(e, ResponseError::RebalanceInProgress),
        }
    }

    fn step(g: &mut ConsumerGroup, id: &str, c: &mut Client, t: &Topics, now: i64) {
        if c.kind != Kind::Consumer {
            match g.classic_heartbeat(id, None, c.epoch, now) {
                Ok(()) => {}
                Err(ResponseError::RebalanceInProgress) => classic_join(g, id, c, t, now),
                Err(e) => panic!("{id}: {e:?}"),
            }
            return;
        }
        let owned: Assignment = if c.owned.is_empty() {
            Assignment::new()
        } else {
            Assignment::from([(T, c.owned.clone())])
        };
        let hb = Heartbeat {
            member_id: id.into(),
            member_epoch: c.epoch,
            rebalance_timeout_ms: 30_000,
            subscribed_names: Some(vec!["t".into()]),
            owned: Some(owned),
            ..Heartbeat::default()
        };
        let a = g.heartbeat(hb, t, now).unwrap();
        c.epoch = a.member_epoch;
        if let Some(a) = a.assignment {
            c.owned = a.get(&T).cloned().unwrap_or_default();
        }
    }

    /// Consumer-protocol, eager and cooperative classic members join,
    /// leave and heartbeat in random order: no partition is ever held by
    /// two clients, and once all of them heartbeat a few times the group
    /// is stable with every partition held once.
    #[test]
    fn mixed_protocols_never_hold_a_partition_twice_and_converge() {
        let seed = keel_log::testing::test_seed();
        let mut rng = SmallRng::seed_from_u64(seed);
        for _round in 0..40 {
            let t = topics(rng.gen_range(1..12));
            let mut g = ConsumerGroup::new("g", ConsumerGroupConfig::default());
            let mut clients: BTreeMap<String, Client> = BTreeMap::new();
            let mut now = 0;
            for n in 0..60 {
                now += 10;
                let choice = rng.gen_range(0..10);
                if choice == 0 || clients.is_empty() {
                    let kind = [Kind::Consumer, Kind::Eager, Kind::Cooperative][rng.gen_range(0..3)];
                    let id = format!("m{n}");
                    let mut c = Client {
                        kind,
                        epoch: 0,
                        owned: BTreeSet::new(),
                    };
                    if kind == Kind::Consumer {
                        step(&mut g, &id, &mut c, &t, now);
                    } else {
                        classic_join(&mut g, &id, &mut c, &t, now);
                    }
                    clients.insert(id, c);
                } else {
                    let id = clients
                        .keys()
                        .nth(rng.gen_range(0..clients.len()))
                        .unwrap()
                        .clone();
                    if choice == 1 && clients.len() > 1 {
                        let c = clients.remove(&id).unwrap();
                        if c.kind == Kind::Consumer {
                            let leave = Heartbeat {
                                member_id: id.clone(),
                                member_epoch: LEAVE_EPOCH,
                                ..Heartbeat::default()
                            };
                            g.heartbeat(leave, &t, now).unwrap();
                        } else {
                            g.classic_leave(&id, None, &t).unwrap();
                        }
                    } else {
                        let c = clients.get_mut(&id).unwrap();
                        step(&mut g, &id, c, &t, now);
                    }
                }
                let mut seen = BTreeSet::new();
                for (id, c) in &clients {
                    for p in &c.owned {
                        assert!(
                            seen.insert(*p),
                            "seed {seed}: {id} holds {p}, which another client holds"
                        );
                    }
                }
            }
            for _ in 0..6 {
                for id in clients.keys().cloned().collect::<Vec<_>>() {
                    now += 10;
                    let c = clients.get_mut(&id).unwrap();
                    step(&mut g, &id, c, &t, now);
                }
            }
            assert_eq!(g.state(), ConsumerGroupState::Stable, "seed {seed}");
            let held: usize = clients.values().map(|c| c.owned.len()).sum();
            assert_eq!(held, t["t"].partitions as usize, "seed {seed}");
        }
    }
}
