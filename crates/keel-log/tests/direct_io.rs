//! Reads with O_DIRECT (and the pread + DONTNEED fallback) return exactly
//! what the log holds, for every offset and byte limit, including batches
//! larger than a direct-read window and across segment boundaries.

mod common;

use keel_log::testing::simple_batch;
use keel_log::{probe_direct_io, LogConfig, PartitionLog, ReadIo};

use common::append;

/// Appends batches of mixed sizes (one of ~200 KiB) over several segments
/// and returns every stored batch with its base and last offset.
fn fill(log: &mut PartitionLog) -> Vec<(i64, i64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut next = 0i64;
    for i in 0..60usize {
        let (count, value_len) = match i {
            17 => (2, 100_000),
            _ if i % 5 == 0 => (20, 700),
            _ => (1 + i % 4, 90),
        };
        let (_, stored) = append(log, &[simple_batch(count, value_len, i as i64)], i as i64);
        for b in stored {
            out.push((next, next + count as i64 - 1, b));
            next += count as i64;
        }
    }
    out
}

/// What a read at `offset` with `max_bytes` may return: whole batches
/// starting with the one holding `offset`, at least one. Direct reads may
/// stop earlier (at a window's end), so the check is "a prefix of the
/// expected batches, never empty".
fn check_reads(log: &PartitionLog, batches: &[(i64, i64, Vec<u8>)], what: &str) {
    for max_bytes in [1usize, 5_000, 70_000, 1 << 20] {
        for (i, (base, last, _)) in batches.iter().enumerate() {
            for offset in [*base, *last] {
                let got = log.read_plan(offset, max_bytes).unwrap().execute().unwrap();
                let mut want = Vec::new();
                let mut prefixes = vec![];
                for (_, _, b) in &batches[i..] {
                    if !want.is_empty() && want.len() + b.len() > max_bytes {
                        break;
                    }
                    want.extend_from_slice(b);
                    prefixes.push(want.len());
                }
                assert!(
                    prefixes.contains(&got.len()) && got[..] == want[..got.len()],
                    "{what}: offset {offset} max {max_bytes}: {} bytes, expected one of {prefixes:?}",
                    got.len()
                );
            }
        }
    }
}

fn run(dir: &std::path::Path, read_io: ReadIo, what: &str) {
    let config = LogConfig {
        segment_bytes: 256 * 1024,
        read_io,
        ..LogConfig::default()
    };
    let mut log = PartitionLog::open(dir, config).unwrap();
    let batches = fill(&mut log);
    assert!(log.segment_count() > 1);
    check_reads(&log, &batches, what);
}

#[test]
fn direct_reads_match_the_log() {
    let dir = tempfile::tempdir().unwrap();
    probe_direct_io(dir.path()).expect("the test directory supports O_DIRECT");
    run(dir.path(), ReadIo::Direct, "direct");
}

#[test]
fn dont_need_reads_match_the_log() {
    let dir = tempfile::tempdir().unwrap();
    run(dir.path(), ReadIo::BufferedDontNeed, "pread + DONTNEED");
}

/// tmpfs refused O_DIRECT before Linux 6.6 and accepts it since. Either
/// way, a log configured for direct reads on tmpfs reads correctly: a file
/// that refuses O_DIRECT falls back to pread + DONTNEED per read.
#[test]
fn direct_reads_on_tmpfs_work_with_or_without_o_direct() {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("no /dev/shm on this host");
        return;
    }
    let dir = tempfile::tempdir_in(shm).unwrap();
    let supported = probe_direct_io(dir.path()).is_ok();
    eprintln!("tmpfs O_DIRECT supported: {supported}");
    run(dir.path(), ReadIo::Direct, "direct on tmpfs");
}
