//! [`EtcdStore`]: the coordination store on an etcd cluster (v3 API, through
//! `etcd-client`). Every request has a deadline, so a store that stops
//! answering is [`StoreError::Unavailable`] after it, never a hang.

use std::time::Duration;

use etcd_client::{
    Client, Compare as EtcdCompare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, Txn, TxnOp,
    WatchOptions,
};
use tokio::sync::mpsc;

use crate::store::{
    Compare, CoordStore, KeyValue, LeaseId, Op, Snapshot, StoreError, StoreFuture, Watch, WatchEvent,
};

/// Changes a watch may hold for a slow reader before it waits on it.
const WATCH_BACKLOG: usize = 256;

#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    endpoints: Vec<String>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.endpoints)
            .finish()
    }
}

impl EtcdStore {
    /// A client of the etcd cluster at `endpoints` (`http://host:port`);
    /// each request gives up after `timeout`.
    pub async fn connect(endpoints: &[String], timeout: Duration) -> Result<EtcdStore, StoreError> {
        let options = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_timeout(timeout)
            .with_keep_alive(timeout, timeout)
            .with_keep_alive_while_idle(true)
            // A member cut off from etcd's majority ends its watches
            // instead of leaving them open and silent.
            .with_require_leader(true);
        let client = tokio::time::timeout(timeout, Client::connect(endpoints, Some(options)))
            .await
            .map_err(|_| {
                StoreError::Unavailable(format!("no answer from {} in {timeout:?}", endpoints.join(",")))
            })?
            .map_err(error)?;
        Ok(EtcdStore {
            client,
            endpoints: endpoints.to_vec(),
        })
    }
}

/// The store error an etcd error means.
fn error(e: etcd_client::Error) -> StoreError {
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            let message = status.message().to_string();
            match status.code() as i32 {
                tonic_code::NOT_FOUND if message.contains("lease not found") => StoreError::LeaseExpired(0),
                tonic_code::INVALID_ARGUMENT | tonic_code::FAILED_PRECONDITION | tonic_code::OUT_OF_RANGE => {
                    StoreError::Refused(message)
                }
                _ => StoreError::Unavailable(message),
            }
        }
        // etcd-client reports a keep-alive for a lease etcd no longer has
        // as its own error, not as a gRPC status.
        etcd_client::Error::LeaseKeepAliveError(message) if message.contains("lease not found") => {
            StoreError::LeaseExpired(0)
        }
        other => StoreError::Unavailable(other.to_string()),
    }
}

/// The gRPC status codes told apart (etcd-client re-exports tonic's
/// `Status`, whose `Code` is numbered as gRPC numbers them).
mod tonic_code {
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const NOT_FOUND: i32 = 5;
    pub const FAILED_PRECONDITION: i32 = 9;
    pub const OUT_OF_RANGE: i32 = 11;
}

fn convert(kv: &etcd_client::KeyValue) -> KeyValue {
    KeyValue {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        lease: kv.lease(),
    }
}

impl CoordStore for EtcdStore {
    fn describe(&self) -> String {
        format!("etcd at {}", self.endpoints.join(","))
    }

    fn grant(&self, ttl: Duration) -> StoreFuture<'_, LeaseId> {
        let mut client = self.client.clone();
        Box::pin(async move {
            // etcd counts TTLs in whole seconds.
            let seconds = i64::try_from(ttl.as_millis().div_ceil(1000)).unwrap_or(i64::MAX);
            let granted = client.lease_grant(seconds, None).await.map_err(error)?;
            if granted.ttl() > seconds {
                // etcd raises a TTL below its minimum (1.5 election
                // timeouts); the broker still fences itself on its own,
                // shorter, timeout, so it only leaves later than asked.
                tracing::warn!(
                    asked_s = seconds,
                    granted_s = granted.ttl(),
                    "etcd granted a longer lease than keel.cluster.session.timeout.ms asks"
                );
            }
            Ok(granted.id())
        })
    }

    fn keep_alive(&self, lease: LeaseId) -> StoreFuture<'_, ()> {
        let mut client = self.client.clone();
        Box::pin(async move {
            let named = |e| match error(e) {
                StoreError::LeaseExpired(_) => StoreError::LeaseExpired(lease),
                other => other,
            };
            // Opening the stream sends one renewal and checks its answer
            // (a lease etcd no longer has is an error).
            client.lease_keep_alive(lease).await.map_err(named)?;
            Ok(())
        })
    }

    fn revoke(&self, lease: LeaseId) -> StoreFuture<'_, ()> {
        let mut client = self.client.clone();
        Box::pin(async move {
            match client.lease_revoke(lease).await.map_err(error) {
                Ok(_) | Err(StoreError::LeaseExpired(_)) => Ok(()),
                Err(e) => Err(e),
            }
        })
    }

    fn get(&self, key: &str) -> StoreFuture<'_, Option<KeyValue>> {
        let mut client = self.client.clone();
        let key = key.to_string();
        Box::pin(async move {
            let answer = client.get(key, None).await.map_err(error)?;
            Ok(answer.kvs().first().map(convert))
        })
    }

    fn range(&self, prefix: &str) -> StoreFuture<'_, Snapshot> {
        let mut client = self.client.clone();
        let prefix = prefix.to_string();
        Box::pin(async move {
            let answer = client
                .get(prefix, Some(GetOptions::new().with_prefix()))
                .await
                .map_err(error)?;
            Ok(Snapshot {
                kvs: answer.kvs().iter().map(convert).collect(),
                revision: answer.header().map_or(0, |h| h.revision()),
            })
        })
    }

    fn txn(&self, when: Vec<Compare>, ops: Vec<Op>) -> StoreFuture<'_, Option<i64>> {
        let mut client = self.client.clone();
        Box::pin(async move {
            let compares: Vec<EtcdCompare> = when
                .into_iter()
                .map(|c| match c {
                    // A key that does not exist has create revision 0.
                    Compare::Absent(key) => EtcdCompare::create_revision(key, CompareOp::Equal, 0),
                    Compare::ModRevision(key, rev) => EtcdCompare::mod_revision(key, CompareOp::Equal, rev),
                })
                .collect();
            let mut leases = Vec::new();
            let ops: Vec<TxnOp> = ops
                .into_iter()
                .map(|op| match op {
                    Op::Put { key, value, lease } => {
                        leases.extend(lease);
                        let options = lease.map(|l| PutOptions::new().with_lease(l));
                        TxnOp::put(key, value, options)
                    }
                    Op::Delete(key) => TxnOp::delete(key, None),
                })
                .collect();
            let answer = client
                .txn(Txn::new().when(compares).and_then(ops))
                .await
                .map_err(|e| match error(e) {
                    StoreError::LeaseExpired(_) => {
                        StoreError::LeaseExpired(leases.first().copied().unwrap_or(0))
                    }
                    other => other,
                })?;
            Ok(answer
                .succeeded()
                .then(|| answer.header().map_or(0, |h| h.revision())))
        })
    }

    fn watch(&self, prefix: &str, from: i64) -> StoreFuture<'_, Watch> {
        let mut client = self.client.clone();
        let prefix = prefix.to_string();
        Box::pin(async move {
            let options = WatchOptions::new().with_prefix().with_start_revision(from);
            let mut stream = client.watch(prefix, Some(options)).await.map_err(error)?;
            let (tx, rx) = mpsc::channel(WATCH_BACKLOG);
            tokio::spawn(async move {
                loop {
                    // A watcher that has gone ends the etcd watch at once.
                    let message = tokio::select! {
                        message = stream.message() => message,
                        () = tx.closed() => return,
                    };
                    let answer = match message {
                        Ok(Some(answer)) => answer,
                        Ok(None) => return,
                        Err(e) => {
                            let _ = tx.send(Err(error(e))).await;
                            return;
                        }
                    };
                    if answer.compact_revision() > 0 {
                        let revision = answer.compact_revision();
                        let _ = tx.send(Err(StoreError::Compacted { revision })).await;
                        return;
                    }
                    if answer.canceled() {
                        let why = answer.cancel_reason().to_string();
                        let _ = tx.send(Err(StoreError::Unavailable(why))).await;
                        return;
                    }
                    let events: Vec<WatchEvent> = answer
                        .events()
                        .iter()
                        .filter_map(|e| {
                            let kv = e.kv()?;
                            Some(match e.event_type() {
                                EventType::Put => WatchEvent::Put(convert(kv)),
                                EventType::Delete => WatchEvent::Delete {
                                    key: String::from_utf8_lossy(kv.key()).into_owned(),
                                    mod_revision: kv.mod_revision(),
                                },
                            })
                        })
                        .collect();
                    if !events.is_empty() && tx.send(Ok(events)).await.is_err() {
                        return; // the watcher has gone
                    }
                }
            });
            Ok(rx)
        })
    }
}
