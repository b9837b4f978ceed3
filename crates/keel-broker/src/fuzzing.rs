//! A structure-aware fuzz driver (`fuzz/fuzz_targets/produce_append.rs`):
//! arbitrary bytes become a sequence of operations on one partition log on
//! the simulated storage: produce requests whose batches are built from
//! the bytes and then forged (header fields overwritten, CRCs re-signed or
//! not, cut short, concatenated), validated as the Produce handler does,
//! checked against producer state and appended; reads; retention and
//! DeleteRecords; seals and flushes; power losses followed by recovery.
//!
//! Nothing may panic, and after every operation the log must agree with
//! what was accepted: an accepted batch moves the log end by exactly its
//! offsets, a refused one by none, reads return whole CRC-valid batches,
//! and start-up after a power loss always succeeds without cutting below
//! what was flushed. The committed corpus is replayed by `cargo test`
//! (`tests/fuzz_corpus.rs`).

use std::path::Path;
use std::sync::Arc;

use keel_log::batch::{validate_batches, BatchHeader};
use keel_log::faults::FaultyStorage;
use keel_log::sim::SimStorage;
use keel_log::testing::BatchBuilder;
use keel_log::{LogConfig, PartitionLog, ReadError, Storage};

use keel_data::producers::{ProducerStates, SequenceCheck};

/// Reads the fuzz input as a stream of small numbers and byte strings; an
/// exhausted input reads as zeros, and `done` ends the run.
struct Input<'a> {
    data: &'a [u8],
    at: usize,
}

impl Input<'_> {
    fn done(&self) -> bool {
        self.at >= self.data.len()
    }

    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }

    fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }

    fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let n = usize::from(self.u8()) % (max + 1);
        let end = (self.at + n).min(self.data.len());
        let out = self
            .data
            .get(self.at..end)
            .map(<[u8]>::to_vec)
            .unwrap_or_default();
        self.at += n;
        out
    }
}

const DIR: &str = "/fuzz/t-0";

/// Runs the operations `data` encodes. Panics only on a broken invariant.
pub fn produce_append(data: &[u8]) {
    let mut input = Input { data, at: 0 };
    let sim = SimStorage::new();
    sim.create_dir_all(Path::new("/fuzz")).expect("sim mkdir");
    sim.sync_dir(Path::new("/")).expect("sim sync");
    let faults = FaultyStorage::new(Arc::new(sim.clone()));
    let storage: Arc<dyn Storage> = Arc::new(faults.clone());
    let config = LogConfig {
        segment_bytes: 256 + u64::from(input.u16() % 8192),
        index_interval_bytes: u64::from(input.u8()) * 8,
        flush_messages: if input.u8().is_multiple_of(3) { 1 } else { u64::MAX },
        retention_bytes: 4096 + i64::from(input.u16()),
        retention_ms: -1,
        file_delete_delay_ms: 0,
        ..LogConfig::default()
    };
    let open = |storage: &Arc<dyn Storage>| {
        PartitionLog::open_with(Arc::clone(storage), Path::new(DIR), config.clone())
            .unwrap_or_else(|e| panic!("open after recovery failed: {e}"))
    };
    let mut log = open(&storage);
    let mut producers = ProducerStates::default();
    let mut now_ms = 1_000_000i64;
    while !input.done() {
        now_ms += i64::from(input.u8());
        match input.u8() % 10 {
            0..=4 => produce(&mut input, &mut log, &mut producers, now_ms),
            5 => read(&mut input, &log),
            6 => {
                let _ = log.apply_retention(now_ms);
                let end = log.log_end_offset();
                if end > 0 && input.u8().is_multiple_of(2) {
                    let _ = log.delete_records_before(i64::from(input.u16()) % (end + 1));
                }
            }
            7 => {
                let _ = log.complete_seals();
                if input.u8().is_multiple_of(2) {
                    let _ = log.flush();
                }
            }
            8 => {
                let rule = match input.u8() % 3 {
                    0 => "write short=7 times=1",
                    1 => "write eio times=1",
                    _ => "open emfile times=1",
                };
                faults.add_text(rule).expect("rule parses");
            }
            _ => {
                let flushed = log.flushed_offset();
                drop(log);
                sim.power_loss(u64::from(input.u32()));
                faults.clear();
                log = open(&storage);
                assert!(
                    log.log_end_offset() >= flushed,
                    "recovery cut below the flushed offset {flushed}"
                );
                producers = ProducerStates::default();
                for header in log.batch_headers(log.log_start_offset()).flatten() {
                    producers.record(&header, header.base_offset, now_ms);
                }
            }
        }
        if log.failure().is_some() {
            drop(log);
            faults.clear();
            log = open(&storage);
        }
    }
}

/// One partition's records of a Produce request, built and forged from the
/// input, then validated, sequence-checked and appended.
fn produce(input: &mut Input, log: &mut PartitionLog, producers: &mut ProducerStates, now_ms: i64) {
    let mut records = Vec::new();
    for _ in 0..1 + input.u8() % 2 {
        records.extend(forged_batch(input, now_ms));
    }
    if input.u8().is_multiple_of(8) {
        records.extend(input.bytes(80));
    }
    let before = log.log_end_offset();
    let Ok(headers) = crate::validate_produce_records(&records, 1 << 20) else {
        assert_eq!(log.log_end_offset(), before, "a refused request moved the log");
        return;
    };
    let [h] = headers[..] else {
        panic!("validation accepted {} batches", headers.len());
    };
    assert!(h.records_count > 0 && i64::from(h.last_offset_delta) + 1 == i64::from(h.records_count));
    match producers.check(&h) {
        SequenceCheck::Append => {}
        SequenceCheck::Duplicate { .. } | SequenceCheck::Reject(_) => return,
    }
    let snapshot = producers.snapshot(h.producer_id);
    producers.record(&h, before, now_ms);
    match log.append(&mut records, &headers, now_ms) {
        Ok(info) => {
            assert_eq!(info.base_offset, before);
            assert_eq!(log.log_end_offset(), before + i64::from(h.last_offset_delta) + 1);
        }
        Err(_) => {
            producers.restore(snapshot);
            if log.failure().is_none() {
                assert_eq!(log.log_end_offset(), before, "a failed append moved the log");
            }
        }
    }
}

/// A batch of records from the input, then perhaps forged: a header field
/// overwritten (the CRC re-signed or not), or the batch cut short.
fn forged_batch(input: &mut Input, now_ms: i64) -> Vec<u8> {
    let mut builder = BatchBuilder::new(now_ms);
    if input.u8().is_multiple_of(3) {
        let pid = i64::from(input.u8() % 4);
        builder = builder.producer(pid, i16::from(input.u8() % 2), i32::from(input.u8() % 8) - 1);
    }
    for _ in 0..1 + input.u8() % 6 {
        let key = input.bytes(12);
        let value = input.bytes(60);
        builder = builder.record((!key.is_empty()).then_some(&key[..]), Some(&value));
    }
    let mut batch = builder.build();
    match input.u8() % 6 {
        0 => {
            // Overwrite any header byte run, re-signed: forged but "valid".
            let at = usize::from(input.u8()) % 61;
            let value = input.u32().to_be_bytes();
            for (i, b) in value.iter().enumerate() {
                if let Some(slot) = batch.get_mut(at + i) {
                    *slot = *b;
                }
            }
            if batch.len() > 21 {
                let crc = crc32c::crc32c(&batch[21..]);
                batch[17..21].copy_from_slice(&crc.to_be_bytes());
            }
        }
        1 => {
            let at = usize::from(input.u16()) % batch.len();
            batch[at] ^= input.u8() | 1;
        }
        2 => {
            let keep = usize::from(input.u16()) % batch.len();
            batch.truncate(keep);
        }
        _ => {}
    }
    batch
}

/// A read anywhere around the log: in range it returns whole CRC-valid
/// batches, out of range a clean error.
fn read(input: &mut Input, log: &PartitionLog) {
    let end = log.log_end_offset();
    let offset = i64::from(input.u16()) % (end + 3) - 1;
    let max = usize::from(input.u16());
    match log.read_plan(offset, max) {
        Ok(plan) if plan.tiered_segment().is_none() => match plan.execute() {
            Ok(bytes) if !bytes.is_empty() => {
                let headers: Vec<BatchHeader> = validate_batches(&bytes).expect("reads return valid batches");
                assert!(headers[0].last_offset() >= offset);
            }
            Ok(_) => {}
            // An injected EMFILE may hit the open of the segment file.
            Err(e) if e.to_string().contains("injected") => {}
            Err(e) => panic!("a planned read failed: {e}"),
        },
        Ok(_) => {}
        Err(ReadError::OffsetOutOfRange { .. }) => {
            assert!(offset < log.log_start_offset() || offset > end)
        }
        Err(e) => panic!("unexpected read error: {e}"),
    }
}
