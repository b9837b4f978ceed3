//! ConsumerGroupHeartbeat and ConsumerGroupDescribe: the consumer group
//! protocol (KIP-848) that Kafka 4.x clients use with
//! `group.protocol=consumer`. The requests' checks are Kafka's; the groups
//! are `keel_coord::groups::consumer`.

use keel_protocol::messages::consumer_group_describe_response::{
    Assignment as DescribedAssignment, DescribedGroup, Member as DescribedMember,
    TopicPartitions as DescribedPartitions,
};
use keel_protocol::messages::consumer_group_heartbeat_response::{Assignment, TopicPartitions};
use keel_protocol::messages::*;
use keel_protocol::ResponseError;
use uuid::Uuid;

use super::{str_bytes, topic_name};
use crate::Broker;
use keel_coord::groups::consumer::{self, Heartbeat, TopicInfo, Topics};
use keel_data::topics::base64_url;

/// Kafka's ConsumerGroupDescribe member types (v1): a classic-protocol
/// member the group hosts, and a consumer-protocol member.
const MEMBER_TYPE_CLASSIC: i8 = 0;
const MEMBER_TYPE_CONSUMER: i8 = 1;

/// The broker's topics as a group sees them.
pub(crate) fn topics(broker: &Broker) -> Topics {
    broker
        .data
        .topics
        .all()
        .iter()
        .map(|t| {
            let info = TopicInfo {
                id: t.meta.topic_id,
                partitions: t.meta.partitions,
            };
            (t.meta.name.clone(), info)
        })
        .collect()
}

/// Kafka's checks of a heartbeat's fields, in its order; the member id
/// (v0 members get one from the coordinator on joining).
fn check(req: &ConsumerGroupHeartbeatRequest, version: i16) -> Result<String, String> {
    if req.group_id.is_empty() {
        return Err("GroupId can't be empty.".into());
    }
    let joining = req.member_epoch == 0;
    let member_id = match req.member_id.as_str() {
        "" if joining && version == 0 => base64_url(Uuid::new_v4().as_bytes()),
        "" => return Err("MemberId can't be empty.".into()),
        id => id.to_string(),
    };
    if req.instance_id.as_ref().is_some_and(|i| i.is_empty()) {
        return Err("InstanceId can't be empty.".into());
    }
    if req.rack_id.as_ref().is_some_and(|r| r.is_empty()) {
        return Err("RackId can't be empty.".into());
    }
    if joining {
        if req.rebalance_timeout_ms == -1 {
            return Err("RebalanceTimeoutMs must be provided in first request.".into());
        }
        if req.topic_partitions.as_ref().is_none_or(|t| !t.is_empty()) {
            return Err("TopicPartitions must be empty when (re-)joining.".into());
        }
        if req.subscribed_topic_names.is_none() && req.subscribed_topic_regex.is_none() {
            return Err(
                "Either SubscribedTopicNames or SubscribedTopicRegex must be non-null when (re-)joining."
                    .into(),
            );
        }
    } else if req.member_epoch == consumer::STATIC_LEAVE_EPOCH && req.instance_id.is_none() {
        return Err("InstanceId can't be null.".into());
    } else if req.member_epoch < consumer::STATIC_LEAVE_EPOCH {
        return Err(format!(
            "MemberEpoch is {}, but must be greater than or equal to -2.",
            req.member_epoch
        ));
    }
    Ok(member_id)
}

pub async fn consumer_group_heartbeat(
    broker: &Broker,
    req: ConsumerGroupHeartbeatRequest,
    version: i16,
    client_id: &str,
    client_host: &str,
) -> ConsumerGroupHeartbeatResponse {
    let refuse = |error: ResponseError, message: Option<String>| {
        ConsumerGroupHeartbeatResponse::default()
            .with_error_code(error.code())
            .with_error_message(message.map(str_bytes))
            .with_member_id(None)
            .with_assignment(None)
    };
    let member_id = match check(&req, version) {
        Ok(id) => id,
        Err(message) => return refuse(ResponseError::InvalidRequest, Some(message)),
    };
    if let Some(pattern) = &req.subscribed_topic_regex {
        if regex::Regex::new(pattern.as_str()).is_err() {
            let message = format!(
                "SubscribedTopicRegex `{}` is not a valid regular expression.",
                pattern.as_str()
            );
            return refuse(ResponseError::InvalidRegularExpression, Some(message));
        }
    }
    let hb = Heartbeat {
        member_id,
        member_epoch: req.member_epoch,
        instance_id: req.instance_id.map(|s| s.to_string()),
        rack_id: req.rack_id.map(|s| s.to_string()),
        rebalance_timeout_ms: req.rebalance_timeout_ms,
        subscribed_names: req
            .subscribed_topic_names
            .map(|names| names.into_iter().map(|n| n.0.to_string()).collect()),
        subscribed_regex: req.subscribed_topic_regex.map(|s| s.to_string()),
        server_assignor: req.server_assignor.map(|s| s.to_string()),
        owned: req.topic_partitions.map(|owned| {
            let mut a = consumer::Assignment::new();
            for t in owned {
                a.entry(t.topic_id).or_default().extend(t.partitions);
            }
            a
        }),
        client_id: client_id.to_string(),
        client_host: client_host.to_string(),
        overrides: broker.group_configs.overrides(req.group_id.as_str()),
    };
    match broker
        .groups
        .consumer_heartbeat(req.group_id.as_str(), hb, &topics(broker))
        .await
    {
        Ok(answer) => {
            let assignment = answer.assignment.map(|a| {
                Assignment::default().with_topic_partitions(
                    a.into_iter()
                        .map(|(topic_id, partitions)| {
                            TopicPartitions::default()
                                .with_topic_id(topic_id)
                                .with_partitions(partitions.into_iter().collect())
                        })
                        .collect(),
                )
            });
            ConsumerGroupHeartbeatResponse::default()
                .with_error_message(None)
                .with_member_id(Some(str_bytes(answer.member_id)))
                .with_member_epoch(answer.member_epoch)
                .with_heartbeat_interval_ms(answer.heartbeat_interval_ms)
                .with_assignment(assignment)
        }
        Err((error, message)) => refuse(error, message),
    }
}

pub fn consumer_group_describe(
    broker: &Broker,
    req: ConsumerGroupDescribeRequest,
    version: i16,
) -> ConsumerGroupDescribeResponse {
    let names: std::collections::HashMap<Uuid, String> = topics(broker)
        .into_iter()
        .map(|(name, info)| (info.id, name))
        .collect();
    let described = |a: &consumer::Assignment| {
        DescribedAssignment::default().with_topic_partitions(
            a.iter()
                .map(|(id, partitions)| {
                    DescribedPartitions::default()
                        .with_topic_id(*id)
                        .with_topic_name(topic_name(names.get(id).map_or("", String::as_str)))
                        .with_partitions(partitions.iter().copied().collect())
                })
                .collect(),
        )
    };
    let groups = req
        .group_ids
        .iter()
        .map(|id| {
            let base = DescribedGroup::default()
                .with_group_id(id.clone())
                .with_authorized_operations(super::operations::if_asked(
                    req.include_authorized_operations,
                    super::operations::GROUP,
                ));
            if let Some(e) = broker.group_refused(id.as_str()) {
                return base.with_error_code(e.code());
            }
            let g = match broker.groups.describe_consumer(id.as_str()) {
                Ok(g) => g,
                Err((error, message)) => {
                    return base
                        .with_error_code(error.code())
                        .with_error_message(Some(str_bytes(message)))
                }
            };
            let empty = consumer::Assignment::new();
            let members = g
                .members
                .values()
                .map(|m| {
                    let member = DescribedMember::default()
                        .with_member_id(str_bytes(m.id.clone()))
                        .with_instance_id(m.instance_id.clone().map(str_bytes))
                        .with_rack_id(m.rack_id.clone().map(str_bytes))
                        .with_member_epoch(m.epoch)
                        .with_client_id(str_bytes(m.client_id.clone()))
                        .with_client_host(str_bytes(m.client_host.clone()))
                        .with_subscribed_topic_names(
                            m.subscribed_names.iter().map(|n| topic_name(n)).collect(),
                        )
                        // Kafka describes "no pattern" as an empty one.
                        .with_subscribed_topic_regex(Some(str_bytes(
                            m.subscribed_regex.clone().unwrap_or_default(),
                        )))
                        .with_assignment(described(&m.assigned))
                        .with_target_assignment(described(g.target.get(&m.id).unwrap_or(&empty)));
                    if version >= 1 {
                        member.with_member_type(if m.classic.is_some() {
                            MEMBER_TYPE_CLASSIC
                        } else {
                            MEMBER_TYPE_CONSUMER
                        })
                    } else {
                        member
                    }
                })
                .collect();
            base.with_group_state(str_bytes(g.state().name()))
                .with_group_epoch(g.epoch)
                .with_assignment_epoch(g.assignment_epoch)
                .with_assignor_name(str_bytes(g.assignor.name()))
                .with_members(members)
        })
        .collect();
    ConsumerGroupDescribeResponse::default().with_groups(groups)
}
