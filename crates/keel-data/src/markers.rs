//! Transaction markers into data partitions, as the transaction
//! coordinator writes them once a transaction is prepared.

use std::time::Duration;

use keel_log::marker::Marker;
use keel_protocol::ResponseError;

use crate::leadership::Unserved;
use crate::plane::DataPlane;
use crate::replica::NotDurable;

/// How long a marker's commit is waited for between checks.
const COMMIT_WAIT: Duration = Duration::from_secs(5);

/// Waits between retries: from 100 ms, doubling up to 5 s.
#[derive(Debug)]
pub struct Backoff(Duration);

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff(Duration::from_millis(100))
    }
}

impl Backoff {
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(Duration::from_secs(5));
    }
}

impl DataPlane {
    /// Appends the marker ending producer `producer_id`'s transaction at
    /// `producer_epoch` to partition `index` of `topic`, retrying while
    /// the partition cannot take it (a storage failure heals only with a
    /// restart, which writes the markers again), or while no broker leads
    /// it. A partition that no longer exists needs none; one a newer epoch
    /// of the producer already ended refuses it. One another broker leads
    /// is that broker's to write: its node id is returned.
    ///
    /// `still_due` is asked before every attempt: once it says no (the
    /// transaction was finished by another marker writer, or its
    /// coordinator let it go) the marker is not written, so a late one
    /// cannot end the producer's next transaction.
    pub async fn write_marker(
        &self,
        topic: &str,
        index: i32,
        (producer_id, producer_epoch): (i64, i16),
        marker: Marker,
        still_due: &(dyn Fn() -> bool + Send + Sync),
    ) -> Option<i32> {
        let mut backoff = Backoff::default();
        loop {
            if !still_due() {
                return None;
            }
            let partition = match self.lead_by_name(topic, index) {
                Ok(p) => p,
                // Led here, not claimed yet in this epoch (a cluster's term
                // ended and the next has not begun), or led by no broker
                // yet (its leader died and the controller has not moved
                // it): wait for it.
                Err(Unserved::NotLeader(None)) => {
                    backoff.wait().await;
                    continue;
                }
                Err(Unserved::NotLeader(Some(l))) if l.node_id == self.leadership.node_id() => {
                    backoff.wait().await;
                    continue;
                }
                Err(Unserved::NotLeader(Some(l))) => return Some(l.node_id),
                Err(_) => return None,
            };
            match partition.write_marker(producer_id, producer_epoch, marker).await {
                // In a cluster the marker counts once committed; a term
                // that ends first cut it, so it is written again.
                Ok(a) => loop {
                    match partition.wait_durable(&a, COMMIT_WAIT).await {
                        Ok(()) => return None,
                        Err(NotDurable::TimedOut) => continue,
                        Err(NotDurable::Fenced) => break,
                    }
                },
                Err(f) if f.error == ResponseError::UnknownTopicOrPartition => return None,
                Err(f) if f.error == ResponseError::InvalidProducerEpoch => {
                    // A newer epoch already wrote here: this transaction's
                    // data was ended by that producer's own marker.
                    tracing::warn!(topic, partition = index, message = %f.message, "a stale marker was refused");
                    return None;
                }
                Err(f) => {
                    tracing::warn!(topic, partition = index, error = ?f.error, message = %f.message, "cannot write a transaction marker; retrying");
                    backoff.wait().await;
                }
            }
        }
    }
}
