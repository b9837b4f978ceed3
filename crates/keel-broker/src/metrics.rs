//! The broker's metrics in Prometheus' text format (`GET /metrics` on the
//! admin endpoint), and the slow-request log.
//!
//! Two kinds of metric: those requests feed as they finish (per-API, per-
//! stage latency histograms, request and byte counters, connections),
//! kept in a registry here; and the state the broker already counts (tail
//! cache, cold reads, tiers, the mover, the cleaner, groups, partitions),
//! read afresh at every scrape from the same counters `/stats` reports.
//! docs/metrics.md maps each name to Kafka's JMX metrics.

use keel_tier::IoClass;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use keel_protocol::messages::ApiKey;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::trace::{Place, RequestTrace, Stage, TraceSummary};
use crate::Broker;
use keel_data::topics::TopicStore;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StageLabels {
    api: &'static str,
    stage: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ApiLabels {
    api: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct SourceLabels {
    source: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct IoLabels {
    class: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TierLabels {
    tier: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PartitionLabels {
    topic: String,
    partition: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct QuotaLabels {
    quota: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ListenerLabels {
    listener: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct MechanismLabels {
    listener: String,
    mechanism: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DirLabels {
    dir: String,
}

/// Request metrics and the slow-request threshold.
pub struct Metrics {
    registry: Registry,
    stages: Family<StageLabels, Histogram>,
    requests: Family<ApiLabels, Counter>,
    bytes_in: Counter,
    bytes_out: Family<SourceLabels, Counter>,
    connections: Gauge,
    connections_accepted: Counter,
    authentication_failures: Family<ListenerLabels, Counter>,
    authentications: Family<MechanismLabels, Counter>,
    expired_sessions: Family<ListenerLabels, Counter>,
    slow_requests: Counter,
    quota_throttled: Family<QuotaLabels, Counter>,
    quota_throttle_ms: Family<QuotaLabels, Counter>,
    /// `keel.request.slow.ms` in microseconds (dynamic; `u64::MAX`: off):
    /// requests at least this slow (not counting a fetch's long-poll wait)
    /// are logged.
    slow_us: AtomicU64,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").field("slow", &self.slow()).finish()
    }
}

/// Histogram buckets for stage times: 50 µs doubling to about 26 s.
fn stage_buckets() -> Histogram {
    Histogram::new(exponential_buckets(50e-6, 2.0, 20))
}

impl Metrics {
    fn slow_us(slow: Option<Duration>) -> u64 {
        slow.map_or(u64::MAX, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX - 1))
    }

    /// The slow-request log's threshold, if on.
    pub fn slow(&self) -> Option<Duration> {
        match self.slow_us.load(Relaxed) {
            u64::MAX => None,
            us => Some(Duration::from_micros(us)),
        }
    }

    /// Changes the slow-request log's threshold (`keel.request.slow.ms`).
    pub fn set_slow(&self, slow: Option<Duration>) {
        self.slow_us.store(Self::slow_us(slow), Relaxed);
    }

    pub fn new(slow: Option<Duration>) -> Metrics {
        let mut registry = Registry::default();
        let stages =
            Family::<StageLabels, Histogram>::new_with_constructor(stage_buckets as fn() -> Histogram);
        registry.register(
            "keel_request_stage_seconds",
            "Time requests spent in each stage, by API (stage total: arrival to response sent)",
            stages.clone(),
        );
        let requests = Family::<ApiLabels, Counter>::default();
        registry.register("keel_requests", "Requests answered, by API", requests.clone());
        let bytes_in = Counter::default();
        registry.register(
            "keel_bytes_in",
            "Record bytes appended by Produce requests",
            bytes_in.clone(),
        );
        let bytes_out = Family::<SourceLabels, Counter>::default();
        for stage in [
            Stage::ReadCache,
            Stage::ReadAhead,
            Stage::ReadLocal,
            Stage::ReadCapacity,
            Stage::ReadRemote,
        ] {
            let _ = bytes_out.get_or_create(&SourceLabels { source: stage.name() });
        }
        registry.register(
            "keel_bytes_out",
            "Record bytes returned by Fetch requests, by where they were read from",
            bytes_out.clone(),
        );
        let connections = Gauge::default();
        registry.register(
            "keel_connections",
            "Client connections open now",
            connections.clone(),
        );
        let connections_accepted = Counter::default();
        registry.register(
            "keel_connections_accepted",
            "Client connections accepted",
            connections_accepted.clone(),
        );
        let authentication_failures = Family::<ListenerLabels, Counter>::default();
        registry.register(
            "keel_authentication_failures",
            "Connections refused in authentication (a failed TLS handshake, a client certificate no rule maps, a failed SASL exchange), by listener",
            authentication_failures.clone(),
        );
        let authentications = Family::<MechanismLabels, Counter>::default();
        registry.register(
            "keel_sasl_authentications",
            "Successful SASL authentications and re-authentications, by listener and mechanism",
            authentications.clone(),
        );
        let expired_sessions = Family::<ListenerLabels, Counter>::default();
        registry.register(
            "keel_sasl_expired_sessions_closed",
            "Connections closed because their SASL session outlived connections.max.reauth.ms without re-authentication, by listener",
            expired_sessions.clone(),
        );
        let slow_requests = Counter::default();
        registry.register(
            "keel_slow_requests",
            "Requests at or over keel.request.slow.ms (each logged)",
            slow_requests.clone(),
        );
        let quota_throttled = Family::<QuotaLabels, Counter>::default();
        registry.register(
            "keel_quota_throttled",
            "Responses (connections, for connection_creation_rate) a client quota throttled, by quota key",
            quota_throttled.clone(),
        );
        let quota_throttle_ms = Family::<QuotaLabels, Counter>::default();
        registry.register(
            "keel_quota_throttle_ms",
            "Throttle time client quotas gave, in ms, by quota key",
            quota_throttle_ms.clone(),
        );
        Metrics {
            registry,
            stages,
            requests,
            bytes_in,
            bytes_out,
            connections,
            connections_accepted,
            authentication_failures,
            authentications,
            expired_sessions,
            slow_requests,
            quota_throttled,
            quota_throttle_ms,
            slow_us: AtomicU64::new(Self::slow_us(slow)),
        }
    }

    pub fn connection_opened(&self) {
        self.connections.inc();
        self.connections_accepted.inc();
    }

    /// A response or connection the client quota `quota` throttled for
    /// `ms`.
    pub fn quota_throttled(&self, quota: &'static str, ms: u64) {
        let labels = QuotaLabels { quota };
        self.quota_throttled.get_or_create(&labels).inc();
        self.quota_throttle_ms.get_or_create(&labels).inc_by(ms);
    }

    /// A connection on `listener` refused in authentication.
    pub fn authentication_failed(&self, listener: &str) {
        let labels = ListenerLabels {
            listener: listener.to_string(),
        };
        self.authentication_failures.get_or_create(&labels).inc();
    }

    /// A SASL exchange on `listener` that succeeded.
    pub fn authenticated(&self, listener: &str, mechanism: &'static str) {
        let labels = MechanismLabels {
            listener: listener.to_string(),
            mechanism,
        };
        self.authentications.get_or_create(&labels).inc();
    }

    /// A connection on `listener` closed because its SASL session expired.
    pub fn session_expired(&self, listener: &str) {
        let labels = ListenerLabels {
            listener: listener.to_string(),
        };
        self.expired_sessions.get_or_create(&labels).inc();
    }

    pub fn connection_closed(&self) {
        self.connections.dec();
    }

    /// Records a request whose response has been sent (or that needed
    /// none), and logs it if it was slow (naming its segment files as
    /// `store` places them).
    pub fn finish(&self, trace: &RequestTrace, store: &TopicStore) {
        let total = trace.started.elapsed();
        trace.add(Stage::Total, total);
        let summary = trace.take_summary();
        let api = api_name(trace.api_key);
        self.requests.get_or_create(&ApiLabels { api }).inc();
        for &(stage, d) in &summary.stages {
            self.stages
                .get_or_create(&StageLabels {
                    api,
                    stage: stage.name(),
                })
                .observe(d.as_secs_f64());
        }
        for p in &summary.partitions {
            if p.source == APPEND {
                self.bytes_in.inc_by(p.bytes);
            } else {
                self.bytes_out
                    .get_or_create(&SourceLabels { source: p.source })
                    .inc_by(p.bytes);
            }
        }
        // A fetch's long poll is waiting the client asked for, not slowness.
        let waited = summary
            .stages
            .iter()
            .find(|(s, _)| *s == Stage::Wait)
            .map_or(Duration::ZERO, |(_, d)| *d);
        if self
            .slow()
            .is_some_and(|slow| total.saturating_sub(waited) >= slow)
        {
            self.slow_requests.inc();
            tracing::warn!(target: "keel::slow_request", "{}", slow_request_json(trace, &summary, store));
        }
    }

    /// Everything, in the Prometheus / OpenMetrics text format. Reads each
    /// partition's page-cache residency: call it on a blocking thread.
    pub fn encode(&self, broker: &Broker) -> String {
        let mut text = String::new();
        let state = state_registry(broker);
        // Writing to a String cannot fail.
        let _ = encode_registry(&mut text, &self.registry);
        let _ = encode_registry(&mut text, &state);
        let _ = encode_eof(&mut text);
        text
    }
}

/// The source a produce's partition trace carries.
pub const APPEND: &str = "append";

/// Kafka's name of an API (`Produce`, `Fetch`, ...), as its request
/// metrics label it.
pub fn api_name(key: i16) -> &'static str {
    const UNKNOWN: &str = "Unknown";
    // Indexed by API key; the names are made once.
    static NAMES: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    let names = NAMES.get_or_init(|| {
        (0..=i16::from(u8::MAX))
            .map(|k| ApiKey::try_from(k).map_or(UNKNOWN, |api| &*format!("{api:?}").leak()))
            .collect()
    });
    usize::try_from(key)
        .ok()
        .and_then(|k| names.get(k).copied())
        .unwrap_or(UNKNOWN)
}

/// A slow request as one JSON line: who sent it, what it was, where its
/// time went and which files and positions it wrote or read.
fn slow_request_json(trace: &RequestTrace, summary: &TraceSummary, store: &TopicStore) -> serde_json::Value {
    let ms = |d: Duration| (d.as_secs_f64() * 1e6).round() / 1e3;
    let stages: serde_json::Map<String, serde_json::Value> = summary
        .stages
        .iter()
        .map(|&(s, d)| (s.name().to_string(), ms(d).into()))
        .collect();
    let partitions: Vec<serde_json::Value> = summary
        .partitions
        .iter()
        .map(|p| {
            let stages: serde_json::Map<String, serde_json::Value> = p
                .stages
                .iter()
                .map(|&(s, d)| (s.name().to_string(), ms(d).into()))
                .collect();
            let (file, position) = match &p.place {
                Some(Place::Segment {
                    base_offset,
                    position,
                }) => {
                    let dir = store.partition_dir(&p.topic, p.partition);
                    (
                        Some(keel_log::log_path(&dir, *base_offset).display().to_string()),
                        Some(*position),
                    )
                }
                Some(Place::Named { name, position }) => (Some(name.clone()), *position),
                None => (None, None),
            };
            serde_json::json!({
                "topic": &*p.topic,
                "partition": p.partition,
                "bytes": p.bytes,
                "source": p.source,
                "file": file,
                "position": position,
                "stages_ms": stages,
            })
        })
        .collect();
    serde_json::json!({
        "slow_request": true,
        "api": api_name(trace.api_key),
        "api_version": trace.api_version,
        "correlation_id": trace.correlation_id,
        "client_id": summary.client_id,
        "client_address": trace.peer.to_string(),
        "total_ms": stages.get("total").cloned().unwrap_or_default(),
        "stages_ms": stages,
        "bytes": summary.partitions.iter().map(|p| p.bytes).sum::<u64>(),
        "partitions": partitions,
        "untraced_partitions": summary.untraced_partitions,
    })
}

/// The broker's own counters and levels, read now.
fn state_registry(broker: &Broker) -> Registry {
    let mut r = Registry::default();
    register_levels(&mut r, broker);
    register_counters(&mut r, broker);
    register_io(&mut r, broker);
    register_groups(&mut r, broker);
    register_partitions(&mut r, broker);
    let dirs = Family::<DirLabels, Gauge>::default();
    dirs.get_or_create(&DirLabels {
        dir: broker.data.dir_health.path().display().to_string(),
    })
    .set(i64::from(broker.data.dir_health.is_offline()));
    r.register("keel_log_dir_offline", "1 if the log dir is offline", dirs);
    r
}

/// The tail cache's, cold reads' and the mover's levels.
fn register_levels(r: &mut Registry, broker: &Broker) {
    let t = broker.data.tail_cache.stats();
    let c = broker.data.cold.stats();
    let m = &broker.data.mover;
    let gauges: [(&str, &str, f64); 9] = [
        (
            "keel_tail_cache_budget_bytes",
            "Tail cache budget",
            t.budget_bytes as f64,
        ),
        (
            "keel_tail_cache_used_bytes",
            "Bytes in the tail cache",
            t.used_bytes as f64,
        ),
        (
            "keel_tail_cache_batches",
            "Batches in the tail cache",
            t.cached_batches as f64,
        ),
        (
            "keel_cold_read_queue_depth",
            "Cold reads waiting for a slot or for budget",
            c.queue_depth as f64,
        ),
        (
            "keel_cold_read_budget_bytes_per_second",
            "keel.cold.read.bytes.per.sec (0: unlimited)",
            c.budget_bytes_per_sec as f64,
        ),
        (
            "keel_read_ahead_held_bytes",
            "Bytes read ahead and held",
            c.read_ahead_held_bytes as f64,
        ),
        (
            "keel_mover_fast_bytes",
            "Bytes in the fast (local) tier",
            m.fast_bytes.load(Relaxed) as f64,
        ),
        (
            "keel_mover_fast_max_bytes",
            "The fast tier's budget (keel.tier.fast.max.bytes, -1: none)",
            m.fast_max_bytes() as f64,
        ),
        (
            "keel_mover_move_bytes_per_second",
            "keel.tier.move.bytes.per.sec",
            broker.data.io.budget(IoClass::TierMove).bytes_per_sec() as f64,
        ),
    ];
    for (name, help, value) in gauges {
        let g = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        g.set(value);
        r.register(name, help, g);
    }
}

/// What the tail cache, cold reads, the tiers, the mover and the cleaner
/// have done since start-up.
fn register_counters(r: &mut Registry, broker: &Broker) {
    let counters = read_counters(broker).into_iter().chain(tier_counters(broker));
    let c = broker.data.cold.stats();
    for (name, help, value) in counters {
        let c = Counter::<u64>::default();
        c.inc_by(value);
        r.register(name, help, c);
    }
    let seconds: [(&str, &str, u64); 2] = [
        (
            "keel_cold_read_wait_seconds",
            "Time cold reads waited before their I/O started",
            c.wait_us_total,
        ),
        (
            "keel_cold_read_throttled_seconds",
            "Time cold reads waited for the byte budget alone",
            c.throttled_us_total,
        ),
    ];
    for (name, help, micros) in seconds {
        let c = Counter::<f64, std::sync::atomic::AtomicU64>::default();
        c.inc_by(Duration::from_micros(micros).as_secs_f64());
        r.register(name, help, c);
    }
}

/// The tail cache's and cold reads' counters: name, help, value.
fn read_counters(broker: &Broker) -> Vec<(&'static str, &'static str, u64)> {
    let t = broker.data.tail_cache.stats();
    let c = broker.data.cold.stats();
    vec![
        (
            "keel_tail_cache_inserted_bytes",
            "Bytes put in the tail cache",
            t.inserted_bytes,
        ),
        (
            "keel_tail_cache_evicted_bytes",
            "Bytes evicted from the tail cache",
            t.evicted_bytes,
        ),
        (
            "keel_tail_cache_hit_reads",
            "Fetch reads answered from the tail cache",
            t.hit_reads,
        ),
        (
            "keel_tail_cache_hit_bytes",
            "Bytes answered from the tail cache",
            t.hit_bytes,
        ),
        (
            "keel_tail_cache_miss_reads",
            "Fetch reads the tail cache could not answer",
            t.miss_reads,
        ),
        (
            "keel_cold_reads",
            "Reads of log files on the cold-read executor",
            c.reads,
        ),
        ("keel_cold_read_bytes", "Bytes cold reads returned", c.bytes),
        (
            "keel_cold_read_disk_bytes",
            "Bytes cold reads took from the disk",
            c.disk_bytes,
        ),
        (
            "keel_read_ahead_hits",
            "Fetches answered by a read-ahead",
            c.read_ahead_hits,
        ),
    ]
}

/// The colder tiers', the mover's and the cleaner's counters.
fn tier_counters(broker: &Broker) -> Vec<(&'static str, &'static str, u64)> {
    let s = broker.data.tiers.stats();
    let (m, cl) = (&broker.data.mover, &broker.data.cleaner);
    vec![
        ("keel_tier_copies", "Segments copied to a colder tier", s.copies),
        (
            "keel_tier_copied_bytes",
            "Bytes copied to colder tiers",
            s.copied_bytes,
        ),
        (
            "keel_tier_copy_failures",
            "Failed copies to a colder tier",
            s.copy_failures,
        ),
        ("keel_tier_reads", "Reads of colder tiers", s.reads),
        (
            "keel_tier_read_bytes",
            "Bytes read from colder tiers",
            s.read_bytes,
        ),
        (
            "keel_tier_read_failures",
            "Failed reads of colder tiers",
            s.read_failures,
        ),
        ("keel_tier_deletes", "Copies deleted from colder tiers", s.deletes),
        (
            "keel_mover_released_segments",
            "Local segments released after their colder copy",
            m.released_segments.load(Relaxed),
        ),
        (
            "keel_mover_released_bytes",
            "Local bytes released",
            m.released_bytes.load(Relaxed),
        ),
        (
            "keel_mover_passes",
            "Mover passes finished, failed ones included",
            m.passes.load(Relaxed),
        ),
        (
            "keel_mover_failed_passes",
            "Mover passes that failed",
            m.failed_passes.load(Relaxed),
        ),
        (
            "keel_mover_partitions_set_aside",
            "Partitions mover passes left alone because their log was unavailable (once per pass)",
            m.partitions_set_aside.load(Relaxed),
        ),
        (
            "keel_cleaner_passes",
            "Compaction passes",
            cl.passes.load(Relaxed),
        ),
        (
            "keel_cleaner_failed_passes",
            "Compaction passes that failed",
            cl.failed_passes.load(Relaxed),
        ),
        (
            "keel_cleaner_read_bytes",
            "Bytes compaction read",
            cl.bytes_read.load(Relaxed),
        ),
        (
            "keel_cleaner_written_bytes",
            "Bytes compaction wrote",
            cl.bytes_written.load(Relaxed),
        ),
        (
            "keel_cleaner_reclaimed_bytes",
            "Bytes compaction reclaimed",
            cl.bytes_reclaimed.load(Relaxed),
        ),
    ]
}

/// Each I/O class's budget, bytes and time waited for its budget.
fn register_io(r: &mut Registry, broker: &Broker) {
    let budget = Family::<IoLabels, Gauge>::default();
    let bytes = Family::<IoLabels, Counter>::default();
    let throttled = Family::<IoLabels, Counter<f64, std::sync::atomic::AtomicU64>>::default();
    for stats in broker.data.io.stats() {
        let labels = IoLabels {
            class: stats.class.name(),
        };
        budget
            .get_or_create(&labels)
            .set(i64::try_from(stats.budget_bytes_per_sec).unwrap_or(i64::MAX));
        bytes.get_or_create(&labels).inc_by(stats.bytes);
        throttled
            .get_or_create(&labels)
            .inc_by(stats.throttled_us as f64 / 1e6);
    }
    r.register(
        "keel_io_budget_bytes_per_second",
        "An I/O class's byte budget (0: unlimited; the live path is never paced)",
        budget,
    );
    r.register(
        "keel_io_bytes",
        "Bytes an I/O class read or wrote (live: appended)",
        bytes,
    );
    r.register(
        "keel_io_throttled_seconds",
        "Time an I/O class waited for its byte budget",
        throttled,
    );
}

/// Groups by state.
fn register_groups(r: &mut Registry, broker: &Broker) {
    let groups = Family::<StateLabels, Gauge>::default();
    for state in [
        "Empty",
        "PreparingRebalance",
        "CompletingRebalance",
        "Stable",
        "Dead",
        "Reconciling",
    ] {
        let _ = groups.get_or_create(&StateLabels { state });
    }
    for (_, _, state) in broker.groups.list() {
        groups.get_or_create(&StateLabels { state: state.name() }).inc();
    }
    // Consumer-protocol groups (KIP-848) share Empty and Stable.
    for (_, state) in broker.groups.list_consumer() {
        groups.get_or_create(&StateLabels { state: state.name() }).inc();
    }
    r.register("keel_groups", "Consumer groups, by state", groups);
}

/// Each partition's size, offsets, page-cache residency and health, and
/// the bytes in each colder tier.
fn register_partitions(r: &mut Registry, broker: &Broker) {
    let tiers = Family::<TierLabels, Gauge>::default();
    for tier in [keel_log::Tier::Capacity, keel_log::Tier::Remote] {
        let _ = tiers.get_or_create(&TierLabels { tier: tier.name() });
    }
    let partitions_offline = Family::<PartitionLabels, Gauge>::default();
    let size = Family::<PartitionLabels, Gauge>::default();
    let end = Family::<PartitionLabels, Gauge>::default();
    let start = Family::<PartitionLabels, Gauge>::default();
    let resident = Family::<PartitionLabels, Gauge>::default();
    let mut resident_total = 0u64;
    for topic in broker.data.topics.all() {
        for p in &topic.partitions {
            let labels = PartitionLabels {
                topic: topic.meta.name.clone(),
                partition: p.index.to_string(),
            };
            let (in_cache, _) = p.page_cache_residency();
            resident_total += in_cache;
            resident.get_or_create(&labels).set(in_cache as i64);
            end.get_or_create(&labels).set(p.high_watermark());
            start.get_or_create(&labels).set(p.log_start_offset());
            partitions_offline
                .get_or_create(&labels)
                .set(i64::from(p.unavailable().is_some()));
            if let Some(reader) = p.reader() {
                size.get_or_create(&labels).set(reader.total_bytes() as i64);
                for t in reader.tiered_segments().iter().filter(|t| t.is_cold()) {
                    tiers
                        .get_or_create(&TierLabels { tier: t.tier.name() })
                        .inc_by(t.size_bytes as i64);
                }
            }
        }
    }
    r.register("keel_log_size_bytes", "A partition's bytes in every tier", size);
    r.register(
        "keel_log_end_offset",
        "A partition's log end offset (high watermark)",
        end,
    );
    r.register("keel_log_start_offset", "A partition's log start offset", start);
    r.register(
        "keel_partition_offline",
        "1 if the partition cannot serve",
        partitions_offline,
    );
    r.register(
        "keel_page_cache_resident_bytes",
        "A partition's segment bytes in the page cache",
        resident,
    );
    let all = Gauge::<i64>::default();
    all.set(resident_total as i64);
    r.register(
        "keel_page_cache_resident_bytes_all",
        "Segment bytes in the page cache, all partitions",
        all,
    );
    r.register(
        "keel_tier_bytes",
        "Bytes whose only copy is in a colder tier, by tier",
        tiers,
    );
}
