//! [`Pacer`]: a byte budget per second, shared by whoever draws on it, in
//! arrival order.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

/// The longest a waiting draw sleeps before it looks at the rate again.
const RATE_CHECK: Duration = Duration::from_millis(100);

/// A token bucket refilled at the budget rate, holding at most one
/// second's worth. Waiters queue on its mutex, so they are served first
/// come, first served. A rate of 0 means unlimited. The rate can change
/// while draws wait: a waiter looks at it again every [`RATE_CHECK`].
#[derive(Debug)]
pub struct Pacer {
    bytes_per_sec: AtomicU64,
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
            bytes_per_sec: AtomicU64::new(bytes_per_sec),
            bucket: Mutex::new(Bucket {
                tokens: bytes_per_sec as f64,
                refilled: Instant::now(),
            }),
        }
    }

    pub fn bytes_per_sec(&self) -> u64 {
        self.bytes_per_sec.load(Ordering::Relaxed)
    }

    /// Changes the rate (0: unlimited) for the draws from now on and for
    /// those waiting; the bucket keeps its balance, capped at one second
    /// of the new rate.
    pub fn set_bytes_per_sec(&self, bytes_per_sec: u64) {
        self.bytes_per_sec.store(bytes_per_sec, Ordering::Relaxed);
    }

    /// Waits until `bytes` of budget are available and takes them. Returns
    /// how long it waited. A draw larger than one second of budget waits
    /// for a full bucket and drives it negative; later draws repay the debt.
    pub async fn take(&self, bytes: u64) -> Duration {
        if self.bytes_per_sec() == 0 {
            return Duration::ZERO;
        }
        let started = Instant::now();
        let mut bucket = self.bucket.lock().await;
        loop {
            let rate = self.bytes_per_sec() as f64;
            if rate == 0.0 {
                return started.elapsed();
            }
            let want = (bytes as f64).min(rate);
            let now = Instant::now();
            let elapsed = now.duration_since(bucket.refilled).as_secs_f64();
            bucket.tokens = (bucket.tokens + elapsed * rate).min(rate);
            bucket.refilled = now;
            if bucket.tokens >= want {
                bucket.tokens -= bytes as f64;
                return started.elapsed();
            }
            let missing = want - bucket.tokens;
            // In slices, so that a new rate reaches a long wait.
            tokio::time::sleep(Duration::from_secs_f64(missing / rate).min(RATE_CHECK)).await;
        }
    }

    /// Charges `bytes` used beyond what was taken, without waiting.
    pub async fn charge(&self, bytes: u64) {
        if self.bytes_per_sec() > 0 && bytes > 0 {
            self.bucket.lock().await.tokens -= bytes as f64;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_new_rate_reaches_the_draws_already_waiting() {
        let pacer = Arc::new(Pacer::new(1000));
        assert_eq!(pacer.take(1000).await, Duration::ZERO, "a full bucket to start");
        // The bucket is empty: at 1000 B/s this draw waits a second...
        let waiting = tokio::spawn({
            let pacer = Arc::clone(&pacer);
            async move { pacer.take(1000).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        // ...until the rate is raised tenfold: the rest comes in 90 ms.
        pacer.set_bytes_per_sec(10_000);
        let waited = waiting.await.expect("the draw");
        assert!(waited < Duration::from_millis(300), "{waited:?}");
        // Unlimited: no wait at all, even in debt.
        pacer.charge(50_000).await;
        pacer.set_bytes_per_sec(0);
        assert_eq!(pacer.take(1_000_000).await, Duration::ZERO);
    }
}
