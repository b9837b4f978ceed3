//! Copies of sealed segments into each colder tier (a capacity dir and a
//! `file://` object store), read back by offset and timestamp exactly as the
//! local log answers, verified, and deleted. S3 is covered by the Python
//! suite against a real S3-compatible server.

use std::path::{Path, PathBuf};

use keel_log::batch::validate_batches;
use keel_log::faults::{FaultEffect, FaultOp, FaultRule, FaultyStorage};
use keel_log::storage::DiskStorage;
use keel_log::testing::simple_batch;
use keel_log::{LogConfig, PartitionLog, Tier, TierState};
use keel_tier::{Budget, IoClass, RemoteSettings, Tiers};

const T0: i64 = 1_700_000_000_000;

fn filled_log(dir: &Path) -> PartitionLog {
    let config = LogConfig {
        segment_bytes: 64 * 1024,
        index_interval_bytes: 1024,
        retention_ms: -1,
        ..LogConfig::default()
    };
    let mut log = PartitionLog::open(dir, config).unwrap();
    for i in 0..300 {
        // Mixed sizes, one batch larger than a read window.
        let (count, len) = if i == 77 {
            (3, 150_000)
        } else {
            (1 + i % 7, 60 + i % 300)
        };
        let mut buf = simple_batch(count, len, T0 + i as i64 * 10);
        let headers = validate_batches(&buf).unwrap();
        log.append(&mut buf, &headers, T0).unwrap();
    }
    log.complete_seals().unwrap();
    log
}

fn tiers(kind: &str, root: &Path) -> Tiers {
    match kind {
        "capacity" => Tiers::new(
            DiskStorage::shared(),
            &[root.join("cap-a"), root.join("cap-b")],
            None,
        )
        .unwrap(),
        _ => Tiers::new(
            DiskStorage::shared(),
            &[],
            Some(&RemoteSettings {
                url: format!("file://{}", root.join("bucket").display()),
                ..RemoteSettings::default()
            }),
        )
        .unwrap(),
    }
}

fn files_under(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out
}

async fn round_trip(kind: &str, tier: Tier) {
    let data = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let tiers = tiers(kind, root.path());
    assert!(tiers.has(tier));
    let mut log = filled_log(data.path());
    let end = log.log_end_offset();
    let reference: Vec<_> = (0..end)
        .map(|o| log.read_plan(o, 1).unwrap().execute().unwrap())
        .collect();
    let ts_reference: Vec<_> = (0..300)
        .map(|i| log.offset_for_timestamp(T0 + i * 10 + 1).unwrap())
        .collect();

    let budget = Budget::unlimited(IoClass::TierMove);
    for (i, c) in log.copy_candidates().into_iter().enumerate() {
        let object = format!("topic-0011/0/{:020}-{i}", c.base_offset);
        log.begin_copy(&c, tier, object.clone()).unwrap();
        tiers.copy(tier, &c, &object, &budget).await.unwrap();
        assert!(log.finish_copy(&object).unwrap());
    }
    while let Some((base, ..)) = log.oldest_releasable() {
        log.release_local(base).unwrap();
    }
    assert_eq!(log.segment_count(), 1, "only the active segment stays local");
    let files = files_under(root.path());
    assert!(files.iter().all(|f| !f
        .display()
        .to_string()
        .contains(&data.path().display().to_string())));
    assert!(files.len() >= 3 * log.tiered_segments().len(), "{files:?}");

    let log = std::sync::Arc::new(log);
    let tiers = std::sync::Arc::new(tiers);
    let (l, t) = (log.clone(), tiers.clone());
    tokio::task::spawn_blocking(move || {
        for offset in 0..end {
            let plan = l.read_plan(offset, 1).unwrap();
            let got = match plan.tiered_segment() {
                Some(seg) => t.read_blocking(seg, offset, 1).unwrap().bytes,
                None => plan.execute().unwrap(),
            };
            assert_eq!(got, reference[offset as usize], "offset {offset}");
        }
        for (i, want) in ts_reference.iter().enumerate() {
            let target = T0 + i as i64 * 10 + 1;
            let plan = l.reader().timestamp_plan(target).unwrap();
            let got = match plan.tiered_segment() {
                Some(seg) => t
                    .find_timestamp_blocking(seg, target, plan.log_start_offset())
                    .unwrap(),
                None => plan.execute().unwrap(),
            };
            assert_eq!(&got, want, "timestamp {target}");
        }
    })
    .await
    .unwrap();
    let stats = tiers.stats();
    assert_eq!(stats.copies as usize, log.tiered_segments().len());
    assert!(stats.read_bytes > 0 && stats.read_failures == 0, "{stats:?}");

    for seg in &log.tiered_segments() {
        tiers.delete(seg).await.unwrap();
        tiers.delete(seg).await.unwrap();
    }
    assert!(files_under(root.path()).is_empty(), "every copy deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_dirs_round_trip() {
    round_trip("capacity", Tier::Capacity).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_object_store_round_trip() {
    round_trip("remote", Tier::Remote).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_copy_fails_verification_and_a_missing_tier_is_an_error() {
    let data = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let tiers = tiers("capacity", root.path());
    let mut log = filled_log(data.path());
    let c = log.copy_candidates()[0].clone();
    assert!(
        tiers
            .copy(Tier::Remote, &c, "x/0/a", &Budget::unlimited(IoClass::TierMove))
            .await
            .is_err(),
        "no remote tier"
    );

    // A copy whose source changed under it (bit rot in the fast tier) must
    // not verify.
    let path = data.path().join(format!("{:020}.log", c.base_offset));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[100] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
    log.begin_copy(&c, Tier::Capacity, "x/0/b".into()).unwrap();
    let err = tiers
        .copy(Tier::Capacity, &c, "x/0/b", &Budget::unlimited(IoClass::TierMove))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{err}");
    assert_eq!(tiers.stats().copy_failures, 2);
    log.abort_copy("x/0/b").unwrap();
    assert_eq!(log.pending_deletes()[0].state, TierState::Deleting);
}

/// A copy held as uncommitted (written before any manifest names it) is
/// left out of the listing the orphan sweep works from, until every hold
/// on it is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_held_as_uncommitted_is_not_listed() {
    let data = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let tiers = tiers("capacity", root.path());
    let log = filled_log(data.path());
    let budget = Budget::unlimited(IoClass::TierMove);
    let objects = ["c/t-0011/0/a", "c/t-0011/0/b"];
    let segment = log.copy_candidates().remove(0);
    let (first, second) = (
        tiers.hold_uncommitted(objects[0]),
        tiers.hold_uncommitted(objects[0]),
    );
    for object in objects {
        tiers
            .copy(Tier::Capacity, &segment, object, &budget)
            .await
            .unwrap();
    }
    let listed = || async {
        let mut names: Vec<String> = tiers
            .list_copies(Tier::Capacity, "c")
            .await
            .unwrap()
            .into_keys()
            .collect();
        names.sort();
        names
    };
    assert_eq!(listed().await, [objects[1]]);
    drop(first);
    assert_eq!(listed().await, [objects[1]], "held twice");
    drop(second);
    assert_eq!(listed().await, objects);
}

/// Capacity copies go through the storage seam: a failed write or fsync of
/// a copy fails the copy (counted, nothing claimed copied), and the same
/// copy succeeds once the disk behaves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_capacity_disk_fails_the_copy_and_claims_nothing() {
    let data = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let faulty = std::sync::Arc::new(FaultyStorage::new(DiskStorage::shared()));
    let tiers = Tiers::new(faulty.clone(), &[root.path().join("cap")], None).unwrap();
    let log = filled_log(data.path());
    let segment = log.copy_candidates().remove(0);
    let budget = Budget::unlimited(IoClass::TierMove);
    let cap = root.path().join("cap").display().to_string();

    for (n, rule) in [
        FaultRule::new(FaultOp::Write, FaultEffect::Eio).path(&cap),
        FaultRule::new(FaultOp::Sync, FaultEffect::Eio).path(&cap),
        FaultRule::new(FaultOp::Write, FaultEffect::Short(100)).path(&cap),
        FaultRule::new(FaultOp::Open, FaultEffect::Emfile).path(&cap),
    ]
    .into_iter()
    .enumerate()
    {
        faulty.add(rule.clone());
        let err = tiers
            .copy(Tier::Capacity, &segment, "t-0011/0/a", &budget)
            .await
            .expect_err(&format!("{rule:?} must fail the copy"));
        assert!(faulty.injected() > 0, "{rule:?} fired");
        let stats = tiers.stats();
        assert_eq!(stats.copies, 0, "{rule:?}: {err}");
        assert_eq!(stats.copy_failures, n as u64 + 1, "{rule:?}");
        faulty.clear();
    }
    tiers
        .copy(Tier::Capacity, &segment, "t-0011/0/a", &budget)
        .await
        .unwrap();
    assert_eq!(tiers.stats().copies, 1);
    let listed = tiers.list_copies(Tier::Capacity, "t-0011").await.unwrap();
    assert_eq!(listed.keys().collect::<Vec<_>>(), ["t-0011/0/a"]);
}
