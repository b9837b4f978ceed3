//! ShareFetch and ShareAcknowledge: a member's share session, the
//! acknowledgements it carries, and the records it acquires.
//!
//! A ShareFetch applies its acknowledgements first, then reads each
//! partition of the session from where its share partition says
//! (`next_fetch_offset`), and acquires what the read returned under the
//! coordinator's lock. The read happens without that lock, so another
//! member may have taken some records meanwhile: acquisition takes only
//! what is still available. A fetch that acquires nothing waits up to
//! `max_wait_ms` for an append to one of its partitions, or for records
//! to become available again in its group (a release, an expired lock,
//! a closed session: `ShareCoordinator::changes`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use keel_protocol::messages::share_fetch_response::{
    AcquiredRecords, LeaderIdAndEpoch, PartitionData, ShareFetchableTopicResponse,
};
use keel_protocol::messages::*;
use keel_protocol::{ResponseError, StrBytes};
use tokio::sync::Notify;
use tokio::time::Instant;
use uuid::Uuid;

use super::{connection_key, enabled, limits};
use crate::handlers::str_bytes;
use crate::{Broker, ClientInfo};
use keel_auth::acl::{Operation, ResourceType};
use keel_coord::share::partition::{AckType, Acquired, BatchSpan, LogRead, ShareLimits};
use keel_coord::share::{self, AckBatch, FINAL_EPOCH, INITIAL_EPOCH};
use keel_data::partition::{Partition, ReadFailure, ReadSource};
use keel_data::readers::Reader;
use keel_log::batch::BatchHeader;

/// Kafka's default `max.poll.records`, for a request that sets none.
const DEFAULT_MAX_RECORDS: usize = 500;
/// Kafka's default `fetch.max.bytes`, for a request that sets none.
const DEFAULT_MAX_BYTES: usize = 50 * 1024 * 1024;

type Tp = (Uuid, i32);

/// What the request names, checked: group and member, and the group's
/// settings, read once per request.
struct Who {
    group: String,
    member: Arc<str>,
    limits: ShareLimits,
    /// `share.isolation.level` read_committed.
    committed: bool,
    /// `share.renew.acknowledge.enable`.
    renews: bool,
}

/// The group and member a request names, both required.
fn who(
    group: Option<&GroupId>,
    member: Option<&StrBytes>,
) -> Result<(String, Arc<str>), (ResponseError, String)> {
    let group = group.map(|g| g.0.to_string()).filter(|g| !g.is_empty()).ok_or((
        ResponseError::InvalidRequest,
        "Invalid group id in the request.".to_string(),
    ))?;
    let member = member.map(|m| m.to_string()).filter(|m| !m.is_empty()).ok_or((
        ResponseError::InvalidRequest,
        "Invalid member id in the request.".to_string(),
    ))?;
    Ok((group, Arc::from(member)))
}

/// Kafka's checks of a ShareFetch or ShareAcknowledge before its
/// session: share groups served, a group and member named, READ on the
/// group.
fn admitted(
    broker: &Broker,
    client: &ClientInfo,
    group: Option<&GroupId>,
    member: Option<&StrBytes>,
) -> Result<Who, (ResponseError, String)> {
    if !enabled(broker) {
        return Err((
            ResponseError::UnsupportedVersion,
            "Share groups are not enabled.".into(),
        ));
    }
    let (group, member) = who(group, member)?;
    if !broker.authorized(client, Operation::Read, ResourceType::Group, &group) {
        return Err((
            ResponseError::GroupAuthorizationFailed,
            "Group authorization failed.".into(),
        ));
    }
    let settings = broker
        .group_configs
        .share_settings(&group, broker.config().share_limits());
    Ok(Who {
        limits: settings.limits,
        committed: settings.read_committed,
        renews: settings.renew_enabled,
        group,
        member,
    })
}

/// A partition of the session this broker leads: its log and leader.
struct Served {
    partition: Arc<Partition>,
    leader: LeaderIdAndEpoch,
}

/// A partition of the session, resolved, or why it cannot be served to
/// this client.
fn resolve(broker: &Broker, client: &ClientInfo, tp: Tp) -> Result<Served, ResponseError> {
    let topic = broker
        .data
        .topics
        .get_by_id(tp.0)
        .ok_or(ResponseError::UnknownTopicId)?;
    if !broker.authorized(client, Operation::Read, ResourceType::Topic, &topic.meta.name) {
        return Err(ResponseError::TopicAuthorizationFailed);
    }
    let (partition, leader) = broker.data.lead(&topic, tp.1, -1).map_err(|e| e.error())?;
    Ok(Served {
        partition,
        leader: LeaderIdAndEpoch::default()
            .with_leader_id(leader.node_id)
            .with_leader_epoch(leader.epoch),
    })
}

/// The acknowledgement batches of a request, checked: known types only,
/// and RENEW only where the request says it renews (`IsRenewAck`, v2).
fn ack_batches(
    batches: impl Iterator<Item = (i64, i64, Vec<i8>)>,
    renews: bool,
) -> Result<Vec<AckBatch>, (ResponseError, String)> {
    batches
        .map(|(first, last, codes)| {
            let types = codes
                .iter()
                .map(|c| match AckType::from_code(*c) {
                    Some(AckType::Renew) if !renews => Err((
                        ResponseError::InvalidRequest,
                        "A RENEW acknowledgement needs IsRenewAck (ShareFetch or ShareAcknowledge v2)."
                            .to_string(),
                    )),
                    None => Err((
                        ResponseError::InvalidRequest,
                        format!("Unknown acknowledge type {c}."),
                    )),
                    Some(t) => Ok(t),
                })
                .collect::<Result<Vec<_>, _>>()?;
            if types.is_empty() {
                return Err((ResponseError::InvalidRequest, "No acknowledge type.".to_string()));
            }
            Ok(AckBatch {
                first_offset: first,
                last_offset: last,
                types,
            })
        })
        .collect()
}

/// Applies one partition's acknowledgements; the error code and message.
async fn acknowledge(
    broker: &Broker,
    client: &ClientInfo,
    who: &Who,
    tp: Tp,
    batches: Result<Vec<AckBatch>, (ResponseError, String)>,
) -> (i16, Option<String>, i32, i32) {
    let (leader, epoch) = match resolve(broker, client, tp) {
        Ok(s) => (s.leader.leader_id, s.leader.leader_epoch),
        Err(e) => return (e.code(), None, -1, -1),
    };
    let renewing = |batches: &[AckBatch]| batches.iter().any(|b| b.types.contains(&AckType::Renew));
    let outcome = match batches {
        Err(e) => Err(e),
        Ok(batches) if !who.renews && renewing(&batches) => Err((
            ResponseError::InvalidRecordState,
            "Renewing acquisition locks is not enabled for the group.".to_string(),
        )),
        Ok(batches) => {
            let key = share::key(&who.group, tp.0, tp.1);
            let now_ms = broker.data.clock.now_ms();
            broker
                .share
                .acknowledge(&key, &who.member, &batches, &who.limits, now_ms)
                .await
        }
    };
    match outcome {
        Ok(()) => (0, None, leader, epoch),
        Err((e, message)) => (e.code(), Some(message), leader, epoch),
    }
}

fn fetch_error(e: ResponseError, message: String) -> ShareFetchResponse {
    ShareFetchResponse::default()
        .with_error_code(e.code())
        .with_error_message(Some(str_bytes(message)))
}

/// One partition's answer.
fn part(index: i32) -> PartitionData {
    PartitionData::default()
        .with_partition_index(index)
        .with_records(Some(Bytes::new()))
        .with_current_leader(
            LeaderIdAndEpoch::default()
                .with_leader_id(-1)
                .with_leader_epoch(-1),
        )
}

/// ShareFetch: the session, its acknowledgements, then records. A fetch
/// that renews locks (`IsRenewAck`) fetches nothing: reading could take
/// longer than the locks it renewed, so Kafka has it set every limit to 0.
pub async fn share_fetch(
    broker: &Arc<Broker>,
    fetch: keel_protocol::share::ShareFetch,
    client: &ClientInfo,
    client_id: &str,
) -> ShareFetchResponse {
    let (req, renews) = (fetch.request, fetch.is_renew_ack);
    let who = match admitted(broker, client, req.group_id.as_ref(), req.member_id.as_ref()) {
        Ok(w) => w,
        Err((e, m)) => return fetch_error(e, m),
    };
    if let keel_protocol::share::ShareAcquireMode::Unknown(id) = fetch.acquire_mode {
        return fetch_error(
            ResponseError::InvalidRequest,
            format!("Unknown share acquire mode {id}."),
        );
    }
    if renews && (req.max_bytes, req.min_bytes, req.max_records, req.max_wait_ms) != (0, 0, 0, 0) {
        return fetch_error(
            ResponseError::InvalidRequest,
            "maxBytes, minBytes, maxRecords and maxWaitMs must be 0 when isRenewAck is true.".into(),
        );
    }
    let add: Vec<Tp> = req
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(move |p| (t.topic_id, p.partition_index)))
        .collect();
    let forget: Vec<Tp> = req
        .forgotten_topics_data
        .iter()
        .flat_map(|t| t.partitions.iter().map(move |p| (t.topic_id, *p)))
        .collect();
    let has_acks = req
        .topics
        .iter()
        .any(|t| t.partitions.iter().any(|p| !p.acknowledgement_batches.is_empty()));
    let epoch = req.share_session_epoch;
    let max_sessions = usize::try_from(broker.config().num("group.share.max.share.sessions")).unwrap_or(2000);
    let session = broker.share.session(
        &who.group,
        &who.member,
        epoch,
        &add,
        &forget,
        has_acks,
        connection_key(client),
        max_sessions,
    );
    let partitions = match session {
        Ok(p) => p,
        Err((ResponseError::ShareSessionLimitReached, m)) => {
            // After the request's wait, as Kafka answers it: a client
            // that opens a session again at once does not spin.
            let wait = Duration::from_millis(u64::try_from(req.max_wait_ms).unwrap_or(0).min(30_000));
            tokio::time::sleep(wait).await;
            return fetch_error(ResponseError::ShareSessionLimitReached, m);
        }
        Err((e, m)) => return fetch_error(e, m),
    };
    let mut out: BTreeMap<Tp, PartitionData> = BTreeMap::new();
    let mut acked = std::collections::BTreeSet::new();
    for t in &req.topics {
        for p in t
            .partitions
            .iter()
            .filter(|p| !p.acknowledgement_batches.is_empty())
        {
            let batches = ack_batches(
                p.acknowledgement_batches
                    .iter()
                    .map(|b| (b.first_offset, b.last_offset, b.acknowledge_types.clone())),
                renews,
            );
            let (e, message, leader, leader_epoch) =
                acknowledge(broker, client, &who, (t.topic_id, p.partition_index), batches).await;
            acked.insert((t.topic_id, p.partition_index));
            let entry = out
                .entry((t.topic_id, p.partition_index))
                .or_insert_with(|| part(p.partition_index));
            entry.acknowledge_error_code = e;
            entry.acknowledge_error_message = message.map(str_bytes);
            entry.current_leader = LeaderIdAndEpoch::default()
                .with_leader_id(leader)
                .with_leader_epoch(leader_epoch);
        }
    }
    if epoch == FINAL_EPOCH {
        broker
            .share
            .close_session(&who.group, &who.member, &|g| limits(broker, g));
    } else if !renews {
        let reader = Reader::new(client_id, &client.host, client.port);
        fetch_records(broker, client, &who, &partitions, &req, &reader, &mut out).await;
        // The first answer of a session carries every partition of it
        // (`fetch_records` answers each); later ones only what changed:
        // records, errors, the outcome of acknowledgements.
        if epoch != INITIAL_EPOCH {
            out.retain(|tp, d| acked.contains(tp) || d.error_code != 0 || !d.acquired_records.is_empty());
        }
    }
    let mut topics: BTreeMap<Uuid, Vec<PartitionData>> = BTreeMap::new();
    for ((topic, _), data) in out {
        topics.entry(topic).or_default().push(data);
    }
    ShareFetchResponse::default()
        .with_acquisition_lock_timeout_ms(i32::try_from(who.limits.lock_ms).unwrap_or(i32::MAX))
        .with_responses(
            topics
                .into_iter()
                .map(|(id, partitions)| {
                    ShareFetchableTopicResponse::default()
                        .with_topic_id(id)
                        .with_partitions(partitions)
                })
                .collect(),
        )
}

/// What is left of a request's limits.
struct Budget {
    records: usize,
    bytes: usize,
}

/// Acquires records from the session's partitions into `out`, waiting up
/// to `max_wait_ms` while there are none.
async fn fetch_records(
    broker: &Arc<Broker>,
    client: &ClientInfo,
    who: &Who,
    partitions: &[Tp],
    req: &ShareFetchRequest,
    reader: &Reader,
    out: &mut BTreeMap<Tp, PartitionData>,
) {
    let deadline = Instant::now() + Duration::from_millis(u64::try_from(req.max_wait_ms).unwrap_or(0));
    let mut changes = broker.share.changes(&who.group);
    let waiter = Arc::new(Notify::new());
    let resolved: Vec<(Tp, Result<Served, ResponseError>)> = partitions
        .iter()
        .map(|tp| (*tp, resolve(broker, client, *tp)))
        .collect();
    loop {
        // Registered before reading, so nothing that lands meanwhile is
        // missed.
        changes.borrow_and_update();
        for (_, r) in &resolved {
            if let Ok(s) = r {
                s.partition.register_waiter(&waiter);
            }
        }
        let mut budget = Budget {
            records: positive(req.max_records).unwrap_or(DEFAULT_MAX_RECORDS),
            bytes: positive(req.max_bytes)
                .unwrap_or(DEFAULT_MAX_BYTES)
                .min(broker_max_bytes(broker)),
        };
        let mut found = false;
        for (tp, r) in &resolved {
            let data = out.entry(*tp).or_insert_with(|| part(tp.1));
            found |= fill(broker, who, *tp, r, reader, &mut budget, data).await;
        }
        // Errors alone end the wait only when no partition is left to
        // wait on, as Kafka's do: otherwise a session holding one bad
        // partition would answer at once, every time.
        let waitable = resolved.iter().any(|(_, r)| r.is_ok());
        if found || !waitable || Instant::now() >= deadline {
            return;
        }
        tokio::select! {
            _ = waiter.notified() => {}
            _ = changes.changed() => {}
            _ = tokio::time::sleep_until(deadline) => return,
        }
    }
}

/// The broker's `fetch.max.bytes`: no ShareFetch reads more.
fn broker_max_bytes(broker: &Broker) -> usize {
    usize::try_from(broker.config().num("fetch.max.bytes"))
        .unwrap_or(DEFAULT_MAX_BYTES)
        .max(1)
}

fn positive(n: i32) -> Option<usize> {
    usize::try_from(n).ok().filter(|n| *n > 0)
}

/// One partition's part of a fetch: its error, or what it acquired;
/// whether it acquired records.
async fn fill(
    broker: &Broker,
    who: &Who,
    tp: Tp,
    served: &Result<Served, ResponseError>,
    reader: &Reader,
    budget: &mut Budget,
    data: &mut PartitionData,
) -> bool {
    let s = match served {
        Ok(s) => s,
        Err(e) => {
            data.error_code = e.code();
            return false;
        }
    };
    data.current_leader = s.leader.clone();
    match acquire(broker, who, tp, &s.partition, reader, budget).await {
        Ok(Some((records, acquired))) => {
            data.records = Some(records);
            data.acquired_records = acquired;
            true
        }
        Ok(None) => false,
        Err(e) => {
            data.error_code = e.code();
            false
        }
    }
}

/// Reads one partition from where its share partition says and acquires
/// what the read returned: the batches holding acquired records and the
/// acquired ranges, or `None` if there was nothing to acquire.
async fn acquire(
    broker: &Broker,
    who: &Who,
    tp: Tp,
    p: &Arc<Partition>,
    reader: &Reader,
    budget: &mut Budget,
) -> Result<Option<(Bytes, Vec<AcquiredRecords>)>, ResponseError> {
    if budget.records == 0 || budget.bytes == 0 {
        return Ok(None);
    }
    let key = share::key(&who.group, tp.0, tp.1);
    // Share partitions get their state when the group assigns them
    // (ShareGroupHeartbeat): a fetch of any other is answered empty, so
    // requests cannot make the broker keep state for whatever they name.
    if !broker.share.is_initialized(&key) {
        return Ok(None);
    }
    let limits = who.limits;
    let log_start = p.log_start_offset();
    broker.share.skip_to(&key, log_start);
    let now_ms = broker.data.clock.now_ms();
    let Some(from) = broker.share.next_fetch_offset(&key, &limits, now_ms) else {
        return Ok(None);
    };
    // read_committed (the group's `share.isolation.level`) reads up to
    // the last stable offset, and delivers no aborted transaction's
    // records.
    let committed = who.committed;
    let end = if committed {
        p.last_stable_offset()
    } else {
        p.high_watermark()
    };
    if from >= end {
        return Ok(None);
    }
    let bytes = match read_at(reader, p, from, budget.bytes, committed).await {
        Ok(b) => b,
        Err(ReadFailure::OffsetOutOfRange) => {
            broker.share.skip_to(&key, p.log_start_offset());
            return Ok(None);
        }
        Err(ReadFailure::Storage(_)) => return Err(ResponseError::KafkaStorageError),
    };
    // What was read counts, acquired or not: a fetch whose reads find
    // only records others hold still stops at its limit.
    budget.bytes = budget.bytes.saturating_sub(bytes.len());
    let mut spans = spans(&bytes);
    // A read of the files may reach past what may be read yet.
    spans.retain(|s| s.span.base_offset < end);
    let aborted = if committed {
        p.aborted_txns(from, end)
    } else {
        Vec::new()
    };
    let batches = deliverable(&spans, aborted);
    let read = LogRead {
        from,
        to: spans.last().map_or(from - 1, |s| s.span.last_offset),
        batches: &batches,
    };
    let now_ms = broker.data.clock.now_ms();
    let (acquired, write) = broker
        .share
        .acquire(&key, &who.member, read, budget.records, &limits, now_ms);
    if let Err(e) = write.await {
        // The records are acquired all the same; a restart would count
        // this delivery again from the last written state.
        tracing::warn!(error = %e, "the share log could not be written");
    }
    if acquired.is_empty() {
        return Ok(None);
    }
    let records = covering(&bytes, &spans, &acquired);
    let count: i64 = acquired.iter().map(|a| a.last_offset - a.first_offset + 1).sum();
    budget.records = budget
        .records
        .saturating_sub(usize::try_from(count).unwrap_or(usize::MAX));

    let ranges = acquired
        .iter()
        .map(|a| {
            AcquiredRecords::default()
                .with_first_offset(a.first_offset)
                .with_last_offset(a.last_offset)
                .with_delivery_count(a.delivery_count)
        })
        .collect();
    Ok(Some((records, ranges)))
}

/// Whole batches from `offset`, within `max_bytes` (the first batch
/// whole even if larger, KIP-74).
async fn read_at(
    reader: &Reader,
    p: &Arc<Partition>,
    offset: i64,
    max_bytes: usize,
    committed: bool,
) -> Result<Bytes, ReadFailure> {
    let cold = |r: Result<std::io::Result<Bytes>, _>| match r {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) => Err(ReadFailure::Storage(e.to_string())),
        Err(_) => Err(ReadFailure::Storage("the read ended".into())),
    };
    match p.read(reader, offset, max_bytes.max(1), committed)? {
        ReadSource::Memory(c) | ReadSource::ReadAhead(c) => Ok(c.join()),
        ReadSource::Disk(read) => {
            let bytes = cold(read.spawn().await)?;
            p.note_cold_read(bytes.len() as u64);
            Ok(bytes)
        }
        ReadSource::Pending(rx) => cold(rx.await),
    }
}

/// One whole batch of a read.
struct Span {
    /// Where it starts in the read's bytes.
    at: usize,
    span: BatchSpan,
    producer_id: i64,
    transactional: bool,
    control: bool,
}

/// The whole batches in `bytes`.
fn spans(bytes: &[u8]) -> Vec<Span> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Ok(h) = BatchHeader::parse(&bytes[at..]) {
        let end = at + h.total_len();
        if end > bytes.len() {
            break;
        }
        out.push(Span {
            at,
            span: BatchSpan {
                base_offset: h.base_offset,
                last_offset: h.last_offset(),
            },
            producer_id: h.producer_id,
            transactional: h.is_transactional(),
            control: h.is_control(),
        });
        at = end;
    }
    out
}

/// The batches whose records may be delivered: not control batches
/// (transaction markers), and, `read_committed`, not those of the
/// `aborted` transactions. A producer's batches from its aborted
/// transaction's first offset up to its marker are that transaction's,
/// as Kafka's clients tell them.
fn deliverable(spans: &[Span], mut aborted: Vec<keel_log::txnindex::AbortedTxn>) -> Vec<BatchSpan> {
    aborted.sort_by_key(|a| a.first_offset);
    let mut pending = aborted.into_iter().peekable();
    let mut open = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(spans.len());
    for s in spans {
        while let Some(a) = pending.next_if(|a| a.first_offset <= s.span.base_offset) {
            open.insert(a.producer_id);
        }
        if s.control {
            open.remove(&s.producer_id);
        } else if !(s.transactional && open.contains(&s.producer_id)) {
            out.push(s.span);
        }
    }
    out
}

/// The bytes from the first batch holding an acquired record to the end
/// of the last one.
fn covering(bytes: &Bytes, spans: &[Span], acquired: &[Acquired]) -> Bytes {
    let first = acquired.iter().map(|a| a.first_offset).min().unwrap_or(i64::MAX);
    let last = acquired.iter().map(|a| a.last_offset).max().unwrap_or(i64::MIN);
    let start = spans
        .iter()
        .find(|s| s.span.last_offset >= first)
        .map_or(0, |s| s.at);
    let end = spans
        .iter()
        .find(|s| s.span.base_offset > last)
        .map_or(bytes.len(), |s| s.at);
    bytes.slice(start..end)
}

/// ShareAcknowledge: acknowledgements outside a fetch. It continues (or,
/// at epoch -1, closes) a session; it cannot open one.
pub async fn share_acknowledge(
    broker: &Broker,
    ack: keel_protocol::share::ShareAcknowledge,
    client: &ClientInfo,
) -> keel_protocol::share::ShareAcknowledgeAnswer {
    let (req, renews) = (ack.request, ack.is_renew_ack);
    let who = admitted(broker, client, req.group_id.as_ref(), req.member_id.as_ref());
    let lock_ms = who.as_ref().map_or(0, |w| w.limits.lock_ms);
    keel_protocol::share::ShareAcknowledgeAnswer {
        response: acknowledge_all(broker, req, renews, who, client).await,
        acquisition_lock_timeout_ms: i32::try_from(lock_ms).unwrap_or(i32::MAX),
    }
}

async fn acknowledge_all(
    broker: &Broker,
    req: ShareAcknowledgeRequest,
    renews: bool,
    who: Result<Who, (ResponseError, String)>,
    client: &ClientInfo,
) -> ShareAcknowledgeResponse {
    use keel_protocol::messages::share_acknowledge_response::{
        LeaderIdAndEpoch as Leader, PartitionData as AckData, ShareAcknowledgeTopicResponse,
    };
    let error = |e: ResponseError, m: String| {
        ShareAcknowledgeResponse::default()
            .with_error_code(e.code())
            .with_error_message(Some(str_bytes(m)))
    };
    let who = match who {
        Ok(w) => w,
        Err((e, m)) => return error(e, m),
    };
    let epoch = req.share_session_epoch;
    if epoch == INITIAL_EPOCH {
        return error(
            ResponseError::InvalidShareSessionEpoch,
            "A ShareAcknowledge cannot open a share session.".into(),
        );
    }
    let max_sessions = usize::try_from(broker.config().num("group.share.max.share.sessions")).unwrap_or(2000);
    if let Err((e, m)) = broker.share.session(
        &who.group,
        &who.member,
        epoch,
        &[],
        &[],
        true,
        connection_key(client),
        max_sessions,
    ) {
        return error(e, m);
    }
    let mut topics = Vec::with_capacity(req.topics.len());
    for t in &req.topics {
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for p in &t.partitions {
            let batches = ack_batches(
                p.acknowledgement_batches
                    .iter()
                    .map(|b| (b.first_offset, b.last_offset, b.acknowledge_types.clone())),
                renews,
            );
            let (e, message, leader, leader_epoch) =
                acknowledge(broker, client, &who, (t.topic_id, p.partition_index), batches).await;
            partitions.push(
                AckData::default()
                    .with_partition_index(p.partition_index)
                    .with_error_code(e)
                    .with_error_message(message.map(str_bytes))
                    .with_current_leader(
                        Leader::default()
                            .with_leader_id(leader)
                            .with_leader_epoch(leader_epoch),
                    ),
            );
        }
        topics.push(
            ShareAcknowledgeTopicResponse::default()
                .with_topic_id(t.topic_id)
                .with_partitions(partitions),
        );
    }
    if epoch == FINAL_EPOCH {
        broker
            .share
            .close_session(&who.group, &who.member, &|g| limits(broker, g));
    }
    ShareAcknowledgeResponse::default().with_responses(topics)
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_log::txnindex::AbortedTxn;

    fn span(base: i64, last: i64, producer_id: i64, transactional: bool, control: bool) -> Span {
        Span {
            at: 0,
            span: BatchSpan {
                base_offset: base,
                last_offset: last,
            },
            producer_id,
            transactional,
            control,
        }
    }

    /// Markers are never delivered; an aborted transaction's batches are
    /// not, from its first offset to its marker; a committed one's and
    /// another producer's interleaved batches are.
    #[test]
    fn only_records_of_no_aborted_transaction_are_deliverable() {
        let spans = [
            span(0, 1, 7, true, false),  // aborted (7, first offset 0)
            span(2, 3, 8, true, false),  // committed
            span(4, 4, 9, false, false), // not transactional
            span(5, 5, 7, true, true),   // 7's abort marker
            span(6, 6, 8, true, true),   // 8's commit marker
            span(7, 8, 7, true, false),  // 7's next transaction: committed
        ];
        let aborted = vec![AbortedTxn {
            producer_id: 7,
            first_offset: 0,
            last_offset: 5,
            last_stable_offset: 0,
        }];
        let offsets: Vec<(i64, i64)> = deliverable(&spans, aborted)
            .iter()
            .map(|b| (b.base_offset, b.last_offset))
            .collect();
        assert_eq!(offsets, vec![(2, 3), (4, 4), (7, 8)]);
    }
}
