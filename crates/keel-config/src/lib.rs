//! Broker and topic configuration under Kafka's names.
//!
//! The broker's configuration is a flat map of Kafka-style keys (the server
//! merges defaults, the TOML file, `KEEL_*` variables and flags into it).
//! Topic configs are overrides of the broker's `log.*` defaults, exactly as
//! in Kafka: `retention.ms` on a topic overrides `log.retention.ms`.

pub mod kafka_configs;
pub mod listeners;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use keel_log::{CleanupPolicy, LogConfig};

use keel_coord::groups::group::GroupConfig;
use keel_coord::groups::CoordinatorConfig;
pub use keel_data::policy::{CleanerSettings, Compaction, TierPolicy};
use keel_data::policy::{Policies, Refused};

/// Kafka's config value types, as DescribeConfigs reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigType {
    Boolean = 1,
    String = 2,
    Int = 3,
    Short = 4,
    Long = 5,
    Double = 6,
    List = 7,
    Class = 8,
    /// Kafka's PASSWORD: described as sensitive, its value never shown.
    Password = 9,
}

/// A topic-level config Keel knows: its topic name, the broker default it
/// overrides (empty for a topic config with no broker synonym), that
/// default's value and its type.
#[derive(Debug, Clone, Copy)]
pub struct TopicConfigDef {
    pub name: &'static str,
    pub broker_name: &'static str,
    pub default: &'static str,
    pub kind: ConfigType,
}

const fn def(
    name: &'static str,
    broker_name: &'static str,
    default: &'static str,
    kind: ConfigType,
) -> TopicConfigDef {
    TopicConfigDef {
        name,
        broker_name,
        default,
        kind,
    }
}

const LONG_MAX: &str = "9223372036854775807";

/// Kafka's topic configs. Keel honours the storage ones (segment, index,
/// retention, flush, max.message.bytes) and the timestamp ones
/// (message.timestamp.*); the others are accepted and reported so that
/// tools and clients that set them keep working.
pub const TOPIC_CONFIGS: &[TopicConfigDef] = &[
    def("cleanup.policy", "log.cleanup.policy", "delete", ConfigType::List),
    def(
        "compression.type",
        "compression.type",
        "producer",
        ConfigType::String,
    ),
    def(
        "compression.gzip.level",
        "compression.gzip.level",
        "-1",
        ConfigType::Int,
    ),
    def(
        "compression.lz4.level",
        "compression.lz4.level",
        "9",
        ConfigType::Int,
    ),
    def(
        "compression.zstd.level",
        "compression.zstd.level",
        "3",
        ConfigType::Int,
    ),
    def(
        "delete.retention.ms",
        "log.cleaner.delete.retention.ms",
        "86400000",
        ConfigType::Long,
    ),
    def(
        "file.delete.delay.ms",
        "log.segment.delete.delay.ms",
        "60000",
        ConfigType::Long,
    ),
    def(
        "flush.messages",
        "log.flush.interval.messages",
        LONG_MAX,
        ConfigType::Long,
    ),
    def("flush.ms", "log.flush.interval.ms", LONG_MAX, ConfigType::Long),
    def(
        "index.interval.bytes",
        "log.index.interval.bytes",
        "4096",
        ConfigType::Int,
    ),
    // Replication throttles name replicas of other brokers; one broker has
    // no followers, so they are accepted, checked and reported only.
    def("leader.replication.throttled.replicas", "", "", ConfigType::List),
    def(
        "follower.replication.throttled.replicas",
        "",
        "",
        ConfigType::List,
    ),
    def(
        "local.retention.bytes",
        "log.local.retention.bytes",
        "-2",
        ConfigType::Long,
    ),
    def(
        "local.retention.ms",
        "log.local.retention.ms",
        "-2",
        ConfigType::Long,
    ),
    def(
        "max.compaction.lag.ms",
        "log.cleaner.max.compaction.lag.ms",
        LONG_MAX,
        ConfigType::Long,
    ),
    def(
        "max.message.bytes",
        "message.max.bytes",
        "1048588",
        ConfigType::Int,
    ),
    def(
        "message.timestamp.after.max.ms",
        "log.message.timestamp.after.max.ms",
        "3600000",
        ConfigType::Long,
    ),
    def(
        "message.timestamp.before.max.ms",
        "log.message.timestamp.before.max.ms",
        LONG_MAX,
        ConfigType::Long,
    ),
    def(
        "message.timestamp.type",
        "log.message.timestamp.type",
        "CreateTime",
        ConfigType::String,
    ),
    def(
        "min.cleanable.dirty.ratio",
        "log.cleaner.min.cleanable.ratio",
        "0.5",
        ConfigType::Double,
    ),
    def(
        "min.compaction.lag.ms",
        "log.cleaner.min.compaction.lag.ms",
        "0",
        ConfigType::Long,
    ),
    def("min.insync.replicas", "min.insync.replicas", "1", ConfigType::Int),
    def("preallocate", "log.preallocate", "false", ConfigType::Boolean),
    def("remote.log.copy.disable", "", "false", ConfigType::Boolean),
    def("remote.log.delete.on.disable", "", "false", ConfigType::Boolean),
    def(
        "remote.storage.enable",
        "remote.log.storage.enable",
        "false",
        ConfigType::Boolean,
    ),
    def("retention.bytes", "log.retention.bytes", "-1", ConfigType::Long),
    def("retention.ms", "log.retention.ms", "604800000", ConfigType::Long),
    def(
        "segment.bytes",
        "log.segment.bytes",
        "1073741824",
        ConfigType::Int,
    ),
    def(
        "segment.index.bytes",
        "log.index.size.max.bytes",
        "10485760",
        ConfigType::Int,
    ),
    def("segment.jitter.ms", "log.roll.jitter.ms", "0", ConfigType::Long),
    def("segment.ms", "log.roll.ms", "604800000", ConfigType::Long),
    def(
        "unclean.leader.election.enable",
        "unclean.leader.election.enable",
        "false",
        ConfigType::Boolean,
    ),
];

/// Broker-only keys (not topic defaults): name, default, type.
pub const BROKER_CONFIGS: &[(&str, &str, ConfigType)] = &[
    ("node.id", "1", ConfigType::Int),
    ("listen", "127.0.0.1:9092", ConfigType::String),
    ("advertised", "", ConfigType::String),
    // Kafka's listener map and TLS keys (`crate::listeners`); each `ssl.*`
    // key may be set per listener as `listener.name.<name>.ssl.*`.
    (
        "listener.security.protocol.map",
        "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
        ConfigType::String,
    ),
    // The inter-broker listener, as a copied Kafka config names it: where
    // a cluster's brokers send each other requests. The keys are checked
    // as Kafka checks them (`crate::listeners::inter_broker`).
    ("inter.broker.listener.name", "", ConfigType::String),
    // A cluster's controller spreads partition leaders over the live
    // brokers every `leader.imbalance.check.interval.seconds`.
    ("auto.leader.rebalance.enable", "true", ConfigType::Boolean),
    ("leader.imbalance.check.interval.seconds", "300", ConfigType::Long),
    ("security.inter.broker.protocol", "PLAINTEXT", ConfigType::String),
    (
        "sasl.mechanism.inter.broker.protocol",
        "GSSAPI",
        ConfigType::String,
    ),
    ("ssl.keystore.type", "JKS", ConfigType::String),
    ("ssl.keystore.location", "", ConfigType::String),
    ("ssl.keystore.password", "", ConfigType::Password),
    ("ssl.keystore.key", "", ConfigType::Password),
    ("ssl.keystore.certificate.chain", "", ConfigType::Password),
    ("ssl.key.password", "", ConfigType::Password),
    ("ssl.truststore.type", "JKS", ConfigType::String),
    ("ssl.truststore.location", "", ConfigType::String),
    ("ssl.truststore.password", "", ConfigType::Password),
    ("ssl.truststore.certificates", "", ConfigType::Password),
    ("ssl.client.auth", "none", ConfigType::String),
    ("ssl.enabled.protocols", "TLSv1.2,TLSv1.3", ConfigType::List),
    ("ssl.cipher.suites", "", ConfigType::List),
    ("ssl.principal.mapping.rules", "DEFAULT", ConfigType::String),
    // A broker connecting to another's SSL inter-broker listener checks
    // the name in its certificate (`https`), or not (empty).
    (
        "ssl.endpoint.identification.algorithm",
        "https",
        ConfigType::String,
    ),
    // SASL (`keel_auth::sasl`): the mechanisms a SASL listener offers (Kafka's
    // default, GSSAPI, is refused with a message: Keel has PLAIN and
    // SCRAM), PLAIN's users in `listener.name.<l>.plain.sasl.jaas.config`,
    // the longest a session lasts before the client must re-authenticate
    // (KIP-368; 0 is for ever), the largest SASL token read, and how long
    // a failed authentication waits before its answer and the close.
    ("sasl.enabled.mechanisms", "GSSAPI", ConfigType::List),
    ("sasl.jaas.config", "", ConfigType::Password),
    ("connections.max.reauth.ms", "0", ConfigType::Long),
    ("sasl.server.max.receive.size", "524288", ConfigType::Int),
    (
        "connection.failed.authentication.delay.ms",
        "100",
        ConfigType::Int,
    ),
    // ACLs (`keel_auth::acl`): on with Kafka's StandardAuthorizer class name,
    // `super.users` (`User:a;User:b`) bypass them, and a resource no ACL
    // names is open only with `allow.everyone.if.no.acl.found`.
    ("authorizer.class.name", "", ConfigType::String),
    ("super.users", "", ConfigType::String),
    ("allow.everyone.if.no.acl.found", "false", ConfigType::Boolean),
    ("log.dirs", "./data", ConfigType::String),
    ("auto.create.topics.enable", "true", ConfigType::Boolean),
    ("num.partitions", "1", ConfigType::Int),
    ("default.replication.factor", "1", ConfigType::Int),
    ("socket.request.max.bytes", "104857600", ConfigType::Int),
    // The most partitions one DescribeTopicPartitions response describes.
    ("max.request.partition.size.limit", "2000", ConfigType::Int),
    // The most record bytes one Fetch response carries, whatever it asks.
    ("fetch.max.bytes", "57671680", ConfigType::Int),
    // Connections: in all, per client address, and how long one may idle.
    ("max.connections", "2147483647", ConfigType::Int),
    ("max.connections.per.ip", "2147483647", ConfigType::Int),
    ("connections.max.idle.ms", "600000", ConfigType::Long),
    // Idempotent producers' state is forgotten after this long without a
    // write, checked at this interval.
    ("producer.id.expiration.ms", "86400000", ConfigType::Int),
    (
        "producer.id.expiration.check.interval.ms",
        "600000",
        ConfigType::Int,
    ),
    ("log.retention.check.interval.ms", "300000", ConfigType::Long),
    // Client quotas' rates are measured over this many windows of this
    // many seconds.
    ("quota.window.num", "11", ConfigType::Int),
    ("quota.window.size.seconds", "1", ConfigType::Int),
    ("delete.topic.enable", "true", ConfigType::Boolean),
    ("group.min.session.timeout.ms", "6000", ConfigType::Int),
    ("group.max.session.timeout.ms", "1800000", ConfigType::Int),
    ("group.initial.rebalance.delay.ms", "3000", ConfigType::Int),
    ("group.max.size", "2147483647", ConfigType::Int),
    // The consumer protocol's groups (KIP-848).
    ("group.consumer.session.timeout.ms", "45000", ConfigType::Int),
    ("group.consumer.min.session.timeout.ms", "45000", ConfigType::Int),
    ("group.consumer.max.session.timeout.ms", "60000", ConfigType::Int),
    ("group.consumer.heartbeat.interval.ms", "5000", ConfigType::Int),
    (
        "group.consumer.min.heartbeat.interval.ms",
        "5000",
        ConfigType::Int,
    ),
    (
        "group.consumer.max.heartbeat.interval.ms",
        "15000",
        ConfigType::Int,
    ),
    ("group.consumer.assignors", "uniform,range", ConfigType::List),
    ("group.consumer.max.size", "2147483647", ConfigType::Int),
    (
        "group.consumer.migration.policy",
        "bidirectional",
        ConfigType::String,
    ),
    // Share groups (KIP-932), Kafka's names, defaults and ranges.
    ("group.share.delivery.count.limit", "5", ConfigType::Int),
    ("group.share.record.lock.duration.ms", "30000", ConfigType::Int),
    // Bounds of the lock duration and the delivery limit, for the broker's
    // values and groups' own (`share.record.lock.duration.ms`, ...).
    (
        "group.share.min.record.lock.duration.ms",
        "15000",
        ConfigType::Int,
    ),
    (
        "group.share.max.record.lock.duration.ms",
        "60000",
        ConfigType::Int,
    ),
    ("group.share.min.delivery.count.limit", "2", ConfigType::Int),
    ("group.share.max.delivery.count.limit", "10", ConfigType::Int),
    ("group.share.partition.max.record.locks", "2000", ConfigType::Int),
    ("group.share.max.share.sessions", "2000", ConfigType::Int),
    ("group.share.max.size", "200", ConfigType::Int),
    ("group.share.session.timeout.ms", "45000", ConfigType::Int),
    ("group.share.heartbeat.interval.ms", "5000", ConfigType::Int),
    // Bounds of those, for the broker's values and groups' own
    // (`share.session.timeout.ms`, `share.heartbeat.interval.ms`).
    ("group.share.min.session.timeout.ms", "45000", ConfigType::Int),
    ("group.share.max.session.timeout.ms", "60000", ConfigType::Int),
    ("group.share.min.heartbeat.interval.ms", "5000", ConfigType::Int),
    ("group.share.max.heartbeat.interval.ms", "15000", ConfigType::Int),
    // The `share.version` feature level ApiVersions finalizes: 1 serves
    // share groups (KIP-932), as Kafka 4.2+ does by default; 0 answers
    // every share API UNSUPPORTED_VERSION.
    ("keel.share.version", "1", ConfigType::Int),
    ("offsets.retention.minutes", "10080", ConfigType::Int),
    ("offsets.retention.check.interval.ms", "600000", ConfigType::Long),
    ("offset.metadata.max.bytes", "4096", ConfigType::Int),
    ("offsets.topic.segment.bytes", "104857600", ConfigType::Int),
    ("offsets.commit.timeout.ms", "5000", ConfigType::Int),
    // The transaction coordinator: the longest timeout a producer may ask
    // for, how often open transactions are checked against theirs, how
    // long an idle transactional id is remembered, and the transaction
    // log's segment size.
    ("transaction.max.timeout.ms", "900000", ConfigType::Int),
    (
        "transaction.abort.timed.out.transaction.cleanup.interval.ms",
        "10000",
        ConfigType::Int,
    ),
    ("transactional.id.expiration.ms", "604800000", ConfigType::Int),
    // How long a transactional produce (v12+) waits for its transaction
    // to be free to take its partitions (the last one's markers being
    // written) before it answers CONCURRENT_TRANSACTIONS. Kafka retries
    // for this long, every `add.partitions.to.txn.retry.backoff.ms`; Keel
    // wakes when the transaction's state changes instead.
    (
        "add.partitions.to.txn.retry.backoff.max.ms",
        "100",
        ConfigType::Int,
    ),
    // How often a partition leader asks again a coordinator on another
    // broker that answered CONCURRENT_TRANSACTIONS, up to the max above.
    ("add.partitions.to.txn.retry.backoff.ms", "20", ConfigType::Int),
    (
        "transaction.state.log.segment.bytes",
        "104857600",
        ConfigType::Int,
    ),
    // The `transaction.version` feature level ApiVersions finalizes (Kafka
    // sets it with `kafka-features`): 2 lets clients use transactions v2
    // (KIP-890), 0 or 1 keeps them on the classic protocol.
    ("keel.transaction.version", "2", ConfigType::Int),
    // -1: a share of the memory the broker may use (see keel_tier::memory).
    ("keel.tail.cache.bytes", "-1", ConfigType::Long),
    // auto | on | off: read segment data with O_DIRECT (see keel_log::ReadIo).
    ("keel.io.direct", "auto", ConfigType::String),
    // Broker-wide budget of reads below the tail cache; 0 = unlimited.
    ("keel.cold.read.bytes.per.sec", "0", ConfigType::Long),
    ("keel.cold.read.max.concurrent", "4", ConfigType::Int),
    // Shared cold scans (keel_data::scan): the scan buffer (-1: a share of
    // the memory limit), how far ahead of a reader data is held for it,
    // and the convoy's pacing of readers ahead of the one furthest behind.
    ("keel.scan.buffer.bytes", "-1", ConfigType::Long),
    ("keel.scan.window.bytes", "67108864", ConfigType::Long),
    ("keel.scan.convoy.ahead.percent", "10", ConfigType::Int),
    ("keel.scan.convoy.max.slowed.ms", "120000", ConfigType::Long),
    // The live path's latency target (produce and tail fetch p99 as the
    // broker sees them, keel_tier::govern): with one, the background
    // budgets above are ceilings the I/O governor stays under while the
    // live path is over it. 0: off.
    ("keel.io.live.latency.target.ms", "0", ConfigType::Double),
    // Requests taking at least this long (arrival to response sent) are
    // logged as one JSON line each, with every stage; -1: off.
    ("keel.request.slow.ms", "1000", ConfigType::Long),
    // HOST:PORT of the admin HTTP endpoint (/stats, /metrics, /healthz); empty: off.
    ("keel.admin.listen", "127.0.0.1:9644", ConfigType::String),
    // Who may read the admin endpoint, and over TLS (the ADMIN listener's
    // keys: `listener.name.admin.ssl.*`, else `ssl.*`). A non-loopback
    // address without a token or credentials is refused unless allowed.
    ("keel.admin.auth.bearer.token", "", ConfigType::Password),
    ("keel.admin.auth.basic.credentials", "", ConfigType::Password),
    ("keel.admin.ssl.enabled", "false", ConfigType::Boolean),
    (
        "keel.admin.allow.remote.without.auth",
        "false",
        ConfigType::Boolean,
    ),
    // Cluster mode (docs/cluster.md): etcd's client URLs, comma-separated;
    // empty, one node on an in-process coordination store. Brokers given
    // the same endpoints and prefix form one cluster.
    ("keel.cluster.etcd.endpoints", "", ConfigType::List),
    ("keel.cluster.etcd.prefix", "/keel", ConfigType::String),
    // How long a broker's session (its etcd lease) lives without renewal:
    // a broker that stops renewing leaves the cluster after it.
    ("keel.cluster.session.timeout.ms", "6000", ConfigType::Int),
    // A cluster's write-ahead log in the object store (docs/cluster.md):
    // how long a WAL object gathers writes, how large it grows before it
    // is written, and how many bytes of writes may wait for the object
    // store before appends are refused (NOT_ENOUGH_REPLICAS).
    ("keel.cluster.wal.linger.ms", "5", ConfigType::Int),
    ("keel.cluster.wal.object.bytes", "4194304", ConfigType::Int),
    ("keel.cluster.wal.buffer.max.bytes", "67108864", ConfigType::Int),
    ("keel.cluster.wal.gc.interval.ms", "30000", ConfigType::Long),
    ("keel.cluster.wal.segment.roll.ms", "600000", ConfigType::Long),
    // How many partitions of Kafka's internal topics place the group and
    // transaction coordinators in a cluster (a key's coordinator is the
    // leader of its partition); read when the cluster first places them.
    ("offsets.topic.num.partitions", "50", ConfigType::Int),
    ("transaction.state.log.num.partitions", "50", ConfigType::Int),
    // How many brokers must be live before they are placed, so that they
    // spread over the cluster (Kafka's: internal topics are not created
    // until the cluster has this many brokers).
    ("offsets.topic.replication.factor", "3", ConfigType::Int),
    ("transaction.state.log.replication.factor", "3", ConfigType::Int),
    // Tiers (see keel_tier::tiers). `log.dirs` is the fast tier, where all
    // writes land; sealed segments are copied to the capacity dirs, or to
    // the object store for topics with remote.storage.enable=true.
    ("keel.tier.capacity.dirs", "", ConfigType::List),
    // file:///dir or s3://bucket[/prefix]; empty: no object store.
    ("keel.tier.remote", "", ConfigType::String),
    ("keel.tier.remote.endpoint", "", ConfigType::String),
    ("keel.tier.remote.region", "us-east-1", ConfigType::String),
    ("keel.tier.remote.access.key.id", "", ConfigType::String),
    ("keel.tier.remote.secret.access.key", "", ConfigType::Password),
    // Local copies of segments already copied to a colder tier are
    // deleted, oldest first, while the fast tier holds more; -1: no limit.
    ("keel.tier.fast.max.bytes", "-1", ConfigType::Long),
    // Budget of the mover (copies and their verification); 0: unlimited.
    ("keel.tier.move.bytes.per.sec", "52428800", ConfigType::Long),
    ("keel.tier.check.interval.ms", "1000", ConfigType::Long),
    // Reader-aware tiering (keel_data::tiering): how far behind the oldest
    // local segment a recent reader may be and still keep it on the fast
    // tier, and the most a reader keeps; 0: off.
    ("keel.tier.reader.window.bytes", "1073741824", ConfigType::Long),
    // Copies in a tier that no manifest names (of deleted topics, or written
    // by a request still in flight when the broker crashed) are deleted once
    // this old; the sweep runs at this interval too.
    ("keel.tier.orphan.grace.ms", "600000", ConfigType::Long),
    // The log cleaner (compacted topics), under Kafka's names. Its I/O
    // budget defaults to 50 MiB/s (Kafka's is unlimited); 0: unlimited.
    ("log.cleaner.enable", "true", ConfigType::Boolean),
    ("log.cleaner.threads", "1", ConfigType::Int),
    ("log.cleaner.dedupe.buffer.size", "134217728", ConfigType::Long),
    ("log.cleaner.io.buffer.size", "524288", ConfigType::Int),
    (
        "log.cleaner.io.max.bytes.per.second",
        "52428800",
        ConfigType::Double,
    ),
    ("log.cleaner.backoff.ms", "15000", ConfigType::Long),
];

/// Broker keys an operator may change at run time (IncrementalAlterConfigs
/// on the broker or the cluster default, as Kafka's `kafka-configs
/// --entity-type brokers`), besides the topic defaults (`log.*` and the
/// like, see [`is_dynamic`]). Each takes effect without a restart.
pub const DYNAMIC_BROKER_CONFIGS: &[&str] = &[
    "max.connections",
    "max.connections.per.ip",
    "producer.id.expiration.ms",
    "log.cleaner.threads",
    "log.cleaner.dedupe.buffer.size",
    "log.cleaner.io.buffer.size",
    "log.cleaner.io.max.bytes.per.second",
    "log.cleaner.backoff.ms",
    "keel.tail.cache.bytes",
    "keel.cold.read.bytes.per.sec",
    "keel.tier.move.bytes.per.sec",
    "keel.tier.fast.max.bytes",
    "keel.tier.reader.window.bytes",
    "keel.request.slow.ms",
    "keel.io.live.latency.target.ms",
];

/// Whether a broker key can change at run time: the listed keys, every
/// topic default but `remote.log.storage.enable` (a topic's remote storage
/// cannot be turned off under it), and Kafka's keys Keel does not use that
/// Kafka lets change (`crate::kafka_configs`).
pub fn is_dynamic(key: &str) -> bool {
    DYNAMIC_BROKER_CONFIGS.contains(&key)
        || topic_def_by_broker_name(key).is_some_and(|d| d.broker_name != "remote.log.storage.enable")
        || crate::kafka_configs::foreign(key)
            .is_some_and(|k| k.mode != crate::kafka_configs::UpdateMode::ReadOnly)
}

/// The type of a broker key (topic defaults included), if Keel has it.
pub fn broker_config_type(key: &str) -> Option<ConfigType> {
    let key = crate::listeners::scoped_key(key).unwrap_or(key);
    BROKER_CONFIGS
        .iter()
        .find(|(n, _, _)| *n == key)
        .map(|(_, _, k)| *k)
        .or_else(|| topic_def_by_broker_name(key).map(|d| d.kind))
}

/// The built-in default of a broker key; Kafka's for a key Keel does not
/// use (`crate::kafka_configs`).
fn builtin_default(key: &str) -> Option<&'static str> {
    BROKER_CONFIGS
        .iter()
        .find(|(n, _, _)| *n == key)
        .map(|(_, d, _)| *d)
        .or_else(|| topic_def_by_broker_name(key).map(|d| d.default))
        .or_else(|| crate::kafka_configs::foreign(key).and_then(|c| c.default))
}

/// Where a broker config's value comes from: Kafka's `ConfigSource` ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigSource {
    DynamicTopic = 1,
    DynamicBroker = 2,
    DynamicDefaultBroker = 3,
    StaticBroker = 4,
    Default = 5,
    DynamicBrokerLogger = 6,
    /// A group's own config (`kafka-configs --entity-type groups`).
    GroupConfig = 8,
}

/// The broker configs set at run time: the cluster-wide default (Kafka's
/// broker resource `""`) and this broker's own, which wins over it. Both
/// win over the config file, and are persisted (see
/// `crate::dynamic_config`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DynamicLayers {
    pub default: BTreeMap<String, String>,
    pub broker: BTreeMap<String, String>,
}

/// Below this, a cleaner thread's key map could not hold the keys of one
/// large batch.
const MIN_DEDUPE_BUFFER_PER_THREAD: i64 = 64 * 1024;

/// Aliases accepted on input and stored under their canonical key.
const ALIASES: &[(&str, &str)] = &[
    ("data.dir", "log.dirs"),
    ("keel.tier.fast.dirs", "log.dirs"),
    ("log.dir", "log.dirs"),
    ("listeners", "listen"),
    ("advertised.listeners", "advertised"),
];

/// Every key the broker accepts, aliases included.
pub fn known_keys() -> impl Iterator<Item = &'static str> {
    BROKER_CONFIGS
        .iter()
        .map(|(n, _, _)| *n)
        .chain(
            TOPIC_CONFIGS
                .iter()
                .map(|d| d.broker_name)
                .filter(|n| !n.is_empty()),
        )
        .chain(ALIASES.iter().map(|(a, _)| *a))
}

/// One change an IncrementalAlterConfigs request asks of a resource:
/// Kafka's `AlterConfigOp`, a topic config or a logger by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigChange {
    pub name: String,
    /// One of [`ConfigChange::SET`] ..= [`ConfigChange::SUBTRACT`] (any
    /// other value is refused).
    pub op: i8,
    pub value: Option<String>,
}

impl ConfigChange {
    /// Kafka's `AlterConfigOp.OpType` ids.
    pub const SET: i8 = 0;
    pub const DELETE: i8 = 1;
    pub const APPEND: i8 = 2;
    pub const SUBTRACT: i8 = 3;
}

/// A configuration key or value that was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub key: String,
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "config `{}`: {}", self.key, self.reason)
    }
}

impl std::error::Error for ConfigError {}

impl From<keel_auth::SettingError> for ConfigError {
    fn from(e: keel_auth::SettingError) -> ConfigError {
        ConfigError {
            key: e.key,
            reason: e.reason,
        }
    }
}

/// What the authorizer reads: the broker-wide values.
impl keel_auth::Settings for BrokerConfig {
    fn value(&self, key: &str) -> String {
        self.get(key).trim().to_string()
    }

    fn set_value(&self, key: &str) -> Option<String> {
        self.get_override(key).map(str::to_string)
    }
}

fn topic_def_by_broker_name(name: &str) -> Option<&'static TopicConfigDef> {
    TOPIC_CONFIGS
        .iter()
        .find(|d| !d.broker_name.is_empty() && d.broker_name == name)
}

/// The definition of a topic-level config.
pub fn topic_def(name: &str) -> Option<&'static TopicConfigDef> {
    TOPIC_CONFIGS.iter().find(|d| d.name == name)
}

/// A value for one of Kafka's keys Keel does not use: one Kafka would take
/// at run time.
fn check_foreign(kafka: &crate::kafka_configs::KafkaBrokerConfig, value: &str) -> Result<(), ConfigError> {
    let refused = |reason: String| ConfigError {
        key: kafka.name.to_string(),
        reason,
    };
    if kafka.mode == crate::kafka_configs::UpdateMode::ReadOnly {
        return Err(refused("cannot be changed at run time".into()));
    }
    kafka.check(value).map_err(refused)
}

/// Checks that `value` parses as the config's type.
pub fn check_value(key: &str, kind: ConfigType, value: &str) -> Result<(), ConfigError> {
    let ok = match kind {
        ConfigType::Boolean => matches!(value, "true" | "false"),
        ConfigType::Int => value.parse::<i32>().is_ok(),
        ConfigType::Short => value.parse::<i16>().is_ok(),
        ConfigType::Long => value.parse::<i64>().is_ok(),
        ConfigType::Double => value.parse::<f64>().is_ok(),
        ConfigType::String | ConfigType::List | ConfigType::Class | ConfigType::Password => match key {
            "message.timestamp.type" | "log.message.timestamp.type" => {
                matches!(value, "CreateTime" | "LogAppendTime")
            }
            "keel.io.direct" => matches!(value, "auto" | "on" | "off"),
            "keel.tier.remote" => {
                value.is_empty()
                    || value.starts_with("file:///")
                    || value
                        .strip_prefix("s3://")
                        .is_some_and(|b| !b.is_empty() && !b.starts_with('/'))
            }
            "compression.type" => COMPRESSION_TYPES.contains(&value),
            "leader.replication.throttled.replicas" | "follower.replication.throttled.replicas" => {
                throttled_replicas_ok(value)
            }
            _ => true,
        },
    };
    if !ok {
        let reason = match key {
            "compression.type" => format!("String must be one of: {}", COMPRESSION_TYPES.join(", ")),
            "leader.replication.throttled.replicas" | "follower.replication.throttled.replicas" => {
                "must be the literal '*' or a list of replicas in the following format: \
                 [partitionId]:[brokerId],[partitionId]:[brokerId],..."
                    .to_string()
            }
            _ => format!("`{value}` is not a valid {kind:?}"),
        };
        return Err(ConfigError {
            key: key.to_string(),
            reason,
        });
    }
    check_level(key, value)
}

/// Kafka's `compression.type` values: a codec, `uncompressed`, or
/// `producer` (keep the producer's codec).
const COMPRESSION_TYPES: &[&str] = &["uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"];

/// `*`, or `partition:broker` pairs separated by commas (Kafka's
/// `ThrottledReplicaListValidator`).
fn throttled_replicas_ok(value: &str) -> bool {
    let value = value.trim();
    if value.is_empty() || value == "*" {
        return true;
    }
    value.split(',').all(|pair| {
        pair.trim()
            .split_once(':')
            .is_some_and(|(p, b)| p.trim().parse::<u32>().is_ok() && b.trim().parse::<u32>().is_ok())
    })
}

/// A `compression.<codec>.level` within Kafka's range for the codec
/// (gzip also takes -1, its default).
fn check_level(key: &str, value: &str) -> Result<(), ConfigError> {
    let codec = match key {
        "compression.gzip.level" => keel_log::codec::Codec::Gzip,
        "compression.lz4.level" => keel_log::codec::Codec::Lz4,
        "compression.zstd.level" => keel_log::codec::Codec::Zstd,
        _ => return Ok(()),
    };
    let Some(range) = codec.level_range() else {
        return Ok(());
    };
    let level: i32 = value.parse().unwrap_or(i32::MIN);
    if range.contains(&level) || (codec == keel_log::codec::Codec::Gzip && level == -1) {
        return Ok(());
    }
    let also = if codec == keel_log::codec::Codec::Gzip {
        " or -1"
    } else {
        ""
    };
    Err(ConfigError {
        key: key.to_string(),
        reason: format!(
            "Value must be between {} and {}{also}",
            range.start(),
            range.end()
        ),
    })
}

/// The broker's configuration: every key with its value, defaults filled in.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// What is in force: the static values under the dynamic layers.
    values: BTreeMap<String, String>,
    /// The built-in defaults under what the operator set at start-up.
    statics: BTreeMap<String, String>,
    /// Keys the operator set (the rest are defaults), for DescribeConfigs.
    explicit: Vec<String>,
    dynamic: DynamicLayers,
}

impl BrokerConfig {
    /// Builds the configuration from operator-supplied keys. Unknown keys
    /// and values of the wrong type are errors, so a typo cannot silently
    /// leave a default in force.
    pub fn from_map(input: &BTreeMap<String, String>) -> Result<BrokerConfig, ConfigError> {
        let mut values = BTreeMap::new();
        for (name, default, _) in BROKER_CONFIGS {
            values.insert(name.to_string(), default.to_string());
        }
        for d in TOPIC_CONFIGS.iter().filter(|d| !d.broker_name.is_empty()) {
            values.insert(d.broker_name.to_string(), d.default.to_string());
        }
        let mut explicit = Vec::new();
        for (key, value) in input {
            let key = ALIASES
                .iter()
                .find(|(a, _)| a == key)
                .map_or(key.as_str(), |(_, c)| c);
            let kind = broker_config_type(key).ok_or_else(|| ConfigError {
                key: key.to_string(),
                reason: "unknown configuration key".into(),
            })?;
            check_value(key, kind, value)?;
            values.insert(key.to_string(), value.clone());
            explicit.push(key.to_string());
        }
        let config = BrokerConfig {
            statics: values.clone(),
            values,
            explicit,
            dynamic: DynamicLayers::default(),
        };
        config.validate()?;
        Ok(config)
    }

    /// This configuration with `dynamic` as its run-time layers in place of
    /// the current ones. Every key must be dynamic ([`is_dynamic`]) and
    /// every value valid, alone and with the rest. Kafka's keys that Keel
    /// does not use are kept in the layers, not in force
    /// (`crate::kafka_configs`).
    pub fn with_dynamic(&self, dynamic: DynamicLayers) -> Result<BrokerConfig, ConfigError> {
        let mut values = self.statics.clone();
        for (key, value) in dynamic.default.iter().chain(&dynamic.broker) {
            if let Some(kafka) = crate::kafka_configs::foreign(key) {
                check_foreign(kafka, value)?;
                continue;
            }
            let kind = broker_config_type(key).ok_or_else(|| ConfigError {
                key: key.clone(),
                reason: "unknown broker config".into(),
            })?;
            if !is_dynamic(key) {
                return Err(ConfigError {
                    key: key.clone(),
                    reason: "cannot be changed at run time (set it in the config file)".into(),
                });
            }
            check_value(key, kind, value)?;
            values.insert(key.clone(), value.clone());
        }
        let config = BrokerConfig {
            values,
            statics: self.statics.clone(),
            explicit: self.explicit.clone(),
            dynamic,
        };
        config.validate()?;
        Ok(config)
    }

    /// The run-time layers in force.
    pub fn dynamic(&self) -> &DynamicLayers {
        &self.dynamic
    }

    /// A broker key's values from the highest-priority source down, as
    /// DescribeConfigs' synonyms: this broker's dynamic value, the cluster
    /// default, the config file, the built-in default.
    pub fn layers(&self, key: &str) -> Vec<(String, ConfigSource)> {
        let mut out = Vec::new();
        if let Some(v) = self.dynamic.broker.get(key) {
            out.push((v.clone(), ConfigSource::DynamicBroker));
        }
        if let Some(v) = self.dynamic.default.get(key) {
            out.push((v.clone(), ConfigSource::DynamicDefaultBroker));
        }
        if self.is_explicit(key) {
            out.push((
                self.statics.get(key).cloned().unwrap_or_default(),
                ConfigSource::StaticBroker,
            ));
        }
        if let Some(d) = builtin_default(key) {
            out.push((d.to_string(), ConfigSource::Default));
        }
        out
    }

    /// Where a broker key's value in force comes from.
    pub fn source(&self, key: &str) -> ConfigSource {
        self.layers(key)
            .first()
            .map_or(ConfigSource::Default, |(_, s)| *s)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.check_tier_dirs()?;
        keel_auth::acl::settings(self)?;
        self.check_bounds()?;
        self.check_consumer_groups()?;
        self.check_listeners()?;
        self.check_policies()?;
        self.compaction(&BTreeMap::new())?;
        self.topic_log_config(&BTreeMap::new()).map(|_| ())
    }

    /// Numeric keys within their ranges.
    fn check_bounds(&self) -> Result<(), ConfigError> {
        if self.num("num.partitions") < 1 {
            return Err(ConfigError {
                key: "num.partitions".into(),
                reason: "must be at least 1".into(),
            });
        }
        for key in [
            "offsets.topic.num.partitions",
            "transaction.state.log.num.partitions",
            "offsets.topic.replication.factor",
            "transaction.state.log.replication.factor",
            "leader.imbalance.check.interval.seconds",
        ] {
            if self.num(key) < 1 {
                return Err(ConfigError {
                    key: key.into(),
                    reason: "must be at least 1".into(),
                });
            }
        }
        let session = self.num("keel.cluster.session.timeout.ms");
        if !(2000..=300_000).contains(&session) {
            return Err(ConfigError {
                key: "keel.cluster.session.timeout.ms".into(),
                reason: "must be between 2000 and 300000 (etcd counts leases in whole seconds)".into(),
            });
        }
        if !self.etcd_endpoints().is_empty() && self.get("keel.tier.remote").is_empty() {
            return Err(ConfigError {
                key: "keel.tier.remote".into(),
                reason: "a cluster (keel.cluster.etcd.endpoints) keeps acknowledged records in the \
                         object store: set keel.tier.remote to the store all its brokers share"
                    .into(),
            });
        }
        for (key, min) in [
            ("keel.cluster.wal.linger.ms", 0),
            ("keel.cluster.wal.object.bytes", 1024),
            ("keel.cluster.wal.buffer.max.bytes", 1 << 20),
            ("keel.cluster.wal.gc.interval.ms", 100),
            ("keel.cluster.wal.segment.roll.ms", 100),
        ] {
            if self.num(key) < min {
                return Err(ConfigError {
                    key: key.into(),
                    reason: format!("must be at least {min}"),
                });
            }
        }
        let prefix = self.get("keel.cluster.etcd.prefix");
        if !prefix.starts_with('/') || prefix.ends_with('/') || prefix.contains("//") {
            return Err(ConfigError {
                key: "keel.cluster.etcd.prefix".into(),
                reason: "must be a key path such as /keel: starting with '/', not ending with one".into(),
            });
        }
        if self.num("keel.scan.convoy.ahead.percent") > 100 {
            return Err(ConfigError {
                key: "keel.scan.convoy.ahead.percent".into(),
                reason: "must be between 1 and 100".into(),
            });
        }
        if self.num("keel.scan.convoy.max.slowed.ms") > 86_400_000 {
            return Err(ConfigError {
                key: "keel.scan.convoy.max.slowed.ms".into(),
                reason: "must be at most a day (86400000)".into(),
            });
        }
        if self.num("socket.request.max.bytes") < 1024 {
            return Err(ConfigError {
                key: "socket.request.max.bytes".into(),
                reason: "must be at least 1024".into(),
            });
        }
        for (key, min) in [
            ("group.min.session.timeout.ms", 0),
            ("group.max.session.timeout.ms", 0),
            ("group.initial.rebalance.delay.ms", 0),
            ("group.max.size", 1),
            ("group.consumer.session.timeout.ms", 1),
            ("group.consumer.heartbeat.interval.ms", 1),
            ("group.consumer.max.size", 1),
            ("offsets.retention.minutes", 1),
            ("offsets.retention.check.interval.ms", 1),
            ("offset.metadata.max.bytes", 0),
            ("offsets.topic.segment.bytes", 1024),
            ("offsets.commit.timeout.ms", 1),
            ("keel.tail.cache.bytes", -1),
            ("keel.cold.read.bytes.per.sec", 0),
            ("keel.cold.read.max.concurrent", 1),
            ("keel.scan.buffer.bytes", -1),
            ("keel.scan.window.bytes", 0),
            ("keel.tier.reader.window.bytes", 0),
            ("keel.scan.convoy.ahead.percent", 1),
            ("keel.scan.convoy.max.slowed.ms", 0),
            ("fetch.max.bytes", 0),
            ("max.connections", 0),
            ("max.connections.per.ip", 0),
            ("connections.max.idle.ms", -1),
            ("producer.id.expiration.ms", 1),
            ("producer.id.expiration.check.interval.ms", 1),
            ("log.cleaner.threads", 1),
            ("log.cleaner.io.buffer.size", 1),
            ("log.cleaner.backoff.ms", 0),
            ("keel.request.slow.ms", -1),
            ("quota.window.num", 1),
            ("quota.window.size.seconds", 1),
        ] {
            if self.num(key) < min {
                return Err(ConfigError {
                    key: key.into(),
                    reason: format!("must be at least {min}"),
                });
            }
        }
        Ok(())
    }

    /// The consumer protocol's timeouts within Kafka's bounds, and its
    /// assignors known.
    fn check_consumer_groups(&self) -> Result<(), ConfigError> {
        // Kafka's bounds on the consumer protocol's timeouts.
        for (key, min, max) in [
            (
                "group.consumer.session.timeout.ms",
                "group.consumer.min.session.timeout.ms",
                "group.consumer.max.session.timeout.ms",
            ),
            (
                "group.consumer.heartbeat.interval.ms",
                "group.consumer.min.heartbeat.interval.ms",
                "group.consumer.max.heartbeat.interval.ms",
            ),
        ] {
            let (v, lo, hi) = (self.num(key), self.num(min), self.num(max));
            if v < lo || v > hi {
                return Err(ConfigError {
                    key: key.into(),
                    reason: format!("{v} must be between {min} ({lo}) and {max} ({hi})"),
                });
            }
        }
        if self.num("group.consumer.heartbeat.interval.ms") >= self.num("group.consumer.session.timeout.ms") {
            return Err(ConfigError {
                key: "group.consumer.heartbeat.interval.ms".into(),
                reason: "must be less than group.consumer.session.timeout.ms".into(),
            });
        }
        let assignors = self.get("group.consumer.assignors");
        if let Some(bad) = assignors
            .split(',')
            .map(str::trim)
            .find(|a| keel_coord::groups::assignor::Assignor::parse(a).is_none())
        {
            return Err(ConfigError {
                key: "group.consumer.assignors".into(),
                reason: format!("{bad}: Keel's assignors are uniform and range"),
            });
        }
        Ok(())
    }

    /// The listener map, each TLS listener's keys and the inter-broker
    /// listener.
    fn check_listeners(&self) -> Result<(), ConfigError> {
        let listeners = crate::listeners::listeners(self)?;
        for listener in &listeners {
            if listener.protocol.tls() {
                crate::listeners::ssl_settings(self, &listener.name)?;
            }
        }
        crate::listeners::inter_broker(self, &listeners)?;
        Ok(())
    }

    /// The migration policy, the transaction version, the admin endpoint,
    /// the cleaner's buffers and rate, and the classic groups' session
    /// bounds.
    fn check_policies(&self) -> Result<(), ConfigError> {
        let policy = self.get("group.consumer.migration.policy");
        if keel_coord::groups::consumer::MigrationPolicy::parse(policy).is_none() {
            return Err(ConfigError {
                key: "group.consumer.migration.policy".into(),
                reason: format!(
                    "{policy}: must be one of {}",
                    keel_coord::groups::consumer::MigrationPolicy::NAMES.join(", ")
                ),
            });
        }
        let level = self.num("keel.transaction.version");
        if !(0..=i64::from(keel_coord::txn::state::TRANSACTION_VERSION_2)).contains(&level) {
            return Err(ConfigError {
                key: "keel.transaction.version".into(),
                reason: format!("{level}: Keel supports transaction.version 0 to 2"),
            });
        }
        for (key, lo, hi) in [
            ("keel.share.version", 0, 1),
            ("group.share.delivery.count.limit", 2, 10),
            ("group.share.record.lock.duration.ms", 1000, 3_600_000),
            ("group.share.min.record.lock.duration.ms", 1000, 30_000),
            ("group.share.max.record.lock.duration.ms", 30_000, 3_600_000),
            ("group.share.min.delivery.count.limit", 2, 5),
            ("group.share.max.delivery.count.limit", 5, 25),
            ("group.share.partition.max.record.locks", 100, 10_000),
            ("group.share.max.share.sessions", 1, i64::from(i32::MAX)),
            ("group.share.max.size", 1, 1000),
            ("group.share.session.timeout.ms", 1, i64::from(i32::MAX)),
            ("group.share.heartbeat.interval.ms", 1, i64::from(i32::MAX)),
            ("group.share.min.session.timeout.ms", 1, i64::from(i32::MAX)),
            ("group.share.max.session.timeout.ms", 1, i64::from(i32::MAX)),
            ("group.share.min.heartbeat.interval.ms", 1, i64::from(i32::MAX)),
            ("group.share.max.heartbeat.interval.ms", 1, i64::from(i32::MAX)),
        ] {
            let v = self.num(key);
            if !(lo..=hi).contains(&v) {
                return Err(ConfigError {
                    key: key.into(),
                    reason: format!("{v} must be between {lo} and {hi}"),
                });
            }
        }
        for (key, min, max) in [
            (
                "group.share.record.lock.duration.ms",
                "group.share.min.record.lock.duration.ms",
                "group.share.max.record.lock.duration.ms",
            ),
            (
                "group.share.delivery.count.limit",
                "group.share.min.delivery.count.limit",
                "group.share.max.delivery.count.limit",
            ),
            (
                "group.share.session.timeout.ms",
                "group.share.min.session.timeout.ms",
                "group.share.max.session.timeout.ms",
            ),
            (
                "group.share.heartbeat.interval.ms",
                "group.share.min.heartbeat.interval.ms",
                "group.share.max.heartbeat.interval.ms",
            ),
        ] {
            let (v, lo, hi) = (self.num(key), self.num(min), self.num(max));
            if v < lo || v > hi {
                return Err(ConfigError {
                    key: key.into(),
                    reason: format!("{v} must be between {min} ({lo}) and {max} ({hi})"),
                });
            }
        }
        if self.num("group.share.heartbeat.interval.ms") >= self.num("group.share.session.timeout.ms") {
            return Err(ConfigError {
                key: "group.share.heartbeat.interval.ms".into(),
                reason: "must be less than group.share.session.timeout.ms".into(),
            });
        }
        let admin = self.get("keel.admin.listen");
        if !admin.is_empty() && !is_host_port(admin) {
            return Err(ConfigError {
                key: "keel.admin.listen".into(),
                reason: format!("`{admin}`: expected HOST:PORT, or empty to disable"),
            });
        }
        let per_thread = self.num("log.cleaner.dedupe.buffer.size") / self.num("log.cleaner.threads").max(1);
        if per_thread < MIN_DEDUPE_BUFFER_PER_THREAD {
            return Err(ConfigError {
                key: "log.cleaner.dedupe.buffer.size".into(),
                reason: format!(
                    "must be at least {MIN_DEDUPE_BUFFER_PER_THREAD} bytes per cleaner thread (log.cleaner.threads)"
                ),
            });
        }
        let target = self.float("keel.io.live.latency.target.ms");
        if !(0.0..=60_000.0).contains(&target) {
            return Err(ConfigError {
                key: "keel.io.live.latency.target.ms".into(),
                reason: "must be from 0 (off) to 60000".into(),
            });
        }
        let rate = self.float("log.cleaner.io.max.bytes.per.second");
        if rate.is_nan() || rate < 0.0 {
            return Err(ConfigError {
                key: "log.cleaner.io.max.bytes.per.second".into(),
                reason: "must be at least 0".into(),
            });
        }
        if self.num("group.min.session.timeout.ms") > self.num("group.max.session.timeout.ms") {
            return Err(ConfigError {
                key: "group.min.session.timeout.ms".into(),
                reason: "must not exceed group.max.session.timeout.ms".into(),
            });
        }
        Ok(())
    }

    /// The fast tier, the capacity dirs and a `file://` object store must
    /// not overlap: each owns what is in its directory (start-up renames
    /// partition directories it does not know, the mover deletes copies no
    /// manifest names), so one nested in another would see the other's files.
    fn check_tier_dirs(&self) -> Result<(), ConfigError> {
        let mut dirs: Vec<(&str, PathBuf)> = vec![("log.dirs", self.data_dir())];
        dirs.extend(
            self.capacity_dirs()
                .into_iter()
                .map(|d| ("keel.tier.capacity.dirs", d)),
        );
        if let Some(path) = self.get("keel.tier.remote").strip_prefix("file://") {
            dirs.push(("keel.tier.remote", PathBuf::from(path)));
        }
        let absolute: Vec<(&str, PathBuf)> = dirs.into_iter().map(|(key, d)| (key, normalize(&d))).collect();
        for (i, (key_a, a)) in absolute.iter().enumerate() {
            for (key_b, b) in &absolute[i + 1..] {
                if a.starts_with(b) || b.starts_with(a) {
                    return Err(ConfigError {
                        key: key_b.to_string(),
                        reason: format!(
                            "{} and {} ({key_a}) are the same directory or one holds the other; \
                             tiers need directories of their own",
                            b.display(),
                            a.display()
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// `keel.io.live.latency.target.ms`: the I/O governor's target, if on.
    pub fn live_latency_target(&self) -> Option<std::time::Duration> {
        let ms = self.float("keel.io.live.latency.target.ms");
        (ms > 0.0 && ms <= 60_000.0).then(|| std::time::Duration::from_secs_f64(ms / 1e3))
    }

    /// `keel.request.slow.ms`: the slow-request log's threshold, if on.
    pub fn slow_request(&self) -> Option<std::time::Duration> {
        u64::try_from(self.num("keel.request.slow.ms"))
            .ok()
            .map(std::time::Duration::from_millis)
    }

    /// The `transaction.version` feature level (validated: 0 to 2).
    pub fn transaction_version(&self) -> i16 {
        i16::try_from(self.num("keel.transaction.version")).unwrap_or(0)
    }

    /// The `share.version` feature level (validated: 0 or 1).
    pub fn share_version(&self) -> i16 {
        i16::try_from(self.num("keel.share.version")).unwrap_or(0)
    }

    /// What share partitions work under (`group.share.*`).
    pub fn share_limits(&self) -> keel_coord::share::partition::ShareLimits {
        keel_coord::share::partition::ShareLimits {
            delivery_limit: i16::try_from(self.num("group.share.delivery.count.limit")).unwrap_or(5),
            lock_ms: self.num("group.share.record.lock.duration.ms"),
            max_in_flight: usize::try_from(self.num("group.share.partition.max.record.locks"))
                .unwrap_or(2000),
        }
    }

    /// Share groups' membership settings (`group.share.*`).
    pub fn share_group_config(&self) -> keel_coord::share::group::ShareGroupConfig {
        keel_coord::share::group::ShareGroupConfig {
            session_timeout_ms: i32::try_from(self.num("group.share.session.timeout.ms")).unwrap_or(45_000),
            heartbeat_interval_ms: i32::try_from(self.num("group.share.heartbeat.interval.ms"))
                .unwrap_or(5_000),
            max_size: usize::try_from(self.num("group.share.max.size")).unwrap_or(200),
        }
    }

    /// The transaction coordinator's settings.
    pub fn txn_config(&self) -> keel_coord::txn::TxnConfig {
        keel_coord::txn::TxnConfig {
            max_timeout_ms: i32::try_from(self.num("transaction.max.timeout.ms")).unwrap_or(i32::MAX),
            id_expiration_ms: self.num("transactional.id.expiration.ms"),
            log_segment_bytes: u64::try_from(self.num("transaction.state.log.segment.bytes"))
                .unwrap_or(100 << 20),
        }
    }

    pub fn coordinator_config(&self) -> CoordinatorConfig {
        let int = |key| i32::try_from(self.num(key)).unwrap_or(i32::MAX);
        CoordinatorConfig {
            group: GroupConfig {
                min_session_timeout_ms: int("group.min.session.timeout.ms"),
                max_session_timeout_ms: int("group.max.session.timeout.ms"),
                initial_rebalance_delay_ms: int("group.initial.rebalance.delay.ms"),
                max_size: usize::try_from(self.num("group.max.size")).unwrap_or(usize::MAX),
            },
            consumer: keel_coord::groups::consumer::ConsumerGroupConfig {
                session_timeout_ms: int("group.consumer.session.timeout.ms"),
                heartbeat_interval_ms: int("group.consumer.heartbeat.interval.ms"),
                assignors: self
                    .get("group.consumer.assignors")
                    .split(',')
                    .filter_map(|a| keel_coord::groups::assignor::Assignor::parse(a.trim()))
                    .collect(),
                max_size: usize::try_from(self.num("group.consumer.max.size")).unwrap_or(usize::MAX),
                migration: keel_coord::groups::consumer::MigrationPolicy::parse(
                    self.get("group.consumer.migration.policy"),
                )
                .unwrap_or(keel_coord::groups::consumer::MigrationPolicy::Bidirectional),
            },
            offsets_retention_ms: self.num("offsets.retention.minutes").saturating_mul(60_000),
            offsets_retention_check_interval_ms: self.num("offsets.retention.check.interval.ms"),
            offset_metadata_max_bytes: usize::try_from(self.num("offset.metadata.max.bytes")).unwrap_or(4096),
            log_segment_bytes: u64::try_from(self.num("offsets.topic.segment.bytes")).unwrap_or(100 << 20),
        }
    }

    /// The value of a key (every known key has one).
    pub fn get(&self, key: &str) -> &str {
        self.values.get(key).map_or("", String::as_str)
    }

    /// A key that has a value only when set (`listener.name.<l>.ssl.*`).
    pub fn get_override(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(String::as_str)
    }

    /// A numeric key; validated at construction, so the fallback is unused.
    pub fn num(&self, key: &str) -> i64 {
        self.get(key).parse().unwrap_or_default()
    }

    /// A Double key; validated at construction.
    pub fn float(&self, key: &str) -> f64 {
        self.get(key).parse().unwrap_or_default()
    }

    /// The log cleaner's broker-wide settings.
    pub fn cleaner_settings(&self) -> CleanerSettings {
        let rate = self.float("log.cleaner.io.max.bytes.per.second");
        CleanerSettings {
            enabled: self.get("log.cleaner.enable") == "true",
            threads: usize::try_from(self.num("log.cleaner.threads"))
                .unwrap_or(1)
                .max(1),
            dedupe_buffer_bytes: usize::try_from(self.num("log.cleaner.dedupe.buffer.size"))
                .unwrap_or(usize::MAX),
            io_buffer_bytes: u64::try_from(self.num("log.cleaner.io.buffer.size"))
                .unwrap_or(1)
                .max(1),
            // Kafka's default (Double.MaxValue) and 0 both mean unlimited.
            io_bytes_per_sec: if rate >= u64::MAX as f64 { 0 } else { rate as u64 },
            backoff_ms: u64::try_from(self.num("log.cleaner.backoff.ms")).unwrap_or(15_000),
        }
    }

    /// A topic's compaction settings, checked as Kafka checks them.
    pub fn compaction(&self, overrides: &BTreeMap<String, String>) -> Result<Compaction, ConfigError> {
        let value = |name: &str| topic_def(name).map_or("", |d| self.topic_value(overrides, d));
        let bad = |key: &str, reason: String| ConfigError {
            key: key.into(),
            reason,
        };
        let long = |name: &str| -> Result<i64, ConfigError> {
            let v = value(name);
            let n: i64 = v
                .parse()
                .map_err(|_| bad(name, format!("`{v}` is not a number")))?;
            if n < 0 {
                return Err(bad(name, "must be at least 0".into()));
            }
            Ok(n)
        };
        let ratio_text = value("min.cleanable.dirty.ratio");
        let ratio: f64 = ratio_text
            .parse()
            .ok()
            .filter(|r| (0.0..=1.0).contains(r))
            .ok_or_else(|| {
                bad(
                    "min.cleanable.dirty.ratio",
                    format!("`{ratio_text}` is not a ratio between 0 and 1"),
                )
            })?;
        let min_lag = long("min.compaction.lag.ms")?;
        let max_lag = long("max.compaction.lag.ms")?;
        if max_lag < 1 {
            return Err(bad("max.compaction.lag.ms", "must be at least 1".into()));
        }
        if min_lag > max_lag {
            // Kafka's message for the same conflict.
            return Err(bad(
                "min.compaction.lag.ms",
                format!(
                    "conflict topic config setting min.compaction.lag.ms ({min_lag}) > max.compaction.lag.ms ({max_lag})"
                ),
            ));
        }
        Ok(Compaction {
            enabled: self.cleanup_policy(overrides)?.compact,
            min_cleanable_dirty_ratio: ratio,
            min_compaction_lag_ms: min_lag,
            max_compaction_lag_ms: max_lag,
            delete_retention_ms: long("delete.retention.ms")?,
        })
    }

    pub fn is_explicit(&self, key: &str) -> bool {
        self.explicit.iter().any(|k| k == key)
    }

    /// Every key and value, for DescribeConfigs on the broker.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &str)> {
        self.values.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    pub fn node_id(&self) -> i32 {
        i32::try_from(self.num("node.id")).unwrap_or(1)
    }

    pub fn data_dir(&self) -> PathBuf {
        PathBuf::from(self.get("log.dirs"))
    }

    pub fn auto_create_topics(&self) -> bool {
        self.get("auto.create.topics.enable") == "true"
    }

    pub fn default_partitions(&self) -> i32 {
        i32::try_from(self.num("num.partitions")).unwrap_or(1)
    }

    pub fn request_max_bytes(&self) -> usize {
        usize::try_from(self.num("socket.request.max.bytes")).unwrap_or(100 << 20)
    }

    pub fn retention_check_interval_ms(&self) -> u64 {
        u64::try_from(self.num("log.retention.check.interval.ms"))
            .unwrap_or(300_000)
            .max(1)
    }

    /// The broker default behind a topic config.
    pub fn topic_default<'a>(&'a self, def: &TopicConfigDef) -> &'a str {
        if def.broker_name.is_empty() {
            return def.default;
        }
        self.get(def.broker_name)
    }

    /// The effective value of a topic config given the topic's overrides.
    pub fn topic_value<'a>(
        &'a self,
        overrides: &'a BTreeMap<String, String>,
        def: &TopicConfigDef,
    ) -> &'a str {
        overrides
            .get(def.name)
            .map_or_else(|| self.topic_default(def), String::as_str)
    }

    /// The storage settings of a topic with the given overrides.
    pub fn topic_log_config(&self, overrides: &BTreeMap<String, String>) -> Result<LogConfig, ConfigError> {
        let get = |name: &str| -> Result<i64, ConfigError> {
            let d = topic_def(name).ok_or_else(|| ConfigError {
                key: name.into(),
                reason: "unknown".into(),
            })?;
            let v = self.topic_value(overrides, d);
            v.parse::<i64>().map_err(|_| ConfigError {
                key: name.into(),
                reason: format!("`{v}` is not a number"),
            })
        };
        let positive = |name: &str, min: i64| -> Result<u64, ConfigError> {
            let v = get(name)?;
            if v < min {
                return Err(ConfigError {
                    key: name.into(),
                    reason: format!("must be at least {min}"),
                });
            }
            Ok(v as u64)
        };
        let cleanup = self.cleanup_policy(overrides)?;
        let mut segment_ms = positive("segment.ms", 1)? as i64;
        if cleanup.compact {
            // Kafka rolls a compacted log by max.compaction.lag.ms too, so
            // no record waits in the active segment longer than that.
            segment_ms = segment_ms.min(positive("max.compaction.lag.ms", 1)? as i64);
        }
        Ok(LogConfig {
            segment_bytes: positive("segment.bytes", 14)?,
            segment_ms,
            index_interval_bytes: positive("index.interval.bytes", 0)?,
            segment_index_bytes: positive("segment.index.bytes", 8)?,
            retention_bytes: get("retention.bytes")?,
            retention_ms: get("retention.ms")?,
            flush_messages: positive("flush.messages", 1)?,
            flush_ms: positive("flush.ms", 0)? as i64,
            file_delete_delay_ms: positive("file.delete.delay.ms", 0)?,
            cleanup,
            // Decided once for the broker (see `Broker::open`).
            read_io: keel_log::ReadIo::default(),
        })
    }

    /// A topic's `cleanup.policy`.
    pub fn cleanup_policy(&self, overrides: &BTreeMap<String, String>) -> Result<CleanupPolicy, ConfigError> {
        let value = topic_def("cleanup.policy").map_or("delete", |d| self.topic_value(overrides, d));
        CleanupPolicy::parse(value).map_err(|reason| ConfigError {
            key: "cleanup.policy".into(),
            reason,
        })
    }

    /// The codec a topic stores its batches in, with its level: `None` for
    /// `compression.type=producer` (batches are kept as sent).
    pub fn topic_compression(
        &self,
        overrides: &BTreeMap<String, String>,
    ) -> Option<(keel_log::codec::Codec, Option<i32>)> {
        let value = |name: &str| topic_def(name).map_or("", |d| self.topic_value(overrides, d));
        let codec = keel_log::codec::Codec::from_config_name(value("compression.type"))?;
        let level = match codec {
            keel_log::codec::Codec::Gzip => value("compression.gzip.level").parse().ok().filter(|l| *l != -1),
            keel_log::codec::Codec::Zstd => value("compression.zstd.level").parse().ok(),
            _ => None,
        };
        Some((codec, level))
    }

    /// The largest record batch a topic accepts (`max.message.bytes`).
    pub fn max_message_bytes(&self, overrides: &BTreeMap<String, String>) -> usize {
        topic_def("max.message.bytes")
            .and_then(|d| self.topic_value(overrides, d).parse::<usize>().ok())
            .unwrap_or(1_048_588)
    }

    /// Validates topic config overrides from CreateTopics and the like.
    pub fn check_topic_overrides(&self, overrides: &BTreeMap<String, String>) -> Result<(), ConfigError> {
        for (k, v) in overrides {
            let d = topic_def(k).ok_or_else(|| ConfigError {
                key: k.clone(),
                reason: "unknown topic config".into(),
            })?;
            check_value(k, d.kind, v)?;
        }
        let remote = overrides
            .get("remote.storage.enable")
            .is_some_and(|v| v == "true");
        if remote && self.cleanup_policy(overrides)?.compact {
            return Err(ConfigError {
                key: "remote.storage.enable".into(),
                reason: "Remote log storage is unsupported for the compacted topics".into(),
            });
        }
        self.compaction(overrides)?;
        if remote
            && overrides
                .get("remote.log.copy.disable")
                .is_some_and(|v| v == "true")
        {
            // Nothing is copied any more, so the local log must keep all of
            // it (Kafka's rule, and its message).
            let value = |name: &str| topic_def(name).map_or("", |d| self.topic_value(overrides, d));
            for (local, total) in [
                ("local.retention.bytes", "retention.bytes"),
                ("local.retention.ms", "retention.ms"),
            ] {
                if value(local) != "-2" && value(local) != value(total) {
                    return Err(ConfigError {
                        key: "remote.log.copy.disable".into(),
                        reason: format!(
                            "When `remote.log.copy.disable` is set to true, the `{local}` and `{total}` must \
                             be set to the identical value because there will be no more logs copied to \
                             the remote storage."
                        ),
                    });
                }
            }
        }
        if remote && self.get("keel.tier.remote").is_empty() {
            return Err(ConfigError {
                key: "remote.storage.enable".into(),
                reason: "the broker has no object store (keel.tier.remote is not set)".into(),
            });
        }
        self.topic_log_config(overrides).map(|_| ())
    }

    /// `keel.tier.capacity.dirs`, split.
    pub fn capacity_dirs(&self) -> Vec<PathBuf> {
        split_list(self.get("keel.tier.capacity.dirs"))
            .map(PathBuf::from)
            .collect()
    }

    /// etcd's client URLs (`keel.cluster.etcd.endpoints`); none in one-node
    /// mode.
    pub fn etcd_endpoints(&self) -> Vec<String> {
        split_list(self.get("keel.cluster.etcd.endpoints"))
            .map(str::to_string)
            .collect()
    }

    /// `keel.cluster.session.timeout.ms`.
    pub fn cluster_session_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(
            u64::try_from(self.num("keel.cluster.session.timeout.ms")).unwrap_or(6000),
        )
    }

    /// `keel.cluster.wal.*`.
    pub fn wal_settings(&self) -> keel_data::wal::WalSettings {
        let num = |key: &str| u64::try_from(self.num(key)).unwrap_or(0);
        keel_data::wal::WalSettings {
            linger: std::time::Duration::from_millis(num("keel.cluster.wal.linger.ms")),
            object_bytes: usize::try_from(num("keel.cluster.wal.object.bytes")).unwrap_or(usize::MAX),
            buffer_max_bytes: usize::try_from(num("keel.cluster.wal.buffer.max.bytes")).unwrap_or(usize::MAX),
            gc_interval: std::time::Duration::from_millis(num("keel.cluster.wal.gc.interval.ms")),
            segment_roll: std::time::Duration::from_millis(num("keel.cluster.wal.segment.roll.ms")),
        }
    }

    /// The object store settings, if `keel.tier.remote` is set.
    pub fn remote_settings(&self) -> Option<keel_tier::RemoteSettings> {
        let url = self.get("keel.tier.remote");
        (!url.is_empty()).then(|| keel_tier::RemoteSettings {
            url: url.to_string(),
            endpoint: self.get("keel.tier.remote.endpoint").to_string(),
            region: self.get("keel.tier.remote.region").to_string(),
            access_key_id: self.get("keel.tier.remote.access.key.id").to_string(),
            secret_access_key: self.get("keel.tier.remote.secret.access.key").to_string(),
        })
    }

    /// Where a topic's sealed segments go, and how much stays local.
    pub fn tier_policy(&self, overrides: &BTreeMap<String, String>) -> TierPolicy {
        let value = |name: &str| topic_def(name).map_or("", |d| self.topic_value(overrides, d));
        let num = |name: &str| value(name).parse::<i64>().unwrap_or(-1);
        // One broker's compacted topics use the fast and capacity tiers, not
        // the object store (Kafka refuses remote storage for compacted
        // topics). In a cluster every topic's sealed segments go to the
        // object store, compacted ones too: any broker may have to lead the
        // partition next, and rebuild its log from there. The leader's
        // cleaner cleans them there ([`keel_log::clean`]).
        let compact = self.cleanup_policy(overrides).is_ok_and(|p| p.compact);
        let capacity = !self.get("keel.tier.capacity.dirs").trim().is_empty();
        let remote = !self.get("keel.tier.remote").is_empty();
        let cluster = !self.etcd_endpoints().is_empty();
        let tier = if cluster && remote {
            Some(keel_log::Tier::Remote)
        } else if compact {
            capacity.then_some(keel_log::Tier::Capacity)
        } else if value("remote.storage.enable") == "true" && remote {
            Some(keel_log::Tier::Remote)
        } else if !self.get("keel.tier.capacity.dirs").trim().is_empty() {
            Some(keel_log::Tier::Capacity)
        } else {
            None
        };
        // Kafka's rule: -2 means "the same as the total retention".
        let local = |local: &str, total: &str| match num(local) {
            -2 => num(total),
            v => v,
        };
        // `remote.log.copy.disable` keeps the object store's copies readable
        // and makes no more (Kafka's read-only remote tier).
        let copy = !(tier == Some(keel_log::Tier::Remote) && value("remote.log.copy.disable") == "true");
        TierPolicy {
            tier,
            copy,
            local_retention_bytes: local("local.retention.bytes", "retention.bytes"),
            local_retention_ms: local("local.retention.ms", "retention.ms"),
        }
    }
}

/// An absolute path with `.` and `..` resolved lexically (the directories
/// may not exist yet).
fn normalize(path: &std::path::Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut out = PathBuf::new();
    for c in absolute.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

fn split_list(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').map(str::trim).filter(|s| !s.is_empty())
}

/// `HOST:PORT` with a non-empty host and a port number (IPv6 hosts in
/// brackets: `[::1]:9644`).
fn is_host_port(value: &str) -> bool {
    value
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
}

/// The configuration in force, shared by the broker and its data plane:
/// the config file under the dynamic broker configs (see
/// `crate::dynamic_config`), replaced whole by a change.
#[derive(Debug)]
pub struct LiveConfig(parking_lot::RwLock<Arc<BrokerConfig>>);

impl LiveConfig {
    pub fn new(config: BrokerConfig) -> LiveConfig {
        LiveConfig(parking_lot::RwLock::new(Arc::new(config)))
    }

    /// The configuration in force now.
    pub fn get(&self) -> Arc<BrokerConfig> {
        Arc::clone(&self.0.read())
    }

    /// Puts `config` in force.
    pub fn set(&self, config: Arc<BrokerConfig>) {
        *self.0.write() = config;
    }
}

impl From<ConfigError> for Refused {
    fn from(e: ConfigError) -> Refused {
        Refused {
            key: e.key,
            reason: e.reason,
        }
    }
}

impl Policies for LiveConfig {
    fn log_config(&self, overrides: &BTreeMap<String, String>) -> Result<LogConfig, Refused> {
        Ok(self.get().topic_log_config(overrides)?)
    }

    fn tier_policy(&self, overrides: &BTreeMap<String, String>) -> TierPolicy {
        self.get().tier_policy(overrides)
    }

    fn compaction(&self, overrides: &BTreeMap<String, String>) -> Result<Compaction, Refused> {
        Ok(self.get().compaction(overrides)?)
    }

    fn producer_expiration_ms(&self) -> i64 {
        self.get().num("producer.id.expiration.ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_and_overrides() {
        let c =
            BrokerConfig::from_map(&map(&[("log.segment.bytes", "1048576"), ("data.dir", "/x")])).unwrap();
        assert_eq!(c.data_dir(), PathBuf::from("/x"));
        assert!(c.auto_create_topics());
        let lc = c.topic_log_config(&BTreeMap::new()).unwrap();
        assert_eq!(lc.segment_bytes, 1 << 20);
        let lc = c.topic_log_config(&map(&[("segment.bytes", "4096")])).unwrap();
        assert_eq!(lc.segment_bytes, 4096);
        assert!(c.is_explicit("log.segment.bytes"));
    }

    #[test]
    fn cleaner_and_compaction_settings() {
        let c = BrokerConfig::from_map(&BTreeMap::new()).unwrap();
        let s = c.cleaner_settings();
        assert!(s.enabled);
        assert_eq!((s.threads, s.dedupe_buffer_bytes), (1, 128 << 20));
        assert_eq!(s.io_bytes_per_sec, 50 << 20);
        let unlimited = BrokerConfig::from_map(&map(&[(
            "log.cleaner.io.max.bytes.per.second",
            "1.7976931348623157E308",
        )]))
        .unwrap();
        assert_eq!(
            unlimited.cleaner_settings().io_bytes_per_sec,
            0,
            "Kafka's default"
        );
        let refused = |key: &str, value: &str| BrokerConfig::from_map(&map(&[(key, value)])).unwrap_err().key;
        assert_eq!(refused("log.cleaner.threads", "0"), "log.cleaner.threads");
        assert_eq!(
            refused("log.cleaner.dedupe.buffer.size", "1024"),
            "log.cleaner.dedupe.buffer.size"
        );
        assert_eq!(
            refused("log.cleaner.io.max.bytes.per.second", "-1"),
            "log.cleaner.io.max.bytes.per.second"
        );
        assert_eq!(
            refused("log.cleaner.min.cleanable.ratio", "1.5"),
            "min.cleanable.dirty.ratio"
        );

        let compact = c
            .compaction(&map(&[
                ("cleanup.policy", "compact"),
                ("delete.retention.ms", "5"),
            ]))
            .unwrap();
        assert!(compact.enabled);
        assert_eq!(compact.min_cleanable_dirty_ratio, 0.5);
        assert_eq!(
            (compact.min_compaction_lag_ms, compact.delete_retention_ms),
            (0, 5)
        );
        assert!(!c.compaction(&BTreeMap::new()).unwrap().enabled);
        let err = c
            .check_topic_overrides(&map(&[
                ("min.compaction.lag.ms", "10"),
                ("max.compaction.lag.ms", "5"),
            ]))
            .unwrap_err();
        assert_eq!(err.key, "min.compaction.lag.ms");
        assert!(err.reason.contains("conflict"), "{err}");
        for (key, value) in [
            ("min.cleanable.dirty.ratio", "-0.1"),
            ("delete.retention.ms", "-1"),
        ] {
            assert_eq!(
                c.check_topic_overrides(&map(&[(key, value)])).unwrap_err().key,
                key
            );
        }
    }

    #[test]
    fn cleanup_policies() {
        let c = BrokerConfig::from_map(&BTreeMap::new()).unwrap();
        let policy = |v: &str| c.cleanup_policy(&map(&[("cleanup.policy", v)]));
        assert_eq!(policy("delete").unwrap(), CleanupPolicy::DELETE);
        let both = policy("compact, delete").unwrap();
        assert!(both.compact && both.delete);
        assert!(policy("compact").is_ok_and(|p| p.compact && !p.delete));
        assert!(policy("shred").is_err());
        assert!(c
            .check_topic_overrides(&map(&[("cleanup.policy", "shred")]))
            .is_err());
        let lc = c
            .topic_log_config(&map(&[
                ("cleanup.policy", "compact"),
                ("max.compaction.lag.ms", "5000"),
            ]))
            .unwrap();
        assert_eq!(
            lc.segment_ms, 5000,
            "a compacted log rolls by max.compaction.lag.ms too"
        );
        // Compacted topics use the capacity tier, never the object store.
        assert_eq!(c.tier_policy(&map(&[("cleanup.policy", "compact")])).tier, None);
        let tiered = BrokerConfig::from_map(&map(&[
            ("keel.tier.capacity.dirs", "/capacity"),
            ("keel.tier.remote", "file:///remote"),
        ]))
        .unwrap();
        let compact = map(&[("cleanup.policy", "compact"), ("remote.storage.enable", "true")]);
        assert_eq!(tiered.tier_policy(&compact).tier, Some(keel_log::Tier::Capacity));
        // In a cluster, compacted topics too: any broker may lead them next.
        let cluster = BrokerConfig::from_map(&map(&[
            ("keel.tier.capacity.dirs", "/capacity"),
            ("keel.tier.remote", "file:///remote"),
            ("keel.cluster.etcd.endpoints", "http://127.0.0.1:2379"),
            ("node.id", "1"),
        ]))
        .unwrap();
        let compact = map(&[("cleanup.policy", "compact")]);
        assert_eq!(cluster.tier_policy(&compact).tier, Some(keel_log::Tier::Remote));
    }

    #[test]
    fn compression_and_kafka_4_3_topic_configs() {
        use keel_log::codec::Codec;
        let c = BrokerConfig::from_map(&BTreeMap::new()).unwrap();
        let refused = |pairs: &[(&str, &str)]| c.check_topic_overrides(&map(pairs)).unwrap_err().key;
        assert_eq!(refused(&[("compression.type", "none")]), "compression.type");
        assert_eq!(
            refused(&[("compression.gzip.level", "0")]),
            "compression.gzip.level"
        );
        assert_eq!(
            refused(&[("compression.lz4.level", "18")]),
            "compression.lz4.level"
        );
        assert_eq!(
            refused(&[("compression.zstd.level", "-131073")]),
            "compression.zstd.level"
        );
        assert_eq!(
            refused(&[("follower.replication.throttled.replicas", "0:a")]),
            "follower.replication.throttled.replicas"
        );
        for ok in [
            &[("compression.gzip.level", "-1")][..],
            &[("leader.replication.throttled.replicas", " 0:1 , 1:1 ")],
            &[("remote.log.copy.disable", "true")],
        ] {
            assert!(c.check_topic_overrides(&map(ok)).is_ok(), "{ok:?}");
        }
        // The topic's codec and level; gzip's -1 is its default level.
        assert_eq!(c.topic_compression(&BTreeMap::new()), None);
        assert_eq!(
            c.topic_compression(&map(&[("compression.type", "uncompressed")])),
            Some((Codec::None, None))
        );
        assert_eq!(
            c.topic_compression(&map(&[("compression.type", "gzip")])),
            Some((Codec::Gzip, None))
        );
        assert_eq!(
            c.topic_compression(&map(&[
                ("compression.type", "zstd"),
                ("compression.zstd.level", "-3")
            ])),
            Some((Codec::Zstd, Some(-3)))
        );
        // The broker default applies to topics without an override.
        let b = BrokerConfig::from_map(&map(&[("compression.type", "lz4")])).unwrap();
        assert_eq!(b.topic_compression(&BTreeMap::new()), Some((Codec::Lz4, None)));
        // Topic configs without a broker synonym are not broker keys.
        assert!(BrokerConfig::from_map(&map(&[("remote.log.copy.disable", "true")])).is_err());
        assert!(!known_keys().any(str::is_empty));
    }

    #[test]
    fn read_only_remote_storage_copies_nothing_and_keeps_its_retention() {
        let c = BrokerConfig::from_map(&map(&[("keel.tier.remote", "file:///tmp/keel-remote")])).unwrap();
        let remote = [
            ("remote.storage.enable", "true"),
            ("remote.log.copy.disable", "true"),
        ];
        let policy = c.tier_policy(&map(&remote));
        assert_eq!((policy.tier, policy.copy), (Some(keel_log::Tier::Remote), false));
        assert!(c.tier_policy(&map(&remote[..1])).copy);
        assert!(c.check_topic_overrides(&map(&remote)).is_ok());
        let mut shorter = remote.to_vec();
        shorter.push(("local.retention.bytes", "1000"));
        assert_eq!(
            c.check_topic_overrides(&map(&shorter)).unwrap_err().key,
            "remote.log.copy.disable"
        );
    }

    #[test]
    fn bad_keys_and_values_are_refused() {
        assert!(BrokerConfig::from_map(&map(&[("log.segmnt.bytes", "1")])).is_err());
        assert!(BrokerConfig::from_map(&map(&[("num.partitions", "x")])).is_err());
        assert!(BrokerConfig::from_map(&map(&[("num.partitions", "0")])).is_err());
        let c = BrokerConfig::from_map(&BTreeMap::new()).unwrap();
        assert!(c.check_topic_overrides(&map(&[("retention.ms", "abc")])).is_err());
        assert!(c.check_topic_overrides(&map(&[("no.such", "1")])).is_err());
        assert!(c.check_topic_overrides(&map(&[("segment.bytes", "1")])).is_err());
        assert!(c
            .check_topic_overrides(&map(&[("cleanup.policy", "compact")]))
            .is_ok());
        assert!(c
            .check_topic_overrides(&map(&[("message.timestamp.type", "Sometime")]))
            .is_err());
        assert!(c
            .check_topic_overrides(&map(&[("message.timestamp.type", "LogAppendTime")]))
            .is_ok());
        assert!(BrokerConfig::from_map(&map(&[("group.initial.rebalance.delay.ms", "-1")])).is_err());
        let policy = BrokerConfig::from_map(&map(&[("group.consumer.migration.policy", "sideways")]));
        assert_eq!(
            policy.unwrap_err().reason,
            "sideways: must be one of bidirectional, upgrade, downgrade, disabled"
        );
        let c = BrokerConfig::from_map(&map(&[
            ("group.min.session.timeout.ms", "500"),
            ("offsets.retention.minutes", "2"),
            ("group.consumer.migration.policy", "UPGRADE"),
        ]))
        .unwrap()
        .coordinator_config();
        assert_eq!(c.group.min_session_timeout_ms, 500);
        assert_eq!(c.offsets_retention_ms, 120_000);
        assert_eq!(c.group.initial_rebalance_delay_ms, 3000);
        assert_eq!(
            c.consumer.migration,
            keel_coord::groups::consumer::MigrationPolicy::Upgrade
        );
    }

    #[test]
    fn nested_tier_dirs_are_refused() {
        for (data, capacity) in [
            ("/data", "/data/cold"),
            ("/data/hot", "/data"),
            ("/data", "/data/"),
            ("/data", "/other/../data/x"),
        ] {
            let e =
                BrokerConfig::from_map(&map(&[("log.dirs", data), ("keel.tier.capacity.dirs", capacity)]))
                    .unwrap_err();
            assert_eq!(e.key, "keel.tier.capacity.dirs", "{data} {capacity}");
        }
        let e = BrokerConfig::from_map(&map(&[
            ("log.dirs", "/data"),
            ("keel.tier.remote", "file:///data/bucket"),
        ]))
        .unwrap_err();
        assert_eq!(e.key, "keel.tier.remote");
        assert!(BrokerConfig::from_map(&map(&[
            ("log.dirs", "/data"),
            ("keel.tier.capacity.dirs", "/cold,/colder"),
            ("keel.tier.remote", "file:///bucket")
        ]))
        .is_ok());
        assert!(BrokerConfig::from_map(&map(&[
            ("log.dirs", "/d"),
            ("keel.tier.capacity.dirs", "/c,/c/x")
        ]))
        .is_err());
    }

    #[test]
    fn admin_listen_is_host_port_or_empty() {
        let c = BrokerConfig::from_map(&BTreeMap::new()).unwrap();
        assert_eq!(c.get("keel.admin.listen"), "127.0.0.1:9644");
        for ok in ["", "127.0.0.1:0", "localhost:9644", "[::1]:9644"] {
            assert!(
                BrokerConfig::from_map(&map(&[("keel.admin.listen", ok)])).is_ok(),
                "{ok:?}"
            );
        }
        for bad in ["9644", ":9644", "127.0.0.1:", "127.0.0.1:http", "127.0.0.1:70000"] {
            let e = BrokerConfig::from_map(&map(&[("keel.admin.listen", bad)])).unwrap_err();
            assert_eq!(e.key, "keel.admin.listen", "{bad:?}");
        }
    }
}
