//! Sockets: accept connections, read request frames, hand them to the
//! broker, write responses in request order (as Kafka does per connection).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use keel_broker::{Broker, BrokerConfig, ClientInfo};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::config::{gather, ServeArgs};
use crate::{admin, connection};

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
    if let Some(levels) = crate::loggers::installed() {
        let _ = broker.loggers.set(levels);
    }
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
/// request for that long is closed). A connection holds one request in
/// flight, or a few small Produce requests (`connection::PIPELINE_DEPTH`,
/// `connection::PIPELINE_BYTES`), and one frame of
/// `socket.request.max.bytes` being read.
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

    fn connection(&self) -> connection::Limits {
        connection::Limits {
            max_request_bytes: self.max_request_bytes,
            idle: self.idle,
        }
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
                    let closed = connection::serve(stream, peer, &b, &client, limits.connection()).await;
                    if let Err(reason) = closed {
                        tracing::debug!(%peer, %reason, "connection closed");
                    }
                    // Counted once its reason is logged: whoever sees the
                    // count fall finds the line in the log.
                    b.metrics.connection_closed();
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
