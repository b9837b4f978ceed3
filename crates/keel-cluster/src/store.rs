//! The coordination store: what membership, leadership and cluster
//! metadata are kept in. A small key-value interface modelled on etcd's
//! (leases, revisions, compare-and-swap transactions, watches from a
//! revision), so the logic above it is written once and runs unchanged on
//! [`crate::LocalStore`] (one node, and the simulated store of the model
//! tests) and on [`crate::EtcdStore`] (a cluster).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::mpsc;

/// A lease: keys put under it are deleted when it expires or is revoked.
pub type LeaseId = i64;

/// What every store operation returns.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// One key and its value, with the store's revisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    /// The store's revision when the key was created (it changes when the
    /// key is deleted and created again).
    pub create_revision: i64,
    /// The store's revision when the key last changed.
    pub mod_revision: i64,
    /// The lease the key is bound to, 0 for none.
    pub lease: LeaseId,
}

/// The keys under a prefix, and the store's revision they were read at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub kvs: Vec<KeyValue>,
    pub revision: i64,
}

/// A condition of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compare {
    /// The key does not exist.
    Absent(String),
    /// The key exists and last changed at this revision.
    ModRevision(String, i64),
}

/// A write of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Sets a key, bound to a lease (`None`: to no lease). A lease that has
    /// expired fails the whole transaction with [`StoreError::LeaseExpired`].
    Put {
        key: String,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    },
    Delete(String),
}

/// One change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    Put(KeyValue),
    Delete { key: String, mod_revision: i64 },
}

/// The changes under a prefix, in revision order, one batch per store
/// revision. It ends (the receiver yields `None` or an error) when the
/// store can no longer follow; the caller reads again and watches anew.
pub type Watch = mpsc::Receiver<WatchBatch>;

/// One revision's changes, or why the watch ends.
pub type WatchBatch = Result<Vec<WatchEvent>, StoreError>;

/// Why a store operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The store cannot be reached or did not answer in time: the
    /// operation may or may not have taken effect.
    Unavailable(String),
    /// The lease has expired or was revoked.
    LeaseExpired(LeaseId),
    /// A watch asked for revisions the store has compacted away.
    Compacted { revision: i64 },
    /// The store refused the request as malformed.
    Refused(String),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Unavailable(why) => write!(f, "coordination store unavailable: {why}"),
            StoreError::LeaseExpired(lease) => write!(f, "lease {lease:x} has expired"),
            StoreError::Compacted { revision } => {
                write!(f, "revision {revision} is compacted away")
            }
            StoreError::Refused(why) => write!(f, "coordination store refused the request: {why}"),
        }
    }
}

impl std::error::Error for StoreError {}

/// A coordination store.
pub trait CoordStore: Send + Sync + fmt::Debug + 'static {
    /// Where it is, for logs.
    fn describe(&self) -> String;
    /// Whether other brokers share it (a store inside this process alone
    /// is one node's).
    fn is_shared(&self) -> bool {
        true
    }
    /// A new lease that lives `ttl` unless kept alive.
    fn grant(&self, ttl: Duration) -> StoreFuture<'_, LeaseId>;
    /// Renews `lease` for its whole TTL.
    fn keep_alive(&self, lease: LeaseId) -> StoreFuture<'_, ()>;
    /// Ends `lease` now, deleting its keys.
    fn revoke(&self, lease: LeaseId) -> StoreFuture<'_, ()>;
    /// One key.
    fn get(&self, key: &str) -> StoreFuture<'_, Option<KeyValue>>;
    /// Every key starting with `prefix`, in key order.
    fn range(&self, prefix: &str) -> StoreFuture<'_, Snapshot>;
    /// Applies `ops` atomically if every compare holds. The store's new
    /// revision if they were applied, `None` if a compare failed.
    fn txn(&self, when: Vec<Compare>, ops: Vec<Op>) -> StoreFuture<'_, Option<i64>>;
    /// The changes to keys starting with `prefix`, from revision `from`.
    fn watch(&self, prefix: &str, from: i64) -> StoreFuture<'_, Watch>;
}
