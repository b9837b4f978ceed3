//! Client quotas, as Kafka's (KIP-13, KIP-55, KIP-124, KIP-219): byte
//! rates for producers (`producer_byte_rate`) and consumers
//! (`consumer_byte_rate`) and request handling time
//! (`request_percentage`) set per user, per client id, their defaults and their combinations with
//! AlterClientQuotas (`kafka-configs --alter --entity-type users/clients`),
//! described with DescribeClientQuotas.
//!
//! The quotas live in a coordinator log of their own
//! (`__keel_meta/quotas`, see `crate::metalog`): a change is acknowledged
//! once it is in the log. Enforcement keeps one [`rate::Rate`] per quota
//! key and per `(user, client-id)` the matching quota names (see
//! [`table::QuotaTable::resolve`]), over `quota.window.num` windows of
//! `quota.window.size.seconds`. A Produce's request bytes and a Fetch's
//! response bytes are recorded; over the quota, the response carries the
//! throttle time Kafka computes and the connection reads nothing more for
//! that long (KIP-219), so even a client that ignores `throttle_time_ms`
//! is held to the rate. A Fetch over its quota is answered empty (its
//! bytes are taken back), as Kafka does. Every request's handling time
//! (the time its task was polled on a request thread, see
//! `RequestTrace::busy`) is recorded against `request_percentage`, in
//! percent of one thread, and throttles any response (at most a window).
//! Topic and partition creations and deletions are held to
//! `controller_mutation_rate` with Kafka's token bucket ([`Mutations`]).
//! New connections from an address
//! are held to its `connection_creation_rate` (KIP-612): one over it is
//! held unread for the throttle time (at most a window) and then closed.
//!
//! A client's user is the one its connection authenticated as (a TLS
//! client certificate's mapped name); until it does, Kafka's
//! unauthenticated principal, `ANONYMOUS`.

pub mod rate;
pub mod table;
mod throttle;

pub use throttle::Throttle;

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use keel_log::Storage;
use parking_lot::Mutex;

use keel_coord::metalog::StoreError;
use keel_coord::shared::TableStore;
use rate::{Rate, TokenBucket, Windows};
use table::{
    Entity, QuotaRecord, QuotaTable, RateKey, CONNECTION_CREATION_RATE, CONTROLLER_MUTATION_RATE,
    REQUEST_PERCENTAGE,
};

/// The user of a client that has not authenticated.
pub const ANONYMOUS: &str = "ANONYMOUS";

/// Rates and buckets not used for this long are forgotten (Kafka expires
/// its quota sensors after an hour of inactivity).
const RATE_IDLE_MS: i64 = 3_600_000;

/// Idle entries are looked for at least this often.
const SWEEP_EVERY_MS: i64 = 60_000;

/// Entries kept before a sweep is due by count.
const ENTRIES_BEFORE_SWEEP: usize = 10_000;

/// Per-client quota state (a rate, a token bucket) by key, each entry
/// forgotten once unused for [`RATE_IDLE_MS`]. A sweep for idle entries
/// walks the whole map, so it runs once a minute or when the map has
/// doubled since the last one: however many client ids come and go, a
/// request pays a constant share of the sweeps on average, and the map
/// holds at most the clients of the last hour.
struct ClientStates<K, V> {
    entries: HashMap<K, (V, i64)>,
    sweep_at_len: usize,
    sweep_at_ms: i64,
    sweeps: u64,
}

impl<K: std::hash::Hash + Eq, V> ClientStates<K, V> {
    fn new() -> ClientStates<K, V> {
        ClientStates {
            entries: HashMap::new(),
            sweep_at_len: ENTRIES_BEFORE_SWEEP,
            sweep_at_ms: i64::MIN,
            sweeps: 0,
        }
    }

    /// The entry for `key`, made by `new` if there is none, marked used.
    fn get(&mut self, key: K, now_ms: i64, new: impl FnOnce() -> V) -> &mut V {
        if self.entries.len() >= self.sweep_at_len || now_ms >= self.sweep_at_ms {
            self.entries
                .retain(|_, (_, used_ms)| now_ms - *used_ms < RATE_IDLE_MS);
            self.sweep_at_len = (2 * self.entries.len()).max(ENTRIES_BEFORE_SWEEP);
            self.sweep_at_ms = now_ms.saturating_add(SWEEP_EVERY_MS);
            self.sweeps += 1;
        }
        let (value, used_ms) = self.entries.entry(key).or_insert_with(|| (new(), now_ms));
        *used_ms = now_ms;
        value
    }
}

pub struct ClientQuotas {
    store: TableStore<QuotaTable>,
    windows: Windows,
    /// By quota key and the `(user, client-id)` its rate is kept for.
    rates: Mutex<ClientStates<(&'static str, RateKey), Rate>>,
    /// `controller_mutation_rate`'s buckets, by `(user, client-id)`.
    buckets: Mutex<ClientStates<RateKey, TokenBucket>>,
}

/// One request's `controller_mutation_rate` (KIP-599), asked before each
/// topic's partitions are created or deleted. Strict (CreateTopics v6+,
/// DeleteTopics v5+, CreatePartitions v3+): a mutation is refused with
/// THROTTLING_QUOTA_EXCEEDED while the bucket is below zero, and one that
/// finds it at or above zero is done even if it overdraws it. Permissive
/// (older versions, whose clients do not know the error): every mutation
/// is done and the response is throttled.
pub struct Mutations<'a> {
    quotas: &'a ClientQuotas,
    /// The quota and whose bucket; `None` without a quota.
    bucket: Option<(f64, RateKey)>,
    strict: bool,
    throttle_ms: i64,
}

impl Mutations<'_> {
    /// Asks to create or delete `partitions` partitions; false if the quota
    /// refuses them (strict only).
    pub fn admit(&mut self, partitions: i32, now_ms: i64) -> bool {
        let Some((quota, key)) = &self.bucket else {
            return true;
        };
        let mut buckets = self.quotas.buckets.lock();
        let windows = self.quotas.windows;
        let bucket = buckets.get(key.clone(), now_ms, || TokenBucket::new(windows, now_ms));
        if self.strict {
            let owed_ms = bucket.throttle_ms(*quota, now_ms);
            if owed_ms > 0 {
                self.throttle_ms = owed_ms;
                return false;
            }
            bucket.take(*quota, f64::from(partitions.max(0)), now_ms);
        } else {
            bucket.take(*quota, f64::from(partitions.max(0)), now_ms);
            self.throttle_ms = bucket.throttle_ms(*quota, now_ms);
        }
        true
    }

    /// The response's throttle time: the last refusal's (strict) or the
    /// overdraft's (permissive), in ms.
    pub fn throttle_ms(&self) -> i64 {
        self.throttle_ms
    }
}

impl ClientQuotas {
    /// Loads the quota log through `storage`. Blocking.
    pub fn open_with(
        storage: Arc<dyn Storage>,
        dir: &Path,
        windows: Windows,
    ) -> Result<ClientQuotas, keel_coord::metalog::OpenError> {
        Ok(ClientQuotas::new(TableStore::open(storage, dir, None)?, windows))
    }

    /// The quotas in `store` (a log, or the cluster's shared table).
    pub fn new(store: TableStore<QuotaTable>, windows: Windows) -> ClientQuotas {
        ClientQuotas {
            store,
            windows,
            rates: Mutex::new(ClientStates::new()),
            buckets: Mutex::new(ClientStates::new()),
        }
    }

    /// Reads a shared table and follows it (nothing for a log).
    pub async fn load(&self) -> Result<(), StoreError> {
        self.store.load().await
    }

    /// Every entity with quotas, and its values.
    pub fn all(&self) -> BTreeMap<Entity, BTreeMap<String, f64>> {
        self.store.with_table(|t| t.quotas.clone())
    }

    /// Persists quota changes; in force once this returns.
    pub async fn write(&self, records: Vec<QuotaRecord>) -> Result<(), StoreError> {
        self.store.write(records).await
    }

    /// Records `amount` against the quota `key` of `user` / `client_id` and
    /// returns the throttle time in ms (0 within the quota, or with none).
    /// `take_back` removes the amount again when throttled (a Fetch that is
    /// answered empty).
    pub fn record(
        &self,
        key: &'static str,
        user: &str,
        client_id: &str,
        amount: f64,
        take_back: bool,
        now_ms: i64,
    ) -> i64 {
        let Some((bound, rate_key)) = self.store.with_table(|t| t.resolve(key, user, client_id)) else {
            return 0;
        };
        self.record_at(key, rate_key, bound, amount, take_back, now_ms)
    }

    /// The `controller_mutation_rate` of one request of `user` /
    /// `client_id`, strict or permissive by its version.
    pub fn mutations(&self, user: &str, client_id: &str, strict: bool) -> Mutations<'_> {
        Mutations {
            quotas: self,
            bucket: self
                .store
                .with_table(|t| t.resolve(CONTROLLER_MUTATION_RATE, user, client_id)),
            strict,
            throttle_ms: 0,
        }
    }

    /// Records `busy` (the time a request occupied a request thread)
    /// against the `request_percentage` of `user` / `client_id`, as Kafka
    /// does: in percent of one thread over a second. Returns the throttle
    /// time, at most one window, as Kafka bounds it.
    pub fn record_request_time(&self, user: &str, client_id: &str, busy: Duration, now_ms: i64) -> i64 {
        let percent_seconds = busy.as_secs_f64() * 100.0;
        let throttle = self.record(
            REQUEST_PERCENTAGE,
            user,
            client_id,
            percent_seconds,
            false,
            now_ms,
        );
        throttle.min(self.windows.window_ms)
    }

    /// Records a new connection from `ip` against its
    /// `connection_creation_rate` and returns how long to hold it before
    /// closing it unread, in ms, or 0 to serve it. As in Kafka, the hold is
    /// at most one window, and a refused connection is not counted.
    pub fn record_connection(&self, ip: IpAddr, now_ms: i64) -> i64 {
        let Some(bound) = self.store.with_table(|t| t.resolve_ip(ip)) else {
            return 0;
        };
        let key = (ip.to_string(), String::new());
        let throttle = self.record_at(CONNECTION_CREATION_RATE, key, bound, 1.0, true, now_ms);
        throttle.min(self.windows.window_ms)
    }

    /// Records `amount` on the rate kept for `key` / `rate_key` and returns
    /// the throttle time against `bound`.
    fn record_at(
        &self,
        key: &'static str,
        rate_key: RateKey,
        bound: f64,
        amount: f64,
        take_back: bool,
        now_ms: i64,
    ) -> i64 {
        let mut rates = self.rates.lock();
        let windows = self.windows;
        let rate = rates.get((key, rate_key), now_ms, || Rate::new(windows));
        rate.record(amount, now_ms);
        let throttle = rate.throttle_ms(bound, now_ms);
        if throttle > 0 && take_back {
            rate.record(-amount, now_ms);
        }
        throttle
    }

    /// Flushes and closes the quota log. Blocking.
    pub fn close(&self) {
        self.store.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use table::{CLIENT_ID, PRODUCER_BYTE_RATE};

    fn quotas_with_defaults(dir: &Path) -> ClientQuotas {
        let quotas =
            ClientQuotas::open_with(keel_log::DiskStorage::shared(), dir, Windows::default()).unwrap();
        let default_client: Entity = [(CLIENT_ID.to_string(), None)].into();
        let records = [PRODUCER_BYTE_RATE, CONTROLLER_MUTATION_RATE].map(|key| QuotaRecord {
            entity: default_client.clone(),
            key: key.into(),
            value: Some(1e9),
        });
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(quotas.write(records.to_vec())).unwrap();
        quotas
    }

    /// A flood of client ids (each with its own rate under a client-id
    /// default quota) costs a sweep each time the rates double, not one
    /// per request past a threshold; rates and mutation buckets unused
    /// for an hour are forgotten at the next sweep.
    #[test]
    fn rotating_client_ids_are_swept_rarely_and_forgotten_when_idle() {
        let dir = tempfile::tempdir().unwrap();
        let quotas = quotas_with_defaults(dir.path());
        let clients = 50_000;
        for i in 0..clients {
            let client = format!("client-{i}");
            quotas.record(PRODUCER_BYTE_RATE, ANONYMOUS, &client, 1.0, false, 1_000);
            assert!(quotas.mutations(ANONYMOUS, &client, true).admit(1, 1_000));
        }
        let rates = quotas.rates.lock();
        assert_eq!(rates.entries.len(), clients);
        // 10,000, 20,000 and 40,000 entries, and the first call.
        assert!(rates.sweeps <= 4, "{} sweeps for {clients} clients", rates.sweeps);
        drop(rates);
        assert_eq!(quotas.buckets.lock().entries.len(), clients);
        let later = 1_000 + RATE_IDLE_MS + 1;
        quotas.record(PRODUCER_BYTE_RATE, ANONYMOUS, "new", 1.0, false, later);
        assert!(quotas.mutations(ANONYMOUS, "new", true).admit(1, later));
        assert_eq!(quotas.rates.lock().entries.len(), 1, "idle rates are forgotten");
        assert_eq!(
            quotas.buckets.lock().entries.len(),
            1,
            "idle buckets are forgotten"
        );
        quotas.close();
    }
}
