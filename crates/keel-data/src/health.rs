//! [`DirHealth`]: whether a log dir can be trusted.
//!
//! After a failed fsync the page cache may hold data the disk lost, so
//! nothing in the directory can be trusted any more: like Kafka, Keel takes
//! the whole log dir offline. Its partitions answer KAFKA_STORAGE_ERROR
//! until the broker restarts (and recovers them); the rest of the broker
//! (other log dirs, metadata, groups, the admin endpoint) keeps serving.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

#[derive(Debug)]
pub struct DirHealth {
    path: PathBuf,
    offline: AtomicBool,
    reason: Mutex<Option<String>>,
}

impl DirHealth {
    pub fn new(path: &Path) -> Arc<DirHealth> {
        Arc::new(DirHealth {
            path: path.to_path_buf(),
            offline: AtomicBool::new(false),
            reason: Mutex::new(None),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes the dir offline (once; later reasons are only logged).
    pub fn take_offline(&self, why: &str) {
        let mut reason = self.reason.lock();
        if reason.is_none() {
            tracing::error!(
                dir = %self.path.display(), %why,
                "log dir offline: its partitions answer KAFKA_STORAGE_ERROR until the broker restarts"
            );
            *reason = Some(why.to_string());
            self.offline.store(true, Ordering::Release);
        } else {
            tracing::warn!(dir = %self.path.display(), %why, "another failure in an offline log dir");
        }
    }

    pub fn is_offline(&self) -> bool {
        self.offline.load(Ordering::Acquire)
    }

    /// Why the dir is offline, if it is.
    pub fn offline_reason(&self) -> Option<String> {
        if !self.is_offline() {
            return None;
        }
        self.reason.lock().clone()
    }
}
