//! The broker: topics, producer ids and request dispatch.

pub mod catalog;
pub mod coord_log;
pub mod identity;
pub mod producer_ids;
pub(crate) mod refused;
mod state_metrics;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::metrics::Metrics;
use keel_config::{BrokerConfig, LiveConfig};
use keel_coord::groups::GroupCoordinator;
use keel_coord::metalog::OpenError;
use keel_coord::shared::TableStore;
use keel_data::health::DirHealth;
use keel_data::plane::DataPlane;
use keel_data::producers::ProducerIdAllocator;
use keel_data::topics::{TopicRegistry, TopicStore, META_DIR};
use keel_log::clock::{Clock, SystemClock};
use keel_log::faults::FaultyStorage;
use keel_log::{DiskStorage, ReadIo, Storage};
use keel_tier::memory::MemoryLimit;
use keel_tier::{Budgets, ColdReads, IoClass, IoScheduler, TailCache, Tiers};

use keel_data::cleaner::Cleaner;
use keel_data::leadership::{Leadership, SingleNode};
use keel_data::mover::Mover;

/// What to send back for one request.
#[derive(Debug)]
pub enum Reply {
    /// A complete response frame, size prefix included.
    Frame(Bytes),
    /// Nothing (Produce with acks=0).
    Nothing,
    /// Close the connection: the client sent something that cannot be
    /// answered in its own protocol, as Kafka does.
    Close(String),
    /// Close the connection after a request for an API or version Keel does
    /// not serve. The broker logged it, once per client id and API, so the
    /// connection does not log it again.
    Refused(String),
    /// Send a frame (after `delay`, when it is a failed authentication's
    /// answer), then close the connection.
    FrameThenClose {
        frame: Bytes,
        delay: Duration,
        reason: String,
    },
}

/// Who sent a request, as group APIs report it, and on which listener.
#[derive(Debug, Clone, Default)]
pub struct ClientInfo {
    /// Kafka's form: `/` followed by the peer's IP address.
    pub host: String,
    /// The peer's port: with the host, which connection it is.
    pub port: u16,
    /// The listener's name: Metadata, FindCoordinator and DescribeCluster
    /// advertise that listener's address.
    pub listener: String,
    /// The user its TLS client certificate names (through
    /// `ssl.principal.mapping.rules`).
    pub user: Option<Arc<str>>,
    /// On a SASL listener, the connection's authenticator.
    pub sasl: Option<keel_auth::sasl::ConnectionAuth>,
}

impl ClientInfo {
    /// The user the connection authenticated as: its SASL user on a SASL
    /// listener, else its certificate's; `None` is `ANONYMOUS`.
    pub fn principal(&self) -> Option<Arc<str>> {
        match &self.sasl {
            Some(auth) => auth.user(),
            None => self.user.clone(),
        }
    }
}

/// Why the broker could not start.
#[derive(Debug)]
pub enum StartError {
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    Topics(keel_data::plane::PartitionsError),
    Groups(OpenError),
    Transactions(OpenError),
    Share(OpenError),
    Quotas(OpenError),
    Scram(OpenError),
    Acls(OpenError),
    Authorizer(keel_auth::SettingError),
    /// The data directory belongs to another cluster.
    InconsistentClusterId {
        stored: String,
        cluster: String,
    },
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Io { path, error } => write!(f, "{}: {error}", path.display()),
            StartError::Topics(e) => write!(f, "cannot open the topics: {e}"),
            StartError::Groups(e) => write!(f, "cannot open the group log: {e}"),
            StartError::Transactions(e) => write!(f, "cannot open the transaction log: {e}"),
            StartError::Share(e) => write!(f, "cannot open the share log: {e}"),
            StartError::Quotas(e) => write!(f, "cannot open the quota log: {e}"),
            StartError::Scram(e) => write!(f, "cannot open the SCRAM credential log: {e}"),
            StartError::Acls(e) => write!(f, "cannot open the ACL log: {e}"),
            StartError::Authorizer(e) => write!(f, "the authorizer's settings: {e}"),
            StartError::InconsistentClusterId { stored, cluster } => write!(
                f,
                "the data directory belongs to cluster {stored}, not to cluster {cluster} \
                 that the coordination store names; give this broker an empty log.dirs or \
                 point it at its own cluster"
            ),
        }
    }
}

impl std::error::Error for StartError {}

pub struct Broker {
    /// The configuration in force; read it with [`Broker::config`].
    pub config: Arc<LiveConfig>,
    /// The memory the broker may use (host or cgroup), for the budgets.
    pub memory: MemoryLimit,
    /// Each listener's advertised address.
    pub advertised: Vec<keel_config::listeners::Endpoint>,
    /// The partitions, what they are built on and the background work on
    /// them.
    pub data: Arc<DataPlane>,
    /// This broker's membership of the cluster: the live brokers and the
    /// controller (one node: itself alone).
    pub cluster: Arc<keel_cluster::Membership>,
    /// The fault-injecting layer under the data plane's storage, when the
    /// broker was started with `KEEL_FAILPOINTS=1` (tests only).
    pub failpoints: Option<FaultyStorage>,
    /// Where fresh producer ids come from.
    pub producer_ids: producer_ids::ProducerIds,
    pub groups: Arc<GroupCoordinator>,
    /// In a cluster, where the group coordinator's records go: the
    /// partitions of `__consumer_offsets` this broker leads.
    pub group_log: Arc<coord_log::CoordinatorLog<keel_coord::groups::store::GroupTable>>,
    /// The transaction coordinator.
    pub txns: Arc<keel_coord::txn::TxnCoordinator>,
    /// The share group coordinator (KIP-932), served when
    /// `keel.share.version` is 1.
    pub share: Arc<keel_coord::share::ShareCoordinator>,
    /// In a cluster, where the transaction coordinator's records go: the
    /// partitions of `__transaction_state` this broker leads.
    pub txn_log: Arc<coord_log::CoordinatorLog<keel_coord::txn::TxnTable>>,
    /// Client quotas: what is set, and the rates held to them.
    pub quotas: crate::quotas::ClientQuotas,
    /// The SCRAM credentials SASL listeners authenticate against.
    pub scram: Arc<keel_auth::sasl::credentials::ScramCredentials>,
    /// The ACLs, and whether and how they are enforced.
    pub acls: keel_auth::acl::store::AclStore,
    pub authorizer: keel_auth::acl::AuthorizerSettings,
    /// Serializes topic creation, deletion and growth. Held across their
    /// file I/O, which is fine: only other admin requests wait on it.
    pub admin: tokio::sync::Mutex<()>,
    /// Serializes passes that take partitions' leadership in a cluster
    /// (`catalog::take_leaderships`). Separate from `admin`: a takeover
    /// waits on etcd and the object store, and admin requests need not
    /// wait for it.
    pub takeovers: tokio::sync::Mutex<()>,
    /// The epoch of the features ApiVersions finalizes: the broker's start
    /// time, so a restart under a changed `keel.transaction.version` is
    /// newer to the clients than what they saw before.
    pub features_epoch: i64,
    /// Request metrics and the slow-request log (`/metrics`).
    pub metrics: Metrics,
    /// The process's loggers (Kafka's BROKER_LOGGER), set by the binary
    /// that owns the log subscriber; unset, there are none to describe.
    pub loggers: std::sync::OnceLock<Arc<dyn crate::loggers::Loggers>>,
    /// How requests reach the other brokers of a cluster, set by the
    /// binary that owns the sockets; unset, none are sent.
    pub peers: std::sync::OnceLock<Arc<dyn crate::peers::PeerTransport>>,
    /// The requests sent to other brokers.
    pub peer_stats: crate::peers::PeerStats,
    /// Consumer groups' own configs (`kafka-configs --entity-type groups`).
    pub group_configs: crate::group_configs::GroupConfigs,
    /// The clients already told, in the log, that an API they asked for is
    /// not served.
    pub(crate) refused_apis: refused::RefusedApis,
    /// Background tasks that end with the broker (following the
    /// cluster's topics).
    pub(crate) tasks: parking_lot::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// In a cluster, the revision of the cluster's default broker configs
    /// this broker last put in force (or found wanting).
    pub(crate) seen_cluster_default: parking_lot::Mutex<Option<i64>>,
}

impl Broker {
    /// The configuration in force (dynamic changes replace it whole).
    pub fn config(&self) -> Arc<BrokerConfig> {
        self.config.get()
    }

    /// The address advertised to clients of `listener` (the first
    /// listener's for one Keel does not know).
    pub fn endpoint(&self, listener: &str) -> (&str, i32) {
        self.advertised
            .iter()
            .find(|e| e.listener == listener)
            .or(self.advertised.first())
            .map_or(("", -1), |e| (e.host.as_str(), e.port))
    }

    /// Opens the data directory of one node: its cluster identity (a new
    /// one if the directory is new), topics, partition logs (with
    /// recovery). Its membership, on an in-process store, is not started.
    /// Blocking.
    pub fn open(
        config: BrokerConfig,
        advertised: Vec<keel_config::listeners::Endpoint>,
    ) -> Result<Arc<Broker>, StartError> {
        let data_dir = config.data_dir();
        let stored = identity::read_meta_properties(DiskStorage::shared().as_ref(), &data_dir)
            .map_err(io_error(&data_dir))?;
        let identity = identity::Identity {
            cluster_id: stored.cluster_id.unwrap_or_else(identity::new_cluster_id),
            directory_id: stored.directory_id.unwrap_or_else(identity::new_directory_id),
        };
        let membership = identity::local_membership(&config, &advertised, &identity.directory_id);
        Broker::open_in(config, advertised, identity, membership)
    }

    /// Opens the data directory as a member of the cluster `membership`
    /// speaks for, under `identity` (the directory must carry the same
    /// cluster id, or be new): topics, partition logs (with recovery).
    /// The caller starts the membership once the broker is open. Blocking.
    pub fn open_in(
        config: BrokerConfig,
        advertised: Vec<keel_config::listeners::Endpoint>,
        identity: identity::Identity,
        membership: Arc<keel_cluster::Membership>,
    ) -> Result<Arc<Broker>, StartError> {
        let data_dir = config.data_dir();
        let meta_dir = data_dir.join(META_DIR);
        let (storage, failpoints) = open_storage(&meta_dir)?;
        identity::settle_meta_properties(storage.as_ref(), &data_dir, config.node_id(), &identity)?;
        let cluster_id = identity.cluster_id;
        let ids_path = meta_dir.join("producer-ids");
        let local_ids =
            ProducerIdAllocator::open_with(Arc::clone(&storage), &ids_path).map_err(io_error(&ids_path))?;
        // In a cluster (a store the brokers share), producer ids, the ACLs,
        // SCRAM credentials, quotas, group configs, topics and leaders are
        // the cluster's, in the coordination store.
        let clustered = membership.store_is_shared();
        let producer_ids = producer_ids::ProducerIds::new(local_ids, &membership, clustered);
        let stored = crate::dynamic_config::load(storage.as_ref(), &meta_dir, config.node_id())
            .map_err(io_error(&meta_dir))?;
        let config = crate::dynamic_config::start(config, stored);
        let group_configs = if clustered {
            crate::group_configs::GroupConfigs::shared(Arc::clone(&membership))
        } else {
            crate::group_configs::GroupConfigs::load(storage.as_ref(), &meta_dir)
                .map_err(io_error(&meta_dir))?
        };
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let shared = clustered.then(|| (membership.store(), membership.settings().prefix.clone()));
        let shared = shared.as_ref().map(|(store, prefix)| (store, prefix.as_str()));
        // A coordinator's write waits for its commit as long as an offset
        // commit does.
        let commit_timeout = std::time::Duration::from_millis(
            u64::try_from(config.num("offsets.commit.timeout.ms")).unwrap_or(5000),
        );
        let group_log = coord_log::CoordinatorLog::new(
            catalog::GROUPS_TOPIC,
            config.coordinator_config().log_segment_bytes,
            commit_timeout,
        );
        let txn_log = coord_log::CoordinatorLog::new(
            catalog::TRANSACTIONS_TOPIC,
            config.txn_config().log_segment_bytes,
            commit_timeout,
        );
        let sinks = clustered.then(|| (group_log.sink(), txn_log.sink(), txn_log.holds()));
        let coordinators = Coordinators::open(&config, &storage, &meta_dir, &clock, shared, sinks)?;
        let authorizer = keel_auth::acl::settings(&config).map_err(StartError::Authorizer)?;
        let metrics = Metrics::new(config.slow_request());
        let features_epoch = clock.now_ms();
        let memory = MemoryLimit::detect();
        let live = Arc::new(LiveConfig::new(config));
        // In a cluster, the topics and who leads them are the cluster's.
        let leadership: Arc<dyn Leadership> = if clustered {
            Arc::new(catalog::ClusterLeadership {
                membership: Arc::clone(&membership),
            })
        } else {
            Arc::new(SingleNode {
                node_id: live.get().node_id(),
            })
        };
        let parts = PlaneParts {
            storage,
            cluster_id: Arc::from(cluster_id),
            clock,
            leadership,
            wal_membership: clustered.then(|| Arc::clone(&membership)),
        };
        let data = open_data_plane(&live, &memory, parts)?;
        let broker = Broker {
            config: live,
            memory,
            advertised,
            data: Arc::new(data),
            cluster: membership,
            failpoints,
            producer_ids,
            groups: Arc::new(coordinators.groups),
            group_log,
            txns: Arc::new(coordinators.txns),
            share: Arc::new(coordinators.share),
            txn_log,
            quotas: coordinators.quotas,
            scram: Arc::new(coordinators.scram),
            acls: coordinators.acls,
            authorizer,
            admin: tokio::sync::Mutex::new(()),
            takeovers: tokio::sync::Mutex::new(()),
            features_epoch,
            loggers: std::sync::OnceLock::new(),
            peers: std::sync::OnceLock::new(),
            peer_stats: crate::peers::PeerStats::default(),
            group_configs,
            refused_apis: refused::RefusedApis::default(),
            metrics,
            tasks: parking_lot::Mutex::new(Vec::new()),
            seen_cluster_default: parking_lot::Mutex::new(None),
        };
        broker
            .data
            .mover
            .set_committed_offsets(Arc::new(GroupCommits(Arc::downgrade(&broker.groups))));
        broker.data.load_topics().map_err(StartError::Topics)?;
        Ok(Arc::new(broker))
    }

    /// Joins the cluster: registers this broker, then reads the tables it
    /// shares with the others (ACLs, SCRAM credentials, quotas; nothing to
    /// read for one node, whose are in its own logs), then takes the
    /// cluster's topics ([`catalog::join`]).
    pub async fn start_cluster(self: &Arc<Self>) -> Result<(), String> {
        self.cluster.start().await.map_err(|e| e.to_string())?;
        let read =
            |what: &str, e: keel_coord::metalog::StoreError| format!("cannot read the cluster's {what}: {e}");
        self.acls.load().await.map_err(|e| read("ACLs", e))?;
        self.scram
            .load()
            .await
            .map_err(|e| read("SCRAM credentials", e))?;
        self.quotas.load().await.map_err(|e| read("client quotas", e))?;
        if self.topics_shared() {
            let handle = tokio::runtime::Handle::current();
            self.group_log.start(handle.clone(), Arc::clone(&self.data));
            self.txn_log.start(handle, Arc::clone(&self.data));
            catalog::join(self).await?;
        }
        Ok(())
    }

    /// This broker's membership for `/stats`: the store, its session, the
    /// controller and the live brokers.
    fn cluster_json(&self) -> serde_json::Value {
        let c = &self.cluster;
        serde_json::json!({
            "store": c.store_description(),
            "node_id": c.me().node_id,
            "broker_epoch": c.broker_epoch(),
            "fenced": c.is_fenced(),
            "controller": c.controller().map(|c| serde_json::json!({
                "node_id": c.node_id,
                "epoch": c.epoch,
            })),
            "brokers": c.members().iter().map(|m| serde_json::json!({
                "node_id": m.registration.node_id,
                "epoch": m.epoch,
                "endpoints": m.registration.endpoints.iter()
                    .map(|e| format!("{}://{}:{}", e.listener, e.host, e.port))
                    .collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "group_log": self.topics_shared().then(|| self.group_log.stats_json()),
            "txn_log": self.topics_shared().then(|| self.txn_log.stats_json()),
            "peer_requests": self.peer_stats.json(),
            "wal": self.data.wal.as_ref().map(|w| {
                let n = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
                serde_json::json!({
                    "objects": n(&w.stats.objects),
                    "bytes": n(&w.stats.bytes),
                    "write_failures": n(&w.stats.write_failures),
                    "commit_failures": n(&w.stats.commit_failures),
                    "fenced_groups": n(&w.stats.fenced_groups),
                    "collected_objects": n(&w.stats.collected_objects),
                    "collected_orphans": n(&w.stats.collected_orphans),
                    "collected_bytes": n(&w.stats.collected_bytes),
                    "collected_keys": n(&w.stats.collected_keys),
                    "pending_bytes": w.unwritten_bytes(),
                })
            }),
        })
    }

    /// The I/O governor: its target, cuts and the live p99 it last judged.
    /// Each share partition: its start and end offsets, its in-flight
    /// records by state, and what it redelivered and archived.
    fn share_json(&self) -> serde_json::Value {
        let names: std::collections::HashMap<uuid::Uuid, String> = self
            .data
            .topics
            .all()
            .iter()
            .map(|t| (t.meta.topic_id, t.meta.name.clone()))
            .collect();
        let partitions: Vec<serde_json::Value> = self
            .share
            .partition_stats()
            .into_iter()
            .map(|s| {
                serde_json::json!({
                    "group": s.key.group,
                    "topic": names.get(&s.key.topic_id).cloned().unwrap_or_default(),
                    "partition": s.key.partition,
                    "start_offset": s.start_offset,
                    "end_offset": s.end_offset,
                    "available": s.counts.available,
                    "acquired": s.counts.acquired,
                    "acknowledged": s.counts.acknowledged,
                    "archived": s.counts.archived,
                    "redeliveries": s.counts.redeliveries,
                    "archived_at_limit": s.counts.archived_at_limit,
                    "lock_expiries": s.counts.lock_expiries,
                })
            })
            .collect();
        serde_json::json!({
            "enabled": crate::handlers::share::enabled(self),
            "groups": self.share.list().len(),
            "partitions": partitions,
        })
    }

    fn io_governor_json(&self) -> serde_json::Value {
        let g = self.data.io.governor_stats();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        serde_json::json!({
            "target_ms": g.target.map(ms),
            "cuts": g.cuts,
            "live_p99_ms": g.live_p99.map(ms),
            // Every tick of the last five minutes: [wall-clock ms, live p99
            // µs, budgets set (cold read, tier move, cleaning; 0:
            // unlimited), bytes per second each did].
            "history": self.data.io.governor_history().iter().map(|t| {
                let [b0, b1, b2] = t.budgets;
                let [u0, u1, u2] = t.used;
                [t.at_ms, t.live_p99_us, b0, b1, b2, u0, u1, u2]
            }).collect::<Vec<_>>(),
        })
    }

    /// Counters for operators, as JSON: the tail cache and cold reads
    /// broker-wide, page-cache residency of the segment files (mincore), and
    /// per partition the bytes served from each source. Blocking (the
    /// residency check maps each segment file briefly).
    pub fn stats_json(&self) -> serde_json::Value {
        let t = self.data.tail_cache.stats();
        let c = self.data.cold.stats();
        let scan = self.data.cold.scan_pool().stats();
        let mut partitions = Vec::new();
        let groups = self.groups.groups_by_client();
        let (mut resident_total, mut size_total) = (0u64, 0u64);
        for topic in self.data.topics.all() {
            let compacted = self
                .config()
                .cleanup_policy(&topic.meta.configs)
                .is_ok_and(|c| c.compact);
            for p in &topic.partitions {
                let (resident, size) = p.page_cache_residency();
                resident_total += resident;
                size_total += size;
                let mut json = partition_json(&topic.meta.name, p, compacted, (resident, size), &groups);
                let (leader, leader_epoch) = self.leadership_of(&topic, p.index);
                json["leader"] = leader.into();
                json["leader_epoch"] = leader_epoch.into();
                if self.data.wal.is_some() {
                    // The epoch this broker claimed it in (null: it does
                    // not write it).
                    json["claimed_epoch"] = p.claimed_epoch().into();
                }
                partitions.push(json);
            }
        }
        partitions.sort_by(|a, b| {
            (a["topic"].as_str(), a["partition"].as_i64())
                .cmp(&(b["topic"].as_str(), b["partition"].as_i64()))
        });
        serde_json::json!({
            "cluster": self.cluster_json(),
            "tail_cache": {
                "budget_bytes": t.budget_bytes,
                "used_bytes": t.used_bytes,
                "cached_batches": t.cached_batches,
                "inserted_bytes": t.inserted_bytes,
                "evicted_bytes": t.evicted_bytes,
                "evicted_batches": t.evicted_batches,
                "hit_reads": t.hit_reads,
                "hit_bytes": t.hit_bytes,
                "miss_reads": t.miss_reads,
            },
            "io": self.data.io.stats().iter().map(|s| serde_json::json!({
                "class": s.class.name(),
                "budget_bytes_per_sec": s.budget_bytes_per_sec,
                "ceiling_bytes_per_sec": s.ceiling_bytes_per_sec,
                "bytes": s.bytes,
                "throttled_us": s.throttled_us,
            })).collect::<Vec<_>>(),
            "io_governor": self.io_governor_json(),
            "live_latency": live_latency_json(self.data.io.live()),
            "cold_reads": {
                "reads": c.reads,
                "bytes": c.bytes,
                "disk_bytes": c.disk_bytes,
                "budget_bytes_per_sec": c.budget_bytes_per_sec,
                "max_concurrent": c.max_concurrent,
                "queue_depth": c.queue_depth,
                "wait_us_total": c.wait_us_total,
                "throttled_us_total": c.throttled_us_total,
            },
            "scan": {
                "limit_bytes": scan.limit_bytes,
                "held_bytes": scan.held_bytes,
                "hits": scan.hits,
                "served_bytes": scan.served_bytes,
                "shared_bytes": scan.shared_bytes,
                "kept": scan.kept,
                "refused": scan.refused,
                "paced_fetches": scan.paced,
            },
            "tiers": self.tiers_json(),
            "share_groups": self.share_json(),
            "cleaner": self.data.cleaner.to_json(),
            "log_dirs": [{
                "path": self.data.dir_health.path().display().to_string(),
                "offline": self.data.dir_health.is_offline(),
                "error": self.data.dir_health.offline_reason(),
            }],
            "page_cache": {
                "segment_bytes": size_total,
                "resident_bytes": resident_total,
                "read_io": format!("{:?}", self.data.read_io),
            },
            "partitions": partitions,
        })
    }

    fn tiers_json(&self) -> serde_json::Value {
        use std::sync::atomic::Ordering::Relaxed;
        let s = self.data.tiers.stats();
        let m = &self.data.mover;
        let describe = |tier| self.data.tiers.has(tier).then(|| self.data.tiers.describe(tier));
        serde_json::json!({
            "capacity": describe(keel_log::Tier::Capacity),
            "remote": describe(keel_log::Tier::Remote),
            "move_bytes_per_sec": self.data.io.ceiling(IoClass::TierMove),
            "fast_max_bytes": m.fast_max_bytes(),
            "fast_bytes": m.fast_bytes.load(Relaxed),
            "fast_copied_bytes": m.fast_copied_bytes.load(Relaxed),
            "fast_over_budget": m.over_budget.load(Relaxed),
            "released_segments": m.released_segments.load(Relaxed),
            "released_bytes": m.released_bytes.load(Relaxed),
            "passes": m.passes.load(Relaxed),
            "failed_passes": m.failed_passes.load(Relaxed),
            "orphans_deleted": m.orphans_deleted.load(Relaxed),
            "partitions_set_aside": m.partitions_set_aside.load(Relaxed),
            "fast_fs_free_bytes": m.fast_fs_free_bytes.load(Relaxed),
            "fast_fs_total_bytes": m.fast_fs_total_bytes.load(Relaxed),
            "backoff_ms": m.backoff_ms(),
            "reader_holds": m.reader_holds.load(Relaxed),
            "reader_held_bytes": m.reader_held_bytes.load(Relaxed),
            "reader_hold_overrides": m.reader_hold_overrides.load(Relaxed),
            "held_read_bytes": keel_data::mover::held_read_bytes(&self.data),
            "copies": s.copies,
            "copied_bytes": s.copied_bytes,
            "copy_failures": s.copy_failures,
            "reads": s.reads,
            "read_bytes": s.read_bytes,
            "read_failures": s.read_failures,
            "deletes": s.deletes,
            "delete_failures": s.delete_failures,
            "index_cache_bytes": s.index_cache_bytes,
            "last_error": s.last_error,
        })
    }

    /// Flushes every log and marks it cleanly closed. Blocking.
    pub fn shutdown(&self) {
        for task in self.tasks.lock().drain(..) {
            task.abort();
        }
        self.data.cleaner.stop();
        let t = self.data.tail_cache.stats();
        tracing::info!(
            budget_bytes = t.budget_bytes,
            used_bytes = t.used_bytes,
            hit_bytes = t.hit_bytes,
            cold_read_bytes = self.data.cold.stats().bytes,
            evicted_bytes = t.evicted_bytes,
            "tail cache at shutdown"
        );
        self.groups.close();
        self.txns.close();
        self.share.close();
        self.quotas.close();
        self.scram.close();
        self.acls.close();
        for topic in self.data.topics.all() {
            for p in &topic.partitions {
                if let Err(e) = p.close() {
                    tracing::error!(topic = %topic.meta.name, partition = p.index, error = %e, "close failed");
                }
            }
        }
    }
}

/// `keel.io.direct`: `on` requires O_DIRECT in the data directory, `off`
/// reads through the page cache and drops what it read, `auto` uses O_DIRECT
/// where the filesystem takes it and says so either way.
/// One partition as `/stats` shows it: offsets, reads by source, page
/// cache residency (`resident`, `size`), damage, producers, cleaning,
/// readers (with the groups their clients are members of, from `groups`)
/// and tiers.
fn partition_json(
    topic: &str,
    p: &keel_data::partition::Partition,
    compacted: bool,
    (resident, size): (u64, u64),
    groups: &std::collections::HashMap<(String, String), Vec<String>>,
) -> serde_json::Value {
    use std::sync::atomic::Ordering::Relaxed;
    let reader = p.reader();
    let scan = p.scan_summary();
    let (local_segments, local_bytes, tiered, damaged) = match &reader {
        Some(r) => (
            r.segment_count(),
            r.size_bytes(),
            r.tiered_segments(),
            r.damaged_segments(),
        ),
        None => (0, 0, Vec::new(), Vec::new()),
    };
    let damaged: Vec<_> = damaged
            .into_iter()
            .map(|(base, valid, reason)| {
                serde_json::json!({"base_offset": base, "valid_bytes": valid, "reason": reason})
            })
            .collect();
    let count = |state| tiered.iter().filter(|t| t.state == state).count();
    let cold_bytes: u64 = tiered.iter().filter(|t| t.is_cold()).map(|t| t.size_bytes).sum();
    // Bytes with a whole copy in each colder tier (local or not).
    let in_tier = |tier| -> u64 {
        tiered
            .iter()
            .filter(|t| {
                t.tier == tier && matches!(t.state, keel_log::TierState::Both | keel_log::TierState::Cold)
            })
            .map(|t| t.size_bytes)
            .sum()
    };
    serde_json::json!({
        "topic": topic,
        "partition": p.index,
        "log_start_offset": p.log_start_offset(),
        "high_watermark": p.high_watermark(),
        "cache_read_bytes": p.cache_read_bytes.load(Relaxed),
        "cold_read_bytes": p.cold_read_bytes.load(Relaxed),
        "scan": {
            "held_bytes": scan.held_bytes,
            "chunks": scan.chunks,
            "reads_in_flight": scan.reads_in_flight,
            "readers": scan.readers,
            "paced_readers": scan.paced,
            "paced_fetches": scan.deferred,
        },
        "segment_bytes": size,
        "page_cache_resident_bytes": resident,
        "offline": p.unavailable(),
        "damaged_segments": damaged,
        "producers": p.producer_count(),
        "cleaner": compacted.then(|| p.cleaning.lock().to_json()),
        "readers": p.readers.positions().iter().map(|r| (r, p.scan_pacing(&r.reader))).map(|(r, pacing)| serde_json::json!({
            "client_id": &*r.reader.client_id,
            "address": &*r.reader.address,
            "port": r.reader.port,
            "groups": groups
                .get(&(r.reader.client_id.to_string(), r.reader.address.to_string()))
                .cloned()
                .unwrap_or_default(),
            "offset": r.offset,
            "at_ms": r.at_ms,
            // Below the tail cache: paced behind a lead now, and for how
            // long in its scan so far.
            "paced": pacing.map(|(_, paced)| paced),
            "slowed_ms": pacing.map(|(slowed, _)| slowed),
        })).collect::<Vec<_>>(),
        "tiers": {
            "local_segments": local_segments,
            "local_bytes": local_bytes,
            "copying": count(keel_log::TierState::Copying),
            "both": count(keel_log::TierState::Both),
            "cold": count(keel_log::TierState::Cold),
            "deleting": count(keel_log::TierState::Deleting),
            "cold_bytes": cold_bytes,
            "capacity_bytes": in_tier(keel_log::Tier::Capacity),
            "object_store_bytes": in_tier(keel_log::Tier::Remote),
            // Why the oldest local segment is still here past the local
            // retention or the fast tier's budget: a reader about to read it.
            "held_for_reader": p.tier_hold().map(|h| serde_json::json!({
                "base_offset": h.base_offset,
                "next_offset": h.next_offset,
                "bytes": h.size_bytes,
                "reader": h.holder.who,
                "reader_offset": h.holder.offset,
            })),
            "held_read_bytes": p.held_read_bytes.load(Relaxed),
        },
    })
}

/// Maps an I/O error on `path` to the start-up error.
fn io_error(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> StartError {
    let path = path.to_path_buf();
    move |error| StartError::Io { path, error }
}

/// Creates the metadata dir (made durable in its parent) and chooses the
/// storage every file operation goes through: the disk, or the disk under
/// fault injection when `KEEL_FAILPOINTS=1` (tests only).
fn open_storage(meta_dir: &std::path::Path) -> Result<(Arc<dyn Storage>, Option<FaultyStorage>), StartError> {
    std::fs::create_dir_all(meta_dir)
        .and_then(|()| keel_log::storage::sync_parent(DiskStorage::shared().as_ref(), meta_dir))
        .map_err(io_error(meta_dir))?;
    let failpoints = (std::env::var("KEEL_FAILPOINTS").as_deref() == Ok("1")).then(|| {
        tracing::warn!("KEEL_FAILPOINTS=1: storage faults can be injected through the admin endpoint");
        FaultyStorage::new(DiskStorage::shared())
    });
    let storage: Arc<dyn Storage> = match &failpoints {
        Some(f) => Arc::new(f.clone()),
        None => DiskStorage::shared(),
    };
    Ok((storage, failpoints))
}

/// A cluster's group and transaction logs (see `coord_log`).
type ClusterSinks = (
    Box<dyn keel_coord::metalog::Sink<keel_coord::groups::store::GroupTable>>,
    Box<dyn keel_coord::metalog::Sink<keel_coord::txn::TxnTable>>,
    keel_coord::txn::Owns,
);

/// The coordinators and the stores on their own logs under `__keel_meta`.
struct Coordinators {
    groups: GroupCoordinator,
    txns: keel_coord::txn::TxnCoordinator,
    share: keel_coord::share::ShareCoordinator,
    quotas: crate::quotas::ClientQuotas,
    scram: keel_auth::sasl::credentials::ScramCredentials,
    acls: keel_auth::acl::store::AclStore,
}

impl Coordinators {
    /// The coordinators and stores under `meta_dir`; with `shared` (a
    /// cluster's coordination store and key prefix), the stores every
    /// broker shares are there instead, not yet read (see
    /// [`Broker::start_cluster`]), and the group and transaction logs go
    /// to `sinks` (the cluster's `__consumer_offsets` and
    /// `__transaction_state`).
    fn open(
        config: &BrokerConfig,
        storage: &Arc<dyn Storage>,
        meta_dir: &std::path::Path,
        clock: &Arc<dyn Clock>,
        shared: Option<(&Arc<dyn keel_cluster::CoordStore>, &str)>,
        sinks: Option<ClusterSinks>,
    ) -> Result<Coordinators, StartError> {
        let (groups_sink, txns_sink) = match sinks {
            Some((g, t, holds)) => (Some(g), Some((t, holds))),
            None => (None, None),
        };
        let groups = match groups_sink {
            Some(sink) => GroupCoordinator::open_sink(sink, config.coordinator_config(), Arc::clone(clock)),
            None => GroupCoordinator::open_with(
                Arc::clone(storage),
                &meta_dir.join("groups"),
                config.coordinator_config(),
                Arc::clone(clock),
            ),
        }
        .map_err(StartError::Groups)?;
        let txns = match txns_sink {
            Some((sink, holds)) => keel_coord::txn::TxnCoordinator::open_sink(
                sink,
                holds,
                config.txn_config(),
                Arc::clone(clock),
            ),
            None => keel_coord::txn::TxnCoordinator::open_with(
                Arc::clone(storage),
                &meta_dir.join("transactions"),
                config.txn_config(),
                Arc::clone(clock),
            ),
        }
        .map_err(StartError::Transactions)?;
        let share = keel_coord::share::ShareCoordinator::open_with(
            Arc::clone(storage),
            &meta_dir.join("share"),
            u64::try_from(config.num("offsets.topic.segment.bytes")).unwrap_or(100 << 20),
        )
        .map_err(StartError::Share)?;
        let table = |name: &str| (Arc::clone(storage), meta_dir.join(name));
        let (s, dir) = table("quotas");
        let quotas = crate::quotas::ClientQuotas::new(
            TableStore::open(s, &dir, shared).map_err(StartError::Quotas)?,
            crate::quotas::rate::Windows::of(config),
        );
        let (s, dir) = table("scram");
        let scram = keel_auth::sasl::credentials::ScramCredentials::new(
            TableStore::open(s, &dir, shared).map_err(StartError::Scram)?,
        );
        let (s, dir) = table("acls");
        let acls = keel_auth::acl::store::AclStore::new(
            TableStore::open(s, &dir, shared).map_err(StartError::Acls)?,
        );
        Ok(Coordinators {
            groups,
            txns,
            share,
            quotas,
            scram,
            acls,
        })
    }
}

/// The data plane on `storage`, under the configuration in force: the
/// tail cache and cold reads sized to `memory`, the I/O classes' budgets,
/// the colder tiers, the mover and the cleaner; this node leads every
/// partition.
/// What the data plane is built on besides the configs.
struct PlaneParts {
    storage: Arc<dyn Storage>,
    cluster_id: Arc<str>,
    clock: Arc<dyn Clock>,
    leadership: Arc<dyn Leadership>,
    /// In a cluster, the membership its WAL commits through.
    wal_membership: Option<Arc<keel_cluster::Membership>>,
}

fn open_data_plane(
    live: &Arc<LiveConfig>,
    memory: &MemoryLimit,
    parts: PlaneParts,
) -> Result<DataPlane, StartError> {
    let PlaneParts {
        storage,
        cluster_id,
        clock,
        leadership,
        wal_membership,
    } = parts;
    let config = live.get();
    let data_dir = config.data_dir();
    let num = |key: &str| u64::try_from(config.num(key)).unwrap_or(0);
    let cleaner_settings = config.cleaner_settings();
    let io = Arc::new(IoScheduler::new(Budgets {
        cold_read: num("keel.cold.read.bytes.per.sec"),
        tier_move: num("keel.tier.move.bytes.per.sec"),
        cleaning: cleaner_settings.io_bytes_per_sec,
    }));
    io.set_live_target(config.live_latency_target());
    let cold = ColdReads::new(
        Arc::clone(&io),
        usize::try_from(config.num("keel.cold.read.max.concurrent")).unwrap_or(4),
    )
    .with_scan_pool(scan_pool(&config, memory));
    let read_io = choose_read_io(&config, &data_dir).map_err(io_error(&data_dir))?;
    let tiers = Tiers::new(
        Arc::clone(&storage),
        &config.capacity_dirs(),
        config.remote_settings().as_ref(),
    )
    .map_err(io_error(std::path::Path::new(config.get("keel.tier.remote"))))?;
    let tiers = Arc::new(tiers);
    for tier in [keel_log::Tier::Capacity, keel_log::Tier::Remote] {
        if tiers.has(tier) {
            tracing::info!(tier = tier.name(), at = %tiers.describe(tier), "colder tier");
        }
    }
    let mover = Mover::new(
        Duration::from_millis(
            u64::try_from(config.num("keel.tier.check.interval.ms"))
                .unwrap_or(1000)
                .max(10),
        ),
        config.num("keel.tier.fast.max.bytes"),
        Duration::from_millis(u64::try_from(config.num("keel.tier.orphan.grace.ms")).unwrap_or(600_000)),
    );
    mover.set_reader_window_bytes(num("keel.tier.reader.window.bytes"));
    Ok(DataPlane {
        topics: TopicRegistry::default(),
        store: TopicStore::new(&data_dir, Arc::clone(&storage)),
        storage,
        dir_health: DirHealth::new(&data_dir),
        tail_cache: TailCache::new(tail_cache_budget(&config, memory)),
        read_io,
        cold: Arc::new(cold),
        io,
        wal: wal_membership.map(|m| {
            Arc::new(keel_data::wal::Wal::new(
                m,
                Arc::clone(&tiers),
                &cluster_id,
                config.wal_settings(),
            ))
        }),
        tiers,
        clock,
        data_dir,
        cluster_id,
        policies: Arc::clone(live) as Arc<dyn keel_data::policy::Policies>,
        mover,
        cleaner: Cleaner::new(cleaner_settings),
        leadership,
    })
}

fn choose_read_io(config: &BrokerConfig, data_dir: &std::path::Path) -> std::io::Result<ReadIo> {
    let setting = config.get("keel.io.direct");
    if setting == "off" {
        tracing::info!("segment reads: pread + fadvise(DONTNEED) (keel.io.direct=off)");
        return Ok(ReadIo::BufferedDontNeed);
    }
    std::fs::create_dir_all(data_dir)?;
    match keel_log::probe_direct_io(data_dir) {
        Ok(()) => {
            tracing::info!(dir = %data_dir.display(), "segment reads: O_DIRECT");
            Ok(ReadIo::Direct)
        }
        Err(e) if setting == "on" => Err(std::io::Error::new(
            e.kind(),
            format!("keel.io.direct=on but O_DIRECT does not work here: {e}"),
        )),
        Err(e) => {
            tracing::warn!(
                dir = %data_dir.display(),
                error = %e,
                "O_DIRECT is not supported here; segment reads use pread + fadvise(DONTNEED)"
            );
            Ok(ReadIo::BufferedDontNeed)
        }
    }
}

/// `keel.tail.cache.bytes`, or by default a share of the memory the broker
/// may use (host memory or its cgroup's limit, whichever is tighter).
/// The scan buffer (`keel.scan.buffer.bytes`, -1: a share of the memory
/// limit) and the shared scans' policy (`keel.scan.*`).
fn scan_pool(config: &BrokerConfig, limit: &MemoryLimit) -> keel_tier::ScanPool {
    let bytes =
        u64::try_from(config.num("keel.scan.buffer.bytes")).unwrap_or_else(|_| limit.scan_buffer_bytes());
    keel_tier::ScanPool::new(bytes).with_policy(keel_tier::ScanPolicy {
        window_bytes: u64::try_from(config.num("keel.scan.window.bytes")).unwrap_or(0),
        ahead_share: config.num("keel.scan.convoy.ahead.percent") as f64 / 100.0,
        max_slowed_ms: config.num("keel.scan.convoy.max.slowed.ms"),
    })
}

fn tail_cache_budget(config: &BrokerConfig, limit: &MemoryLimit) -> u64 {
    let configured = config.num("keel.tail.cache.bytes");
    if configured >= 0 {
        tracing::info!(
            budget_bytes = configured,
            "tail cache budget from keel.tail.cache.bytes"
        );
        return configured as u64;
    }
    let budget = limit.default_tail_cache_bytes();
    tracing::info!(
        budget_bytes = budget,
        memory_limit_bytes = limit.limit_bytes,
        source = %limit.source,
        scan_buffer_bytes = limit.scan_buffer_bytes(),
        "tail cache budget: {}% of the memory limit",
        keel_tier::memory::TAIL_CACHE_SHARE_PERCENT
    );
    budget
}

/// The tail cache's budget under `config` (see `tail_cache_budget`).
pub(crate) fn tail_cache_bytes(config: &BrokerConfig, limit: &MemoryLimit) -> u64 {
    u64::try_from(config.num("keel.tail.cache.bytes")).unwrap_or_else(|_| limit.default_tail_cache_bytes())
}

/// The live path's latency: per operation, quantiles over the last 10 s
/// and the buckets since start-up (`[upper µs, count]`, eight to a
/// doubling) from which two readings give a phase's quantiles.
fn live_latency_json(live: &keel_tier::LiveLatency) -> serde_json::Value {
    let ops: serde_json::Map<String, serde_json::Value> = keel_tier::LiveOp::ALL
        .iter()
        .map(|&op| {
            let q = live.window(op, LIVE_WINDOW);
            let json = serde_json::json!({
                "last_10s": {
                    "count": q.count,
                    "p50_us": q.p50_us,
                    "p99_us": q.p99_us,
                    "p999_us": q.p999_us,
                    "max_us": q.max_us,
                },
                "buckets": live.cumulative(op),
            });
            (op.name().to_string(), json)
        })
        .collect();
    ops.into()
}

/// The window of the live latency quantiles `/stats` and `/metrics` show.
pub const LIVE_WINDOW: Duration = Duration::from_secs(10);

/// The group coordinator's committed offsets, for reader-aware tiering
/// (`keel_data::tiering`). In a cluster, the groups this broker
/// coordinates; fetch positions cover the readers of the others. Weak: the
/// coordinator's log holds the data plane, which holds the mover.
struct GroupCommits(std::sync::Weak<GroupCoordinator>);

impl std::fmt::Debug for GroupCommits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GroupCommits")
    }
}

impl keel_data::tiering::CommittedOffsets for GroupCommits {
    fn committed_since(&self, since_ms: i64) -> Vec<keel_data::tiering::Commit> {
        let Some(groups) = self.0.upgrade() else {
            return Vec::new();
        };
        groups
            .committed_since(since_ms)
            .into_iter()
            .map(|(group, topic, partition, offset)| keel_data::tiering::Commit {
                group,
                topic,
                partition,
                offset,
            })
            .collect()
    }
}
