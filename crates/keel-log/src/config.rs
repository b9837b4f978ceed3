//! Per-partition log settings, named after Kafka's topic configs.

/// Settings of one partition log. `Default` gives Kafka's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// `segment.bytes`: roll when the active segment would exceed this.
    pub segment_bytes: u64,
    /// `segment.ms`: roll when the incoming data is this much newer than the
    /// active segment's first batch.
    pub segment_ms: i64,
    /// `index.interval.bytes`: bytes of log between two index entries.
    pub index_interval_bytes: u64,
    /// `segment.index.bytes`: roll before an index file would exceed this.
    pub segment_index_bytes: u64,
    /// `retention.bytes`: -1 = unlimited.
    pub retention_bytes: i64,
    /// `retention.ms`: -1 = unlimited.
    pub retention_ms: i64,
    /// `flush.messages`: fsync after this many records; `u64::MAX` = never.
    pub flush_messages: u64,
    /// `flush.ms`: see [`crate::PartitionLog::needs_time_flush`].
    pub flush_ms: i64,
    /// `file.delete.delay.ms`: how long a deleted segment's file stays
    /// readable by reads planned before the deletion.
    pub file_delete_delay_ms: u64,
    /// How read plans read segment files (`keel.io.direct`).
    pub read_io: ReadIo,
    /// `cleanup.policy`: whether retention deletes segments and whether the
    /// cleaner compacts them.
    pub cleanup: CleanupPolicy,
}

/// Kafka's `cleanup.policy`, a list of `delete` and `compact`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CleanupPolicy {
    /// `delete`: `retention.ms` and `retention.bytes` delete old segments.
    /// Without it nothing is deleted by age or size.
    pub delete: bool,
    /// `compact`: the cleaner keeps the latest record of every key.
    pub compact: bool,
}

impl CleanupPolicy {
    pub const DELETE: CleanupPolicy = CleanupPolicy {
        delete: true,
        compact: false,
    };

    /// Parses Kafka's list form (`delete`, `compact`, `compact,delete`).
    pub fn parse(value: &str) -> Result<CleanupPolicy, String> {
        let mut policy = CleanupPolicy {
            delete: false,
            compact: false,
        };
        for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match item {
                "delete" => policy.delete = true,
                "compact" => policy.compact = true,
                other => return Err(format!("`{other}` is not a cleanup policy (delete, compact)")),
            }
        }
        Ok(policy)
    }
}

/// How read plans read segment data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadIo {
    /// Positional reads through the page cache.
    #[default]
    Buffered,
    /// O_DIRECT reads into aligned buffers: segment data read back never
    /// enters the page cache. Falls back to `BufferedDontNeed` for a read
    /// whose file refuses O_DIRECT.
    Direct,
    /// Positional reads, then `posix_fadvise(DONTNEED)` on the range read,
    /// for filesystems without O_DIRECT (tmpfs, some overlays).
    BufferedDontNeed,
}

const DAY_MS: i64 = 24 * 60 * 60 * 1000;

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: 1 << 30,
            segment_ms: 7 * DAY_MS,
            index_interval_bytes: 4096,
            segment_index_bytes: 10 * 1024 * 1024,
            retention_bytes: -1,
            retention_ms: 7 * DAY_MS,
            flush_messages: u64::MAX,
            flush_ms: i64::MAX,
            file_delete_delay_ms: 60_000,
            read_io: ReadIo::Buffered,
            cleanup: CleanupPolicy::DELETE,
        }
    }
}

impl LogConfig {
    /// Rejects values Kafka's format cannot represent (positions are int32).
    pub fn check(&self) -> Result<(), &'static str> {
        if self.segment_bytes == 0 || self.segment_bytes > i32::MAX as u64 {
            return Err("segment_bytes must be in 1..=i32::MAX");
        }
        if self.segment_index_bytes < 12 {
            return Err("segment_index_bytes must hold at least one entry");
        }
        if self.segment_ms <= 0 {
            return Err("segment_ms must be positive");
        }
        Ok(())
    }
}
