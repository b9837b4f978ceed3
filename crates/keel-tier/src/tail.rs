//! The tail cache: the newest record batches of every partition, in broker
//! memory, under one broker-wide byte budget.
//!
//! * Only appends insert. Reads never do, so a consumer reading history
//!   cannot push the tail out (the "catch-up tax" this cache exists to end).
//! * Eviction is by append age across all partitions: the batch appended
//!   longest ago goes first, whatever was read recently.
//! * Each partition's cached batches are a contiguous run of offsets that
//!   ends at what was last appended, so a read at an offset at or after the
//!   first cached batch is answered entirely from memory.
//!
//! Locking: the partitions' runs are split over [`SHARDS`] read-write
//! locks by partition, so a read takes only its partition's shard's read
//! lock and never waits for appends or evictions elsewhere, nor for other
//! readers. The append order (what eviction
//! follows) has a mutex of its own, taken by inserts and evictions only,
//! always before a shard's. Every lock is held only for in-memory work
//! (never across I/O). Batches are `Bytes`, so a read of one batch copies
//! nothing.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use parking_lot::{Mutex, RwLock};

/// One cached batch: its offsets and its bytes as written to the log.
#[derive(Debug, Clone)]
struct CachedBatch {
    base_offset: i64,
    last_offset: i64,
    bytes: Bytes,
}

/// How many mutexes the partitions' runs are split over.
pub const SHARDS: usize = 16;

/// The cached runs of the partitions whose id falls in one shard.
#[derive(Debug, Default)]
struct Shard {
    partitions: HashMap<u64, VecDeque<CachedBatch>>,
}

/// A shard's mutex on a cache line of its own, so a reader of one shard
/// does not share a line with a writer of the next.
#[derive(Debug, Default)]
#[repr(align(128))]
struct PaddedShard(RwLock<Shard>);

/// Every cached batch as `(partition id, base offset)`, oldest append
/// first. Entries of batches already gone (partition dropped or cleared,
/// counted in `TailCache::stale_entries`) are skipped when reached.
#[derive(Debug, Default)]
struct Order {
    entries: VecDeque<(u64, i64)>,
}

/// Counters since start-up.
#[derive(Debug, Default)]
struct Counters {
    inserted_bytes: AtomicU64,
    evicted_bytes: AtomicU64,
    evicted_batches: AtomicU64,
    hit_reads: AtomicU64,
    hit_bytes: AtomicU64,
    miss_reads: AtomicU64,
}

/// A snapshot of the cache's counters and occupancy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TailStats {
    pub budget_bytes: u64,
    pub used_bytes: u64,
    pub cached_batches: u64,
    pub inserted_bytes: u64,
    pub evicted_bytes: u64,
    pub evicted_batches: u64,
    /// Reads answered from memory, and their bytes.
    pub hit_reads: u64,
    pub hit_bytes: u64,
    /// Reads at an offset before the cached run (see `ColdStats` for
    /// what the log files then served).
    pub miss_reads: u64,
}

/// Record batches as the buffers they are held in, in offset order: a read
/// from the cache shares them (no copy); they are joined into one buffer
/// only where a response is encoded, off the request threads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chunks {
    parts: Vec<Bytes>,
    len: usize,
}

impl Chunks {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends whole batches that follow on from the last part.
    pub fn push(&mut self, part: Bytes) {
        if !part.is_empty() {
            self.len += part.len();
            self.parts.push(part);
        }
    }

    /// The whole batches below `end_offset`, sharing the buffers (no
    /// copy): what a `read_committed` fetch may return when the last
    /// stable offset is `end_offset`. A trailing partial batch goes too.
    pub fn below(self, end_offset: i64) -> Chunks {
        let mut out = Chunks::default();
        for part in self.parts {
            let mut at = 0;
            while let Ok(h) = keel_log::BatchHeader::parse(&part[at..]) {
                if h.base_offset >= end_offset || at + h.total_len() > part.len() {
                    break;
                }
                at += h.total_len();
            }
            let whole = at == part.len();
            if at > 0 {
                out.len += at;
                out.parts.push(if whole { part } else { part.slice(..at) });
            }
            if !whole {
                break;
            }
        }
        out
    }

    /// One buffer: the single part itself, else a copy of all of them.
    pub fn join(self) -> Bytes {
        match <[Bytes; 1]>::try_from(self.parts) {
            Ok([one]) => one,
            Err(parts) => {
                let mut out = BytesMut::with_capacity(self.len);
                for part in parts {
                    out.extend_from_slice(&part);
                }
                out.freeze()
            }
        }
    }
}

impl From<Bytes> for Chunks {
    fn from(bytes: Bytes) -> Chunks {
        Chunks {
            len: bytes.len(),
            parts: vec![bytes],
        }
    }
}

#[derive(Debug)]
pub struct TailCache {
    budget_bytes: AtomicU64,
    /// The bytes of every cached batch; changed under the shard holding
    /// the batch.
    used_bytes: AtomicU64,
    /// Entries in `order` whose batch is already gone.
    stale_entries: AtomicUsize,
    order: Mutex<Order>,
    shards: [PaddedShard; SHARDS],
    next_id: AtomicU64,
    counters: Counters,
}

/// One partition's place in the cache. Dropping it drops the partition's
/// batches (a deleted topic frees its memory at once).
#[derive(Debug)]
pub struct PartitionTail {
    id: u64,
    cache: Arc<TailCache>,
}

impl TailCache {
    pub fn new(budget_bytes: u64) -> Arc<TailCache> {
        Arc::new(TailCache {
            budget_bytes: AtomicU64::new(budget_bytes),
            used_bytes: AtomicU64::new(0),
            stale_entries: AtomicUsize::new(0),
            order: Mutex::new(Order::default()),
            shards: std::array::from_fn(|_| PaddedShard::default()),
            next_id: AtomicU64::new(1),
            counters: Counters::default(),
        })
    }

    fn shard(&self, id: u64) -> &RwLock<Shard> {
        &self.shards[(id % SHARDS as u64) as usize].0
    }

    /// Changes the budget; a smaller one evicts the oldest batches at once.
    pub fn set_budget(&self, budget_bytes: u64) {
        let mut order = self.order.lock();
        self.budget_bytes.store(budget_bytes, Ordering::Relaxed);
        self.evict(&mut order);
    }

    /// Registers a partition. Its run starts empty: data written before
    /// start-up is on disk only.
    pub fn partition(self: &Arc<Self>) -> PartitionTail {
        PartitionTail {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            cache: Arc::clone(self),
        }
    }

    pub fn stats(&self) -> TailStats {
        let cached_batches: usize = self
            .shards
            .iter()
            .map(|shard| {
                shard
                    .0
                    .read()
                    .partitions
                    .values()
                    .map(VecDeque::len)
                    .sum::<usize>()
            })
            .sum();
        let c = &self.counters;
        TailStats {
            budget_bytes: self.budget_bytes.load(Ordering::Relaxed),
            used_bytes: self.used_bytes.load(Ordering::Relaxed),
            cached_batches: cached_batches as u64,
            inserted_bytes: c.inserted_bytes.load(Ordering::Relaxed),
            evicted_bytes: c.evicted_bytes.load(Ordering::Relaxed),
            evicted_batches: c.evicted_batches.load(Ordering::Relaxed),
            hit_reads: c.hit_reads.load(Ordering::Relaxed),
            hit_bytes: c.hit_bytes.load(Ordering::Relaxed),
            miss_reads: c.miss_reads.load(Ordering::Relaxed),
        }
    }

    fn insert(&self, id: u64, batches: impl IntoIterator<Item = (i64, i64, Bytes)>) {
        // The order first, then the shard: the entries and the run change
        // together, so eviction finds each entry's batch where it expects.
        let mut order = self.order.lock();
        let mut added = 0u64;
        {
            let mut shard = self.shard(id).write();
            let run = shard.partitions.entry(id).or_default();
            for (base_offset, last_offset, bytes) in batches {
                assert!(last_offset >= base_offset, "batch offsets out of order");
                if run.back().is_some_and(|b| b.last_offset + 1 != base_offset) {
                    // Not contiguous with what is cached (the log was
                    // truncated or reset): the old run can no longer answer
                    // reads.
                    self.stale_entries.fetch_add(run.len(), Ordering::Relaxed);
                    let dropped: u64 = run.drain(..).map(|b| b.bytes.len() as u64).sum();
                    self.used_bytes.fetch_sub(dropped, Ordering::Relaxed);
                }
                added += bytes.len() as u64;
                order.entries.push_back((id, base_offset));
                run.push_back(CachedBatch {
                    base_offset,
                    last_offset,
                    bytes,
                });
            }
            self.used_bytes.fetch_add(added, Ordering::Relaxed);
        }
        self.counters.inserted_bytes.fetch_add(added, Ordering::Relaxed);
        self.evict(&mut order);
    }

    /// Drops the oldest batches until the budget holds. The caller holds
    /// the order; each batch's shard is locked in turn.
    fn evict(&self, order: &mut Order) {
        let (mut bytes, mut batches) = (0u64, 0u64);
        let budget = self.budget_bytes.load(Ordering::Relaxed);
        while self.used_bytes.load(Ordering::Relaxed) > budget {
            let Some((id, base)) = order.entries.pop_front() else {
                break;
            };
            let mut shard = self.shard(id).write();
            match shard.partitions.get_mut(&id) {
                Some(run) if run.front().is_some_and(|b| b.base_offset == base) => {
                    let batch = run.pop_front().expect("front checked");
                    let len = batch.bytes.len() as u64;
                    self.used_bytes.fetch_sub(len, Ordering::Relaxed);
                    bytes += len;
                    batches += 1;
                }
                _ => {
                    let _ = self
                        .stale_entries
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                            Some(n.saturating_sub(1))
                        });
                }
            }
        }
        self.counters.evicted_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.counters
            .evicted_batches
            .fetch_add(batches, Ordering::Relaxed);
    }

    fn read(&self, id: u64, offset: i64, end_offset: i64, max_bytes: usize) -> Option<Chunks> {
        let shard = self.shard(id).read();
        let run = shard.partitions.get(&id);
        let hit = run.filter(|r| r.front().is_some_and(|b| b.base_offset <= offset) && offset < end_offset);
        let mut picked = hit.map(|run| run.range(run.partition_point(|b| b.last_offset < offset)..));
        let Some(head) = picked.as_mut().and_then(Iterator::next) else {
            drop(shard);
            self.counters.miss_reads.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let picked = picked.expect("head came from it");
        let mut total = head.bytes.len();
        let mut more = Vec::new();
        for b in picked {
            if b.base_offset >= end_offset || total + b.bytes.len() > max_bytes {
                break;
            }
            total += b.bytes.len();
            more.push(b.bytes.clone());
        }
        more.insert(0, head.bytes.clone());
        drop(shard);
        self.counters.hit_reads.fetch_add(1, Ordering::Relaxed);
        self.counters.hit_bytes.fetch_add(total as u64, Ordering::Relaxed);
        Some(Chunks {
            parts: more,
            len: total,
        })
    }

    fn remove_below(&self, id: u64, offset: i64) {
        let mut shard = self.shard(id).write();
        let Some(run) = shard.partitions.get_mut(&id) else {
            return;
        };
        let (mut bytes, mut batches) = (0u64, 0usize);
        while run.front().is_some_and(|b| b.last_offset < offset) {
            if let Some(b) = run.pop_front() {
                bytes += b.bytes.len() as u64;
                batches += 1;
            }
        }
        self.used_bytes.fetch_sub(bytes, Ordering::Relaxed);
        self.stale_entries.fetch_add(batches, Ordering::Relaxed);
    }

    fn remove(&self, id: u64) {
        let mut order = self.order.lock();
        if let Some(run) = self.shard(id).write().partitions.remove(&id) {
            self.stale_entries.fetch_add(run.len(), Ordering::Relaxed);
            let bytes: u64 = run.iter().map(|b| b.bytes.len() as u64).sum();
            self.used_bytes.fetch_sub(bytes, Ordering::Relaxed);
        }
        // Keep `order` from filling up with entries of dropped partitions
        // while nothing is being evicted.
        let stale = self.stale_entries.load(Ordering::Relaxed);
        if stale > 1024 && stale * 2 > order.entries.len() {
            order.entries.retain(|(id, base)| {
                self.shard(*id)
                    .read()
                    .partitions
                    .get(id)
                    .is_some_and(|run| run.binary_search_by_key(base, |b| b.base_offset).is_ok())
            });
            self.stale_entries.store(0, Ordering::Relaxed);
        }
    }
}

impl PartitionTail {
    /// Caches batches just appended to the log, in log order:
    /// `(base offset, last offset, bytes)`.
    pub fn insert(&self, batches: impl IntoIterator<Item = (i64, i64, Bytes)>) {
        self.cache.insert(self.id, batches);
    }

    /// Whole batches from the one holding `offset`, up to `max_bytes` but
    /// at least one (KIP-74), none starting at or after `end_offset` (the
    /// high watermark: batches are cached just before it moves), if
    /// `offset` lies in the cached run. `None`: read the log.
    pub fn read(&self, offset: i64, end_offset: i64, max_bytes: usize) -> Option<Chunks> {
        self.cache.read(self.id, offset, end_offset, max_bytes)
    }

    /// Forgets every cached batch of this partition (its log was reloaded
    /// and may no longer hold them).
    pub fn clear(&self) {
        self.cache.remove(self.id);
    }

    /// Forgets the cached batches below `offset` (the cleaner rewrote them).
    pub fn forget_below(&self, offset: i64) {
        self.cache.remove_below(self.id, offset);
    }

    /// The first offset of the cached run, if anything is cached.
    pub fn first_offset(&self) -> Option<i64> {
        let shard = self.cache.shard(self.id).read();
        shard.partitions.get(&self.id)?.front().map(|b| b.base_offset)
    }
}

impl Drop for PartitionTail {
    fn drop(&mut self) {
        self.cache.remove(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    fn batch(base: i64, count: i64, len: usize) -> (i64, i64, Bytes) {
        let mut v = vec![0u8; len];
        v[..8].copy_from_slice(&base.to_be_bytes());
        (base, base + count - 1, Bytes::from(v))
    }

    fn base_of(bytes: &[u8]) -> i64 {
        i64::from_be_bytes(bytes[..8].try_into().unwrap())
    }

    /// A real batch of `count` records at `base`.
    fn real_batch(base: i64, count: usize) -> Bytes {
        let mut b = keel_log::testing::BatchBuilder::new(0).base_offset(base);
        for _ in 0..count {
            b = b.record(None, Some(b"v"));
        }
        Bytes::from(b.build())
    }

    #[test]
    fn below_cuts_whole_batches_without_copying() {
        let (a, b, c) = (real_batch(0, 2), real_batch(2, 2), real_batch(4, 2));
        let joined: Vec<u8> = [&b[..], &c[..]].concat();
        let chunks = Chunks {
            len: a.len() + joined.len(),
            parts: vec![a.clone(), Bytes::from(joined)],
        };
        assert_eq!(chunks.clone().below(100), chunks, "nothing to cut");
        let cut = chunks.clone().below(4);
        assert_eq!(cut.len(), a.len() + b.len());
        assert_eq!(cut.parts[0].as_ptr(), a.as_ptr(), "shared, not copied");
        assert_eq!(cut.join(), Bytes::from([&a[..], &b[..]].concat()));
        assert_eq!(chunks.clone().below(2).join(), a, "the later part goes whole");
        assert!(chunks.below(0).is_empty());
        let torn = Chunks::from(a.slice(..a.len() - 1));
        assert!(torn.below(100).is_empty(), "a partial batch is cut");
    }

    #[test]
    fn reads_start_at_the_batch_holding_the_offset() {
        let cache = TailCache::new(1 << 20);
        let p = cache.partition();
        p.insert([batch(10, 5, 100), batch(15, 5, 100), batch(20, 5, 100)]);
        assert!(p.read(9, i64::MAX, 1000).is_none(), "before the cached run");
        let got = p.read(17, i64::MAX, 1000).unwrap();
        assert_eq!(got.len(), 200);
        let joined = got.join();
        assert_eq!(
            (joined.len(), base_of(&joined), base_of(&joined[100..])),
            (200, 15, 20)
        );
        // max_bytes limits whole batches, but one is always returned.
        assert_eq!(p.read(10, i64::MAX, 150).unwrap().len(), 100);
        assert_eq!(p.read(10, i64::MAX, 1).unwrap().len(), 100);
        assert!(p.read(25, i64::MAX, 1000).is_none(), "past the end");
        // Nothing at or past the end offset (the high watermark).
        assert_eq!(p.read(10, 20, 1000).unwrap().len(), 200);
        assert!(p.read(20, 20, 1000).is_none());
        let s = cache.stats();
        assert_eq!((s.hit_reads, s.miss_reads), (4, 3));
    }

    #[test]
    fn eviction_is_by_append_age_across_partitions() {
        let cache = TailCache::new(300);
        let (a, b) = (cache.partition(), cache.partition());
        a.insert([batch(0, 1, 100)]);
        b.insert([batch(0, 1, 100)]);
        a.insert([batch(1, 1, 100)]);
        // Reading a's oldest batch does not protect it.
        assert!(a.read(0, i64::MAX, 100).is_some());
        b.insert([batch(1, 1, 100)]);
        assert!(
            a.read(0, i64::MAX, 100).is_none(),
            "a's first batch was the oldest"
        );
        assert!(b.read(0, i64::MAX, 100).is_some());
        a.insert([batch(2, 1, 100)]);
        assert!(b.read(0, i64::MAX, 100).is_none());
        let s = cache.stats();
        assert_eq!((s.used_bytes, s.evicted_batches), (300, 2));
    }

    #[test]
    fn a_smaller_budget_evicts_the_oldest_at_once() {
        let cache = TailCache::new(1000);
        let (a, b) = (cache.partition(), cache.partition());
        a.insert([batch(0, 1, 100)]);
        b.insert([batch(0, 1, 100)]);
        a.insert([batch(1, 1, 100)]);
        cache.set_budget(150);
        let s = cache.stats();
        assert_eq!((s.budget_bytes, s.used_bytes, s.evicted_batches), (150, 100, 2));
        assert!(a.read(0, i64::MAX, 1000).is_none(), "a's oldest went first");
        assert!(a.read(1, i64::MAX, 1000).is_some());
        assert!(b.read(0, i64::MAX, 1000).is_none());
        // A larger one evicts nothing and lets the cache fill again.
        cache.set_budget(1000);
        b.insert([batch(1, 1, 400)]);
        assert_eq!(cache.stats().used_bytes, 500);
    }

    #[test]
    fn dropping_a_partition_frees_its_bytes() {
        let cache = TailCache::new(1000);
        let a = cache.partition();
        a.insert([batch(0, 1, 400)]);
        drop(a);
        assert_eq!(cache.stats().used_bytes, 0);
        let b = cache.partition();
        b.insert([batch(0, 1, 900)]);
        assert!(
            b.read(0, i64::MAX, 1000).is_some(),
            "the dropped partition's stale entry is skipped"
        );
    }

    #[test]
    fn a_gap_in_offsets_restarts_the_run() {
        let cache = TailCache::new(1000);
        let p = cache.partition();
        p.insert([batch(0, 10, 100)]);
        p.insert([batch(50, 10, 100)]);
        assert!(p.read(5, i64::MAX, 1000).is_none());
        assert_eq!(base_of(&p.read(50, i64::MAX, 1000).unwrap().join()), 50);
        assert_eq!(cache.stats().used_bytes, 100);
    }

    /// Random appends across partitions against a model: the budget always
    /// holds, each partition's run is the suffix of its log that fits in
    /// append order, and every read returns the right batches.
    #[test]
    fn random_appends_match_a_model() {
        let seed = std::env::var("KEEL_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            });
        println!("KEEL_TEST_SEED={seed}");
        let mut rng = SmallRng::seed_from_u64(seed);
        let budget = 5_000u64;
        let cache = TailCache::new(budget);
        let parts: Vec<PartitionTail> = (0..4).map(|_| cache.partition()).collect();
        let mut next = [0i64; 4];
        // Model: every batch ever appended, in append order.
        let mut appended: Vec<(usize, i64, i64, usize)> = Vec::new();
        for _ in 0..2_000 {
            let p = rng.gen_range(0..4);
            let count = rng.gen_range(1..5);
            let len = rng.gen_range(8..400);
            parts[p].insert([batch(next[p], count, len)]);
            appended.push((p, next[p], next[p] + count - 1, len));
            next[p] += count;
            // The model's cache: the newest batches (any partition) whose
            // total fits the budget.
            let mut used = 0usize;
            let mut kept = Vec::new();
            for &(bp, base, last, blen) in appended.iter().rev() {
                if used + blen > budget as usize {
                    break;
                }
                used += blen;
                kept.push((bp, base, last));
            }
            assert_eq!(cache.stats().used_bytes, used as u64, "seed {seed}");
            let q = rng.gen_range(0..4);
            if next[q] == 0 {
                continue;
            }
            let offset = rng.gen_range(0..next[q]);
            let expected = kept
                .iter()
                .find(|(bp, base, last)| *bp == q && *base <= offset && offset <= *last);
            let oldest_kept = kept
                .iter()
                .filter(|(bp, ..)| *bp == q)
                .map(|(_, base, _)| *base)
                .min();
            match (parts[q].read(offset, i64::MAX, 1), expected) {
                (Some(bytes), Some((_, base, _))) => assert_eq!(base_of(&bytes.join()), *base, "seed {seed}"),
                (None, None) => assert!(oldest_kept.is_none_or(|o| offset < o), "seed {seed}"),
                (got, want) => panic!("seed {seed}: read {offset} of {q}: got {got:?}, model {want:?}"),
            }
        }
    }
}
