//! The I/O governor: the background budgets driven by the live path's
//! latency. Operators' budgets (`keel.cold.read.bytes.per.sec`,
//! `keel.tier.move.bytes.per.sec`, `log.cleaner.io.max.bytes.per.second`)
//! become ceilings; with a target (`keel.io.live.latency.target.ms`), each
//! background class runs at an effective budget at or below its ceiling
//! that the governor moves every [`TICK`]:
//!
//! * **Over target** (the live p99 over the last [`WINDOW`] above it): each
//!   class doing I/O is cut to half of what it used or was allowed,
//!   whichever is less, never below its floor. Then the governor holds for
//!   a window, so the next decision sees latencies from after the cut.
//! * **Within target**: each class its budget held back (it waited for
//!   budget in the last tick) grows by a twentieth of its reference rate:
//!   its ceiling, or for an unlimited one the most it was seen to do, so
//!   from floor to ceiling in ten seconds. Reaching it, it is at its
//!   ceiling again (unlimited, if that is what it is).
//!
//! Why additive increase and multiplicative decrease: the signal is noisy
//! and late (a p99 over two seconds), and how much background I/O a live
//! path can bear depends on the device, the page cache and the live load
//! at the moment, none of which the broker can model. A halving takes
//! effect within one tick whatever the device; a slow additive probe
//! overshoots by at most a twentieth of the reference before the next cut;
//! and classes that share the device converge to shares of what the live
//! path leaves in proportion to their reference rates (Chiu and Jain's
//! result for AIMD, each class stepping by its own twentieth), so the
//! cleaner cannot starve the mover. A PID controller needs a model of the device's
//! response, and a delay-gradient controller a baseline latency, and both
//! move with the live workload.
//!
//! Floors keep background work progressing: a twentieth of the reference
//! rate, at least [`MIN_FLOOR`]; the mover's is a quarter while the fast
//! tier is over its budget (the live path's appends need the room it
//! frees). A live path slow for reasons of its own (its own load, CPU)
//! holds background work at its floors and no lower.
//!
//! Sans I/O: [`Governor::tick`] takes what was measured and returns the
//! budgets; [`crate::IoScheduler::govern`] measures and applies them.

use std::time::Duration;

/// How often the governor decides.
pub const TICK: Duration = Duration::from_millis(500);

/// The live latency window it judges by.
pub const WINDOW: Duration = Duration::from_secs(2);

/// Ticks held after a cut: a window's worth.
const HOLD_TICKS: u64 = (WINDOW.as_millis() / TICK.as_millis()) as u64;

/// The lowest floor, bytes per second.
pub const MIN_FLOOR: u64 = 1 << 20;

/// The reference rate of an unlimited class seen doing nothing yet.
const MIN_REFERENCE: u64 = 16 << 20;

/// What one background class did in the last tick.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassSample {
    /// The operator's budget (0: unlimited).
    pub ceiling: u64,
    /// Bytes per second it read or wrote over the tick.
    pub used: u64,
    /// Whether a draw waited for budget in the tick.
    pub held_back: bool,
    /// Whether its work is urgent (the mover while the fast tier is over
    /// its budget): a higher floor.
    pub urgent: bool,
}

/// The governor of the three background classes (cold reads, tier moves,
/// cleaning, in that order).
#[derive(Debug, Default)]
pub struct Governor {
    target: Option<Duration>,
    classes: [Class; 3],
    tick: u64,
    hold_until: u64,
    cuts: u64,
    last_p99: Option<Duration>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Class {
    /// The budget below the ceiling; `None`: at the ceiling.
    effective: Option<u64>,
    /// The most it was seen to do in a tick, bytes per second.
    peak: u64,
}

/// What the governor did, for `/stats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GovernorStats {
    pub target: Option<Duration>,
    /// Cuts since start-up.
    pub cuts: u64,
    /// The live p99 of the last tick.
    pub live_p99: Option<Duration>,
}

impl Governor {
    pub fn new(target: Option<Duration>) -> Governor {
        Governor {
            target,
            ..Governor::default()
        }
    }

    pub fn target(&self) -> Option<Duration> {
        self.target
    }

    /// A new target (`None`: off, every class at its ceiling); the classes
    /// start again from their ceilings.
    pub fn set_target(&mut self, target: Option<Duration>) {
        if target != self.target {
            self.target = target;
            for c in &mut self.classes {
                c.effective = None;
            }
            self.hold_until = 0;
        }
    }

    pub fn stats(&self) -> GovernorStats {
        GovernorStats {
            target: self.target,
            cuts: self.cuts,
            live_p99: self.last_p99,
        }
    }

    /// The budgets without a tick: each class's effective budget under its
    /// (possibly new) ceiling.
    pub fn budgets(&self, ceilings: [u64; 3]) -> [u64; 3] {
        std::array::from_fn(|i| match (self.classes[i].effective, ceilings[i]) {
            (None, ceiling) => ceiling,
            (Some(e), 0) => e,
            (Some(e), ceiling) => e.min(ceiling),
        })
    }

    /// One decision: `live_p99` the live path's p99 over the last
    /// [`WINDOW`] (`None`: no live traffic), `samples` what each class did
    /// in the tick. Returns each class's budget (0: unlimited).
    pub fn tick(&mut self, live_p99: Option<Duration>, samples: [ClassSample; 3]) -> [u64; 3] {
        self.tick += 1;
        self.last_p99 = live_p99;
        let ceilings = samples.map(|s| s.ceiling);
        let Some(target) = self.target else {
            return ceilings;
        };
        for (c, s) in self.classes.iter_mut().zip(&samples) {
            c.peak = c.peak.max(s.used);
        }
        let over = live_p99.is_some_and(|p| p > target);
        if over && self.tick >= self.hold_until {
            let mut cut = false;
            for (c, s) in self.classes.iter_mut().zip(&samples) {
                if s.used == 0 {
                    continue;
                }
                let floor = floor(c, s);
                let allowed = c
                    .effective
                    .unwrap_or(if s.ceiling > 0 { s.ceiling } else { u64::MAX });
                let next = (allowed.min(s.used) / 2).max(floor);
                if c.effective.is_none_or(|e| next < e) {
                    c.effective = Some(next);
                    cut = true;
                }
            }
            if cut {
                self.cuts += 1;
                self.hold_until = self.tick + HOLD_TICKS;
            }
        } else if !over {
            for (c, s) in self.classes.iter_mut().zip(&samples) {
                let Some(e) = c.effective else { continue };
                // An urgent class is raised to its floor at once.
                let e = e.max(floor(c, s));
                if !s.held_back {
                    c.effective = Some(e);
                    continue;
                }
                let reference = reference(c, s);
                let next = e.saturating_add(reference / 20);
                c.effective = (next < reference).then_some(next);
            }
        }
        self.budgets(ceilings)
    }
}

/// The rate a class's growth step and floor are shares of: its ceiling,
/// or what it was seen to do when unlimited.
fn reference(c: &Class, s: &ClassSample) -> u64 {
    if s.ceiling > 0 {
        s.ceiling
    } else {
        c.peak.max(MIN_REFERENCE)
    }
}

fn floor(c: &Class, s: &ClassSample) -> u64 {
    let reference = reference(c, s);
    let share = if s.urgent { reference / 4 } else { reference / 20 };
    share.max(MIN_FLOOR).min(reference)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1_000_000;

    fn sample(ceiling: u64, used: u64, held_back: bool) -> ClassSample {
        ClassSample {
            ceiling,
            used,
            held_back,
            urgent: false,
        }
    }

    fn idle(ceiling: u64) -> ClassSample {
        sample(ceiling, 0, false)
    }

    #[test]
    fn off_every_class_runs_at_its_ceiling() {
        let mut g = Governor::new(None);
        let budgets = g.tick(
            Some(Duration::from_secs(1)),
            [sample(100 * MB, 100 * MB, true), idle(0), idle(50 * MB)],
        );
        assert_eq!(budgets, [100 * MB, 0, 50 * MB]);
        assert_eq!(g.stats().cuts, 0);
    }

    #[test]
    fn over_target_cuts_by_half_holds_then_grows_back_to_the_ceiling() {
        let target = Duration::from_millis(5);
        let (over, within) = (Some(Duration::from_millis(9)), Some(Duration::from_millis(2)));
        let mut g = Governor::new(Some(target));
        // Cold reads use 80 of their 100 MB/s; the cleaner is idle.
        let b = g.tick(over, [sample(100 * MB, 80 * MB, false), idle(0), idle(50 * MB)]);
        assert_eq!(
            b,
            [40 * MB, 0, 50 * MB],
            "half of what was used; idle classes untouched"
        );
        // Still over during the hold: no second cut until a window passed.
        for _ in 0..HOLD_TICKS - 1 {
            let b = g.tick(over, [sample(100 * MB, 40 * MB, true), idle(0), idle(50 * MB)]);
            assert_eq!(b[0], 40 * MB);
        }
        let b = g.tick(over, [sample(100 * MB, 40 * MB, true), idle(0), idle(50 * MB)]);
        assert_eq!(b[0], 20 * MB);
        assert_eq!(g.stats().cuts, 2);
        // Within target: +5 MB/s (a twentieth of the ceiling) a tick while
        // held back, nothing while not.
        let b = g.tick(within, [sample(100 * MB, 20 * MB, true), idle(0), idle(50 * MB)]);
        assert_eq!(b[0], 25 * MB);
        let b = g.tick(within, [sample(100 * MB, 3 * MB, false), idle(0), idle(50 * MB)]);
        assert_eq!(b[0], 25 * MB);
        let mut ticks = 0;
        while g.tick(within, [sample(100 * MB, 25 * MB, true), idle(0), idle(50 * MB)])[0] < 100 * MB {
            ticks += 1;
            assert!(ticks < 20);
        }
        assert_eq!(ticks, 14, "25 to 100 MB/s at 5 MB/s a tick");
    }

    #[test]
    fn floors_bound_the_cuts_and_an_urgent_mover_keeps_a_quarter() {
        let over = Some(Duration::from_millis(50));
        let mut g = Governor::new(Some(Duration::from_millis(5)));
        let mut mover = sample(40 * MB, 40 * MB, true);
        for _ in 0..40 {
            g.tick(over, [sample(100 * MB, 100 * MB, true), mover, idle(0)]);
        }
        let b = g.tick(over, [sample(100 * MB, 100 * MB, true), mover, idle(0)]);
        assert_eq!(b[0], 5 * MB, "a twentieth of the ceiling");
        assert_eq!(b[1], 2 * MB);
        // The fast tier goes over its budget: the mover's floor is a quarter.
        mover.urgent = true;
        mover.held_back = false;
        let b = g.tick(
            Some(Duration::from_millis(1)),
            [sample(100 * MB, 5 * MB, false), mover, idle(0)],
        );
        assert_eq!(b[1], 10 * MB);
    }

    #[test]
    fn an_unlimited_class_is_cut_from_what_it_did_and_freed_again() {
        let target = Some(Duration::from_millis(5));
        let mut g = Governor::new(target);
        // Unlimited cold reads at 300 MB/s push the live p99 over.
        let b = g.tick(
            Some(Duration::from_millis(20)),
            [sample(0, 300 * MB, false), idle(0), idle(0)],
        );
        assert_eq!(b[0], 150 * MB);
        // Growth by 15 MB/s (a twentieth of the 300 seen) up to the 300,
        // then unlimited again.
        let mut ticks = 0;
        loop {
            let b = g.tick(
                Some(Duration::from_millis(1)),
                [sample(0, 150 * MB, true), idle(0), idle(0)],
            );
            ticks += 1;
            if b[0] == 0 {
                break;
            }
            assert!(b[0] > 150 * MB && b[0] < 300 * MB, "{b:?}");
        }
        assert_eq!(ticks, 10);
        // No live traffic at all counts as within target.
        assert_eq!(g.tick(None, [sample(0, 300 * MB, false), idle(0), idle(0)])[0], 0);
    }

    #[test]
    fn a_lowered_ceiling_applies_at_once_and_a_new_target_starts_afresh() {
        let mut g = Governor::new(Some(Duration::from_millis(5)));
        g.tick(
            Some(Duration::from_millis(9)),
            [sample(100 * MB, 100 * MB, true), idle(0), idle(0)],
        );
        assert_eq!(g.budgets([100 * MB, 0, 0])[0], 50 * MB);
        assert_eq!(g.budgets([30 * MB, 0, 0])[0], 30 * MB);
        g.set_target(Some(Duration::from_millis(10)));
        assert_eq!(g.budgets([100 * MB, 0, 0])[0], 100 * MB);
        g.set_target(None);
        assert_eq!(
            g.tick(
                Some(Duration::from_secs(1)),
                [sample(100 * MB, 100 * MB, true), idle(0), idle(0)]
            )[0],
            100 * MB
        );
    }
}
