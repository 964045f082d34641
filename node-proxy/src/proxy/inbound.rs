//! Inbound: the mesh tunnel (4143, mTLS + HTTP/2 CONNECT, or the opaque transport:
//! `super::transport`) and plaintext capture (4144).

use super::authz::{self, Proto};
use super::body::{self, Body};
use super::http_metrics::ConnectionSeries;
use super::read_ahead::{ReadAhead, TUNNEL_READ_AHEAD};
use super::{relay, PodContext, ProxyError, Shared, TrafficLabels, ERROR_HEADER, PROXY_MARK};
use crate::policy::Client;
use crate::tls::svid_identity;
use ambit_api::WorkloadIdentity;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;

/// How long a client may take to complete the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Presents the pod's current certificate; none (and so no handshake) while it has none.
#[derive(Debug)]
struct PodCert {
    shared: Shared,
    identity: WorkloadIdentity,
}

impl ResolvesServerCert for PodCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.shared
            .identities
            .current(&self.identity)
            .map(|c| c.certified_key())
    }
}

/// The mesh port's TLS server: the pod's certificate, a client SVID required.
pub(super) fn acceptor(pod: &PodContext, shared: &Shared) -> Result<TlsAcceptor, rustls::Error> {
    let resolver = Arc::new(PodCert {
        shared: shared.clone(),
        identity: pod.workload.identity.clone(),
    });
    let mut config = crate::tls::server_config_with(&shared.bundle, resolver)?;
    // No session resumption: a resumed session skips the client's certificate, so a peer
    // could go on past its SVID's expiry or a trust-anchor rotation; tunnels are pooled and
    // long-lived, so a full handshake costs nothing worth keeping. rustls' default, a
    // 256-entry session cache per pod, was also 31 kB per pod (BENCHMARKS.md, "Memory:
    // start-up peak and 1,000 pods").
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    // The opaque transport first: a peer that offers it wants it; the pooled tunnel's
    // clients offer `h2` only.
    config.alpn_protocols = vec![
        super::transport::TRANSPORT_ALPN.to_vec(),
        crate::tls::MESH_ALPN.to_vec(),
    ];
    // For kernel TLS after the handshake (super::transport).
    config.enable_secret_extraction = true;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Serves one connection accepted on the mesh port (`super::accept`).
pub(super) async fn mesh_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    pod: &Arc<PodContext>,
    shared: &Arc<Shared>,
    acceptor: TlsAcceptor,
) -> Result<(), ProxyError> {
    // Anything but a TLS handshake record is refused at its first byte, instead of letting
    // the TLS parser wait for a "record" of whatever length the garbage spells.
    // One deadline for the first byte and the handshake together.
    let deadline = tokio::time::Instant::now() + HANDSHAKE_TIMEOUT;
    let mut first = [0u8; 1];
    let peeked = tokio::time::timeout_at(deadline, tcp.peek(&mut first))
        .await
        .map_err(|_| ProxyError::Client(format!("nothing received from {peer} in time")))?
        .map_err(|e| ProxyError::Client(format!("reading from {peer}: {e}")))?;
    if peeked == 0 || first[0] != 0x16 {
        return Err(ProxyError::Client(format!(
            "{peer} did not start a TLS handshake on the mesh port (plaintext to 4143?)"
        )));
    }
    let mut tls = tokio::time::timeout_at(deadline, acceptor.accept(ReadAhead::new(tcp)))
        .await
        .map_err(|_| ProxyError::Client(format!("TLS handshake from {peer} timed out")))?
        .map_err(|e| ProxyError::Identity(format!("TLS handshake from {peer}: {e}")))?;
    let client_id = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(svid_identity)
        .ok_or_else(|| ProxyError::Identity("no client certificate".into()))?
        .map_err(|e| ProxyError::Identity(e.to_string()))?;
    if tls.get_ref().1.alpn_protocol() == Some(super::transport::TRANSPORT_ALPN) {
        let (pod, shared) = (pod.clone(), shared.clone());
        return super::transport::serve(tls, deadline, move |target| Stream {
            pod,
            shared,
            client_id,
            peer,
            target,
        })
        .await;
    }
    // The pooled tunnel (not the transport, whose socket may go to kernel TLS): read
    // ahead.
    tls.get_mut().0.enable(TUNNEL_READ_AHEAD);
    let service = {
        let (pod, shared, client_id) = (pod.clone(), shared.clone(), client_id.clone());
        let labels = TrafficLabels::inbound(&pod.workload, client_id.to_string());
        let conn_series = Arc::new(ConnectionSeries::new(shared.http.clone(), labels));
        service_fn(move |req| {
            let (pod, shared, client_id) = (pod.clone(), shared.clone(), client_id.clone());
            let conn_series = conn_series.clone();
            async move {
                let resp = if req.method() == http::Method::CONNECT {
                    connect_stream(req, pod, shared, client_id, peer).await
                } else if let Some(denied) = deny_request(&req, &pod, &shared, &client_id, peer) {
                    denied
                } else {
                    super::http::inbound_request(req, &pod, &client_id, &conn_series).await
                };
                Ok::<_, std::convert::Infallible>(resp)
            }
        })
    };
    // Idle: no byte either way for the idle timeout (the peer proxy's pool keeps no PINGs
    // going on an idle connection) — GOAWAY, and the peer opens a new one when it needs it.
    let (tls, activity) = super::idle::Tracked::new(tls);
    let tls = ambit_serving::WriteDeadline::new(tls, super::write_stall_limit(shared));
    let conn = super::h2_server(super::H2_MESH_MAX_STREAMS)
        .initial_stream_window_size(super::H2_STREAM_WINDOW)
        .initial_connection_window_size(super::H2_CONN_WINDOW)
        .max_frame_size(super::H2_MAX_FRAME)
        .serve_connection(TokioIo::new(tls), service);
    tokio::pin!(conn);
    // When the pod leaves (or the proxy drains), GOAWAY tells the peer proxy to stop
    // sending on this pooled connection: its next request opens a new one, to whatever
    // pod has the address by then.
    let mut stopped = pod.stopped.clone();
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = async { drop(stopped.wait_for(|s| *s).await) } => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
        _ = activity.idle_for(shared.http_idle_timeout) => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    result.map_err(|e| ProxyError::Client(format!("HTTP/2 from {peer} ({client_id}): {e}")))
}

/// A request over the mesh to a port whose policy does not authorize its client: the
/// answer (403, or gRPC PERMISSION_DENIED); `None` when it may go on (or names no valid
/// target, which `inbound_request` refuses with its own answer).
fn deny_request(
    req: &http::Request<hyper::body::Incoming>,
    pod: &PodContext,
    shared: &Shared,
    client_id: &WorkloadIdentity,
    peer: SocketAddr,
) -> Option<http::Response<Body>> {
    let target: SocketAddr = req
        .headers()
        .get(super::http::DST_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())?;
    let id = client_id.to_string();
    let client = Client {
        identity: Some(&id),
        addr: peer.ip(),
    };
    let verdict = authz::check_http(shared, &pod.workload, target.port(), &client, req, None);
    (!verdict.allowed()).then(|| authz::refusal(&verdict, req.headers(), true))
}

fn refuse(status: http::StatusCode, cause: &str) -> http::Response<Body> {
    let mut resp = http::Response::new(body::empty());
    *resp.status_mut() = status;
    if let Ok(v) = http::HeaderValue::from_str(cause) {
        resp.headers_mut().insert(ERROR_HEADER, v);
    }
    resp
}

/// Handles one CONNECT stream: connect to the target inside the pod, then relay.
async fn connect_stream(
    req: http::Request<hyper::body::Incoming>,
    pod: Arc<PodContext>,
    shared: Arc<Shared>,
    client_id: WorkloadIdentity,
    peer: SocketAddr,
) -> http::Response<Body> {
    if req.method() != http::Method::CONNECT {
        return refuse(
            http::StatusCode::METHOD_NOT_ALLOWED,
            "the mesh tunnel carries CONNECT streams only",
        );
    }
    let target: Option<SocketAddr> = req.uri().authority().and_then(|a| a.as_str().parse().ok());
    let Some(target) = target else {
        return refuse(
            http::StatusCode::BAD_REQUEST,
            "CONNECT authority must be ip:port",
        );
    };
    let stream = Stream {
        pod,
        shared,
        client_id,
        peer,
        target,
    };
    let mut server = match stream.connect().await {
        Ok(s) => s,
        Err((status, cause)) => return refuse(status, &cause),
    };
    tokio::spawn(async move {
        match hyper::upgrade::on(req).await {
            Ok(upgraded) => {
                let mut upgraded = TokioIo::new(upgraded);
                stream.shared.metrics.transport("inbound", "h2_connect");
                stream.relay(relay(&mut upgraded, &mut server)).await;
            }
            Err(error) => tracing::debug!(%error, "CONNECT stream closed before it opened"),
        }
    });
    http::Response::new(body::empty())
}

/// One opaque stream from a peer proxy to an address of this pod, however it came (a
/// CONNECT stream, or a connection of its own: `super::transport`).
pub(super) struct Stream {
    pub pod: Arc<PodContext>,
    pub shared: Arc<Shared>,
    /// The identity the peer proxy proved for its client.
    pub client_id: WorkloadIdentity,
    /// The peer proxy's address.
    pub peer: SocketAddr,
    /// Where in the pod it goes.
    pub target: SocketAddr,
}

impl Stream {
    /// Checks the target and the client's authorization, and connects to the target inside
    /// the pod; a refusal is an HTTP status and why (counted in `tcp_errors_total`).
    pub async fn connect(&self) -> Result<TcpStream, (http::StatusCode, String)> {
        let (pod, shared, target) = (&self.pod, &self.shared, self.target);
        // Only this pod's own addresses: the tunnel is not an open proxy.
        if !pod.workload.ips.contains(&target.ip()) {
            shared.metrics.error("inbound", "client");
            return Err((
                http::StatusCode::FORBIDDEN,
                "target is not an address of this pod".into(),
            ));
        }
        if super::is_proxy_port(target.port()) {
            shared.metrics.error("inbound", "client");
            return Err((
                http::StatusCode::FORBIDDEN,
                "target is one of the proxy's own ports (4140, 4143, 4144)".into(),
            ));
        }
        let id = self.client_id.to_string();
        let client = Client {
            identity: Some(&id),
            addr: self.peer.ip(),
        };
        let (verdict, _) = authz::check(
            shared,
            &pod.workload,
            target.port(),
            &client,
            None,
            Proto::Tcp,
        );
        if !verdict.allowed() {
            shared.metrics.error("inbound", "denied");
            return Err((
                http::StatusCode::FORBIDDEN,
                "denied: unauthorized by the destination's policy".into(),
            ));
        }
        pod.netns.connect(target, PROXY_MARK).await.map_err(|e| {
            shared.metrics.error("inbound", "upstream");
            let status = if e.kind() == std::io::ErrorKind::ConnectionRefused {
                http::StatusCode::BAD_GATEWAY
            } else {
                http::StatusCode::SERVICE_UNAVAILABLE
            };
            (status, format!("connecting to {target} in the pod: {e}"))
        })
    }

    /// Runs `relay` (which returns the bytes read from and written to the peer proxy),
    /// counted in the metrics; a policy change that denies the client ends it.
    pub async fn relay(&self, relay: impl std::future::Future<Output = (u64, u64)>) {
        let labels = TrafficLabels::inbound(&self.pod.workload, self.client_id.to_string());
        self.shared.metrics.opened(&labels);
        let id = self.client_id.to_string();
        let (read, written) = tokio::select! {
            moved = relay => moved,
            () = authz::revoked(&self.shared, &self.pod.workload, self.target.port(), Some(id), self.peer.ip()) => (0, 0),
        };
        self.shared.metrics.closed(&labels, read, written);
    }
}

/// Plaintext from outside the mesh: authorized per connection, by the client's address;
/// a denied one is closed — or, if it speaks HTTP, answered 403 per request but for the
/// kubelet's probes ([`super::denied`]).
pub(super) async fn plain_connection(
    mut client: TcpStream,
    peer: SocketAddr,
    pod: &Arc<PodContext>,
    shared: &Arc<Shared>,
) -> Result<(), ProxyError> {
    let target = shared.redirector.inbound_dst(&client).map_err(|e| {
        ProxyError::Client(format!(
            "no original destination (was the connection redirected?): {e}"
        ))
    })?;
    super::record_dst(target);
    if !pod.workload.ips.contains(&target.ip()) || super::is_proxy_port(target.port()) {
        return Err(ProxyError::Client(format!(
            "{target} is not a destination in this pod"
        )));
    }
    let policy = shared
        .policy
        .borrow()
        .port(&authz::pod_key(&pod.workload), target.port());
    let open = Client {
        identity: None,
        addr: peer.ip(),
    };
    if !policy.check(&open, None).allowed() {
        // Counted there: per request if it speaks HTTP (probes may pass), else as a
        // denied connection.
        return super::denied::serve(client, peer, target, pod.clone(), shared.clone()).await;
    }
    authz::check(
        shared,
        &pod.workload,
        target.port(),
        &open,
        None,
        Proto::Tcp,
    );
    let mut server = pod
        .netns
        .connect(target, PROXY_MARK)
        .await
        .map_err(|e| ProxyError::Upstream(format!("connecting to {target} in the pod: {e}")))?;
    let w = &pod.workload;
    let labels = TrafficLabels::inbound(w, String::new());
    shared.metrics.opened(&labels);
    // A policy change that denies the client ends the connection.
    let (read, written) = tokio::select! {
        moved = relay(&mut client, &mut server) => moved,
        () = authz::revoked(shared, w, target.port(), None, peer.ip()) => (0, 0),
    };
    shared.metrics.closed(&labels, read, written);
    Ok(())
}
