//! Transaction markers: once the coordinator has a transaction prepared,
//! its markers go into every partition of the transaction (the data
//! plane's `write_marker`, the group log for the offsets partition) and the
//! transaction completes; the timers write the markers of transactions a
//! restart left prepared or a timeout aborted.

use std::sync::Arc;
use std::time::Duration;

use keel_coord::txn::state::{TxnState, TxnStatus};
use keel_coord::txn::{COORDINATOR_EPOCH, OFFSETS_TOPIC};
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
        for (topic, index) in &prepared.partitions {
            write_marker(&broker, topic, *index, &prepared, marker).await;
        }
        let mut backoff = Backoff::default();
        while let Err(e) = broker.txns.complete(&id, &prepared).await {
            tracing::warn!(transactional_id = %id, error = ?e, "cannot complete a transaction; retrying");
            backoff.wait().await;
        }
    });
}

/// Appends one marker (see `DataPlane::write_marker`); a marker of a
/// partition of `__consumer_offsets` goes to the group log, retried the
/// same way. In a cluster that partition's groups must be loaded here: a
/// marker cannot be written to a partition another broker leads yet
/// (docs/cluster.md), so it waits for this broker to load it.
async fn write_marker(broker: &Arc<Broker>, topic: &str, index: i32, prepared: &TxnState, marker: Marker) {
    if topic != OFFSETS_TOPIC {
        let (id, epoch) = (prepared.producer_id, prepared.producer_epoch);
        return broker.data.write_marker(topic, index, id, epoch, marker).await;
    }
    let mut backoff = Backoff::default();
    loop {
        let written = if broker.topics_shared() && !broker.group_log.is_loaded(index) {
            Err(format!(
                "partition {index} of {OFFSETS_TOPIC} is not led by this broker"
            ))
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
