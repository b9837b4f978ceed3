//! One module per group of Kafka APIs. Handlers take a decoded request and
//! return the response body; framing happens in [`crate::broker`].

pub mod admin;
pub mod configs;
pub mod fetch;
pub mod groups;
pub mod metadata;
pub mod offsets;
pub mod produce;

use keel_protocol::messages::{ApiVersionsResponse, TopicName};
use keel_protocol::StrBytes;

pub fn api_versions() -> ApiVersionsResponse {
    keel_protocol::response::api_versions(0)
}

pub(crate) fn str_bytes(s: impl Into<String>) -> StrBytes {
    StrBytes::from_string(s.into())
}

pub(crate) fn topic_name(s: &str) -> TopicName {
    TopicName(str_bytes(s))
}
