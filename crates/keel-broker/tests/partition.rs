//! The append pipeline of one partition: group commit, offsets, duplicates.

use std::sync::Arc;

use bytes::Bytes;
use keel_broker::health::DirHealth;
use keel_broker::partition::{Partition, PartitionParts};
use keel_log::batch::{validate_batches, BatchHeader};
use keel_log::testing::BatchBuilder;
use keel_log::LogConfig;
use keel_protocol::ResponseError;

fn batch(producer: Option<(i64, i32)>, records: usize) -> (Bytes, Vec<BatchHeader>) {
    let mut b = BatchBuilder::new(1_000);
    if let Some((pid, seq)) = producer {
        b = b.producer(pid, 0, seq);
    }
    for i in 0..records {
        b = b.record(Some(format!("k{i}").as_bytes()), Some(b"value"));
    }
    let bytes = b.build();
    let headers = validate_batches(&bytes).unwrap();
    (Bytes::from(bytes), headers)
}

fn open(dir: &std::path::Path) -> Arc<Partition> {
    let config = LogConfig {
        segment_bytes: 4096,
        ..LogConfig::default()
    };
    let tail = keel_tier::TailCache::new(1 << 20).partition();
    Arc::new(Partition::open(parts(dir, config, tail, cold())).unwrap())
}

fn parts(
    dir: &std::path::Path,
    config: LogConfig,
    tail: keel_tier::PartitionTail,
    cold: Arc<keel_tier::ColdReads>,
) -> PartitionParts {
    PartitionParts {
        topic: Arc::from("t"),
        index: 0,
        dir: dir.to_path_buf(),
        config,
        storage: keel_log::DiskStorage::shared(),
        health: DirHealth::new(dir),
        tail,
        cold,
        tiers: no_tiers(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_get_disjoint_contiguous_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(dir.path());
    let mut tasks = Vec::new();
    for i in 0..64usize {
        let p = Arc::clone(&p);
        tasks.push(tokio::spawn(async move {
            let n = 1 + i % 4;
            let (bytes, headers) = batch(None, n);
            (p.append(bytes, headers).await.unwrap().base_offset, n as i64)
        }));
    }
    let mut ranges = Vec::new();
    for t in tasks {
        ranges.push(t.await.unwrap());
    }
    ranges.sort();
    let mut next = 0;
    for (base, n) in ranges {
        assert_eq!(base, next, "offsets must be contiguous and disjoint");
        next += n;
    }
    assert_eq!(p.high_watermark(), next);
    let data = tokio::task::spawn_blocking({
        let plan = p.read_plan(0, 1 << 20).unwrap();
        move || plan.execute().unwrap()
    })
    .await
    .unwrap();
    let epochs: Vec<i32> = validate_batches(&data)
        .unwrap()
        .iter()
        .map(|h| h.partition_leader_epoch)
        .collect();
    assert!(
        epochs.iter().all(|e| *e == 0),
        "leader epoch stamped on every batch: {epochs:?}"
    );
}

#[tokio::test]
async fn retries_are_answered_with_the_original_offset_even_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(dir.path());
    let (filler, h) = batch(None, 3);
    p.append(filler, h).await.unwrap();
    let (b0, h0) = batch(Some((42, 0)), 2);
    assert_eq!(p.append(b0.clone(), h0.clone()).await.unwrap().base_offset, 3);
    assert_eq!(p.append(b0.clone(), h0.clone()).await.unwrap().base_offset, 3);
    assert_eq!(p.high_watermark(), 5);
    // A crash (no clean close): producer state is rebuilt from the log.
    drop(p);
    let p = open(dir.path());
    assert_eq!(p.append(b0, h0).await.unwrap().base_offset, 3);
    let (gap, hg) = batch(Some((42, 7)), 1);
    let err = p.append(gap, hg).await.unwrap_err();
    assert_eq!(err.error, ResponseError::OutOfOrderSequenceNumber);
    let (next, hn) = batch(Some((42, 2)), 1);
    assert_eq!(p.append(next, hn).await.unwrap().base_offset, 5);
}

#[tokio::test]
async fn appends_after_close_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(dir.path());
    p.close().unwrap();
    let (b, h) = batch(None, 1);
    assert_eq!(
        p.append(b, h).await.unwrap_err().error,
        ResponseError::NotLeaderOrFollower
    );
}

fn cold() -> Arc<keel_tier::ColdReads> {
    Arc::new(keel_tier::ColdReads::new(0, 2))
}

fn no_tiers() -> Arc<keel_tier::Tiers> {
    Arc::new(keel_tier::Tiers::new(&[], None).unwrap())
}

fn read_bytes(source: keel_broker::partition::ReadSource) -> (bool, Bytes) {
    use keel_broker::partition::ReadSource;
    match source {
        ReadSource::Memory(b) => (true, b.join()),
        ReadSource::Disk(plan) => (false, plan.execute().unwrap()),
        ReadSource::Pending(_) => panic!("no read-ahead runs in these tests"),
    }
}

/// Fetches of freshly appended data come from the tail cache, byte for byte
/// what the log holds; data older than the cache's run, and data written
/// before the partition was opened, come from the log files.
#[tokio::test]
async fn the_tail_is_served_from_memory_and_history_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        segment_bytes: 4096,
        ..LogConfig::default()
    };
    let cache = keel_tier::TailCache::new(2_000);
    let p = Arc::new(Partition::open(parts(dir.path(), config.clone(), cache.partition(), cold())).unwrap());
    let mut bases = Vec::new();
    for _ in 0..20 {
        let (bytes, headers) = batch(None, 5);
        bases.push(p.append(bytes, headers).await.unwrap().base_offset);
    }
    let hw = p.high_watermark();
    assert_eq!(hw, 100);
    // The newest batch: from memory, identical to the log's copy.
    let (memory, cached) = read_bytes(p.read(95, 1 << 20).unwrap());
    assert!(memory);
    let from_log = p.read_plan(95, 1 << 20).unwrap().execute().unwrap();
    assert_eq!(cached, from_log);
    // The budget holds only the newest batches; the oldest is read from the log.
    let stats = cache.stats();
    assert!(
        stats.used_bytes <= 2_000 && stats.evicted_batches > 0,
        "{stats:?}"
    );
    let (memory, oldest) = read_bytes(p.read(0, 1 << 20).unwrap());
    assert!(!memory);
    assert_eq!(
        &oldest[..],
        &p.read_plan(0, 1 << 20).unwrap().execute().unwrap()[..]
    );
    // At the high watermark there is nothing to read, from either source.
    let (_, empty) = read_bytes(p.read(hw, 1 << 20).unwrap());
    assert!(empty.is_empty());
    p.close().unwrap();
    // The writer task lets go of the partition just after its last reply.
    for _ in 0..1000 {
        if Arc::strong_count(&p) == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    drop(p);
    assert_eq!(cache.stats().used_bytes, 0, "a dropped partition frees its cache");
    // Reopened: nothing is cached until new appends arrive.
    let p = Arc::new(Partition::open(parts(dir.path(), config, cache.partition(), cold())).unwrap());
    assert!(!read_bytes(p.read(95, 1 << 20).unwrap()).0);
    let (bytes, headers) = batch(None, 5);
    assert_eq!(p.append(bytes, headers).await.unwrap().base_offset, 100);
    assert!(read_bytes(p.read(100, 1 << 20).unwrap()).0);
    assert!(!read_bytes(p.read(99, 1 << 20).unwrap()).0);
}

/// A sequential scan below the tail cache is read ahead: after each cold
/// read the next chunk is read before it is asked for, and the next fetch
/// takes it, or waits for it while it is still being read. Nothing is read
/// twice, and cold reads never insert into the tail cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_cold_reads_are_read_ahead_once() {
    use keel_broker::partition::ReadSource;
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        segment_bytes: 4096,
        ..LogConfig::default()
    };
    // A tail cache too small to hold anything: every read is cold.
    let cache = keel_tier::TailCache::new(1);
    let cold = cold();
    let p =
        Arc::new(Partition::open(parts(dir.path(), config, cache.partition(), Arc::clone(&cold))).unwrap());
    for _ in 0..40 {
        let (bytes, headers) = batch(None, 5);
        p.append(bytes, headers).await.unwrap();
    }
    let inserted = cache.stats().inserted_bytes;
    let (mut offset, mut all) = (0i64, Vec::new());
    let (mut disk, mut ahead) = (0, 0);
    while offset < p.high_watermark() {
        let bytes = match p.read(offset, 1_000).unwrap() {
            ReadSource::Memory(b) => {
                ahead += 1;
                b.join()
            }
            ReadSource::Pending(rx) => {
                ahead += 1;
                rx.await.unwrap().unwrap()
            }
            ReadSource::Disk(plan) => {
                disk += 1;
                p.spawn_cold_read(offset, plan, 1_000).await.unwrap().unwrap()
            }
        };
        offset = validate_batches(&bytes).unwrap().last().unwrap().last_offset() + 1;
        all.extend_from_slice(&bytes);
    }
    let mut expected = 0;
    let mut off = 0;
    while off < p.high_watermark() {
        let b = p.read_plan(off, 1_000).unwrap().execute().unwrap();
        off = validate_batches(&b).unwrap().last().unwrap().last_offset() + 1;
        expected += b.len();
    }
    assert_eq!(all.len(), expected, "every byte read once, in order");
    assert_eq!(
        cache.stats().inserted_bytes,
        inserted,
        "cold reads never insert into the tail cache"
    );
    let s = cold.stats();
    assert_eq!(
        disk, 1,
        "only the first read of the scan waits for the disk itself"
    );
    assert_eq!(s.read_ahead_hits, ahead, "{s:?}");
    assert_eq!(s.bytes as usize, expected, "nothing read twice: {s:?}");
}
