//! The scan buffer: broker-owned memory where data read below the tail
//! cache is held for the readers close behind the one whose fetch read it
//! (see `keel_data::scan`), under one byte limit for all partitions. It is
//! neither the page cache (cold reads bypass it) nor the tail cache (which
//! holds only appended batches).

use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of the scan buffer at most, unless the memory limit makes it
/// smaller ([`crate::memory::MemoryLimit::scan_buffer_bytes`]).
pub const SCAN_BUFFER_BYTES: u64 = 256 << 20;

/// The scan buffer's byte limit and counters, shared by every partition's
/// scan.
#[derive(Debug)]
pub struct ScanPool {
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
}

impl ScanPool {
    pub fn new(limit_bytes: u64) -> ScanPool {
        ScanPool {
            limit_bytes,
            held_bytes: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            served_bytes: AtomicU64::new(0),
            shared_bytes: AtomicU64::new(0),
            kept: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
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
