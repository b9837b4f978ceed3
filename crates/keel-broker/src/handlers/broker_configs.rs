//! AlterConfigs and IncrementalAlterConfigs on the broker resource: a
//! change of the dynamic broker configs checked against every topic,
//! persisted (`crate::dynamic_config`), put in force, and its budgets and
//! topic defaults handed to their owners.
//!
//! In a cluster the cluster-wide default (`--entity-default`) is the
//! cluster's, kept in the coordination store
//! (`<prefix>/configs/brokers/default`): a change made at any broker is
//! put there, and every broker puts it in force when it sees it
//! ([`follow_cluster_default_locked`]). A broker's own values stay in its
//! data directory: clients send them to that broker.

use std::sync::Arc;

use keel_config::{BrokerConfig, DynamicLayers, TOPIC_CONFIGS};
use keel_protocol::ResponseError;
use keel_tier::IoClass;

use super::admin::AdminError;
use crate::dynamic_config::save;
use crate::Broker;

/// Puts `layers` in force in place of the current ones: checks them,
/// persists them, applies them. `validate_only` checks only. The caller
/// holds the broker's admin lock.
pub(crate) async fn alter(
    broker: &Arc<Broker>,
    layers: DynamicLayers,
    validate_only: bool,
) -> Result<(), AdminError> {
    let old = broker.config();
    // Kafka answers a broker config it refuses with INVALID_REQUEST.
    let invalid = |e: String| (ResponseError::InvalidRequest, e);
    let new = old.with_dynamic(layers.clone()).map_err(|e| {
        invalid(match layers.broker.get(&e.key).or(layers.default.get(&e.key)) {
            Some(value) => format!("Invalid value {value} for configuration {}: {}", e.key, e.reason),
            None => e.to_string(),
        })
    })?;
    check_topics(broker, &new).map_err(invalid)?;
    if validate_only || new.dynamic() == old.dynamic() {
        return Ok(());
    }
    if broker.topics_shared() && new.dynamic().default != old.dynamic().default {
        share_default(broker, &new.dynamic().default).await?;
    }
    let b = Arc::clone(broker);
    let to_save = new.dynamic().clone();
    tokio::task::spawn_blocking(move || {
        let meta_dir = b.config().data_dir().join(keel_data::topics::META_DIR);
        save(b.data.storage.as_ref(), &meta_dir, b.config().node_id(), &to_save)
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r.map_err(|e| e.to_string()))
    .map_err(|e| (ResponseError::KafkaStorageError, e))?;
    put_in_force(broker, &old, new).await;
    Ok(())
}

/// The kind and name of the cluster default among the cluster's configs.
const DEFAULT: (&str, &str) = ("brokers", "default");

/// Puts the cluster default `default` in the coordination store and waits
/// for this broker to see it.
async fn share_default(
    broker: &Broker,
    default: &std::collections::BTreeMap<String, String>,
) -> Result<(), AdminError> {
    let value = (!default.is_empty()).then(|| serde_json::to_vec(default).expect("a map serializes"));
    let revision = broker
        .cluster
        .put_config(DEFAULT.0, DEFAULT.1, value)
        .await
        .map_err(crate::broker::catalog::store_error)?;
    broker
        .cluster
        .wait_for(revision, broker.cluster.settings().session_timeout)
        .await;
    Ok(())
}

/// On a directory's first join: its cluster default, if it has one and
/// the cluster none yet, becomes the cluster's (as its topics do).
pub(crate) async fn publish_default(broker: &Broker) -> Result<(), String> {
    let default = broker.config().dynamic().default.clone();
    if default.is_empty() || broker.cluster.config(DEFAULT.0, DEFAULT.1).is_some() {
        return Ok(());
    }
    share_default(broker, &default).await.map_err(|(_, why)| why)?;
    tracing::info!(
        ?default,
        "published this directory's default broker configs to the cluster"
    );
    Ok(())
}

/// The cluster default as the coordination store holds it.
fn cluster_default(broker: &Broker) -> std::collections::BTreeMap<String, String> {
    broker
        .cluster
        .config(DEFAULT.0, DEFAULT.1)
        .and_then(|json| serde_json::from_slice(&json).ok())
        .unwrap_or_default()
}

/// In a cluster, puts the cluster default the store holds in force here
/// if it is not already (at start-up, and when another broker changed
/// it). A value this broker refuses is left out with a warning, as at
/// start-up. The caller holds the broker's admin lock.
pub(crate) async fn follow_cluster_default_locked(broker: &Arc<Broker>) {
    let default = cluster_default(broker);
    let old = broker.config();
    if old.dynamic().default == default || broker.seen_cluster_default.lock().as_ref() == Some(&default) {
        return;
    }
    *broker.seen_cluster_default.lock() = Some(default.clone());
    let layers = DynamicLayers {
        default,
        broker: old.dynamic().broker.clone(),
    };
    let new = crate::dynamic_config::start((*old).clone(), layers);
    if let Err(e) = check_topics(broker, &new) {
        tracing::warn!(error = %e, "the cluster's default broker configs are not applied here");
        return;
    }
    if new.dynamic() != old.dynamic() {
        put_in_force(broker, &old, new).await;
    }
}

/// Puts `new` in force in place of `old`: the configuration every
/// request reads, the budgets, and the open logs' settings where a topic
/// default changed.
async fn put_in_force(broker: &Arc<Broker>, old: &BrokerConfig, new: BrokerConfig) {
    let changed: Vec<String> = new
        .entries()
        .filter(|(k, v)| old.get(k) != *v)
        .map(|(k, _)| k.to_string())
        .collect();
    tracing::info!(?changed, layers = ?new.dynamic(), "altered dynamic broker configs");
    let new = Arc::new(new);
    broker.config.set(Arc::clone(&new));
    apply_budgets(broker, &new);
    if TOPIC_CONFIGS
        .iter()
        .any(|d| changed.iter().any(|c| c == d.broker_name))
    {
        let b = Arc::clone(broker);
        let applied = tokio::task::spawn_blocking(move || reconfigure_logs(&b, &new)).await;
        if let Err(e) = applied {
            tracing::warn!(error = %e, "applying new topic defaults failed");
        }
    }
}

/// Every topic's settings must hold under the new defaults, so that no
/// open log is left with settings it cannot take.
fn check_topics(broker: &Broker, config: &BrokerConfig) -> Result<(), String> {
    for topic in broker.data.topics.all() {
        let overrides = &topic.meta.configs;
        let checked = config.compaction(overrides).and_then(|_| {
            let mut log = config.topic_log_config(overrides)?;
            log.read_io = broker.data.read_io;
            log.check().map_err(|reason| keel_config::ConfigError {
                key: "log.segment.bytes".into(),
                reason: reason.into(),
            })
        });
        if let Err(e) = checked {
            return Err(format!("under these defaults, topic `{}`: {e}", topic.meta.name));
        }
    }
    Ok(())
}

/// Hands the budgets and limits of `config` to their owners.
fn apply_budgets(broker: &Arc<Broker>, config: &BrokerConfig) {
    let num = |key| u64::try_from(config.num(key)).unwrap_or(0);
    let tail = crate::broker::tail_cache_bytes(config, &broker.memory);
    if tail != broker.data.tail_cache.stats().budget_bytes {
        tracing::info!(budget_bytes = tail, "tail cache budget changed");
        broker.data.tail_cache.set_budget(tail);
    }
    let io = &broker.data.io;
    io.set_budget(IoClass::ColdRead, num("keel.cold.read.bytes.per.sec"));
    io.set_budget(IoClass::TierMove, num("keel.tier.move.bytes.per.sec"));
    broker
        .data
        .mover
        .reconfigure(config.num("keel.tier.fast.max.bytes"));
    broker.metrics.set_slow(config.slow_request());
    keel_data::cleaner::reconfigure(&broker.data, config.cleaner_settings());
}

/// Every open partition log takes the settings its topic has under
/// `config`'s defaults (an append in progress finishes first).
fn reconfigure_logs(broker: &Broker, config: &BrokerConfig) {
    for topic in broker.data.topics.all() {
        let Ok(mut log) = config.topic_log_config(&topic.meta.configs) else {
            continue;
        };
        log.read_io = broker.data.read_io;
        for p in &topic.partitions {
            if let Err(e) = p.set_log_config(log.clone()) {
                tracing::warn!(topic = %topic.meta.name, partition = p.index, error = %e,
                    "new topic defaults not applied to the open log");
            }
        }
    }
}
