//! Keel's coordinators: consumer groups ([`groups`], classic and KIP-848)
//! and transactions ([`txn`]), and what they keep.
//!
//! A coordinator's state lives in a [`metalog::MetaLog`]: records in a
//! partition log of Keel's own, applied in order to an in-memory table,
//! with snapshots so a start replays only the log's tail. Its records are
//! encoded field by field as Kafka's own coordinator records are
//! ([`codec`]). In a cluster, the stores every broker shares (ACLs, SCRAM
//! credentials, quotas) keep their tables in the coordination store
//! instead ([`shared`]). Time comes in through `keel_log::clock::Clock`. The crate
//! knows nothing about sockets, requests or partitions' data: the broker's
//! handlers drive the coordinators and write transaction markers.

pub mod codec;
pub mod groups;
pub mod metalog;
pub mod partitioned;
pub mod share;
pub mod shared;
pub mod txn;
