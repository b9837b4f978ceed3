//! Keel's Kafka semantics: what each request means, above the partition log.
//!
//! Entry point: [`Broker::open`] loads topics and recovers their logs;
//! [`Broker::handle`] turns one request frame into at most one response
//! frame. Partitions and topics are keel-data's, the group and transaction
//! coordinators keel-coord's, authentication and ACLs keel-auth's; this
//! crate decides what each request asks of them. It knows nothing about
//! sockets (the server crate owns them) and nothing about segment files
//! (the log crate owns them).

#[cfg(test)]
mod background;
pub mod broker;
mod dispatch;
pub mod dynamic_config;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod group_configs;
mod handlers;
pub mod loggers;
mod maintenance;
pub mod metrics;
pub mod peers;
pub mod quotas;
#[cfg(test)]
mod testing;
pub mod trace;

pub use broker::{Broker, ClientInfo, Reply, StartError};

/// Kafka's checks of one partition's records in a Produce request (see the
/// Produce handler): the batch headers if they pass, else the Kafka error
/// and a message.
pub fn validate_produce_records(
    records: &[u8],
    max_batch_bytes: usize,
) -> Result<Vec<keel_log::BatchHeader>, (keel_protocol::ResponseError, String)> {
    handlers::produce::check_records(records, max_batch_bytes)
}
