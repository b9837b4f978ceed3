//! Sockets: accept connections, read request frames, hand them to the
//! broker, write responses in request order (as Kafka does per connection).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use keel_broker::trace::{self, RequestTrace, Stage};
use keel_broker::{Broker, BrokerConfig, ClientInfo, Reply};
use keel_protocol::frame::{request_size, FRAME_PREFIX_BYTES};
use keel_protocol::RequestFrame;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::admin;
use crate::config::{gather, ServeArgs};

pub fn serve(args: ServeArgs) -> Result<(), String> {
    let map = gather(&args)?;
    let config = BrokerConfig::from_map(&map).map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("keel")
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime.block_on(run(config))
}

async fn run(config: BrokerConfig) -> Result<(), String> {
    raise_descriptor_limit();
    let listen = config.get("listen").to_string();
    let listener = TcpListener::bind(&listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let admin_listener = bind_admin(config.get("keel.admin.listen")).await?;
    let (host, port) = advertised(config.get("advertised"), local)?;
    let data_dir = config.data_dir();
    let broker = tokio::task::spawn_blocking(move || Broker::open(config, host, port))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    broker.spawn_maintenance();
    tracing::info!(data_dir = %data_dir.display(), advertised = %format!("{}:{}", broker.advertised_host, broker.advertised_port), "listening on {local}");
    let admin_task = admin_listener.map(|l| {
        let b = Arc::clone(&broker);
        // Called on the blocking pool (see admin::connection).
        let stats: admin::StatsSource = Arc::new(move || b.stats_json());
        let b = Arc::clone(&broker);
        let metrics: admin::MetricsSource = Arc::new(move || b.metrics.encode(&b));
        let handlers = admin::Handlers {
            stats,
            metrics,
            failpoints: broker.failpoints.clone(),
        };
        tokio::spawn(admin::serve(l, handlers, admin::Limits::default()))
    });
    let limits = ConnectionLimits::from_config(&broker.config);
    tokio::select! {
        _ = accept_loop(listener, Arc::clone(&broker), limits) => {}
        _ = shutdown_signal() => tracing::info!("shutting down"),
    }
    if let Some(task) = admin_task {
        task.abort();
    }
    tokio::task::spawn_blocking(move || broker.shutdown())
        .await
        .map_err(|e| e.to_string())?;
    tracing::info!("stopped");
    Ok(())
}

/// Binds the admin endpoint, or says it is off (`keel.admin.listen` empty).
/// Bound before the broker opens, so a taken port fails start-up at once.
async fn bind_admin(addr: &str) -> Result<Option<TcpListener>, String> {
    if addr.is_empty() {
        tracing::info!("admin endpoint disabled (keel.admin.listen is empty)");
        return Ok(None);
    }
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("config `keel.admin.listen`: cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    tracing::info!("admin endpoint on http://{local} (/stats, /metrics, /healthz)");
    Ok(Some(listener))
}

fn advertised(value: &str, local: SocketAddr) -> Result<(String, i32), String> {
    if value.is_empty() {
        return Ok((local.ip().to_string(), i32::from(local.port())));
    }
    let (host, port) = value
        .rsplit_once(':')
        .ok_or_else(|| format!("advertised `{value}`: expected HOST:PORT"))?;
    let port = port
        .parse::<u16>()
        .map_err(|_| format!("advertised `{value}`: bad port"))?;
    Ok((host.to_string(), i32::from(port)))
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// Kafka's connection limits: `max.connections` in all (accepting waits
/// for a free slot), `max.connections.per.ip` (more from one address are
/// closed at once), `connections.max.idle.ms` (a connection that sends no
/// request for that long is closed). Requests on one connection are handled
/// one at a time, as Kafka does, so a connection has at most one request in
/// flight and one frame of `socket.request.max.bytes` buffered.
struct ConnectionLimits {
    total: Arc<Semaphore>,
    per_ip: usize,
    idle: Option<Duration>,
    max_request_bytes: usize,
    by_ip: Mutex<HashMap<IpAddr, usize>>,
}

impl ConnectionLimits {
    fn from_config(config: &BrokerConfig) -> Arc<ConnectionLimits> {
        let num = |key| usize::try_from(config.num(key)).unwrap_or(usize::MAX);
        let total = num("max.connections").min(Semaphore::MAX_PERMITS);
        let idle_ms = config.num("connections.max.idle.ms");
        Arc::new(ConnectionLimits {
            total: Arc::new(Semaphore::new(total)),
            per_ip: num("max.connections.per.ip"),
            idle: u64::try_from(idle_ms).ok().map(Duration::from_millis),
            max_request_bytes: config.request_max_bytes(),
            by_ip: Mutex::new(HashMap::new()),
        })
    }

    /// Counts a connection from `ip`; false if that address has its fill.
    fn admit(&self, ip: IpAddr) -> bool {
        let mut by_ip = self.by_ip.lock();
        let n = by_ip.entry(ip).or_insert(0);
        if *n >= self.per_ip {
            return false;
        }
        *n += 1;
        true
    }

    fn release(&self, ip: IpAddr) {
        let mut by_ip = self.by_ip.lock();
        if let Some(n) = by_ip.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                by_ip.remove(&ip);
            }
        }
    }
}

async fn accept_loop(listener: TcpListener, broker: Arc<Broker>, limits: Arc<ConnectionLimits>) {
    loop {
        // At `max.connections`, stop accepting until one closes (clients
        // wait in the listen backlog, as with Kafka).
        let Ok(slot) = Arc::clone(&limits.total).acquire_owned().await else {
            return;
        };
        match listener.accept().await {
            Ok((stream, peer)) => {
                if !limits.admit(peer.ip()) {
                    tracing::warn!(%peer, max = limits.per_ip, "closing a connection over max.connections.per.ip");
                    drop(stream);
                    continue;
                }
                let b = Arc::clone(&broker);
                let limits = Arc::clone(&limits);
                tokio::spawn(async move {
                    let client = ClientInfo {
                        host: format!("/{}", peer.ip()),
                    };
                    b.metrics.connection_opened();
                    let closed = connection(stream, peer, Arc::clone(&b), &client, &limits).await;
                    b.metrics.connection_closed();
                    if let Err(reason) = closed {
                        tracing::debug!(%peer, %reason, "connection closed");
                    }
                    limits.release(peer.ip());
                    drop(slot);
                });
            }
            Err(e) => {
                // Typically EMFILE: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

/// Serves one connection until the client closes it, sends something that
/// cannot be answered, or stays idle past `connections.max.idle.ms`.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    broker: Arc<Broker>,
    client: &ClientInfo,
    limits: &ConnectionLimits,
) -> Result<(), String> {
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::with_capacity(64 * 1024, read);
    loop {
        let mut prefix = [0u8; FRAME_PREFIX_BYTES];
        let next = read.read_exact(&mut prefix);
        let got = match limits.idle {
            Some(idle) => match tokio::time::timeout(idle, next).await {
                Ok(got) => got,
                Err(_) => return Err("idle past connections.max.idle.ms".into()),
            },
            None => next.await,
        };
        match got {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.to_string()),
        }
        let started = Instant::now();
        let size = request_size(prefix, limits.max_request_bytes).map_err(|e| {
            tracing::warn!(error = %e, "refusing request frame");
            e.to_string()
        })?;
        let mut body = vec![0u8; size];
        read.read_exact(&mut body)
            .await
            .map_err(|e| format!("truncated frame: {e}"))?;
        let frame = RequestFrame::parse(Bytes::from(body)).map_err(|e| e.to_string())?;
        let trace = Arc::new(RequestTrace::new(
            frame.api_key,
            frame.api_version,
            frame.correlation_id,
            peer,
            started,
        ));
        trace.add(Stage::Receive, started.elapsed());
        let reply = trace::scope(Arc::clone(&trace), broker.handle(frame, client)).await;
        match reply {
            Reply::Frame(bytes) => {
                let sending = Instant::now();
                write_frame(&mut write, &bytes).await.map_err(|e| e.to_string())?;
                trace.add(Stage::Send, sending.elapsed());
            }
            Reply::Nothing => {}
            Reply::Close(reason) => {
                tracing::warn!(%reason, "closing connection");
                return Err(reason);
            }
        }
        broker.metrics.finish(&trace, &broker.store);
    }
}

/// Raises the soft limit of open files to the hard limit: a broker holds
/// one descriptor per partition's active segment and per connection.
fn raise_descriptor_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let limit = getrlimit(Resource::Nofile);
    if limit.current == limit.maximum {
        return;
    }
    let raised = rustix::process::Rlimit {
        current: limit.maximum,
        maximum: limit.maximum,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => tracing::info!(from = ?limit.current, to = ?limit.maximum, "raised the open files limit"),
        Err(e) => tracing::warn!(error = %e, current = ?limit.current, "cannot raise the open files limit"),
    }
}

/// Bytes written per poll of a connection: a large response (a backfill's
/// megabytes) goes out in pieces with a yield between them, so the
/// kernel's copy of it never holds a request thread for long while other
/// connections' requests wait.
const WRITE_PIECE_BYTES: usize = 256 << 10;

async fn write_frame(write: &mut (impl AsyncWriteExt + Unpin), frame: &[u8]) -> std::io::Result<()> {
    let mut pieces = frame.chunks(WRITE_PIECE_BYTES).peekable();
    while let Some(piece) = pieces.next() {
        write.write_all(piece).await?;
        if pieces.peek().is_some() {
            tokio::task::yield_now().await;
        }
    }
    Ok(())
}
