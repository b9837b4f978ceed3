//! The scan buffer: broker-owned memory where data read below the tail
//! cache is held for the readers close behind the one whose fetch read it
//! (see `keel_data::scan`), under one byte limit for all partitions. It is
//! neither the page cache (cold reads bypass it) nor the tail cache (which
//! holds only appended batches).

use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of the scan buffer at most, unless the memory limit makes it
/// smaller ([`crate::memory::MemoryLimit::scan_buffer_bytes`]).
pub const SCAN_BUFFER_BYTES: u64 = 256 << 20;

/// How the shared scans hold data and pace readers (the `keel.scan.*`
/// configs): see `keel_data::scan`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScanPolicy {
    /// Data further ahead of a reader than this is not held for it.
    pub window_bytes: u64,
    /// The share of the lead's rate a paced reader ahead of it reads at.
    pub ahead_share: f64,
    /// How long a reader may be slowed in one scan (0: never paced).
    pub max_slowed_ms: i64,
}

impl Default for ScanPolicy {
    fn default() -> ScanPolicy {
        ScanPolicy {
            window_bytes: 64 << 20,
            ahead_share: 0.1,
            max_slowed_ms: 120_000,
        }
    }
}

/// The scan buffer's byte limit and counters, shared by every partition's
/// scan, and the policy the scans follow.
#[derive(Debug)]
pub struct ScanPool {
    policy: ScanPolicy,
    limit_bytes: u64,
    held_bytes: AtomicU64,
    /// Fetches answered by held data or by a read already in flight.
    hits: AtomicU64,
    /// Bytes those fetches got, and the part of them another reader's
    /// fetch had read.
    served_bytes: AtomicU64,
    shared_bytes: AtomicU64,
    /// Reads whose data was held, and those refused for want of room.
    kept: AtomicU64,
    refused: AtomicU64,
    /// Fetches answered without data while their reader was paced.
    paced: AtomicU64,
}

/// A snapshot of the scan buffer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanStats {
    pub limit_bytes: u64,
    pub held_bytes: u64,
    pub hits: u64,
    pub served_bytes: u64,
    pub shared_bytes: u64,
    pub kept: u64,
    pub refused: u64,
    pub paced: u64,
}

impl ScanPool {
    pub fn new(limit_bytes: u64) -> ScanPool {
        ScanPool {
            policy: ScanPolicy::default(),
            limit_bytes,
            held_bytes: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            served_bytes: AtomicU64::new(0),
            shared_bytes: AtomicU64::new(0),
            kept: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            paced: AtomicU64::new(0),
        }
    }

    pub fn with_policy(mut self, policy: ScanPolicy) -> ScanPool {
        self.policy = policy;
        self
    }

    pub fn policy(&self) -> ScanPolicy {
        self.policy
    }

    /// Reserves room for `bytes`; false (and counted) when the buffer is
    /// full.
    pub fn reserve(&self, bytes: u64) -> bool {
        let ok = self
            .held_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held + bytes <= self.limit_bytes).then_some(held + bytes)
            })
            .is_ok();
        let counter = if ok { &self.kept } else { &self.refused };
        counter.fetch_add(1, Ordering::Relaxed);
        ok
    }

    pub fn release(&self, bytes: u64) {
        self.held_bytes.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Counts a fetch answered without a read of its own: `bytes` in all,
    /// `shared` of them read by another reader's fetch.
    pub fn note_hit(&self, bytes: u64, shared: u64) {
        self.hits.fetch_add(1, Ordering::Relaxed);
        self.served_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.shared_bytes.fetch_add(shared, Ordering::Relaxed);
    }

    /// Counts a fetch answered without data: its reader is paced.
    pub fn note_paced(&self) {
        self.paced.fetch_add(1, Ordering::Relaxed);
    }

    pub fn held_bytes(&self) -> u64 {
        self.held_bytes.load(Ordering::Acquire)
    }

    pub fn limit_bytes(&self) -> u64 {
        self.limit_bytes
    }

    pub fn stats(&self) -> ScanStats {
        ScanStats {
            limit_bytes: self.limit_bytes,
            held_bytes: self.held_bytes(),
            hits: self.hits.load(Ordering::Relaxed),
            served_bytes: self.served_bytes.load(Ordering::Relaxed),
            shared_bytes: self.shared_bytes.load(Ordering::Relaxed),
            kept: self.kept.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            paced: self.paced.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buffer_is_bounded_and_counts_refusals() {
        let pool = ScanPool::new(100);
        assert!(pool.reserve(90));
        assert!(!pool.reserve(11));
        assert!(pool.reserve(10));
        pool.release(100);
        pool.note_hit(40, 30);
        let s = pool.stats();
        assert_eq!(
            (
                s.held_bytes,
                s.kept,
                s.refused,
                s.hits,
                s.served_bytes,
                s.shared_bytes
            ),
            (0, 2, 1, 1, 40, 30)
        );
    }
}
