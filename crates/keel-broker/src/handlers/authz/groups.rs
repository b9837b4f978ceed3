//! The group APIs' checks: READ on a group to join it or commit its
//! offsets (with READ on the topics), DESCRIBE to find, fetch or describe
//! it, DELETE to delete it or its offsets. A group's offsets and
//! assignments show only the topics the client may DESCRIBE.

use keel_protocol::messages::*;
use keel_protocol::ResponseError;

use super::{str_bytes, topic_name, TOPIC_DENIED};
use crate::{Broker, ClientInfo};
use keel_auth::acl::{Operation, ResourceType};

const GROUP_DENIED: ResponseError = ResponseError::GroupAuthorizationFailed;

/// The group a group API names: READ on it (DESCRIBE for OffsetFetch and
/// FindCoordinator).
pub fn group(broker: &Broker, client: &ClientInfo, group: &str, operation: Operation) -> bool {
    broker.authorized(client, operation, ResourceType::Group, group)
}

/// OffsetCommit: READ on each topic (the group is checked by the caller).
pub fn offset_commit_topics(
    broker: &Broker,
    client: &ClientInfo,
    req: &mut OffsetCommitRequest,
) -> Vec<offset_commit_response::OffsetCommitResponseTopic> {
    if !broker.authorizer.enabled {
        return Vec::new();
    }
    let mut denied = Vec::new();
    req.topics.retain(|t| {
        let name = topic_name(broker, &t.name, t.topic_id);
        if broker.authorized(client, Operation::Read, ResourceType::Topic, &name) {
            return true;
        }
        denied.push(offset_commit_refused(t, TOPIC_DENIED));
        false
    });
    denied
}

/// An OffsetCommit topic's answer when all of it is refused with `error`.
pub fn offset_commit_refused(
    t: &offset_commit_request::OffsetCommitRequestTopic,
    error: ResponseError,
) -> offset_commit_response::OffsetCommitResponseTopic {
    use offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
    OffsetCommitResponseTopic::default()
        .with_name(t.name.clone())
        .with_topic_id(t.topic_id)
        .with_partitions(
            t.partitions
                .iter()
                .map(|p| {
                    OffsetCommitResponsePartition::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(error.code())
                })
                .collect(),
        )
}

/// FindCoordinator's answer for keys the client may not DESCRIBE.
pub enum Coordinators {
    /// A v0-v3 request for one key that is refused.
    Refused(FindCoordinatorResponse),
    /// Answers for the refused keys of a v4+ request (taken out of it).
    Keys(Vec<find_coordinator_response::Coordinator>),
}

/// FindCoordinator: DESCRIBE on the group or transactional id.
pub fn find_coordinator(
    broker: &Broker,
    client: &ClientInfo,
    req: &mut FindCoordinatorRequest,
    version: i16,
) -> Coordinators {
    if !broker.authorizer.enabled {
        return Coordinators::Keys(Vec::new());
    }
    let (resource_type, error) = match req.key_type {
        1 => (
            ResourceType::TransactionalId,
            ResponseError::TransactionalIdAuthorizationFailed,
        ),
        _ => (ResourceType::Group, ResponseError::GroupAuthorizationFailed),
    };
    let allowed = |key: &str| broker.authorized(client, Operation::Describe, resource_type, key);
    if version < 4 {
        if allowed(&req.key) {
            return Coordinators::Keys(Vec::new());
        }
        return Coordinators::Refused(
            FindCoordinatorResponse::default()
                .with_error_code(error.code())
                .with_error_message(Some(str_bytes("Authorization failed.")))
                .with_node_id(BrokerId(-1))
                .with_port(-1),
        );
    }
    let mut denied = Vec::new();
    req.coordinator_keys.retain(|key| {
        if allowed(key) {
            return true;
        }
        denied.push(
            find_coordinator_response::Coordinator::default()
                .with_key(key.clone())
                .with_node_id(BrokerId(-1))
                .with_port(-1)
                .with_error_code(error.code())
                .with_error_message(Some(str_bytes("Authorization failed."))),
        );
        false
    });
    Coordinators::Keys(denied)
}

/// OffsetFetch v8+: DESCRIBE on each group named (older versions name one
/// group, checked with the other group APIs).
pub fn offset_fetch_groups(
    broker: &Broker,
    client: &ClientInfo,
    req: &mut OffsetFetchRequest,
    version: i16,
) -> Vec<offset_fetch_response::OffsetFetchResponseGroup> {
    if !broker.authorizer.enabled || version < 8 {
        return Vec::new();
    }
    let mut denied = Vec::new();
    req.groups.retain(|g| {
        if group(broker, client, &g.group_id, Operation::Describe) {
            return true;
        }
        denied.push(
            offset_fetch_response::OffsetFetchResponseGroup::default()
                .with_group_id(g.group_id.clone())
                .with_error_code(ResponseError::GroupAuthorizationFailed.code()),
        );
        false
    });
    denied
}

/// DescribeGroups: DESCRIBE on each group.
pub fn describe_groups(
    broker: &Broker,
    client: &ClientInfo,
    req: &mut DescribeGroupsRequest,
) -> Vec<describe_groups_response::DescribedGroup> {
    if !broker.authorizer.enabled {
        return Vec::new();
    }
    let mut denied = Vec::new();
    req.groups.retain(|g| {
        let ok = group(broker, client, g, Operation::Describe);
        if !ok {
            denied.push(
                describe_groups_response::DescribedGroup::default()
                    .with_group_id(g.clone())
                    .with_error_code(ResponseError::GroupAuthorizationFailed.code())
                    .with_authorized_operations(i32::MIN),
            );
        }
        ok
    });
    denied
}

/// DescribeGroups' authorized-operation masks, from the ACLs.
pub fn describe_groups_masks(
    broker: &Broker,
    client: &ClientInfo,
    include: bool,
    resp: &mut DescribeGroupsResponse,
) {
    if !broker.authorizer.enabled || !include {
        return;
    }
    for g in resp.groups.iter_mut().filter(|g| g.error_code == 0) {
        g.authorized_operations = broker.authorized_operations(client, ResourceType::Group, &g.group_id);
    }
}

/// ListGroups: every group with DESCRIBE on the cluster, else the groups
/// the client may DESCRIBE.
pub fn list_groups(broker: &Broker, client: &ClientInfo, resp: &mut ListGroupsResponse) {
    if !broker.authorizer.enabled || broker.authorized_cluster(client, Operation::Describe) {
        return;
    }
    resp.groups
        .retain(|g| broker.authorized_to_list(client, Operation::Describe, ResourceType::Group, &g.group_id));
}

/// DeleteGroups: DELETE on each group.
pub fn delete_groups(
    broker: &Broker,
    client: &ClientInfo,
    req: &mut DeleteGroupsRequest,
) -> Vec<delete_groups_response::DeletableGroupResult> {
    if !broker.authorizer.enabled {
        return Vec::new();
    }
    let mut denied = Vec::new();
    req.groups_names.retain(|g| {
        let ok = group(broker, client, g, Operation::Delete);
        if !ok {
            denied.push(
                delete_groups_response::DeletableGroupResult::default()
                    .with_group_id(g.clone())
                    .with_error_code(ResponseError::GroupAuthorizationFailed.code()),
            );
        }
        ok
    });
    denied
}

/// OffsetFetch: the groups asking for every topic they committed (v0-7
/// name one group: `group_id`), as against naming topics.
pub fn offset_fetch_listing(req: &OffsetFetchRequest, version: i16) -> Vec<GroupId> {
    if version < 8 {
        return req
            .topics
            .is_none()
            .then(|| req.group_id.clone())
            .into_iter()
            .collect();
    }
    req.groups
        .iter()
        .filter(|g| g.topics.is_none())
        .map(|g| g.group_id.clone())
        .collect()
}

/// OffsetFetch, after the handler: a listing of every committed topic
/// leaves out those the client may not DESCRIBE; a named one is answered
/// TOPIC_AUTHORIZATION_FAILED in each partition. `listing` is from
/// [`offset_fetch_listing`].
pub fn offset_fetch_topics(
    broker: &Broker,
    client: &ClientInfo,
    listing: &[GroupId],
    version: i16,
    resp: &mut OffsetFetchResponse,
) {
    if !broker.authorizer.enabled {
        return;
    }
    let may = |topic: &str, listed: bool| {
        if listed {
            broker.authorized_to_list(client, Operation::Describe, ResourceType::Topic, topic)
        } else {
            broker.authorized(client, Operation::Describe, ResourceType::Topic, topic)
        }
    };
    // The v0-7 and v8+ answers have the same fields in types of their own.
    macro_rules! hide {
        ($topics:expr, $listed:expr, $partition:ty) => {
            $topics.retain_mut(|t| {
                if may(&t.name, $listed) {
                    return true;
                }
                for p in &mut t.partitions {
                    *p = <$partition>::default()
                        .with_partition_index(p.partition_index)
                        .with_committed_offset(-1)
                        .with_committed_leader_epoch(-1)
                        .with_metadata(Some(str_bytes("")))
                        .with_error_code(TOPIC_DENIED.code());
                }
                !$listed
            })
        };
    }
    if version < 8 {
        let listed = !listing.is_empty();
        hide!(
            resp.topics,
            listed,
            offset_fetch_response::OffsetFetchResponsePartition
        );
        return;
    }
    for g in &mut resp.groups {
        let listed = listing.contains(&g.group_id);
        hide!(
            g.topics,
            listed,
            offset_fetch_response::OffsetFetchResponsePartitions
        );
    }
}

/// OffsetDelete: DELETE on the group, or the whole request is refused
/// (`Err`, the answer); then READ on each topic, whose refused ones are
/// taken out of the request and answered (`Ok`).
pub fn offset_delete(
    broker: &Broker,
    client: &ClientInfo,
    req: &mut OffsetDeleteRequest,
) -> Result<Vec<offset_delete_response::OffsetDeleteResponseTopic>, OffsetDeleteResponse> {
    use offset_delete_response::{OffsetDeleteResponsePartition, OffsetDeleteResponseTopic};
    if !broker.authorizer.enabled {
        return Ok(Vec::new());
    }
    if !group(broker, client, &req.group_id, Operation::Delete) {
        return Err(OffsetDeleteResponse::default().with_error_code(GROUP_DENIED.code()));
    }
    let mut denied = Vec::new();
    req.topics.retain(|t| {
        if broker.authorized(client, Operation::Read, ResourceType::Topic, &t.name) {
            return true;
        }
        denied.push(
            OffsetDeleteResponseTopic::default()
                .with_name(t.name.clone())
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            OffsetDeleteResponsePartition::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(TOPIC_DENIED.code())
                        })
                        .collect(),
                ),
        );
        false
    });
    Ok(denied)
}

/// ConsumerGroupDescribe, before the handler: DESCRIBE on each group; the
/// refused ones are taken out and answered.
pub fn consumer_group_describe(
    broker: &Broker,
    client: &ClientInfo,
    req: &mut ConsumerGroupDescribeRequest,
) -> Vec<consumer_group_describe_response::DescribedGroup> {
    if !broker.authorizer.enabled {
        return Vec::new();
    }
    let mut denied = Vec::new();
    req.group_ids.retain(|g| {
        let ok = group(broker, client, g, Operation::Describe);
        if !ok {
            denied.push(
                consumer_group_describe_response::DescribedGroup::default()
                    .with_group_id(g.clone())
                    .with_error_code(GROUP_DENIED.code())
                    .with_authorized_operations(i32::MIN),
            );
        }
        ok
    });
    denied
}

/// ConsumerGroupDescribe, after the handler: a group whose members are
/// assigned (or about to be) a topic the client may not DESCRIBE is
/// answered TOPIC_AUTHORIZATION_FAILED instead, as in Kafka, so those
/// topics stay hidden; the others get their authorized-operation masks.
pub fn consumer_group_describe_topics(
    broker: &Broker,
    client: &ClientInfo,
    include_operations: bool,
    resp: &mut ConsumerGroupDescribeResponse,
) {
    if !broker.authorizer.enabled {
        return;
    }
    for g in resp.groups.iter_mut().filter(|g| g.error_code == 0) {
        let hidden = g
            .members
            .iter()
            .flat_map(|m| {
                m.assignment
                    .topic_partitions
                    .iter()
                    .chain(&m.target_assignment.topic_partitions)
            })
            // A deleted topic's id resolves to no name: nothing to hide.
            .filter(|t| !t.topic_name.is_empty())
            .any(|t| {
                !broker.authorized_to_list(client, Operation::Describe, ResourceType::Topic, &t.topic_name)
            });
        if hidden {
            *g = consumer_group_describe_response::DescribedGroup::default()
                .with_group_id(g.group_id.clone())
                .with_error_code(TOPIC_DENIED.code())
                .with_error_message(Some(str_bytes(
                    "The group has described topic(s) that the client is not authorized to describe.",
                )))
                .with_authorized_operations(i32::MIN);
        } else if include_operations {
            g.authorized_operations = broker.authorized_operations(client, ResourceType::Group, &g.group_id);
        }
    }
}
