//! Dynamic broker configs: Kafka's `kafka-configs --entity-type brokers
//! --alter`, for this broker (`--entity-name <node.id>`) or the cluster-wide
//! default (`--entity-default`, the broker resource `""`).
//!
//! The keys that may change are [`keel_config::is_dynamic`]'s: the topic
//! defaults (`log.retention.ms`, `message.max.bytes`, ...), the log
//! cleaner's settings, connection limits, and Keel's own budgets. A change
//! is checked as a whole (each value, the configuration it makes, and every
//! topic's settings under the new defaults; a refusal is Kafka's
//! INVALID_REQUEST naming the key and value), written to
//! `__keel_meta/broker-configs.json` (a temporary file, fsynced, renamed:
//! the commit point), and then put in force without a restart:
//!
//! * the request paths read the configuration in force for each request
//!   (`Broker::config`), so limits such as `max.connections` or
//!   `producer.id.expiration.ms` apply from the next request;
//! * every open partition log takes its new settings when a topic default
//!   changed (topics with their own value keep it);
//! * the budgets are handed to their owners: the tail cache (a smaller one
//!   evicts at once), cold reads and the tier mover (waiting reads and
//!   copies see the new rate), the cleaner, the slow-request log.
//!
//! At start-up the file's values go over the config file's, as Kafka's
//! dynamic configs do over `server.properties`; a stored value the broker
//! no longer accepts is logged and left out. In a cluster the cluster
//! default is the cluster's (`handlers::broker_configs`): the file's is
//! replaced by it once the broker has joined.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use keel_config::{BrokerConfig, DynamicLayers};
use keel_log::storage::{read_file, write_atomically, Storage};

/// The file under the metadata dir.
const FILE: &str = "broker-configs.json";

/// The file's contents: the cluster default, and each broker's own by node
/// id (a data dir moved to another node id keeps the old id's values
/// without applying them).
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Stored {
    default: BTreeMap<String, String>,
    brokers: BTreeMap<String, BTreeMap<String, String>>,
}

fn path(meta_dir: &Path) -> PathBuf {
    meta_dir.join(FILE)
}

fn read(storage: &dyn Storage, meta_dir: &Path) -> io::Result<Stored> {
    let path = path(meta_dir);
    match read_file(storage, &path)? {
        None => Ok(Stored::default()),
        Some(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display()))),
    }
}

/// The stored layers of broker `node_id`.
pub fn load(storage: &dyn Storage, meta_dir: &Path, node_id: i32) -> io::Result<DynamicLayers> {
    let mut stored = read(storage, meta_dir)?;
    Ok(DynamicLayers {
        broker: stored.brokers.remove(&node_id.to_string()).unwrap_or_default(),
        default: stored.default,
    })
}

/// Persists the layers of broker `node_id` (atomically; other brokers'
/// values are kept).
pub fn save(storage: &dyn Storage, meta_dir: &Path, node_id: i32, layers: &DynamicLayers) -> io::Result<()> {
    let mut stored = read(storage, meta_dir)?;
    stored.default = layers.default.clone();
    let id = node_id.to_string();
    if layers.broker.is_empty() {
        stored.brokers.remove(&id);
    } else {
        stored.brokers.insert(id, layers.broker.clone());
    }
    let json = serde_json::to_vec_pretty(&stored).map_err(io::Error::other)?;
    write_atomically(storage, &path(meta_dir), &json)
}

/// The configuration to start with: `config` under the stored layers. A
/// stored value that is no longer valid (a key made static, a config file
/// it now conflicts with) is left out, with a warning naming it.
pub fn start(config: BrokerConfig, mut layers: DynamicLayers) -> BrokerConfig {
    loop {
        match config.with_dynamic(layers.clone()) {
            Ok(merged) => return merged,
            Err(e) => {
                let in_broker = layers.broker.remove(&e.key).is_some();
                let in_default = !in_broker && layers.default.remove(&e.key).is_some();
                if !in_broker && !in_default {
                    // The conflict is not one stored key: start without any.
                    tracing::warn!(error = %e, "dynamic broker configs not applied");
                    return config;
                }
                tracing::warn!(
                    key = %e.key,
                    layer = if in_broker { "broker" } else { "cluster default" },
                    error = %e,
                    "a stored dynamic broker config is not applied"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_config::{BrokerConfig, ConfigSource};
    use keel_log::DiskStorage;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn layers_persist_per_broker_and_keep_other_brokers() {
        let dir = tempfile::tempdir().unwrap();
        let storage = DiskStorage::shared();
        let empty = load(storage.as_ref(), dir.path(), 1).unwrap();
        assert_eq!(empty, DynamicLayers::default());
        let one = DynamicLayers {
            default: map(&[("log.retention.ms", "1000")]),
            broker: map(&[("max.connections", "10")]),
        };
        save(storage.as_ref(), dir.path(), 1, &one).unwrap();
        let two = DynamicLayers {
            default: map(&[("log.retention.ms", "2000")]),
            broker: map(&[("max.connections", "20")]),
        };
        save(storage.as_ref(), dir.path(), 2, &two).unwrap();
        assert_eq!(load(storage.as_ref(), dir.path(), 2).unwrap(), two);
        // Broker 1 keeps its own, under the cluster default broker 2 wrote.
        let back = load(storage.as_ref(), dir.path(), 1).unwrap();
        assert_eq!(back.broker, one.broker);
        assert_eq!(back.default, two.default);
    }

    #[test]
    fn the_broker_value_wins_over_the_default_over_the_file() {
        let file = BrokerConfig::from_map(&map(&[("log.retention.ms", "5000")])).unwrap();
        let layers = DynamicLayers {
            default: map(&[("log.retention.ms", "6000"), ("log.segment.bytes", "20000")]),
            broker: map(&[("log.retention.ms", "7000")]),
        };
        let c = file.with_dynamic(layers).unwrap();
        assert_eq!(c.get("log.retention.ms"), "7000");
        assert_eq!(c.source("log.retention.ms"), ConfigSource::DynamicBroker);
        assert_eq!(
            c.layers("log.retention.ms"),
            vec![
                ("7000".to_string(), ConfigSource::DynamicBroker),
                ("6000".to_string(), ConfigSource::DynamicDefaultBroker),
                ("5000".to_string(), ConfigSource::StaticBroker),
                ("604800000".to_string(), ConfigSource::Default),
            ]
        );
        assert_eq!(c.get("log.segment.bytes"), "20000");
        assert_eq!(c.source("log.segment.bytes"), ConfigSource::DynamicDefaultBroker);
        // Removing the layers gives the file's values back.
        let back = c.with_dynamic(DynamicLayers::default()).unwrap();
        assert_eq!(back.get("log.retention.ms"), "5000");
        assert_eq!(back.source("log.retention.ms"), ConfigSource::StaticBroker);
        assert_eq!(back.source("log.segment.bytes"), ConfigSource::Default);
    }

    #[test]
    fn static_keys_bad_values_and_conflicts_are_refused_by_key() {
        let c = BrokerConfig::from_map(&BTreeMap::new()).unwrap();
        let refused = |default: &[(&str, &str)]| {
            c.with_dynamic(DynamicLayers {
                default: map(default),
                broker: BTreeMap::new(),
            })
            .unwrap_err()
            .key
        };
        assert_eq!(refused(&[("log.dirs", "/elsewhere")]), "log.dirs");
        assert_eq!(
            refused(&[("remote.log.storage.enable", "true")]),
            "remote.log.storage.enable"
        );
        assert_eq!(refused(&[("no.such.key", "1")]), "no.such.key");
        assert_eq!(
            refused(&[("keel.cold.read.bytes.per.sec", "fast")]),
            "keel.cold.read.bytes.per.sec"
        );
        assert_eq!(refused(&[("log.cleaner.threads", "0")]), "log.cleaner.threads");
        // Valid alone, not together: the whole configuration is checked.
        assert_eq!(
            refused(&[
                ("log.cleaner.dedupe.buffer.size", "131072"),
                ("log.cleaner.threads", "4")
            ]),
            "log.cleaner.dedupe.buffer.size"
        );
    }

    #[test]
    fn start_leaves_out_stored_values_no_longer_valid() {
        let file = BrokerConfig::from_map(&BTreeMap::new()).unwrap();
        let stored = DynamicLayers {
            default: map(&[("log.dirs", "/elsewhere"), ("log.retention.ms", "1000")]),
            broker: map(&[("max.connections", "-5"), ("keel.cold.read.bytes.per.sec", "100")]),
        };
        let c = start(file, stored);
        assert_eq!(c.get("log.retention.ms"), "1000");
        assert_eq!(c.get("keel.cold.read.bytes.per.sec"), "100");
        assert_eq!(c.get("max.connections"), "2147483647");
        assert_eq!(c.source("log.dirs"), ConfigSource::Default);
    }
}
