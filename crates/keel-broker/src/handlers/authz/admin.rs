//! The administrative APIs' checks: ALTER on a topic to add partitions,
//! DELETE to delete records, READ to see its producers, DESCRIBE to
//! describe its partitions; DESCRIBE on the cluster for log dirs, ALTER
//! for leader elections, DESCRIBE_CONFIGS to list config resources.

use keel_protocol::messages::*;

use super::{str_bytes, CLUSTER_DENIED, TOPIC_DENIED};
use crate::{Broker, ClientInfo};
use keel_auth::acl::{Operation, ResourceType};

/// Takes the topics the client may not `operation` out of `topics` (`name`
/// gives a topic's name) and answers each with `refused`.
fn refuse_topics<T, A>(
    broker: &Broker,
    client: &ClientInfo,
    operation: Operation,
    topics: &mut Vec<T>,
    name: impl Fn(&T) -> &str,
    refused: impl Fn(&T) -> A,
) -> Vec<A> {
    if !broker.authorizer.enabled {
        return Vec::new();
    }
    let mut denied = Vec::new();
    topics.retain(|t| {
        let ok = broker.authorized(client, operation, ResourceType::Topic, name(t));
        if !ok {
            denied.push(refused(t));
        }
        ok
    });
    denied
}

/// CreatePartitions: ALTER on each topic.
pub fn create_partitions(
    broker: &Broker,
    client: &ClientInfo,
    req: &mut CreatePartitionsRequest,
) -> Vec<create_partitions_response::CreatePartitionsTopicResult> {
    refuse_topics(
        broker,
        client,
        Operation::Alter,
        &mut req.topics,
        |t| &t.name,
        |t| {
            create_partitions_response::CreatePartitionsTopicResult::default()
                .with_name(t.name.clone())
                .with_error_code(TOPIC_DENIED.code())
                .with_error_message(Some(str_bytes("Authorization failed.")))
        },
    )
}

/// DeleteRecords: DELETE on each topic.
pub fn delete_records(
    broker: &Broker,
    client: &ClientInfo,
    req: &mut DeleteRecordsRequest,
) -> Vec<delete_records_response::DeleteRecordsTopicResult> {
    use delete_records_response::{DeleteRecordsPartitionResult, DeleteRecordsTopicResult};
    refuse_topics(
        broker,
        client,
        Operation::Delete,
        &mut req.topics,
        |t| &t.name,
        |t| {
            DeleteRecordsTopicResult::default()
                .with_name(t.name.clone())
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            DeleteRecordsPartitionResult::default()
                                .with_partition_index(p.partition_index)
                                .with_low_watermark(-1)
                                .with_error_code(TOPIC_DENIED.code())
                        })
                        .collect(),
                )
        },
    )
}

/// DescribeProducers: READ on each topic.
pub fn describe_producers(
    broker: &Broker,
    client: &ClientInfo,
    req: &mut DescribeProducersRequest,
) -> Vec<describe_producers_response::TopicResponse> {
    use describe_producers_response::{PartitionResponse, TopicResponse};
    refuse_topics(
        broker,
        client,
        Operation::Read,
        &mut req.topics,
        |t| &t.name,
        |t| {
            TopicResponse::default()
                .with_name(t.name.clone())
                .with_partitions(
                    t.partition_indexes
                        .iter()
                        .map(|&p| {
                            PartitionResponse::default()
                                .with_partition_index(p)
                                .with_error_code(TOPIC_DENIED.code())
                        })
                        .collect(),
                )
        },
    )
}

/// DescribeTopicPartitions: whether the client may DESCRIBE `topic` (a
/// listing of every topic leaves the others out; a named one is answered
/// TOPIC_AUTHORIZATION_FAILED). Always without an authorizer.
pub fn may_describe_topic(broker: &Broker, client: &ClientInfo, topic: &str, listing: bool) -> bool {
    if !broker.authorizer.enabled {
        return true;
    }
    if listing {
        broker.authorized_to_list(client, Operation::Describe, ResourceType::Topic, topic)
    } else {
        broker.authorized(client, Operation::Describe, ResourceType::Topic, topic)
    }
}

/// DescribeTopicPartitions, after the handler: each topic's
/// authorized-operation mask, from the ACLs (unknown topics' too, as
/// Kafka).
pub fn describe_topic_partitions_masks(
    broker: &Broker,
    client: &ClientInfo,
    resp: &mut DescribeTopicPartitionsResponse,
) {
    if !broker.authorizer.enabled {
        return;
    }
    for t in resp
        .topics
        .iter_mut()
        .filter(|t| t.error_code != TOPIC_DENIED.code())
    {
        let name = t.name.as_deref().map_or("", |n| n.as_str());
        t.topic_authorized_operations = broker.authorized_operations(client, ResourceType::Topic, name);
    }
}

/// Whether `client` is refused an API that needs `operation` on the
/// cluster.
fn cluster_refused(broker: &Broker, client: &ClientInfo, operation: Operation) -> bool {
    broker.authorizer.enabled && !broker.authorized_cluster(client, operation)
}

/// DescribeLogDirs: DESCRIBE on the cluster. The answer when refused.
pub fn describe_log_dirs(broker: &Broker, client: &ClientInfo) -> Option<DescribeLogDirsResponse> {
    cluster_refused(broker, client, Operation::Describe)
        .then(|| DescribeLogDirsResponse::default().with_error_code(CLUSTER_DENIED.code()))
}

/// ListConfigResources: DESCRIBE_CONFIGS on the cluster. The answer when
/// refused.
pub fn list_config_resources(broker: &Broker, client: &ClientInfo) -> Option<ListConfigResourcesResponse> {
    cluster_refused(broker, client, Operation::DescribeConfigs)
        .then(|| ListConfigResourcesResponse::default().with_error_code(CLUSTER_DENIED.code()))
}

/// ElectLeaders: ALTER on the cluster, or the request (v1+ has a code of
/// its own) and each partition it names are refused. The answer when
/// refused.
pub fn elect_leaders(
    broker: &Broker,
    client: &ClientInfo,
    req: &ElectLeadersRequest,
    version: i16,
) -> Option<ElectLeadersResponse> {
    use elect_leaders_response::{PartitionResult, ReplicaElectionResult};
    if !cluster_refused(broker, client, Operation::Alter) {
        return None;
    }
    let message = || Some(str_bytes("Cluster authorization failed."));
    let results = req
        .topic_partitions
        .iter()
        .flatten()
        .map(|t| {
            ReplicaElectionResult::default()
                .with_topic(t.topic.clone())
                .with_partition_result(
                    t.partitions
                        .iter()
                        .map(|&p| {
                            PartitionResult::default()
                                .with_partition_id(p)
                                .with_error_code(CLUSTER_DENIED.code())
                                .with_error_message(message())
                        })
                        .collect(),
                )
        })
        .collect();
    let top = if version >= 1 { CLUSTER_DENIED.code() } else { 0 };
    Some(
        ElectLeadersResponse::default()
            .with_error_code(top)
            .with_replica_election_results(results),
    )
}
