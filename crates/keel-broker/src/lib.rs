//! Keel's Kafka semantics: what each request means, above the partition log.
//!
//! Entry point: [`Broker::open`] loads topics and recovers their logs;
//! [`Broker::handle`] turns one request frame into at most one response
//! frame. This crate knows nothing about sockets (the server crate owns
//! them) and nothing about segment files (the log crate owns them).

pub mod broker;
pub mod config;
pub mod groups;
mod handlers;
pub mod health;
pub mod mover;
pub mod partition;
pub mod producers;
mod time;
pub mod topics;

pub use broker::{Broker, ClientInfo, Reply, StartError};
pub use config::{BrokerConfig, ConfigError};
