//! Where partition data lives and how it is read back.
//!
//! Today: [`TailCache`], the broker-owned cache of the newest batches of
//! every partition under one byte budget; [`memory`], which sizes that
//! budget from the memory the broker may use; and [`ColdReads`], the
//! bounded, budgeted executor for reads below the tail. The capacity and
//! object-store tiers build on this crate.
//!
//! This crate does no socket I/O and knows nothing of Kafka requests; it
//! stores and returns record batches by offset.

pub mod cold;
pub mod memory;
pub mod resident;
pub mod tail;

pub use cold::{ColdReads, ColdStats};
pub use tail::{PartitionTail, TailCache, TailStats};
