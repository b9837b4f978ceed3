//! Transaction markers: once the coordinator has a transaction prepared,
//! its markers go into every partition of the transaction (the data
//! plane's `write_marker`, the group log for the offsets partition) and the
//! transaction completes; the timers write the markers of transactions a
//! restart left prepared or a timeout aborted.

use std::sync::Arc;
use std::time::Duration;

use keel_coord::txn::state::{TxnState, TxnStatus};
use keel_coord::txn::{COORDINATOR_EPOCH, OFFSETS_PARTITION, OFFSETS_TOPIC};
use keel_data::markers::Backoff;
use keel_log::marker::Marker;

use crate::Broker;

/// The wait between retries of a step that must succeed: 100 ms, doubling
/// up to 5 s.
/// Writes the markers of a persisted Prepare state into every partition
/// of its transaction, then completes it. Runs on its own task: the
/// client has its answer already, and its next AddPartitionsToTxn or
/// InitProducerId gets CONCURRENT_TRANSACTIONS until this is done.
pub fn spawn_markers(broker: &Arc<Broker>, id: String, prepared: TxnState) {
    let broker = Arc::clone(broker);
    tokio::spawn(async move {
        let marker = Marker {
            commit: prepared.status == TxnStatus::PrepareCommit,
            coordinator_epoch: COORDINATOR_EPOCH,
        };
        // The data partitions' markers first: a group's offsets waiting
        // for its partition to load here hold no other partition's
        // transaction open.
        let (offsets, data): (Vec<_>, Vec<_>) = prepared
            .partitions
            .iter()
            .partition(|(topic, index)| in_group_log(&broker, topic, *index));
        // Another task may finish the transaction meanwhile (one a load
        // of its partition started while this one waited), or its
        // partition may be let go: a marker written after that could end
        // the producer's next transaction, so each attempt asks first.
        let still_due = {
            let (broker, id, prepared) = (Arc::clone(&broker), id.clone(), prepared.clone());
            move || broker.txns.describe(&id).as_ref() == Some(&prepared)
        };
        for (topic, index) in data.into_iter().chain(offsets) {
            write_marker(&broker, topic, *index, &prepared, marker, &still_due).await;
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

/// Whether a transaction's partition is the group log's: one node's
/// `__consumer_offsets` partition 0 (its one group log), a cluster's
/// partitions of `__consumer_offsets`.
fn in_group_log(broker: &Broker, topic: &str, index: i32) -> bool {
    topic == OFFSETS_TOPIC && (broker.topics_shared() || index == OFFSETS_PARTITION)
}

/// Appends one marker (see `DataPlane::write_marker`); a marker of the
/// group log goes to the group coordinator, retried the same way. In a
/// cluster it waits while this broker leads the group's partition of
/// `__consumer_offsets` and has not loaded it yet, or no broker leads it;
/// a partition another broker leads is given up with a warning, as
/// `DataPlane::write_marker` gives up a data partition (markers are not
/// sent to other brokers yet: docs/cluster.md), and so is one of a
/// `__consumer_offsets` not created yet (no offsets can be there). Nothing
/// is written once `still_due` says no.
async fn write_marker(
    broker: &Arc<Broker>,
    topic: &str,
    index: i32,
    prepared: &TxnState,
    marker: Marker,
    still_due: &(dyn Fn() -> bool + Send + Sync),
) {
    let producer = (prepared.producer_id, prepared.producer_epoch);
    if !in_group_log(broker, topic, index) {
        return broker
            .data
            .write_marker(topic, index, producer, marker, still_due)
            .await;
    }
    let mut backoff = Backoff::default();
    while still_due() {
        let written = if broker.topics_shared() && !broker.group_log.is_loaded(index) {
            if broker.group_marker_not_here(index) {
                return tracing::warn!(
                    partition = index,
                    producer_id = prepared.producer_id,
                    "not writing a transaction marker to a partition of {OFFSETS_TOPIC} another broker leads (or that does not exist)"
                );
            }
            Err(format!("partition {index} of {OFFSETS_TOPIC} is still loading"))
        } else {
            broker
                .groups
                .end_transaction(prepared.producer_id, prepared.producer_epoch, marker)
                .await
                .map_err(|e| e.to_string())
        };
        match written {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(error = %e, "cannot write a transaction marker into the group log; retrying");
                backoff.wait().await;
            }
        }
    }
}

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
