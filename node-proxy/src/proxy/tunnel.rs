//! The mesh tunnel, client side: mTLS to the destination pod's 4143 listener, HTTP/2 on
//! top, one CONNECT stream per proxied connection. HTTP/2 connections are pooled per
//! (source identity, destination pod address), so a new TCP connection through the mesh
//! costs one stream, not a TCP and TLS handshake.

use super::body::{self, Body};
use super::read_ahead::{ReadAhead, TUNNEL_READ_AHEAD};
use super::{PodContext, ProxyError, Shared, MESH_PORT, PROXY_MARK};
use crate::netns::Netns;
use crate::tls::{self, TrustBundle};
use ambit_api::WorkloadIdentity;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::sign::CertifiedKey;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio_rustls::TlsConnector;

/// A pooled HTTP/2 connection to a peer proxy.
pub(super) type Sender = SendRequest<Body>;

/// How long connecting to a peer proxy may take (TCP).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the TLS and HTTP/2 handshakes with a peer proxy may take, together.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// HTTP/2 PING interval on a tunnel with streams open: a peer that stops answering is
/// noticed within interval + timeout, and its streams fail instead of hanging.
pub const PING_INTERVAL: Duration = Duration::from_secs(20);
/// How long a PING may go unanswered.
pub const PING_TIMEOUT: Duration = Duration::from_secs(10);
/// A pooled tunnel unused this long is dropped (the peer closes its side when idle too).
pub const POOL_IDLE: Duration = Duration::from_secs(300);

/// A tunnel is pooled per source identity, destination address, and the identity the
/// destination proved: an address that now belongs to a pod of another identity never
/// reuses a connection verified for the old one.
type Key = (WorkloadIdentity, IpAddr, WorkloadIdentity);

/// One set-up shared by every request that needs the connection while it is under way.
type Attempt = Arc<tokio::sync::OnceCell<Result<Sender, ProxyError>>>;

#[derive(Default)]
struct Slot {
    sender: Option<Sender>,
    last_used: Option<tokio::time::Instant>,
    attempt: Option<Attempt>,
}

/// Pooled HTTP/2-over-mTLS connections to peer proxies.
#[derive(Clone, Default)]
pub struct TunnelPool {
    conns: Arc<Mutex<HashMap<Key, Slot>>>,
}

impl std::fmt::Debug for TunnelPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunnelPool").finish_non_exhaustive()
    }
}

/// One end-to-end tunnel request.
pub(super) struct Tunnel<'a> {
    /// The source pod's netns: the TCP connection leaves from it, with the pod's IP.
    pub netns: &'a Netns,
    /// The source workload's identity and certificate.
    pub source: (&'a WorkloadIdentity, Arc<CertifiedKey>),
    /// The identity the destination must prove.
    pub expected: WorkloadIdentity,
    /// The destination pod IP (its proxy listens on 4143 there).
    pub peer: IpAddr,
    /// Trust anchors.
    pub bundle: &'a TrustBundle,
}

impl<'a> Tunnel<'a> {
    /// A tunnel from `pod` to the proxy at `peer`, which must prove `expected`. Fails
    /// closed: without the pod's own current certificate there is no tunnel, and never
    /// a plaintext fallback.
    pub(super) fn from_pod(
        pod: &'a PodContext,
        shared: &'a Shared,
        peer: IpAddr,
        expected: WorkloadIdentity,
    ) -> Result<Self, ProxyError> {
        let w = &pod.workload;
        let cert = shared.identities.current(&w.identity).ok_or_else(|| {
            ProxyError::Identity(format!("no valid certificate for {} yet", w.identity))
        })?;
        Ok(Self {
            netns: &pod.netns,
            source: (&w.identity, cert.certified_key()),
            expected,
            peer,
            bundle: &shared.bundle,
        })
    }
}

impl TunnelPool {
    fn key(t: &Tunnel<'_>) -> Key {
        (t.source.0.clone(), t.peer, t.expected.clone())
    }

    /// A ready HTTP/2 connection to the peer proxy (a pooled one, or a new one), and
    /// whether it came from the pool.
    async fn sender_pooled(&self, t: &Tunnel<'_>) -> Result<(Sender, bool), ProxyError> {
        let key = Self::key(t);
        {
            let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(slot) = conns.get_mut(&key) {
                if let Some(s) = slot.sender.as_ref().filter(|s| s.is_ready()) {
                    let s = s.clone();
                    slot.last_used = Some(tokio::time::Instant::now());
                    return Ok((s, true));
                }
            }
        }
        Ok((self.connect_new(t).await?, false))
    }

    /// A new connection, replacing a dead one in the pool. Concurrent callers
    /// share one set-up: a burst of connections to a new peer costs one handshake, and a
    /// peer that does not answer costs each of them one timeout, not one each in turn.
    async fn connect_new(&self, t: &Tunnel<'_>) -> Result<Sender, ProxyError> {
        let key = Self::key(t);
        let attempt = {
            let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
            let slot = conns.entry(key.clone()).or_default();
            // Someone already replaced the dead one (a dead one is never ready).
            if let Some(s) = slot.sender.as_ref().filter(|s| s.is_ready()) {
                return Ok(s.clone());
            }
            slot.attempt.get_or_insert_with(Attempt::default).clone()
        };
        let result = attempt.get_or_init(|| connect(t)).await.clone();
        let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = conns.entry(key).or_default();
        // The first caller back ends the attempt; the next set-up starts afresh.
        if slot
            .attempt
            .as_ref()
            .is_some_and(|a| Arc::ptr_eq(a, &attempt))
        {
            slot.attempt = None;
            if let Ok(s) = &result {
                slot.sender = Some(s.clone());
                slot.last_used = Some(tokio::time::Instant::now());
            }
        }
        result
    }

    /// Drops tunnels to peers `keep` no longer wants (pods that left discovery), tunnels
    /// that are dead, and tunnels unused for [`POOL_IDLE`]; returns how many remain.
    pub fn prune(&self, keep: impl Fn(IpAddr) -> bool) -> usize {
        let now = tokio::time::Instant::now();
        let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        conns.retain(|(_, peer, _), slot| {
            let fresh = slot
                .last_used
                .is_some_and(|t| now.duration_since(t) < POOL_IDLE);
            let live = slot.sender.as_ref().is_some_and(|s| !s.is_closed());
            slot.attempt.is_some() || (keep(*peer) && live && fresh)
        });
        conns.len()
    }

    /// Sends `req` through the tunnel. A pooled connection that turns out to be dead
    /// before the request left (the peer proxy restarted, the pod behind the address
    /// was replaced) is dropped, and the request goes once more on a new connection.
    /// `what` and `to` name the request in errors (formatted only when one happens).
    pub(super) async fn send(
        &self,
        t: &Tunnel<'_>,
        req: http::Request<Body>,
        what: &'static str,
        to: &(dyn std::fmt::Display + Sync),
    ) -> Result<http::Response<hyper::body::Incoming>, ProxyError> {
        let failed = |e: hyper::Error| ProxyError::Upstream(format!("{what} {to}: {e}"));
        let (mut sender, pooled) = self.sender_pooled(t).await?;
        match sender.try_send_request(req).await {
            Ok(resp) => Ok(resp),
            // The dead connection needs no eviction: it is no longer ready, so the next
            // request (or the retry below) replaces it in the pool.
            Err(mut e) => match (pooled, e.take_message()) {
                (true, Some(req)) => {
                    tracing::debug!(peer = %t.peer, error = %e.error(), "pooled tunnel was dead; sending on a new one");
                    let mut fresh = self.connect_new(t).await?;
                    fresh.send_request(req).await.map_err(failed)
                }
                _ => Err(failed(e.into_error())),
            },
        }
    }

    /// Opens a CONNECT stream to `target` through the peer proxy.
    pub(super) async fn open(
        &self,
        t: &Tunnel<'_>,
        target: SocketAddr,
    ) -> Result<hyper::upgrade::Upgraded, ProxyError> {
        let req = http::Request::builder()
            .method(http::Method::CONNECT)
            .uri(target.to_string())
            .body(body::empty())
            .map_err(|e| ProxyError::Internal(e.to_string()))?;
        let resp = self.send(t, req, "tunnel request to", &t.peer).await?;
        if resp.status() != http::StatusCode::OK {
            let cause = resp
                .headers()
                .get(super::ERROR_HEADER)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("no reason given")
                .to_string();
            return Err(ProxyError::Upstream(format!(
                "peer proxy at {} answered {} for {target}: {cause}",
                t.peer,
                resp.status()
            )));
        }
        hyper::upgrade::on(resp)
            .await
            .map_err(|e| ProxyError::Upstream(format!("tunnel upgrade: {e}")))
    }
}

async fn connect(t: &Tunnel<'_>) -> Result<Sender, ProxyError> {
    let (addr, tcp) = connect_tcp(t).await?;
    tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(t, addr, tcp))
        .await
        .map_err(|_| {
            ProxyError::Timeout(format!(
                "TLS and HTTP/2 handshakes with the peer proxy at {addr}: not done in {HANDSHAKE_TIMEOUT:?}"
            ))
        })?
}

/// A TCP connection from the source pod to the peer proxy's mesh port, within
/// [`CONNECT_TIMEOUT`].
pub(super) async fn connect_tcp(
    t: &Tunnel<'_>,
) -> Result<(SocketAddr, tokio::net::TcpStream), ProxyError> {
    let addr = SocketAddr::new(t.peer, MESH_PORT);
    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, t.netns.connect(addr, PROXY_MARK))
        .await
        .map_err(|_| {
            ProxyError::Timeout(format!(
                "connecting to the peer proxy at {addr}: no answer in {CONNECT_TIMEOUT:?}"
            ))
        })?
        .map_err(|e| {
            ProxyError::Upstream(format!("connecting to the peer proxy at {addr}: {e}"))
        })?;
    let _ = super::keepalive(&tcp);
    Ok((addr, tcp))
}

async fn handshake(
    t: &Tunnel<'_>,
    addr: SocketAddr,
    tcp: tokio::net::TcpStream,
) -> Result<Sender, ProxyError> {
    let config = tls::client_config(t.bundle, t.source.1.clone(), vec![t.expected.clone()])
        .map_err(|e| ProxyError::Internal(e.to_string()))?;
    let name = rustls_pki_types::ServerName::IpAddress(t.peer.into());
    let mut stream = TlsConnector::from(Arc::new(config))
        .connect(name, ReadAhead::new(tcp))
        .await
        .map_err(|e| {
            ProxyError::Identity(format!("mTLS with {addr} (expecting {}): {e}", t.expected))
        })?;
    stream.get_mut().0.enable(TUNNEL_READ_AHEAD);
    let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .keep_alive_interval(PING_INTERVAL)
        .keep_alive_timeout(PING_TIMEOUT)
        // No PINGs on an idle tunnel: the peer closes it when idle, and the pool drops it.
        .keep_alive_while_idle(false)
        .max_header_list_size(super::H2_MAX_HEADER_LIST)
        .initial_stream_window_size(super::H2_STREAM_WINDOW)
        .initial_connection_window_size(super::H2_CONN_WINDOW)
        .max_frame_size(super::H2_MAX_FRAME)
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|e| ProxyError::Upstream(format!("HTTP/2 with {addr}: {e}")))?;
    tokio::spawn(async move {
        if let Err(error) = conn.await {
            tracing::debug!(%error, "tunnel connection ended");
        }
    });
    Ok(sender)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{TestCa, TestNetns};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A peer proxy's mesh port inside `netns`: mTLS as `id`, HTTP/2 answering 200;
    /// counts the TCP connections it accepts.
    async fn peer(netns: &Netns, ca: &TestCa, id: &WorkloadIdentity) -> Arc<AtomicUsize> {
        let listener = netns
            .bind(SocketAddr::from(([127, 0, 0, 1], MESH_PORT)))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let config = tls::server_config(&ca.bundle(), ca.certified_key(id))
            .unwrap_or_else(|e| panic!("{e}"));
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(|_req| async {
                        Ok::<_, std::convert::Infallible>(http::Response::new(body::empty()))
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        accepted
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_set_ups_share_one_connection_keyed_by_the_identity_it_proved() {
        let ns = TestNetns::new("tunnel");
        let netns = Netns::open(&ns.path()).unwrap_or_else(|e| panic!("{e}"));
        let ca = TestCa::new("cluster.local");
        let (cli, web, other) = (
            ca.identity("shop", "cli"),
            ca.identity("shop", "web"),
            ca.identity("shop", "other"),
        );
        let accepted = peer(&netns, &ca, &web).await;
        let bundle = ca.bundle();
        let tunnel = |expected: &WorkloadIdentity| Tunnel {
            netns: &netns,
            source: (&cli, ca.certified_key(&cli)),
            expected: expected.clone(),
            peer: IpAddr::from([127, 0, 0, 1]),
            bundle: &bundle,
        };
        let pool = TunnelPool::default();
        // A burst of first requests to one peer: one set-up, one connection.
        let to_web = tunnel(&web);
        let burst = (0..20).map(|_| pool.sender_pooled(&to_web));
        for got in futures::future::join_all(burst).await {
            got.unwrap_or_else(|e| panic!("{e}"));
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert!(pool
            .sender_pooled(&to_web)
            .await
            .is_ok_and(|(_, pooled)| pooled));
        // The same address, now expected to be another identity: the connection verified
        // for web is not reused; a new handshake fails, as the peer cannot prove it.
        let to_other = tunnel(&other);
        let err = pool.sender_pooled(&to_other).await.map(|_| ()).unwrap_err();
        assert!(matches!(err, ProxyError::Identity(_)), "{err}");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        // Pruned when the peer leaves discovery.
        assert_eq!(pool.prune(|_| false), 0);
    }
}
