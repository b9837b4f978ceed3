//! Taking a partition's leadership in a cluster, and keeping the object
//! store's record of its sealed segments.
//!
//! A broker the controller names leader claims the partition in the
//! coordination store (`keel_cluster::logs::claim`), which fences every
//! earlier leader. Then:
//! * if this broker is the partition's writer (its term committed the
//!   newest records) and its log holds them, it cuts what it wrote past
//!   the committed offset and leads;
//! * otherwise it rebuilds the log from the object store: the sealed
//!   segments the earlier leaders copied there become its cold segments,
//!   as they are (reads of their offsets go to the object store), and the
//!   records past them are replayed from the WAL objects into a fresh
//!   local segment. Producer state is the snapshot the old leader put
//!   beside the last segment (`<object>.snapshot`, written when that
//!   segment rolled) and then the replayed records, so an idempotent
//!   producer's retry is recognised wherever its batch is; the leader-epoch
//!   history is in the batches themselves.
//!
//! A leader records each segment the mover copies to the object store
//! ([`publish_copies`]) and forgets a copy before deleting it
//! ([`forget_copy`]), and records its log start as it moves
//! ([`record_log_start`]), all fenced by its claim, so a later leader
//! adopts exactly the copies that hold committed records and starts the
//! log where it was.

use std::sync::Arc;

use keel_cluster::logs::{Claimed, Forget, LogSources, Published, RemoteSegment};
use keel_log::txnindex::AbortedTxn;
use keel_log::{Tier, TierState, TieredSegment};

use crate::partition::Partition;
use crate::plane::DataPlane;

/// WAL ranges read from the object store at once while replaying.
const READS_AHEAD: usize = 8;

/// Claims `partition` in `epoch` and makes this broker its leader, its
/// log rebuilt from the object store if this broker's log does not hold
/// every committed record. On an error the partition is not led here (the
/// caller tries again later); its claim stays, fencing earlier leaders.
pub async fn take_leadership(data: &DataPlane, partition: &Arc<Partition>, epoch: i32) -> Result<(), String> {
    let wal = data.wal.as_ref().ok_or("this broker is not in a cluster")?;
    let membership = wal.membership();
    partition.give_up_leadership();
    let reader = partition.reader().ok_or("the partition's log is not open")?;
    let local = (reader.log_start_offset(), reader.log_end_offset());
    let id = (partition.topic_id, partition.index);
    let claimed = membership
        .claim_log(id, epoch, local)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("a newer leader holds it, or this broker's session is not confirmed")?;
    partition.published.lock().clear();
    partition
        .recorded_start
        .store(-1, std::sync::atomic::Ordering::Release);
    // The writer's log holds every committed record, unless it lost them,
    // or another broker claimed the partition since (it may have moved the
    // log start, or copied and recorded segments this log does not know).
    let me = membership.me().node_id;
    let holds_all = claimed.writer == me
        && claimed.previous == me
        && local.1 >= claimed.end_offset
        && claimed.log_start <= local.0;
    if !holds_all {
        let sources = membership
            .partition_log(id, &claimed)
            .await
            .map_err(|e| e.to_string())?
            .map_err(|why| format!("cannot rebuild its log from the object store: {why}"))?;
        rebuild(data, partition, &claimed, &sources).await?;
    }
    let p = Arc::clone(partition);
    let (end, revision) = (claimed.end_offset, claimed.revision);
    blocking(move || p.take_leadership(epoch, end, revision, !holds_all)).await?;
    tracing::info!(
        topic = %partition.topic, partition = partition.index, epoch, committed = claimed.end_offset,
        rebuilt = !holds_all, "leading the partition"
    );
    Ok(())
}

/// Replaces the local log with the one `sources` describe.
async fn rebuild(
    data: &DataPlane,
    partition: &Arc<Partition>,
    claimed: &Claimed,
    sources: &LogSources,
) -> Result<(), String> {
    let started = std::time::Instant::now();
    let cold: Vec<TieredSegment> = sources.segments.iter().map(tiered).collect();
    let (start, from) = (sources.log_start, sources.wal_from);
    let snapshot = match sources.segments.last() {
        Some(last) => data
            .tiers
            .get_remote(&format!("{}.snapshot", last.object))
            .await
            .map_err(|e| format!("reading the producer snapshot of {}: {e}", last.object))?,
        None => None,
    };
    let mut restart = Some((cold, snapshot.map(|b| b.to_vec())));
    let mut bytes = 0u64;
    for window in sources.wal.chunks(READS_AHEAD) {
        let reads: Vec<_> = window
            .iter()
            .map(|(object, r)| {
                let tiers = Arc::clone(&data.tiers);
                let (object, position, length) = (object.clone(), r.position, r.length);
                tokio::spawn(async move { tiers.read_remote(&object, position, length).await })
            })
            .collect();
        for (read, (object, range)) in reads.into_iter().zip(window) {
            let read = read
                .await
                .map_err(|e| format!("reading WAL object {object}: {e}"))?
                .map_err(|e| format!("reading WAL object {object}: {e}"))?;
            let (batches, first) = from_offset(read, range.base_offset, from).map_err(|why| {
                format!(
                    "WAL object {object}, offsets {}..{} at bytes {}+{}: {why}",
                    range.base_offset, range.end_offset, range.position, range.length
                )
            })?;
            if let Some((cold, snapshot)) = restart.take() {
                // The log restarts at the first replayed batch (it may hold
                // the log start, which DeleteRecords can put inside a batch).
                let p = Arc::clone(partition);
                blocking(move || p.restart_log((start, first), cold, snapshot)).await?;
            }
            if batches.is_empty() {
                continue;
            }
            bytes += batches.len() as u64;
            let p = Arc::clone(partition);
            blocking(move || p.replay(&batches)).await?;
        }
    }
    if let Some((cold, snapshot)) = restart.take() {
        let p = Arc::clone(partition);
        blocking(move || p.restart_log((start, from), cold, snapshot)).await?;
    }
    let end = partition.reader().map_or(-1, |r| r.log_end_offset());
    if end != claimed.end_offset {
        return Err(format!(
            "the rebuilt log ends at {end}, not at the committed offset {}",
            claimed.end_offset
        ));
    }
    tracing::info!(
        topic = %partition.topic, partition = partition.index,
        log_start = sources.log_start, segments = sources.segments.len(), wal_from = from,
        wal_ranges = sources.wal.len(), replayed_bytes = bytes, end,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "rebuilt the partition's log from the object store"
    );
    Ok(())
}

/// The batches of `range` (whole batches, the first at `base`) from the
/// one holding offset `from` on, and where the first of them starts.
fn from_offset(range: bytes::Bytes, base: i64, from: i64) -> Result<(bytes::Bytes, i64), String> {
    let mut pos = 0;
    let mut first = base;
    while pos < range.len() {
        let header = keel_log::BatchHeader::parse(&range[pos..]).map_err(|e| e.to_string())?;
        if header.last_offset() >= from {
            break;
        }
        pos += header.total_len();
        first = header.last_offset() + 1;
    }
    if pos > range.len() {
        return Err(format!("its batches overrun it before offset {from}"));
    }
    Ok((range.slice(pos..), first))
}

/// A segment in the object store as this broker's manifest holds it.
pub(crate) fn tiered(s: &RemoteSegment) -> TieredSegment {
    TieredSegment {
        base_offset: s.base_offset,
        next_offset: s.next_offset,
        size_bytes: s.size_bytes,
        max_timestamp_ms: s.max_timestamp_ms,
        offset_of_max_timestamp: s.offset_of_max_timestamp,
        tier: Tier::Remote,
        state: TierState::Cold,
        object: s.object.clone(),
        aborted: s
            .aborted
            .iter()
            .map(
                |[producer_id, first_offset, last_offset, last_stable_offset]| AbortedTxn {
                    producer_id: *producer_id,
                    first_offset: *first_offset,
                    last_offset: *last_offset,
                    last_stable_offset: *last_stable_offset,
                },
            )
            .collect(),
    }
}

/// A copy in this broker's manifest as the coordination store records it.
fn remote(t: &TieredSegment) -> RemoteSegment {
    RemoteSegment {
        version: 1,
        base_offset: t.base_offset,
        next_offset: t.next_offset,
        size_bytes: t.size_bytes,
        max_timestamp_ms: t.max_timestamp_ms,
        offset_of_max_timestamp: t.offset_of_max_timestamp,
        object: t.object.clone(),
        aborted: t
            .aborted
            .iter()
            .map(|a| [a.producer_id, a.first_offset, a.last_offset, a.last_stable_offset])
            .collect(),
    }
}

/// Records in the coordination store the partition's complete copies in
/// the object store that it has not recorded yet, while this broker leads
/// it. A claim that moved on meanwhile (a commit) is read again; a
/// deposed leader records nothing.
pub async fn publish_copies(data: &DataPlane, partition: &Partition) -> Result<(), String> {
    let Some(wal) = &data.wal else {
        return Ok(());
    };
    let Some(reader) = partition.reader() else {
        return Ok(());
    };
    let copies: Vec<TieredSegment> = reader
        .tiered_segments()
        .into_iter()
        .filter(|t| t.tier == Tier::Remote && matches!(t.state, TierState::Both | TierState::Cold))
        .filter(|t| !partition.published.lock().contains(&t.object))
        .collect();
    let id = (partition.topic_id, partition.index);
    for copy in copies {
        let Some(revision) = partition.claimed_revision() else {
            return Ok(());
        };
        let published = wal
            .membership()
            .publish_segment(id, revision, &remote(&copy))
            .await
            .map_err(|e| e.to_string())?;
        match published {
            Published::Recorded => {}
            Published::Superseded => tracing::warn!(
                topic = %partition.topic, partition = partition.index, object = %copy.object,
                base_offset = copy.base_offset, next_offset = copy.next_offset,
                "a copy shorter than the one recorded at its base offset is not recorded"
            ),
            Published::Fenced => return Ok(()), // deposed: the next leader's copies count
        }
        partition.published.lock().insert(copy.object);
    }
    record_log_start(data, partition).await.map(|_| ())
}

/// Records in the coordination store the partition's log start, if it
/// moved past the one recorded, while this broker leads it: a leader that
/// rebuilds the log then starts it there (retention, DeleteRecords).
/// Whether it is recorded (false: this broker no longer leads it).
pub async fn record_log_start(data: &DataPlane, partition: &Partition) -> Result<bool, String> {
    let Some(wal) = &data.wal else {
        return Ok(true);
    };
    let start = partition.log_start_offset();
    if partition
        .recorded_start
        .load(std::sync::atomic::Ordering::Acquire)
        >= start
    {
        return Ok(true);
    }
    let Some(revision) = partition.claimed_revision() else {
        return Ok(false);
    };
    let id = (partition.topic_id, partition.index);
    let recorded = wal
        .membership()
        .record_log_start(id, revision, start)
        .await
        .map_err(|e| e.to_string())?;
    if recorded {
        partition
            .recorded_start
            .fetch_max(start, std::sync::atomic::Ordering::AcqRel);
    }
    Ok(recorded)
}

/// Whether the leader may delete its copy `segment` from the object
/// store: in a cluster, once the coordination store no longer records it
/// ([`keel_cluster::logs::forget_segment`]; a deposed leader may not, the
/// copy may be another leader's now).
pub async fn forget_copy(
    data: &DataPlane,
    partition: &Partition,
    segment: &TieredSegment,
) -> Result<Forget, String> {
    let Some(wal) = &data.wal else {
        return Ok(Forget::Gone);
    };
    if segment.tier != Tier::Remote {
        return Ok(Forget::Gone);
    }
    let Some(revision) = partition.claimed_revision() else {
        return Ok(Forget::Fenced);
    };
    let id = (partition.topic_id, partition.index);
    let forgotten = wal
        .membership()
        .forget_segment(
            id,
            revision,
            (segment.base_offset, &segment.object, partition.log_start_offset()),
        )
        .await
        .map_err(|e| e.to_string())?;
    if forgotten == Forget::Gone {
        partition.published.lock().remove(&segment.object);
    }
    Ok(forgotten)
}

/// A data-plane change on a blocking thread, its failure as a message.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f).await.map_err(|e| e.to_string())?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_cut_at_the_batch_holding_the_first_offset_needed() {
        let batch = |base: i64, records: usize| {
            let mut b = keel_log::testing::BatchBuilder::new(0);
            for _ in 0..records {
                b = b.record(None, Some(b"v"));
            }
            let mut bytes = b.build();
            keel_log::batch::set_base_offset(&mut bytes, base);
            bytes
        };
        let (first, second) = (batch(10, 3), batch(13, 2));
        let range = bytes::Bytes::from([first.clone(), second.clone()].concat());
        let cut = |from| from_offset(range.clone(), 10, from).unwrap();
        assert_eq!(cut(10), (range.clone(), 10));
        assert_eq!(cut(13), (bytes::Bytes::from(second.clone()), 13));
        assert_eq!(cut(15), (bytes::Bytes::new(), 15));
        // A range after the offset is taken whole.
        assert_eq!(cut(4), (range.clone(), 10));
        // An offset inside a batch (a log start DeleteRecords set): from
        // that batch on.
        assert_eq!(cut(14), (bytes::Bytes::from(second), 13));
        assert_eq!(cut(11), (range.clone(), 10));
        // Bytes that are not batches.
        assert!(from_offset(bytes::Bytes::from_static(b"not a batch at all, no"), 0, 5).is_err());
    }

    #[test]
    fn segments_round_trip_between_the_manifest_and_the_store() {
        let t = TieredSegment {
            base_offset: 10,
            next_offset: 20,
            size_bytes: 300,
            max_timestamp_ms: 5,
            offset_of_max_timestamp: 12,
            tier: Tier::Remote,
            state: TierState::Cold,
            object: "c/t-x/0/00000000000000000010-ab".into(),
            aborted: vec![AbortedTxn {
                producer_id: 7,
                first_offset: 11,
                last_offset: 14,
                last_stable_offset: 11,
            }],
        };
        assert_eq!(tiered(&remote(&t)), t);
    }
}
