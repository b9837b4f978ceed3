//! Request dispatch: `Broker::handle` decodes a frame, checks that the
//! client may send it, and runs its API's entry in `apis::APIS` (its ACL
//! checks, handler, quota accounting and answer). Here too: what every
//! API's answer shares (the throttle times, the SASL outcome).

pub(crate) mod apis;
mod coordinator;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use keel_auth::acl::Operation;
use keel_protocol::messages::ApiKey;
use keel_protocol::{DecodeError, Encodable, Request, RequestFrame};

use crate::broker::{Broker, ClientInfo, Reply};
use crate::handlers;
use crate::quotas::table::{
    CONNECTION_CREATION_RATE, CONSUMER_BYTE_RATE, CONTROLLER_MUTATION_RATE, PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
};
use crate::quotas::Throttle;
use crate::trace::{self, Stage};
use apis::Call;
use keel_log::clock::now_ms;

impl Broker {
    /// Handles one request frame.
    pub async fn handle(self: &Arc<Self>, frame: RequestFrame, client: &ClientInfo) -> Reply {
        let decoding = Instant::now();
        let decoded = keel_protocol::decode(&frame);
        trace::add(Stage::Decode, decoding.elapsed());
        let decoded = match decoded {
            Ok(d) => d,
            Err(DecodeError::UnsupportedVersion { api_key, .. }) if api_key == ApiKey::ApiVersions as i16 => {
                return match keel_protocol::response::api_versions_unsupported(frame.correlation_id) {
                    Ok(bytes) => Reply::Frame(bytes),
                    Err(e) => Reply::Close(e.to_string()),
                };
            }
            Err(e @ (DecodeError::UnsupportedApi { .. } | DecodeError::UnsupportedVersion { .. })) => {
                self.refused_apis.log(&frame, &client.host);
                return Reply::Refused(e.to_string());
            }
            Err(e) => return Reply::Close(e.to_string()),
        };
        let version = frame.api_version;
        let id = frame.correlation_id;
        let client_id = decoded.header.client_id.as_ref().map_or("", |c| c.as_str());
        trace::set_client_id(client_id);
        let Ok(key) = ApiKey::try_from(frame.api_key) else {
            return Reply::Close(format!("unknown API key {}", frame.api_key));
        };
        let Some(api) = apis::find(key) else {
            return Reply::Close(format!("no handler for {key:?}"));
        };
        if let Some(reply) = self.group_denied(&decoded.body, version, id, client_id, client) {
            return reply;
        }
        if let Some(reply) = self.not_coordinator(&decoded.body, version, id) {
            return reply;
        }
        let call = Call {
            version,
            id,
            client_id,
            client,
            request_bytes: frame.bytes.len(),
        };
        (api.serve)(self, decoded.body, call).await
    }

    /// The answer to a group API whose group the client may not use (READ;
    /// DESCRIBE for OffsetFetch): Kafka's GROUP_AUTHORIZATION_FAILED.
    fn group_denied(
        &self,
        body: &Request,
        version: i16,
        id: i32,
        client_id: &str,
        client: &ClientInfo,
    ) -> Option<Reply> {
        use keel_auth::acl::Operation::{Describe, Read};
        use keel_protocol::messages::*;
        if !self.authorizer.enabled {
            return None;
        }
        let code = keel_protocol::ResponseError::GroupAuthorizationFailed.code();
        let denied = |group: &str, op| !handlers::authz::group(self, client, group, op);
        let reply = match body {
            Request::JoinGroup(r) if denied(&r.group_id, Read) => self.answer(
                client_id,
                ApiKey::JoinGroup,
                version,
                id,
                &mut JoinGroupResponse::default()
                    .with_error_code(code)
                    .with_generation_id(-1),
            ),
            Request::SyncGroup(r) if denied(&r.group_id, Read) => self.answer(
                client_id,
                ApiKey::SyncGroup,
                version,
                id,
                &mut SyncGroupResponse::default().with_error_code(code),
            ),
            Request::Heartbeat(r) if denied(&r.group_id, Read) => self.answer(
                client_id,
                ApiKey::Heartbeat,
                version,
                id,
                &mut HeartbeatResponse::default().with_error_code(code),
            ),
            Request::LeaveGroup(r) if denied(&r.group_id, Read) => self.answer(
                client_id,
                ApiKey::LeaveGroup,
                version,
                id,
                &mut LeaveGroupResponse::default().with_error_code(code),
            ),
            Request::OffsetCommit(r) if denied(&r.group_id, Read) => {
                let topics = r
                    .topics
                    .iter()
                    .map(|t| {
                        handlers::authz::offset_commit_refused(
                            t,
                            keel_protocol::ResponseError::GroupAuthorizationFailed,
                        )
                    })
                    .collect();
                self.answer(
                    client_id,
                    ApiKey::OffsetCommit,
                    version,
                    id,
                    &mut OffsetCommitResponse::default().with_topics(topics),
                )
            }
            Request::OffsetFetch(r) if version < 8 && denied(&r.group_id, Describe) => self.answer(
                client_id,
                ApiKey::OffsetFetch,
                version,
                id,
                &mut OffsetFetchResponse::default().with_error_code(code),
            ),
            Request::ConsumerGroupHeartbeat(r) if denied(&r.group_id, Read) => self.answer(
                client_id,
                ApiKey::ConsumerGroupHeartbeat,
                version,
                id,
                &mut ConsumerGroupHeartbeatResponse::default()
                    .with_error_code(code)
                    .with_error_message(Some(handlers::str_bytes("Group authorization failed."))),
            ),
            _ => return None,
        };
        Some(reply)
    }

    /// A SASL answer, and what the connection does after it: a failed
    /// authentication is answered after
    /// `connection.failed.authentication.delay.ms` (Kafka's brake on
    /// password guessing) and closes the connection.
    pub(crate) fn sasl_reply<R: Encodable>(
        &self,
        key: ApiKey,
        version: i16,
        id: i32,
        body: &R,
        next: keel_auth::sasl::Next,
        client: &ClientInfo,
    ) -> Reply {
        let reply = respond(key, version, id, body);
        let Reply::Frame(frame) = reply else {
            return reply;
        };
        self.sasl_outcome(frame, next, client)
    }

    /// Counts a SASL step's outcome and turns it into a reply carrying
    /// `frame` (a response, or a bare token's answer after a v0 handshake).
    pub fn sasl_outcome(&self, frame: Bytes, next: keel_auth::sasl::Next, client: &ClientInfo) -> Reply {
        use keel_auth::sasl::Next;
        match next {
            Next::Continue => Reply::Frame(frame),
            Next::Authenticated => {
                if let Some(session) = client.sasl.as_ref().and_then(|a| a.lock().session().cloned()) {
                    self.metrics.authenticated(&client.listener, session.mechanism);
                    tracing::debug!(listener = %client.listener, user = %session.user, mechanism = session.mechanism, "SASL authentication succeeded");
                }
                Reply::Frame(frame)
            }
            Next::Fail(reason) => {
                self.metrics.authentication_failed(&client.listener);
                tracing::info!(listener = %client.listener, client = %client.host, %reason, "SASL authentication failed; closing the connection");
                let delay = Duration::from_millis(
                    self.config()
                        .num("connection.failed.authentication.delay.ms")
                        .max(0) as u64,
                );
                Reply::FrameThenClose { frame, delay, reason }
            }
            Next::Close(reason) => {
                // Counted as Kafka counts a broken handshake: a failed
                // authentication.
                self.metrics.authentication_failed(&client.listener);
                tracing::info!(listener = %client.listener, client = %client.host, %reason, "SASL protocol error; closing the connection");
                Reply::FrameThenClose {
                    frame,
                    delay: Duration::ZERO,
                    reason,
                }
            }
        }
    }

    /// Encodes a response after raising its throttle time to what the
    /// client's `request_percentage` asks for the time the request has
    /// taken so far (Kafka throttles every response but those of cluster
    /// actions that way).
    pub(crate) fn answer<R: Encodable + Throttle>(
        &self,
        client_id: &str,
        key: ApiKey,
        version: i16,
        id: i32,
        body: &mut R,
    ) -> Reply {
        let throttle = self.request_throttle(client_id);
        if throttle > 0 {
            body.raise_throttle_time_ms(throttle);
        }
        respond(key, version, id, body)
    }

    /// The client's `controller_mutation_rate` for one request.
    pub(crate) fn mutations(&self, client_id: &str, strict: bool) -> crate::quotas::Mutations<'_> {
        self.quotas.mutations(&quota_user(), client_id, strict)
    }

    /// Records the current request's handling time against the client's
    /// `request_percentage` and returns the throttle time.
    pub(crate) fn request_throttle(&self, client_id: &str) -> i32 {
        let Some(busy) = trace::busy() else {
            return 0;
        };
        let ms = self
            .quotas
            .record_request_time(&quota_user(), client_id, busy, now_ms());
        self.throttled(REQUEST_PERCENTAGE, ms)
    }

    /// Records `bytes` against the client's quota `key` and returns the
    /// throttle time, which also mutes the connection after the response
    /// (see `crate::quotas`).
    pub(crate) fn quota_throttle(
        &self,
        key: &'static str,
        client_id: &str,
        bytes: usize,
        take_back: bool,
    ) -> i32 {
        let ms = self
            .quotas
            .record(key, &quota_user(), client_id, bytes as f64, take_back, now_ms());
        self.throttled(key, ms)
    }

    /// A throttle time of `ms` from the quota `key`: on the request's trace
    /// (the connection mutes for it) and in the metrics.
    pub(crate) fn throttled(&self, key: &'static str, ms: i64) -> i32 {
        let ms = u32::try_from(ms).unwrap_or(if ms < 0 { 0 } else { u32::MAX });
        if ms > 0 {
            trace::throttle(ms);
            self.metrics.quota_throttled(key, u64::from(ms));
        }
        i32::try_from(ms).unwrap_or(i32::MAX)
    }

    /// Counts a new connection from `ip` against its address's
    /// `connection_creation_rate`: how long to hold it unread before
    /// closing it, or `None` to serve it.
    pub fn connection_throttle(&self, ip: std::net::IpAddr) -> Option<Duration> {
        let ms = u64::try_from(self.quotas.record_connection(ip, now_ms())).unwrap_or(0);
        if ms == 0 {
            return None;
        }
        self.metrics.quota_throttled(CONNECTION_CREATION_RATE, ms);
        Some(Duration::from_millis(ms))
    }
}

/// Fetch responses with at least this many record bytes are assembled and
/// encoded on a bulk thread (see `keel_tier::bulk`).
pub(crate) const BULK_RESPONSE_BYTES: usize = 256 << 10;

/// The current request's user for quotas: the one its connection
/// authenticated as, else Kafka's `ANONYMOUS`.
pub(crate) fn quota_user() -> Arc<str> {
    static ANONYMOUS: std::sync::LazyLock<Arc<str>> =
        std::sync::LazyLock::new(|| Arc::from(crate::quotas::ANONYMOUS));
    trace::user().unwrap_or_else(|| Arc::clone(&ANONYMOUS))
}

pub(crate) fn respond<R: Encodable>(key: ApiKey, version: i16, correlation_id: i32, body: &R) -> Reply {
    let encoding = Instant::now();
    let encoded = keel_protocol::response::encode(key, version, correlation_id, body);
    trace::add(Stage::Encode, encoding.elapsed());
    match encoded {
        Ok(bytes) => Reply::Frame(bytes),
        Err(e) => {
            tracing::error!(error = %e, "cannot encode response");
            Reply::Close(e.to_string())
        }
    }
}
