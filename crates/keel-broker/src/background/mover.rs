//! Mover passes driven one at a time on a broker with a capacity tier.

use std::sync::atomic::Ordering;

use std::sync::Arc;

use crate::testing::{append_keyed, capacity_dir, create_topic, open_broker};
use keel_data::mover::pass;

/// Small segments, and every copied segment released from the fast tier.
const TIERED: [(&str, &str); 2] = [("segment.bytes", "1024"), ("local.retention.bytes", "0")];

fn records(n: usize) -> Vec<(String, String)> {
    (0..n).map(|i| (format!("key-{i}"), "v".repeat(40))).collect()
}

fn pairs(records: &[(String, String)]) -> Vec<(&str, &str)> {
    records.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// Whether every file of a copy is in the capacity tier.
fn in_tier(root: &std::path::Path, object: &str) -> bool {
    ["log", "index", "timeindex"]
        .iter()
        .all(|suffix| capacity_dir(root).join(format!("{object}.{suffix}")).exists())
}

/// A partition whose log cannot be opened (offline from start-up) must not
/// stop the mover for the others: the healthy partition's sealed segments
/// are still copied and its local copies released. The offline partition
/// is counted, and the orphan sweep, which cannot read its manifest, keeps
/// its copies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offline_partition_does_not_stop_the_mover_for_the_others() {
    let root = tempfile::tempdir().unwrap();
    // Every pass sweeps, and every copy not named is old enough to go.
    let sets = [("keel.tier.orphan.grace.ms", "1")];
    let broker = open_broker(root.path(), &sets);
    let topic = create_topic(&broker, "t", 2, &TIERED).await;
    let records = records(60);
    for p in &topic.partitions {
        append_keyed(p, &pairs(&records)).await;
    }
    pass(&broker.data).await.unwrap();
    let offline_copies = topic.partitions[0].with_log(|log| log.tiered_segments()).unwrap();
    assert!(!offline_copies.is_empty());
    for p in &topic.partitions {
        append_keyed(p, &pairs(&records)).await;
    }
    broker.shutdown();
    drop((topic, broker));
    // Partition 0's log no longer opens; its tier manifest is intact.
    let recovery_point = root.path().join("data/t-0/recovery-point");
    std::fs::remove_file(&recovery_point).unwrap();
    std::fs::create_dir(&recovery_point).unwrap();

    let broker = open_broker(root.path(), &sets);
    let topic = broker.data.topics.get("t").unwrap();
    assert!(
        topic.partitions[0].unavailable().is_some(),
        "partition 0 is offline"
    );
    let healthy = Arc::clone(&topic.partitions[1]);
    let (copied, sealed) = healthy
        .with_log(|log| (log.tiered_segments().len(), log.copy_candidates().len()))
        .unwrap();
    assert!(sealed >= 2, "{sealed} sealed segments to copy");

    pass(&broker.data)
        .await
        .expect("a pass goes on past an offline partition");
    let tiered = healthy.with_log(|log| log.tiered_segments()).unwrap();
    assert_eq!(
        tiered.len(),
        copied + sealed,
        "every sealed segment copied: {tiered:?}"
    );
    assert_eq!(
        broker.data.mover.released_segments.load(Ordering::Relaxed),
        sealed as u64,
        "and released from the fast tier"
    );
    assert_eq!(broker.data.mover.partitions_set_aside.load(Ordering::Relaxed), 1);
    for copy in &offline_copies {
        assert!(
            in_tier(root.path(), &copy.object),
            "the offline partition's copy {} is kept",
            copy.object
        );
    }
}
