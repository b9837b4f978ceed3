//! Sockets: accept connections, read request frames, hand them to the
//! broker, write responses in request order (as Kafka does per connection).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keel_auth::sasl::{ConnectionAuth, SaslListener};
use keel_broker::broker::identity;
use keel_broker::{Broker, ClientInfo};
use keel_cluster::Membership;
use keel_config::{listeners, BrokerConfig};
use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

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

/// One bound listener, with its TLS configuration if it is SSL or
/// SASL_SSL, and its SASL settings if it is SASL_PLAINTEXT or SASL_SSL.
struct Bound {
    listener: listeners::Listener,
    socket: TcpListener,
    tls: Option<Arc<crate::tls::Reloading>>,
    sasl: Option<keel_auth::sasl::SaslSettings>,
}

/// Binds every listener (`listeners`), with its TLS keys read and its SASL
/// settings checked first, so a bad key, an unknown mechanism or a taken
/// port fails start-up at once.
async fn bind_listeners(config: &BrokerConfig) -> Result<Vec<Bound>, String> {
    let mut out = Vec::new();
    for listener in listeners::listeners(config).map_err(|e| e.to_string())? {
        let tls = if listener.protocol.tls() {
            let settings = listeners::ssl_settings(config, &listener.name).map_err(|e| e.to_string())?;
            Some(crate::tls::Reloading::new(&listener.name, settings)?)
        } else {
            None
        };
        let sasl = if listener.protocol.sasl() {
            let view = listeners::ListenerSettings::new(config, &listener.name);
            Some(keel_auth::sasl::settings(&view, &listener.name).map_err(|e| e.to_string())?)
        } else {
            None
        };
        let address = listener.bind_address();
        let socket = TcpListener::bind(&address)
            .await
            .map_err(|e| format!("listener {}: cannot listen on {address}: {e}", listener.name))?;
        out.push(Bound {
            listener,
            socket,
            tls,
            sasl,
        });
    }
    Ok(out)
}

async fn run(config: BrokerConfig) -> Result<(), String> {
    raise_descriptor_limit();
    let bound = bind_listeners(&config).await?;
    let locals: Vec<(listeners::Listener, SocketAddr)> = bound
        .iter()
        .map(|b| {
            Ok((
                b.listener.clone(),
                b.socket.local_addr().map_err(|e| e.to_string())?,
            ))
        })
        .collect::<Result<_, String>>()?;
    let admin_listener = bind_admin(&config).await?;
    let advertised = listeners::advertised(&config, &locals).map_err(|e| e.to_string())?;
    let data_dir = config.data_dir();
    let broker = open_broker(config, advertised).await?;
    if let Some(levels) = crate::loggers::installed() {
        let _ = broker.loggers.set(levels);
    }
    broker.spawn_maintenance();
    for ((listener, local), endpoint) in locals.iter().zip(&broker.advertised) {
        tracing::info!(
            data_dir = %data_dir.display(),
            listener = %listener.name,
            protocol = listener.protocol.name(),
            advertised = %format!("{}:{}", endpoint.host, endpoint.port),
            "listening on {local}"
        );
    }
    let admin_task = admin_listener.map(|(l, auth, tls)| {
        let b = Arc::clone(&broker);
        // Called on the blocking pool (see admin::connection).
        let stats: admin::StatsSource = Arc::new(move || b.stats_json());
        let b = Arc::clone(&broker);
        let metrics: admin::MetricsSource = Arc::new(move || b.metrics_text());
        if let Some(tls) = &tls {
            tls.spawn_watch();
        }
        let handlers = admin::Handlers {
            stats,
            metrics,
            failpoints: broker.failpoints.clone(),
            auth,
            tls,
        };
        tokio::spawn(admin::serve(l, handlers, admin::Limits::default()))
    });
    let limits = ConnectionLimits::from_config(&broker.config());
    let mut accepting = tokio::task::JoinSet::new();
    for b in &bound {
        if let Some(tls) = &b.tls {
            tls.spawn_watch();
        }
    }
    for b in bound {
        accepting.spawn(accept_loop(b, Arc::clone(&broker), Arc::clone(&limits)));
    }
    tokio::select! {
        _ = accepting.join_next() => {}
        _ = shutdown_signal() => tracing::info!("shutting down"),
    }
    accepting.abort_all();
    if let Some(task) = admin_task {
        task.abort();
    }
    // The writes already made are committed before the session ends, so a
    // clean stop loses no acks=1 record either.
    if let Some(wal) = &broker.data.wal {
        if !wal.drain(std::time::Duration::from_secs(5)).await {
            tracing::warn!(
                pending_bytes = wal.unwritten_bytes(),
                "stopping with writes not committed: they are cut from the log when this broker leads again"
            );
        }
    }
    broker.cluster.leave().await;
    tokio::task::spawn_blocking(move || broker.shutdown())
        .await
        .map_err(|e| e.to_string())?;
    tracing::info!("stopped");
    Ok(())
}

/// Opens the broker as a member of its cluster: connects to the
/// coordination store (etcd at `keel.cluster.etcd.endpoints`, or one in
/// this process when there are none), takes the cluster id it holds (or
/// gives it this directory's, or a new one, if it holds none yet), opens
/// the data directory under it, and registers the broker.
async fn open_broker(
    config: BrokerConfig,
    advertised: Vec<listeners::Endpoint>,
) -> Result<Arc<Broker>, String> {
    let endpoints = config.etcd_endpoints();
    let settings = identity::cluster_settings(&config);
    let store = keel_cluster::connect(&endpoints, settings.session_timeout)
        .await
        .map_err(|e| format!("keel.cluster.etcd.endpoints={}: {e}", endpoints.join(",")))?;
    let data_dir = config.data_dir();
    let stored = identity::read_meta_properties(keel_log::DiskStorage::shared().as_ref(), &data_dir)
        .map_err(|e| format!("{}: {e}", data_dir.display()))?;
    let candidate = stored.cluster_id.unwrap_or_else(identity::new_cluster_id);
    let cluster_id = Membership::claim_cluster_id(store.as_ref(), &settings, &candidate)
        .await
        .map_err(|e| format!("cannot read the cluster id from {}: {e}", store.describe()))?;
    let identity = identity::Identity {
        cluster_id,
        directory_id: stored.directory_id.unwrap_or_else(identity::new_directory_id),
    };
    let me = identity::registration(&config, &advertised, &identity.directory_id);
    let membership = Membership::new(store, settings, me);
    let all = listeners::listeners(&config).map_err(|e| e.to_string())?;
    let inter_broker = listeners::inter_broker_listener(&config, &all);
    let peers = match crate::peers::TcpPeers::new(&config, inter_broker.as_ref()) {
        Ok(peers) => peers,
        // One broker sends no requests to others: what the inter-broker
        // listener lacks matters only in a cluster.
        Err(why) if endpoints.is_empty() => {
            crate::peers::TcpPeers::refusing(&config, inter_broker.as_ref(), why)
        }
        Err(why) => return Err(why),
    };
    let broker =
        tokio::task::spawn_blocking(move || Broker::open_in(config, advertised, identity, membership))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
    // Before the cluster starts: the transactions a load finds prepared
    // send their markers at once.
    let _ = broker.peers.set(Arc::new(peers));
    if let Err(e) = broker.start_cluster().await {
        broker.cluster.leave().await;
        let b = Arc::clone(&broker);
        let _ = tokio::task::spawn_blocking(move || b.shutdown()).await;
        return Err(e);
    }
    Ok(broker)
}

type AdminEndpoint = (TcpListener, admin::Auth, Option<Arc<crate::tls::Reloading>>);

/// Binds the admin endpoint, or says it is off (`keel.admin.listen` empty),
/// with who may read it and its TLS keys. Bound before the broker opens,
/// so a taken port or a bad key fails start-up at once; so does an
/// address other hosts can reach without a token or credentials, unless
/// `keel.admin.allow.remote.without.auth` allows it.
async fn bind_admin(config: &BrokerConfig) -> Result<Option<AdminEndpoint>, String> {
    let addr = config.get("keel.admin.listen");
    if addr.is_empty() {
        tracing::info!("admin endpoint disabled (keel.admin.listen is empty)");
        return Ok(None);
    }
    let auth = admin::Auth::new(
        config.get("keel.admin.auth.bearer.token"),
        config.get("keel.admin.auth.basic.credentials"),
    );
    let tls = if config.get("keel.admin.ssl.enabled") == "true" {
        let settings = listeners::ssl_settings(config, "ADMIN").map_err(|e| e.to_string())?;
        Some(crate::tls::Reloading::new("ADMIN", settings)?)
    } else {
        None
    };
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("config `keel.admin.listen`: cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    if !local.ip().is_loopback()
        && auth.is_open()
        && config.get("keel.admin.allow.remote.without.auth") != "true"
    {
        return Err(format!(
            "config `keel.admin.listen`: {addr} can be reached from other hosts, and /stats and /metrics would \
             answer anyone: set keel.admin.auth.bearer.token or keel.admin.auth.basic.credentials, bind a \
             loopback address, or set keel.admin.allow.remote.without.auth=true to allow it"
        ));
    }
    let scheme = if tls.is_some() { "https" } else { "http" };
    let guarded = if auth.is_open() {
        ""
    } else {
        ", authorization required but for /healthz"
    };
    tracing::info!("admin endpoint on {scheme}://{local} (/stats, /metrics, /healthz{guarded})");
    Ok(Some((listener, auth, tls)))
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
/// request for that long is closed). The first two are dynamic broker
/// configs, read from the configuration in force at each accept. A
/// connection holds one request in flight, or a few small Produce requests
/// (`connection::PIPELINE_DEPTH`, `connection::PIPELINE_BYTES`), and one
/// frame of `socket.request.max.bytes` being read.
struct ConnectionLimits {
    open: AtomicUsize,
    /// Signalled when a connection closes.
    freed: Notify,
    idle: Option<Duration>,
    max_request_bytes: usize,
    by_ip: Mutex<HashMap<IpAddr, usize>>,
}

/// How often a full accept loop looks at `max.connections` again (it may
/// have been raised) when no connection closes.
const MAX_CONNECTIONS_RECHECK: Duration = Duration::from_secs(1);

impl ConnectionLimits {
    fn from_config(config: &BrokerConfig) -> Arc<ConnectionLimits> {
        let idle_ms = config.num("connections.max.idle.ms");
        Arc::new(ConnectionLimits {
            open: AtomicUsize::new(0),
            freed: Notify::new(),
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

    /// Waits until fewer than `max.connections` are open.
    async fn wait_for_slot(&self, broker: &Broker) {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let max = usize::try_from(broker.config().num("max.connections")).unwrap_or(usize::MAX);
            if self.open.load(Ordering::Acquire) < max {
                return;
            }
            let _ = tokio::time::timeout(MAX_CONNECTIONS_RECHECK, freed).await;
        }
    }

    /// Counts a connection from `ip`; false if that address has its fill
    /// (`per_ip`).
    fn admit(&self, ip: IpAddr, per_ip: usize) -> bool {
        let mut by_ip = self.by_ip.lock();
        let n = by_ip.entry(ip).or_insert(0);
        if *n >= per_ip {
            return false;
        }
        *n += 1;
        self.open.fetch_add(1, Ordering::AcqRel);
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
        self.open.fetch_sub(1, Ordering::AcqRel);
        self.freed.notify_waiters();
    }
}

/// How long a TLS handshake may take before the connection is closed.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

async fn accept_loop(bound: Bound, broker: Arc<Broker>, limits: Arc<ConnectionLimits>) {
    let Bound {
        listener: config,
        socket: listener,
        tls,
        sasl,
    } = bound;
    let name: Arc<str> = Arc::from(config.name.as_str());
    let sasl = match sasl.map(|s| SaslListener::new(s, Arc::clone(&broker.scram))) {
        None => None,
        Some(Ok(l)) => Some(Arc::new(l)),
        Some(Err(e)) => {
            tracing::error!(listener = %name, error = %e, "cannot set up SASL; the listener does not serve");
            return;
        }
    };
    loop {
        // At `max.connections`, stop accepting until one closes (clients
        // wait in the listen backlog, as with Kafka).
        limits.wait_for_slot(&broker).await;
        match listener.accept().await {
            Ok((stream, peer)) => {
                if let Some(hold) = broker.connection_throttle(peer.ip()) {
                    // Kafka's answer to a connection over its address's
                    // connection_creation_rate: nothing is read, and the
                    // close comes after the throttle time, which slows
                    // down a client that reconnects at once.
                    tracing::debug!(%peer, hold_ms = hold.as_millis(), "closing a connection over connection_creation_rate");
                    tokio::spawn(async move {
                        tokio::time::sleep(hold).await;
                        drop(stream);
                    });
                    continue;
                }
                let per_ip =
                    usize::try_from(broker.config().num("max.connections.per.ip")).unwrap_or(usize::MAX);
                if !limits.admit(peer.ip(), per_ip) {
                    tracing::warn!(%peer, max = per_ip, "closing a connection over max.connections.per.ip");
                    drop(stream);
                    continue;
                }
                let b = Arc::clone(&broker);
                let limits = Arc::clone(&limits);
                let tls = tls.clone();
                let sasl = sasl.clone();
                let name = Arc::clone(&name);
                tokio::spawn(async move {
                    b.metrics.connection_opened();
                    let closed = match secure(stream, tls.as_deref(), peer, &name).await {
                        Ok((transport, user)) => {
                            let client = ClientInfo {
                                host: format!("/{}", peer.ip()),
                                port: peer.port(),
                                listener: name.to_string(),
                                user: user.map(Arc::from),
                                sasl: sasl.map(ConnectionAuth::new),
                            };
                            let served =
                                connection::serve(transport, peer, &b, &client, limits.connection()).await;
                            // Its share sessions end with it.
                            b.connection_closed(&client);
                            served
                        }
                        Err(reason) => {
                            b.metrics.authentication_failed(&name);
                            Err(reason)
                        }
                    };
                    if let Err(reason) = closed {
                        tracing::debug!(%peer, %reason, "connection closed");
                    }
                    // Counted once its reason is logged: whoever sees the
                    // count fall finds the line in the log.
                    b.metrics.connection_closed();
                    limits.release(peer.ip());
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

/// The connection as its listener serves it, and the user it
/// authenticated as: after the TLS handshake on an SSL listener (a failed
/// one is logged and closes it).
async fn secure(
    stream: TcpStream,
    tls: Option<&crate::tls::Reloading>,
    peer: SocketAddr,
    listener: &str,
) -> Result<(connection::Transport, Option<String>), String> {
    let _ = stream.set_nodelay(true);
    let Some(tls) = tls else {
        return Ok((connection::Transport::Plain(stream), None));
    };
    match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, tls.acceptor().accept(stream)).await {
        Ok(Ok(stream)) => match tls.user(stream.get_ref().1.peer_certificates()) {
            Ok(user) => Ok((connection::Transport::Tls(Box::new(stream)), user)),
            Err(e) => {
                tracing::info!(%peer, listener, error = %e, "client certificate refused; closing the connection");
                Err(e)
            }
        },
        Ok(Err(e)) => {
            tracing::info!(%peer, listener, error = %e, "TLS handshake failed; closing the connection");
            Err(format!("TLS handshake: {e}"))
        }
        Err(_) => {
            tracing::info!(%peer, listener, "no TLS handshake within 10 s; closing the connection");
            Err("TLS handshake timed out".into())
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
