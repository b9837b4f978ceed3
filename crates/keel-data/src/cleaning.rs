//! One partition's cleaning as `/stats` shows it. The cleaner updates it;
//! the partition carries it.

use keel_log::clean::{Assessment, Skip};

/// One partition's cleaning, for `/stats`.
#[derive(Debug, Clone, Default)]
pub struct Cleaning {
    pub passes: u64,
    pub failed_passes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub bytes_reclaimed: u64,
    pub records_removed: u64,
    /// At the last assessment or pass.
    pub dirty_ratio: f64,
    pub dirty_bytes: u64,
    pub cleanable_bytes: u64,
    /// Keys in the map of the last pass, and their share of what the
    /// thread's map holds at its full budget.
    pub map_keys: u64,
    pub map_fill: f64,
    /// When the last pass ended (wall clock, ms) and how long it took.
    pub last_pass_ms: Option<i64>,
    pub last_pass_duration_ms: u64,
    /// Where the cleaner stands: everything below is clean.
    pub clean_end: Option<i64>,
    /// Why the partition is not cleanable now.
    pub not_cleanable: Option<String>,
    pub last_error: Option<String>,
    /// A pass failed: the partition is left alone until the broker
    /// restarts (Kafka's uncleanable partitions), so a damaged batch does
    /// not cost a read of the dirty section every backoff.
    pub uncleanable: bool,
    /// A pass failed reading or writing a colder tier (an object store
    /// that did not answer): the partition is cleanable again from then
    /// (wall clock, ms), not left alone until restart.
    pub retry_at_ms: Option<i64>,
}

impl Cleaning {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "passes": self.passes,
            "failed_passes": self.failed_passes,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "bytes_reclaimed": self.bytes_reclaimed,
            "records_removed": self.records_removed,
            "dirty_ratio": self.dirty_ratio,
            "dirty_bytes": self.dirty_bytes,
            "cleanable_bytes": self.cleanable_bytes,
            "map_keys": self.map_keys,
            "map_fill": self.map_fill,
            "last_pass_ms": self.last_pass_ms,
            "last_pass_duration_ms": self.last_pass_duration_ms,
            "clean_end": self.clean_end,
            "not_cleanable": self.not_cleanable,
            "last_error": self.last_error,
            "uncleanable": self.uncleanable,
            "retry_at_ms": self.retry_at_ms,
        })
    }

    /// What an assessment of the partition found.
    pub fn assessed(&mut self, a: &Assessment) {
        self.dirty_ratio = a.dirty_ratio;
        self.dirty_bytes = a.dirty_bytes;
        self.cleanable_bytes = a.cleanable_bytes;
        self.not_cleanable = None;
    }

    /// Why a pass left the partition alone.
    pub fn skipped(&mut self, skip: &Skip) {
        if let Skip::BelowDirtyRatio(r) = skip {
            self.dirty_ratio = *r;
        }
        self.not_cleanable = Some(skip.to_string());
    }
}
