//! IncrementalAlterConfigs and AlterConfigs: `kafka-configs --alter`,
//! `Admin.incrementalAlterConfigs`, for topics, brokers (the dynamic
//! broker configs of `crate::dynamic_config`: this broker's own and the
//! cluster default `""`), consumer groups (`crate::group_configs`) and
//! loggers (`crate::loggers`).
//!
//! For a topic:
//! A change is checked as a whole against the topic's new overrides (Kafka's
//! INVALID_CONFIG naming the key), persisted in the topic's description
//! (one atomic file write: the commit point), and then applied without a
//! restart: the registry's topic carries the new overrides, which the
//! request paths, the cleaner and the tier mover read, and every open
//! partition log takes its new settings (segment size, retention, flushes).
//! `validate_only` checks and changes nothing.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use keel_protocol::messages::alter_configs_response::AlterConfigsResourceResponse as LegacyResourceResponse;
use keel_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
use keel_protocol::messages::*;
use keel_protocol::{ResponseError, StrBytes};

use super::admin::AdminError;
use super::config_resource::{RESOURCE_BROKER, RESOURCE_BROKER_LOGGER, RESOURCE_GROUP, RESOURCE_TOPIC};
use super::str_bytes;
use crate::group_configs::GROUP_CONFIGS;
use crate::Broker;
use keel_config::kafka_configs::{foreign, kafka_broker_config, UpdateMode};
use keel_config::{broker_config_type, is_dynamic, topic_def, ConfigChange, ConfigType};
use keel_data::partition::Partition;
use keel_data::topics::Topic;
use keel_log::LogConfig;

/// What a request asks of one resource.
enum Edit {
    /// IncrementalAlterConfigs: these changes to what is set.
    Changes(Vec<ConfigChange>),
    /// AlterConfigs: exactly these overrides.
    Replace(Vec<(String, Option<String>)>),
}

pub async fn incremental_alter_configs(
    broker: &Arc<Broker>,
    req: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let edits = req.resources.iter().map(|r| {
        let changes = r
            .configs
            .iter()
            .map(|c| ConfigChange {
                name: c.name.to_string(),
                op: c.config_operation,
                value: c.value.as_ref().map(|v| v.to_string()),
            })
            .collect();
        (r.resource_type, r.resource_name.as_str(), Edit::Changes(changes))
    });
    let results = alter_all(broker, edits.collect(), req.validate_only).await;
    let responses = req
        .resources
        .into_iter()
        .zip(results)
        .map(|(r, (code, message))| {
            AlterConfigsResourceResponse::default()
                .with_error_code(code)
                .with_error_message(message)
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name)
        })
        .collect();
    IncrementalAlterConfigsResponse::default().with_responses(responses)
}

/// AlterConfigs (the legacy form): the resource's overrides become exactly
/// the given ones.
pub async fn alter_configs(broker: &Arc<Broker>, req: AlterConfigsRequest) -> AlterConfigsResponse {
    let edits = req.resources.iter().map(|r| {
        let given = r
            .configs
            .iter()
            .map(|c| (c.name.to_string(), c.value.as_ref().map(|v| v.to_string())))
            .collect();
        (r.resource_type, r.resource_name.as_str(), Edit::Replace(given))
    });
    let results = alter_all(broker, edits.collect(), req.validate_only).await;
    let responses = req
        .resources
        .into_iter()
        .zip(results)
        .map(|(r, (code, message))| {
            LegacyResourceResponse::default()
                .with_error_code(code)
                .with_error_message(message)
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name)
        })
        .collect();
    AlterConfigsResponse::default().with_responses(responses)
}

/// Alters each resource in turn; per resource, the error code and message
/// of its answer. A resource named twice in one request is refused.
async fn alter_all(
    broker: &Arc<Broker>,
    edits: Vec<(i8, &str, Edit)>,
    validate_only: bool,
) -> Vec<(i16, Option<StrBytes>)> {
    let mut seen = HashSet::new();
    let repeated: HashSet<(i8, &str)> = edits
        .iter()
        .map(|(kind, name, _)| (*kind, *name))
        .filter(|r| !seen.insert(*r))
        .collect();
    let mut results = Vec::with_capacity(edits.len());
    for (kind, name, edit) in &edits {
        let outcome = if repeated.contains(&(*kind, *name)) {
            Err((
                ResponseError::InvalidRequest,
                "the resource is named more than once in the request".into(),
            ))
        } else {
            match edit {
                Edit::Changes(changes) => match check_changes(changes) {
                    Err(e) => Err(e),
                    Ok(()) if *kind == RESOURCE_BROKER_LOGGER => {
                        alter_loggers(broker, name, validate_only, changes)
                    }
                    Ok(()) => {
                        alter(broker, *kind, name, validate_only, |current| {
                            incremental(current, changes, |key| effective(broker, *kind, current, key))
                        })
                        .await
                    }
                },
                Edit::Replace(given) => {
                    alter(broker, *kind, name, validate_only, |_| replacement(given)).await
                }
            }
        };
        results.push(match outcome {
            Ok(()) => (0, None),
            Err((error, message)) => (error.code(), Some(str_bytes(message))),
        });
    }
    results
}

/// Kafka's checks on the changes to any resource, before its own: each
/// key once, and a value for every operation but DELETE.
fn check_changes(changes: &[ConfigChange]) -> Result<(), AdminError> {
    let mut names = HashSet::new();
    if !changes.iter().all(|c| names.insert(c.name.as_str())) {
        return Err((
            ResponseError::InvalidRequest,
            "Error due to duplicate config keys".into(),
        ));
    }
    match changes
        .iter()
        .find(|c| c.op != ConfigChange::DELETE && c.value.is_none())
    {
        Some(c) => Err((
            ResponseError::InvalidRequest,
            format!("Null value not supported for : {}", c.name),
        )),
        None => Ok(()),
    }
}

/// Sets or removes loggers' levels (Kafka's checks, in `crate::loggers`);
/// they last until the process stops.
fn alter_loggers(
    broker: &Broker,
    name: &str,
    validate_only: bool,
    changes: &[ConfigChange],
) -> Result<(), AdminError> {
    let node = broker.config().node_id().to_string();
    if name != node {
        return Err((
            ResponseError::InvalidRequest,
            format!("Unexpected broker id, expected {node}, but received {name}"),
        ));
    }
    let Some(loggers) = broker.loggers.get() else {
        return Err((
            ResponseError::InvalidRequest,
            "this process has no loggers to change".into(),
        ));
    };
    let checked = crate::loggers::check(loggers, changes)?;
    if !validate_only {
        loggers.apply(&checked);
        tracing::info!(changes = ?checked, "changed log levels");
    }
    Ok(())
}

/// A key's type and current value on a topic (its override or else the
/// broker's default) or on the broker (the value in force), for APPEND and
/// SUBTRACT; unknown keys are refused.
fn effective(
    broker: &Broker,
    kind: i8,
    current: &BTreeMap<String, String>,
    key: &str,
) -> Result<(ConfigType, String), AdminError> {
    let config = broker.config();
    if kind == RESOURCE_BROKER {
        if let Some(kafka) = foreign(key) {
            let value = current.get(key).map(String::as_str).or(kafka.default);
            return Ok((kafka.kind, value.unwrap_or_default().to_string()));
        }
        let ty = broker_config_type(key).ok_or_else(|| unknown_broker_key(key))?;
        let value = current
            .get(key)
            .map_or_else(|| config.get(key).to_string(), String::clone);
        return Ok((ty, value));
    }
    if kind == RESOURCE_GROUP {
        if let Some((_, ty, default, _)) = crate::group_configs::SHARE_CHOICE_CONFIGS
            .iter()
            .find(|(name, ..)| *name == key)
        {
            let value = current.get(key).cloned().unwrap_or_else(|| default.to_string());
            return Ok((*ty, value));
        }
        let (_, broker_key) = GROUP_CONFIGS
            .iter()
            .find(|(name, _)| *name == key)
            .ok_or_else(|| {
                (
                    ResponseError::InvalidConfig,
                    format!("Unknown group config name: {key}"),
                )
            })?;
        let value = current
            .get(key)
            .map_or_else(|| config.get(broker_key).to_string(), String::clone);
        return Ok((ConfigType::Int, value));
    }
    let def = topic_def(key).ok_or_else(|| unknown_key(key))?;
    Ok((def.kind, config.topic_value(current, def).to_string()))
}

/// Alters one resource: a topic's overrides or a broker's dynamic configs.
async fn alter(
    broker: &Arc<Broker>,
    kind: i8,
    name: &str,
    validate_only: bool,
    change: impl Fn(&BTreeMap<String, String>) -> Result<BTreeMap<String, String>, AdminError>,
) -> Result<(), AdminError> {
    match kind {
        RESOURCE_TOPIC => alter_topic(broker, name, validate_only, change).await,
        RESOURCE_BROKER => alter_broker(broker, name, validate_only, change).await,
        RESOURCE_GROUP => alter_group(broker, name, validate_only, change).await,
        // Loggers are IncrementalAlterConfigs' alone, as in Kafka.
        RESOURCE_BROKER_LOGGER => Err((
            ResponseError::InvalidRequest,
            "AlterConfigs does not support the BROKER_LOGGER resource type: use \
             IncrementalAlterConfigs"
                .into(),
        )),
        other => Err((
            ResponseError::InvalidRequest,
            format!("resource type {other} has no configs to alter"),
        )),
    }
}

/// The values set after `changes`, which passed [`check_changes`]:
/// APPEND and SUBTRACT only on list configs, on the current value
/// (`effective` gives a key's type and value in force).
fn incremental(
    current: &BTreeMap<String, String>,
    changes: &[ConfigChange],
    effective: impl Fn(&str) -> Result<(ConfigType, String), AdminError>,
) -> Result<BTreeMap<String, String>, AdminError> {
    let mut next = current.clone();
    for c in changes {
        let value = c.value.clone().unwrap_or_default();
        match c.op {
            ConfigChange::SET => {
                next.insert(c.name.clone(), value);
            }
            ConfigChange::DELETE => {
                next.remove(&c.name);
            }
            ConfigChange::APPEND | ConfigChange::SUBTRACT => {
                let append = c.op == ConfigChange::APPEND;
                let verb = if append { "append" } else { "subtract" };
                let (kind, value_now) = effective(&c.name)?;
                if kind != ConfigType::List {
                    return Err((
                        ResponseError::InvalidConfig,
                        format!("Config value {verb} is not allowed for config key: {}", c.name),
                    ));
                }
                let mut items: Vec<String> = list(&value_now);
                if append {
                    for item in list(&value) {
                        if !items.contains(&item) {
                            items.push(item);
                        }
                    }
                } else {
                    let removed = list(&value);
                    items.retain(|i| !removed.contains(i));
                }
                next.insert(c.name.clone(), items.join(","));
            }
            other => {
                return Err((
                    ResponseError::InvalidRequest,
                    format!("unknown config operation {other} for {}", c.name),
                ))
            }
        }
    }
    Ok(next)
}

/// AlterConfigs' whole set of overrides.
fn replacement(given: &[(String, Option<String>)]) -> Result<BTreeMap<String, String>, AdminError> {
    let mut next = BTreeMap::new();
    for (name, value) in given {
        let value = value.clone().ok_or_else(|| {
            (
                ResponseError::InvalidRequest,
                format!("Null value not supported for : {name}"),
            )
        })?;
        if next.insert(name.clone(), value).is_some() {
            return Err((
                ResponseError::InvalidRequest,
                "Error due to duplicate config keys".into(),
            ));
        }
    }
    Ok(next)
}

fn list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

fn unknown_key(name: &str) -> AdminError {
    (
        ResponseError::InvalidConfig,
        format!("Unknown topic config name: {name}"),
    )
}

/// Kafka stores broker keys it does not know; Keel refuses them, so that a
/// typo cannot look applied (Kafka's own keys are stored, see
/// `crate::kafka_configs`).
fn unknown_broker_key(name: &str) -> AdminError {
    (
        ResponseError::InvalidRequest,
        format!(
            "Unknown broker config name: {name} (neither Keel nor Apache Kafka has such a broker config)"
        ),
    )
}

/// Kafka's checks, in its order, on the values of its keys Keel does not
/// use (`DynamicBrokerConfig.validateConfigs`): each value's type, then no
/// per-broker key at the cluster default.
fn check_foreign(
    next: &BTreeMap<String, String>,
    touched: &BTreeSet<&String>,
    per_broker: bool,
) -> Result<(), AdminError> {
    let invalid = |message: String| (ResponseError::InvalidRequest, message);
    for (key, kafka) in touched.iter().filter_map(|k| foreign(k).map(|c| (k, c))) {
        if let Some(value) = next.get(*key) {
            kafka.check(value).map_err(|reason| {
                invalid(format!("Invalid value {value} for configuration {key}: {reason}"))
            })?;
        }
    }
    let broker_only: Vec<&str> = touched
        .iter()
        .filter(|k| kafka_broker_config(k).is_some_and(|c| c.mode == UpdateMode::PerBroker))
        .map(|k| k.as_str())
        .collect();
    if !per_broker && !broker_only.is_empty() {
        return Err(invalid(format!(
            "Cannot update these configs at default cluster level, broker id must be specified: [{}]",
            broker_only.join(", ")
        )));
    }
    Ok(())
}

/// Alters a broker's dynamic configs: `name` is this broker's node id (its
/// own values) or `""` (the cluster default).
async fn alter_broker(
    broker: &Arc<Broker>,
    name: &str,
    validate_only: bool,
    change: impl FnOnce(&BTreeMap<String, String>) -> Result<BTreeMap<String, String>, AdminError>,
) -> Result<(), AdminError> {
    let node = broker.config().node_id();
    let per_broker = match name.parse::<i32>() {
        _ if name.is_empty() => false,
        Ok(id) if id == node => true,
        Ok(id) => {
            return Err((
                ResponseError::InvalidRequest,
                format!(
                    "broker {id} is not this broker (node.id {node}): name {node}, or the cluster default"
                ),
            ))
        }
        Err(_) => {
            return Err((
                ResponseError::InvalidRequest,
                format!("Invalid broker name {name}: a node id, or empty for the cluster default"),
            ))
        }
    };
    // One admin change at a time: topic changes check against the defaults.
    let _admin = broker.admin.lock().await;
    let mut layers = broker.config().dynamic().clone();
    let shared_default = broker.topics_shared() && !per_broker;
    if shared_default {
        // The cluster's default, not what this broker has in force of it
        // (it may not have seen a change yet).
        layers.default = super::broker_configs::cluster_default(broker).0;
    }
    let layer = if per_broker {
        &mut layers.broker
    } else {
        &mut layers.default
    };
    let next = change(layer)?;
    let touched: BTreeSet<&String> = next
        .keys()
        .chain(layer.keys())
        .filter(|k| next.get(*k) != layer.get(*k))
        .collect();
    if let Some(key) = touched
        .iter()
        .find(|k| broker_config_type(k).is_none() && kafka_broker_config(k).is_none())
    {
        return Err(unknown_broker_key(key));
    }
    // Kafka's answer to a key that cannot change at run time, for the
    // whole resource.
    let fixed: Vec<&str> = touched
        .iter()
        .filter(|k| !is_dynamic(k))
        .map(|k| k.as_str())
        .collect();
    if !fixed.is_empty() {
        return Err((
            ResponseError::InvalidRequest,
            format!("Cannot update these configs dynamically: [{}]", fixed.join(", ")),
        ));
    }
    check_foreign(&next, &touched, per_broker)?;
    *layer = next;
    super::broker_configs::alter(broker, layers, shared_default, validate_only).await
}

/// Alters a consumer group's configs (`crate::group_configs`). The group
/// need not exist, as in Kafka: its members follow them once it does.
async fn alter_group(
    broker: &Arc<Broker>,
    name: &str,
    validate_only: bool,
    change: impl Fn(&BTreeMap<String, String>) -> Result<BTreeMap<String, String>, AdminError>,
) -> Result<(), AdminError> {
    // One admin change at a time: the file is written in the order the
    // configs change.
    let _admin = broker.admin.lock().await;
    // In a cluster, a change made at another broker meanwhile is seen and
    // this one made again over it.
    for _ in 0..20 {
        let (current, revision) = broker.group_configs.get_at(name);
        let next = change(&current)?;
        crate::group_configs::check(&broker.config(), &next)
            .map_err(|m| (ResponseError::InvalidConfig, m))?;
        if validate_only || next == current {
            return Ok(());
        }
        if !broker.group_configs.is_shared() {
            return set_group_locally(broker, name, next).await;
        }
        let landed = broker
            .group_configs
            .set_shared(name, &next, revision)
            .await
            .map_err(|e| (ResponseError::RequestTimedOut, e))?;
        if landed {
            tracing::info!(group = name, configs = ?next, "altered group configs in the cluster");
            return Ok(());
        }
    }
    Err((
        ResponseError::RequestTimedOut,
        format!("group `{name}`'s configs kept changing under this request"),
    ))
}

async fn set_group_locally(
    broker: &Arc<Broker>,
    name: &str,
    next: BTreeMap<String, String>,
) -> Result<(), AdminError> {
    let (b, group, configs) = (Arc::clone(broker), name.to_string(), next.clone());
    tokio::task::spawn_blocking(move || {
        let meta_dir = b.config().data_dir().join(keel_data::topics::META_DIR);
        b.group_configs
            .set(b.data.storage.as_ref(), &meta_dir, &group, configs)
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r.map_err(|e| e.to_string()))
    .map_err(|e| (ResponseError::KafkaStorageError, e))?;
    tracing::info!(group = name, configs = ?next, "altered group configs");
    Ok(())
}

/// Refuses `configs` turning remote storage off for a topic with
/// `current` unless the remote data goes too, as Kafka does
/// (`remote.log.delete.on.disable=true` in the same change).
fn disables_remote_storage(
    broker: &Broker,
    current: &BTreeMap<String, String>,
    configs: &BTreeMap<String, String>,
) -> Result<(), AdminError> {
    let flag = |c: &BTreeMap<String, String>, key: &str| {
        topic_def(key).is_some_and(|d| broker.config().topic_value(c, d) == "true")
    };
    let disabling = flag(current, "remote.storage.enable") && !flag(configs, "remote.storage.enable");
    if disabling && !flag(configs, "remote.log.delete.on.disable") {
        return Err((
            ResponseError::InvalidConfig,
            "It is invalid to disable remote storage without deleting remote data. If you want to \
             keep the remote data and turn to read only, please set \
             `remote.storage.enable=true,remote.log.copy.disable=true`. If you want to disable remote \
             storage and delete all remote data, please set \
             `remote.storage.enable=false,remote.log.delete.on.disable=true`."
                .into(),
        ));
    }
    Ok(())
}

/// The open logs of an altered topic take its new settings (an append in
/// progress finishes first); with remote storage disabled, its copies
/// there are marked for deletion. Blocking.
fn apply_to_open_logs(
    topic: &str,
    partitions: &[Arc<Partition>],
    log_config: &LogConfig,
    disabling_remote: bool,
) {
    for p in partitions {
        if let Err(e) = p.set_log_config(log_config.clone()) {
            tracing::warn!(topic, partition = p.index, error = %e, "altered configs not applied to the open log");
        }
        if disabling_remote {
            // The mover deletes what this marks; offsets held only in
            // the object store are gone from the log now.
            let discarded = p
                .with_log(|log| log.discard_tier(keel_log::Tier::Remote))
                .map_err(std::io::Error::from)
                .and_then(|r| r);
            match discarded {
                Ok(start) => tracing::info!(
                    topic,
                    partition = p.index,
                    log_start_offset = start,
                    "remote storage disabled: the object store's copies are deleted"
                ),
                Err(e) => tracing::warn!(
                    topic, partition = p.index, error = %e,
                    "remote storage disabled, but its copies could not be marked for deletion"
                ),
            }
        }
    }
}

async fn alter_topic(
    broker: &Arc<Broker>,
    name: &str,
    validate_only: bool,
    change: impl Fn(&BTreeMap<String, String>) -> Result<BTreeMap<String, String>, AdminError>,
) -> Result<(), AdminError> {
    // One admin change at a time: no create, delete or other alter of the
    // topic runs in between.
    let _admin = broker.admin.lock().await;
    let topic = broker
        .data
        .topics
        .get(name)
        .filter(|t| !t.meta.deleting)
        .ok_or_else(|| {
            (
                ResponseError::UnknownTopicOrPartition,
                format!("The topic '{name}' does not exist."),
            )
        })?;
    if broker.topics_shared() {
        // The change applies to the cluster's configs (which this broker's
        // copy may not hold yet); every broker, this one too, takes the
        // result when it sees it.
        let topic_id = topic.meta.topic_id;
        crate::broker::catalog::update_topic_locked(broker, name, |t| {
            if t.topic_id != topic_id {
                return Err((
                    ResponseError::UnknownTopicOrPartition,
                    format!("The topic '{name}' does not exist."),
                ));
            }
            let configs = checked_topic_configs(broker, &t.configs, &change)?;
            let mut altered = t.clone();
            if !validate_only {
                altered.configs = configs;
            }
            Ok(altered)
        })
        .await?;
        if !validate_only {
            let now = broker
                .cluster
                .topic(name)
                .map(|s| s.topic.configs)
                .unwrap_or_default();
            let changed = diff(&topic.meta.configs, &now);
            tracing::info!(topic = name, ?changed, "altered topic configs in the cluster");
        }
        return Ok(());
    }
    let configs = checked_topic_configs(broker, &topic.meta.configs, &change)?;
    if validate_only || configs == topic.meta.configs {
        return Ok(());
    }
    let changed = diff(&topic.meta.configs, &configs);
    install_topic_configs(broker, topic, configs)
        .await
        .map_err(|e| (ResponseError::KafkaStorageError, e))?;
    tracing::info!(topic = name, ?changed, "altered topic configs");
    Ok(())
}

/// A topic's overrides after `change` of `current`, checked as Kafka
/// checks them.
fn checked_topic_configs(
    broker: &Broker,
    current: &BTreeMap<String, String>,
    change: impl Fn(&BTreeMap<String, String>) -> Result<BTreeMap<String, String>, AdminError>,
) -> Result<BTreeMap<String, String>, AdminError> {
    let configs = change(current)?;
    if let Some(key) = configs.keys().find(|k| topic_def(k).is_none()) {
        return Err(unknown_key(key));
    }
    let invalid = |e: String| (ResponseError::InvalidConfig, e);
    disables_remote_storage(broker, current, &configs)?;
    broker
        .config()
        .check_topic_overrides(&configs)
        .map_err(|e| invalid(e.to_string()))?;
    let mut log_config = broker
        .config()
        .topic_log_config(&configs)
        .map_err(|e| invalid(e.to_string()))?;
    log_config.read_io = broker.data.read_io;
    log_config.check().map_err(|e| invalid(e.to_string()))?;
    Ok(configs)
}

/// The keys whose values differ between `a` and `b`.
fn diff(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> BTreeSet<String> {
    a.keys()
        .chain(b.keys())
        .filter(|k| a.get(*k) != b.get(*k))
        .cloned()
        .collect()
}

/// Gives `topic` the config overrides `configs` (checked by the caller):
/// its description is saved, then its open logs take the settings (an
/// append in progress finishes first); remote storage turned off marks
/// the object store's copies for deletion.
pub(crate) async fn install_topic_configs(
    broker: &Arc<Broker>,
    topic: Arc<Topic>,
    configs: BTreeMap<String, String>,
) -> Result<(), String> {
    let flag = |c: &BTreeMap<String, String>, key: &str| {
        topic_def(key).is_some_and(|d| broker.config().topic_value(c, d) == "true")
    };
    let disabling_remote =
        flag(&topic.meta.configs, "remote.storage.enable") && !flag(&configs, "remote.storage.enable");
    let mut log_config = broker
        .config()
        .topic_log_config(&configs)
        .map_err(|e| e.to_string())?;
    log_config.read_io = broker.data.read_io;
    let data = Arc::clone(&broker.data);
    let altered = tokio::task::spawn_blocking(move || data.set_topic_configs(&topic, configs))
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()))?;
    let partitions = altered.partitions.clone();
    let topic_name = altered.meta.name.clone();
    let applied = tokio::task::spawn_blocking(move || {
        apply_to_open_logs(&topic_name, &partitions, &log_config, disabling_remote)
    })
    .await;
    if let Err(e) = applied {
        tracing::warn!(topic = %altered.meta.name, error = %e, "applying altered configs failed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(name: &str, op: i8, value: Option<&str>) -> ConfigChange {
        ConfigChange {
            name: name.into(),
            op,
            value: value.map(str::to_string),
        }
    }

    /// As a request's changes go: the common checks, then the topic's.
    fn apply(
        current: &[(&str, &str)],
        changes: &[ConfigChange],
    ) -> Result<Vec<(String, String)>, (i16, String)> {
        let current: BTreeMap<String, String> = current
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        check_changes(changes).map_err(|(e, m)| (e.code(), m))?;
        incremental(&current, changes, |key| {
            let d = topic_def(key).ok_or_else(|| unknown_key(key))?;
            Ok((
                d.kind,
                current.get(d.name).map_or(d.default, String::as_str).to_string(),
            ))
        })
        .map(|m| m.into_iter().collect())
        .map_err(|(e, m)| (e.code(), m))
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn set_delete_append_and_subtract_follow_kafka() {
        let got = apply(
            &[("retention.ms", "5"), ("segment.ms", "9")],
            &[
                change("retention.ms", ConfigChange::DELETE, None),
                change("segment.bytes", ConfigChange::SET, Some("20000")),
                // Appends to the default (delete) when not overridden.
                change("cleanup.policy", ConfigChange::APPEND, Some("compact,delete")),
            ],
        );
        assert_eq!(
            got,
            Ok(pairs(&[
                ("cleanup.policy", "delete,compact"),
                ("segment.bytes", "20000"),
                ("segment.ms", "9")
            ]))
        );
        let got = apply(
            &[("cleanup.policy", "delete,compact")],
            &[change("cleanup.policy", ConfigChange::SUBTRACT, Some("delete"))],
        );
        assert_eq!(got, Ok(pairs(&[("cleanup.policy", "compact")])));
    }

    #[test]
    fn refusals_carry_kafkas_errors() {
        let invalid_request = ResponseError::InvalidRequest.code();
        let invalid_config = ResponseError::InvalidConfig.code();
        let dup = apply(
            &[],
            &[
                change("retention.ms", ConfigChange::SET, Some("1")),
                change("retention.ms", ConfigChange::DELETE, None),
            ],
        );
        assert_eq!(dup.unwrap_err().0, invalid_request);
        let null = apply(&[], &[change("retention.ms", ConfigChange::SET, None)]).unwrap_err();
        assert_eq!(
            null,
            (
                invalid_request,
                "Null value not supported for : retention.ms".into()
            )
        );
        let not_list = apply(&[], &[change("retention.ms", ConfigChange::APPEND, Some("1"))]).unwrap_err();
        assert_eq!(not_list.0, invalid_config);
        assert!(not_list.1.contains("retention.ms"), "{not_list:?}");
        let unknown = apply(&[], &[change("no.such", ConfigChange::SUBTRACT, Some("1"))]).unwrap_err();
        assert_eq!(
            unknown,
            (invalid_config, "Unknown topic config name: no.such".into())
        );
        assert_eq!(
            apply(&[], &[change("retention.ms", 9, Some("1"))]).unwrap_err().0,
            invalid_request
        );
        assert_eq!(
            replacement(&[("a".into(), Some("1".into())), ("a".into(), Some("2".into()))])
                .unwrap_err()
                .0,
            ResponseError::InvalidRequest
        );
        assert_eq!(
            replacement(&[("a".into(), None)]).unwrap_err().0,
            ResponseError::InvalidRequest
        );
    }
}
