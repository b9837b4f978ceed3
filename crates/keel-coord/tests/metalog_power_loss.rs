//! Coordinator logs (`MetaLog`) across crashes and power loss, against a
//! model: random writes (plain records and tombstones, records in a
//! producer's transaction and the markers that commit or abort them, as the
//! group log takes) with snapshots every few KiB (which keep open
//! transactions open), clean reopens, and a crash at a random storage step followed by
//! a power loss that drops everything not fsynced, on the simulated
//! storage. After each recovery:
//! * opening always succeeds;
//! * the table is the model's state after some prefix of the writes, in
//!   order: nothing is applied out of order, skipped or invented;
//! * that prefix holds every write the log promised would survive: all
//!   acknowledged ones for a `Durability::Synced` log (ACLs, SCRAM
//!   credentials, quotas), and for a `Durability::Written` log (groups,
//!   transactions) every one acknowledged before a clean close;
//! * after a clean close and reopen, every acknowledged write is there.
//!
//! Replay a failure with `KEEL_TEST_SEED=<seed>`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use keel_coord::codec::RecordError;
use keel_coord::metalog::{log_config, Durability, Entry, MetaLog, Table};
use keel_log::faults::{FaultEffect, FaultOp, FaultRule, FaultyStorage};
use keel_log::marker::Marker;
use keel_log::sim::SimStorage;
use keel_log::testing::test_seed;
use keel_log::Storage;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const DIR: &str = "/data/__keel_meta/model";

/// A key-value table: a record sets a key, or deletes it (`None`); a
/// producer's transactional records wait for its commit marker.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Kv {
    map: BTreeMap<u32, u64>,
    /// Open transactions: producer id -> (epoch, records).
    pending: BTreeMap<i64, (i16, Vec<KvRecord>)>,
}

type KvRecord = (u32, Option<u64>);

impl Table for Kv {
    type Record = KvRecord;
    const NAME: &'static str = "model";

    fn apply(&mut self, (key, value): KvRecord) {
        match value {
            Some(v) => self.map.insert(key, v),
            None => self.map.remove(&key),
        };
    }

    fn records(&self) -> Vec<KvRecord> {
        self.map.iter().map(|(k, v)| (*k, Some(*v))).collect()
    }

    fn apply_transactional(&mut self, producer_id: i64, producer_epoch: i16, record: KvRecord) {
        let open = self
            .pending
            .entry(producer_id)
            .or_insert((producer_epoch, Vec::new()));
        open.0 = producer_epoch;
        open.1.push(record);
    }

    fn end_transaction(&mut self, producer_id: i64, _producer_epoch: i16, commit: bool) {
        if let Some((_, records)) = self.pending.remove(&producer_id) {
            if commit {
                records.into_iter().for_each(|r| self.apply(r));
            }
        }
    }

    fn transactional_records(&self) -> Vec<(i64, i16, Vec<KvRecord>)> {
        self.pending
            .iter()
            .map(|(id, (epoch, records))| (*id, *epoch, records.clone()))
            .collect()
    }

    fn encode((key, value): &KvRecord) -> (Bytes, Option<Bytes>) {
        let value = value.map(|v| Bytes::copy_from_slice(&v.to_be_bytes()));
        (Bytes::copy_from_slice(&key.to_be_bytes()), value)
    }

    fn decode(key: &[u8], value: Option<&[u8]>) -> Result<KvRecord, RecordError> {
        let bad = |what: &str| RecordError(format!("bad {what}"));
        let key = u32::from_be_bytes(key.try_into().map_err(|_| bad("key"))?);
        let value = value
            .map(|v| v.try_into().map(u64::from_be_bytes).map_err(|_| bad("value")))
            .transpose()?;
        Ok((key, value))
    }
}

struct Harness {
    rng: SmallRng,
    sim: SimStorage,
    faults: FaultyStorage,
    durability: Durability,
    segment_bytes: u64,
    snapshot_bytes: u64,
    log: Option<MetaLog<Kv>>,
    runtime: tokio::runtime::Runtime,
    /// The table as the last recovery found it.
    base: Kv,
    /// Every write handed to the log since, in order (a failed one too:
    /// its bytes may survive).
    writes: Vec<Entry<KvRecord>>,
    /// Writes before this index must survive any crash.
    must_survive: usize,
    crashes: u64,
    /// Recoveries that found fewer writes than were acknowledged.
    lost_unsynced: u64,
}

impl Harness {
    fn new(seed: u64, durability: Durability) -> Harness {
        let mut rng = SmallRng::seed_from_u64(seed);
        let sim = SimStorage::new();
        // The broker creates the meta dir and syncs its parent.
        sim.create_dir_all(Path::new("/data/__keel_meta")).unwrap();
        sim.sync_dir(Path::new("/")).unwrap();
        sim.sync_dir(Path::new("/data")).unwrap();
        let faults = FaultyStorage::new(Arc::new(sim.clone()));
        let segment_bytes = rng.gen_range(1024..4096);
        let snapshot_bytes = rng.gen_range(512..4096);
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let mut h = Harness {
            rng,
            sim,
            faults,
            durability,
            segment_bytes,
            snapshot_bytes,
            log: None,
            runtime,
            base: Kv::default(),
            writes: Vec::new(),
            must_survive: 0,
            crashes: 0,
            lost_unsynced: 0,
        };
        h.log = Some(h.open().expect("first open"));
        h
    }

    fn open(&self) -> Result<MetaLog<Kv>, keel_coord::metalog::OpenError> {
        MetaLog::open_with(
            Arc::new(self.faults.clone()),
            Path::new(DIR),
            log_config(self.segment_bytes),
            self.snapshot_bytes,
            self.durability,
        )
    }

    fn random_write(&mut self) -> Entry<KvRecord> {
        let records = (0..self.rng.gen_range(1..6))
            .map(|_| {
                let key = self.rng.gen_range(0..40);
                let value = self.rng.gen_bool(0.85).then(|| self.rng.gen());
                (key, value)
            })
            .collect();
        let producer_id = self.rng.gen_range(1..4);
        match self.rng.gen_range(0..10) {
            0..=5 => Entry::Records(records),
            6..=7 => Entry::Transactional {
                producer_id,
                producer_epoch: 0,
                records,
            },
            _ => Entry::Marker {
                producer_id,
                producer_epoch: 0,
                marker: Marker {
                    commit: self.rng.gen_bool(0.5),
                    coordinator_epoch: 0,
                },
            },
        }
    }

    /// One write, awaited. `Err` when the storage crashed under it.
    fn write(&mut self) -> Result<(), ()> {
        let entry = self.random_write();
        self.writes.push(entry.clone());
        let log = self.log.as_ref().expect("open");
        match self.runtime.block_on(log.write_entry(entry)) {
            Ok(()) => {
                if self.durability == Durability::Synced {
                    self.must_survive = self.writes.len();
                }
                Ok(())
            }
            Err(e) => {
                assert!(self.faults.crashed(), "a write failed without a crash: {e}");
                Err(())
            }
        }
    }

    /// Closes the log and opens it again: every acknowledged write is
    /// there, whatever the durability.
    fn reopen_clean(&mut self) -> Result<(), ()> {
        let log = self.log.take().expect("open");
        log.close();
        drop(log);
        if self.faults.crashed() {
            return Err(());
        }
        let log = self.open().unwrap_or_else(|e| panic!("clean reopen failed: {e}"));
        let table = log.with_table(Kv::clone);
        let expected = self.state_after(self.writes.len());
        assert_eq!(
            table, expected,
            "a clean reopen lost or changed acknowledged writes"
        );
        self.log = Some(log);
        self.must_survive = self.writes.len();
        Ok(())
    }

    fn state_after(&self, writes: usize) -> Kv {
        let mut table = self.base.clone();
        for entry in &self.writes[..writes] {
            entry.clone().apply_to(&mut table);
        }
        table
    }

    /// The machine loses power: reopen what survived and check it.
    fn power_loss(&mut self, seed: u64) {
        self.crashes += 1;
        if let Some(log) = self.log.take() {
            log.close();
        }
        self.sim.power_loss(seed);
        self.faults.clear();
        let log = self.open().unwrap_or_else(|e| {
            panic!(
                "start-up after a power loss failed: {e}\nfiles: {:?}",
                self.sim.list_files()
            )
        });
        let table = log.with_table(Kv::clone);
        let found = (self.must_survive..=self.writes.len())
            .rev()
            .find(|n| self.state_after(*n) == table);
        let Some(found) = found else {
            panic!(
                "after a power loss the table is no prefix of the writes from {} to {}: {}",
                self.must_survive,
                self.writes.len(),
                difference(&table, &self.state_after(self.writes.len()))
            );
        };
        if found < self.writes.len() {
            self.lost_unsynced += 1;
        }
        self.base = table;
        self.writes.clear();
        self.must_survive = 0;
        self.log = Some(log);
    }

    fn step(&mut self) -> Result<(), ()> {
        match self.rng.gen_range(0..100) {
            0..=89 => self.write(),
            _ => self.reopen_clean(),
        }
    }
}

/// The keys whose values differ, for a failure's message.
fn difference(found: &Kv, expected: &Kv) -> String {
    let keys: std::collections::BTreeSet<_> = found.map.keys().chain(expected.map.keys()).collect();
    let mut differ: Vec<String> = keys
        .into_iter()
        .filter(|k| found.map.get(k) != expected.map.get(k))
        .map(|k| {
            format!(
                "key {k}: found {:?}, expected {:?}",
                found.map.get(k),
                expected.map.get(k)
            )
        })
        .collect();
    if found.pending != expected.pending {
        differ.push(format!(
            "open transactions: found {:?}, expected {:?}",
            found.pending, expected.pending
        ));
    }
    differ.join("; ")
}

fn run(seed: u64, durability: Durability, steps: usize) -> (u64, u64) {
    let mut h = Harness::new(seed, durability);
    let mut crash_at = h.faults.mutations() + h.rng.gen_range(5..200);
    for _ in 0..steps {
        if h.faults.mutations() >= crash_at && !h.faults.crashed() {
            h.faults
                .add(FaultRule::new(FaultOp::Any, FaultEffect::Crash).times(1));
        }
        if h.step().is_err() {
            let loss_seed = h.rng.gen();
            h.power_loss(loss_seed);
            crash_at = h.faults.mutations() + h.rng.gen_range(5..200);
        }
    }
    let loss_seed = h.rng.gen();
    h.power_loss(loss_seed);
    (h.crashes, h.lost_unsynced)
}

fn run_seeds(durability: Durability) -> (u64, u64) {
    let seed = test_seed();
    let (mut crashes, mut lost) = (0, 0);
    for i in 0..16u64 {
        let seed = seed.wrapping_add(i);
        eprintln!("running seed={seed} {durability:?}");
        let (c, l) = run(seed, durability, 400);
        crashes += c;
        lost += l;
    }
    eprintln!("{durability:?}: power losses {crashes}, recoveries without the newest writes {lost}");
    assert!(crashes >= 40, "the test should lose power often ({crashes})");
    (crashes, lost)
}

#[test]
fn a_synced_coordinator_log_keeps_every_acknowledged_write() {
    run_seeds(Durability::Synced);
}

#[test]
fn a_written_coordinator_log_recovers_a_prefix_of_its_writes() {
    let (_, lost) = run_seeds(Durability::Written);
    // Power losses that drop unsynced writes are what this test is about.
    assert!(lost > 0, "no power loss dropped an unsynced write");
}
