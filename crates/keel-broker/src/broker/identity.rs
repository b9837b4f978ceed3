//! Who this broker is: its data directory's `meta.properties` (Kafka's
//! format: `cluster.id`, `directory.id`, `node.id`), and its membership
//! of the cluster.

use std::path::Path;
use std::sync::Arc;

use keel_cluster::{Endpoint, LocalStore, Membership, Registration, Settings};
use keel_config::BrokerConfig;
use keel_data::topics::base64_url;
use keel_log::Storage;
use uuid::Uuid;

use super::StartError;

const META_PROPERTIES: &str = "meta.properties";

/// What a data directory's `meta.properties` holds, where it exists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetaProperties {
    pub cluster_id: Option<String>,
    pub directory_id: Option<String>,
}

/// The ids a broker starts with: the cluster's, and its data directory's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub cluster_id: String,
    pub directory_id: String,
}

/// A new cluster id, in Kafka's form (a UUID in URL-safe base64).
pub fn new_cluster_id() -> String {
    base64_url(Uuid::new_v4().as_bytes())
}

/// A new directory id, in Kafka's form.
pub fn new_directory_id() -> String {
    base64_url(Uuid::new_v4().as_bytes())
}

/// Reads `<data_dir>/meta.properties`; nothing if it is not there yet.
pub fn read_meta_properties(storage: &dyn Storage, data_dir: &Path) -> std::io::Result<MetaProperties> {
    let path = data_dir.join(META_PROPERTIES);
    let Some(bytes) = keel_log::storage::read_file(storage, &path)? else {
        return Ok(MetaProperties::default());
    };
    let text = String::from_utf8_lossy(&bytes);
    let value = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    Ok(MetaProperties {
        cluster_id: value("cluster.id"),
        directory_id: value("directory.id"),
    })
}

/// Makes the data directory carry `identity`: writes `meta.properties`
/// where it is missing or lacks a directory id, and refuses a directory
/// that belongs to another cluster (Kafka's InconsistentClusterIdException).
pub(super) fn settle_meta_properties(
    storage: &dyn Storage,
    data_dir: &Path,
    node_id: i32,
    identity: &Identity,
) -> Result<(), StartError> {
    let path = data_dir.join(META_PROPERTIES);
    let io = |error| StartError::Io {
        path: path.clone(),
        error,
    };
    let stored = read_meta_properties(storage, data_dir).map_err(io)?;
    if let Some(stored) = &stored.cluster_id {
        if *stored != identity.cluster_id {
            return Err(StartError::InconsistentClusterId {
                stored: stored.clone(),
                cluster: identity.cluster_id.clone(),
            });
        }
    }
    if stored.cluster_id.is_some() && stored.directory_id.as_ref() == Some(&identity.directory_id) {
        return Ok(());
    }
    let text = format!(
        "#Written by Keel\nversion=1\ncluster.id={}\ndirectory.id={}\nnode.id={node_id}\n",
        identity.cluster_id, identity.directory_id
    );
    keel_log::storage::write_atomically(storage, &path, text.as_bytes()).map_err(io)
}

/// Membership settings from the configuration.
pub fn cluster_settings(config: &BrokerConfig) -> Settings {
    Settings {
        prefix: config.get("keel.cluster.etcd.prefix").to_string(),
        session_timeout: config.cluster_session_timeout(),
        leader_balance: (config.get("auto.leader.rebalance.enable") == "true").then(|| {
            std::time::Duration::from_secs(
                u64::try_from(config.num("leader.imbalance.check.interval.seconds")).unwrap_or(300),
            )
        }),
    }
}

/// What this broker registers: its node id and advertised listeners.
pub fn registration(
    config: &BrokerConfig,
    advertised: &[keel_config::listeners::Endpoint],
    directory_id: &str,
) -> Registration {
    Registration {
        node_id: config.node_id(),
        rack: None,
        endpoints: advertised
            .iter()
            .map(|e| Endpoint {
                listener: e.listener.clone(),
                host: e.host.clone(),
                port: e.port,
            })
            .collect(),
        directory_id: directory_id.to_string(),
    }
}

/// One node's membership, on an in-process store.
pub(super) fn local_membership(
    config: &BrokerConfig,
    advertised: &[keel_config::listeners::Endpoint],
    directory_id: &str,
) -> Arc<Membership> {
    Membership::new(
        Arc::new(LocalStore::new()),
        cluster_settings(config),
        registration(config, advertised, directory_id),
    )
}
