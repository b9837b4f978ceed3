//! One module per group of Kafka APIs. Handlers take a decoded request and
//! return the response body; framing happens in [`crate::broker`].

pub mod admin;
pub mod configs;
pub mod fetch;
pub mod groups;
pub mod metadata;
pub mod offsets;
pub mod produce;
pub mod txn;
pub mod txn_admin;

use keel_protocol::messages::{ApiVersionsResponse, TopicName};
use keel_protocol::StrBytes;

pub fn api_versions() -> ApiVersionsResponse {
    keel_protocol::response::api_versions(0)
}

/// A partition of an existing topic, or UNKNOWN_TOPIC_OR_PARTITION.
pub(crate) fn partition_of(
    broker: &crate::Broker,
    topic: &str,
    index: i32,
) -> Result<std::sync::Arc<crate::partition::Partition>, keel_protocol::ResponseError> {
    broker
        .topics
        .get(topic)
        .and_then(|t| t.partition(index).cloned())
        .ok_or(keel_protocol::ResponseError::UnknownTopicOrPartition)
}

pub(crate) fn str_bytes(s: impl Into<String>) -> StrBytes {
    StrBytes::from_string(s.into())
}

pub(crate) fn topic_name(s: &str) -> TopicName {
    TopicName(str_bytes(s))
}
