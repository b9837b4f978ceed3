//! Compaction against a model: random keyed appends (a small key space,
//! tombstones, a third of the batches compressed with one of Kafka's
//! codecs), cleaning passes with random key-map budgets (so most passes
//! see only part of the dirty section), clock jumps past
//! `delete.retention.ms`, clean reopens, and crashes at a random storage
//! step followed by a power loss, on the simulated storage. After every
//! pass and every recovery:
//! * opening always succeeds, and offsets only grow;
//! * every record read is one appended at that offset;
//! * the latest record of every key is there, unless it is a tombstone
//!   past its delete horizon, and then no older record of the key is;
//! * once passes with a map that holds every key find nothing left to do,
//!   no key appears twice below the cleaner's clean point.
//!
//! Replay a failure with `KEEL_TEST_SEED=<seed>`.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use keel_log::batch::validate_batches;
use keel_log::clean::{Checkpoint, KeyMap, PassOptions, Skip};
use keel_log::codec::Codec;
use keel_log::faults::{FaultEffect, FaultOp, FaultRule, FaultyStorage};
use keel_log::records::{records_in, records_section};
use keel_log::sim::SimStorage;
use keel_log::testing::{test_seed, BatchBuilder};
use keel_log::{CleanupPolicy, LogConfig, PartitionLog, Storage};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const DIR: &str = "/data/c-0";
const DELETE_RETENTION_MS: i64 = 500;

type Value = Option<Vec<u8>>;
/// A batch's records: (key, value).
type Records = Vec<(Vec<u8>, Value)>;

struct Harness {
    rng: SmallRng,
    sim: SimStorage,
    faults: FaultyStorage,
    config: LogConfig,
    log: Option<PartitionLog>,
    /// Every record appended, by offset: (key, value).
    appended: BTreeMap<i64, (Vec<u8>, Value)>,
    /// The offset of each key's latest record.
    latest: HashMap<Vec<u8>, i64>,
    keys: u32,
    /// A batch whose append crashed: it may survive the power loss.
    pending: Option<(i64, Records)>,
    last_skip: Option<Skip>,
    now_ms: i64,
    passes: u64,
    removed: u64,
    crashes: u64,
    tombstones_dropped: u64,
}

impl Harness {
    fn new(seed: u64) -> Harness {
        let mut rng = SmallRng::seed_from_u64(seed);
        let sim = SimStorage::new();
        sim.create_dir_all(Path::new("/data")).unwrap();
        sim.sync_dir(Path::new("/")).unwrap();
        let faults = FaultyStorage::new(Arc::new(sim.clone()));
        let config = LogConfig {
            segment_bytes: rng.gen_range(600..3000),
            index_interval_bytes: rng.gen_range(0..400),
            retention_ms: -1,
            flush_messages: 1,
            file_delete_delay_ms: 0,
            cleanup: CleanupPolicy {
                delete: false,
                compact: true,
            },
            ..LogConfig::default()
        };
        let keys = rng.gen_range(3..80);
        let mut h = Harness {
            rng,
            sim,
            faults,
            config,
            log: None,
            appended: BTreeMap::new(),
            latest: HashMap::new(),
            keys,
            pending: None,
            last_skip: None,
            now_ms: 1_000,
            passes: 0,
            removed: 0,
            crashes: 0,
            tombstones_dropped: 0,
        };
        h.log = Some(h.open().expect("first open"));
        h
    }

    fn open(&self) -> Result<PartitionLog, String> {
        let storage: Arc<dyn Storage> = Arc::new(self.faults.clone());
        PartitionLog::open_with(storage, Path::new(DIR), self.config.clone()).map_err(|e| e.to_string())
    }

    fn log(&mut self) -> &mut PartitionLog {
        self.log.as_mut().expect("log open")
    }

    fn step(&mut self) -> Result<(), ()> {
        self.now_ms += self.rng.gen_range(0..30);
        match self.rng.gen_range(0..100) {
            0..=59 => self.append(),
            60..=69 => self.log().complete_seals().map(drop).map_err(drop),
            70..=89 => self.clean(false).map(drop),
            90..=93 => {
                self.now_ms += DELETE_RETENTION_MS;
                Ok(())
            }
            _ => self.reopen(),
        }
    }

    fn append(&mut self) -> Result<(), ()> {
        let mut b = BatchBuilder::new(self.now_ms);
        let mut recs = Vec::new();
        for _ in 0..self.rng.gen_range(1..5) {
            let key = format!("key-{}", self.rng.gen_range(0..self.keys)).into_bytes();
            let value =
                (!self.rng.gen_bool(0.1)).then(|| vec![self.rng.gen::<u8>(); self.rng.gen_range(0..120)]);
            b = b.record(Some(&key), value.as_deref());
            recs.push((key, value));
        }
        if self.rng.gen_bool(0.33) {
            let codecs = [Codec::Gzip, Codec::Snappy, Codec::Lz4, Codec::Zstd];
            b = b.compressed(codecs[self.rng.gen_range(0..codecs.len())]);
        }
        let mut buf = b.build();
        let headers = validate_batches(&buf).unwrap();
        let base = self.log().log_end_offset();
        let now = self.now_ms;
        let result = self.log().append(&mut buf, &headers, now);
        if result.is_ok() {
            self.note_appended(base, recs);
            Ok(())
        } else {
            // Crashed mid-append: the batch may or may not survive.
            self.pending = Some((base, recs));
            Err(())
        }
    }

    fn note_appended(&mut self, base: i64, recs: Records) {
        for (i, (key, value)) in recs.into_iter().enumerate() {
            let offset = base + i as i64;
            self.latest.insert(key.clone(), offset);
            self.appended.insert(offset, (key, value));
        }
    }

    fn options(&self) -> PassOptions {
        PassOptions {
            now_ms: self.now_ms,
            min_compaction_lag_ms: 0,
            max_compaction_lag_ms: i64::MAX,
            min_cleanable_dirty_ratio: 0.0,
            delete_retention_ms: DELETE_RETENTION_MS,
        }
    }

    /// One pass, with a map of random size (or one that holds every key).
    fn clean(&mut self, big_map: bool) -> Result<Option<Checkpoint>, ()> {
        let slots = if big_map {
            4 * self.keys as usize + 64
        } else {
            self.rng.gen_range(1..40)
        };
        let mut map = KeyMap::with_budget(slots * keel_log::clean::SLOT_BYTES);
        let options = self.options();
        // Small windows make most reads start at an index entry.
        let window = self.rng.gen_range(1..2048);
        let log = self.log.as_mut().expect("open");
        let source = log.clean_source().with_read_window(window);
        let outcome = source.clean(&mut map, &options, &mut |_: u64| {}, &mut |g| {
            log.commit_cleaned(g)
        });
        match outcome {
            Ok(Ok(stats)) => {
                self.passes += 1;
                self.removed += stats.records_removed;
                self.check();
                Ok(Some(stats.checkpoint))
            }
            Ok(Err(Skip::Unsupported(why))) => panic!("unexpected skip: {why}"),
            Ok(Err(skip)) => {
                self.last_skip = Some(skip);
                Ok(None)
            }
            Err(_) => Err(()),
        }
    }

    fn reopen(&mut self) -> Result<(), ()> {
        let mut log = self.log.take().expect("open");
        let closed = log.close();
        drop(log);
        self.log = Some(self.open().map_err(drop)?);
        self.check();
        closed.map_err(drop)
    }

    fn power_loss(&mut self, seed: u64) {
        self.crashes += 1;
        drop(self.log.take());
        self.sim.power_loss(seed);
        self.faults.clear();
        let log = self.open().unwrap_or_else(|e| {
            panic!(
                "start-up after a power loss failed: {e}\nfiles: {:?}",
                self.sim.list_files()
            )
        });
        self.log = Some(log);
        let end = self.log().log_end_offset();
        if let Some((base, recs)) = self.pending.take() {
            if end > base {
                self.note_appended(base, recs);
            }
        }
        self.check();
    }

    /// Every record in the log: (offset, key, value).
    fn read_all(&mut self) -> Vec<(i64, Vec<u8>, Value)> {
        let (mut offset, end) = (self.log().log_start_offset(), self.log().log_end_offset());
        let mut out = Vec::new();
        while offset < end {
            let plan = self
                .log()
                .read_plan(offset, 1 << 16)
                .expect("plan a read in range");
            let bytes = plan.execute().expect("the log reads back");
            assert!(
                !bytes.is_empty(),
                "no data at offset {offset} below the log end {end}"
            );
            let mut at = 0;
            for h in validate_batches(&bytes).expect("whole, CRC-valid batches") {
                let batch = &bytes[at..at + h.total_len()];
                let section = records_section(batch, &h).expect("readable through its codec");
                for r in records_in(&section) {
                    let r = r.expect("well-formed records");
                    let o = h.base_offset + r.offset_delta;
                    if o >= offset {
                        out.push((o, r.key.expect("keyed").to_vec(), r.value.map(<[u8]>::to_vec)));
                    }
                }
                at += h.total_len();
                offset = h.last_offset() + 1;
            }
        }
        out
    }

    fn check(&mut self) {
        let ranges = self.log().reader().segment_ranges();
        assert!(
            ranges.windows(2).all(|w| w[0].1 <= w[1].0),
            "segments overlap: {ranges:?}"
        );
        let read = self.read_all();
        assert!(read.windows(2).all(|w| w[0].0 < w[1].0), "offsets only grow");
        let mut present: HashMap<&[u8], Vec<i64>> = HashMap::new();
        for (offset, key, value) in &read {
            let appended = self
                .appended
                .get(offset)
                .expect("a record appended at this offset");
            assert_eq!(
                (&appended.0, &appended.1),
                (key, value),
                "record at {offset} changed"
            );
            present.entry(key.as_slice()).or_default().push(*offset);
        }
        for (key, latest) in &self.latest {
            let offsets = present.get(key.as_slice());
            let is_tombstone = self.appended[latest].1.is_none();
            match offsets {
                Some(o) => assert!(
                    o.contains(latest),
                    "key {:?}: latest record at {latest} is gone, older ones at {o:?} remain",
                    String::from_utf8_lossy(key)
                ),
                None => {
                    assert!(
                        is_tombstone,
                        "key {:?}: latest record at {latest} lost",
                        String::from_utf8_lossy(key)
                    );
                    self.tombstones_dropped += 1;
                }
            }
        }
    }

    /// Passes with a map that holds every key until nothing is left: no
    /// key appears twice below the clean point.
    fn settle(&mut self) {
        let _ = self.log().complete_seals();
        let mut last = None;
        for _ in 0..50 {
            match self.clean(true) {
                Ok(Some(c)) => last = Some(c),
                Ok(None) => break,
                Err(()) => return,
            }
        }
        let clean_end = last.map_or(0, |c| c.clean_end);
        let read = self.read_all();
        let mut seen = HashMap::new();
        for (offset, key, _) in read.iter().filter(|(o, ..)| *o < clean_end) {
            if let Some(prev) = seen.insert(key.clone(), *offset) {
                panic!(
                    "key {:?} at {prev} and {offset}, both below the clean point {clean_end}",
                    String::from_utf8_lossy(key)
                );
            }
        }
    }
}

fn run(seed: u64, steps: usize) -> (u64, u64, u64, u64) {
    let mut h = Harness::new(seed);
    let mut crash_at = h.faults.mutations() + h.rng.gen_range(5..150);
    for i in 0..steps {
        if h.faults.mutations() >= crash_at && !h.faults.crashed() {
            h.faults
                .add(FaultRule::new(FaultOp::Any, FaultEffect::Crash).times(1));
        }
        if h.step().is_err() || h.faults.crashed() {
            if h.faults.crashed() {
                h.power_loss(seed.wrapping_add(i as u64));
                crash_at = h.faults.mutations() + h.rng.gen_range(5..150);
            } else {
                panic!("seed {seed}: step {i} failed without a fault");
            }
        }
        if i % 97 == 96 {
            h.settle();
        }
    }
    h.settle();
    (h.passes, h.removed, h.crashes, h.tombstones_dropped)
}

#[test]
fn compaction_keeps_the_latest_record_of_every_key_through_crashes() {
    let base = test_seed();
    let mut totals = (0, 0, 0, 0);
    for i in 0..12 {
        let seed = base.wrapping_add(i);
        println!("compaction model: seed {seed} (KEEL_TEST_SEED={seed} to replay)");
        let (p, r, c, t) = run(seed, 400);
        totals = (totals.0 + p, totals.1 + r, totals.2 + c, totals.3 + t);
    }
    println!(
        "passes {}, records removed {}, power losses {}, tombstones gone {}",
        totals.0, totals.1, totals.2, totals.3
    );
    assert!(
        totals.0 > 100 && totals.1 > 1000,
        "the test cleaned little: {totals:?}"
    );
    assert!(totals.2 > 5, "the test crashed little: {totals:?}");
    assert!(totals.3 > 0, "no tombstone ever expired: {totals:?}");
}

#[test]
fn a_crash_at_any_step_of_a_pass_is_finished_or_undone() {
    let seed = test_seed();
    println!("crash steps: seed {seed} (KEEL_TEST_SEED={seed} to replay)");
    let mut swaps_recovered = 0;
    let mut steps = None;
    for k in (0..2000).step_by(4) {
        let mut h = Harness::new(seed);
        h.config.segment_bytes = 1024;
        h.log = Some(h.open().unwrap());
        h.keys = 20;
        // A first pass leaves small segments; the second one merges them.
        for round in 0..2 {
            for _ in 0..150 {
                h.append().unwrap();
            }
            h.log().complete_seals().unwrap();
            h.now_ms += 100;
            if round == 0 {
                assert!(matches!(h.clean(true), Ok(Some(_))));
            }
        }
        let before = h.faults.mutations();
        h.faults
            .add(FaultRule::new(FaultOp::Any, FaultEffect::Crash).skip(k).times(1));
        let outcome = h.clean(true);
        if !h.faults.crashed() {
            assert!(
                matches!(outcome, Ok(Some(_))),
                "the pass cleaned: {outcome:?} {:?}",
                h.last_skip
            );
            steps = Some(h.faults.mutations() - before);
            break;
        }
        let swapped = h.sim.list_files().iter().any(|(f, _)| f.ends_with(".swap"));
        swaps_recovered += u64::from(swapped);
        h.power_loss(seed.wrapping_add(k));
        h.settle();
    }
    println!("a pass takes {steps:?} storage steps; {swaps_recovered} crashes left a swap to finish");
    assert!(steps.is_some(), "the pass never finished");
    assert!(swaps_recovered > 0, "no crash left a swap to finish");
}

#[test]
fn a_small_map_still_reclaims_space_on_every_pass() {
    // The bulk-load-then-republish shape: unique keys, then all of them
    // again. A map holding a tenth of the keys removes a tenth of the
    // bulk load per pass, from the first pass on.
    let sim = SimStorage::new();
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    let config = compact_config(4096);
    let mut log = PartitionLog::open_with(Arc::clone(&storage), Path::new(DIR), config).unwrap();
    let n = 2000;
    for round in 0..2 {
        for k in 0..n {
            let key = format!("key-{k:05}");
            let value = format!("round-{round}");
            append_batch(
                &mut log,
                BatchBuilder::new(1_000)
                    .record(Some(key.as_bytes()), Some(value.as_bytes()))
                    .build(),
            );
        }
    }
    // Unique keys after it, a segment's worth: everything above is sealed.
    fill(&mut log, "filler", 100);
    log.complete_seals().unwrap();
    let options = eager_options(0.5);
    let mut map = KeyMap::with_budget(n as usize / 10 * 16);
    let mut removed = Vec::new();
    loop {
        let source = log.clean_source();
        match source
            .clean(&mut map, &options, &mut |_: u64| {}, &mut |g| {
                log.commit_cleaned(g)
            })
            .unwrap()
        {
            Ok(stats) => {
                assert!(
                    stats.records_removed > 0,
                    "pass {} reclaimed nothing: {stats:?}",
                    removed.len()
                );
                removed.push(stats.records_removed);
            }
            Err(Skip::NothingToClean | Skip::BelowDirtyRatio(_)) => break,
            Err(e) => panic!("{e}"),
        }
        assert!(removed.len() < 20, "too many passes: {removed:?}");
    }
    println!("records removed per pass: {removed:?}");
    assert_eq!(
        removed.iter().sum::<u64>(),
        n as u64,
        "every record of the bulk load goes"
    );
}

#[test]
fn cleaning_a_segment_drops_its_colder_copy() {
    // A sealed segment copied to the capacity tier (state Both): once the
    // cleaner replaces it, the copy holds superseded data, and the mover
    // must not take it for the cleaned segment (same base offset) when it
    // releases local copies. The swap marks it Deleting first.
    let sim = SimStorage::new();
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    let config = compact_config(2048);
    let mut log = PartitionLog::open_with(Arc::clone(&storage), Path::new(DIR), config.clone()).unwrap();
    for round in 0..3 {
        for k in 0..30 {
            let key = format!("key-{k:02}");
            append_batch(
                &mut log,
                BatchBuilder::new(1_000)
                    .record(Some(key.as_bytes()), Some(format!("round-{round}").as_bytes()))
                    .build(),
            );
        }
    }
    log.complete_seals().unwrap();
    let first = log.copy_candidates().remove(0);
    let entry = log
        .begin_copy(&first, keel_log::Tier::Capacity, "c/0/first".into())
        .unwrap();
    assert!(log.finish_copy(&entry.object).unwrap());
    assert_eq!(log.oldest_releasable().map(|r| r.0), Some(first.base_offset));

    let options = eager_options(0.0);
    let mut map = KeyMap::with_budget(1 << 16);
    let stats = log
        .clean_source()
        .clean(&mut map, &options, &mut |_: u64| {}, &mut |g| {
            log.commit_cleaned(g)
        })
        .unwrap()
        .unwrap();
    assert!(stats.groups_swapped > 0, "{stats:?}");
    let copy = log
        .tiered_segments()
        .into_iter()
        .find(|t| t.object == "c/0/first")
        .unwrap();
    assert_eq!(copy.state, keel_log::TierState::Deleting);
    assert_eq!(
        log.oldest_releasable(),
        None,
        "nothing to release: the copy is stale"
    );
    // It survives a power loss: the manifest said so before the swap.
    drop(log);
    sim.power_loss(7);
    let log = PartitionLog::open_with(storage, Path::new(DIR), config.clone()).unwrap();
    assert!(log
        .tiered_segments()
        .iter()
        .all(|t| t.state == keel_log::TierState::Deleting));
}

/// A compact-only log's config, with `segment_bytes` segments.
fn compact_config(segment_bytes: u64) -> LogConfig {
    LogConfig {
        segment_bytes,
        retention_ms: -1,
        cleanup: CleanupPolicy {
            delete: false,
            compact: true,
        },
        ..LogConfig::default()
    }
}

/// A pass at t=2 s that cleans everything sealed, tombstones at once.
fn eager_options(min_cleanable_dirty_ratio: f64) -> PassOptions {
    PassOptions {
        now_ms: 2_000,
        min_compaction_lag_ms: 0,
        max_compaction_lag_ms: i64::MAX,
        min_cleanable_dirty_ratio,
        delete_retention_ms: 0,
    }
}

/// Appends one batch; returns its base offset.
fn append_batch(log: &mut PartitionLog, mut buf: Vec<u8>) -> i64 {
    let headers = validate_batches(&buf).unwrap();
    log.append(&mut buf, &headers, 1_000).unwrap().base_offset
}

fn fill(log: &mut PartitionLog, prefix: &str, n: usize) {
    for i in 0..n {
        let key = format!("{prefix}-{i:03}");
        append_batch(
            log,
            BatchBuilder::new(1_000)
                .record(Some(key.as_bytes()), Some(b"filler"))
                .build(),
        );
    }
}

/// The data records of the log, control batches left out: (offset, key, value).
fn data_records(log: &PartitionLog) -> Vec<(i64, String, String)> {
    let (mut offset, end) = (log.log_start_offset(), log.log_end_offset());
    let mut out = Vec::new();
    while offset < end {
        let bytes = log.read_plan(offset, 1 << 16).unwrap().execute().unwrap();
        let mut at = 0;
        for h in validate_batches(&bytes).unwrap() {
            let batch = &bytes[at..at + h.total_len()];
            at += h.total_len();
            offset = h.last_offset() + 1;
            if h.is_control() {
                continue;
            }
            let section = records_section(batch, &h).unwrap();
            for r in records_in(&section) {
                let r = r.unwrap();
                let text = |b: Option<&[u8]>| String::from_utf8(b.unwrap_or_default().to_vec()).unwrap();
                out.push((h.base_offset + r.offset_delta, text(r.key), text(r.value)));
            }
        }
    }
    out
}

#[test]
fn aborted_transactions_are_cleaned_away_and_open_ones_wait() {
    use keel_log::marker::{marker_batch, Marker};
    use keel_log::txnindex::AbortedTxn;
    let sim = SimStorage::new();
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    let config = compact_config(1024);
    let mut log = PartitionLog::open_with(Arc::clone(&storage), Path::new(DIR), config).unwrap();
    let txn = |pid: i64, records: &[(&str, &str)]| {
        let mut b = BatchBuilder::new(1_000).producer(pid, 0, 0).transactional(true);
        for (k, v) in records {
            b = b.record(Some(k.as_bytes()), Some(v.as_bytes()));
        }
        b.build()
    };
    let marker = |pid: i64, commit: bool| {
        marker_batch(
            pid,
            0,
            Marker {
                commit,
                coordinator_epoch: 0,
            },
            1_000,
        )
    };
    append_batch(
        &mut log,
        BatchBuilder::new(1_000).record(Some(b"a"), Some(b"a0")).build(),
    );
    append_batch(&mut log, txn(1, &[("a", "a1")]));
    append_batch(&mut log, marker(1, true));
    let aborted_first = append_batch(&mut log, txn(2, &[("a", "a2"), ("b", "b2")]));
    let aborted_marker = append_batch(&mut log, marker(2, false));
    log.add_aborted_txn(AbortedTxn {
        producer_id: 2,
        first_offset: aborted_first,
        last_offset: aborted_marker,
        last_stable_offset: aborted_first,
    })
    .unwrap();
    fill(&mut log, "f", 40);
    // Producer 3's transaction is still open: the last stable offset.
    let open = append_batch(&mut log, txn(3, &[("a", "a3")]));
    fill(&mut log, "g", 40);
    log.complete_seals().unwrap();
    let options = eager_options(0.0);
    let mut map = KeyMap::with_budget(1 << 16);
    let mut pass = |log: &mut PartitionLog, stable_end: i64| {
        let source = log.clean_source().with_stable_end(stable_end);
        let outcome = source
            .clean(&mut map, &options, &mut |_: u64| {}, &mut |g| {
                log.commit_cleaned(g)
            })
            .unwrap();
        assert!(outcome.is_ok(), "{outcome:?}");
    };
    let of_key = |log: &PartitionLog, key: &str| -> Vec<String> {
        data_records(log)
            .into_iter()
            .filter(|(_, k, _)| k == key)
            .map(|(_, _, v)| v)
            .collect()
    };
    pass(&mut log, open);
    // The aborted transaction's records are gone and hid nothing; the
    // committed value superseded the plain one; the open transaction's
    // value is beyond the stable offset and shadows nothing yet.
    assert_eq!(of_key(&log, "a"), ["a1", "a3"]);
    assert_eq!(of_key(&log, "b"), Vec::<String>::new());
    assert!(log
        .reader()
        .aborted_txns(0, i64::MAX)
        .iter()
        .any(|e| e.producer_id == 2));
    // Producer 3 aborts; with everything stable, a1 is still the value.
    let marker3 = append_batch(&mut log, marker(3, false));
    log.add_aborted_txn(AbortedTxn {
        producer_id: 3,
        first_offset: open,
        last_offset: marker3,
        last_stable_offset: open,
    })
    .unwrap();
    fill(&mut log, "h", 40);
    log.complete_seals().unwrap();
    pass(&mut log, i64::MAX);
    assert_eq!(of_key(&log, "a"), ["a1"]);
}

/// One value of each of the keys `key-00`..`key-19`: `round-<round>`.
fn write_round(log: &mut PartitionLog, round: usize) {
    for k in 0..20 {
        append_batch(
            log,
            BatchBuilder::new(1_000)
                .record(
                    Some(format!("key-{k:02}").as_bytes()),
                    Some(format!("round-{round}").as_bytes()),
                )
                .build(),
        );
    }
}

/// A log whose only sealed segment holds two values of each of 20 keys
/// (one group for a pass), on simulated storage.
fn one_dirty_segment(storage: &Arc<dyn Storage>) -> PartitionLog {
    let mut log = PartitionLog::open_with(Arc::clone(storage), Path::new(DIR), compact_config(4096)).unwrap();
    let mut round = 0;
    while log.segment_count() < 2 {
        write_round(&mut log, round);
        round += 1;
    }
    log.complete_seals().unwrap();
    assert_eq!(log.segment_count(), 2, "one sealed segment, one active");
    log
}

/// What DeleteTopics and then CreateTopics under the same name do to a
/// partition directory: the log is retired (its directory renamed away)
/// and a new, empty log opened at its path.
fn delete_and_create(storage: &Arc<dyn Storage>, log: PartitionLog) -> PartitionLog {
    log.retire("deleted").unwrap();
    PartitionLog::open_with(Arc::clone(storage), Path::new(DIR), compact_config(4096)).unwrap()
}

/// A pass runs without the log's lock. If the log is retired while the
/// pass reads (its topic deleted and created again), the pass must not
/// create, empty or remove files at the path it started from: the new
/// log's own pass may be writing its cleaned group there, under the same
/// name (every log starts at offset 0).
#[test]
fn a_pass_whose_log_is_retired_leaves_a_new_log_at_its_path_alone() {
    let storage: Arc<dyn Storage> = Arc::new(SimStorage::new());
    let log = one_dirty_segment(&storage);
    let source = log.clean_source();
    let cleaned = Path::new(DIR).join("00000000000000000000.log.cleaned");
    let (mut old, mut new) = (Some(log), None);
    let mut budget = |_: u64| {
        if let Some(log) = old.take() {
            new = Some(delete_and_create(&storage, log));
            // The new log's pass, writing its cleaned group.
            let file = storage
                .open(&cleaned, keel_log::storage::OpenMode::Create)
                .unwrap();
            file.write_at(b"the new log's", 0).unwrap();
        }
    };
    let mut map = KeyMap::with_budget(1 << 16);
    // The broker refuses to swap into a deleted partition.
    let outcome = source.clean(&mut map, &eager_options(0.0), &mut budget, &mut |_| Ok(false));
    assert!(matches!(outcome, Ok(Err(Skip::Retired))), "{outcome:?}");
    assert_eq!(
        keel_log::storage::read_file(storage.as_ref(), &cleaned)
            .unwrap()
            .as_deref(),
        Some(&b"the new log's"[..]),
        "the new log's cleaned group is untouched"
    );
    drop(new);
}

/// Retired right after its swap (DeleteTopics between the swap and the end
/// of the pass): the pass's checkpoint must not land in the new log's
/// directory, where it would call the new log's records clean.
#[test]
fn a_pass_whose_log_is_retired_after_its_swap_writes_no_checkpoint_at_its_path() {
    let storage: Arc<dyn Storage> = Arc::new(SimStorage::new());
    let log = one_dirty_segment(&storage);
    let source = log.clean_source();
    let (mut old, mut new) = (Some(log), None);
    let mut commit = |group| {
        let Some(mut log) = old.take() else {
            return Ok(false); // Deleted: the broker refuses the swap.
        };
        let swapped = log.commit_cleaned(group)?;
        new = Some(delete_and_create(&storage, log));
        Ok(swapped)
    };
    let mut map = KeyMap::with_budget(1 << 16);
    let outcome = source.clean(&mut map, &eager_options(0.0), &mut |_: u64| {}, &mut commit);
    assert!(matches!(outcome, Ok(Err(Skip::Retired))), "{outcome:?}");
    assert_eq!(
        Checkpoint::read(storage.as_ref(), Path::new(DIR)).unwrap(),
        None,
        "no checkpoint in the new log's directory"
    );
    drop(new);
}

/// Cleans `log` until a pass finds nothing to do; returns the passes run.
fn clean_all(log: &mut PartitionLog) -> usize {
    let mut map = KeyMap::with_budget(1 << 16);
    let mut passes = 0;
    loop {
        let source = log.clean_source();
        match source
            .clean(&mut map, &eager_options(0.0), &mut |_: u64| {}, &mut |g| {
                log.commit_cleaned(g)
            })
            .unwrap()
        {
            Ok(_) => passes += 1,
            Err(Skip::NothingToClean | Skip::BelowDirtyRatio(_)) => return passes,
            Err(e) => panic!("{e}"),
        }
        assert!(passes < 20, "too many passes");
    }
}

/// A log emptied and started again (a cluster's partition rebuilt from the
/// object store) holds none of the records its cleaner checkpoint called
/// clean: the checkpoint goes with them. Kept, it would call the replayed,
/// never-deduplicated records below its clean end clean, and a tombstone
/// there would later be dropped while an older value of its key stayed.
#[test]
fn a_log_started_over_is_cleaned_from_its_start_again() {
    let storage: Arc<dyn Storage> = Arc::new(SimStorage::new());
    let mut log = one_dirty_segment(&storage);
    assert!(clean_all(&mut log) > 0);
    let clean_end = Checkpoint::read(storage.as_ref(), Path::new(DIR))
        .unwrap()
        .map(|c| c.clean_end);
    assert!(clean_end.is_some_and(|end| end > 0), "{clean_end:?}");

    log.restart_at(0, 0, Vec::new()).unwrap();
    assert_eq!(Checkpoint::read(storage.as_ref(), Path::new(DIR)).unwrap(), None);
    // The same history again, as the WAL replays it: every value of every
    // key, then enough more to seal it.
    for round in 0..2 {
        write_round(&mut log, round);
    }
    fill(&mut log, "filler", 100);
    log.complete_seals().unwrap();
    clean_all(&mut log);
    let records = data_records(&log);
    for k in 0..20 {
        let key = format!("key-{k:02}");
        let values: Vec<&str> = records
            .iter()
            .filter(|r| r.1 == key)
            .map(|r| r.2.as_str())
            .collect();
        assert_eq!(values, ["round-1"], "{key}");
    }
}

/// A pass begun before the log started over (a cluster's leader rebuilt
/// it while the pass read) writes no checkpoint into the new log: the
/// records it would call clean are the new log's raw replay.
#[test]
fn a_pass_begun_before_the_log_started_over_leaves_it_no_checkpoint() {
    let storage: Arc<dyn Storage> = Arc::new(SimStorage::new());
    let mut log = one_dirty_segment(&storage);
    let source = log.clean_source();
    log.restart_at(0, 0, Vec::new()).unwrap();
    for round in 0..2 {
        write_round(&mut log, round);
    }
    fill(&mut log, "filler", 100);
    log.complete_seals().unwrap();
    let mut map = KeyMap::with_budget(1 << 16);
    let outcome = source
        .clean(&mut map, &eager_options(0.0), &mut |_: u64| {}, &mut |g| {
            log.commit_cleaned(g)
        })
        .unwrap();
    assert!(matches!(outcome, Err(Skip::Retired)), "{outcome:?}");
    assert_eq!(Checkpoint::read(storage.as_ref(), Path::new(DIR)).unwrap(), None);
    // The new log's own passes clean it from its start.
    assert!(clean_all(&mut log) > 0);
}
