//! Power loss, against a model: random appends (with random flush
//! policies), rolls, seals, retention, DeleteRecords, tier moves, clean
//! reopens and delete-and-recreate, on the simulated storage, with faults
//! injected (EIO, ENOSPC, torn writes, failed fsyncs) and a crash at a
//! random storage step followed by a power loss that drops everything not
//! fsynced. After each recovery:
//! * opening always succeeds;
//! * every batch the log called flushed (acknowledged and fsynced under the
//!   flush policy) is there, byte for byte, unless DeleteRecords or
//!   retention removed it;
//! * every batch read back is whole, CRC-valid, and one that was appended
//!   at that offset (no torn or invented record is ever served).
//!
//! Replay a failure with `KEEL_TEST_SEED=<seed>`.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use keel_log::batch::validate_batches;
use keel_log::faults::{FaultEffect, FaultOp, FaultRule, FaultyStorage};
use keel_log::sim::SimStorage;
use keel_log::storage::read_exact_at;
use keel_log::testing::{test_seed, BatchBuilder};
use keel_log::{read_windows, LogConfig, PartitionLog, SegmentIndex, Storage, Tier, TieredSegment};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const DIR: &str = "/data/t-0";

/// What the log must hold.
#[derive(Debug, Default, Clone)]
struct Model {
    /// Every batch ever handed to `append` at a base offset (failed
    /// attempts too: their bytes may survive a crash).
    attempts: BTreeMap<i64, Vec<Vec<u8>>>,
    /// Acknowledged batches by base offset: (last offset, bytes).
    acked: BTreeMap<i64, (i64, Vec<u8>)>,
    /// Every acknowledged batch below this is durable (the log said so).
    durable_below: i64,
    /// DeleteRecords made this the log start offset, durably.
    deleted_below: i64,
}

struct Harness {
    rng: SmallRng,
    sim: SimStorage,
    faults: FaultyStorage,
    config: LogConfig,
    log: Option<PartitionLog>,
    model: Model,
    /// The colder tier: object name -> (log, index, time index).
    tier: HashMap<String, (Bytes, Bytes, Bytes)>,
    now_ms: i64,
    copies: u64,
    /// A delete-and-recreate was interrupted: the old log or a new empty
    /// one may come back.
    recreating: bool,
    /// Stats, to check the test exercised what it claims.
    crashes: u64,
    recovered_cuts: u64,
    injected: u64,
}

impl Harness {
    fn new(seed: u64) -> Harness {
        let mut rng = SmallRng::seed_from_u64(seed);
        let sim = SimStorage::new();
        sim.create_dir_all(Path::new("/data")).unwrap();
        sim.sync_dir(Path::new("/")).unwrap();
        let faults = FaultyStorage::new(Arc::new(sim.clone()));
        let config = LogConfig {
            segment_bytes: rng.gen_range(1024..4096),
            index_interval_bytes: rng.gen_range(0..600),
            retention_bytes: rng.gen_range(8..40) * 1024,
            retention_ms: -1,
            flush_messages: if rng.gen_bool(0.5) {
                rng.gen_range(1..8)
            } else {
                u64::MAX
            },
            file_delete_delay_ms: 0,
            ..LogConfig::default()
        };
        let mut h = Harness {
            rng,
            sim,
            faults,
            config,
            log: None,
            model: Model::default(),
            tier: HashMap::new(),
            now_ms: 1_000,
            copies: 0,
            recreating: false,
            crashes: 0,
            recovered_cuts: 0,
            injected: 0,
        };
        h.log = Some(h.open().expect("first open"));
        h
    }

    fn storage(&self) -> Arc<dyn Storage> {
        Arc::new(self.faults.clone())
    }

    fn open(&self) -> Result<PartitionLog, String> {
        PartitionLog::open_with(self.storage(), Path::new(DIR), self.config.clone())
            .map_err(|e| e.to_string())
    }

    fn log(&mut self) -> &mut PartitionLog {
        self.log.as_mut().expect("log open")
    }

    /// What the log says is durable now.
    fn note_durable(&mut self) {
        let flushed = self.log().flushed_offset();
        self.model.durable_below = self.model.durable_below.max(flushed);
    }

    fn random_batch(&mut self) -> Vec<u8> {
        let mut b = BatchBuilder::new(self.now_ms);
        for _ in 0..self.rng.gen_range(1..5) {
            let key = format!("k{}", self.rng.gen::<u16>());
            let value = vec![self.rng.gen::<u8>(); self.rng.gen_range(0..250)];
            b = b.record(Some(key.as_bytes()), Some(&value));
        }
        b.build()
    }

    /// Runs one random operation. `Err` when the storage crashed under it.
    fn step(&mut self) -> Result<(), ()> {
        self.ensure_open()?;
        self.now_ms += self.rng.gen_range(0..40);
        let op = self.rng.gen_range(0..100);
        let result = match op {
            0..=49 => self.append(),
            50..=57 => self.log().flush().map_err(drop),
            58..=67 => self.log().complete_seals().map(drop).map_err(drop),
            68..=74 => self.retention(),
            75..=78 => self.delete_records(),
            79..=86 => self.tier_move(),
            87..=89 => self.reopen_clean(),
            90..=91 => self.delete_and_recreate(),
            _ => self.inject_fault(),
        };
        if self.faults.crashed() {
            return Err(());
        }
        self.ensure_open()?;
        if result.is_ok() {
            self.note_durable();
        }
        // A failed fsync takes the log offline: restart it (no power loss).
        if self.log().failure().is_some() {
            self.restart_after_failure();
        }
        Ok(())
    }

    fn append(&mut self) -> Result<(), ()> {
        let n = self.rng.gen_range(1..4);
        let batches: Vec<Vec<u8>> = (0..n).map(|_| self.random_batch()).collect();
        let mut buf = batches.concat();
        let headers = validate_batches(&buf).unwrap();
        let base = self.log().log_end_offset();
        let now = self.now_ms;
        let result = self.log().append(&mut buf, &headers, now);
        // Record what was attempted at each offset, as written.
        let (mut at, mut offset) = (0, base);
        let mut stored = Vec::new();
        for h in &headers {
            let bytes = buf[at..at + h.total_len()].to_vec();
            let last = offset + i64::from(h.last_offset_delta);
            self.model.attempts.entry(offset).or_default().push(bytes.clone());
            stored.push((offset, last, bytes));
            at += h.total_len();
            offset = last + 1;
        }
        match result {
            Ok(info) => {
                assert_eq!(info.base_offset, base);
                for (b, last, bytes) in stored {
                    self.model.acked.insert(b, (last, bytes));
                }
                Ok(())
            }
            Err(_) => {
                assert!(
                    self.faults.crashed() || self.faults.injected() > 0,
                    "an append failed without a fault"
                );
                if self.log.as_ref().is_some_and(|l| l.failure().is_none()) {
                    assert_eq!(
                        self.log().log_end_offset(),
                        base,
                        "a failed append changes nothing"
                    );
                }
                Err(())
            }
        }
    }

    fn retention(&mut self) -> Result<(), ()> {
        let now = self.now_ms;
        self.log().apply_retention(now).map(drop).map_err(drop)
    }

    fn delete_records(&mut self) -> Result<(), ()> {
        let (start, end) = (self.log().log_start_offset(), self.log().log_end_offset());
        let offset = self.rng.gen_range(start..=end);
        self.log().delete_records_before(offset).map_err(drop)?;
        self.model.deleted_below = self.model.deleted_below.max(offset);
        Ok(())
    }

    /// Copies the oldest candidate to the colder tier and maybe releases
    /// the local copy, as the mover does.
    fn tier_move(&mut self) -> Result<(), ()> {
        let Some(c) = self.log().copy_candidates().into_iter().next() else {
            return Ok(());
        };
        self.copies += 1;
        let object = format!("t-00/0/{:020}-{}", c.base_offset, self.copies);
        self.log()
            .begin_copy(&c, Tier::Capacity, object.clone())
            .map_err(drop)?;
        let file = c.log.open().map_err(drop)?;
        let mut data = vec![0u8; c.size_bytes as usize];
        read_exact_at(file.as_ref(), &mut data, 0).map_err(drop)?;
        self.tier.insert(
            object.clone(),
            (Bytes::from(data), c.index.clone(), c.time_index.clone()),
        );
        self.log().finish_copy(&object).map_err(drop)?;
        if self.rng.gen_bool(0.6) {
            if let Some((base, ..)) = self.log().oldest_releasable() {
                self.log().release_local(base).map_err(drop)?;
            }
        }
        Ok(())
    }

    fn reopen_clean(&mut self) -> Result<(), ()> {
        let mut log = self.log.take().expect("open");
        let closed = log.close();
        drop(log);
        match self.open() {
            Ok(log) => self.log = Some(log),
            Err(_) if self.faults.crashed() => return Err(()),
            Err(e) => {
                // An injected fault hit the start-up: start again without it.
                assert!(e.contains("injected"), "reopen failed without a fault: {e}");
                self.faults.clear();
                self.log = Some(self.open().expect("reopen without faults"));
                self.check_recovered();
            }
        }
        closed.map_err(drop)
    }

    /// Deletes the log (fence, rename away) and starts a new one at the
    /// same path, as DeleteTopics and CreateTopics do.
    fn delete_and_recreate(&mut self) -> Result<(), ()> {
        let log = self.log.take().expect("open");
        let unique = format!("{}", self.rng.gen::<u32>());
        self.recreating = true;
        let retired = log.retire(&unique).map_err(drop);
        let recreated = self.open();
        match (retired, recreated) {
            (Ok(_), Ok(log)) => {
                self.log = Some(log);
                self.model = Model::default();
                self.recreating = false;
                Ok(())
            }
            (_, Ok(log)) => {
                self.log = Some(log);
                Err(())
            }
            (_, Err(_)) => Err(()),
        }
    }

    fn inject_fault(&mut self) -> Result<(), ()> {
        let rule = match self.rng.gen_range(0..4) {
            0 => FaultRule::new(FaultOp::Write, FaultEffect::Eio),
            1 => FaultRule::new(FaultOp::Write, FaultEffect::Enospc),
            2 => FaultRule::new(FaultOp::Write, FaultEffect::Short(self.rng.gen_range(1..100))),
            _ => FaultRule::new(FaultOp::Sync, FaultEffect::Eio),
        };
        self.faults
            .add(rule.path(".log").skip(self.rng.gen_range(0..3)).times(1));
        self.injected += 1;
        Ok(())
    }

    /// After a failed fsync the log is offline: the broker would restart.
    fn restart_after_failure(&mut self) {
        drop(self.log.take());
        self.faults.clear();
        self.log = Some(self.open().expect("reopen after a failed fsync"));
        self.check_recovered();
    }

    /// An interrupted delete-and-recreate may leave no log open.
    fn ensure_open(&mut self) -> Result<(), ()> {
        if self.log.is_none() {
            if self.faults.crashed() {
                return Err(());
            }
            self.faults.clear();
            self.log = Some(self.open().expect("open after a failed recreate"));
            self.check_recovered();
        }
        Ok(())
    }

    /// The machine loses power: reopen what survived and check it.
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
        // A deletion caught mid-way leaves the old log or a new empty one.
        if std::mem::take(&mut self.recreating) && self.log().log_end_offset() == 0 {
            self.model = Model::default();
        }
        self.check_recovered();
    }

    /// Checks the reopened log against the model, then makes the model
    /// what the log now holds.
    fn check_recovered(&mut self) {
        let (start, end) = (self.log().log_start_offset(), self.log().log_end_offset());
        let model = self.model.clone();
        assert!(
            end >= model.durable_below,
            "recovered log ends at {end}, below the durable offset {}",
            model.durable_below
        );
        // Offsets below a durable DeleteRecords are never handed out again:
        // a log cut below it restarts empty there.
        assert!(
            start >= model.deleted_below,
            "log start {start} below the {} DeleteRecords made durable (log end {end})",
            model.deleted_below
        );
        let read = self.read_all(start, end);
        for (base, bytes) in &read {
            let ok = model
                .attempts
                .get(base)
                .is_some_and(|a| a.iter().any(|b| b == bytes));
            assert!(ok, "batch at {base} was never appended there");
        }
        for (base, (last, bytes)) in model.acked.range(start..) {
            if *last < model.durable_below && *last < end {
                let got = read.iter().find(|(b, _)| b == base);
                assert!(
                    got.is_some_and(|(_, g)| g == bytes),
                    "durable batch at {base} lost or changed (log {start}..{end})"
                );
            }
        }
        if end < self.model_end() {
            self.recovered_cuts += 1;
        }
        // From here on the log is the truth: what recovery kept is durable.
        self.model.acked.retain(|b, _| *b < end);
        self.model.attempts.retain(|b, _| *b < end);
        self.model.durable_below = end;
    }

    fn model_end(&self) -> i64 {
        self.model
            .acked
            .iter()
            .next_back()
            .map_or(0, |(_, (last, _))| last + 1)
    }

    /// Every batch from `start` to `end`, from local files or the tier.
    fn read_all(&mut self, start: i64, end: i64) -> Vec<(i64, Vec<u8>)> {
        let mut out: Vec<(i64, Vec<u8>)> = Vec::new();
        let mut offset = start;
        while offset < end {
            let plan = self
                .log()
                .read_plan(offset, 1 << 16)
                .expect("plan a read in range");
            let bytes = match plan.tiered_segment() {
                Some(t) => self.read_tiered(t, offset),
                None => plan.execute().expect("recovered data reads back"),
            };
            if bytes.is_empty() {
                // A gap (never written offsets do not exist in a log).
                panic!("no data at offset {offset} below the log end {end}");
            }
            let headers = validate_batches(&bytes).expect("whole, CRC-valid batches");
            let mut at = 0;
            for h in headers {
                // Keel assigns offsets contiguously: a log has no holes.
                if let Some((prev_base, prev)) = out.last() {
                    let prev_last = *prev_base + i64::from(BatchHeaderLast::of(prev.as_slice()));
                    assert_eq!(h.base_offset, prev_last + 1, "a hole after offset {prev_last}");
                }
                out.push((h.base_offset, bytes[at..at + h.total_len()].to_vec()));
                at += h.total_len();
                offset = h.last_offset() + 1;
            }
        }
        out
    }

    fn read_tiered(&self, t: &TieredSegment, offset: i64) -> Bytes {
        let (data, index, time_index) = self.tier.get(&t.object).expect("the tier holds every copy");
        let index = SegmentIndex::decode(t.base_offset, t.size_bytes, index, time_index).unwrap();
        let start = index.position_of(offset);
        read_windows(
            start,
            t.size_bytes,
            offset,
            1 << 16,
            index.window_end(start, 1 << 16),
            |pos, len| Ok(data.slice(pos as usize..(pos + len) as usize)),
        )
        .unwrap()
    }
}

/// The last offset delta of a stored batch.
struct BatchHeaderLast;

impl BatchHeaderLast {
    fn of(batch: &[u8]) -> i32 {
        keel_log::BatchHeader::parse(batch)
            .expect("a stored batch")
            .last_offset_delta
    }
}

fn run(seed: u64, steps: usize) -> (u64, u64, u64) {
    let mut h = Harness::new(seed);
    let mut crash_at = h.faults.mutations() + h.rng.gen_range(20..400);
    let mut i = 0;
    while i < steps {
        if h.faults.mutations() >= crash_at && !h.faults.crashed() {
            h.faults
                .add(FaultRule::new(FaultOp::Any, FaultEffect::Crash).times(1));
        }
        if h.step().is_err() {
            let loss_seed = h.rng.gen();
            h.power_loss(loss_seed);
            crash_at = h.faults.mutations() + h.rng.gen_range(20..400);
        }
        i += 1;
    }
    // And a last power loss at the end, at a quiet moment.
    let loss_seed = h.rng.gen();
    h.power_loss(loss_seed);
    (h.crashes, h.recovered_cuts, h.injected)
}

#[test]
fn nothing_flushed_is_lost_and_nothing_torn_is_served() {
    let seed = test_seed();
    let (mut crashes, mut cuts, mut injected) = (0, 0, 0);
    for i in 0..12u64 {
        let seed = seed.wrapping_add(i);
        eprintln!("running seed={seed}");
        let (c, k, f) = run(seed, 300);
        crashes += c;
        cuts += k;
        injected += f;
    }
    eprintln!("power losses {crashes}, recoveries that cut a tail {cuts}, faults injected {injected}");
    assert!(crashes >= 20, "the test should lose power often ({crashes})");
    assert!(injected >= 10, "the test should inject faults ({injected})");
}
