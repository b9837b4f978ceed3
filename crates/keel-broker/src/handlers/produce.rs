//! Produce and InitProducerId.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use keel_log::batch::{
    set_log_append_time, validate_batches, validate_records, BatchError, BatchHeader, RecordTimestamps,
    NO_TIMESTAMP,
};
use keel_log::codec::Codec;
use keel_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use keel_protocol::messages::*;
use keel_protocol::ResponseError;

use super::str_bytes;
use crate::config::{topic_def, BrokerConfig};
use crate::metrics::APPEND;
use crate::partition::{AppendFailure, AppendTrace, Partition};
use crate::time::now_ms;
use crate::topics::Topic;
use crate::trace::{self, PartitionTrace, Place, Stage};
use crate::Broker;

/// The first Produce version that may carry zstd batches (KIP-110); older
/// clients could not read them back either.
const ZSTD_MIN_PRODUCE_VERSION: i16 = 7;

/// The first Produce version whose transactional batches add their
/// partition to the transaction themselves (transactions v2, KIP-890).
const IMPLICIT_ADD_VERSION: i16 = 12;

/// Handles a Produce request. With acks=0 the response is not sent; see
/// [`acks_zero_failure`].
pub async fn produce(broker: &Arc<Broker>, req: ProduceRequest, version: i16) -> ProduceResponse {
    if !matches!(req.acks, -1..=1) {
        return all_failed(req, ResponseError::InvalidRequiredAcks);
    }
    trace::expect_appends(req.topic_data.iter().map(|t| t.partition_data.len()).sum());
    let txn = match req
        .transactional_id
        .as_ref()
        .map(|t| Arc::<str>::from(t.as_str()))
    {
        None => None,
        Some(id) if version >= IMPLICIT_ADD_VERSION => {
            let checking = Instant::now();
            let added = add_to_transaction(broker, &id, &req).await;
            trace::longest(Stage::Coordinator, checking.elapsed());
            Some(TxnCheck::Added(added))
        }
        Some(id) => Some(TxnCheck::Verify(id)),
    };
    if let [t] = &req.topic_data[..] {
        if let [p] = &t.partition_data[..] {
            // One partition, the common case: appended in this task, with
            // no task of its own to schedule and join.
            let topic = broker.topics.resolve(t.name.0.as_str(), t.topic_id);
            let result = produce_partition(broker, topic, p.index, p.records.clone(), txn, version).await;
            let response = TopicProduceResponse::default()
                .with_name(t.name.clone())
                .with_topic_id(t.topic_id)
                .with_partition_responses(vec![result.with_index(p.index)]);
            return ProduceResponse::default().with_responses(vec![response]);
        }
    }
    // Partitions are appended concurrently: a slow write on one does not
    // hold back the others in the same request.
    let mut pending = Vec::new();
    for t in req.topic_data {
        let topic = broker.topics.resolve(t.name.0.as_str(), t.topic_id);
        for p in t.partition_data {
            let topic = topic.clone();
            let b = Arc::clone(broker);
            let txn = txn.clone();
            let work = async move { produce_partition(&b, topic, p.index, p.records, txn, version).await };
            let task = tokio::spawn(trace::within(trace::current(), work));
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
    ProduceResponse::default().with_responses(responses)
}

/// For an acks=0 Produce, which gets no response: the first partition
/// that failed, as `topic-partition: error`. Kafka closes the connection
/// then, so that the producer notices (it refreshes its metadata and
/// reconnects) instead of sending on into the error.
pub fn acks_zero_failure(response: &ProduceResponse) -> Option<String> {
    response.responses.iter().find_map(|t| {
        t.partition_responses.iter().find_map(|p| {
            (p.error_code != 0).then(|| {
                let topic = if t.name.0.is_empty() {
                    t.topic_id.to_string()
                } else {
                    t.name.0.to_string()
                };
                format!(
                    "acks=0 produce to {topic}-{} failed with error {}",
                    p.index, p.error_code
                )
            })
        })
    })
}

async fn produce_partition(
    broker: &Broker,
    topic: Result<Arc<Topic>, ResponseError>,
    index: i32,
    records: Option<Bytes>,
    txn: Option<TxnCheck>,
    version: i16,
) -> PartitionProduceResponse {
    let topic = match topic {
        Ok(t) => t,
        Err(e) => return failed(e, String::new()),
    };
    let Some(partition) = topic.partition(index).cloned() else {
        return failed(ResponseError::UnknownTopicOrPartition, String::new());
    };
    let records = records.unwrap_or_default();
    // One snapshot of the configs for all of this batch's checks.
    let config = broker.config();
    let max_batch_bytes = config.max_message_bytes(&topic.meta.configs);
    let validating = Instant::now();
    let headers = check_records(&records, max_batch_bytes);
    trace::longest(Stage::Validate, validating.elapsed());
    let headers = match headers {
        Ok(h) => h,
        Err((error, message)) => return failed(error, message),
    };
    if headers[0].compression_codec() == Codec::Zstd as u8 && version < ZSTD_MIN_PRODUCE_VERSION {
        return failed(
            ResponseError::UnsupportedCompressionType,
            format!("Produce requests with version {version} are not allowed to use ZStandard compression"),
        );
    }
    if let Err((error, message)) = check_transaction(broker, &headers[0], txn, &topic, index) {
        return failed(error, message);
    }
    if config
        .cleanup_policy(&topic.meta.configs)
        .is_ok_and(|p| p.compact)
    {
        // Kafka opens compressed batches of compacted topics for this too.
        let keyless = match keel_log::records::first_keyless_record(&records, &headers[0]) {
            Ok(k) => k,
            Err(why) => return failed(ResponseError::CorruptMessage, why),
        };
        if let Some(record) = keyless {
            let message = format!(
                "Compacted topic cannot accept message without key in topic partition {}-{index}",
                topic.meta.name
            );
            return failed(ResponseError::InvalidRecord, message.clone()).with_record_errors(vec![
                BatchIndexAndErrorMessage::default()
                    .with_batch_index(i32::try_from(record).unwrap_or(i32::MAX))
                    .with_batch_index_error_message(Some(str_bytes(message))),
            ]);
        }
    }
    let (records, headers) = match in_topic_codec(&config, &topic, records, headers, max_batch_bytes).await {
        Ok(converted) => converted,
        Err((error, message)) => return failed(error, message),
    };
    let policy = TimestampPolicy::of(&config, &topic.meta.configs);
    match policy.apply(records, headers, now_ms()) {
        Ok(stamped) => append(&partition, stamped).await,
        Err(refused) => {
            failed(ResponseError::InvalidTimestamp, refused.message).with_record_errors(refused.record_errors)
        }
    }
}

/// Batches this large are recompressed on the blocking pool, not on the
/// request's worker thread.
const RECOMPRESS_INLINE_MAX_BYTES: usize = 64 << 10;

/// The batch in its topic's `compression.type` when that names a codec
/// other than the batch's own, as Kafka's `LogValidator` rebuilds it; as
/// sent otherwise (`producer`, or the same codec). The rebuilt batch must
/// still fit `max.message.bytes`.
async fn in_topic_codec(
    config: &BrokerConfig,
    topic: &Topic,
    records: Bytes,
    headers: Vec<BatchHeader>,
    max_batch_bytes: usize,
) -> Result<(Bytes, Vec<BatchHeader>), (ResponseError, String)> {
    let Some((codec, level)) = config.topic_compression(&topic.meta.configs) else {
        return Ok((records, headers));
    };
    if headers[0].compression_codec() == codec as u8 {
        return Ok((records, headers));
    }
    let started = Instant::now();
    let header = headers[0];
    let rebuild = move || keel_log::records::recompress_batch(&records, &header, codec, level);
    let rebuilt = if headers[0].total_len() <= RECOMPRESS_INLINE_MAX_BYTES {
        rebuild()
    } else {
        tokio::task::spawn_blocking(rebuild)
            .await
            .unwrap_or_else(|e| Err(format!("recompression failed: {e}")))
    };
    trace::longest(Stage::Validate, started.elapsed());
    let rebuilt = rebuilt.map_err(|why| (ResponseError::CorruptMessage, why))?;
    let header = BatchHeader::parse(&rebuilt).map_err(|e| (ResponseError::CorruptMessage, e.to_string()))?;
    if header.total_len() > max_batch_bytes {
        return Err((
            ResponseError::MessageTooLarge,
            format!(
                "batch of {} bytes in {} exceeds max.message.bytes={max_batch_bytes}",
                header.total_len(),
                codec.name()
            ),
        ));
    }
    Ok((Bytes::from(rebuilt), vec![header]))
}

/// Validates a partition's records before they reach the log, as Kafka's
/// `ProduceRequest.validateRecords` and `LogValidator` do: exactly one
/// whole v2 batch with a valid CRC, within `max.message.bytes`, whose
/// header agrees with itself (record count = last offset delta + 1, a
/// sequence when it names a producer) and, when uncompressed, with its
/// records. Anything else is refused before it can cost an offset.
pub(crate) fn check_records(
    records: &[u8],
    max_batch_bytes: usize,
) -> Result<Vec<BatchHeader>, (ResponseError, String)> {
    let invalid = |message: String| (ResponseError::InvalidRecord, message);
    let headers = validate_batches(records).map_err(|e| match e {
        BatchError::UnsupportedMagic(m) => invalid(format!(
            "produce requests may only carry record batches with magic 2, not {m}"
        )),
        BatchError::InvalidOffsetDelta(_) | BatchError::InvalidRecordCount(_) => invalid(e.to_string()),
        _ => (ResponseError::CorruptMessage, e.to_string()),
    })?;
    let [h] = headers[..] else {
        return Err(invalid(format!(
            "produce requests may carry exactly one record batch per partition, not {}",
            headers.len()
        )));
    };
    if h.total_len() > max_batch_bytes {
        return Err((
            ResponseError::MessageTooLarge,
            format!(
                "batch of {} bytes exceeds max.message.bytes={max_batch_bytes}",
                h.total_len()
            ),
        ));
    }
    if h.is_control() {
        return Err(invalid(format!(
            "control batches are written by the transaction coordinator, not by producers (producer {})",
            h.producer_id
        )));
    }
    if h.records_count <= 0 || i64::from(h.last_offset_delta) + 1 != i64::from(h.records_count) {
        return Err(invalid(format!(
            "inconsistent batch offset range and record count: last offset delta {}, {} records",
            h.last_offset_delta, h.records_count
        )));
    }
    if h.producer_id >= 0 && h.base_sequence < 0 {
        return Err(invalid(format!(
            "invalid sequence number {} in a batch of producer {}",
            h.base_sequence, h.producer_id
        )));
    }
    keel_log::records::codec_of(&h).map_err(invalid)?;
    validate_records(records, &h).map_err(invalid)?;
    Ok(headers)
}

/// How a produce's transactional batches are checked against their
/// transaction.
#[derive(Debug, Clone)]
enum TxnCheck {
    /// Before Produce v12: each partition must be in the open transaction
    /// already (AddPartitionsToTxn).
    Verify(Arc<str>),
    /// Produce v12+ (transactions v2): the request's partitions were added
    /// to the transaction, together, with this outcome.
    Added(Result<(), (ResponseError, String)>),
}

/// Transactions v2: adds every partition a request's transactional
/// batches go to to the transaction, in one step before any is appended,
/// as Kafka's broker sends one AddPartitionsToTxn for a produce request.
/// (Added one by one, at once, all but one would find the transaction busy
/// with the others.) Partitions that do not exist or whose batch does not
/// parse are left out: their own checks refuse them.
async fn add_to_transaction(
    broker: &Broker,
    id: &str,
    req: &ProduceRequest,
) -> Result<(), (ResponseError, String)> {
    let mut producer: Option<(i64, i16)> = None;
    let mut partitions = Vec::new();
    for t in &req.topic_data {
        let Ok(topic) = broker.topics.resolve(t.name.0.as_str(), t.topic_id) else {
            continue;
        };
        for p in &t.partition_data {
            let header = p.records.as_deref().and_then(|r| BatchHeader::parse(r).ok());
            let Some(h) = header.filter(|h| h.is_transactional() && h.producer_id >= 0) else {
                continue;
            };
            if topic.partition(p.index).is_none() {
                continue;
            }
            let this = (h.producer_id, h.producer_epoch);
            if *producer.get_or_insert(this) != this {
                // Kafka refuses such a request whole.
                let message = format!("transactional batches of more than one producer ({id})");
                return Err((ResponseError::InvalidProducerIdMapping, message));
            }
            partitions.push((topic.meta.name.clone(), p.index));
        }
    }
    let Some(producer) = producer else {
        return Ok(());
    };
    let max_wait_ms = broker.config().num("add.partitions.to.txn.retry.backoff.max.ms");
    let max_wait = std::time::Duration::from_millis(u64::try_from(max_wait_ms).unwrap_or(0));
    broker
        .txns
        .add_for_produce(id, producer, &partitions, max_wait)
        .await
        .map_err(|e| {
            let message = format!(
                "cannot add {} partition(s) to the transaction of producer {} epoch {} ({id}): {e:?}",
                partitions.len(),
                producer.0,
                producer.1
            );
            (produce_error(e), message)
        })
}

/// A transactional batch must come with its transactional id, from the
/// producer id and epoch that own it, into a partition its open
/// transaction added (Kafka's partition verification): a batch written
/// outside its transaction would never get a marker and would hold the
/// last stable offset back for good.
fn check_transaction(
    broker: &Broker,
    h: &BatchHeader,
    txn: Option<TxnCheck>,
    topic: &Topic,
    index: i32,
) -> Result<(), (ResponseError, String)> {
    if !h.is_transactional() {
        return Ok(());
    }
    let id = match txn {
        None => {
            return Err((
                ResponseError::InvalidRecord,
                format!(
                    "a transactional batch of producer {} without a transactional id",
                    h.producer_id
                ),
            ))
        }
        // Its partition was in the add (see add_to_transaction).
        Some(TxnCheck::Added(added)) => return added,
        Some(TxnCheck::Verify(id)) => id,
    };
    let partition = (topic.meta.name.clone(), index);
    broker
        .txns
        .verify(&id, h.producer_id, h.producer_epoch, &partition)
        .map_err(|e| {
            let message = format!(
                "producer {} epoch {} of transactional id {id} has no open transaction with {}-{index}",
                h.producer_id, h.producer_epoch, topic.meta.name
            );
            (e, message)
        })
}

/// What a produce answers for the coordinator's refusal of its implicit
/// add, as Kafka's broker translates it for Produce v12+:
/// CONCURRENT_TRANSACTIONS as it is (the last transaction's markers are
/// still being written; clients retry it), the coordinator errors every
/// client retries without a metadata refresh as NOT_ENOUGH_REPLICAS, and
/// PRODUCER_FENCED as INVALID_PRODUCER_EPOCH, which producers expect from
/// a produce.
fn produce_error(e: ResponseError) -> ResponseError {
    match e {
        ResponseError::CoordinatorNotAvailable
        | ResponseError::CoordinatorLoadInProgress
        | ResponseError::NotCoordinator => ResponseError::NotEnoughReplicas,
        ResponseError::ProducerFenced => ResponseError::InvalidProducerEpoch,
        other => other,
    }
}

/// How a topic's records are timestamped (`message.timestamp.type`) and
/// which CreateTime timestamps it accepts (`message.timestamp.before.max.ms`
/// and `message.timestamp.after.max.ms`, relative to the broker's clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TimestampPolicy {
    log_append_time: bool,
    before_max_ms: i64,
    after_max_ms: i64,
}

/// Batches ready to append: with LogAppendTime, rewritten to carry the
/// broker's time, which the response reports.
struct Stamped {
    records: Bytes,
    headers: Vec<BatchHeader>,
    /// -1 for CreateTime topics, as Kafka answers.
    log_append_time_ms: i64,
}

/// Why a partition's records were refused (always INVALID_TIMESTAMP).
struct TimestampRefusal {
    message: String,
    record_errors: Vec<BatchIndexAndErrorMessage>,
}

impl TimestampPolicy {
    fn of(config: &BrokerConfig, overrides: &BTreeMap<String, String>) -> TimestampPolicy {
        let value = |name: &str| topic_def(name).map(|d| config.topic_value(overrides, d));
        let ms = |name: &str, default: i64| value(name).and_then(|v| v.parse().ok()).unwrap_or(default);
        TimestampPolicy {
            log_append_time: value("message.timestamp.type") == Some("LogAppendTime"),
            before_max_ms: ms("message.timestamp.before.max.ms", i64::MAX),
            after_max_ms: ms("message.timestamp.after.max.ms", 3_600_000),
        }
    }

    /// Kafka's `LogValidator` timestamp rules for validated batches at
    /// broker time `now_ms`. A producer may not set the LogAppendTime bit
    /// itself (Kafka refuses that on LogAppendTime topics and rewrites it on
    /// CreateTime ones; Keel refuses it on both).
    fn apply(
        &self,
        records: Bytes,
        mut headers: Vec<BatchHeader>,
        now_ms: i64,
    ) -> Result<Stamped, TimestampRefusal> {
        if headers.iter().any(BatchHeader::timestamp_type_is_log_append) {
            return Err(TimestampRefusal {
                message: "producers may not set the LogAppendTime timestamp type".into(),
                record_errors: Vec::new(),
            });
        }
        if !self.log_append_time {
            self.check_create_times(&records, &headers, now_ms)?;
            return Ok(Stamped {
                records,
                headers,
                log_append_time_ms: -1,
            });
        }
        // One copy of the request's records: they are shared and immutable.
        let mut buf = records.to_vec();
        let mut at = 0;
        for h in &mut headers {
            let len = h.total_len();
            set_log_append_time(&mut buf[at..at + len], h, now_ms);
            at += len;
        }
        Ok(Stamped {
            records: Bytes::from(buf),
            headers,
            log_append_time_ms: now_ms,
        })
    }

    /// Every record's CreateTime must lie in `[now - before, now + after]`
    /// (records without a timestamp pass). Uncompressed batches are checked
    /// record by record; compressed ones by their first record (the base
    /// timestamp) and their max timestamp, as Keel does not decompress.
    fn check_create_times(
        &self,
        records: &[u8],
        headers: &[BatchHeader],
        now_ms: i64,
    ) -> Result<(), TimestampRefusal> {
        let out_of_range = |ts: i64| {
            ts != NO_TIMESTAMP
                && (now_ms.saturating_sub(ts) > self.before_max_ms
                    || ts.saturating_sub(now_ms) > self.after_max_ms)
        };
        let mut bad: Vec<(Option<i32>, i64)> = Vec::new();
        let mut at = 0;
        for h in headers {
            let batch = &records[at..at + h.total_len()];
            at += h.total_len();
            match RecordTimestamps::new(batch, h) {
                Some(each) => bad.extend(
                    each.filter(|r| out_of_range(r.timestamp_ms))
                        .map(|r| (Some(r.index), r.timestamp_ms)),
                ),
                None => {
                    if out_of_range(h.base_timestamp) {
                        bad.push((Some(0), h.base_timestamp));
                    } else if out_of_range(h.max_timestamp) {
                        bad.push((None, h.max_timestamp));
                    }
                }
            }
        }
        let Some(&(_, first_ts)) = bad.first() else {
            return Ok(());
        };
        let range = format!(
            "[{}, {}]",
            now_ms.saturating_sub(self.before_max_ms),
            now_ms.saturating_add(self.after_max_ms)
        );
        let record_errors = bad
            .iter()
            .filter_map(|&(index, ts)| {
                let message = format!("timestamp {ts} is out of range {range}");
                index.map(|i| {
                    BatchIndexAndErrorMessage::default()
                        .with_batch_index(i)
                        .with_batch_index_error_message(Some(str_bytes(message)))
                })
            })
            .collect();
        Err(TimestampRefusal {
            message: format!(
                "{} timestamp(s) out of range {range}, the first {first_ts}",
                bad.len()
            ),
            record_errors,
        })
    }
}

async fn append(partition: &Arc<Partition>, stamped: Stamped) -> PartitionProduceResponse {
    let bytes = stamped.records.len() as u64;
    let appended = partition.append(stamped.records, stamped.headers).await;
    if let Ok(a) = &appended {
        trace::partition(append_trace(partition, bytes, &a.trace));
    }
    match appended {
        Ok(a) => PartitionProduceResponse::default()
            .with_base_offset(a.base_offset)
            .with_log_append_time_ms(stamped.log_append_time_ms)
            .with_log_start_offset(a.log_start_offset),
        Err(AppendFailure { error, message }) => failed(error, message),
    }
}

/// A produced partition as the request's trace shows it.
fn append_trace(partition: &Partition, bytes: u64, t: &AppendTrace) -> PartitionTrace {
    let mut stages = vec![(Stage::Queue, t.queue), (Stage::Lock, t.lock)];
    if let Some(w) = &t.written {
        stages.extend(w.times.roll.map(|d| (Stage::Roll, d)));
        stages.push((Stage::Write, w.times.write));
        stages.extend(w.times.flush.map(|d| (Stage::Flush, d)));
        stages.push((Stage::Publish, t.publish));
    }
    stages.push((Stage::Reply, t.answered.elapsed()));
    PartitionTrace {
        topic: Arc::clone(&partition.topic),
        partition: partition.index,
        bytes,
        source: APPEND,
        place: t.written.map(|w| Place::Segment {
            base_offset: w.segment_base_offset,
            position: w.position,
        }),
        stages,
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
    if let Some(id) = req.transactional_id.as_ref().filter(|id| !id.is_empty()) {
        return match transactional_init(broker, id.as_str(), &req).await {
            Ok((pid, epoch)) => resp.with_producer_id(ProducerId(pid)).with_producer_epoch(epoch),
            Err(e) => resp.with_error_code(e.code()),
        };
    }
    // Without a transactional id Kafka always hands out a fresh producer id
    // (epoch 0), whatever id and epoch the request names: nothing proves
    // the caller owns them, so bumping their epoch would let any client
    // fence another producer.
    match allocate_producer_id(broker).await {
        Ok(id) => resp.with_producer_id(ProducerId(id)).with_producer_epoch(0),
        Err(e) => resp.with_error_code(e.code()),
    }
}

/// InitProducerId for a transactional id: the coordinator's answer,
/// with a fresh producer id when it needs one. An open transaction is
/// aborted first, and the client asked to retry.
async fn transactional_init(
    broker: &Arc<Broker>,
    id: &str,
    req: &InitProducerIdRequest,
) -> Result<(i64, i16), ResponseError> {
    let expected = (req.producer_id.0 >= 0).then_some((req.producer_id.0, req.producer_epoch));
    let mut fresh = None;
    loop {
        let server_version = broker.config().transaction_version();
        let outcome = broker
            .txns
            .init_producer_id(id, req.transaction_timeout_ms, expected, fresh, server_version)
            .await?;
        match outcome {
            crate::txn::InitOutcome::Ready(pid, epoch) => return Ok((pid, epoch)),
            crate::txn::InitOutcome::NeedProducerId if fresh.is_none() => {
                fresh = Some(allocate_producer_id(broker).await?);
            }
            crate::txn::InitOutcome::NeedProducerId => return Err(ResponseError::UnknownServerError),
            crate::txn::InitOutcome::AbortFirst(prepared) => {
                super::txn::spawn_markers(broker, id.to_string(), prepared);
                return Err(ResponseError::ConcurrentTransactions);
            }
        }
    }
}

/// A producer id never handed out before (blocking file write once per
/// block, off the async threads).
pub(super) async fn allocate_producer_id(broker: &Arc<Broker>) -> Result<i64, ResponseError> {
    let b = Arc::clone(broker);
    match tokio::task::spawn_blocking(move || b.producer_ids.lock().allocate()).await {
        Ok(Ok(id)) => Ok(id),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "cannot allocate a producer id");
            Err(ResponseError::KafkaStorageError)
        }
        Err(_) => Err(ResponseError::UnknownServerError),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_log::testing::{BatchBuilder, TestRecord};

    const NOW_MS: i64 = 1_800_000_000_000;
    const HOUR_MS: i64 = 3_600_000;

    fn policy(log_append_time: bool) -> TimestampPolicy {
        TimestampPolicy {
            log_append_time,
            before_max_ms: HOUR_MS,
            after_max_ms: HOUR_MS,
        }
    }

    /// One uncompressed batch whose records have these timestamps.
    fn batch(timestamps: &[i64]) -> Vec<u8> {
        let mut b = BatchBuilder::new(timestamps[0]);
        for &ts in timestamps {
            b = b.push(TestRecord {
                key: None,
                value: Some(b"v".to_vec()),
                timestamp_delta_ms: ts - timestamps[0],
                headers: Vec::new(),
            });
        }
        b.build()
    }

    fn validated(bufs: &[Vec<u8>]) -> (Bytes, Vec<BatchHeader>) {
        let all = bufs.concat();
        let headers = validate_batches(&all).unwrap();
        (Bytes::from(all), headers)
    }

    #[test]
    fn log_append_time_stamps_every_batch_with_broker_time() {
        let (records, headers) = validated(&[batch(&[5, 6]), batch(&[7])]);
        let stamped = policy(true).apply(records, headers, NOW_MS).ok().unwrap();
        assert_eq!(stamped.log_append_time_ms, NOW_MS);
        let reparsed = validate_batches(&stamped.records).expect("CRCs valid after the rewrite");
        assert_eq!(reparsed, stamped.headers);
        for h in &reparsed {
            assert!(h.timestamp_type_is_log_append());
            assert_eq!(h.max_timestamp, NOW_MS);
        }
    }

    #[test]
    fn create_time_keeps_batches_and_reports_no_append_time() {
        let (records, headers) = validated(&[batch(&[NOW_MS - HOUR_MS, NOW_MS + HOUR_MS])]);
        let stamped = policy(false)
            .apply(records.clone(), headers, NOW_MS)
            .ok()
            .unwrap();
        assert_eq!(stamped.log_append_time_ms, -1);
        assert_eq!(stamped.records, records);
    }

    #[test]
    fn create_times_outside_the_window_are_refused_per_record() {
        let (records, headers) = validated(&[batch(&[
            NOW_MS,
            NOW_MS - HOUR_MS - 1,
            NO_TIMESTAMP,
            NOW_MS + HOUR_MS + 1,
        ])]);
        let refused = policy(false).apply(records, headers, NOW_MS).err().unwrap();
        let indexes: Vec<i32> = refused.record_errors.iter().map(|e| e.batch_index).collect();
        assert_eq!(indexes, vec![1, 3]);
        assert!(
            refused.message.contains("2 timestamp(s) out of range"),
            "{}",
            refused.message
        );
        // A LogAppendTime topic ignores CreateTime bounds.
        let (records, headers) = validated(&[batch(&[NOW_MS - 10 * HOUR_MS])]);
        assert!(policy(true).apply(records, headers, NOW_MS).is_ok());
    }

    #[test]
    fn extreme_timestamps_do_not_overflow() {
        let (records, headers) = validated(&[batch(&[i64::MIN + 1]), batch(&[i64::MAX])]);
        let unbounded = TimestampPolicy {
            log_append_time: false,
            before_max_ms: i64::MAX,
            after_max_ms: i64::MAX,
        };
        assert!(unbounded.apply(records.clone(), headers.clone(), NOW_MS).is_ok());
        let refused = policy(false).apply(records, headers, NOW_MS).err().unwrap();
        assert_eq!(refused.record_errors.len(), 2);
    }

    #[test]
    fn compressed_batches_are_checked_by_their_bounds() {
        // Mark the batch compressed (the records stay opaque to the check)
        // and re-sign it.
        let mut b = batch(&[NOW_MS, NOW_MS + 2 * HOUR_MS]);
        b[22] |= 1;
        let crc = crc32c(&b[21..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        let (records, headers) = validated(&[b]);
        assert_eq!(headers[0].compression_codec(), 1);
        let refused = policy(false).apply(records, headers, NOW_MS).err().unwrap();
        assert!(refused.record_errors.is_empty(), "the index is unknown");
        assert!(refused.message.contains(&(NOW_MS + 2 * HOUR_MS).to_string()));
    }

    #[test]
    fn producers_cannot_claim_log_append_time() {
        let mut b = batch(&[NOW_MS]);
        let mut h = BatchHeader::parse(&b).unwrap();
        set_log_append_time(&mut b, &mut h, NOW_MS);
        for log_append_time in [false, true] {
            let (records, headers) = validated(std::slice::from_ref(&b));
            assert!(policy(log_append_time).apply(records, headers, NOW_MS).is_err());
        }
    }

    #[test]
    fn policy_reads_topic_overrides_over_broker_defaults() {
        let config = BrokerConfig::from_map(&BTreeMap::new()).unwrap();
        let defaults = TimestampPolicy::of(&config, &BTreeMap::new());
        assert_eq!(
            defaults,
            TimestampPolicy {
                log_append_time: false,
                before_max_ms: i64::MAX,
                after_max_ms: HOUR_MS,
            }
        );
        let overrides: BTreeMap<String, String> = [
            ("message.timestamp.type", "LogAppendTime"),
            ("message.timestamp.before.max.ms", "1000"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let topic = TimestampPolicy::of(&config, &overrides);
        assert!(topic.log_append_time);
        assert_eq!(topic.before_max_ms, 1000);
    }

    /// CRC-32C (Castagnoli), bit by bit: enough to re-sign a test batch.
    fn crc32c(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in bytes {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0x82F6_3B78
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }
}
