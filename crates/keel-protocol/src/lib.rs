//! Kafka's wire protocol as Keel speaks it: bytes in, typed requests out;
//! typed responses in, bytes out.
//!
//! This crate does no I/O and knows nothing about disks or sockets. The
//! message codecs come from the `kafka-protocol` crate; this crate adds what a
//! broker facing untrusted input needs on top of them:
//!
//! * frame-size checks before any allocation ([`frame`]);
//! * a request-header parser that never panics on short input ([`request`]);
//! * the table of APIs and versions Keel implements ([`versions`]), which is
//!   the single source for the ApiVersions response and for refusing
//!   unsupported requests;
//! * response framing with the right header version ([`response`]);
//! * the share API versions the codec lacks ([`share`]);
//! * request frames out and response frames in, for the requests one
//!   broker sends another ([`client`]);
//! * an allocator that keeps hostile array lengths in requests from
//!   aborting the process ([`alloc_guard`]).
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod alloc_guard;
pub mod client;
pub mod frame;
pub mod request;
pub mod response;
pub mod share;
pub mod versions;

pub use kafka_protocol::error::ResponseError;
pub use kafka_protocol::messages;
pub use kafka_protocol::protocol::{Encodable, StrBytes};
pub use kafka_protocol::records;
pub use request::{decode, DecodeError, DecodedRequest, Request, RequestFrame};
