//! The data path: listeners inside each meshed pod's network namespace.
//!
//! | port | what |
//! |---|---|
//! | 4140 | outbound: the pod's connections, redirected here, go to their original destination — through the mesh tunnel when it is a meshed pod, directly otherwise |
//! | 4143 | inbound mTLS: the mesh tunnel from other proxies; CONNECT streams are delivered to the pod |
//! | 4144 | inbound plaintext: clients outside the mesh, redirected here |
//!
//! Outbound connections are classified on their first bytes (HTTP/1, HTTP/2, else opaque;
//! ports marked opaque skip this). HTTP is proxied per request (balanced, counted, sent as
//! HTTP/2 through the tunnel); everything else is relayed as opaque TCP in a CONNECT
//! stream.

mod balance;
mod body;
mod client;
mod detect;
mod http;
mod http_metrics;
mod inbound;
mod metrics;
mod outbound;
pub mod redirect;
mod tunnel;
mod upgrade;

pub use balance::Balancer;
pub use detect::{classify, Protocol};
pub use http_metrics::HttpMetrics;
pub use metrics::{TcpMetrics, TrafficLabels};
pub use redirect::{Redirect, Redirector};
pub use tunnel::TunnelPool;

use crate::cni::CniPods;
use crate::discovery::{DiscoveryState, Workload};
use crate::identity::IdentityManager;
use crate::netns::Netns;
use crate::tls::TrustBundle;
use std::collections::BTreeMap;
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
/// How long a departed pod's metric series stay, so that Prometheus scrapes them once more.
pub const DEPARTED_METRICS_TTL: std::time::Duration = std::time::Duration::from_secs(60);
/// Response header naming why the proxy failed a request, as Linkerd's `l5d-proxy-error`.
pub const ERROR_HEADER: &str = "ambit-proxy-error";

/// Why a proxied connection failed, and whose fault it was.
#[derive(Debug, thiserror::Error)]
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
    /// Pods handed over by the CNI plugin (their netns and addresses).
    pub cni_pods: watch::Receiver<CniPods>,
    /// Pods whose listeners are open, for `/ready` and the CNI plugin.
    pub serving: ServingPods,
}

/// Every pod whose listeners (and redirection) are in place: `<namespace>/<name>` and the
/// netns they were opened in. A watch, so that the CNI socket can wait for a change.
pub type ServingPods = Arc<watch::Sender<BTreeMap<String, std::path::PathBuf>>>;

/// The local pods to serve: meshed pods on `node` that the CNI plugin handed over (with
/// the netns and addresses it gave), or that name their netns themselves (local mode).
pub fn pods_to_serve(
    state: &DiscoveryState,
    cni: &CniPods,
    node: &str,
) -> BTreeMap<String, Arc<Workload>> {
    state
        .local_workloads(node)
        .into_iter()
        .filter_map(|w| match cni.get(&w.key()) {
            Some(pod) => {
                let mut w = (*w).clone();
                w.netns = Some(pod.netns.clone());
                if !pod.ips.is_empty() {
                    w.ips = pod.ips.clone();
                }
                Some((w.key(), Arc::new(w)))
            }
            None => w.netns.is_some().then(|| (w.key(), w)),
        })
        .collect()
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
}

struct Running {
    pod: Arc<PodContext>,
    stop: watch::Sender<bool>,
    /// The accept loops; they end (closing the listeners) soon after `stop`.
    loops: Vec<tokio::task::JoinHandle<()>>,
}

/// Opens listeners in each local pod's netns as pods arrive, closes them as pods leave.
pub async fn serve_pods(
    shared: Shared,
    node: String,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut state = shared.state.clone();
    let mut cni = shared.cni_pods.clone();
    let mut running: BTreeMap<String, Running> = BTreeMap::new();
    loop {
        let mut failed = false;
        let s = state.borrow_and_update().clone();
        // Endpoints that left discovery leave the balancer too.
        let known = s.known_ips();
        shared
            .balancer
            .retain(|a: &SocketAddr| known.contains(&a.ip()));
        let want = pods_to_serve(&s, &cni.borrow_and_update().clone(), &node);
        let leaving: Vec<String> = running
            .iter()
            .filter(|(key, r)| {
                !want
                    .get(*key)
                    .is_some_and(|w| w.netns == r.pod.workload.netns && w.ips == r.pod.workload.ips)
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in leaving {
            let Some(r) = running.remove(&key) else {
                continue;
            };
            tracing::info!(pod = %key, "pod left; closing its listeners");
            r.stop.send_replace(true);
            let pod = &r.pod;
            forget_later(&shared, &pod.workload, state.clone(), node.clone());
            // A pod that is no longer meshed must not keep redirection that points at
            // listeners that are gone. Done before any pod starts: a new sandbox of the
            // same pod may take the same addresses.
            if let Err(error) = shared
                .redirector
                .remove(&pod.netns, &pod.workload, pod.netns_cookie)
                .await
            {
                tracing::debug!(pod = %key, %error, "redirection not removed (netns gone?)");
            }
        }
        for (key, w) in want {
            if running.contains_key(&key) {
                continue;
            }
            match start_pod(&shared, w.clone()).await {
                Ok(r) => {
                    running.insert(key, r);
                }
                Err(error) => {
                    failed = true;
                    tracing::error!(pod = %key, %error, retry_in = ?START_RETRY, "cannot open listeners in the pod's network namespace")
                }
            }
        }
        shared.serving.send_replace(
            running
                .iter()
                .map(|(k, r)| (k.clone(), r.pod.netns.path().to_path_buf()))
                .collect(),
        );
        // A pod whose netns could not be entered (not there yet, a port taken) is tried
        // again after a while even if discovery has nothing new to say.
        let retry = async {
            if failed {
                tokio::time::sleep(START_RETRY).await
            } else {
                std::future::pending().await
            }
        };
        tokio::select! {
            _ = &mut shutdown => break,
            changed = state.changed() => if changed.is_err() { break },
            changed = cni.changed() => if changed.is_err() { break },
            _ = retry => {}
        }
    }
    // Shutting down: stop accepting everywhere, and return only once every listener is
    // closed, so that a stopped proxy leaves nothing that accepts (fail closed).
    for r in running.values() {
        r.stop.send_replace(true);
    }
    for r in running.into_values() {
        for l in r.loops {
            let _ = l.await;
        }
    }
}

/// Drops a departed pod's series after the TTL, unless it is back on the node by then.
fn forget_later(
    shared: &Shared,
    w: &Workload,
    state: watch::Receiver<Arc<DiscoveryState>>,
    node: String,
) {
    let (shared, key, ns, pod) = (shared.clone(), w.key(), w.namespace.clone(), w.name.clone());
    tokio::spawn(async move {
        tokio::time::sleep(shared.departed_metrics_ttl).await;
        let back = state
            .borrow()
            .local_workloads(&node)
            .iter()
            .any(|w| w.key() == key);
        if !back {
            shared.metrics.forget_pod(&ns, &pod);
            shared.http.forget_pod(&ns, &pod);
        }
    });
}

async fn start_pod(shared: &Shared, workload: Arc<Workload>) -> std::io::Result<Running> {
    let path = workload.netns.clone().unwrap_or_default();
    let netns = Netns::open(&path)?;
    // IPv4 always; IPv6 too when the pod has an IPv6 address (dual-stack clusters).
    let mut unspecified = vec![IpAddr::V4(Ipv4Addr::UNSPECIFIED)];
    if workload.ips.iter().any(IpAddr::is_ipv6) {
        unspecified.push(IpAddr::V6(Ipv6Addr::UNSPECIFIED));
    }
    let mut listeners = Vec::new();
    for ip in &unspecified {
        let bind = |port| netns.bind(SocketAddr::new(*ip, port));
        listeners.push((
            bind(OUTBOUND_PORT).await?,
            bind(MESH_PORT).await?,
            bind(INBOUND_PLAIN_PORT).await?,
        ));
    }
    tracing::info!(pod = %workload.key(), netns = %path.display(), families = unspecified.len(), redirect = shared.redirector.mode(), "listening in the pod: 4140 outbound, 4143 mesh, 4144 plaintext");
    // Listeners first, redirection second: a redirected connection always finds a
    // listener.
    let families: Vec<_> = listeners
        .iter()
        .zip(&unspecified)
        .map(|((outbound, mesh, plain), ip)| redirect::FamilyListeners {
            ipv6: ip.is_ipv6(),
            outbound,
            mesh,
            plain,
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
    });
    let mut loops = Vec::new();
    for (outbound, mesh, plain) in listeners {
        loops.push(tokio::spawn(outbound::serve(
            outbound,
            pod.clone(),
            shared.clone(),
            stopped.clone(),
        )));
        loops.push(tokio::spawn(inbound::serve_mesh(
            mesh,
            pod.clone(),
            shared.clone(),
            stopped.clone(),
        )));
        loops.push(tokio::spawn(inbound::serve_plain(
            plain,
            pod.clone(),
            shared.clone(),
            stopped.clone(),
        )));
    }
    Ok(Running { pod, stop, loops })
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

/// Accepts until `stop` turns true and runs `handle` on each connection in its own task; a
/// failure is counted in `tcp_errors_total{direction}` and logged with the pod and peer.
pub(crate) async fn serve_each<F, Fut>(
    listener: tokio::net::TcpListener,
    stop: watch::Receiver<bool>,
    pod: Arc<PodContext>,
    shared: Shared,
    direction: &'static str,
    handle: F,
) where
    F: Fn(tokio::net::TcpStream, SocketAddr, Arc<PodContext>, Shared) -> Fut,
    Fut: std::future::Future<Output = Result<(), ProxyError>> + Send + 'static,
{
    accept_loop(listener, stop, move |stream, peer| {
        let failed = handle(stream, peer, pod.clone(), shared.clone());
        let (pod, shared) = (pod.clone(), shared.clone());
        async move {
            if let Err(error) = failed.await {
                shared.metrics.error(direction, error.kind());
                tracing::info!(pod = %pod.workload.key(), %peer, direction, %error, "connection failed");
            }
        }
    })
    .await;
}

/// Accepts until `stop` turns true, spawning `handle` per connection.
pub(crate) async fn accept_loop<F, Fut>(
    listener: tokio::net::TcpListener,
    mut stop: watch::Receiver<bool>,
    handle: F,
) where
    F: Fn(tokio::net::TcpStream, SocketAddr) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    loop {
        tokio::select! {
            _ = async { drop(stop.wait_for(|s| *s).await) } => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(handle(stream, peer));
                }
                Err(error) => {
                    // EMFILE and friends: back off briefly rather than spin.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
        }
    }
}
