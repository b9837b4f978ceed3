//! Metadata (with topic auto-creation) and DescribeCluster.

use std::collections::BTreeMap;
use std::sync::Arc;

use keel_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use keel_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use keel_protocol::messages::*;
use keel_protocol::ResponseError;
use uuid::Uuid;

use super::{operations, str_bytes, topic_name};
use crate::Broker;
use keel_data::topics::Topic;

/// Kafka's DescribeCluster endpoint type of brokers (KIP-919).
const ENDPOINT_TYPE_BROKER: i8 = 1;

/// Answers Metadata with the address of the listener the client came in on.
pub async fn metadata(
    broker: &Arc<Broker>,
    req: MetadataRequest,
    version: i16,
    listener: &str,
) -> MetadataResponse {
    // v0 sends an empty list to mean "all topics"; later versions send null.
    // (The dispatcher turns v0's empty list, every topic, into `None`.)
    let all = req.topics.is_none();
    let topics = if all {
        broker
            .data
            .topics
            .all()
            .iter()
            .map(|t| describe_topic(broker, t))
            .collect()
    } else {
        let allow_create =
            broker.config().auto_create_topics() && (version < 4 || req.allow_auto_topic_creation);
        let mut out = Vec::new();
        for t in req.topics.unwrap_or_default() {
            out.push(requested_topic(broker, t, allow_create).await);
        }
        out
    };
    let brokers = live_brokers(broker, listener)
        .into_iter()
        .map(|b| {
            MetadataResponseBroker::default()
                .with_node_id(BrokerId(b.node_id))
                .with_host(str_bytes(b.host))
                .with_port(b.port)
                .with_rack(b.rack.map(str_bytes))
        })
        .collect();
    let mut resp = MetadataResponse::default()
        .with_brokers(brokers)
        .with_cluster_id(Some(str_bytes(&*broker.data.cluster_id)))
        .with_controller_id(controller_id(broker))
        .with_topics(topics)
        .with_cluster_authorized_operations(if req.include_cluster_authorized_operations {
            operations::CLUSTER
        } else {
            operations::OMITTED
        });
    if req.include_topic_authorized_operations {
        for t in &mut resp.topics {
            t.topic_authorized_operations = operations::TOPIC;
        }
    }
    resp
}

async fn requested_topic(
    broker: &Arc<Broker>,
    t: metadata_request::MetadataRequestTopic,
    allow_create: bool,
) -> MetadataResponseTopic {
    let Some(name) = t.name.as_ref().map(|n| n.0.as_str().to_string()) else {
        return match broker.data.topics.get_by_id(t.topic_id) {
            Some(topic) => describe_topic(broker, &topic),
            None => error_topic(None, t.topic_id, ResponseError::UnknownTopicId),
        };
    };
    if let Some(topic) = broker.data.topics.get(&name) {
        return describe_topic(broker, &topic);
    }
    if !allow_create {
        return error_topic(Some(&name), Uuid::nil(), ResponseError::UnknownTopicOrPartition);
    }
    let partitions = broker.config().default_partitions();
    match super::admin::create_topic(broker, &name, partitions, BTreeMap::new(), None, false).await {
        Ok(_) | Err((ResponseError::TopicAlreadyExists, _)) => match broker.data.topics.get(&name) {
            Some(topic) => describe_topic(broker, &topic),
            None => error_topic(Some(&name), Uuid::nil(), ResponseError::UnknownTopicOrPartition),
        },
        Err((error, message)) => {
            tracing::warn!(topic = %name, %message, "auto-creation refused");
            error_topic(Some(&name), Uuid::nil(), error)
        }
    }
}

/// A live broker as clients of one listener reach it.
struct LiveBroker {
    node_id: i32,
    host: String,
    port: i32,
    rack: Option<String>,
}

/// The live brokers, by node id, at their endpoints for `listener`. A
/// broker without that listener is left out, as Kafka leaves it out; this
/// broker is always in (at its first listener's address for a listener it
/// does not know).
fn live_brokers(broker: &Broker, listener: &str) -> Vec<LiveBroker> {
    let me = broker.cluster.me().node_id;
    broker
        .cluster
        .members()
        .into_iter()
        .filter_map(|m| {
            let r = m.registration;
            let (host, port) = if r.node_id == me {
                let (host, port) = broker.endpoint(listener);
                (host.to_string(), port)
            } else {
                let e = r.endpoint(listener)?;
                (e.host.clone(), e.port)
            };
            Some(LiveBroker {
                node_id: r.node_id,
                host,
                port,
                rack: r.rack,
            })
        })
        .collect()
}

/// The elected controller, -1 while there is none (as Kafka answers).
fn controller_id(broker: &Broker) -> BrokerId {
    BrokerId(broker.cluster.controller().map_or(-1, |c| c.node_id))
}

/// A partition's leader and epoch as Metadata gives them: while no broker
/// leads it, LEADER_NOT_AVAILABLE and -1, as Kafka answers.
fn leader_of(broker: &Broker, topic: &Topic, index: i32) -> (i16, BrokerId, i32) {
    match broker.data.leader(topic, index) {
        Some(l) => (0, BrokerId(l.node_id), l.epoch),
        None => (ResponseError::LeaderNotAvailable.code(), BrokerId(-1), -1),
    }
}

fn replica_ids(broker: &Broker, topic: &Topic, index: i32) -> Vec<BrokerId> {
    broker
        .data
        .replicas(topic, index)
        .into_iter()
        .map(BrokerId)
        .collect()
}

fn error_topic(name: Option<&str>, id: Uuid, error: ResponseError) -> MetadataResponseTopic {
    MetadataResponseTopic::default()
        .with_error_code(error.code())
        .with_name(name.map(topic_name))
        .with_topic_id(id)
        .with_topic_authorized_operations(operations::OMITTED)
}

fn describe_topic(broker: &Broker, topic: &Topic) -> MetadataResponseTopic {
    let partitions = topic
        .partitions
        .iter()
        .map(|p| {
            let (error, leader, epoch) = leader_of(broker, topic, p.index);
            let replicas = replica_ids(broker, topic, p.index);
            MetadataResponsePartition::default()
                .with_error_code(error)
                .with_partition_index(p.index)
                .with_leader_id(leader)
                .with_leader_epoch(epoch)
                .with_replica_nodes(replicas.clone())
                .with_isr_nodes(replicas)
        })
        .collect();
    MetadataResponseTopic::default()
        .with_name(Some(topic_name(&topic.meta.name)))
        .with_topic_id(topic.meta.topic_id)
        .with_is_internal(broker.topics_shared() && crate::broker::catalog::is_internal(&topic.meta.name))
        .with_partitions(partitions)
        .with_topic_authorized_operations(operations::OMITTED)
}

pub fn describe_cluster(
    broker: &Broker,
    req: DescribeClusterRequest,
    listener: &str,
) -> DescribeClusterResponse {
    if req.endpoint_type != ENDPOINT_TYPE_BROKER {
        return DescribeClusterResponse::default()
            .with_endpoint_type(req.endpoint_type)
            .with_error_code(ResponseError::UnsupportedEndpointType.code())
            .with_error_message(Some(str_bytes(format!(
                "endpoint type {} is not served by a broker; ask for brokers (1)",
                req.endpoint_type
            ))))
            .with_cluster_id(str_bytes(&*broker.data.cluster_id))
            .with_cluster_authorized_operations(operations::OMITTED);
    }
    let operations = if req.include_cluster_authorized_operations {
        operations::CLUSTER
    } else {
        operations::OMITTED
    };
    DescribeClusterResponse::default()
        .with_endpoint_type(req.endpoint_type)
        .with_cluster_id(str_bytes(&*broker.data.cluster_id))
        .with_controller_id(controller_id(broker))
        .with_brokers(
            live_brokers(broker, listener)
                .into_iter()
                .map(|b| {
                    DescribeClusterBroker::default()
                        .with_broker_id(BrokerId(b.node_id))
                        .with_host(str_bytes(b.host))
                        .with_port(b.port)
                        .with_rack(b.rack.map(str_bytes))
                })
                .collect(),
        )
        .with_cluster_authorized_operations(operations)
}

/// DescribeTopicPartitions (KIP-966), which Kafka 4.x's Admin client uses
/// to describe topics (`kafka-topics --describe`): the topics by name (all
/// of them when none is named), in name order, their partitions paged by
/// `response_partition_limit` (at most `max.request.partition.size.limit`)
/// with a cursor to continue from. A cursor outside the named topics is
/// INVALID_REQUEST on every topic (the response has no error of its own).
/// `may_describe(topic, listing)` says whether the client may see a topic:
/// a listing of every topic leaves out those it may not, a named one is
/// answered TOPIC_AUTHORIZATION_FAILED.
pub fn describe_topic_partitions(
    broker: &Broker,
    req: DescribeTopicPartitionsRequest,
    may_describe: &dyn Fn(&str, bool) -> bool,
) -> DescribeTopicPartitionsResponse {
    use describe_topic_partitions_response::DescribeTopicPartitionsResponseTopic;
    let named: Vec<_> = req.topics.iter().map(|t| t.name.clone()).collect();
    paged_topic_partitions(broker, req, may_describe).unwrap_or_else(|(error, message)| {
        tracing::debug!(%message, "DescribeTopicPartitions refused");
        DescribeTopicPartitionsResponse::default().with_topics(
            named
                .into_iter()
                .map(|name| {
                    DescribeTopicPartitionsResponseTopic::default()
                        .with_error_code(error.code())
                        .with_name(Some(name))
                        .with_topic_authorized_operations(operations::OMITTED)
                })
                .collect(),
        )
    })
}

/// The topics a DescribeTopicPartitions asks for, sorted: those named, or
/// every topic the client may describe.
fn requested_names(
    broker: &Broker,
    req: &DescribeTopicPartitionsRequest,
    may_describe: &dyn Fn(&str, bool) -> bool,
) -> Vec<String> {
    let mut names: Vec<String> = if req.topics.is_empty() {
        broker
            .data
            .topics
            .all()
            .iter()
            .filter(|t| !t.meta.deleting && may_describe(&t.meta.name, true))
            .map(|t| t.meta.name.clone())
            .collect()
    } else {
        req.topics.iter().map(|t| t.name.0.to_string()).collect()
    };
    names.sort();
    names.dedup();
    names
}

/// Where the page starts: the cursor's topic and partition, checked as
/// Kafka checks them.
fn cursor_start(
    req: &DescribeTopicPartitionsRequest,
    names: &[String],
) -> Result<(Option<String>, i32), (ResponseError, String)> {
    let Some(c) = &req.cursor else {
        return Ok((None, 0));
    };
    let topic = c.topic_name.0.to_string();
    if !req.topics.is_empty() && !names.contains(&topic) {
        return Err((
            ResponseError::InvalidRequest,
            format!("the topic list does not contain the cursor's topic {topic}"),
        ));
    }
    if c.partition_index < 0 {
        return Err((
            ResponseError::InvalidRequest,
            format!("the cursor's partition {} is negative", c.partition_index),
        ));
    }
    Ok((Some(topic), c.partition_index))
}

fn describe_partition(
    broker: &Broker,
    topic: &Topic,
    index: i32,
) -> describe_topic_partitions_response::DescribeTopicPartitionsResponsePartition {
    let (error, leader, epoch) = leader_of(broker, topic, index);
    let replicas = replica_ids(broker, topic, index);
    describe_topic_partitions_response::DescribeTopicPartitionsResponsePartition::default()
        .with_error_code(error)
        .with_partition_index(index)
        .with_leader_id(leader)
        .with_leader_epoch(epoch)
        .with_replica_nodes(replicas.clone())
        .with_isr_nodes(replicas)
        .with_eligible_leader_replicas(Some(Vec::new()))
        .with_last_known_elr(Some(Vec::new()))
}

fn paged_topic_partitions(
    broker: &Broker,
    req: DescribeTopicPartitionsRequest,
    may_describe: &dyn Fn(&str, bool) -> bool,
) -> Result<DescribeTopicPartitionsResponse, (ResponseError, String)> {
    use describe_topic_partitions_response::{Cursor, DescribeTopicPartitionsResponseTopic};
    let cap = broker.config().num("max.request.partition.size.limit").max(1);
    let mut budget = i64::from(req.response_partition_limit).clamp(1, cap);
    let names = requested_names(broker, &req, may_describe);
    let (first_topic, first_partition) = cursor_start(&req, &names)?;
    let mut topics = Vec::new();
    let mut next_cursor = None;
    for name in names
        .into_iter()
        .filter(|n| first_topic.as_ref().is_none_or(|f| n >= f))
    {
        if budget == 0 {
            next_cursor = Some(Cursor::default().with_topic_name(topic_name(&name)));
            break;
        }
        if !req.topics.is_empty() && !may_describe(&name, false) {
            topics.push(
                DescribeTopicPartitionsResponseTopic::default()
                    .with_error_code(ResponseError::TopicAuthorizationFailed.code())
                    .with_name(Some(topic_name(&name)))
                    .with_topic_authorized_operations(operations::OMITTED),
            );
            continue;
        }
        let Some(topic) = broker.data.topics.get(&name).filter(|t| !t.meta.deleting) else {
            topics.push(
                DescribeTopicPartitionsResponseTopic::default()
                    .with_error_code(ResponseError::UnknownTopicOrPartition.code())
                    .with_name(Some(topic_name(&name)))
                    .with_topic_authorized_operations(operations::TOPIC),
            );
            continue;
        };
        let from = if first_topic.as_deref() == Some(name.as_str()) {
            first_partition
        } else {
            0
        };
        let mut partitions = Vec::new();
        for p in topic.partitions.iter().filter(|p| p.index >= from) {
            if budget == 0 {
                next_cursor = Some(
                    Cursor::default()
                        .with_topic_name(topic_name(&name))
                        .with_partition_index(p.index),
                );
                break;
            }
            budget -= 1;
            partitions.push(describe_partition(broker, &topic, p.index));
        }
        topics.push(
            DescribeTopicPartitionsResponseTopic::default()
                .with_name(Some(topic_name(&name)))
                .with_topic_id(topic.meta.topic_id)
                .with_partitions(partitions)
                .with_topic_authorized_operations(operations::TOPIC),
        );
        if next_cursor.is_some() {
            break;
        }
    }
    Ok(DescribeTopicPartitionsResponse::default()
        .with_topics(topics)
        .with_next_cursor(next_cursor))
}
