//! The data plane as one value: the partition registry, what every
//! partition is built on (storage, the data dir's health, the tail cache,
//! cold reads, the colder tiers) and the background work on them (the
//! mover, the cleaner, see [`crate::maintenance`]). The broker holds one
//! and reaches partitions through it.

use std::path::PathBuf;
use std::sync::Arc;

use keel_log::clock::Clock;
use keel_log::{LogConfig, ReadIo, Storage};
use keel_tier::{ColdReads, IoScheduler, TailCache, Tiers};

use crate::cleaner::Cleaner;
use crate::health::DirHealth;
use crate::leadership::{check_epoch, Leader, Leadership, Unserved};
use crate::mover::Mover;
use crate::partition::{OpenFailure, Partition, PartitionParts};
use crate::policy::{Policies, Refused};
use crate::topics::{Topic, TopicMeta, TopicRegistry, TopicStore};

pub struct DataPlane {
    /// Every topic and its partitions.
    pub topics: TopicRegistry,
    /// Topic descriptions and partition directories on disk.
    pub store: TopicStore,
    /// Every file operation of partition logs and topic metadata.
    pub storage: Arc<dyn Storage>,
    /// The health of the data dir (`log.dirs`).
    pub dir_health: Arc<DirHealth>,
    /// The newest batches of every partition, under one byte budget.
    pub tail_cache: Arc<TailCache>,
    /// How segment data is read back (`keel.io.direct`, probed at start-up).
    pub read_io: ReadIo,
    /// Every class of I/O's byte budget (live, cold reads, tier moves,
    /// cleaning).
    pub io: Arc<IoScheduler>,
    /// Reads below the tail cache: bounded, budgeted, and the scan buffer
    /// the shared scans hold their data in.
    pub cold: Arc<ColdReads>,
    /// The capacity dirs and the object store, where sealed segments go.
    pub tiers: Arc<Tiers>,
    /// The time partitions stamp their appends with.
    pub clock: Arc<dyn Clock>,
    /// The data dir (`log.dirs`), the fast tier.
    pub data_dir: PathBuf,
    /// The cluster's id: the prefix of every copy in the colder tiers.
    pub cluster_id: Arc<str>,
    /// Each topic's settings in force.
    pub policies: Arc<dyn Policies>,
    /// Takes sealed segments to the colder tiers.
    pub mover: Mover,
    /// Compacts the partitions of compacted topics.
    pub cleaner: Cleaner,
    /// Which broker leads each partition, in which epoch.
    pub leadership: Arc<dyn Leadership>,
    /// In a cluster, where partitions make their writes durable.
    pub wal: Option<Arc<crate::wal::Wal>>,
}

/// Why partitions could not be opened.
#[derive(Debug)]
pub enum PartitionsError {
    /// The topic's configs make no log settings.
    Config(Refused),
    /// A directory could not be read or prepared.
    Io { path: PathBuf, error: std::io::Error },
    /// A partition's log did not open.
    Open(OpenFailure),
}

impl std::fmt::Display for PartitionsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PartitionsError::Config(e) => e.fmt(f),
            PartitionsError::Io { path, error } => write!(f, "{}: {error}", path.display()),
            PartitionsError::Open(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for PartitionsError {}

impl DataPlane {
    /// Partition `index` of `topic`, if this broker leads it, with its
    /// leader; `current_epoch` is the leader epoch the request carries
    /// (-1: none), checked as Kafka checks it (KIP-320). Every request that
    /// reads, writes or lists a partition's offsets reaches it here.
    pub fn lead(
        &self,
        topic: &Topic,
        index: i32,
        current_epoch: i32,
    ) -> Result<(Arc<Partition>, Leader), Unserved> {
        let partition = topic.partition(index).ok_or(Unserved::Unknown(
            keel_protocol::ResponseError::UnknownTopicOrPartition,
        ))?;
        let leader = self.leader(topic, index);
        match leader {
            Some(l) if l.node_id == self.leadership.node_id() => {
                check_epoch(current_epoch, l)?;
                // In a cluster, a leader serves once it has claimed the
                // partition in its epoch (until then, clients retry).
                if !partition.serves_in(l.epoch) {
                    return Err(Unserved::NotLeader(Some(l)));
                }
                Ok((Arc::clone(partition), l))
            }
            other => Err(Unserved::NotLeader(other)),
        }
    }

    /// [`DataPlane::lead`] by topic name, for requests without an epoch.
    pub fn lead_by_name(&self, topic: &str, index: i32) -> Result<Arc<Partition>, Unserved> {
        let topic = self.topics.get(topic).ok_or(Unserved::Unknown(
            keel_protocol::ResponseError::UnknownTopicOrPartition,
        ))?;
        self.lead(&topic, index, -1).map(|(p, _)| p)
    }

    /// Who leads partition `index` of `topic` now.
    pub fn leader(&self, topic: &Topic, index: i32) -> Option<Leader> {
        self.leadership.leader(topic.meta.topic_id, index)
    }

    /// The brokers holding partition `index` of `topic`.
    pub fn replicas(&self, topic: &Topic, index: i32) -> Vec<i32> {
        self.leadership.replicas(topic.meta.topic_id, index)
    }

    /// What partition `index` of `topic` is opened with, in its directory
    /// `dir`, under `config`.
    pub fn partition_parts(
        &self,
        (topic, topic_id): (&Arc<str>, uuid::Uuid),
        index: i32,
        dir: PathBuf,
        config: LogConfig,
    ) -> PartitionParts {
        PartitionParts {
            topic: Arc::clone(topic),
            topic_id,
            index,
            dir,
            config,
            storage: Arc::clone(&self.storage),
            health: Arc::clone(&self.dir_health),
            tail: self.tail_cache.partition(),
            cold: Arc::clone(&self.cold),
            io: Arc::clone(&self.io),
            tiers: Arc::clone(&self.tiers),
            clock: Arc::clone(&self.clock),
            wal: self.wal.clone(),
        }
    }

    /// Opens every topic in the data dir and registers it, removing what
    /// deletions left behind. Blocking. A partition whose log cannot be
    /// opened is kept offline and the others serve.
    pub fn load_topics(&self) -> Result<(), PartitionsError> {
        let io = |error| PartitionsError::Io {
            path: self.data_dir.clone(),
            error,
        };
        let metas = self.store.load_all().map_err(io)?;
        let (metas, sweep) = self.store.sweep(metas).map_err(io)?;
        self.remove_in_background(sweep.deleted);
        for meta in metas {
            let partitions = self.open_partitions(&meta, 0, true)?;
            tracing::info!(topic = %meta.name, partitions = meta.partitions, "loaded topic");
            self.topics.insert(Arc::new(Topic { meta, partitions }));
        }
        Ok(())
    }

    /// Opens partitions `from..meta.partitions` of a topic. Blocking. At
    /// start-up (`tolerate_failures`) a partition whose log cannot be opened
    /// is kept offline and the others serve; when creating partitions, a
    /// failure is the caller's error.
    pub fn open_partitions(
        &self,
        meta: &TopicMeta,
        from: i32,
        tolerate_failures: bool,
    ) -> Result<Vec<Arc<Partition>>, PartitionsError> {
        let mut log_config = self
            .policies
            .log_config(&meta.configs)
            .map_err(PartitionsError::Config)?;
        log_config.read_io = self.read_io;
        let name: Arc<str> = Arc::from(meta.name.as_str());
        let parts = |p: i32| {
            let dir = self.store.partition_dir(&meta.name, p);
            self.partition_parts((&name, meta.topic_id), p, dir, log_config.clone())
        };
        let mut out = Vec::new();
        for p in from..meta.partitions {
            let dir = self.store.partition_dir(&meta.name, p);
            let io = |error| PartitionsError::Io {
                path: dir.clone(),
                error,
            };
            if !tolerate_failures {
                // Creating: the directory must be this topic's own.
                self.store
                    .clear_for_new_partition(&dir, meta.topic_id)
                    .map_err(io)?;
            }
            let opened = Partition::open(parts(p))
                .map_err(PartitionsError::Open)
                .and_then(|partition| {
                    self.store
                        .ensure_partition_metadata(&dir, meta.topic_id)
                        .map_err(io)?;
                    Ok(partition)
                });
            let partition = match opened {
                Ok(partition) => partition,
                Err(e) if tolerate_failures => {
                    tracing::error!(
                        topic = %meta.name, partition = p, error = %e,
                        "partition offline: its log cannot be opened; the other partitions serve"
                    );
                    Partition::offline(parts(p), e.to_string())
                }
                Err(e) => return Err(e),
            };
            out.push(Arc::new(partition));
        }
        Ok(out)
    }
}
