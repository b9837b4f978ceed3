//! The APIs operators use on transactions (KIP-664, what
//! `kafka-transactions` sends): ListTransactions and DescribeTransactions
//! ask the transaction coordinator, DescribeProducers asks each
//! partition's producer state, and WriteTxnMarkers ends a hanging
//! transaction in a partition by hand.

use std::sync::Arc;

use keel_log::marker::Marker;
use keel_protocol::messages::describe_producers_response::{PartitionResponse, ProducerState, TopicResponse};
use keel_protocol::messages::describe_transactions_response::{self, TopicData};
use keel_protocol::messages::list_transactions_response;
use keel_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
};
use keel_protocol::messages::*;
use keel_protocol::ResponseError;

use super::{partition_of, str_bytes, topic_name};
use crate::Broker;
use keel_coord::txn::state::{ListFilter, TxnState, TxnStatus};
use keel_coord::txn::COORDINATOR_EPOCH;

/// How long a WriteTxnMarkers marker waits for its commit in a cluster.
const MARKER_COMMIT_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

pub fn describe_transactions(
    broker: &Broker,
    req: DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    let states = req
        .transactional_ids
        .into_iter()
        .map(|id| {
            let out =
                describe_transactions_response::TransactionState::default().with_transactional_id(id.clone());
            if let Some(e) = broker.txn_refused(id.as_str()) {
                return out
                    .with_error_code(e.code())
                    .with_producer_id(ProducerId(-1))
                    .with_producer_epoch(-1)
                    .with_transaction_start_time_ms(-1);
            }
            match broker.txns.describe(id.as_str()) {
                None => out
                    .with_error_code(ResponseError::TransactionalIdNotFound.code())
                    .with_producer_id(ProducerId(-1))
                    .with_producer_epoch(-1)
                    .with_transaction_start_time_ms(-1),
                Some(s) => out
                    .with_transaction_state(str_bytes(s.status.name()))
                    .with_transaction_timeout_ms(s.timeout_ms)
                    .with_transaction_start_time_ms(s.start_ms)
                    .with_producer_id(ProducerId(s.producer_id))
                    .with_producer_epoch(s.producer_epoch)
                    .with_topics(topics_of(&s)),
            }
        })
        .collect();
    DescribeTransactionsResponse::default().with_transaction_states(states)
}

/// A transaction's partitions, by topic.
fn topics_of(state: &TxnState) -> Vec<TopicData> {
    let mut topics: Vec<TopicData> = Vec::new();
    for (topic, index) in &state.partitions {
        match topics.last_mut() {
            Some(t) if t.topic.as_str() == topic => t.partitions.push(*index),
            _ => topics.push(
                TopicData::default()
                    .with_topic(topic_name(topic))
                    .with_partitions(vec![*index]),
            ),
        }
    }
    topics
}

/// ListTransactions: every transactional id that passes all the filters
/// given (states by name, producer ids, running longer than a duration,
/// ids matching a pattern), as Kafka filters them. Unknown state names
/// are reported back and match nothing.
pub fn list_transactions(broker: &Broker, req: ListTransactionsRequest) -> ListTransactionsResponse {
    let response = ListTransactionsResponse::default();
    let pattern = match req.transactional_id_pattern.as_ref().filter(|p| !p.is_empty()) {
        None => None,
        Some(p) => match regex::Regex::new(&format!("^(?:{})$", p.as_str())) {
            Ok(re) => Some(re),
            Err(_) => return response.with_error_code(ResponseError::InvalidRegularExpression.code()),
        },
    };
    let mut states = Vec::new();
    let mut unknown = Vec::new();
    for name in &req.state_filters {
        match TxnStatus::from_name(name.as_str()) {
            Some(s) => states.push(s),
            None => unknown.push(name.clone()),
        }
    }
    let filter = ListFilter {
        states: (!req.state_filters.is_empty()).then_some(states),
        producer_ids: req.producer_id_filters.iter().map(|p| p.0).collect(),
        min_duration_ms: req.duration_filter,
    };
    let now = broker.txns.now_ms();
    let listed = broker
        .txns
        .describe_all()
        .into_iter()
        .filter(|d| {
            filter.matches(&d.state, now)
                && pattern.as_ref().is_none_or(|re| re.is_match(&d.transactional_id))
        })
        .map(|d| {
            list_transactions_response::TransactionState::default()
                .with_transactional_id(TransactionalId(str_bytes(d.transactional_id)))
                .with_producer_id(ProducerId(d.state.producer_id))
                .with_transaction_state(str_bytes(d.state.status.name()))
        })
        .collect();
    response
        .with_unknown_state_filters(unknown)
        .with_transaction_states(listed)
}

/// DescribeProducers: each partition's producers, with the first offset
/// of the transaction each has open there (what `kafka-transactions
/// find-hanging` compares with the coordinator's view).
pub fn describe_producers(broker: &Broker, req: DescribeProducersRequest) -> DescribeProducersResponse {
    let topics = req
        .topics
        .into_iter()
        .map(|t| {
            let partitions = t
                .partition_indexes
                .iter()
                .map(|&index| {
                    let out = PartitionResponse::default().with_partition_index(index);
                    match partition_of(broker, t.name.as_str(), index) {
                        Err(e) => out.with_error_code(e.code()),
                        Ok(p) => {
                            let producers = p
                                .describe_producers()
                                .into_iter()
                                .map(|info| {
                                    ProducerState::default()
                                        .with_producer_id(ProducerId(info.producer_id))
                                        .with_producer_epoch(i32::from(info.epoch))
                                        .with_last_sequence(info.last_sequence)
                                        .with_last_timestamp(info.last_timestamp_ms)
                                        .with_coordinator_epoch(info.coordinator_epoch)
                                        .with_current_txn_start_offset(info.txn_start_offset)
                                })
                                .collect();
                            out.with_active_producers(producers)
                        }
                    }
                })
                .collect();
            TopicResponse::default()
                .with_name(t.name)
                .with_partitions(partitions)
        })
        .collect();
    DescribeProducersResponse::default().with_topics(topics)
}

/// WriteTxnMarkers: writes each marker into its partitions, as a
/// coordinator would (a partition of `__consumer_offsets` ends the
/// producer's offsets in the group log). A cluster's coordinators send it
/// to the leaders of their transactions' partitions; operators send it
/// (`kafka-transactions abort`) to end a transaction whose coordinator no
/// longer will. A marker older
/// than a partition's producer state is refused there
/// (INVALID_PRODUCER_EPOCH, TRANSACTION_COORDINATOR_FENCED); on one node,
/// one claiming a coordinator newer than Keel's is INVALID_REQUEST.
pub async fn write_txn_markers(broker: &Arc<Broker>, req: WriteTxnMarkersRequest) -> WriteTxnMarkersResponse {
    let mut markers = Vec::with_capacity(req.markers.len());
    for m in req.markers {
        let marker = Marker {
            commit: m.transaction_result,
            coordinator_epoch: m.coordinator_epoch,
        };
        let mut topics = Vec::with_capacity(m.topics.len());
        for t in m.topics {
            let mut partitions = Vec::with_capacity(t.partition_indexes.len());
            for index in t.partition_indexes {
                let one_node = !broker.topics_shared();
                let written = if one_node && m.coordinator_epoch > COORDINATOR_EPOCH {
                    // One node's one coordinator is at COORDINATOR_EPOCH:
                    // a marker claiming a newer one is forged, and would
                    // fence the coordinator's own markers out of the
                    // partition. (A cluster's coordinators write at their
                    // partitions' leader epochs.)
                    Err(ResponseError::InvalidRequest)
                } else if super::markers::in_group_log(broker, t.name.as_str(), index) {
                    group_marker(broker, index, (m.producer_id.0, m.producer_epoch), marker).await
                } else {
                    match partition_of(broker, t.name.as_str(), index) {
                    Err(e) => Err(e),
                    Ok(p) => match p.write_marker(m.producer_id.0, m.producer_epoch, marker).await {
                        Ok(a) => super::produce::durable(&p, a, MARKER_COMMIT_WAIT).await,
                        Err(f) => Err(f),
                    }
                    .map(|_| ())
                    .map_err(|f| {
                            tracing::warn!(topic = %t.name.as_str(), partition = index, message = %f.message, "a WriteTxnMarkers marker was refused");
                            f.error
                        }),
                    }
                };
                partitions.push(
                    WritableTxnMarkerPartitionResult::default()
                        .with_partition_index(index)
                        .with_error_code(written.err().map_or(0, |e| e.code())),
                );
            }
            topics.push(
                WritableTxnMarkerTopicResult::default()
                    .with_name(t.name)
                    .with_partitions(partitions),
            );
        }
        markers.push(
            WritableTxnMarkerResult::default()
                .with_producer_id(m.producer_id)
                .with_topics(topics),
        );
    }
    WriteTxnMarkersResponse::default().with_markers(markers)
}

/// A marker for a partition of the group log, as WriteTxnMarkers answers
/// it: NOT_LEADER_OR_FOLLOWER where another broker leads the partition,
/// COORDINATOR_LOAD_IN_PROGRESS while it loads here or has no leader.
async fn group_marker(
    broker: &Arc<Broker>,
    index: i32,
    producer: (i64, i16),
    marker: Marker,
) -> Result<(), ResponseError> {
    match super::markers::group_marker(broker, index, producer, marker).await {
        Ok(None) => Ok(()),
        Ok(Some(_)) => Err(ResponseError::NotLeaderOrFollower),
        Err(why) => {
            tracing::warn!(partition = index, %why, "a WriteTxnMarkers marker for the group log waits");
            Err(ResponseError::CoordinatorLoadInProgress)
        }
    }
}
