//! Model-based randomized test: random appends, rolls, reopens, crashes
//! (with torn or lost tails and corrupt indexes), truncations, retention,
//! DeleteRecords and reads, checked against a `Vec` of batches.
//! Replay a failure with `KEEL_TEST_SEED=<seed>`.

mod common;

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

use keel_log::batch::validate_batches;
use keel_log::testing::{test_seed, BatchBuilder};
use keel_log::{LogConfig, PartitionLog, ReadError};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};

use common::{append, seg_path};

#[derive(Debug, Clone)]
struct StoredBatch {
    base: i64,
    last: i64,
    bytes: Vec<u8>,
}

#[derive(Debug, Default)]
struct Model {
    batches: Vec<StoredBatch>,
    log_start: i64,
    log_end: i64,
}

impl Model {
    /// Batches from the one holding `offset`, as a fetch must return them.
    fn from(&self, offset: i64) -> &[StoredBatch] {
        let i = self.batches.partition_point(|b| b.last < offset);
        &self.batches[i..]
    }

    fn truncate_to(&mut self, offset: i64) {
        if offset >= self.log_end {
            return;
        }
        if offset < self.log_start {
            self.batches.clear();
            self.log_start = offset;
            self.log_end = offset;
            return;
        }
        self.lose_from(self.batches.partition_point(|b| b.last < offset));
    }

    /// Drops batches `keep..`, as truncation and a lost tail do.
    fn lose_from(&mut self, keep: usize) {
        if let Some(first_removed) = self.batches.get(keep) {
            self.log_end = first_removed.base;
        }
        self.batches.truncate(keep);
        self.log_start = self.log_start.min(self.log_end);
    }

    /// Drops batches `keep..` lost in a crash. A log that lost batches
    /// at or above its durable start restarts empty there: offsets below
    /// it are never handed out again.
    fn lose_tail(&mut self, keep: usize) {
        let start = self.log_start;
        self.lose_from(keep);
        if self.log_end < start {
            self.batches.clear();
            self.log_start = start;
            self.log_end = start;
        }
    }
}

fn config(rng: &mut SmallRng) -> LogConfig {
    LogConfig {
        segment_bytes: rng.gen_range(1024..4096),
        index_interval_bytes: rng.gen_range(0..600),
        retention_bytes: 24 * 1024,
        retention_ms: -1,
        ..LogConfig::default()
    }
}

fn random_batch(rng: &mut SmallRng, now_ms: i64) -> Vec<u8> {
    let mut builder = BatchBuilder::new(now_ms);
    for _ in 0..rng.gen_range(1..6) {
        let key = format!("k{}", rng.gen::<u16>());
        let value = vec![rng.gen::<u8>(); rng.gen_range(0..300)];
        let key = rng.gen_bool(0.8).then_some(key.as_bytes());
        builder = builder.record(key, Some(&value));
    }
    builder.build()
}

struct Harness {
    rng: SmallRng,
    model: Model,
    log: Option<PartitionLog>,
    config: LogConfig,
    now_ms: i64,
}

impl Harness {
    fn log(&mut self) -> &mut PartitionLog {
        self.log.as_mut().expect("log open")
    }

    fn dir(&mut self) -> std::path::PathBuf {
        self.log().dir().to_path_buf()
    }

    fn append(&mut self) {
        self.now_ms += self.rng.gen_range(0..50);
        let n = self.rng.gen_range(1..4);
        let batches: Vec<Vec<u8>> = (0..n).map(|_| random_batch(&mut self.rng, self.now_ms)).collect();
        let now_ms = self.now_ms;
        let (info, stored) = append(self.log(), &batches, now_ms);
        assert_eq!(info.base_offset, self.model.log_end);
        for bytes in stored {
            let h = validate_batches(&bytes).expect("valid")[0];
            assert_eq!(h.base_offset, self.model.log_end, "contiguous offsets");
            self.model.log_end = h.last_offset() + 1;
            self.model.batches.push(StoredBatch {
                base: h.base_offset,
                last: h.last_offset(),
                bytes,
            });
        }
        assert_eq!(info.last_offset + 1, self.model.log_end);
    }

    fn read(&mut self) {
        let (start, end) = (self.model.log_start, self.model.log_end);
        let offset = self.rng.gen_range(start.saturating_sub(3)..=end + 3);
        let max_bytes = self.rng.gen_range(0..3000);
        match self.log().read_plan(offset, max_bytes) {
            Err(ReadError::OffsetOutOfRange { log_start, log_end }) => {
                assert!(
                    offset < start || offset > end,
                    "offset {offset} in range [{start}, {end}]"
                );
                assert_eq!((log_start, log_end), (start, end));
            }
            Err(e @ ReadError::Damaged { .. }) => panic!("{e}"),
            Ok(plan) => {
                assert!((start..=end).contains(&offset));
                let bytes = plan.execute().expect("execute");
                check_read(&self.model, offset, max_bytes, &bytes);
            }
        }
    }

    fn reopen(&mut self) {
        let mut log = self.log.take().expect("open");
        let dir = log.dir().to_path_buf();
        if self.rng.gen_bool(0.7) {
            log.close().expect("close");
        }
        drop(log);
        self.log = Some(PartitionLog::open(&dir, self.config.clone()).expect("reopen"));
    }

    /// Drops the log without closing, then damages what a crash could.
    fn crash(&mut self) {
        let dir = self.dir();
        let bases = self.log().segment_base_offsets();
        let last_base = *bases.last().expect("a segment");
        drop(self.log.take());
        let log_path = seg_path(&dir, last_base, "log");
        match self.rng.gen_range(0..4) {
            0 => append_bytes(&log_path, &random_bytes(&mut self.rng)),
            1 => {
                let batch = random_batch(&mut self.rng, self.now_ms);
                let cut = self.rng.gen_range(1..batch.len());
                append_bytes(&log_path, &batch[..cut]);
            }
            2 => self.lose_tail(&log_path, last_base),
            _ => {}
        }
        if self.rng.gen_bool(0.3) {
            let base = bases[self.rng.gen_range(0..bases.len())];
            let ext = if self.rng.gen_bool(0.5) {
                "index"
            } else {
                "timeindex"
            };
            let garbage = random_bytes(&mut self.rng);
            std::fs::write(seg_path(&dir, base, ext), garbage).expect("write garbage index");
        }
        self.log = Some(PartitionLog::open(&dir, self.config.clone()).expect("recover"));
    }

    /// Cuts the last segment at a random byte: the batches it cuts are lost.
    fn lose_tail(&mut self, log_path: &Path, last_base: i64) {
        let size = std::fs::metadata(log_path).expect("stat").len();
        if size == 0 {
            return;
        }
        let cut = self.rng.gen_range(0..size);
        OpenOptions::new()
            .write(true)
            .open(log_path)
            .expect("open")
            .set_len(cut)
            .expect("cut");
        let mut pos = 0u64;
        let first = self.model.batches.partition_point(|b| b.base < last_base);
        let mut keep = self.model.batches.len();
        for (i, b) in self.model.batches[first..].iter().enumerate() {
            pos += b.bytes.len() as u64;
            if pos > cut {
                keep = first + i;
                break;
            }
        }
        self.model.lose_tail(keep);
    }

    fn truncate(&mut self) {
        let (start, end) = (self.model.log_start, self.model.log_end);
        let offset = self.rng.gen_range(start.saturating_sub(2).max(0)..=end);
        self.log().truncate_to(offset).expect("truncate");
        self.model.truncate_to(offset);
    }

    fn delete_records(&mut self) {
        let (start, end) = (self.model.log_start, self.model.log_end);
        let offset = self.rng.gen_range(start..=end);
        self.log().delete_records_before(offset).expect("delete records");
        self.model.log_start = self.model.log_start.max(offset);
    }

    /// Retention by bytes, with a read planned before and executed after.
    fn retention(&mut self) {
        let (start, end) = (self.model.log_start, self.model.log_end);
        let offset = self.rng.gen_range(start..=end);
        let plan = self.log().read_plan(offset, 4096).expect("plan");
        let now_ms = self.now_ms;
        let outcome = self.log().apply_retention(now_ms).expect("retention");
        assert!(outcome.log_start_offset >= start && outcome.log_start_offset <= end);
        check_read(
            &self.model,
            offset,
            4096,
            &plan.execute().expect("read deleted segment"),
        );
        self.model.log_start = outcome.log_start_offset;
    }

    fn check_offsets(&mut self) {
        let (start, end) = (self.model.log_start, self.model.log_end);
        let log = self.log();
        assert_eq!(log.log_end_offset(), end, "log end offset");
        assert_eq!(log.log_start_offset(), start, "log start offset");
    }
}

fn check_read(model: &Model, offset: i64, max_bytes: usize, bytes: &[u8]) {
    if offset == model.log_end {
        assert!(bytes.is_empty());
        return;
    }
    let expected = model.from(offset);
    assert!(!bytes.is_empty(), "read at {offset} returned nothing");
    let mut at = 0;
    for (i, b) in expected.iter().enumerate() {
        if at == bytes.len() {
            break;
        }
        let got = bytes.get(at..at + b.bytes.len()).expect("whole batches");
        assert!(got == &b.bytes[..], "batch {i} from offset {offset} differs");
        at += b.bytes.len();
    }
    assert_eq!(at, bytes.len(), "read returned bytes beyond the model");
    let first_len = expected[0].bytes.len();
    assert!(bytes.len() <= max_bytes.max(first_len), "read exceeded max_bytes");
}

fn random_bytes(rng: &mut SmallRng) -> Vec<u8> {
    let mut buf = vec![0u8; rng.gen_range(1..200)];
    rng.fill_bytes(&mut buf);
    buf
}

fn append_bytes(path: &Path, bytes: &[u8]) {
    let mut file = OpenOptions::new().append(true).open(path).expect("open");
    file.write_all(bytes).expect("append");
}

fn run(seed: u64, ops: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut rng = SmallRng::seed_from_u64(seed);
    let config = config(&mut rng);
    let log = PartitionLog::open(dir.path(), config.clone()).expect("open");
    let mut h = Harness {
        rng,
        model: Model::default(),
        log: Some(log),
        config,
        now_ms: 1_000,
    };
    let mut max_segments = 0;
    let trace = std::env::var_os("KEEL_TEST_TRACE").is_some();
    for _ in 0..ops {
        let op = h.rng.gen_range(0..100);
        if trace {
            let log = h.log();
            eprintln!(
                "op {op} start={} end={} segs={:?}",
                log.log_start_offset(),
                log.log_end_offset(),
                log.segment_base_offsets()
            );
        }
        match op {
            0..=44 => h.append(),
            45..=74 => h.read(),
            75..=79 => h.reopen(),
            80..=86 => h.crash(),
            87..=90 => h.truncate(),
            91..=94 => h.delete_records(),
            _ => h.retention(),
        }
        h.check_offsets();
        max_segments = max_segments.max(h.log().segment_count());
    }
    assert!(
        max_segments > 3,
        "the test should roll segments (max {max_segments})"
    );
}

#[test]
fn log_matches_model() {
    let seed = test_seed();
    for i in 0..6u64 {
        let seed = seed.wrapping_add(i);
        eprintln!("running seed={seed}");
        run(seed, 400);
    }
}
