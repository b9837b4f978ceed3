//! [`DirFence`]: keeps work that runs beside a partition log, off its
//! writer lock, out of the log's directory once the log is retired.
//!
//! [`crate::PartitionLog::retire`] renames the directory away, and a new
//! log may be created at its path at once (a topic deleted and created
//! again under the same name). A handle opened before the rename follows
//! the directory; a path does not. So work that holds the path (a cleaning
//! pass) opens, creates, removes and replaces files by it only through the
//! fence: retiring waits for such an operation in progress, then refuses
//! every later one.

use std::io;

use parking_lot::RwLock;

#[derive(Debug, Default)]
pub(crate) struct DirFence {
    /// True once retired. Read-locked across each fenced operation's I/O
    /// (never nested); only `retire`, on the thread deleting the log,
    /// waits for the write lock.
    retired: RwLock<bool>,
}

/// What a fenced operation fails with once the log is retired.
#[derive(Debug)]
pub(crate) struct Retired;

impl std::fmt::Display for Retired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the log was retired: its directory is no longer at this path")
    }
}

impl std::error::Error for Retired {}

impl DirFence {
    /// Runs `op`, which uses the directory by its path, unless the log is
    /// retired; retiring waits for it.
    pub(crate) fn run<T>(&self, op: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        let retired = self.retired.read();
        if *retired {
            return Err(io::Error::other(Retired));
        }
        op()
    }

    /// Refuses every later operation, after waiting for one in progress.
    pub(crate) fn retire(&self) {
        *self.retired.write() = true;
    }

    pub(crate) fn is_retired(&self) -> bool {
        *self.retired.read()
    }
}
