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

use std::collections::BTreeMap;

use keel_config::{BrokerConfig, DynamicLayers, TOPIC_CONFIGS};
use keel_protocol::ResponseError;
use keel_tier::IoClass;

use super::admin::AdminError;
use crate::dynamic_config::save;
use crate::Broker;

/// Puts `layers` in force in place of the current ones: checks them,
/// persists them (with `shared_default`, their default as the cluster's
/// too), applies them. `validate_only` checks only. The caller holds the
/// broker's admin lock.
pub(crate) async fn alter(
    broker: &Arc<Broker>,
    layers: DynamicLayers,
    shared_default: bool,
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
    if validate_only {
        return Ok(());
    }
    if shared_default && cluster_default(broker).0 != new.dynamic().default {
        share_default(broker, &new.dynamic().default).await?;
    }
    if new.dynamic() == old.dynamic() {
        return Ok(());
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

/// Puts the cluster default `default` in the coordination store if it is
/// still the one the view holds (another broker may have changed it
/// meanwhile: then a retriable error, and the client asks again), and
/// waits for this broker to see it.
async fn share_default(broker: &Broker, default: &BTreeMap<String, String>) -> Result<(), AdminError> {
    let (_, revision) = cluster_default(broker);
    // None left is kept as `{}`: a directory joining later brings none back.
    let value = serde_json::to_vec(default).expect("a map serializes");
    let landed = broker
        .cluster
        .put_config(DEFAULT.0, DEFAULT.1, value, revision)
        .await
        .map_err(crate::broker::catalog::store_error)?;
    let Some(at) = landed else {
        return Err((
            ResponseError::RequestTimedOut,
            "the cluster's default broker configs changed meanwhile; ask again".into(),
        ));
    };
    broker
        .cluster
        .wait_for(at, broker.cluster.settings().session_timeout)
        .await;
    *broker.seen_cluster_default.lock() = Some(at);
    Ok(())
}

/// When the cluster has no default broker configs yet, this broker's
/// become the cluster's (a directory that ran alone brings its own, as it
/// brings its topics).
pub(crate) async fn publish_default(broker: &Broker) -> Result<(), String> {
    if cluster_default(broker).1.is_some() {
        return Ok(());
    }
    let default = broker.config().dynamic().default.clone();
    match share_default(broker, &default).await {
        Ok(()) => {
            tracing::info!(
                ?default,
                "published this broker's default broker configs to the cluster"
            );
            Ok(())
        }
        // Another broker published first (brokers starting together):
        // its are the cluster's, once this broker's view has them.
        Err((ResponseError::RequestTimedOut, why)) => {
            broker.cluster.refresh().await.map_err(|e| e.to_string())?;
            match cluster_default(broker).1 {
                Some(_) => Ok(()),
                None => Err(why),
            }
        }
        Err((_, why)) => Err(why),
    }
}

/// The cluster default as the coordination store holds it, and the
/// revision of its key (`None`: there is none yet).
pub(crate) fn cluster_default(broker: &Broker) -> (BTreeMap<String, String>, Option<i64>) {
    match broker.cluster.config(DEFAULT.0, DEFAULT.1) {
        Some((json, revision)) => (serde_json::from_slice(&json).unwrap_or_default(), Some(revision)),
        None => (BTreeMap::new(), None),
    }
}

/// In a cluster, puts the cluster default the store holds in force here
/// if this broker has not yet (at start-up, and when another broker
/// changed it). A value this broker refuses is left out of the default
/// with a warning, as at start-up; its own values are kept. The caller
/// holds the broker's admin lock.
pub(crate) async fn follow_cluster_default_locked(broker: &Arc<Broker>) {
    let (default, Some(revision)) = cluster_default(broker) else {
        return;
    };
    if *broker.seen_cluster_default.lock() == Some(revision) {
        return;
    }
    *broker.seen_cluster_default.lock() = Some(revision);
    let old = broker.config();
    if old.dynamic().default == default {
        return;
    }
    let mut layers = DynamicLayers {
        default,
        broker: old.dynamic().broker.clone(),
    };
    let new = loop {
        match old.with_dynamic(layers.clone()) {
            Ok(new) => break new,
            Err(e) if layers.default.remove(&e.key).is_some() => {
                tracing::warn!(key = %e.key, error = %e, "a cluster default broker config is not applied here");
            }
            Err(e) => {
                return tracing::warn!(error = %e, "the cluster's default broker configs are not applied here");
            }
        }
    };
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
    io.set_live_target(config.live_latency_target());
    broker
        .data
        .mover
        .reconfigure(config.num("keel.tier.fast.max.bytes"));
    broker
        .data
        .mover
        .set_reader_window_bytes(num("keel.tier.reader.window.bytes"));
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
