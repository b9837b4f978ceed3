//! The share coordinator's state across crashes and power loss, on the
//! simulated storage: two members acquire records of a simulated log and
//! accept, release or reject them, with a crash at a random storage step
//! followed by a power loss that drops everything not fsynced, and clean
//! restarts in between. After each recovery:
//! * the coordinator opens;
//! * each share partition is as it was after some write of it, in
//!   order: nothing applied out of order, half-applied or invented
//!   (records acquired then come back available, their deliveries
//!   counted);
//! * after a clean restart, every acknowledgement that was answered is
//!   there: no accepted record is delivered again;
//! * no record is acquired past the delivery limit, and a record's
//!   delivery count never goes back, across clean restarts. (A power
//!   loss may take the newest writes with it, as it may the group log's:
//!   the counts then go on from the state recovered.)
//!
//! Replay a failure with `KEEL_TEST_SEED=<seed>`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use keel_coord::share::partition::{AckType, BatchSpan, LogRead, ShareLimits, SharePartition};
use keel_coord::share::store::ShareState;
use keel_coord::share::{key, AckBatch, ShareCoordinator, ShareKey};
use keel_log::faults::{FaultEffect, FaultOp, FaultRule, FaultyStorage};
use keel_log::sim::SimStorage;
use keel_log::testing::test_seed;
use keel_log::Storage;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use uuid::Uuid;

const DIR: &str = "/data/__keel_meta/share";
const LIMITS: ShareLimits = ShareLimits {
    delivery_limit: 3,
    lock_ms: 1000,
    max_in_flight: 60,
};

/// A persisted state as a restart turns it: acquired records available.
fn restored(state: &ShareState) -> ShareState {
    SharePartition::restore(state).persisted()
}

struct Harness {
    rng: SmallRng,
    sim: SimStorage,
    faults: FaultyStorage,
    segment_bytes: u64,
    coordinator: Option<ShareCoordinator>,
    runtime: tokio::runtime::Runtime,
    keys: Vec<ShareKey>,
    /// Per key, every state written since the last recovery, in order,
    /// starting with the state that recovery found.
    written: BTreeMap<ShareKey, Vec<ShareState>>,
    /// Per key, the index in `written` a recovery may not go below.
    must_survive: BTreeMap<ShareKey, usize>,
    /// The highest delivery count each (key, offset) was acquired with.
    deliveries: BTreeMap<(ShareKey, i64), i16>,
    now_ms: i64,
    crashes: u64,
    lost_unsynced: u64,
}

/// The simulated log: batches of 1 to 5 records, back to back.
fn log_batches(from: i64, n: usize) -> Vec<BatchSpan> {
    let mut out = Vec::new();
    let mut base = 0;
    while out.len() < n {
        let len = 1 + (base % 5);
        let b = BatchSpan {
            base_offset: base,
            last_offset: base + len - 1,
        };
        if b.last_offset >= from {
            out.push(b);
        }
        base += len;
    }
    out
}

impl Harness {
    fn new(seed: u64) -> Harness {
        let mut rng = SmallRng::seed_from_u64(seed);
        let sim = SimStorage::new();
        sim.create_dir_all(Path::new("/data/__keel_meta")).unwrap();
        sim.sync_dir(Path::new("/")).unwrap();
        sim.sync_dir(Path::new("/data")).unwrap();
        let faults = FaultyStorage::new(Arc::new(sim.clone()));
        let segment_bytes = rng.gen_range(1024..8192);
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let keys: Vec<ShareKey> = (0..2).map(|p| key("g", Uuid::from_u128(7), p)).collect();
        let mut h = Harness {
            rng,
            sim,
            faults,
            segment_bytes,
            coordinator: None,
            runtime,
            keys: keys.clone(),
            written: BTreeMap::new(),
            must_survive: BTreeMap::new(),
            deliveries: BTreeMap::new(),
            now_ms: 0,
            crashes: 0,
            lost_unsynced: 0,
        };
        let c = h.open().expect("first open");
        for k in &keys {
            h.runtime
                .block_on(c.initialize(k.clone(), 0))
                .expect("initialized");
            h.written
                .insert(k.clone(), vec![c.persisted(k).expect("initialized")]);
            h.must_survive.insert(k.clone(), 1);
        }
        // A clean close makes the share partitions' first states durable
        // (the share log fsyncs only at rolls, snapshots and closes), as a
        // broker's share partitions are from some point on.
        c.close();
        drop(c);
        h.coordinator = Some(h.open().expect("reopen"));
        h
    }

    fn open(&self) -> Result<ShareCoordinator, keel_coord::metalog::OpenError> {
        ShareCoordinator::open_with(Arc::new(self.faults.clone()), Path::new(DIR), self.segment_bytes)
    }

    fn coordinator(&self) -> &ShareCoordinator {
        self.coordinator.as_ref().expect("open")
    }

    /// Notes `k`'s state after a write of it.
    /// Locks of `k` that ran out so far.
    fn lock_expiries(&self, k: &ShareKey) -> u64 {
        self.coordinator()
            .partition_stats()
            .into_iter()
            .find(|s| &s.key == k)
            .map_or(0, |s| s.counts.lock_expiries)
    }

    fn wrote(&mut self, k: &ShareKey) {
        let state = self.coordinator().persisted(k).expect("initialized");
        self.written.get_mut(k).expect("key").push(state);
    }

    fn acquire(&mut self, k: &ShareKey, member: &Arc<str>) -> Result<(), ()> {
        let max = self.rng.gen_range(1..20);
        let c = self.coordinator();
        let Some(from) = c.next_fetch_offset(k, &LIMITS, self.now_ms) else {
            return Ok(());
        };
        let batches = log_batches(from, 3);
        let (got, write) = c.acquire(k, member, LogRead::of(from, &batches), max, &LIMITS, self.now_ms);
        let outcome = self.runtime.block_on(write);
        for a in &got {
            assert!(
                a.delivery_count <= LIMITS.delivery_limit,
                "acquired past the limit: {a:?}"
            );
            for offset in a.first_offset..=a.last_offset {
                let seen = self.deliveries.entry((k.clone(), offset)).or_insert(0);
                assert!(
                    a.delivery_count > *seen,
                    "offset {offset} acquired with delivery count {} after {}",
                    a.delivery_count,
                    *seen
                );
                *seen = a.delivery_count;
            }
        }
        if !got.is_empty() {
            self.wrote(k);
        }
        self.settle(outcome.map_err(|_| ()))
    }

    fn acknowledge(&mut self, k: &ShareKey, member: &Arc<str>) -> Result<(), ()> {
        let Some(state) = self.coordinator().persisted(k) else {
            return Ok(());
        };
        let Some(run) = state.runs.iter().find(|r| r.state == 1) else {
            return Ok(());
        };
        let ack = match self.rng.gen_range(0..3) {
            0 => AckType::Accept,
            1 => AckType::Release,
            _ => AckType::Reject,
        };
        let batch = AckBatch {
            first_offset: run.first_offset,
            last_offset: run.first_offset + self.rng.gen_range(0..=(run.last_offset - run.first_offset)),
            types: vec![ack],
        };
        let expired_before = self.lock_expiries(k);
        let c = self.coordinator();
        let outcome = self
            .runtime
            .block_on(c.acknowledge(k, member, &[batch], &LIMITS, self.now_ms));
        match outcome {
            // Held by the other member: refused, and nothing written
            // unless locks ran out on the way (those are written).
            Err((keel_protocol::ResponseError::InvalidRecordState, _)) => {
                if self.lock_expiries(k) != expired_before {
                    self.wrote(k);
                }
                Ok(())
            }
            Ok(()) => {
                self.wrote(k);
                Ok(())
            }
            Err(_) => {
                self.wrote(k);
                self.settle(Err(()))
            }
        }
    }

    fn settle(&self, outcome: Result<(), ()>) -> Result<(), ()> {
        if outcome.is_err() {
            assert!(self.faults.crashed(), "a write failed without a crash");
        }
        outcome
    }

    /// Closes and reopens: every state written is there.
    fn reopen_clean(&mut self) -> Result<(), ()> {
        let c = self.coordinator.take().expect("open");
        c.close();
        drop(c);
        if self.faults.crashed() {
            return Err(());
        }
        let c = self.open().unwrap_or_else(|e| panic!("clean reopen failed: {e}"));
        for k in &self.keys {
            let last = self.written[k].last().expect("a state");
            assert_eq!(
                c.persisted(k).as_ref(),
                Some(&restored(last)),
                "a clean reopen changed {k:?}"
            );
            let n = self.written[k].len();
            self.must_survive.insert(k.clone(), n);
        }
        self.coordinator = Some(c);
        Ok(())
    }

    /// The machine loses power: reopen what survived and check it.
    fn power_loss(&mut self, seed: u64) {
        self.crashes += 1;
        if let Some(c) = self.coordinator.take() {
            c.close();
        }
        self.sim.power_loss(seed);
        self.faults.clear();
        let c = self
            .open()
            .unwrap_or_else(|e| panic!("start-up after a power loss failed: {e}"));
        for k in self.keys.clone() {
            let found = c.persisted(&k).expect("initialized before any crash");
            let written = &self.written[&k];
            let from = self.must_survive[&k].saturating_sub(1);
            let Some(at) = (from..written.len())
                .rev()
                .find(|i| restored(&written[*i]) == found)
            else {
                panic!(
                    "after a power loss {k:?} is {found:?}, none of its states written from #{from}: {:?}",
                    &written[from..]
                );
            };
            if at + 1 < written.len() {
                self.lost_unsynced += 1;
            }
            // Deliveries go on from what was recovered.
            self.deliveries.retain(|(key, _), _| *key != k);
            for r in &found.runs {
                for offset in r.first_offset..=r.last_offset {
                    self.deliveries.insert((k.clone(), offset), r.delivery_count);
                }
            }
            self.written.insert(k.clone(), vec![found]);
            self.must_survive.insert(k, 1);
        }
        self.coordinator = Some(c);
    }

    fn step(&mut self, members: &[Arc<str>]) -> Result<(), ()> {
        let k = self.keys[self.rng.gen_range(0..self.keys.len())].clone();
        let m = members[self.rng.gen_range(0..members.len())].clone();
        match self.rng.gen_range(0..100) {
            0..=44 => self.acquire(&k, &m),
            45..=89 => self.acknowledge(&k, &m),
            90..=94 => {
                self.now_ms += 600;
                Ok(())
            }
            _ => self.reopen_clean(),
        }
    }
}

fn run(seed: u64, steps: usize) -> (u64, u64) {
    let members: Vec<Arc<str>> = vec![Arc::from("a"), Arc::from("b")];
    let mut h = Harness::new(seed);
    let mut crash_at = h.faults.mutations() + h.rng.gen_range(5..200);
    for _ in 0..steps {
        if h.faults.mutations() >= crash_at && !h.faults.crashed() {
            h.faults
                .add(FaultRule::new(FaultOp::Any, FaultEffect::Crash).times(1));
        }
        if h.step(&members).is_err() {
            let loss_seed = h.rng.gen();
            h.power_loss(loss_seed);
            crash_at = h.faults.mutations() + h.rng.gen_range(5..200);
        }
    }
    let loss_seed = h.rng.gen();
    h.power_loss(loss_seed);
    (h.crashes, h.lost_unsynced)
}

#[test]
fn share_state_recovers_a_written_state_after_power_loss() {
    let seed = test_seed();
    let (mut crashes, mut lost) = (0, 0);
    for i in 0..12u64 {
        let seed = seed.wrapping_add(i);
        eprintln!("running seed={seed}");
        let (c, l) = run(seed, 400);
        crashes += c;
        lost += l;
    }
    eprintln!("power losses {crashes}, recoveries without the newest writes {lost}");
    assert!(crashes >= 30, "the test should lose power often ({crashes})");
}
