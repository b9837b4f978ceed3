//! Who a client is and what it may do, decided without sockets.
//!
//! * [`sasl`]: one connection's SASL exchange (PLAIN, SCRAM-SHA-256/512)
//!   and re-authentication, as a state machine fed the client's frames;
//!   SCRAM credentials and their store ([`sasl::credentials`]).
//! * [`acl`]: Kafka's StandardAuthorizer: ACL bindings, their index and
//!   store, and the decision for a principal, host, operation and resource.
//! * [`principal`]: a TLS client certificate's name to a user
//!   (`ssl.principal.mapping.rules`).
//!
//! Settings come in through [`Settings`], under Kafka's names; the stores
//! keep their records in coordinator logs (`keel_coord::metalog`).

pub mod acl;
pub mod principal;
pub mod sasl;

use std::fmt;

/// A setting refused, by its Kafka name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingError {
    pub key: String,
    pub reason: String,
}

impl SettingError {
    pub fn new(key: &str, reason: impl Into<String>) -> SettingError {
        SettingError {
            key: key.to_string(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for SettingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "config `{}`: {}", self.key, self.reason)
    }
}

impl std::error::Error for SettingError {}

/// The broker settings authentication and authorization read.
pub trait Settings {
    /// The value in effect for `key`, trimmed: the one set, else Kafka's
    /// default. For a listener's settings, its
    /// `listener.name.<listener>.<key>` comes first.
    fn value(&self, key: &str) -> String;
    /// The value set for exactly `key`, if one was.
    fn set_value(&self, key: &str) -> Option<String>;
}
