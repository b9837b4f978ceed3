//! Time in Kafka's unit (milliseconds since the Unix epoch), and the seam
//! that lets tests move it by hand.

use std::time::{SystemTime, UNIX_EPOCH};

/// A time source. Code that decides by time (coordinators' timeouts,
/// retention, the mover) takes one, so tests can set the time.
pub trait Clock: Send + Sync {
    fn now_ms(&self) -> i64;
}

/// Wall-clock time.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        now_ms()
    }
}

/// The wall clock now, in milliseconds since the Unix epoch (0 before it).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
