//! Produce and InitProducerId.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use keel_log::batch::{validate_batches, validate_records, validate_section, BatchError, BatchHeader};
use keel_log::codec::Codec;
use keel_log::marker::TxnWrite;
use keel_log::records::{open_section, recompress_section, SectionError};
use keel_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use keel_protocol::messages::*;
use keel_protocol::ResponseError;

use super::record_checks::{RecordRules, Refusal, Stamped};
use super::str_bytes;
use crate::metrics::APPEND;
use crate::trace::{self, PartitionTrace, Place, Stage};
use crate::Broker;
use keel_data::partition::{
    open_transaction_check, AppendFailure, AppendTrace, Appended, Partition, VerificationGuard, Verify,
};
use std::collections::HashMap;

use super::txn::CoordinatorAt;
use keel_data::replica::NotDurable;
use keel_data::topics::Topic;
use keel_log::clock::now_ms;

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
            Some(TxnCheck::Added(id, added))
        }
        Some(id) => Some(TxnCheck::Verify(id)),
    };
    if let [t] = &req.topic_data[..] {
        if let [p] = &t.partition_data[..] {
            // One partition, the common case: appended in this task, with
            // no task of its own to schedule and join.
            let topic = broker.data.topics.resolve(t.name.0.as_str(), t.topic_id);
            let acks = Acks::of(&req);
            let result =
                produce_partition(broker, (topic, p.index), p.records.clone(), txn, (version, acks)).await;
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
    let acks = Acks::of(&req);
    for t in req.topic_data {
        let topic = broker.data.topics.resolve(t.name.0.as_str(), t.topic_id);
        for p in t.partition_data {
            let topic = topic.clone();
            let b = Arc::clone(broker);
            let txn = txn.clone();
            let work =
                async move { produce_partition(&b, (topic, p.index), p.records, txn, (version, acks)).await };
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

/// What a Produce asks of its acknowledgement: acks=all, and how long
/// it may wait for it (the request's `timeout_ms`).
#[derive(Debug, Clone, Copy)]
struct Acks {
    all: bool,
    timeout: Duration,
}

impl Acks {
    fn of(req: &ProduceRequest) -> Acks {
        Acks {
            all: req.acks == -1,
            timeout: Duration::from_millis(u64::try_from(req.timeout_ms).unwrap_or(0)),
        }
    }
}

async fn produce_partition(
    broker: &Broker,
    (topic, index): (Result<Arc<Topic>, ResponseError>, i32),
    records: Option<Bytes>,
    txn: Option<TxnCheck>,
    (version, acks): (i16, Acks),
) -> PartitionProduceResponse {
    let topic = match topic {
        Ok(t) => t,
        Err(e) => return failed(e, String::new()),
    };
    if let Err((error, message)) =
        crate::handlers::admin::internal_refused(broker, &topic.meta.name, "written to")
    {
        return failed(error, message);
    }
    let partition = match broker.data.lead(&topic, index, -1) {
        Ok((partition, _)) => partition,
        Err(e) => return failed(e.error(), String::new()),
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
    // Checked here to refuse early, and again by the partition writer just
    // before the batch is planned (see `verifier`).
    let verify = match check_transaction(broker, &partition, &headers[0], txn, &topic, index).await {
        Ok(verify) => verify,
        Err((error, message)) => return failed(error, message),
    };
    let rules = RecordRules::of(&config, &topic.meta.configs);
    let now_ms = now_ms();
    let check = RecordsCheck {
        rules,
        partition: (topic.meta.name.clone(), index),
        header: headers[0],
        records,
        now_ms,
        recompress: config
            .topic_compression(&topic.meta.configs)
            .filter(|(codec, _)| *codec as u8 != headers[0].compression_codec()),
        max_batch_bytes,
    };
    let (records, header) = match check_each_record(check).await {
        Ok(checked) => checked,
        Err(refused) => {
            return failed(refused.error, refused.message).with_record_errors(refused.record_errors)
        }
    };
    append(
        &partition,
        rules.timestamps.stamp(records, vec![header], now_ms),
        verify,
        acks,
    )
    .await
}

/// The check a transactional batch must pass again in the partition
/// writer, in queue order: between this request's check and its append
/// (record checks, recompression) the transaction may end and its marker
/// be written here, and the batch would then open a transaction no
/// coordinator ends.
fn verifier(broker: &Broker, id: &Arc<str>, h: &BatchHeader, topic: &Topic, index: i32) -> Verify {
    let (txns, id) = (Arc::clone(&broker.txns), Arc::clone(id));
    let (producer_id, epoch) = (h.producer_id, h.producer_epoch);
    let partition = (topic.meta.name.clone(), index);
    Box::new(move |_| {
        txns.verify(&id, producer_id, epoch, &partition).map_err(|error| AppendFailure {
            // The id's coordinator moved to another broker since the
            // check: the client retries, and the batch is asked about there.
            error: match error {
                ResponseError::InvalidProducerIdMapping => ResponseError::NotEnoughReplicas,
                other => other,
            },
            message: format!(
                "the transaction of producer {producer_id} epoch {epoch} ({id}) did not hold {}-{} at its coordinator \
                 when the batch was appended ({error:?})",
                partition.0, partition.1
            ),
        })
    })
}

/// Batches this large (compressed, or to be compressed in the topic's
/// codec) have their records checked and rebuilt on the blocking pool.
/// Decompression runs up to `MAX_DECOMPRESSED_BYTES` (64 MiB) and
/// compression over as much: tens of milliseconds of CPU that, on an async
/// worker, would stall every connection that worker serves.
const RECORDS_INLINE_MAX_BYTES: usize = 64 << 10;

/// The record-level checks of one produced batch whose header passed
/// [`check_records`], owned so that they can move to the blocking pool.
struct RecordsCheck {
    rules: RecordRules,
    partition: (String, i32),
    header: BatchHeader,
    records: Bytes,
    now_ms: i64,
    /// The topic's `compression.type` codec and level, when it is not the
    /// batch's own: the batch is rebuilt in it, as Kafka's `LogValidator`
    /// does.
    recompress: Option<(Codec, Option<i32>)>,
    max_batch_bytes: usize,
}

/// [`RecordsCheck::run`], on the blocking pool unless the batch is small
/// or needs no codec.
async fn check_each_record(check: RecordsCheck) -> Result<(Bytes, BatchHeader), Refusal> {
    let started = Instant::now();
    let codec_work = check.header.compression_codec() != 0 || check.recompress.is_some();
    let checked = if codec_work && check.header.total_len() > RECORDS_INLINE_MAX_BYTES {
        tokio::task::spawn_blocking(move || check.run())
            .await
            .unwrap_or_else(|e| {
                Err(refusal(
                    ResponseError::UnknownServerError,
                    format!("record checks failed: {e}"),
                ))
            })
    } else {
        check.run()
    };
    trace::longest(Stage::Validate, started.elapsed());
    checked
}

impl RecordsCheck {
    /// Opens the batch once (decompressing it when it is compressed, as
    /// Kafka's `LogValidator` reads every compressed batch a client sends)
    /// and checks its records against its header (count, fields, offset
    /// deltas; uncompressed ones were walked by [`check_records`]), then
    /// against the topic's per-record rules, then rebuilds it in the
    /// topic's codec if that differs. The rebuilt batch must still fit
    /// `max.message.bytes`.
    fn run(self) -> Result<(Bytes, BatchHeader), Refusal> {
        let h = self.header;
        let rebuilt = {
            let section = open_section(&self.records, &h).map_err(|e| match e {
                SectionError::TooLarge { .. } => refusal(ResponseError::MessageTooLarge, e.to_string()),
                SectionError::Unreadable(why) => refusal(ResponseError::CorruptMessage, why),
            })?;
            if h.compression_codec() != 0 {
                validate_section(&section, &h).map_err(|why| refusal(ResponseError::InvalidRecord, why))?;
            }
            let (topic, index) = &self.partition;
            self.rules
                .check_section((topic, *index), &h, &section, self.now_ms)?;
            match self.recompress {
                None => None,
                Some((codec, level)) => Some((
                    codec,
                    recompress_section(&self.records, &h, &section, codec, level)
                        .map_err(|why| refusal(ResponseError::CorruptMessage, why))?,
                )),
            }
        };
        let Some((codec, rebuilt)) = rebuilt else {
            return Ok((self.records, h));
        };
        let header = BatchHeader::parse(&rebuilt)
            .map_err(|e| refusal(ResponseError::CorruptMessage, e.to_string()))?;
        if header.total_len() > self.max_batch_bytes {
            return Err(refusal(
                ResponseError::MessageTooLarge,
                format!(
                    "batch of {} bytes in {} exceeds max.message.bytes={}",
                    header.total_len(),
                    codec.name(),
                    self.max_batch_bytes
                ),
            ));
        }
        Ok((Bytes::from(rebuilt), header))
    }
}

/// A refusal of the whole batch, naming no record.
fn refusal(error: ResponseError, message: String) -> Refusal {
    Refusal {
        error,
        message,
        record_errors: Vec::new(),
    }
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
    if keel_log::records::delete_horizon(&h).is_some() {
        // Kafka's LogValidator lets the bit through; its cleaner would then
        // read the producer's base timestamp as the batch's delete horizon
        // and drop its tombstones before delete.retention.ms has passed.
        return Err(invalid(format!(
            "the delete horizon flag (attributes bit 6) is set by the log cleaner, not by producers (producer {})",
            h.producer_id
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
    /// to the transaction, together, with this outcome; by a coordinator
    /// on another broker, under these guards.
    Added(Arc<str>, Result<Option<Guards>, (ResponseError, String)>),
}

/// The verification guards of a produce's partitions led here, taken
/// before a coordinator on another broker was asked to add them: a
/// marker for the producer queued meanwhile (the transaction ended: a
/// timeout, or a new producer fenced it) voids them, so the writer
/// refuses a batch that would open a transaction here no marker ends.
/// (The marker's bumped epoch does not fence it where the producer had
/// not written yet: such a marker is not written.)
type Guards = Arc<parking_lot::Mutex<HashMap<(String, i32), Joined>>>;

/// How a partition led here is in a transaction another broker
/// coordinates.
#[derive(Debug)]
enum Joined {
    /// Added by this request, under this guard.
    Added(VerificationGuard),
    /// Already: the producer's transaction at this epoch had written here
    /// (see `keel_data::partition::open_transaction_check`).
    Open,
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
) -> Result<Option<Guards>, (ResponseError, String)> {
    let mut producer: Option<(i64, i16)> = None;
    let mut partitions = Vec::new();
    for t in &req.topic_data {
        let Ok(topic) = broker.data.topics.resolve(t.name.0.as_str(), t.topic_id) else {
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
        return Ok(None);
    };
    let max_wait_ms = broker.config().num("add.partitions.to.txn.retry.backoff.max.ms");
    let max_wait = std::time::Duration::from_millis(u64::try_from(max_wait_ms).unwrap_or(0));
    let added = match super::txn::coordinator_at(broker, id) {
        CoordinatorAt::Here => broker
            .txns
            .add_for_produce(id, producer, &partitions, max_wait)
            .await
            .map(|()| None),
        CoordinatorAt::Unavailable(e) => Err(e),
        CoordinatorAt::Elsewhere => {
            // Taken before the coordinator is asked: a marker for the
            // producer queued after this voids them (see `Guards`).
            let joined: HashMap<(String, i32), Joined> = partitions
                .iter()
                .filter_map(|(topic, index)| {
                    let p = broker.data.lead_by_name(topic, *index).ok()?;
                    if p.in_open_transaction(producer.0, producer.1) {
                        return Some(((topic.clone(), *index), Joined::Open));
                    }
                    // Produce v12+: transactions v2.
                    let batch = TxnWrite {
                        producer_id: producer.0,
                        producer_epoch: producer.1,
                        bumped_on_end: true,
                    };
                    Some((
                        (topic.clone(), *index),
                        Joined::Added(p.verification_guard(batch)),
                    ))
                })
                .collect();
            // Only those the transaction has not written to yet (and
            // those not led here, whose own check refuses them).
            let to_add: Vec<(String, i32)> = partitions
                .iter()
                .filter(|p| !matches!(joined.get(*p), Some(Joined::Open)))
                .cloned()
                .collect();
            let asked = match to_add.is_empty() {
                true => Ok(()),
                false => {
                    let ask = super::txn::Ask::Add(max_wait);
                    super::txn::ask_coordinator(broker, id, producer, &to_add, ask).await
                }
            };
            asked.map(|()| Some(Arc::new(parking_lot::Mutex::new(joined))))
        }
    };
    added.map_err(|e| {
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
/// last stable offset back for good. Checked here, and again by the
/// partition writer with the returned check (see [`Verify`]).
///
/// Where another broker coordinates the transaction, that coordinator is
/// asked (AddPartitionsToTxn: verify only, or the add of a produce v12+)
/// under the partition's verification guard, which a marker for the
/// producer voids; the writer checks the guard. While no coordinator can
/// answer, the batch is refused with an error clients retry.
async fn check_transaction(
    broker: &Broker,
    partition: &Arc<Partition>,
    h: &BatchHeader,
    txn: Option<TxnCheck>,
    topic: &Topic,
    index: i32,
) -> Result<Option<Verify>, (ResponseError, String)> {
    if !h.is_transactional() {
        return Ok(None);
    }
    let Some(txn) = txn else {
        return Err((
            ResponseError::InvalidRecord,
            format!(
                "a transactional batch of producer {} without a transactional id",
                h.producer_id
            ),
        ));
    };
    let not_open = |id: &str| {
        format!(
            "producer {} epoch {} of transactional id {id} has no open transaction with {}-{index}",
            h.producer_id, h.producer_epoch, topic.meta.name
        )
    };
    // Why the writer refused a batch checked here: how its transaction
    // was seen to end (the text tells an operator which check it was).
    let ended = |id: &str, how: &str| AppendFailure {
        error: ResponseError::InvalidTxnState,
        message: format!(
            "the transaction of producer {} epoch {} ({id}) {how} \
             before its batch to {}-{index} was appended",
            h.producer_id, h.producer_epoch, topic.meta.name
        ),
    };
    const GUARD_VOID: &str = "ended (a marker for the producer was queued here)";
    const NOT_OPEN_HERE: &str = "was no longer open in the partition";
    let partition_name = (topic.meta.name.clone(), index);
    match txn {
        // Its partition was in the add (see add_to_transaction).
        TxnCheck::Added(_, Err(refused)) => Err(refused),
        TxnCheck::Added(id, Ok(None)) => Ok(Some(verifier(broker, &id, h, topic, index))),
        TxnCheck::Added(id, Ok(Some(guards))) => match guards.lock().remove(&partition_name) {
            Some(Joined::Added(guard)) => Ok(Some(guard.into_verify(ended(&id, GUARD_VOID)))),
            Some(Joined::Open) => Ok(Some(open_transaction_check(
                h.producer_id,
                h.producer_epoch,
                ended(&id, NOT_OPEN_HERE),
            ))),
            // Not led here when the add was asked.
            None => Err((ResponseError::NotLeaderOrFollower, not_open(&id))),
        },
        TxnCheck::Verify(id) => match super::txn::coordinator_at(broker, &id) {
            CoordinatorAt::Unavailable(e) => Err((produce_error(e), not_open(&id))),
            CoordinatorAt::Elsewhere if partition.in_open_transaction(h.producer_id, h.producer_epoch) => {
                Ok(Some(open_transaction_check(
                    h.producer_id,
                    h.producer_epoch,
                    ended(&id, NOT_OPEN_HERE),
                )))
            }
            CoordinatorAt::Elsewhere => {
                // Produce below v12: the transaction's markers carry its
                // own epoch.
                let guard = partition.verification_guard(TxnWrite {
                    producer_id: h.producer_id,
                    producer_epoch: h.producer_epoch,
                    bumped_on_end: false,
                });
                super::txn::ask_coordinator(
                    broker,
                    &id,
                    (h.producer_id, h.producer_epoch),
                    std::slice::from_ref(&partition_name),
                    super::txn::Ask::Verify,
                )
                .await
                .map_err(|e| (produce_error(e), not_open(&id)))?;
                Ok(Some(guard.into_verify(ended(&id, GUARD_VOID))))
            }
            CoordinatorAt::Here => {
                broker
                    .txns
                    .verify(&id, h.producer_id, h.producer_epoch, &partition_name)
                    .map_err(|e| (e, not_open(&id)))?;
                Ok(Some(verifier(broker, &id, h, topic, index)))
            }
        },
    }
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

async fn append(
    partition: &Arc<Partition>,
    stamped: Stamped,
    verify: Option<Verify>,
    acks: Acks,
) -> PartitionProduceResponse {
    let bytes = stamped.records.len() as u64;
    let appended = match partition.queue(stamped.records, stamped.headers, verify) {
        Ok(queued) => {
            // In its partition's write order now: a pipelined produce
            // behind this one may start (see `RequestTrace::appends_queued`).
            trace::append_queued();
            queued.outcome().await
        }
        Err(refused) => Err(refused),
    };
    if let Ok(a) = &appended {
        trace::partition(append_trace(partition, bytes, &a.trace));
    }
    let appended = match appended {
        Ok(a) if acks.all => durable(partition, a, acks.timeout).await,
        other => other,
    };
    match appended {
        Ok(a) => PartitionProduceResponse::default()
            .with_base_offset(a.base_offset)
            .with_log_append_time_ms(stamped.log_append_time_ms)
            .with_log_start_offset(a.log_start_offset),
        Err(AppendFailure { error, message }) => failed(error, message),
    }
}

/// In a cluster, waits for an acks=all write to be committed (see
/// `keel_data::replica`); one node's writes are acknowledged once written.
pub(crate) async fn durable(
    partition: &Partition,
    a: Appended,
    timeout: Duration,
) -> Result<Appended, AppendFailure> {
    if a.term.is_none() {
        return Ok(a);
    }
    let waiting = Instant::now();
    let outcome = partition.wait_durable(&a, timeout).await;
    trace::longest(Stage::Commit, waiting.elapsed());
    match outcome {
        Ok(()) => Ok(a),
        Err(NotDurable::Fenced) => Err(AppendFailure {
            error: ResponseError::NotLeaderOrFollower,
            message: "this broker lost the partition's leadership before the write was committed".into(),
        }),
        Err(NotDurable::TimedOut) => Err(AppendFailure {
            error: ResponseError::RequestTimedOut,
            message: format!("the write was not committed to the object store within {timeout:?}"),
        }),
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
    tracing::debug!(?error, %message, "a partition's produce refused");
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
            keel_coord::txn::InitOutcome::Ready(pid, epoch) => return Ok((pid, epoch)),
            keel_coord::txn::InitOutcome::NeedProducerId if fresh.is_none() => {
                fresh = Some(allocate_producer_id(broker).await?);
            }
            keel_coord::txn::InitOutcome::NeedProducerId => return Err(ResponseError::UnknownServerError),
            keel_coord::txn::InitOutcome::AbortFirst(prepared) => {
                super::markers::spawn_markers(broker, id.to_string(), prepared);
                return Err(ResponseError::ConcurrentTransactions);
            }
        }
    }
}

/// A producer id never handed out before.
pub(super) async fn allocate_producer_id(broker: &Arc<Broker>) -> Result<i64, ResponseError> {
    broker.producer_ids.allocate().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handlers::record_checks::TimestampPolicy;
    use keel_log::testing::BatchBuilder;

    const COMPRESSED: [Codec; 4] = [Codec::Gzip, Codec::Snappy, Codec::Lz4, Codec::Zstd];
    const NOW_MS: i64 = 1_800_000_000_000;

    /// A topic's default rules: no compaction, CreateTime without a lower
    /// bound, so no rule needs to look inside a compressed batch.
    fn default_rules() -> RecordRules {
        RecordRules {
            compacted: false,
            timestamps: TimestampPolicy {
                log_append_time: false,
                before_max_ms: i64::MAX,
                after_max_ms: 3_600_000,
            },
        }
    }

    /// Every check a produced batch goes through before it is appended.
    fn produce_checks(records: &[u8]) -> Result<(), (ResponseError, String)> {
        produce_checks_within(records, 1 << 20)
    }

    fn produce_checks_within(records: &[u8], max_batch_bytes: usize) -> Result<(), (ResponseError, String)> {
        let headers = check_records(records, max_batch_bytes)?;
        let check = RecordsCheck {
            rules: default_rules(),
            partition: ("t".to_string(), 0),
            header: headers[0],
            records: Bytes::copy_from_slice(records),
            now_ms: NOW_MS,
            recompress: None,
            max_batch_bytes,
        };
        check.run().map(|_| ()).map_err(|r| (r.error, r.message))
    }

    /// An uncompressed batch of `n` records, for forging.
    fn plain(n: usize) -> Vec<u8> {
        let mut b = BatchBuilder::new(NOW_MS);
        for i in 0..n {
            b = b.record(Some(format!("k{i}").as_bytes()), Some(b"v"));
        }
        b.build()
    }

    /// `batch` (uncompressed, possibly forged) with its records section in
    /// `codec`, the header's length, codec bits and CRC made to match.
    fn compress(batch: &[u8], codec: Codec) -> Vec<u8> {
        let mut out = batch[..61].to_vec();
        out.extend_from_slice(&codec.compress(&batch[61..]).unwrap());
        let length = (out.len() - 12) as i32;
        out[8..12].copy_from_slice(&length.to_be_bytes());
        let attributes = i16::from_be_bytes([out[21], out[22]]) | codec as i16;
        out[21..23].copy_from_slice(&attributes.to_be_bytes());
        resign(&mut out);
        out
    }

    fn resign(batch: &mut [u8]) {
        let crc = crc32c::crc32c(&batch[21..]);
        batch[17..21].copy_from_slice(&crc.to_be_bytes());
    }

    /// Sets the header's record count and last offset delta to agree with
    /// each other on `count` records.
    fn claim_records(batch: &mut [u8], count: i32) {
        batch[23..27].copy_from_slice(&(count - 1).to_be_bytes());
        batch[57..61].copy_from_slice(&count.to_be_bytes());
        resign(batch);
    }

    fn refused(records: &[u8]) -> (ResponseError, String) {
        produce_checks(records).expect_err("refused")
    }

    #[test]
    fn sound_compressed_batches_pass() {
        for codec in COMPRESSED {
            assert_eq!(produce_checks(&compress(&plain(5), codec)), Ok(()), "{codec:?}");
        }
    }

    #[test]
    fn a_compressed_batch_holding_fewer_records_than_its_header_says_is_refused() {
        for codec in COMPRESSED {
            let mut forged = plain(3);
            claim_records(&mut forged, 4);
            let (error, message) = refused(&compress(&forged, codec));
            assert_eq!(error, ResponseError::InvalidRecord, "{codec:?}");
            assert_eq!(
                message, "Incorrect declared batch size, premature EOF reached",
                "{codec:?}"
            );
        }
    }

    #[test]
    fn a_compressed_batch_holding_more_records_than_its_header_says_is_refused() {
        for codec in COMPRESSED {
            let mut forged = plain(3);
            claim_records(&mut forged, 2);
            let (error, message) = refused(&compress(&forged, codec));
            assert_eq!(error, ResponseError::InvalidRecord, "{codec:?}");
            assert_eq!(
                message, "Incorrect declared batch size, records still remaining in file",
                "{codec:?}"
            );
        }
    }

    #[test]
    fn compressed_offset_deltas_out_of_order_are_refused() {
        // Each record of `plain` is `len, attributes, timestamp delta,
        // offset delta, ...`, every varint one byte long here.
        let mut forged = plain(3);
        let first_len = usize::from(forged[61] / 2) + 1;
        let (first, second) = (61 + 3, 61 + first_len + 3);
        assert_eq!(
            (forged[first], forged[second]),
            (0, 2),
            "zigzag offset deltas 0 and 1"
        );
        forged.swap(first, second);
        resign(&mut forged);
        for codec in COMPRESSED {
            let (error, message) = refused(&compress(&forged, codec));
            assert_eq!(error, ResponseError::InvalidRecord, "{codec:?}");
            assert!(
                message.contains("offset delta 1, expected 0"),
                "{codec:?}: {message}"
            );
        }
        // The same holds uncompressed (checked before).
        assert_eq!(refused(&forged).0, ResponseError::InvalidRecord);
    }

    #[test]
    fn compressed_batches_are_opened_even_when_no_rule_needs_their_records() {
        // Garbage where the compressed records should be, under a valid CRC.
        for codec in COMPRESSED {
            let mut forged = compress(&plain(2), codec);
            for byte in &mut forged[61..] {
                *byte = 0xa5;
            }
            resign(&mut forged);
            let (error, message) = refused(&forged);
            assert_eq!(error, ResponseError::CorruptMessage, "{codec:?}");
            assert!(message.contains(codec.name()), "{codec:?}: {message}");
        }
    }

    #[test]
    fn a_decompression_bomb_is_refused_as_too_large() {
        let limit = keel_log::codec::MAX_DECOMPRESSED_BYTES;
        let zeros = vec![0u8; limit + 1];
        for codec in COMPRESSED {
            let mut bomb = plain(1)[..61].to_vec();
            bomb.extend_from_slice(&zeros);
            let bomb = compress(&bomb, codec);
            // Snappy inflates at most ~21x, so its bomb needs a topic with
            // a larger max.message.bytes than the default 1 MiB.
            let max_batch_bytes = if codec == Codec::Snappy { 4 << 20 } else { 1 << 20 };
            assert!(bomb.len() < max_batch_bytes, "{codec:?}: {} bytes", bomb.len());
            let (error, message) = produce_checks_within(&bomb, max_batch_bytes).unwrap_err();
            assert_eq!(error, ResponseError::MessageTooLarge, "{codec:?}");
            assert_eq!(
                message,
                format!(
                    "{} batch: records decompress to more than {limit} bytes",
                    codec.name()
                )
            );
        }
    }

    #[test]
    fn a_producer_cannot_set_the_delete_horizon_flag() {
        for codec in [Codec::None, Codec::Gzip, Codec::Snappy, Codec::Lz4, Codec::Zstd] {
            let mut forged = compress(&plain(2), codec);
            forged[22] |= keel_log::records::DELETE_HORIZON_FLAG as u8;
            resign(&mut forged);
            let (error, message) = refused(&forged);
            assert_eq!(error, ResponseError::InvalidRecord, "{codec:?}");
            assert!(message.contains("delete horizon"), "{codec:?}: {message}");
        }
    }
}
