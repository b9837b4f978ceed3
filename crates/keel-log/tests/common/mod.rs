//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use keel_log::batch::validate_batches;
use keel_log::testing::simple_batch;
use keel_log::{AppendInfo, PartitionLog};

/// Appends `batches` in one call (group commit) and returns the info plus
/// the batches as stored (with their assigned base offsets). A roll's seal
/// work is done at once, as the broker's background thread would.
pub fn append(log: &mut PartitionLog, batches: &[Vec<u8>], now_ms: i64) -> (AppendInfo, Vec<Vec<u8>>) {
    let mut buf: Vec<u8> = batches.concat();
    let headers = validate_batches(&buf).expect("test batches are valid");
    let info = log.append(&mut buf, &headers, now_ms).expect("append");
    log.complete_seals().expect("seal");
    let mut stored = Vec::new();
    let mut pos = 0;
    for h in &headers {
        stored.push(buf[pos..pos + h.total_len()].to_vec());
        pos += h.total_len();
    }
    (info, stored)
}

/// Appends `count` single-batch appends of `records` records each, with
/// timestamps `ts0`, `ts0 + step`, ...
pub fn fill(log: &mut PartitionLog, count: usize, records: usize, ts0: i64, step: i64) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for i in 0..count {
        let ts = ts0 + step * i as i64;
        let (_, stored) = append(log, &[simple_batch(records, 40, ts)], ts);
        out.extend(stored);
    }
    out
}

pub fn seg_path(dir: &Path, base: i64, ext: &str) -> PathBuf {
    dir.join(format!("{base:020}.{ext}"))
}

/// Reads everything from `offset` to the log end by repeated fetches.
pub fn read_all(log: &PartitionLog, mut offset: i64) -> Vec<u8> {
    let mut out = Vec::new();
    while offset < log.log_end_offset() {
        let bytes = log
            .read_plan(offset, 1 << 20)
            .expect("plan")
            .execute()
            .expect("read");
        assert!(!bytes.is_empty(), "read at {offset} returned nothing");
        let headers = validate_batches(&bytes).expect("valid batches read back");
        offset = headers.last().expect("one batch").last_offset() + 1;
        out.extend_from_slice(&bytes);
    }
    out
}
