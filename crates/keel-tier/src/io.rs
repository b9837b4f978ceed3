//! The I/O scheduler: every class of disk and object-store I/O Keel does,
//! each with its byte budget per second and its counters, in one place.
//!
//! * [`IoClass::Live`]: appends and tail reads. Never paced; counted.
//! * [`IoClass::ColdRead`]: fetches below the tail cache
//!   (`keel.cold.read.bytes.per.sec`).
//! * [`IoClass::TierMove`]: the mover's copies to colder tiers
//!   (`keel.tier.move.bytes.per.sec`).
//! * [`IoClass::Cleaning`]: the log cleaner's passes
//!   (`log.cleaner.io.max.bytes.per.second`).
//!
//! A background class waits for its own budget only: a cold read never
//! waits for the mover's, and nothing waits for the live path. A budget of
//! 0 is unlimited. Budgets change at run time (dynamic configs), and a draw
//! already waiting sees the new rate.
//!
//! The operators' budgets are ceilings. With a live latency target
//! (`keel.io.live.latency.target.ms`), the [`Governor`] runs each
//! background class at an effective budget at or below its ceiling, from
//! the live path's latency the scheduler keeps ([`LiveLatency`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::govern::{ClassSample, Governor, GovernorStats};
use crate::live::{LiveLatency, LiveOp};
use crate::pace::Pacer;

/// A class of I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IoClass {
    Live,
    ColdRead,
    TierMove,
    Cleaning,
}

impl IoClass {
    pub const ALL: [IoClass; 4] = [
        IoClass::Live,
        IoClass::ColdRead,
        IoClass::TierMove,
        IoClass::Cleaning,
    ];

    /// The name `/stats` and `/metrics` use.
    pub fn name(self) -> &'static str {
        match self {
            IoClass::Live => "live",
            IoClass::ColdRead => "cold_read",
            IoClass::TierMove => "tier_move",
            IoClass::Cleaning => "cleaning",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// One class's budget and what it has done.
#[derive(Debug)]
pub struct Budget {
    class: IoClass,
    pacer: Pacer,
    bytes: AtomicU64,
    throttled_us: AtomicU64,
    /// Draws waiting for budget now.
    waiting: AtomicU64,
}

impl Budget {
    fn new(class: IoClass, bytes_per_sec: u64) -> Budget {
        Budget {
            class,
            pacer: Pacer::new(bytes_per_sec),
            bytes: AtomicU64::new(0),
            throttled_us: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
        }
    }

    /// A budget of its own, unlimited, outside any scheduler (tests, tools).
    pub fn unlimited(class: IoClass) -> Budget {
        Budget::new(class, 0)
    }

    pub fn class(&self) -> IoClass {
        self.class
    }

    /// Bytes per second (0: unlimited).
    pub fn bytes_per_sec(&self) -> u64 {
        self.pacer.bytes_per_sec()
    }

    /// Waits until `bytes` of budget are available and takes them; returns
    /// how long it waited. `take(0)` waits only until the budget is out of
    /// debt.
    pub async fn take(&self, bytes: u64) -> Duration {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        // Counted down however the draw ends (a dropped future too).
        let _waiting = Waiting(&self.waiting);
        let waited = self.pacer.take(bytes).await;
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.throttled_us
            .fetch_add(waited.as_micros() as u64, Ordering::Relaxed);
        waited
    }

    /// Charges `bytes` used beyond what was taken, without waiting: the
    /// draws after it repay the debt.
    pub async fn charge(&self, bytes: u64) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.pacer.charge(bytes).await;
    }

    /// Counts `bytes` of I/O that is never paced (the live path).
    pub fn count(&self, bytes: u64) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    fn set_bytes_per_sec(&self, bytes_per_sec: u64) {
        self.pacer.set_bytes_per_sec(bytes_per_sec);
    }

    fn stats(&self, ceiling: u64) -> IoClassStats {
        IoClassStats {
            class: self.class,
            budget_bytes_per_sec: self.bytes_per_sec(),
            ceiling_bytes_per_sec: ceiling,
            bytes: self.bytes.load(Ordering::Relaxed),
            throttled_us: self.throttled_us.load(Ordering::Relaxed),
        }
    }
}

/// A draw in progress, counted in its budget's `waiting`.
struct Waiting<'a>(&'a AtomicU64);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What one class has done since start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoClassStats {
    pub class: IoClass,
    /// The budget in force (0: unlimited): the ceiling, or what the
    /// governor set below it.
    pub budget_bytes_per_sec: u64,
    /// The operator's budget (0: unlimited).
    pub ceiling_bytes_per_sec: u64,
    /// Bytes read or written.
    pub bytes: u64,
    /// Time draws waited for the budget.
    pub throttled_us: u64,
}

/// Every class's budget, the live path's latency, and the governor.
#[derive(Debug)]
pub struct IoScheduler {
    classes: [Budget; 4],
    /// The operators' budgets.
    ceilings: [AtomicU64; 4],
    /// Classes whose work is urgent (see [`ClassSample::urgent`]).
    urgent: [AtomicBool; 4],
    live: LiveLatency,
    governor: Mutex<Governed>,
}

/// The governor, the counters its last tick read, and its recent ticks.
#[derive(Debug)]
struct Governed {
    governor: Governor,
    last: Option<(Instant, [IoClassStats; 4])>,
    history: std::collections::VecDeque<GovernorTick>,
}

/// The governor ticks `/stats` keeps: the last five minutes.
const HISTORY: usize = 600;

/// One governor decision, for the budget over time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GovernorTick {
    /// Wall-clock ms since the epoch.
    pub at_ms: u64,
    /// The live p99 it judged by (µs; 0: no live traffic).
    pub live_p99_us: u64,
    /// Cold reads', tier moves' and cleaning's budgets set (0: unlimited).
    pub budgets: [u64; 3],
    /// What each did over the tick, bytes per second.
    pub used: [u64; 3],
}

/// The background classes the governor drives, in its order.
const GOVERNED: [IoClass; 3] = [IoClass::ColdRead, IoClass::TierMove, IoClass::Cleaning];

/// The budgets to start with, bytes per second (0: unlimited).
#[derive(Debug, Clone, Copy, Default)]
pub struct Budgets {
    pub cold_read: u64,
    pub tier_move: u64,
    pub cleaning: u64,
}

impl IoScheduler {
    pub fn new(budgets: Budgets) -> IoScheduler {
        let ceilings = [0, budgets.cold_read, budgets.tier_move, budgets.cleaning];
        IoScheduler {
            classes: std::array::from_fn(|i| Budget::new(IoClass::ALL[i], ceilings[i])),
            ceilings: ceilings.map(AtomicU64::new),
            urgent: std::array::from_fn(|_| AtomicBool::new(false)),
            live: LiveLatency::new(),
            governor: Mutex::new(Governed {
                governor: Governor::new(None),
                last: None,
                history: std::collections::VecDeque::new(),
            }),
        }
    }

    /// The live path's latencies, which the request path records.
    pub fn live(&self) -> &LiveLatency {
        &self.live
    }

    /// A class's budget, to draw on.
    pub fn budget(&self, class: IoClass) -> &Budget {
        &self.classes[class.index()]
    }

    /// Sets a background class's budget, its ceiling (0: unlimited); the
    /// live path is never paced, and a budget set for it is ignored.
    pub fn set_budget(&self, class: IoClass, bytes_per_sec: u64) {
        if class != IoClass::Live {
            self.ceilings[class.index()].store(bytes_per_sec, Ordering::Relaxed);
            self.apply(&self.governor.lock().governor);
        }
    }

    /// A class's budget as set: the ceiling of the one in force.
    pub fn ceiling(&self, class: IoClass) -> u64 {
        self.ceilings[class.index()].load(Ordering::Relaxed)
    }

    /// Marks a class's work urgent or not: the governor keeps it a higher
    /// floor while it is.
    pub fn set_urgent(&self, class: IoClass, urgent: bool) {
        self.urgent[class.index()].store(urgent, Ordering::Relaxed);
    }

    /// Sets the live latency target (`None`: the governor is off and every
    /// class runs at its ceiling).
    pub fn set_live_target(&self, target: Option<Duration>) {
        let mut g = self.governor.lock();
        g.governor.set_target(target);
        self.apply(&g.governor);
    }

    fn ceilings(&self) -> [u64; 3] {
        GOVERNED.map(|c| self.ceilings[c.index()].load(Ordering::Relaxed))
    }

    fn apply(&self, governor: &Governor) {
        self.set_governed(governor.budgets(self.ceilings()));
    }

    fn set_governed(&self, budgets: [u64; 3]) {
        for (class, budget) in GOVERNED.iter().zip(budgets) {
            self.budget(*class).set_bytes_per_sec(budget);
        }
    }

    /// One governor decision (every [`crate::govern::TICK`]): what each
    /// class did since the last, and the live p99 over the governor's
    /// window, the worse of produce and tail fetch.
    pub fn govern(&self) {
        self.govern_at(Instant::now());
    }

    /// [`IoScheduler::govern`] as of `now`.
    pub fn govern_at(&self, now: Instant) {
        let mut g = self.governor.lock();
        // Read under the lock, so a new ceiling set meanwhile is not lost.
        let stats = self.stats();
        if let Some((then, _)) = g.last {
            // A tick right after a late one measures rates over too short
            // a time to mean anything.
            if now.duration_since(then) < crate::govern::TICK / 2 {
                return;
            }
        }
        let Some((then, last)) = g.last.replace((now, stats)) else {
            return;
        };
        if g.governor.target().is_none() {
            return;
        }
        let secs = now.duration_since(then).as_secs_f64();
        let samples = GOVERNED.map(|class| {
            let (now, before) = (stats[class.index()], last[class.index()]);
            ClassSample {
                ceiling: now.ceiling_bytes_per_sec,
                used: ((now.bytes.saturating_sub(before.bytes)) as f64 / secs) as u64,
                held_back: now.throttled_us > before.throttled_us
                    || self.budget(class).waiting.load(Ordering::Relaxed) > 0,
                urgent: self.urgent[class.index()].load(Ordering::Relaxed),
            }
        });
        let live_p99 = LiveOp::ALL
            .iter()
            .map(|op| self.live.window_at(*op, crate::govern::WINDOW, now))
            .filter(|q| q.count > 0)
            .map(|q| Duration::from_micros(q.p99_us))
            .max();
        let budgets = g.governor.tick(live_p99, samples);
        self.set_governed(budgets);
        if g.history.len() == HISTORY {
            g.history.pop_front();
        }
        let at_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        g.history.push_back(GovernorTick {
            at_ms,
            live_p99_us: live_p99.map_or(0, |d| d.as_micros() as u64),
            budgets,
            used: samples.map(|s| s.used),
        });
    }

    pub fn governor_stats(&self) -> GovernorStats {
        self.governor.lock().governor.stats()
    }

    /// The governor's decisions over the last five minutes, oldest first
    /// (none while it is off).
    pub fn governor_history(&self) -> Vec<GovernorTick> {
        self.governor.lock().history.iter().copied().collect()
    }

    pub fn stats(&self) -> [IoClassStats; 4] {
        IoClass::ALL.map(|c| {
            self.budget(c)
                .stats(self.ceilings[c.index()].load(Ordering::Relaxed))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn each_class_waits_for_its_own_budget_only() {
        let io = IoScheduler::new(Budgets {
            cold_read: 1000,
            tier_move: 1000,
            cleaning: 0,
        });
        // The mover spends its second of budget and owes another.
        assert_eq!(io.budget(IoClass::TierMove).take(1000).await, Duration::ZERO);
        io.budget(IoClass::TierMove).charge(1000).await;
        // A cold read still has its own full bucket; cleaning is unlimited.
        assert_eq!(io.budget(IoClass::ColdRead).take(1000).await, Duration::ZERO);
        assert_eq!(io.budget(IoClass::Cleaning).take(1 << 30).await, Duration::ZERO);
        // The mover waits out its debt.
        assert!(io.budget(IoClass::TierMove).take(0).await >= Duration::from_millis(900));
        // The live path is counted, never paced, and keeps no budget.
        io.set_budget(IoClass::Live, 10);
        io.budget(IoClass::Live).count(1 << 20);
        let stats = io.stats();
        assert_eq!(stats[0].budget_bytes_per_sec, 0);
        assert_eq!(stats[1].ceiling_bytes_per_sec, 1000);
        assert_eq!(stats[0].bytes, 1 << 20);
        assert_eq!(stats[2].bytes, 2000);
        assert!(stats[2].throttled_us >= 900_000);
        assert_eq!(stats[1].throttled_us, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_budget_reaches_a_class_at_once() {
        let io = IoScheduler::new(Budgets {
            cold_read: 0,
            tier_move: 0,
            cleaning: 100,
        });
        io.budget(IoClass::Cleaning).take(100).await;
        io.set_budget(IoClass::Cleaning, 0);
        assert_eq!(io.budget(IoClass::Cleaning).take(1 << 20).await, Duration::ZERO);
        assert_eq!(io.budget(IoClass::Cleaning).bytes_per_sec(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_live_path_cuts_the_background_budget_below_its_ceiling() {
        let io = IoScheduler::new(Budgets {
            cold_read: 100_000_000,
            tier_move: 0,
            cleaning: 0,
        });
        io.set_live_target(Some(Duration::from_millis(5)));
        let start = std::time::Instant::now();
        io.govern_at(start);
        io.budget(IoClass::ColdRead).take(50_000_000).await;
        for _ in 0..100 {
            io.live().record(LiveOp::Produce, Duration::from_millis(20));
        }
        // A tick within half a period of the last one is no decision.
        io.govern_at(start + Duration::from_millis(100));
        assert_eq!(io.governor_stats().cuts, 0);
        io.govern_at(start + crate::govern::TICK);
        let cut = io.stats()[1];
        assert_eq!(cut.ceiling_bytes_per_sec, 100_000_000);
        assert!(
            cut.budget_bytes_per_sec < 100_000_000 && cut.budget_bytes_per_sec >= 5_000_000,
            "{cut:?}"
        );
        assert_eq!(io.governor_stats().cuts, 1);
        let [tick] = io.governor_history()[..] else {
            panic!("one tick: {:?}", io.governor_history())
        };
        assert_eq!(tick.budgets[0], cut.budget_bytes_per_sec);
        assert!(tick.live_p99_us >= 19_000, "{tick:?}");
        // A new ceiling below the cut budget applies at once; the target
        // off, every class is at its ceiling.
        io.set_budget(IoClass::ColdRead, 1_000_000);
        assert_eq!(io.stats()[1].budget_bytes_per_sec, 1_000_000);
        io.set_budget(IoClass::ColdRead, 100_000_000);
        io.set_live_target(None);
        assert_eq!(io.stats()[1].budget_bytes_per_sec, 100_000_000);
    }
}
