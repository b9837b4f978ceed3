//! A broker on a temporary directory with a capacity tier, for tests that
//! drive its background work (mover passes, cleaner passes) one step at a
//! time: nothing runs unless the test calls it (`spawn_maintenance` is not
//! called).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use keel_log::batch::validate_batches;
use keel_log::testing::BatchBuilder;

use crate::Broker;
use keel_config::BrokerConfig;
use keel_data::partition::Partition;
use keel_data::topics::Topic;

/// Opens a broker on `<root>/data` with its capacity tier in
/// `<root>/cold`, the mover unpaced, and `sets` over that. Blocking.
pub(crate) fn open_broker(root: &Path, sets: &[(&str, &str)]) -> Arc<Broker> {
    let mut map: BTreeMap<String, String> = [
        ("log.dirs", path(&root.join("data"))),
        ("keel.tier.capacity.dirs", path(&capacity_dir(root))),
        ("keel.tier.move.bytes.per.sec", "0".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    map.extend(sets.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let config = BrokerConfig::from_map(&map).expect("test broker config");
    Broker::open(config, Vec::new()).expect("test broker opens")
}

/// Where [`open_broker`] puts the capacity tier.
pub(crate) fn capacity_dir(root: &Path) -> PathBuf {
    root.join("cold")
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Creates a topic as CreateTopics does.
pub(crate) async fn create_topic(
    broker: &Arc<Broker>,
    name: &str,
    partitions: i32,
    configs: &[(&str, &str)],
) -> Arc<Topic> {
    let configs = configs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    crate::handlers::admin::create_topic(broker, name, partitions, configs, None, false)
        .await
        .expect("topic created");
    broker.data.topics.get(name).expect("topic registered")
}

/// Appends one batch per key (`<key>` = `<value>`), as produces do, and
/// then runs the seals the rolls queued, so every rolled segment is sealed
/// and durable.
pub(crate) async fn append_keyed(p: &Arc<Partition>, records: &[(&str, &str)]) {
    for (key, value) in records {
        let bytes = BatchBuilder::new(keel_log::clock::now_ms())
            .record(Some(key.as_bytes()), Some(value.as_bytes()))
            .build();
        let headers = validate_batches(&bytes).expect("a valid batch");
        p.append(bytes.into(), headers).await.expect("append");
    }
    let p = Arc::clone(p);
    tokio::task::spawn_blocking(move || p.with_log(|log| log.complete_seals()))
        .await
        .expect("seal task")
        .expect("log available")
        .expect("seals");
}
