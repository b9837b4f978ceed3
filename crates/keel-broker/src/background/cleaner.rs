//! Cleaner passes driven one at a time on a broker with a capacity tier.

use std::path::Path;
use std::time::SystemTime;

use keel_log::clean::CleanSource;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::testing::{append_keyed, capacity_dir, create_topic, open_broker};
use keel_data::cleaner::ColdAccess;
use keel_data::mover::pass;
use keel_log::clean::{KeyMap, PassOptions};

/// Compacted, small segments, every copied segment released from the fast
/// tier (so the cleaner reads and rewrites them in the capacity tier).
const COMPACTED_COLD: [(&str, &str); 3] = [
    ("cleanup.policy", "compact"),
    ("segment.bytes", "1024"),
    ("local.retention.bytes", "0"),
];

/// A pass that cleans everything sealed.
fn eager() -> PassOptions {
    PassOptions {
        now_ms: keel_log::clock::now_ms(),
        min_compaction_lag_ms: 0,
        max_compaction_lag_ms: i64::MAX,
        min_cleanable_dirty_ratio: 0.0,
        delete_retention_ms: 0,
    }
}

/// Sets every file under `dir` an hour back.
fn backdate(dir: &Path) {
    let an_hour_ago = SystemTime::now() - Duration::from_secs(3600);
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            backdate(&path);
        } else {
            let file = std::fs::File::options().write(true).open(&path).unwrap();
            file.set_modified(an_hour_ago).unwrap();
        }
    }
}

/// `rounds` rounds of the same 20 keys (`key-00`..), valued `round-<n>`.
async fn append_rounds(p: &Arc<keel_data::partition::Partition>, rounds: usize) {
    for round in 0..rounds {
        let value = format!("round-{round}");
        let records: Vec<(String, &str)> = (0..20).map(|k| (format!("key-{k:02}"), value.as_str())).collect();
        let records: Vec<(&str, &str)> = records.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        append_keyed(p, &records).await;
    }
}

/// A cleaned cold group is stored in the capacity tier before its swap
/// names it in the manifest; when storing it (the paced copy and read-back)
/// outlasts `keel.tier.orphan.grace.ms`, the orphan sweep meets it old and
/// unnamed. It must keep it: the swap that follows names it as the only
/// copy of the group's records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_orphan_sweep_keeps_a_cleaned_cold_copy_waiting_for_its_swap() {
    let root = tempfile::tempdir().unwrap();
    let broker = open_broker(root.path(), &[("keel.tier.orphan.grace.ms", "1")]);
    let topic = create_topic(&broker, "c", 1, &COMPACTED_COLD).await;
    let p = Arc::clone(&topic.partitions[0]);
    append_rounds(&p, 4).await;
    pass(&broker.data).await.unwrap();
    let cold = p.with_log(|log| log.tiered_segments()).unwrap();
    assert!(cold.len() >= 3 && cold.iter().all(|t| t.is_cold()), "{cold:?}");

    let runtime = tokio::runtime::Handle::current();
    let source: CleanSource = p.with_log(|log| log.clean_source()).unwrap();
    let source = source.with_cold(ColdAccess::new(&broker.data, &runtime, &topic, p.index));
    let (b, partition, root_dir) = (Arc::clone(&broker), Arc::clone(&p), root.path().to_path_buf());
    let outcome = tokio::task::spawn_blocking(move || {
        let mut map = KeyMap::with_budget(1 << 20);
        let mut commit = |group: keel_log::clean::CleanedGroup| {
            // The group's copy is stored; its read-back took longer than
            // the grace, and a mover pass sweeps before the swap.
            backdate(&capacity_dir(&root_dir));
            runtime.block_on(pass(&b.data))?;
            partition.with_log(|log| log.commit_cleaned(group))?
        };
        source.clean(&mut map, &eager(), &mut |_: u64| {}, &mut commit)
    })
    .await
    .unwrap();
    let stats = outcome.expect("the pass").expect("cleaned");
    assert!(stats.groups_swapped > 0, "{stats:?}");
    // Swapped in, the copies are named; the next sweep keeps them too.
    for sweep in 0..2 {
        if sweep == 1 {
            backdate(&capacity_dir(root.path()));
            pass(&broker.data).await.unwrap();
        }
        for copy in p.with_log(|log| log.tiered_segments()).unwrap() {
            if copy.is_cold() {
                let log = capacity_dir(root.path()).join(format!("{}.log", copy.object));
                assert!(
                    log.exists(),
                    "the copy {} the manifest names is gone",
                    copy.object
                );
            }
        }
    }
    assert_eq!(broker.data.mover.orphans_deleted.load(Ordering::Relaxed), 0);
}

/// A cold copy the cleaner replaced stays in its tier for
/// `file.delete.delay.ms` after the swap, so a fetch that planned its read
/// against the copy before the swap still finds it; with no delay the
/// mover's next pass deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_cold_copy_stays_for_the_file_delete_delay() {
    let root = tempfile::tempdir().unwrap();
    let broker = open_broker(root.path(), &[]);
    let on_disk = |object: &String| capacity_dir(root.path()).join(format!("{object}.log")).exists();
    for (name, delay) in [("delayed", "3600000"), ("at-once", "0")] {
        let mut configs = COMPACTED_COLD.to_vec();
        configs.push(("file.delete.delay.ms", delay));
        let topic = create_topic(&broker, name, 1, &configs).await;
        let p = Arc::clone(&topic.partitions[0]);
        append_rounds(&p, 4).await;
        pass(&broker.data).await.unwrap();
        let copies = |state: keel_log::TierState| -> Vec<String> {
            p.with_log(|log| log.tiered_segments())
                .unwrap()
                .into_iter()
                .filter(|t| t.state == state)
                .map(|t| t.object)
                .collect()
        };
        let before = copies(keel_log::TierState::Cold);
        assert!(before.len() >= 3, "{before:?}");

        let runtime = tokio::runtime::Handle::current();
        let source: CleanSource = p.with_log(|log| log.clean_source()).unwrap();
        let source = source.with_cold(ColdAccess::new(&broker.data, &runtime, &topic, p.index));
        let partition = Arc::clone(&p);
        let stats = tokio::task::spawn_blocking(move || {
            let mut map = KeyMap::with_budget(1 << 20);
            let mut commit =
                |group: keel_log::clean::CleanedGroup| partition.with_log(|log| log.commit_cleaned(group))?;
            source.clean(&mut map, &eager(), &mut |_: u64| {}, &mut commit)
        })
        .await
        .unwrap()
        .expect("the pass")
        .expect("cleaned");
        assert!(stats.groups_swapped > 0, "{stats:?}");
        let marked = copies(keel_log::TierState::Deleting);
        assert!(
            !marked.is_empty() && marked.iter().all(|o| before.contains(o)),
            "{marked:?}"
        );
        pass(&broker.data).await.unwrap();
        if delay == "0" {
            assert!(copies(keel_log::TierState::Deleting).is_empty(), "{name}");
            assert!(!marked.iter().any(on_disk), "{name}: a replaced copy stayed");
        } else {
            assert_eq!(copies(keel_log::TierState::Deleting), marked, "{name}");
            assert!(
                marked.iter().all(on_disk),
                "{name}: a replaced copy went before the delay"
            );
        }
    }
}
