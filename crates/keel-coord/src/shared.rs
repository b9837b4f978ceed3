//! A coordinator table kept in the cluster's coordination store instead of
//! a log of this broker's own, so every broker of a cluster reads and
//! writes the same one: the ACLs, the SCRAM credentials, the client quotas.
//!
//! A [`Table`]'s records are already key-value pairs with tombstones (a
//! `None` value), as a compacted Kafka topic's are; here each is one key
//! of the store, `<cluster prefix>/tables/<table name>/<key in hex>`, and a
//! tombstone deletes it. Every broker keeps the whole table in memory:
//! read once, then followed through a watch. A key's revision orders its
//! changes, so a broker applies its own write at once (read-your-writes)
//! and skips the watch's older news of the same key.
//!
//! [`TableStore`] is what a store of records holds: its own log (one node)
//! or a shared table (a cluster), behind the same three calls.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use keel_cluster::store::{KeyValue, Op, WatchEvent};
use keel_cluster::CoordStore;
use parking_lot::Mutex;
use tokio::task::JoinHandle;

use crate::metalog::{MetaLog, StoreError, Table};

/// How long to wait after a failed read or watch before trying again.
const RETRY: Duration = Duration::from_millis(500);

/// Writes per transaction at the most: etcd's default `--max-txn-ops`.
pub const TXN_OPS: usize = keel_cluster::local::MAX_TXN_OPS;

/// The records of a store: its own log, or a table shared by the cluster.
pub enum TableStore<T: Table> {
    Log(MetaLog<T>),
    Shared(Arc<SharedTable<T>>),
}

/// Segment and snapshot size of a store's own log: these tables are small.
const LOG_BYTES: u64 = 1 << 20;

impl<T: Table> TableStore<T> {
    /// A store's records: in the cluster's coordination store when
    /// `cluster` names one (the store and the cluster's key prefix), else
    /// in a log of this broker's own under `dir` (blocking: it is read).
    pub fn open(
        storage: Arc<dyn keel_log::Storage>,
        dir: &std::path::Path,
        cluster: Option<(&Arc<dyn CoordStore>, &str)>,
    ) -> Result<TableStore<T>, crate::metalog::OpenError> {
        Ok(match cluster {
            Some((store, prefix)) => TableStore::Shared(SharedTable::new(Arc::clone(store), prefix)),
            None => TableStore::Log(MetaLog::open_synced(storage, dir, LOG_BYTES)?),
        })
    }

    pub fn with_table<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        match self {
            TableStore::Log(log) => log.with_table(f),
            TableStore::Shared(shared) => shared.with_table(f),
        }
    }

    /// Writes records; resolves once they are durable (in the log file, or
    /// in the coordination store) and applied here.
    pub async fn write(&self, records: Vec<T::Record>) -> Result<(), StoreError> {
        match self {
            TableStore::Log(log) => log.write(records).await,
            TableStore::Shared(shared) => shared.write(records).await,
        }
    }

    /// Reads a shared table and starts following it (nothing for a log,
    /// which is read when it opens).
    pub async fn load(&self) -> Result<(), StoreError> {
        match self {
            TableStore::Log(_) => Ok(()),
            TableStore::Shared(shared) => shared.load().await,
        }
    }

    /// Closes a log (blocking) or stops following a shared table.
    pub fn close(&self) {
        match self {
            TableStore::Log(log) => log.close(),
            TableStore::Shared(shared) => shared.stop(),
        }
    }
}

/// A table every broker of a cluster shares.
pub struct SharedTable<T: Table> {
    store: Arc<dyn CoordStore>,
    /// `<cluster prefix>/tables/<name>/`.
    prefix: String,
    state: Mutex<State<T>>,
    follower: Mutex<Option<JoinHandle<()>>>,
}

struct State<T> {
    table: T,
    /// The store's revision of the last change applied to each key (a
    /// deleted key's too), so an older change never overwrites a newer one.
    revisions: HashMap<String, i64>,
    /// The revision the table was last read whole at: it holds every change
    /// up to there, so a change at or below it to a key it does not know
    /// (one deleted since, say, by another broker) is old news.
    floor: i64,
}

impl<T: Table> SharedTable<T> {
    /// The table `T` of the cluster whose keys are under `cluster_prefix`;
    /// empty until [`SharedTable::load`].
    pub fn new(store: Arc<dyn CoordStore>, cluster_prefix: &str) -> Arc<SharedTable<T>> {
        Arc::new(SharedTable {
            store,
            prefix: format!("{cluster_prefix}/tables/{}/", T::NAME),
            state: Mutex::new(State {
                table: T::default(),
                revisions: HashMap::new(),
                floor: 0,
            }),
            follower: Mutex::new(None),
        })
    }

    pub fn with_table<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        f(&self.state.lock().table)
    }

    /// Reads the whole table (waiting for a store that does not answer),
    /// then follows its changes in the background.
    pub async fn load(self: &Arc<Self>) -> Result<(), StoreError> {
        let revision = loop {
            match self.reload().await {
                Ok(revision) => break revision,
                Err(keel_cluster::StoreError::Unavailable(why)) => {
                    tracing::warn!(table = T::NAME, %why, "waiting for the coordination store");
                    tokio::time::sleep(RETRY).await;
                }
                Err(e) => return Err(StoreError(e.to_string())),
            }
        };
        let follower = tokio::spawn(Arc::clone(self).follow(revision));
        if let Some(old) = self.follower.lock().replace(follower) {
            old.abort();
        }
        Ok(())
    }

    /// Stops following (the table keeps what it has).
    pub fn stop(&self) {
        if let Some(follower) = self.follower.lock().take() {
            follower.abort();
        }
    }

    /// Writes `records` and applies them here at their revision: one
    /// transaction per [`TXN_OPS`] keys (etcd's default limit), the last
    /// record of a key standing for it (etcd refuses a key twice in one
    /// transaction).
    pub async fn write(&self, records: Vec<T::Record>) -> Result<(), StoreError> {
        let mut last: Vec<(String, T::Record)> = Vec::with_capacity(records.len());
        for record in records {
            let key = format!("{}{}", self.prefix, hex(&T::encode(&record).0));
            last.retain(|(k, _)| *k != key);
            last.push((key, record));
        }
        for chunk in last.chunks(TXN_OPS) {
            let ops = chunk
                .iter()
                .map(|(key, record)| match T::encode(record).1 {
                    Some(value) => Op::Put {
                        key: key.clone(),
                        value: value.to_vec(),
                        lease: None,
                    },
                    None => Op::Delete(key.clone()),
                })
                .collect();
            let revision = self
                .store
                .txn(Vec::new(), ops)
                .await
                .map_err(|e| StoreError(e.to_string()))?
                .ok_or_else(|| StoreError("a transaction without conditions was refused".into()))?;
            let mut state = self.state.lock();
            for (key, record) in chunk {
                state.apply(key.clone(), revision, record.clone());
            }
        }
        Ok(())
    }

    /// Reads every key and rebuilds the table from them; the revision read at.
    async fn reload(&self) -> Result<i64, keel_cluster::StoreError> {
        let snapshot = self.store.range(&self.prefix).await?;
        let mut fresh = State {
            table: T::default(),
            revisions: HashMap::new(),
            floor: 0,
        };
        for kv in &snapshot.kvs {
            match self.decode(&kv.key, Some(&kv.value)) {
                Ok(record) => fresh.apply(kv.key.clone(), kv.mod_revision, record),
                Err(why) => tracing::warn!(key = %kv.key, %why, "a shared record Keel cannot read; skipped"),
            }
        }
        fresh.floor = snapshot.revision;
        *self.state.lock() = fresh;
        Ok(snapshot.revision)
    }

    /// Applies the changes after `revision`, reading the whole table again
    /// whenever the watch ends.
    async fn follow(self: Arc<Self>, mut revision: i64) {
        loop {
            match self.store.watch(&self.prefix, revision + 1).await {
                Ok(mut watch) => {
                    while let Some(Ok(events)) = watch.recv().await {
                        for event in events {
                            revision = revision.max(self.apply_event(&event));
                        }
                    }
                }
                Err(e) => tracing::debug!(table = T::NAME, error = %e, "watching a shared table"),
            }
            loop {
                tokio::time::sleep(RETRY).await;
                match self.reload().await {
                    Ok(r) => {
                        revision = r;
                        break;
                    }
                    Err(e) => tracing::debug!(table = T::NAME, error = %e, "reading a shared table"),
                }
            }
        }
    }

    /// Applies one watched change; its revision.
    fn apply_event(&self, event: &WatchEvent) -> i64 {
        let (key, value, revision) = match event {
            WatchEvent::Put(KeyValue {
                key,
                value,
                mod_revision,
                ..
            }) => (key, Some(value.as_slice()), *mod_revision),
            WatchEvent::Delete { key, mod_revision } => (key, None, *mod_revision),
        };
        match self.decode(key, value) {
            Ok(record) => self.state.lock().apply(key.clone(), revision, record),
            Err(why) => tracing::warn!(%key, %why, "a shared record Keel cannot read; skipped"),
        }
        revision
    }

    fn decode(&self, key: &str, value: Option<&[u8]>) -> Result<T::Record, String> {
        let raw = key
            .strip_prefix(&self.prefix)
            .and_then(unhex)
            .ok_or_else(|| "not a key of this table".to_string())?;
        T::decode(&raw, value).map_err(|e| e.to_string())
    }
}

impl<T: Table> State<T> {
    fn apply(&mut self, key: String, revision: i64, record: T::Record) {
        let known = self.revisions.get(&key).copied().unwrap_or(self.floor);
        let newer = known < revision;
        if newer {
            self.revisions.insert(key, revision);
            self.table.apply(record);
        }
    }
}

impl<T: Table> Drop for SharedTable<T> {
    fn drop(&mut self) {
        self.stop();
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    text.as_bytes()
        .chunks(2)
        .map(|pair| {
            let pair = std::str::from_utf8(pair).ok().filter(|p| p.len() == 2)?;
            u8::from_str_radix(pair, 16).ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use bytes::Bytes;
    use keel_cluster::LocalStore;

    use super::*;
    use crate::codec::RecordError;

    /// A key-value table: a record is a key and its value, or its removal.
    #[derive(Debug, Default)]
    struct Kv(BTreeMap<String, String>);

    impl Table for Kv {
        type Record = (String, Option<String>);
        const NAME: &'static str = "kv";

        fn apply(&mut self, (key, value): Self::Record) {
            match value {
                Some(v) => self.0.insert(key, v),
                None => self.0.remove(&key),
            };
        }

        fn records(&self) -> Vec<Self::Record> {
            self.0.iter().map(|(k, v)| (k.clone(), Some(v.clone()))).collect()
        }

        fn encode((key, value): &Self::Record) -> (Bytes, Option<Bytes>) {
            (Bytes::from(key.clone()), value.clone().map(Bytes::from))
        }

        fn decode(key: &[u8], value: Option<&[u8]>) -> Result<Self::Record, RecordError> {
            let text = |b: &[u8]| String::from_utf8(b.to_vec()).map_err(|e| RecordError(e.to_string()));
            Ok((text(key)?, value.map(text).transpose()?))
        }
    }

    fn set(key: &str, value: Option<&str>) -> (String, Option<String>) {
        (key.into(), value.map(str::to_string))
    }

    async fn settled(t: &SharedTable<Kv>, want: &[(&str, &str)]) {
        let want: BTreeMap<String, String> =
            want.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        for _ in 0..200 {
            if t.with_table(|kv| kv.0 == want) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{:?} never became {want:?}", t.with_table(|kv| kv.0.clone()));
    }

    #[tokio::test]
    async fn brokers_see_each_others_writes_and_their_own_at_once() {
        let store: Arc<dyn CoordStore> = Arc::new(LocalStore::new());
        let a = SharedTable::<Kv>::new(Arc::clone(&store), "/keel");
        let b = SharedTable::<Kv>::new(Arc::clone(&store), "/keel");
        a.write(vec![set("early", Some("1"))]).await.unwrap();
        a.load().await.unwrap();
        b.load().await.unwrap();
        assert_eq!(b.with_table(|kv| kv.0.get("early").cloned()), Some("1".into()));
        a.write(vec![set("x", Some("1")), set("y", Some("2"))])
            .await
            .unwrap();
        assert_eq!(
            a.with_table(|kv| kv.0.len()),
            3,
            "its own write, before the watch"
        );
        settled(&b, &[("early", "1"), ("x", "1"), ("y", "2")]).await;
        b.write(vec![set("x", None), set("y", Some("3"))]).await.unwrap();
        settled(&a, &[("early", "1"), ("y", "3")]).await;
        // A table under another prefix is another cluster's.
        let other = SharedTable::<Kv>::new(Arc::clone(&store), "/other");
        other.load().await.unwrap();
        assert!(other.with_table(|kv| kv.0.is_empty()));
    }

    #[tokio::test]
    async fn a_broken_watch_reads_the_table_again_and_misses_nothing() {
        let local = Arc::new(LocalStore::new());
        let store: Arc<dyn CoordStore> = local.clone();
        let a = SharedTable::<Kv>::new(Arc::clone(&store), "/keel");
        let b = SharedTable::<Kv>::new(Arc::clone(&store), "/keel");
        a.load().await.unwrap();
        b.load().await.unwrap();
        a.write(vec![set("k", Some("1")), set("gone", Some("1"))])
            .await
            .unwrap();
        settled(&b, &[("k", "1"), ("gone", "1")]).await;
        // A cut ends every watch; the followers read again once the store
        // answers, and follow from there.
        local.set_available(false);
        tokio::time::sleep(RETRY + Duration::from_millis(100)).await;
        local.set_available(true);
        a.write(vec![set("k", Some("2")), set("gone", None)])
            .await
            .unwrap();
        settled(&b, &[("k", "2")]).await;
        a.write(vec![set("later", Some("1"))]).await.unwrap();
        settled(&b, &[("k", "2"), ("later", "1")]).await;
        // An older change of a key never overwrites a newer one.
        let mut state = b.state.lock();
        let key = format!("/keel/tables/kv/{}", hex(b"k"));
        let newest = state.revisions[&key];
        state.apply(key, newest - 1, set("k", Some("stale")));
        assert_eq!(state.table.0["k"], "2");
    }

    #[tokio::test]
    async fn a_write_answered_after_a_reload_does_not_bring_back_a_deleted_key() {
        let store: Arc<dyn CoordStore> = Arc::new(LocalStore::new());
        let a = SharedTable::<Kv>::new(Arc::clone(&store), "/keel");
        let b = SharedTable::<Kv>::new(Arc::clone(&store), "/keel");
        a.load().await.unwrap();
        // a's write lands at some revision, and b deletes the key after it;
        // a reads the table whole, and only then hears of its own write.
        let key = format!("/keel/tables/kv/{}", hex(b"k"));
        let put = Op::Put {
            key: key.clone(),
            value: b"1".to_vec(),
            lease: None,
        };
        let written = store.txn(vec![], vec![put]).await.unwrap().unwrap();
        b.write(vec![set("k", None)]).await.unwrap();
        a.stop();
        a.reload().await.unwrap();
        a.state.lock().apply(key, written, set("k", Some("1")));
        assert!(a.with_table(|kv| kv.0.is_empty()), "older than the table it read");
    }

    #[tokio::test]
    async fn a_key_written_twice_and_more_writes_than_one_transaction_takes() {
        let store: Arc<dyn CoordStore> = Arc::new(LocalStore::new());
        let a = SharedTable::<Kv>::new(Arc::clone(&store), "/keel");
        a.load().await.unwrap();
        let mut records = vec![set("dup", Some("first")), set("dup", Some("second"))];
        records.extend((0..300).map(|i| (format!("k{i}"), Some(i.to_string()))));
        a.write(records).await.unwrap();
        assert_eq!(a.with_table(|kv| kv.0["dup"].clone()), "second");
        let stored = store.range("/keel/tables/kv/").await.unwrap();
        assert_eq!(stored.kvs.len(), 301);
        // Three transactions: 301 keys at 128 a piece.
        assert_eq!(stored.revision, 3);
    }

    #[test]
    fn keys_round_trip_through_hex() {
        for key in [&b""[..], b"\x00\xff", b"topic-\x01"] {
            assert_eq!(unhex(&hex(key)).as_deref(), Some(key));
        }
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
    }
}
