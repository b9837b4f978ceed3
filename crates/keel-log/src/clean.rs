//! Log compaction: keeps the latest record of every key in the sealed part
//! of a log, with Kafka's semantics (offsets never change, tombstones go
//! after `delete.retention.ms`, the active segment and anything newer than
//! `min.compaction.lag.ms` untouched) and Kafka's crash-safe swap
//! (`.cleaned`, then `.swap`, then the segment's own name).
//!
//! A pass builds a [`KeyMap`] of the dirty section **from its newest end**:
//! records newest first, each key's first sighting is its latest offset.
//! When the map fills up, it covers a suffix `[map_start, dirty_end)` of the
//! dirty section; every record older than `map_start` whose key is in the
//! map is superseded, so the pass reclaims space even when the map holds a
//! small part of the keys (Kafka builds its map forward from the start of
//! the dirty section, so a bulk load of unique keys fills it with keys that
//! have nothing to supersede). The next pass maps the part below
//! `map_start`, until the dirty section is done.
//!
//! The state between passes is the partition's `cleaner-checkpoint`:
//! everything below `clean_end` is clean (no record has a newer one of the
//! same key below it), and so is a suffix window `[suffix_start,
//! suffix_end)` while a backward sweep is under way: each record in it is
//! the latest of its key below `suffix_end`, and no older record shares its
//! key.
//!
//! A pass reads sealed segments through their files and writes new ones
//! beside them without the partition's writer lock; only the swap of each
//! cleaned group takes it ([`crate::PartitionLog::commit_cleaned`]). Every
//! file it opens, creates or removes by the directory's path goes through
//! the log's fence, so a pass under way when the log is retired (its topic
//! deleted) touches nothing at that path again, where a new log may live,
//! and ends with [`Skip::Retired`].

// Reads bytes from disk: bad bytes are errors, never panics.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hasher};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;

use crate::batch::{check_crc, BatchHeader};
use crate::fence::DirFence;
use crate::index::{Indexer, OffsetEntry, TimeEntry};
use crate::partition::SealedSegment;
use crate::records::{delete_horizon, rebuild_batch, records_in, records_section, Record};
use crate::segment::{
    batch_meta, read_header_at, segment_path, SegMeta, SegmentFile, INDEX_SUFFIX, LOG_SUFFIX,
    TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX,
};
use crate::storage::{
    read_file, remove_if_exists, write_all_at, write_atomically, OpenMode, Storage, StoredFile,
};
use crate::tiered::{Tier, TieredSegment};
use crate::view::LogReader;

/// The per-partition file holding the cleaner's progress.
pub const CLEANER_CHECKPOINT_FILE: &str = "cleaner-checkpoint";

/// Bytes of one map slot: an 80-bit digest of the key and a 32-bit offset
/// relative to the map's base offset.
pub const SLOT_BYTES: usize = 14;
/// The map takes keys until 7/8 of its slots are used, so a full map
/// costs `SLOT_BYTES * 8 / 7` = 16 bytes per key.
const MAX_LOAD_NUM: usize = 7;
const MAX_LOAD_DEN: usize = 8;
const DIGEST_BYTES: usize = 10;
/// An empty slot's offset field (never a stored offset delta).
const EMPTY: u32 = u32::MAX;

/// Key digest → latest offset, in a flat open-addressing table of
/// [`SLOT_BYTES`]-byte slots (linear probing). Two keys with the same 80-bit
/// digest are one key to the map; docs/format.md works out the odds.
pub struct KeyMap {
    slots: Vec<u8>,
    capacity: usize,
    /// The most slots the budget allows; a pass sizes the map to what its
    /// dirty section can hold, up to this.
    budget_capacity: usize,
    max_entries: usize,
    entries: usize,
    base_offset: i64,
}

/// What [`KeyMap::insert_if_absent`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Insert {
    Inserted,
    /// The key is already mapped (to a newer offset, when filled newest
    /// first).
    Present,
    Full,
}

impl KeyMap {
    /// A map using at most `budget_bytes` (at least a few slots). Memory
    /// is taken by [`KeyMap::reset`], not here.
    pub fn with_budget(budget_bytes: usize) -> KeyMap {
        KeyMap {
            slots: Vec::new(),
            capacity: 0,
            budget_capacity: (budget_bytes / SLOT_BYTES).max(8),
            max_entries: 0,
            entries: 0,
            base_offset: 0,
        }
    }

    /// Empties the map for offsets from `base_offset` (up to 2^32 - 2 past
    /// it), at its full budget.
    pub fn reset(&mut self, base_offset: i64) {
        self.reset_for(base_offset, u64::MAX);
    }

    /// Empties the map for at most `keys` keys from `base_offset`: it takes
    /// no more memory than that many keys need, within its budget.
    pub fn reset_for(&mut self, base_offset: i64, keys: u64) {
        let wanted = usize::try_from(keys.saturating_mul(MAX_LOAD_DEN as u64) / MAX_LOAD_NUM as u64)
            .unwrap_or(usize::MAX)
            .saturating_add(1)
            .clamp(8, self.budget_capacity);
        if wanted == self.capacity {
            self.slots.fill(0xff);
        } else {
            // Free the old table first: never two tables at once.
            self.slots = Vec::new();
            self.slots = vec![0xff; wanted * SLOT_BYTES];
            self.capacity = wanted;
            self.max_entries = wanted * MAX_LOAD_NUM / MAX_LOAD_DEN;
        }
        self.entries = 0;
        self.base_offset = base_offset;
    }

    /// Gives the map's memory back (until the next reset).
    pub fn release(&mut self) {
        self.slots = Vec::new();
        self.capacity = 0;
        self.max_entries = 0;
        self.entries = 0;
    }

    /// How many keys the map holds when full at its whole budget.
    pub fn budget_entries(&self) -> usize {
        self.budget_capacity * MAX_LOAD_NUM / MAX_LOAD_DEN
    }

    pub fn len(&self) -> usize {
        self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// How many keys the map holds when full.
    pub fn max_entries(&self) -> usize {
        self.max_entries
    }

    pub fn size_bytes(&self) -> usize {
        self.slots.len()
    }

    /// The highest offset a map based at `base_offset` can hold.
    pub fn max_offset(base_offset: i64) -> i64 {
        base_offset.saturating_add(i64::from(EMPTY) - 1)
    }

    fn digest(key: &[u8]) -> (u64, [u8; DIGEST_BYTES]) {
        let hash = |seed: u8| {
            let mut h = DefaultHasher::new();
            h.write_u8(seed);
            h.write(key);
            h.finish()
        };
        let (h1, h2) = (hash(0), hash(1));
        let mut stored = [0u8; DIGEST_BYTES];
        stored[..8].copy_from_slice(&h2.to_le_bytes());
        stored[8..].copy_from_slice(&h1.to_le_bytes()[..2]);
        (h1, stored)
    }

    fn home(&self, h1: u64) -> usize {
        ((u128::from(h1) * self.capacity as u128) >> 64) as usize
    }

    /// The slot holding `digest`, or the empty slot where it would go
    /// (`None`: the map has no memory).
    fn find(&self, h1: u64, digest: &[u8; DIGEST_BYTES]) -> Option<(usize, bool)> {
        if self.capacity == 0 {
            return None;
        }
        let mut i = self.home(h1);
        loop {
            let slot = &self.slots[i * SLOT_BYTES..(i + 1) * SLOT_BYTES];
            let delta = u32::from_le_bytes([slot[10], slot[11], slot[12], slot[13]]);
            if delta == EMPTY {
                return Some((i, false));
            }
            if slot[..DIGEST_BYTES] == digest[..] {
                return Some((i, true));
            }
            i = if i + 1 == self.capacity { 0 } else { i + 1 };
        }
    }

    /// Maps `key` to `offset` unless it is mapped already.
    pub fn insert_if_absent(&mut self, key: &[u8], offset: i64) -> Insert {
        let (h1, digest) = Self::digest(key);
        let Some((i, found)) = self.find(h1, &digest) else {
            return Insert::Full;
        };
        if found {
            return Insert::Present;
        }
        let delta = offset - self.base_offset;
        if self.entries >= self.max_entries || !(0..i64::from(EMPTY)).contains(&delta) {
            return Insert::Full;
        }
        let slot = &mut self.slots[i * SLOT_BYTES..(i + 1) * SLOT_BYTES];
        slot[..DIGEST_BYTES].copy_from_slice(&digest);
        slot[DIGEST_BYTES..].copy_from_slice(&(delta as u32).to_le_bytes());
        self.entries += 1;
        Insert::Inserted
    }

    /// The offset `key` is mapped to.
    pub fn get(&self, key: &[u8]) -> Option<i64> {
        let (h1, digest) = Self::digest(key);
        let (i, found) = self.find(h1, &digest)?;
        found.then(|| {
            let slot = &self.slots[i * SLOT_BYTES..(i + 1) * SLOT_BYTES];
            self.base_offset + i64::from(u32::from_le_bytes([slot[10], slot[11], slot[12], slot[13]]))
        })
    }
}

/// The cleaner's progress in one partition (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Checkpoint {
    pub clean_end: i64,
    pub suffix_start: i64,
    pub suffix_end: i64,
}

impl Checkpoint {
    fn at(offset: i64) -> Checkpoint {
        Checkpoint {
            clean_end: offset,
            suffix_start: offset,
            suffix_end: offset,
        }
    }

    /// This state with its clean end at least `first_base` (the log start
    /// may have moved past it) and a sweep that reached it folded in.
    fn settled(self, first_base: i64) -> Checkpoint {
        let clean_end = self.clean_end.max(first_base);
        if clean_end >= self.suffix_start {
            Checkpoint::at(clean_end.max(self.suffix_end))
        } else {
            Checkpoint { clean_end, ..self }
        }
    }

    fn sweeping(&self) -> bool {
        self.suffix_start < self.suffix_end
    }

    /// The state after a pass that mapped `[map_start, hi)` of its range
    /// `[lo, hi)` (the dirty section, or the part below this state's
    /// sweep window): clean up to the window's or the range's end when the
    /// map reached `lo`, else with a sweep window from `map_start`.
    fn after_pass(self, lo: i64, map_start: i64, hi: i64) -> Checkpoint {
        if map_start == lo {
            Checkpoint::at(if self.sweeping() { self.suffix_end } else { hi })
        } else {
            Checkpoint {
                clean_end: self.clean_end,
                suffix_start: map_start,
                suffix_end: if self.sweeping() { self.suffix_end } else { hi },
            }
        }
    }

    /// Whether the record at `offset` is clean in this state.
    fn is_clean(&self, offset: i64) -> bool {
        offset < self.clean_end || (self.suffix_start..self.suffix_end).contains(&offset)
    }

    pub fn read(storage: &dyn Storage, dir: &Path) -> io::Result<Option<Checkpoint>> {
        let Some(bytes) = read_file(storage, &dir.join(CLEANER_CHECKPOINT_FILE))? else {
            return Ok(None);
        };
        let text = String::from_utf8_lossy(&bytes);
        let numbers: Vec<i64> = text
            .lines()
            .skip(1)
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        Ok(match (text.lines().next(), numbers.as_slice()) {
            (Some("0"), &[clean_end, suffix_start, suffix_end])
                if clean_end <= suffix_start && suffix_start <= suffix_end =>
            {
                Some(Checkpoint {
                    clean_end,
                    suffix_start,
                    suffix_end,
                })
            }
            _ => {
                tracing::warn!(dir = %dir.display(), "unreadable cleaner checkpoint; cleaning from the start");
                None
            }
        })
    }

    pub fn write(&self, storage: &dyn Storage, dir: &Path) -> io::Result<()> {
        let text = format!(
            "0\n{}\n{}\n{}\n",
            self.clean_end, self.suffix_start, self.suffix_end
        );
        write_atomically(storage, &dir.join(CLEANER_CHECKPOINT_FILE), text.as_bytes())
    }
}

/// What a pass needs to know besides the log's own config.
#[derive(Debug, Clone, Copy)]
pub struct PassOptions {
    pub now_ms: i64,
    /// `min.compaction.lag.ms`: segments holding newer records wait.
    pub min_compaction_lag_ms: i64,
    /// `max.compaction.lag.ms`: a dirty record this old makes the log
    /// cleanable whatever its dirty ratio.
    pub max_compaction_lag_ms: i64,
    /// `min.cleanable.dirty.ratio`.
    pub min_cleanable_dirty_ratio: f64,
    /// `delete.retention.ms`: how long a clean tombstone stays.
    pub delete_retention_ms: i64,
}

/// A sealed segment as a pass sees it.
#[derive(Debug, Clone)]
pub(crate) struct SegmentRef {
    pub base_offset: i64,
    pub next_offset: i64,
    pub size_bytes: u64,
    pub max_timestamp_ms: i64,
    pub first_timestamp_ms: Option<i64>,
    pub source: Source,
    /// Batch positions the offset index names: where reads may start
    /// (for a cold segment, read from its tier when the pass needs them).
    pub positions: Vec<u32>,
}

/// Where a segment's bytes are.
#[derive(Debug, Clone)]
pub(crate) enum Source {
    Local(Arc<SegmentFile>),
    /// Its only copy is in a colder tier ([`ColdSegments`] reaches it).
    Cold(TieredSegment),
}

impl SegmentRef {
    /// The colder tier holding its only copy (`None`: it is local).
    fn tier(&self) -> Option<Tier> {
        match &self.source {
            Source::Local(_) => None,
            Source::Cold(t) => Some(t.tier),
        }
    }
}

/// What a pass needs to clean segments whose only copy is in a colder
/// tier: their offset index and bytes, and a place for their cleaned
/// replacement in the same tier. The caller (the broker, which owns the
/// tiers) provides it; without one, a log with such segments is not
/// cleanable.
pub trait ColdSegments: Send + Sync {
    /// The byte positions `segment`'s offset index names.
    fn positions(&self, segment: &TieredSegment) -> io::Result<Vec<u32>>;
    /// `len` bytes of `segment`'s log from `pos` (fewer only at its end).
    fn read(&self, segment: &TieredSegment, pos: u64, len: u64) -> io::Result<Bytes>;
    /// Copies a cleaned segment into `tier`, verified and durable, under a
    /// new object name; returns its manifest entry (state `Cold`).
    fn store(&self, tier: Tier, segment: &SealedSegment) -> io::Result<TieredSegment>;
    /// Deletes a stored copy no manifest will name.
    fn discard(&self, segment: &TieredSegment) -> io::Result<()>;
}

/// A group of consecutive sealed segments written again as one, ready to
/// be swapped in by [`crate::PartitionLog::commit_cleaned`].
pub struct CleanedGroup {
    pub(crate) replaced: Vec<SegmentRef>,
    pub(crate) cleaned_path: PathBuf,
    /// For a group of cold segments: the cleaned copy, stored in their
    /// tier; the swap is then a manifest change.
    pub(crate) stored: Option<TieredSegment>,
    pub(crate) size_bytes: u64,
    pub(crate) next_offset: i64,
    pub(crate) offset_index: Vec<OffsetEntry>,
    pub(crate) time_index: Vec<TimeEntry>,
    pub(crate) indexer: Indexer,
    pub(crate) first_batch_max_timestamp_ms: Option<i64>,
}

impl CleanedGroup {
    pub fn base_offset(&self) -> i64 {
        self.replaced.first().map_or(0, |s| s.base_offset)
    }

    /// The offset after the last one it covers.
    pub fn next_offset(&self) -> i64 {
        self.next_offset
    }

    /// The segment's metadata, with `file` as its log.
    pub(crate) fn meta(&self, file: Arc<SegmentFile>) -> SegMeta {
        let mut meta = SegMeta::cleaned(self.base_offset(), file);
        meta.size_bytes = self.size_bytes;
        meta.next_offset = self.next_offset;
        meta.offset_index = self.offset_index.clone();
        meta.time_index = self.time_index.clone();
        meta.indexer = self.indexer;
        meta.first_batch_max_timestamp_ms = self.first_batch_max_timestamp_ms;
        meta.add_final_time_entry();
        meta
    }
}

/// Why a log was not cleaned.
#[derive(Debug, Clone, PartialEq)]
pub enum Skip {
    /// Nothing sealed is old enough or dirty enough.
    NothingToClean,
    /// The dirty ratio is below `min.cleanable.dirty.ratio`.
    BelowDirtyRatio(f64),
    /// The log holds batches the cleaner cannot rewrite yet.
    Unsupported(String),
    /// Retention, a deletion or a failure changed the segments under the
    /// pass; the next pass starts again.
    Changed,
    /// The log was retired (its topic deleted) during the pass: what the
    /// pass did is discarded with it.
    Retired,
}

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Skip::NothingToClean => write!(f, "no sealed segment past min.compaction.lag.ms is dirty"),
            Skip::BelowDirtyRatio(r) => write!(f, "dirty ratio {r:.2} is below min.cleanable.dirty.ratio"),
            Skip::Unsupported(why) => write!(f, "{why}"),
            Skip::Changed => write!(f, "the log changed during the pass"),
            Skip::Retired => write!(f, "the log was deleted during the pass"),
        }
    }
}

/// What a pass did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PassStats {
    pub dirty_ratio: f64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Bytes of the segments replaced minus bytes of their replacements.
    pub bytes_reclaimed: u64,
    pub records_removed: u64,
    pub groups_swapped: usize,
    pub map_entries: usize,
    /// The range the map covered: `[map_start, map_end)`.
    pub map_start: i64,
    pub map_end: i64,
    pub checkpoint: Checkpoint,
}

/// Everything a pass reads: the log's files and view, without its lock.
pub struct CleanSource {
    pub(crate) storage: Arc<dyn Storage>,
    pub(crate) dir: PathBuf,
    /// Closed when the log is retired: every use of `dir`'s path goes
    /// through it.
    pub(crate) fence: Arc<DirFence>,
    pub(crate) view: LogReader,
    pub(crate) segment_bytes: u64,
    pub(crate) index_interval_bytes: u64,
    /// Read segment data with O_DIRECT (else buffered, then dropped from
    /// the page cache).
    pub(crate) direct: bool,
    pub(crate) read_window: u64,
    /// Producer id -> last offset of its newest batch (see
    /// [`CleanSource::with_producers`]).
    pub(crate) producers: HashMap<i64, i64>,
    pub(crate) cold: Option<Arc<dyn ColdSegments>>,
    /// The partition's last stable offset: a pass cleans only segments
    /// below it (see [`CleanSource::with_stable_end`]).
    pub(crate) stable_end: i64,
}

/// How much a pass reads at once by default (Kafka's
/// `log.cleaner.io.buffer.size`).
pub const DEFAULT_READ_WINDOW: u64 = 512 * 1024;

/// How a log stands before a pass: what [`CleanSource::assess`] finds.
#[derive(Debug, Clone, PartialEq)]
pub struct Assessment {
    /// Dirty bytes over the bytes of the cleanable segments.
    pub dirty_ratio: f64,
    pub dirty_bytes: u64,
    pub cleanable_bytes: u64,
    /// A dirty record is older than `max.compaction.lag.ms`.
    pub overdue: bool,
}

/// The part of a log a pass works on.
struct Plan {
    cleanable: Vec<SegmentRef>,
    checkpoint: Checkpoint,
    assessment: Assessment,
    /// The range to map: `[lo, hi)`.
    lo: i64,
    hi: i64,
}

/// What [`CleanSource::write_group`] has written of a group so far.
struct GroupOutput {
    base_offset: i64,
    /// Bytes written: the next batch's position in the file.
    pos: u64,
    /// Written bytes not yet handed to the file, from `flushed` on.
    pending: Vec<u8>,
    flushed: u64,
    indexer: Indexer,
    offset_index: Vec<OffsetEntry>,
    time_index: Vec<TimeEntry>,
    first_batch_max_timestamp_ms: Option<i64>,
    /// A batch was dropped or rewritten.
    changed: bool,
    next_offset: i64,
    records_removed: u64,
}

impl GroupOutput {
    fn new(base_offset: i64) -> GroupOutput {
        GroupOutput {
            base_offset,
            pos: 0,
            pending: Vec::new(),
            flushed: 0,
            indexer: Indexer::new(base_offset),
            offset_index: Vec::new(),
            time_index: Vec::new(),
            first_batch_max_timestamp_ms: None,
            changed: false,
            next_offset: base_offset,
            records_removed: 0,
        }
    }

    /// Appends a batch the pass keeps (as it was or rewritten), with its
    /// index entries.
    fn append(&mut self, bytes: &[u8], index_interval_bytes: u64) -> io::Result<()> {
        let nh = BatchHeader::parse(bytes).map_err(|e| io::Error::other(e.to_string()))?;
        self.pending.extend_from_slice(bytes);
        let (o, t) = self.indexer.on_batch(
            batch_meta(&nh, self.pos),
            self.base_offset,
            index_interval_bytes,
            self.time_index.last().copied(),
        );
        self.offset_index.extend(o);
        self.time_index.extend(t);
        self.first_batch_max_timestamp_ms.get_or_insert(nh.max_timestamp);
        self.next_offset = nh.last_offset() + 1;
        self.pos += bytes.len() as u64;
        Ok(())
    }

    /// Hands the pending bytes to `out`.
    fn flush_to(&mut self, out: &dyn StoredFile) -> io::Result<()> {
        write_all_at(out, &self.pending, self.flushed)?;
        self.flushed += self.pending.len() as u64;
        self.pending.clear();
        Ok(())
    }

    /// The cleaned group that replaces `group`, written whole at `path`.
    fn into_cleaned(self, group: &[SegmentRef], path: PathBuf) -> CleanedGroup {
        CleanedGroup {
            replaced: group.to_vec(),
            cleaned_path: path,
            stored: None,
            size_bytes: self.pos,
            next_offset: self.next_offset,
            offset_index: self.offset_index,
            time_index: self.time_index,
            indexer: self.indexer,
            first_batch_max_timestamp_ms: self.first_batch_max_timestamp_ms,
        }
    }
}

impl CleanSource {
    /// The sealed, durable, undamaged segments a pass may clean (all of
    /// them but the active one), or why there are none.
    ///
    /// Segments whose only copy is in a colder tier (the capacity tier or
    /// the object store) come first (they are the oldest), when the pass
    /// has [`ColdSegments`] to reach them.
    fn sealed(&self) -> Result<(Vec<SegmentRef>, i64), Skip> {
        let st = self.view.state.read();
        let mut cold: Vec<&TieredSegment> = st.tiered.iter().filter(|t| t.is_cold()).collect();
        if !cold.is_empty() && self.cold.is_none() {
            return Err(Skip::Unsupported(
                "the log has segments in a colder tier the cleaner cannot reach".into(),
            ));
        }
        cold.sort_by_key(|t| t.base_offset);
        let cold = cold.into_iter().map(|t| SegmentRef {
            base_offset: t.base_offset,
            next_offset: t.next_offset,
            size_bytes: t.size_bytes,
            max_timestamp_ms: t.max_timestamp_ms,
            first_timestamp_ms: None,
            source: Source::Cold(t.clone()),
            positions: Vec::new(),
        });
        let sealed = &st.segments[..st.segments.len().saturating_sub(1)];
        let local = sealed
            .iter()
            .take_while(|s| s.durable && s.damage.is_none())
            .filter(|s| s.size_bytes > 0)
            .map(|s| SegmentRef {
                base_offset: s.base_offset,
                next_offset: s.next_offset,
                size_bytes: s.size_bytes,
                max_timestamp_ms: s.indexer.max_timestamp_ms,
                first_timestamp_ms: s.first_batch_max_timestamp_ms,
                source: Source::Local(Arc::clone(&s.file)),
                positions: s.offset_index.iter().map(|e| e.position).collect(),
            });
        Ok((cold.chain(local).collect(), st.log_start_offset))
    }

    /// The last offset of each producer's newest batch: that batch is kept,
    /// emptied if need be, so the producer's sequence survives cleaning.
    pub fn with_producers(mut self, last_offsets: HashMap<i64, i64>) -> CleanSource {
        self.producers = last_offsets;
        self
    }

    /// The partition's last stable offset: segments holding offsets at or
    /// after it (an open transaction's data, or data whose transaction may
    /// still abort) wait, as Kafka's cleaner stops at the first unstable
    /// offset.
    pub fn with_stable_end(mut self, last_stable_offset: i64) -> CleanSource {
        self.stable_end = last_stable_offset;
        self
    }

    /// Lets passes clean segments whose only copy is in a colder tier.
    pub fn with_cold(mut self, cold: Arc<dyn ColdSegments>) -> CleanSource {
        self.cold = Some(cold);
        self
    }

    /// Reads `bytes` at once (at least one batch).
    pub fn with_read_window(mut self, bytes: u64) -> CleanSource {
        self.read_window = bytes.max(1);
        self
    }

    /// Whether a pass would clean now, and how dirty the log is: for
    /// choosing the dirtiest log first.
    pub fn assess(&self, options: &PassOptions) -> io::Result<Result<Assessment, Skip>> {
        Ok(self.plan(options)?.map(|p| p.assessment))
    }

    fn plan(&self, options: &PassOptions) -> io::Result<Result<Plan, Skip>> {
        let (sealed, log_start) = match self.sealed() {
            Ok(s) => s,
            Err(skip) => return Ok(Err(skip)),
        };
        // The first uncleanable offset: the first segment holding a record
        // newer than min.compaction.lag.ms or at or after the last stable
        // offset (Kafka's rules), else the end of the sealed segments.
        let lag_limit = options.now_ms.saturating_sub(options.min_compaction_lag_ms);
        let cleanable: Vec<SegmentRef> = sealed
            .into_iter()
            .take_while(|s| s.max_timestamp_ms <= lag_limit && s.next_offset <= self.stable_end)
            .collect();
        let Some(last) = cleanable.last() else {
            return Ok(Err(Skip::NothingToClean));
        };
        let dirty_end = last.next_offset;
        let first_base = cleanable[0].base_offset.max(log_start);
        let checkpoint = self
            .fence
            .run(|| Checkpoint::read(self.storage.as_ref(), &self.dir))?
            .filter(|c| c.suffix_end <= dirty_end)
            .map_or_else(|| Checkpoint::at(first_base), |c| c.settled(first_base));
        let total: u64 = cleanable.iter().map(|s| s.size_bytes).sum();
        let clean_bytes: u64 = cleanable
            .iter()
            .filter(|s| s.next_offset <= checkpoint.clean_end)
            .map(|s| s.size_bytes)
            .sum();
        let dirty_ratio = if total == 0 {
            0.0
        } else {
            (total - clean_bytes) as f64 / total as f64
        };
        // The range to map: below the sweep's window while one is under
        // way, else the whole dirty section.
        let lo = checkpoint.clean_end;
        let hi = if checkpoint.sweeping() {
            checkpoint.suffix_start
        } else {
            dirty_end
        };
        if lo >= hi {
            return Ok(Err(Skip::NothingToClean));
        }
        let overdue = cleanable
            .iter()
            .find(|s| s.next_offset > lo)
            .and_then(|s| s.first_timestamp_ms)
            .is_some_and(|t| t >= 0 && options.now_ms.saturating_sub(t) > options.max_compaction_lag_ms);
        if !checkpoint.sweeping() && dirty_ratio < options.min_cleanable_dirty_ratio && !overdue {
            return Ok(Err(Skip::BelowDirtyRatio(dirty_ratio)));
        }
        Ok(Ok(Plan {
            cleanable,
            checkpoint,
            assessment: Assessment {
                dirty_ratio,
                dirty_bytes: total - clean_bytes,
                cleanable_bytes: total,
                overdue,
            },
            lo,
            hi,
        }))
    }

    /// Runs one cleaning pass: maps the dirty section newest first, writes
    /// every segment below the mapped range's end again without the
    /// superseded records (and expired clean tombstones), hands each group
    /// to `commit` (which swaps it in under the writer lock, or refuses if
    /// the log changed meanwhile) and saves the new checkpoint. `budget`
    /// is told every byte read, so the caller can pace the pass.
    ///
    /// A pass whose log is retired meanwhile ends with [`Skip::Retired`],
    /// whatever it was doing: the fence kept it out of the directory's
    /// path from then on, and its results go with the log.
    pub fn clean(
        &self,
        map: &mut KeyMap,
        options: &PassOptions,
        budget: &mut dyn FnMut(u64),
        commit: &mut dyn FnMut(CleanedGroup) -> io::Result<bool>,
    ) -> io::Result<Result<PassStats, Skip>> {
        let outcome = self.clean_unretired(map, options, budget, commit);
        if self.fence.is_retired() {
            return Ok(Err(Skip::Retired));
        }
        outcome
    }

    fn clean_unretired(
        &self,
        map: &mut KeyMap,
        options: &PassOptions,
        budget: &mut dyn FnMut(u64),
        commit: &mut dyn FnMut(CleanedGroup) -> io::Result<bool>,
    ) -> io::Result<Result<PassStats, Skip>> {
        let Plan {
            cleanable,
            checkpoint,
            assessment,
            lo,
            hi,
        } = match self.plan(options)? {
            Ok(plan) => plan,
            Err(skip) => return Ok(Err(skip)),
        };
        let mut stats = PassStats {
            dirty_ratio: assessment.dirty_ratio,
            ..PassStats::default()
        };

        // Aborted transactions' batches hold no value of their keys: the
        // map skips them and the rewrite removes their records.
        let first_base = cleanable.first().map_or(lo, |s| s.base_offset);
        let aborted = AbortedBatches::new(self.view.aborted_txns(first_base, hi));

        // 1. The map, newest first.
        let map_start = self.map_keys(map, &cleanable, &aborted, (lo, hi), budget, &mut stats.bytes_read)?;
        if map_start >= hi {
            return Ok(Err(Skip::Unsupported(
                "the key map holds no key of the newest batch (log.cleaner.dedupe.buffer.size too small)"
                    .into(),
            )));
        }
        stats.map_entries = map.len();
        stats.map_start = map_start;
        stats.map_end = hi;

        // 2. The state after this pass, which decides where tombstones get
        //    their delete horizon.
        let next = checkpoint.after_pass(lo, map_start, hi);
        let decide = Decide {
            map,
            aborted: &aborted,
            producers: &self.producers,
            map_start,
            map_end: hi,
            before: checkpoint,
            after: next,
            now_ms: options.now_ms,
            delete_retention_ms: options.delete_retention_ms,
        };

        // 3. Every segment below the map's end, in groups, written again.
        let targets: Vec<SegmentRef> = cleanable.into_iter().filter(|s| s.base_offset < hi).collect();
        for group in group_segments(&targets, self.segment_bytes) {
            let Some(cleaned) = self.write_group(group, &decide, budget, &mut stats)? else {
                continue;
            };
            if !self.commit_group(group, cleaned, commit, &mut stats)? {
                // The log changed under the pass (retention, deletion):
                // stop; the checkpoint stays where it was.
                return Ok(Err(Skip::Changed));
            }
        }
        self.fence.run(|| next.write(self.storage.as_ref(), &self.dir))?;
        stats.checkpoint = next;
        Ok(Ok(stats))
    }

    /// Maps the keys of `cleanable` in `[lo, hi)` to their latest offsets,
    /// newest first, until the map is full, and returns where the mapped
    /// range starts: every key of `[map_start, hi)` is in the map.
    /// `bytes_read` counts what it reads, as `budget` is told.
    fn map_keys(
        &self,
        map: &mut KeyMap,
        cleanable: &[SegmentRef],
        aborted: &AbortedBatches,
        (lo, hi): (i64, i64),
        budget: &mut dyn FnMut(u64),
        bytes_read: &mut u64,
    ) -> io::Result<i64> {
        let map_base = lo.max(hi.saturating_sub(i64::from(EMPTY) - 1));
        map.reset_for(map_base, u64::try_from(hi - map_base).unwrap_or(0));
        let mut map_start = map_base;
        'segments: for seg in cleanable
            .iter()
            .rev()
            .filter(|s| s.base_offset < hi && s.next_offset > lo)
        {
            let reader = self.reader(seg)?;
            for window in self.windows(seg)?.into_iter().rev() {
                let batches = self.read_batches(&reader, window)?;
                budget(window.1 - window.0);
                *bytes_read += window.1 - window.0;
                for (h, batch) in batches.iter().rev() {
                    if h.last_offset() < map_base {
                        break 'segments;
                    }
                    // Control batches carry markers, not keys.
                    if h.base_offset >= hi || h.is_control() || aborted.contains(h) {
                        continue;
                    }
                    let section = batch_section(batch, h)?;
                    let recs = section_records(&section, h)?;
                    for r in recs.iter().rev() {
                        let offset = h.base_offset + r.offset_delta;
                        if offset >= hi || offset < map_base {
                            continue;
                        }
                        let Some(key) = r.key else { continue };
                        if map.insert_if_absent(key, offset) == Insert::Full {
                            map_start = offset + 1;
                            break 'segments;
                        }
                    }
                }
            }
        }
        Ok(map_start)
    }

    /// Hands a cleaned group to `commit`, after storing it in its tier if
    /// its segments are cold, and counts it in `stats`. Whether `commit`
    /// swapped it in; if not, the cleaned copy is removed.
    fn commit_group(
        &self,
        group: &[SegmentRef],
        mut cleaned: CleanedGroup,
        commit: &mut dyn FnMut(CleanedGroup) -> io::Result<bool>,
        stats: &mut PassStats,
    ) -> io::Result<bool> {
        let old_bytes: u64 = cleaned.replaced.iter().map(|s| s.size_bytes).sum();
        let new_bytes = cleaned.size_bytes;
        let path = cleaned.cleaned_path.clone();
        if let Some(Source::Cold(first)) = group.first().map(|s| &s.source) {
            let stored = self.store_cold(first.tier, &cleaned);
            if stored.is_err() {
                self.remove(&path)?;
            }
            cleaned.stored = Some(stored?);
        }
        let stored = cleaned.stored.clone();
        if commit(cleaned)? {
            stats.groups_swapped += 1;
            stats.bytes_reclaimed += old_bytes.saturating_sub(new_bytes);
            Ok(true)
        } else {
            if let Some(stored) = stored {
                self.cold_access()?.discard(&stored)?;
            }
            self.remove(&path)?;
            Ok(false)
        }
    }

    /// Writes `group` again as `<base>.log.cleaned`, fsynced and dropped
    /// from the page cache, with its index entries. `None` when nothing in
    /// it changes.
    fn write_group(
        &self,
        group: &[SegmentRef],
        decide: &Decide<'_>,
        budget: &mut dyn FnMut(u64),
        stats: &mut PassStats,
    ) -> io::Result<Option<CleanedGroup>> {
        let Some(first) = group.first() else {
            return Ok(None);
        };
        let base = first.base_offset;
        let path = cleaned_path(&self.dir, base);
        let out = self.fence.run(|| self.storage.open(&path, OpenMode::Create))?;
        let mut output = GroupOutput::new(base);
        let written = self.write_batches(
            group,
            decide,
            budget,
            &mut stats.bytes_read,
            out.as_ref(),
            &mut output,
        );
        let done = written.and_then(|()| {
            if output.changed || group.len() > 1 {
                out.sync_data()?;
                out.drop_cache();
            }
            Ok(())
        });
        drop(out);
        if let Err(e) = done {
            let _ = self.remove(&path);
            return Err(e);
        }
        if !output.changed && group.len() == 1 {
            self.remove(&path)?;
            return Ok(None);
        }
        stats.bytes_written += output.pos;
        stats.records_removed += output.records_removed;
        Ok(Some(output.into_cleaned(group, path)))
    }

    /// Reads `group`'s batches in order and writes what `decide` keeps of
    /// each to `out` through `output`, a read window's worth at a time.
    /// `bytes_read` counts what it reads, as `budget` is told.
    fn write_batches(
        &self,
        group: &[SegmentRef],
        decide: &Decide<'_>,
        budget: &mut dyn FnMut(u64),
        bytes_read: &mut u64,
        out: &dyn StoredFile,
        output: &mut GroupOutput,
    ) -> io::Result<()> {
        for (si, seg) in group.iter().enumerate() {
            let reader = self.reader(seg)?;
            let windows = self.windows(seg)?;
            let last_window = windows.len().saturating_sub(1);
            for (wi, window) in windows.into_iter().enumerate() {
                let batches = self.read_batches(&reader, window)?;
                budget(window.1 - window.0);
                *bytes_read += window.1 - window.0;
                let last_batch = batches.len().saturating_sub(1);
                for (bi, (h, batch)) in batches.iter().enumerate() {
                    let is_group_end = si + 1 == group.len() && wi == last_window && bi == last_batch;
                    let rewritten = decide.batch(batch, h, is_group_end)?;
                    let bytes: &[u8] = match &rewritten {
                        Rewrite::Same => batch,
                        Rewrite::Drop { records } => {
                            output.changed = true;
                            output.records_removed += records;
                            continue;
                        }
                        Rewrite::New { bytes, removed: r } => {
                            output.changed = true;
                            output.records_removed += r;
                            bytes
                        }
                    };
                    output.append(bytes, self.index_interval_bytes)?;
                }
                if output.pending.len() as u64 >= self.read_window {
                    output.flush_to(out)?;
                }
            }
        }
        write_all_at(out, &output.pending, output.flushed)
    }

    /// The batches of one window of a segment, read without leaving it in
    /// the page cache; each batch's CRC is checked, so the cleaner never
    /// rewrites damaged data under a fresh checksum.
    fn read_batches(
        &self,
        reader: &Reader,
        (start, end): (u64, u64),
    ) -> io::Result<Vec<(BatchHeader, Bytes)>> {
        let data = match reader {
            Reader::Local(file) => file.read_uncached(start, end - start, self.direct)?,
            Reader::Cold(cold, segment) => cold.read(segment, start, end - start)?,
        };
        if (data.len() as u64) < end - start {
            return Err(invalid_data(format!(
                "segment data ends at {} before {end}",
                start + data.len() as u64
            )));
        }
        let mut out = Vec::new();
        let mut pos = 0usize;
        while pos < data.len() {
            let at = start + pos as u64;
            let h =
                BatchHeader::parse(&data[pos..]).map_err(|e| invalid_data(format!("batch at {at}: {e}")))?;
            let len = h.total_len();
            if len > data.len() - pos {
                return Err(invalid_data(format!("batch at {at} runs past {end}")));
            }
            let batch = data.slice(pos..pos + len);
            check_crc(&batch, &h).map_err(|e| invalid_data(format!("batch at {at}: {e}")))?;
            out.push((h, batch));
            pos += len;
        }
        Ok(out)
    }

    /// Copies a cleaned group of cold segments into their tier (outside
    /// the writer lock: the commit is then a manifest change).
    fn store_cold(&self, tier: Tier, cleaned: &CleanedGroup) -> io::Result<TieredSegment> {
        let path = &cleaned.cleaned_path;
        let handle = self.fence.run(|| self.storage.open(path, OpenMode::Read))?;
        let file = Arc::new(SegmentFile::pinned(
            Arc::clone(&self.storage),
            path.clone(),
            handle,
        ));
        let mut meta = cleaned.meta(file);
        meta.aborted = self.aborted_in(cleaned.base_offset(), cleaned.next_offset);
        let segment = meta.sealed_segment();
        self.cold_access()?.store(tier, &segment)
    }

    /// The aborted-transaction entries whose markers lie in `[base,
    /// next)`: what a segment written again over that range must keep.
    fn aborted_in(&self, base: i64, next: i64) -> Vec<crate::AbortedTxn> {
        let mut entries: Vec<crate::AbortedTxn> = self
            .view
            .aborted_txns(base, next)
            .into_iter()
            .filter(|e| e.last_offset >= base && e.last_offset < next)
            .collect();
        entries.sort_by_key(|e| e.last_offset);
        entries
    }

    /// Removes a file of the pass (a cleaned group not swapped in).
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.fence.run(|| remove_if_exists(self.storage.as_ref(), path))
    }

    fn reader(&self, seg: &SegmentRef) -> io::Result<Reader> {
        Ok(match &seg.source {
            // Opened by path unless a reader holds it open already.
            Source::Local(file) => Reader::Local(self.fence.run(|| file.open())?),
            Source::Cold(t) => Reader::Cold(self.cold_access()?, t.clone()),
        })
    }

    fn cold_access(&self) -> io::Result<Arc<dyn ColdSegments>> {
        self.cold
            .clone()
            .ok_or_else(|| io::Error::other("no access to the colder tier"))
    }

    /// Byte ranges of a segment to read at once: each starts at a batch (a
    /// position its offset index names) and spans at least the read window
    /// where the index allows.
    fn windows(&self, seg: &SegmentRef) -> io::Result<Vec<(u64, u64)>> {
        Ok(match &seg.source {
            Source::Local(_) => windows(&seg.positions, seg.size_bytes, self.read_window),
            Source::Cold(t) => windows(
                &self.cold_access()?.positions(t)?,
                seg.size_bytes,
                self.read_window,
            ),
        })
    }
}

/// An open segment a pass reads.
enum Reader {
    Local(Arc<dyn crate::StoredFile>),
    Cold(Arc<dyn ColdSegments>, TieredSegment),
}

fn invalid_data(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

/// Byte ranges of a segment of `size_bytes` to read at once: each starts at
/// a batch (one of `positions`) and spans at least `window` bytes where the
/// positions allow.
fn windows(positions: &[u32], size_bytes: u64, window: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut start = 0u64;
    for p in positions.iter().map(|p| u64::from(*p)) {
        if p > start && p < size_bytes && p - start >= window {
            out.push((start, p));
            start = p;
        }
    }
    if start < size_bytes {
        out.push((start, size_bytes));
    }
    out
}

/// `dir/<base>.log.cleaned`.
pub(crate) fn cleaned_path(dir: &Path, base_offset: i64) -> PathBuf {
    let mut p = segment_path(dir, base_offset, LOG_SUFFIX).into_os_string();
    p.push(".cleaned");
    PathBuf::from(p)
}

/// `dir/<base>.log.swap`.
pub(crate) fn swap_path(dir: &Path, base_offset: i64) -> PathBuf {
    let mut p = segment_path(dir, base_offset, LOG_SUFFIX).into_os_string();
    p.push(".swap");
    PathBuf::from(p)
}

/// Kafka's grouping: consecutive segments whose sizes add up to at most
/// `segment.bytes` and whose offsets fit one segment's int32 range. A
/// group is all local or all in one colder tier: a cleaned cold group goes
/// back to its tier, so cold segments stay below local ones.
fn group_segments(segments: &[SegmentRef], max_bytes: u64) -> Vec<&[SegmentRef]> {
    let mut groups = Vec::new();
    let mut start = 0;
    while start < segments.len() {
        let mut end = start + 1;
        let mut size = segments[start].size_bytes;
        while end < segments.len()
            && segments[end].tier() == segments[start].tier()
            && size + segments[end].size_bytes <= max_bytes
            && segments[end].next_offset - 1 - segments[start].base_offset <= i64::from(i32::MAX)
        {
            size += segments[end].size_bytes;
            end += 1;
        }
        groups.push(&segments[start..end]);
        start = end;
    }
    groups
}

/// Positions and headers of a segment's batches.
fn batch_positions(file: &dyn crate::StoredFile, size: u64) -> io::Result<Vec<(u64, BatchHeader)>> {
    let mut out = Vec::new();
    let mut pos = 0;
    while let Some(h) = read_header_at(file, pos, size)? {
        out.push((pos, h));
        pos += h.total_len() as u64;
    }
    Ok(out)
}

/// The records section of a batch, decompressed if need be.
fn batch_section<'a>(batch: &'a [u8], h: &BatchHeader) -> io::Result<std::borrow::Cow<'a, [u8]>> {
    records_section(batch, h).map_err(|why| invalid_data(format!("batch at offset {}: {why}", h.base_offset)))
}

fn section_records<'a>(section: &'a [u8], h: &BatchHeader) -> io::Result<Vec<Record<'a>>> {
    records_in(section)
        .collect::<Result<Vec<_>, String>>()
        .map_err(|why| invalid_data(format!("batch at offset {}: {why}", h.base_offset)))
}

/// The per-record rules of a pass.
struct Decide<'a> {
    map: &'a KeyMap,
    /// Producer id -> last offset of its newest batch in the log.
    aborted: &'a AbortedBatches,
    producers: &'a HashMap<i64, i64>,
    map_start: i64,
    map_end: i64,
    before: Checkpoint,
    after: Checkpoint,
    now_ms: i64,
    delete_retention_ms: i64,
}

/// The aborted transactions of the range a pass cleans, by producer.
struct AbortedBatches {
    /// Producer id -> `(first offset, marker offset)` of each aborted
    /// transaction.
    by_producer: HashMap<i64, Vec<(i64, i64)>>,
}

impl AbortedBatches {
    fn new(entries: Vec<crate::AbortedTxn>) -> AbortedBatches {
        let mut by_producer: HashMap<i64, Vec<(i64, i64)>> = HashMap::new();
        for e in entries {
            by_producer
                .entry(e.producer_id)
                .or_default()
                .push((e.first_offset, e.last_offset));
        }
        AbortedBatches { by_producer }
    }

    /// Whether `h` is a data batch of a transaction its producer aborted.
    fn contains(&self, h: &BatchHeader) -> bool {
        h.is_transactional()
            && !h.is_control()
            && self.by_producer.get(&h.producer_id).is_some_and(|txns| {
                txns.iter()
                    .any(|&(first, marker)| first <= h.base_offset && h.base_offset < marker)
            })
    }
}

enum Rewrite {
    Same,
    Drop { records: u64 },
    New { bytes: Vec<u8>, removed: u64 },
}

impl Decide<'_> {
    /// Whether the record at `offset` with `key` survives the map.
    fn latest(&self, offset: i64, key: Option<&[u8]>) -> bool {
        let Some(key) = key else { return true };
        if offset >= self.map_end {
            return true;
        }
        match self.map.get(key) {
            None => true,
            Some(mapped) if offset >= self.map_start => mapped == offset,
            Some(mapped) => mapped < offset,
        }
    }

    fn batch(&self, batch: &[u8], h: &BatchHeader, is_group_end: bool) -> io::Result<Rewrite> {
        if h.is_control() {
            return Ok(Rewrite::Same);
        }
        let section = batch_section(batch, h)?;
        let recs = section_records(&section, h)?;
        let horizon = delete_horizon(h);
        let expired = horizon.is_some_and(|t| self.now_ms >= t);
        let aborted = self.aborted.contains(h);
        let kept: Vec<Record> = recs
            .iter()
            .filter(|r| {
                let offset = h.base_offset + r.offset_delta;
                !aborted
                    && self.latest(offset, r.key)
                    && !(r.is_tombstone() && expired && self.before.is_clean(offset))
            })
            .copied()
            .collect();
        let removed = (recs.len() - kept.len()) as u64;
        // Tombstones of a batch that is clean after this pass start their
        // delete.retention.ms now (KIP-534's delete horizon).
        let clean_after = self.after.is_clean(h.base_offset) && self.after.is_clean(h.last_offset());
        let set_horizon = horizon.is_none() && clean_after && kept.iter().any(Record::is_tombstone);
        // An empty batch stays where it carries what the log needs: the
        // group's last offset, or a producer's last sequence (Kafka keeps
        // that batch too, so the producer's next write is in sequence).
        let keep_empty = is_group_end
            || (h.producer_id >= 0 && self.producers.get(&h.producer_id) == Some(&h.last_offset()));
        if kept.is_empty() && !keep_empty {
            return Ok(Rewrite::Drop { records: removed });
        }
        if removed == 0 && !set_horizon {
            return Ok(Rewrite::Same);
        }
        let new_horizon = set_horizon.then(|| self.now_ms.saturating_add(self.delete_retention_ms));
        Ok(Rewrite::New {
            bytes: rebuild_batch(batch, h, &kept, new_horizon)?,
            removed,
        })
    }
}

/// Deletes the files of the segments a cleaned segment at `base` replaces
/// (their index files, and their `.log` but `base`'s, which the swap file
/// is renamed over), then fsyncs the directory.
pub(crate) fn remove_replaced(
    storage: &dyn Storage,
    dir: &Path,
    base: i64,
    replaced: impl Iterator<Item = i64>,
) -> io::Result<()> {
    for old in replaced {
        for suffix in [INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
            remove_if_exists(storage, &segment_path(dir, old, suffix))?;
        }
        if old != base {
            // `base`'s `.txnindex` already holds every replaced segment's
            // aborts (written before the swap's commit point).
            remove_if_exists(storage, &segment_path(dir, old, LOG_SUFFIX))?;
            remove_if_exists(storage, &segment_path(dir, old, TXN_INDEX_SUFFIX))?;
        }
    }
    storage.sync_dir(dir)
}

/// Finishes or undoes what a crash left of a swap at start-up: `.cleaned`
/// files are dropped (the originals are intact); a `.swap` file replaces
/// every segment whose base lies in its offset range, then takes its
/// segment name.
pub(crate) fn recover_swaps(storage: &dyn Storage, dir: &Path) -> io::Result<()> {
    let entries = storage.read_dir(dir)?;
    let bases: Vec<i64> = entries
        .iter()
        .filter(|e| !e.is_dir)
        .filter_map(|e| e.name.strip_suffix(".log")?.parse().ok())
        .collect();
    for entry in entries {
        let name = entry.name;
        if entry.is_dir {
            continue;
        }
        let path = dir.join(&name);
        if name.ends_with(".log.cleaned") {
            tracing::info!(file = %path.display(), "removing a cleaned segment that was never swapped in");
            remove_if_exists(storage, &path)?;
            continue;
        }
        let Some(stem) = name.strip_suffix(".log.swap") else {
            continue;
        };
        let Ok(base) = stem.parse::<i64>() else { continue };
        let file = storage.open(&path, OpenMode::Read)?;
        let size = file.len()?;
        let end = batch_positions(file.as_ref(), size)
            .ok()
            .and_then(|b| b.last().map(|(_, h)| h.last_offset() + 1));
        drop(file);
        let Some(end) = end else {
            // A swap file is renamed only once fsynced; one that does not
            // read back is not trusted over the originals.
            tracing::warn!(file = %path.display(), "unreadable swap file; keeping the original segments");
            remove_if_exists(storage, &path)?;
            continue;
        };
        tracing::info!(file = %path.display(), base, end, "completing the swap of a cleaned segment");
        remove_replaced(
            storage,
            dir,
            base,
            bases.iter().copied().filter(|b| *b >= base && *b < end),
        )?;
        storage.rename(&path, &segment_path(dir, base, LOG_SUFFIX))?;
        storage.sync_dir(dir)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_settles_past_the_log_start() {
        let c = |clean_end, suffix_start, suffix_end| Checkpoint {
            clean_end,
            suffix_start,
            suffix_end,
        };
        assert_eq!(
            c(5, 5, 5).settled(20),
            Checkpoint::at(20),
            "retention moved the start"
        );
        assert_eq!(c(5, 30, 40).settled(20), c(20, 30, 40), "the sweep goes on");
        assert_eq!(
            c(5, 10, 40).settled(20),
            Checkpoint::at(40),
            "the start passed the sweep's low end"
        );
        assert_eq!(c(5, 10, 15).settled(20), Checkpoint::at(20));
        assert_eq!(c(30, 30, 30).settled(20), Checkpoint::at(30));
    }

    #[test]
    fn the_map_keeps_the_first_offset_of_each_key_and_fills_up() {
        let mut map = KeyMap::with_budget(16 * SLOT_BYTES);
        map.reset(100);
        assert_eq!(map.max_entries(), 14);
        assert_eq!(map.insert_if_absent(b"a", 150), Insert::Inserted);
        assert_eq!(map.insert_if_absent(b"a", 120), Insert::Present);
        assert_eq!(map.get(b"a"), Some(150));
        assert_eq!(map.get(b"b"), None);
        for i in 0..13 {
            assert_eq!(
                map.insert_if_absent(format!("k{i}").as_bytes(), 101 + i),
                Insert::Inserted
            );
        }
        assert_eq!(map.insert_if_absent(b"z", 99), Insert::Full);
        assert_eq!(map.len(), 14);
    }
}
