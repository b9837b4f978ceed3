//! [`Pacer`]: a byte budget per second, shared by whoever draws on it, in
//! arrival order.

use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

/// A token bucket refilled at the budget rate, holding at most one
/// second's worth. Waiters queue on its mutex, so they are served first
/// come, first served. A rate of 0 means unlimited.
#[derive(Debug)]
pub struct Pacer {
    bytes_per_sec: u64,
    bucket: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    refilled: Instant,
}

impl Pacer {
    pub fn new(bytes_per_sec: u64) -> Pacer {
        Pacer {
            bytes_per_sec,
            bucket: Mutex::new(Bucket {
                tokens: bytes_per_sec as f64,
                refilled: Instant::now(),
            }),
        }
    }

    pub fn bytes_per_sec(&self) -> u64 {
        self.bytes_per_sec
    }

    /// Waits until `bytes` of budget are available and takes them. Returns
    /// how long it waited. A draw larger than one second of budget waits
    /// for a full bucket and drives it negative; later draws repay the debt.
    pub async fn take(&self, bytes: u64) -> Duration {
        if self.bytes_per_sec == 0 {
            return Duration::ZERO;
        }
        let started = Instant::now();
        let rate = self.bytes_per_sec as f64;
        let want = (bytes as f64).min(rate);
        let mut bucket = self.bucket.lock().await;
        loop {
            let now = Instant::now();
            let elapsed = now.duration_since(bucket.refilled).as_secs_f64();
            bucket.tokens = (bucket.tokens + elapsed * rate).min(rate);
            bucket.refilled = now;
            if bucket.tokens >= want {
                bucket.tokens -= bytes as f64;
                return started.elapsed();
            }
            let missing = want - bucket.tokens;
            tokio::time::sleep(Duration::from_secs_f64(missing / rate)).await;
        }
    }

    /// Charges `bytes` used beyond what was taken, without waiting.
    pub async fn charge(&self, bytes: u64) {
        if self.bytes_per_sec > 0 && bytes > 0 {
            self.bucket.lock().await.tokens -= bytes as f64;
        }
    }
}
