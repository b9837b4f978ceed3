//! Where producer ids come from: one node reserves blocks in its own file
//! (`__keel_meta/producer-ids`); a broker of a cluster takes blocks from
//! the coordination store's counter, so no two brokers hand out the same
//! id, starting above every id its directory handed out alone.

use std::ops::Range;
use std::sync::Arc;

use keel_cluster::Membership;
use keel_data::producers::ProducerIdAllocator;
use keel_protocol::ResponseError;
use parking_lot::Mutex;

pub enum ProducerIds {
    /// One node.
    Local(Arc<Mutex<ProducerIdAllocator>>),
    /// A broker of a cluster. Each block taken is also reserved in the
    /// directory's file, so the directory alone never hands out an id the
    /// cluster gave it.
    Cluster {
        membership: Arc<keel_cluster::Membership>,
        local: Arc<Mutex<ProducerIdAllocator>>,
        block: tokio::sync::Mutex<Range<i64>>,
    },
}

impl ProducerIds {
    /// Ids from `local` alone, or from the cluster `membership` belongs to
    /// when `clustered`, above every id `local` handed out.
    pub fn new(local: ProducerIdAllocator, membership: &Arc<Membership>, clustered: bool) -> ProducerIds {
        let local = Arc::new(Mutex::new(local));
        if clustered {
            ProducerIds::Cluster {
                membership: Arc::clone(membership),
                local,
                block: tokio::sync::Mutex::new(0..0),
            }
        } else {
            ProducerIds::Local(local)
        }
    }

    /// A producer id never handed out before. One node writes its block
    /// file once per block, off the async threads; a cluster's broker
    /// asks the store once per block, and while the store cannot be
    /// reached answers COORDINATOR_LOAD_IN_PROGRESS (retriable), as Kafka
    /// does while its controller has no block for it.
    pub async fn allocate(&self) -> Result<i64, ResponseError> {
        match self {
            ProducerIds::Local(local) => on_file(local, |ids| ids.allocate()).await,
            ProducerIds::Cluster {
                membership,
                local,
                block,
            } => {
                let mut block = block.lock().await;
                if block.is_empty() {
                    let floor = local.lock().floor();
                    let taken = membership.take_producer_id_block(floor).await.map_err(|e| {
                        tracing::warn!(error = %e, "cannot take a block of producer ids");
                        ResponseError::CoordinatorLoadInProgress
                    })?;
                    let end = taken.end;
                    on_file(local, move |ids| ids.reserve_through(end)).await?;
                    *block = taken;
                }
                let id = block.start;
                block.start += 1;
                Ok(id)
            }
        }
    }
}

/// Runs `f` on the directory's allocator, off the async threads (it writes
/// its file once per block).
async fn on_file<T: Send + 'static>(
    local: &Arc<Mutex<ProducerIdAllocator>>,
    f: impl FnOnce(&mut ProducerIdAllocator) -> std::io::Result<T> + Send + 'static,
) -> Result<T, ResponseError> {
    let local = Arc::clone(local);
    match tokio::task::spawn_blocking(move || f(&mut local.lock())).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "cannot reserve producer ids");
            Err(ResponseError::KafkaStorageError)
        }
        Err(_) => Err(ResponseError::UnknownServerError),
    }
}
