//! Keel's coordinators: what they keep and how it reaches the disk.
//!
//! A coordinator's state lives in a [`metalog::MetaLog`]: records in a
//! partition log of Keel's own, applied in order to an in-memory table,
//! with snapshots so a start replays only the log's tail. Its records are
//! encoded field by field as Kafka's own coordinator records are
//! ([`codec`]). The crate knows nothing about sockets or requests.

pub mod codec;
pub mod metalog;
