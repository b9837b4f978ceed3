//! The broker's background work: the group coordinator's timers, the
//! transaction coordinator's (markers of transactions a restart or a
//! timeout left, expiry of idle ids) and the data plane's (retention,
//! producer expiration, the page-cache pass, time-based flushes, the mover,
//! the cleaner).

use std::sync::Arc;
use std::time::Duration;

use crate::handlers;
use crate::Broker;

impl Broker {
    /// Background work: the coordinators' timers and the data plane's
    /// (retention, producer expiration, the page cache pass, time-based
    /// flushes, the mover, the cleaner). Runs until the runtime shuts down.
    pub fn spawn_maintenance(self: &Arc<Self>) {
        self.groups.spawn_timers();
        handlers::markers::spawn_timers(self);
        handlers::share::spawn_sweeper(self);
        let config = self.config();
        let every = |key: &str, default: u64| {
            Duration::from_millis(u64::try_from(config.num(key)).unwrap_or(default).max(1))
        };
        let schedule = keel_data::maintenance::Schedule {
            retention_every: Duration::from_millis(config.retention_check_interval_ms()),
            expire_producers_every: every("producer.id.expiration.check.interval.ms", 600_000),
        };
        keel_data::maintenance::spawn(&self.data, schedule);
    }
}
