//! The broker's metrics in Prometheus' text format (`GET /metrics` on the
//! admin endpoint), and the slow-request log.
//!
//! Two kinds of metric: those requests feed as they finish (per-API, per-
//! stage latency histograms, request and byte counters, connections),
//! kept in a registry here; and the state the broker already counts (tail
//! cache, cold reads, tiers, the mover, the cleaner, groups, partitions),
//! read afresh at every scrape from the same counters `/stats` reports.
//! docs/metrics.md maps each name to Kafka's JMX metrics.

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
use keel_data::topics::TopicStore;
use keel_tier::{LiveLatency, LiveOp};

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
    /// none), in these metrics and, for the live path (produce, a fetch
    /// answered from the tail cache), in `live`; and logs it if it was
    /// slow (naming its segment files as `store` places them).
    pub fn finish(&self, trace: &RequestTrace, store: &TopicStore, live: &LiveLatency) {
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
        if let Some(op) = live_op(trace.api_key, &summary) {
            live.record(op, total.saturating_sub(waited));
        }
        if self
            .slow()
            .is_some_and(|slow| total.saturating_sub(waited) >= slow)
        {
            self.slow_requests.inc();
            tracing::warn!(target: "keel::slow_request", "{}", slow_request_json(trace, &summary, store));
        }
    }

    /// The request metrics and `state` (the broker's levels and counters
    /// read now), in the Prometheus / OpenMetrics text format.
    pub fn encode(&self, state: &Registry) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = encode_registry(&mut text, &self.registry);
        let _ = encode_registry(&mut text, state);
        let _ = encode_eof(&mut text);
        text
    }
}

/// What of the live path a request was: every produce, and a fetch that
/// returned records, all of them from the tail cache (a fetch's partition
/// traces name only partitions that returned records or read below the
/// tail).
fn live_op(api_key: i16, summary: &TraceSummary) -> Option<LiveOp> {
    match ApiKey::try_from(api_key) {
        Ok(ApiKey::Produce) => Some(LiveOp::Produce),
        Ok(ApiKey::Fetch)
            if !summary.partitions.is_empty()
                && summary.untraced_partitions == 0
                && summary
                    .partitions
                    .iter()
                    .all(|p| p.source == Stage::ReadCache.name()) =>
        {
            Some(LiveOp::TailFetch)
        }
        _ => None,
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
