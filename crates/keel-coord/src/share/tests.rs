//! The share partition against a model: random acquisitions,
//! acknowledgements, lock expiries and releases by several members, each
//! checked against a plain map of every offset's state. A failure prints
//! its seed; `KEEL_TEST_SEED=<seed>` replays it.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::partition::*;

/// xorshift64*: deterministic, seedable, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Rec {
    state: RecordState,
    deliveries: i16,
    owner: Option<usize>,
    deadline_ms: i64,
}

/// Every offset of the log, with what the model says of it.
struct Model {
    /// The log's batches, in order.
    batches: Vec<BatchSpan>,
    recs: BTreeMap<i64, Rec>,
    limits: ShareLimits,
}

impl Model {
    fn log_end(&self) -> i64 {
        self.batches.last().map_or(0, |b| b.last_offset + 1)
    }

    fn expire(&mut self, now_ms: i64) {
        let limit = self.limits.delivery_limit;
        for r in self.recs.values_mut() {
            if r.state == RecordState::Acquired && r.deadline_ms <= now_ms {
                release(r, limit);
            }
        }
    }

    /// The batches a read from `offset` returns: the one holding it and
    /// up to `n - 1` after.
    fn read(&self, offset: i64, n: usize) -> Vec<BatchSpan> {
        self.batches
            .iter()
            .filter(|b| b.last_offset >= offset)
            .take(n)
            .copied()
            .collect()
    }
}

fn release(r: &mut Rec, limit: i16) {
    r.state = if r.deliveries >= limit {
        RecordState::Archived
    } else {
        RecordState::Available
    };
    r.owner = None;
}

fn seed() -> u64 {
    std::env::var("KEEL_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
        | 1
}

/// The partition agrees with the model on every in-flight record, its
/// start offset is the first record not done with, and no record went
/// past the delivery limit.
fn check(sp: &SharePartition, m: &Model, step: usize) {
    let first_open = m
        .recs
        .iter()
        .find(|(_, r)| !matches!(r.state, RecordState::Acknowledged | RecordState::Archived))
        .map(|(o, _)| *o);
    let end = sp.end_offset();
    assert_eq!(
        sp.start_offset(),
        first_open.unwrap_or(end).min(end),
        "step {step}: start offset"
    );
    for (&offset, r) in m.recs.range(sp.start_offset()..end) {
        assert_eq!(
            sp.record(offset),
            Some((r.state, r.deliveries)),
            "step {step}: offset {offset}"
        );
    }
    for r in m.recs.values() {
        assert!(r.deliveries <= m.limits.delivery_limit, "step {step}: {r:?}");
    }
    for (&offset, r) in m.recs.range(..sp.start_offset()) {
        assert!(
            matches!(r.state, RecordState::Acknowledged | RecordState::Archived),
            "step {step}: offset {offset} below the start offset is {r:?}"
        );
    }
}

fn run(seed: u64, steps: usize) {
    let mut rng = Rng(seed);
    let limits = ShareLimits {
        delivery_limit: 2 + rng.below(4) as i16,
        lock_ms: 1000,
        max_in_flight: 8 + rng.below(40) as usize,
    };
    let members: Vec<Arc<str>> = (0..3).map(|i| Arc::from(format!("m{i}"))).collect();
    let mut sp = SharePartition::new(0);
    let mut m = Model {
        batches: Vec::new(),
        recs: BTreeMap::new(),
        limits,
    };
    let mut now_ms = 0i64;
    for step in 0..steps {
        let who = rng.below(members.len() as u64) as usize;
        match rng.below(10) {
            // Produce a batch (sometimes after a gap the log no longer has).
            0 | 1 => {
                let gap = if rng.below(5) == 0 { rng.below(3) as i64 } else { 0 };
                let base = m.log_end() + gap;
                let last = base + rng.below(6) as i64;
                m.batches.push(BatchSpan {
                    base_offset: base,
                    last_offset: last,
                });
            }
            // Fetch.
            2..=4 => {
                m.expire(now_ms);
                let Some(from) = sp.next_fetch_offset(&limits, now_ms) else {
                    let in_flight = (sp.end_offset() - sp.start_offset()) as usize;
                    let available = m.recs.values().any(|r| r.state == RecordState::Available);
                    assert!(
                        !available,
                        "step {step}: a record is available but none acquirable"
                    );
                    assert!(in_flight >= limits.max_in_flight, "step {step}");
                    continue;
                };
                if from < sp.end_offset() {
                    assert_eq!(
                        m.recs.get(&from).map(|r| r.state),
                        Some(RecordState::Available),
                        "step {step}: fetch from {from}"
                    );
                }
                let batches = m.read(from, 1 + rng.below(3) as usize);
                let max_records = 1 + rng.below(12) as usize;
                let end_before = sp.end_offset();
                let got = sp.acquire(
                    &members[who],
                    LogRead::of(from, &batches),
                    max_records,
                    &limits,
                    now_ms,
                );
                // Offsets the log skipped are archived, never delivered.
                let in_log = |o: i64| {
                    m.batches
                        .iter()
                        .any(|b| (b.base_offset..=b.last_offset).contains(&o))
                };
                let gaps: Vec<i64> = (end_before..sp.end_offset()).filter(|o| !in_log(*o)).collect();
                for gap in gaps {
                    m.recs.entry(gap).or_insert(Rec {
                        state: RecordState::Archived,
                        deliveries: 0,
                        owner: None,
                        deadline_ms: 0,
                    });
                }
                for a in &got {
                    for offset in a.first_offset..=a.last_offset {
                        let r = m.recs.entry(offset).or_insert(Rec {
                            state: RecordState::Available,
                            deliveries: 0,
                            owner: None,
                            deadline_ms: 0,
                        });
                        assert_eq!(r.state, RecordState::Available, "step {step}: acquired {offset}");
                        assert_eq!(r.deliveries + 1, a.delivery_count, "step {step}: {offset}");
                        r.state = RecordState::Acquired;
                        r.deliveries += 1;
                        r.owner = Some(who);
                        r.deadline_ms = now_ms + limits.lock_ms;
                    }
                }
                // A read from where the partition said acquires something,
                // unless new records lie past a gap that does not fit in
                // what is left of the in-flight limit.
                let past_gap = from >= end_before && batches.first().is_some_and(|b| b.base_offset > from);
                assert!(
                    batches.is_empty() || !got.is_empty() || past_gap,
                    "step {step}: nothing acquired from {from}"
                );
            }
            // Acknowledge: usually a range the member holds, sometimes any.
            5..=7 => {
                m.expire(now_ms);
                let held: Vec<i64> = m
                    .recs
                    .iter()
                    .filter(|(_, r)| r.owner == Some(who))
                    .map(|(o, _)| *o)
                    .collect();
                let (first, last) = if !held.is_empty() && rng.below(5) != 0 {
                    let first = held[rng.below(held.len() as u64) as usize];
                    let mut last = first;
                    while held.contains(&(last + 1)) && rng.below(3) != 0 {
                        last += 1;
                    }
                    (first, last)
                } else {
                    let first = rng.below(m.log_end().max(1) as u64 + 2) as i64;
                    (first, first + rng.below(3) as i64)
                };
                let pick = |rng: &mut Rng| match rng.below(4) {
                    0 => AckType::Accept,
                    1 => AckType::Release,
                    2 => AckType::Reject,
                    _ => AckType::Renew,
                };
                let types: Vec<AckType> = if rng.below(2) == 0 {
                    vec![pick(&mut rng)]
                } else {
                    (first..=last).map(|_| pick(&mut rng)).collect()
                };
                // Records below the start offset are done with: skipped.
                let start = m
                    .recs
                    .iter()
                    .find(|(_, r)| !matches!(r.state, RecordState::Acknowledged | RecordState::Archived))
                    .map_or(sp.end_offset(), |(o, _)| *o)
                    .min(sp.end_offset());
                let expect_ok = (first..=last).all(|o| {
                    o < start
                        || m.recs
                            .get(&o)
                            .is_some_and(|r| r.state == RecordState::Acquired && r.owner == Some(who))
                });
                let result = sp.acknowledge(&members[who], first, last, &types, &limits, now_ms);
                assert_eq!(
                    result.is_ok(),
                    expect_ok,
                    "step {step}: ack {first}..={last}: {result:?}"
                );
                if expect_ok {
                    for (i, o) in (first..=last).enumerate().filter(|(_, o)| *o >= start) {
                        let ack = if types.len() == 1 { types[0] } else { types[i] };
                        let r = m.recs.get_mut(&o).expect("held");
                        match ack {
                            AckType::Accept => {
                                r.state = RecordState::Acknowledged;
                                r.owner = None;
                            }
                            AckType::Reject | AckType::Gap => {
                                r.state = RecordState::Archived;
                                r.owner = None;
                            }
                            AckType::Release => release(r, limits.delivery_limit),
                            AckType::Renew => r.deadline_ms = now_ms + limits.lock_ms,
                        }
                    }
                }
            }
            // Time passes; sometimes a lock runs out.
            8 => {
                now_ms += rng.below(700) as i64;
                m.expire(now_ms);
                sp.expire(&limits, now_ms);
            }
            // A member's session closes.
            _ => {
                for r in m.recs.values_mut().filter(|r| r.owner == Some(who)) {
                    if r.state == RecordState::Acquired {
                        release(r, limits.delivery_limit);
                    }
                }
                sp.release_member(&members[who], &limits);
            }
        }
        check(&sp, &m, step);
    }
}

#[test]
fn a_share_partition_agrees_with_its_model() {
    let seed = seed();
    println!("share partition model seed {seed} (replay with KEEL_TEST_SEED={seed})");
    for round in 0..40 {
        run(seed.wrapping_add(round * 7919), 600);
    }
}

/// Keeps fetching and accepting until every record is done: each record
/// of the log ends acknowledged, none was delivered twice.
#[test]
fn consumers_that_accept_everything_drain_the_log_once() {
    let limits = ShareLimits::default();
    let members: Vec<Arc<str>> = vec![Arc::from("a"), Arc::from("b")];
    let mut sp = SharePartition::new(0);
    let batches: Vec<BatchSpan> = (0..50)
        .map(|i| BatchSpan {
            base_offset: i * 10,
            last_offset: i * 10 + 9,
        })
        .collect();
    let mut delivered = 0;
    for round in 0.. {
        let member = &members[round % 2];
        let Some(from) = sp.next_fetch_offset(&limits, 0) else {
            break;
        };
        let read: Vec<BatchSpan> = batches
            .iter()
            .filter(|b| b.last_offset >= from)
            .take(3)
            .copied()
            .collect();
        if read.is_empty() {
            break;
        }
        for a in sp.acquire(member, LogRead::of(from, &read), 25, &limits, 0) {
            assert_eq!(a.delivery_count, 1);
            delivered += a.last_offset - a.first_offset + 1;
            sp.acknowledge(
                member,
                a.first_offset,
                a.last_offset,
                &[AckType::Accept],
                &limits,
                0,
            )
            .expect("held");
        }
    }
    assert_eq!(delivered, 500);
    assert_eq!(sp.start_offset(), 500);
    assert_eq!(sp.counts(), ShareCounts::default());
}

/// A record released at every delivery is archived at the limit, and a
/// lock left to run out counts as a delivery too.
#[test]
fn a_record_is_archived_at_the_delivery_limit() {
    let limits = ShareLimits {
        delivery_limit: 3,
        lock_ms: 100,
        max_in_flight: 100,
    };
    let m: Arc<str> = Arc::from("m");
    let mut sp = SharePartition::new(5);
    let batch = [BatchSpan {
        base_offset: 0,
        last_offset: 9,
    }];
    let got = sp.acquire(&m, LogRead::of(5, &batch), 100, &limits, 0);
    assert_eq!(
        got,
        vec![Acquired {
            first_offset: 5,
            last_offset: 9,
            delivery_count: 1
        }]
    );
    sp.acknowledge(&m, 5, 9, &[AckType::Release], &limits, 0)
        .expect("held");
    // The second delivery's lock runs out.
    assert_eq!(sp.next_fetch_offset(&limits, 0), Some(5));
    assert_eq!(
        sp.acquire(&m, LogRead::of(5, &batch), 100, &limits, 0)[0].delivery_count,
        2
    );
    assert_eq!(sp.next_deadline_ms(), Some(100));
    assert_eq!(sp.next_fetch_offset(&limits, 99), Some(10));
    assert_eq!(sp.next_fetch_offset(&limits, 100), Some(5));
    assert_eq!(sp.counts().lock_expiries, 5);
    // An acknowledgement after the lock ran out is refused.
    assert!(matches!(
        sp.acknowledge(&m, 5, 5, &[AckType::Accept], &limits, 100),
        Err(AckError::InvalidRecordState(_))
    ));
    let third = sp.acquire(&m, LogRead::of(5, &batch), 100, &limits, 100);
    assert_eq!(third[0].delivery_count, 3);
    assert_eq!(sp.counts().redeliveries, 10);
    sp.acknowledge(&m, 5, 9, &[AckType::Release], &limits, 100)
        .expect("held");
    assert_eq!(sp.start_offset(), 10, "archived at the limit");
    assert_eq!(sp.counts().archived_at_limit, 5);
    assert!(sp
        .acquire(&m, LogRead::of(10, &batch), 100, &limits, 100)
        .is_empty());
}

/// New records stop at the in-flight limit, and resume once the start
/// offset moves; a batch may be taken in part.
#[test]
fn acquisition_stops_at_the_in_flight_limit() {
    let limits = ShareLimits {
        delivery_limit: 5,
        lock_ms: 1000,
        max_in_flight: 10,
    };
    let m: Arc<str> = Arc::from("m");
    let mut sp = SharePartition::new(0);
    let batches: Vec<BatchSpan> = (0..5)
        .map(|i| BatchSpan {
            base_offset: i * 6,
            last_offset: i * 6 + 5,
        })
        .collect();
    let got = sp.acquire(&m, LogRead::of(0, &batches), 100, &limits, 0);
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].first_offset, got[0].last_offset),
        (0, 9),
        "up to the limit"
    );
    assert_eq!(sp.next_fetch_offset(&limits, 0), None);
    sp.acknowledge(&m, 0, 5, &[AckType::Accept], &limits, 0)
        .expect("held");
    assert_eq!(sp.next_fetch_offset(&limits, 0), Some(10));
    let got = sp.acquire(&m, LogRead::of(10, &batches[1..]), 100, &limits, 0);
    assert_eq!((got[0].first_offset, got[0].last_offset), (10, 15));
    // Per-offset types: a gap, an accept, a reject.
    let types = [AckType::Gap, AckType::Accept, AckType::Reject, AckType::Accept];
    assert!(matches!(
        sp.acknowledge(&m, 12, 14, &types, &limits, 0),
        Err(AckError::InvalidRequest(_))
    ));
    assert!(matches!(
        sp.acknowledge(&Arc::from("other"), 12, 15, &types, &limits, 0),
        Err(AckError::InvalidRecordState(_))
    ));
    sp.acknowledge(&m, 12, 15, &types, &limits, 0).expect("held");
    assert_eq!(sp.record(12), Some((RecordState::Archived, 1)));
    assert_eq!(sp.record(13), Some((RecordState::Acknowledged, 1)));
}

/// Released records the cleaner then removed from the log are archived
/// when a read passes over them, so the start offset moves on.
#[test]
fn records_compacted_away_after_a_release_are_archived() {
    let limits = ShareLimits::default();
    let m: Arc<str> = Arc::from("m");
    let mut sp = SharePartition::new(0);
    let before = [
        BatchSpan {
            base_offset: 0,
            last_offset: 4,
        },
        BatchSpan {
            base_offset: 5,
            last_offset: 9,
        },
    ];
    sp.acquire(&m, LogRead::of(0, &before), 100, &limits, 0);
    sp.acknowledge(&m, 0, 9, &[AckType::Release], &limits, 0)
        .expect("held");
    assert_eq!(sp.next_fetch_offset(&limits, 0), Some(0));
    // The cleaner removed 0..=4 and kept 7 of the second batch.
    let after = [
        BatchSpan {
            base_offset: 5,
            last_offset: 9,
        },
        BatchSpan {
            base_offset: 12,
            last_offset: 12,
        },
    ];
    let got = sp.acquire(&m, LogRead::of(0, &after), 100, &limits, 0);
    assert_eq!(sp.start_offset(), 5, "0..=4 archived");
    assert_eq!(
        got,
        vec![
            Acquired {
                first_offset: 5,
                last_offset: 9,
                delivery_count: 2
            },
            Acquired {
                first_offset: 12,
                last_offset: 12,
                delivery_count: 1
            }
        ]
    );
    assert_eq!(sp.record(10), Some((RecordState::Archived, 0)), "a gap");
}

/// A compaction gap wider than the in-flight limit costs no slots: with
/// nothing in flight the start moves past it; with records in flight
/// before it, acquisition waits until they are done.
#[test]
fn a_wide_gap_in_the_log_takes_no_slots() {
    let limits = ShareLimits {
        delivery_limit: 5,
        lock_ms: 1000,
        max_in_flight: 100,
    };
    let m: Arc<str> = Arc::from("m");
    let mut sp = SharePartition::new(0);
    let log = [
        BatchSpan {
            base_offset: 0,
            last_offset: 4,
        },
        BatchSpan {
            base_offset: 1_000_000,
            last_offset: 1_000_004,
        },
    ];
    let got = sp.acquire(&m, LogRead::of(0, &log), 100, &limits, 0);
    assert_eq!((got.len(), got[0].last_offset), (1, 4), "stops at the gap");
    assert_eq!(sp.end_offset(), 5);
    sp.acknowledge(&m, 0, 4, &[AckType::Accept], &limits, 0)
        .expect("held");
    assert_eq!(sp.next_fetch_offset(&limits, 0), Some(5));
    let got = sp.acquire(&m, LogRead::of(5, &log[1..]), 100, &limits, 0);
    assert_eq!((got[0].first_offset, got[0].last_offset), (1_000_000, 1_000_004));
    assert_eq!((sp.start_offset(), sp.end_offset()), (1_000_000, 1_000_005));
    // Offsets far outside what is in flight are refused, without overflow.
    assert!(matches!(
        sp.acknowledge(&m, i64::MIN, i64::MAX, &[AckType::Accept], &limits, 0),
        Err(AckError::InvalidRecordState(_))
    ));
}

/// A share partition's state goes through the share log's encoding
/// unchanged; acquired records come back available with their
/// deliveries; values that are not a run of contiguous offsets are
/// refused.
#[test]
fn share_state_round_trips_and_corrupt_values_are_refused() {
    use super::store::{ShareRecord, ShareTable};
    use crate::metalog::Table;
    let limits = ShareLimits::default();
    let m: Arc<str> = Arc::from("m");
    let mut sp = SharePartition::new(10);
    let log = [BatchSpan {
        base_offset: 10,
        last_offset: 19,
    }];
    sp.acquire(&m, LogRead::of(10, &log), 100, &limits, 0);
    sp.acknowledge(&m, 12, 13, &[AckType::Accept], &limits, 0)
        .expect("held");
    sp.acknowledge(&m, 15, 15, &[AckType::Reject], &limits, 0)
        .expect("held");
    let record = ShareRecord {
        key: super::key("g", uuid::Uuid::from_u128(3), 2),
        state: Some(sp.persisted()),
    };
    let (k, v) = ShareTable::encode(&record);
    let decoded = ShareTable::decode(&k, v.as_deref()).expect("decodes");
    assert_eq!(decoded, record);
    let restored = SharePartition::restore(record.state.as_ref().expect("state"));
    assert_eq!((restored.start_offset(), restored.end_offset()), (10, 20));
    assert_eq!(restored.record(11), Some((RecordState::Available, 1)));
    assert_eq!(restored.record(12), Some((RecordState::Acknowledged, 1)));
    assert_eq!(restored.record(15), Some((RecordState::Archived, 1)));
    // A run that leaves a hole, and one that spans too far.
    let mut bad = v.expect("value").to_vec();
    let first_run_at = 2 + 8 + 4 + 4;
    bad[first_run_at..first_run_at + 8].copy_from_slice(&11i64.to_be_bytes());
    assert!(ShareTable::decode(&k, Some(&bad)).is_err());
    let mut huge = sp.persisted();
    huge.runs.last_mut().expect("a run").last_offset = 1 << 40;
    let (_, v) = ShareTable::encode(&ShareRecord {
        key: record.key.clone(),
        state: Some(huge),
    });
    assert!(ShareTable::decode(&k, v.as_deref()).is_err());
}

/// A request's batches for one partition are applied all or none, must
/// be in order without overlap, and those below the start offset are
/// skipped.
#[test]
fn acknowledgement_batches_apply_all_or_none() {
    let limits = ShareLimits::default();
    let m: Arc<str> = Arc::from("m");
    let mut sp = SharePartition::new(0);
    let log = [BatchSpan {
        base_offset: 0,
        last_offset: 9,
    }];
    sp.acquire(&m, LogRead::of(0, &log), 100, &limits, 0);
    let accept: &[AckType] = &[AckType::Accept];
    // The second batch names a record not acquired: nothing is applied.
    assert!(sp
        .acknowledge_all(&m, &[(0, 2, accept), (8, 12, accept)], &limits, 0)
        .is_err());
    assert_eq!(sp.record(0), Some((RecordState::Acquired, 1)));
    assert!(matches!(
        sp.acknowledge_all(&m, &[(3, 5, accept), (5, 6, accept)], &limits, 0),
        Err(AckError::InvalidRequest(_))
    ));
    sp.acknowledge_all(&m, &[(0, 2, accept), (4, 5, accept)], &limits, 0)
        .expect("held");
    assert_eq!(sp.start_offset(), 3);
    // Below the start offset: skipped; across it: the rest applied.
    sp.acknowledge_all(&m, &[(0, 1, accept), (2, 3, accept)], &limits, 0)
        .expect("held");
    assert_eq!(sp.start_offset(), 6);
}

mod groups {
    use super::super::group::*;
    use crate::groups::consumer::{Assignment, TopicInfo, Topics};
    use keel_protocol::ResponseError;
    use uuid::Uuid;

    fn hb(member: &str, epoch: i32, topics: Option<&[&str]>) -> ShareHeartbeat {
        ShareHeartbeat {
            member_id: member.into(),
            member_epoch: epoch,
            rack_id: None,
            subscribed: topics.map(|t| t.iter().map(|s| s.to_string()).collect()),
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
        }
    }

    fn partitions(a: &crate::groups::consumer::Assignment) -> usize {
        a.values().map(|p| p.len()).sum()
    }

    fn member(id: &str) -> ShareMember {
        ShareMember {
            member_id: id.into(),
            epoch: 1,
            previous_epoch: 0,
            rack_id: None,
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            subscribed: ["t".to_string()].into(),
            assignment: Default::default(),
            last_heartbeat_ms: 0,
        }
    }

    /// The `simple` assignor as members join and leave at random, over
    /// topics of random sizes: every partition has its sharing of members
    /// (exactly one while members are no more than partitions) and shares
    /// differ by at most one. It is sticky: while members are no more
    /// than partitions, a join only takes partitions from the others (each
    /// keeps part of what it held) and a leave only gives the leaver's
    /// partitions to the others (each keeps all it held).
    #[test]
    fn the_simple_assignor_balances_and_moves_as_little_as_it_can() {
        let seed = super::seed();
        println!("share assignor seed {seed} (replay with KEEL_TEST_SEED={seed})");
        let mut rng = super::Rng(seed);
        let id = Uuid::from_u128(1);
        for _ in 0..300 {
            let n = 1 + rng.below(10) as usize;
            let topics: Topics = [(
                "t".to_string(),
                TopicInfo {
                    id,
                    partitions: n as i32,
                },
            )]
            .into();
            let mut members = std::collections::BTreeMap::new();
            let mut before = std::collections::BTreeMap::new();
            for _ in 0..30 {
                let old = members.len();
                let joined = members.is_empty() || rng.below(3) > 0 && members.len() < 2 * n + 2;
                if joined {
                    let m = format!("m{}", rng.below(1000));
                    members.insert(m.clone(), member(&m));
                } else {
                    let k = rng.below(members.len() as u64) as usize;
                    let gone = members.keys().nth(k).cloned().expect("k < len");
                    members.remove(&gone);
                }
                let after = assign(&members, &topics, &before);
                let m = members.len();
                let held = |a: &std::collections::BTreeMap<String, Assignment>, who: &str| {
                    a.get(who).and_then(|t| t.get(&id)).cloned().unwrap_or_default()
                };
                let counts: Vec<usize> = members.keys().map(|k| held(&after, k).len()).collect();
                let mut holders = vec![0usize; n];
                for k in members.keys() {
                    for p in held(&after, k) {
                        holders[p as usize] += 1;
                    }
                }
                if m == 0 {
                    before = after;
                    continue;
                }
                let (lo, hi) = (counts.iter().min(), counts.iter().max());
                assert!(
                    hi.zip(lo).is_some_and(|(h, l)| h - l <= 1),
                    "seed {seed}: {counts:?}"
                );
                let sharing = m.div_ceil(n);
                if m <= n {
                    assert!(holders.iter().all(|&h| h == 1), "seed {seed}: {holders:?}");
                } else {
                    assert!(
                        holders.iter().all(|&h| (1..=sharing).contains(&h)),
                        "seed {seed}: {holders:?}"
                    );
                    assert!(counts.iter().all(|&c| c >= 1), "seed {seed}: {counts:?}");
                }
                if m <= n && old <= n && old > 0 {
                    for k in members.keys() {
                        let (was, is) = (held(&before, k), held(&after, k));
                        if joined && !was.is_empty() {
                            assert!(is.is_subset(&was), "seed {seed}: {k} held {was:?}, now {is:?}");
                        } else if !joined {
                            assert!(was.is_subset(&is), "seed {seed}: {k} held {was:?}, now {is:?}");
                        }
                    }
                }
                before = after;
            }
        }
    }

    /// Members with the same subscriptions are balanced over all their
    /// topics' partitions together, as Kafka's homogeneous case is: two
    /// members on two one-partition topics get one each; a member with
    /// other subscriptions makes it topic by topic.
    #[test]
    fn the_simple_assignor_balances_same_subscriptions_across_topics() {
        let topic = |n: u128| TopicInfo {
            id: Uuid::from_u128(n),
            partitions: 1,
        };
        let topics: Topics = [("a".to_string(), topic(1)), ("b".to_string(), topic(2))].into();
        let both = |id: &str| ShareMember {
            subscribed: ["a".to_string(), "b".to_string()].into(),
            ..member(id)
        };
        let members: std::collections::BTreeMap<String, ShareMember> =
            [("x".to_string(), both("x")), ("y".to_string(), both("y"))].into();
        let got = assign(&members, &topics, &Default::default());
        assert!(got.values().all(|a| partitions(a) == 1), "{got:?}");
        let x = ShareMember {
            subscribed: ["t".to_string(), "b".to_string()].into(),
            ..member("x")
        };
        let mixed: std::collections::BTreeMap<String, ShareMember> =
            [("x".to_string(), x), ("y".to_string(), member("y"))].into();
        let topics: Topics = [("t".to_string(), topic(3)), ("b".to_string(), topic(2))].into();
        // x alone on b; x and y (on t only) share t's one partition.
        let got = assign(&mixed, &topics, &Default::default());
        assert_eq!((partitions(&got["x"]), partitions(&got["y"])), (2, 1), "{got:?}");
    }

    /// Members join and get every partition between them (shared once
    /// they outnumber the partitions); a member whose answer was lost
    /// heartbeats with the epoch before and gets its assignment again;
    /// any other epoch is fenced; leaving and timing out reassign.
    #[test]
    fn share_group_members_join_share_and_leave() {
        let config = ShareGroupConfig::default();
        let topics: Topics = [(
            "t".to_string(),
            TopicInfo {
                id: Uuid::from_u128(1),
                partitions: 2,
            },
        )]
        .into();
        let mut g = ShareGroup::new("g");
        let a = g
            .heartbeat(hb("a", 0, Some(&["t"])), &topics, &config, 0)
            .expect("joins");
        assert_eq!(
            (a.member_epoch, a.assignment.as_ref().map(partitions)),
            (1, Some(2))
        );
        let b = g
            .heartbeat(hb("b", 0, Some(&["t"])), &topics, &config, 0)
            .expect("joins");
        assert_eq!(
            (b.member_epoch, b.assignment.as_ref().map(partitions)),
            (2, Some(1))
        );
        // a learns of epoch 2 and gives up a partition.
        let a2 = g.heartbeat(hb("a", 1, None), &topics, &config, 1).expect("stays");
        assert_eq!(
            (a2.member_epoch, a2.assignment.as_ref().map(partitions)),
            (2, Some(1))
        );
        // That answer was lost: a heartbeats with epoch 1 again.
        let again = g
            .heartbeat(hb("a", 1, None), &topics, &config, 2)
            .expect("the epoch before");
        assert_eq!((again.member_epoch, again.assignment.is_some()), (2, true));
        let quiet = g
            .heartbeat(hb("a", 2, None), &topics, &config, 3)
            .expect("current");
        assert_eq!(quiet.assignment, None);
        let fenced = g.heartbeat(hb("a", 7, None), &topics, &config, 3).unwrap_err();
        assert_eq!(fenced.0, ResponseError::FencedMemberEpoch);
        // Three members, two partitions: each partition is shared by two
        // members, so one member gets both.
        g.heartbeat(hb("c", 0, Some(&["t"])), &topics, &config, 3)
            .expect("joins");
        let targets = assign(&g.members, &topics, &Default::default());
        let mut counts: Vec<usize> = targets.values().map(partitions).collect();
        counts.sort();
        assert_eq!(counts, [1, 1, 2], "{targets:?}");
        assert_eq!(g.assigned_partitions().len(), 2);
        // b leaves; c times out.
        g.heartbeat(hb("b", LEAVE_EPOCH, None), &topics, &config, 4)
            .expect("leaves");
        let a3 = g
            .heartbeat(hb("a", 2, None), &topics, &config, 10)
            .expect("stays");
        assert_eq!(a3.member_epoch, 4);
        let gone = g.expire_members(&topics, &config, 3 + i64::from(config.session_timeout_ms));
        assert_eq!(gone, vec!["c".to_string()]);
        let a4 = g
            .heartbeat(hb("a", 4, None), &topics, &config, 50_000)
            .expect("stays");
        assert_eq!(
            (a4.member_epoch, a4.assignment.as_ref().map(partitions)),
            (5, Some(2))
        );
        let unknown = g
            .heartbeat(hb("b", 3, None), &topics, &config, 50_000)
            .unwrap_err();
        assert_eq!(unknown.0, ResponseError::UnknownMemberId);
    }
}

/// Offsets a read covered without a deliverable batch (a transaction
/// marker, an aborted transaction's records) are archived as it passes
/// them, whether records are in flight before them or not.
#[test]
fn offsets_read_without_a_deliverable_batch_are_passed() {
    let limits = ShareLimits::default();
    let m: Arc<str> = Arc::from("m");
    let mut sp = SharePartition::new(0);
    // A marker alone at 0..=0: nothing to acquire, the start moves on.
    let none: [BatchSpan; 0] = [];
    let got = sp.acquire(
        &m,
        LogRead {
            from: 0,
            to: 0,
            batches: &none,
        },
        10,
        &limits,
        0,
    );
    assert!(got.is_empty());
    assert_eq!((sp.start_offset(), sp.end_offset()), (1, 1));
    // Records 1..=3, then an aborted batch 4..=6 and its marker 7.
    let data = [BatchSpan {
        base_offset: 1,
        last_offset: 3,
    }];
    let got = sp.acquire(
        &m,
        LogRead {
            from: 1,
            to: 7,
            batches: &data,
        },
        10,
        &limits,
        0,
    );
    assert_eq!(got.len(), 1);
    assert_eq!(sp.end_offset(), 8, "4..=7 passed");
    assert_eq!(sp.record(5), Some((RecordState::Archived, 0)));
    sp.acknowledge(&m, 1, 3, &[AckType::Accept], &limits, 0)
        .expect("held");
    assert_eq!(sp.start_offset(), 8);
}

/// A fetch waiting on one group wakes for that group's releases,
/// acknowledgements and expired locks, and not for another group's.
#[test]
fn a_group_s_changes_wake_only_its_own_fetches() {
    use super::{key, AckBatch, ShareCoordinator};
    let limits = ShareLimits::default();
    let c = ShareCoordinator::in_memory();
    let m: Arc<str> = Arc::from("m");
    let topic = uuid::Uuid::from_u128(1);
    let (a, b) = (key("a", topic, 0), key("b", topic, 0));
    let log = [BatchSpan {
        base_offset: 0,
        last_offset: 9,
    }];
    // b's locks run 5 ms, a's 20.
    let lock = |ms: i64| ShareLimits {
        lock_ms: ms,
        ..limits
    };
    for (k, ms) in [(&a, 20), (&b, 5)] {
        drop(c.initialize(k.clone(), 0));
        let (got, _) = c.acquire(k, &m, LogRead::of(0, &log), 10, &lock(ms), 0);
        assert_eq!(got.len(), 1);
    }
    let mut waiting_a = c.changes("a");
    let release = |k: &super::ShareKey, first: i64| {
        let batch = AckBatch {
            first_offset: first,
            last_offset: first,
            types: vec![AckType::Release],
        };
        c.acknowledge_now(k, &m, &[batch], &limits, 0).0.expect("held");
    };
    release(&b, 0);
    assert!(!waiting_a.has_changed().expect("open"), "b's release woke a");
    release(&a, 0);
    assert!(waiting_a.has_changed().expect("open"), "a's release");
    waiting_a.borrow_and_update();
    // b's locks run out, then a's.
    let config = super::group::ShareGroupConfig::default();
    c.sweep(&Default::default, &|_| config, &|_| limits, 10);
    let expiries = |k: &super::ShareKey| {
        c.partition_stats()
            .into_iter()
            .find(|s| &s.key == k)
            .map(|s| s.counts.lock_expiries)
    };
    assert_eq!((expiries(&b), expiries(&a)), (Some(9), Some(0)));
    assert!(!waiting_a.has_changed().expect("open"), "b's expiry woke a");
    c.sweep(&Default::default, &|_| config, &|_| limits, 30);
    assert!(waiting_a.has_changed().expect("open"), "a's expiry");
}
