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

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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

    fn index(self) -> usize {
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
}

impl Budget {
    fn new(class: IoClass, bytes_per_sec: u64) -> Budget {
        Budget {
            class,
            pacer: Pacer::new(bytes_per_sec),
            bytes: AtomicU64::new(0),
            throttled_us: AtomicU64::new(0),
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

    pub fn stats(&self) -> IoClassStats {
        IoClassStats {
            class: self.class,
            budget_bytes_per_sec: self.bytes_per_sec(),
            bytes: self.bytes.load(Ordering::Relaxed),
            throttled_us: self.throttled_us.load(Ordering::Relaxed),
        }
    }
}

/// What one class has done since start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoClassStats {
    pub class: IoClass,
    /// 0: unlimited.
    pub budget_bytes_per_sec: u64,
    /// Bytes read or written.
    pub bytes: u64,
    /// Time draws waited for the budget.
    pub throttled_us: u64,
}

/// Every class's budget.
#[derive(Debug)]
pub struct IoScheduler {
    classes: [Budget; 4],
}

/// The budgets to start with, bytes per second (0: unlimited).
#[derive(Debug, Clone, Copy, Default)]
pub struct Budgets {
    pub cold_read: u64,
    pub tier_move: u64,
    pub cleaning: u64,
}

impl IoScheduler {
    pub fn new(budgets: Budgets) -> IoScheduler {
        IoScheduler {
            classes: [
                Budget::new(IoClass::Live, 0),
                Budget::new(IoClass::ColdRead, budgets.cold_read),
                Budget::new(IoClass::TierMove, budgets.tier_move),
                Budget::new(IoClass::Cleaning, budgets.cleaning),
            ],
        }
    }

    /// A class's budget, to draw on.
    pub fn budget(&self, class: IoClass) -> &Budget {
        &self.classes[class.index()]
    }

    /// Sets a background class's budget (0: unlimited); the live path is
    /// never paced, and a budget set for it is ignored.
    pub fn set_budget(&self, class: IoClass, bytes_per_sec: u64) {
        if class != IoClass::Live {
            self.budget(class).set_bytes_per_sec(bytes_per_sec);
        }
    }

    pub fn stats(&self) -> [IoClassStats; 4] {
        IoClass::ALL.map(|c| self.budget(c).stats())
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
}
