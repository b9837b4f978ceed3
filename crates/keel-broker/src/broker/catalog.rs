//! A cluster's topics on this broker. In a cluster the topics are the
//! cluster's, kept in the coordination store ([`keel_cluster::topics`]):
//! any broker changes them there, and every broker brings its data plane
//! to what the store holds (opens, grows, reconfigures and deletes its
//! local copy of each topic) on every change it sees. Who leads each
//! partition is read from the same view ([`ClusterLeadership`]).
//!
//! The same task follows the cluster's default broker configs
//! (`handlers::broker_configs`).
//!
//! One node keeps its topics in its own data directory, as it always has.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use keel_cluster::topics::{self, ClusterTopic, NO_LEADER};
use keel_cluster::{Membership, StoreError};
use keel_data::leadership::{Leader, Leadership};
use keel_data::partition::Partition;
use keel_data::topics::{Topic, TopicMeta, META_DIR};
use keel_protocol::ResponseError;
use uuid::Uuid;

use super::coord_log;
use crate::handlers::admin::AdminError;
use crate::Broker;

/// The file, in the data dir's `__keel_meta`, that marks a directory whose
/// topics are its cluster's: once it is there, a topic the directory holds
/// and the cluster does not is one deleted while the broker was away.
const JOINED_FILE: &str = "cluster-topics";

/// How often the data plane is checked against the view even without a
/// change (a local change that failed is tried again).
const RESYNC: Duration = Duration::from_secs(5);

/// Who leads each partition, from the cluster's view: the leader the
/// controller elected while it is live, and this broker only while its own
/// session is sure (a fenced broker leads nothing).
pub struct ClusterLeadership {
    pub membership: Arc<Membership>,
}

impl Leadership for ClusterLeadership {
    fn node_id(&self) -> i32 {
        self.membership.me().node_id
    }

    fn leader(&self, topic_id: Uuid, index: i32) -> Option<Leader> {
        let (node_id, epoch) = self.membership.live_leader(topic_id, index)?;
        Some(Leader { node_id, epoch })
    }

    fn replicas(&self, topic_id: Uuid, index: i32) -> Vec<i32> {
        self.membership
            .partition(topic_id, index)
            .map(|p| p.replicas)
            .unwrap_or_default()
    }
}

impl Broker {
    /// Whether this broker's topics are a cluster's (kept in etcd).
    pub fn topics_shared(&self) -> bool {
        self.cluster.store_is_shared()
    }

    /// The leader and leader epoch the cluster holds for a partition
    /// (leader -1 while none), for `/stats`; one node leads its own.
    pub fn leadership_of(&self, topic: &Topic, index: i32) -> (i32, i32) {
        if self.topics_shared() {
            return self
                .cluster
                .partition(topic.meta.topic_id, index)
                .map_or((NO_LEADER, -1), |p| (p.leader, p.leader_epoch));
        }
        self.data
            .leader(topic, index)
            .map_or((NO_LEADER, -1), |l| (l.node_id, l.epoch))
    }
}

/// A coordination-store failure as an admin request's error: retriable
/// unless the store refused the change itself.
pub(crate) fn store_error(e: StoreError) -> AdminError {
    let error = match e {
        StoreError::Refused(_) => ResponseError::InvalidRequest,
        _ => ResponseError::RequestTimedOut,
    };
    (error, format!("the cluster's metadata could not be changed: {e}"))
}

/// The largest a topic's description in the store may be: etcd refuses
/// requests over 1.5 MiB.
const MAX_TOPIC_BYTES: usize = 1 << 20;

/// Refuses a topic too large to keep in the store (about 20,000
/// partitions).
pub(crate) fn check_size(topic: &ClusterTopic) -> Result<(), AdminError> {
    let size = serde_json::to_vec(topic).map_or(usize::MAX, |v| v.len());
    if size > MAX_TOPIC_BYTES {
        return Err((
            ResponseError::InvalidPartitions,
            format!(
                "{} partitions make a description of {size} bytes, over the {MAX_TOPIC_BYTES} a cluster keeps per topic",
                topic.partitions.len()
            ),
        ));
    }
    Ok(())
}

/// On joining: the topics of the data directory the cluster does not
/// know are published to it if the directory has never been in a cluster
/// (a broker's first start in one brings its topics along), set aside as
/// strays otherwise (deleted while the broker was away; renamed, never
/// deleted). Then the data plane takes the cluster's topics, and follows
/// them from then on.
pub(crate) async fn join(broker: &Arc<Broker>) -> Result<(), String> {
    let cluster = &broker.cluster;
    // What follows needs a view known whole: the one membership read at
    // its start, unless that read failed.
    if cluster.revision() == 0 {
        cluster.refresh().await.map_err(|e| e.to_string())?;
    }
    let marker = broker.data.data_dir.join(META_DIR).join(JOINED_FILE);
    let storage = Arc::clone(&broker.data.storage);
    let joined = storage.file_len(&marker).map_err(|e| e.to_string())?.is_some();
    let mut published = 0;
    {
        let _admin = broker.admin.lock().await;
        for local in broker.data.topics.all() {
            let name = local.meta.name.as_str();
            if cluster.topic(name).is_some() || cluster.topic_unreadable(name) {
                continue; // the cluster's copy decides, in sync below
            }
            if !joined {
                if let Some(revision) = publish(broker, &local).await? {
                    published = published.max(revision);
                    continue;
                }
            }
            set_aside(broker, local).await;
        }
    }
    // What was published must be in the view before the data plane is
    // brought to it, or it would be taken for deleted.
    let wait = cluster.settings().session_timeout;
    if !cluster.wait_for(published, wait).await {
        return Err(format!(
            "the topics published to the cluster were not seen within {wait:?}"
        ));
    }
    crate::handlers::broker_configs::publish_default(broker).await?;
    if !joined {
        let id = broker.data.cluster_id.to_string();
        let m = marker.clone();
        tokio::task::spawn_blocking(move || {
            keel_log::storage::write_atomically(storage.as_ref(), &m, id.as_bytes())
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("{}: {e}", marker.display()))?;
    }
    if let Some(wal) = &broker.data.wal {
        let writing = tokio::spawn(Arc::clone(wal).run());
        let collecting = tokio::spawn(Arc::clone(wal).collect_garbage_forever());
        broker.tasks.lock().extend([writing, collecting]);
    }
    {
        let _admin = broker.admin.lock().await;
        sync_locked(broker).await;
        crate::handlers::broker_configs::follow_cluster_default_locked(broker).await;
    }
    take_leaderships(broker).await;
    let b = Arc::clone(broker);
    let following = tokio::spawn(async move { follow(b).await });
    broker.tasks.lock().push(following);
    Ok(())
}

/// Publishes a topic of this directory to the cluster, led here: the
/// change's revision, `None` if the name is taken.
async fn publish(broker: &Broker, local: &Topic) -> Result<Option<i64>, String> {
    let me = broker.cluster.me().node_id;
    // Its partitions' records are this broker's: no other may claim one
    // with an empty log before it does.
    for p in &local.partitions {
        if let Some(log) = p.reader() {
            let span = (log.log_start_offset(), log.log_end_offset());
            broker
                .cluster
                .seed_log((local.meta.topic_id, p.index), span)
                .await
                .map_err(|e| format!("cannot publish topic `{}`: {e}", local.meta.name))?;
        }
    }
    let topic = ClusterTopic {
        version: 1,
        name: local.meta.name.clone(),
        topic_id: local.meta.topic_id,
        configs: local.meta.configs.clone(),
        partitions: (0..local.meta.partitions)
            .map(|_| topics::PartitionState {
                leader: me,
                leader_epoch: 0,
                replicas: vec![me],
            })
            .collect(),
    };
    let created = broker
        .cluster
        .create_topic(&topic)
        .await
        .map_err(|e| format!("cannot publish topic `{}`: {e}", topic.name))?;
    if created.is_some() {
        tracing::info!(topic = %topic.name, partitions = topic.partitions.len(), "published this directory's topic to the cluster");
    }
    Ok(created)
}

/// Keeps the data plane at the cluster's view: on every change, and every
/// RESYNC. The partitions' leadership is taken after the admin lock is
/// let go: admin requests to this broker need not wait for takeovers.
async fn follow(broker: Arc<Broker>) {
    let mut changes = broker.cluster.subscribe();
    loop {
        let _ = tokio::time::timeout(RESYNC, changes.changed()).await;
        {
            let _admin = broker.admin.lock().await;
            sync_locked(&broker).await;
            crate::handlers::broker_configs::follow_cluster_default_locked(&broker).await;
        }
        take_leaderships(&broker).await;
    }
}

/// Waits for the view to hold the change at `revision`, then brings the
/// data plane to it and takes the leadership of the partitions it gives
/// this broker (a topic created here is led here when it is answered).
/// The caller holds `broker.admin`.
pub(crate) async fn settle_locked(broker: &Arc<Broker>, revision: i64) -> Result<(), AdminError> {
    sync_to_locked(broker, revision).await?;
    take_leaderships(broker).await;
    Ok(())
}

/// [`settle_locked`] but the takeover pass: the follower takes the
/// leaderships the change gives this broker (a deletion or a new config
/// gives none). The caller holds `broker.admin`.
async fn sync_to_locked(broker: &Arc<Broker>, revision: i64) -> Result<(), AdminError> {
    let wait = broker.cluster.settings().session_timeout;
    if !broker.cluster.wait_for(revision, wait).await {
        return Err((
            ResponseError::RequestTimedOut,
            format!("the change was made, but this broker did not see it within {wait:?}"),
        ));
    }
    sync_locked(broker).await;
    Ok(())
}

/// Brings the data plane's topics to the cluster's view: opens the
/// topics it lacks, grows and reconfigures the ones it has, deletes the
/// ones the cluster deleted. The caller holds `broker.admin`. A change
/// that fails is logged and tried again at the next pass. The leadership
/// of partitions is the next step, [`take_leaderships`], which the caller
/// may run after letting the lock go.
pub(crate) async fn sync_locked(broker: &Arc<Broker>) {
    let view = broker.cluster.topics();
    let names: BTreeSet<&str> = view.iter().map(|s| s.topic.name.as_str()).collect();
    for local in broker.data.topics.all() {
        let name = local.meta.name.as_str();
        if !names.contains(name) && !broker.cluster.topic_unreadable(name) {
            if let Err((_, why)) = crate::handlers::admin::remove_topic(broker, local.clone()).await {
                tracing::error!(topic = %local.meta.name, error = %why, "cannot delete a topic the cluster deleted");
            }
        }
    }
    for stored in &view {
        let t = &stored.topic;
        let local = broker.data.topics.get(&t.name);
        if let Some(old) = local.as_ref().filter(|l| l.meta.topic_id != t.topic_id) {
            // The cluster's topic of this name is another incarnation.
            set_aside(broker, Arc::clone(old)).await;
        }
        let outcome = match local.filter(|l| l.meta.topic_id == t.topic_id) {
            None => open_local(broker, t).await,
            Some(l) => update_local(broker, l, t).await,
        };
        if let Err(why) = outcome {
            tracing::error!(topic = %t.name, error = %why, "cannot bring a topic to the cluster's view");
        }
    }
}

/// How many partitions a broker takes the leadership of (or loads the
/// keys of) at once. Each waits on etcd and the object store rather than
/// on this broker, so a broker taking over a dead one's partitions does
/// them side by side.
const TAKEOVERS_AT_ONCE: usize = 16;

/// Claims the partitions the view says this broker leads and it has not
/// claimed in their epoch, and gives up those it no longer leads (see
/// `keel_data::replica`). A claim that fails is tried again at the next
/// pass. One pass at a time (`broker.takeovers`); a topic deleted during
/// a pass leaves its partitions' takeovers failing (their logs are gone).
async fn take_leaderships(broker: &Arc<Broker>) {
    let _pass = broker.takeovers.lock().await;
    let me = broker.cluster.me().node_id;
    let mut running = tokio::task::JoinSet::new();
    for topic in broker.data.topics.all() {
        // The coordinators' topics: their partitions' keys are loaded
        // where they are led (see `coord_log`).
        let coordinators = is_internal(&topic.meta.name);
        for partition in &topic.partitions {
            let index = partition.index;
            let claimed = partition.claimed_epoch();
            let take = match broker.cluster.live_leader(topic.meta.topic_id, index) {
                Some((leader, epoch)) if leader == me => (claimed != Some(epoch)).then_some(epoch),
                _ => {
                    if claimed.is_some() {
                        partition.give_up_leadership();
                    }
                    if coordinators {
                        coord_log::unload(broker, &topic.meta.name, index).await;
                    }
                    continue;
                }
            };
            let load =
                coordinators && (take.is_some() || !broker.coordinator_loaded(&topic.meta.name, index));
            if take.is_none() && !load {
                continue;
            }
            if running.len() >= TAKEOVERS_AT_ONCE {
                running.join_next().await;
            }
            let (broker, topic, partition) = (Arc::clone(broker), Arc::clone(&topic), Arc::clone(partition));
            running.spawn(async move { lead(&broker, &topic, &partition, take, load).await });
        }
    }
    while running.join_next().await.is_some() {}
}

/// Takes the leadership of `partition` in epoch `take` (if given), then
/// loads its keys if it is a coordinators' partition (`load`).
async fn lead(
    broker: &Arc<Broker>,
    topic: &Topic,
    partition: &Arc<Partition>,
    take: Option<i32>,
    load: bool,
) {
    let (name, index) = (topic.meta.name.as_str(), partition.index);
    if let Some(epoch) = take {
        if load {
            // The keys loaded from the old term are stale.
            coord_log::unload(broker, name, index).await;
        }
        if let Err(why) = keel_data::takeover::take_leadership(&broker.data, partition, epoch).await {
            return tracing::warn!(topic = name, partition = index, epoch, error = %why, "cannot take the partition's leadership yet");
        }
    }
    if load {
        if let Err(why) = coord_log::load(broker, name, partition, index, topic.meta.partitions).await {
            tracing::warn!(topic = name, partition = index, error = %why, "cannot load a coordinator's partition yet");
        }
    }
}

/// The configs the data plane gives a cluster's topic: its own, and for
/// the coordinators' topics (the group and transaction logs) no
/// retention: their snapshots bound them (see `coord_log`).
fn local_configs(t: &ClusterTopic) -> BTreeMap<String, String> {
    let mut configs = t.configs.clone();
    if is_internal(&t.name) {
        for (key, value) in [
            ("cleanup.policy", "delete"),
            ("retention.ms", "-1"),
            ("retention.bytes", "-1"),
        ] {
            configs.insert(key.to_string(), value.to_string());
        }
    }
    configs
}

async fn open_local(broker: &Arc<Broker>, t: &ClusterTopic) -> Result<(), String> {
    let meta = TopicMeta {
        version: 1,
        name: t.name.clone(),
        topic_id: t.topic_id,
        partitions: t.partition_count(),
        configs: local_configs(t),
        deleting: false,
    };
    let data = Arc::clone(&broker.data);
    run_blocking(move || data.create_topic(meta)).await?;
    tracing::info!(topic = %t.name, partitions = t.partitions.len(), "opened the cluster's topic");
    Ok(())
}

async fn update_local(broker: &Arc<Broker>, local: Arc<Topic>, t: &ClusterTopic) -> Result<(), String> {
    let mut local = local;
    if t.partition_count() > local.meta.partitions {
        let data = Arc::clone(&broker.data);
        let (l, count) = (Arc::clone(&local), t.partition_count());
        local = run_blocking(move || data.grow_topic(&l, count)).await?;
        tracing::info!(topic = %t.name, partitions = count, "grew the cluster's topic");
    }
    let configs = local_configs(t);
    if configs != local.meta.configs {
        crate::handlers::alter_configs::install_topic_configs(broker, local, configs).await?;
        tracing::info!(topic = %t.name, "took the cluster's configs of a topic");
    }
    Ok(())
}

/// Sets a local topic aside as a stray (see `DataPlane::set_aside_topic`).
async fn set_aside(broker: &Broker, topic: Arc<Topic>) {
    let data = Arc::clone(&broker.data);
    let t = Arc::clone(&topic);
    match run_blocking(move || data.set_aside_topic(&t)).await {
        Ok(kept) => tracing::warn!(
            topic = %topic.meta.name, topic_id = %topic.meta.topic_id, dirs = ?kept,
            "this directory's topic is not the cluster's (deleted while this broker was away, or \
             another incarnation): its partition directories are renamed to -stray, not deleted"
        ),
        Err(why) => tracing::error!(topic = %topic.meta.name, error = %why, "cannot set a topic aside"),
    }
}

/// A data-plane change on a blocking thread (see `handlers::admin::blocking`),
/// its failure as a message.
async fn run_blocking<T: Send + 'static, E: std::fmt::Display + Send + 'static>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, String> {
    crate::handlers::admin::blocking(f).await.map_err(|(_, why)| why)
}

/// What a change makes of a cluster's topic.
enum Change {
    Replace(ClusterTopic),
    Delete,
    Nothing,
}

/// Changes the cluster's topic `name` as `decide` says from what the view
/// holds of it, retrying while other changes (the controller's, another
/// broker's) land first, then waits for this broker's data plane to hold
/// the change. The caller holds `broker.admin`.
async fn change_topic_locked(
    broker: &Arc<Broker>,
    name: &str,
    decide: impl Fn(Option<&ClusterTopic>) -> Result<Change, AdminError>,
) -> Result<(), AdminError> {
    for _ in 0..50 {
        if broker.cluster.topic_unreadable(name) {
            return Err((
                ResponseError::InvalidRequest,
                format!("the cluster's description of topic `{name}` cannot be read by this broker"),
            ));
        }
        let stored = broker.cluster.topic(name);
        let revision = stored.as_ref().map_or(0, |s| s.revision);
        let had = stored.as_ref().map_or(0, |s| s.topic.partitions.len());
        // Only new partitions are led before the answer: other changes do
        // not wait for a takeover pass under the admin lock.
        let mut grows = false;
        let written = match decide(stored.as_ref().map(|s| &s.topic))? {
            Change::Nothing => return Ok(()),
            Change::Replace(next) => {
                check_size(&next)?;
                grows = next.partitions.len() > had;
                broker.cluster.replace_topic(&next, revision).await
            }
            Change::Delete => broker.cluster.delete_topic(name, revision).await,
        };
        match written {
            Ok(Some(revision)) if grows => return settle_locked(broker, revision).await,
            Ok(Some(revision)) => return sync_to_locked(broker, revision).await,
            // Changed meanwhile: wait for the view to see it, then again.
            Ok(None) => {
                broker
                    .cluster
                    .wait_for_topic_change(name, revision, Duration::from_secs(1))
                    .await;
            }
            Err(e) => return Err(store_error(e)),
        }
    }
    Err((
        ResponseError::RequestTimedOut,
        format!("topic `{name}` kept changing under this request"),
    ))
}

/// Changes the cluster's topic `name` with `change` (see
/// [`change_topic_locked`]).
pub(crate) async fn update_topic_locked(
    broker: &Arc<Broker>,
    name: &str,
    change: impl Fn(&ClusterTopic) -> Result<ClusterTopic, AdminError>,
) -> Result<(), AdminError> {
    change_topic_locked(broker, name, |stored| {
        let stored = stored.ok_or((
            ResponseError::UnknownTopicOrPartition,
            format!("topic `{name}` does not exist"),
        ))?;
        let next = change(stored)?;
        Ok(if next == *stored {
            Change::Nothing
        } else {
            Change::Replace(next)
        })
    })
    .await
}

/// Deletes the cluster's topic `name` of id `topic_id` (see
/// [`change_topic_locked`]).
pub(crate) async fn delete_topic_locked(
    broker: &Arc<Broker>,
    name: &str,
    topic_id: Uuid,
) -> Result<(), AdminError> {
    change_topic_locked(broker, name, |stored| match stored {
        Some(t) if t.topic_id == topic_id => Ok(Change::Delete),
        _ => Err((
            ResponseError::UnknownTopicOrPartition,
            format!("topic `{name}` was deleted meanwhile"),
        )),
    })
    .await
}

/// Leaders for `count` new partitions on the live brokers, as
/// [`topics::place`] puts them; or, where the request names them
/// (`assignment`, one broker per partition), there.
pub(crate) fn placement(
    broker: &Broker,
    count: usize,
    assignment: Option<&[i32]>,
) -> Result<Vec<topics::PartitionState>, AdminError> {
    let live = broker.cluster.live();
    if let Some(nodes) = assignment {
        if let Some(n) = nodes.iter().find(|n| !live.contains(n)) {
            return Err((
                ResponseError::InvalidReplicaAssignment,
                format!("broker {n} is not a live broker of this cluster"),
            ));
        }
        return Ok(nodes
            .iter()
            .map(|n| topics::PartitionState {
                leader: *n,
                leader_epoch: 0,
                replicas: vec![*n],
            })
            .collect());
    }
    let all = broker.cluster.topics();
    let load: BTreeMap<i32, usize> = topics::load(all.iter().map(|s| &s.topic));
    let placed = topics::place(count, &live, &load);
    if placed.len() != count {
        return Err((
            ResponseError::InvalidReplicationFactor,
            "Unable to replicate the partition 1 time(s): no broker is registered".into(),
        ));
    }
    Ok(placed)
}

pub use keel_cluster::topics::{is_internal, GROUPS_TOPIC, TRANSACTIONS_TOPIC};

/// Where a transaction marker for a partition of `__consumer_offsets`
/// goes (see [`Broker::group_marker_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerAt {
    /// The topic does not exist yet: the partition holds no offsets.
    Nowhere,
    /// This broker leads it.
    Here,
    /// Another live broker leads it.
    Broker(i32),
    /// No live broker leads it now.
    NoLeader,
}

/// The partition of a coordinators' topic of `partitions` partitions that
/// `key` (a group or transactional id) falls in: Kafka's
/// `Utils.abs(key.hashCode()) % partitions` (Java's string hash; the
/// absolute value, 0 for `i32::MIN`), so a key maps to the same partition
/// as on Kafka.
pub fn coordinator_partition(key: &str, partitions: i32) -> i32 {
    let hash = key
        .encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)));
    let abs = if hash == i32::MIN { 0 } else { hash.abs() };
    abs % partitions.max(1)
}

impl Broker {
    /// The internal topic placing the coordinators of `transactions` (or
    /// of groups) and its configured partition count.
    fn coordinators_topic(&self, transactions: bool) -> (&'static str, i32) {
        let (name, key) = if transactions {
            (TRANSACTIONS_TOPIC, "transaction.state.log.num.partitions")
        } else {
            (GROUPS_TOPIC, "offsets.topic.num.partitions")
        };
        (name, i32::try_from(self.config().num(key)).unwrap_or(50).max(1))
    }

    /// How many brokers must be live before the coordinators are placed.
    fn coordinators_brokers(&self, transactions: bool) -> usize {
        let key = if transactions {
            "transaction.state.log.replication.factor"
        } else {
            "offsets.topic.replication.factor"
        };
        usize::try_from(self.config().num(key)).unwrap_or(3).max(1)
    }

    /// In a cluster, creates the internal topic placing the coordinators
    /// of `transactions` (or of groups) on the live brokers if it does not
    /// exist yet, as Kafka does at the first FindCoordinator. A failure is
    /// logged: FindCoordinator answers COORDINATOR_NOT_AVAILABLE meanwhile
    /// and the client asks again.
    pub(crate) async fn ensure_coordinators(self: &Arc<Self>, transactions: bool) {
        let (name, partitions) = self.coordinators_topic(transactions);
        if !self.topics_shared() || self.cluster.topic(name).is_some() {
            return;
        }
        let (live, needed) = (self.cluster.live().len(), self.coordinators_brokers(transactions));
        if live < needed {
            return tracing::warn!(
                topic = name,
                live,
                needed,
                "not placing the coordinators until enough brokers are live \
                 (offsets.topic.replication.factor / transaction.state.log.replication.factor)"
            );
        }
        let placed = match placement(self, usize::try_from(partitions).unwrap_or(1), None) {
            Ok(placed) => placed,
            Err((_, why)) => return tracing::warn!(topic = name, %why, "cannot place the coordinators"),
        };
        let topic = ClusterTopic {
            version: 1,
            name: name.to_string(),
            topic_id: Uuid::new_v4(),
            configs: BTreeMap::new(),
            partitions: placed,
        };
        match self.cluster.create_topic(&topic).await {
            Ok(Some(revision)) => {
                tracing::info!(topic = name, partitions, revision, "placed the coordinators");
                self.cluster
                    .wait_for(revision, self.cluster.settings().session_timeout)
                    .await;
            }
            Ok(None) => {} // another broker placed them first
            Err(e) => tracing::warn!(topic = name, error = %e, "cannot place the coordinators"),
        }
    }

    /// Why this broker cannot serve `group` now, if it cannot: another
    /// broker coordinates it (NOT_COORDINATOR; COORDINATOR_NOT_AVAILABLE
    /// while none does), or this one still reads its partition of
    /// `__consumer_offsets` (COORDINATOR_LOAD_IN_PROGRESS, see
    /// `coord_log`). One node serves every group.
    pub fn group_refused(&self, group: &str) -> Option<ResponseError> {
        self.key_refused(group, false)
    }

    /// Why this broker cannot serve transactional id `id` now, if it
    /// cannot: as [`Broker::group_refused`], for its partition of
    /// `__transaction_state`. One node serves every id.
    pub fn txn_refused(&self, id: &str) -> Option<ResponseError> {
        self.key_refused(id, true)
    }

    /// [`Broker::group_refused`] and [`Broker::txn_refused`]: the key's
    /// coordinator is another broker, none, or this one still loading it.
    fn key_refused(&self, key: &str, transactions: bool) -> Option<ResponseError> {
        if !self.topics_shared() {
            return None;
        }
        let (name, _) = self.coordinators_topic(transactions);
        match self.coordinator_of(key, transactions) {
            Ok(node) if node != self.config().node_id() => Some(ResponseError::NotCoordinator),
            Ok(_) => {
                let partitions = self.cluster.topic_shape(name).map_or(1, |(_, n)| n);
                let index = coordinator_partition(key, partitions);
                (!self.coordinator_loaded(name, index)).then_some(ResponseError::CoordinatorLoadInProgress)
            }
            Err(e) => Some(e),
        }
    }

    /// Whether this broker has loaded partition `index` of the
    /// coordinators' topic `topic`.
    fn coordinator_loaded(&self, topic: &str, index: i32) -> bool {
        if topic == GROUPS_TOPIC {
            self.group_log.is_loaded(index)
        } else {
            self.txn_log.is_loaded(index)
        }
    }

    /// Where a transaction marker for partition `index` of
    /// `__consumer_offsets` goes, in a cluster.
    pub fn group_marker_at(&self, index: i32) -> MarkerAt {
        let Some((id, _)) = self.cluster.topic_shape(GROUPS_TOPIC) else {
            return MarkerAt::Nowhere;
        };
        match self.cluster.live_leader(id, index) {
            None => MarkerAt::NoLeader,
            Some((node, _)) if node == self.config().node_id() => MarkerAt::Here,
            Some((node, _)) => MarkerAt::Broker(node),
        }
    }

    /// The epoch transactional id `id`'s coordinator writes its markers
    /// with, which a partition fences older coordinators' markers by
    /// (TRANSACTION_COORDINATOR_FENCED): in a cluster, the leader epoch
    /// of the id's partition of `__transaction_state` while this broker
    /// leads it (`None` while it does not), as Kafka's.
    pub fn coordinator_epoch(&self, id: &str) -> Option<i32> {
        if !self.topics_shared() {
            return Some(keel_coord::txn::COORDINATOR_EPOCH);
        }
        let (name, _) = self.coordinators_topic(true);
        let (topic_id, partitions) = self.cluster.topic_shape(name)?;
        self.cluster
            .live_leader(topic_id, coordinator_partition(id, partitions))
            .filter(|(node, _)| *node == self.config().node_id())
            .map(|(_, epoch)| epoch)
    }

    /// Whether this broker leads a partition of `__consumer_offsets` it
    /// has not loaded yet.
    pub fn groups_loading(&self) -> bool {
        let Some((id, partitions)) = self.cluster.topic_shape(GROUPS_TOPIC) else {
            return false;
        };
        let me = self.config().node_id();
        (0..partitions).any(|index| {
            self.cluster
                .live_leader(id, index)
                .is_some_and(|(node, _)| node == me)
                && !self.group_log.is_loaded(index)
        })
    }

    /// The partition of `__consumer_offsets` a transaction takes in to
    /// commit `group`'s offsets, as Kafka's does: the group's. One node
    /// keeps every group in one log, its partition 0.
    pub fn offsets_partition_of(&self, group: &str) -> (String, i32) {
        if !self.topics_shared() {
            return keel_coord::txn::offsets_partition();
        }
        // Before the topic is placed: the partitions it will have.
        let partitions = self
            .cluster
            .topic_shape(GROUPS_TOPIC)
            .map_or_else(|| self.coordinators_topic(false).1, |(_, n)| n);
        (GROUPS_TOPIC.to_string(), coordinator_partition(group, partitions))
    }

    /// The broker coordinating the group (or, with `transactions`, the
    /// transactional id) `key`: this one for one node; in a cluster, the
    /// live leader of the key's partition of the coordinators' topic
    /// (COORDINATOR_NOT_AVAILABLE while there is none).
    pub fn coordinator_of(&self, key: &str, transactions: bool) -> Result<i32, ResponseError> {
        if !self.topics_shared() {
            return Ok(self.config().node_id());
        }
        let (name, _) = self.coordinators_topic(transactions);
        let (topic_id, partitions) = self
            .cluster
            .topic_shape(name)
            .ok_or(ResponseError::CoordinatorNotAvailable)?;
        self.cluster
            .live_leader(topic_id, coordinator_partition(key, partitions))
            .map(|(node, _)| node)
            .ok_or(ResponseError::CoordinatorNotAvailable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_fall_in_the_partitions_kafka_puts_them_in() {
        // Kafka: Utils.abs(key.hashCode()) % 50.
        assert_eq!(coordinator_partition("", 50), 0);
        assert_eq!(coordinator_partition("a", 50), 97 % 50);
        // "my-group".hashCode() == -1906497762 in Java.
        assert_eq!(coordinator_partition("my-group", 50), 1_906_497_762 % 50);
        // "polygenelubricants".hashCode() == Integer.MIN_VALUE: Utils.abs gives 0.
        assert_eq!(coordinator_partition("polygenelubricants", 50), 0);
        for key in ["x", "group-17", "transactional-id", "é"] {
            assert!((0..7).contains(&coordinator_partition(key, 7)));
        }
    }
}
