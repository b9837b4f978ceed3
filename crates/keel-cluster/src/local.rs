//! [`LocalStore`]: the coordination store inside one process. One-node
//! mode runs on it: its leases never expire (the process is the whole
//! cluster, and its session ends with it). Given a clock it expires leases
//! on their TTL and can be made unreachable, which makes it the simulated
//! store the model tests run membership against.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keel_log::clock::Clock;
use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::store::{
    Compare, CoordStore, KeyValue, LeaseId, Op, Snapshot, StoreError, StoreFuture, Watch, WatchBatch,
    WatchEvent,
};

/// Writes one transaction may hold: etcd's default `--max-txn-ops`.
pub const MAX_TXN_OPS: usize = 128;

/// Events a watcher may fall behind by before its watch is ended (it then
/// reads again, as after any broken watch).
const WATCH_BACKLOG: usize = 1024;

#[derive(Default)]
pub struct LocalStore {
    state: Mutex<State>,
    /// Expires leases when set; `None`: leases live until revoked.
    clock: Option<Arc<dyn Clock>>,
    unavailable: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    revision: i64,
    kvs: BTreeMap<String, KeyValue>,
    /// Each lease's TTL and when it expires (ms on the clock).
    leases: HashMap<LeaseId, (i64, i64)>,
    next_lease: LeaseId,
    watchers: Vec<(String, mpsc::Sender<WatchBatch>)>,
}

impl std::fmt::Debug for LocalStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalStore")
            .field("state", &self.state)
            .field("expires_leases", &self.clock.is_some())
            .field("unavailable", &self.unavailable)
            .finish()
    }
}

impl LocalStore {
    /// A store whose leases never expire.
    pub fn new() -> LocalStore {
        LocalStore::default()
    }

    /// A store whose leases expire on `clock` (see [`LocalStore::expire`]).
    pub fn with_clock(clock: Arc<dyn Clock>) -> LocalStore {
        LocalStore {
            clock: Some(clock),
            ..LocalStore::default()
        }
    }

    /// Makes every operation fail with [`StoreError::Unavailable`] and
    /// ends every watch (a network cut from the store), or work again.
    pub fn set_available(&self, available: bool) {
        self.unavailable.store(!available, Ordering::SeqCst);
        if !available {
            self.state.lock().watchers.clear();
        }
    }

    /// Ends every lease whose time has passed, deleting its keys. Every
    /// operation does this first; a test calls it after moving the clock.
    pub fn expire(&self) {
        let Some(now) = self.clock.as_ref().map(|c| c.now_ms()) else {
            return;
        };
        let mut state = self.state.lock();
        let due: Vec<LeaseId> = state
            .leases
            .iter()
            .filter(|(_, (_, deadline))| *deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for lease in due {
            state.end_lease(lease);
        }
    }

    /// The state, after expiring what is due; unreachable stores fail.
    fn lock(&self) -> Result<parking_lot::MutexGuard<'_, State>, StoreError> {
        if self.unavailable.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("the store is cut off".into()));
        }
        self.expire();
        Ok(self.state.lock())
    }

    fn now_ms(&self) -> i64 {
        self.clock.as_ref().map_or(0, |c| c.now_ms())
    }
}

impl State {
    fn end_lease(&mut self, lease: LeaseId) {
        self.leases.remove(&lease);
        let keys: Vec<String> = self
            .kvs
            .values()
            .filter(|kv| kv.lease == lease)
            .map(|kv| kv.key.clone())
            .collect();
        if !keys.is_empty() {
            self.revision += 1;
            let events = keys
                .into_iter()
                .map(|key| {
                    self.kvs.remove(&key);
                    WatchEvent::Delete {
                        key,
                        mod_revision: self.revision,
                    }
                })
                .collect();
            self.publish(events);
        }
    }

    fn holds(&self, compare: &Compare) -> bool {
        match compare {
            Compare::Absent(key) => !self.kvs.contains_key(key),
            Compare::ModRevision(key, rev) => self.kvs.get(key).is_some_and(|kv| kv.mod_revision == *rev),
        }
    }

    /// Sends each watcher the events under its prefix; a watcher that has
    /// gone or fallen too far behind is dropped (its watch ends).
    fn publish(&mut self, events: Vec<WatchEvent>) {
        self.watchers.retain(|(prefix, tx)| {
            let mine: Vec<WatchEvent> = events
                .iter()
                .filter(|e| match e {
                    WatchEvent::Put(kv) => kv.key.starts_with(prefix.as_str()),
                    WatchEvent::Delete { key, .. } => key.starts_with(prefix.as_str()),
                })
                .cloned()
                .collect();
            mine.is_empty() || tx.try_send(Ok(mine)).is_ok()
        });
    }
}

impl CoordStore for LocalStore {
    fn is_shared(&self) -> bool {
        false
    }

    fn describe(&self) -> String {
        "in-process (one node)".into()
    }

    fn grant(&self, ttl: Duration) -> StoreFuture<'_, LeaseId> {
        let result = self.lock().map(|mut state| {
            state.next_lease += 1;
            let id = state.next_lease;
            let ttl = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
            let deadline = self.now_ms().saturating_add(ttl);
            state.leases.insert(id, (ttl, deadline));
            id
        });
        Box::pin(std::future::ready(result))
    }

    fn keep_alive(&self, lease: LeaseId) -> StoreFuture<'_, ()> {
        let now = self.now_ms();
        let result = self
            .lock()
            .and_then(|mut state| match state.leases.get_mut(&lease) {
                Some((ttl, deadline)) => {
                    *deadline = now.saturating_add(*ttl);
                    Ok(())
                }
                None => Err(StoreError::LeaseExpired(lease)),
            });
        Box::pin(std::future::ready(result))
    }

    fn revoke(&self, lease: LeaseId) -> StoreFuture<'_, ()> {
        let result = self.lock().map(|mut state| state.end_lease(lease));
        Box::pin(std::future::ready(result))
    }

    fn get(&self, key: &str) -> StoreFuture<'_, Option<KeyValue>> {
        let result = self.lock().map(|state| state.kvs.get(key).cloned());
        Box::pin(std::future::ready(result))
    }

    fn range(&self, prefix: &str) -> StoreFuture<'_, Snapshot> {
        let result = self.lock().map(|state| Snapshot {
            kvs: state
                .kvs
                .range(prefix.to_string()..)
                .take_while(|(k, _)| k.starts_with(prefix))
                .map(|(_, kv)| kv.clone())
                .collect(),
            revision: state.revision,
        });
        Box::pin(std::future::ready(result))
    }

    fn txn(&self, when: Vec<Compare>, ops: Vec<Op>) -> StoreFuture<'_, Option<i64>> {
        let result = self.lock().and_then(|mut state| {
            if !when.iter().all(|c| state.holds(c)) {
                return Ok(None);
            }
            // As etcd refuses them.
            let mut keys = std::collections::HashSet::new();
            for op in &ops {
                let key = match op {
                    Op::Put { key, .. } | Op::Delete(key) => key,
                };
                if !keys.insert(key) {
                    return Err(StoreError::Refused(format!(
                        "duplicate key given in txn request: {key}"
                    )));
                }
            }
            if ops.len() > MAX_TXN_OPS {
                return Err(StoreError::Refused("too many operations in txn request".into()));
            }
            for op in &ops {
                if let Op::Put {
                    lease: Some(lease), ..
                } = op
                {
                    if !state.leases.contains_key(lease) {
                        return Err(StoreError::LeaseExpired(*lease));
                    }
                }
            }
            state.revision += 1;
            let revision = state.revision;
            let mut events = Vec::new();
            for op in ops {
                match op {
                    Op::Put { key, value, lease } => {
                        let create_revision = state.kvs.get(&key).map_or(revision, |kv| kv.create_revision);
                        let kv = KeyValue {
                            key: key.clone(),
                            value,
                            create_revision,
                            mod_revision: revision,
                            lease: lease.unwrap_or(0),
                        };
                        state.kvs.insert(key, kv.clone());
                        events.push(WatchEvent::Put(kv));
                    }
                    Op::Delete(key) => {
                        if state.kvs.remove(&key).is_some() {
                            events.push(WatchEvent::Delete {
                                key,
                                mod_revision: revision,
                            });
                        }
                    }
                }
            }
            state.publish(events);
            Ok(Some(revision))
        });
        Box::pin(std::future::ready(result))
    }

    /// Watches from the next revision only: the local store keeps no
    /// history, so `from` must be past what the caller has read.
    fn watch(&self, prefix: &str, from: i64) -> StoreFuture<'_, Watch> {
        let result = self.lock().and_then(|mut state| {
            if from <= state.revision {
                return Err(StoreError::Compacted { revision: from });
            }
            let (tx, rx) = mpsc::channel(WATCH_BACKLOG);
            state.watchers.push((prefix.to_string(), tx));
            Ok(rx)
        });
        Box::pin(std::future::ready(result))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicI64;

    use super::*;

    #[derive(Default)]
    struct ManualClock(AtomicI64);

    impl Clock for ManualClock {
        fn now_ms(&self) -> i64 {
            self.0.load(Ordering::SeqCst)
        }
    }

    fn put(key: &str, value: &str, lease: Option<LeaseId>) -> Op {
        Op::Put {
            key: key.into(),
            value: value.into(),
            lease,
        }
    }

    #[tokio::test]
    async fn transactions_compare_revisions_and_absence() {
        let store = LocalStore::new();
        let first = store
            .txn(vec![Compare::Absent("/k".into())], vec![put("/k", "a", None)])
            .await;
        let rev = first.unwrap().expect("absent, so applied");
        let again = store
            .txn(vec![Compare::Absent("/k".into())], vec![put("/k", "b", None)])
            .await;
        assert_eq!(again.unwrap(), None, "present now");
        let stale = store
            .txn(
                vec![Compare::ModRevision("/k".into(), rev - 1)],
                vec![put("/k", "c", None)],
            )
            .await;
        assert_eq!(stale.unwrap(), None);
        let current = store
            .txn(
                vec![Compare::ModRevision("/k".into(), rev)],
                vec![put("/k", "d", None)],
            )
            .await;
        assert!(current.unwrap().is_some());
        let kv = store.get("/k").await.unwrap().unwrap();
        assert_eq!((kv.value.as_slice(), kv.create_revision), (&b"d"[..], rev));
        let snapshot = store.range("/").await.unwrap();
        assert_eq!(snapshot.kvs.len(), 1);
        assert_eq!(snapshot.revision, kv.mod_revision);
    }

    #[tokio::test]
    async fn an_expired_lease_takes_its_keys_and_refuses_puts_and_renewals() {
        let clock = Arc::new(ManualClock::default());
        let store = LocalStore::with_clock(clock.clone());
        let lease = store.grant(Duration::from_millis(1000)).await.unwrap();
        store
            .txn(vec![], vec![put("/a/1", "x", Some(lease))])
            .await
            .unwrap();
        let from = store.range("/a/").await.unwrap().revision + 1;
        let mut watch = store.watch("/a/", from).await.unwrap();
        clock.0.store(900, Ordering::SeqCst);
        store.keep_alive(lease).await.unwrap();
        clock.0.store(1800, Ordering::SeqCst);
        assert!(
            store.get("/a/1").await.unwrap().is_some(),
            "renewed at 900, lives to 1900"
        );
        clock.0.store(1900, Ordering::SeqCst);
        assert!(store.get("/a/1").await.unwrap().is_none());
        let events = watch.recv().await.unwrap().unwrap();
        assert!(matches!(&events[..], [WatchEvent::Delete { key, .. }] if key == "/a/1"));
        assert_eq!(
            store.keep_alive(lease).await,
            Err(StoreError::LeaseExpired(lease))
        );
        let refused = store.txn(vec![], vec![put("/a/2", "y", Some(lease))]).await;
        assert_eq!(refused, Err(StoreError::LeaseExpired(lease)));
        assert!(
            store.get("/a/2").await.unwrap().is_none(),
            "nothing of a refused txn applies"
        );
    }

    #[tokio::test]
    async fn a_watch_from_a_revision_already_read_past_is_refused_and_a_cut_store_answers_nothing() {
        let store = LocalStore::new();
        store.txn(vec![], vec![put("/k", "a", None)]).await.unwrap();
        let revision = store.range("/").await.unwrap().revision;
        assert_eq!(
            store.watch("/", revision).await.err(),
            Some(StoreError::Compacted { revision })
        );
        store.set_available(false);
        assert!(matches!(store.get("/k").await, Err(StoreError::Unavailable(_))));
        store.set_available(true);
        assert!(store.get("/k").await.unwrap().is_some());
    }
}
