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
//! the log first, then acquires what it read under the lock. Time comes
//! in as `now_ms`; the broker sweeps expired locks and members
//! ([`ShareCoordinator::sweep`]) and a fetch waiting for records wakes on
//! [`ShareCoordinator::changes`], which moves whenever records become
//! available again.

pub mod group;
pub mod partition;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use keel_protocol::ResponseError;
use parking_lot::Mutex;
use tokio::sync::watch;
use uuid::Uuid;

use crate::groups::consumer::Topics;
use group::{ShareGroup, ShareGroupConfig, ShareGroupState, ShareHeartbeat, ShareHeartbeatAnswer};
use partition::{AckError, AckType, Acquired, BatchSpan, ShareCounts, ShareLimits, SharePartition};

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
    /// Moves when records may have become available again.
    changes: watch::Sender<u64>,
}

impl Default for ShareCoordinator {
    fn default() -> Self {
        ShareCoordinator::new()
    }
}

impl ShareCoordinator {
    pub fn new() -> ShareCoordinator {
        ShareCoordinator {
            state: Mutex::new(State::default()),
            changes: watch::channel(0).0,
        }
    }

    /// A receiver that sees a change whenever records were released, a
    /// lock ran out or a session closed.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
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
        if hb.member_epoch != 0 && !state.groups.contains_key(group_id) {
            return Err((
                ResponseError::GroupIdNotFound,
                format!("Share group {group_id} not found."),
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
    pub fn initialize(&self, key: ShareKey, start_offset: i64) {
        self.state
            .lock()
            .partitions
            .entry(key)
            .or_insert_with(|| SharePartition::new(start_offset));
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
        release_member(&mut state, group_id, member, limits);
        drop(state);
        self.changed();
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
            release_member(&mut state, group, member, limits);
        }
        drop(state);
        self.changed();
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
        if let Some(sp) = self.state.lock().partitions.get_mut(key) {
            sp.skip_to(log_start_offset);
        }
    }

    /// Acquires what `batches` hold for `member` (see
    /// [`SharePartition::acquire`]).
    pub fn acquire(
        &self,
        key: &ShareKey,
        member: &Arc<str>,
        batches: &[BatchSpan],
        max_records: usize,
        limits: &ShareLimits,
        now_ms: i64,
    ) -> Vec<Acquired> {
        let mut state = self.state.lock();
        match state.partitions.get_mut(key) {
            Some(sp) => sp.acquire(member, batches, max_records, limits, now_ms),
            None => Vec::new(),
        }
    }

    /// Applies `member`'s acknowledgement batches to one share partition,
    /// in order, up to the first refused.
    pub fn acknowledge(
        &self,
        key: &ShareKey,
        member: &str,
        batches: &[AckBatch],
        limits: &ShareLimits,
        now_ms: i64,
    ) -> Result<(), ShareError> {
        let mut state = self.state.lock();
        let sp = state.partitions.get_mut(key).ok_or_else(|| {
            (
                ResponseError::InvalidRecordState,
                "The share partition has no records in flight.".to_string(),
            )
        })?;
        let mut released = false;
        let mut outcome = Ok(());
        for b in batches {
            released |= b.types.contains(&AckType::Release);
            if let Err(e) = sp.acknowledge(member, b.first_offset, b.last_offset, &b.types, limits, now_ms) {
                outcome = Err(match e {
                    AckError::InvalidRecordState(m) => (ResponseError::InvalidRecordState, m),
                    AckError::InvalidRequest(m) => (ResponseError::InvalidRequest, m),
                });
                break;
            }
        }
        drop(state);
        if released {
            self.changed();
        }
        outcome
    }

    /// Releases the locks that ran out and removes the members whose
    /// session timed out; returns when the next lock runs out.
    pub fn sweep(
        &self,
        topics: &Topics,
        config: &ShareGroupConfig,
        limits: &dyn Fn(&str) -> ShareLimits,
        now_ms: i64,
    ) -> Option<i64> {
        let mut state = self.state.lock();
        let mut expired = 0;
        let mut next: Option<i64> = None;
        for (k, sp) in state.partitions.iter_mut() {
            expired += sp.expire(&limits(&k.group), now_ms);
            next = match (next, sp.next_deadline_ms()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        for group in state.groups.values_mut() {
            group.expire_members(topics, config, now_ms);
        }
        drop(state);
        if expired > 0 {
            self.changed();
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

fn release_member(state: &mut State, group: &str, member: &str, limits: &dyn Fn(&str) -> ShareLimits) {
    let limits = limits(group);
    for (_, sp) in state.partitions.iter_mut().filter(|(k, _)| k.group == group) {
        sp.release_member(member, &limits);
    }
}
