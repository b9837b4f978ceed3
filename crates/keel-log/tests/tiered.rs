//! The tier lifecycle of a partition log: copy, release, read routed by
//! offset, retention and DeleteRecords across tiers, and start-up after a
//! crash at each step. The colder tier here is a plain directory the test
//! copies files into, as the capacity tier does.

mod common;

use std::fs;
use std::path::Path;

use bytes::Bytes;
use keel_log::testing::simple_batch;
use keel_log::{
    find_timestamp_in_windows, read_windows, LogConfig, PartitionLog, SealedSegment, SegmentIndex, Tier,
    TierState, TieredSegment,
};

use common::append;

const T0: i64 = 1_700_000_000_000;

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 4096,
        index_interval_bytes: 512,
        retention_ms: -1,
        ..LogConfig::default()
    }
}

/// 40 batches of 5 records (~500 bytes each) over several segments;
/// returns each stored batch with its base offset and timestamp.
fn fill(log: &mut PartitionLog) -> Vec<(i64, i64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut next = 0;
    for i in 0..40 {
        let ts = T0 + i * 1000;
        let (_, stored) = append(log, &[simple_batch(5, 80, ts)], ts);
        out.push((next, ts, stored.concat()));
        next += 5;
    }
    out
}

/// Copies a sealed segment's files into `tier` as `object`, like a mover.
fn copy(segment: &SealedSegment, tier: &Path, object: &str) {
    let mut log = vec![0u8; segment.size_bytes as usize];
    let file = segment.log.open().unwrap();
    keel_log::storage::read_exact_at(file.as_ref(), &mut log, 0).unwrap();
    let path = tier.join(object);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(format!("{}.log", path.display()), log).unwrap();
    fs::write(format!("{}.index", path.display()), &segment.index).unwrap();
    fs::write(format!("{}.timeindex", path.display()), &segment.time_index).unwrap();
}

/// Copies every candidate and releases the local copies of all but the
/// last `keep_local` sealed segments.
fn move_segments(log: &mut PartitionLog, tier: &Path, keep_local: usize) {
    let candidates = log.copy_candidates();
    for (i, c) in candidates.iter().enumerate() {
        let object = format!("t-00ff/0/{:020}-{i}", c.base_offset);
        let entry = log.begin_copy(c, Tier::Capacity, object.clone()).unwrap();
        assert_eq!(entry.state, TierState::Copying);
        copy(c, tier, &object);
        assert!(log.finish_copy(&object).unwrap());
    }
    for _ in 0..candidates.len().saturating_sub(keep_local) {
        let (base, ..) = log.oldest_releasable().unwrap();
        log.release_local(base).unwrap();
    }
}

/// What the tier store does with a tiered plan: index, then ranged reads.
fn read_tiered(tier: &Path, t: &TieredSegment, offset: i64, max_bytes: usize) -> Bytes {
    let base = tier.join(&t.object);
    let read_file = |suffix: &str| fs::read(format!("{}.{suffix}", base.display())).unwrap();
    let index = SegmentIndex::decode(
        t.base_offset,
        t.size_bytes,
        &read_file("index"),
        &read_file("timeindex"),
    )
    .unwrap();
    let data = Bytes::from(read_file("log"));
    let start = index.position_of(offset);
    read_windows(
        start,
        t.size_bytes,
        offset,
        max_bytes,
        index.window_end(start, max_bytes),
        |pos, len| Ok(data.slice(pos as usize..(pos + len) as usize)),
    )
    .unwrap()
}

fn read_any(log: &PartitionLog, tier: &Path, offset: i64, max_bytes: usize) -> Bytes {
    let plan = log.read_plan(offset, max_bytes).unwrap();
    match plan.tiered_segment() {
        Some(t) => read_tiered(tier, t, offset, max_bytes),
        None => plan.execute().unwrap(),
    }
}

#[test]
fn reads_are_routed_by_offset_and_match_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let tier = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), config()).unwrap();
    let batches = fill(&mut log);
    let local_before = log.segment_count();
    assert!(local_before > 4, "several segments: {local_before}");
    move_segments(&mut log, tier.path(), 1);
    assert_eq!(
        log.segment_count(),
        2,
        "one sealed and the active segment stay local"
    );
    assert!(log.cold_bytes() > 0);
    assert_eq!(
        log.log_start_offset(),
        0,
        "moving data does not move the log start"
    );
    for (base, _, bytes) in &batches {
        let got = read_any(&log, tier.path(), *base, 1);
        assert_eq!(&got[..], &bytes[..], "offset {base}");
        let plan = log.read_plan(base + 4, 1).unwrap();
        assert_eq!(
            plan.tiered_segment().is_some(),
            *base < log.segment_base_offsets()[0]
        );
    }
    // A big read from a cold segment stops at its end; the next starts there.
    let first = log.tiered_segments()[0].clone();
    let got = read_any(&log, tier.path(), 0, 1 << 20);
    assert_eq!(got.len() as u64, first.size_bytes);

    // Reopen: the same routing, from the manifest.
    drop(log);
    let log = PartitionLog::open(dir.path(), config()).unwrap();
    assert_eq!(log.log_start_offset(), 0);
    assert_eq!(log.log_end_offset(), 200);
    for (base, _, bytes) in &batches {
        assert_eq!(&read_any(&log, tier.path(), *base, 1)[..], &bytes[..]);
    }
}

#[test]
fn timestamps_are_found_in_cold_segments() {
    let dir = tempfile::tempdir().unwrap();
    let tier = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), config()).unwrap();
    let batches = fill(&mut log);
    let max_before = log.max_timestamp();
    let expected: Vec<_> = batches
        .iter()
        .map(|(_, ts, _)| log.offset_for_timestamp(*ts - 1).unwrap())
        .collect();
    move_segments(&mut log, tier.path(), 0);
    for ((_, ts, _), want) in batches.iter().zip(expected) {
        let plan = log.reader().timestamp_plan(*ts - 1).unwrap();
        let got = match plan.tiered_segment() {
            None => plan.execute().unwrap(),
            Some(t) => {
                let base = tier.path().join(&t.object);
                let f = |s: &str| fs::read(format!("{}.{s}", base.display())).unwrap();
                let index =
                    SegmentIndex::decode(t.base_offset, t.size_bytes, &f("index"), &f("timeindex")).unwrap();
                let data = Bytes::from(f("log"));
                find_timestamp_in_windows(
                    index.position_for_timestamp(*ts - 1),
                    t.size_bytes,
                    *ts - 1,
                    plan.log_start_offset(),
                    |pos, len| Ok(data.slice(pos as usize..(pos + len) as usize)),
                )
                .unwrap()
            }
        };
        assert_eq!(got, want, "timestamp {ts}");
    }
    assert_eq!(log.max_timestamp(), max_before);
    assert_eq!(max_before.unwrap().0, batches.last().unwrap().1 + 4);
}

#[test]
fn retention_and_delete_records_reach_cold_segments_first() {
    let dir = tempfile::tempdir().unwrap();
    let tier = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), config()).unwrap();
    fill(&mut log);
    move_segments(&mut log, tier.path(), 1);
    let cold: Vec<_> = log
        .tiered_segments()
        .iter()
        .filter(|t| t.is_cold())
        .cloned()
        .collect();
    assert!(cold.len() >= 3);

    // DeleteRecords inside the second cold segment: the first goes.
    log.delete_records_before(cold[1].base_offset + 1).unwrap();
    assert_eq!(log.log_start_offset(), cold[1].base_offset + 1);
    assert_eq!(
        log.pending_deletes(),
        vec![TieredSegment {
            state: TierState::Deleting,
            ..cold[0].clone()
        }]
    );
    assert!(log.read_plan(cold[0].base_offset, 100).is_err());

    // Retention by bytes, sized to drop exactly the oldest cold segment.
    drop(log);
    let log = PartitionLog::open(dir.path(), config()).unwrap();
    assert_eq!(log.pending_deletes().len(), 1, "Deleting survives a reopen");
    let limit = log.total_bytes() - cold[1].size_bytes;
    drop(log);
    let mut log = PartitionLog::open(
        dir.path(),
        LogConfig {
            retention_bytes: limit as i64,
            ..config()
        },
    )
    .unwrap();
    let outcome = log.apply_retention(T0).unwrap();
    assert_eq!(outcome.deleted_segments, 1, "{outcome:?}");
    assert_eq!(log.log_start_offset(), cold[2].base_offset);
    assert_eq!(log.pending_deletes().len(), 2);

    // Retention to nothing: every cold segment and every sealed local one.
    drop(log);
    let mut log = PartitionLog::open(
        dir.path(),
        LogConfig {
            retention_bytes: 0,
            ..config()
        },
    )
    .unwrap();
    log.apply_retention(T0).unwrap();
    assert!(log
        .tiered_segments()
        .iter()
        .all(|t| t.state == TierState::Deleting));
    assert_eq!(log.segment_count(), 1);
    assert_eq!(log.log_start_offset(), log.segment_base_offsets()[0]);
    assert_eq!(log.total_bytes(), log.size_bytes());
    // The tier confirms each deletion; the manifest forgets it.
    for t in log.pending_deletes() {
        log.forget_deleted(&t.object).unwrap();
    }
    assert!(log.pending_deletes().is_empty());
}

#[test]
fn discarding_a_tier_deletes_what_only_it_held_and_marks_its_copies() {
    let dir = tempfile::tempdir().unwrap();
    let tier = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), config()).unwrap();
    let stored = fill(&mut log);
    move_segments(&mut log, tier.path(), 2);
    let before = log.tiered_segments();
    let cold: Vec<_> = before.iter().filter(|t| t.is_cold()).cloned().collect();
    let both: Vec<_> = before
        .iter()
        .filter(|t| t.state == TierState::Both)
        .cloned()
        .collect();
    assert!(cold.len() >= 2 && both.len() == 2, "{before:?}");
    let first_local = log.segment_base_offsets()[0];
    assert_eq!(first_local, cold.last().unwrap().next_offset);

    // Another tier is left alone.
    assert_eq!(log.discard_tier(Tier::Remote).unwrap(), 0);
    assert!(log.pending_deletes().is_empty());

    assert_eq!(log.discard_tier(Tier::Capacity).unwrap(), first_local);
    assert_eq!(log.log_start_offset(), first_local);
    let mut pending = log.pending_deletes();
    pending.sort_by_key(|t| t.base_offset);
    assert_eq!(pending.len(), before.len(), "every copy goes: {pending:?}");
    assert!(log.read_plan(cold[0].base_offset, 100).is_err());
    // What stays is read locally, byte for byte.
    let (_, _, bytes) = stored.iter().find(|(base, ..)| *base == first_local).unwrap();
    assert_eq!(
        &read_any(&log, tier.path(), first_local, bytes.len())[..],
        &bytes[..]
    );
    // The local segments are candidates again (for another tier), and the
    // discard survives a reopen.
    assert_eq!(log.copy_candidates().len(), both.len());
    drop(log);
    let log = PartitionLog::open(dir.path(), config()).unwrap();
    assert_eq!(
        (log.log_start_offset(), log.pending_deletes().len()),
        (first_local, before.len())
    );
}

#[test]
fn start_up_rolls_back_copies_and_finishes_releases() {
    let dir = tempfile::tempdir().unwrap();
    let tier = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), config()).unwrap();
    let batches = fill(&mut log);
    let candidates = log.copy_candidates();
    // Crash during a copy: the entry says Copying, the copy is partial.
    let object = format!("t-00ff/0/{:020}-a", candidates[0].base_offset);
    log.begin_copy(&candidates[0], Tier::Remote, object.clone())
        .unwrap();
    drop(log);
    let mut log = PartitionLog::open(dir.path(), config()).unwrap();
    let pending = log.pending_deletes();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].object, object);
    assert_eq!(
        log.copy_candidates().len(),
        candidates.len(),
        "the segment is copied again"
    );
    assert!(
        log.begin_copy(&candidates[0], Tier::Remote, object.clone())
            .is_err(),
        "names are never reused"
    );

    // Crash between "Cold" in the manifest and the local deletion: simulate
    // by putting the local files back after a release.
    let saved: Vec<(String, Vec<u8>)> = ["log", "index", "timeindex"]
        .iter()
        .map(|s| {
            let p = dir.path().join(format!("{:020}.{s}", candidates[0].base_offset));
            (p.display().to_string(), fs::read(&p).unwrap())
        })
        .collect();
    move_segments(&mut log, tier.path(), candidates.len() - 1);
    assert_eq!(log.segment_base_offsets()[0], candidates[1].base_offset);
    drop(log);
    for (path, bytes) in &saved {
        fs::write(path, bytes).unwrap();
    }
    let log = PartitionLog::open(dir.path(), config()).unwrap();
    assert!(
        !Path::new(&saved[0].0).exists(),
        "the released local copy is deleted at start-up"
    );
    assert_eq!(log.segment_base_offsets()[0], candidates[1].base_offset);
    assert_eq!(log.log_start_offset(), 0);
    for (base, _, bytes) in &batches {
        assert_eq!(&read_any(&log, tier.path(), *base, 1)[..], &bytes[..]);
    }
}

#[test]
fn a_copy_of_a_segment_deleted_meanwhile_is_not_kept() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), config()).unwrap();
    fill(&mut log);
    let c = log.copy_candidates()[0].clone();
    let object = format!("t-00ff/0/{:020}-x", c.base_offset);
    log.begin_copy(&c, Tier::Capacity, object.clone()).unwrap();
    log.delete_records_before(c.next_offset).unwrap();
    assert!(!log.finish_copy(&object).unwrap(), "retention won the race");
    assert_eq!(log.pending_deletes()[0].object, object);
    assert!(log.oldest_releasable().is_none());
}

#[test]
fn sequential_scans_read_each_batch_once() {
    // Windows end on batch boundaries from the index, so a scan with fetches
    // smaller than a window does not re-read the batch a window cut.
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(
        dir.path(),
        LogConfig {
            segment_bytes: 1 << 20,
            ..config()
        },
    )
    .unwrap();
    fill(&mut log);
    assert_eq!(log.segment_count(), 1);
    log.close().unwrap(); // writes the active segment's index files
    let data = Bytes::from(fs::read(dir.path().join(format!("{:020}.log", 0))).unwrap());
    let index = SegmentIndex::decode(
        0,
        data.len() as u64,
        &fs::read(dir.path().join(format!("{:020}.index", 0))).unwrap(),
        &fs::read(dir.path().join(format!("{:020}.timeindex", 0))).unwrap(),
    )
    .unwrap();
    for max_bytes in [700usize, 1500, 5000] {
        let (mut offset, mut requested, mut served) = (0i64, 0u64, 0usize);
        // A scan continues where the last read ended (the broker keeps that
        // position as a `ScanHint`); the first read starts from the index.
        let mut next_start = index.position_of(0);
        while offset < log.log_end_offset() {
            let start = next_start;
            let got = read_windows(
                start,
                data.len() as u64,
                offset,
                max_bytes,
                index.window_end(start, max_bytes),
                |pos, len| {
                    requested += len;
                    Ok(data.slice(pos as usize..(pos + len) as usize))
                },
            )
            .unwrap();
            served += got.len();
            next_start = start + got.len() as u64;
            let mut at = 0;
            while at < got.len() {
                let h = keel_log::BatchHeader::parse(&got[at..]).unwrap();
                offset = h.last_offset() + 1;
                at += h.total_len();
            }
        }
        assert_eq!(served, data.len());
        assert!(
            requested as f64 <= data.len() as f64 * 1.05,
            "max_bytes {max_bytes}: read {requested} for {}",
            data.len()
        );
    }
}
