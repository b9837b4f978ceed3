//! One share group's membership (KIP-932): members join and leave with
//! ShareGroupHeartbeat, the coordinator assigns partitions, and a member
//! takes a new assignment with the next heartbeat. Unlike a consumer
//! group, partitions are shared, so nothing is revoked first: the
//! assignment epoch moves and each member's next heartbeat carries it.
//! No I/O and no clock: operations take `now_ms`.

use std::collections::{BTreeMap, BTreeSet};

use keel_protocol::ResponseError;
use uuid::Uuid;

use crate::groups::consumer::{Assignment, TopicInfo, Topics};

/// The member epoch a member leaves with.
pub const LEAVE_EPOCH: i32 = -1;

/// `group.share.*` membership settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareGroupConfig {
    /// `group.share.session.timeout.ms`.
    pub session_timeout_ms: i32,
    /// `group.share.heartbeat.interval.ms`.
    pub heartbeat_interval_ms: i32,
    /// `group.share.max.size`.
    pub max_size: usize,
}

impl Default for ShareGroupConfig {
    fn default() -> Self {
        ShareGroupConfig {
            session_timeout_ms: 45_000,
            heartbeat_interval_ms: 5_000,
            max_size: 200,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ShareMember {
    pub member_id: String,
    /// The assignment epoch this member last received.
    pub epoch: i32,
    /// The one before: a member whose answer carrying `epoch` was lost
    /// heartbeats with it, and is sent its assignment again.
    pub previous_epoch: i32,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub subscribed: BTreeSet<String>,
    pub assignment: Assignment,
    pub last_heartbeat_ms: i64,
}

/// One heartbeat's fields.
#[derive(Debug, Clone)]
pub struct ShareHeartbeat {
    pub member_id: String,
    pub member_epoch: i32,
    pub rack_id: Option<String>,
    /// `None`: unchanged since the last heartbeat.
    pub subscribed: Option<Vec<String>>,
    pub client_id: String,
    pub client_host: String,
}

/// What a heartbeat is answered.
#[derive(Debug, Clone, PartialEq)]
pub struct ShareHeartbeatAnswer {
    pub member_epoch: i32,
    /// The member's whole assignment, when it changed (or it joined).
    pub assignment: Option<Assignment>,
}

/// A share group's state as ListGroups and ShareGroupDescribe name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareGroupState {
    Empty,
    Stable,
}

impl ShareGroupState {
    pub fn name(self) -> &'static str {
        match self {
            ShareGroupState::Empty => "Empty",
            ShareGroupState::Stable => "Stable",
        }
    }
}

#[derive(Debug, Clone)]
pub struct ShareGroup {
    pub group_id: String,
    /// Counts up at each change of membership, subscriptions or the
    /// subscribed topics' partitions.
    pub epoch: i32,
    /// The epoch of the current target assignment.
    pub assignment_epoch: i32,
    pub members: BTreeMap<String, ShareMember>,
    /// The subscribed topics as the last assignment saw them.
    assigned_topics: Topics,
    targets: BTreeMap<String, Assignment>,
}

impl ShareGroup {
    pub fn new(group_id: &str) -> ShareGroup {
        ShareGroup {
            group_id: group_id.to_string(),
            epoch: 0,
            assignment_epoch: 0,
            members: BTreeMap::new(),
            assigned_topics: Topics::new(),
            targets: BTreeMap::new(),
        }
    }

    pub fn state(&self) -> ShareGroupState {
        if self.members.is_empty() {
            ShareGroupState::Empty
        } else {
            ShareGroupState::Stable
        }
    }

    /// Every topic a member subscribes to.
    pub fn subscribed_topics(&self) -> BTreeSet<String> {
        self.members
            .values()
            .flat_map(|m| m.subscribed.iter().cloned())
            .collect()
    }

    /// Applies one heartbeat against `topics` (the broker's topics now).
    pub fn heartbeat(
        &mut self,
        hb: ShareHeartbeat,
        topics: &Topics,
        config: &ShareGroupConfig,
        now_ms: i64,
    ) -> Result<ShareHeartbeatAnswer, (ResponseError, String)> {
        if hb.member_epoch == LEAVE_EPOCH {
            if self.members.remove(&hb.member_id).is_none() {
                return Err(unknown_member(&hb.member_id, &self.group_id));
            }
            self.reassign(topics);
            return Ok(ShareHeartbeatAnswer {
                member_epoch: LEAVE_EPOCH,
                assignment: None,
            });
        }
        let joining = hb.member_epoch == 0;
        let mut changed = false;
        match self.members.get_mut(&hb.member_id) {
            None if !joining => return Err(unknown_member(&hb.member_id, &self.group_id)),
            None => {
                if self.members.len() >= config.max_size {
                    return Err((
                        ResponseError::GroupMaxSizeReached,
                        format!(
                            "The share group has reached its maximum size of {}.",
                            config.max_size
                        ),
                    ));
                }
                self.members.insert(
                    hb.member_id.clone(),
                    ShareMember {
                        member_id: hb.member_id.clone(),
                        epoch: 0,
                        previous_epoch: 0,
                        rack_id: None,
                        client_id: String::new(),
                        client_host: String::new(),
                        subscribed: BTreeSet::new(),
                        assignment: Assignment::new(),
                        last_heartbeat_ms: now_ms,
                    },
                );
                changed = true;
            }
            Some(m) if !joining && m.epoch != hb.member_epoch && m.previous_epoch != hb.member_epoch => {
                return Err((
                    ResponseError::FencedMemberEpoch,
                    format!(
                        "The share group member has an epoch {} that is not the current one, {}.",
                        hb.member_epoch, m.epoch
                    ),
                ))
            }
            Some(_) => {}
        }
        let m = self.members.get_mut(&hb.member_id).expect("present");
        // A full heartbeat (subscriptions named), or one from the epoch
        // before, is answered with the whole assignment.
        let resend = hb.subscribed.is_some() || hb.member_epoch != m.epoch;
        m.last_heartbeat_ms = now_ms;
        m.client_id = hb.client_id;
        m.client_host = hb.client_host;
        m.rack_id = hb.rack_id.or(m.rack_id.take());
        if let Some(names) = hb.subscribed {
            let names: BTreeSet<String> = names.into_iter().collect();
            changed |= names != m.subscribed;
            m.subscribed = names;
        }
        if changed || self.subscribed_view(topics) != self.assigned_topics {
            self.reassign(topics);
        }
        let m = self.members.get_mut(&hb.member_id).expect("present");
        let moved = m.epoch != self.assignment_epoch;
        if moved {
            m.previous_epoch = m.epoch;
            m.epoch = self.assignment_epoch;
            m.assignment = self.targets.get(&m.member_id).cloned().unwrap_or_default();
        }
        let refresh = joining || moved || resend;
        Ok(ShareHeartbeatAnswer {
            member_epoch: m.epoch,
            assignment: refresh.then(|| m.assignment.clone()),
        })
    }

    /// Removes the members not heard from within the session timeout;
    /// returns their ids.
    /// Whether a member was not heard from within the session timeout.
    pub fn has_timed_out(&self, config: &ShareGroupConfig, now_ms: i64) -> bool {
        let timeout = i64::from(config.session_timeout_ms);
        self.members
            .values()
            .any(|m| now_ms - m.last_heartbeat_ms >= timeout)
    }

    pub fn expire_members(&mut self, topics: &Topics, config: &ShareGroupConfig, now_ms: i64) -> Vec<String> {
        let timeout = i64::from(config.session_timeout_ms);
        let gone: Vec<String> = self
            .members
            .values()
            .filter(|m| now_ms - m.last_heartbeat_ms >= timeout)
            .map(|m| m.member_id.clone())
            .collect();
        for id in &gone {
            self.members.remove(id);
        }
        if !gone.is_empty() {
            self.reassign(topics);
        }
        gone
    }

    /// The partitions some member is assigned.
    pub fn assigned_partitions(&self) -> BTreeSet<(Uuid, i32)> {
        self.targets
            .values()
            .flat_map(|a| a.iter().flat_map(|(t, ps)| ps.iter().map(move |p| (*t, *p))))
            .collect()
    }

    /// The subscribed topics that exist, as `topics` has them.
    fn subscribed_view(&self, topics: &Topics) -> Topics {
        self.subscribed_topics()
            .into_iter()
            .filter_map(|name| topics.get(&name).map(|t| (name, *t)))
            .collect()
    }

    /// A new target for every member, under a new epoch.
    fn reassign(&mut self, topics: &Topics) {
        self.epoch += 1;
        self.assigned_topics = self.subscribed_view(topics);
        self.targets = assign(&self.members, &self.assigned_topics, &self.targets);
        self.assignment_epoch = self.epoch;
    }
}

fn unknown_member(member: &str, group: &str) -> (ResponseError, String) {
    (
        ResponseError::UnknownMemberId,
        format!("Member {member} is not a member of share group {group}."),
    )
}

/// Kafka's `simple` share assignor, sticky: balance first, then as
/// little movement as balance allows. When every member subscribes to the
/// same topics it balances all their partitions together, as Kafka's
/// homogeneous case does; otherwise topic by topic over each topic's
/// subscribers.
///
/// With `m` members and `n` partitions, each partition is shared by up to
/// `ceil(m / n)` members (1 while partitions are at least as many), and
/// the `ceil(m / n) * n` places are spread over the members as evenly as
/// they divide, the larger shares going to the members that held the
/// most. Each member keeps what it held of its share; what it held
/// beyond, and places beyond a partition's sharing, are given up; then
/// the partitions short of members go round-robin to the members short
/// of partitions, never twice to one member (so, as in Kafka, a partition
/// may be left with fewer than its sharing when only members that hold it
/// have room; never with none). Ties go by member id, so the result
/// depends only on the members, their subscriptions and the previous
/// assignment.
pub fn assign(
    members: &BTreeMap<String, ShareMember>,
    topics: &Topics,
    previous: &BTreeMap<String, Assignment>,
) -> BTreeMap<String, Assignment> {
    let mut out: BTreeMap<String, Assignment> =
        members.keys().map(|id| (id.clone(), Assignment::new())).collect();
    let partitions_of = |names: &mut dyn Iterator<Item = &String>| -> Vec<(Uuid, i32)> {
        names
            .filter_map(|name| topics.get(name))
            .flat_map(|TopicInfo { id, partitions }| (0..(*partitions).max(0)).map(move |p| (*id, p)))
            .collect()
    };
    let mut subscriptions = members.values().map(|m| &m.subscribed);
    let homogeneous = subscriptions
        .next()
        .is_some_and(|first| subscriptions.all(|s| s == first));
    // Who is balanced over which partitions: everyone over everything,
    // or each topic's subscribers over its partitions.
    let groups: Vec<Balanced> = if homogeneous {
        let first = members.values().next().map(|m| &m.subscribed);
        let all = first.map_or_else(Vec::new, |s| partitions_of(&mut s.iter()));
        vec![(members.keys().collect(), all)]
    } else {
        topics
            .keys()
            .map(|name| {
                let subscribers = members
                    .values()
                    .filter(|m| m.subscribed.contains(name))
                    .map(|m| &m.member_id)
                    .collect();
                (subscribers, partitions_of(&mut std::iter::once(name)))
            })
            .collect()
    };
    for (subscribers, places) in groups {
        if subscribers.is_empty() || places.is_empty() {
            continue;
        }
        let index: BTreeMap<(Uuid, i32), usize> = places.iter().enumerate().map(|(i, tp)| (*tp, i)).collect();
        let held = |member: &String| -> BTreeSet<usize> {
            previous
                .get(member)
                .into_iter()
                .flat_map(|a| a.iter())
                .flat_map(|(id, ps)| ps.iter().filter_map(|p| index.get(&(*id, *p)).copied()))
                .collect()
        };
        for (member, ps) in assign_topic(&subscribers, places.len(), held) {
            for i in ps {
                let (id, p) = places[i];
                out.entry(member.clone())
                    .or_default()
                    .entry(id)
                    .or_default()
                    .insert(p);
            }
        }
    }
    out
}

/// Members (their ids) balanced over partitions.
type Balanced<'a> = (Vec<&'a String>, Vec<(Uuid, i32)>);

/// `n` partitions (as indexes) over their subscribers (in id order),
/// given what each held: each subscriber's partitions.
fn assign_topic<'a>(
    subscribers: &[&'a String],
    n: usize,
    held: impl Fn(&String) -> BTreeSet<usize>,
) -> Vec<(&'a String, BTreeSet<usize>)> {
    let m = subscribers.len();
    let sharing = m.div_ceil(n);
    let places = sharing * n;
    let mut now: Vec<(&String, BTreeSet<usize>)> = subscribers.iter().map(|s| (*s, held(s))).collect();
    // Shares: `places` split as evenly as `m` divides it, the larger
    // shares to those that held the most.
    let mut by_held: Vec<usize> = (0..m).collect();
    by_held.sort_by_key(|&i| std::cmp::Reverse(now[i].1.len()));
    let mut share = vec![0; m];
    for (rank, &i) in by_held.iter().enumerate() {
        share[i] = places / m + usize::from(rank < places % m);
    }
    // Over their share: give up the highest partitions.
    for (i, (_, ps)) in now.iter_mut().enumerate() {
        while ps.len() > share[i] {
            ps.pop_last();
        }
    }
    // Partitions over their sharing: the later members give them up.
    let mut holders = vec![0usize; n];
    for (_, ps) in now.iter_mut() {
        ps.retain(|&p| {
            let keep = holders[p] < sharing;
            if keep {
                holders[p] += 1;
            }
            keep
        });
    }
    // The partitions short of members, round-robin over the members
    // short of partitions.
    let mut next = 0;
    for (p, held_by) in holders.iter_mut().enumerate() {
        let mut tried = 0;
        while *held_by < sharing && tried < m {
            let i = next;
            next = (next + 1) % m;
            tried += 1;
            let (_, ps) = &mut now[i];
            if ps.len() < share[i] && ps.insert(p) {
                *held_by += 1;
                tried = 0;
            }
        }
    }
    now
}
