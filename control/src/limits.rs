//! What a client can hold of the control plane, bounded (issue 10, "Nothing grows without
//! bound"): connections per listener, HTTP/2 streams, resets and headers per connection,
//! and how long a silent or dead peer keeps any of it.
//!
//! The sizes assume a production control plane serving a few thousand node proxies, each
//! holding one identity connection (many short certificate requests, a burst when the
//! proxy starts) and one discovery connection (one long-lived stream).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Default of `--max-connections`: open connections per gRPC listener (identity and
/// discovery each). Each node proxy holds one on each, and Kubernetes supports clusters
/// of up to 5,000 nodes; twice that leaves room for proxies reconnecting before their old,
/// dead connection is noticed (see [`HTTP2_KEEPALIVE_INTERVAL`]). Each open connection
/// costs a descriptor, TLS buffers and HTTP/2 state, so an unbounded number is a way to
/// exhaust the control plane's memory or descriptors from anywhere that can reach it.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;

/// Connections one source address may hold on one listener: a node proxy holds one on
/// each (a second while it reconnects), so 16 is ample; without it, anyone on the pod
/// network could fill a listener's 10,000 places before presenting any token, and lock the
/// node proxies out of renewals. Loopback sources (the control plane's own pod) are exempt.
pub const MAX_CONNECTIONS_PER_SOURCE: usize = 16;

/// Largest `--max-connections` accepted: beyond it the limit would be the process's
/// descriptor limit anyway.
pub const MAX_MAX_CONNECTIONS: usize = 1_000_000;

/// Open connections to the admin server (:9990). Its clients are a few Prometheus
/// scrapers and the kubelet's probes, each a connection or two; 256 is ample for them and
/// small enough that connections held open cannot exhaust anything.
pub const ADMIN_MAX_CONNECTIONS: usize = 256;

/// How long an admin client may take to send a request's head (its request line and
/// headers), and how long an idle keep-alive connection waits for the next one. Scrapers
/// and probes send a request at once in a packet or two; a slowloris that trickles bytes
/// (or sends none) is closed after this, so it holds a connection for 5 s, not forever.
pub const ADMIN_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// How long an admin answer may wait for a client that does not read it: a scraper reads
/// at once; a client that pipelines requests and never reads would otherwise hold its
/// connection (and, 256 of them, the admin server) for good.
pub const ADMIN_WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// `SETTINGS_MAX_CONCURRENT_STREAMS` on the gRPC servers (tonic's default is unlimited).
/// A discovery connection carries one stream; an identity connection carries one request
/// per identity the proxy renews, all at once when it starts (up to a node's pods, 110 by
/// default): beyond 100, the proxy's requests wait for a stream rather than fail. 100 is
/// RFC 9113's recommended minimum.
pub const MAX_CONCURRENT_STREAMS: u32 = 100;

/// Requests of one connection handled at once (tonic's `concurrency_limit_per_connection`;
/// further streams wait their turn). Certificate signing is CPU-bound: 32 at once keep
/// every core of the control plane busy, so one proxy's burst cannot take more than its
/// share from the others.
pub const CONCURRENCY_LIMIT_PER_CONNECTION: usize = 32;

/// Streams a client may open and reset before the server accepted them, before the
/// connection is closed with GOAWAY `ENHANCE_YOUR_CALM`: the HTTP/2 rapid reset attack
/// (CVE-2023-44487) opens and cancels streams to make the server start work it never
/// finishes. 20 is h2's own default, set here so that no dependency upgrade drops it.
pub const HTTP2_MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 20;

/// Streams the server may reset because the client broke the protocol, before the
/// connection is closed: the "MadeYouReset" attack (CVE-2025-8671) makes the server
/// reset streams itself. hyper's default is 1,024, but tonic's builder turns the limit
/// off unless it is set; a correct proxy causes none.
pub const HTTP2_MAX_LOCAL_ERROR_RESET_STREAMS: usize = 1024;

/// `SETTINGS_MAX_HEADER_LIST_SIZE`: the largest request head, decoded. A proxy's request
/// carries its node token in `authorization` (a projected ServiceAccount token, 1–2 KiB)
/// and little else; 16 KiB leaves room for larger tokens and bounds what HPACK decoding
/// can make the server allocate per stream.
pub const MAX_HEADER_LIST_SIZE: u32 = 16 * 1024;

/// HTTP/2 PING interval on the gRPC servers. A proxy whose node died without closing its
/// connections (power loss, partition) would keep its discovery stream, and the deltas
/// queued for it, forever; a PING every 30 s costs two small frames per proxy per half
/// minute (5,000 proxies: ~170 frames/s).
pub const HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);

/// How long a PING may go unanswered before the connection is closed: a dead proxy is
/// noticed within 40 s. A live proxy answers in a round trip, however busy.
pub const HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// TCP keepalive on accepted gRPC connections: first probe after 60 s idle, then every
/// 10 s, 3 probes. A backstop under HTTP/2 PINGs: it also covers a connection whose
/// HTTP/2 is wedged, and drops a dead peer in ~90 s instead of Linux's default 2 h 11 min.
pub const TCP_KEEPALIVE_TIME: Duration = Duration::from_secs(60);
/// See [`TCP_KEEPALIVE_TIME`].
pub const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// See [`TCP_KEEPALIVE_TIME`].
pub const TCP_KEEPALIVE_RETRIES: u32 = 3;

/// At most one log line per listener per this long about refused connections: a flood of
/// connections must not become a flood of log lines.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// A tonic server builder with this module's HTTP/2 limits. TCP keepalive and
/// `TCP_NODELAY` are set on each accepted socket by [`configure_socket`]: tonic applies its
/// own `tcp_keepalive`/`tcp_nodelay` only to listeners it binds itself, and ours are
/// handed to it already accepted (`serve_with_incoming`).
pub fn grpc_server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .concurrency_limit_per_connection(CONCURRENCY_LIMIT_PER_CONNECTION)
        .http2_max_pending_accept_reset_streams(Some(HTTP2_MAX_PENDING_ACCEPT_RESET_STREAMS))
        .http2_max_local_error_reset_streams(Some(HTTP2_MAX_LOCAL_ERROR_RESET_STREAMS))
        .http2_max_header_list_size(MAX_HEADER_LIST_SIZE)
        .http2_keepalive_interval(Some(HTTP2_KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(HTTP2_KEEPALIVE_TIMEOUT))
}

/// `TCP_NODELAY` and TCP keepalive on an accepted gRPC connection.
pub fn configure_socket(tcp: &TcpStream) -> std::io::Result<()> {
    // gRPC exchanges are small: without TCP_NODELAY, Nagle and delayed ACKs stall each
    // one ~40 ms (measured: 363 → 9,700 certificates/s; BENCHMARKS.md).
    tcp.set_nodelay(true)?;
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(TCP_KEEPALIVE_TIME)
        .with_interval(TCP_KEEPALIVE_INTERVAL)
        .with_retries(TCP_KEEPALIVE_RETRIES);
    socket2::SockRef::from(tcp).set_tcp_keepalive(&keepalive)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerLabels {
    server: &'static str,
}

/// Connections refused over a listener's limit, and connections open, by server.
#[derive(Clone, Debug, Default)]
pub struct ConnectionMetrics {
    refused: Family<ServerLabels, Counter>,
    open: Family<ServerLabels, Gauge>,
}

impl ConnectionMetrics {
    /// Creates the metrics and registers them.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "control_connections_refused",
            "Connections closed at once because the listener had its limit open, by server (identity, discovery, admin)",
            m.refused.clone(),
        );
        registry.register(
            "control_connections_open",
            "Connections open (TLS handshakes included), by server (identity, discovery, admin)",
            m.open.clone(),
        );
        m
    }
}

/// The connection limit of one listener. Owned by its accept loop.
#[derive(Debug)]
pub struct ConnectionLimit {
    server: &'static str,
    max: usize,
    permits: Arc<Semaphore>,
    refused: Counter,
    open: Gauge,
    /// Connections open by source address (loopback not counted).
    by_source: BySource,
    per_source: usize,
    /// When a refusal was last logged, and how many were not logged since.
    last_logged: Option<Instant>,
    unlogged: u64,
}

impl ConnectionLimit {
    /// At most `max` connections at once on `server`'s listener (`max` at least 1).
    pub fn new(server: &'static str, max: usize, metrics: &ConnectionMetrics) -> Self {
        let labels = ServerLabels { server };
        let max = max.clamp(1, MAX_MAX_CONNECTIONS);
        Self {
            server,
            max,
            permits: Arc::new(Semaphore::new(max)),
            refused: metrics.refused.get_or_create(&labels).clone(),
            open: metrics.open.get_or_create(&labels).clone(),
            by_source: Arc::default(),
            per_source: MAX_CONNECTIONS_PER_SOURCE,
            last_logged: None,
            unlogged: 0,
        }
    }

    /// A permit for a connection just accepted from `peer`, or `None` if the listener has
    /// its limit open: the caller then drops the connection at once. A refused connection
    /// is reset (`SO_LINGER` 0), so that a flood of them leaves no `TIME_WAIT` behind.
    pub fn admit(&mut self, tcp: &TcpStream, peer: SocketAddr) -> Option<ConnectionPermit> {
        let source = self.take_source(peer.ip());
        if let (Some(source), Ok(permit)) = (source, self.permits.clone().try_acquire_owned()) {
            self.open.inc();
            return Some(ConnectionPermit {
                _permit: permit,
                _source: source,
                open: self.open.clone(),
            });
        }
        self.refused.inc();
        let _ = socket2::SockRef::from(tcp).set_linger(Some(Duration::ZERO));
        self.unlogged += 1;
        let now = Instant::now();
        if self
            .last_logged
            .is_none_or(|t| now.duration_since(t) >= REFUSAL_LOG_INTERVAL)
        {
            tracing::warn!(
                server = self.server,
                limit = self.max,
                %peer,
                refused = self.unlogged,
                "connection limit reached: refusing connections (count since the last such message; all in control_connections_refused_total)"
            );
            self.last_logged = Some(now);
            self.unlogged = 0;
        }
        None
    }
}

impl ConnectionLimit {
    /// A place for one more connection from `ip`, unless it holds [`MAX_CONNECTIONS_PER_SOURCE`].
    fn take_source(&self, ip: std::net::IpAddr) -> Option<SourcePlace> {
        let ip = match ip {
            std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, std::net::IpAddr::V4),
            v4 => v4,
        };
        if ip.is_loopback() {
            return Some(SourcePlace(None));
        }
        let mut by = self
            .by_source
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = by.entry(ip).or_default();
        if *n >= self.per_source {
            return None;
        }
        *n += 1;
        Some(SourcePlace(Some((ip, self.by_source.clone()))))
    }
}

/// Connections open by source address.
type BySource = Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>;

/// One connection's place in its source's count (none for loopback).
#[derive(Debug)]
struct SourcePlace(Option<(std::net::IpAddr, BySource)>);

impl Drop for SourcePlace {
    fn drop(&mut self) {
        if let Some((ip, by)) = self.0.take() {
            let mut by = by.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(n) = by.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    by.remove(&ip);
                }
            }
        }
    }
}

/// Held by an open connection; frees its place when dropped.
#[derive(Debug)]
pub struct ConnectionPermit {
    _permit: OwnedSemaphorePermit,
    _source: SourcePlace,
    open: Gauge,
}

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        self.open.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_listener_admits_up_to_its_limit_counts_refusals_and_frees_places() {
        let mut registry = Registry::default();
        let metrics = ConnectionMetrics::register(&mut registry);
        let mut limit = ConnectionLimit::new("identity", 2, &metrics);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut clients = Vec::new();
        let mut accepted = Vec::new();
        for _ in 0..4 {
            clients.push(TcpStream::connect(addr).await.unwrap());
            accepted.push(listener.accept().await.unwrap());
        }
        let (a, peer) = &accepted[0];
        let first = limit.admit(a, *peer);
        let second = limit.admit(&accepted[1].0, accepted[1].1);
        assert!(first.is_some() && second.is_some());
        assert!(limit.admit(&accepted[2].0, accepted[2].1).is_none());
        assert!(limit.admit(&accepted[3].0, accepted[3].1).is_none());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("control_connections_refused_total{server=\"identity\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("control_connections_open{server=\"identity\"} 2"),
            "{text}"
        );
        drop(first);
        assert!(limit.admit(&accepted[2].0, accepted[2].1).is_some());
    }

    #[tokio::test]
    async fn one_source_holds_at_most_its_share_loopback_aside() {
        let mut registry = Registry::default();
        let metrics = ConnectionMetrics::register(&mut registry);
        let mut limit = ConnectionLimit::new("discovery", 100, &metrics);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (tcp, _) = listener.accept().await.unwrap();
        // The peer address is what counts (the socket is only reset when refused).
        let from = |ip: [u8; 4]| SocketAddr::from((ip, 40000));
        let mut held = Vec::new();
        for _ in 0..MAX_CONNECTIONS_PER_SOURCE {
            held.push(
                limit
                    .admit(&tcp, from([10, 0, 0, 9]))
                    .expect("within its share"),
            );
        }
        assert!(
            limit.admit(&tcp, from([10, 0, 0, 9])).is_none(),
            "one pod fills no more"
        );
        let mapped: SocketAddr = "[::ffff:10.0.0.9]:1".parse().unwrap();
        assert!(
            limit.admit(&tcp, mapped).is_none(),
            "nor through a v4-mapped address"
        );
        // Others and loopback are served; a freed place is its source's again.
        assert!(limit.admit(&tcp, from([10, 0, 0, 10])).is_some());
        let local: Vec<_> = (0..MAX_CONNECTIONS_PER_SOURCE + 4)
            .map(|_| limit.admit(&tcp, from([127, 0, 0, 1])))
            .collect();
        assert!(local.iter().all(Option::is_some));
        held.pop();
        assert!(limit.admit(&tcp, from([10, 0, 0, 9])).is_some());
    }

    #[tokio::test]
    async fn accepted_sockets_get_nodelay_and_keepalive() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (tcp, _) = listener.accept().await.unwrap();
        configure_socket(&tcp).unwrap();
        let s = socket2::SockRef::from(&tcp);
        assert!(s.tcp_nodelay().unwrap());
        assert!(s.keepalive().unwrap());
        assert_eq!(s.tcp_keepalive_time().unwrap(), TCP_KEEPALIVE_TIME);
        assert_eq!(s.tcp_keepalive_interval().unwrap(), TCP_KEEPALIVE_INTERVAL);
        assert_eq!(s.tcp_keepalive_retries().unwrap(), TCP_KEEPALIVE_RETRIES);
    }
}
