//! A topic's life on the data plane: creation, growth and deletion, each
//! durable before it is registered or unregistered. Blocking (file I/O and
//! fsyncs): the broker runs them on blocking threads, one admin change at
//! a time. The Kafka checks (names, counts, configs, ACLs, quotas) are the
//! broker's, before it calls these.

use std::sync::Arc;

use keel_log::TieredSegment;

use crate::plane::{DataPlane, PartitionsError};
use crate::topics::{Topic, TopicMeta};

impl DataPlane {
    /// Creates and registers the topic `meta` describes: its partitions'
    /// directories first, its description last (the commit point; a crash
    /// before it leaves directories that start-up removes).
    pub fn create_topic(&self, meta: TopicMeta) -> Result<Arc<Topic>, PartitionsError> {
        let partitions = self.open_partitions(&meta, 0, false)?;
        self.save_meta(&meta)?;
        let topic = Arc::new(Topic { meta, partitions });
        self.topics.insert(Arc::clone(&topic));
        Ok(topic)
    }

    /// Grows `topic` to `count` partitions, the same way: the new
    /// partitions' directories, then the description.
    pub fn grow_topic(&self, topic: &Topic, count: i32) -> Result<Arc<Topic>, PartitionsError> {
        let mut meta = topic.meta.clone();
        meta.partitions = count;
        let added = self.open_partitions(&meta, topic.meta.partitions, false)?;
        self.save_meta(&meta)?;
        let mut partitions = topic.partitions.clone();
        partitions.extend(added);
        let grown = Arc::new(Topic { meta, partitions });
        self.topics.insert(Arc::clone(&grown));
        Ok(grown)
    }

    /// Deletes `topic` so that nothing of it can touch a topic created
    /// after it under the same name: its description is marked `deleting`
    /// (the commit point), it leaves the registry, its partitions are
    /// fenced (a write in progress finishes first) and their directories
    /// renamed to `<topic>-<p>.<id>-delete` durably, then the description
    /// goes. The directories are removed in the background. Returns the
    /// copies in colder tiers, which the caller deletes.
    pub fn delete_topic(&self, topic: &Topic) -> std::io::Result<Vec<TieredSegment>> {
        self.store.mark_deleting(&topic.meta)?;
        self.topics.remove(&topic.meta.name);
        let unique = topic.meta.topic_id.simple().to_string();
        let (mut tiered, mut retired) = (Vec::new(), Vec::new());
        for p in &topic.partitions {
            match p.fence() {
                Some(log) => {
                    let (dir, copies) = log.retire(&unique)?;
                    retired.push(dir);
                    tiered.extend(copies);
                }
                // An offline partition has no open log: rename its directory.
                None => retired.extend(self.store.retire_partition_dir(&topic.meta, p.index)?),
            }
        }
        self.store.remove_meta(&topic.meta.name)?;
        self.remove_in_background(retired);
        Ok(tiered)
    }

    /// Takes `topic` out of service without deleting anything of it: it
    /// leaves the registry, its partitions are fenced and their
    /// directories renamed to `<topic>-<p>.<id>-stray` durably (kept for
    /// the operator, as Kafka keeps stray logs), then its description
    /// goes. For a topic this broker holds that its cluster does not know.
    pub fn set_aside_topic(&self, topic: &Topic) -> std::io::Result<Vec<std::path::PathBuf>> {
        self.topics.remove(&topic.meta.name);
        let unique = topic.meta.topic_id.simple().to_string();
        let mut kept = Vec::new();
        for p in &topic.partitions {
            match p.fence() {
                Some(log) => kept.push(log.set_aside(&unique)?),
                None => kept.extend(self.store.set_aside_partition_dir(&topic.meta, p.index)?),
            }
        }
        self.store.remove_meta(&topic.meta.name)?;
        Ok(kept)
    }

    /// Gives `topic` the config overrides `configs`: its description is
    /// saved, then the registry holds the topic with them (the same
    /// partitions; their open logs take the new settings from the caller).
    pub fn set_topic_configs(
        &self,
        topic: &Topic,
        configs: std::collections::BTreeMap<String, String>,
    ) -> Result<Arc<Topic>, PartitionsError> {
        let meta = TopicMeta {
            configs,
            ..topic.meta.clone()
        };
        self.save_meta(&meta)?;
        let altered = Arc::new(Topic {
            meta,
            partitions: topic.partitions.clone(),
        });
        self.topics.insert(Arc::clone(&altered));
        Ok(altered)
    }

    fn save_meta(&self, meta: &TopicMeta) -> Result<(), PartitionsError> {
        self.store.save(meta).map_err(|error| PartitionsError::Io {
            path: self.data_dir.clone(),
            error,
        })
    }
}
