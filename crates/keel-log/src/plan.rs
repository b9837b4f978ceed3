//! Compaction planning: how many passes a log needs to be cleaned, what
//! they read and write, and the disk a compacted topic needs, for Keel's
//! cleaner and, for comparison, Kafka's. The input is a described workload
//! ([`Workload`]) or a scan of a partition's files ([`scan_partition`]).
//!
//! The model works in records of one partition. A log before a clean is a
//! clean part (`clean` records, one per key) followed by a dirty part
//! (`dirty` records holding `dirty_keys` distinct keys, of which the first
//! `fresh` records carry keys with no older copy anywhere, which come again
//! later in the dirty part: a bulk load not cleaned yet, then republished).
//! `superseded_clean` clean records have a newer copy in the
//! dirty part.
//!
//! * **Keel** maps the dirty part newest first. Each pass maps `map_keys`
//!   keys no earlier pass of the sweep mapped (their older copies are gone
//!   after the pass that mapped them), so a sweep takes
//!   `ceil(dirty_keys / map_keys)` passes, and every pass removes the older
//!   copies of the keys it maps. A pass reads the records it maps and
//!   rewrites everything below them.
//! * **Kafka** maps the dirty part oldest first, 24 bytes per key at a load
//!   factor of 0.9. A pass maps the next records until its map holds
//!   `map_keys` keys and rewrites everything from the log start to the end
//!   of them; records in the `fresh` part supersede nothing, so passes that
//!   map only them reclaim nothing (the 003 bulk-load-then-republish case).
//!
//! Removals are spread over passes in proportion to the keys each maps, and
//! records over keys evenly: a planning estimate, not a replay. Bytes are
//! records times the mean record size.

use std::collections::hash_map::DefaultHasher;
use std::hash::BuildHasherDefault;
use std::io;
use std::path::{Path, PathBuf};

use hyperloglogplus::{HyperLogLog, HyperLogLogPlus};

use crate::batch::{check_crc, BatchHeader, BATCH_HEADER_LEN};
use crate::clean::{Checkpoint, KeyMap};
use crate::records::{records_in, records_section};
use crate::storage::DiskStorage;
use crate::tiered::{read_manifest, Tier, TieredSegment};

/// Kafka's key-map slot: a 16-byte MD5 of the key and an 8-byte offset.
pub const KAFKA_BYTES_PER_KEY: u64 = 24;
/// Kafka's `log.cleaner.io.buffer.load.factor` default.
pub const KAFKA_LOAD_FACTOR: f64 = 0.9;

/// The cleaner's settings the plan depends on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CleanerBudget {
    /// `log.cleaner.dedupe.buffer.size`, shared by the threads.
    pub dedupe_buffer_bytes: u64,
    /// `log.cleaner.threads`.
    pub threads: u32,
    /// `log.cleaner.io.max.bytes.per.second`; `None` when unlimited.
    pub io_bytes_per_sec: Option<u64>,
    /// `segment.bytes`: a pass writes one group of at most this beside
    /// the segments it replaces.
    pub segment_bytes: u64,
}

impl CleanerBudget {
    fn per_thread_bytes(&self) -> u64 {
        self.dedupe_buffer_bytes / u64::from(self.threads.max(1))
    }

    /// Keys one of Keel's cleaner threads maps per pass.
    pub fn keel_map_keys(&self) -> u64 {
        let bytes = usize::try_from(self.per_thread_bytes()).unwrap_or(usize::MAX);
        KeyMap::with_budget(bytes).budget_entries() as u64
    }

    /// Keys one of Kafka's cleaner threads maps per pass (its map is at
    /// most 2 GiB per thread).
    pub fn kafka_map_keys(&self) -> u64 {
        let bytes = self.per_thread_bytes().min(i32::MAX as u64);
        ((bytes / KAFKA_BYTES_PER_KEY) as f64 * KAFKA_LOAD_FACTOR) as u64
    }
}

/// One partition's log before a clean, in records (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Section {
    pub clean: f64,
    pub dirty: f64,
    pub dirty_keys: f64,
    pub fresh: f64,
    pub superseded_clean: f64,
    pub record_bytes: f64,
}

impl Section {
    /// Records a full clean removes: older copies within the dirty part
    /// and the clean records it supersedes.
    pub fn removable(&self) -> f64 {
        (self.dirty - self.dirty_keys).max(0.0) + self.superseded_clean
    }

    pub fn bytes(&self) -> f64 {
        (self.clean + self.dirty) * self.record_bytes
    }
}

/// What a full clean of one [`Section`] costs one broker's cleaner.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CleanCost {
    pub passes: u64,
    /// Passes that remove nothing.
    pub barren_passes: u64,
    pub bytes_read: f64,
    pub bytes_written: f64,
    pub bytes_reclaimed: f64,
    pub bytes_before: f64,
    pub bytes_after: f64,
    /// Bytes each pass reclaims, in order.
    pub reclaimed_per_pass: Vec<f64>,
}

/// The cost of a clean that makes no pass (`Err`), or the cost before
/// the first pass.
fn start(s: &Section, map_keys: u64) -> Result<CleanCost, CleanCost> {
    let idle = s.dirty <= 0.0 || map_keys == 0;
    let cost = CleanCost {
        bytes_before: s.bytes(),
        bytes_after: if idle { s.bytes() } else { 0.0 },
        ..CleanCost::default()
    };
    if idle {
        Err(cost)
    } else {
        Ok(cost)
    }
}

/// Keel's passes over `s` with `map_keys` keys per pass.
pub fn keel_clean(s: &Section, map_keys: u64) -> CleanCost {
    let mut cost = match start(s, map_keys) {
        Ok(cost) => cost,
        Err(none) => return none,
    };
    let m = map_keys as f64;
    let passes = (s.dirty_keys / m).ceil().max(1.0) as u64;
    let removable = s.removable();
    // Records below the pass's mapped range's end: all of them at first;
    // each pass leaves out what it removed and the keys it mapped.
    let mut below = s.clean + s.dirty;
    let mut keys_left = s.dirty_keys.max(1.0);
    for _ in 0..passes {
        let keys = m.min(keys_left);
        let share = keys / s.dirty_keys.max(1.0);
        let mapped = s.dirty * share;
        let removed = removable * share;
        cost.bytes_read += (below + mapped) * s.record_bytes;
        cost.bytes_written += (below - removed) * s.record_bytes;
        cost.reclaimed_per_pass.push(removed * s.record_bytes);
        below -= removed + keys;
        keys_left -= keys;
    }
    finish(cost, passes)
}

/// Kafka's passes over `s` with `map_keys` keys per pass.
pub fn kafka_clean(s: &Section, map_keys: u64) -> CleanCost {
    let mut cost = match start(s, map_keys) {
        Ok(cost) => cost,
        Err(none) => return none,
    };
    let m = map_keys as f64;
    // The dirty part after the fresh records, which holds every dirty key
    // (the fresh records' keys come again there).
    let rest = (s.dirty - s.fresh).max(0.0);
    let rest_keys = s.dirty_keys.min(rest);
    let removable = s.removable();
    let mut clean = s.clean;
    let mut fresh_left = s.fresh;
    let mut rest_left = rest;
    let mut passes = 0u64;
    while fresh_left + rest_left > 0.5 {
        passes += 1;
        // The map fills with fresh keys (one per record) first, then with
        // the rest, `rest / rest_keys` records per key.
        let from_fresh = fresh_left.min(m);
        let keys_for_rest = m - from_fresh;
        let per_key = if rest_keys > 0.0 { rest / rest_keys } else { 1.0 };
        let from_rest = (keys_for_rest * per_key).min(rest_left);
        let covered = from_fresh + from_rest;
        let removed = if rest > 0.0 {
            removable * from_rest / rest
        } else {
            0.0
        };
        cost.bytes_read += (clean + 2.0 * covered) * s.record_bytes;
        cost.bytes_written += (clean + covered - removed) * s.record_bytes;
        cost.reclaimed_per_pass.push(removed * s.record_bytes);
        clean += covered - removed;
        fresh_left -= from_fresh;
        rest_left -= from_rest;
    }
    finish(cost, passes)
}

fn finish(mut cost: CleanCost, passes: u64) -> CleanCost {
    cost.passes = passes;
    cost.barren_passes = cost.reclaimed_per_pass.iter().filter(|r| **r < 0.5).count() as u64;
    cost.bytes_reclaimed = cost.reclaimed_per_pass.iter().sum();
    cost.bytes_after = (cost.bytes_before - cost.bytes_reclaimed).max(0.0);
    cost
}

/// How the dirty part of a compacted log arises.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Shape {
    /// Updates spread evenly over the keys; the cleaner starts when the
    /// dirty ratio reaches `min.cleanable.dirty.ratio`.
    Steady,
    /// A bulk load of every key, of which `uncleaned` (a fraction) was not
    /// cleaned yet, then a full republish of every key (the 003 article).
    Republish { uncleaned: f64 },
}

/// A described workload, for the whole topic.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Workload {
    pub keys: f64,
    pub partitions: u32,
    /// Mean bytes per record on disk (batch overhead included).
    pub record_bytes: f64,
    pub shape: Shape,
    /// `min.cleanable.dirty.ratio`.
    pub dirty_ratio: f64,
    /// Updates per second to the whole topic, if known.
    pub updates_per_sec: Option<f64>,
}

impl Workload {
    pub fn keys_per_partition(&self) -> f64 {
        self.keys / f64::from(self.partitions.max(1))
    }

    /// One partition's log when its clean starts.
    pub fn section(&self) -> Section {
        let k = self.keys_per_partition();
        match self.shape {
            Shape::Steady => {
                let r = self.dirty_ratio.clamp(0.0, 0.99);
                let dirty = k * r / (1.0 - r);
                let dirty_keys = k * (1.0 - (-dirty / k.max(1.0)).exp());
                Section {
                    clean: k,
                    dirty,
                    dirty_keys,
                    fresh: 0.0,
                    superseded_clean: dirty_keys,
                    record_bytes: self.record_bytes,
                }
            }
            Shape::Republish { uncleaned } => {
                let fresh = k * uncleaned.clamp(0.0, 1.0);
                Section {
                    clean: k - fresh,
                    dirty: fresh + k,
                    dirty_keys: k,
                    fresh,
                    superseded_clean: k - fresh,
                    record_bytes: self.record_bytes,
                }
            }
        }
    }
}

/// A plan for a whole topic on one broker.
#[derive(Debug, Clone, PartialEq)]
pub struct TopicPlan {
    pub keel_map_keys: u64,
    pub kafka_map_keys: u64,
    /// Per partition: (Keel, Kafka).
    pub partitions: Vec<(Section, CleanCost, CleanCost)>,
    pub keel_bytes_read: f64,
    pub kafka_bytes_read: f64,
    pub keel_bytes_written: f64,
    /// Seconds the reads take at `log.cleaner.io.max.bytes.per.second`.
    pub keel_seconds: Option<f64>,
    pub kafka_seconds: Option<f64>,
    /// The topic compacted: one record per key.
    pub compacted_bytes: f64,
    /// The most the topic occupies: every partition at its fullest, plus a
    /// cleaned group per cleaner thread beside the segments it replaces.
    pub peak_bytes: f64,
}

impl TopicPlan {
    pub fn new(sections: &[Section], live_keys: f64, budget: &CleanerBudget) -> TopicPlan {
        let keel_map_keys = budget.keel_map_keys();
        let kafka_map_keys = budget.kafka_map_keys();
        let partitions: Vec<(Section, CleanCost, CleanCost)> = sections
            .iter()
            .map(|s| (*s, keel_clean(s, keel_map_keys), kafka_clean(s, kafka_map_keys)))
            .collect();
        let sum = |f: &dyn Fn(&(Section, CleanCost, CleanCost)) -> f64| partitions.iter().map(f).sum::<f64>();
        let keel_bytes_read = sum(&|p| p.1.bytes_read);
        let kafka_bytes_read = sum(&|p| p.2.bytes_read);
        let keel_bytes_written = sum(&|p| p.1.bytes_written);
        let mean_record = sum(&|p| p.0.bytes()) / sum(&|p| p.0.clean + p.0.dirty).max(1.0);
        let groups = (budget.threads.max(1) as f64) * budget.segment_bytes as f64;
        let at_budget = |bytes: f64| budget.io_bytes_per_sec.map(|b| bytes / b.max(1) as f64);
        TopicPlan {
            keel_map_keys,
            kafka_map_keys,
            keel_bytes_read,
            kafka_bytes_read,
            keel_bytes_written,
            keel_seconds: at_budget(keel_bytes_read),
            kafka_seconds: at_budget(kafka_bytes_read),
            compacted_bytes: live_keys * mean_record,
            peak_bytes: sum(&|p| p.0.bytes()) + groups,
            partitions,
        }
    }

    /// Disk to provision beyond the compacted size.
    pub fn headroom_bytes(&self) -> f64 {
        (self.peak_bytes - self.compacted_bytes).max(0.0)
    }

    /// In steady state with `updates_per_sec`: the share of the I/O
    /// budget the cleaner needs to keep up (over 1.0: it falls behind).
    pub fn budget_share(&self, w: &Workload, budget: &CleanerBudget) -> Option<f64> {
        let updates = w.updates_per_sec.filter(|u| *u > 0.0)?;
        let io = budget.io_bytes_per_sec? as f64;
        let dirty: f64 = self.partitions.iter().map(|p| p.0.dirty).sum();
        let cycle_s = dirty / updates;
        Some(self.keel_bytes_read / cycle_s / io)
    }
}

/// What a scan of one partition's segment files finds.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionScan {
    pub records: u64,
    pub bytes: u64,
    /// Records the cleaner has cleaned (its checkpoint).
    pub clean_records: u64,
    /// Records of the active (last) segment, which no pass touches.
    pub active_records: u64,
    /// Estimated distinct keys: all, in the clean part, in the dirty part.
    pub keys: f64,
    pub clean_keys: f64,
    pub dirty_keys: f64,
    pub segments: usize,
}

impl PartitionScan {
    /// The section a clean of the sealed dirty part would start from.
    pub fn section(&self) -> Section {
        let dirty = (self.records - self.clean_records - self.active_records) as f64;
        Section {
            clean: self.clean_records as f64,
            dirty,
            dirty_keys: self.dirty_keys.min(dirty),
            fresh: 0.0,
            superseded_clean: (self.clean_keys + self.dirty_keys - self.keys)
                .clamp(0.0, self.clean_records as f64),
            record_bytes: if self.records == 0 {
                0.0
            } else {
                self.bytes as f64 / self.records as f64
            },
        }
    }
}

/// Where a cold segment's copy is: its `.log` in one of `capacity_dirs`.
fn cold_copy(t: &TieredSegment, capacity_dirs: &[PathBuf]) -> io::Result<PathBuf> {
    if t.tier != Tier::Capacity {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "segment {} is in the object store, which a scan does not read",
                t.base_offset
            ),
        ));
    }
    let name = format!("{}.log", t.object);
    capacity_dirs
        .iter()
        .map(|d| d.join(&name))
        .find(|p| p.exists())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "segment {} is in the capacity tier as {name}, in none of the capacity dirs given ({})",
                    t.base_offset,
                    capacity_dirs
                        .iter()
                        .map(|d| d.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })
}

type KeyCounter = HyperLogLogPlus<[u8], BuildHasherDefault<DefaultHasher>>;

fn key_counter() -> io::Result<KeyCounter> {
    // Precision 14: 16 Ki registers, about 0.8 % standard error.
    HyperLogLogPlus::new(14, BuildHasherDefault::default()).map_err(|e| io::Error::other(format!("{e:?}")))
}

/// Reads every segment of the partition directory `dir` and, for the
/// segments whose only copy is in the capacity tier, their copies in
/// `capacity_dirs` (read-only; the broker may be running), counting records
/// and estimating distinct keys, split at the cleaner's checkpoint. A
/// segment the cleaner replaces meanwhile is skipped. Every batch's CRC is
/// checked.
pub fn scan_partition(dir: &Path, capacity_dirs: &[PathBuf]) -> io::Result<PartitionScan> {
    let storage = DiskStorage;
    let checkpoint = Checkpoint::read(&storage, dir)?.unwrap_or_default();
    let mut logs: Vec<(i64, PathBuf)> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let base = name.strip_suffix(".log")?.parse::<i64>().ok()?;
            Some((base, e.path()))
        })
        .collect();
    let local = logs.len();
    for t in read_manifest(&storage, dir)?.iter().filter(|t| t.is_cold()) {
        logs.push((t.base_offset, cold_copy(t, capacity_dirs)?));
    }
    // Cold segments are below the local ones: the last is the active one.
    logs.sort();
    let mut scan = PartitionScan {
        records: 0,
        bytes: 0,
        clean_records: 0,
        active_records: 0,
        keys: 0.0,
        clean_keys: 0.0,
        dirty_keys: 0.0,
        segments: logs.len(),
    };
    let (mut all, mut clean, mut dirty) = (key_counter()?, key_counter()?, key_counter()?);
    for (i, (_, path)) in logs.iter().enumerate() {
        let data = match std::fs::read(path) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let active = local > 0 && i + 1 == logs.len();
        let mut pos = 0usize;
        while data.len() - pos >= BATCH_HEADER_LEN {
            let Ok(h) = BatchHeader::parse(&data[pos..]) else {
                break;
            };
            let Some(batch) = data.get(pos..pos + h.total_len()) else {
                break;
            };
            check_crc(batch, &h).map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display()))
            })?;
            pos += h.total_len();
            scan.bytes += batch.len() as u64;
            if h.is_control() {
                continue;
            }
            let section = records_section(batch, &h).map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display()))
            })?;
            for r in records_in(&section) {
                let r = r.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                let offset = h.base_offset + r.offset_delta;
                scan.records += 1;
                let is_clean = offset < checkpoint.clean_end
                    || (checkpoint.suffix_start..checkpoint.suffix_end).contains(&offset);
                if active {
                    scan.active_records += 1;
                } else if is_clean {
                    scan.clean_records += 1;
                }
                let Some(key) = r.key else { continue };
                all.insert(key);
                if is_clean {
                    clean.insert(key);
                } else if !active {
                    dirty.insert(key);
                }
            }
        }
    }
    scan.keys = all.count();
    scan.clean_keys = clean.count();
    scan.dirty_keys = dirty.count();
    Ok(scan)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(map_bytes: u64) -> CleanerBudget {
        CleanerBudget {
            dedupe_buffer_bytes: map_bytes,
            threads: 1,
            io_bytes_per_sec: Some(50 << 20),
            segment_bytes: 1 << 30,
        }
    }

    /// The 003 article: 1.6 billion keys of about 5 kB in 8 partitions, a
    /// bulk load half uncleaned (dirty ratio 0.5) then a full republish.
    fn tickets(partitions: u32) -> Workload {
        Workload {
            keys: 1.6e9,
            partitions,
            record_bytes: 5_000.0,
            shape: Shape::Republish { uncleaned: 0.5 },
            dirty_ratio: 0.5,
            updates_per_sec: None,
        }
    }

    #[test]
    fn the_articles_numbers_come_out() {
        let s = tickets(8).section();
        assert_eq!((s.dirty, s.dirty_keys), (300e6, 200e6));
        // Kafka at 128 MiB: 5.0 M keys a pass (the article, without the
        // load factor: 5.59 M and 54 passes), the first 100 M records
        // reclaim nothing.
        let b = budget(128 << 20);
        assert_eq!(b.kafka_map_keys(), 5_033_164);
        let kafka = kafka_clean(&s, b.kafka_map_keys());
        assert_eq!(kafka.passes, 60);
        assert_eq!(kafka.barren_passes, 19);
        // Keel at 128 MiB: 8.4 M keys a pass, every one reclaiming.
        let keel = keel_clean(&s, b.keel_map_keys());
        assert_eq!(b.keel_map_keys(), 8_388_607);
        assert_eq!((keel.passes, keel.barren_passes), (24, 0));
        // Both end at one record per key.
        for cost in [&keel, &kafka] {
            assert!((cost.bytes_after - 200e6 * 5_000.0).abs() < 1e6, "{cost:?}");
        }
        // 60 partitions and a 1 GiB map: one pass each for Kafka, as the
        // article's author sized it.
        let s = tickets(60).section();
        let b = budget(1 << 30);
        assert_eq!(kafka_clean(&s, b.kafka_map_keys()).passes, 1);
        assert_eq!(keel_clean(&s, b.keel_map_keys()).passes, 1);
        assert_eq!(keel_clean(&s, budget(128 << 20).keel_map_keys()).passes, 4);
    }

    #[test]
    fn a_map_that_holds_every_key_cleans_in_one_pass() {
        let w = Workload {
            keys: 1e6,
            partitions: 1,
            record_bytes: 100.0,
            shape: Shape::Steady,
            dirty_ratio: 0.5,
            updates_per_sec: Some(1_000.0),
        };
        let s = w.section();
        // Half the log dirty: 1 M updates over 1 M keys touch 63 % of them.
        assert!((s.dirty_keys / 1e6 - 0.632).abs() < 0.001, "{s:?}");
        let plan = TopicPlan::new(&[s], w.keys, &budget(128 << 20));
        let (_, keel, kafka) = &plan.partitions[0];
        assert_eq!((keel.passes, kafka.passes), (1, 1));
        assert_eq!(keel.bytes_reclaimed, kafka.bytes_reclaimed);
        assert!((keel.bytes_after - 1e8).abs() < 1.0, "{keel:?}");
        // Peak: 2 M records (ratio 0.5) plus one group beside them.
        assert!((plan.peak_bytes - (2e8 + (1u64 << 30) as f64)).abs() < 1.0);
        // 1,000 updates/s fill the dirty part in 1,000 s; the pass reads
        // 2 M + 1 M records = 300 MB of the 50 GiB that allows.
        let share = plan.budget_share(&w, &budget(128 << 20)).unwrap();
        assert!(
            (share - 3e8 / 1_000.0 / (50u64 << 20) as f64).abs() < 1e-9,
            "{share}"
        );
    }

    #[test]
    fn every_keel_pass_reclaims_and_passes_shrink_the_log() {
        let s = tickets(8).section();
        let keel = keel_clean(&s, 10_000_000);
        assert_eq!(keel.passes, 20);
        assert!(keel.reclaimed_per_pass.iter().all(|r| *r > 0.0));
        let total: f64 = keel.reclaimed_per_pass.iter().sum();
        assert!((total - s.removable() * s.record_bytes).abs() < 1.0);
    }
}
