//! Topics: names, ids, partition counts and config overrides, persisted as
//! one small JSON file per topic under `<data>/__keel_meta/topics/`.
//!
//! Partition data lives in Kafka's layout, `<data>/<topic>-<partition>/`,
//! each directory holding Kafka's `partition.metadata` with its topic's id,
//! so a directory is only ever adopted by the topic incarnation it belongs
//! to. The registry map is only ever locked for in-memory lookups and
//! swaps; creating or deleting files happens outside it. Every file
//! operation goes through the storage seam.
//!
//! Deleting a topic: its description is marked `deleting` (the commit
//! point), its fenced partitions' directories are renamed to Kafka's
//! `<topic>-<p>.<id>-delete` (durably), then the description goes and the
//! directories are removed in the background. Start-up finishes a deletion
//! a crash interrupted, removes `-delete` directories, and renames
//! directories no topic owns to `<name>.<uuid>-stray` (never deletes them).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use keel_log::storage::{read_file, remove_if_exists, sync_parent, write_atomically, Storage};
use keel_protocol::ResponseError;
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::partition::Partition;

/// Directory under the data dir holding Keel's own metadata.
pub const META_DIR: &str = "__keel_meta";

/// Kafka's limit on topic name length.
pub const MAX_TOPIC_NAME_LEN: usize = 249;

/// Kafka's per-partition topic id file.
pub const PARTITION_METADATA_FILE: &str = "partition.metadata";

/// A topic's persisted description (format version 1, see docs/format.md).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TopicMeta {
    pub version: u32,
    pub name: String,
    pub topic_id: Uuid,
    pub partitions: i32,
    pub configs: BTreeMap<String, String>,
    /// Set when a deletion began: the topic is gone, its directories may
    /// still need renaming away.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleting: bool,
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

/// A topic name Kafka's rule refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InvalidTopicName {
    /// Empty, `.` or `..`.
    Illegal(String),
    TooLong,
    IllegalCharacter {
        name: String,
        character: char,
    },
}

impl std::fmt::Display for InvalidTopicName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InvalidTopicName::Illegal(name) => write!(f, "topic name `{name}` is illegal"),
            InvalidTopicName::TooLong => {
                write!(f, "topic name is longer than {MAX_TOPIC_NAME_LEN} characters")
            }
            InvalidTopicName::IllegalCharacter { name, character } => {
                write!(f, "topic name `{name}` contains illegal character `{character}`")
            }
        }
    }
}

impl std::error::Error for InvalidTopicName {}

/// Kafka's topic-name rule: 1-249 chars of `[a-zA-Z0-9._-]`, not `.`/`..`.
pub fn validate_topic_name(name: &str) -> Result<(), InvalidTopicName> {
    if name.is_empty() || name == "." || name == ".." {
        return Err(InvalidTopicName::Illegal(name.to_string()));
    }
    if name.len() > MAX_TOPIC_NAME_LEN {
        return Err(InvalidTopicName::TooLong);
    }
    if let Some(character) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(InvalidTopicName::IllegalCharacter {
            name: name.to_string(),
            character,
        });
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
    storage: Arc<dyn Storage>,
}

/// What start-up found in the data dir: directories of deletions to
/// remove, and directories no topic owns (renamed to `-stray`).
#[derive(Debug, Default)]
pub struct DirSweep {
    pub deleted: Vec<PathBuf>,
    pub strays: Vec<(PathBuf, PathBuf)>,
}

impl TopicStore {
    pub fn new(data_dir: &Path, storage: Arc<dyn Storage>) -> TopicStore {
        TopicStore {
            data_dir: data_dir.to_path_buf(),
            storage,
        }
    }

    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
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
    pub fn save(&self, meta: &TopicMeta) -> io::Result<()> {
        let dir = self.meta_dir();
        if self.storage.read_dir(&dir).is_err() {
            self.storage.create_dir_all(&dir)?;
            sync_parent(self.storage.as_ref(), &dir)?;
        }
        let json = serde_json::to_vec_pretty(meta).map_err(io::Error::other)?;
        write_atomically(self.storage.as_ref(), &self.meta_path(&meta.name), &json)
    }

    /// Every persisted topic description (those being deleted included).
    pub fn load_all(&self) -> io::Result<Vec<TopicMeta>> {
        let dir = self.meta_dir();
        let entries = match self.storage.read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for entry in entries {
            let path = dir.join(&entry.name);
            if entry.name.ends_with(".tmp") {
                remove_if_exists(self.storage.as_ref(), &path)?;
                continue;
            }
            if !entry.name.ends_with(".json") {
                continue;
            }
            let Some(bytes) = read_file(self.storage.as_ref(), &path)? else {
                continue;
            };
            let meta: TopicMeta = serde_json::from_slice(&bytes).map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display()))
            })?;
            out.push(meta);
        }
        Ok(out)
    }

    /// Writes Kafka's `partition.metadata` (the topic id) into a partition
    /// directory that lacks it.
    pub fn ensure_partition_metadata(&self, dir: &Path, topic_id: Uuid) -> io::Result<()> {
        let path = dir.join(PARTITION_METADATA_FILE);
        if self.storage.file_len(&path)?.is_some() {
            return Ok(());
        }
        let text = format!("version: 0\ntopic_id: {}\n", base64_url(topic_id.as_bytes()));
        write_atomically(self.storage.as_ref(), &path, text.as_bytes())
    }

    /// The topic id in a partition directory's `partition.metadata`, if it
    /// has a readable one.
    pub fn partition_topic_id(&self, dir: &Path) -> io::Result<Option<Uuid>> {
        let Some(bytes) = read_file(self.storage.as_ref(), &dir.join(PARTITION_METADATA_FILE))? else {
            return Ok(None);
        };
        let text = String::from_utf8_lossy(&bytes);
        Ok(text
            .lines()
            .find_map(|l| l.strip_prefix("topic_id:"))
            .and_then(|v| decode_base64_url(v.trim()))
            .and_then(|b| Uuid::from_slice(&b).ok()))
    }

    /// Before a new topic's partition directory is created: a directory
    /// already at its path that belongs to another topic incarnation (an
    /// interrupted deletion, a copied-in directory) is renamed to `-stray`,
    /// never adopted and never deleted.
    pub fn clear_for_new_partition(&self, dir: &Path, topic_id: Uuid) -> io::Result<()> {
        if self.storage.read_dir(dir).is_err() {
            return Ok(());
        }
        if self.partition_topic_id(dir)? == Some(topic_id) {
            return Ok(());
        }
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let stray = dir.with_file_name(format!("{name}.{}-stray", Uuid::new_v4().simple()));
        self.storage.rename(dir, &stray)?;
        sync_parent(self.storage.as_ref(), dir)?;
        tracing::warn!(
            dir = %dir.display(), renamed_to = %stray.display(),
            "a new topic's partition directory was taken by another topic's data: renamed, not deleted"
        );
        Ok(())
    }

    /// Marks a topic as being deleted: the commit point of a deletion.
    pub fn mark_deleting(&self, meta: &TopicMeta) -> io::Result<()> {
        let mut m = meta.clone();
        m.deleting = true;
        self.save(&m)
    }

    /// Renames one partition directory of a topic being deleted to
    /// `<topic>-<p>.<topic id>-delete`, durably. A directory already gone
    /// (renamed before a crash) is fine.
    pub fn retire_partition_dir(&self, meta: &TopicMeta, partition: i32) -> io::Result<Option<PathBuf>> {
        let dir = self.partition_dir(&meta.name, partition);
        if self.storage.read_dir(&dir).is_err() {
            return Ok(None);
        }
        if self
            .partition_topic_id(&dir)?
            .is_some_and(|id| id != meta.topic_id)
        {
            return Ok(None); // Another incarnation's: not this deletion's to move.
        }
        let retired = self.retired_name(&dir, meta.topic_id);
        self.storage.rename(&dir, &retired)?;
        sync_parent(self.storage.as_ref(), &dir)?;
        Ok(Some(retired))
    }

    /// Renames one partition directory of a topic set aside to
    /// `<topic>-<p>.<topic id>-stray`, durably, if it is the topic's.
    pub fn set_aside_partition_dir(&self, meta: &TopicMeta, partition: i32) -> io::Result<Option<PathBuf>> {
        let dir = self.partition_dir(&meta.name, partition);
        if self.storage.read_dir(&dir).is_err()
            || self
                .partition_topic_id(&dir)?
                .is_some_and(|id| id != meta.topic_id)
        {
            return Ok(None);
        }
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let kept = dir.with_file_name(format!("{name}.{}-stray", meta.topic_id.simple()));
        self.storage.rename(&dir, &kept)?;
        sync_parent(self.storage.as_ref(), &dir)?;
        Ok(Some(kept))
    }

    pub fn retired_name(&self, dir: &Path, topic_id: Uuid) -> PathBuf {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        dir.with_file_name(format!("{name}.{}-delete", topic_id.simple()))
    }

    /// Removes a topic's description (after its directories were renamed).
    pub fn remove_meta(&self, name: &str) -> io::Result<()> {
        remove_if_exists(self.storage.as_ref(), &self.meta_path(name))?;
        self.storage.sync_dir(&self.meta_dir())
    }

    /// Finishes deletions a crash interrupted, lists `-delete` directories
    /// to remove, and renames directories no live topic owns to `-stray`.
    /// Returns the live topics.
    pub fn sweep(&self, metas: Vec<TopicMeta>) -> io::Result<(Vec<TopicMeta>, DirSweep)> {
        let (deleting, live): (Vec<_>, Vec<_>) = metas.into_iter().partition(|m| m.deleting);
        let mut sweep = DirSweep::default();
        for meta in &deleting {
            tracing::info!(topic = %meta.name, "finishing the deletion of a topic");
            for p in 0..meta.partitions {
                let dir = self.partition_dir(&meta.name, p);
                let owned = self.partition_topic_id(&dir).unwrap_or(None);
                if owned.is_none_or(|id| id == meta.topic_id) {
                    sweep.deleted.extend(self.retire_partition_dir(meta, p)?);
                }
            }
            self.remove_meta(&meta.name)?;
        }
        for entry in self.storage.read_dir(&self.data_dir)? {
            let name = entry.name;
            if !entry.is_dir || name == META_DIR {
                continue;
            }
            let path = self.data_dir.join(&name);
            if name.ends_with("-delete") {
                if !sweep.deleted.contains(&path) {
                    sweep.deleted.push(path);
                }
                continue;
            }
            if name.ends_with("-stray") {
                continue;
            }
            let Some((topic, part)) = name.rsplit_once('-') else {
                continue;
            };
            let Ok(part) = part.parse::<i32>() else { continue };
            let owner = live
                .iter()
                .find(|m| m.name == topic && (0..m.partitions).contains(&part));
            let owned = match owner {
                Some(meta) => match self.partition_topic_id(&path)? {
                    Some(id) => id == meta.topic_id,
                    None => true, // From before topic ids were written: adopt.
                },
                None => false,
            };
            if !owned {
                let stray = path.with_file_name(format!("{name}.{}-stray", Uuid::new_v4().simple()));
                self.storage.rename(&path, &stray)?;
                sync_parent(self.storage.as_ref(), &path)?;
                tracing::warn!(
                    dir = %path.display(), renamed_to = %stray.display(),
                    "a partition directory no topic owns (a mistaken log.dirs? a deleted topic \
                     from another incarnation?): renamed, not deleted; remove it once checked"
                );
                sweep.strays.push((path, stray));
            }
        }
        Ok((live, sweep))
    }
}

/// URL-safe base64 without padding: Kafka's encoding of UUIDs and cluster ids.
pub fn base64_url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
        }
    }
    out
}

fn decode_base64_url(text: &str) -> Option<Vec<u8>> {
    let mut bits = 0u32;
    let mut n = 0;
    let mut out = Vec::new();
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' | b'+' => 62,
            b'_' | b'/' => 63,
            b'=' => break,
            _ => return None,
        };
        bits = (bits << 6) | u32::from(v);
        n += 6;
        if n >= 8 {
            n -= 8;
            out.push((bits >> n) as u8);
        }
    }
    Some(out)
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
    fn metadata_round_trips_and_strays_are_renamed_never_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let store = TopicStore::new(dir.path(), keel_log::DiskStorage::shared());
        let meta = TopicMeta {
            version: 1,
            name: "t".into(),
            topic_id: Uuid::new_v4(),
            partitions: 2,
            configs: BTreeMap::from([("retention.ms".into(), "1000".into())]),
            deleting: false,
        };
        store.save(&meta).unwrap();
        assert_eq!(store.load_all().unwrap(), vec![meta.clone()]);
        for p in 0..3 {
            std::fs::create_dir_all(store.partition_dir("t", p)).unwrap();
        }
        store
            .ensure_partition_metadata(&store.partition_dir("t", 0), meta.topic_id)
            .unwrap();
        assert_eq!(
            store.partition_topic_id(&store.partition_dir("t", 0)).unwrap(),
            Some(meta.topic_id)
        );
        // Partition 1 belongs to another incarnation of the topic.
        store
            .ensure_partition_metadata(&store.partition_dir("t", 1), Uuid::new_v4())
            .unwrap();
        std::fs::write(
            store.partition_dir("t", 2).join("00000000000000000000.log"),
            b"data",
        )
        .unwrap();
        let (live, sweep) = store.sweep(store.load_all().unwrap()).unwrap();
        assert_eq!(live, vec![meta.clone()]);
        assert!(store.partition_dir("t", 0).exists());
        assert_eq!(sweep.strays.len(), 2, "{sweep:?}");
        for (_, stray) in &sweep.strays {
            assert!(stray.exists() && stray.to_string_lossy().ends_with("-stray"));
        }
        // A deletion interrupted after its commit point is finished.
        store.mark_deleting(&meta).unwrap();
        let (live, sweep) = store.sweep(store.load_all().unwrap()).unwrap();
        assert!(live.is_empty());
        assert_eq!(sweep.deleted.len(), 1);
        assert!(sweep.deleted[0].to_string_lossy().ends_with("-delete"));
        assert!(store.load_all().unwrap().is_empty());
        assert!(!store.partition_dir("t", 0).exists());
    }

    #[test]
    fn base64_round_trips() {
        let id = Uuid::new_v4();
        assert_eq!(
            decode_base64_url(&base64_url(id.as_bytes())).unwrap(),
            id.as_bytes()
        );
        assert_eq!(base64_url(&[0xff; 16]).len(), 22);
        assert_eq!(base64_url(b"Man"), "TWFu");
    }
}
