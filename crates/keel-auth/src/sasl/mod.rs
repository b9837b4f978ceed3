//! SASL authentication on SASL_PLAINTEXT and SASL_SSL listeners, as Kafka
//! does it (KIP-43, KIP-152, KIP-368), with PLAIN and SCRAM-SHA-256/512.
//!
//! A connection on a SASL listener starts unauthenticated. Its client may
//! ask ApiVersions, then sends SaslHandshake naming a mechanism from
//! `sasl.enabled.mechanisms`, then the mechanism's tokens: in
//! SaslAuthenticate requests after a v1 handshake, or as bare
//! length-prefixed frames after a v0 one. Anything else before the
//! exchange succeeds closes the connection. A failed exchange is answered
//! with SASL_AUTHENTICATION_FAILED after `connection.failed.authentication.delay.ms`,
//! and the connection closes.
//!
//! With `connections.max.reauth.ms` set, a session lasts that long
//! (SaslAuthenticate v1+ tells the client): the client re-authenticates on
//! the same connection with a new handshake and exchange, as the same user
//! and mechanism. As in Kafka, an exchange in progress admits only its own
//! frames, and a re-authentication does not extend the session it renews
//! until it succeeds: after the session's end, any request but the
//! re-authentication's handshake and tokens closes the connection, and so
//! does a re-authentication that fails.
//!
//! [`Authenticator`] is one connection's state machine: it takes the
//! handshake and the tokens, and answers what to send and whether the
//! connection goes on. The mechanisms are the `rsasl` crate's; the users
//! are PLAIN's from the listener's JAAS config ([`jaas`]) and SCRAM's from
//! the credentials AlterUserScramCredentials keeps ([`credentials`]).

pub mod client;
pub mod credentials;
pub mod jaas;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rsasl::callback::{Context, Request, SessionCallback, SessionData};
use rsasl::mechanisms::scram::properties::ScramStoredPassword;
use rsasl::mechname::Mechname;
use rsasl::prelude::{SASLConfig, SASLServer, Session, SessionError, State as StepState, Validation};
use rsasl::property::{AuthId, AuthzId, Password};
use rsasl::validate::{Validate, ValidationError};

use keel_protocol::messages::ApiKey;
use parking_lot::Mutex;

use crate::{SettingError, Settings};
use credentials::{ScramCredentials, ScramMechanism};
use keel_protocol::ResponseError;

pub const PLAIN: &str = "PLAIN";

/// The mechanisms Keel offers.
pub const MECHANISMS: [&str; 3] = [PLAIN, "SCRAM-SHA-256", "SCRAM-SHA-512"];

/// A SASL listener's settings, checked.
#[derive(Debug, Clone)]
pub struct SaslSettings {
    /// `sasl.enabled.mechanisms`, in the order given.
    pub mechanisms: Vec<&'static str>,
    /// PLAIN's users and passwords (`user_<name>="<password>"`).
    plain_users: BTreeMap<String, String>,
    /// `connections.max.reauth.ms`, if above 0.
    pub reauth: Option<Duration>,
    /// `sasl.server.max.receive.size`: the largest SASL token read.
    pub max_receive_bytes: usize,
}

fn error(key: &str, reason: impl Into<String>) -> SettingError {
    SettingError::new(key, reason)
}

/// The SASL settings of `listener`; `config` is that listener's view (its
/// `listener.name.<l>.*` keys over the broker's).
pub fn settings(config: &impl Settings, listener: &str) -> Result<SaslSettings, SettingError> {
    let prefix = format!("listener.name.{}.", listener.to_ascii_lowercase());
    let get = |key: &str| config.value(key);
    let mut mechanisms = Vec::new();
    for name in get("sasl.enabled.mechanisms")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let Some(known) = MECHANISMS.iter().find(|m| **m == name) else {
            return Err(error(
                "sasl.enabled.mechanisms",
                format!(
                    "listener {listener}: Keel does not offer {name}; set sasl.enabled.mechanisms (or listener.name.{}.sasl.enabled.mechanisms) to any of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512",
                    listener.to_ascii_lowercase()
                ),
            ));
        };
        if !mechanisms.contains(known) {
            mechanisms.push(*known);
        }
    }
    if mechanisms.is_empty() {
        return Err(error(
            "sasl.enabled.mechanisms",
            format!("listener {listener} uses SASL but enables no mechanism"),
        ));
    }
    let mut plain_users = BTreeMap::new();
    if mechanisms.contains(&PLAIN) {
        let key = format!("{prefix}plain.sasl.jaas.config");
        let text = config.set_value(&key).unwrap_or_default();
        let text = text.trim();
        if text.is_empty() {
            return Err(error(
                &key,
                "PLAIN is enabled but has no users: set it to `org.apache.kafka.common.security.plain.PlainLoginModule required user_<name>=\"<password>\";`",
            ));
        }
        let entry = jaas::parse(text).map_err(|e| error(&key, e))?;
        if entry.module != jaas::PLAIN_LOGIN_MODULE {
            return Err(error(
                &key,
                format!("PLAIN's login module is {}", jaas::PLAIN_LOGIN_MODULE),
            ));
        }
        plain_users = entry.plain_users();
        if plain_users.is_empty() {
            return Err(error(
                &key,
                "PLAIN is enabled but no user_<name>=\"<password>\" option is set",
            ));
        }
    }
    let reauth_ms = get("connections.max.reauth.ms").parse::<i64>().unwrap_or(0);
    let max_receive = get("sasl.server.max.receive.size").parse::<i64>().unwrap_or(0);
    if max_receive < 1 {
        return Err(error("sasl.server.max.receive.size", "must be at least 1"));
    }
    Ok(SaslSettings {
        mechanisms,
        plain_users,
        reauth: (reauth_ms > 0).then(|| Duration::from_millis(reauth_ms as u64)),
        max_receive_bytes: max_receive as usize,
    })
}

/// What a finished exchange validated: the user, or why it was refused
/// (Kafka's message, which names no credential).
struct Validated;

impl Validation for Validated {
    type Value = Result<Arc<str>, &'static str>;
}

/// Finds users for the mechanisms: PLAIN's passwords, SCRAM's stored keys.
struct Users {
    plain: BTreeMap<String, String>,
    scram: Arc<ScramCredentials>,
}

impl SessionCallback for Users {
    fn callback(
        &self,
        session: &SessionData,
        context: &Context,
        request: &mut Request,
    ) -> Result<(), SessionError> {
        let Some(mechanism) = ScramMechanism::from_name(session.mechanism().mechanism.as_str()) else {
            return Ok(());
        };
        let Some(user) = context.get_ref::<AuthId>() else {
            return Ok(());
        };
        // An unknown user gets no credential: the mechanism answers with a
        // made-up salt and fails at the proof, so the exchange does not
        // tell which users exist.
        if let Some(c) = self.scram.get(user, mechanism) {
            let iterations = u32::try_from(c.iterations).unwrap_or(0);
            request.satisfy::<ScramStoredPassword>(&ScramStoredPassword::new(
                iterations,
                &c.salt,
                &c.stored_key,
                &c.server_key,
            ))?;
        }
        Ok(())
    }

    fn validate(
        &self,
        session: &SessionData,
        context: &Context,
        validate: &mut Validate<'_>,
    ) -> Result<(), ValidationError> {
        let user = context.get_ref::<AuthId>().unwrap_or("");
        let authzid = context.get_ref::<AuthzId>().filter(|a| !a.is_empty());
        let outcome = if authzid.is_some_and(|a| a != user) {
            Err("Authentication failed: Client requested an authorization id that is different from username")
        } else if session.mechanism().mechanism.as_str() == PLAIN {
            let given = context.get_ref::<Password>().unwrap_or(&[]);
            let matches = self.plain.get(user).is_some_and(|expected| {
                bool::from(subtle::ConstantTimeEq::ct_eq(expected.as_bytes(), given))
            });
            if matches {
                Ok(Arc::from(user))
            } else {
                Err("Authentication failed: Invalid username or password")
            }
        } else {
            // SCRAM validates only after the client's proof matched.
            Ok(Arc::from(user))
        };
        validate.with::<Validated, _>(|| Ok(outcome))?;
        Ok(())
    }
}

/// A SASL listener: its settings and the mechanisms' configuration.
pub struct SaslListener {
    pub settings: SaslSettings,
    config: Arc<SASLConfig>,
}

impl SaslListener {
    pub fn new(settings: SaslSettings, scram: Arc<ScramCredentials>) -> Result<SaslListener, String> {
        let users = Users {
            plain: settings.plain_users.clone(),
            scram,
        };
        let config = SASLConfig::builder()
            .with_defaults()
            .with_callback(users)
            .map_err(|e| format!("SASL: {e}"))?;
        Ok(SaslListener { settings, config })
    }
}

/// What the connection does after an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Goes on.
    Continue,
    /// The exchange succeeded (a first authentication or a
    /// re-authentication): goes on as the session's user.
    Authenticated,
    /// Authentication failed: the answer goes out after
    /// `connection.failed.authentication.delay.ms`, then the connection
    /// closes. The reason is for the log.
    Fail(String),
    /// The client broke the protocol: the answer goes out, then the
    /// connection closes.
    Close(String),
}

/// A SaslHandshake answer.
#[derive(Debug, Clone)]
pub struct HandshakeAnswer {
    pub error: Option<ResponseError>,
    pub mechanisms: Vec<&'static str>,
    pub next: Next,
}

/// A SaslAuthenticate answer (or a v0 token's).
#[derive(Debug, Clone)]
pub struct TokenAnswer {
    pub error: Option<(ResponseError, String)>,
    pub bytes: Vec<u8>,
    /// The session's lifetime, for SaslAuthenticate v1+: 0 is for ever.
    pub session_lifetime_ms: i64,
    pub next: Next,
}

impl TokenAnswer {
    fn refused(error: ResponseError, message: impl Into<String>, next: Next) -> TokenAnswer {
        TokenAnswer {
            error: Some((error, message.into())),
            bytes: Vec::new(),
            session_lifetime_ms: 0,
            next,
        }
    }
}

enum Exchange {
    /// Waiting for a handshake: a new connection's, or a re-authentication's.
    Handshake,
    /// A mechanism was chosen; its tokens follow.
    Tokens {
        session: Box<Session<Validated>>,
        mechanism: &'static str,
        /// After a v0 handshake the tokens are bare frames.
        raw: bool,
        /// Whether the next token is the exchange's first.
        first: bool,
    },
    /// Authenticated; a new handshake begins a re-authentication.
    Done,
    /// An answer closed the connection (a failed exchange, a broken
    /// protocol): nothing the old session allowed is served while the
    /// answer goes out.
    Failed,
}

/// The session a successful exchange opened.
#[derive(Debug, Clone)]
pub struct SaslSession {
    pub user: Arc<str>,
    pub mechanism: &'static str,
    /// When the client must have re-authenticated by.
    pub expires: Option<Instant>,
}

/// One connection's SASL state.
pub struct Authenticator {
    listener: Arc<SaslListener>,
    exchange: Exchange,
    session: Option<SaslSession>,
}

impl Authenticator {
    pub fn new(listener: Arc<SaslListener>) -> Authenticator {
        Authenticator {
            listener,
            exchange: Exchange::Handshake,
            session: None,
        }
    }

    /// The listener's settings.
    pub fn settings(&self) -> &SaslSettings {
        &self.listener.settings
    }

    /// The session, once the client authenticated.
    pub fn session(&self) -> Option<&SaslSession> {
        self.session.as_ref()
    }

    /// Whether the next frame is a bare token (after a v0 handshake).
    pub fn expects_raw_token(&self) -> bool {
        matches!(self.exchange, Exchange::Tokens { raw: true, .. })
    }

    /// Whether the session ran past its lifetime. Only a
    /// re-authentication that succeeds renews it; one in progress does
    /// not, or a client could keep an expired session (and a deleted
    /// credential's) alive by starting exchanges it never finishes.
    pub fn expired(&self, now: Instant) -> bool {
        self.session
            .as_ref()
            .and_then(|s| s.expires)
            .is_some_and(|e| now >= e)
    }

    /// Whether a frame of `api_key` may be handled at `now`, as Kafka
    /// decides it: before authentication only ApiVersions and the SASL
    /// APIs; during an exchange (the first or a re-authentication) only
    /// its tokens, bare ones after a v0 handshake (Kafka's channel hands
    /// every frame to its authenticator until the exchange ends); once the
    /// session has expired only the frames of a re-authentication; after
    /// an answer that closes the connection nothing.
    pub fn gate(&self, api_key: i16, now: Instant) -> Gate {
        let is = |key: ApiKey| api_key == key as i16;
        let name = || ApiKey::try_from(api_key).map_or_else(|_| format!("{api_key}"), |k| format!("{k:?}"));
        match &self.exchange {
            Exchange::Failed => Gate::Close("a request after a failed SASL exchange".into()),
            Exchange::Tokens { raw: true, .. } => Gate::RawToken,
            // A handshake here is answered ILLEGAL_SASL_STATE, as in Kafka.
            Exchange::Tokens { .. } if is(ApiKey::SaslAuthenticate) || is(ApiKey::SaslHandshake) => {
                Gate::Pass
            }
            // A handshake still begins a re-authentication after the
            // session's end, as in Kafka: a client may have waited for its
            // requests in flight before starting one.
            _ if self.expired(now) && !is(ApiKey::SaslHandshake) => Gate::Expired,
            Exchange::Tokens { .. } => Gate::Close(format!(
                "Unexpected Kafka request of type {} during SASL authentication",
                name()
            )),
            _ if self.session.is_none() && !BEFORE_AUTHENTICATION.contains(&api_key) => Gate::Close(format!(
                "Unexpected Kafka request of type {} during SASL handshake",
                name()
            )),
            Exchange::Handshake | Exchange::Done => Gate::Pass,
        }
    }

    /// SaslHandshake (`version` 0 or 1) for `mechanism`.
    pub fn handshake(&mut self, mechanism: &str, version: i16) -> HandshakeAnswer {
        let answer = self.start_exchange(mechanism, version);
        self.fail_on_close(&answer.next);
        answer
    }

    /// An answer that closes the connection ends the exchange for good.
    fn fail_on_close(&mut self, next: &Next) {
        if matches!(next, Next::Fail(_) | Next::Close(_)) {
            self.exchange = Exchange::Failed;
        }
    }

    fn start_exchange(&mut self, mechanism: &str, version: i16) -> HandshakeAnswer {
        let enabled = self.listener.settings.mechanisms.clone();
        let answer = |error, next| HandshakeAnswer {
            error,
            mechanisms: enabled.clone(),
            next,
        };
        if !matches!(self.exchange, Exchange::Handshake | Exchange::Done) {
            return answer(
                Some(ResponseError::IllegalSaslState),
                Next::Close("SaslHandshake in the middle of a SASL exchange".into()),
            );
        }
        let Some(chosen) = enabled.iter().copied().find(|m| *m == mechanism) else {
            return answer(
                Some(ResponseError::UnsupportedSaslMechanism),
                Next::Close(format!("unsupported SASL mechanism {mechanism}")),
            );
        };
        if let Some(session) = &self.session {
            if version < 1 {
                return answer(
                    Some(ResponseError::IllegalSaslState),
                    Next::Close("re-authentication needs SaslHandshake v1".into()),
                );
            }
            if session.mechanism != chosen {
                return answer(
                    Some(ResponseError::IllegalSaslState),
                    Next::Close(format!(
                        "re-authentication must use the session's mechanism {}, not {chosen}",
                        session.mechanism
                    )),
                );
            }
        }
        let name = Mechname::parse(chosen.as_bytes()).expect("the mechanism names are valid");
        let started = SASLServer::<Validated>::new(Arc::clone(&self.listener.config)).start_suggested(name);
        match started {
            Ok(session) => {
                self.exchange = Exchange::Tokens {
                    session: Box::new(session),
                    mechanism: chosen,
                    raw: version == 0,
                    first: true,
                };
                answer(None, Next::Continue)
            }
            Err(e) => answer(
                Some(ResponseError::UnsupportedSaslMechanism),
                Next::Close(format!("cannot start {chosen}: {e}")),
            ),
        }
    }

    /// One client token (a SaslAuthenticate request's, or a bare frame's
    /// after a v0 handshake: `raw`), at `now`.
    pub fn token(&mut self, token: &[u8], raw: bool, now: Instant) -> TokenAnswer {
        let answer = self.take_token(token, raw, now);
        self.fail_on_close(&answer.next);
        answer
    }

    fn take_token(&mut self, token: &[u8], raw: bool, now: Instant) -> TokenAnswer {
        let Exchange::Tokens {
            session,
            mechanism,
            raw: expects_raw,
            first,
        } = &mut self.exchange
        else {
            // After authentication Kafka answers it and goes on; before a
            // handshake it is a broken exchange.
            if matches!(self.exchange, Exchange::Done) {
                return TokenAnswer::refused(
                    ResponseError::IllegalSaslState,
                    "SaslAuthenticate request received after successful authentication",
                    Next::Continue,
                );
            }
            return TokenAnswer::refused(
                ResponseError::IllegalSaslState,
                "SaslAuthenticate before a SaslHandshake",
                Next::Close("SaslAuthenticate before a SaslHandshake".into()),
            );
        };
        if *expects_raw != raw {
            return TokenAnswer::refused(
                ResponseError::IllegalSaslState,
                "tokens follow a v0 SaslHandshake as bare frames and a v1 one in SaslAuthenticate",
                Next::Close("SASL token in the wrong framing".into()),
            );
        }
        let mechanism = *mechanism;
        match step_exchange(session, mechanism, first, token) {
            Ok(Stepped::Running(bytes)) => TokenAnswer {
                error: None,
                bytes,
                session_lifetime_ms: 0,
                next: Next::Continue,
            },
            Ok(Stepped::Finished { user, bytes }) => self.open_session(user, mechanism, bytes, now),
            Err(answer) => answer,
        }
    }

    /// Opens the session of `user`, whom `mechanism`'s exchange validated
    /// at `now`, and answers the exchange's last token with `bytes`. A
    /// re-authentication as another user fails.
    fn open_session(
        &mut self,
        user: Arc<str>,
        mechanism: &'static str,
        bytes: Vec<u8>,
        now: Instant,
    ) -> TokenAnswer {
        if let Some(previous) = &self.session {
            if previous.user != user {
                return TokenAnswer::refused(
                    ResponseError::SaslAuthenticationFailed,
                    format!(
                        "Cannot change principals during re-authentication from User:{}: User:{user}",
                        previous.user
                    ),
                    Next::Fail("re-authentication as another user".into()),
                );
            }
        }
        let reauth = self.listener.settings.reauth;
        self.session = Some(SaslSession {
            user,
            mechanism,
            expires: reauth.map(|d| now + d),
        });
        self.exchange = Exchange::Done;
        TokenAnswer {
            error: None,
            bytes,
            session_lifetime_ms: reauth.map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            next: Next::Authenticated,
        }
    }
}

/// Where a mechanism's exchange stands after a client token.
enum Stepped {
    /// It wants another token; `bytes` answer this one.
    Running(Vec<u8>),
    /// The client proved to be `user`; `bytes` answer its last token.
    Finished { user: Arc<str>, bytes: Vec<u8> },
}

/// Hands a client token to the exchange's `session` of `mechanism`
/// (`first`: whether it is the exchange's first token; it is not after
/// this one). The error is the answer to a token that fails the exchange.
fn step_exchange(
    session: &mut Session<Validated>,
    mechanism: &'static str,
    first: &mut bool,
    token: &[u8],
) -> Result<Stepped, TokenAnswer> {
    // rsasl 2.3's SCRAM parser indexes attributes without checking
    // their length, so a SCRAM message is checked against RFC 5802's
    // shape first: a hostile token fails its exchange before the
    // parser sees it.
    if mechanism.starts_with("SCRAM-") {
        if let Err(why) = scram_shape(token, *first) {
            return Err(authentication_failed(
                mechanism,
                &format!("{mechanism}: malformed message: {why}"),
            ));
        }
    }
    *first = false;
    let mut out = Vec::new();
    // Should the parser still panic on a message of the right shape,
    // the exchange fails and the connection's task goes on.
    let step = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        session.step(Some(token), &mut out)
    }));
    let outcome = match step {
        Err(_) => {
            return Err(authentication_failed(
                mechanism,
                &format!("{mechanism}: the SASL library failed on the message"),
            ));
        }
        Ok(Err(e)) => {
            return Err(authentication_failed(mechanism, &format!("{mechanism}: {e}")));
        }
        Ok(Ok(StepState::Running)) => return Ok(Stepped::Running(out)),
        Ok(Ok(StepState::Finished(_))) => session.validation(),
    };
    match outcome {
        Some(Ok(user)) => Ok(Stepped::Finished { user, bytes: out }),
        Some(Err(message)) => Err(TokenAnswer::refused(
            ResponseError::SaslAuthenticationFailed,
            message,
            Next::Fail(format!("{mechanism}: {message}")),
        )),
        None => Err(authentication_failed(
            mechanism,
            &format!("{mechanism}: invalid credentials"),
        )),
    }
}

/// The answer to a token that failed `mechanism`'s exchange: Kafka's
/// message for the mechanism, which does not say why; `reason` is for
/// the log.
fn authentication_failed(mechanism: &str, reason: &str) -> TokenAnswer {
    let message = if mechanism == PLAIN {
        "Authentication failed: Invalid username or password".to_string()
    } else {
        format!(
            "Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"
        )
    };
    TokenAnswer::refused(
        ResponseError::SaslAuthenticationFailed,
        message,
        Next::Fail(reason.to_string()),
    )
}

/// What a connection does with a frame before handling it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// Handle it as a request.
    Pass,
    /// It is a bare SASL token (after a v0 handshake).
    RawToken,
    /// Close the connection, for this reason: the client broke the SASL
    /// protocol.
    Close(String),
    /// Close the connection: its session ended (`connections.max.reauth.ms`)
    /// and the frame does not re-authenticate.
    Expired,
}

/// The APIs a client may send before it has authenticated.
const BEFORE_AUTHENTICATION: [i16; 3] = [
    ApiKey::ApiVersions as i16,
    ApiKey::SaslHandshake as i16,
    ApiKey::SaslAuthenticate as i16,
];

/// A connection's authenticator, shared by the connection and its
/// requests' handlers.
#[derive(Clone)]
pub struct ConnectionAuth(Arc<Mutex<Authenticator>>);

impl std::fmt::Debug for ConnectionAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let user = self.user();
        f.debug_struct("ConnectionAuth").field("user", &user).finish()
    }
}

impl ConnectionAuth {
    pub fn new(listener: Arc<SaslListener>) -> ConnectionAuth {
        ConnectionAuth(Arc::new(Mutex::new(Authenticator::new(listener))))
    }

    pub fn lock(&self) -> parking_lot::MutexGuard<'_, Authenticator> {
        self.0.lock()
    }

    /// The user the session authenticated, if it has.
    pub fn user(&self) -> Option<Arc<str>> {
        self.0.lock().session().map(|s| Arc::clone(&s.user))
    }

    /// Whether a frame of `api_key` may be handled at `now`
    /// ([`Authenticator::gate`]).
    pub fn gate(&self, api_key: i16, now: Instant) -> Gate {
        self.0.lock().gate(api_key, now)
    }

    /// The largest frame read now: `sasl.server.max.receive.size` until
    /// the client has authenticated and while it re-authenticates.
    pub fn max_frame_bytes(&self, max_request_bytes: usize) -> usize {
        let auth = self.0.lock();
        if !matches!(auth.exchange, Exchange::Done) {
            max_request_bytes.min(auth.settings().max_receive_bytes)
        } else {
            max_request_bytes
        }
    }
}

/// Checks a SCRAM client message against RFC 5802's shape: attributes
/// separated by commas, each a name, `=` and a value. The first message
/// starts with the GS2 header: a channel-binding flag (`n`, `y` or
/// `p=NAME`) and an authorization id (empty or `a=NAME`). Values are left
/// to the mechanism; this only guarantees every attribute its name and `=`.
fn scram_shape(message: &[u8], first: bool) -> Result<(), &'static str> {
    let mut parts = message.split(|b| *b == b',');
    // RFC 5802's attributes have one-letter names; Kafka's extensions
    // (`tokenauth=true`) have longer ones.
    let attribute = |part: &[u8]| {
        part.iter()
            .position(|b| *b == b'=')
            .is_some_and(|eq| eq > 0 && part[..eq].iter().all(u8::is_ascii_alphanumeric))
    };
    if first {
        match parts.next() {
            Some(b"n" | b"y") => {}
            Some(flag) if flag.starts_with(b"p=") && flag.len() > 2 => {}
            _ => return Err("no channel-binding flag"),
        }
        match parts.next() {
            Some(b"") => {}
            Some(id) if id.starts_with(b"a=") => {}
            _ => return Err("no authorization id field"),
        }
    }
    let mut any = false;
    for part in parts {
        if !attribute(part) {
            return Err("an attribute is not NAME=VALUE");
        }
        any = true;
    }
    if any {
        Ok(())
    } else {
        Err("no attributes")
    }
}

#[cfg(test)]
mod tests;
