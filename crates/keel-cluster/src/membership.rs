//! Broker membership on the coordination store: each broker registers
//! under a lease (its session), keeps the lease alive, and follows every
//! other broker's registration and the controller's election through a
//! watch. The same code runs on one node (an in-process store, where the
//! broker is alone and always the controller) and in a cluster (etcd).
//!
//! Keys, under `keel.cluster.etcd.prefix` (`/keel` by default):
//!
//! ```text
//! <prefix>/cluster_id          the cluster's id, set once by the first broker
//! <prefix>/brokers/<node.id>   a live broker's registration (JSON), on its lease
//! <prefix>/controller          the controller's node id (JSON), on its lease
//! <prefix>/producer_ids        the next producer id no broker has taken
//! <prefix>/topics/<name>       a topic and its partitions' leaders (see [`crate::topics`])
//! <prefix>/configs/<kind>/<name> a config the cluster shares (a group's: `groups/<group id>`)
//! ```
//!
//! A session ends when its lease does: the broker stopped renewing it for
//! a whole session timeout (it died, stalled, or lost the store), or it
//! left. Its keys go with it, so the others see it leave, and elect a new
//! controller if it was the one. A broker that cannot confirm its lease
//! within the timeout counts itself fenced; when the store answers again
//! it registers anew, in a new broker epoch.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::store::{Compare, CoordStore, KeyValue, LeaseId, Op, Snapshot, StoreError, WatchEvent};
use crate::topics::{self, ClusterTopic, PartitionState, StoredTopic};

/// How long to wait after a failed request before trying again.
const RETRY: Duration = Duration::from_millis(500);

/// One advertised listener of a broker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    pub listener: String,
    pub host: String,
    pub port: i32,
}

/// What a broker registers: who it is and where clients reach it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    pub node_id: i32,
    #[serde(default)]
    pub rack: Option<String>,
    pub endpoints: Vec<Endpoint>,
    /// Its data directory's `directory.id`: a broker restarted on the same
    /// directory replaces its own earlier registration at once, where a
    /// second broker claiming the node id is refused.
    pub directory_id: String,
}

impl Registration {
    /// The endpoint of `listener`, if the broker has that listener.
    pub fn endpoint(&self, listener: &str) -> Option<&Endpoint> {
        self.endpoints.iter().find(|e| e.listener == listener)
    }
}

/// A live broker as the others see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub registration: Registration,
    /// The broker epoch: the store's revision of its registration.
    pub epoch: i64,
}

/// The elected controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Controller {
    pub node_id: i32,
    /// The controller epoch: the store's revision of the election, rising
    /// with every new controller.
    pub epoch: i64,
}

/// Membership settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The keys' prefix (`keel.cluster.etcd.prefix`), without a trailing `/`.
    pub prefix: String,
    /// How long a broker's lease lives without renewal
    /// (`keel.cluster.session.timeout.ms`).
    pub session_timeout: Duration,
    /// How often the controller spreads leaders over the live brokers
    /// ([`crate::topics::balance`]; `leader.imbalance.check.interval.seconds`),
    /// `None` if it does not (`auto.leader.rebalance.enable=false`).
    pub leader_balance: Option<Duration>,
}

impl Settings {
    pub(crate) fn key(&self, rest: &str) -> String {
        format!("{}/{rest}", self.prefix)
    }

    fn broker_key(&self, node_id: i32) -> String {
        self.key(&format!("brokers/{node_id}"))
    }
}

/// Why a broker could not join.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinError {
    /// Another live broker, on another data directory, holds this node id.
    /// (`holder`: its registration, `None` if Keel cannot read it).
    DuplicateNodeId {
        node_id: i32,
        holder: Option<Registration>,
    },
    Store(StoreError),
}

impl std::fmt::Display for JoinError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JoinError::DuplicateNodeId { node_id, holder } => {
                let holder = holder.as_ref().map_or("unreadable registration".into(), |h| {
                    let at: Vec<String> = h
                        .endpoints
                        .iter()
                        .map(|e| format!("{}://{}:{}", e.listener, e.host, e.port))
                        .collect();
                    format!("{}, directory.id {}", at.join(","), h.directory_id)
                });
                write!(
                    f,
                    "node.id={node_id} is registered by another live broker ({holder}); \
                     every broker of a cluster needs its own node.id"
                )
            }
            JoinError::Store(e) => write!(f, "cannot register with the coordination store: {e}"),
        }
    }
}

impl std::error::Error for JoinError {}

impl From<StoreError> for JoinError {
    fn from(e: StoreError) -> JoinError {
        JoinError::Store(e)
    }
}

/// This broker's session.
#[derive(Debug, Clone, Copy)]
struct Session {
    lease: LeaseId,
    epoch: i64,
    /// When the last renewal that the store confirmed was sent: the lease
    /// lives at least a session timeout past it.
    renewed_at: Instant,
}

#[derive(Debug, Default)]
struct View {
    members: BTreeMap<i32, Member>,
    controller: Option<Controller>,
    session: Option<Session>,
    /// Set while this broker cannot be sure its session is alive.
    fenced: bool,
    /// The cluster's topics, by name.
    topics: BTreeMap<String, StoredTopic>,
    /// Topic names by topic id.
    topic_ids: HashMap<uuid::Uuid, String>,
    /// Topics whose keys this broker cannot read (another version's?).
    unreadable_topics: BTreeSet<String>,
    /// Ids of topics this view saw deleted (or replaced by another
    /// incarnation of their name): what garbage collection may delete
    /// the keys and copies of.
    removed_topics: std::collections::HashSet<uuid::Uuid>,
    /// The cluster's configs (`<prefix>/configs/<kind>/<name>`), by
    /// `<kind>/<name>`, with the revisions of their keys.
    configs: BTreeMap<String, (Vec<u8>, i64)>,
    /// The store's revision the view reflects.
    revision: i64,
}

/// This broker's membership of the cluster.
#[derive(Debug)]
pub struct Membership {
    store: Arc<dyn CoordStore>,
    settings: Settings,
    me: Registration,
    view: Mutex<View>,
    /// Bumped on every change of the view.
    changes: tokio::sync::watch::Sender<u64>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Partition leader changes this broker made as controller.
    leader_changes: std::sync::atomic::AtomicU64,
    /// Whether the store is another process's (etcd), shared with other
    /// brokers.
    shared_store: bool,
}

impl Membership {
    /// Membership of `me` through `store`; nothing is registered until
    /// [`Membership::start`].
    pub fn new(store: Arc<dyn CoordStore>, settings: Settings, me: Registration) -> Arc<Membership> {
        let shared_store = store.is_shared();
        Arc::new(Membership {
            store,
            settings,
            me,
            view: Mutex::new(View::default()),
            changes: tokio::sync::watch::channel(0).0,
            tasks: Mutex::new(Vec::new()),
            leader_changes: std::sync::atomic::AtomicU64::new(0),
            shared_store,
        })
    }

    /// The cluster's id: the one stored, or `candidate` if none is yet
    /// (this broker is the first). Waits for a store that does not answer,
    /// as a broker waits for its cluster at start-up.
    pub async fn claim_cluster_id(
        store: &dyn CoordStore,
        settings: &Settings,
        candidate: &str,
    ) -> Result<String, StoreError> {
        let key = settings.key("cluster_id");
        loop {
            match claim_once(store, &key, candidate).await {
                Ok(Some(id)) => return Ok(id),
                Ok(None) => {} // claimed by another meanwhile: read it
                Err(StoreError::Unavailable(why)) => {
                    tracing::warn!(store = %store.describe(), %why, "waiting for the coordination store");
                    tokio::time::sleep(RETRY).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Registers this broker (waiting up to a session timeout for an
    /// earlier registration of its node id to expire), takes part in the
    /// controller election, reads the view, and keeps all three going in
    /// the background until [`Membership::leave`].
    pub async fn start(self: &Arc<Self>) -> Result<(), JoinError> {
        self.register().await?;
        self.elect().await;
        // The first view before returning, so Metadata lists the others
        // from the first request on.
        if let Ok(snapshot) = self.store.range(&self.settings.key("")).await {
            self.rebuild(&snapshot);
        }
        let session = tokio::spawn(Arc::clone(self).keep_session());
        let follow = tokio::spawn(Arc::clone(self).follow());
        let lead = tokio::spawn(Arc::clone(self).lead_partitions());
        let balance = tokio::spawn(Arc::clone(self).balance_leaders());
        self.tasks.lock().extend([session, follow, lead, balance]);
        Ok(())
    }

    /// Ends the session now (on shutdown): the others see this broker
    /// leave at once instead of after a session timeout.
    pub async fn leave(&self) {
        for task in self.tasks.lock().drain(..) {
            task.abort();
        }
        let lease = self.view.lock().session.take().map(|s| s.lease);
        if let Some(lease) = lease {
            let wait = self.settings.session_timeout;
            match tokio::time::timeout(wait, self.store.revoke(lease)).await {
                Ok(Ok(())) => tracing::info!(node = self.me.node_id, "left the cluster"),
                Ok(Err(e)) => tracing::warn!(error = %e, "could not end the session; it expires on its own"),
                Err(_) => tracing::warn!("the store did not answer; the session expires on its own"),
            }
        }
    }

    /// Stops renewing the session without ending it, as a crash does: the
    /// others see this broker leave once its lease expires.
    pub fn abandon(&self) {
        for task in self.tasks.lock().drain(..) {
            task.abort();
        }
    }

    /// This broker's registration.
    pub fn me(&self) -> &Registration {
        &self.me
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The next block of producer ids no broker of the cluster has taken,
    /// none below `floor`.
    pub async fn take_producer_id_block(&self, floor: i64) -> Result<std::ops::Range<i64>, StoreError> {
        crate::producer_ids::take_block(self.store.as_ref(), &self.settings, floor).await
    }

    /// The coordination store.
    pub fn store(&self) -> Arc<dyn CoordStore> {
        Arc::clone(&self.store)
    }

    /// Whether the store is shared with other brokers (etcd), not this
    /// process's alone.
    pub fn store_is_shared(&self) -> bool {
        self.shared_store
    }

    /// Where the coordination store is, for logs and stats.
    pub fn store_description(&self) -> String {
        self.store.describe()
    }

    /// The live brokers, by node id. This broker is always among them (a
    /// client talking to it sees it, whatever the store says now).
    pub fn members(&self) -> Vec<Member> {
        let view = self.view.lock();
        let mut members = view.members.clone();
        members.entry(self.me.node_id).or_insert_with(|| Member {
            registration: self.me.clone(),
            epoch: view.session.map_or(-1, |s| s.epoch),
        });
        members.into_values().collect()
    }

    /// The controller, if one is elected.
    pub fn controller(&self) -> Option<Controller> {
        self.view.lock().controller
    }

    /// This broker's epoch (-1 before it registers).
    pub fn broker_epoch(&self) -> i64 {
        self.view.lock().session.map_or(-1, |s| s.epoch)
    }

    /// Whether this broker cannot be sure its session is alive: it has not
    /// registered, or no renewal was confirmed within a session timeout.
    pub fn is_fenced(&self) -> bool {
        let view = self.view.lock();
        match view.session {
            None => true,
            Some(s) => view.fenced || s.renewed_at.elapsed() >= self.settings.session_timeout,
        }
    }

    /// A receiver that sees a change whenever the view does.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n += 1);
    }

    /// The live brokers as the store has them (unlike
    /// [`Membership::members`], without this broker unless it is
    /// registered).
    pub fn live(&self) -> BTreeSet<i32> {
        self.view.lock().members.keys().copied().collect()
    }

    /// The cluster's topics, with the revisions of their keys.
    pub fn topics(&self) -> Vec<StoredTopic> {
        self.view.lock().topics.values().cloned().collect()
    }

    /// The topic `name`, with the revision of its key.
    pub fn topic(&self, name: &str) -> Option<StoredTopic> {
        self.view.lock().topics.get(name).cloned()
    }

    /// The id and partition count of the topic `name` (without copying
    /// its partitions).
    pub fn topic_shape(&self, name: &str) -> Option<(uuid::Uuid, i32)> {
        let view = self.view.lock();
        let t = &view.topics.get(name)?.topic;
        Some((t.topic_id, t.partition_count()))
    }

    /// Whether the store holds a topic `name` this broker cannot read: it
    /// is neither known nor known to be gone.
    pub fn topic_unreadable(&self, name: &str) -> bool {
        self.view.lock().unreadable_topics.contains(name)
    }

    /// Waits until the view's topic `name` is no longer the one at
    /// `revision` (changed or deleted), at most `timeout`.
    pub async fn wait_for_topic_change(&self, name: &str, revision: i64, timeout: Duration) -> bool {
        self.wait_until(
            || self.topic(name).is_none_or(|t| t.revision != revision),
            timeout,
        )
        .await
    }

    /// Partition `index` of the topic `topic_id`, as the view has it.
    pub fn partition(&self, topic_id: uuid::Uuid, index: i32) -> Option<PartitionState> {
        self.with_partition(topic_id, index, PartitionState::clone)
    }

    /// The live leader of partition `index` of the topic `topic_id` and
    /// its leader epoch: none while it has no leader, or its leader's
    /// session has ended (this broker's own: while it is fenced). Every
    /// request for a partition asks it, so it copies nothing.
    pub fn live_leader(&self, topic_id: uuid::Uuid, index: i32) -> Option<(i32, i32)> {
        let (leader, epoch) = self.with_partition(topic_id, index, |p| (p.leader, p.leader_epoch))?;
        let live = if leader == topics::NO_LEADER {
            false
        } else if leader == self.me.node_id {
            !self.is_fenced()
        } else {
            self.view.lock().members.contains_key(&leader)
        };
        live.then_some((leader, epoch))
    }

    fn with_partition<T>(
        &self,
        topic_id: uuid::Uuid,
        index: i32,
        f: impl FnOnce(&PartitionState) -> T,
    ) -> Option<T> {
        let view = self.view.lock();
        let name = view.topic_ids.get(&topic_id)?;
        let topic = &view.topics.get(name)?.topic;
        topic.partitions.get(usize::try_from(index).ok()?).map(f)
    }

    /// The cluster's config of kind `kind` (`groups`, ...) for `name`,
    /// as stored, with the revision of its key.
    pub fn config(&self, kind: &str, name: &str) -> Option<(Vec<u8>, i64)> {
        self.view.lock().configs.get(&format!("{kind}/{name}")).cloned()
    }

    /// Waits until the view's config of kind `kind` for `name` is no
    /// longer the one at `revision` (`None`: none), at most `timeout`.
    pub async fn wait_for_config_change(
        &self,
        kind: &str,
        name: &str,
        revision: Option<i64>,
        timeout: Duration,
    ) -> bool {
        self.wait_until(|| self.config(kind, name).map(|(_, r)| r) != revision, timeout)
            .await
    }

    /// The names that have a config of kind `kind`.
    pub fn config_names(&self, kind: &str) -> Vec<String> {
        let prefix = format!("{kind}/");
        let view = self.view.lock();
        view.configs
            .keys()
            .filter_map(|k| k.strip_prefix(&prefix))
            .map(str::to_string)
            .collect()
    }

    /// Sets the cluster's config of kind `kind` for `name` to `value` if
    /// its key is still at `revision` (`None`: if there is none): the
    /// change's revision, `None` if it changed meanwhile.
    pub async fn put_config(
        &self,
        kind: &str,
        name: &str,
        value: Vec<u8>,
        revision: Option<i64>,
    ) -> Result<Option<i64>, StoreError> {
        let key = self.settings.key(&format!("configs/{kind}/{name}"));
        let when = match revision {
            Some(r) => Compare::ModRevision(key.clone(), r),
            None => Compare::Absent(key.clone()),
        };
        let put = Op::Put {
            key,
            value,
            lease: None,
        };
        self.store.txn(vec![when], vec![put]).await
    }

    /// This broker's session for commits ([`crate::logs`]), `None` before
    /// it registers or while it is fenced.
    pub fn log_session(&self) -> Option<crate::logs::Session> {
        let epoch = self.broker_epoch();
        (epoch >= 0 && !self.is_fenced()).then_some(crate::logs::Session {
            node_id: self.me.node_id,
            epoch,
        })
    }

    /// Claims a partition's log for this broker in `leader_epoch`, its
    /// local log spanning `local` ([`crate::logs::claim`]): `None` if a
    /// newer epoch holds it or this broker's session is not confirmed.
    pub async fn claim_log(
        &self,
        partition: (uuid::Uuid, i32),
        leader_epoch: i32,
        local: (i64, i64),
    ) -> Result<Option<crate::logs::Claimed>, StoreError> {
        let Some(session) = self.log_session() else {
            return Ok(None);
        };
        let store = self.store.as_ref();
        crate::logs::claim(store, &self.settings, session, partition, leader_epoch, local).await
    }

    /// Writes the first commit of a partition a directory brings in
    /// ([`crate::logs::seed`]); nothing while the session is not confirmed.
    pub async fn seed_log(&self, partition: (uuid::Uuid, i32), local: (i64, i64)) -> Result<(), StoreError> {
        match self.log_session() {
            Some(session) => {
                crate::logs::seed(self.store.as_ref(), &self.settings, session, partition, local).await
            }
            None => Err(StoreError::Unavailable(
                "this broker's session is not confirmed".into(),
            )),
        }
    }

    /// Where a claimed partition's records are ([`crate::logs::partition_log`]).
    pub async fn partition_log(
        &self,
        partition: (uuid::Uuid, i32),
        claimed: &crate::logs::Claimed,
    ) -> Result<Result<crate::logs::LogSources, String>, StoreError> {
        crate::logs::partition_log(self.store.as_ref(), &self.settings, partition, claimed).await
    }

    /// The WAL objects the coordination store's index names, `None` if a
    /// key does not read ([`crate::logs::wal_objects`]).
    pub async fn wal_objects(&self) -> Result<Option<BTreeSet<String>>, StoreError> {
        crate::logs::wal_objects(self.store.as_ref(), &self.settings).await
    }

    /// What the coordination store records that nothing needs any more
    /// ([`crate::logs::garbage`]), judged against this broker's view;
    /// `settled`: WAL objects too old for any more of their parts to be
    /// committed.
    pub async fn garbage(
        &self,
        settled: &std::collections::HashSet<String>,
    ) -> Result<crate::logs::Garbage, StoreError> {
        let removed = self.view.lock().removed_topics.clone();
        crate::logs::garbage(self.store.as_ref(), &self.settings, &removed, settled).await
    }

    /// Deletes keys of [`Membership::garbage`].
    pub async fn delete_keys(&self, keys: &[String]) -> Result<(), StoreError> {
        crate::logs::delete_keys(self.store.as_ref(), keys).await
    }

    /// Runs one of a leader's records (`crate::logs`) under this broker's
    /// session: `fenced` without a confirmed one.
    async fn as_leader<'a, T, F, Fut>(&'a self, fenced: T, record: F) -> Result<T, StoreError>
    where
        F: FnOnce(&'a dyn CoordStore, &'a Settings, crate::logs::Session) -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        match self.log_session() {
            Some(session) => record(self.store.as_ref(), &self.settings, session).await,
            None => Ok(fenced),
        }
    }

    /// Records a segment copied to the object store
    /// ([`crate::logs::publish_segment`]).
    pub async fn publish_segment(
        &self,
        partition: (uuid::Uuid, i32),
        revision: i64,
        segment: &crate::logs::RemoteSegment,
    ) -> Result<crate::logs::Published, StoreError> {
        self.as_leader(crate::logs::Published::Fenced, |store, settings, session| {
            crate::logs::publish_segment(store, settings, session, partition, revision, segment)
        })
        .await
    }

    /// Forgets a segment copy about to be deleted
    /// ([`crate::logs::forget_segment`]): whether it may be deleted.
    pub async fn forget_segment(
        &self,
        partition: (uuid::Uuid, i32),
        revision: i64,
        segment: (i64, &str, i64),
    ) -> Result<crate::logs::Forget, StoreError> {
        self.as_leader(crate::logs::Forget::Fenced, |store, settings, session| {
            crate::logs::forget_segment(store, settings, session, partition, revision, segment)
        })
        .await
    }

    /// Records a partition's log start ([`crate::logs::record_log_start`]):
    /// whether it holds.
    pub async fn record_log_start(
        &self,
        partition: (uuid::Uuid, i32),
        revision: i64,
        log_start: i64,
    ) -> Result<bool, StoreError> {
        self.as_leader(false, |store, settings, session| {
            crate::logs::record_log_start(store, settings, session, partition, revision, log_start)
        })
        .await
    }

    /// Commits the WAL object `object`, `id` among this broker's
    /// ([`crate::logs::commit`]): `None` if this broker's session has ended
    /// or is not confirmed.
    pub async fn commit_wal(
        &self,
        object: &str,
        id: &str,
        parts: &[crate::logs::CommitPart],
    ) -> Result<Option<Vec<crate::logs::PartOutcome>>, StoreError> {
        let Some(session) = self.log_session() else {
            return Ok(None);
        };
        crate::logs::commit(self.store.as_ref(), &self.settings, session, (object, id), parts).await
    }

    /// Partition leader changes this broker made as controller.
    pub fn leader_changes(&self) -> u64 {
        self.leader_changes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The store's revision the view reflects.
    pub fn revision(&self) -> i64 {
        self.view.lock().revision
    }

    /// Waits until the view reflects the store's `revision` (a change this
    /// broker made), at most `timeout`. Whether it does.
    pub async fn wait_for(&self, revision: i64, timeout: Duration) -> bool {
        self.wait_until(|| self.revision() >= revision, timeout).await
    }

    /// Waits until `done` holds of the view, checked at every change of
    /// it, at most `timeout`. Whether it does.
    async fn wait_until(&self, done: impl Fn() -> bool, timeout: Duration) -> bool {
        let mut changes = self.subscribe();
        let waited = async {
            while !done() {
                if changes.changed().await.is_err() {
                    return false;
                }
            }
            true
        };
        tokio::time::timeout(timeout, waited).await.unwrap_or(false)
    }

    /// Reads the whole view again now, waiting for a store that does not
    /// answer. For start-up, where a decision needs a view known complete.
    pub async fn refresh(&self) -> Result<(), StoreError> {
        loop {
            match self.store.range(&self.settings.key("")).await {
                Ok(snapshot) => {
                    self.rebuild(&snapshot);
                    return Ok(());
                }
                Err(StoreError::Unavailable(why)) => {
                    tracing::warn!(store = %self.store.describe(), %why, "waiting for the coordination store");
                    tokio::time::sleep(RETRY).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Creates `topic` unless its name is taken: the change's revision,
    /// `None` if taken.
    pub async fn create_topic(&self, topic: &ClusterTopic) -> Result<Option<i64>, StoreError> {
        topics::create(self.store.as_ref(), &self.settings, topic).await
    }

    /// Replaces a topic whose key is still at `revision`: the change's
    /// revision, `None` if it changed meanwhile.
    pub async fn replace_topic(
        &self,
        topic: &ClusterTopic,
        revision: i64,
    ) -> Result<Option<i64>, StoreError> {
        topics::replace(self.store.as_ref(), &self.settings, topic, revision, Vec::new()).await
    }

    /// Deletes a topic whose key is still at `revision`: the change's
    /// revision, `None` if it changed meanwhile.
    pub async fn delete_topic(&self, name: &str, revision: i64) -> Result<Option<i64>, StoreError> {
        topics::delete(self.store.as_ref(), &self.settings, name, revision).await
    }

    /// While this broker is the controller, applies [`topics::elect`] to
    /// every topic whenever the view changes (and every RETRY after a
    /// change that did not land), each change compared against the
    /// controller's own election.
    async fn lead_partitions(self: Arc<Self>) {
        let mut changes = self.subscribe();
        loop {
            let settled = self.elect_leaders().await;
            let wait = changes.changed();
            if settled {
                if wait.await.is_err() {
                    return;
                }
            } else {
                let _ = tokio::time::timeout(RETRY, wait).await;
            }
        }
    }

    /// One pass of the controller's rule. Whether every change landed (or
    /// there was none, or this broker is not the controller).
    async fn elect_leaders(&self) -> bool {
        let (controller, live, topics) = {
            let view = self.view.lock();
            let live: BTreeSet<i32> = view.members.keys().copied().collect();
            (
                view.controller,
                live,
                view.topics.values().cloned().collect::<Vec<_>>(),
            )
        };
        let Some(controller) = controller.filter(|c| c.node_id == self.me.node_id) else {
            return true;
        };
        let mine = Compare::ModRevision(self.settings.key("controller"), controller.epoch);
        let mut settled = true;
        let mut led = topics::load(topics.iter().map(|s| &s.topic));
        for stored in topics {
            let Some(next) = topics::elect(&stored.topic, &live, &mut led) else {
                continue;
            };
            match self
                .change_leaders(&stored, &next, &mine, "partition leader changed")
                .await
            {
                Ok(Some(_)) => {}
                Ok(None) => settled = false, // changed meanwhile: the watch brings it
                Err(e) => {
                    tracing::debug!(topic = %next.name, error = %e, "changing leaders");
                    settled = false;
                }
            }
        }
        settled
    }

    /// While this broker is the controller, applies [`topics::balance`]
    /// every `leader_balance`.
    async fn balance_leaders(self: Arc<Self>) {
        // At most a day apart (a larger setting is a day).
        let Some(every) = self
            .settings
            .leader_balance
            .map(|d| d.min(Duration::from_secs(86_400)))
        else {
            return;
        };
        let mut ticks = tokio::time::interval_at(Instant::now() + every, every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            if let Err(e) = self.balance_once().await {
                tracing::debug!(error = %e, "balancing leaders");
            }
        }
    }

    /// One pass of the leader balance: how many partitions moved. Only
    /// while every partition of a live broker's is led (the controller's
    /// elections come first), and only partitions another broker could
    /// rebuild from the object store now move.
    pub async fn balance_once(&self) -> Result<usize, StoreError> {
        let (controller, live, stored, fenced) = {
            let view = self.view.lock();
            (
                view.controller,
                view.members.keys().copied().collect::<BTreeSet<i32>>(),
                view.topics.values().cloned().collect::<Vec<_>>(),
                view.fenced,
            )
        };
        let Some(controller) = controller.filter(|c| c.node_id == self.me.node_id && !fenced) else {
            return Ok(0);
        };
        let unled = stored
            .iter()
            .flat_map(|s| &s.topic.partitions)
            .any(|p| !live.contains(&p.leader));
        if unled {
            return Ok(0);
        }
        let topics: Vec<ClusterTopic> = stored.iter().map(|s| s.topic.clone()).collect();
        let mut pinned = BTreeSet::new();
        let plan = loop {
            let plan = topics::balance(&topics, &live, &pinned);
            let moved: Vec<(uuid::Uuid, i32)> = plan
                .iter()
                .flat_map(|next| {
                    let was = topics.iter().find(|t| t.topic_id == next.topic_id);
                    next.partitions.iter().enumerate().filter_map(move |(i, p)| {
                        let before = was.and_then(|t| t.partitions.get(i))?;
                        (before.leader != p.leader).then_some((next.topic_id, i32::try_from(i).ok()?))
                    })
                })
                .collect();
            let verdicts = crate::logs::rebuildable(self.store.as_ref(), &self.settings, &moved).await?;
            let before = pinned.len();
            for (id, verdict) in moved.into_iter().zip(verdicts) {
                if let Err(why) = verdict {
                    tracing::debug!(topic_id = %id.0, partition = id.1, %why, "a partition stays for the leader balance");
                    pinned.insert(id);
                }
            }
            if pinned.len() == before {
                break plan;
            }
        };
        let mine = Compare::ModRevision(self.settings.key("controller"), controller.epoch);
        let mut moved = 0;
        for next in plan {
            let Some(stored) = stored.iter().find(|s| s.topic.topic_id == next.topic_id) else {
                continue;
            };
            // A topic changed meanwhile: the next pass sees it.
            let why = "partition leader moved to balance the brokers";
            moved += self.change_leaders(stored, &next, &mine, why).await?.unwrap_or(0);
        }
        Ok(moved)
    }

    /// Replaces `stored` with `next`, whose leaders the controller
    /// changed, if neither the topic nor the controller changed since;
    /// logs each change with `why` and counts it. How many partitions
    /// changed leader, `None` if the compare failed.
    async fn change_leaders(
        &self,
        stored: &StoredTopic,
        next: &ClusterTopic,
        controller: &Compare,
        why: &str,
    ) -> Result<Option<usize>, StoreError> {
        let changed = topics::replace(
            self.store.as_ref(),
            &self.settings,
            next,
            stored.revision,
            vec![controller.clone()],
        )
        .await?;
        let Some(revision) = changed else {
            return Ok(None);
        };
        let mut count = 0;
        for (i, (was, now)) in stored.topic.partitions.iter().zip(&next.partitions).enumerate() {
            if was.leader != now.leader || was.leader_epoch != now.leader_epoch {
                count += 1;
                self.leader_changes
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::info!(
                    topic = %next.name, partition = i, leader = now.leader,
                    leader_epoch = now.leader_epoch, previous = was.leader, revision,
                    "{why}"
                );
            }
        }
        Ok(Some(count))
    }

    /// Puts this broker's registration on a new lease.
    async fn register(&self) -> Result<(), JoinError> {
        let ttl = self.settings.session_timeout;
        let key = self.settings.broker_key(self.me.node_id);
        let value = serde_json::to_vec(&self.me).expect("a registration serializes");
        let deadline = Instant::now() + ttl + Duration::from_secs(1);
        // The lease lives at least a session timeout past the moment it
        // was asked for.
        let mut granted = Instant::now();
        let mut lease = self.grant(ttl).await?;
        loop {
            let put = Op::Put {
                key: key.clone(),
                value: value.clone(),
                lease: Some(lease),
            };
            let existing = match self.store.get(&key).await {
                Err(StoreError::Unavailable(why)) => {
                    tracing::warn!(store = %self.store.describe(), %why, "waiting for the coordination store");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
                other => other?,
            };
            let when = match existing {
                None => Compare::Absent(key.clone()),
                Some(kv) => match decode::<Registration>(&kv) {
                    // Its own earlier session (a restart): replaced.
                    Some(old) if old.directory_id == self.me.directory_id => {
                        Compare::ModRevision(key.clone(), kv.mod_revision)
                    }
                    holder if Instant::now() >= deadline => {
                        let _ = self.store.revoke(lease).await;
                        return Err(JoinError::DuplicateNodeId {
                            node_id: self.me.node_id,
                            holder,
                        });
                    }
                    // Someone else's, perhaps a dead broker's whose lease
                    // has yet to expire: wait for it.
                    _ => {
                        tokio::time::sleep(RETRY).await;
                        continue;
                    }
                },
            };
            match self.store.txn(vec![when], vec![put]).await {
                Ok(Some(epoch)) => {
                    let mut view = self.view.lock();
                    view.session = Some(Session {
                        lease,
                        epoch,
                        renewed_at: granted,
                    });
                    view.fenced = false;
                    drop(view);
                    tracing::info!(
                        node = self.me.node_id,
                        epoch,
                        store = %self.store.describe(),
                        "registered"
                    );
                    self.changed();
                    return Ok(());
                }
                Ok(None) => {} // it changed under us: look again
                Err(StoreError::LeaseExpired(_)) => {
                    granted = Instant::now();
                    lease = self.grant(ttl).await?;
                }
                Err(StoreError::Unavailable(why)) => {
                    tracing::warn!(store = %self.store.describe(), %why, "waiting for the coordination store");
                    tokio::time::sleep(RETRY).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// A new lease, waiting for a store that does not answer.
    async fn grant(&self, ttl: Duration) -> Result<LeaseId, StoreError> {
        loop {
            match self.store.grant(ttl).await {
                Err(StoreError::Unavailable(why)) => {
                    tracing::warn!(store = %self.store.describe(), %why, "waiting for the coordination store");
                    tokio::time::sleep(RETRY).await;
                }
                other => return other,
            }
        }
    }

    /// Stands for controller if there is none: the first broker to put
    /// the key, on its lease, wins.
    async fn elect(&self) {
        let Some(lease) = self.view.lock().session.map(|s| s.lease) else {
            return;
        };
        let key = self.settings.key("controller");
        let put = Op::Put {
            key: key.clone(),
            value: serde_json::to_vec(&self.me.node_id).expect("an id serializes"),
            lease: Some(lease),
        };
        match self.store.txn(vec![Compare::Absent(key)], vec![put]).await {
            Ok(Some(epoch)) => tracing::info!(node = self.me.node_id, epoch, "elected controller"),
            Ok(None) => {}
            Err(e) => tracing::debug!(error = %e, "controller election"),
        }
    }

    /// Renews the lease every third of the session timeout. A renewal the
    /// store refuses (the lease expired) ends the session: the broker is
    /// fenced and registers again. One it cannot confirm for a whole
    /// timeout fences the broker until the store answers again.
    async fn keep_session(self: Arc<Self>) {
        let period = self.settings.session_timeout / 3;
        // Renewals go out every period whatever the last one's fate, each
        // given at most a period, so one slow answer costs no session.
        let mut ticks = tokio::time::interval_at(Instant::now() + period, period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let Some(session) = self.view.lock().session else {
                return;
            };
            let sent = Instant::now();
            let renewed = tokio::time::timeout(period, self.store.keep_alive(session.lease))
                .await
                .unwrap_or_else(|_| Err(StoreError::Unavailable("no answer to a renewal".into())));
            match renewed {
                Ok(()) => {
                    let mut view = self.view.lock();
                    if let Some(s) = view.session.as_mut().filter(|s| s.lease == session.lease) {
                        s.renewed_at = sent;
                    }
                    let was_fenced = std::mem::replace(&mut view.fenced, false);
                    drop(view);
                    if was_fenced {
                        tracing::info!(node = self.me.node_id, "session confirmed again");
                        self.changed();
                    }
                }
                Err(StoreError::LeaseExpired(_)) => {
                    self.fence("the session expired");
                    match self.register().await {
                        Ok(()) => self.elect().await,
                        Err(e) => tracing::error!(error = %e, "cannot register again"),
                    }
                }
                Err(e) => {
                    if sent.duration_since(session.renewed_at) >= self.settings.session_timeout {
                        self.fence(&e.to_string());
                    }
                }
            }
        }
    }

    fn fence(&self, why: &str) {
        let was = std::mem::replace(&mut self.view.lock().fenced, true);
        if !was {
            tracing::error!(node = self.me.node_id, why, "fenced: the session may have ended");
            self.changed();
        }
    }

    /// Follows the registrations and the election: a read, then a watch
    /// from the revision after it, again whenever the watch ends. Stands
    /// for controller whenever there is none.
    async fn follow(self: Arc<Self>) {
        let prefix = self.settings.key("");
        loop {
            let snapshot = match self.store.range(&prefix).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(error = %e, "reading the cluster view");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            self.rebuild(&snapshot);
            if self.controller().is_none() {
                // Its outcome, won or lost, comes through the watch.
                self.elect().await;
            }
            let mut watch = match self.store.watch(&prefix, snapshot.revision + 1).await {
                Ok(w) => w,
                Err(e) => {
                    tracing::debug!(error = %e, "watching the cluster view");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            loop {
                // While there is no controller, stand again every RETRY: a
                // failed election brings no event to wake on.
                let next = if self.controller().is_none() {
                    match tokio::time::timeout(RETRY, watch.recv()).await {
                        Ok(next) => next,
                        Err(_) => {
                            self.elect().await;
                            continue;
                        }
                    }
                } else {
                    watch.recv().await
                };
                let Some(Ok(events)) = next else {
                    break;
                };
                self.apply(&events);
                if self.controller().is_none() {
                    self.elect().await;
                }
            }
            // The watch ended: read again, but not in a tight loop.
            tokio::time::sleep(RETRY / 5).await;
        }
    }

    /// The view from every key under the prefix.
    fn rebuild(&self, snapshot: &Snapshot) {
        let mut view = self.view.lock();
        if snapshot.revision < view.revision {
            return; // read before what the view already holds
        }
        let before: Vec<uuid::Uuid> = view.topic_ids.keys().copied().collect();
        view.members.clear();
        view.controller = None;
        view.topics.clear();
        view.topic_ids.clear();
        view.unreadable_topics.clear();
        view.configs.clear();
        for kv in &snapshot.kvs {
            self.put(&mut view, kv);
        }
        if view.unreadable_topics.is_empty() {
            for id in before {
                if !view.topic_ids.contains_key(&id) {
                    view.removed_topics.insert(id);
                }
            }
        }
        view.revision = snapshot.revision;
        drop(view);
        self.changed();
    }

    /// Applies a watch's changes newer than the view: a watch opened
    /// before the view was last read whole replays older ones, which
    /// must not undo what the read found.
    fn apply(&self, events: &[WatchEvent]) {
        let mut view = self.view.lock();
        let base = view.revision;
        for event in events {
            match event {
                WatchEvent::Put(kv) if kv.mod_revision > base => {
                    view.revision = view.revision.max(kv.mod_revision);
                    self.put(&mut view, kv)
                }
                WatchEvent::Delete { key, mod_revision } if *mod_revision > base => {
                    view.revision = view.revision.max(*mod_revision);
                    if *key == self.settings.key("controller") {
                        view.controller = None;
                    } else if let Some(id) = self.node_of(key) {
                        view.members.remove(&id);
                    } else if let Some(config) = key.strip_prefix(&self.settings.key("configs/")) {
                        view.configs.remove(config);
                    } else if let Some(name) = topics::name_of(&self.settings, key) {
                        view.unreadable_topics.remove(name);
                        if let Some(gone) = view.topics.remove(name) {
                            view.topic_ids.remove(&gone.topic.topic_id);
                            view.removed_topics.insert(gone.topic.topic_id);
                        }
                    }
                }
                _ => {} // already in the view
            }
        }
        drop(view);
        self.changed();
    }

    fn put(&self, view: &mut View, kv: &KeyValue) {
        if kv.key == self.settings.key("controller") {
            view.controller = decode::<i32>(kv).map(|node_id| Controller {
                node_id,
                epoch: kv.mod_revision,
            });
        } else if let Some(id) = self.node_of(&kv.key) {
            match decode::<Registration>(kv) {
                Some(registration) if registration.node_id == id => {
                    view.members.insert(
                        id,
                        Member {
                            registration,
                            epoch: kv.mod_revision,
                        },
                    );
                }
                _ => tracing::warn!(key = %kv.key, "a registration Keel cannot read; ignored"),
            }
        } else if let Some(config) = kv.key.strip_prefix(&self.settings.key("configs/")) {
            view.configs
                .insert(config.to_string(), (kv.value.clone(), kv.mod_revision));
        } else if let Some(name) = topics::name_of(&self.settings, &kv.key) {
            match decode::<ClusterTopic>(kv) {
                Some(topic) if topic.name == name => {
                    view.unreadable_topics.remove(name);
                    if let Some(old) = view.topics.get(name) {
                        let old_id = old.topic.topic_id;
                        view.topic_ids.remove(&old_id);
                        if old_id != topic.topic_id {
                            view.removed_topics.insert(old_id);
                        }
                    }
                    view.topic_ids.insert(topic.topic_id, topic.name.clone());
                    let stored = StoredTopic {
                        topic,
                        revision: kv.mod_revision,
                    };
                    view.topics.insert(name.to_string(), stored);
                }
                _ => {
                    // Neither the topic nor its absence: brokers keep what
                    // they hold of it.
                    tracing::warn!(key = %kv.key, "a topic Keel cannot read; ignored");
                    view.unreadable_topics.insert(name.to_string());
                    if let Some(old) = view.topics.remove(name) {
                        view.topic_ids.remove(&old.topic.topic_id);
                    }
                }
            }
        }
    }

    /// The node id a registration key names.
    fn node_of(&self, key: &str) -> Option<i32> {
        key.strip_prefix(&self.settings.key("brokers/"))?.parse().ok()
    }
}

/// The stored cluster id, or `candidate` once put; `None` if another
/// broker put one between the read and the put.
async fn claim_once(
    store: &dyn CoordStore,
    key: &str,
    candidate: &str,
) -> Result<Option<String>, StoreError> {
    if let Some(kv) = store.get(key).await? {
        return Ok(Some(String::from_utf8_lossy(&kv.value).into_owned()));
    }
    let put = Op::Put {
        key: key.to_string(),
        value: candidate.as_bytes().to_vec(),
        lease: None,
    };
    let claimed = store
        .txn(vec![Compare::Absent(key.to_string())], vec![put])
        .await?;
    Ok(claimed.map(|_| candidate.to_string()))
}

fn decode<T: for<'de> Deserialize<'de>>(kv: &KeyValue) -> Option<T> {
    serde_json::from_slice(&kv.value).ok()
}
