//! Sockets: accept connections, read request frames, hand them to the
//! broker, write responses in request order (as Kafka does per connection).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use keel_broker::{Broker, BrokerConfig, ClientInfo, Reply};
use keel_protocol::frame::{request_size, FRAME_PREFIX_BYTES};
use keel_protocol::RequestFrame;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

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
        tokio::spawn(admin::serve(l, stats, admin::Limits::default()))
    });
    let max_request_bytes = broker.config.request_max_bytes();
    tokio::select! {
        _ = accept_loop(listener, Arc::clone(&broker), max_request_bytes) => {}
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
    tracing::info!("admin endpoint on http://{local} (/stats, /healthz)");
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

async fn accept_loop(listener: TcpListener, broker: Arc<Broker>, max_request_bytes: usize) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let b = Arc::clone(&broker);
                tokio::spawn(async move {
                    let client = ClientInfo {
                        host: format!("/{}", peer.ip()),
                    };
                    if let Err(reason) = connection(stream, b, &client, max_request_bytes).await {
                        tracing::debug!(%peer, %reason, "connection closed");
                    }
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

/// Serves one connection until the client closes it or sends something
/// that cannot be answered.
async fn connection(
    stream: TcpStream,
    broker: Arc<Broker>,
    client: &ClientInfo,
    max_request_bytes: usize,
) -> Result<(), String> {
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::with_capacity(64 * 1024, read);
    loop {
        let mut prefix = [0u8; FRAME_PREFIX_BYTES];
        match read.read_exact(&mut prefix).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.to_string()),
        }
        let size = request_size(prefix, max_request_bytes).map_err(|e| {
            tracing::warn!(error = %e, "refusing request frame");
            e.to_string()
        })?;
        let mut body = vec![0u8; size];
        read.read_exact(&mut body)
            .await
            .map_err(|e| format!("truncated frame: {e}"))?;
        let frame = RequestFrame::parse(Bytes::from(body)).map_err(|e| e.to_string())?;
        match broker.handle(frame, client).await {
            Reply::Frame(bytes) => write_frame(&mut write, &bytes).await.map_err(|e| e.to_string())?,
            Reply::Nothing => {}
            Reply::Close(reason) => {
                tracing::warn!(%reason, "closing connection");
                return Err(reason);
            }
        }
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
