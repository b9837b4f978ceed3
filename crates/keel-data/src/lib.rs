//! Keel's data plane: what holds and serves the records.
//!
//! * [`partition`]: one partition: its append queue and writer (group
//!   commit, producers' sequences and transactions, [`producers`]), the
//!   offsets it publishes, and reads routed to the tail cache, a
//!   read-ahead or the log files.
//! * [`topics`]: the topic registry and its persistence, and topic
//!   deletion.
//! * [`health`]: a log dir's health (a failed fsync takes it offline).
//! * [`cleaning`]: a partition's cleaning, as `/stats` shows it.
//! * [`plane`]: all of it as one value, [`plane::DataPlane`], which the
//!   broker holds.
//!
//! The crate knows nothing about requests or sockets; the broker's
//! handlers call it.

pub mod cleaning;
pub mod health;
pub mod partition;
pub mod plane;
pub mod producers;
pub mod topics;
