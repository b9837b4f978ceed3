//! Fetch with long polling: a fetch that finds less than `min_bytes` waits
//! until an append to one of its partitions wakes it or `max_wait_ms`
//! passes. Wake-ups come from appends, not from polling timers.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use keel_log::ReadError;
use keel_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use keel_protocol::messages::*;
use keel_protocol::ResponseError;
use keel_tier::TailCache;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::partition::{Partition, ReadSource, LEADER_EPOCH};
use crate::Broker;

/// Kafka's default for `fetch.max.bytes` when a request carries none (v<3).
const DEFAULT_FETCH_MAX_BYTES: usize = 50 * 1024 * 1024;

/// A partition's failed read: the Kafka error and the offsets the client
/// needs to recover (set for OFFSET_OUT_OF_RANGE).
#[derive(Debug, Clone, Copy)]
struct Failure {
    error: ResponseError,
    high_watermark: i64,
    log_start_offset: i64,
}

impl Failure {
    fn new(error: ResponseError, message: &str) -> Failure {
        if !message.is_empty() {
            tracing::warn!(%message, ?error, "fetch failed");
        }
        Failure {
            error,
            high_watermark: -1,
            log_start_offset: -1,
        }
    }

    fn into_data(self) -> PartitionData {
        PartitionData::default()
            .with_error_code(self.error.code())
            .with_high_watermark(self.high_watermark)
            .with_last_stable_offset(self.high_watermark)
            .with_log_start_offset(self.log_start_offset)
            .with_preferred_read_replica(BrokerId(-1))
    }
}

/// One requested partition, resolved to a partition or an error.
struct Target {
    topic_index: usize,
    index: i32,
    fetch_offset: i64,
    max_bytes: usize,
    partition: Result<Arc<Partition>, ResponseError>,
}

pub async fn fetch(broker: &Arc<Broker>, req: FetchRequest) -> FetchResponse {
    let (topics, targets) = resolve(broker, &req);
    let total_max = usize::try_from(req.max_bytes)
        .ok()
        .filter(|m| *m > 0)
        .unwrap_or(DEFAULT_FETCH_MAX_BYTES);
    let min_bytes = usize::try_from(req.min_bytes).unwrap_or(0);
    let max_wait = Duration::from_millis(u64::try_from(req.max_wait_ms).unwrap_or(0));
    let deadline = Instant::now() + max_wait;
    let waiter = Arc::new(Notify::new());
    loop {
        // Register before reading, so an append landing between the read
        // and the wait still wakes this fetch.
        for t in &targets {
            if let Ok(p) = &t.partition {
                p.register_waiter(&waiter);
            }
        }
        let (partitions, bytes, failed) = read_all(broker, &targets, total_max).await;
        let done = bytes >= min_bytes.max(1) || failed || Instant::now() >= deadline;
        if done
            || tokio::time::timeout_at(deadline, waiter.notified())
                .await
                .is_err()
        {
            let final_parts = if done {
                partitions
            } else {
                read_all(broker, &targets, total_max).await.0
            };
            return assemble(topics, &targets, final_parts);
        }
    }
}

fn resolve(broker: &Broker, req: &FetchRequest) -> (Vec<FetchableTopicResponse>, Vec<Target>) {
    let mut topics = Vec::new();
    let mut targets = Vec::new();
    for (topic_index, t) in req.topics.iter().enumerate() {
        let topic = broker.topics.resolve(t.topic.0.as_str(), t.topic_id);
        topics.push(
            FetchableTopicResponse::default()
                .with_topic(t.topic.clone())
                .with_topic_id(t.topic_id),
        );
        for p in &t.partitions {
            let partition = topic.clone().and_then(|topic| {
                if p.current_leader_epoch > LEADER_EPOCH {
                    return Err(ResponseError::UnknownLeaderEpoch);
                }
                topic
                    .partition(p.partition)
                    .cloned()
                    .ok_or(ResponseError::UnknownTopicOrPartition)
            });
            targets.push(Target {
                topic_index,
                index: p.partition,
                fetch_offset: p.fetch_offset,
                max_bytes: usize::try_from(p.partition_max_bytes).unwrap_or(0),
                partition,
            });
        }
    }
    (topics, targets)
}

/// Reads every target once. Returns the per-target results (in target
/// order), the bytes read, and whether any target failed.
async fn read_all(
    broker: &Broker,
    targets: &[Target],
    total_max: usize,
) -> (Vec<PartitionData>, usize, bool) {
    // Sources are resolved under each partition's lock without I/O (tail
    // cache hits are already data); file reads happen on a blocking thread
    // after every lock is released.
    let mut plans: Vec<Result<Option<ReadSource>, Failure>> = Vec::with_capacity(targets.len());
    for t in targets {
        plans.push(plan(t));
    }
    let cache = Arc::clone(&broker.tail_cache);
    let partitions: Vec<Option<Arc<Partition>>> = targets
        .iter()
        .map(|t| t.partition.as_ref().ok().cloned())
        .collect();
    let results = tokio::task::spawn_blocking(move || execute(plans, &partitions, total_max, &cache))
        .await
        .unwrap_or_else(|e| {
            vec![Err(Failure::new(ResponseError::UnknownServerError, &e.to_string())); targets.len()]
        });
    let mut out = Vec::with_capacity(targets.len());
    let (mut bytes, mut failed) = (0, false);
    for (t, r) in targets.iter().zip(results) {
        let data = match r {
            Ok(records) => {
                bytes += records.len();
                let p = t.partition.as_ref().ok();
                PartitionData::default()
                    .with_partition_index(t.index)
                    .with_high_watermark(p.map_or(-1, |p| p.high_watermark()))
                    .with_last_stable_offset(p.map_or(-1, |p| p.high_watermark()))
                    .with_log_start_offset(p.map_or(-1, |p| p.log_start_offset()))
                    .with_preferred_read_replica(BrokerId(-1))
                    .with_records(Some(records))
            }
            Err(f) => {
                failed = true;
                f.into_data().with_partition_index(t.index)
            }
        };
        out.push(data);
    }
    (out, bytes, failed)
}

fn plan(t: &Target) -> Result<Option<ReadSource>, Failure> {
    let p = t.partition.as_ref().map_err(|e| Failure::new(*e, ""))?;
    if t.max_bytes == 0 {
        return Ok(None);
    }
    match p.read(t.fetch_offset, t.max_bytes) {
        Ok(source) => Ok(Some(source)),
        Err(ReadError::OffsetOutOfRange { .. }) => Err(Failure {
            error: ResponseError::OffsetOutOfRange,
            high_watermark: p.high_watermark(),
            log_start_offset: p.log_start_offset(),
        }),
    }
}

/// Runs the read plans within the request's byte budget. The first
/// partition that returns data may exceed the budget by one batch (KIP-74),
/// so a batch larger than the limits can still be consumed.
fn execute(
    plans: Vec<Result<Option<ReadSource>, Failure>>,
    partitions: &[Option<Arc<Partition>>],
    total_max: usize,
    cache: &TailCache,
) -> Vec<Result<Bytes, Failure>> {
    let mut remaining = total_max;
    let mut any_data = false;
    let read = |source: ReadSource, partition: &Option<Arc<Partition>>| match source {
        ReadSource::Memory(bytes) => Ok(bytes),
        ReadSource::Disk(plan) => {
            let bytes = plan.execute()?;
            if !plan.is_empty() {
                cache.record_cold_read(bytes.len() as u64);
                if let Some(p) = partition {
                    p.note_cold_read(bytes.len() as u64);
                }
            }
            Ok::<Bytes, std::io::Error>(bytes)
        }
    };
    plans
        .into_iter()
        .zip(partitions)
        .map(|(p, partition)| match p {
            Ok(Some(source)) if remaining > 0 || !any_data => match read(source, partition) {
                Ok(bytes) if any_data && bytes.len() > remaining => Ok(Bytes::new()),
                Ok(bytes) => {
                    any_data |= !bytes.is_empty();
                    remaining = remaining.saturating_sub(bytes.len());
                    Ok(bytes)
                }
                Err(e) => Err(Failure::new(ResponseError::KafkaStorageError, &e.to_string())),
            },
            Ok(_) => Ok(Bytes::new()),
            Err(d) => Err(d),
        })
        .collect()
}

fn assemble(
    mut topics: Vec<FetchableTopicResponse>,
    targets: &[Target],
    parts: Vec<PartitionData>,
) -> FetchResponse {
    for (t, p) in targets.iter().zip(parts) {
        topics[t.topic_index].partitions.push(p);
    }
    FetchResponse::default().with_responses(topics)
}
