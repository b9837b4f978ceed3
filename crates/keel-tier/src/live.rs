//! The live path's latency as the broker sees it: produce requests, and
//! fetches answered from the tail cache, from the request's arrival to its
//! response sent (a fetch's long poll not counted). Kept per second for the
//! last [`SLOTS`] seconds, which the I/O governor and `/stats` read, and
//! since start-up, from which a benchmark takes a phase's quantiles as the
//! difference of two readings.
//!
//! Values are HDR histograms of microseconds with two significant digits:
//! a quantile is within 1 % of the true one, fine enough to tell a p99
//! 20 % over its baseline, which doubling buckets cannot.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use parking_lot::Mutex;

/// Seconds kept for windowed quantiles.
pub const SLOTS: usize = 16;

/// The largest latency told apart from larger ones (longer is counted as
/// this long).
const MAX_US: u64 = 100_000_000;

/// The cumulative buckets' ratio: eight buckets per doubling.
const BUCKET_RATIO: f64 = 1.090_507_732_665_257_7; // 2^(1/8)

/// What the live path does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveOp {
    /// A produce request.
    Produce,
    /// A consumer's fetch that returned records, all from the tail cache.
    TailFetch,
}

impl LiveOp {
    pub const ALL: [LiveOp; 2] = [LiveOp::Produce, LiveOp::TailFetch];

    /// The name `/stats` and `/metrics` use.
    pub fn name(self) -> &'static str {
        match self {
            LiveOp::Produce => "produce",
            LiveOp::TailFetch => "tail_fetch",
        }
    }
}

/// The live path's latencies.
#[derive(Debug)]
pub struct LiveLatency {
    started: Instant,
    ops: [Mutex<OpLatency>; 2],
}

#[derive(Debug)]
struct OpLatency {
    /// `slots[s % SLOTS]` holds second `s` (since `started`) if its tag says so.
    slots: Vec<(u64, Histogram<u64>)>,
    total: Histogram<u64>,
}

fn histogram<T: hdrhistogram::Counter>() -> Histogram<T> {
    // Bounds and precision are constants within hdrhistogram's range.
    Histogram::new_with_bounds(1, MAX_US, 2).expect("valid histogram bounds")
}

impl Default for LiveLatency {
    fn default() -> Self {
        LiveLatency::new()
    }
}

/// Quantiles of one operation over a window, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Quantiles {
    pub count: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
}

impl LiveLatency {
    pub fn new() -> LiveLatency {
        let op = || {
            Mutex::new(OpLatency {
                slots: (0..SLOTS).map(|_| (u64::MAX, histogram())).collect(),
                total: histogram(),
            })
        };
        LiveLatency {
            started: Instant::now(),
            ops: [op(), op()],
        }
    }

    fn second(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.started).as_secs()
    }

    /// Records one operation that took `took`, finishing now.
    pub fn record(&self, op: LiveOp, took: Duration) {
        self.record_at(op, took, Instant::now());
    }

    /// Records one operation that took `took`, finishing at `at`.
    pub fn record_at(&self, op: LiveOp, took: Duration, at: Instant) {
        let us = u64::try_from(took.as_micros()).unwrap_or(MAX_US).clamp(1, MAX_US);
        let second = self.second(at);
        let mut o = self.ops[op as usize].lock();
        let slot = &mut o.slots[(second % SLOTS as u64) as usize];
        if slot.0 != second {
            slot.0 = second;
            slot.1.reset();
        }
        slot.1.saturating_record(us);
        o.total.saturating_record(us);
    }

    /// `op`'s quantiles over the last `window` before `at` (whole
    /// seconds, the current one included; at most [`SLOTS`]).
    pub fn window_at(&self, op: LiveOp, window: Duration, at: Instant) -> Quantiles {
        let now = self.second(at);
        let secs = window.as_secs().clamp(1, SLOTS as u64);
        let mut merged = histogram::<u64>();
        let o = self.ops[op as usize].lock();
        for (second, h) in &o.slots {
            if *second <= now && now - *second < secs {
                // Same bounds and precision: adding cannot fail.
                let _ = merged.add(h);
            }
        }
        drop(o);
        quantiles(&merged)
    }

    /// `op`'s quantiles over the last `window`.
    pub fn window(&self, op: LiveOp, window: Duration) -> Quantiles {
        self.window_at(op, window, Instant::now())
    }

    /// `op`'s latencies since start-up, as buckets of `(upper bound in
    /// µs, count)` eight to a doubling, empty ones left out: two readings'
    /// difference gives a phase's distribution.
    pub fn cumulative(&self, op: LiveOp) -> Vec<(u64, u64)> {
        let o = self.ops[op as usize].lock();
        o.total
            .iter_log(1, BUCKET_RATIO)
            .filter(|v| v.count_since_last_iteration() > 0)
            .map(|v| (v.value_iterated_to(), v.count_since_last_iteration()))
            .collect()
    }
}

fn quantiles(h: &Histogram<u64>) -> Quantiles {
    if h.is_empty() {
        return Quantiles::default();
    }
    Quantiles {
        count: h.len(),
        p50_us: h.value_at_quantile(0.5),
        p99_us: h.value_at_quantile(0.99),
        p999_us: h.value_at_quantile(0.999),
        max_us: h.max(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_holds_its_seconds_alone_and_the_total_everything() {
        let live = LiveLatency::new();
        let t0 = live.started;
        let at = |s: u64| t0 + Duration::from_secs(s) + Duration::from_millis(500);
        // Second 0: 99 fast produces and one slow one; second 3: fast only.
        for _ in 0..99 {
            live.record_at(LiveOp::Produce, Duration::from_micros(200), at(0));
        }
        live.record_at(LiveOp::Produce, Duration::from_millis(50), at(0));
        for _ in 0..100 {
            live.record_at(LiveOp::Produce, Duration::from_micros(300), at(3));
        }
        let both = live.window_at(LiveOp::Produce, Duration::from_secs(4), at(3));
        assert_eq!(both.count, 200);
        assert!((49_000..=51_000).contains(&both.max_us), "{both:?}");
        let last = live.window_at(LiveOp::Produce, Duration::from_secs(2), at(3));
        assert_eq!(last.count, 100);
        assert!((297..=303).contains(&last.p99_us), "within 1 %: {last:?}");
        // The fetch side saw nothing.
        assert_eq!(
            live.window_at(LiveOp::TailFetch, Duration::from_secs(4), at(3))
                .count,
            0
        );
        // A slot is reused SLOTS seconds later, its old second gone.
        live.record_at(LiveOp::Produce, Duration::from_micros(100), at(SLOTS as u64));
        let wrapped = live.window_at(
            LiveOp::Produce,
            Duration::from_secs(SLOTS as u64),
            at(SLOTS as u64),
        );
        assert_eq!(wrapped.count, 101, "second 0 is out of the window");
        // The cumulative buckets count all 201, eight to a doubling.
        let buckets = live.cumulative(LiveOp::Produce);
        assert_eq!(buckets.iter().map(|b| b.1).sum::<u64>(), 201);
        let fast = buckets.iter().find(|b| b.0 >= 200).expect("a bucket at 200 us");
        assert!(fast.0 < 220, "{buckets:?}");
    }

    #[test]
    fn outliers_are_clamped_not_lost() {
        let live = LiveLatency::new();
        live.record(LiveOp::TailFetch, Duration::from_secs(1000));
        live.record(LiveOp::TailFetch, Duration::ZERO);
        let q = live.window(LiveOp::TailFetch, Duration::from_secs(1));
        assert_eq!(q.count, 2);
        assert!(q.max_us >= MAX_US / 100 * 99);
    }
}
