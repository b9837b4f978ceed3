//! Where partition data lives and how it is read back.
//!
//! [`TailCache`], the broker-owned cache of the newest batches of every
//! partition under one byte budget; [`memory`], which sizes that budget from
//! the memory the broker may use; [`ColdReads`], the bounded, budgeted
//! executor for reads below the tail; [`IoScheduler`], the byte budget of
//! each class of I/O (live, cold reads, tier moves, cleaning), with the
//! live path's latency ([`LiveLatency`]) and the [`govern`]or that sets
//! the background budgets from it; and
//! [`Tiers`], the capacity directories and object store that sealed
//! segments move to.
//!
//! This crate does no socket I/O and knows nothing of Kafka requests; it
//! stores and returns record batches by offset.

pub mod bulk;
pub mod cold;
pub mod govern;
pub mod io;
pub mod live;
pub mod memory;
pub mod pace;
pub mod priority;
pub mod resident;
pub mod scan;
pub mod tail;
pub mod tiers;

pub use bulk::{Bulk, BULK_NICE};
pub use cold::{ColdRead, ColdReads, ColdStats};
pub use govern::GovernorStats;
pub use io::{Budget, Budgets, GovernorTick, IoClass, IoClassStats, IoScheduler};
pub use live::{LiveLatency, LiveOp, Quantiles};
pub use scan::{ScanPolicy, ScanPool, ScanStats};
pub use tail::{Chunks, PartitionTail, TailCache, TailStats};
pub use tiers::{filesystem_space, RemoteSettings, TierStats, Tiers, UncommittedCopy};
