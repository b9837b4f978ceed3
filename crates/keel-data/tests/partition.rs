//! The append pipeline of one partition: group commit, offsets, duplicates.

use std::sync::Arc;

use bytes::Bytes;
use keel_data::health::DirHealth;
use keel_data::partition::{Partition, PartitionParts};
use keel_log::batch::{validate_batches, BatchHeader};
use keel_log::faults::FaultyStorage;
use keel_log::marker::{Marker, TxnWrite};
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
        topic_id: uuid::Uuid::nil(),
        index: 0,
        dir: dir.to_path_buf(),
        config,
        storage: keel_log::DiskStorage::shared(),
        health: DirHealth::new(dir),
        tail,
        cold,
        io: Arc::new(keel_tier::IoScheduler::new(keel_tier::Budgets::default())),
        tiers: no_tiers(),
        clock: Arc::new(keel_log::clock::SystemClock),
        wal: None,
    }
}

/// A partition on storage with fault injection, and the injector.
fn faulty(dir: &std::path::Path, config: LogConfig) -> (Arc<Partition>, FaultyStorage, Arc<DirHealth>) {
    let faults = FaultyStorage::new(keel_log::DiskStorage::shared());
    let health = DirHealth::new(dir);
    let mut p = parts(
        dir,
        config,
        keel_tier::TailCache::new(1 << 20).partition(),
        cold(),
    );
    p.storage = Arc::new(faults.clone());
    p.health = Arc::clone(&health);
    (Arc::new(Partition::open(p).unwrap()), faults, health)
}

/// Every batch in the log from offset 0, by base offset.
fn log_contents(p: &Partition) -> Vec<(i64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut offset = p.log_start_offset();
    while offset < p.high_watermark() {
        let bytes = p.read_plan(offset, 1 << 20).unwrap().execute().unwrap();
        let mut at = 0;
        for h in validate_batches(&bytes).unwrap() {
            out.push((h.base_offset, bytes[at..at + h.total_len()][61..].to_vec()));
            at += h.total_len();
            offset = h.last_offset() + 1;
        }
    }
    out
}

/// A panic inside the writer (here injected into its `write`) fails the
/// requests of that group, reloads the log from disk, and the partition
/// keeps taking appends at the right offsets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_the_writer_fails_its_requests_and_the_partition_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (p, faults, health) = faulty(dir.path(), LogConfig::default());
    for _ in 0..3 {
        let (b, h) = batch(None, 2);
        p.append(b, h).await.unwrap();
    }
    faults.add_text("write panic path=.log times=1").unwrap();
    let (b, h) = batch(None, 2);
    let err = p.append(b, h).await.unwrap_err();
    assert_eq!(err.error, ResponseError::KafkaStorageError, "{err:?}");
    assert!(!health.is_offline(), "a panic is not a storage failure");
    for i in 0..3 {
        let (b, h) = batch(None, 1);
        assert_eq!(
            p.append(b, h).await.unwrap().base_offset,
            6 + i,
            "offsets continue"
        );
    }
    assert_eq!(p.high_watermark(), 9);
    assert_eq!(log_contents(&p).len(), 6);
}

/// After a failed fsync the log dir goes offline: the append that needed
/// it fails, and so does every later one, with KAFKA_STORAGE_ERROR. A
/// restart recovers, and an idempotent retry of the failed append is not
/// stored twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fsync_takes_the_dir_offline_and_a_retry_is_not_stored_twice() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        flush_messages: 1,
        ..LogConfig::default()
    };
    let (p, faults, health) = faulty(dir.path(), config.clone());
    let (b0, h0) = batch(Some((7, 0)), 2);
    assert_eq!(p.append(b0, h0).await.unwrap().base_offset, 0);
    faults.add_text("sync eio path=.log times=1").unwrap();
    let (b1, h1) = batch(Some((7, 2)), 2);
    let err = p.append(b1.clone(), h1.clone()).await.unwrap_err();
    assert_eq!(err.error, ResponseError::KafkaStorageError);
    assert!(health.is_offline());
    assert!(p.unavailable().unwrap().contains("fsync") || p.unavailable().unwrap().contains("injected"));
    let (b2, h2) = batch(None, 1);
    assert_eq!(
        p.append(b2, h2).await.unwrap_err().error,
        ResponseError::KafkaStorageError
    );
    assert!(matches!(
        p.read(&reader(), 0, 1 << 20, false),
        Err(keel_data::partition::ReadFailure::Storage(_))
    ));
    drop(p);
    // The restart: the retry of the failed batch is a duplicate if the
    // batch survived, and new data if it did not; never both.
    let p = Arc::new(
        Partition::open(parts(
            dir.path(),
            config,
            keel_tier::TailCache::new(1 << 20).partition(),
            cold(),
        ))
        .unwrap(),
    );
    let retry = p.append(b1, h1).await.unwrap().base_offset;
    assert_eq!(retry, 2);
    let (b3, h3) = batch(Some((7, 4)), 1);
    assert_eq!(p.append(b3, h3).await.unwrap().base_offset, 4);
    assert_eq!(log_contents(&p).len(), 3);
}

/// A roll whose new segment cannot be created (no descriptor left) fails
/// that append cleanly and leaves nothing behind; the next append rolls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_roll_fails_the_append_and_leaves_no_stray_segment() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        segment_bytes: 150,
        ..LogConfig::default()
    };
    let (p, faults, health) = faulty(dir.path(), config);
    let (b, h) = batch(None, 3);
    p.append(b, h).await.unwrap();
    let logs = |d: &std::path::Path| {
        std::fs::read_dir(d)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "log"))
            .count()
    };
    assert_eq!(logs(dir.path()), 1);
    faults.add_text("open emfile times=1").unwrap();
    let (b, h) = batch(None, 3);
    let err = p.append(b, h).await.unwrap_err();
    assert_eq!(err.error, ResponseError::KafkaStorageError);
    assert!(!health.is_offline(), "a failed open is not a storage failure");
    assert_eq!(logs(dir.path()), 1, "no stray segment");
    let (b, h) = batch(None, 3);
    assert_eq!(p.append(b, h).await.unwrap().base_offset, 3);
    assert_eq!(logs(dir.path()), 2, "the next append rolled");
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
    let io = keel_tier::IoScheduler::new(keel_tier::Budgets::default());
    Arc::new(keel_tier::ColdReads::new(Arc::new(io), 2))
}

fn reader() -> keel_data::readers::Reader {
    keel_data::readers::Reader::new("test", "/127.0.0.1", 1)
}

fn no_tiers() -> Arc<keel_tier::Tiers> {
    Arc::new(keel_tier::Tiers::new(keel_log::storage::DiskStorage::shared(), &[], None).unwrap())
}

fn read_bytes(source: keel_data::partition::ReadSource) -> (bool, Bytes) {
    use keel_data::partition::ReadSource;
    match source {
        ReadSource::Memory(b) => (true, b.join()),
        ReadSource::Disk(read) => (false, read.plan().execute().unwrap()),
        ReadSource::ReadAhead(_) | ReadSource::Pending(_) => panic!("no read-ahead runs in these tests"),
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
    let (memory, cached) = read_bytes(p.read(&reader(), 95, 1 << 20, false).unwrap());
    assert!(memory);
    let from_log = p.read_plan(95, 1 << 20).unwrap().execute().unwrap();
    assert_eq!(cached, from_log);
    // The budget holds only the newest batches; the oldest is read from the log.
    let stats = cache.stats();
    assert!(
        stats.used_bytes <= 2_000 && stats.evicted_batches > 0,
        "{stats:?}"
    );
    let (memory, oldest) = read_bytes(p.read(&reader(), 0, 1 << 20, false).unwrap());
    assert!(!memory);
    assert_eq!(
        &oldest[..],
        &p.read_plan(0, 1 << 20).unwrap().execute().unwrap()[..]
    );
    // At the high watermark there is nothing to read, from either source.
    let (_, empty) = read_bytes(p.read(&reader(), hw, 1 << 20, false).unwrap());
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
    assert!(!read_bytes(p.read(&reader(), 95, 1 << 20, false).unwrap()).0);
    let (bytes, headers) = batch(None, 5);
    assert_eq!(p.append(bytes, headers).await.unwrap().base_offset, 100);
    assert!(read_bytes(p.read(&reader(), 100, 1 << 20, false).unwrap()).0);
    assert!(!read_bytes(p.read(&reader(), 99, 1 << 20, false).unwrap()).0);
}

/// A partition of 40 batches in 4 KiB segments, behind a tail cache too
/// small to hold anything (every read is cold).
async fn cold_partition(
    dir: &std::path::Path,
) -> (
    Arc<Partition>,
    Arc<keel_tier::TailCache>,
    Arc<keel_tier::ColdReads>,
) {
    let config = LogConfig {
        segment_bytes: 4096,
        ..LogConfig::default()
    };
    let cache = keel_tier::TailCache::new(1);
    let cold = cold();
    let p = Arc::new(Partition::open(parts(dir, config, cache.partition(), Arc::clone(&cold))).unwrap());
    for _ in 0..40 {
        let (bytes, headers) = batch(None, 5);
        p.append(bytes, headers).await.unwrap();
    }
    (p, cache, cold)
}

/// One fetch by `r` at `offset`: its bytes, and whether a read of the
/// fetch's own went to the disk.
async fn fetch_below_tail(p: &Arc<Partition>, r: &keel_data::readers::Reader, offset: i64) -> (Bytes, bool) {
    use keel_data::partition::ReadSource;
    match p.read(r, offset, 1_000, false).unwrap() {
        ReadSource::Memory(b) | ReadSource::ReadAhead(b) => (b.join(), false),
        ReadSource::Pending(rx) => (rx.await.unwrap().unwrap(), false),
        ReadSource::Disk(read) => (read.spawn().await.unwrap().unwrap(), true),
    }
}

/// The whole log, as plain reads of the files give it.
fn whole_log(p: &Partition) -> Vec<u8> {
    let (mut all, mut off) = (Vec::new(), 0);
    while off < p.high_watermark() {
        let b = p.read_plan(off, 1_000).unwrap().execute().unwrap();
        off = validate_batches(&b).unwrap().last().unwrap().last_offset() + 1;
        all.extend_from_slice(&b);
    }
    all
}

/// A sequential scan below the tail cache is read ahead: after each cold
/// read the next chunk is read before it is asked for, and the next fetch
/// takes it, or waits for it while it is still being read. Nothing is read
/// twice, and cold reads never insert into the tail cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_cold_reads_are_read_ahead_once() {
    let dir = tempfile::tempdir().unwrap();
    let (p, cache, cold) = cold_partition(dir.path()).await;
    let inserted = cache.stats().inserted_bytes;
    let (mut offset, mut all) = (0i64, Vec::new());
    let (mut disk, mut ahead) = (0, 0);
    while offset < p.high_watermark() {
        let (bytes, own_read) = fetch_below_tail(&p, &reader(), offset).await;
        if own_read {
            disk += 1;
        } else {
            ahead += 1;
        }
        offset = validate_batches(&bytes).unwrap().last().unwrap().last_offset() + 1;
        all.extend_from_slice(&bytes);
    }
    let expected = whole_log(&p);
    assert_eq!(all, expected, "every byte read once, in order");
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
    let scan = cold.scan_pool().stats();
    assert_eq!(scan.hits, ahead, "{scan:?}");
    assert_eq!(s.bytes as usize, expected.len(), "nothing read twice: {s:?}");
}

/// Two readers scanning the same stretch below the tail cache, one a
/// fetch behind the other: the one behind is served what the one ahead
/// read, so the partition is read from disk once for both, and each gets
/// every batch in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_riding_together_share_one_read_of_each_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _cache, cold) = cold_partition(dir.path()).await;
    let readers = [
        keel_data::readers::Reader::new("loader", "/127.0.0.1", 1),
        keel_data::readers::Reader::new("indexer", "/127.0.0.1", 2),
    ];
    let (mut offsets, mut got) = ([0i64; 2], [Vec::new(), Vec::new()]);
    while offsets.iter().any(|o| *o < p.high_watermark()) {
        for (i, r) in readers.iter().enumerate() {
            if offsets[i] >= p.high_watermark() {
                continue;
            }
            let (bytes, _) = fetch_below_tail(&p, r, offsets[i]).await;
            offsets[i] = validate_batches(&bytes).unwrap().last().unwrap().last_offset() + 1;
            got[i].extend_from_slice(&bytes);
        }
    }
    let expected = whole_log(&p);
    assert_eq!(got[0], expected, "the reader ahead got every batch in order");
    assert_eq!(got[1], expected, "the reader behind got every batch in order");
    let (s, scan) = (cold.stats(), cold.scan_pool().stats());
    assert_eq!(s.bytes as usize, expected.len(), "one read for both: {s:?}");
    assert!(
        scan.shared_bytes as usize >= expected.len() * 9 / 10,
        "the reader behind rode the other's reads: {scan:?}"
    );
    p.tick_scan();
    assert!(
        p.scan_summary().held_bytes > 0,
        "recent readers keep what they still need"
    );
}

/// A stalled fsync holds the partition's writer, not its readers: fetch
/// planning, tail reads and timestamp lookups of the same partition answer
/// at once while an append waits 1.5 s on the disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_never_wait_for_a_stalled_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        flush_messages: 1,
        ..LogConfig::default()
    };
    let (p, faults, _) = faulty(dir.path(), config);
    for _ in 0..5 {
        let (b, h) = batch(None, 2);
        p.append(b, h).await.unwrap();
    }
    faults.add_text("sync delay=1500 path=.log times=1").unwrap();
    let started = std::time::Instant::now();
    let writer = {
        let p = Arc::clone(&p);
        tokio::spawn(async move {
            let (b, h) = batch(None, 2);
            p.append(b, h).await.unwrap()
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!writer.is_finished(), "the append is stalled in its fsync");
    for _ in 0..100 {
        p.read_plan(0, 1 << 20).unwrap();
        p.timestamp_plan(0).unwrap();
        drop(p.read(&reader(), 8, 1 << 20, false).unwrap());
    }
    // Ordering, not timing: the reads were answered while the append was
    // still stalled, so none of them waited for it.
    assert!(!writer.is_finished(), "the reads waited for the stalled writer");
    assert_eq!(writer.await.unwrap().base_offset, 10);
    assert!(started.elapsed() >= std::time::Duration::from_millis(1500));
}

/// Each producer as DescribeProducers reports it: id, last sequence,
/// open transaction's first offset, coordinator epoch.
fn described(p: &Partition) -> Vec<(i64, i32, i64, i32)> {
    p.describe_producers()
        .iter()
        .map(|d| {
            (
                d.producer_id,
                d.last_sequence,
                d.txn_start_offset,
                d.coordinator_epoch,
            )
        })
        .collect()
}

/// Waits until the storage has injected `n` faults: a delayed operation
/// is then in its delay.
async fn injected(faults: &FaultyStorage, n: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while faults.injected() < n {
        assert!(std::time::Instant::now() < deadline, "the fault never fired");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// A stalled fsync holds the partition's writer, not the producers'
/// state: DescribeProducers (and the producer count in /stats), which
/// request threads answer, read what the writer published after its last
/// write, so a disk that stops answering cannot hold them (issue 36).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_state_is_read_without_waiting_for_a_stalled_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        flush_messages: 1,
        ..LogConfig::default()
    };
    let (p, faults, _) = faulty(dir.path(), config);
    let (b, h) = batch(Some((7, 0)), 2);
    p.append(b, h).await.unwrap();
    // Far longer than the guard below: a lookup that waits for the
    // writer cannot pass it.
    faults.add_text("sync delay=15000 path=.log times=1").unwrap();
    let writer = {
        let p = Arc::clone(&p);
        tokio::spawn(async move {
            let (b, h) = batch(Some((7, 2)), 2);
            p.append(b, h).await.unwrap()
        })
    };
    injected(&faults, 1).await;
    let lookup = {
        let p = Arc::clone(&p);
        tokio::task::spawn_blocking(move || (described(&p), p.producer_count()))
    };
    let (during, count) = tokio::time::timeout(std::time::Duration::from_secs(3), lookup)
        .await
        .expect("the producers' state waited for the stalled fsync")
        .unwrap();
    assert!(!writer.is_finished(), "the append is still in its fsync");
    // Published after the write, as the high watermark is: the stalled
    // batch is not in it yet.
    assert_eq!(during, vec![(7, 1, -1, -1)]);
    assert_eq!(count, 1);
    assert_eq!(writer.await.unwrap().base_offset, 2);
    assert_eq!(described(&p), vec![(7, 3, -1, -1)]);
}

/// What DescribeProducers reports follows the writes: appends, a
/// transaction and its marker, a write that failed (and was undone), a
/// reload after a panic, and expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn described_producers_follow_the_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (p, faults, _) = faulty(dir.path(), LogConfig::default());
    let (b, h) = batch(Some((7, 0)), 2);
    p.append(b, h).await.unwrap();
    let txn = BatchBuilder::new(1_000)
        .producer(9, 0, 0)
        .transactional(true)
        .record(None, Some(b"in a transaction"))
        .build();
    let headers = validate_batches(&txn).unwrap();
    assert_eq!(p.append(Bytes::from(txn), headers).await.unwrap().base_offset, 2);
    assert_eq!(described(&p), vec![(7, 1, -1, -1), (9, 0, 2, -1)]);
    let commit = Marker {
        commit: true,
        coordinator_epoch: 3,
    };
    p.write_marker(9, 0, commit).await.unwrap();
    assert_eq!(described(&p), vec![(7, 1, -1, -1), (9, 0, -1, 3)]);
    // A write that fails is undone, and so is what it told the producers.
    faults.add_text("write eio path=.log times=1").unwrap();
    let (b, h) = batch(Some((8, 0)), 1);
    assert_eq!(
        p.append(b, h).await.unwrap_err().error,
        ResponseError::KafkaStorageError
    );
    let (b, h) = batch(Some((7, 2)), 1);
    p.append(b, h).await.unwrap();
    let expected = vec![(7, 2, -1, -1), (9, 0, -1, 3)];
    assert_eq!(described(&p), expected);
    // A panic reloads the state from the log. The failed request is
    // answered as the panic unwinds, before the reload: the next append,
    // queued behind the reload, is the point after it.
    faults.add_text("write panic path=.log times=1").unwrap();
    let (b, h) = batch(Some((8, 0)), 1);
    p.append(b, h).await.unwrap_err();
    assert_eq!(described(&p), expected);
    let (b, h) = batch(Some((7, 3)), 1);
    p.append(b, h).await.unwrap();
    assert_eq!(described(&p), vec![(7, 3, -1, -1), (9, 0, -1, 3)]);
    assert_eq!(p.producer_count(), 2);
    assert_eq!(p.expire_producers(i64::MAX, 1), 2);
    assert_eq!(described(&p), vec![]);
    assert_eq!(p.producer_count(), 0);
}

/// A roll's fsync runs off the append path: while the seal of the rolled
/// segment is stalled in its fsync, appends to the new segment complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_never_wait_for_the_seal_of_a_rolled_segment() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        segment_bytes: 150,
        ..LogConfig::default()
    };
    let (p, faults, _) = faulty(dir.path(), config);
    let (b, h) = batch(None, 3);
    p.append(b, h).await.unwrap();
    faults
        .add_text("sync delay=1500 path=00000000000000000000.log times=1")
        .unwrap();
    let (b, h) = batch(None, 3);
    assert_eq!(p.append(b, h).await.unwrap().base_offset, 3, "this append rolled");
    for i in 0..5 {
        let (b, h) = batch(None, 1);
        assert_eq!(p.append(b, h).await.unwrap().base_offset, 6 + i);
    }
    // Ordering, not timing: the appends are done and the seal is not.
    let flushed = p.with_log(|log| log.flushed_offset()).unwrap();
    assert_eq!(flushed, 0, "the seal of segment 0 is still in its fsync");
    for _ in 0..100 {
        if p.with_log(|log| log.flushed_offset()).unwrap() >= 3 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("the seal never completed");
}

/// A sealed segment leaves the page cache once its seal's fsync has made
/// every page clean, however slowly the disk wrote it back: the broker's
/// periodic drop pass skips pages still dirty, and on a slow disk it has
/// moved on to newer segments by the time they are clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_segment_leaves_the_page_cache() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        segment_bytes: 256 << 10,
        ..LogConfig::default()
    };
    if rustix::fs::statfs(dir.path()).unwrap().f_type == 0x0102_1994 {
        return; // On tmpfs the files are the page cache.
    }
    let tail = keel_tier::TailCache::new(1 << 20).partition();
    let p = Arc::new(Partition::open(parts(dir.path(), config, tail, cold())).unwrap());
    let value = vec![7u8; 1024];
    for _ in 0..100 {
        let mut b = BatchBuilder::new(1_000);
        for i in 0..10 {
            b = b.record(Some(format!("k{i}").as_bytes()), Some(&value));
        }
        let bytes = b.build();
        let headers = validate_batches(&bytes).unwrap();
        p.append(Bytes::from(bytes), headers).await.unwrap();
    }
    let mut logs: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    assert!(logs.len() >= 3, "{logs:?}");
    let base =
        |path: &std::path::Path| -> i64 { path.file_stem().unwrap().to_str().unwrap().parse().unwrap() };
    let active = base(logs.last().unwrap());
    let mut sealed = false;
    for _ in 0..500 {
        sealed = p.with_log(|log| log.flushed_offset()).unwrap() >= active;
        if sealed {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(sealed, "the seals did not complete");
    for path in &logs[..logs.len() - 1] {
        let f = std::fs::File::open(path).unwrap();
        let (resident, size) = keel_tier::resident::resident_bytes(&f).unwrap();
        assert!(size > 200 << 10, "{path:?}: {size}");
        assert_eq!(
            resident, 0,
            "{path:?}: {resident} of {size} bytes still in the page cache"
        );
    }
}

/// An ABORT marker whose append rolled the segment keeps its
/// aborted-transaction entry across a crash of the process: the producer
/// snapshot written at the roll describes the state at the new segment's
/// base offset, so start-up replays the marker and indexes it again (as
/// Kafka's snapshot at each roll does). Before, the snapshot was taken at
/// the log end after the marker, start-up never saw the marker, and a
/// `read_committed` consumer was served the aborted records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_marker_that_rolled_the_segment_is_indexed_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        segment_bytes: 1024,
        ..LogConfig::default()
    };
    let (p, faults, _) = faulty(dir.path(), config.clone());
    let mut b = BatchBuilder::new(1_000).producer(7, 0, 0).transactional(true);
    for i in 0..10 {
        b = b.record(Some(format!("k{i}").as_bytes()), Some(&[b'v'; 200]));
    }
    let bytes = b.build();
    let headers = validate_batches(&bytes).unwrap();
    p.append(Bytes::from(bytes), headers).await.unwrap();
    let abort = keel_log::marker::Marker {
        commit: false,
        coordinator_epoch: 0,
    };
    let marker = p.write_marker(7, 0, abort).await.unwrap();
    assert_eq!(marker.base_offset, 10);
    let expected = p.aborted_txns(0, p.high_watermark());
    assert_eq!(expected.len(), 1, "the abort is indexed before the crash");
    // The roll queued a producer snapshot; the crash comes after it is
    // written, as it would after any later append.
    let snapshot_written = || {
        std::fs::read_dir(dir.path())
            .unwrap()
            .any(|e| e.unwrap().path().extension().is_some_and(|x| x == "snapshot"))
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !snapshot_written() {
        assert!(
            std::time::Instant::now() < deadline,
            "the roll's producer snapshot was never written"
        );
        p.spawn_seals();
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // kill -9: no further write reaches the disk.
    faults.add_text("any crash").unwrap();
    drop(p);
    let p = open_with_config(dir.path(), config);
    assert_eq!(p.high_watermark(), 11);
    assert_eq!(p.aborted_txns(0, p.high_watermark()), expected);
    assert_eq!(p.last_stable_offset(), 11, "no transaction is left open");
}

fn open_with_config(dir: &std::path::Path, config: LogConfig) -> Arc<Partition> {
    let tail = keel_tier::TailCache::new(1 << 20).partition();
    Arc::new(Partition::open(parts(dir, config, tail, cold())).unwrap())
}

/// A transaction's batches, its ABORT marker rolling the segment, a
/// committed transaction and a second abort, with the process killed at
/// every storage step in turn: after each restart the aborted-transaction
/// index names exactly the aborts whose markers survived, and the last
/// stable offset stops at a transaction left open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_transactions_survive_a_crash_at_every_step() {
    let config = LogConfig {
        segment_bytes: 1024,
        ..LogConfig::default()
    };
    let txn_batch = |seq: i32| {
        let mut b = BatchBuilder::new(1_000).producer(7, 0, seq).transactional(true);
        for i in 0..10 {
            b = b.record(Some(format!("k{i}").as_bytes()), Some(&[b'v'; 120]));
        }
        let bytes = b.build();
        let headers = validate_batches(&bytes).unwrap();
        (Bytes::from(bytes), headers)
    };
    let marker = |commit| keel_log::marker::Marker {
        commit,
        coordinator_epoch: 0,
    };
    // Offsets: A 0..=9, ABORT 10, B 11..=20, COMMIT 21, C 22..=31, ABORT 32.
    let mut crashes = 0;
    for step in 0.. {
        let dir = tempfile::tempdir().unwrap();
        let (p, faults, _) = faulty(dir.path(), config.clone());
        faults
            .add_text(&format!("any crash skip={step} times=1"))
            .unwrap();
        let run = async {
            for (seq, commit) in [(0, false), (10, true), (20, false)] {
                let (b, h) = txn_batch(seq);
                p.append(b, h).await.map_err(drop)?;
                p.write_marker(7, 0, marker(commit)).await.map_err(drop)?;
            }
            p.close().map_err(drop)
        };
        let finished = run.await.is_ok() && !faults.crashed();
        drop(p);
        let p = open_with_config(dir.path(), config.clone());
        let hw = p.high_watermark();
        let aborted: Vec<(i64, i64)> = p
            .aborted_txns(0, hw)
            .iter()
            .map(|t| (t.first_offset, t.last_offset))
            .collect();
        let expected: Vec<(i64, i64)> = [(0, 10), (22, 32)]
            .into_iter()
            .filter(|(_, marker)| *marker < hw)
            .collect();
        assert_eq!(aborted, expected, "crash at step {step}: log end {hw}");
        let open_txn = [0, 11, 22]
            .into_iter()
            .find(|first| *first < hw && first + 10 >= hw);
        assert_eq!(
            p.last_stable_offset(),
            open_txn.unwrap_or(hw),
            "crash at step {step}: log end {hw}"
        );
        if finished {
            break;
        }
        crashes += 1;
    }
    assert!(
        crashes >= 10,
        "the scenario should crash at many steps ({crashes})"
    );
}

/// A transactional batch is verified by the partition writer when it takes
/// the batch, in queue order, not when the request checked it: a
/// transaction that ended while the batch waited (its marker queued behind
/// it, or already written) refuses the batch, so it cannot open a
/// transaction here that no coordinator ends.
#[tokio::test(flavor = "current_thread")]
async fn a_transactional_batch_is_verified_when_the_writer_takes_it() {
    use std::sync::atomic::{AtomicBool, Ordering};

    let dir = tempfile::tempdir().unwrap();
    let (p, faults, _) = faulty(dir.path(), LogConfig::default());
    // The writer is busy with a slow write while the batch waits.
    faults.add_text("write delay=1500 path=.log times=1").unwrap();
    let busy = tokio::spawn({
        let p = Arc::clone(&p);
        let (b, h) = batch(None, 1);
        async move { p.append(b, h).await }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while faults.injected() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the slow write never started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let open = Arc::new(AtomicBool::new(true));
    let txn = BatchBuilder::new(1_000)
        .producer(9, 0, 0)
        .transactional(true)
        .record(None, Some(b"late"))
        .build();
    let headers = validate_batches(&txn).unwrap();
    let verify: keel_data::partition::Verify = Box::new({
        let open = Arc::clone(&open);
        move |_| {
            if open.load(Ordering::SeqCst) {
                Ok(())
            } else {
                Err(keel_data::partition::AppendFailure {
                    error: ResponseError::InvalidTxnState,
                    message: "the transaction ended".into(),
                })
            }
        }
    });
    // The batch is queued behind the slow write, and its transaction ends
    // before the writer gets to it.
    let late = p.queue(Bytes::from(txn), headers, Some(verify)).unwrap();
    open.store(false, Ordering::SeqCst);
    assert_eq!(busy.await.unwrap().unwrap().base_offset, 0);
    let refused = late.outcome().await.unwrap_err();
    assert_eq!(refused.error, ResponseError::InvalidTxnState, "{refused:?}");
    assert_eq!(p.high_watermark(), 1);
    assert_eq!(p.last_stable_offset(), 1, "no transaction was opened");
}

/// A transactional batch of one record: producer id, epoch, sequence.
fn txn_batch((producer, epoch, sequence): (i64, i16, i32), value: &[u8]) -> (Bytes, Vec<BatchHeader>) {
    let bytes = BatchBuilder::new(1_000)
        .producer(producer, epoch, sequence)
        .transactional(true)
        .record(None, Some(value))
        .build();
    let headers = validate_batches(&bytes).unwrap();
    (Bytes::from(bytes), headers)
}

/// What a voided verification guard refuses a batch with.
fn txn_ended() -> keel_data::partition::AppendFailure {
    keel_data::partition::AppendFailure {
        error: ResponseError::InvalidTxnState,
        message: "the transaction ended".into(),
    }
}

/// Under transactions v2 a transaction's markers carry the epoch its
/// producer's next transaction uses: the previous transaction's marker,
/// arriving while the next one's batch is checked, leaves the batch's
/// guard alone; the marker that ends the batch's own transaction (a later
/// epoch) voids it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_transactions_v2_only_a_later_epochs_marker_voids_a_guard() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _, _) = faulty(dir.path(), LogConfig::default());
    let txn = |epoch, sequence, value| txn_batch((9, epoch, sequence), value);
    let refusal = txn_ended;
    let marker = Marker {
        commit: true,
        coordinator_epoch: 0,
    };
    let v2 = |producer_epoch| TxnWrite {
        producer_id: 9,
        producer_epoch,
        bumped_on_end: true,
    };
    // The first transaction, in epoch 0, ends with its marker in epoch 1.
    let (b, h) = txn(0, 0, b"first");
    p.append(b, h).await.unwrap();
    let next = p.verification_guard(v2(1));
    p.write_marker(9, 1, marker).await.unwrap();
    let (b, h) = txn(1, 0, b"second");
    let written = p.queue(b, h, Some(next.into_verify(refusal()))).unwrap();
    assert_eq!(written.outcome().await.unwrap().base_offset, 2);
    // The second ends in epoch 2 (an abort on its timeout, say): a batch
    // of it checked meanwhile is refused.
    let late = p.verification_guard(v2(1));
    p.write_marker(
        9,
        2,
        Marker {
            commit: false,
            ..marker
        },
    )
    .await
    .unwrap();
    let (b, h) = txn(1, 1, b"late");
    let refused = p
        .queue(b, h, Some(late.into_verify(refusal())))
        .unwrap()
        .outcome()
        .await
        .unwrap_err();
    assert_eq!(refused.error, ResponseError::InvalidTxnState, "{refused:?}");
    assert_eq!(p.high_watermark(), 4);
}

/// A batch whose producer's transaction at its epoch had already written
/// here needs no coordinator's word (Kafka asks none): it is let in by
/// the open transaction, checked when the writer takes it. Once a marker
/// ended that transaction, such a batch is refused; the first batch of
/// the next epoch's transaction finds none open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_a_transaction_open_here_is_let_in_until_its_marker() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _, _) = faulty(dir.path(), LogConfig::default());
    let open = |epoch| keel_data::partition::open_transaction_check(9, epoch, txn_ended());
    assert!(!p.in_open_transaction(9, 0), "nothing written yet");
    let (b, h) = txn_batch((9, 0, 0), b"first");
    p.append(b, h).await.unwrap();
    assert!(p.in_open_transaction(9, 0));
    assert!(!p.in_open_transaction(9, 1) && !p.in_open_transaction(8, 0));
    let (b, h) = txn_batch((9, 0, 1), b"second");
    let second = p.queue(b, h, Some(open(0))).unwrap();
    assert_eq!(second.outcome().await.unwrap().base_offset, 1);
    // Checked while open, queued after the marker (epoch 1: transactions v2).
    assert!(p.in_open_transaction(9, 0));
    let marker = Marker {
        commit: true,
        coordinator_epoch: 0,
    };
    p.write_marker(9, 1, marker).await.unwrap();
    let (b, h) = txn_batch((9, 0, 2), b"late");
    let refused = p.queue(b, h, Some(open(0))).unwrap().outcome().await.unwrap_err();
    assert_eq!(refused.error, ResponseError::InvalidTxnState, "{refused:?}");
    assert!(!p.in_open_transaction(9, 0) && !p.in_open_transaction(9, 1));
    assert_eq!(p.high_watermark(), 3);
    assert_eq!(p.last_stable_offset(), 3, "no transaction left open");
}

/// A verification guard holds only in the leadership term it was taken
/// in: a marker written while another broker led the partition voided
/// nothing here, so a batch checked before the leadership went and came
/// back is refused as NOT_LEADER_OR_FOLLOWER (its client retries, and it
/// is checked again); one checked in the new term is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verification_guard_holds_only_in_the_term_it_was_taken_in() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(dir.path());
    let v2 = TxnWrite {
        producer_id: 9,
        producer_epoch: 0,
        bumped_on_end: true,
    };
    p.take_leadership(1, 0, 1, true).unwrap();
    let before = p.verification_guard(v2);
    // Led elsewhere, then here again.
    p.give_up_leadership();
    p.take_leadership(3, 0, 5, true).unwrap();
    let after = p.verification_guard(v2);
    let (b, h) = txn_batch((9, 0, 0), b"checked before");
    let refused = p
        .queue(b, h, Some(before.into_verify(txn_ended())))
        .unwrap()
        .outcome()
        .await
        .unwrap_err();
    assert_eq!(refused.error, ResponseError::NotLeaderOrFollower, "{refused:?}");
    let (b, h) = txn_batch((9, 0, 0), b"checked after");
    let written = p.queue(b, h, Some(after.into_verify(txn_ended()))).unwrap();
    assert_eq!(written.outcome().await.unwrap().base_offset, 0);
}

/// A verification guard (a transactional batch checked with a coordinator
/// on another broker) holds until a marker for its producer is queued:
/// a batch whose guard was taken before its transaction's marker is
/// refused by the writer, one whose guard was taken after it is written,
/// and another producer's marker voids nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marker_voids_the_verification_guards_of_its_producer() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _, _) = faulty(dir.path(), LogConfig::default());
    let txn = |producer, sequence, value| txn_batch((producer, 0, sequence), value);
    let refusal = txn_ended;
    let commit = Marker {
        commit: true,
        coordinator_epoch: 3,
    };
    // Producers 7 and 8 each wrote a transaction here.
    for producer in [7, 8] {
        let (b, h) = txn(producer, 0, b"first");
        p.append(b, h).await.unwrap();
    }
    let v1 = |producer_id| TxnWrite {
        producer_id,
        producer_epoch: 0,
        bumped_on_end: false,
    };
    let stale = p.verification_guard(v1(7));
    let other = p.verification_guard(v1(8));
    p.write_marker(7, 0, commit).await.unwrap();
    let (b, h) = txn(7, 1, b"stale");
    let refused = p
        .queue(b, h, Some(stale.into_verify(refusal())))
        .unwrap()
        .outcome()
        .await
        .unwrap_err();
    assert_eq!(refused.error, ResponseError::InvalidTxnState, "{refused:?}");
    let (b, h) = txn(8, 1, b"second");
    let kept = p.queue(b, h, Some(other.into_verify(refusal()))).unwrap();
    assert_eq!(kept.outcome().await.unwrap().base_offset, 3);
    let fresh = p.verification_guard(v1(7));
    let (b, h) = txn(7, 1, b"next");
    let next = p.queue(b, h, Some(fresh.into_verify(refusal()))).unwrap();
    assert_eq!(next.outcome().await.unwrap().base_offset, 4);
    assert_eq!(p.high_watermark(), 5);
    // The partition keeps the coordinator epoch of the marker.
    assert!(p
        .describe_producers()
        .iter()
        .any(|i| i.producer_id == 7 && i.coordinator_epoch == 3));
}

/// A marker for a producer that never wrote to the partition ends nothing
/// and fences nothing there, so it is not written: a late marker of a
/// deleted topic (markers are addressed by name) leaves a re-created topic
/// of that name empty. A producer the partition knows still gets its
/// marker, even with no open transaction, for the epoch it carries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marker_for_a_producer_that_never_wrote_here_is_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _, _) = faulty(dir.path(), LogConfig::default());
    let commit = Marker {
        commit: true,
        coordinator_epoch: 0,
    };
    assert_eq!(p.write_marker(9, 0, commit).await.unwrap().base_offset, 0);
    assert_eq!(p.high_watermark(), 0, "nothing was written");
    assert_eq!(described(&p), vec![]);
    let (b, h) = batch(Some((7, 0)), 2);
    p.append(b, h).await.unwrap();
    assert_eq!(p.write_marker(7, 1, commit).await.unwrap().base_offset, 2);
    assert_eq!(p.high_watermark(), 3);
    assert_eq!(described(&p), vec![(7, -1, -1, 0)], "the epoch moved on");
}

/// Maintenance under the writer lock (retention, the mover, the cleaner
/// run through `with_log`) beside a stream of appends: the offsets are
/// published in the writer's order, so the high watermark readers see
/// only moves forward. A publication out of order trips the release-build
/// assertion in the partition (the maintenance thread panics) or shows
/// here as a high watermark that went back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_beside_appends_never_moves_the_high_watermark_back() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _, _) = faulty(dir.path(), LogConfig::default());
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let maintenance = {
        let (p, done) = (Arc::clone(&p), Arc::clone(&done));
        std::thread::spawn(move || {
            let mut passes = 0u64;
            let mut seen = 0;
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                p.with_log(|_| ()).unwrap();
                let hw = p.high_watermark();
                assert!(hw >= seen, "the high watermark went back from {seen} to {hw}");
                seen = hw;
                passes += 1;
            }
            passes
        })
    };
    let writers: Vec<_> = (0..4)
        .map(|_| {
            let p = Arc::clone(&p);
            tokio::spawn(async move {
                for _ in 0..300 {
                    let (b, h) = batch(None, 1);
                    p.append(b, h).await.unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    let passes = maintenance.join().expect("maintenance published in order");
    assert!(passes > 0);
    assert_eq!(p.high_watermark(), 1_200);
}

/// A clock the test moves by hand.
struct ManualClock(std::sync::atomic::AtomicI64);

impl keel_log::clock::Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A partition reads time only from its clock: a producer's last write
/// (what DescribeProducers reports and `producer.id.expiration.ms` counts
/// from) is the clock's time at its append; the snapshot written at close
/// keeps it across a reopen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_times_come_from_the_partitions_clock() {
    use std::sync::atomic::Ordering::SeqCst;
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock(std::sync::atomic::AtomicI64::new(5_000)));
    let open = |clock: &Arc<ManualClock>| {
        let mut p = parts(
            dir.path(),
            LogConfig::default(),
            keel_tier::TailCache::new(1 << 20).partition(),
            cold(),
        );
        p.clock = Arc::clone(clock) as Arc<dyn keel_log::clock::Clock>;
        Arc::new(Partition::open(p).unwrap())
    };
    let p = open(&clock);
    let (b, h) = batch(Some((7, 0)), 2);
    p.append(b, h).await.unwrap();
    let last_writes = |p: &Partition| {
        p.describe_producers()
            .iter()
            .map(|d| (d.producer_id, d.last_timestamp_ms))
            .collect::<Vec<_>>()
    };
    assert_eq!(last_writes(&p), vec![(7, 5_000)]);
    // Idle a millisecond short of the expiration: kept; for all of it:
    // expired (Kafka's `>=`).
    assert_eq!(p.expire_producers(64_999, 60_000), 0);
    clock.0.store(65_000, SeqCst);
    let (b, h) = batch(Some((8, 0)), 1);
    p.append(b, h).await.unwrap();
    assert_eq!(p.expire_producers(65_000, 60_000), 1);
    assert_eq!(last_writes(&p), vec![(8, 65_000)]);
    p.close().unwrap();
    drop(p);
    clock.0.store(90_000, SeqCst);
    let p = open(&clock);
    assert_eq!(last_writes(&p), vec![(8, 65_000)]);
}

/// A partition taken over from the object store: its own log is emptied
/// and restarts where the segments there end, the WAL's batches are
/// replayed at their own offsets, and producer state is read from them,
/// so a producer's retry is recognised and its next batch goes on.
#[tokio::test]
async fn a_log_rebuilt_from_replayed_batches_keeps_offsets_and_producer_state() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = open(a_dir.path());
    let (filler, h) = batch(None, 3);
    a.append(filler, h).await.unwrap();
    let (b0, h0) = batch(Some((42, 0)), 2);
    assert_eq!(a.append(b0, h0).await.unwrap().base_offset, 3);
    let (b1, h1) = batch(Some((42, 2)), 2);
    assert_eq!(a.append(b1.clone(), h1.clone()).await.unwrap().base_offset, 5);
    // What the WAL objects hold past offset 3: the batches as written.
    let written = a.read_plan(3, 1 << 20).unwrap().execute().unwrap();
    let first = validate_batches(&written).unwrap()[0].total_len();

    let b = open(b_dir.path());
    let (stale, hs) = batch(None, 2);
    b.append(stale, hs).await.unwrap();
    b.restart_log((3, 3), Vec::new(), None).unwrap();
    // Batches that do not start where the log ends are refused.
    let err = b.replay(&written[first..]).unwrap_err();
    assert!(err.contains("offset 5"), "{err}");
    b.replay(&written).unwrap();
    b.take_leadership(1, 7, 1, true).unwrap();
    assert_eq!((b.log_start_offset(), b.high_watermark()), (3, 7));
    assert_eq!(log_contents(&b), log_contents(&a)[1..]);
    // The producer's retry of its last batch, then its next one.
    assert_eq!(b.append(b1, h1).await.unwrap().base_offset, 5);
    let (next, hn) = batch(Some((42, 4)), 1);
    assert_eq!(b.append(next, hn).await.unwrap().base_offset, 7);
    // It survives a crash and reopen as rebuilt.
    drop(b);
    let b = open(b_dir.path());
    assert_eq!((b.log_start_offset(), b.high_watermark()), (3, 8));

    // A log start inside the first replayed batch (DeleteRecords to 4).
    let c_dir = tempfile::tempdir().unwrap();
    let c = open(c_dir.path());
    assert!(
        c.restart_log((2, 3), Vec::new(), None).is_err(),
        "a start below the first batch"
    );
    c.restart_log((4, 3), Vec::new(), None).unwrap();
    c.replay(&written).unwrap();
    c.take_leadership(1, 7, 1, true).unwrap();
    assert_eq!((c.log_start_offset(), c.high_watermark()), (4, 7));
    assert_eq!(log_contents(&c), log_contents(&a)[1..]);
}

/// The producer-state snapshot the old leader wrote when its segment
/// rolled (put beside the segment's copy in the object store) carries a
/// producer whose last batches are below the replayed WAL: its retry of
/// one of them is recognised, not written twice.
#[tokio::test]
async fn a_rebuilt_log_takes_producer_state_below_the_wal_from_the_snapshot() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = open(a_dir.path());
    let mut seq = 0;
    let mut batches = Vec::new();
    // Producer 42's batches until the segment rolls (4 KiB segments): the
    // batch that rolled it is the new segment's first.
    while a.reader().unwrap().segment_base_offsets().len() < 2 {
        let (b, h) = batch(Some((42, seq)), 2);
        let at = a.append(b.clone(), h.clone()).await.unwrap().base_offset;
        batches.push((b, h, at));
        seq += 2;
    }
    let rolled = *a.reader().unwrap().segment_base_offsets().last().unwrap();
    assert_eq!(batches.last().unwrap().2, rolled);
    // Its batch before the roll: only the snapshot knows it.
    let (retry, hr, retried_at) = batches[batches.len() - 2].clone();
    let snapshot_file = a_dir.path().join(format!("{rolled:020}.snapshot"));
    let snapshot = (0..200)
        .find_map(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            std::fs::read(&snapshot_file).ok()
        })
        .expect("the roll's producer snapshot");
    let wal = a.read_plan(rolled, 1 << 20).unwrap().execute().unwrap();
    let end = a.high_watermark();

    let b = open(b_dir.path());
    b.restart_log((rolled, rolled), Vec::new(), Some(snapshot))
        .unwrap();
    b.replay(&wal).unwrap();
    b.take_leadership(1, end, 1, true).unwrap();
    assert_eq!(b.append(retry, hr).await.unwrap().base_offset, retried_at);
    let (next, hn) = batch(Some((42, seq)), 1);
    assert_eq!(b.append(next, hn).await.unwrap().base_offset, end);
}
