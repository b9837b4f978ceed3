//! The sockets of requests to other brokers (`keel_broker::peers`): TCP
//! connections to each broker's inter-broker listener, up to
//! [`CONNECTIONS_PER_BROKER`] per broker, kept open and used one exchange
//! at a time, so that one slow answer holds up no other request (more
//! requests at once wait for a connection).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use keel_broker::peers::{Answer, PeerTransport};
use keel_config::listeners::{Listener, SecurityProtocol};
use keel_protocol::frame::FRAME_PREFIX_BYTES;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

/// Connections per broker: exchanges beyond that many at once wait.
const CONNECTIONS_PER_BROKER: usize = 16;

/// The largest answer read: the requests sent are small, and so are their
/// answers.
const MAX_ANSWER_BYTES: usize = 16 << 20;

pub struct TcpPeers {
    listener: String,
    /// Why requests cannot be sent on the listener, if they cannot.
    refused: Option<String>,
    idle: Mutex<HashMap<i32, Vec<Idle>>>,
    /// Per broker, a permit per connection in use.
    slots: Mutex<HashMap<i32, Arc<Semaphore>>>,
}

struct Idle {
    address: (String, i32),
    stream: TcpStream,
}

impl TcpPeers {
    /// Requests on `listener` (the inter-broker listener, `None` if there
    /// is none). Keel's brokers speak to each other in the clear: on a TLS
    /// or SASL listener every request fails with the reason.
    pub fn new(listener: Option<&Listener>) -> TcpPeers {
        let refused = match listener {
            None => Some(
                "no inter-broker listener: name a PLAINTEXT listener with inter.broker.listener.name"
                    .to_string(),
            ),
            Some(l) if l.protocol != SecurityProtocol::Plaintext => Some(format!(
                "the inter-broker listener {} is {}; Keel's brokers send each other requests over PLAINTEXT only",
                l.name,
                l.protocol.name()
            )),
            Some(_) => None,
        };
        TcpPeers {
            listener: listener.map_or_else(String::new, |l| l.name.clone()),
            refused,
            idle: Mutex::new(HashMap::new()),
            slots: Mutex::new(HashMap::new()),
        }
    }

    async fn exchange(&self, node_id: i32, host: &str, port: i32, frame: Bytes) -> Result<Bytes, String> {
        if let Some(why) = &self.refused {
            return Err(why.clone());
        }
        let slots = Arc::clone(
            self.slots
                .lock()
                .entry(node_id)
                .or_insert_with(|| Arc::new(Semaphore::new(CONNECTIONS_PER_BROKER))),
        );
        let _slot = slots.acquire_owned().await.map_err(|e| e.to_string())?;
        let address = (host.to_string(), port);
        let reused = {
            let mut idle = self.idle.lock();
            let conns = idle.entry(node_id).or_default();
            // A broker restarted at another address: its old connections go.
            conns.retain(|c| c.address == address);
            conns.pop()
        };
        let (stream, answer) = match reused {
            Some(c) => match round_trip(c.stream, &frame, host, port).await {
                // An idle connection the broker closed meanwhile
                // (`connections.max.idle.ms`) fails before any answer:
                // the request goes again on a new one. (Both requests
                // sent are safe to repeat.)
                Err(Failure::BeforeAnswer(_)) => {
                    round_trip(connect(host, port).await?, &frame, host, port).await
                }
                other => other,
            },
            None => round_trip(connect(host, port).await?, &frame, host, port).await,
        }
        .map_err(Failure::into_message)?;
        let mut idle = self.idle.lock();
        let conns = idle.entry(node_id).or_default();
        if conns.len() < CONNECTIONS_PER_BROKER {
            conns.push(Idle { address, stream });
        }
        Ok(answer)
    }
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

async fn connect(host: &str, port: i32) -> Result<TcpStream, String> {
    let port = u16::try_from(port).map_err(|_| format!("port {port} is out of range"))?;
    let stream = TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("cannot connect to {host}:{port}: {e}"))?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Sends one request frame and reads one answer frame.
async fn round_trip(
    mut stream: TcpStream,
    frame: &[u8],
    host: &str,
    port: i32,
) -> Result<(TcpStream, Bytes), Failure> {
    stream
        .write_all(frame)
        .await
        .map_err(|e| Failure::BeforeAnswer(format!("cannot send to {host}:{port}: {e}")))?;
    let mut prefix = [0u8; FRAME_PREFIX_BYTES];
    stream
        .read_exact(&mut prefix)
        .await
        .map_err(|e| Failure::BeforeAnswer(format!("no answer from {host}:{port}: {e}")))?;
    let size = usize::try_from(i32::from_be_bytes(prefix))
        .ok()
        .filter(|n| *n <= MAX_ANSWER_BYTES)
        .ok_or_else(|| {
            Failure::AfterAnswer(format!(
                "{host}:{port} answered a frame of {} bytes",
                i32::from_be_bytes(prefix)
            ))
        })?;
    let mut body = vec![0u8; size];
    stream
        .read_exact(&mut body)
        .await
        .map_err(|e| Failure::AfterAnswer(format!("a cut answer from {host}:{port}: {e}")))?;
    Ok((stream, Bytes::from(body)))
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
