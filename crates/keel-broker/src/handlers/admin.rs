//! CreateTopics, DeleteTopics, CreatePartitions, and the topic creation
//! that Metadata's auto-creation shares.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use keel_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use keel_protocol::messages::create_topics_response::{CreatableTopicConfigs, CreatableTopicResult};
use keel_protocol::messages::delete_topics_response::DeletableTopicResult;
use keel_protocol::messages::*;
use keel_protocol::ResponseError;
use keel_protocol::StrBytes;
use uuid::Uuid;

use super::{str_bytes, topic_name};
use crate::broker::catalog;
use crate::quotas::Mutations;
use crate::Broker;
use keel_cluster::topics::ClusterTopic;
use keel_config::TOPIC_CONFIGS;
use keel_data::topics::{validate_topic_name, Topic, TopicMeta};
use keel_log::clock::now_ms;

/// A refused admin operation: Kafka error and a message for the operator.
pub(crate) type AdminError = (ResponseError, String);

/// Creates a topic (or, with `validate_only`, checks that it could be):
/// in a cluster, in the cluster's metadata, its partitions on the brokers
/// `assignment` names or else on the least loaded ones.
pub(crate) async fn create_topic(
    broker: &Arc<Broker>,
    name: &str,
    partitions: i32,
    configs: BTreeMap<String, String>,
    assignment: Option<Vec<i32>>,
    validate_only: bool,
) -> Result<TopicMeta, AdminError> {
    validate_topic_name(name).map_err(|e| (ResponseError::InvalidTopicException, e.to_string()))?;
    if !(1..=100_000).contains(&partitions) {
        return Err((
            ResponseError::InvalidPartitions,
            format!("{partitions} partitions is not allowed"),
        ));
    }
    broker
        .config()
        .check_topic_overrides(&configs)
        .map_err(|e| (ResponseError::InvalidConfig, e.to_string()))?;
    let _admin = broker.admin.lock().await;
    let exists = if broker.topics_shared() {
        broker.cluster.topic(name).is_some()
    } else {
        broker.data.topics.get(name).is_some()
    };
    if exists {
        return Err(already_exists(name));
    }
    let meta = TopicMeta {
        version: 1,
        name: name.to_string(),
        topic_id: Uuid::new_v4(),
        partitions,
        configs,
        deleting: false,
    };
    if broker.topics_shared() {
        if catalog::is_internal(name) {
            return Err((
                ResponseError::InvalidRequest,
                format!("Creation of internal topic {name} is prohibited."),
            ));
        }
        let count = usize::try_from(partitions).unwrap_or(0);
        let placed = catalog::placement(broker, count, assignment.as_deref())?;
        if validate_only {
            return Ok(meta);
        }
        let topic = ClusterTopic {
            version: 1,
            name: meta.name.clone(),
            topic_id: meta.topic_id,
            configs: meta.configs.clone(),
            partitions: placed,
        };
        catalog::check_size(&topic)?;
        let revision = broker
            .cluster
            .create_topic(&topic)
            .await
            .map_err(catalog::store_error)?
            .ok_or_else(|| already_exists(name))?;
        catalog::settle_locked(broker, revision).await?;
        let leaders: Vec<i32> = topic.partitions.iter().map(|p| p.leader).collect();
        tracing::info!(
            topic = name,
            partitions,
            ?leaders,
            revision,
            "created topic in the cluster"
        );
        return Ok(meta);
    }
    if validate_only {
        return Ok(meta);
    }
    let data = Arc::clone(&broker.data);
    let m = meta.clone();
    blocking(move || data.create_topic(m)).await?;
    tracing::info!(topic = name, partitions, "created topic");
    Ok(meta)
}

fn already_exists(name: &str) -> AdminError {
    (
        ResponseError::TopicAlreadyExists,
        format!("topic `{name}` already exists"),
    )
}

/// Runs a data-plane change of a topic on a blocking thread; a failure is
/// KAFKA_STORAGE_ERROR.
pub(crate) async fn blocking<T: Send + 'static, E: std::fmt::Display + Send + 'static>(
    change: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, AdminError> {
    tokio::task::spawn_blocking(change)
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()))
        .map_err(|e| (ResponseError::KafkaStorageError, e))
}

/// A topic refused by `controller_mutation_rate`, with Kafka's error and,
/// as Kafka answers it, no message.
fn throttled() -> AdminError {
    (ResponseError::ThrottlingQuotaExceeded, String::new())
}

/// A refusal's message for the response: none if empty.
fn message_of(message: String) -> Option<StrBytes> {
    (!message.is_empty()).then(|| str_bytes(message))
}

pub async fn create_topics(
    broker: &Arc<Broker>,
    req: CreateTopicsRequest,
    version: i16,
    quota: &mut Mutations<'_>,
) -> CreateTopicsResponse {
    let mut results = Vec::new();
    // A name given more than once is refused once, and not created (Kafka).
    let mut entries: BTreeMap<&str, usize> = BTreeMap::new();
    for t in &req.topics {
        *entries.entry(t.name.0.as_str()).or_default() += 1;
    }
    let repeated: BTreeSet<String> = entries
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(name, _)| name.to_string())
        .collect();
    let mut refused_repeats = BTreeSet::new();
    for t in req.topics {
        let name = t.name.0.as_str().to_string();
        // Kafka answers a created topic with a null message.
        let mut result = CreatableTopicResult::default()
            .with_name(t.name.clone())
            .with_error_message(None);
        let outcome = if repeated.contains(&name) {
            if !refused_repeats.insert(name.clone()) {
                continue;
            }
            Err((
                ResponseError::InvalidRequest,
                "Found multiple entries for this topic.".to_string(),
            ))
        } else {
            topic_request(broker, &t)
        };
        let outcome = match outcome {
            // Counted only where partitions are created (not under
            // validate_only).
            Ok(asked) if !req.validate_only && !quota.admit(asked.partitions, now_ms()) => Err(throttled()),
            Ok(asked) => {
                create_topic(
                    broker,
                    &name,
                    asked.partitions,
                    asked.configs,
                    asked.assignment,
                    req.validate_only,
                )
                .await
            }
            Err(e) => Err(e),
        };
        match outcome {
            Ok(meta) => {
                // Only a created topic has an id.
                if !req.validate_only {
                    result.topic_id = meta.topic_id;
                }
                result.num_partitions = meta.partitions;
                result.replication_factor = 1;
                if version >= 5 {
                    result.configs = Some(effective_configs(broker, &meta.configs));
                }
            }
            Err((error, message)) => {
                result.error_code = error.code();
                result.error_message = message_of(message);
                result.num_partitions = -1;
                result.replication_factor = -1;
            }
        }
        results.push(result);
    }
    CreateTopicsResponse::default().with_topics(results)
}

/// What one CreateTopics entry asks for.
struct TopicAsked {
    partitions: i32,
    configs: BTreeMap<String, String>,
    /// The broker of each partition, where the request names them.
    assignment: Option<Vec<i32>>,
}

/// Partition count, configs and placement of one CreateTopics entry, with
/// Kafka's defaults (-1) resolved. A partition's records are on one broker
/// (in a cluster, the object store is their durable copy), so an
/// assignment names one broker per partition: this one alone, or, in a
/// cluster, any live one (checked when the topic is placed).
fn topic_request(
    broker: &Broker,
    t: &create_topics_request::CreatableTopic,
) -> Result<TopicAsked, AdminError> {
    let node = broker.config().node_id();
    let mut assignment = None;
    if !t.assignments.is_empty() {
        if t.num_partitions != -1 || t.replication_factor != -1 {
            return Err((
                ResponseError::InvalidRequest,
                "assignments given with a partition count or replication factor".into(),
            ));
        }
        if let Some(a) = t.assignments.iter().find(|a| a.broker_ids.len() > 1) {
            return Err((
                ResponseError::InvalidReplicationFactor,
                format!(
                    "partition {} is assigned {} brokers; a partition's records are on one broker",
                    a.partition_index,
                    a.broker_ids.len()
                ),
            ));
        }
        let mut nodes: Vec<(i32, i32)> = t
            .assignments
            .iter()
            .map(|a| (a.partition_index, a.broker_ids.first().map_or(-1, |b| b.0)))
            .collect();
        nodes.sort_unstable();
        if nodes
            .iter()
            .enumerate()
            .any(|(i, (p, _))| usize::try_from(*p).ok() != Some(i))
        {
            return Err((
                ResponseError::InvalidReplicaAssignment,
                "partitions must be assigned 0, 1, 2, ... once each".into(),
            ));
        }
        let nodes: Vec<i32> = nodes.into_iter().map(|(_, n)| n).collect();
        if !broker.topics_shared() && nodes.iter().any(|n| *n != node) {
            return Err((
                ResponseError::InvalidReplicaAssignment,
                format!("this cluster has only broker {node}"),
            ));
        }
        assignment = Some(nodes);
    }
    if !matches!(t.replication_factor, -1 | 1) {
        return Err((
            ResponseError::InvalidReplicationFactor,
            format!(
                "replication factor {} is larger than the 1 available broker",
                t.replication_factor
            ),
        ));
    }
    let partitions = match (t.num_partitions, t.assignments.len()) {
        (-1, 0) => broker.config().default_partitions(),
        (-1, n) => i32::try_from(n).unwrap_or(i32::MAX),
        (n, _) => n,
    };
    let nulls: Vec<&str> = t
        .configs
        .iter()
        .filter(|c| c.value.is_none())
        .map(|c| c.name.as_str())
        .collect();
    if !nulls.is_empty() {
        return Err((
            ResponseError::InvalidConfig,
            format!("Null value not supported for topic configs: {}", nulls.join(",")),
        ));
    }
    let configs = t
        .configs
        .iter()
        .filter_map(|c| Some((c.name.to_string(), c.value.as_ref()?.to_string())))
        .collect();
    Ok(TopicAsked {
        partitions,
        configs,
        assignment,
    })
}

fn effective_configs(broker: &Broker, overrides: &BTreeMap<String, String>) -> Vec<CreatableTopicConfigs> {
    TOPIC_CONFIGS
        .iter()
        .map(|d| {
            let source = if overrides.contains_key(d.name) { 1 } else { 5 };
            CreatableTopicConfigs::default()
                .with_name(str_bytes(d.name))
                .with_value(Some(str_bytes(broker.config().topic_value(overrides, d))))
                .with_config_source(source)
        })
        .collect()
}

pub async fn delete_topics(
    broker: &Arc<Broker>,
    req: DeleteTopicsRequest,
    quota: &mut Mutations<'_>,
) -> DeleteTopicsResponse {
    let mut targets: Vec<(Option<String>, Uuid)> = req
        .topic_names
        .iter()
        .map(|n| (Some(n.0.as_str().to_string()), Uuid::nil()))
        .collect();
    targets.extend(
        req.topics
            .iter()
            .map(|t| (t.name.as_ref().map(|n| n.0.as_str().to_string()), t.topic_id)),
    );
    let mut responses = Vec::new();
    for (name, id) in targets {
        let mut r = DeletableTopicResult::default()
            .with_name(name.as_deref().map(topic_name))
            .with_topic_id(id);
        let topic = match &name {
            Some(n) => broker.data.topics.get(n),
            None => broker.data.topics.get_by_id(id),
        };
        match topic {
            Some(t) => {
                r.name = Some(topic_name(&t.meta.name));
                r.topic_id = t.meta.topic_id;
                let outcome = if quota.admit(t.meta.partitions, now_ms()) {
                    delete_topic(broker, t).await
                } else {
                    Err(throttled())
                };
                if let Err((error, message)) = outcome {
                    r.error_code = error.code();
                    r.error_message = message_of(message);
                }
            }
            None => {
                let error = if name.is_some() {
                    ResponseError::UnknownTopicOrPartition
                } else {
                    ResponseError::UnknownTopicId
                };
                r.error_code = error.code();
            }
        }
        responses.push(r);
    }
    DeleteTopicsResponse::default().with_responses(responses)
}

/// Deletes a topic from the data plane (`DataPlane::delete_topic`: durably,
/// so that nothing of it can touch a topic created after it under the same
/// name), then its copies in colder tiers and every group's committed
/// offsets of it, as Kafka does.
async fn delete_topic(broker: &Arc<Broker>, topic: Arc<Topic>) -> Result<(), AdminError> {
    internal_refused(broker, &topic.meta.name, "deleted")?;
    if broker.config().get("delete.topic.enable") != "true" {
        return Err((
            ResponseError::TopicDeletionDisabled,
            "delete.topic.enable is false".into(),
        ));
    }
    let _admin = broker.admin.lock().await;
    // Another deletion (and maybe a creation under the same name) may have
    // run while this one waited for the lock: only this incarnation goes.
    let deleted_meanwhile = || {
        (
            ResponseError::UnknownTopicOrPartition,
            format!("topic `{}` was deleted meanwhile", topic.meta.name),
        )
    };
    if broker.topics_shared() {
        // Every broker (this one too) deletes its copy when it sees the
        // cluster's topic go.
        return catalog::delete_topic_locked(broker, &topic.meta.name, topic.meta.topic_id).await;
    }
    let current = broker.data.topics.get(&topic.meta.name);
    if current.is_none_or(|t| t.meta.topic_id != topic.meta.topic_id) {
        return Err(deleted_meanwhile());
    }
    remove_topic(broker, topic).await
}

/// Deletes a topic from this broker's data plane (see `delete_topic`).
/// The caller holds `broker.admin`.
pub(crate) async fn remove_topic(broker: &Arc<Broker>, topic: Arc<Topic>) -> Result<(), AdminError> {
    let data = Arc::clone(&broker.data);
    let t = Arc::clone(&topic);
    let tiered = blocking(move || data.delete_topic(&t)).await?;
    if !tiered.is_empty() {
        let b = Arc::clone(broker);
        let name = topic.meta.name.clone();
        tokio::spawn(async move {
            for segment in &tiered {
                if let Err(e) = b.data.tiers.delete(segment).await {
                    tracing::warn!(topic = %name, object = %segment.object, error = %e, "could not delete a colder copy of a deleted topic");
                }
            }
        });
    }
    match broker.groups.remove_topic_offsets(&topic.meta.name).await {
        Ok(0) => {}
        Ok(n) => {
            tracing::info!(topic = %topic.meta.name, offsets = n, "removed committed offsets of a deleted topic")
        }
        Err(e) => {
            tracing::warn!(topic = %topic.meta.name, error = %e, "cannot remove committed offsets of a deleted topic")
        }
    }
    tracing::info!(topic = %topic.meta.name, "deleted topic");
    Ok(())
}

/// In a cluster the group log's topic (`__consumer_offsets`) is the
/// coordinator's: clients read it, but may not write, delete, grow or
/// truncate it (a group's partition is where its records are).
pub(crate) fn internal_refused(broker: &Broker, name: &str, what: &str) -> Result<(), AdminError> {
    if broker.topics_shared() && catalog::is_internal(name) {
        return Err((
            ResponseError::InvalidTopicException,
            format!("internal topic {name} cannot be {what}"),
        ));
    }
    Ok(())
}

pub async fn create_partitions(
    broker: &Arc<Broker>,
    req: CreatePartitionsRequest,
    quota: &mut Mutations<'_>,
) -> CreatePartitionsResponse {
    let mut results = Vec::new();
    for t in req.topics {
        let mut r = CreatePartitionsTopicResult::default().with_name(t.name.clone());
        let grown = grow_topic(broker, t.name.0.as_str(), t.count, req.validate_only, quota).await;
        if let Err((error, message)) = grown {
            r.error_code = error.code();
            r.error_message = message_of(message);
        }
        results.push(r);
    }
    CreatePartitionsResponse::default().with_results(results)
}

async fn grow_topic(
    broker: &Arc<Broker>,
    name: &str,
    count: i32,
    validate_only: bool,
    quota: &mut Mutations<'_>,
) -> Result<(), AdminError> {
    internal_refused(broker, name, "grown")?;
    let _admin = broker.admin.lock().await;
    let topic = broker.data.topics.get(name).ok_or((
        ResponseError::UnknownTopicOrPartition,
        format!("topic `{name}` does not exist"),
    ))?;
    let increase = |current: i32| {
        if count <= current || count > 100_000 {
            return Err((
                ResponseError::InvalidPartitions,
                format!("topic has {current} partitions; {count} is not an increase"),
            ));
        }
        Ok(usize::try_from(count - current).unwrap_or(0))
    };
    let current = topic.meta.partitions;
    increase(current)?;
    if validate_only {
        return Ok(());
    }
    if !quota.admit(count - current, now_ms()) {
        return Err(throttled());
    }
    if broker.topics_shared() {
        return catalog::update_topic_locked(broker, name, |t| {
            let mut grown = t.clone();
            grown
                .partitions
                .extend(catalog::placement(broker, increase(t.partition_count())?, None)?);
            Ok(grown)
        })
        .await;
    }
    let data = Arc::clone(&broker.data);
    blocking(move || data.grow_topic(&topic, count)).await?;
    Ok(())
}
