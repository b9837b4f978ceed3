//! Cold reads: fetches below the tail cache, read from the log files.
//!
//! They run on the bulk threads ([`Bulk`]), never on request tasks, at most
//! `max_concurrent` at a time, and within a broker-wide byte budget
//! (`keel.cold.read.bytes.per.sec`; 0 = unlimited). Waiting readers are
//! served first come, first served (a fair queue), so consumers reading
//! history share the budget. Tail reads never come here: they are answered
//! from memory and never wait behind a cold read.

use std::io;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::bulk::Bulk;
use crate::io::{IoClass, IoScheduler};
use crate::scan::{ScanPool, SCAN_BUFFER_BYTES};

/// What a cold read returned, and how many bytes it took from the disk or
/// object store (what the budget is charged).
#[derive(Debug, Clone, Default)]
pub struct ColdRead {
    pub bytes: Bytes,
    pub disk_bytes: u64,
}

/// Counters since start-up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ColdStats {
    pub budget_bytes_per_sec: u64,
    pub max_concurrent: u64,
    /// Cold reads waiting for a slot or for budget right now.
    pub queue_depth: u64,
    pub reads: u64,
    /// Bytes the reads returned, and bytes they took from the disk.
    pub bytes: u64,
    pub disk_bytes: u64,
    /// Total time reads spent waiting before their I/O started.
    pub wait_us_total: u64,
    /// Time spent waiting for budget alone.
    pub throttled_us_total: u64,
}

#[derive(Debug)]
pub struct ColdReads {
    max_concurrent: usize,
    slots: Semaphore,
    /// Where reads run; shared with other bulk work (large fetch responses).
    bulk: Arc<Bulk>,
    /// Where the byte budget is (`IoClass::ColdRead`): the head of the
    /// queue waits for it, the others queue behind it in arrival order.
    io: Arc<IoScheduler>,
    queue_depth: AtomicI64,
    reads: AtomicU64,
    bytes: AtomicU64,
    wait_us_total: AtomicU64,
    /// Where the reads' data is held for the readers behind.
    scan: Arc<ScanPool>,
    /// Reads on the disk now.
    running: AtomicI64,
    /// When reads last contended (one waited for a slot or for budget, or
    /// two were on the disk at once), in µs since `started` (0: never).
    started: Instant,
    last_contended_us: AtomicU64,
}

/// Cold reads contend while they do, and this long after.
const CONTENDED_FOR: Duration = Duration::from_secs(1);

/// A wait this long for a slot or budget counts as contention.
const CONTENTION_WAIT: Duration = Duration::from_millis(1);

/// A read on the disk, counted while it runs (also if its future is
/// dropped).
struct Running<'a> {
    reads: &'a AtomicI64,
    /// Reads on the disk with it.
    count: i64,
}

impl<'a> Running<'a> {
    fn start(reads: &'a AtomicI64) -> Running<'a> {
        let count = reads.fetch_add(1, Ordering::Relaxed) + 1;
        Running { reads, count }
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.reads.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ColdReads {
    /// Reads at most `max_concurrent` at a time, within `io`'s cold-read
    /// budget.
    pub fn new(io: Arc<IoScheduler>, max_concurrent: usize) -> ColdReads {
        let max_concurrent = max_concurrent.max(1);
        ColdReads {
            max_concurrent,
            slots: Semaphore::new(max_concurrent),
            // Room for every read plus response encoding beside them.
            bulk: Arc::new(Bulk::new(max_concurrent + 2).expect("start the bulk threads")),
            io,
            queue_depth: AtomicI64::new(0),
            reads: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            wait_us_total: AtomicU64::new(0),
            scan: Arc::new(ScanPool::new(SCAN_BUFFER_BYTES)),
            running: AtomicI64::new(0),
            started: Instant::now(),
            last_contended_us: AtomicU64::new(0),
        }
    }

    /// Changes the byte budget (0: unlimited), for reads queued now too.
    pub fn set_budget_bytes_per_sec(&self, bytes_per_sec: u64) {
        self.io.set_budget(IoClass::ColdRead, bytes_per_sec);
    }

    /// The bulk threads reads run on, for other bulk work.
    pub fn bulk(&self) -> &Arc<Bulk> {
        &self.bulk
    }

    /// Sets the scan buffer (its limit: bytes held at once, broker-wide)
    /// and the scans' policy.
    pub fn with_scan_pool(mut self, pool: ScanPool) -> ColdReads {
        self.scan = Arc::new(pool);
        self
    }

    /// The scan buffer every partition's shared scan holds data in.
    pub fn scan_pool(&self) -> Arc<ScanPool> {
        Arc::clone(&self.scan)
    }

    /// Runs a blocking read: waits for a slot and for the budget to be out
    /// of debt, then reads on a bulk thread, then charges the bytes it
    /// actually took from the disk. A read larger than the budget's balance
    /// borrows from the readers after it, which wait for the debt.
    pub async fn read<F>(&self, read: F) -> io::Result<Bytes>
    where
        F: FnOnce() -> io::Result<ColdRead> + Send + 'static,
    {
        let queued = Instant::now();
        self.queue_depth.fetch_add(1, Ordering::Relaxed);
        let permit = self.slots.acquire().await;
        self.io.budget(IoClass::ColdRead).take(0).await;
        self.queue_depth.fetch_sub(1, Ordering::Relaxed);
        let waited = queued.elapsed();
        self.wait_us_total
            .fetch_add(waited.as_micros() as u64, Ordering::Relaxed);
        let running = Running::start(&self.running);
        if waited >= CONTENTION_WAIT || running.count >= 2 {
            self.note_contended();
        }
        let result = self
            .bulk
            .run(read)
            .await
            .unwrap_or_else(|e| Err(io::Error::other(format!("cold read: {e}"))));
        drop(running);
        drop(permit);
        let read = result?;
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(read.bytes.len() as u64, Ordering::Relaxed);
        self.io.budget(IoClass::ColdRead).charge(read.disk_bytes).await;
        Ok(read.bytes)
    }

    fn note_contended(&self) {
        let at = self.started.elapsed().as_micros().max(1) as u64;
        self.last_contended_us.store(at, Ordering::Relaxed);
    }

    /// Whether reads contend for the disk, the executor or its budget: one
    /// waits now, or within the last second one waited or two were on the
    /// disk at once (each reader's scan has one read in flight at a time,
    /// so two scans share the device).
    pub fn contended(&self) -> bool {
        if self.queue_depth.load(Ordering::Relaxed) > 0 || self.running.load(Ordering::Relaxed) >= 2 {
            return true;
        }
        let last = self.last_contended_us.load(Ordering::Relaxed);
        last != 0 && self.started.elapsed().as_micros() as u64 - last < CONTENDED_FOR.as_micros() as u64
    }

    pub fn stats(&self) -> ColdStats {
        // The budget, the bytes read from the disk and the time waited for
        // the budget are the cold-read class's own counters.
        let class = self.io.stats()[IoClass::ColdRead.index()];
        ColdStats {
            budget_bytes_per_sec: class.budget_bytes_per_sec,
            max_concurrent: self.max_concurrent as u64,
            queue_depth: self.queue_depth.load(Ordering::Relaxed).max(0) as u64,
            reads: self.reads.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            disk_bytes: class.bytes,
            wait_us_total: self.wait_us_total.load(Ordering::Relaxed),
            throttled_us_total: class.throttled_us,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn cold_reads(budget_bytes_per_sec: u64, max_concurrent: usize) -> ColdReads {
        let io = IoScheduler::new(crate::io::Budgets {
            cold_read: budget_bytes_per_sec,
            ..Default::default()
        });
        ColdReads::new(Arc::new(io), max_concurrent)
    }

    fn read_of(len: usize) -> ColdRead {
        ColdRead {
            bytes: Bytes::from(vec![0u8; len]),
            disk_bytes: len as u64,
        }
    }

    /// The budget is charged what was read, not what was asked for: reads
    /// that ask for a lot and find little are not held back.
    #[tokio::test(start_paused = true)]
    async fn the_budget_charges_bytes_read_not_asked() {
        let cold = cold_reads(1_000_000, 1);
        let started = Instant::now();
        for _ in 0..40 {
            // Each would have asked for 64 MiB.
            cold.read(|| Ok(read_of(10_000))).await.unwrap();
        }
        assert!(
            started.elapsed().as_secs_f64() < 0.01,
            "400 kB within a 1 MB/s budget"
        );
        assert_eq!(cold.stats().disk_bytes, 400_000);
        // A read bigger than the balance is charged in full: the next waits.
        cold.read(|| Ok(read_of(3_000_000))).await.unwrap();
        let before = Instant::now();
        cold.read(|| Ok(read_of(1))).await.unwrap();
        let waited = before.elapsed().as_secs_f64();
        assert!(
            (2.3..2.6).contains(&waited),
            "waited {waited:.3}s for a 2.4 MB debt at 1 MB/s"
        );
    }

    /// On tokio's paused clock: time moves only when every task waits, so
    /// the elapsed time is exactly what the budget imposed.
    #[tokio::test(start_paused = true)]
    async fn the_budget_bounds_bytes_over_time() {
        let cold = Arc::new(cold_reads(1_000_000, 4));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let cold = Arc::clone(&cold);
            tasks.push(tokio::spawn(async move {
                for _ in 0..10 {
                    cold.read(|| Ok(read_of(100_000))).await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let elapsed = started.elapsed().as_secs_f64();
        let s = cold.stats();
        assert_eq!((s.reads, s.bytes), (40, 4_000_000));
        // 4 MB at 1 MB/s with a full 1 MB bucket at the start: 3 s, less
        // the last reads in flight (up to 4 x 100 kB), which are charged
        // after they read and leave their debt to whoever reads next.
        assert!(
            (2.5..3.2).contains(&elapsed),
            "4 MB took {elapsed:.3}s under a 1 MB/s budget"
        );
        assert!(s.throttled_us_total > 0);
        assert_eq!(s.queue_depth, 0);
    }

    #[tokio::test]
    async fn unlimited_reads_do_not_wait_for_budget() {
        let cold = cold_reads(0, 2);
        for _ in 0..100 {
            cold.read(|| Ok(read_of(1))).await.unwrap();
        }
        let s = cold.stats();
        assert_eq!((s.reads, s.bytes, s.throttled_us_total), (100, 100, 0));
    }

    /// One scan keeps one read on the disk at a time: reads one after the
    /// other do not contend; two on the disk at once do (for a second).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_reads_on_the_disk_at_once_contend() {
        let cold = Arc::new(cold_reads(0, 4));
        for _ in 0..3 {
            cold.read(|| Ok(read_of(10))).await.unwrap();
        }
        assert!(!cold.contended());
        let slow = || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            Ok(read_of(10))
        };
        let (a, b) = tokio::join!(cold.read(slow), cold.read(slow));
        a.unwrap();
        b.unwrap();
        assert!(cold.contended());
    }

    #[tokio::test]
    async fn errors_are_returned_and_not_counted() {
        let cold = cold_reads(0, 1);
        let r = cold.read(|| Err(io::Error::other("disk on fire"))).await;
        assert!(r.is_err());
        assert_eq!(cold.stats().reads, 0);
    }
}
