//! Keel's data plane: what holds and serves the records.
//!
//! * [`partition`]: one partition: its append queue and writer (group
//!   commit, producers' sequences and transactions, [`producers`]), the
//!   offsets it publishes, and reads routed to the tail cache or the
//!   shared scan.
//! * [`scan`]: shared cold scans: reads below the tail cache held for
//!   the readers close behind, so readers riding one stretch of the log
//!   share each read.
//! * [`readers`]: who reads each partition, and where (every read names
//!   its reader).
//! * [`lifecycle`]: a topic's creation, growth and deletion, durable.
//! * [`topics`]: the topic registry and its persistence, and topic
//!   deletion.
//! * [`health`]: a log dir's health (a failed fsync takes it offline).
//! * [`cleaning`]: a partition's cleaning, as `/stats` shows it.
//! * [`mover`], [`cleaner`], [`maintenance`]: the background work:
//!   sealed segments to the colder tiers, compaction, retention, flushes.
//! * [`tiering`]: which sealed segments the mover keeps on the fast tier
//!   for readers about to read them.
//! * [`markers`]: transaction markers into data partitions, retried until
//!   written.
//! * [`policy`]: what the data plane asks of the configs in force.
//! * [`leadership`]: who leads each partition, in which epoch (one node:
//!   this broker, epoch 0); every partition a request reaches goes through
//!   [`plane::DataPlane::lead`].
//! * [`wal`], [`replica`]: in a cluster, writes made durable in the object
//!   store and committed in the coordination store before the high
//!   watermark moves past them.
//! * [`plane`]: all of it as one value, [`plane::DataPlane`], which the
//!   broker holds.
//!
//! The crate knows nothing about requests or sockets; the broker's
//! handlers call it.

pub mod cleaner;
pub mod cleaning;
pub mod health;
pub mod leadership;
pub mod lifecycle;
pub mod maintenance;
pub mod markers;
pub mod mover;
pub mod partition;
pub mod plane;
pub mod policy;
pub mod producers;
pub mod readers;
pub mod replica;
pub mod scan;
pub mod takeover;
pub mod tiering;
pub mod topics;
pub mod wal;
