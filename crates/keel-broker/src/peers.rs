//! Requests to the other brokers of a cluster: a transaction's markers to
//! the leaders of its partitions, a partition leader's check of a
//! transactional batch with the transaction's coordinator.
//!
//! The sockets are the binary's ([`PeerTransport`], set once at start-up
//! like the loggers); this module picks the broker's address on the
//! inter-broker listener from the cluster's membership, frames the request
//! (`keel_protocol::client`) and reads the answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use keel_protocol::client::{decode_response, encode_request, ApiRequest};

use crate::Broker;

/// A future the transport answers with.
pub type Answer<'a> = Pin<Box<dyn Future<Output = Result<Bytes, String>> + Send + 'a>>;

/// How requests reach another broker: one request frame (size prefix
/// included) out, its response frame (without the prefix) back. The
/// transport keeps its connections; a failed exchange drops its
/// connection.
pub trait PeerTransport: Send + Sync {
    /// The listener other brokers are reached on (the inter-broker
    /// listener, by name).
    fn listener(&self) -> &str;
    /// Sends `frame` to broker `node_id` at `host:port` and reads one
    /// response frame.
    fn round_trip(&self, node_id: i32, host: &str, port: i32, frame: Bytes) -> Answer<'_>;
}

/// Why a request to another broker got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerError {
    /// The broker is not a live member, or has no inter-broker listener.
    Unreachable(String),
    /// The exchange failed or timed out (the connection is dropped).
    Failed(String),
}

impl std::fmt::Display for PeerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerError::Unreachable(why) | PeerError::Failed(why) => f.write_str(why),
        }
    }
}

/// Requests sent to other brokers, and how many failed, by API name.
#[derive(Debug, Default)]
pub struct PeerStats(parking_lot::Mutex<std::collections::BTreeMap<String, (u64, u64)>>);

impl PeerStats {
    fn count(&self, api: i16, failed: bool) {
        let name = keel_protocol::messages::ApiKey::try_from(api)
            .map_or_else(|_| format!("api {api}"), |k| format!("{k:?}"));
        let mut by_api = self.0.lock();
        let entry = by_api.entry(name).or_default();
        entry.0 += 1;
        entry.1 += u64::from(failed);
    }

    /// (API name, requests, failures), by name.
    pub fn snapshot(&self) -> Vec<(String, u64, u64)> {
        self.0
            .lock()
            .iter()
            .map(|(k, (n, f))| (k.clone(), *n, *f))
            .collect()
    }

    pub fn json(&self) -> serde_json::Value {
        self.snapshot()
            .into_iter()
            .map(|(api, n, f)| (api, serde_json::json!({"requests": n, "failures": f})))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
}

/// Correlation ids of this broker's requests to others.
static NEXT_CORRELATION: AtomicI32 = AtomicI32::new(1);

impl Broker {
    /// Sends `req` at `version` to broker `node_id` and waits at most
    /// `timeout` for its answer.
    pub async fn peer_request<R: ApiRequest>(
        &self,
        node_id: i32,
        version: i16,
        req: &R,
        timeout: Duration,
    ) -> Result<R::Response, PeerError> {
        let answer = self.exchange(node_id, (version, req), timeout).await;
        self.peer_stats.count(R::KEY, answer.is_err());
        answer
    }

    /// [`Broker::peer_request`], uncounted.
    async fn exchange<R: ApiRequest>(
        &self,
        node_id: i32,
        (version, req): (i16, &R),
        timeout: Duration,
    ) -> Result<R::Response, PeerError> {
        let Some(transport) = self.peers.get() else {
            return Err(PeerError::Unreachable(
                "this broker has no inter-broker transport".into(),
            ));
        };
        let listener = transport.listener();
        let member = self
            .cluster
            .members()
            .into_iter()
            .find(|m| m.registration.node_id == node_id)
            .ok_or_else(|| PeerError::Unreachable(format!("broker {node_id} is not a live member")))?;
        let endpoint = member
            .registration
            .endpoint(listener)
            .ok_or_else(|| PeerError::Unreachable(format!("broker {node_id} has no listener {listener}")))?;
        let correlation = NEXT_CORRELATION.fetch_add(1, Ordering::Relaxed);
        let client_id = format!("keel-broker-{}", self.config().node_id());
        let frame = encode_request(correlation, &client_id, version, req)
            .map_err(|e| PeerError::Failed(e.to_string()))?;
        let exchange = transport.round_trip(node_id, &endpoint.host, endpoint.port, frame);
        let answer = match tokio::time::timeout(timeout, exchange).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(why)) => return Err(PeerError::Failed(format!("broker {node_id}: {why}"))),
            Err(_) => {
                return Err(PeerError::Failed(format!(
                    "broker {node_id} did not answer within {timeout:?}"
                )))
            }
        };
        let (answered, response) = decode_response::<R>(answer, version)
            .map_err(|e| PeerError::Failed(format!("broker {node_id}'s answer: {e}")))?;
        if answered != correlation {
            return Err(PeerError::Failed(format!(
                "broker {node_id} answered request {answered}, not {correlation}"
            )));
        }
        Ok(response)
    }
}
