//! One client connection: request frames read from the socket, handed to
//! the broker, and their responses written back in request order, as
//! Kafka does.
//!
//! Kafka handles one request per connection at a time. Keel does too, with
//! one exception: a Produce request whose appends are all in their
//! partitions' queues (waiting only for the writers) lets the next Produce
//! on the connection start. The requests a producer pipelines
//! (`max.in.flight.requests.per.connection`) then reach a partition's
//! writer together and are written in one write, instead of each waiting
//! for the one before it to be answered. Appends still enter every
//! partition's queue in request order, any other request waits for all
//! before it, and responses go out in request order.
//!
//! A response a client quota throttled (its trace says for how long) is
//! sent at once, and then the connection reads and starts nothing more for
//! the throttle time: Kafka's channel muting (KIP-219).
//!
//! On an SSL listener the connection is a TLS stream ([`Transport::Tls`]):
//! responses are encrypted and written by the connection's task, and large
//! ones do not go through the bulk threads.

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use keel_auth::sasl::{ConnectionAuth, Gate};
use keel_broker::trace::{self, RequestTrace, Stage};
use keel_broker::{Broker, ClientInfo, Reply};
use keel_protocol::frame::{request_size, token_size, FrameError, FRAME_PREFIX_BYTES};
use keel_protocol::messages::ApiKey;
use keel_protocol::RequestFrame;
use keel_tier::Bulk;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, WriteHalf};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use crate::receive_time::StampedRead;

/// A connection as its listener serves it.
pub enum Transport {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// The half of a connection responses are written to.
enum Writer {
    Plain(OwnedWriteHalf),
    Tls(WriteHalf<TlsStream<TcpStream>>),
}

/// The half of a connection requests are read from.
enum Reader {
    /// Plaintext: read with the kernel's receive timestamps, so each read
    /// says how long its bytes waited in the socket.
    Stamped(StampedRead),
    /// TLS (decrypted by rustls), or bytes in a test: no timestamps.
    Other(Box<dyn AsyncRead + Unpin + Send>),
}

impl Reader {
    /// Appends what the socket has to `buf`, at least one byte (none at
    /// the end of the stream), when the frame being read lacks `missing`
    /// bytes; and how long the newest of them waited in the socket since
    /// `wanted_since` at the earliest, where known.
    async fn read_some(
        &mut self,
        buf: &mut BytesMut,
        missing: usize,
        wanted_since: Instant,
    ) -> std::io::Result<(usize, Option<Duration>)> {
        match self {
            Reader::Stamped(read) => read.read(buf, missing.max(READ_BYTES), wanted_since).await,
            Reader::Other(read) => {
                // Room for one read, not for the whole frame announced: a
                // frame's memory grows with the bytes that arrive, so a
                // client cannot make the broker hold memory it never sends.
                buf.reserve(missing.clamp(READ_BYTES, crate::receive_time::MAX_READ_BYTES));
                Ok((read.read_buf(buf).await?, None))
            }
        }
    }
}

impl Transport {
    fn split(self) -> (Reader, Writer) {
        match self {
            Transport::Plain(stream) => {
                let (read, write) = stream.into_split();
                (Reader::Stamped(StampedRead::new(read)), Writer::Plain(write))
            }
            Transport::Tls(stream) => {
                let (read, write) = tokio::io::split(*stream);
                (Reader::Other(Box::new(read)), Writer::Tls(write))
            }
        }
    }
}

/// Requests in flight on one connection at most: the first, and Produce
/// requests pipelined behind it.
pub const PIPELINE_DEPTH: usize = 8;

/// Produce requests are pipelined while the frames in flight hold at most
/// this many bytes: pipelining is for small requests that would otherwise
/// wait on each other's round trip; a large one is its own batch.
pub const PIPELINE_BYTES: usize = 1 << 20;

/// Bytes asked of the socket per read, unless a frame needs more.
const READ_BYTES: usize = 64 << 10;

/// Responses at least this large (a backfill's fetches) are written by
/// the bulk threads, in pieces of this size: the kernel's copy of them runs
/// at the bulk threads' priority (SCHED_IDLE), so a request thread or a
/// partition writer that wakes up does not wait for a request thread to
/// finish its time slice of sending.
const BULK_SEND_BYTES: usize = 256 << 10;

/// How long one bulk job keeps writing a large response, waits for the
/// socket included, before it hands the write half back to the connection
/// (which waits for the socket without a thread and hands it out again): a
/// slow reader holds a bulk thread, which cold reads also need, for at most
/// this long at a time.
const BULK_SEND_HOLD: Duration = Duration::from_millis(20);

/// What a connection may hold: `socket.request.max.bytes` per frame and
/// `connections.max.idle.ms` without a request.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_request_bytes: usize,
    pub idle: Option<Duration>,
}

/// Serves one connection until the client closes it, sends something that
/// cannot be answered, or stays idle past `connections.max.idle.ms`.
pub async fn serve(
    stream: Transport,
    peer: SocketAddr,
    broker: &Arc<Broker>,
    client: &ClientInfo,
    limits: Limits,
) -> Result<(), String> {
    let tls = matches!(stream, Transport::Tls(_));
    let (read, write) = stream.split();
    let mut connection = Connection {
        broker,
        client,
        peer,
        limits,
        tls,
        wanting: Wanting::default(),
        muted_until: None,
        flight: VecDeque::new(),
        inbox: Inbox::default(),
        write: Some(write),
        read,
    };
    loop {
        connection.send_ready_replies().await?;
        if connection.muted_until.is_some_and(|m| m <= Instant::now()) {
            connection.muted_until = None;
        }
        connection.start_frames().await?;
        if connection.flight.front().is_some_and(|f| f.done.is_some()) {
            continue;
        }
        if connection.flight.is_empty() && connection.inbox.eof {
            return connection.inbox.closed();
        }
        connection.wait().await?;
    }
}

/// What [`serve`] holds for one connection. Its methods are the steps of
/// serve's loop; an error they return ends the connection for that reason.
struct Connection<'a> {
    broker: &'a Arc<Broker>,
    client: &'a ClientInfo,
    peer: SocketAddr,
    limits: Limits,
    /// Whether the connection is a TLS stream (an SSL listener's).
    tls: bool,
    // The fields below drop in this order: the requests in flight before
    // the socket's halves.
    wanting: Wanting,
    /// Until when a quota's throttle time mutes the connection.
    muted_until: Option<Instant>,
    /// The requests started and not yet answered, in request order.
    flight: VecDeque<InFlight<'a>>,
    inbox: Inbox,
    /// Lent to a bulk thread while it writes a large response ([`send`]).
    write: Option<Writer>,
    read: Reader,
}

impl<'a> Connection<'a> {
    /// Sends the responses that are ready, in request order, and mutes the
    /// connection for the throttle time they carry.
    async fn send_ready_replies(&mut self) -> Result<(), String> {
        while let Some(reply) = self.flight.front_mut().and_then(|f| f.done.take()) {
            let done = self.flight.pop_front().expect("the front was just looked at");
            match reply {
                Reply::Frame(bytes) => {
                    let sending = Instant::now();
                    send(&mut self.write, bytes, self.broker.data.cold.bulk())
                        .await
                        .map_err(|e| e.to_string())?;
                    done.trace.add(Stage::Send, sending.elapsed());
                    self.wanting.pause();
                }
                Reply::Nothing => {}
                Reply::Close(reason) => {
                    tracing::warn!(%reason, "closing connection");
                    return Err(reason);
                }
                Reply::Refused(reason) => return Err(reason),
                Reply::FrameThenClose { frame, delay, reason } => {
                    return Err(answer_and_close(&mut self.write, frame, delay, reason, self.broker).await);
                }
            }
            let throttle = done.trace.throttle_ms();
            if throttle > 0 {
                let until = Instant::now() + Duration::from_millis(u64::from(throttle));
                self.muted_until = Some(self.muted_until.map_or(until, |m| m.max(until)));
            }
            let data = &self.broker.data;
            self.broker
                .metrics
                .finish(&done.trace, &data.store, data.io.live());
        }
        Ok(())
    }

    /// Starts the frames that have arrived whole, in order, while the
    /// requests in flight let them ([`admits`]) and no quota mutes the
    /// connection.
    async fn start_frames(&mut self) -> Result<(), String> {
        while let Some(len) = self.next_frame()? {
            if !admits(&self.flight, self.inbox.api_key(), len) {
                break;
            }
            let arrived = self.inbox.take(len);
            if !self.pass_sasl_gate(&arrived.body).await? {
                continue;
            }
            let (frame, trace) = self.parse_and_trace(arrived)?;
            self.start(frame, trace, len).await;
        }
        Ok(())
    }

    /// The size of the first frame in the inbox once all of it has
    /// arrived, unless a quota mutes the connection. A size that cannot
    /// be answered is an error.
    fn next_frame(&self) -> Result<Option<usize>, String> {
        match self.muted_until {
            Some(_) => Ok(None),
            None => self
                .inbox
                .complete_frame(frame_limit(self.client, self.limits))
                .map_err(|e| refuse(e, &self.inbox.buf, self.tls)),
        }
    }

    /// Whether a frame is a request to handle (always, off a SASL
    /// listener), or was a bare SASL token and has been answered here.
    async fn pass_sasl_gate(&mut self, body: &[u8]) -> Result<bool, String> {
        let client = self.client;
        let Some(auth) = &client.sasl else {
            return Ok(true);
        };
        match auth.gate(inbox_api_key(body), Instant::now()) {
            Gate::Pass => Ok(true),
            Gate::RawToken => {
                // Nothing is in flight: a bare token follows a handshake
                // that was answered.
                self.answer_raw_token(auth, body).await?;
                Ok(false)
            }
            Gate::Expired => {
                self.broker.metrics.session_expired(&client.listener);
                let reason = "the SASL session expired without re-authentication (connections.max.reauth.ms)";
                tracing::info!(listener = %client.listener, peer = %self.peer, %reason, "closing a SASL connection");
                Err(reason.into())
            }
            Gate::Close(reason) => {
                self.broker.metrics.authentication_failed(&client.listener);
                tracing::info!(listener = %client.listener, peer = %self.peer, %reason, "closing a SASL connection");
                Err(reason)
            }
        }
    }

    /// Answers a bare SASL token, which follows a v0 handshake.
    async fn answer_raw_token(&mut self, auth: &ConnectionAuth, token: &[u8]) -> Result<(), String> {
        let answer = auth.lock().token(token, true, Instant::now());
        let frame = if answer.error.is_some() {
            // A v0 exchange has no way to say why.
            Bytes::new()
        } else {
            raw_token_frame(&answer.bytes)
        };
        match self.broker.sasl_outcome(frame, answer.next, self.client) {
            Reply::Frame(bytes) => send(&mut self.write, bytes, self.broker.data.cold.bulk())
                .await
                .map_err(|e| e.to_string()),
            Reply::FrameThenClose { frame, delay, reason } => {
                Err(answer_and_close(&mut self.write, frame, delay, reason, self.broker).await)
            }
            Reply::Nothing => Ok(()),
            Reply::Close(reason) | Reply::Refused(reason) => Err(reason),
        }
    }

    /// Parses a frame and begins its trace, with the time its bytes spent
    /// in the socket and in arriving.
    fn parse_and_trace(&self, arrived: Arrived) -> Result<(RequestFrame, Arc<RequestTrace>), String> {
        let frame = RequestFrame::parse(arrived.body).map_err(|e| e.to_string())?;
        // When the kernel had the bytes that completed the frame: a
        // frame read whole was at the broker before Keel read it, and
        // its trace starts then; the upload ends then.
        let last_received = arrived
            .socket_wait
            .and_then(|w| arrived.complete.checked_sub(w))
            .unwrap_or(arrived.complete);
        let received = last_received.min(arrived.first_byte);
        let trace = Arc::new(RequestTrace::new(
            frame.api_key,
            frame.api_version,
            frame.correlation_id,
            self.peer,
            received,
        ));
        if let Some(user) = self.client.principal() {
            trace.set_user(user);
        }
        if let Some(waited) = arrived.socket_wait {
            trace.add(Stage::Socket, waited);
        }
        trace.add(
            Stage::Receive,
            last_received.saturating_duration_since(arrived.first_byte),
        );
        trace.add(Stage::Connection, arrived.complete.elapsed());
        Ok((frame, trace))
    }

    /// Hands a request of `bytes` bytes to the broker and puts it in
    /// flight.
    async fn start(&mut self, frame: RequestFrame, trace: Arc<RequestTrace>, bytes: usize) {
        let (broker, client) = (self.broker, self.client);
        let mut reply: Pin<Box<dyn Future<Output = Reply> + Send + 'a>> =
            Box::pin(trace::scope(Arc::clone(&trace), broker.handle(frame, client)));
        // Polled once now: a Produce queues its appends here, before
        // the next frame may start.
        let done = poll_fn(|cx| Poll::Ready(poll_reply(&mut reply, &trace, cx))).await;
        self.flight.push_back(InFlight {
            trace,
            bytes,
            reply,
            done,
        });
    }

    /// Waits for bytes (unless a whole frame already waits its turn), for
    /// a request in flight to finish, for a quota's mute to end, or for
    /// the idle limit.
    async fn wait(&mut self) -> Result<(), String> {
        let read_more = self.muted_until.is_none()
            && !self.inbox.eof
            && self.inbox.complete_frame(frame_limit(self.client, self.limits)) == Ok(None);
        // Worked out here: select! evaluates a disabled branch's future too.
        let wanted_since = self.wanting.update(read_more, Instant::now());
        let working = self.flight.iter().any(|f| f.done.is_none());
        let idle = if self.flight.is_empty() && self.inbox.buf.is_empty() && self.muted_until.is_none() {
            self.limits.idle
        } else {
            None
        };
        let muted_until = self.muted_until;
        tokio::select! {
            biased;
            () = progress(&mut self.flight), if working => {}
            () = sleep_or_never(muted_until.map(|m| m.saturating_duration_since(Instant::now()))), if muted_until.is_some() => {}
            got = self.inbox.fill(&mut self.read, wanted_since), if read_more => got.map_err(|e| e.to_string())?,
            () = sleep_or_never(idle) => return Err("idle past connections.max.idle.ms".into()),
        }
        Ok(())
    }
}

/// Since when a connection has wanted more bytes without a pause: the
/// earliest its reads' socket waits count from. Bytes that wait in the
/// socket while a quota mutes the connection, a whole frame waits its turn
/// or the connection writes a response are not a request thread's delay.
#[derive(Debug, Default)]
struct Wanting(Option<Instant>);

impl Wanting {
    /// The floor for a read at `now` when the connection `reads`; a pass
    /// that does not read closes the window.
    fn update(&mut self, reads: bool, now: Instant) -> Instant {
        if reads {
            *self.0.get_or_insert(now)
        } else {
            self.0 = None;
            now
        }
    }

    /// The connection did something else (wrote a response): a read after
    /// it counts from then.
    fn pause(&mut self) {
        self.0 = None;
    }
}

/// What the next frame may be: at most `socket.request.max.bytes`, or
/// `sasl.server.max.receive.size` before SASL authentication; a bare SASL
/// token (after a v0 handshake) may be shorter than a request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FrameLimit {
    max_bytes: usize,
    raw_token: bool,
}

fn frame_limit(client: &ClientInfo, limits: Limits) -> FrameLimit {
    match &client.sasl {
        None => FrameLimit {
            max_bytes: limits.max_request_bytes,
            raw_token: false,
        },
        Some(auth) => FrameLimit {
            max_bytes: auth.max_frame_bytes(limits.max_request_bytes),
            raw_token: auth.lock().expects_raw_token(),
        },
    }
}

/// A frame's API key, as far as it has one (a bare token may be shorter).
fn inbox_api_key(body: &[u8]) -> i16 {
    match body {
        [a, b, ..] => i16::from_be_bytes([*a, *b]),
        _ => -1,
    }
}

/// A bare SASL token's answer after a v0 handshake: its size, then it.
fn raw_token_frame(token: &[u8]) -> Bytes {
    let mut frame = BytesMut::with_capacity(FRAME_PREFIX_BYTES + token.len());
    frame.extend_from_slice(&(token.len() as i32).to_be_bytes());
    frame.extend_from_slice(token);
    frame.freeze()
}

/// Sends a last answer after `delay` (a failed authentication's, which
/// Kafka holds back to slow down password guessing), and closes the
/// connection: returns `reason`, the error the connection ends with.
async fn answer_and_close(
    write: &mut Option<Writer>,
    frame: Bytes,
    delay: Duration,
    reason: String,
    broker: &Broker,
) -> String {
    tokio::time::sleep(delay).await;
    if !frame.is_empty() {
        // The client may be gone already; the close is what matters.
        let _ = send(write, frame, broker.data.cold.bulk()).await;
    }
    if let Some(Writer::Tls(half)) = write.as_mut() {
        let _ = half.shutdown().await;
    }
    reason
}

fn refuse(e: FrameError, buf: &[u8], tls: bool) -> String {
    // A TLS record starts 0x16 0x03: a client speaking TLS to a plaintext
    // listener.
    if !tls && buf.starts_with(&[0x16, 0x03]) {
        tracing::warn!(error = %e, "refusing a TLS handshake on a PLAINTEXT listener; closing the connection");
        return format!("{e} (a TLS handshake on a PLAINTEXT listener)");
    }
    tracing::warn!(error = %e, "refusing request frame");
    e.to_string()
}

/// A request being handled, or handled and waiting for the ones before it
/// to be answered.
struct InFlight<'a> {
    trace: Arc<RequestTrace>,
    /// Its frame's size.
    bytes: usize,
    reply: Pin<Box<dyn Future<Output = Reply> + Send + 'a>>,
    done: Option<Reply>,
}

impl InFlight<'_> {
    /// Whether a Produce may start behind this request: it is a Produce
    /// that was answered, or waits only for its partitions' writers. One
    /// that closes the connection lets nothing behind it start.
    fn lets_produce_pass(&self) -> bool {
        self.trace.api_key == ApiKey::Produce as i16
            && match &self.done {
                Some(Reply::Close(_) | Reply::Refused(_)) => false,
                Some(_) => true,
                None => self.trace.appends_queued(),
            }
    }
}

/// Whether a frame of `len` bytes with `api_key` may start behind the
/// requests in flight.
fn admits(flight: &VecDeque<InFlight>, api_key: i16, len: usize) -> bool {
    flight.is_empty()
        || (api_key == ApiKey::Produce as i16
            && flight.len() < PIPELINE_DEPTH
            && flight.iter().map(|f| f.bytes).sum::<usize>() + len <= PIPELINE_BYTES
            && flight.iter().all(InFlight::lets_produce_pass))
}

/// Polls a request once, counting the poll as the request's busy time
/// (what `request_percentage` quotas measure).
fn poll_reply(
    reply: &mut Pin<Box<dyn Future<Output = Reply> + Send + '_>>,
    trace: &RequestTrace,
    cx: &mut std::task::Context,
) -> Option<Reply> {
    let _polling = trace.polling();
    match reply.as_mut().poll(cx) {
        Poll::Ready(r) => Some(r),
        Poll::Pending => None,
    }
}

/// Ready when at least one request in flight has finished.
async fn progress(flight: &mut VecDeque<InFlight<'_>>) {
    poll_fn(|cx| {
        let mut finished = false;
        for f in flight.iter_mut().filter(|f| f.done.is_none()) {
            f.done = poll_reply(&mut f.reply, &f.trace, cx);
            finished |= f.done.is_some();
        }
        if finished {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await
}

async fn sleep_or_never(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// Bytes read from the socket and not yet taken as frames, with when each
/// read arrived.
#[derive(Default)]
struct Inbox {
    buf: BytesMut,
    /// Position in the connection's byte stream of `buf[0]`.
    pos: u64,
    /// The reads whose bytes are still in `buf`, oldest first.
    reads: VecDeque<ReadEnd>,
    eof: bool,
}

/// One read of the socket.
#[derive(Debug, Clone, Copy)]
struct ReadEnd {
    /// The stream position the read ended at.
    end: u64,
    /// When it returned.
    at: Instant,
    /// How long its newest bytes had waited in the socket's receive queue.
    waited: Option<Duration>,
}

/// A frame taken from the inbox.
struct Arrived {
    /// The frame without its size prefix.
    body: Bytes,
    /// When its first byte was read.
    first_byte: Instant,
    /// When its last byte was read.
    complete: Instant,
    /// How long the bytes of the read that completed it waited in the
    /// socket's receive queue (plaintext connections).
    socket_wait: Option<Duration>,
}

impl Inbox {
    /// The whole size (prefix included) of the first frame in the buffer,
    /// once all of it has arrived. The size is checked as soon as the
    /// prefix is in.
    fn complete_frame(&self, limit: FrameLimit) -> Result<Option<usize>, FrameError> {
        let Some(prefix) = self.buf.get(..FRAME_PREFIX_BYTES) else {
            return Ok(None);
        };
        let prefix = <[u8; FRAME_PREFIX_BYTES]>::try_from(prefix).expect("sliced to the prefix's size");
        let size = if limit.raw_token {
            token_size(prefix, limit.max_bytes)?
        } else {
            request_size(prefix, limit.max_bytes)?
        };
        let len = FRAME_PREFIX_BYTES + size;
        Ok((self.buf.len() >= len).then_some(len))
    }

    /// The API key of the first frame, which [`Inbox::complete_frame`]
    /// found whole (-1 for a bare SASL token too short to look like one).
    fn api_key(&self) -> i16 {
        inbox_api_key(&self.buf[FRAME_PREFIX_BYTES..])
    }

    /// The read that took the byte at stream position `at` (still in the
    /// buffer).
    fn read_of(&self, at: u64) -> ReadEnd {
        self.reads
            .iter()
            .find(|r| r.end > at)
            .copied()
            .unwrap_or(ReadEnd {
                end: at + 1,
                at: Instant::now(),
                waited: None,
            })
    }

    /// Takes the first `len` bytes: a whole frame.
    fn take(&mut self, len: usize) -> Arrived {
        let first_byte = self.read_of(self.pos).at;
        let last = self.read_of(self.pos + len as u64 - 1);
        let mut frame = self.buf.split_to(len);
        frame.advance(FRAME_PREFIX_BYTES);
        self.pos += len as u64;
        while self.reads.front().is_some_and(|r| r.end <= self.pos) {
            self.reads.pop_front();
        }
        Arrived {
            body: frame.freeze(),
            first_byte,
            complete: last.at,
            socket_wait: last.waited,
        }
    }

    /// Reads what the socket has, at least one byte, or notes its end.
    /// Cancel-safe: nothing is read unless it returns.
    /// The socket stage counts from `wanted_since` at the earliest: when
    /// the connection last began wanting to read.
    async fn fill(&mut self, read: &mut Reader, wanted_since: Instant) -> std::io::Result<()> {
        let missing = match self.buf.get(..FRAME_PREFIX_BYTES) {
            // The size was checked (complete_frame) before more is read.
            Some(prefix) => {
                let size = i32::from_be_bytes(prefix.try_into().expect("sliced to the prefix's size"));
                (FRAME_PREFIX_BYTES + usize::try_from(size).unwrap_or(0)).saturating_sub(self.buf.len())
            }
            None => FRAME_PREFIX_BYTES - self.buf.len(),
        };
        let (n, waited) = read.read_some(&mut self.buf, missing, wanted_since).await?;
        if n == 0 {
            self.eof = true;
        } else {
            self.reads.push_back(ReadEnd {
                end: self.pos + self.buf.len() as u64,
                at: Instant::now(),
                waited,
            });
        }
        Ok(())
    }

    /// How the stream ended: between frames, or inside one.
    fn closed(&self) -> Result<(), String> {
        if self.buf.len() < FRAME_PREFIX_BYTES {
            Ok(())
        } else {
            Err("truncated frame: early eof".into())
        }
    }
}

/// Writes a response frame. A large one is written by the bulk threads:
/// this task waits for the socket to take more, then hands the write half
/// and the rest of the frame to a bulk thread, which writes it in pieces
/// and waits for the socket itself, for at most [`BULK_SEND_HOLD`], before
/// giving the half back.
async fn send(write: &mut Option<Writer>, frame: Bytes, bulk: &Bulk) -> std::io::Result<()> {
    let half = match write.as_mut() {
        None => return Err(std::io::Error::other("the connection's write half was lost")),
        Some(Writer::Tls(half)) => {
            half.write_all(&frame).await?;
            return half.flush().await;
        }
        Some(Writer::Plain(half)) => half,
    };
    if frame.len() < BULK_SEND_BYTES {
        return half.write_all(&frame).await;
    }
    let mut sent = 0;
    while sent < frame.len() {
        let Some(Writer::Plain(half)) = write.take() else {
            return Err(std::io::Error::other("the connection's write half was lost"));
        };
        half.writable().await?;
        let rest = frame.slice(sent..);
        // If the job panics the half is dropped with it, which closes the
        // connection: the response cannot be finished.
        let (half, wrote) = bulk
            .run(move || {
                let wrote = write_for_a_while(&half, &rest, BULK_SEND_HOLD);
                (half, wrote)
            })
            .await?;
        *write = Some(Writer::Plain(half));
        sent += wrote?;
    }
    Ok(())
}

/// On a bulk thread: writes `data` in pieces of [`BULK_SEND_BYTES`] (one
/// kernel copy each, so a live thread that wakes on this CPU waits for at
/// most one piece), waiting with poll(2) while the socket is full, until
/// all is written or `hold` has passed. Returns the bytes written.
///
/// The pieces go out with send(2) on the socket itself, not through
/// tokio's `try_write`: that one answers "would block" from tokio's own
/// readiness until the runtime's event loop has seen the socket drain, so
/// after a poll it would spin. When the job ends on a full socket, one
/// `try_write` makes tokio see the full socket too, so the connection's
/// `writable().await` waits for it to drain instead of handing the half
/// straight back.
fn write_for_a_while(half: &OwnedWriteHalf, data: &[u8], hold: Duration) -> std::io::Result<usize> {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    use rustix::io::Errno;
    use rustix::net::{send, SendFlags};
    let started = Instant::now();
    let stream: &TcpStream = half.as_ref();
    let mut sent = 0;
    while sent < data.len() {
        let piece = &data[sent..data.len().min(sent + BULK_SEND_BYTES)];
        match send(stream, piece, SendFlags::DONTWAIT | SendFlags::NOSIGNAL) {
            Ok(n) => sent += n,
            Err(Errno::INTR) => {}
            Err(Errno::AGAIN) => {
                let left = hold.saturating_sub(started.elapsed());
                if left.is_zero() {
                    return match half.try_write(piece) {
                        Ok(n) => Ok(sent + n),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(sent),
                        Err(e) => Err(e),
                    };
                }
                let timeout = Timespec {
                    tv_sec: left.as_secs() as _,
                    tv_nsec: left.subsec_nanos() as _,
                };
                match poll(&mut [PollFd::new(stream, PollFlags::OUT)], Some(&timeout)) {
                    Ok(_) | Err(Errno::INTR) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        }
        if started.elapsed() >= hold {
            break;
        }
    }
    Ok(sent)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn frame(api_key: i16, body_len: usize) -> Vec<u8> {
        let size = 8 + body_len;
        let mut f = (size as i32).to_be_bytes().to_vec();
        f.extend(api_key.to_be_bytes());
        f.extend(0i16.to_be_bytes()); // version
        f.extend(7i32.to_be_bytes()); // correlation id
        f.extend(std::iter::repeat_n(0xab, body_len));
        f
    }

    /// Bytes read as a connection without receive timestamps.
    fn bytes(b: &[u8]) -> Reader {
        Reader::Other(Box::new(std::io::Cursor::new(b.to_vec())))
    }

    /// A TLS connection (bytes without timestamps) that announces a frame
    /// of the largest size and sends a few bytes of it holds memory for
    /// what it sent, not for what it announced.
    #[tokio::test]
    async fn an_announced_frame_size_is_not_reserved_before_it_is_read() {
        let announced = 100 << 20;
        let (mut client, server) = tokio::io::duplex(1 << 10);
        let mut read = Reader::Other(Box::new(server));
        let mut inbox = Inbox::default();
        let limit = FrameLimit {
            max_bytes: announced,
            raw_token: false,
        };
        client.write_all(&(announced as i32).to_be_bytes()).await.unwrap();
        inbox.fill(&mut read, Instant::now()).await.unwrap();
        assert!(inbox.complete_frame(limit).unwrap().is_none());
        client.write_all(&[0u8; 10]).await.unwrap();
        inbox.fill(&mut read, Instant::now()).await.unwrap();
        assert!(inbox.complete_frame(limit).unwrap().is_none());
        assert_eq!(inbox.buf.len(), 14);
        let held = inbox.buf.capacity();
        assert!(
            held <= 2 * crate::receive_time::MAX_READ_BYTES,
            "{held} bytes held for 14 bytes read"
        );
    }

    #[tokio::test]
    async fn a_frame_that_waited_in_the_socket_says_how_long() {
        let (mut client, read) = crate::receive_time::tests::connected().await;
        let mut read = Reader::Stamped(read);
        let limit = FrameLimit {
            max_bytes: 1 << 20,
            raw_token: false,
        };
        let long_ago = Instant::now() - Duration::from_secs(1);
        client.write_all(&frame(0, 20)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        let mut inbox = Inbox::default();
        inbox.fill(&mut read, long_ago).await.unwrap();
        let len = inbox
            .complete_frame(limit)
            .unwrap()
            .expect("one read took it whole");
        let arrived = inbox.take(len);
        let waited = arrived
            .socket_wait
            .expect("a plaintext socket's reads are stamped");
        assert!(waited >= Duration::from_millis(30), "{waited:?}");
        // Bytes without timestamps (TLS) say nothing.
        let mut inbox = Inbox::default();
        inbox.fill(&mut bytes(&frame(0, 20)), long_ago).await.unwrap();
        assert_eq!(inbox.take(32).socket_wait, None);
    }

    #[tokio::test]
    async fn frames_split_across_reads_keep_their_arrival_times() {
        let mut stream = frame(0, 20);
        stream.extend(frame(3, 4));
        let mut inbox = Inbox::default();
        inbox
            .fill(&mut bytes(&stream[..10]), Instant::now())
            .await
            .unwrap();
        assert_eq!(
            inbox.complete_frame(FrameLimit {
                max_bytes: 1 << 20,
                raw_token: false
            }),
            Ok(None)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        inbox
            .fill(&mut bytes(&stream[10..]), Instant::now())
            .await
            .unwrap();

        let len = inbox
            .complete_frame(FrameLimit {
                max_bytes: 1 << 20,
                raw_token: false,
            })
            .unwrap()
            .expect("the first frame is whole");
        assert_eq!((len, inbox.api_key()), (32, 0));
        let first = inbox.take(len);
        assert_eq!(first.body.len(), 28);
        assert!(
            first.complete - first.first_byte >= Duration::from_millis(20),
            "its last bytes came in the second read"
        );
        let len = inbox
            .complete_frame(FrameLimit {
                max_bytes: 1 << 20,
                raw_token: false,
            })
            .unwrap()
            .expect("the second frame is whole");
        assert_eq!((len, inbox.api_key()), (16, 3));
        let second = inbox.take(len);
        assert_eq!(
            second.first_byte, second.complete,
            "all of it came in the second read"
        );
        assert_eq!(second.first_byte, first.complete);
        assert!(inbox.buf.is_empty() && inbox.reads.is_empty());
        assert_eq!(inbox.closed(), Ok(()));
    }

    #[tokio::test]
    async fn a_bad_size_is_refused_before_the_body_and_a_cut_frame_is_truncated() {
        let mut inbox = Inbox::default();
        inbox
            .fill(&mut bytes(&(200i32.to_be_bytes())[..]), Instant::now())
            .await
            .unwrap();
        assert!(matches!(
            inbox.complete_frame(FrameLimit {
                max_bytes: 100,
                raw_token: false
            }),
            Err(FrameError::TooLarge { .. })
        ));

        let mut inbox = Inbox::default();
        inbox
            .fill(&mut bytes(&frame(0, 10)[..12]), Instant::now())
            .await
            .unwrap();
        inbox.fill(&mut bytes(&[][..]), Instant::now()).await.unwrap();
        assert!(inbox.eof);
        assert!(inbox.closed().is_err(), "a frame cut short is a truncated frame");

        let mut inbox = Inbox::default();
        inbox
            .fill(&mut bytes(&[0u8, 0][..]), Instant::now())
            .await
            .unwrap();
        assert_eq!(
            inbox.closed(),
            Ok(()),
            "a connection may close inside a size prefix"
        );
    }

    #[test]
    fn the_socket_wait_counts_from_when_reading_resumed() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut wanting = Wanting::default();
        assert_eq!(wanting.update(true, at(0)), at(0));
        assert_eq!(wanting.update(true, at(5)), at(0), "still reading since 0");
        // Muted, or a whole frame waiting its turn: the window closes.
        assert_eq!(wanting.update(false, at(10)), at(10));
        assert_eq!(wanting.update(false, at(500)), at(500));
        assert_eq!(
            wanting.update(true, at(510)),
            at(510),
            "not from before the pause"
        );
        assert_eq!(wanting.update(true, at(520)), at(510));
        wanting.pause();
        assert_eq!(wanting.update(true, at(530)), at(530), "not from before the send");
    }

    /// A client socket and the server side's halves, over loopback.
    pub(crate) async fn connected() -> (TcpStream, tokio::net::tcp::OwnedReadHalf, OwnedWriteHalf) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (read, write) = server.into_split();
        (client, read, write)
    }

    #[tokio::test]
    async fn a_bulk_send_writes_on_while_the_runtime_is_busy_instead_of_spinning() {
        // The bulk thread's writes must not depend on the runtime's event
        // loop noticing the socket drain: here the runtime (this test's one
        // thread) is blocked in the write while a plain thread reads.
        let (client, _read, write) = connected().await;
        let client = client.into_std().unwrap();
        client.set_nonblocking(false).unwrap();
        let large: Vec<u8> = (0..64 * BULK_SEND_BYTES).map(|i| (i * 17 % 251) as u8).collect();
        let want = large.len();
        let reader = std::thread::spawn(move || {
            let mut client = client;
            let mut got = Vec::with_capacity(want);
            let mut chunk = vec![0u8; 64 << 10];
            while got.len() < want {
                let n = std::io::Read::read(&mut client, &mut chunk).unwrap();
                assert!(n > 0, "the connection closed early");
                got.extend_from_slice(&chunk[..n]);
            }
            got
        });
        let hold = Duration::from_secs(20);
        let started = Instant::now();
        let wrote = write_for_a_while(&write, &large, hold).unwrap();
        assert_eq!(wrote, large.len(), "stopped early after {:?}", started.elapsed());
        assert!(reader.join().unwrap() == large, "the bytes arrived changed");
    }

    #[tokio::test]
    async fn a_large_response_is_written_whole_by_the_bulk_threads_and_a_small_one_after_it() {
        let (client, _read, write) = connected().await;
        let mut write = Some(Writer::Plain(write));
        let bulk = Bulk::new(1).unwrap();
        let large: Bytes = (0..3 * BULK_SEND_BYTES + 123)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let expected_len = large.len() + 3;
        let reader = tokio::spawn(async move {
            let mut client = client;
            let mut got = Vec::new();
            while got.len() < expected_len {
                let mut chunk = [0u8; 64 << 10];
                let n = client.read(&mut chunk).await.unwrap();
                assert!(n > 0, "the connection closed early");
                got.extend_from_slice(&chunk[..n]);
                // A slow reader: the socket fills and the bulk thread's
                // write would block.
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            got
        });
        send(&mut write, large.clone(), &bulk).await.unwrap();
        send(&mut write, Bytes::from_static(b"end"), &bulk).await.unwrap();
        let got = reader.await.unwrap();
        assert_eq!(&got[..large.len()], &large[..]);
        assert_eq!(&got[large.len()..], b"end");
        assert!(write.is_some(), "the write half came back");
    }

    #[tokio::test]
    async fn a_bulk_send_to_a_reader_that_stops_gives_the_thread_back_after_its_hold() {
        let (client, _read, write) = connected().await;
        // More than the two sockets' buffers hold: the reader reads nothing yet.
        let large: Bytes = (0..64 * BULK_SEND_BYTES).map(|i| (i * 13 % 251) as u8).collect();
        let hold = Duration::from_millis(50);
        let data = large.clone();
        // A job that ignored its hold would never return: the guard turns
        // that hang into a failure.
        let job = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let wrote = write_for_a_while(&write, &data, hold).unwrap();
            (write, wrote, started.elapsed())
        });
        let (write, wrote, took) = tokio::time::timeout(Duration::from_secs(60), job)
            .await
            .expect("the bulk job kept the thread past its hold")
            .unwrap();
        assert!(
            wrote > 0 && wrote < large.len(),
            "wrote {wrote} of {}",
            large.len()
        );
        assert!(took >= hold, "gave up before its hold: {took:?}");

        // The rest goes out through `send` (bulk jobs again) once the reader
        // reads, with a pause longer than a hold on the way, and arrives whole.
        let mut write = Some(Writer::Plain(write));
        let bulk = Bulk::new(1).unwrap();
        let rest = large.slice(wrote..);
        let reader = tokio::spawn(async move {
            let mut client = client;
            let mut got = Vec::new();
            while got.len() < large.len() + 3 {
                let mut chunk = [0u8; 256 << 10];
                let n = client.read(&mut chunk).await.unwrap();
                assert!(n > 0, "the connection closed early");
                got.extend_from_slice(&chunk[..n]);
                if got.len() == n {
                    tokio::time::sleep(BULK_SEND_HOLD * 2).await;
                }
            }
            (got, large)
        });
        send(&mut write, rest, &bulk).await.unwrap();
        send(&mut write, Bytes::from_static(b"end"), &bulk).await.unwrap();
        let (got, large) = reader.await.unwrap();
        assert_eq!(got.len(), large.len() + 3);
        assert!(
            got[..large.len()] == large[..],
            "the frame arrived out of order or changed"
        );
        assert_eq!(&got[large.len()..], b"end");
    }

    fn in_flight(api_key: ApiKey, bytes: usize, queued: bool, done: Option<Reply>) -> InFlight<'static> {
        let trace = Arc::new(RequestTrace::new(
            api_key as i16,
            0,
            1,
            "127.0.0.1:9".parse().unwrap(),
            Instant::now(),
        ));
        let t = Arc::clone(&trace);
        let ready = async move {
            if queued {
                trace::expect_appends(1);
                trace::append_queued();
            }
        };
        // Run the marking inside the trace's scope, as a handler would; it
        // does not wait, so one poll finishes it.
        let mut marking = std::pin::pin!(trace::scope(t, ready));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(marking.as_mut().poll(&mut cx).is_ready());
        InFlight {
            trace,
            bytes,
            reply: Box::pin(std::future::pending()),
            done,
        }
    }

    #[test]
    fn only_produce_requests_pass_produce_requests_whose_appends_are_queued() {
        let produce = ApiKey::Produce as i16;
        let fetch = ApiKey::Fetch as i16;
        assert!(
            admits(&VecDeque::new(), fetch, 100),
            "an idle connection takes anything"
        );

        let queued: VecDeque<_> = [in_flight(ApiKey::Produce, 100, true, None)].into();
        assert!(admits(&queued, produce, 100));
        assert!(
            !admits(&queued, fetch, 100),
            "anything else waits for the produce"
        );
        assert!(!admits(&queued, produce, PIPELINE_BYTES), "a large one waits");

        let unqueued: VecDeque<_> = [in_flight(ApiKey::Produce, 100, false, None)].into();
        assert!(
            !admits(&unqueued, produce, 100),
            "appends not queued yet could be overtaken"
        );

        let answered: VecDeque<_> = [in_flight(ApiKey::Produce, 100, false, Some(Reply::Nothing))].into();
        assert!(admits(&answered, produce, 100));
        let closing: VecDeque<_> = [in_flight(
            ApiKey::Produce,
            100,
            false,
            Some(Reply::Close("bad".into())),
        )]
        .into();
        assert!(
            !admits(&closing, produce, 100),
            "nothing starts behind a closing reply"
        );

        let metadata: VecDeque<_> = [in_flight(ApiKey::Metadata, 100, false, None)].into();
        assert!(!admits(&metadata, produce, 100));

        let full: VecDeque<_> = (0..PIPELINE_DEPTH)
            .map(|_| in_flight(ApiKey::Produce, 10, true, None))
            .collect();
        assert!(!admits(&full, produce, 10), "at most PIPELINE_DEPTH in flight");
    }
}
