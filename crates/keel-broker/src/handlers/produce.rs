//! Produce and InitProducerId.

use std::sync::Arc;

use bytes::Bytes;
use keel_log::batch::{validate_batches, BatchError, BatchHeader};
use keel_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use keel_protocol::messages::*;
use keel_protocol::ResponseError;

use super::str_bytes;
use crate::partition::{AppendFailure, Partition};
use crate::topics::Topic;
use crate::Broker;

/// Handles a Produce request. `None` means no response is sent (acks=0).
pub async fn produce(broker: &Arc<Broker>, req: ProduceRequest) -> Option<ProduceResponse> {
    let acks = req.acks;
    if req.transactional_id.is_some() {
        return Some(all_failed(req, ResponseError::TransactionalIdAuthorizationFailed));
    }
    if !matches!(acks, -1..=1) {
        return Some(all_failed(req, ResponseError::InvalidRequiredAcks));
    }
    // Partitions are appended concurrently: a slow write on one does not
    // hold back the others in the same request.
    let mut pending = Vec::new();
    for t in req.topic_data {
        let topic = broker.topics.resolve(t.name.0.as_str(), t.topic_id);
        for p in t.partition_data {
            let topic = topic.clone();
            let b = Arc::clone(broker);
            let task = tokio::spawn(async move { produce_partition(&b, topic, p.index, p.records).await });
            pending.push((t.name.clone(), t.topic_id, p.index, task));
        }
    }
    let mut responses: Vec<TopicProduceResponse> = Vec::new();
    for (name, id, index, task) in pending {
        let result = task
            .await
            .unwrap_or_else(|e| failed(ResponseError::UnknownServerError, e.to_string()));
        let partition = result.with_index(index);
        match responses.iter_mut().find(|r| r.name == name && r.topic_id == id) {
            Some(r) => r.partition_responses.push(partition),
            None => responses.push(
                TopicProduceResponse::default()
                    .with_name(name)
                    .with_topic_id(id)
                    .with_partition_responses(vec![partition]),
            ),
        }
    }
    (acks != 0).then(|| ProduceResponse::default().with_responses(responses))
}

async fn produce_partition(
    broker: &Broker,
    topic: Result<Arc<Topic>, ResponseError>,
    index: i32,
    records: Option<Bytes>,
) -> PartitionProduceResponse {
    let topic = match topic {
        Ok(t) => t,
        Err(e) => return failed(e, String::new()),
    };
    let Some(partition) = topic.partition(index).cloned() else {
        return failed(ResponseError::UnknownTopicOrPartition, String::new());
    };
    let records = records.unwrap_or_default();
    let max_batch_bytes = broker.config.max_message_bytes(&topic.meta.configs);
    let headers = match check_records(&records, max_batch_bytes) {
        Ok(h) => h,
        Err((error, message)) => return failed(error, message),
    };
    append(&partition, records, headers).await
}

/// Validates a partition's records before they reach the log: whole v2
/// batches with valid CRCs, each within `max.message.bytes`.
fn check_records(
    records: &[u8],
    max_batch_bytes: usize,
) -> Result<Vec<BatchHeader>, (ResponseError, String)> {
    let headers = validate_batches(records).map_err(|e| {
        let error = match e {
            BatchError::UnsupportedMagic(_) => ResponseError::UnsupportedForMessageFormat,
            _ => ResponseError::CorruptMessage,
        };
        (error, e.to_string())
    })?;
    if let Some(h) = headers.iter().find(|h| h.total_len() > max_batch_bytes) {
        return Err((
            ResponseError::MessageTooLarge,
            format!(
                "batch of {} bytes exceeds max.message.bytes={max_batch_bytes}",
                h.total_len()
            ),
        ));
    }
    if let Some(h) = headers.iter().find(|h| h.is_transactional() || h.is_control()) {
        return Err((
            ResponseError::InvalidRecord,
            format!(
                "transactional batches are not supported (producer {})",
                h.producer_id
            ),
        ));
    }
    Ok(headers)
}

async fn append(
    partition: &Arc<Partition>,
    records: Bytes,
    headers: Vec<BatchHeader>,
) -> PartitionProduceResponse {
    match partition.append(records, headers).await {
        Ok(a) => PartitionProduceResponse::default()
            .with_base_offset(a.base_offset)
            .with_log_append_time_ms(-1)
            .with_log_start_offset(a.log_start_offset),
        Err(AppendFailure { error, message }) => failed(error, message),
    }
}

fn failed(error: ResponseError, message: String) -> PartitionProduceResponse {
    PartitionProduceResponse::default()
        .with_error_code(error.code())
        .with_base_offset(-1)
        .with_log_append_time_ms(-1)
        .with_log_start_offset(-1)
        .with_error_message((!message.is_empty()).then(|| str_bytes(message)))
}

fn all_failed(req: ProduceRequest, error: ResponseError) -> ProduceResponse {
    let responses = req
        .topic_data
        .into_iter()
        .map(|t| {
            let partitions = t
                .partition_data
                .iter()
                .map(|p| failed(error, String::new()).with_index(p.index))
                .collect();
            TopicProduceResponse::default()
                .with_name(t.name)
                .with_topic_id(t.topic_id)
                .with_partition_responses(partitions)
        })
        .collect();
    ProduceResponse::default().with_responses(responses)
}

pub async fn init_producer_id(broker: &Arc<Broker>, req: InitProducerIdRequest) -> InitProducerIdResponse {
    let resp = InitProducerIdResponse::default()
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    if req.transactional_id.is_some() {
        // Transactions need a transaction coordinator, which Keel lacks.
        return resp.with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code());
    }
    // An idempotent producer re-initialising with its id (KIP-360) gets the
    // next epoch of the same id, which resets its sequences.
    if req.producer_id.0 >= 0 && req.producer_epoch >= 0 && req.producer_epoch < i16::MAX - 1 {
        return resp
            .with_producer_id(req.producer_id)
            .with_producer_epoch(req.producer_epoch + 1);
    }
    let b = Arc::clone(broker);
    match tokio::task::spawn_blocking(move || b.producer_ids.lock().allocate()).await {
        Ok(Ok(id)) => resp.with_producer_id(ProducerId(id)).with_producer_epoch(0),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "cannot allocate a producer id");
            resp.with_error_code(ResponseError::KafkaStorageError.code())
        }
        Err(_) => resp.with_error_code(ResponseError::UnknownServerError.code()),
    }
}
