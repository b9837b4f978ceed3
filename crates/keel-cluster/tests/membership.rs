//! Membership against the in-process store with expiring leases, on
//! tokio's paused clock: brokers join, crash, lose the store and come
//! back, and the model tests drive random sequences of that (the second
//! with a topic whose leaders the controller moves) with a printed seed
//! (`KEEL_TEST_SEED` repeats one).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keel_cluster::store::{Compare, KeyValue, LeaseId, Op, Snapshot, StoreFuture, Watch};
use keel_cluster::topics::{self, ClusterTopic};
use keel_cluster::{
    CoordStore, Endpoint, JoinError, LocalStore, Membership, Registration, Settings, StoreError,
};
use keel_log::clock::Clock;
use keel_log::testing::test_seed;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const TTL: Duration = Duration::from_secs(6);

/// Milliseconds on tokio's (paused) clock.
struct TokioClock(tokio::time::Instant);

impl Clock for TokioClock {
    fn now_ms(&self) -> i64 {
        self.0.elapsed().as_millis() as i64
    }
}

fn shared_store() -> Arc<LocalStore> {
    Arc::new(LocalStore::with_clock(Arc::new(TokioClock(
        tokio::time::Instant::now(),
    ))))
}

/// One broker's way to the shared store, which the test can cut (failing
/// new requests and ending open watches) or make lossy (a request takes
/// effect but its answer is lost).
#[derive(Debug)]
struct Link {
    store: Arc<LocalStore>,
    up: AtomicBool,
    lossy: AtomicBool,
    /// How late its watches deliver each change, in ms.
    lag_ms: std::sync::atomic::AtomicU64,
    cuts: tokio::sync::watch::Sender<u64>,
}

impl Link {
    fn new(store: &Arc<LocalStore>) -> Arc<Link> {
        Arc::new(Link {
            store: Arc::clone(store),
            up: AtomicBool::new(true),
            lossy: AtomicBool::new(false),
            lag_ms: std::sync::atomic::AtomicU64::new(0),
            cuts: tokio::sync::watch::channel(0).0,
        })
    }

    fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        self.cuts.send_modify(|n| *n += 1);
    }

    fn heal(&self) {
        self.up.store(true, Ordering::SeqCst);
    }

    /// `answer`, unless answers are being lost: then the request has taken
    /// effect, but the caller hears only that the store did not answer.
    fn lose<'a, T: Send + 'a>(&'a self, answer: StoreFuture<'a, T>) -> StoreFuture<'a, T> {
        let lossy = self.lossy.load(Ordering::SeqCst);
        Box::pin(async move {
            let result = answer.await;
            if lossy {
                Err(StoreError::Unavailable("answer lost".into()))
            } else {
                result
            }
        })
    }

    fn check(&self) -> Result<(), StoreError> {
        if self.up.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(StoreError::Unavailable("cut".into()))
        }
    }
}

macro_rules! through {
    ($self:ident, $call:expr) => {{
        match $self.check() {
            Ok(()) => $call,
            // As a real client does, it finds out only when its request
            // times out.
            Err(e) => Box::pin(async move {
                tokio::time::sleep(TTL / 3).await;
                Err(e)
            }),
        }
    }};
}

impl CoordStore for Link {
    fn describe(&self) -> String {
        "link".into()
    }
    fn grant(&self, ttl: Duration) -> StoreFuture<'_, LeaseId> {
        through!(self, self.lose(self.store.grant(ttl)))
    }
    fn keep_alive(&self, lease: LeaseId) -> StoreFuture<'_, ()> {
        through!(self, self.lose(self.store.keep_alive(lease)))
    }
    fn revoke(&self, lease: LeaseId) -> StoreFuture<'_, ()> {
        through!(self, self.store.revoke(lease))
    }
    fn get(&self, key: &str) -> StoreFuture<'_, Option<KeyValue>> {
        through!(self, self.store.get(key))
    }
    fn range(&self, prefix: &str) -> StoreFuture<'_, Snapshot> {
        through!(self, self.store.range(prefix))
    }
    fn txn(&self, when: Vec<Compare>, ops: Vec<Op>) -> StoreFuture<'_, Option<i64>> {
        through!(self, self.lose(self.store.txn(when, ops)))
    }
    /// A watch that a cut ends, and that delivers each change `lag_ms`
    /// late.
    fn watch(&self, prefix: &str, from: i64) -> StoreFuture<'_, Watch> {
        let mut cuts = self.cuts.subscribe();
        let prefix = prefix.to_string();
        let lag = Duration::from_millis(self.lag_ms.load(Ordering::SeqCst));
        through!(
            self,
            Box::pin(async move {
                let mut inner = self.store.watch(&prefix, from).await?;
                let (tx, rx) = tokio::sync::mpsc::channel(1024);
                tokio::spawn(async move {
                    loop {
                        tokio::select! {
                            next = inner.recv() => {
                                let Some(batch) = next else { return };
                                tokio::time::sleep(lag).await;
                                if tx.send(batch).await.is_err() {
                                    return;
                                }
                            }
                            _ = cuts.changed() => return,
                        }
                    }
                });
                Ok(rx)
            })
        )
    }
}

fn registration(node_id: i32, directory: &str) -> Registration {
    Registration {
        node_id,
        rack: None,
        endpoints: vec![Endpoint {
            listener: "PLAINTEXT".into(),
            host: "127.0.0.1".into(),
            port: 9000 + node_id,
        }],
        directory_id: directory.into(),
    }
}

fn settings() -> Settings {
    Settings {
        prefix: "/keel".into(),
        session_timeout: TTL,
        leader_balance: None,
    }
}

fn ids(m: &Membership) -> Vec<i32> {
    m.members().iter().map(|m| m.registration.node_id).collect()
}

async fn join(link: &Arc<Link>, node_id: i32) -> Arc<Membership> {
    let m = Membership::new(
        link.clone(),
        settings(),
        registration(node_id, &format!("dir-{node_id}")),
    );
    m.start().await.unwrap();
    m
}

async fn settle(time: Duration) {
    tokio::time::sleep(time).await;
}

#[tokio::test(start_paused = true)]
async fn brokers_see_each_other_and_agree_on_one_controller() {
    let store = shared_store();
    let links: Vec<_> = (0..3).map(|_| Link::new(&store)).collect();
    let mut brokers = Vec::new();
    for (i, link) in links.iter().enumerate() {
        brokers.push(join(link, i as i32 + 1).await);
    }
    settle(Duration::from_millis(10)).await;
    for b in &brokers {
        assert_eq!(ids(b), [1, 2, 3]);
        assert_eq!(
            b.controller().map(|c| c.node_id),
            Some(1),
            "the first to join is elected"
        );
        assert!(!b.is_fenced());
    }
    let cluster_id = Membership::claim_cluster_id(store.as_ref(), &settings(), "first").await;
    assert_eq!(cluster_id.unwrap(), "first");
    let again = Membership::claim_cluster_id(store.as_ref(), &settings(), "second").await;
    assert_eq!(again.unwrap(), "first", "the first claim stands");
}

#[tokio::test(start_paused = true)]
async fn a_crashed_controller_is_replaced_after_its_session_times_out() {
    let store = shared_store();
    let links: Vec<_> = (0..3).map(|_| Link::new(&store)).collect();
    let mut brokers = Vec::new();
    for (i, link) in links.iter().enumerate() {
        brokers.push(join(link, i as i32 + 1).await);
    }
    let before = brokers[1].controller().unwrap();
    brokers[0].abandon();
    settle(TTL / 2).await;
    assert_eq!(ids(&brokers[1]), [1, 2, 3], "not gone before its lease expires");
    settle(TTL).await;
    for b in &brokers[1..] {
        assert_eq!(ids(b), [2, 3]);
        let now = b.controller().expect("a new controller");
        assert_ne!(now.node_id, 1);
        assert!(now.epoch > before.epoch, "{now:?} after {before:?}");
    }
    // A clean leave is seen at once.
    brokers[2].leave().await;
    settle(Duration::from_millis(10)).await;
    assert_eq!(ids(&brokers[1]), [2]);
    assert_eq!(brokers[1].controller().map(|c| c.node_id), Some(2));
}

#[tokio::test(start_paused = true)]
async fn a_broker_cut_from_the_store_fences_itself_and_rejoins_in_a_new_epoch() {
    let store = shared_store();
    let (a, b) = (Link::new(&store), Link::new(&store));
    let one = join(&a, 1).await;
    let two = join(&b, 2).await;
    let epoch = two.broker_epoch();
    b.cut();
    settle(TTL + TTL / 3).await;
    assert!(
        two.is_fenced(),
        "no renewal confirmed for a whole session timeout"
    );
    assert_eq!(ids(&one), [1], "its lease expired for the others");
    b.heal();
    settle(TTL).await;
    assert!(!two.is_fenced());
    assert!(two.broker_epoch() > epoch, "a new session, a new epoch");
    assert_eq!(ids(&one), [1, 2]);
    assert_eq!(ids(&two), [1, 2]);
}

#[tokio::test(start_paused = true)]
async fn a_node_id_is_held_by_one_directory() {
    let store = shared_store();
    let link = Link::new(&store);
    let first = join(&link, 7).await;
    let impostor = Membership::new(link.clone(), settings(), registration(7, "another-dir"));
    match impostor.start().await {
        Err(JoinError::DuplicateNodeId { node_id: 7, holder }) => {
            assert_eq!(holder.unwrap().directory_id, "dir-7");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(!first.is_fenced());
    // The same directory restarted (its old session not yet expired)
    // takes its registration over at once.
    first.abandon();
    let restarted = join(&link, 7).await;
    assert!(restarted.broker_epoch() > first.broker_epoch());
    settle(TTL * 2).await;
    assert_eq!(
        ids(&restarted),
        [7],
        "the old lease's expiry leaves the new registration"
    );
    assert!(!restarted.is_fenced());
}

/// Random crashes, restarts, cuts (which end watches), heals and lost
/// answers (requests that took effect unheard). At every step: a broker that
/// thinks its session is alive has its registration in the store in its
/// own epoch (it is never live on a lease that has ended). After healing
/// everything: every running broker sees exactly the running ones and
/// they agree on a controller among them.
#[tokio::test(start_paused = true)]
async fn model_random_crashes_and_cuts() {
    let seed = test_seed();
    let mut rng = SmallRng::seed_from_u64(seed);
    let store = shared_store();
    for round in 0..8 {
        let n = rng.gen_range(2..=4);
        let links: Vec<_> = (0..n).map(|_| Link::new(&store)).collect();
        let mut running: Vec<Option<Arc<Membership>>> = Vec::new();
        for (i, link) in links.iter().enumerate() {
            running.push(Some(join(link, round * 10 + i as i32).await));
        }
        for _ in 0..30 {
            let i = rng.gen_range(0..n);
            match rng.gen_range(0..6) {
                0 => {
                    if let Some(m) = running[i].take() {
                        m.abandon();
                    } else {
                        links[i].heal();
                        links[i].lossy.store(false, Ordering::SeqCst);
                        let m = Membership::new(
                            links[i].clone(),
                            settings(),
                            registration(round * 10 + i as i32, &format!("dir-{i}")),
                        );
                        m.start().await.expect("its own directory rejoins");
                        running[i] = Some(m);
                    }
                }
                1 => links[i].cut(),
                2 => links[i].heal(),
                3 => links[i].lossy.store(true, Ordering::SeqCst),
                4 => links[i].lossy.store(false, Ordering::SeqCst),
                _ => {}
            }
            settle(Duration::from_millis(
                rng.gen_range(0..TTL.as_millis() as u64 * 2),
            ))
            .await;
            store.expire();
            for m in running.iter().flatten() {
                if !m.is_fenced() {
                    let key = format!("/keel/brokers/{}", m.me().node_id);
                    let kv = store.get(&key).await.unwrap();
                    let epoch = kv.as_ref().map(|kv| kv.mod_revision);
                    assert_eq!(
                        epoch,
                        Some(m.broker_epoch()),
                        "seed={seed}: unfenced on a dead session"
                    );
                }
            }
        }
        for link in &links {
            link.heal();
            link.lossy.store(false, Ordering::SeqCst);
        }
        settle(TTL * 3).await;
        let alive: Vec<i32> = running.iter().flatten().map(|m| m.me().node_id).collect();
        for m in running.iter().flatten() {
            assert_eq!(ids(m), alive, "seed={seed}");
            assert!(!m.is_fenced(), "seed={seed}");
            let controller = m.controller().expect("a controller").node_id;
            assert!(alive.contains(&controller), "seed={seed}");
            assert_eq!(
                Some(controller),
                running
                    .iter()
                    .flatten()
                    .next()
                    .unwrap()
                    .controller()
                    .map(|c| c.node_id)
            );
        }
        for m in running.iter().flatten() {
            m.leave().await;
        }
    }
}

/// The topic the leadership model test runs on.
const TOPIC: &str = "model";

/// The cluster's copy of [`TOPIC`], read from the store itself.
async fn stored_topic(store: &LocalStore) -> ClusterTopic {
    stored_topic_if_any(store).await.expect("the topic exists")
}

async fn stored_topic_if_any(store: &LocalStore) -> Option<ClusterTopic> {
    let kv = store.get(&format!("/keel/topics/{TOPIC}")).await.unwrap()?;
    Some(serde_json::from_slice(&kv.value).unwrap())
}

/// Adds one partition to [`TOPIC`] through `m`, as an admin request does:
/// read, change, compare-and-swap, again if another change landed first.
/// Whether it landed.
async fn grow(m: &Membership) -> bool {
    for _ in 0..10 {
        let Some(stored) = m.topic(TOPIC) else {
            return false;
        };
        let mut grown = stored.topic.clone();
        let live = m.live();
        let placed = topics::place(1, &live, &topics::load([&stored.topic]));
        let Some(p) = placed.into_iter().next() else {
            return false;
        };
        grown.partitions.push(p);
        match m.replace_topic(&grown, stored.revision).await {
            Ok(Some(_)) => return true,
            Ok(None) => settle(Duration::from_millis(50)).await,
            Err(_) => return false,
        }
    }
    false
}

/// Watches `m`'s view of [`TOPIC`] at every change, noting in
/// `violations` any step back: a topic's revision in the view never falls.
fn monitor(m: &Arc<Membership>, violations: &Arc<parking_lot::Mutex<Vec<String>>>) {
    let (m, violations) = (Arc::clone(m), Arc::clone(violations));
    let mut changes = m.subscribe();
    tokio::spawn(async move {
        let mut seen = 0;
        while changes.changed().await.is_ok() {
            if let Some(t) = m.topic(TOPIC) {
                if t.revision < seen {
                    violations.lock().push(format!(
                        "broker {}: topic at revision {} after {seen}",
                        m.me().node_id,
                        t.revision
                    ));
                }
                seen = seen.max(t.revision);
            }
        }
    });
}

/// A watch that lags behind a whole read of the view replays changes the
/// read already holds: the view never goes back to them.
#[tokio::test(start_paused = true)]
async fn a_lagging_watch_never_takes_the_view_back() {
    let store = shared_store();
    let (a, b) = (Link::new(&store), Link::new(&store));
    b.lag_ms.store(1000, Ordering::SeqCst);
    let one = join(&a, 1).await;
    let two = join(&b, 2).await;
    let violations = Arc::new(parking_lot::Mutex::new(Vec::new()));
    monitor(&two, &violations);
    settle(Duration::from_millis(10)).await; // its watch is open
    let mut topic = ClusterTopic {
        version: 1,
        name: TOPIC.into(),
        topic_id: uuid::Uuid::new_v4(),
        configs: Default::default(),
        partitions: topics::place(2, &one.live(), &Default::default()),
    };
    let created = one.create_topic(&topic).await.unwrap().unwrap();
    topic.configs.insert("retention.ms".into(), "1000".into());
    let altered = one.replace_topic(&topic, created).await.unwrap().unwrap();
    two.refresh().await.unwrap();
    assert_eq!(two.topic(TOPIC).map(|t| t.revision), Some(altered));
    settle(Duration::from_secs(5)).await;
    assert_eq!(violations.lock().as_slice(), &[] as &[String]);
    assert_eq!(
        two.topic(TOPIC).map(|t| (t.topic, t.revision)),
        Some((topic, altered))
    );
}

/// Leadership under random crashes, restarts, cuts, lost answers and
/// partitions added by any broker while the controller moves leaders. At
/// every step, in the store: every partition is led by one of its
/// replicas or by none; its leader epoch never falls, and rises with every
/// change of leader; no partition added was lost. A broker that is not
/// fenced leads only partitions it holds. After healing everything: every
/// partition is led by its replica, in every broker's view as in the
/// store.
#[tokio::test(start_paused = true)]
async fn model_leadership_under_crashes_and_cuts() {
    let seed = test_seed();
    println!("seed={seed}");
    let mut rng = SmallRng::seed_from_u64(seed);
    for _round in 0..4 {
        let store = shared_store();
        let n = rng.gen_range(2..=4usize);
        let node = |i: usize| i as i32 + 1;
        let links: Vec<_> = (0..n).map(|_| Link::new(&store)).collect();
        let violations = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let mut running: Vec<Option<Arc<Membership>>> = Vec::new();
        for (i, link) in links.iter().enumerate() {
            let m = join(link, node(i)).await;
            monitor(&m, &violations);
            running.push(Some(m));
        }
        settle(Duration::from_millis(10)).await;
        let first = running[0].as_ref().unwrap();
        let topic = ClusterTopic {
            version: 1,
            name: TOPIC.into(),
            topic_id: uuid::Uuid::new_v4(),
            configs: Default::default(),
            partitions: topics::place(2 * n, &first.live(), &Default::default()),
        };
        first.create_topic(&topic).await.unwrap().expect("created");
        let mut partitions = topic.partitions.len();
        let mut last = stored_topic(&store).await;
        for _ in 0..40 {
            let i = rng.gen_range(0..n);
            match rng.gen_range(0..10) {
                0 => {
                    if let Some(m) = running[i].take() {
                        m.abandon();
                    } else {
                        links[i].heal();
                        links[i].lossy.store(false, Ordering::SeqCst);
                        let m = join(&links[i], node(i)).await;
                        monitor(&m, &violations);
                        running[i] = Some(m);
                    }
                }
                1 => links[i].cut(),
                2 => links[i].heal(),
                3 => links[i].lossy.store(true, Ordering::SeqCst),
                4 => links[i].lossy.store(false, Ordering::SeqCst),
                5 => {
                    if let Some(m) = running[i].as_ref() {
                        if !links[i].lossy.load(Ordering::SeqCst) && grow(m).await {
                            partitions += 1;
                        }
                    }
                }
                // A whole read while a watch opened earlier replays older
                // changes: they must not undo it.
                6 => {
                    if let Some(m) = running[i].as_ref().filter(|_| links[i].up.load(Ordering::SeqCst)) {
                        let _ = tokio::time::timeout(Duration::from_secs(1), m.refresh()).await;
                    }
                }
                // Its next watches lag.
                8 => links[i].lag_ms.store(rng.gen_range(0..3) * 700, Ordering::SeqCst),
                // Deleted and created again: another incarnation, new epochs.
                7 => {
                    if let Some(m) = running[i]
                        .as_ref()
                        .filter(|_| !links[i].lossy.load(Ordering::SeqCst))
                    {
                        if let Some(stored) = m.topic(TOPIC) {
                            if let Ok(Some(_)) = m.delete_topic(TOPIC, stored.revision).await {
                                let again = ClusterTopic {
                                    topic_id: uuid::Uuid::new_v4(),
                                    partitions: topics::place(n, &m.live(), &Default::default()),
                                    ..stored.topic
                                };
                                m.create_topic(&again).await.ok();
                            }
                        }
                    }
                }
                _ => {}
            }
            settle(Duration::from_millis(
                rng.gen_range(0..TTL.as_millis() as u64 * 2),
            ))
            .await;
            store.expire();
            assert_eq!(violations.lock().as_slice(), &[] as &[String], "seed={seed}");
            let Some(now) = stored_topic_if_any(&store).await else {
                continue; // deleted, and its creation again did not land
            };
            if now.topic_id != last.topic_id {
                (last, partitions) = (now.clone(), now.partitions.len());
            }
            // A lost answer may hide a grow that landed: never fewer.
            assert!(
                now.partitions.len() >= partitions,
                "seed={seed}: a partition lost"
            );
            partitions = now.partitions.len();
            for (p, state) in now.partitions.iter().enumerate() {
                assert!(
                    state.leader == topics::NO_LEADER || state.replicas.contains(&state.leader),
                    "seed={seed}: partition {p} led by {} outside {:?}",
                    state.leader,
                    state.replicas
                );
                if let Some(before) = last.partitions.get(p) {
                    assert!(
                        state.leader_epoch >= before.leader_epoch,
                        "seed={seed}: epoch fell"
                    );
                    if state.leader != before.leader {
                        assert!(
                            state.leader_epoch > before.leader_epoch,
                            "seed={seed}: partition {p} changed leader in the same epoch"
                        );
                    }
                }
            }
            // A view as new as the store is the store.
            let revision = store.range("/keel/").await.unwrap().revision;
            let stored = store
                .get("/keel/topics/model")
                .await
                .unwrap()
                .map(|kv| kv.mod_revision);
            for m in running.iter().flatten() {
                if m.revision() >= revision {
                    assert_eq!(
                        m.topic(TOPIC).map(|t| (t.topic, t.revision)),
                        Some((now.clone(), stored.unwrap())),
                        "seed={seed}: broker {} at revision {revision} sees another topic",
                        m.me().node_id
                    );
                }
            }
            for m in running.iter().flatten().filter(|m| !m.is_fenced()) {
                for p in 0..now.partitions.len() as i32 {
                    if let Some(view) = m.partition(now.topic_id, p) {
                        if view.leader == m.me().node_id {
                            assert!(view.replicas.contains(&view.leader), "seed={seed}");
                        }
                    }
                }
            }
            last = now;
        }
        for link in &links {
            link.heal();
            link.lossy.store(false, Ordering::SeqCst);
        }
        // Brokers that stay down keep their partitions leaderless; bring
        // every one back.
        for (i, slot) in running.iter_mut().enumerate() {
            if slot.is_none() {
                *slot = Some(join(&links[i], node(i)).await);
            }
        }
        settle(TTL * 3).await;
        let Some(now) = stored_topic_if_any(&store).await else {
            for m in running.iter().flatten() {
                m.leave().await;
            }
            continue; // deleted last, and not created again
        };
        for (p, state) in now.partitions.iter().enumerate() {
            assert_eq!(
                Some(state.leader),
                state.replicas.first().copied(),
                "seed={seed}: partition {p} not led by its replica after healing"
            );
            for m in running.iter().flatten() {
                assert_eq!(
                    m.partition(now.topic_id, p as i32).as_ref(),
                    Some(state),
                    "seed={seed}: broker {} sees partition {p} otherwise",
                    m.me().node_id
                );
            }
        }
        for m in running.iter().flatten() {
            m.leave().await;
        }
    }
}
