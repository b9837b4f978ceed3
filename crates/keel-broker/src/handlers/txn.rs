//! The transaction APIs (InitProducerId with a transactional id is in
//! `produce.rs`, TxnOffsetCommit in `groups.rs`), and the marker writer:
//! the part of ending a transaction that touches partitions, which the
//! coordinator (`keel_coord::txn`) leaves to the broker.

use std::sync::Arc;

use keel_protocol::messages::add_partitions_to_txn_request::{
    AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction,
};
use keel_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult,
};
use keel_protocol::messages::*;
use keel_protocol::ResponseError;

use super::{partition_exists, str_bytes};
use crate::Broker;
use keel_coord::txn::EndOutcome;

/// What a producer whose epoch is older gets: PRODUCER_FENCED from the
/// versions that know it (KIP-588), INVALID_PRODUCER_EPOCH before.
fn fenced_error(version: i16, first_version_with_fenced: i16) -> ResponseError {
    if version >= first_version_with_fenced {
        ResponseError::ProducerFenced
    } else {
        ResponseError::InvalidProducerEpoch
    }
}

pub async fn add_partitions_to_txn(
    broker: &Arc<Broker>,
    req: AddPartitionsToTxnRequest,
    version: i16,
) -> AddPartitionsToTxnResponse {
    let fenced = fenced_error(version, 2);
    if version <= 3 {
        let results = add_one(
            broker,
            req.v3_and_below_transactional_id.as_str(),
            (req.v3_and_below_producer_id.0, req.v3_and_below_producer_epoch),
            false,
            &req.v3_and_below_topics,
            fenced,
            version,
        )
        .await;
        return AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(results);
    }
    let mut out = Vec::with_capacity(req.transactions.len());
    for t in &req.transactions {
        let results = add_one(
            broker,
            t.transactional_id.as_str(),
            (t.producer_id.0, t.producer_epoch),
            t.verify_only,
            &t.topics,
            fenced,
            version,
        )
        .await;
        out.push(
            AddPartitionsToTxnResult::default()
                .with_transactional_id(t.transactional_id.clone())
                .with_topic_results(results),
        );
    }
    AddPartitionsToTxnResponse::default().with_results_by_transaction(out)
}

/// One transaction's partitions: all fail with the id's coordinator
/// error when this broker does not serve it; else unknown ones fail on
/// their own and the
/// others are OPERATION_NOT_ATTEMPTED, as in Kafka; verify-only requests
/// check each partition is in the open transaction.
async fn add_one(
    broker: &Arc<Broker>,
    id: &str,
    (producer_id, epoch): (i64, i16),
    verify_only: bool,
    topics: &[AddPartitionsToTxnTopic],
    fenced: ResponseError,
    version: i16,
) -> Vec<AddPartitionsToTxnTopicResult> {
    // v5 is what a partition leader sends for a produce under
    // transactions v2 (its implicit add).
    let client_version = if version >= 5 {
        keel_coord::txn::state::TRANSACTION_VERSION_2
    } else {
        0
    };
    let requested: Vec<(String, i32)> = topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| (t.name.0.to_string(), *p)))
        .collect();
    let unknown: Vec<bool> = requested
        .iter()
        .map(|(t, p)| !partition_exists(broker, t, *p))
        .collect();
    let errors: Vec<Option<ResponseError>> = if let Some(e) = broker.txn_refused(id) {
        // In a cluster, another broker coordinates the id (or this one
        // still loads it).
        vec![Some(e); requested.len()]
    } else if verify_only {
        requested
            .iter()
            .map(|p| broker.txns.verify(id, producer_id, epoch, p).err())
            .collect()
    } else if unknown.iter().any(|u| *u) {
        unknown
            .iter()
            .map(|u| {
                Some(if *u {
                    ResponseError::UnknownTopicOrPartition
                } else {
                    ResponseError::OperationNotAttempted
                })
            })
            .collect()
    } else {
        let result = broker
            .txns
            .add_partitions(id, producer_id, epoch, &requested, client_version, fenced)
            .await;
        vec![result.err(); requested.len()]
    };
    let mut results: Vec<AddPartitionsToTxnTopicResult> = Vec::new();
    for ((topic, partition), error) in requested.into_iter().zip(errors) {
        let r = AddPartitionsToTxnPartitionResult::default()
            .with_partition_index(partition)
            .with_partition_error_code(error.map_or(0, |e| e.code()));
        match results.iter_mut().find(|t| t.name.0.as_str() == topic) {
            Some(t) => t.results_by_partition.push(r),
            None => results.push(
                AddPartitionsToTxnTopicResult::default()
                    .with_name(TopicName(super::str_bytes(topic)))
                    .with_results_by_partition(vec![r]),
            ),
        }
    }
    results
}

/// What a partition leader or a group coordinator asks of a transaction's
/// coordinator on another broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ask {
    /// Add the partitions (transactions v2's implicit add), retrying for
    /// up to this long while the transaction is busy
    /// (CONCURRENT_TRANSACTIONS), every
    /// `add.partitions.to.txn.retry.backoff.ms`.
    Add(std::time::Duration),
    /// Whether the partitions are in the open transaction.
    Verify,
}

/// Where transactional id `id`'s coordinator is, for a partition leader
/// or group coordinator that must ask it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CoordinatorAt {
    Here,
    /// Another broker: asked with [`ask_coordinator`].
    Elsewhere,
    /// Nowhere that can answer now (no live coordinator, or this broker
    /// still loads the id): COORDINATOR_NOT_AVAILABLE or
    /// COORDINATOR_LOAD_IN_PROGRESS, which clients retry.
    Unavailable(ResponseError),
}

pub(crate) fn coordinator_at(broker: &Broker, id: &str) -> CoordinatorAt {
    match broker.txn_refused(id) {
        None => CoordinatorAt::Here,
        Some(ResponseError::NotCoordinator) => CoordinatorAt::Elsewhere,
        Some(e) => CoordinatorAt::Unavailable(e),
    }
}

/// How long a coordinator on another broker is waited for, per request.
const ASK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The AddPartitionsToTxn version partition leaders send (KIP-890).
const BROKER_ADD_VERSION: i16 = 5;

/// Asks transactional id `id`'s coordinator, another broker, about
/// `partitions` of producer `producer`'s transaction with AddPartitionsToTxn
/// v5, as Kafka's partition leaders do: the first partition's error, if
/// any. A coordinator this broker cannot reach is COORDINATOR_NOT_AVAILABLE.
pub(crate) async fn ask_coordinator(
    broker: &Broker,
    id: &str,
    (producer_id, epoch): (i64, i16),
    partitions: &[(String, i32)],
    ask: Ask,
) -> Result<(), ResponseError> {
    let node = broker.coordinator_of(id, true)?;
    let mut topics: Vec<AddPartitionsToTxnTopic> = Vec::new();
    for (topic, index) in partitions {
        match topics.iter_mut().find(|t| t.name.0.as_str() == topic) {
            Some(t) => t.partitions.push(*index),
            None => topics.push(
                AddPartitionsToTxnTopic::default()
                    .with_name(TopicName(str_bytes(topic.as_str())))
                    .with_partitions(vec![*index]),
            ),
        }
    }
    let req =
        AddPartitionsToTxnRequest::default().with_transactions(vec![AddPartitionsToTxnTransaction::default(
        )
        .with_transactional_id(TransactionalId(str_bytes(id)))
        .with_producer_id(ProducerId(producer_id))
        .with_producer_epoch(epoch)
        .with_verify_only(ask == Ask::Verify)
        .with_topics(topics)]);
    let max_wait = match ask {
        Ask::Add(wait) => wait,
        Ask::Verify => std::time::Duration::ZERO,
    };
    let deadline = tokio::time::Instant::now() + max_wait;
    let backoff_ms = broker.config().num("add.partitions.to.txn.retry.backoff.ms");
    let backoff = std::time::Duration::from_millis(u64::try_from(backoff_ms).unwrap_or(20).max(1));
    loop {
        let answer = broker
            .peer_request(node, BROKER_ADD_VERSION, &req, ASK_WAIT)
            .await
            .map_err(|e| {
                tracing::warn!(transactional_id = id, coordinator = node, error = %e, "cannot ask a transaction's coordinator");
                ResponseError::CoordinatorNotAvailable
            })?;
        match first_error(&answer, partitions.len()) {
            None => return Ok(()),
            Some(ResponseError::ConcurrentTransactions)
                if tokio::time::Instant::now() + backoff < deadline =>
            {
                tokio::time::sleep(backoff).await;
            }
            Some(e) if answers_client(e) => return Err(e),
            Some(e) => {
                // The coordinator refused this broker, not the client's
                // transaction (its principal lacks CLUSTER_ACTION, say):
                // an error the client retries, and a line for the operator.
                tracing::error!(transactional_id = id, coordinator = node, error = ?e, "a transaction's coordinator refused this broker's AddPartitionsToTxn");
                return Err(ResponseError::CoordinatorNotAvailable);
            }
        }
    }
}

/// The error of an AddPartitionsToTxn answer: the request's, else the
/// first partition's that is not OPERATION_NOT_ATTEMPTED (which only
/// says another partition failed). An answer for fewer partitions than
/// asked about is not a yes.
fn first_error(answer: &AddPartitionsToTxnResponse, asked: usize) -> Option<ResponseError> {
    let of = |code: i16| {
        ResponseError::try_from_code(code).or((code != 0).then_some(ResponseError::UnknownServerError))
    };
    if let Some(e) = of(answer.error_code) {
        return Some(e);
    }
    let codes: Vec<i16> = answer
        .results_by_transaction
        .iter()
        .flat_map(|t| &t.topic_results)
        .flat_map(|t| &t.results_by_partition)
        .map(|p| p.partition_error_code)
        .collect();
    if codes.len() < asked {
        return Some(ResponseError::UnknownServerError);
    }
    let not_attempted = ResponseError::OperationNotAttempted.code();
    codes
        .iter()
        .find(|c| **c != 0 && **c != not_attempted)
        .or(codes.iter().find(|c| **c != 0))
        .and_then(|c| of(*c))
}

/// The coordinator's answers that are about the client's transaction, as
/// the client would get them from the coordinator itself.
fn answers_client(e: ResponseError) -> bool {
    matches!(
        e,
        ResponseError::ConcurrentTransactions
            | ResponseError::InvalidProducerEpoch
            | ResponseError::ProducerFenced
            | ResponseError::InvalidTxnState
            | ResponseError::InvalidProducerIdMapping
            | ResponseError::UnknownTopicOrPartition
            | ResponseError::TransactionalIdAuthorizationFailed
            | ResponseError::NotCoordinator
            | ResponseError::CoordinatorNotAvailable
            | ResponseError::CoordinatorLoadInProgress
    )
}

/// AddOffsetsToTxn: the transaction will commit offsets of `group_id`,
/// so it takes in the group's partition of `__consumer_offsets` (one
/// node's one group log is its partition 0).
pub async fn add_offsets_to_txn(
    broker: &Arc<Broker>,
    req: AddOffsetsToTxnRequest,
    version: i16,
) -> AddOffsetsToTxnResponse {
    let error = if req.group_id.is_empty() {
        Err(ResponseError::InvalidGroupId)
    } else {
        broker
            .txns
            .add_partitions(
                req.transactional_id.as_str(),
                req.producer_id.0,
                req.producer_epoch,
                &[broker.offsets_partition_of(req.group_id.as_str())],
                0,
                fenced_error(version, 2),
            )
            .await
    };
    AddOffsetsToTxnResponse::default().with_error_code(error.err().map_or(0, |e| e.code()))
}

/// EndTxn. From v5 (transactions v2) every end bumps the epoch, and the
/// answer carries the producer id and epoch the client goes on with.
pub async fn end_txn(broker: &Arc<Broker>, req: EndTxnRequest, version: i16) -> EndTxnResponse {
    let (error, (pid, epoch)) = match end(broker, &req, version).await {
        Ok(answer) => (0, answer),
        Err(e) => (e.code(), (-1, -1)),
    };
    EndTxnResponse::default()
        .with_error_code(error)
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(epoch)
}

/// Ends the transaction (allocating the producer id an exhausted epoch
/// hands over to, once) and starts its markers: the id and epoch to
/// answer with.
async fn end(broker: &Arc<Broker>, req: &EndTxnRequest, version: i16) -> Result<(i64, i16), ResponseError> {
    let id = req.transactional_id.as_str();
    let producer = (req.producer_id.0, req.producer_epoch);
    let mut fresh = None;
    loop {
        let outcome = broker
            .txns
            .end_txn(
                id,
                producer,
                req.committed,
                version >= 5,
                fresh,
                fenced_error(version, 2),
            )
            .await?;
        match outcome {
            EndOutcome::NeedProducerId if fresh.is_none() => {
                fresh = Some(super::produce::allocate_producer_id(broker).await?);
            }
            EndOutcome::NeedProducerId => return Err(ResponseError::UnknownServerError),
            EndOutcome::Done(pid, epoch) => return Ok((pid, epoch)),
            EndOutcome::Prepared(prepared) => {
                let answer = prepared.handed_out();
                super::markers::spawn_markers(broker, id.to_string(), prepared);
                return Ok(answer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(codes: &[i16]) -> AddPartitionsToTxnResponse {
        let partitions = codes
            .iter()
            .enumerate()
            .map(|(i, c)| {
                AddPartitionsToTxnPartitionResult::default()
                    .with_partition_index(i as i32)
                    .with_partition_error_code(*c)
            })
            .collect();
        AddPartitionsToTxnResponse::default().with_results_by_transaction(vec![
            AddPartitionsToTxnResult::default().with_topic_results(vec![
                AddPartitionsToTxnTopicResult::default().with_results_by_partition(partitions),
            ]),
        ])
    }

    #[test]
    fn a_coordinators_answer_is_read_as_its_first_real_error() {
        let not_attempted = ResponseError::OperationNotAttempted.code();
        let unknown = ResponseError::UnknownTopicOrPartition.code();
        assert_eq!(first_error(&answer(&[0, 0]), 2), None);
        assert_eq!(
            first_error(&answer(&[not_attempted, unknown]), 2),
            Some(ResponseError::UnknownTopicOrPartition)
        );
        assert_eq!(
            first_error(&answer(&[not_attempted]), 1),
            Some(ResponseError::OperationNotAttempted)
        );
        // An answer for fewer partitions than asked is no yes.
        assert_eq!(
            first_error(&answer(&[0]), 2),
            Some(ResponseError::UnknownServerError)
        );
        let refused = answer(&[0]).with_error_code(ResponseError::ClusterAuthorizationFailed.code());
        let e = first_error(&refused, 1).unwrap();
        assert_eq!(e, ResponseError::ClusterAuthorizationFailed);
        // Which a client is not shown as it is.
        assert!(!answers_client(e));
        assert!(answers_client(ResponseError::ConcurrentTransactions));
    }
}
