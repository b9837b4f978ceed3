//! What the data plane asks of the configuration in force: each topic's
//! log settings, tier policy and compaction from its overrides over the
//! broker's defaults. Dynamic configs change the answers, so the data plane
//! asks again each time it needs one and keeps none.

use std::collections::BTreeMap;

use keel_log::LogConfig;

/// A topic's or the broker's configs, as the data plane reads them.
pub trait Policies: Send + Sync {
    /// The log settings of a topic with `overrides`.
    fn log_config(&self, overrides: &BTreeMap<String, String>) -> Result<LogConfig, Refused>;
    /// Where a topic's sealed segments go, and how much stays local.
    fn tier_policy(&self, overrides: &BTreeMap<String, String>) -> TierPolicy;
    /// A topic's compaction settings.
    fn compaction(&self, overrides: &BTreeMap<String, String>) -> Result<Compaction, Refused>;
    /// `producer.id.expiration.ms`: how long an idle producer's state is
    /// kept.
    fn producer_expiration_ms(&self) -> i64;
}

/// A config value the data plane cannot use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub key: String,
    pub reason: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "config `{}`: {}", self.key, self.reason)
    }
}

impl std::error::Error for Refused {}

/// Where a topic's sealed segments are copied, and how much of its log
/// the fast tier keeps once they are (-1: no limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierPolicy {
    pub tier: Option<keel_log::Tier>,
    /// Whether the mover copies segments to `tier` (false once the topic's
    /// `remote.log.copy.disable` is set; the copies made stay readable).
    pub copy: bool,
    pub local_retention_bytes: i64,
    pub local_retention_ms: i64,
}

/// A topic's compaction settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Compaction {
    /// `cleanup.policy` includes `compact`.
    pub enabled: bool,
    pub min_cleanable_dirty_ratio: f64,
    pub min_compaction_lag_ms: i64,
    pub max_compaction_lag_ms: i64,
    pub delete_retention_ms: i64,
}

/// The log cleaner's broker-wide settings (`log.cleaner.*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanerSettings {
    pub enabled: bool,
    pub threads: usize,
    /// Shared by the threads: each one's key map gets an equal part.
    pub dedupe_buffer_bytes: usize,
    /// How much a pass reads at once.
    pub io_buffer_bytes: u64,
    /// 0: unlimited.
    pub io_bytes_per_sec: u64,
    /// How long a thread waits when no log needs cleaning.
    pub backoff_ms: u64,
}
