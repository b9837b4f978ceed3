//! The data plane's background work: retention, producer expiration, the
//! page-cache pass, the shared scans' idle readers, time-based flushes
//! (with seal retries), the I/O governor, the mover and the cleaner. [`spawn`] starts all of it; each step is also a method a
//! test can call on its own.

use std::sync::Arc;
use std::time::Duration;

use crate::plane::DataPlane;

/// How often written segment data is dropped from the page cache.
const PAGE_CACHE_DROP_EVERY: Duration = Duration::from_secs(1);

/// How often the shared scans drop what readers gone idle held.
const SCAN_TICK_EVERY: Duration = Duration::from_secs(1);

/// How often `flush.ms` is checked; Kafka's scheduler checks it on a
/// similar fixed interval.
const FLUSH_CHECK_EVERY: Duration = Duration::from_millis(100);

/// The intervals of the background work operators set.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    /// `log.retention.check.interval.ms`.
    pub retention_every: Duration,
    /// `producer.id.expiration.check.interval.ms`.
    pub expire_producers_every: Duration,
}

/// Starts the background work. Call from within the runtime; it runs until
/// the runtime shuts down.
pub fn spawn(data: &Arc<DataPlane>, schedule: Schedule) {
    spawn_every(data, schedule.retention_every, true, DataPlane::apply_retention);
    spawn_every(
        data,
        schedule.expire_producers_every,
        true,
        DataPlane::expire_producers,
    );
    tokio::spawn(crate::mover::run(Arc::clone(data)));
    crate::cleaner::spawn(data);
    spawn_every(data, PAGE_CACHE_DROP_EVERY, false, DataPlane::drop_written_pages);
    spawn_every(data, FLUSH_CHECK_EVERY, false, DataPlane::flush_due);
    spawn_every(data, SCAN_TICK_EVERY, false, DataPlane::tick_scans);
    spawn_every(data, keel_tier::govern::TICK, false, DataPlane::govern_io);
}

/// Runs `work` on a blocking thread every `period` (after waiting one
/// period first if `wait_first`), one run at a time.
fn spawn_every(data: &Arc<DataPlane>, period: Duration, wait_first: bool, work: fn(&DataPlane)) {
    let data = Arc::clone(data);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        // A late run is not followed by a burst of catch-up runs.
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        if wait_first {
            tick.tick().await;
        }
        loop {
            tick.tick().await;
            let d = Arc::clone(&data);
            let _ = tokio::task::spawn_blocking(move || work(&d)).await;
        }
    });
}

impl DataPlane {
    /// Deletes segments past each partition's retention.
    pub fn apply_retention(&self) {
        let now = self.clock.now_ms();
        for topic in self.topics.all() {
            for p in &topic.partitions {
                if p.unavailable().is_some() {
                    continue;
                }
                // In a cluster, nothing past the committed offset goes.
                let ceiling = p.retention_ceiling();
                let applied = p
                    .with_log(|log| log.apply_retention_below(now, ceiling))
                    .map_err(std::io::Error::from)
                    .and_then(|r| r);
                if let Err(e) = applied {
                    tracing::error!(topic = %topic.meta.name, partition = p.index, error = %e, "retention failed")
                }
            }
        }
    }

    /// Forgets producers idle for `producer.id.expiration.ms`.
    pub fn expire_producers(&self) {
        let (now, expiration_ms) = (self.clock.now_ms(), self.policies.producer_expiration_ms());
        let mut expired = 0;
        for topic in self.topics.all() {
            for p in &topic.partitions {
                expired += p.expire_producers(now, expiration_ms);
            }
        }
        if expired > 0 {
            tracing::info!(expired, "expired idle producer ids");
        }
    }

    /// Keeps written segment data out of the page cache (see
    /// `Partition::drop_written_pages`).
    pub fn drop_written_pages(&self) {
        for topic in self.topics.all() {
            for p in &topic.partitions {
                p.drop_written_pages();
            }
        }
    }

    /// The I/O governor's decision (`keel_tier::govern`): a no-op without
    /// a live latency target.
    pub fn govern_io(&self) {
        self.io.govern();
    }

    /// Lets each partition's shared scan drop the data of readers gone
    /// idle and below the log start.
    pub fn tick_scans(&self) {
        for topic in self.topics.all() {
            for p in &topic.partitions {
                p.tick_scan();
            }
        }
    }

    /// Flushes the partitions whose `flush.ms` is due, and retries seals
    /// that failed.
    pub fn flush_due(&self) {
        let now = self.clock.now_ms();
        for topic in self.topics.all() {
            for p in &topic.partitions {
                if p.unavailable().is_some() {
                    continue;
                }
                p.spawn_seals();
                let result = p.with_log(|log| {
                    if log.needs_time_flush(now) {
                        log.flush()
                    } else {
                        Ok(())
                    }
                });
                if let Ok(Err(e)) = result {
                    tracing::error!(topic = %topic.meta.name, partition = p.index, error = %e, "flush failed");
                }
            }
        }
    }

    /// Removes directories of deleted partitions on a thread of their own.
    pub fn remove_in_background(&self, dirs: Vec<std::path::PathBuf>) {
        if dirs.is_empty() {
            return;
        }
        let storage = Arc::clone(&self.storage);
        let spawned = std::thread::Builder::new()
            .name("keel-delete".into())
            .spawn(move || {
                for dir in dirs {
                    match keel_log::remove_retired(storage.as_ref(), &dir) {
                        Ok(()) => tracing::info!(dir = %dir.display(), "removed a deleted partition's directory"),
                        Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "cannot remove a deleted partition's directory"),
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the thread that removes deleted partitions");
        }
    }
}
