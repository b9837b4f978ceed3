//! Kafka's ACL checks, API by API (`keel_auth::acl` decides). Each checked
//! API's resources are looked at before its handler runs: what the client
//! may not touch is taken out of the request and answered with Kafka's
//! authorization error beside the handler's answer, so handlers never see
//! it. Without an authorizer every function here leaves the request alone.
//!
//! Every API Keel serves is checked. One missing from [`checked`] (an API
//! added without its checks) is open to `super.users` only: a request
//! from anyone else closes its connection, with the reason logged. That
//! refuses more than Kafka would, never less.

use keel_protocol::messages::*;
use keel_protocol::{ResponseError, StrBytes};
use uuid::Uuid;

use super::str_bytes;
use crate::{Broker, ClientInfo};
use keel_auth::acl::{Operation, ResourceType};

mod admin;
mod groups;
mod txn;

pub use admin::*;
pub use groups::*;
pub use txn::*;

const TOPIC_DENIED: ResponseError = ResponseError::TopicAuthorizationFailed;

/// A topic's name from a request that may name it by id.
fn topic_name(broker: &Broker, name: &str, id: Uuid) -> String {
    if id.is_nil() {
        return name.to_string();
    }
    broker
        .data
        .topics
        .get_by_id(id)
        .map_or_else(|| name.to_string(), |t| t.meta.name.clone())
}

/// Produce: WRITE on each topic, and on the transactional id if any.
pub fn produce(
    broker: &Broker,
    client: &ClientInfo,
    req: &mut ProduceRequest,
) -> Vec<produce_response::TopicProduceResponse> {
    use produce_response::{PartitionProduceResponse, TopicProduceResponse};
    if !broker.authorizer.enabled {
        return Vec::new();
    }
    let txn_denied = req
        .transactional_id
        .as_ref()
        .is_some_and(|id| !broker.authorized(client, Operation::Write, ResourceType::TransactionalId, id));
    let mut denied = Vec::new();
    req.topic_data.retain(|t| {
        let name = topic_name(broker, &t.name, t.topic_id);
        let error = if txn_denied {
            ResponseError::TransactionalIdAuthorizationFailed
        } else if !broker.authorized(client, Operation::Write, ResourceType::Topic, &name) {
            TOPIC_DENIED
        } else {
            return true;
        };
        denied.push(
            TopicProduceResponse::default()
                .with_name(t.name.clone())
                .with_topic_id(t.topic_id)
                .with_partition_responses(
                    t.partition_data
                        .iter()
                        .map(|p| {
                            PartitionProduceResponse::default()
                                .with_index(p.index)
                                .with_error_code(error.code())
                                .with_base_offset(-1)
                                .with_log_append_time_ms(-1)
                                .with_log_start_offset(-1)
                        })
                        .collect(),
                ),
        );
        false
    });
    denied
}

/// Fetch: READ on each topic.
pub fn fetch(
    broker: &Broker,
    client: &ClientInfo,
    req: &mut FetchRequest,
) -> Vec<fetch_response::FetchableTopicResponse> {
    use fetch_response::{FetchableTopicResponse, PartitionData};
    if !broker.authorizer.enabled {
        return Vec::new();
    }
    let mut denied = Vec::new();
    req.topics.retain(|t| {
        let name = topic_name(broker, &t.topic, t.topic_id);
        if broker.authorized(client, Operation::Read, ResourceType::Topic, &name) {
            return true;
        }
        denied.push(
            FetchableTopicResponse::default()
                .with_topic(t.topic.clone())
                .with_topic_id(t.topic_id)
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            PartitionData::default()
                                .with_partition_index(p.partition)
                                .with_error_code(TOPIC_DENIED.code())
                                .with_high_watermark(-1)
                                .with_last_stable_offset(-1)
                                .with_log_start_offset(-1)
                        })
                        .collect(),
                ),
        );
        false
    });
    denied
}

/// Metadata, before the handler: a named topic needs DESCRIBE, and one
/// that does not exist yet CREATE (on the cluster or the topic) to be
/// created.
pub fn metadata_request(
    broker: &Broker,
    client: &ClientInfo,
    req: &mut MetadataRequest,
) -> Vec<metadata_response::MetadataResponseTopic> {
    use metadata_response::MetadataResponseTopic;
    if !broker.authorizer.enabled {
        return Vec::new();
    }
    let Some(topics) = req.topics.as_mut() else {
        return Vec::new();
    };
    let auto_create = req.allow_auto_topic_creation;
    let mut create_on_cluster = None;
    let mut denied = Vec::new();
    topics.retain(|t| {
        let name = topic_name(broker, t.name.as_deref().map_or("", |n| n.as_str()), t.topic_id);
        let allowed = broker.authorized(client, Operation::Describe, ResourceType::Topic, &name)
            && (!auto_create
                || broker.data.topics.get(&name).is_some()
                || *create_on_cluster
                    .get_or_insert_with(|| broker.authorized_cluster(client, Operation::Create))
                || broker.authorized(client, Operation::Create, ResourceType::Topic, &name));
        if !allowed {
            denied.push(
                MetadataResponseTopic::default()
                    .with_name(t.name.clone())
                    .with_topic_id(t.topic_id)
                    .with_error_code(TOPIC_DENIED.code())
                    .with_topic_authorized_operations(i32::MIN),
            );
        }
        allowed
    });
    denied
}

/// Metadata, after the handler: a listing of every topic shows only those
/// the client may DESCRIBE, and the authorized-operation masks asked for
/// are computed from the ACLs.
pub fn metadata_response(
    broker: &Broker,
    client: &ClientInfo,
    listed_all: bool,
    include_topic_ops: bool,
    include_cluster_ops: bool,
    resp: &mut MetadataResponse,
) {
    if !broker.authorizer.enabled {
        return;
    }
    if listed_all {
        resp.topics.retain(|t| {
            let name = t.name.as_deref().map_or("", |n| n.as_str());
            broker.authorized_to_list(client, Operation::Describe, ResourceType::Topic, name)
        });
    }
    if include_topic_ops {
        for t in resp.topics.iter_mut().filter(|t| t.error_code == 0) {
            let name = t.name.as_deref().map_or("", |n| n.as_str());
            t.topic_authorized_operations = broker.authorized_operations(client, ResourceType::Topic, name);
        }
    }
    if include_cluster_ops {
        resp.cluster_authorized_operations =
            broker.authorized_operations(client, ResourceType::Cluster, keel_auth::acl::CLUSTER_NAME);
    }
}

/// CreateTopics: CREATE on the cluster, or on each topic.
pub fn create_topics(
    broker: &Broker,
    client: &ClientInfo,
    req: &mut CreateTopicsRequest,
) -> Vec<create_topics_response::CreatableTopicResult> {
    use create_topics_response::CreatableTopicResult;
    if !broker.authorizer.enabled || broker.authorized_cluster(client, Operation::Create) {
        return Vec::new();
    }
    let mut denied = Vec::new();
    req.topics.retain(|t| {
        if broker.authorized(client, Operation::Create, ResourceType::Topic, &t.name) {
            return true;
        }
        denied.push(
            CreatableTopicResult::default()
                .with_name(t.name.clone())
                .with_error_code(TOPIC_DENIED.code())
                .with_error_message(Some(str_bytes("Authorization failed.")))
                .with_num_partitions(-1)
                .with_replication_factor(-1),
        );
        false
    });
    denied
}

/// ListOffsets: DESCRIBE on each topic.
pub fn list_offsets(
    broker: &Broker,
    client: &ClientInfo,
    req: &mut ListOffsetsRequest,
) -> Vec<list_offsets_response::ListOffsetsTopicResponse> {
    use list_offsets_response::{ListOffsetsPartitionResponse, ListOffsetsTopicResponse};
    if !broker.authorizer.enabled {
        return Vec::new();
    }
    let mut denied = Vec::new();
    req.topics.retain(|t| {
        if broker.authorized(client, Operation::Describe, ResourceType::Topic, &t.name) {
            return true;
        }
        denied.push(
            ListOffsetsTopicResponse::default()
                .with_name(t.name.clone())
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            ListOffsetsPartitionResponse::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(TOPIC_DENIED.code())
                                .with_timestamp(-1)
                                .with_offset(-1)
                        })
                        .collect(),
                ),
        );
        false
    });
    denied
}

/// OffsetForLeaderEpoch: DESCRIBE on each topic.
pub fn offset_for_leader_epoch(
    broker: &Broker,
    client: &ClientInfo,
    req: &mut OffsetForLeaderEpochRequest,
) -> Vec<offset_for_leader_epoch_response::OffsetForLeaderTopicResult> {
    use offset_for_leader_epoch_response::{EpochEndOffset, OffsetForLeaderTopicResult};
    if !broker.authorizer.enabled {
        return Vec::new();
    }
    let mut denied = Vec::new();
    req.topics.retain(|t| {
        if broker.authorized(client, Operation::Describe, ResourceType::Topic, &t.topic) {
            return true;
        }
        denied.push(
            OffsetForLeaderTopicResult::default()
                .with_topic(t.topic.clone())
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            EpochEndOffset::default()
                                .with_partition(p.partition)
                                .with_error_code(TOPIC_DENIED.code())
                                .with_leader_epoch(-1)
                                .with_end_offset(-1)
                        })
                        .collect(),
                ),
        );
        false
    });
    denied
}

/// InitProducerId: WRITE on the transactional id; without one,
/// IDEMPOTENT_WRITE on the cluster or WRITE on some topic. The error, if
/// denied.
pub fn init_producer_id(
    broker: &Broker,
    client: &ClientInfo,
    req: &InitProducerIdRequest,
) -> Option<ResponseError> {
    if !broker.authorizer.enabled {
        return None;
    }
    match &req.transactional_id {
        Some(id) => (!broker.authorized(client, Operation::Write, ResourceType::TransactionalId, id))
            .then_some(ResponseError::TransactionalIdAuthorizationFailed),
        None => (!broker.authorized_cluster(client, Operation::IdempotentWrite)
            && !broker.may_write_some_topic(client))
        .then_some(ResponseError::ClusterAuthorizationFailed),
    }
}

/// DeleteTopics: DELETE on each topic.
pub fn delete_topics(
    broker: &Broker,
    client: &ClientInfo,
    req: &mut DeleteTopicsRequest,
) -> Vec<delete_topics_response::DeletableTopicResult> {
    use delete_topics_response::DeletableTopicResult;
    if !broker.authorizer.enabled {
        return Vec::new();
    }
    let refused = |name: Option<TopicName>, id: Uuid| {
        DeletableTopicResult::default()
            .with_name(name)
            .with_topic_id(id)
            .with_error_code(TOPIC_DENIED.code())
            .with_error_message(Some(str_bytes("Authorization failed.")))
    };
    let allowed = |name: &str| broker.authorized(client, Operation::Delete, ResourceType::Topic, name);
    let mut denied = Vec::new();
    req.topic_names.retain(|name| {
        let ok = allowed(name);
        if !ok {
            denied.push(refused(Some(name.clone()), Uuid::nil()));
        }
        ok
    });
    req.topics.retain(|t| {
        let ok = allowed(&topic_name(
            broker,
            t.name.as_deref().map_or("", |n| n.as_str()),
            t.topic_id,
        ));
        if !ok {
            denied.push(refused(t.name.clone(), t.topic_id));
        }
        ok
    });
    denied
}

/// The APIs refused as a whole without an operation on the cluster:
/// SCRAM credentials (DESCRIBE, ALTER) and client quotas
/// (DESCRIBE_CONFIGS, ALTER_CONFIGS). Whether `client` is refused.
pub fn cluster_refused(broker: &Broker, client: &ClientInfo, operation: Operation) -> bool {
    broker.authorizer.enabled && !broker.authorized_cluster(client, operation)
}

const CLUSTER_DENIED: ResponseError = ResponseError::ClusterAuthorizationFailed;

pub fn describe_user_scram_refused() -> DescribeUserScramCredentialsResponse {
    DescribeUserScramCredentialsResponse::default()
        .with_error_code(CLUSTER_DENIED.code())
        .with_error_message(Some(str_bytes("Cluster authorization failed.")))
}

pub fn alter_user_scram_refused(req: &AlterUserScramCredentialsRequest) -> AlterUserScramCredentialsResponse {
    use alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
    let mut users: Vec<StrBytes> = Vec::new();
    for name in req
        .deletions
        .iter()
        .map(|d| &d.name)
        .chain(req.upsertions.iter().map(|u| &u.name))
    {
        if !users.contains(name) {
            users.push(name.clone());
        }
    }
    AlterUserScramCredentialsResponse::default().with_results(
        users
            .into_iter()
            .map(|user| {
                AlterUserScramCredentialsResult::default()
                    .with_user(user)
                    .with_error_code(CLUSTER_DENIED.code())
                    .with_error_message(Some(str_bytes("Cluster authorization failed.")))
            })
            .collect(),
    )
}

pub fn describe_client_quotas_refused() -> DescribeClientQuotasResponse {
    DescribeClientQuotasResponse::default()
        .with_error_code(CLUSTER_DENIED.code())
        .with_error_message(Some(str_bytes("Cluster authorization failed.")))
}

pub fn alter_client_quotas_refused(req: &AlterClientQuotasRequest) -> AlterClientQuotasResponse {
    use alter_client_quotas_response::{EntityData, EntryData};
    AlterClientQuotasResponse::default().with_entries(
        req.entries
            .iter()
            .map(|e| {
                EntryData::default()
                    .with_error_code(CLUSTER_DENIED.code())
                    .with_error_message(Some(str_bytes("Cluster authorization failed.")))
                    .with_entity(
                        e.entity
                            .iter()
                            .map(|d| {
                                EntityData::default()
                                    .with_entity_type(d.entity_type.clone())
                                    .with_entity_name(d.entity_name.clone())
                            })
                            .collect(),
                    )
            })
            .collect(),
    )
}

/// A config resource's check (`operation` is DESCRIBE_CONFIGS or
/// ALTER_CONFIGS): a topic's on the topic, a group's on the group, the
/// broker's, its loggers' and client metrics' on the cluster. The error
/// when denied.
fn config_resource(
    broker: &Broker,
    client: &ClientInfo,
    resource_type: i8,
    name: &str,
    operation: Operation,
) -> Option<ResponseError> {
    const TOPIC: i8 = 2;
    const GROUP: i8 = 32;
    let (allowed, error) = match resource_type {
        TOPIC => (
            broker.authorized(client, operation, ResourceType::Topic, name),
            TOPIC_DENIED,
        ),
        GROUP => (
            broker.authorized(client, operation, ResourceType::Group, name),
            ResponseError::GroupAuthorizationFailed,
        ),
        _ => (broker.authorized_cluster(client, operation), CLUSTER_DENIED),
    };
    (!allowed).then_some(error)
}

/// DescribeConfigs: DESCRIBE_CONFIGS on each resource.
pub fn describe_configs(
    broker: &Broker,
    client: &ClientInfo,
    req: &mut DescribeConfigsRequest,
) -> Vec<describe_configs_response::DescribeConfigsResult> {
    if !broker.authorizer.enabled {
        return Vec::new();
    }
    let mut denied = Vec::new();
    req.resources.retain(|r| {
        match config_resource(
            broker,
            client,
            r.resource_type,
            &r.resource_name,
            Operation::DescribeConfigs,
        ) {
            None => true,
            Some(error) => {
                denied.push(
                    describe_configs_response::DescribeConfigsResult::default()
                        .with_error_code(error.code())
                        .with_error_message(Some(str_bytes("Authorization failed.")))
                        .with_resource_type(r.resource_type)
                        .with_resource_name(r.resource_name.clone()),
                );
                false
            }
        }
    });
    denied
}

/// AlterConfigs and IncrementalAlterConfigs: ALTER_CONFIGS on each
/// resource. The refused resources are taken out of `resources` (`key`
/// gives a resource's type and name) and answered with `answer`.
pub fn alter_configs<R, A>(
    broker: &Broker,
    client: &ClientInfo,
    resources: &mut Vec<R>,
    key: impl Fn(&R) -> (i8, &StrBytes),
    answer: impl Fn(i8, StrBytes, ResponseError) -> A,
) -> Vec<A> {
    if !broker.authorizer.enabled {
        return Vec::new();
    }
    let mut denied = Vec::new();
    resources.retain(|r| {
        let (t, name) = key(r);
        match config_resource(broker, client, t, name, Operation::AlterConfigs) {
            None => true,
            Some(error) => {
                denied.push(answer(t, name.clone(), error));
                false
            }
        }
    });
    denied
}
