//! Crash recovery and index files: torn and corrupt tails, missing and
//! garbage indexes, and the exact Kafka byte format of the index files.

mod common;

use std::fs::{self, OpenOptions};
use std::io::Write;

use keel_log::batch::{validate_batches, BatchHeader};
use keel_log::testing::simple_batch;
use keel_log::{LogConfig, PartitionLog};

use common::{append, fill, read_all, seg_path};

fn small_config() -> LogConfig {
    LogConfig {
        segment_bytes: 64 * 1024,
        index_interval_bytes: 600,
        ..LogConfig::default()
    }
}

#[test]
fn corrupt_byte_in_last_batch_truncates_to_previous_batch() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config()).unwrap();
    let batches = fill(&mut log, 10, 3, 1_000, 10);
    let end_before_last = log.log_end_offset() - 3;
    drop(log); // crash: no clean-shutdown marker

    let path = seg_path(dir.path(), 0, "log");
    let size = fs::metadata(&path).unwrap().len();
    let last_len = batches[9].len() as u64;
    let mut bytes = fs::read(&path).unwrap();
    bytes[(size - last_len / 2) as usize] ^= 0xff;
    fs::write(&path, &bytes).unwrap();

    let log = PartitionLog::open(dir.path(), small_config()).unwrap();
    assert_eq!(log.log_end_offset(), end_before_last);
    assert_eq!(fs::metadata(&path).unwrap().len(), size - last_len);
    assert_eq!(read_all(&log, 0), batches[..9].concat());
}

#[test]
fn clean_shutdown_skips_crc_scan_but_unclean_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config()).unwrap();
    let batches = fill(&mut log, 4, 2, 1_000, 10);
    log.close().unwrap();
    drop(log);
    assert!(dir.path().join(".keel_clean_shutdown").exists());

    // A flipped value byte is only caught by the CRC scan of an unclean open.
    let path = seg_path(dir.path(), 0, "log");
    let mut bytes = fs::read(&path).unwrap();
    let at = bytes.len() - 5;
    bytes[at] ^= 1;
    fs::write(&path, &bytes).unwrap();
    let log = PartitionLog::open(dir.path(), small_config()).unwrap();
    assert!(
        !dir.path().join(".keel_clean_shutdown").exists(),
        "open removes the marker"
    );
    assert_eq!(log.log_end_offset(), 8, "clean open trusts the tail");
    drop(log);
    let log = PartitionLog::open(dir.path(), small_config()).unwrap();
    assert_eq!(log.log_end_offset(), 6, "unclean open checks CRCs");
    assert_eq!(read_all(&log, 0), batches[..3].concat());
}

#[test]
fn torn_write_and_garbage_are_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config()).unwrap();
    let batches = fill(&mut log, 5, 2, 1_000, 10);
    drop(log);
    let path = seg_path(dir.path(), 0, "log");
    let size = fs::metadata(&path).unwrap().len();
    let torn = simple_batch(4, 100, 2_000);
    let mut file = OpenOptions::new().append(true).open(&path).unwrap();
    file.write_all(&torn[..torn.len() - 7]).unwrap();
    drop(file);

    let mut log = PartitionLog::open(dir.path(), small_config()).unwrap();
    assert_eq!(fs::metadata(&path).unwrap().len(), size);
    assert_eq!(log.log_end_offset(), 10);
    // Appends continue at the right place after the repair.
    let (info, stored) = append(&mut log, &[simple_batch(1, 5, 3_000)], 3_000);
    assert_eq!(info.base_offset, 10);
    assert_eq!(read_all(&log, 0), [batches.concat(), stored.concat()].concat());
}

#[test]
fn batch_with_offsets_going_backwards_is_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config()).unwrap();
    let batches = fill(&mut log, 3, 2, 1_000, 10);
    drop(log);
    // A valid batch (good CRC) whose base offset repeats an earlier one.
    let path = seg_path(dir.path(), 0, "log");
    let mut file = OpenOptions::new().append(true).open(&path).unwrap();
    file.write_all(&batches[1]).unwrap();
    drop(file);
    let log = PartitionLog::open(dir.path(), small_config()).unwrap();
    assert_eq!(log.log_end_offset(), 6);
    assert_eq!(read_all(&log, 0), batches.concat());
}

#[test]
fn missing_or_garbage_indexes_are_rebuilt_identically() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        segment_bytes: 4 * 1024,
        index_interval_bytes: 300,
        ..LogConfig::default()
    };
    let mut log = PartitionLog::open(dir.path(), config.clone()).unwrap();
    let batches = fill(&mut log, 60, 3, 1_000, 7);
    let bases = log.segment_base_offsets();
    assert!(bases.len() >= 3);
    log.close().unwrap();
    drop(log);

    let sealed = bases[1];
    let index = seg_path(dir.path(), sealed, "index");
    let timeindex = seg_path(dir.path(), sealed, "timeindex");
    let original = (fs::read(&index).unwrap(), fs::read(&timeindex).unwrap());
    assert!(!original.0.is_empty() && !original.1.is_empty());
    fs::remove_file(&index).unwrap();
    fs::write(&timeindex, b"garbage garbage garbage").unwrap();
    fs::write(seg_path(dir.path(), bases[0], "index"), [0xffu8; 16]).unwrap();
    fs::write(dir.path().join("00000000000000000000.index.tmp"), b"x").unwrap();

    let log = PartitionLog::open(dir.path(), config).unwrap();
    assert_eq!(
        fs::read(&index).unwrap(),
        original.0,
        "rebuilt .index equals the original"
    );
    assert_eq!(
        fs::read(&timeindex).unwrap(),
        original.1,
        "rebuilt .timeindex equals the original"
    );
    assert!(!dir.path().join("00000000000000000000.index.tmp").exists());
    assert_eq!(read_all(&log, 0), batches.concat());
    for offset in (0..log.log_end_offset()).step_by(5) {
        let bytes = log.read_plan(offset, 1).unwrap().execute().unwrap();
        let h = validate_batches(&bytes).unwrap();
        assert_eq!(h.len(), 1, "max_bytes 1 still returns one whole batch");
        assert!(h[0].base_offset <= offset && offset <= h[0].last_offset());
    }
}

/// Kafka's rules, computed independently from the batch sizes: an offset
/// entry (last offset of the batch, position of the batch) once more than
/// `interval` bytes were written since the last entry; a time entry at the
/// same moment if the max timestamp grew; a final time entry at roll.
fn expected_indexes(batches: &[Vec<u8>], base: i64, interval: u64) -> (Vec<u8>, Vec<u8>) {
    let (mut index, mut timeindex) = (Vec::new(), Vec::new());
    let (mut since, mut pos) = (0u64, 0u64);
    let (mut max_ts, mut max_ts_offset, mut last_time_entry) = (-1i64, base, -1i64);
    for b in batches {
        let h = BatchHeader::parse(b).unwrap();
        if h.max_timestamp > max_ts {
            (max_ts, max_ts_offset) = (h.max_timestamp, h.last_offset());
        }
        if since > interval {
            index.extend_from_slice(&((h.last_offset() - base) as i32).to_be_bytes());
            index.extend_from_slice(&(pos as i32).to_be_bytes());
            if max_ts > last_time_entry {
                timeindex.extend_from_slice(&max_ts.to_be_bytes());
                timeindex.extend_from_slice(&((max_ts_offset - base) as i32).to_be_bytes());
                last_time_entry = max_ts;
            }
            since = 0;
        }
        since += b.len() as u64;
        pos += b.len() as u64;
    }
    if max_ts > last_time_entry {
        timeindex.extend_from_slice(&max_ts.to_be_bytes());
        timeindex.extend_from_slice(&((max_ts_offset - base) as i32).to_be_bytes());
    }
    (index, timeindex)
}

#[test]
fn index_files_are_exactly_kafkas_format() {
    let dir = tempfile::tempdir().unwrap();
    let interval = 500;
    let config = LogConfig {
        segment_bytes: 16 * 1024,
        index_interval_bytes: interval,
        ..LogConfig::default()
    };
    let mut log = PartitionLog::open(dir.path(), config).unwrap();
    // Timestamps go up and down, so not every index moment adds a time entry.
    let mut batches = Vec::new();
    for i in 0..80i64 {
        let ts = 10_000 + (i * 37) % 23 * 100 + i;
        let (_, stored) = append(&mut log, &[simple_batch(1 + (i % 4) as usize, 60, ts)], ts);
        batches.extend(stored);
    }
    let bases = log.segment_base_offsets();
    assert!(bases.len() >= 2);
    let sealed_base = bases[0];
    let in_segment: Vec<Vec<u8>> = batches
        .iter()
        .filter(|b| BatchHeader::parse(b).unwrap().base_offset < bases[1])
        .cloned()
        .collect();
    let (index, timeindex) = expected_indexes(&in_segment, sealed_base, interval);
    assert!(index.len() >= 3 * 8, "enough entries to mean something");
    assert_eq!(
        fs::read(seg_path(dir.path(), sealed_base, "index")).unwrap(),
        index
    );
    assert_eq!(
        fs::read(seg_path(dir.path(), sealed_base, "timeindex")).unwrap(),
        timeindex
    );
    assert_eq!(
        fs::read(seg_path(dir.path(), sealed_base, "log")).unwrap(),
        in_segment.concat()
    );
}

#[test]
fn reopen_empty_and_first_open() {
    let dir = tempfile::tempdir().unwrap();
    let part = dir.path().join("topic-0");
    let mut log = PartitionLog::open(&part, LogConfig::default()).unwrap();
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (0, 0));
    assert!(log.read_plan(0, 100).unwrap().execute().unwrap().is_empty());
    assert!(log.read_plan(1, 100).is_err());
    assert!(seg_path(&part, 0, "log").exists());
    log.close().unwrap();
    drop(log);
    let log = PartitionLog::open(&part, LogConfig::default()).unwrap();
    assert_eq!(log.segment_count(), 1);
    log.delete().unwrap();
    assert!(!part.exists());
}

/// DeleteRecords named offsets that were never fsynced, and the power
/// went: the log restarts empty at its durable start, so no offset below
/// it is handed out again, and the producer snapshots (state of batches
/// that are gone: an open transaction among them would pin the last
/// stable offset below the log start for good) go with the batches.
#[test]
fn a_log_cut_below_its_durable_start_restarts_there_without_producer_state() {
    use std::path::Path;
    use std::sync::Arc;

    use keel_log::sim::SimStorage;
    use keel_log::Storage;

    let dir = Path::new("/data/t-0");
    let config = small_config();
    let mut restarts = 0;
    for seed in 0..40u64 {
        let sim = SimStorage::new();
        sim.create_dir_all(Path::new("/data")).unwrap();
        sim.sync_dir(Path::new("/")).unwrap();
        let storage: Arc<dyn Storage> = Arc::new(sim.clone());
        let mut log = PartitionLog::open_with(Arc::clone(&storage), dir, config.clone()).unwrap();
        for _ in 0..3 {
            append(&mut log, &[simple_batch(5, 100, 1_000)], 1_000);
        }
        log.flush().unwrap();
        log.queue_producer_snapshot(15, b"an open transaction from offset 0".to_vec());
        log.complete_seals().unwrap();
        for _ in 0..3 {
            append(&mut log, &[simple_batch(5, 100, 1_000)], 1_000);
        }
        log.delete_records_before(25).unwrap();
        drop(log);
        sim.power_loss(seed);
        let mut log = PartitionLog::open_with(storage, dir, config.clone()).unwrap();
        assert_eq!(log.log_start_offset(), 25, "seed {seed}");
        assert!(
            log.log_end_offset() >= 25,
            "seed {seed}: offsets below the log start handed out again"
        );
        if log.segment_base_offsets() == [25] {
            restarts += 1;
            assert_eq!(
                log.take_producer_snapshot(),
                None,
                "seed {seed}: producer state of lost batches"
            );
        }
    }
    assert!(restarts > 0, "no power loss cut the log below its start");
}

/// A log keeps its newest two producer snapshots, and every one above the
/// offset its mover names (the segments still to be copied to the object
/// store, each with the snapshot at its end).
#[test]
fn snapshots_of_segments_still_to_copy_are_kept() {
    use std::path::Path;
    use std::sync::Arc;

    use keel_log::sim::SimStorage;
    use keel_log::Storage;

    let dir = Path::new("/data/t-0");
    let sim = SimStorage::new();
    sim.create_dir_all(Path::new("/data")).unwrap();
    let storage: Arc<dyn Storage> = Arc::new(sim);
    let mut log = PartitionLog::open_with(storage, dir, small_config()).unwrap();
    for _ in 0..8 {
        append(&mut log, &[simple_batch(10, 100, 1_000)], 1_000);
    }
    let kept = |log: &PartitionLog| -> Vec<i64> {
        (1..=8)
            .map(|i| i * 10)
            .filter(|o| log.read_producer_snapshot(*o).unwrap().is_some())
            .collect()
    };
    let snapshot = |log: &mut PartitionLog, offset: i64| {
        log.queue_producer_snapshot(offset, format!("state at {offset}").into_bytes());
        log.complete_seals().unwrap();
    };
    for offset in [10, 20, 30] {
        snapshot(&mut log, offset);
    }
    assert_eq!(kept(&log), [20, 30]);
    log.keep_snapshots_after(25);
    for offset in [40, 50, 60] {
        snapshot(&mut log, offset);
    }
    assert_eq!(kept(&log), [30, 40, 50, 60]);
    // Copied up to 50: the older ones go with the next snapshot.
    log.keep_snapshots_after(50);
    snapshot(&mut log, 70);
    assert_eq!(kept(&log), [60, 70]);
    // No segment has a colder copy: every snapshot is kept from now on.
    log.keep_snapshots_of_uncopied();
    for offset in [10, 20, 30] {
        snapshot(&mut log, offset);
    }
    assert_eq!(kept(&log), [10, 20, 30, 60, 70]);
}
