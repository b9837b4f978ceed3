//! The transaction APIs' checks. A producer's requests need WRITE on its
//! transactional id (and READ on the group and topics whose offsets it
//! commits); seeing a transaction needs DESCRIBE on its id; the APIs
//! brokers send each other need CLUSTER_ACTION on the cluster
//! (AddPartitionsToTxn v4+; WriteTxnMarkers, also ALTER).

use keel_protocol::messages::*;
use keel_protocol::ResponseError;

use super::{CLUSTER_DENIED, TOPIC_DENIED};
use crate::handlers::partition_exists;
use crate::{Broker, ClientInfo};
use keel_auth::acl::{Operation, ResourceType};

const TXN_DENIED: ResponseError = ResponseError::TransactionalIdAuthorizationFailed;

fn may_write_txn(broker: &Broker, client: &ClientInfo, id: &str) -> bool {
    broker.authorized(client, Operation::Write, ResourceType::TransactionalId, id)
}

/// AddPartitionsToTxn. v0-3 come from producers: WRITE on the
/// transactional id and on each topic. Any refused topic fails the whole
/// request, as in Kafka: its partitions answer TOPIC_AUTHORIZATION_FAILED,
/// unknown ones UNKNOWN_TOPIC_OR_PARTITION, and the rest
/// OPERATION_NOT_ATTEMPTED. v4+ come from brokers: CLUSTER_ACTION. The
/// whole answer when refused.
pub fn add_partitions_to_txn(
    broker: &Broker,
    client: &ClientInfo,
    req: &AddPartitionsToTxnRequest,
    version: i16,
) -> Option<AddPartitionsToTxnResponse> {
    use add_partitions_to_txn_response::{AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult};
    if !broker.authorizer.enabled {
        return None;
    }
    if version >= 4 {
        return (!broker.authorized_cluster(client, Operation::ClusterAction))
            .then(|| AddPartitionsToTxnResponse::default().with_error_code(CLUSTER_DENIED.code()));
    }
    let topics = &req.v3_and_below_topics;
    let txn_denied = !may_write_txn(broker, client, &req.v3_and_below_transactional_id);
    let topic_denied: Vec<bool> = topics
        .iter()
        .map(|t| !txn_denied && !broker.authorized(client, Operation::Write, ResourceType::Topic, &t.name))
        .collect();
    if !txn_denied && !topic_denied.contains(&true) {
        return None;
    }
    let results = topics
        .iter()
        .zip(topic_denied)
        .map(|(t, denied)| {
            let error = |p: i32| {
                if txn_denied {
                    TXN_DENIED
                } else if denied {
                    TOPIC_DENIED
                } else if !partition_exists(broker, &t.name, p) {
                    ResponseError::UnknownTopicOrPartition
                } else {
                    ResponseError::OperationNotAttempted
                }
            };
            AddPartitionsToTxnTopicResult::default()
                .with_name(t.name.clone())
                .with_results_by_partition(
                    t.partitions
                        .iter()
                        .map(|&p| {
                            AddPartitionsToTxnPartitionResult::default()
                                .with_partition_index(p)
                                .with_partition_error_code(error(p).code())
                        })
                        .collect(),
                )
        })
        .collect();
    Some(AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(results))
}

/// AddOffsetsToTxn: WRITE on the transactional id, then READ on the
/// group. The error, if refused.
pub fn add_offsets_to_txn(
    broker: &Broker,
    client: &ClientInfo,
    req: &AddOffsetsToTxnRequest,
) -> Option<ResponseError> {
    if !broker.authorizer.enabled {
        None
    } else if !may_write_txn(broker, client, &req.transactional_id) {
        Some(TXN_DENIED)
    } else if !super::group(broker, client, &req.group_id, Operation::Read) {
        Some(ResponseError::GroupAuthorizationFailed)
    } else {
        None
    }
}

/// EndTxn: WRITE on the transactional id. The answer, if refused.
pub fn end_txn(broker: &Broker, client: &ClientInfo, req: &EndTxnRequest) -> Option<EndTxnResponse> {
    (broker.authorizer.enabled && !may_write_txn(broker, client, &req.transactional_id)).then(|| {
        EndTxnResponse::default()
            .with_error_code(TXN_DENIED.code())
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1)
    })
}

/// TxnOffsetCommit: WRITE on the transactional id and READ on the group,
/// or every partition is refused (`Err`, the whole answer); then READ on
/// each topic, whose refused ones are taken out of the request and
/// answered (`Ok`).
pub fn txn_offset_commit(
    broker: &Broker,
    client: &ClientInfo,
    req: &mut TxnOffsetCommitRequest,
) -> Result<Vec<txn_offset_commit_response::TxnOffsetCommitResponseTopic>, TxnOffsetCommitResponse> {
    use txn_offset_commit_response::{TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic};
    if !broker.authorizer.enabled {
        return Ok(Vec::new());
    }
    let refused = |t: &txn_offset_commit_request::TxnOffsetCommitRequestTopic, error: ResponseError| {
        TxnOffsetCommitResponseTopic::default()
            .with_name(t.name.clone())
            .with_partitions(
                t.partitions
                    .iter()
                    .map(|p| {
                        TxnOffsetCommitResponsePartition::default()
                            .with_partition_index(p.partition_index)
                            .with_error_code(error.code())
                    })
                    .collect(),
            )
    };
    let whole = if !may_write_txn(broker, client, &req.transactional_id) {
        Some(TXN_DENIED)
    } else if !super::group(broker, client, &req.group_id, Operation::Read) {
        Some(ResponseError::GroupAuthorizationFailed)
    } else {
        None
    };
    if let Some(error) = whole {
        let topics = req.topics.iter().map(|t| refused(t, error)).collect();
        return Err(TxnOffsetCommitResponse::default().with_topics(topics));
    }
    let mut denied = Vec::new();
    req.topics.retain(|t| {
        let ok = broker.authorized(client, Operation::Read, ResourceType::Topic, &t.name);
        if !ok {
            denied.push(refused(t, TOPIC_DENIED));
        }
        ok
    });
    Ok(denied)
}

/// WriteTxnMarkers: ALTER on the cluster (KIP-1037: `kafka-transactions
/// abort` by an operator) or CLUSTER_ACTION, or every partition is
/// refused. The whole answer when refused.
pub fn write_txn_markers(
    broker: &Broker,
    client: &ClientInfo,
    req: &WriteTxnMarkersRequest,
) -> Option<WriteTxnMarkersResponse> {
    use write_txn_markers_response::{
        WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
    };
    if !broker.authorizer.enabled
        || broker.authorized_cluster(client, Operation::Alter)
        || broker.authorized_cluster(client, Operation::ClusterAction)
    {
        return None;
    }
    let markers = req
        .markers
        .iter()
        .map(|m| {
            let topics = m
                .topics
                .iter()
                .map(|t| {
                    WritableTxnMarkerTopicResult::default()
                        .with_name(t.name.clone())
                        .with_partitions(
                            t.partition_indexes
                                .iter()
                                .map(|&p| {
                                    WritableTxnMarkerPartitionResult::default()
                                        .with_partition_index(p)
                                        .with_error_code(CLUSTER_DENIED.code())
                                })
                                .collect(),
                        )
                })
                .collect();
            WritableTxnMarkerResult::default()
                .with_producer_id(m.producer_id)
                .with_topics(topics)
        })
        .collect();
    Some(WriteTxnMarkersResponse::default().with_markers(markers))
}

/// DescribeTransactions, before the handler: DESCRIBE on each
/// transactional id; the refused ones are taken out and answered.
pub fn describe_transactions(
    broker: &Broker,
    client: &ClientInfo,
    req: &mut DescribeTransactionsRequest,
) -> Vec<describe_transactions_response::TransactionState> {
    if !broker.authorizer.enabled {
        return Vec::new();
    }
    let mut denied = Vec::new();
    req.transactional_ids.retain(|id| {
        let ok = broker.authorized(client, Operation::Describe, ResourceType::TransactionalId, id);
        if !ok {
            denied.push(
                describe_transactions_response::TransactionState::default()
                    .with_transactional_id(id.clone())
                    .with_error_code(TXN_DENIED.code())
                    .with_producer_id(ProducerId(-1))
                    .with_producer_epoch(-1)
                    .with_transaction_start_time_ms(-1),
            );
        }
        ok
    });
    denied
}

/// DescribeTransactions, after the handler: a transaction shows only the
/// topics the client may DESCRIBE.
pub fn describe_transactions_topics(
    broker: &Broker,
    client: &ClientInfo,
    resp: &mut DescribeTransactionsResponse,
) {
    if !broker.authorizer.enabled {
        return;
    }
    for state in &mut resp.transaction_states {
        state.topics.retain(|t| {
            broker.authorized_to_list(client, Operation::Describe, ResourceType::Topic, &t.topic)
        });
    }
}

/// ListTransactions: only the transactional ids the client may DESCRIBE.
pub fn list_transactions(broker: &Broker, client: &ClientInfo, resp: &mut ListTransactionsResponse) {
    if !broker.authorizer.enabled {
        return;
    }
    resp.transaction_states.retain(|s| {
        broker.authorized_to_list(
            client,
            Operation::Describe,
            ResourceType::TransactionalId,
            &s.transactional_id,
        )
    });
}
