//! Topics: names, ids, partition counts and config overrides, persisted as
//! one small JSON file per topic under `<data>/__keel_meta/topics/`.
//!
//! Partition data lives in Kafka's layout, `<data>/<topic>-<partition>/`.
//! The registry map is only ever locked for in-memory lookups and swaps;
//! creating or deleting files happens outside it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use keel_protocol::ResponseError;
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::partition::Partition;
use crate::producers::write_atomically;

/// Directory under the data dir holding Keel's own metadata.
pub const META_DIR: &str = "__keel_meta";

/// Kafka's limit on topic name length.
pub const MAX_TOPIC_NAME_LEN: usize = 249;

/// A topic's persisted description (format version 1, see docs/format.md).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TopicMeta {
    pub version: u32,
    pub name: String,
    pub topic_id: Uuid,
    pub partitions: i32,
    pub configs: BTreeMap<String, String>,
}

/// A topic with its open partitions. Immutable: changes build a new `Topic`
/// that shares the unchanged partitions and replace it in the registry.
pub struct Topic {
    pub meta: TopicMeta,
    pub partitions: Vec<Arc<Partition>>,
}

impl Topic {
    pub fn partition(&self, index: i32) -> Option<&Arc<Partition>> {
        usize::try_from(index).ok().and_then(|i| self.partitions.get(i))
    }
}

/// Kafka's topic-name rule: 1-249 chars of `[a-zA-Z0-9._-]`, not `.`/`..`.
pub fn validate_topic_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name == "." || name == ".." {
        return Err(format!("topic name `{name}` is illegal"));
    }
    if name.len() > MAX_TOPIC_NAME_LEN {
        return Err(format!(
            "topic name is longer than {MAX_TOPIC_NAME_LEN} characters"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!("topic name `{name}` contains illegal character `{c}`"));
    }
    Ok(())
}

/// The set of topics.
#[derive(Default)]
pub struct TopicRegistry {
    topics: RwLock<BTreeMap<String, Arc<Topic>>>,
}

impl TopicRegistry {
    pub fn get(&self, name: &str) -> Option<Arc<Topic>> {
        self.topics.read().get(name).cloned()
    }

    pub fn get_by_id(&self, id: Uuid) -> Option<Arc<Topic>> {
        self.topics
            .read()
            .values()
            .find(|t| t.meta.topic_id == id)
            .cloned()
    }

    /// The topic a request names: by id when it carries one (Fetch and
    /// Produce v13+), else by name, with Kafka's error for each miss.
    pub fn resolve(&self, name: &str, id: Uuid) -> Result<Arc<Topic>, ResponseError> {
        if id.is_nil() {
            self.get(name).ok_or(ResponseError::UnknownTopicOrPartition)
        } else {
            self.get_by_id(id).ok_or(ResponseError::UnknownTopicId)
        }
    }

    pub fn all(&self) -> Vec<Arc<Topic>> {
        self.topics.read().values().cloned().collect()
    }

    pub fn insert(&self, topic: Arc<Topic>) {
        self.topics.write().insert(topic.meta.name.clone(), topic);
    }

    pub fn remove(&self, name: &str) -> Option<Arc<Topic>> {
        self.topics.write().remove(name)
    }
}

/// Where a topic's files live.
#[derive(Debug, Clone)]
pub struct TopicStore {
    data_dir: PathBuf,
}

impl TopicStore {
    pub fn new(data_dir: &Path) -> TopicStore {
        TopicStore {
            data_dir: data_dir.to_path_buf(),
        }
    }

    fn meta_dir(&self) -> PathBuf {
        self.data_dir.join(META_DIR).join("topics")
    }

    fn meta_path(&self, name: &str) -> PathBuf {
        self.meta_dir().join(format!("{name}.json"))
    }

    pub fn partition_dir(&self, name: &str, partition: i32) -> PathBuf {
        self.data_dir.join(format!("{name}-{partition}"))
    }

    /// Persists a topic description atomically.
    pub fn save(&self, meta: &TopicMeta) -> std::io::Result<()> {
        std::fs::create_dir_all(self.meta_dir())?;
        let json = serde_json::to_vec_pretty(meta).map_err(std::io::Error::other)?;
        write_atomically(&self.meta_path(&meta.name), &json)
    }

    /// Every persisted topic description.
    pub fn load_all(&self) -> std::io::Result<Vec<TopicMeta>> {
        let dir = self.meta_dir();
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for entry in entries {
            let path = entry?.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let bytes = std::fs::read(&path)?;
            let meta: TopicMeta = serde_json::from_slice(&bytes).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: {e}", path.display()),
                )
            })?;
            out.push(meta);
        }
        Ok(out)
    }

    /// Deletes a topic: its description first (the commit point), then its
    /// partition directories. A crash in between leaves orphan directories,
    /// which start-up removes.
    pub fn delete(&self, meta: &TopicMeta) -> std::io::Result<()> {
        match std::fs::remove_file(self.meta_path(&meta.name)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        for p in 0..meta.partitions {
            remove_dir_if_present(&self.partition_dir(&meta.name, p))?;
        }
        Ok(())
    }

    /// Partition directories that belong to no known topic (left by a crash
    /// during topic deletion).
    pub fn orphan_partition_dirs(&self, known: &[TopicMeta]) -> std::io::Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.data_dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some((topic, part)) = name.rsplit_once('-') else {
                continue;
            };
            let Ok(part) = part.parse::<i32>() else { continue };
            if !entry.file_type()?.is_dir() || name == META_DIR {
                continue;
            }
            if !known.iter().any(|m| m.name == topic && part < m.partitions) {
                out.push(entry.path());
            }
        }
        Ok(out)
    }
}

fn remove_dir_if_present(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_follow_kafka_rules() {
        assert!(validate_topic_name("orders.v1_x-2").is_ok());
        assert!(validate_topic_name("").is_err());
        assert!(validate_topic_name("..").is_err());
        assert!(validate_topic_name("a/b").is_err());
        assert!(validate_topic_name(&"x".repeat(250)).is_err());
    }

    #[test]
    fn metadata_round_trips_and_orphans_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let store = TopicStore::new(dir.path());
        let meta = TopicMeta {
            version: 1,
            name: "t".into(),
            topic_id: Uuid::new_v4(),
            partitions: 2,
            configs: BTreeMap::from([("retention.ms".into(), "1000".into())]),
        };
        store.save(&meta).unwrap();
        assert_eq!(store.load_all().unwrap(), vec![meta.clone()]);
        for p in 0..3 {
            std::fs::create_dir_all(store.partition_dir("t", p)).unwrap();
        }
        let orphans = store.orphan_partition_dirs(std::slice::from_ref(&meta)).unwrap();
        assert_eq!(orphans, vec![store.partition_dir("t", 2)]);
        store.delete(&meta).unwrap();
        assert!(store.load_all().unwrap().is_empty());
        assert!(!store.partition_dir("t", 0).exists());
    }
}
