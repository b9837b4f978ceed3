//! The group log: committed offsets and group metadata, persisted as record
//! batches in a coordinator log ([`crate::metalog`]) of Keel's own
//! (`__keel_meta/groups/log`), in the record schemas of Kafka's
//! `__consumer_offsets` ([`super::records`]).

use std::collections::BTreeMap;

use bytes::Bytes;

use super::records::{CommittedOffset, GroupMetadata, GroupRecord};
pub use crate::metalog::StoreError;
use crate::metalog::{MetaLog, Table};

/// Committed offsets of one group, by `(topic, partition)`.
pub type GroupOffsets = BTreeMap<(String, i32), CommittedOffset>;

/// The group log.
pub type GroupStore = MetaLog<GroupTable>;

/// Everything the group log holds, as of its last applied record.
#[derive(Debug, Default, Clone)]
pub struct GroupTable {
    pub offsets: BTreeMap<String, GroupOffsets>,
    pub groups: BTreeMap<String, GroupMetadata>,
}

impl Table for GroupTable {
    type Record = GroupRecord;
    const NAME: &'static str = "group-log";

    fn apply(&mut self, record: GroupRecord) {
        match record {
            GroupRecord::Offset {
                group,
                topic,
                partition,
                value: Some(v),
            } => {
                self.offsets
                    .entry(group)
                    .or_default()
                    .insert((topic, partition), v);
            }
            GroupRecord::Offset {
                group,
                topic,
                partition,
                value: None,
            } => {
                if let Some(offsets) = self.offsets.get_mut(&group) {
                    offsets.remove(&(topic, partition));
                    if offsets.is_empty() {
                        self.offsets.remove(&group);
                    }
                }
            }
            GroupRecord::Group {
                group,
                value: Some(v),
            } => {
                self.groups.insert(group, v);
            }
            GroupRecord::Group { group, value: None } => {
                self.groups.remove(&group);
            }
        }
    }

    fn records(&self) -> Vec<GroupRecord> {
        let groups = self.groups.iter().map(|(g, v)| GroupRecord::Group {
            group: g.clone(),
            value: Some(v.clone()),
        });
        let offsets = self.offsets.iter().flat_map(|(g, offsets)| {
            offsets.iter().map(move |((t, p), v)| GroupRecord::Offset {
                group: g.clone(),
                topic: t.clone(),
                partition: *p,
                value: Some(v.clone()),
            })
        });
        groups.chain(offsets).collect()
    }

    fn encode(record: &GroupRecord) -> (Bytes, Option<Bytes>) {
        (record.encode_key(), record.encode_value())
    }

    fn decode(key: &[u8], value: Option<&[u8]>) -> Result<GroupRecord, String> {
        GroupRecord::decode(key, value).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metalog::{encode_batch, list_snapshots};
    use keel_log::LogConfig;

    fn offset_record(group: &str, partition: i32, offset: i64) -> GroupRecord {
        GroupRecord::Offset {
            group: group.into(),
            topic: "t".into(),
            partition,
            value: Some(CommittedOffset {
                offset,
                leader_epoch: -1,
                metadata: String::new(),
                commit_timestamp_ms: 1,
            }),
        }
    }

    fn small_log() -> LogConfig {
        LogConfig {
            segment_bytes: 4096,
            ..LogConfig::default()
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().build().unwrap()
    }

    #[test]
    fn batches_are_valid_kafka_batches() {
        let r = offset_record("g", 0, 5);
        let batch = encode_batch::<GroupTable>([&r].into_iter(), 7).unwrap();
        let header = keel_log::batch::BatchHeader::parse(&batch).unwrap();
        assert_eq!(header.records_count, 1);
        keel_log::batch::check_crc(&batch, &header).unwrap();
    }

    #[test]
    fn writes_survive_reopen_and_snapshots_bound_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let rt = runtime();
        {
            let store = GroupStore::open(dir.path(), small_log(), 8192).unwrap();
            for i in 0..2000 {
                rt.block_on(store.write(vec![offset_record("g", i % 4, i64::from(i))]))
                    .unwrap();
            }
            rt.block_on(store.write(vec![offset_record("gone", 0, 1)]))
                .unwrap();
            rt.block_on(store.write(vec![GroupRecord::Offset {
                group: "gone".into(),
                topic: "t".into(),
                partition: 0,
                value: None,
            }]))
            .unwrap();
            store.close();
        }
        let log_bytes: u64 = std::fs::read_dir(dir.path().join("log"))
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        // 2000 commits of ~100 bytes each were written; the snapshots keep
        // the log to a few segments.
        assert!(log_bytes < 64 * 1024, "group log holds {log_bytes} bytes");
        assert!(
            !list_snapshots(&keel_log::DiskStorage, &dir.path().join("snapshots"))
                .unwrap()
                .is_empty()
        );
        let store = GroupStore::open(dir.path(), small_log(), 8192).unwrap();
        store.with_table(|t| {
            let g = &t.offsets["g"];
            for p in 0..4 {
                assert_eq!(g[&("t".to_string(), p)].offset, i64::from(1996 + p));
            }
            assert!(!t.offsets.contains_key("gone"));
        });
        store.close();
    }

    #[test]
    fn a_torn_tail_loses_only_unacknowledged_records() {
        let dir = tempfile::tempdir().unwrap();
        let rt = runtime();
        let store = GroupStore::open(dir.path(), LogConfig::default(), u64::MAX).unwrap();
        rt.block_on(store.write(vec![offset_record("g", 0, 10)])).unwrap();
        // Reopened as after a crash (no clean-shutdown marker), with
        // garbage appended as a torn write would leave it.
        drop(store);
        std::fs::remove_file(dir.path().join("log").join(keel_log::CLEAN_SHUTDOWN_FILE)).unwrap();
        let segment = std::fs::read_dir(dir.path().join("log"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "log"))
            .unwrap();
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().append(true).open(&segment).unwrap();
        f.write_all(&[0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 1]).unwrap();
        let store = GroupStore::open(dir.path(), LogConfig::default(), u64::MAX).unwrap();
        store.with_table(|t| assert_eq!(t.offsets["g"][&("t".to_string(), 0)].offset, 10));
        rt.block_on(store.write(vec![offset_record("g", 0, 11)])).unwrap();
        store.close();
    }
}
