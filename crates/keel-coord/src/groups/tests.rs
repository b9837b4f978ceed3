//! The coordinator on a hand-moved clock: rebalances, session expiry,
//! Kafka's error codes, persistence across reopen and offset retention,
//! with no sleeping.

use std::sync::atomic::{AtomicI64, Ordering};

use bytes::Bytes;
use tokio::task::JoinHandle;

use super::*;

struct ManualClock(AtomicI64);

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

struct Harness {
    dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
    config: CoordinatorConfig,
    coordinator: Arc<GroupCoordinator>,
}

const SESSION_MS: i32 = 10_000;
const REBALANCE_MS: i32 = 30_000;
const DELAY_MS: i32 = 500;

impl Harness {
    fn new() -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock(AtomicI64::new(1_000_000)));
        let config = CoordinatorConfig {
            group: GroupConfig {
                initial_rebalance_delay_ms: DELAY_MS,
                ..GroupConfig::default()
            },
            offsets_retention_ms: 60_000,
            ..CoordinatorConfig::default()
        };
        let coordinator =
            Arc::new(GroupCoordinator::open(dir.path(), config.clone(), clock.clone()).unwrap());
        Harness {
            dir,
            clock,
            config,
            coordinator,
        }
    }

    fn reopen(&mut self) {
        self.coordinator.close();
        self.coordinator = Arc::new(
            GroupCoordinator::open(self.dir.path(), self.config.clone(), self.clock.clone()).unwrap(),
        );
    }

    /// Moves the clock and runs the timers, letting woken tasks run.
    async fn advance(&self, ms: i64) {
        self.clock.0.fetch_add(ms, Ordering::SeqCst);
        self.coordinator.tick().await.unwrap();
        settle().await;
    }

    fn join(&self, member_id: &str, instance: Option<&str>) -> JoinHandle<JoinResult> {
        let c = Arc::clone(&self.coordinator);
        let params = params(member_id, instance);
        tokio::spawn(async move { c.join("g", params, &Topics::new()).await })
    }

    /// The two-step join of a new dynamic member (JoinGroup v4+).
    async fn new_member(&self) -> JoinHandle<JoinResult> {
        let first = self.join("", None).await.unwrap();
        assert_eq!(first.error, Some(ResponseError::MemberIdRequired));
        let handle = self.join(&first.member_id, None);
        settle().await;
        handle
    }

    fn sync(&self, r: &JoinResult, assignments: Vec<(String, Bytes)>) -> JoinHandle<SyncResult> {
        let c = Arc::clone(&self.coordinator);
        let (generation, member) = (r.generation, r.member_id.clone());
        let instance = c
            .describe("g")
            .and_then(|d| d.members.into_iter().find(|m| m.member_id == member))
            .and_then(|m| m.instance_id);
        tokio::spawn(async move {
            c.sync(
                "g",
                generation,
                &member,
                instance.as_deref(),
                (None, None),
                assignments,
                &Topics::new(),
            )
            .await
        })
    }

    /// Joins `n` new members and completes the rebalance: each gets
    /// "assignment-<i>" in join order.
    async fn stable_group(&self, n: usize) -> Vec<JoinResult> {
        let mut joins = Vec::new();
        for _ in 0..n {
            joins.push(self.new_member().await);
        }
        // Members that joined within the initial delay extend it once more.
        self.advance(i64::from(DELAY_MS)).await;
        if n > 1 {
            assert!(joins.iter().all(|j| !j.is_finished()));
            self.advance(i64::from(DELAY_MS)).await;
        }
        let mut results = Vec::new();
        for j in joins {
            results.push(j.await.unwrap());
        }
        self.complete_sync(&results).await;
        results
    }

    async fn complete_sync(&self, results: &[JoinResult]) {
        let leader = results
            .iter()
            .find(|r| r.member_id == r.leader)
            .expect("a leader");
        let assignments: Vec<(String, Bytes)> = leader
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| (m.member_id.clone(), Bytes::from(format!("assignment-{i}"))))
            .collect();
        let mut syncs = Vec::new();
        for r in results {
            let a = if r.member_id == r.leader {
                assignments.clone()
            } else {
                Vec::new()
            };
            syncs.push((r.member_id.clone(), self.sync(r, a)));
        }
        for (member, s) in syncs {
            let answer = s.await.unwrap().unwrap();
            let expected = assignments.iter().find(|(m, _)| *m == member).unwrap();
            assert_eq!(answer.assignment, expected.1);
        }
    }

    fn state(&self) -> GroupState {
        self.coordinator.describe("g").unwrap().state
    }
}

fn params(member_id: &str, instance: Option<&str>) -> JoinParams {
    JoinParams {
        member_id: member_id.into(),
        instance_id: instance.map(String::from),
        client_id: "client".into(),
        client_host: "/127.0.0.1".into(),
        session_timeout_ms: SESSION_MS,
        rebalance_timeout_ms: REBALANCE_MS,
        protocol_type: "consumer".into(),
        protocols: vec![("range".into(), Bytes::from_static(b"meta"))],
        require_known_member_id: true,
    }
}

async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn three_members_share_one_generation_and_one_leader() {
    let h = Harness::new();
    let results = h.stable_group(3).await;
    let generation = results[0].generation;
    assert!(results
        .iter()
        .all(|r| r.generation == generation && r.error.is_none()));
    let leaders: Vec<_> = results.iter().filter(|r| r.member_id == r.leader).collect();
    assert_eq!(leaders.len(), 1);
    assert_eq!(leaders[0].members.len(), 3);
    assert!(results
        .iter()
        .filter(|r| r.member_id != r.leader)
        .all(|r| r.members.is_empty()));
    assert_eq!(results[0].protocol_name.as_deref(), Some("range"));
    assert_eq!(h.state(), GroupState::Stable);
}

#[tokio::test]
async fn the_initial_delay_holds_the_first_rebalance() {
    let h = Harness::new();
    let first = h.new_member().await;
    h.advance(i64::from(DELAY_MS) - 1).await;
    assert!(!first.is_finished(), "the join waits out the initial delay");
    let second = h.new_member().await;
    // A member arrived within the delay: it is extended once more.
    h.advance(1).await;
    assert!(!first.is_finished());
    h.advance(i64::from(DELAY_MS)).await;
    let (a, b) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!(a.generation, b.generation);
}

#[tokio::test]
async fn an_expired_member_triggers_a_rebalance_without_it() {
    let h = Harness::new();
    let results = h.stable_group(3).await;
    let generation = results[0].generation;
    // Two members keep heartbeating; the third goes silent.
    for _ in 0..3 {
        h.clock.0.fetch_add(i64::from(SESSION_MS) / 3, Ordering::SeqCst);
        for r in &results[..2] {
            h.coordinator
                .heartbeat("g", generation, &r.member_id, None)
                .unwrap();
        }
        h.advance(0).await;
    }
    h.advance(1).await;
    assert_eq!(h.state(), GroupState::PreparingRebalance);
    let hb = h
        .coordinator
        .heartbeat("g", generation, &results[0].member_id, None);
    assert_eq!(hb, Err(ResponseError::RebalanceInProgress));
    assert_eq!(
        h.coordinator
            .heartbeat("g", generation, &results[2].member_id, None),
        Err(ResponseError::UnknownMemberId)
    );
    let rejoins: Vec<_> = results[..2].iter().map(|r| h.join(&r.member_id, None)).collect();
    settle().await;
    let mut again = Vec::new();
    for j in rejoins {
        again.push(j.await.unwrap());
    }
    assert!(again.iter().all(|r| r.generation == generation + 1));
    h.complete_sync(&again).await;
    assert_eq!(h.coordinator.describe("g").unwrap().members.len(), 2);
}

#[tokio::test]
async fn wrong_generations_and_unknown_members_get_kafkas_errors() {
    let h = Harness::new();
    let results = h.stable_group(2).await;
    let (generation, member) = (results[0].generation, results[0].member_id.clone());
    let c = &h.coordinator;
    assert_eq!(
        c.heartbeat("g", generation - 1, &member, None),
        Err(ResponseError::IllegalGeneration)
    );
    assert_eq!(
        c.heartbeat("g", generation, "nobody", None),
        Err(ResponseError::UnknownMemberId)
    );
    assert_eq!(
        c.heartbeat("nogroup", generation, &member, None),
        Err(ResponseError::UnknownMemberId)
    );
    let sync = c
        .sync(
            "g",
            generation + 1,
            &member,
            None,
            (None, None),
            Vec::new(),
            &Topics::new(),
        )
        .await;
    assert_eq!(sync.unwrap_err(), ResponseError::IllegalGeneration);
    let commit = |generation, member: &'static str| {
        let offsets = vec![OffsetToCommit {
            topic: "t".into(),
            partition: 0,
            offset: 5,
            leader_epoch: -1,
            metadata: String::new(),
        }];
        c.commit_offsets("g", generation, member, None, offsets, 9)
    };
    let member: &'static str = Box::leak(member.into_boxed_str());
    assert_eq!(
        commit(generation - 1, member).await.unwrap_err(),
        ResponseError::IllegalGeneration
    );
    assert_eq!(
        commit(generation, "nobody").await.unwrap_err(),
        ResponseError::UnknownMemberId
    );
    // A commit from outside the generation while the group has members.
    assert_eq!(commit(-1, "").await.unwrap_err(), ResponseError::UnknownMemberId);
    assert!(commit(generation, member).await.is_ok());
    let unknown = c.join("g", params("nobody", None), &Topics::new()).await;
    assert_eq!(unknown.error, Some(ResponseError::UnknownMemberId));
    let mut short = params("", None);
    short.session_timeout_ms = 10;
    assert_eq!(
        c.join("g", short, &Topics::new()).await.error,
        Some(ResponseError::InvalidSessionTimeout)
    );
    let mut other = params("", None);
    other.protocols = vec![("roundrobin".into(), Bytes::new())];
    assert_eq!(
        c.join("g", other, &Topics::new()).await.error,
        Some(ResponseError::InconsistentGroupProtocol)
    );
    // A follower that rejoins unchanged gets the current generation back;
    // the leader's rejoin starts a rebalance.
    let follower = results.iter().find(|r| r.member_id != r.leader).unwrap();
    let same = c
        .join("g", params(&follower.member_id, None), &Topics::new())
        .await;
    assert_eq!((same.error, same.generation), (None, generation));
    assert_eq!(h.state(), GroupState::Stable);
    let rejoin = h.join(&results[0].leader, None);
    settle().await;
    assert_eq!(h.state(), GroupState::PreparingRebalance);
    let sync = c
        .sync(
            "g",
            generation,
            member,
            None,
            (None, None),
            Vec::new(),
            &Topics::new(),
        )
        .await;
    assert_eq!(sync.unwrap_err(), ResponseError::RebalanceInProgress);
    drop(rejoin);
}

#[tokio::test]
async fn a_restarted_static_member_takes_its_place_without_a_rebalance() {
    let h = Harness::new();
    let a = h.join("", Some("instance-a"));
    let b = h.join("", Some("instance-b"));
    settle().await;
    h.advance(i64::from(DELAY_MS)).await;
    h.advance(i64::from(DELAY_MS)).await;
    let results = vec![a.await.unwrap(), b.await.unwrap()];
    h.complete_sync(&results).await;
    let generation = results[0].generation;
    let old = results
        .iter()
        .find(|r| r.member_id.starts_with("instance-b"))
        .unwrap();
    let old_assignment = h
        .coordinator
        .describe("g")
        .unwrap()
        .members
        .into_iter()
        .find(|m| m.member_id == old.member_id)
        .unwrap()
        .assignment;
    // The client restarts: same instance id, no member id.
    let again = h.join("", Some("instance-b")).await.unwrap();
    assert_eq!(again.error, None);
    assert_eq!(again.generation, generation, "no rebalance");
    assert_ne!(again.member_id, old.member_id);
    assert_eq!(h.state(), GroupState::Stable);
    let answer = h
        .coordinator
        .sync(
            "g",
            generation,
            &again.member_id,
            Some("instance-b"),
            (None, None),
            Vec::new(),
            &Topics::new(),
        )
        .await
        .unwrap();
    assert_eq!(answer.assignment, old_assignment);
    // The old instance is fenced.
    assert_eq!(
        h.coordinator
            .heartbeat("g", generation, &old.member_id, Some("instance-b")),
        Err(ResponseError::FencedInstanceId)
    );
}

#[tokio::test]
async fn groups_and_offsets_survive_a_reopen() {
    let mut h = Harness::new();
    let results = h.stable_group(2).await;
    let generation = results[0].generation;
    let offsets = vec![OffsetToCommit {
        topic: "t".into(),
        partition: 3,
        offset: 42,
        leader_epoch: 0,
        metadata: "meta".into(),
    }];
    h.coordinator
        .commit_offsets("g", generation, &results[0].member_id, None, offsets, 9)
        .await
        .unwrap();
    h.reopen();
    assert_eq!(h.state(), GroupState::Stable);
    for r in &results {
        h.coordinator
            .heartbeat("g", generation, &r.member_id, None)
            .unwrap();
    }
    let fetched = h.coordinator.fetch_offsets("g", None);
    assert_eq!(fetched.len(), 1);
    let (topic, partition, value) = &fetched[0];
    assert_eq!((topic.as_str(), *partition), ("t", 3));
    let value = value.as_ref().unwrap();
    assert_eq!(
        (value.offset, value.leader_epoch, value.metadata.as_str()),
        (42, 0, "meta")
    );
    // Members that never come back expire after the restart too.
    h.advance(i64::from(SESSION_MS) + 1).await;
    assert_eq!(h.state(), GroupState::Empty);
}

#[tokio::test]
async fn offsets_of_an_empty_group_expire_after_retention() {
    let mut h = Harness::new();
    let offsets = offset_of_t0;
    // With a generation, to a group that does not exist: refused, with
    // Kafka's answer for the request's version.
    for (version, error) in [
        (8, ResponseError::IllegalGeneration),
        (9, ResponseError::GroupIdNotFound),
    ] {
        let refused = h
            .coordinator
            .commit_offsets("g", 3, "m", None, offsets(1), version)
            .await;
        assert_eq!(refused.unwrap_err(), error, "v{version}");
    }
    h.coordinator
        .commit_offsets("g", -1, "", None, offsets(1), 9)
        .await
        .unwrap();
    h.clock.0.fetch_add(30_000, Ordering::SeqCst);
    h.coordinator
        .commit_offsets("other", -1, "", None, offsets(2), 9)
        .await
        .unwrap();
    h.coordinator.expire_offsets().await.unwrap();
    assert_eq!(
        h.coordinator.fetch_offsets("g", None).len(),
        1,
        "nothing is due yet"
    );
    h.clock.0.fetch_add(30_000, Ordering::SeqCst);
    h.coordinator.expire_offsets().await.unwrap();
    assert!(h.coordinator.fetch_offsets("g", None).is_empty());
    assert!(h.coordinator.describe("g").is_none(), "the empty group is gone");
    assert_eq!(h.coordinator.fetch_offsets("other", None).len(), 1);
    h.reopen();
    assert!(h.coordinator.describe("g").is_none());
    assert_eq!(h.coordinator.fetch_offsets("other", None).len(), 1);
}

#[tokio::test]
async fn only_empty_groups_can_be_deleted() {
    let h = Harness::new();
    let results = h.stable_group(1).await;
    let ids = vec!["g".to_string(), "missing".to_string()];
    let r = h.coordinator.delete_groups(&ids).await;
    assert_eq!(
        r,
        vec![
            Err(ResponseError::NonEmptyGroup),
            Err(ResponseError::GroupIdNotFound)
        ]
    );
    let left = h
        .coordinator
        .leave("g", &[(results[0].member_id.clone(), None)], &Topics::new())
        .await;
    assert_eq!(left, vec![Ok(())]);
    // The last member left: the join phase ends at once, with nobody.
    assert_eq!(h.state(), GroupState::Empty);
    assert_eq!(h.coordinator.delete_groups(&ids[..1]).await, vec![Ok(())]);
    assert!(h.coordinator.describe("g").is_none());
}

#[tokio::test]
async fn offsets_of_subscribed_topics_cannot_be_deleted_while_members_consume() {
    let h = Harness::new();
    // A consumer-protocol subscription (version 0) to topic "t".
    let subscription = Bytes::from_static(&[0, 0, 0, 0, 0, 1, 0, 1, b't', 255, 255, 255, 255]);
    let mut p = params("", Some("instance"));
    p.protocols = vec![("range".into(), subscription)];
    let join = {
        let c = Arc::clone(&h.coordinator);
        tokio::spawn(async move { c.join("g", p, &Topics::new()).await })
    };
    settle().await;
    h.advance(i64::from(DELAY_MS)).await;
    let joined = join.await.unwrap();
    h.complete_sync(std::slice::from_ref(&joined)).await;
    let offsets = |topic: &str| OffsetToCommit {
        topic: topic.into(),
        partition: 0,
        offset: 1,
        leader_epoch: -1,
        metadata: String::new(),
    };
    h.coordinator
        .commit_offsets(
            "g",
            joined.generation,
            &joined.member_id,
            Some("instance"),
            vec![offsets("t"), offsets("u")],
            9,
        )
        .await
        .unwrap();
    let deleted = h
        .coordinator
        .delete_offsets("g", &[("t".into(), 0), ("u".into(), 0)])
        .await
        .unwrap();
    assert_eq!(deleted, vec![Err(ResponseError::GroupSubscribedToTopic), Ok(())]);
    let left = h.coordinator.fetch_offsets("g", None);
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].0, "t");
}

/// A commit of `offset` for partition 0 of topic `t`.
fn offset_of_t0(offset: i64) -> Vec<OffsetToCommit> {
    vec![OffsetToCommit {
        topic: "t".into(),
        partition: 0,
        offset,
        leader_epoch: -1,
        metadata: String::new(),
    }]
}

#[tokio::test]
async fn transactional_offsets_are_checked_held_and_ended_by_their_marker() {
    let mut h = Harness::new();
    let results = h.stable_group(1).await;
    let (generation, member) = (results[0].generation, results[0].member_id.clone());
    let offset = offset_of_t0;
    let commit = |h: &Harness, producer_id, generation, member: &str, o| {
        let c = Arc::clone(&h.coordinator);
        let member = member.to_string();
        async move {
            let guard = c.txn_offsets_guard(TxnWrite {
                producer_id,
                producer_epoch: 0,
                bumped_on_end: false,
            });
            c.commit_transactional_offsets("g", (producer_id, 0), generation, &member, None, o, &guard)
                .await
        }
    };
    // KIP-447: a named member and generation must be current; a request
    // naming neither (before v3) is taken.
    assert_eq!(
        commit(&h, 7, generation + 1, &member, offset(5)).await,
        Err(ResponseError::IllegalGeneration)
    );
    assert_eq!(
        commit(&h, 7, generation, "stranger", offset(5)).await,
        Err(ResponseError::UnknownMemberId)
    );
    commit(&h, 7, -1, "", offset(4)).await.unwrap();
    commit(&h, 7, generation, &member, offset(5)).await.unwrap();
    let stable = |c: &GroupCoordinator| c.fetch_offsets_stable("g", Some(&[("t".into(), 0)]), true);
    assert_eq!(
        stable(&h.coordinator)[0].2,
        Err(ResponseError::UnstableOffsetCommit)
    );
    assert_eq!(
        h.coordinator.fetch_offsets("g", None).len(),
        0,
        "not committed yet"
    );
    let marker = |commit| Marker {
        commit,
        coordinator_epoch: 0,
    };
    // Still pending after a reopen; the commit marker makes it the
    // group's offset, an abort marker of another producer changes nothing.
    h.reopen();
    assert_eq!(
        stable(&h.coordinator)[0].2,
        Err(ResponseError::UnstableOffsetCommit)
    );
    h.coordinator.end_transaction(7, 0, marker(true)).await.unwrap();
    commit(&h, 8, -1, "", offset(9)).await.unwrap();
    h.coordinator.end_transaction(8, 0, marker(false)).await.unwrap();
    let fetched = stable(&h.coordinator);
    assert_eq!(fetched[0].2.as_ref().unwrap().as_ref().map(|v| v.offset), Some(5));
}

/// A TxnOffsetCommit's guard, taken before its transaction's coordinator
/// is asked, holds until a marker ending that transaction is queued: such
/// a marker in between refuses the offsets (they would stay pending with
/// no marker to end them); under transactions v2 the previous
/// transaction's marker, in the epoch the next one uses, does not.
#[tokio::test]
async fn a_marker_ending_the_transaction_refuses_offsets_checked_before_it() {
    let h = Harness::new();
    let offset = offset_of_t0;
    let marker = |commit| Marker {
        commit,
        coordinator_epoch: 0,
    };
    let c = &h.coordinator;
    let write = |producer_epoch, bumped_on_end| TxnWrite {
        producer_id: 7,
        producer_epoch,
        bumped_on_end,
    };
    // Before transactions v2: a marker in the offsets' epoch ends them.
    let stale = c.txn_offsets_guard(write(0, false));
    c.end_transaction(7, 0, marker(false)).await.unwrap();
    let refused = c
        .commit_transactional_offsets("g", (7, 0), -1, "", None, offset(3), &stale)
        .await;
    assert_eq!(refused, Err(ResponseError::InvalidTxnState));
    // Transactions v2: the next transaction (epoch 1) is checked while the
    // previous one's marker (epoch 1) is written; its offsets are taken.
    let next = c.txn_offsets_guard(write(1, true));
    c.end_transaction(7, 1, marker(true)).await.unwrap();
    c.commit_transactional_offsets("g", (7, 1), -1, "", None, offset(4), &next)
        .await
        .unwrap();
    // Its own end, in epoch 2, voids a guard taken in epoch 1.
    let late = c.txn_offsets_guard(write(1, true));
    c.end_transaction(7, 2, marker(true)).await.unwrap();
    let refused = c
        .commit_transactional_offsets("g", (7, 1), -1, "", None, offset(5), &late)
        .await;
    assert_eq!(refused, Err(ResponseError::InvalidTxnState));
    let committed = c.fetch_offsets_stable("g", Some(&[("t".into(), 0)]), true);
    assert_eq!(
        committed[0].2.as_ref().unwrap().as_ref().map(|v| v.offset),
        Some(4)
    );
}

// Online migration (KIP-848): classic members of a consumer group.

mod migration {
    use super::*;
    use crate::groups::consumer::{Assignment, MigrationPolicy, TopicInfo};
    use crate::groups::embedded::{self, Subscription};

    const TOPIC_ID: uuid::Uuid = uuid::Uuid::from_u128(0x7);

    fn topics() -> Topics {
        Topics::from([(
            "t".to_string(),
            TopicInfo {
                id: TOPIC_ID,
                partitions: 6,
            },
        )])
    }

    fn subscription(owned: &[i32]) -> Bytes {
        Subscription {
            version: 3,
            topics: vec!["t".into()],
            owned: if owned.is_empty() {
                vec![]
            } else {
                vec![("t".into(), owned.to_vec())]
            },
            rack_id: None,
        }
        .encode()
    }

    fn classic_params(member_id: &str, owned: &[i32]) -> JoinParams {
        JoinParams {
            protocols: vec![("range".into(), subscription(owned))],
            ..params(member_id, None)
        }
    }

    /// A classic consumer with the eager protocol: it revokes everything
    /// before it joins again.
    struct Classic {
        id: String,
        generation: i32,
        owned: Vec<i32>,
    }

    impl Classic {
        async fn rejoin(&mut self, c: &GroupCoordinator) {
            self.owned.clear();
            let r = c.join("g", classic_params(&self.id, &[]), &topics()).await;
            assert_eq!(r.error, None, "{r:?}");
            assert_eq!((r.leader.as_str(), r.members.len()), ("", 0), "the group assigns");
            self.generation = r.generation;
            let s = c
                .sync(
                    "g",
                    r.generation,
                    &self.id,
                    None,
                    (Some("consumer"), Some("range")),
                    vec![],
                    &topics(),
                )
                .await;
            match s {
                Ok(a) => {
                    let (parts, _) = embedded::parse_assignment(&a.assignment).unwrap();
                    self.owned = parts.into_iter().flat_map(|(_, ps)| ps).collect();
                }
                Err(e) => assert_eq!(e, ResponseError::RebalanceInProgress),
            }
        }

        /// Heartbeats; joins again when told to.
        async fn beat(&mut self, c: &GroupCoordinator) {
            match c.heartbeat("g", self.generation, &self.id, None) {
                Ok(()) => {}
                Err(ResponseError::RebalanceInProgress) => self.rejoin(c).await,
                Err(e) => panic!("{}: {e:?}", self.id),
            }
        }
    }

    /// A consumer-protocol member.
    struct Modern {
        id: String,
        epoch: i32,
        owned: Assignment,
    }

    impl Modern {
        async fn beat(&mut self, c: &GroupCoordinator) {
            let hb = Heartbeat {
                member_id: self.id.clone(),
                member_epoch: self.epoch,
                rebalance_timeout_ms: REBALANCE_MS,
                subscribed_names: Some(vec!["t".into()]),
                owned: Some(self.owned.clone()),
                ..Heartbeat::default()
            };
            let a = c.consumer_heartbeat("g", hb, &topics()).await.unwrap();
            self.epoch = a.member_epoch;
            if let Some(assignment) = a.assignment {
                self.owned = assignment;
            }
        }

        fn partitions(&self) -> Vec<i32> {
            self.owned
                .get(&TOPIC_ID)
                .map(|p| p.iter().copied().collect())
                .unwrap_or_default()
        }
    }

    /// Two classic members holding three partitions each, in a Stable
    /// classic group.
    async fn classic_group(h: &Harness) -> Vec<Classic> {
        let c = &h.coordinator;
        let mut ids = Vec::new();
        let mut joins = Vec::new();
        for _ in 0..2 {
            let first = c.join("g", classic_params("", &[]), &topics()).await;
            assert_eq!(first.error, Some(ResponseError::MemberIdRequired));
            let cc = Arc::clone(c);
            let id = first.member_id.clone();
            joins.push(tokio::spawn(async move {
                cc.join("g", classic_params(&id, &[]), &topics()).await
            }));
            ids.push(first.member_id);
            settle().await;
        }
        h.advance(i64::from(DELAY_MS)).await;
        h.advance(i64::from(DELAY_MS)).await;
        let mut results = Vec::new();
        for j in joins {
            results.push(j.await.unwrap());
        }
        let leader = results
            .iter()
            .find(|r| r.member_id == r.leader)
            .unwrap()
            .leader
            .clone();
        let shares: Vec<(String, Bytes)> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let ps: Vec<i32> = (0..6).filter(|p| p % 2 == i as i32).collect();
                (
                    id.clone(),
                    embedded::encode_assignment(3, &vec![("t".into(), ps)]),
                )
            })
            .collect();
        let mut syncs = Vec::new();
        for r in &results {
            let cc = Arc::clone(c);
            let a = if r.member_id == leader {
                shares.clone()
            } else {
                vec![]
            };
            let (g, id) = (r.generation, r.member_id.clone());
            syncs.push(tokio::spawn(async move {
                cc.sync("g", g, &id, None, (None, None), a, &topics()).await
            }));
        }
        for s in syncs {
            s.await.unwrap().unwrap();
        }
        assert_eq!(h.state(), GroupState::Stable);
        results
            .iter()
            .map(|r| Classic {
                id: r.member_id.clone(),
                generation: r.generation,
                owned: ids
                    .iter()
                    .position(|id| *id == r.member_id)
                    .map(|i| (0..6).filter(|p| p % 2 == i as i32).collect())
                    .unwrap(),
            })
            .collect()
    }

    /// No partition is held by two members, as the clients see it.
    fn disjoint(classic: &[Classic], modern: &Modern) -> Vec<i32> {
        let mut all: Vec<i32> = classic.iter().flat_map(|c| c.owned.clone()).collect();
        all.extend(modern.partitions());
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n, "a partition held twice");
        all
    }

    #[tokio::test]
    async fn a_classic_group_upgrades_hosts_its_members_and_downgrades_when_the_last_consumer_member_leaves()
    {
        let h = Harness::new();
        let c = &h.coordinator;
        let mut classic = classic_group(&h).await;
        let generation = classic[0].generation;
        let mut modern = Modern {
            id: "modern".into(),
            epoch: 0,
            owned: Assignment::new(),
        };
        modern.beat(c).await;
        // Upgraded: the classic members are hosted at their generation
        // with the partitions they held.
        let g = c.describe_consumer("g").unwrap();
        assert_eq!(g.members.len(), 3);
        for m in &classic {
            let hosted = &g.members[&m.id];
            assert!(hosted.classic.is_some());
            assert_eq!(hosted.epoch, generation);
            assert_eq!(hosted.assigned[&TOPIC_ID].len(), 3);
        }
        assert!(c.describe("g").is_none(), "no classic group any more");
        assert!(modern.epoch > generation && modern.partitions().is_empty());

        // Everyone heartbeats until the group is stable: two partitions
        // each, never one partition in two hands.
        for _ in 0..10 {
            for i in 0..classic.len() {
                classic[i].beat(c).await;
                disjoint(&classic, &modern);
            }
            modern.beat(c).await;
            disjoint(&classic, &modern);
        }
        let g = c.describe_consumer("g").unwrap();
        assert_eq!(g.state(), crate::groups::consumer::ConsumerGroupState::Stable);
        assert_eq!(disjoint(&classic, &modern), (0..6).collect::<Vec<_>>());
        assert!(classic.iter().all(|m| m.owned.len() == 2) && modern.partitions().len() == 2);
        // A classic member commits with its generation, its epoch.
        let epoch = classic[0].generation;
        assert_eq!(c.admit_consumer_commit("g", &classic[0].id, epoch), Some(Ok(())));
        assert_eq!(
            c.admit_consumer_commit("g", &classic[0].id, epoch - 1),
            Some(Err(ResponseError::IllegalGeneration))
        );

        // The consumer member leaves: a classic group again, which
        // rebalances at the next generation.
        let leave = Heartbeat {
            member_id: "modern".into(),
            member_epoch: crate::groups::consumer::LEAVE_EPOCH,
            ..Heartbeat::default()
        };
        c.consumer_heartbeat("g", leave, &topics()).await.unwrap();
        assert_eq!(h.state(), GroupState::PreparingRebalance);
        let epoch = g.epoch + 1;
        assert_eq!(
            c.heartbeat("g", epoch, &classic[0].id, None),
            Err(ResponseError::RebalanceInProgress)
        );
        let rejoins: Vec<_> = classic
            .iter()
            .map(|m| {
                let cc = Arc::clone(c);
                let id = m.id.clone();
                tokio::spawn(async move { cc.join("g", classic_params(&id, &[]), &topics()).await })
            })
            .collect();
        settle().await;
        let mut again = Vec::new();
        for j in rejoins {
            again.push(j.await.unwrap());
        }
        assert!(
            again
                .iter()
                .all(|r| r.error.is_none() && r.generation == epoch + 1),
            "{again:?}"
        );
        assert_eq!(again.iter().filter(|r| r.member_id == r.leader).count(), 1);
    }

    #[tokio::test]
    async fn a_consumer_member_whose_session_ends_leaves_a_classic_group_behind() {
        let h = Harness::new();
        let c = &h.coordinator;
        let mut classic = classic_group(&h).await;
        let mut modern = Modern {
            id: "modern".into(),
            epoch: 0,
            owned: Assignment::new(),
        };
        modern.beat(c).await;
        // The consumer member goes silent; the classic members go on (and
        // join again when told to).
        let session_ms =
            i64::from(crate::groups::consumer::ConsumerGroupConfig::default().session_timeout_ms);
        let mut waited = 0;
        while c.describe("g").is_none() {
            assert!(waited <= session_ms, "no downgrade after the session timeout");
            h.clock.0.fetch_add(1_000, Ordering::SeqCst);
            waited += 1_000;
            for m in &mut classic {
                m.beat(c).await;
            }
            h.advance(0).await;
        }
        assert!(waited >= session_ms, "{waited}");
        let d = c.describe("g").unwrap();
        assert_eq!((d.state, d.members.len()), (GroupState::PreparingRebalance, 2));
        assert!(c.describe_consumer("g").is_err());
    }

    #[tokio::test]
    async fn upgrades_follow_the_policy_and_the_protocol_type() {
        let mut h = Harness::new();
        h.config.consumer.migration = MigrationPolicy::Downgrade;
        h.reopen();
        classic_group(&h).await;
        let join = Heartbeat {
            member_id: "modern".into(),
            member_epoch: 0,
            rebalance_timeout_ms: REBALANCE_MS,
            subscribed_names: Some(vec!["t".into()]),
            owned: Some(Assignment::new()),
            ..Heartbeat::default()
        };
        let refused = h
            .coordinator
            .consumer_heartbeat("g", join.clone(), &topics())
            .await;
        assert_eq!(refused.unwrap_err().0, ResponseError::GroupIdNotFound);
        assert_eq!(h.state(), GroupState::Stable);

        // Allowed: the classic group's persisted metadata is tombstoned,
        // so a restart does not bring back members the consumer group
        // took over.
        h.config.consumer.migration = MigrationPolicy::Bidirectional;
        h.reopen();
        assert_eq!(h.state(), GroupState::Stable, "restored from its metadata");
        h.coordinator
            .consumer_heartbeat("g", join, &topics())
            .await
            .unwrap();
        h.reopen();
        assert!(h.coordinator.describe("g").is_none());
        // The consumer group, with the classic members it hosts, is in the
        // log instead.
        let g = h.coordinator.describe_consumer("g").unwrap();
        assert_eq!(g.members.values().filter(|m| m.classic.is_some()).count(), 2);
    }

    #[tokio::test]
    async fn hosted_members_get_kafkas_errors() {
        let h = Harness::new();
        let c = &h.coordinator;
        let classic = classic_group(&h).await;
        let mut modern = Modern {
            id: "modern".into(),
            epoch: 0,
            owned: Assignment::new(),
        };
        modern.beat(c).await;
        let m = &classic[0];
        assert_eq!(
            c.heartbeat("g", m.generation + 7, &m.id, None),
            Err(ResponseError::IllegalGeneration)
        );
        assert_eq!(
            c.heartbeat("g", 1, "nobody", None),
            Err(ResponseError::UnknownMemberId)
        );
        // The consumer member is not a classic one.
        assert_eq!(
            c.heartbeat("g", modern.epoch, "modern", None),
            Err(ResponseError::UnknownMemberId)
        );
        let sync = c
            .sync(
                "g",
                m.generation,
                &m.id,
                None,
                (Some("connect"), None),
                vec![],
                &topics(),
            )
            .await;
        assert_eq!(sync.unwrap_err(), ResponseError::InconsistentGroupProtocol);
        // A JoinGroup of another protocol type is refused.
        let other = JoinParams {
            protocol_type: "connect".into(),
            ..classic_params(&m.id, &[])
        };
        let r = c.join("g", other, &topics()).await;
        assert_eq!(r.error, Some(ResponseError::InconsistentGroupProtocol));
        // So is one whose embedded subscription does not parse: truncated,
        // or claiming two billion topics in six bytes.
        for junk in [&b"\x00"[..], &[0, 0, 0x7f, 0xff, 0xff, 0xff]] {
            let bad = JoinParams {
                protocols: vec![("range".into(), Bytes::copy_from_slice(junk))],
                ..classic_params(&m.id, &[])
            };
            let r = c.join("g", bad, &topics()).await;
            assert_eq!(r.error, Some(ResponseError::InconsistentGroupProtocol));
        }
        // Leaving by member id.
        assert_eq!(
            c.leave("g", &[(m.id.clone(), None)], &topics()).await,
            vec![Ok(())]
        );
        assert_eq!(c.describe_consumer("g").unwrap().members.len(), 2);
    }
}

// Consumer groups in the group log: members go on at their epochs after a
// restart.

mod persistence {
    use super::*;
    use crate::groups::consumer::{Assignment, ConsumerGroupState, TopicInfo, LEAVE_EPOCH};

    fn topics() -> Topics {
        Topics::from([(
            "t".to_string(),
            TopicInfo {
                id: uuid::Uuid::from_u128(3),
                partitions: 4,
            },
        )])
    }

    async fn beat(h: &Harness, id: &str, epoch: i32, owned: &Assignment) -> HeartbeatAnswer {
        let hb = Heartbeat {
            member_id: id.into(),
            member_epoch: epoch,
            rebalance_timeout_ms: REBALANCE_MS,
            subscribed_names: Some(vec!["t".into()]),
            server_assignor: (epoch == 0).then(|| "range".to_string()),
            owned: Some(owned.clone()),
            ..Heartbeat::default()
        };
        h.coordinator
            .consumer_heartbeat("g", hb, &topics())
            .await
            .unwrap()
    }

    /// Two members heartbeat until the group is stable: -> their epochs
    /// and partitions.
    async fn stable(h: &Harness) -> Vec<(String, i32, Assignment)> {
        let mut members: Vec<(String, i32, Assignment)> = vec![
            ("a".into(), 0, Assignment::new()),
            ("b".into(), 0, Assignment::new()),
        ];
        for _ in 0..4 {
            for (id, epoch, owned) in &mut members {
                let a = beat(h, id, *epoch, owned).await;
                *epoch = a.member_epoch;
                if let Some(assignment) = a.assignment {
                    *owned = assignment;
                }
            }
        }
        let g = h.coordinator.describe_consumer("g").unwrap();
        assert_eq!(g.state(), ConsumerGroupState::Stable);
        members
    }

    #[tokio::test]
    async fn members_go_on_at_their_epochs_after_a_reopen() {
        let mut h = Harness::new();
        let members = stable(&h).await;
        let before = h.coordinator.describe_consumer("g").unwrap();
        h.reopen();
        let after = h.coordinator.describe_consumer("g").unwrap();
        assert_eq!(
            (after.epoch, after.assignment_epoch),
            (before.epoch, before.assignment_epoch)
        );
        assert_eq!(after.assignor, before.assignor);
        for (id, m) in &before.members {
            let back = &after.members[id];
            assert_eq!(
                (back.epoch, &back.assigned, back.state),
                (m.epoch, &m.assigned, m.state)
            );
            assert_eq!(after.target[id], before.target[id]);
            assert_eq!(
                (&back.subscribed_names, &back.server_assignor),
                (&m.subscribed_names, &m.server_assignor)
            );
        }
        // Their next heartbeats are answered at the same epochs: no
        // rebalance, as the topics have not changed.
        for (id, epoch, owned) in &members {
            let a = beat(&h, id, *epoch, owned).await;
            assert_eq!(a.member_epoch, *epoch);
        }
        assert_eq!(h.coordinator.describe_consumer("g").unwrap().epoch, before.epoch);
    }

    #[tokio::test]
    async fn a_topic_that_grew_while_down_moves_the_epoch() {
        let mut h = Harness::new();
        let members = stable(&h).await;
        let epoch = h.coordinator.describe_consumer("g").unwrap().epoch;
        h.reopen();
        let mut grown = topics();
        grown.get_mut("t").unwrap().partitions = 6;
        let (id, member_epoch, owned) = &members[0];
        let hb = Heartbeat {
            member_id: id.clone(),
            member_epoch: *member_epoch,
            owned: Some(owned.clone()),
            ..Heartbeat::default()
        };
        h.coordinator.consumer_heartbeat("g", hb, &grown).await.unwrap();
        assert_eq!(h.coordinator.describe_consumer("g").unwrap().epoch, epoch + 1);
    }

    #[tokio::test]
    async fn an_empty_group_stays_until_deleted_and_its_records_go_with_it() {
        let mut h = Harness::new();
        let members = stable(&h).await;
        for (id, _, _) in &members {
            beat(&h, id, LEAVE_EPOCH, &Assignment::new()).await;
        }
        h.reopen();
        let g = h.coordinator.describe_consumer("g").unwrap();
        assert_eq!(g.state(), ConsumerGroupState::Empty);
        assert_eq!(
            h.coordinator.delete_groups(&["g".to_string()]).await,
            vec![Ok(())]
        );
        h.reopen();
        assert!(h.coordinator.describe_consumer("g").is_err());
        assert!(h.coordinator.store.with_table(|t| t.consumer.is_empty()));
    }

    #[tokio::test]
    async fn a_member_whose_session_ended_is_gone_from_the_log() {
        let mut h = Harness::new();
        stable(&h).await;
        let session_ms = crate::groups::consumer::ConsumerGroupConfig::default().session_timeout_ms;
        h.advance(i64::from(session_ms) + 1).await;
        assert!(h.coordinator.describe_consumer("g").unwrap().members.is_empty());
        h.reopen();
        let g = h.coordinator.describe_consumer("g").unwrap();
        assert!(g.members.is_empty() && g.target.is_empty());
    }
}
