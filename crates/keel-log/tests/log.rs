//! Append, read, retention, DeleteRecords, timestamps and flush policy.

mod common;

use keel_log::batch::validate_batches;
use keel_log::testing::simple_batch;
use keel_log::{AppendError, LogConfig, PartitionLog, ReadError};

use common::{append, fill, read_all, seg_path};

const HOUR_MS: i64 = 3_600_000;

#[test]
fn group_commit_assigns_contiguous_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), LogConfig::default()).unwrap();
    let batches = [
        simple_batch(3, 10, 100),
        simple_batch(1, 10, 200),
        simple_batch(5, 10, 150),
    ];
    let (info, stored) = append(&mut log, &batches, 1_000);
    assert_eq!((info.base_offset, info.last_offset), (0, 8));
    assert_eq!(info.max_timestamp_ms, 200);
    assert_eq!(info.records_count, 9);
    let bases: Vec<i64> = stored
        .iter()
        .map(|b| validate_batches(b).unwrap()[0].base_offset)
        .collect();
    assert_eq!(bases, [0, 3, 4]);
    assert_eq!(log.log_end_offset(), 9);
    assert_eq!(read_all(&log, 0), stored.concat());
    // Reading from the middle of a batch returns that whole batch.
    let bytes = log.read_plan(5, 0).unwrap().execute().unwrap();
    assert_eq!(&bytes[..], &stored[2][..]);
}

#[test]
fn append_rejects_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), LogConfig::default()).unwrap();
    let mut buf = simple_batch(2, 10, 0);
    let headers = validate_batches(&buf).unwrap();
    assert!(matches!(log.append(&mut buf, &[], 0), Err(AppendError::Empty)));
    let mut longer = [buf.clone(), vec![0; 3]].concat();
    assert!(matches!(
        log.append(&mut longer, &headers, 0),
        Err(AppendError::HeadersMismatch { .. })
    ));
    assert_eq!(log.log_end_offset(), 0);
    assert_eq!(log.append(&mut buf, &headers, 0).unwrap().last_offset, 1);
}

#[test]
fn read_respects_max_bytes_and_range() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), LogConfig::default()).unwrap();
    let batches = fill(&mut log, 10, 2, 0, 1);
    let one = batches[0].len();
    let bytes = log.read_plan(0, one * 3 + 10).unwrap().execute().unwrap();
    assert_eq!(&bytes[..], &batches[..3].concat()[..]);
    let bytes = log.read_plan(4, 1).unwrap().execute().unwrap();
    assert_eq!(&bytes[..], &batches[2][..], "KIP-74: at least one batch");
    assert_eq!(
        log.read_plan(21, 10).unwrap_err(),
        ReadError::OffsetOutOfRange {
            log_start: 0,
            log_end: 20
        }
    );
    assert!(log.read_plan(20, 10).unwrap().execute().unwrap().is_empty());
}

#[test]
fn plan_does_not_see_later_appends() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), LogConfig::default()).unwrap();
    let batches = fill(&mut log, 2, 1, 0, 1);
    let plan = log.read_plan(0, 1 << 20).unwrap();
    fill(&mut log, 2, 1, 0, 1);
    assert_eq!(&plan.execute().unwrap()[..], &batches.concat()[..]);
    fn assert_send_static<T: Send + 'static>(_: &T) {}
    assert_send_static(&plan);
}

#[test]
fn rolls_on_size_time_and_index_limits() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        segment_bytes: 2_000,
        segment_ms: HOUR_MS,
        ..LogConfig::default()
    };
    let mut log = PartitionLog::open(dir.path(), config).unwrap();
    fill(&mut log, 30, 2, 0, 1);
    let by_size = log.segment_count();
    assert!(by_size > 1);
    let t0 = 10 * HOUR_MS;
    append(&mut log, &[simple_batch(1, 10, t0)], t0);
    let n = log.segment_count();
    append(
        &mut log,
        &[simple_batch(1, 10, t0 + HOUR_MS + 1)],
        t0 + HOUR_MS + 1,
    );
    assert_eq!(log.segment_count(), n + 1, "segment.ms roll");

    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        index_interval_bytes: 0,
        segment_index_bytes: 5 * 12,
        ..LogConfig::default()
    };
    let mut log = PartitionLog::open(dir.path(), config).unwrap();
    fill(&mut log, 20, 1, 0, 1);
    assert!(log.segment_count() >= 4, "index-full roll");
    // The active segment's index files are written at close.
    log.close().unwrap();
    for base in log.segment_base_offsets() {
        let len = std::fs::metadata(seg_path(dir.path(), base, "timeindex"))
            .unwrap()
            .len();
        assert!(len <= 60, "time index within segment_index_bytes");
    }
}

#[test]
fn retention_by_bytes_never_deletes_active() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        segment_bytes: 1_000,
        retention_bytes: 2_500,
        ..LogConfig::default()
    };
    let mut log = PartitionLog::open(dir.path(), config).unwrap();
    let batches = fill(&mut log, 30, 2, 0, 1);
    let before = log.size_bytes();
    let sizes: Vec<u64> = log
        .segment_base_offsets()
        .iter()
        .map(|b| std::fs::metadata(seg_path(dir.path(), *b, "log")).unwrap().len())
        .collect();
    let outcome = log.apply_retention(0).unwrap();
    // Kafka's rule: delete the oldest while the rest is still >= the limit.
    let mut expect = 0;
    let mut excess = before as i64 - 2_500;
    for s in &sizes[..sizes.len() - 1] {
        if excess - (*s as i64) < 0 {
            break;
        }
        excess -= *s as i64;
        expect += 1;
    }
    assert!(expect > 0);
    assert_eq!(outcome.deleted_segments, expect);
    assert!(log.size_bytes() >= 2_500 && log.size_bytes() < 2_500 + sizes[expect] + 1_000);
    let start = log.log_start_offset();
    assert_eq!(start, log.segment_base_offsets()[0]);
    assert!(!seg_path(dir.path(), 0, "log").exists());
    let first_kept = batches
        .iter()
        .position(|b| validate_batches(b).unwrap()[0].base_offset == start);
    assert_eq!(read_all(&log, start), batches[first_kept.unwrap()..].concat());
    assert!(matches!(
        log.read_plan(0, 10),
        Err(ReadError::OffsetOutOfRange { .. })
    ));

    let tiny = LogConfig {
        segment_bytes: 1_000,
        retention_bytes: 0,
        ..LogConfig::default()
    };
    drop(log);
    let mut log = PartitionLog::open(dir.path(), tiny).unwrap();
    log.apply_retention(0).unwrap();
    assert_eq!(log.segment_count(), 1, "the active segment stays");
    assert!(log.size_bytes() > 0);
}

#[test]
fn retention_by_time_uses_largest_timestamp() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        segment_bytes: 1_000,
        retention_ms: 10 * HOUR_MS,
        ..LogConfig::default()
    };
    let mut log = PartitionLog::open(dir.path(), config).unwrap();
    // One batch per hour; several batches per segment.
    fill(&mut log, 30, 2, 0, HOUR_MS);
    let segments = log.segment_count();
    assert!(segments > 4);
    assert_eq!(log.apply_retention(0).unwrap().deleted_segments, 0);
    let now = 25 * HOUR_MS;
    let outcome = log.apply_retention(now).unwrap();
    assert!(outcome.deleted_segments > 0);
    // Every remaining segment holds a batch newer than the limit; the first
    // deleted one did not.
    let start = log.log_start_offset();
    let first = log.read_plan(start, 1 << 20).unwrap().execute().unwrap();
    let headers = validate_batches(&first).unwrap();
    let newest_in_first = headers.iter().map(|h| h.max_timestamp).max().unwrap();
    assert!(now - newest_in_first <= 10 * HOUR_MS);
    assert!(now - (headers[0].base_timestamp - HOUR_MS) > 10 * HOUR_MS);
    // Far in the future everything but the active segment goes.
    log.apply_retention(1_000 * HOUR_MS).unwrap();
    assert_eq!(log.segment_count(), 1);
}

#[test]
fn delete_records_persists_log_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        segment_bytes: 1_000,
        ..LogConfig::default()
    };
    let mut log = PartitionLog::open(dir.path(), config.clone()).unwrap();
    fill(&mut log, 20, 2, 0, 1);
    let before = log.segment_count();
    log.delete_records_before(23).unwrap();
    assert_eq!(log.log_start_offset(), 23);
    assert!(log.segment_count() < before);
    assert!(log.segment_base_offsets()[0] <= 23);
    assert!(log.delete_records_before(41).is_err());
    log.delete_records_before(10).unwrap(); // not an advance: no-op
    assert_eq!(log.log_start_offset(), 23);
    let bytes = log.read_plan(23, 1).unwrap().execute().unwrap();
    assert_eq!(
        validate_batches(&bytes).unwrap()[0].base_offset,
        22,
        "batch holding 23"
    );
    drop(log);
    let text = std::fs::read_to_string(dir.path().join("log-start-offset")).unwrap();
    assert_eq!(text, "0\n23\n");
    let log = PartitionLog::open(dir.path(), config).unwrap();
    assert_eq!(log.log_start_offset(), 23);
    assert!(matches!(
        log.read_plan(22, 10),
        Err(ReadError::OffsetOutOfRange { .. })
    ));
}

#[test]
fn truncate_to_and_truncate_fully() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        segment_bytes: 1_000,
        ..LogConfig::default()
    };
    let mut log = PartitionLog::open(dir.path(), config.clone()).unwrap();
    let batches = fill(&mut log, 20, 2, 0, 1);
    log.truncate_to(15).unwrap(); // mid-batch: the batch [14, 15] goes
    assert_eq!(log.log_end_offset(), 14);
    assert_eq!(read_all(&log, 0), batches[..7].concat());
    let (info, _) = append(&mut log, &[simple_batch(1, 5, 0)], 0);
    assert_eq!(info.base_offset, 14);
    log.delete_records_before(10).unwrap();
    log.truncate_to(5).unwrap();
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (5, 5));
    assert_eq!(log.segment_count(), 1);
    drop(log);
    let log = PartitionLog::open(dir.path(), config).unwrap();
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (5, 5));
    assert!(seg_path(dir.path(), 5, "log").exists());
}

#[test]
fn offsets_for_timestamps() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        segment_bytes: 1_500,
        index_interval_bytes: 100,
        ..LogConfig::default()
    };
    let mut log = PartitionLog::open(dir.path(), config.clone()).unwrap();
    assert_eq!(log.max_timestamp(), None);
    // Batch i holds offsets 2i, 2i+1 with timestamps 1000i, 1000i+1;
    // uncompressed batches are answered at record granularity.
    fill(&mut log, 30, 2, 0, 1_000);
    assert!(log.segment_count() > 2);
    assert_eq!(log.offset_for_timestamp(0).unwrap(), Some((0, 0)));
    assert_eq!(log.offset_for_timestamp(5_001).unwrap(), Some((11, 5_001)));
    assert_eq!(log.offset_for_timestamp(5_002).unwrap(), Some((12, 6_000)));
    assert_eq!(log.offset_for_timestamp(29_001).unwrap(), Some((59, 29_001)));
    assert_eq!(log.offset_for_timestamp(29_002).unwrap(), None);
    assert_eq!(log.max_timestamp(), Some((29_001, 59)));
    log.close().unwrap();
    drop(log);
    let log = PartitionLog::open(dir.path(), config).unwrap();
    assert_eq!(log.max_timestamp(), Some((29_001, 59)));
    assert_eq!(log.offset_for_timestamp(17_500).unwrap(), Some((36, 18_000)));
}

#[test]
fn flush_policy() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        flush_messages: 5,
        flush_ms: 1_000,
        ..LogConfig::default()
    };
    let mut log = PartitionLog::open(dir.path(), config).unwrap();
    let (info, _) = append(&mut log, &[simple_batch(3, 10, 0)], 100);
    assert!(!info.flushed);
    assert_eq!((log.flushed_offset(), log.unflushed_messages()), (0, 3));
    assert!(!log.needs_time_flush(1_099));
    assert!(log.needs_time_flush(1_100));
    let (info, _) = append(&mut log, &[simple_batch(2, 10, 0)], 200);
    assert!(info.flushed);
    assert_eq!((log.flushed_offset(), log.unflushed_messages()), (5, 0));
    assert!(!log.needs_time_flush(10_000));
}

#[test]
fn batch_headers_scan_across_segments() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        segment_bytes: 1_000,
        index_interval_bytes: 100,
        ..LogConfig::default()
    };
    let mut log = PartitionLog::open(dir.path(), config).unwrap();
    fill(&mut log, 20, 2, 0, 1);
    let headers: Vec<_> = log.batch_headers(13).collect::<Result<_, _>>().unwrap();
    let bases: Vec<i64> = headers.iter().map(|h| h.base_offset).collect();
    assert_eq!(bases, (12..40).step_by(2).collect::<Vec<_>>());
}
