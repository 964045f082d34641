//! The data path: listeners inside each meshed pod's network namespace. Which pods, and
//! when, is [`crate::pods`]'s business: this module opens a pod's listeners and
//! redirection when asked ([`open`]) and serves what they accept.
//!
//! | port | what |
//! |---|---|
//! | 4140 | outbound: the pod's connections, redirected here, go to their original destination — through the mesh tunnel when it is a meshed pod, directly otherwise |
//! | 4143 | inbound mTLS: the mesh tunnel from other proxies; CONNECT streams are delivered to the pod |
//! | 4144 | inbound plaintext: clients outside the mesh, redirected here |
//!
//! Outbound connections are classified on their first bytes (HTTP/1, HTTP/2, else opaque;
//! ports marked opaque skip this). HTTP is proxied per request (balanced, counted, sent as
//! HTTP/2 through the tunnel); everything else is relayed as opaque TCP: on a kernel TLS
//! connection of its own, spliced (`transport`), or in a CONNECT stream of the tunnel.

mod accept;
mod accrual;
pub mod authz;
mod balance;
mod body;
mod classify;
mod client;
mod denied;
mod detect;
mod http;
mod http_metrics;
mod idle;
mod inbound;
mod metrics;
mod outbound;
mod read_ahead;
pub mod redirect;
mod resolve;
mod retry;
mod route;
pub mod route_metrics;
mod transport;
mod tunnel;
mod upgrade;

pub use balance::Balancer;
pub use detect::{classify, Protocol};
pub use http_metrics::HttpMetrics;
pub use metrics::{TcpMetrics, TrafficLabels};
pub use redirect::{Redirect, Redirector};
pub use resolve::Destinations;
pub use tunnel::TunnelPool;

use crate::discovery::{DiscoveryState, Workload};
use crate::identity::IdentityManager;
use crate::netns::Netns;
use crate::tls::TrustBundle;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use tokio::sync::watch;

// The eBPF programs were built with the same values: one definition, in ebpf/common.
/// Outbound capture port.
pub const OUTBOUND_PORT: u16 = ambit_ebpf::common::OUTBOUND_PORT;
/// Inbound mTLS (mesh tunnel) port.
pub const MESH_PORT: u16 = ambit_ebpf::common::MESH_PORT;
/// Inbound plaintext capture port.
pub const INBOUND_PLAIN_PORT: u16 = ambit_ebpf::common::INBOUND_PLAIN_PORT;
/// `SO_MARK` on every socket the proxy opens in a pod, so that redirection skips them.
pub const PROXY_MARK: u32 = ambit_ebpf::common::PROXY_MARK;
/// How soon opening a pod's listeners is tried again after it failed.
pub const START_RETRY: std::time::Duration = std::time::Duration::from_secs(5);
/// How often idle and dead tunnels are dropped from the pool ([`prune`]).
pub const PRUNE_EVERY: std::time::Duration = std::time::Duration::from_secs(60);
/// How long a departed pod's metric series stay, so that Prometheus scrapes them once more.
pub const DEPARTED_METRICS_TTL: std::time::Duration = std::time::Duration::from_secs(60);
/// Failed connections are counted each, logged at most 20 a second.
static FAILURE_LOGS: crate::limits::LogBudget = crate::limits::LogBudget::new(20);
/// Response header naming why the proxy failed a request, as Linkerd's `l5d-proxy-error`.
pub const ERROR_HEADER: &str = "ambit-proxy-error";

/// Why a proxied connection failed, and whose fault it was.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ProxyError {
    /// The peer could not be reached or refused.
    #[error("upstream: {0}")]
    Upstream(String),
    /// The peer did not answer in time.
    #[error("upstream timed out: {0}")]
    Timeout(String),
    /// No endpoint to send to (a Service without ready endpoints).
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// An identity could not be proven or was not the expected one.
    #[error("identity: {0}")]
    Identity(String),
    /// The client asked for something not allowed.
    #[error("client: {0}")]
    Client(String),
    /// Refused by configuration or policy.
    #[error("denied: {0}")]
    Denied(String),
    /// The destination Service has routes and none matches the request (HTTP 404, as
    /// Gateway API says).
    #[error("no route: {0}")]
    NoRoute(String),
    /// The matching route cannot send anywhere: every backend has weight 0, or the one
    /// drawn does not exist (HTTP 500, as Gateway API says).
    #[error("route: {0}")]
    BadRoute(String),
    /// Our own failure.
    #[error("internal: {0}")]
    Internal(String),
}

impl ProxyError {
    /// A short label for `tcp_errors_total{error}`.
    pub fn kind(&self) -> &'static str {
        match self {
            ProxyError::Upstream(_) => "upstream",
            ProxyError::Timeout(_) => "timeout",
            ProxyError::Unavailable(_) => "unavailable",
            ProxyError::Identity(_) => "identity",
            ProxyError::Client(_) => "client",
            ProxyError::Denied(_) => "denied",
            ProxyError::NoRoute(_) => "no_route",
            ProxyError::BadRoute(_) => "bad_route",
            ProxyError::Internal(_) => "internal",
        }
    }
}

/// What every pod's listeners share.
#[derive(Clone, Debug)]
pub struct Shared {
    /// Certificates of the local identities.
    pub identities: IdentityManager,
    /// The cluster as discovery knows it.
    pub state: watch::Receiver<Arc<DiscoveryState>>,
    /// Trust anchors.
    pub bundle: TrustBundle,
    /// Pooled tunnels.
    pub pool: TunnelPool,
    /// TCP metrics.
    pub metrics: TcpMetrics,
    /// HTTP metrics.
    pub http: HttpMetrics,
    /// Endpoint latency and load.
    pub balancer: Balancer,
    /// How long protocol detection waits for the first bytes.
    pub detect_timeout: std::time::Duration,
    /// How long a departed pod's metric series are kept (for a last scrape).
    pub departed_metrics_ttl: std::time::Duration,
    /// How pod traffic reaches the listeners.
    pub redirector: Redirector,
    /// Connection budgets.
    pub limits: crate::limits::Limits,
    /// How long an application's HTTP connection may stay silent.
    pub http_idle_timeout: std::time::Duration,
    /// Whether a pod may reach destinations discovery does not know.
    pub outbound_unknown: OutboundUnknown,
    /// Every local pod's inbound policy.
    pub policy: watch::Receiver<Arc<crate::policy::PolicyState>>,
    /// Authorization decisions.
    pub authz: authz::AuthzMetrics,
    /// Route metrics (`outbound_{http,grpc}_route_*`).
    pub routes: route_metrics::RouteMetrics,
    /// Each route's retry budget.
    pub budgets: retry::Budgets,
    /// Whether opaque streams to peer proxies take kernel TLS (`transport`).
    pub kernel_tls: crate::ktls::KernelTls,
    /// Destinations discovery does not know yet: subscribed, then waited for.
    pub destinations: resolve::Destinations,
}

/// What happens to a pod's connection to an address discovery does not know (not a
/// Service, not a pod): `--outbound-unknown`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OutboundUnknown {
    /// Connect as asked, in plaintext (an address outside the cluster).
    #[default]
    Allow,
    /// Refuse: only destinations discovery knows (also before discovery has delivered its
    /// first snapshot), as Istio's `REGISTRY_ONLY`.
    Deny,
}

impl OutboundUnknown {
    /// `Err` when `dst` may not be reached.
    pub fn check(self, dst: SocketAddr) -> Result<(), ProxyError> {
        match self {
            OutboundUnknown::Allow => Ok(()),
            OutboundUnknown::Deny => Err(ProxyError::Denied(format!(
                "{dst} is not a destination discovery knows (--outbound-unknown deny)"
            ))),
        }
    }
}

/// One meshed pod served by this proxy.
#[derive(Debug)]
pub struct PodContext {
    /// The pod.
    pub workload: Arc<Workload>,
    /// Its network namespace.
    pub netns: Arc<Netns>,
    /// The netns cookie (eBPF keys the original destination by it).
    pub netns_cookie: u64,
    /// HTTP clients connecting from it.
    pub clients: client::PodClients,
    /// Turns true when the pod leaves or the proxy drains.
    pub stopped: watch::Receiver<bool>,
    /// The connections its listeners may hold at once.
    pub budget: Arc<tokio::sync::Semaphore>,
}

/// Drops what the data path keeps for destinations discovery no longer knows: their
/// balancer state, tunnels and per-pod HTTP clients (and idle or dead tunnels, and
/// clients of destinations outside the cluster unused for a while). Call it on each
/// discovery change and every [`PRUNE_EVERY`].
pub fn prune<'a>(
    shared: &Shared,
    state: &DiscoveryState,
    pods: impl IntoIterator<Item = &'a PodContext>,
) {
    let known = state.known_ips();
    shared
        .balancer
        .retain(|a: &SocketAddr| known.contains(&a.ip()));
    shared.pool.prune(|ip| known.contains(&ip));
    for pod in pods {
        let own = &pod.workload.ips;
        pod.clients.prune(
            |a| known.contains(&a.ip()) || own.contains(&a.ip()),
            tunnel::POOL_IDLE,
        );
    }
}

/// A pod's listeners for one address family: what [`open`] binds, or what a running
/// proxy handed over (`crate::handover`).
#[derive(Clone, Debug)]
pub struct PodListeners {
    /// Whether these are the IPv6 ones.
    pub ipv6: bool,
    /// 4140, on loopback.
    pub outbound: Arc<tokio::net::TcpListener>,
    /// 4143.
    pub mesh: Arc<tokio::net::TcpListener>,
    /// 4144.
    pub plain: Arc<tokio::net::TcpListener>,
}

/// A pod's listeners, open and accepting, and its redirection in place.
#[derive(Debug)]
pub struct ServedPod {
    /// What its connections share.
    pub pod: Arc<PodContext>,
    /// Its listening sockets (shared with the accept loops), for a hand-over.
    pub listeners: Vec<PodListeners>,
    stop: watch::Sender<bool>,
    /// The accept loops; they end soon after `stop`.
    loops: Vec<tokio::task::JoinHandle<()>>,
}

impl ServedPod {
    /// Stops accepting (its redirection stays: the pod's connections are refused) and
    /// returns once every listener is closed — unless another process holds them too (a
    /// hand-over: it accepts from then on); open connections finish on their own, told
    /// to wind down (GOAWAY, `connection: close`).
    pub async fn close(self) -> Arc<PodContext> {
        self.stop.send_replace(true);
        for l in self.loops {
            let _ = l.await;
        }
        self.pod
    }
}

impl PodContext {
    /// Removes the pod's redirection (its listeners are closed: the pod left the mesh).
    pub async fn remove_redirection(&self, redirector: &Redirector) -> std::io::Result<()> {
        redirector
            .remove(&self.netns, &self.workload, self.netns_cookie)
            .await
    }
}

/// Opens `workload`'s listeners in `netns` (4140 on loopback, 4143 and 4144) — or takes
/// `handed`, the same listeners a running proxy handed over — then its redirection, and
/// starts accepting.
pub async fn open(
    shared: &Arc<Shared>,
    workload: Arc<Workload>,
    netns: Netns,
    handed: Option<Vec<PodListeners>>,
) -> std::io::Result<ServedPod> {
    let path = netns.path().to_path_buf();
    let listeners = match handed {
        Some(listeners) => {
            tracing::info!(pod = %workload.key(), netns = %path.display(), redirect = shared.redirector.mode(), "accepting on the listeners handed over");
            listeners
        }
        None => bind_listeners(&workload, &netns).await?,
    };
    // Listeners first, redirection second: a redirected connection always finds a
    // listener.
    let families: Vec<_> = listeners
        .iter()
        .map(|l| redirect::FamilyListeners {
            ipv6: l.ipv6,
            outbound: &l.outbound,
            mesh: &l.mesh,
            plain: &l.plain,
        })
        .collect();
    let netns_cookie = shared
        .redirector
        .install(&netns, &workload, &families)
        .await?;
    let netns = Arc::new(netns);
    let clients = client::PodClients::new(netns.clone());
    let (stop, stopped) = watch::channel(false);
    let pod = Arc::new(PodContext {
        workload,
        netns,
        netns_cookie,
        clients,
        stopped: stopped.clone(),
        budget: shared.limits.pod_budget(),
    });
    // One task accepts on all the pod's listeners (`accept`).
    let loops = vec![tokio::spawn(accept::serve_pod(
        listeners.clone(),
        pod.clone(),
        shared.clone(),
        stopped,
    ))];
    Ok(ServedPod {
        pod,
        listeners,
        stop,
        loops,
    })
}

/// Binds a pod's listeners in its netns: IPv4 always, IPv6 too when the pod has an IPv6
/// address (dual-stack clusters).
async fn bind_listeners(workload: &Workload, netns: &Netns) -> std::io::Result<Vec<PodListeners>> {
    let mut unspecified = vec![IpAddr::V4(Ipv4Addr::UNSPECIFIED)];
    if workload.ips.iter().any(IpAddr::is_ipv6) {
        unspecified.push(IpAddr::V6(Ipv6Addr::UNSPECIFIED));
    }
    let mut listeners = Vec::new();
    for ip in &unspecified {
        let bind = |port| netns.bind(SocketAddr::new(*ip, port));
        // Outbound on loopback only: redirection (eBPF and nftables alike) sends the pod's
        // connections to loopback:4140, and nothing from outside the pod may reach it.
        let loopback = match ip {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        };
        listeners.push(PodListeners {
            ipv6: ip.is_ipv6(),
            outbound: Arc::new(netns.bind(SocketAddr::new(loopback, OUTBOUND_PORT)).await?),
            mesh: Arc::new(bind(MESH_PORT).await?),
            plain: Arc::new(bind(INBOUND_PLAIN_PORT).await?),
        });
    }
    tracing::info!(pod = %workload.key(), netns = %netns.path().display(), families = unspecified.len(), "listening in the pod: loopback:4140 outbound, 4143 mesh, 4144 plaintext");
    Ok(listeners)
}

/// TCP keepalive on every connection the proxy holds, so that a peer that vanished (a node
/// gone, a pod killed without a FIN) is noticed and its connection closed: probes after a
/// minute of silence, every 10 s, 6 unanswered close it (about two minutes in all).
pub fn keepalive(stream: &tokio::net::TcpStream) -> std::io::Result<()> {
    let ka = socket2::TcpKeepalive::new()
        .with_time(std::time::Duration::from_secs(60))
        .with_interval(std::time::Duration::from_secs(10))
        .with_retries(6);
    socket2::SockRef::from(stream).set_tcp_keepalive(&ka)
}

/// The proxy's own ports in a pod: never a destination a client may ask for (a tunnel or
/// plaintext connection "to 4140" would reach the outbound listener from outside the pod
/// and borrow another connection's original destination; one to 4143/4144 would loop).
pub fn is_proxy_port(port: u16) -> bool {
    matches!(port, OUTBOUND_PORT | MESH_PORT | INBOUND_PLAIN_PORT)
}

/// Copy buffer per direction of a relayed connection. 8 KiB (tokio's default) cost a TLS
/// record and an HTTP/2 frame per 8 KiB; see BENCHMARKS.md for what larger ones bought.
pub const RELAY_BUFFER: usize = 64 * 1024;
/// HTTP/2 flow-control windows of the tunnel: large enough that one stream can fill a
/// fast link without waiting for WINDOW_UPDATEs.
pub const H2_STREAM_WINDOW: u32 = 4 * 1024 * 1024;
/// Connection-level window of the tunnel.
pub const H2_CONN_WINDOW: u32 = 16 * 1024 * 1024;
/// Largest HTTP/2 frame the tunnel accepts.
pub const H2_MAX_FRAME: u32 = 256 * 1024;
/// Streams one peer proxy may have open at once on one tunnel connection: each proxied
/// connection or request from one identity to one pod is a stream, so this is generous;
/// the pod's connection budget bounds the total.
pub const H2_MESH_MAX_STREAMS: u32 = 10_000;
/// Streams an application's own HTTP/2 connection may have open at once (gRPC servers
/// commonly allow 100; Envoy's default is 2^31).
pub const H2_APP_MAX_STREAMS: u32 = 1_000;
/// Streams a client may open and reset before the server has accepted them, beyond which
/// the connection is closed with GOAWAY (rapid reset, CVE-2023-44487).
pub const H2_MAX_PENDING_RESETS: usize = 50;
/// Streams the server may reset because the client misbehaved before it closes the
/// connection (`h2`'s own default, set explicitly).
pub const H2_MAX_ERROR_RESETS: usize = 1024;
/// Largest header block (HEADERS plus CONTINUATION) accepted; beyond it the stream is
/// refused, so a CONTINUATION flood cannot grow a header block without end.
pub const H2_MAX_HEADER_LIST: u32 = 64 * 1024;

/// How long a write to an HTTP peer may make no progress before the connection is dropped:
/// the idle timeout, at most a minute (a peer that stops reading holds nothing longer,
/// graceful shutdown included).
pub fn write_stall_limit(shared: &Shared) -> std::time::Duration {
    shared
        .http_idle_timeout
        .min(std::time::Duration::from_secs(60))
}

/// An HTTP/2 server with every limit set explicitly (hyper's defaults leave the stream
/// count unlimited).
pub fn h2_server(
    max_streams: u32,
) -> hyper::server::conn::http2::Builder<hyper_util::rt::TokioExecutor> {
    let mut b = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
    b.timer(hyper_util::rt::TokioTimer::new())
        .max_concurrent_streams(max_streams)
        .max_pending_accept_reset_streams(H2_MAX_PENDING_RESETS)
        .max_local_error_reset_streams(H2_MAX_ERROR_RESETS)
        .max_header_list_size(H2_MAX_HEADER_LIST);
    b
}

/// Copies both ways until both sides have closed, passing half-closes through; returns
/// the bytes read from and written to `client`.
pub async fn relay<A, B>(client: &mut A, server: &mut B) -> (u64, u64)
where
    A: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + ?Sized,
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + ?Sized,
{
    match tokio::io::copy_bidirectional_with_sizes(client, server, RELAY_BUFFER, RELAY_BUFFER).await
    {
        Ok((from_client, to_client)) => (from_client, to_client),
        Err(error) => {
            tracing::debug!(%error, "connection ended with an error");
            (0, 0)
        }
    }
}

/// Records a connection's destination in its span (see [`accept`]).
pub(crate) fn record_dst(dst: SocketAddr) {
    tracing::Span::current().record("dst", tracing::field::display(dst));
}
