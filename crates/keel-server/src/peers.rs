//! The sockets of requests to other brokers (`keel_broker::peers`):
//! connections to each broker's inter-broker listener, kept open and used
//! one exchange at a time, so that one slow answer holds up no other
//! request. Up to [`CONNECTIONS_PER_BROKER`] transaction markers and as
//! many other requests (a produce's question to a transaction's
//! coordinator) go to one broker at once, the rest waiting their turn:
//! markers, each waiting for its commit at the other broker, never hold
//! up the questions a produce waits on.
//!
//! A connection speaks the listener's security protocol as a Kafka broker
//! does: TLS from the listener's keys ([`crate::tls::client`]) on SSL and
//! SASL_SSL, then on SASL_PLAINTEXT and SASL_SSL a SaslHandshake v1 with
//! `sasl.mechanism.inter.broker.protocol` and the mechanism's
//! SaslAuthenticate exchange as the user of the listener's JAAS config
//! (`keel_auth::sasl::client`). A session the other broker limits
//! (`connections.max.reauth.ms`) is not reused past most of its lifetime:
//! the next request opens a new connection.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use keel_auth::sasl::client::{self as sasl, Login, Step};
use keel_broker::peers::{Answer, PeerTransport};
use keel_config::listeners::{self, Listener, ListenerSettings};
use keel_config::BrokerConfig;
use keel_protocol::client::{decode_response, encode_request, ApiRequest};
use keel_protocol::frame::FRAME_PREFIX_BYTES;
use keel_protocol::messages::{SaslAuthenticateRequest, SaslHandshakeRequest};
use keel_protocol::{ResponseError, StrBytes};
use parking_lot::Mutex;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use crate::tls::client::Connector;

/// Exchanges at once per broker and kind (markers, others): more wait.
const CONNECTIONS_PER_BROKER: usize = 16;

/// WriteTxnMarkers' API key, read from a request frame's header.
const WRITE_TXN_MARKERS: i16 = 27;

/// The largest answer read: the requests sent are small, and so are their
/// answers.
const MAX_ANSWER_BYTES: usize = 16 << 20;

/// The share of a SASL session's lifetime a connection is used for (Kafka's
/// clients re-authenticate at 85-95 % of it).
const SESSION_USE: f64 = 0.85;

/// A connection's byte stream: TCP, or TLS over it.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

pub struct TcpPeers {
    listener: String,
    /// How connections are secured, or why requests cannot be sent.
    security: Result<Security, String>,
    client_id: String,
    idle: Mutex<HashMap<i32, Vec<Idle>>>,
    /// Per broker and kind (markers or not), a permit per exchange.
    slots: Mutex<HashMap<(i32, bool), Arc<Semaphore>>>,
}

struct Security {
    tls: Option<Connector>,
    sasl: Option<Login>,
}

struct Idle {
    address: (String, i32),
    conn: Conn,
}

struct Conn {
    stream: Box<dyn Io>,
    /// When the SASL session stops being used, if it is limited.
    retire: Option<Instant>,
}

impl TcpPeers {
    /// Requests on `listener`, the inter-broker listener, secured with its
    /// settings in `config`. An error says what is missing (a cluster's
    /// broker does not start without it).
    pub fn new(config: &BrokerConfig, listener: Option<&Listener>) -> Result<TcpPeers, String> {
        let Some(l) = listener else {
            return Err(
                "a cluster's brokers send each other requests and none of the listeners is the \
                 inter-broker one: name it with inter.broker.listener.name (or have a PLAINTEXT listener)"
                    .to_string(),
            );
        };
        let tls = if l.protocol.tls() {
            let settings = listeners::ssl_settings(config, &l.name).map_err(|e| e.to_string())?;
            Some(Connector::new(&l.name, settings)?)
        } else {
            None
        };
        let sasl = if l.protocol.sasl() {
            let mechanism = config.get("sasl.mechanism.inter.broker.protocol");
            let view = ListenerSettings::new(config, &l.name);
            Some(sasl::login(&view, &l.name, mechanism).map_err(|e| e.to_string())?)
        } else {
            None
        };
        Ok(TcpPeers::with(config, &l.name, Ok(Security { tls, sasl })))
    }

    /// A transport whose every request fails with `why` (one broker, which
    /// sends no requests to others).
    pub fn refusing(config: &BrokerConfig, listener: Option<&Listener>, why: String) -> TcpPeers {
        TcpPeers::with(config, listener.map_or("", |l| l.name.as_str()), Err(why))
    }

    fn with(config: &BrokerConfig, listener: &str, security: Result<Security, String>) -> TcpPeers {
        TcpPeers {
            listener: listener.to_string(),
            security,
            client_id: format!("keel-broker-{}", config.node_id()),
            idle: Mutex::new(HashMap::new()),
            slots: Mutex::new(HashMap::new()),
        }
    }

    async fn exchange(&self, node_id: i32, host: &str, port: i32, frame: Bytes) -> Result<Bytes, String> {
        let security = self.security.as_ref().map_err(Clone::clone)?;
        // The API key follows the size prefix.
        let marker =
            frame.get(FRAME_PREFIX_BYTES..FRAME_PREFIX_BYTES + 2) == Some(&WRITE_TXN_MARKERS.to_be_bytes());
        let slots = Arc::clone(
            self.slots
                .lock()
                .entry((node_id, marker))
                .or_insert_with(|| Arc::new(Semaphore::new(CONNECTIONS_PER_BROKER))),
        );
        let _slot = slots.acquire_owned().await.map_err(|e| e.to_string())?;
        let address = (host.to_string(), port);
        let reused = {
            let mut idle = self.idle.lock();
            let conns = idle.entry(node_id).or_default();
            // A broker restarted at another address: its old connections
            // go; so do sessions near their end.
            let now = Instant::now();
            conns.retain(|c| c.address == address && c.conn.retire.is_none_or(|at| now < at));
            conns.pop()
        };
        let (conn, answer) = match reused {
            Some(c) => match round_trip(c.conn, &frame, host, port).await {
                // An idle connection the broker closed meanwhile
                // (`connections.max.idle.ms`) fails before any answer:
                // the request goes again on a new one. (Both requests
                // sent are safe to repeat.)
                Err(Failure::BeforeAnswer(_)) => {
                    round_trip(self.open(security, host, port).await?, &frame, host, port).await
                }
                other => other,
            },
            None => round_trip(self.open(security, host, port).await?, &frame, host, port).await,
        }
        .map_err(Failure::into_message)?;
        let mut idle = self.idle.lock();
        let conns = idle.entry(node_id).or_default();
        if conns.len() < 2 * CONNECTIONS_PER_BROKER {
            conns.push(Idle { address, conn });
        }
        Ok(answer)
    }

    /// A new connection, secured and authenticated.
    async fn open(&self, security: &Security, host: &str, port: i32) -> Result<Conn, String> {
        let port = u16::try_from(port).map_err(|_| format!("port {port} is out of range"))?;
        let tcp = TcpStream::connect((host, port))
            .await
            .map_err(|e| format!("cannot connect to {host}:{port}: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let stream: Box<dyn Io> = match &security.tls {
            None => Box::new(tcp),
            Some(connector) => {
                let name = ServerName::try_from(host.to_string())
                    .map_err(|e| format!("{host}: not a name TLS can check: {e}"))?;
                let tls = connector
                    .connector()
                    .connect(name, tcp)
                    .await
                    .map_err(|e| format!("TLS with {host}:{port} on listener {}: {e}", self.listener))?;
                Box::new(tls)
            }
        };
        let mut conn = Conn { stream, retire: None };
        if let Some(login) = &security.sasl {
            let lifetime = self
                .authenticate(&mut conn, login)
                .await
                .map_err(|e| format!("SASL with {host}:{port} on listener {}: {e}", self.listener))?;
            conn.retire = lifetime.map(|l| Instant::now() + l.mul_f64(SESSION_USE));
        }
        Ok(conn)
    }

    /// Kafka's SASL exchange on `conn` as `login`: its session's lifetime,
    /// if the other broker limits it.
    async fn authenticate(&self, conn: &mut Conn, login: &Login) -> Result<Option<Duration>, String> {
        let handshake =
            SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(login.mechanism));
        let answer = self.call(conn, 1, &handshake).await?;
        if answer.error_code != 0 {
            let offered: Vec<&str> = answer.mechanisms.iter().map(|m| m.as_str()).collect();
            return Err(format!(
                "the mechanism {} is refused ({}); the listener offers {}",
                login.mechanism,
                error_name(answer.error_code),
                offered.join(", ")
            ));
        }
        let (mut exchange, mut token) = login.start()?;
        loop {
            let request = SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(token));
            let answer = self.call(conn, 2, &request).await?;
            if answer.error_code != 0 {
                return Err(format!(
                    "{} as {} failed ({}): {}",
                    login.mechanism,
                    login.user,
                    error_name(answer.error_code),
                    answer.error_message.as_deref().unwrap_or("")
                ));
            }
            match exchange.step(&answer.auth_bytes)? {
                Step::Send(next) => token = next,
                Step::Done => {
                    let ms = u64::try_from(answer.session_lifetime_ms).unwrap_or(0);
                    return Ok((ms > 0).then(|| Duration::from_millis(ms)));
                }
            }
        }
    }

    /// One request of the connection's own (the SASL exchange) and its
    /// answer.
    async fn call<R: ApiRequest>(
        &self,
        conn: &mut Conn,
        version: i16,
        req: &R,
    ) -> Result<R::Response, String> {
        let frame = encode_request(0, &self.client_id, version, req).map_err(|e| e.to_string())?;
        conn.stream
            .write_all(&frame)
            .await
            .map_err(|e| format!("cannot send: {e}"))?;
        let body = read_frame(&mut conn.stream)
            .await
            .map_err(Failure::into_message)?;
        let (_, answer) =
            decode_response::<R>(body, version).map_err(|e| format!("a malformed answer: {e}"))?;
        Ok(answer)
    }
}

fn error_name(code: i16) -> String {
    ResponseError::try_from_code(code).map_or_else(|| format!("error {code}"), |e| format!("{e:?}"))
}

/// Why an exchange failed: before any byte of the answer came, or after.
enum Failure {
    BeforeAnswer(String),
    AfterAnswer(String),
}

impl Failure {
    fn into_message(self) -> String {
        match self {
            Failure::BeforeAnswer(m) | Failure::AfterAnswer(m) => m,
        }
    }
}

/// Sends one request frame and reads one answer frame.
async fn round_trip(mut conn: Conn, frame: &[u8], host: &str, port: i32) -> Result<(Conn, Bytes), Failure> {
    conn.stream
        .write_all(frame)
        .await
        .map_err(|e| Failure::BeforeAnswer(format!("cannot send to {host}:{port}: {e}")))?;
    let answer = read_frame(&mut conn.stream).await.map_err(|f| match f {
        Failure::BeforeAnswer(m) => Failure::BeforeAnswer(format!("no answer from {host}:{port}: {m}")),
        Failure::AfterAnswer(m) => Failure::AfterAnswer(format!("{host}:{port}: {m}")),
    })?;
    Ok((conn, answer))
}

/// One answer frame, without its size prefix.
async fn read_frame(stream: &mut Box<dyn Io>) -> Result<Bytes, Failure> {
    let mut prefix = [0u8; FRAME_PREFIX_BYTES];
    stream
        .read_exact(&mut prefix)
        .await
        .map_err(|e| Failure::BeforeAnswer(e.to_string()))?;
    let size = usize::try_from(i32::from_be_bytes(prefix))
        .ok()
        .filter(|n| *n <= MAX_ANSWER_BYTES)
        .ok_or_else(|| {
            Failure::AfterAnswer(format!(
                "answered a frame of {} bytes",
                i32::from_be_bytes(prefix)
            ))
        })?;
    let mut body = vec![0u8; size];
    stream
        .read_exact(&mut body)
        .await
        .map_err(|e| Failure::AfterAnswer(format!("a cut answer: {e}")))?;
    Ok(Bytes::from(body))
}

impl PeerTransport for TcpPeers {
    fn listener(&self) -> &str {
        &self.listener
    }

    fn round_trip(&self, node_id: i32, host: &str, port: i32, frame: Bytes) -> Answer<'_> {
        let host = host.to_string();
        Box::pin(async move { self.exchange(node_id, &host, port, frame).await })
    }
}
