//! Shared cold scans: one partition's reads below the tail cache, as a
//! state machine without clock, channels or I/O ([`ScanCore`]); the
//! partition runs the reads it orders and hands back what they returned.
//!
//! Every reader that fetches below the tail cache is known by its position.
//! A read's data is held in the scan buffer ([`ScanPool`]) while a reader
//! still needs it: one at or behind it, within `window_bytes`, seen within
//! `reader_idle_ms`. A fetch is then answered, in order of preference:
//! 1. from held data, whole batches from the one holding its offset, on
//!    through held data that follows on, within its `max_bytes`;
//! 2. by a read already in flight from its very offset (it waits);
//! 3. by a read of its own.
//!
//! After a fetch is answered, the chunk after what it got is read ahead
//! (unless held or in flight already, or the reader is paced), so a scan
//! keeps the device busy between its fetches, and readers riding the same
//! stretch of the log share one read of each chunk. Data is never held for nobody: what no
//! reader needs any more is dropped at once.
//!
//! # Readers at different offsets: the convoy
//!
//! Readers far apart share nothing by themselves: each reads its own
//! stretch, and four readers at 0, 25, 50 and 75 % of a history read 2.5
//! histories between them. A consumer needs its records in order, so a
//! reader cannot be handed what lies further on; sharing must come from
//! readers converging. So when cold reads contend (two scans' reads on
//! the disk at once, or reads waiting for the executor or its budget:
//! `ColdReads::contended`), the reader furthest behind (the lead) gets the
//! disk, and a reader ahead of it, out of its window, has its reads paced
//! to `ahead_share` of the lead's rate until the lead reaches it; from then
//! on they ride one read of each chunk (the one ahead reads, the one behind
//! is served from the buffer). With readers at 0/25/50/75 % and the disk's
//! rate B, the lead moves at about B/(1+3w) and the others at w times
//! that, so the disk reads about (1 + 1.5 w/(1-w)) histories (1.17 at
//! w = 0.1) instead of 2.5, and all four finish at about one history's
//! time instead of 2.5: no reader finishes later than with fair shares,
//! since the last one cannot finish before the lead has read everything.
//! Bounds:
//! * a reader is paced only while the lead is expected to reach it within
//!   what is left of `max_slowed_ms` (at the rate it closes in, `(1-w)`
//!   of the lead's; until the lead's rate is first measured, a rate
//!   sample, it waits), and is never paced again in its scan once it has
//!   been slowed that long: a lead that slows down or stalls holds nobody
//!   beyond that bound (a paced fetch's long poll may add one
//!   `fetch.max.wait.ms`);
//! * a reader within a window of the tail is never paced: it is a live
//!   reader even when the tail cache does not hold its offsets;
//! * a lead not seen for `STALLED_MS` paces nobody, and pacing starts
//!   only while cold reads contend (it goes on after they stop, as the
//!   paced readers' lower demand is what stops it);
//! * only reads of the disk are paced: data held or in flight is served
//!   at once, and the tail cache's readers never come here.
//!
//! Pacing from the lead's rate rather than pausing the readers ahead
//! (w = 0) keeps them moving whatever the lead does; sharing only
//! identical reads in flight (as a read cache does) shares nothing between
//! readers at different offsets; and shortest-remaining-first still reads
//! 2.5 histories.
//!
//! What the log changes under a scan is told here: retention
//! ([`ScanCore::forget_below`]: held data wholly below the new log start
//! goes, and none below it is held again), the cleaner's rewrite of the
//! segments below an offset ([`ScanCore::invalidate_below`]), and a
//! truncation or a reopened log ([`ScanCore::clear`]). Held data they
//! touch is dropped. A read in flight across a rewrite or a truncation
//! still answers the fetches that waited for it (as the plain read each
//! would have made already), but its data is not held and no later fetch
//! waits for it.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::Arc;

use bytes::Bytes;
use keel_log::batch::BatchHeader;
use keel_tier::scan::{ScanPolicy, ScanPool};
use keel_tier::Chunks;

/// How a scan decides what to hold.
#[derive(Debug, Clone, Copy)]
pub struct ScanSettings {
    /// A reader not seen for this long needs nothing any more.
    pub reader_idle_ms: i64,
    /// Data further ahead of a reader than this is not held for it.
    pub window_bytes: u64,
    /// Readers tracked at most; the one seen least recently gives way.
    pub max_readers: usize,
    /// The share of the lead's rate a paced reader ahead of it reads at.
    pub ahead_share: f64,
    /// How long a reader may be slowed in one scan at most (0: readers
    /// are never paced).
    pub max_slowed_ms: i64,
}

impl Default for ScanSettings {
    fn default() -> ScanSettings {
        ScanSettings::of(ScanPolicy::default())
    }
}

impl ScanSettings {
    /// The settings of a broker's policy (the `keel.scan.*` configs).
    pub fn of(policy: ScanPolicy) -> ScanSettings {
        ScanSettings {
            reader_idle_ms: 10_000,
            window_bytes: policy.window_bytes,
            max_readers: crate::readers::MAX_READERS,
            ahead_share: policy.ahead_share,
            max_slowed_ms: policy.max_slowed_ms,
        }
    }
}

/// A read the scan asks for.
pub type ReadId = u64;

/// A read of whole batches from `offset`, about `max_bytes` of them, that
/// the partition is to run and hand back to [`ScanCore::complete`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadOrder {
    pub id: ReadId,
    pub offset: i64,
    pub max_bytes: usize,
}

/// Where a fetch waits for a read's data.
pub trait Waiter {
    /// Whether the fetch still waits (it may have been answered without
    /// the data at its deadline).
    fn is_waiting(&self) -> bool;
}

/// Held data smaller than this is copied out of its read's buffer.
const COPY_BELOW: usize = 256 << 10;

/// A lead not seen for this long is stalled: it paces nobody.
pub const STALLED_MS: i64 = 2_000;

/// A reader's rate is sampled over at least this long.
const RATE_SAMPLE_MS: i64 = 200;

/// Whether a reader is paced behind a lead.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Pace {
    Free,
    /// Until the lead's rate is known.
    Measuring,
    /// At a share of the lead's rate (offsets per ms).
    Paced(f64),
}

/// A fetch, as the scan sees it.
#[derive(Debug, Clone, Copy)]
pub struct FetchAt {
    pub offset: i64,
    pub max_bytes: usize,
    pub now_ms: i64,
    /// Read-ahead stops below this (the tail cache's first offset or the
    /// high watermark).
    pub ahead_limit: i64,
    /// Cold reads contend now (`keel_tier::ColdReads::contended`).
    pub contended: bool,
}

/// How a fetch is answered.
#[derive(Debug)]
pub enum Step {
    /// Held data, now; `ahead` is the read-ahead to run.
    Serve { data: Chunks, ahead: Option<ReadOrder> },
    /// A read in flight will deliver to the fetch's waiter.
    Wait,
    /// The fetch's own read, which delivers to its waiter too.
    Read(ReadOrder),
    /// Paced: nothing now (the reader is ahead of a lead that will reach
    /// it); the fetch is answered without data from here.
    Defer,
}

impl Step {
    pub fn name(&self) -> &'static str {
        match self {
            Step::Serve { .. } => "serve",
            Step::Wait => "wait",
            Step::Read(_) => "read",
            Step::Defer => "defer",
        }
    }
}

/// What a completed read gives: each waiter's data (`None`: the read
/// failed), and the read-ahead to run next.
#[derive(Debug)]
pub struct Completed<W> {
    pub deliveries: Vec<(W, Option<Bytes>)>,
    pub ahead: Option<ReadOrder>,
    /// The data reached a paced reader's offset: its long poll should end
    /// now, so it rides on with the reader that read it.
    pub wake: bool,
}

/// Held data: whole batches read at `first`, up to `next`.
#[derive(Debug)]
struct Chunk<K> {
    first: i64,
    next: i64,
    bytes: Bytes,
    /// Per batch: its last offset and where it ends in `bytes`.
    ends: Vec<(i64, usize)>,
    /// The reader whose fetch read it.
    read_by: K,
}

impl<K> Chunk<K> {
    /// The index of the batch holding `offset` (or the first after it).
    fn batch_at(&self, offset: i64) -> usize {
        self.ends.partition_point(|(last, _)| *last < offset)
    }

    fn start_of(&self, batch: usize) -> usize {
        if batch == 0 {
            0
        } else {
            self.ends[batch - 1].1
        }
    }
}

#[derive(Debug)]
struct InFlight<K, W> {
    offset: i64,
    max_bytes: usize,
    /// The log changed under it: its data answers its waiters only.
    stale: bool,
    /// A read-ahead (no fetch asked for it yet).
    ahead: bool,
    read_by: K,
    /// Each waiting fetch: where it goes, whose it is, its `max_bytes`.
    waiters: Vec<(W, K, usize)>,
}

#[derive(Debug, Clone, Copy)]
struct Position {
    offset: i64,
    seen_ms: i64,
    /// Progress, offsets per ms (none until a first sample), and the
    /// sample it is measured from.
    rate: Option<f64>,
    sample: (i64, i64),
    /// Paced at its last fetch; its last fetch got nothing for it; slowed
    /// this long in this scan so far; no longer paced in this scan; next
    /// allowed a read of the disk at.
    paced: bool,
    deferred: bool,
    slowed_ms: i64,
    released: bool,
    paced_until: i64,
}

impl Position {
    fn new(offset: i64, now_ms: i64) -> Position {
        Position {
            offset,
            seen_ms: now_ms,
            rate: None,
            sample: (offset, now_ms),
            paced: false,
            deferred: false,
            slowed_ms: 0,
            released: false,
            paced_until: 0,
        }
    }

    /// A fetch at `offset`: its rate, and the time it was slowed since its
    /// last fetch. Going back starts a new scan.
    fn moved(&mut self, offset: i64, now_ms: i64) {
        if offset < self.offset {
            *self = Position::new(offset, now_ms);
            return;
        }
        self.deferred = false;
        if self.paced {
            self.slowed_ms += now_ms - self.seen_ms;
        }
        let (from, at) = self.sample;
        if now_ms - at >= RATE_SAMPLE_MS {
            let rate = (offset - from) as f64 / (now_ms - at) as f64;
            self.rate = Some(self.rate.map_or(rate, |r| (r + rate) / 2.0));
            self.sample = (offset, now_ms);
        }
        self.offset = offset;
        self.seen_ms = now_ms;
    }
}

/// One partition's shared scan. `K` names readers, `W` is where a fetch
/// waits for a read.
#[derive(Debug)]
pub struct ScanCore<K, W> {
    settings: ScanSettings,
    pool: Arc<ScanPool>,
    /// By the offset each was read at.
    chunks: BTreeMap<i64, Chunk<K>>,
    reads: HashMap<ReadId, InFlight<K, W>>,
    readers: HashMap<K, Position>,
    next_id: ReadId,
    held_bytes: u64,
    /// The log start retention last set: nothing below it is held.
    log_start: i64,
    /// Bytes per offset of what was read (to turn offsets into bytes).
    bytes_per_offset: f64,
    /// Fetches paced, for `/stats`.
    deferred: u64,
}

/// What `/stats` shows of one partition's scan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanSummary {
    pub held_bytes: u64,
    pub chunks: usize,
    pub reads_in_flight: usize,
    pub readers: usize,
    /// Readers paced now, and fetches paced so far.
    pub paced: usize,
    pub deferred: u64,
}

impl<K: Clone + Eq + Hash, W: Waiter> ScanCore<K, W> {
    pub fn new(settings: ScanSettings, pool: Arc<ScanPool>) -> ScanCore<K, W> {
        ScanCore {
            settings,
            pool,
            chunks: BTreeMap::new(),
            reads: HashMap::new(),
            readers: HashMap::new(),
            next_id: 1,
            held_bytes: 0,
            log_start: 0,
            bytes_per_offset: 0.0,
            deferred: 0,
        }
    }

    /// `reader`'s fetch (within the log, below the tail cache). `waiter`
    /// gets the data of a [`Step::Wait`] or [`Step::Read`].
    pub fn fetch(&mut self, reader: &K, at: FetchAt, waiter: W) -> Step {
        let FetchAt {
            offset,
            max_bytes,
            now_ms,
            ahead_limit,
            contended,
        } = at;
        self.note(reader, offset, now_ms);
        self.evict(now_ms);
        let pace = self.assess(reader, offset, now_ms, contended, ahead_limit);
        if let Some((data, shared, end)) = self.serve(reader, offset, max_bytes) {
            self.pool.note_hit(data.len() as u64, shared);
            let ahead = match pace {
                Pace::Free => self.order_ahead(end, max_bytes, ahead_limit, reader),
                Pace::Measuring | Pace::Paced(_) => None,
            };
            return Step::Serve { data, ahead };
        }
        if let Some(read) = self.reads.values_mut().find(|r| !r.stale && r.offset == offset) {
            read.waiters.push((waiter, reader.clone(), max_bytes));
            return Step::Wait;
        }
        let chunk = max_bytes as f64 / self.bytes_per_offset.max(1.0);
        let share = self.settings.ahead_share;
        let defer = match (pace, self.readers.get_mut(reader)) {
            (Pace::Free, _) | (_, None) => false,
            // Until the lead's rate is known (at most a rate sample).
            (Pace::Measuring, _) => true,
            (Pace::Paced(_), Some(me)) if now_ms < me.paced_until => true,
            // One read of the disk per chunk's time at its share of the
            // lead's rate.
            (Pace::Paced(rate), Some(me)) => {
                let left = self.settings.max_slowed_ms.saturating_sub(me.slowed_ms).max(0);
                let wait = (chunk / (share * rate)).min(left as f64) as i64;
                me.paced_until = now_ms.saturating_add(wait);
                false
            }
        };
        if let Some(me) = self.readers.get_mut(reader) {
            me.deferred = defer;
        }
        if defer {
            self.deferred += 1;
            self.pool.note_paced();
            return Step::Defer;
        }
        let order = self.issue(offset, max_bytes, reader, false);
        if let Some(read) = self.reads.get_mut(&order.id) {
            read.waiters.push((waiter, reader.clone(), max_bytes));
        }
        Step::Read(order)
    }

    /// Whether `reader`, at `offset`, is to be paced (see the convoy
    /// above). Notes it (a paced reader's reads are not read ahead), and
    /// releases a reader slowed for the bound.
    fn assess(&mut self, reader: &K, offset: i64, now_ms: i64, contended: bool, tail: i64) -> Pace {
        let (w, max_slowed) = (self.settings.ahead_share, self.settings.max_slowed_ms);
        let window = self.settings.window_bytes as f64 / self.bytes_per_offset.max(1.0);
        // A reader within a window of the tail is a live one whatever
        // serves it (the tail cache may not hold its offsets, after a
        // restart or with a small cache): never paced.
        let near_tail = (tail - offset) as f64 <= window;
        let lead = self
            .readers
            .iter()
            .filter(|(k, p)| *k != reader && p.offset < offset && now_ms - p.seen_ms <= STALLED_MS)
            .map(|(_, p)| *p)
            .min_by_key(|p| p.offset);
        let Some(me) = self.readers.get_mut(reader) else {
            return Pace::Free;
        };
        if me.slowed_ms >= max_slowed {
            me.released = true;
        }
        let pace = lead.map_or(Pace::Free, |lead| {
            let to_close = (offset - lead.offset) as f64 - window;
            // Contention starts the pacing; it goes on once the readers
            // ahead read less (and the disk no longer contends) until the
            // lead reaches them or the bound.
            let candidate = max_slowed > 0
                && w > 0.0
                && w < 1.0
                && (contended || me.paced)
                && !me.released
                && !near_tail
                && to_close > 0.0;
            match lead.rate {
                _ if !candidate => Pace::Free,
                None => Pace::Measuring,
                // The lead reaches the window within what is left of the
                // bound, at the rate it closes in.
                Some(rate)
                    if rate > 0.0
                        && to_close / ((1.0 - w) * rate)
                            <= max_slowed.saturating_sub(me.slowed_ms) as f64 =>
                {
                    Pace::Paced(rate)
                }
                Some(_) => Pace::Free,
            }
        });
        me.paced = pace != Pace::Free;
        pace
    }

    fn is_paced(&self, reader: &K) -> bool {
        self.readers.get(reader).is_some_and(|p| p.paced)
    }

    /// How long `reader` was slowed in its scan so far, and whether it is
    /// paced now: for `/stats` and tests.
    pub fn slowed(&self, reader: &K) -> Option<(i64, bool)> {
        self.readers.get(reader).map(|p| (p.slowed_ms, p.paced))
    }

    /// The read `id` returned `bytes` (`None`: it failed). Its waiters get
    /// their data (cut to each one's `max_bytes`); it is held if a reader
    /// needs it, and the chunk after it is read ahead if a fetch still
    /// waited for it.
    pub fn complete(
        &mut self,
        id: ReadId,
        bytes: Option<Bytes>,
        now_ms: i64,
        ahead_limit: i64,
    ) -> Completed<W> {
        self.evict(now_ms);
        let Some(read) = self.reads.remove(&id) else {
            return Completed {
                deliveries: Vec::new(),
                ahead: None,
                wake: false,
            };
        };
        let Some(bytes) = bytes else {
            return Completed {
                deliveries: read.waiters.into_iter().map(|(w, _, _)| (w, None)).collect(),
                ahead: None,
                wake: false,
            };
        };
        let ends = batch_ends(&bytes);
        if let Some((last, end)) = ends.last() {
            let per_offset = *end as f64 / (last + 1 - read.offset).max(1) as f64;
            self.bytes_per_offset = if self.bytes_per_offset == 0.0 {
                per_offset
            } else {
                (self.bytes_per_offset * 7.0 + per_offset) / 8.0
            };
        }
        let mut deliveries = Vec::with_capacity(read.waiters.len());
        let mut waiting = false;
        for (w, who, max_bytes) in read.waiters {
            let data = if max_bytes >= read.max_bytes || ends.is_empty() {
                bytes.clone()
            } else {
                // Whole batches within the fetch's own budget, at least one.
                let fit = ends.partition_point(|(_, end)| *end <= max_bytes).max(1);
                bytes.slice(..ends[fit - 1].1)
            };
            if w.is_waiting() {
                waiting = true;
                if who != read.read_by {
                    self.pool.note_hit(data.len() as u64, data.len() as u64);
                } else if read.ahead {
                    self.pool.note_hit(data.len() as u64, 0);
                }
            }
            deliveries.push((w, Some(data)));
        }
        let (mut ahead, mut wake) = (None, false);
        if !read.stale {
            if let Some((last, _)) = ends.last() {
                let next = last + 1;
                self.keep(read.offset, next, bytes, ends, read.read_by.clone());
                wake = self
                    .readers
                    .values()
                    .any(|p| p.deferred && read.offset <= p.offset && p.offset < next);
                if waiting && !self.is_paced(&read.read_by) {
                    ahead = self.order_ahead(next, read.max_bytes, ahead_limit, &read.read_by);
                }
            }
        }
        Completed {
            deliveries,
            ahead,
            wake,
        }
    }

    /// `reader` reads from the tail cache now: it needs nothing held here.
    pub fn leave(&mut self, reader: &K) {
        if self.readers.remove(reader).is_some() {
            self.drop_unneeded();
        }
    }

    /// Forgets readers not seen within `reader_idle_ms`, and the data only
    /// they needed, and the data below `log_start` (retention).
    pub fn tick(&mut self, now_ms: i64, log_start: i64) {
        self.forget_below(log_start);
        self.evict(now_ms);
    }

    /// Retention moved the log start to `log_start`: the data wholly below
    /// it goes.
    pub fn forget_below(&mut self, log_start: i64) {
        self.log_start = self.log_start.max(log_start);
        self.drop_chunks(|c| c.next <= log_start);
    }

    /// The cleaner rewrote the log below `end`: the data read from there
    /// goes, and the reads in flight there no longer count.
    pub fn invalidate_below(&mut self, end: i64) {
        self.drop_chunks(|c| c.first < end);
        for read in self.reads.values_mut().filter(|r| r.offset < end) {
            read.stale = true;
        }
    }

    /// The log was truncated or reopened: nothing read before counts.
    pub fn clear(&mut self) {
        self.log_start = 0;
        self.drop_chunks(|_| true);
        for read in self.reads.values_mut() {
            read.stale = true;
        }
    }

    pub fn summary(&self) -> ScanSummary {
        ScanSummary {
            held_bytes: self.held_bytes,
            chunks: self.chunks.len(),
            reads_in_flight: self.reads.len(),
            readers: self.readers.len(),
            paced: self.readers.values().filter(|p| p.paced).count(),
            deferred: self.deferred,
        }
    }

    /// The held data, as (offset read at, next offset, bytes): for tests.
    pub fn held(&self) -> impl Iterator<Item = (i64, i64, &Bytes)> {
        self.chunks.values().map(|c| (c.first, c.next, &c.bytes))
    }

    fn note(&mut self, reader: &K, offset: i64, now_ms: i64) {
        if let Some(p) = self.readers.get_mut(reader) {
            p.moved(offset, now_ms);
            return;
        }
        let position = Position::new(offset, now_ms);
        if self.readers.len() >= self.settings.max_readers {
            let oldest = self
                .readers
                .iter()
                .min_by_key(|(_, p)| p.seen_ms)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                self.readers.remove(&oldest);
            }
        }
        self.readers.insert(reader.clone(), position);
    }

    fn evict(&mut self, now_ms: i64) {
        let idle = self.settings.reader_idle_ms;
        let before = self.readers.len();
        self.readers
            .retain(|_, p| now_ms.saturating_sub(p.seen_ms) <= idle);
        if self.readers.len() != before || !self.chunks.is_empty() {
            self.drop_unneeded();
        }
    }

    fn drop_unneeded(&mut self) {
        let readers: Vec<i64> = self.readers.values().map(|p| p.offset).collect();
        let window = self.settings.window_bytes;
        self.drop_chunks(|c| !needed(&readers, window, c.first, c.next, c.bytes.len()));
    }

    fn drop_chunks(&mut self, mut gone: impl FnMut(&Chunk<K>) -> bool) {
        let mut freed = 0u64;
        self.chunks.retain(|_, c| {
            let go = gone(c);
            if go {
                freed += c.bytes.len() as u64;
            }
            !go
        });
        self.held_bytes -= freed;
        self.pool.release(freed);
    }

    /// Whole batches from held data for a fetch at `offset`: the data, the
    /// part of it another reader's fetch read, and the offset after it.
    fn serve(&self, reader: &K, offset: i64, max_bytes: usize) -> Option<(Chunks, u64, i64)> {
        let (_, mut chunk) = self.chunks.range(..=offset).next_back()?;
        if offset >= chunk.next {
            return None;
        }
        let (mut data, mut shared, mut at) = (Chunks::default(), 0u64, offset);
        loop {
            let from = chunk.batch_at(at);
            let start = chunk.start_of(from);
            let mut to = from;
            while to < chunk.ends.len() {
                let first_of_all = data.is_empty() && to == from;
                if data.len() + (chunk.ends[to].1 - start) > max_bytes && !first_of_all {
                    break;
                }
                to += 1;
            }
            if to == from {
                break;
            }
            let part = chunk.bytes.slice(start..chunk.ends[to - 1].1);
            if chunk.read_by != *reader {
                shared += part.len() as u64;
            }
            data.push(part);
            at = chunk.ends[to - 1].0 + 1;
            if to < chunk.ends.len() {
                break;
            }
            match self.chunks.get(&chunk.next) {
                Some(following) => chunk = following,
                None => break,
            }
        }
        (!data.is_empty()).then_some((data, shared, at))
    }

    /// Orders the read-ahead at `offset`, unless it is at or past
    /// `ahead_limit`, held, or in flight.
    fn order_ahead(
        &mut self,
        offset: i64,
        max_bytes: usize,
        ahead_limit: i64,
        reader: &K,
    ) -> Option<ReadOrder> {
        if offset >= ahead_limit || self.covered_to(offset).is_some() {
            return None;
        }
        if self.reads.values().any(|r| !r.stale && r.offset == offset) {
            return None;
        }
        Some(self.issue(offset, max_bytes, reader, true))
    }

    /// The end of the held chunk covering `offset`, if one does.
    fn covered_to(&self, offset: i64) -> Option<i64> {
        self.chunks
            .range(..=offset)
            .next_back()
            .map(|(_, c)| c.next)
            .filter(|next| offset < *next)
    }

    fn issue(&mut self, offset: i64, max_bytes: usize, reader: &K, ahead: bool) -> ReadOrder {
        let id = self.next_id;
        self.next_id += 1;
        self.reads.insert(
            id,
            InFlight {
                offset,
                max_bytes,
                stale: false,
                ahead,
                read_by: reader.clone(),
                waiters: Vec::new(),
            },
        );
        ReadOrder {
            id,
            offset,
            max_bytes,
        }
    }

    /// Holds a read's whole batches (read at `first`, up to `next`), less
    /// what is held already, if a reader needs them and the pool has room.
    fn keep(&mut self, first: i64, next: i64, bytes: Bytes, ends: Vec<(i64, usize)>, read_by: K) {
        let read_len = bytes.len();
        let (mut first, mut bytes, mut ends) = (first, bytes, ends);
        // Held chunks covering the start: keep what follows them.
        while let Some(held_to) = self.covered_to(first) {
            if held_to >= next {
                return;
            }
            let from = ends.partition_point(|(last, _)| *last < held_to);
            let start = if from == 0 { 0 } else { ends[from - 1].1 };
            bytes = bytes.slice(start..);
            ends = ends[from..]
                .iter()
                .map(|(last, end)| (*last, end - start))
                .collect();
            first = held_to;
        }
        // A held chunk starting inside: keep what comes before it.
        if let Some((&other, _)) = self.chunks.range(first + 1..next).next() {
            let to = ends.partition_point(|(last, _)| *last < other);
            if to == 0 {
                return;
            }
            ends.truncate(to);
            bytes = bytes.slice(..ends[to - 1].1);
        }
        let Some(&(last, _)) = ends.last() else { return };
        let next = last + 1;
        if next <= self.log_start {
            return;
        }
        let readers: Vec<i64> = self.readers.values().map(|p| p.offset).collect();
        if !needed(&readers, self.settings.window_bytes, first, next, bytes.len()) {
            return;
        }
        if !self.pool.reserve(bytes.len() as u64) {
            return;
        }
        // A slice pins its whole buffer (a read's, or the aligned window
        // of an O_DIRECT read): a small or trimmed part is held as a copy,
        // so what the buffer holds is what its limit counts.
        if bytes.len() < COPY_BELOW || bytes.len() * 2 < read_len {
            bytes = Bytes::copy_from_slice(&bytes);
        }
        self.held_bytes += bytes.len() as u64;
        self.chunks.insert(
            first,
            Chunk {
                first,
                next,
                bytes,
                ends,
                read_by,
            },
        );
    }
}

impl<K, W> Drop for ScanCore<K, W> {
    fn drop(&mut self) {
        self.pool.release(self.held_bytes);
    }
}

/// Whether a reader at one of `readers` will read `[first, next)`: it is
/// below `next` and at most `window` bytes (estimated from the chunk's
/// bytes per offset) behind `first`.
fn needed(readers: &[i64], window: u64, first: i64, next: i64, len: usize) -> bool {
    let per_offset = len as f64 / (next - first).max(1) as f64;
    readers
        .iter()
        .any(|&at| at < next && ((first - at).max(0) as f64) * per_offset <= window as f64)
}

/// Per whole batch of `bytes`: its last offset and where it ends. A
/// trailing partial batch is left out.
pub fn batch_ends(bytes: &[u8]) -> Vec<(i64, usize)> {
    let mut ends = Vec::new();
    let mut at = 0;
    while let Ok(h) = BatchHeader::parse(&bytes[at..]) {
        let end = at + h.total_len();
        if end > bytes.len() || h.total_len() == 0 {
            break;
        }
        ends.push((h.last_offset(), end));
        at = end;
    }
    ends
}
