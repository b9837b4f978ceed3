//! The share group offsets APIs `kafka-share-groups` uses (KIP-932):
//! DescribeShareGroupOffsets (`--describe`), AlterShareGroupOffsets
//! (`--reset-offsets`) and DeleteShareGroupOffsets (`--delete-offsets`).
//! A share group's "offset" is each share partition's start offset.
//! Changes need an empty group (NON_EMPTY_GROUP otherwise), as in Kafka.

use keel_protocol::messages::alter_share_group_offsets_response::{
    AlterShareGroupOffsetsResponsePartition, AlterShareGroupOffsetsResponseTopic,
};
use keel_protocol::messages::delete_share_group_offsets_response::DeleteShareGroupOffsetsResponseTopic;
use keel_protocol::messages::describe_share_group_offsets_request::DescribeShareGroupOffsetsRequestGroup;
use keel_protocol::messages::describe_share_group_offsets_response::{
    DescribeShareGroupOffsetsResponseGroup, DescribeShareGroupOffsetsResponsePartition,
    DescribeShareGroupOffsetsResponseTopic,
};
use keel_protocol::messages::*;
use keel_protocol::ResponseError;
use uuid::Uuid;

use super::enabled;
use crate::handlers::str_bytes;
use crate::{Broker, ClientInfo};
use keel_auth::acl::{Operation, ResourceType};
use keel_coord::share;
use keel_protocol::share::ShareOffsetsAnswer;

/// Kafka's start offset of a share partition with no share state.
const UNINITIALIZED: i64 = -1;

/// Share partitions' lags, by group, topic name and partition.
type Lags = std::collections::BTreeMap<(String, String, i32), i64>;

fn may(broker: &Broker, client: &ClientInfo, op: Operation, kind: ResourceType, name: &str) -> bool {
    broker.authorized(client, op, kind, name)
}

/// DescribeShareGroupOffsets: each group's share partitions' start
/// offsets, all of them (topics null) or those named, and (v1) their lag;
/// a topic the client may not DESCRIBE is left out, as Kafka leaves it.
pub fn describe_offsets(
    broker: &Broker,
    client: &ClientInfo,
    req: DescribeShareGroupOffsetsRequest,
) -> ShareOffsetsAnswer {
    let mut lags = std::collections::BTreeMap::new();
    let groups = req
        .groups
        .into_iter()
        .map(|g| {
            let id = g.group_id.clone();
            let error = |e: ResponseError| {
                DescribeShareGroupOffsetsResponseGroup::default()
                    .with_group_id(id.clone())
                    .with_error_code(e.code())
            };
            if !enabled(broker) {
                error(ResponseError::UnsupportedVersion)
            } else if !may(
                broker,
                client,
                Operation::Describe,
                ResourceType::Group,
                &g.group_id,
            ) {
                error(ResponseError::GroupAuthorizationFailed)
            } else {
                describe_group(broker, client, g, &mut lags)
            }
        })
        .collect();
    ShareOffsetsAnswer {
        response: DescribeShareGroupOffsetsResponse::default().with_groups(groups),
        lags,
    }
}

/// One group's share partitions; their lags go into `lags`.
fn describe_group(
    broker: &Broker,
    client: &ClientInfo,
    g: DescribeShareGroupOffsetsRequestGroup,
    lags: &mut Lags,
) -> DescribeShareGroupOffsetsResponseGroup {
    let group = g.group_id.as_str();
    let out = DescribeShareGroupOffsetsResponseGroup::default().with_group_id(g.group_id.clone());
    let partition = |index: i32, start: i64, leader_epoch: i32| {
        DescribeShareGroupOffsetsResponsePartition::default()
            .with_partition_index(index)
            .with_start_offset(start)
            .with_leader_epoch(leader_epoch)
    };
    let named: Vec<(String, Vec<i32>)> = match g.topics {
        Some(topics) => topics
            .into_iter()
            .map(|t| (t.topic_name.to_string(), t.partitions))
            .collect(),
        None => {
            let Some(offsets) = broker.share.group_offsets(group) else {
                return out
                    .with_error_code(ResponseError::GroupIdNotFound.code())
                    .with_error_message(Some(str_bytes(format!("Group {group} not found."))));
            };
            let mut by_topic: std::collections::BTreeMap<String, Vec<i32>> = Default::default();
            for (id, p, _) in offsets {
                if let Some(t) = broker.data.topics.get_by_id(id) {
                    by_topic.entry(t.meta.name.clone()).or_default().push(p);
                }
            }
            by_topic.into_iter().collect()
        }
    };
    let topics = named
        .into_iter()
        .filter(|(name, _)| may(broker, client, Operation::Describe, ResourceType::Topic, name))
        .map(|(name, partitions)| {
            let topic = broker.data.topics.get(&name);
            let id = topic.as_ref().map_or(Uuid::nil(), |t| t.meta.topic_id);
            let partitions = partitions
                .into_iter()
                .map(|p| {
                    let state = topic
                        .as_ref()
                        .and_then(|_| broker.share.start_and_done(&share::key(group, id, p)));
                    let led = topic.as_ref().and_then(|t| broker.data.lead(t, p, -1).ok());
                    // Kafka's lag: the high watermark less the start offset
                    // and the records past it done with.
                    if let (Some((start, done)), Some((partition, _))) = (state, led.as_ref()) {
                        let lag = (partition.high_watermark() - start - done).max(0);
                        lags.insert((group.to_string(), name.clone(), p), lag);
                    }
                    let start = state.map_or(UNINITIALIZED, |(start, _)| start);
                    partition(p, start, led.map_or(-1, |(_, l)| l.epoch))
                })
                .collect();
            DescribeShareGroupOffsetsResponseTopic::default()
                .with_topic_name(TopicName(str_bytes(name)))
                .with_topic_id(id)
                .with_partitions(partitions)
        })
        .collect();
    out.with_topics(topics)
}

/// AlterShareGroupOffsets: new start offsets for an empty group's share
/// partitions.
pub async fn alter_offsets(
    broker: &Broker,
    client: &ClientInfo,
    req: AlterShareGroupOffsetsRequest,
) -> AlterShareGroupOffsetsResponse {
    let refused = |e: ResponseError, m: Option<String>| {
        AlterShareGroupOffsetsResponse::default()
            .with_error_code(e.code())
            .with_error_message(m.map(str_bytes))
    };
    if !enabled(broker) {
        return refused(ResponseError::UnsupportedVersion, None);
    }
    let group = req.group_id.to_string();
    if !may(broker, client, Operation::Read, ResourceType::Group, &group) {
        return refused(ResponseError::GroupAuthorizationFailed, None);
    }
    let mut offsets = Vec::new();
    let mut topics = Vec::with_capacity(req.topics.len());
    for t in &req.topics {
        let name = t.topic_name.as_str();
        let topic = broker.data.topics.get(name);
        let allowed = may(broker, client, Operation::Read, ResourceType::Topic, name);
        let mut parts = Vec::with_capacity(t.partitions.len());
        for p in &t.partitions {
            let error = match &topic {
                _ if !allowed => Some(ResponseError::TopicAuthorizationFailed),
                None => Some(ResponseError::UnknownTopicOrPartition),
                Some(topic) if topic.partition(p.partition_index).is_none() => {
                    Some(ResponseError::UnknownTopicOrPartition)
                }
                Some(topic) => {
                    offsets.push((topic.meta.topic_id, p.partition_index, p.start_offset.max(0)));
                    None
                }
            };
            parts.push(
                AlterShareGroupOffsetsResponsePartition::default()
                    .with_partition_index(p.partition_index)
                    .with_error_code(error.map_or(0, |e| e.code())),
            );
        }
        topics.push(
            AlterShareGroupOffsetsResponseTopic::default()
                .with_topic_name(t.topic_name.clone())
                .with_topic_id(topic.map_or(Uuid::nil(), |t| t.meta.topic_id))
                .with_partitions(parts),
        );
    }
    let write = match broker.share.reset_offsets(&group, &offsets) {
        Ok(w) => w,
        Err((e, m)) => return refused(e, Some(m)),
    };
    if let Err(e) = write.await {
        return refused(ResponseError::CoordinatorNotAvailable, Some(e.to_string()));
    }
    AlterShareGroupOffsetsResponse::default().with_responses(topics)
}

/// DeleteShareGroupOffsets: an empty group's share state for the named
/// topics goes.
pub async fn delete_offsets(
    broker: &Broker,
    client: &ClientInfo,
    req: DeleteShareGroupOffsetsRequest,
) -> DeleteShareGroupOffsetsResponse {
    let refused = |e: ResponseError, m: Option<String>| {
        DeleteShareGroupOffsetsResponse::default()
            .with_error_code(e.code())
            .with_error_message(m.map(str_bytes))
    };
    if !enabled(broker) {
        return refused(ResponseError::UnsupportedVersion, None);
    }
    let group = req.group_id.to_string();
    if !may(broker, client, Operation::Delete, ResourceType::Group, &group) {
        return refused(ResponseError::GroupAuthorizationFailed, None);
    }
    let mut ids = Vec::new();
    let mut topics = Vec::with_capacity(req.topics.len());
    for t in &req.topics {
        let name = t.topic_name.as_str();
        let topic = broker.data.topics.get(name);
        let error = if !may(broker, client, Operation::Read, ResourceType::Topic, name) {
            Some(ResponseError::TopicAuthorizationFailed)
        } else if let Some(topic) = &topic {
            ids.push(topic.meta.topic_id);
            None
        } else {
            Some(ResponseError::UnknownTopicOrPartition)
        };
        topics.push(
            DeleteShareGroupOffsetsResponseTopic::default()
                .with_topic_name(t.topic_name.clone())
                .with_topic_id(topic.map_or(Uuid::nil(), |t| t.meta.topic_id))
                .with_error_code(error.map_or(0, |e| e.code())),
        );
    }
    let write = match broker.share.delete_offsets(&group, &ids) {
        Ok(w) => w,
        Err((e, m)) => return refused(e, Some(m)),
    };
    if let Err(e) = write.await {
        return refused(ResponseError::CoordinatorNotAvailable, Some(e.to_string()));
    }
    DeleteShareGroupOffsetsResponse::default().with_responses(topics)
}
