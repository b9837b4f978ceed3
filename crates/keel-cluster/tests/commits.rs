//! A model test of the commit protocol (`keel_cluster::logs`): brokers
//! whose sessions end and begin again, a controller handing one
//! partition's leadership around in rising epochs, leaders that write,
//! claim and commit, zombies that keep committing after they were
//! deposed, and a coordination store that fails requests and loses
//! answers to transactions it applied. After every step the committed
//! WAL ranges in the store must tile the partition's log from offset 0 to
//! its committed end without overlap, and every record a broker
//! acknowledged must be in that log at the offset it was acknowledged at.
//! Printed seed (`KEEL_TEST_SEED` replays one).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use keel_cluster::logs::{self, Claimed, CommitPart, PartOutcome, Session, WalIndex, WalRange};
use keel_cluster::store::{Compare, KeyValue, LeaseId, Op, Snapshot, StoreFuture, Watch};
use keel_cluster::{CoordStore, LocalStore, Settings, StoreError};
use keel_log::testing::test_seed;
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use uuid::Uuid;

/// A store that fails a request before it reaches the store, or applies
/// a transaction and loses its answer.
#[derive(Debug)]
struct Flaky {
    store: LocalStore,
    rng: Mutex<SmallRng>,
}

impl Flaky {
    fn roll(&self) -> f64 {
        self.rng.lock().gen()
    }
}

fn lost() -> StoreError {
    StoreError::Unavailable("injected".into())
}

impl CoordStore for Flaky {
    fn describe(&self) -> String {
        "flaky".into()
    }
    fn grant(&self, ttl: Duration) -> StoreFuture<'_, LeaseId> {
        self.store.grant(ttl)
    }
    fn keep_alive(&self, lease: LeaseId) -> StoreFuture<'_, ()> {
        self.store.keep_alive(lease)
    }
    fn revoke(&self, lease: LeaseId) -> StoreFuture<'_, ()> {
        self.store.revoke(lease)
    }
    fn get(&self, key: &str) -> StoreFuture<'_, Option<KeyValue>> {
        if self.roll() < 0.05 {
            return Box::pin(async { Err(lost()) });
        }
        self.store.get(key)
    }
    fn range(&self, prefix: &str) -> StoreFuture<'_, Snapshot> {
        self.store.range(prefix)
    }
    fn txn(&self, when: Vec<Compare>, ops: Vec<Op>) -> StoreFuture<'_, Option<i64>> {
        let roll = self.roll();
        Box::pin(async move {
            if roll < 0.1 {
                return Err(lost());
            }
            let applied = self.store.txn(when, ops).await?;
            if roll < 0.2 {
                // Applied (or refused), but the answer never arrives.
                let _ = applied;
                return Err(lost());
            }
            Ok(applied)
        })
    }
    fn watch(&self, prefix: &str, from: i64) -> StoreFuture<'_, Watch> {
        self.store.watch(prefix, from)
    }
}

/// One broker's model: its session, its local log of record ids, and
/// its leadership term.
#[derive(Default)]
struct Broker {
    session: Option<Session>,
    log: Vec<u64>,
    /// Claimed: the epoch and the revision the next commit compares.
    term: Option<(i32, i64)>,
    /// Offsets written locally and not yet committed start here.
    committed: i64,
    /// An object whose commit got no answer, retried as it was.
    retry: Option<(String, CommitPart)>,
}

struct Model {
    store: Arc<Flaky>,
    settings: Settings,
    topic: Uuid,
    brokers: Vec<Broker>,
    epoch: i32,
    /// Record id -> the offset it was acknowledged at.
    acked: HashMap<u64, i64>,
    /// What each committed object held: object name -> records.
    objects: HashMap<String, Vec<u64>>,
    next_record: u64,
    next_object: u64,
}

impl Model {
    async fn register(&mut self, b: usize) {
        let put = Op::Put {
            key: format!("{}/brokers/{}", self.settings.prefix, b),
            value: b"{}".to_vec(),
            lease: None,
        };
        if let Ok(Some(epoch)) = self.store.store.txn(vec![], vec![put]).await {
            let broker = &mut self.brokers[b];
            broker.session = Some(Session {
                node_id: b as i32,
                epoch,
            });
            broker.term = None;
            broker.retry = None;
        }
    }

    async fn end_session(&mut self, b: usize) {
        let key = format!("{}/brokers/{}", self.settings.prefix, b);
        self.store.store.txn(vec![], vec![Op::Delete(key)]).await.unwrap();
    }

    /// The committed log, from the WAL indexes in the store, checked to
    /// tile 0..end without overlap.
    async fn committed_log(&self) -> Vec<u64> {
        let indexes = self
            .store
            .store
            .range(&format!("{}.wal/", self.settings.prefix))
            .await
            .unwrap();
        let mut ranges: Vec<(WalRange, String)> = Vec::new();
        for kv in &indexes.kvs {
            let index: WalIndex = serde_json::from_slice(&kv.value).unwrap();
            ranges.extend(index.ranges.into_iter().map(|r| (r, index.object.clone())));
        }
        ranges.sort_by_key(|(r, _)| r.base_offset);
        let mut log = Vec::new();
        for (r, object) in &ranges {
            assert_eq!(
                r.base_offset,
                log.len() as i64,
                "committed ranges overlap or leave a gap: {ranges:?}"
            );
            log.extend_from_slice(&self.objects[object]);
            assert_eq!(r.end_offset, log.len() as i64);
        }
        let key = logs::log_key(&self.settings, self.topic, 0);
        if let Some(kv) = self.store.store.get(&key).await.unwrap() {
            let commit: logs::LogCommit = serde_json::from_slice(&kv.value).unwrap();
            assert_eq!(
                commit.end_offset,
                log.len() as i64,
                "the commit key's end is not the log's"
            );
        }
        log
    }

    async fn claim(&mut self, b: usize, epoch: i32) {
        let Some(session) = self.brokers[b].session else {
            return;
        };
        let local_end = self.brokers[b].log.len() as i64;
        let claimed = logs::claim(
            &*self.store,
            &self.settings,
            session,
            (self.topic, 0),
            epoch,
            (0, local_end),
        )
        .await;
        let Ok(Some(Claimed {
            end_offset,
            revision,
            writer,
            ..
        })) = claimed
        else {
            return;
        };
        // The writer cuts what it never committed; any other broker takes
        // what was committed (a failover replaying the object store).
        let committed = self.committed_log().await;
        let broker = &mut self.brokers[b];
        let end = end_offset as usize;
        if writer == b as i32 && local_end >= end_offset {
            assert_eq!(
                broker.log[..end],
                committed[..end],
                "broker {b}, the writer, holds records that were not committed"
            );
            broker.log.truncate(end);
        } else {
            broker.log = committed[..end].to_vec();
        }
        broker.term = Some((epoch, revision));
        broker.committed = end_offset;
        broker.retry = None;
    }

    fn write(&mut self, b: usize, n: usize) {
        if self.brokers[b].term.is_none() {
            return;
        }
        for _ in 0..n {
            self.next_record += 1;
            self.brokers[b].log.push(self.next_record);
        }
    }

    async fn commit(&mut self, b: usize) {
        let broker = &self.brokers[b];
        let (Some(session), Some((epoch, revision))) = (broker.session, broker.term) else {
            return;
        };
        let (object, part) = match &broker.retry {
            Some(retry) => retry.clone(),
            None => {
                let end = broker.log.len() as i64;
                if end == broker.committed {
                    return;
                }
                self.next_object += 1;
                let object = format!("o{}", self.next_object);
                let records = broker.log[broker.committed as usize..].to_vec();
                self.objects.insert(object.clone(), records);
                let range = WalRange {
                    topic_id: self.topic,
                    partition: 0,
                    leader_epoch: epoch,
                    base_offset: broker.committed,
                    end_offset: end,
                    position: 0,
                    length: 1,
                };
                let part = CommitPart {
                    range,
                    revision,
                    log_start: 0,
                };
                (object, part)
            }
        };
        let outcome = logs::commit(
            &*self.store,
            &self.settings,
            session,
            (&object, &object),
            std::slice::from_ref(&part),
        )
        .await;
        let broker = &mut self.brokers[b];
        match outcome {
            Err(_) => broker.retry = Some((object, part)),
            Ok(Some(outcomes)) => {
                broker.retry = None;
                match outcomes[0] {
                    PartOutcome::Committed(rev) => {
                        let r = &part.range;
                        for offset in r.base_offset..r.end_offset {
                            let record = broker.log[offset as usize];
                            assert!(self.acked.insert(record, offset).is_none(), "acknowledged twice");
                        }
                        broker.committed = r.end_offset;
                        broker.term = Some((epoch, rev));
                    }
                    PartOutcome::Fenced => broker.term = None,
                }
            }
            Ok(None) => {
                broker.retry = None;
                broker.term = None;
            }
        }
    }

    async fn check(&self) {
        let log = self.committed_log().await;
        for (record, offset) in &self.acked {
            assert_eq!(
                log.get(*offset as usize),
                Some(record),
                "record {record} acknowledged at {offset} is not there"
            );
        }
    }
}

#[tokio::test]
async fn committed_logs_never_overlap_and_keep_every_acknowledged_record() {
    let seed = test_seed();
    let mut acked_rounds = 0u32;
    for round in 0..20u64 {
        let mut rng = SmallRng::seed_from_u64(seed.wrapping_add(round));
        let store = Arc::new(Flaky {
            store: LocalStore::new(),
            rng: Mutex::new(SmallRng::seed_from_u64(seed ^ round.wrapping_mul(0x9e37))),
        });
        let mut m = Model {
            store,
            settings: Settings {
                prefix: "/m".into(),
                session_timeout: Duration::from_secs(6),
                leader_balance: None,
            },
            topic: Uuid::from_u64_pair(seed, round),
            brokers: (0..3).map(|_| Broker::default()).collect(),
            epoch: 0,
            acked: HashMap::new(),
            objects: HashMap::new(),
            next_record: 0,
            next_object: 0,
        };
        for b in 0..3 {
            m.register(b).await;
        }
        for _ in 0..300 {
            let b = rng.gen_range(0..3);
            match rng.gen_range(0..100) {
                0..=4 => m.end_session(b).await,
                5..=9 => m.register(b).await,
                10..=17 => {
                    // The controller elects b in a new epoch; b claims.
                    m.epoch += 1;
                    let epoch = m.epoch;
                    m.claim(b, epoch).await;
                }
                18..=20 => {
                    // A claim in an epoch older than the newest: refused
                    // unless no newer one was claimed yet.
                    let epoch = rng.gen_range(0..=m.epoch);
                    m.claim(b, epoch).await;
                }
                21..=60 => {
                    let n = rng.gen_range(1..5);
                    m.write(b, n);
                }
                _ => m.commit(b).await,
            }
            m.check().await;
        }
        acked_rounds += u32::from(!m.acked.is_empty());
    }
    // A round's random walk may acknowledge nothing (claims and faults
    // all the way: about one round in twenty); most rounds not doing so
    // would mean commits rarely land.
    println!("seed {seed}: {acked_rounds} of 20 rounds acknowledged records");
    assert!(
        acked_rounds >= 10,
        "seed {seed}: only {acked_rounds} of 20 rounds acknowledged records"
    );
}
