//! ListOffsets, OffsetForLeaderEpoch and DeleteRecords.

use std::sync::Arc;

use keel_log::DeleteRecordsError;
use keel_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use keel_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use keel_protocol::messages::offset_for_leader_epoch_response::{EpochEndOffset, OffsetForLeaderTopicResult};
use keel_protocol::messages::*;
use keel_protocol::ResponseError;

use super::partition_of;
use crate::Broker;
use keel_data::leadership::Unserved;
use keel_data::partition::Partition;

/// ListOffsets' special timestamps (Kafka's `ListOffsetsRequest`). The
/// answer carries a leader epoch from v4 on.
const LATEST: i64 = -1;
const EARLIEST: i64 = -2;
const MAX_TIMESTAMP: i64 = -3;
/// KIP-405: the first offset still in the local (fast) tier.
const EARLIEST_LOCAL: i64 = -4;
/// KIP-1005: the highest offset copied to the remote tier.
const LATEST_TIERED: i64 = -5;
/// KIP-1023: the first offset not yet copied to the remote tier.
const EARLIEST_PENDING_UPLOAD: i64 = -6;

pub async fn list_offsets(
    broker: &Arc<Broker>,
    req: ListOffsetsRequest,
    version: i16,
) -> ListOffsetsResponse {
    // read_committed readers see the log up to its last stable offset.
    let committed = req.isolation_level == 1;
    let mut topics = Vec::new();
    for t in req.topics {
        let mut partitions = Vec::new();
        for p in t.partitions {
            let base = ListOffsetsPartitionResponse::default().with_partition_index(p.partition_index);
            let topic = broker.data.topics.get(t.name.0.as_str());
            let tiered = topic
                .as_ref()
                .is_some_and(|topic| broker.config().tier_policy(&topic.meta.configs).tier.is_some());
            let led = match &topic {
                Some(topic) => broker
                    .data
                    .lead(topic, p.partition_index, p.current_leader_epoch)
                    .map_err(|e| e.error()),
                None => Err(ResponseError::UnknownTopicOrPartition),
            };
            let r = match led {
                Ok((partition, leader)) => {
                    match offset_at(&partition, p.timestamp, tiered, committed).await {
                        Ok((offset, timestamp)) => base
                            .with_offset(offset)
                            .with_timestamp(timestamp)
                            .with_leader_epoch(if offset >= 0 && version >= 4 {
                                leader.epoch
                            } else {
                                -1
                            }),
                        Err(e) => base.with_error_code(e.code()).with_offset(-1).with_timestamp(-1),
                    }
                }
                Err(e) => base.with_error_code(e.code()).with_offset(-1).with_timestamp(-1),
            };
            partitions.push(r);
        }
        topics.push(
            ListOffsetsTopicResponse::default()
                .with_name(t.name)
                .with_partitions(partitions),
        );
    }
    ListOffsetsResponse::default().with_topics(topics)
}

/// `(offset, timestamp)` for one ListOffsets query; (-1, -1) when no record
/// matches a timestamp, as in Kafka.
async fn offset_at(
    p: &Partition,
    timestamp: i64,
    tiered: bool,
    committed: bool,
) -> Result<(i64, i64), ResponseError> {
    if p.unavailable().is_some() {
        return Err(ResponseError::KafkaStorageError);
    }
    let reader = p.reader().ok_or(ResponseError::KafkaStorageError)?;
    match timestamp {
        LATEST if committed => Ok((p.last_stable_offset(), -1)),
        LATEST => Ok((p.high_watermark(), -1)),
        EARLIEST => Ok((p.log_start_offset(), -1)),
        EARLIEST_LOCAL => Ok((tiered_offsets(&reader, p, tiered).earliest_local, -1)),
        LATEST_TIERED => Ok((tiered_offsets(&reader, p, tiered).latest_tiered, -1)),
        EARLIEST_PENDING_UPLOAD => Ok((tiered_offsets(&reader, p, tiered).earliest_pending_upload, -1)),
        // The record holding the largest timestamp is the first record
        // whose timestamp reaches it.
        MAX_TIMESTAMP => match reader.max_timestamp() {
            Some((max_ts, _)) => by_timestamp(p, max_ts).await,
            None => Ok((-1, -1)),
        },
        t if t >= 0 => by_timestamp(p, t).await,
        _ => Err(ResponseError::InvalidRequest),
    }
}

/// The tier-related offsets of ListOffsets, from the tier manifest.
struct TieredOffsets {
    earliest_local: i64,
    latest_tiered: i64,
    earliest_pending_upload: i64,
}

/// Kafka's answers: the earliest local offset is where the local segments
/// begin (the log start offset if that is higher); the latest tiered offset
/// is the last offset with a verified copy in a colder tier (-1 if none);
/// the earliest pending upload is the first offset not copied yet (-1 when
/// everything is, or the topic has no colder tier).
fn tiered_offsets(reader: &keel_log::LogReader, p: &Partition, tiered: bool) -> TieredOffsets {
    let start = p.log_start_offset();
    let first_local = reader.segment_base_offsets().first().copied().unwrap_or(start);
    let copied_end = reader
        .tiered_segments()
        .iter()
        .filter(|t| matches!(t.state, keel_log::TierState::Both | keel_log::TierState::Cold))
        .map(|t| t.next_offset)
        .max();
    let hw = p.high_watermark();
    TieredOffsets {
        earliest_local: first_local.max(start),
        latest_tiered: copied_end.map_or(-1, |end| end - 1),
        earliest_pending_upload: match copied_end.unwrap_or(start).max(start) {
            _ if !tiered => -1,
            next if next >= hw => -1,
            next => next,
        },
    }
}

/// The first record whose timestamp is at least `t`; the file is read on
/// a blocking thread after the plan is made under the partition lock.
pub(crate) async fn by_timestamp(p: &Partition, t: i64) -> Result<(i64, i64), ResponseError> {
    let Some(plan) = p
        .timestamp_plan(t)
        .map_err(|_| ResponseError::KafkaStorageError)?
    else {
        return Ok((-1, -1));
    };
    let found = tokio::task::spawn_blocking(p.timestamp_reader(plan))
        .await
        .map_err(|_| ResponseError::UnknownServerError)?
        .map_err(|e| {
            tracing::error!(error = %e, "timestamp lookup failed");
            ResponseError::KafkaStorageError
        })?;
    Ok(found.unwrap_or((-1, -1)))
}

/// The end offset of the epoch the client knows. A partition's leader
/// epoch rises when its broker leaves and comes back (see
/// `keel_cluster::topics::elect`), but its log stays the one log that broker
/// wrote: no epoch ever ended by truncation, so every epoch up to the
/// current one ends, as far as a client can have read, at the high
/// watermark, and no client is told to truncate. (Leaders that move between
/// brokers need each partition's epoch history here, Kafka's
/// leader-epoch-checkpoint.)
pub fn offset_for_leader_epoch(
    broker: &Broker,
    req: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let topics = req
        .topics
        .into_iter()
        .map(|t| {
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    let base = EpochEndOffset::default().with_partition(p.partition);
                    let led = match broker.data.topics.get(t.topic.0.as_str()) {
                        Some(topic) => broker.data.lead(&topic, p.partition, p.current_leader_epoch),
                        None => Err(Unserved::Unknown(ResponseError::UnknownTopicOrPartition)),
                    };
                    match led {
                        // An epoch newer than this broker knows: an error
                        // without the offsets, as before.
                        Err(Unserved::UnknownEpoch) => {
                            base.with_error_code(ResponseError::UnknownLeaderEpoch.code())
                        }
                        Err(e) => base
                            .with_error_code(e.error().code())
                            .with_leader_epoch(-1)
                            .with_end_offset(-1),
                        Ok(_) if p.leader_epoch < 0 => base.with_leader_epoch(-1).with_end_offset(-1),
                        Ok((partition, leader)) => base
                            .with_leader_epoch(p.leader_epoch.min(leader.epoch))
                            .with_end_offset(partition.high_watermark()),
                    }
                })
                .collect();
            OffsetForLeaderTopicResult::default()
                .with_topic(t.topic)
                .with_partitions(partitions)
        })
        .collect();
    OffsetForLeaderEpochResponse::default().with_topics(topics)
}

pub async fn delete_records(broker: &Arc<Broker>, req: DeleteRecordsRequest) -> DeleteRecordsResponse {
    let mut topics = Vec::new();
    for t in req.topics {
        let mut partitions = Vec::new();
        for p in t.partitions {
            let base = DeleteRecordsPartitionResult::default().with_partition_index(p.partition_index);
            let refused = crate::handlers::admin::internal_refused(broker, t.name.0.as_str(), "truncated");
            let result = match refused
                .map_err(|(e, _)| e)
                .and_then(|()| partition_of(broker, t.name.0.as_str(), p.partition_index))
            {
                Ok(partition) => {
                    let offset = p.offset;
                    let part = Arc::clone(&partition);
                    let deleted = tokio::task::spawn_blocking(move || delete_before(&part, offset))
                        .await
                        .unwrap_or(Err(ResponseError::UnknownServerError));
                    // In a cluster the new log start is recorded before the
                    // answer, so a failover cannot bring the records back.
                    match deleted {
                        Ok(low) => {
                            match keel_data::takeover::record_log_start(&broker.data, &partition).await {
                                Ok(true) => Ok(low),
                                Ok(false) => Err(ResponseError::NotLeaderOrFollower),
                                Err(why) => {
                                    tracing::warn!(error = %why, "cannot record a log start in the cluster");
                                    Err(ResponseError::RequestTimedOut)
                                }
                            }
                        }
                        Err(e) => Err(e),
                    }
                }
                Err(e) => Err(e),
            };
            partitions.push(match result {
                Ok(low) => base.with_low_watermark(low),
                Err(e) => base.with_error_code(e.code()).with_low_watermark(-1),
            });
        }
        topics.push(
            DeleteRecordsTopicResult::default()
                .with_name(t.name)
                .with_partitions(partitions),
        );
    }
    DeleteRecordsResponse::default().with_topics(topics)
}

/// Advances the log start offset; -1 means "up to the high watermark".
fn delete_before(p: &Partition, offset: i64) -> Result<i64, ResponseError> {
    let target = if offset == -1 { p.high_watermark() } else { offset };
    // Past the high watermark is out of range, as in Kafka (in a cluster
    // the log may hold records past it that are not committed).
    if target < 0 || target > p.high_watermark() {
        return Err(ResponseError::OffsetOutOfRange);
    }
    p.with_log(|log| match log.delete_records_before(target) {
        Ok(()) => Ok(log.log_start_offset()),
        Err(DeleteRecordsError::OffsetOutOfRange { .. }) => Err(ResponseError::OffsetOutOfRange),
        Err(DeleteRecordsError::PolicyViolation) => Err(ResponseError::PolicyViolation),
        Err(DeleteRecordsError::Io(e)) => {
            tracing::error!(error = %e, "delete records failed");
            Err(ResponseError::KafkaStorageError)
        }
    })
    .unwrap_or(Err(ResponseError::KafkaStorageError))
}
