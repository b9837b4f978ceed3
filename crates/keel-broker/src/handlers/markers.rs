//! Transaction markers: once the coordinator has a transaction prepared,
//! its markers go into every partition of the transaction (the data
//! plane's `write_marker`, the group log for the offsets partition, or in
//! a cluster WriteTxnMarkers to the broker leading the partition) and the
//! transaction completes; the timers write the markers of transactions a
//! restart left prepared or a timeout aborted.

use std::sync::Arc;
use std::time::Duration;

use keel_coord::txn::state::{TxnState, TxnStatus};
use keel_coord::txn::{OFFSETS_PARTITION, OFFSETS_TOPIC};
use keel_data::markers::Backoff;
use keel_log::marker::Marker;
use keel_protocol::messages::write_txn_markers_request::{WritableTxnMarker, WritableTxnMarkerTopic};
use keel_protocol::messages::{ProducerId, TopicName, WriteTxnMarkersRequest};
use keel_protocol::{ResponseError, StrBytes};

use crate::broker::catalog::MarkerAt;
use crate::Broker;

/// Writes the markers of a persisted Prepare state into every partition
/// of its transaction, then completes it. Runs on its own task: the
/// client has its answer already, and its next AddPartitionsToTxn or
/// InitProducerId gets CONCURRENT_TRANSACTIONS until this is done.
pub fn spawn_markers(broker: &Arc<Broker>, id: String, prepared: TxnState) {
    let broker = Arc::clone(broker);
    tokio::spawn(async move {
        // The data partitions' markers first: a group's offsets waiting
        // for its partition to load here hold no other partition's
        // transaction open.
        let (offsets, data): (Vec<_>, Vec<_>) = prepared
            .partitions
            .iter()
            .cloned()
            .partition(|(topic, index)| in_group_log(&broker, topic, *index));
        // Another task may finish the transaction meanwhile (one a load
        // of its partition started while this one waited), or its
        // partition may be let go: a marker written after that could end
        // the producer's next transaction, so each attempt asks first.
        let still_due: StillDue = {
            let (broker, id, prepared) = (Arc::clone(&broker), id.clone(), prepared.clone());
            Arc::new(move || broker.txns.describe(&id).as_ref() == Some(&prepared))
        };
        // The data partitions' markers all at once (they commit together,
        // in one WAL object for the partitions this broker leads, and in
        // one round trip each for those other brokers lead); the group
        // log's one by one, since each ends the producer's offsets in every
        // group this broker holds.
        let prepared = Arc::new(prepared);
        let mut writing = tokio::task::JoinSet::new();
        for (topic, index) in data {
            let (broker, id, prepared, still_due) = (
                Arc::clone(&broker),
                id.clone(),
                Arc::clone(&prepared),
                Arc::clone(&still_due),
            );
            writing.spawn(async move {
                write_marker(&broker, &id, (&topic, index), &prepared, &*still_due).await
            });
        }
        let mut lost = false;
        while let Some(done) = writing.join_next().await {
            lost |= done.is_err();
        }
        if lost {
            // Not completed: the transaction stays prepared, and its
            // markers are written again when its partition is next loaded.
            return tracing::error!(transactional_id = %id, "a transaction marker task failed");
        }
        for (topic, index) in offsets {
            write_marker(&broker, &id, (&topic, index), &prepared, &*still_due).await;
        }
        if !still_due() {
            return;
        }
        let mut backoff = Backoff::default();
        while let Err(e) = broker.txns.complete(&id, &prepared).await {
            tracing::warn!(transactional_id = %id, error = ?e, "cannot complete a transaction; retrying");
            backoff.wait().await;
        }
    });
}

/// Asked before every attempt at a marker: whether the transaction is
/// still the prepared one.
type StillDue = Arc<dyn Fn() -> bool + Send + Sync>;

/// Whether a transaction's partition is the group log's: one node's
/// `__consumer_offsets` partition 0 (its one group log), a cluster's
/// partitions of `__consumer_offsets`.
pub(crate) fn in_group_log(broker: &Broker, topic: &str, index: i32) -> bool {
    topic == OFFSETS_TOPIC && (broker.topics_shared() || index == OFFSETS_PARTITION)
}

/// Appends one marker (see `DataPlane::write_marker`); a marker of the
/// group log goes to the group coordinator, retried the same way. In a
/// cluster a partition another broker leads gets its marker from that
/// broker (WriteTxnMarkers); a partition of `__consumer_offsets` this
/// broker leads and has not loaded yet, or that no broker leads, is
/// waited for; one of a `__consumer_offsets` not created yet needs none
/// (no offsets can be there). Nothing is written once `still_due` says
/// no.
///
/// Each attempt carries the coordinator epoch in force then
/// (`Broker::coordinator_epoch`); while this broker's view does not show
/// it leading the id's partition of `__transaction_state`, it waits.
async fn write_marker(
    broker: &Arc<Broker>,
    id: &str,
    (topic, index): (&str, i32),
    prepared: &TxnState,
    still_due: &(dyn Fn() -> bool + Send + Sync),
) {
    let producer = (prepared.producer_id, prepared.producer_epoch);
    let mut backoff = Backoff::default();
    while still_due() {
        let Some(coordinator_epoch) = broker.coordinator_epoch(id) else {
            tracing::warn!(
                transactional_id = id,
                "this broker does not lead the transactional id's partition now; its marker waits"
            );
            backoff.wait().await;
            continue;
        };
        let marker = Marker {
            commit: prepared.status == TxnStatus::PrepareCommit,
            coordinator_epoch,
        };
        let elsewhere = if in_group_log(broker, topic, index) {
            match group_marker(broker, index, producer, marker).await {
                Ok(elsewhere) => elsewhere,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot write a transaction marker into the group log; retrying");
                    backoff.wait().await;
                    continue;
                }
            }
        } else {
            broker
                .data
                .write_marker(topic, index, producer, marker, still_due)
                .await
        };
        let Some(node) = elsewhere else {
            return;
        };
        match send_marker(broker, node, (topic, index), producer, marker).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(topic, partition = index, leader = node, error = %e, "cannot send a transaction marker to the partition's leader; retrying");
                backoff.wait().await;
            }
        }
    }
}

/// One attempt at a marker of the group log here: `Ok(Some(node))` when
/// broker `node` leads the partition, `Ok(None)` when it is written or
/// needs none.
pub(crate) async fn group_marker(
    broker: &Arc<Broker>,
    index: i32,
    (producer_id, epoch): (i64, i16),
    marker: Marker,
) -> Result<Option<i32>, String> {
    if broker.topics_shared() && !broker.group_log.is_loaded(index) {
        return match broker.group_marker_at(index) {
            MarkerAt::Nowhere => Ok(None),
            MarkerAt::Broker(node) => Ok(Some(node)),
            MarkerAt::Here => Err(format!("partition {index} of {OFFSETS_TOPIC} is still loading")),
            MarkerAt::NoLeader => Err(format!("partition {index} of {OFFSETS_TOPIC} has no leader")),
        };
    }
    broker
        .groups
        .end_transaction(producer_id, epoch, marker)
        .await
        .map(|()| None)
        .map_err(|e| e.to_string())
}

/// How long a marker sent to another broker is waited for: it answers
/// once the marker is committed there.
/// (Longer than the 30 s the leader waits for the commit, so its answer
/// arrives.)
const MARKER_ANSWER_WAIT: Duration = Duration::from_secs(40);

/// Sends one marker to the broker leading its partition: `Ok` once it is
/// written there or needs writing no more (the partition is gone, a newer
/// producer epoch or coordinator wrote there already), `Err` to try again.
async fn send_marker(
    broker: &Arc<Broker>,
    node: i32,
    (topic, index): (&str, i32),
    (producer_id, epoch): (i64, i16),
    marker: Marker,
) -> Result<(), String> {
    let req = WriteTxnMarkersRequest::default().with_markers(vec![WritableTxnMarker::default()
        .with_producer_id(ProducerId(producer_id))
        .with_producer_epoch(epoch)
        .with_transaction_result(marker.commit)
        .with_coordinator_epoch(marker.coordinator_epoch)
        .with_topics(vec![WritableTxnMarkerTopic::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partition_indexes(vec![index])])]);
    let answer = broker
        .peer_request(node, WRITE_TXN_MARKERS_VERSION, &req, MARKER_ANSWER_WAIT)
        .await
        .map_err(|e| e.to_string())?;
    let code = answer
        .markers
        .first()
        .and_then(|m| m.topics.first())
        .and_then(|t| t.partitions.first())
        .map(|p| p.error_code)
        .ok_or_else(|| format!("broker {node} answered for no partition"))?;
    match ResponseError::try_from_code(code) {
        None => Ok(()),
        Some(ResponseError::UnknownTopicOrPartition) => Ok(()),
        Some(e @ (ResponseError::InvalidProducerEpoch | ResponseError::TransactionCoordinatorFenced)) => {
            tracing::warn!(topic, partition = index, producer_id, error = ?e, "a stale marker was refused by the partition's leader");
            Ok(())
        }
        Some(e) => Err(format!("broker {node} answered {e:?}")),
    }
}

/// The WriteTxnMarkers version Keel serves and sends.
const WRITE_TXN_MARKERS_VERSION: i16 = 1;

/// Start-up: writes the markers of transactions the last run left
/// prepared. Then, every
/// `transaction.abort.timed.out.transaction.cleanup.interval.ms`, aborts
/// open transactions past their timeout and forgets idle ids.
pub fn spawn_timers(broker: &Arc<Broker>) {
    for (id, prepared) in broker.txns.unfinished() {
        tracing::info!(transactional_id = %id, status = prepared.status.name(), "finishing a transaction the last run prepared");
        spawn_markers(broker, id, prepared);
    }
    let every = u64::try_from(
        broker
            .config()
            .num("transaction.abort.timed.out.transaction.cleanup.interval.ms"),
    )
    .unwrap_or(10_000)
    .max(10);
    let broker = Arc::clone(broker);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(every));
        tick.tick().await;
        loop {
            tick.tick().await;
            let server_version = broker.config().transaction_version();
            for (id, prepared) in broker.txns.abort_timed_out(server_version).await {
                spawn_markers(&broker, id, prepared);
            }
            broker.txns.expire_ids().await;
        }
    });
}
