//! The compaction planner against the cleaner it models: a partition on
//! disk in the bulk-load-then-republish shape is scanned (records and
//! distinct keys, split at the cleaner's checkpoint), planned, then cleaned
//! pass by pass; the plan's passes and reclaimed bytes are what the passes
//! did.

use std::path::Path;

use keel_log::batch::validate_batches;
use keel_log::clean::{KeyMap, PassOptions, Skip};
use keel_log::plan::{keel_clean, scan_partition, CleanerBudget};
use keel_log::testing::BatchBuilder;
use keel_log::{CleanupPolicy, LogConfig, PartitionLog};

fn append(log: &mut PartitionLog, key: &str, value: &[u8]) {
    let mut buf = BatchBuilder::new(1_000)
        .record(Some(key.as_bytes()), Some(value))
        .build();
    let headers = validate_batches(&buf).unwrap();
    log.append(&mut buf, &headers, 1_000).unwrap();
}

fn open(dir: &Path) -> PartitionLog {
    let config = LogConfig {
        segment_bytes: 64 << 10,
        retention_ms: -1,
        cleanup: CleanupPolicy {
            delete: false,
            compact: true,
        },
        ..LogConfig::default()
    };
    PartitionLog::open(dir, config).unwrap()
}

#[test]
fn the_plan_matches_the_passes_the_cleaner_makes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("t-0");
    let mut log = open(&dir);
    let keys = 6_000;
    for round in 0..2 {
        for k in 0..keys {
            append(
                &mut log,
                &format!("key-{k:05}"),
                format!("round-{round}-{:0>80}", k).as_bytes(),
            );
        }
    }
    // A segment's worth of other keys: everything above is sealed.
    for k in 0..700 {
        append(&mut log, &format!("filler-{k}"), &[b'f'; 80]);
    }
    log.complete_seals().unwrap();

    let scan = scan_partition(&dir, &[]).unwrap();
    assert_eq!(scan.records, 2 * keys + 700);
    assert_eq!(scan.clean_records, 0);
    let within = |estimate: f64, exact: f64| (estimate / exact - 1.0).abs() < 0.02;
    assert!(within(scan.keys, (keys + 700) as f64), "{scan:?}");
    let section = scan.section();
    // The active segment holds fillers only; the rest is dirty.
    let sealed_fillers = 700 - scan.active_records;
    assert_eq!(section.dirty as u64, 2 * keys + sealed_fillers);
    assert!(
        within(section.dirty_keys, (keys + sealed_fillers) as f64),
        "{scan:?}"
    );

    // A map for a sixth of the keys.
    let map_bytes = keys / 6 * 16;
    let budget = CleanerBudget {
        dedupe_buffer_bytes: map_bytes,
        threads: 1,
        io_bytes_per_sec: None,
        segment_bytes: 64 << 10,
    };
    let planned = keel_clean(&section, budget.keel_map_keys());

    let options = PassOptions {
        now_ms: 2_000,
        min_compaction_lag_ms: 0,
        max_compaction_lag_ms: i64::MAX,
        min_cleanable_dirty_ratio: 0.5,
        delete_retention_ms: 0,
    };
    let mut map = KeyMap::with_budget(map_bytes as usize);
    let mut reclaimed = Vec::new();
    let mut read = 0.0;
    loop {
        let source = log.clean_source();
        match source
            .clean(&mut map, &options, &mut |_: u64| {}, &mut |g| {
                log.commit_cleaned(g)
            })
            .unwrap()
        {
            Ok(stats) => {
                reclaimed.push(stats.bytes_reclaimed as f64);
                read += stats.bytes_read as f64;
            }
            Err(Skip::NothingToClean | Skip::BelowDirtyRatio(_)) => break,
            Err(e) => panic!("{e}"),
        }
        assert!(reclaimed.len() < 20, "too many passes: {reclaimed:?}");
    }
    println!("planned {planned:?}\nreclaimed per pass {reclaimed:?}, read {read}");
    let reclaiming = reclaimed.iter().filter(|r| **r > 0.0).count() as u64;
    assert_eq!(reclaiming, planned.passes, "passes that reclaim");
    let total: f64 = reclaimed.iter().sum();
    assert!(
        (total / planned.bytes_reclaimed - 1.0).abs() < 0.05,
        "reclaimed {total} vs planned {}",
        planned.bytes_reclaimed
    );
    // Reads: each pass reads what it maps and everything below it.
    assert!(
        (read / planned.bytes_read - 1.0).abs() < 0.15,
        "read {read} vs planned {}",
        planned.bytes_read
    );
    // After cleaning, the scan finds it clean.
    let after = scan_partition(&dir, &[]).unwrap();
    assert_eq!(after.records, keys + 700);
    assert_eq!(
        after.records - after.clean_records - after.active_records,
        0,
        "{after:?}"
    );
}
