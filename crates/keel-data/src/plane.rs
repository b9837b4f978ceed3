//! The data plane as one value: the partition registry and what every
//! partition is built on (storage, the data dir's health, the tail cache,
//! cold reads, the colder tiers). The broker holds one and reaches
//! partitions through it.

use std::path::PathBuf;
use std::sync::Arc;

use keel_log::clock::Clock;
use keel_log::{LogConfig, ReadIo, Storage};
use keel_tier::{ColdReads, TailCache, Tiers};

use crate::health::DirHealth;
use crate::partition::PartitionParts;
use crate::topics::{TopicRegistry, TopicStore};

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
    /// Reads below the tail cache: bounded, budgeted, read ahead.
    pub cold: Arc<ColdReads>,
    /// The capacity dirs and the object store, where sealed segments go.
    pub tiers: Arc<Tiers>,
    /// The time partitions stamp their appends with.
    pub clock: Arc<dyn Clock>,
}

impl DataPlane {
    /// What partition `index` of `topic` is opened with, in its directory
    /// `dir`, under `config`.
    pub fn partition_parts(
        &self,
        topic: &Arc<str>,
        index: i32,
        dir: PathBuf,
        config: LogConfig,
    ) -> PartitionParts {
        PartitionParts {
            topic: Arc::clone(topic),
            index,
            dir,
            config,
            storage: Arc::clone(&self.storage),
            health: Arc::clone(&self.dir_health),
            tail: self.tail_cache.partition(),
            cold: Arc::clone(&self.cold),
            tiers: Arc::clone(&self.tiers),
            clock: Arc::clone(&self.clock),
        }
    }
}
