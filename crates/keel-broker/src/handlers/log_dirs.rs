//! DescribeLogDirs: the broker's data directory with its partitions' bytes
//! and its filesystem's space, as `kafka-log-dirs --describe` and
//! `Admin.describeLogDirs` read them.
//!
//! A partition's size is the bytes of its segments in the data directory:
//! Kafka's "local log" under tiered storage. Segments Keel has moved to a
//! capacity directory or the object store are not in it; `keel stats`
//! gives them per partition (`tiers.capacity_bytes`,
//! `tiers.object_store_bytes`).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use keel_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use keel_protocol::messages::*;
use keel_protocol::ResponseError;

use super::{str_bytes, topic_name};
use crate::Broker;

/// Kafka's answer when a volume's size is unknown.
const UNKNOWN_BYTES: i64 = -1;

pub async fn describe_log_dirs(broker: &Arc<Broker>, req: DescribeLogDirsRequest) -> DescribeLogDirsResponse {
    let dir = broker.config().data_dir();
    let log_dir = str_bytes(std::path::absolute(&dir).unwrap_or(dir.clone()).to_string_lossy());
    // An offline dir is reported as Kafka does: the error, and nothing in it.
    if broker.data.dir_health.is_offline() {
        return DescribeLogDirsResponse::default().with_results(vec![DescribeLogDirsResult::default()
            .with_error_code(ResponseError::KafkaStorageError.code())
            .with_log_dir(log_dir)
            .with_total_bytes(UNKNOWN_BYTES)
            .with_usable_bytes(UNKNOWN_BYTES)]);
    }
    // statvfs can block on a failing disk: not on a request thread.
    let (usable, total) = tokio::task::spawn_blocking(move || space(&dir))
        .await
        .unwrap_or((UNKNOWN_BYTES, UNKNOWN_BYTES));
    // Null topics: every partition. Partitions that do not exist are left
    // out, as Kafka does.
    let wanted: Option<BTreeMap<String, Vec<i32>>> = req.topics.map(|topics| {
        let mut wanted: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        for t in topics {
            wanted
                .entry(t.topic.0.to_string())
                .or_default()
                .extend(t.partitions);
        }
        wanted
    });
    let mut all = broker.data.topics.all();
    all.sort_by(|a, b| a.meta.name.cmp(&b.meta.name));
    let topics = all
        .iter()
        .filter(|t| !t.meta.deleting)
        .filter_map(|topic| {
            let only = match &wanted {
                None => None,
                Some(w) => Some(w.get(&topic.meta.name)?),
            };
            let partitions: Vec<_> = topic
                .partitions
                .iter()
                .filter(|p| only.is_none_or(|o| o.contains(&p.index)))
                // A partition whose log could not be opened has no size to
                // report.
                .filter_map(|p| Some((p, p.reader()?)))
                .map(|(p, reader)| {
                    let size = reader.size_bytes();
                    DescribeLogDirsPartition::default()
                        .with_partition_index(p.index)
                        .with_partition_size(i64::try_from(size).unwrap_or(i64::MAX))
                        // The leader's own replica: no lag, never a future one.
                        .with_offset_lag(0)
                        .with_is_future_key(false)
                })
                .collect();
            (!partitions.is_empty()).then(|| {
                DescribeLogDirsTopic::default()
                    .with_name(topic_name(&topic.meta.name))
                    .with_partitions(partitions)
            })
        })
        .collect();
    DescribeLogDirsResponse::default().with_results(vec![DescribeLogDirsResult::default()
        .with_log_dir(log_dir)
        .with_topics(topics)
        .with_total_bytes(total)
        .with_usable_bytes(usable)])
}

/// Usable and total bytes of the volume holding `dir`.
fn space(dir: &Path) -> (i64, i64) {
    match keel_tier::filesystem_space(dir) {
        Some((free, total)) => (
            i64::try_from(free).unwrap_or(i64::MAX),
            i64::try_from(total).unwrap_or(i64::MAX),
        ),
        None => (UNKNOWN_BYTES, UNKNOWN_BYTES),
    }
}
