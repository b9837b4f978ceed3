//! One module per group of Kafka APIs. Handlers take a decoded request and
//! return the response body; framing happens in [`crate::broker`].

pub mod acls;
pub mod admin;
pub mod alter_configs;
pub mod authz;
pub(crate) mod broker_configs;
pub mod configs;
pub mod consumer_groups;
pub mod elect;
pub mod fetch;
pub mod groups;
pub mod leader_hints;
pub mod log_dirs;
pub mod markers;
pub mod metadata;
pub mod offsets;
pub mod produce;
pub mod quotas;
pub(crate) mod record_checks;
pub mod sasl;
pub mod scram;
pub mod share;
pub mod txn;
pub mod txn_admin;

use keel_protocol::messages::api_versions_response::{FinalizedFeatureKey, SupportedFeatureKey};
use keel_protocol::messages::{ApiVersionsResponse, TopicName};
use keel_protocol::StrBytes;

/// Kafka's config resource types (`ConfigResource.Type`).
pub(crate) mod config_resource {
    pub const RESOURCE_TOPIC: i8 = 2;
    pub const RESOURCE_BROKER: i8 = 4;
    pub const RESOURCE_BROKER_LOGGER: i8 = 8;
    pub const RESOURCE_CLIENT_METRICS: i8 = 16;
    pub const RESOURCE_GROUP: i8 = 32;
}

/// Authorized-operations masks: bit `n` is Kafka's `AclOperation` id `n`.
/// Without an authorizer Kafka reports every operation the resource type
/// supports (`AclEntry.supportedOperations`), and so does Keel.
pub(crate) mod operations {
    const READ: i32 = 3;
    const WRITE: i32 = 4;
    const CREATE: i32 = 5;
    const DELETE: i32 = 6;
    const ALTER: i32 = 7;
    const DESCRIBE: i32 = 8;
    const CLUSTER_ACTION: i32 = 9;
    const DESCRIBE_CONFIGS: i32 = 10;
    const ALTER_CONFIGS: i32 = 11;
    const IDEMPOTENT_WRITE: i32 = 12;

    const fn mask(ops: &[i32]) -> i32 {
        let mut m = 0;
        let mut i = 0;
        while i < ops.len() {
            m |= 1 << ops[i];
            i += 1;
        }
        m
    }

    /// "Not requested".
    pub const OMITTED: i32 = i32::MIN;

    /// `mask` when the request asked for authorized operations, else
    /// [`OMITTED`].
    pub fn if_asked(asked: bool, mask: i32) -> i32 {
        if asked {
            mask
        } else {
            OMITTED
        }
    }
    pub const TOPIC: i32 = mask(&[
        READ,
        WRITE,
        CREATE,
        DELETE,
        ALTER,
        DESCRIBE,
        DESCRIBE_CONFIGS,
        ALTER_CONFIGS,
    ]);
    pub const GROUP: i32 = mask(&[READ, DESCRIBE, DELETE]);
    pub const CLUSTER: i32 = mask(&[
        CREATE,
        CLUSTER_ACTION,
        DESCRIBE_CONFIGS,
        ALTER_CONFIGS,
        IDEMPOTENT_WRITE,
        ALTER,
        DESCRIBE,
    ]);
}

/// The feature flag that selects Kafka's transaction protocol version
/// (KIP-890): 2 is transactions v2.
pub const TRANSACTION_VERSION_FEATURE: &str = "transaction.version";
/// `group.version` 1: the consumer group protocol (KIP-848) is served.
pub const GROUP_VERSION_FEATURE: &str = "group.version";
pub const GROUP_VERSION: i16 = 1;
/// `metadata.version` 30 is Kafka 4.3-IV0's: the level of the protocol
/// Keel answers (it has no KRaft metadata log to move between levels, so
/// it supports that one only).
/// `share.version` 1: share groups (KIP-932) are served; the level is
/// `keel.share.version`.
pub const SHARE_VERSION_FEATURE: &str = "share.version";
pub const METADATA_VERSION_FEATURE: &str = "metadata.version";
pub const METADATA_VERSION: i16 = 30;

/// ApiVersions: the APIs, and (v3+) the features, as a KRaft broker
/// reports them: `metadata.version` at Kafka 4.3-IV0's level,
/// `group.version` finalized at 1, and
/// `transaction.version` supported 0 to 2 and finalized at
/// `keel.transaction.version`, which clients read to choose the protocol,
/// and `share.version` supported 0 to 1 and finalized at
/// `keel.share.version`.
pub fn api_versions(broker: &crate::Broker) -> ApiVersionsResponse {
    let level = broker.config().transaction_version();
    let supported = |name: &str, min: i16, max: i16| {
        SupportedFeatureKey::default()
            .with_name(str_bytes(name))
            .with_min_version(min)
            .with_max_version(max)
    };
    let finalized = |name: &str, level: i16| {
        FinalizedFeatureKey::default()
            .with_name(str_bytes(name))
            .with_min_version_level(level)
            .with_max_version_level(level)
    };
    let mut finals = vec![
        finalized(METADATA_VERSION_FEATURE, METADATA_VERSION),
        finalized(GROUP_VERSION_FEATURE, GROUP_VERSION),
    ];
    // Kafka leaves a feature at level 0 out of the finalized ones.
    if level > 0 {
        finals.push(finalized(TRANSACTION_VERSION_FEATURE, level));
    }
    if share::enabled(broker) {
        finals.push(finalized(SHARE_VERSION_FEATURE, broker.config().share_version()));
    }
    keel_protocol::response::api_versions(0)
        .with_supported_features(vec![
            supported(METADATA_VERSION_FEATURE, METADATA_VERSION, METADATA_VERSION),
            supported(GROUP_VERSION_FEATURE, 0, GROUP_VERSION),
            supported(
                TRANSACTION_VERSION_FEATURE,
                0,
                keel_coord::txn::state::TRANSACTION_VERSION_2,
            ),
            supported(SHARE_VERSION_FEATURE, 0, 1),
        ])
        .with_finalized_features_epoch(broker.features_epoch)
        .with_finalized_features(finals)
}

/// A partition of an existing topic this broker leads, for a request
/// without a leader epoch; else UNKNOWN_TOPIC_OR_PARTITION or
/// NOT_LEADER_OR_FOLLOWER.
pub(crate) fn partition_of(
    broker: &crate::Broker,
    topic: &str,
    index: i32,
) -> Result<std::sync::Arc<keel_data::partition::Partition>, keel_protocol::ResponseError> {
    broker.data.lead_by_name(topic, index).map_err(|e| e.error())
}

/// Whether partition `index` of the topic `topic` exists, wherever it is
/// led: what a group's offset commit or a transaction's partitions are
/// checked against.
pub(crate) fn partition_exists(broker: &crate::Broker, topic: &str, index: i32) -> bool {
    broker
        .data
        .topics
        .get(topic)
        .is_some_and(|t| t.partition(index).is_some())
}

pub(crate) fn str_bytes(s: impl Into<String>) -> StrBytes {
    StrBytes::from_string(s.into())
}

pub(crate) fn topic_name(s: &str) -> TopicName {
    TopicName(str_bytes(s))
}
