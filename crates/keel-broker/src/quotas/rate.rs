//! A rate over sampled windows, and the throttle time a quota violation
//! earns, as Kafka's client quotas measure them (`quota.window.num` samples
//! of `quota.window.size.seconds` each). Sans-I/O: every call takes the
//! time.

/// Kafka's `quota.window.num` and `quota.window.size.seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Windows {
    pub samples: usize,
    pub window_ms: i64,
}

impl Default for Windows {
    fn default() -> Windows {
        Windows {
            samples: 11,
            window_ms: 1000,
        }
    }
}

impl Windows {
    /// The windows `config` sets.
    pub fn of(config: &keel_config::BrokerConfig) -> Windows {
        Windows {
            samples: usize::try_from(config.num("quota.window.num"))
                .unwrap_or(11)
                .max(1),
            window_ms: config
                .num("quota.window.size.seconds")
                .max(1)
                .saturating_mul(1000),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    start_ms: i64,
    value: f64,
}

/// Amounts recorded over the last `samples` windows.
#[derive(Debug, Clone)]
pub struct Rate {
    windows: Windows,
    /// Oldest first; at most `windows.samples`.
    samples: Vec<Sample>,
}

impl Rate {
    pub fn new(windows: Windows) -> Rate {
        Rate {
            windows,
            samples: Vec::new(),
        }
    }

    /// Drops samples older than all the windows together.
    fn purge(&mut self, now_ms: i64) {
        let expire = self.windows.window_ms * self.windows.samples as i64;
        self.samples.retain(|s| now_ms - s.start_ms < expire);
    }

    /// Adds `value` (bytes, or a negative amount to take back).
    pub fn record(&mut self, value: f64, now_ms: i64) {
        self.purge(now_ms);
        match self.samples.last_mut() {
            Some(s) if now_ms - s.start_ms < self.windows.window_ms => s.value += value,
            _ => {
                if self.samples.len() == self.windows.samples.max(1) {
                    self.samples.remove(0);
                }
                self.samples.push(Sample {
                    start_ms: now_ms,
                    value,
                });
            }
        }
    }

    /// The time the rate is measured over: since the oldest sample began,
    /// and at least `samples - 1` whole windows, so that a first burst is
    /// not measured over a few milliseconds.
    pub fn window_size_ms(&mut self, now_ms: i64) -> i64 {
        self.purge(now_ms);
        let w = self.windows.window_ms.max(1);
        let elapsed = self.samples.first().map_or(0, |s| now_ms - s.start_ms);
        let full = elapsed / w;
        let min_full = self.windows.samples.saturating_sub(1) as i64;
        if full < min_full {
            elapsed + (min_full - full) * w
        } else {
            elapsed
        }
    }

    /// Amount per second.
    pub fn per_second(&mut self, now_ms: i64) -> f64 {
        let size = self.window_size_ms(now_ms);
        let total: f64 = self.samples.iter().map(|s| s.value).sum();
        if size <= 0 {
            0.0
        } else {
            total * 1000.0 / size as f64
        }
    }

    /// The throttle time for a rate over `bound`: how long nothing more
    /// may come for the rate over the window to fall to the bound (0 when
    /// within it).
    pub fn throttle_ms(&mut self, bound: f64, now_ms: i64) -> i64 {
        let rate = self.per_second(now_ms);
        if bound <= 0.0 || rate <= bound {
            return 0;
        }
        let size = self.window_size_ms(now_ms) as f64;
        ((rate - bound) / bound * size).round() as i64
    }
}

/// Kafka's token bucket for `controller_mutation_rate` (KIP-599): tokens
/// (partitions created or deleted) refill at the quota per second up to a
/// burst of `samples - 1` windows' worth, and a mutation takes its tokens
/// even when that leaves the bucket below zero. Full when new.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    windows: Windows,
    tokens: f64,
    updated_ms: i64,
    full: bool,
}

impl TokenBucket {
    pub fn new(windows: Windows, now_ms: i64) -> TokenBucket {
        TokenBucket {
            windows,
            tokens: 0.0,
            updated_ms: now_ms,
            full: true,
        }
    }

    fn burst(&self, quota: f64) -> f64 {
        self.windows.samples.saturating_sub(1) as f64 * self.windows.window_ms as f64 / 1000.0 * quota
    }

    /// The tokens left at `now_ms` (negative: owed).
    pub fn tokens(&mut self, quota: f64, now_ms: i64) -> f64 {
        let burst = self.burst(quota);
        if std::mem::take(&mut self.full) {
            self.tokens = burst;
        }
        let refill = quota * (now_ms - self.updated_ms).max(0) as f64 / 1000.0;
        self.tokens = (self.tokens + refill).min(burst);
        self.updated_ms = now_ms;
        self.tokens
    }

    /// Takes `amount` tokens.
    pub fn take(&mut self, quota: f64, amount: f64, now_ms: i64) {
        let burst = self.burst(quota);
        self.tokens = (self.tokens(quota, now_ms) - amount).min(burst);
    }

    /// How long until the bucket is back at zero, in ms (0 if it is not
    /// below), as Kafka computes a mutation's throttle time.
    pub fn throttle_ms(&mut self, quota: f64, now_ms: i64) -> i64 {
        let tokens = self.tokens(quota, now_ms);
        if tokens >= 0.0 || quota <= 0.0 {
            0
        } else {
            (-tokens / quota * 1000.0).round() as i64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_bucket_starts_full_lets_one_mutation_overdraw_and_refills() {
        let w = Windows::default();
        let mut b = TokenBucket::new(w, 0);
        // 2 partitions a second: a burst of 10 windows' worth.
        assert_eq!(b.tokens(2.0, 0), 20.0);
        b.take(2.0, 26.0, 0);
        assert_eq!(b.tokens(2.0, 0), -6.0);
        assert_eq!(b.throttle_ms(2.0, 0), 3000);
        assert_eq!(b.throttle_ms(2.0, 1000), 2000);
        assert_eq!(b.throttle_ms(2.0, 3000), 0);
        // Refilled, but never past the burst.
        assert_eq!(b.tokens(2.0, 60_000), 20.0);
    }

    #[test]
    fn a_first_burst_is_measured_over_ten_windows() {
        let mut r = Rate::new(Windows::default());
        r.record(10_000.0, 0);
        // 10,000 bytes over at least 10 s: 1,000 B/s.
        assert_eq!(r.window_size_ms(0), 10_000);
        assert_eq!(r.per_second(0), 1000.0);
        assert_eq!(r.throttle_ms(1000.0, 0), 0);
        // Bound 500 B/s: twice over, so as long again as the window.
        assert_eq!(r.throttle_ms(500.0, 0), 10_000);
    }

    #[test]
    fn old_samples_leave_the_window() {
        let w = Windows::default();
        let mut r = Rate::new(w);
        for s in 0..30 {
            r.record(1000.0, s * 1000);
        }
        // The last 11 windows, over 10 s and a bit.
        let rate = r.per_second(29_500);
        assert!((rate - 11_000.0 / 10.5).abs() < 1e-6, "{rate}");
        // 11 windows later nothing is left.
        assert_eq!(r.per_second(29_000 + 11_000), 0.0);
    }

    #[test]
    fn a_rate_under_the_bound_is_never_throttled_and_taking_back_undoes() {
        let mut r = Rate::new(Windows::default());
        // 900 B every 100 ms: 9,000 B/s against a bound of 10,000.
        for i in 0..300 {
            r.record(900.0, i * 100);
            assert_eq!(r.throttle_ms(10_000.0, i * 100), 0, "at {} ms", i * 100);
        }
        r.record(50_000.0, 30_000);
        assert!(r.throttle_ms(10_000.0, 30_000) > 0);
        r.record(-50_000.0, 30_000);
        assert_eq!(r.throttle_ms(10_000.0, 30_000), 0);
    }
}
