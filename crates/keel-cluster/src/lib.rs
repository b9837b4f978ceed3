//! The coordination seam and what runs on it.
//!
//! [`CoordStore`] is a small key-value store with leases, compare-and-swap
//! transactions and watches: [`LocalStore`] inside one process (one-node
//! mode, and the simulated store of the model tests) or [`EtcdStore`] on an
//! etcd cluster. [`Membership`] keeps a broker's session on it, follows the
//! other brokers and elects the controller, the same code on either store.
//! [`producer_ids`] hands a cluster's brokers disjoint blocks of producer
//! ids. [`topics`] keeps the cluster's topics and their partitions'
//! leaders, which the controller elects. [`logs`] commits partitions'
//! logs (the WAL objects their batches are in, and their high watermarks)
//! and fences their earlier leaders.
//!
//! Does not know: Kafka requests, partitions, the data directory.

pub mod etcd;
pub mod local;
pub mod logs;
pub mod membership;
pub mod producer_ids;
pub mod store;
pub mod topics;

use std::sync::Arc;
use std::time::Duration;

pub use etcd::EtcdStore;
pub use local::LocalStore;
pub use membership::{Controller, Endpoint, JoinError, Member, Membership, Registration, Settings};
pub use store::{CoordStore, StoreError};

/// The coordination store named by `keel.cluster.etcd.endpoints`: none
/// (an empty list) is one node on a [`LocalStore`]; each request to etcd
/// gives up after a third of the session timeout.
pub async fn connect(
    endpoints: &[String],
    session_timeout: Duration,
) -> Result<Arc<dyn CoordStore>, StoreError> {
    if endpoints.is_empty() {
        return Ok(Arc::new(LocalStore::new()));
    }
    let store = EtcdStore::connect(endpoints, session_timeout / 3).await?;
    Ok(Arc::new(store))
}
