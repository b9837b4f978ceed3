//! Fetch with long polling: a fetch that finds less than `min_bytes` waits
//! until an append to one of its partitions wakes it or `max_wait_ms`
//! passes. Wake-ups come from appends, not from polling timers.

use std::sync::Arc;
use std::time::Duration;

use keel_protocol::messages::fetch_response::{AbortedTransaction, FetchableTopicResponse, PartitionData};
use keel_protocol::messages::*;
use keel_protocol::ResponseError;
use keel_tier::Chunks;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::trace::{self, PartitionTrace, Place, Stage};
use crate::Broker;
use keel_data::partition::{Partition, ReadFailure, ReadSource};
use keel_data::readers::Reader;

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
    /// `read_committed`: data only below the last stable offset, with the
    /// aborted transactions it overlaps.
    committed: bool,
}

/// A fetch's answer before encoding: the records are still the buffers
/// they were read into, so joining and encoding them can happen off the
/// request threads ([`FetchAnswer::into_response`]).
pub struct FetchAnswer {
    topics: Vec<FetchableTopicResponse>,
    /// Per requested partition: its topic's index in `topics` and its data.
    parts: Vec<(usize, PartData)>,
    bytes: usize,
}

enum PartData {
    Records {
        index: i32,
        high_watermark: i64,
        last_stable_offset: i64,
        log_start_offset: i64,
        records: Chunks,
        /// For `read_committed` fetches (`None` otherwise, as Kafka sends).
        aborted: Option<Vec<AbortedTransaction>>,
    },
    Failed(PartitionData),
}

impl FetchAnswer {
    /// Record bytes in the answer.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn into_response(self) -> FetchResponse {
        let mut topics = self.topics;
        for (topic_index, part) in self.parts {
            let data = match part {
                PartData::Records {
                    index,
                    high_watermark,
                    last_stable_offset,
                    log_start_offset,
                    records,
                    aborted,
                } => PartitionData::default()
                    .with_partition_index(index)
                    .with_high_watermark(high_watermark)
                    .with_last_stable_offset(last_stable_offset)
                    .with_log_start_offset(log_start_offset)
                    .with_aborted_transactions(aborted)
                    .with_preferred_read_replica(BrokerId(-1))
                    .with_records(Some(records.join())),
                PartData::Failed(data) => data,
            };
            topics[topic_index].partitions.push(data);
        }
        FetchResponse::default().with_responses(topics)
    }
}

pub async fn fetch(broker: &Arc<Broker>, req: FetchRequest, reader: &Reader) -> FetchAnswer {
    let (topics, targets) = resolve(broker, &req);
    // The request's limit, within the broker's `fetch.max.bytes`.
    let broker_max =
        usize::try_from(broker.config().num("fetch.max.bytes")).unwrap_or(DEFAULT_FETCH_MAX_BYTES);
    let total_max = usize::try_from(req.max_bytes)
        .ok()
        .filter(|m| *m > 0)
        .unwrap_or(DEFAULT_FETCH_MAX_BYTES)
        .min(broker_max.max(1));
    let min_bytes = usize::try_from(req.min_bytes).unwrap_or(0);
    // Kafka answers at once when there is nothing to wait for: no
    // partitions, or no minimum to reach.
    let max_wait = if targets.is_empty() || min_bytes == 0 {
        Duration::ZERO
    } else {
        Duration::from_millis(u64::try_from(req.max_wait_ms).unwrap_or(0))
    };
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
        let read = read_all(reader, &targets, total_max, deadline).await;
        let done = read.bytes >= min_bytes.max(1) || read.failed || Instant::now() >= deadline;
        let done = done || targets.is_empty();
        let waiting = Instant::now();
        if done
            || tokio::time::timeout_at(deadline, waiter.notified())
                .await
                .is_err()
        {
            let read = if done {
                read
            } else {
                trace::add(Stage::Wait, waiting.elapsed());
                read_all(reader, &targets, total_max, deadline).await
            };
            for t in read.traces {
                trace::partition(t);
            }
            return FetchAnswer {
                parts: targets.iter().map(|t| t.topic_index).zip(read.parts).collect(),
                topics,
                bytes: read.bytes,
            };
        }
        trace::add(Stage::Wait, waiting.elapsed());
    }
}

fn resolve(broker: &Broker, req: &FetchRequest) -> (Vec<FetchableTopicResponse>, Vec<Target>) {
    let committed = req.isolation_level == 1;
    let mut topics = Vec::new();
    let mut targets = Vec::new();
    for (topic_index, t) in req.topics.iter().enumerate() {
        let topic = broker.data.topics.resolve(t.topic.0.as_str(), t.topic_id);
        topics.push(
            FetchableTopicResponse::default()
                .with_topic(t.topic.clone())
                .with_topic_id(t.topic_id),
        );
        for p in &t.partitions {
            let partition = topic.clone().and_then(|topic| {
                broker
                    .data
                    .lead(&topic, p.partition, p.current_leader_epoch)
                    .map(|(partition, _)| partition)
                    .map_err(|e| e.error())
            });
            targets.push(Target {
                topic_index,
                index: p.partition,
                fetch_offset: p.fetch_offset,
                max_bytes: usize::try_from(p.partition_max_bytes).unwrap_or(0),
                partition,
                committed,
            });
        }
    }
    (topics, targets)
}

/// What one read of every target found.
struct Read {
    /// Per target, in target order.
    parts: Vec<PartData>,
    /// Record bytes in `parts`.
    bytes: usize,
    /// Whether any target failed.
    failed: bool,
    /// Where each target's data came from, for the request's trace.
    traces: Vec<PartitionTrace>,
}

/// Reads every target once.
///
/// Partitions are read in request order against what is left of the
/// request's budget, as Kafka does: each gets at most the smaller of its
/// own limit and the remainder; only the first with data may go over
/// (by one batch, KIP-74), and once the budget is spent the rest are not
/// read at all. A read of the log files reserves its whole share before it
/// runs, so the bytes taken from disk stay within the budget too.
///
/// Sources are resolved from each partition's view without I/O: tail cache
/// and data the shared scan holds are data at once. Reads of the log files start
/// together on the cold executor. When the tail part already has data, the
/// cold part is waited for only until `deadline`; a cold read still running
/// then is answered empty and its data kept for the next fetch.
async fn read_all(reader: &Reader, targets: &[Target], total_max: usize, deadline: Instant) -> Read {
    let started = Instant::now();
    let mut results: Vec<Option<Result<Chunks, Failure>>> = Vec::with_capacity(targets.len());
    let mut sources: Vec<Option<Source>> = Vec::with_capacity(targets.len());
    let mut cold = Vec::new();
    let mut remaining = total_max;
    let mut any_data = false;
    for (i, t) in targets.iter().enumerate() {
        let budget = t.max_bytes.min(remaining);
        if any_data && budget == 0 {
            results.push(Some(Ok(Chunks::default())));
            sources.push(None);
            continue;
        }
        let planned = plan(reader, t, budget);
        sources.push(planned.as_ref().ok().and_then(|p| p.as_ref()).map(Source::of));
        match planned {
            Ok(Some(ReadSource::Memory(bytes) | ReadSource::ReadAhead(bytes))) => {
                remaining = remaining.saturating_sub(bytes.len());
                any_data |= !bytes.is_empty();
                results.push(Some(Ok(bytes)));
            }
            Ok(Some(ReadSource::Disk(read))) => {
                cold.push((i, read.spawn()));
                remaining = remaining.saturating_sub(budget);
                any_data = true;
                results.push(None);
            }
            Ok(Some(ReadSource::Pending(rx))) => {
                cold.push((i, rx));
                remaining = remaining.saturating_sub(budget);
                any_data = true;
                results.push(None);
            }
            Ok(_) => results.push(Some(Ok(Chunks::default()))),
            Err(f) => results.push(Some(Err(f))),
        }
    }
    let planned = started.elapsed();
    let waited = await_cold_reads(targets, cold, &mut results, deadline, started).await;
    // Held read-ahead may be larger than this fetch's share: the budget
    // holds for the response in any case.
    let results = limit_total(
        results.into_iter().map(|r| r.expect("every target resolved")),
        total_max,
    );
    assemble(targets, results, sources, &waited, planned)
}

/// Waits for the cold reads (only until `deadline` when the tail cache
/// already answered something), each into its target's place in
/// `results`; returns when each one's data arrived.
async fn await_cold_reads(
    targets: &[Target],
    cold: Vec<(
        usize,
        tokio::sync::oneshot::Receiver<std::io::Result<bytes::Bytes>>,
    )>,
    results: &mut [Option<Result<Chunks, Failure>>],
    deadline: Instant,
    started: Instant,
) -> Vec<Option<std::time::Duration>> {
    let mut waited = vec![None; targets.len()];
    let tail_has_data = results.iter().any(|r| matches!(r, Some(Ok(b)) if !b.is_empty()));
    for (i, rx) in cold {
        let outcome = if tail_has_data {
            tokio::time::timeout_at(deadline, rx).await
        } else {
            Ok(rx.await)
        };
        results[i] = Some(match outcome {
            Ok(Ok(Ok(bytes))) => {
                if let Ok(p) = &targets[i].partition {
                    p.note_cold_read(bytes.len() as u64);
                }
                waited[i] = Some(started.elapsed());
                Ok(bytes.into())
            }
            Ok(Ok(Err(e))) => Err(cold_failure(&targets[i], &e)),
            Ok(Err(_)) => Err(Failure::new(
                ResponseError::UnknownServerError,
                "cold read task ended",
            )),
            Err(_) => Ok(Chunks::default()),
        });
    }
    waited
}

/// The fetch's answer from each target's result, with the trace of where
/// each read went.
fn assemble(
    targets: &[Target],
    results: Vec<Result<Chunks, Failure>>,
    mut sources: Vec<Option<Source>>,
    waited: &[Option<std::time::Duration>],
    planned: std::time::Duration,
) -> Read {
    let mut out = Read {
        parts: Vec::with_capacity(targets.len()),
        bytes: 0,
        failed: false,
        traces: Vec::new(),
    };
    for (i, (t, r)) in targets.iter().zip(results).enumerate() {
        let data = match r {
            Ok(records) => {
                let part = records_of(t, records);
                if let PartData::Records { records, .. } = &part {
                    out.bytes += records.len();
                    // A partition the tail cache had nothing for says
                    // nothing about where time went: not traced.
                    let source = sources[i]
                        .take()
                        .filter(|s| !records.is_empty() || s.stage != Stage::ReadCache);
                    if let (Some(source), Ok(p)) = (source, &t.partition) {
                        out.traces
                            .push(source.trace(p, records.len(), waited[i].unwrap_or(planned)));
                    }
                }
                part
            }
            Err(f) => {
                out.failed = true;
                PartData::Failed(f.into_data().with_partition_index(t.index))
            }
        };
        out.parts.push(data);
    }
    out
}

/// Where a partition's read went, for the request's trace.
struct Source {
    stage: Stage,
    place: Option<Place>,
}

impl Source {
    fn of(source: &ReadSource) -> Source {
        let (stage, place) = match source {
            ReadSource::Memory(_) => (Stage::ReadCache, None),
            ReadSource::ReadAhead(_) | ReadSource::Pending(_) => (Stage::ReadAhead, None),
            // A read of the files: naming them costs nothing next to the I/O.
            ReadSource::Disk(read) => match read.plan().tiered_segment() {
                Some(t) => (
                    Stage::of_tier(t.tier),
                    Some(Place::Named {
                        name: t.object.clone(),
                        position: None,
                    }),
                ),
                None => (
                    Stage::ReadLocal,
                    read.plan().file_path().map(|f| Place::Named {
                        name: f.display().to_string(),
                        position: Some(read.plan().start_position()),
                    }),
                ),
            },
        };
        Source { stage, place }
    }

    fn trace(self, p: &Partition, bytes: usize, took: Duration) -> PartitionTrace {
        PartitionTrace {
            topic: Arc::clone(&p.topic),
            partition: p.index,
            bytes: bytes as u64,
            source: self.stage.name(),
            place: self.place,
            stages: vec![(self.stage, took)],
        }
    }
}

/// One partition's answer. A `read_committed` one is cut at the last
/// stable offset (read after the data, so every marker below it is in the
/// aborted-transaction index) and lists the aborted transactions that
/// overlap `[fetch offset, LSO)`: a superset of those its records need,
/// as Kafka's upper bound is too; clients use only the entries their
/// batches reach.
fn records_of(t: &Target, records: Chunks) -> PartData {
    let Ok(p) = t.partition.as_ref() else {
        return PartData::Records {
            index: t.index,
            high_watermark: -1,
            last_stable_offset: -1,
            log_start_offset: -1,
            records,
            aborted: None,
        };
    };
    let (hw, lso) = (p.high_watermark(), p.last_stable_offset());
    // The tail cache reads up to the limit; a read of the files (or data
    // one took before) can reach past it: past the LSO while a
    // transaction is open, past the high watermark in a cluster, whose
    // log holds what is written but not yet committed.
    let records = records.below(if t.committed { lso } else { hw });
    let (records, aborted) = if !t.committed {
        (records, None)
    } else if records.is_empty() {
        (records, Some(Vec::new()))
    } else {
        let aborted = p
            .aborted_txns(t.fetch_offset, lso)
            .into_iter()
            .map(|a| {
                AbortedTransaction::default()
                    .with_producer_id(ProducerId(a.producer_id))
                    .with_first_offset(a.first_offset)
            })
            .collect();
        (records, Some(aborted))
    };
    PartData::Records {
        index: t.index,
        high_watermark: hw,
        last_stable_offset: lso,
        log_start_offset: p.log_start_offset(),
        records,
        aborted,
    }
}

/// A failed read of the log files: a segment deleted between planning and
/// reading means the offset fell below the log start (retention won the
/// race); anything else is a storage error.
fn cold_failure(t: &Target, e: &std::io::Error) -> Failure {
    if let (std::io::ErrorKind::NotFound, Ok(p)) = (e.kind(), &t.partition) {
        if t.fetch_offset < p.log_start_offset() {
            return Failure {
                error: ResponseError::OffsetOutOfRange,
                high_watermark: p.high_watermark(),
                log_start_offset: p.log_start_offset(),
            };
        }
    }
    Failure::new(ResponseError::KafkaStorageError, &e.to_string())
}

fn plan(reader: &Reader, t: &Target, budget: usize) -> Result<Option<ReadSource>, Failure> {
    let p = t.partition.as_ref().map_err(|e| Failure::new(*e, ""))?;
    if t.max_bytes == 0 {
        return Ok(None);
    }
    match p.read(reader, t.fetch_offset, budget.max(1), t.committed) {
        Ok(source) => Ok(Some(source)),
        Err(ReadFailure::OffsetOutOfRange) => Err(Failure {
            error: ResponseError::OffsetOutOfRange,
            high_watermark: p.high_watermark(),
            log_start_offset: p.log_start_offset(),
        }),
        Err(ReadFailure::Storage(why)) => Err(Failure::new(ResponseError::KafkaStorageError, &why)),
    }
}

/// Applies the request's byte budget in partition order. The first
/// partition with data may exceed it by one batch (KIP-74), so a batch
/// larger than the limits can still be consumed; data past the budget is
/// dropped (the client fetches it again).
fn limit_total(
    results: impl Iterator<Item = Result<Chunks, Failure>>,
    total_max: usize,
) -> Vec<Result<Chunks, Failure>> {
    let mut remaining = total_max;
    let mut any_data = false;
    results
        .map(|r| match r {
            Ok(bytes) if any_data && bytes.len() > remaining => Ok(Chunks::default()),
            Ok(bytes) => {
                any_data |= !bytes.is_empty();
                remaining = remaining.saturating_sub(bytes.len());
                Ok(bytes)
            }
            Err(f) => Err(f),
        })
        .collect()
}
