//! HTTP-aware proxying. Outbound, requests are read from the application (HTTP/1.1 or
//! HTTP/2), balanced per request, and sent to meshed endpoints as HTTP/2 over the pooled
//! mTLS tunnel — HTTP/1 rides as HTTP/2 and is restored at the destination, as Linkerd
//! does — or straight to endpoints outside the mesh in the application's own protocol.

use super::balance::Pick;
use super::body::{self, Body};
use super::detect::{Protocol, Rewind};
use super::http_metrics::ConnectionSeries;
use super::metrics::{DstService, TrafficLabels};
use super::resolve::{settle_response, Resolved};
use super::route_metrics::RouteCache;
use super::tunnel::Tunnel;
use super::{PodContext, ProxyError, Shared, ERROR_HEADER};
use ambit_api::WorkloadIdentity;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::metrics::counter::Counter;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Target address inside the destination pod, set by the sending proxy. (Header names as
/// constants: a `&str` name is parsed again on every use, per request.)
pub const DST_HEADER: HeaderName = HeaderName::from_static("ambit-dst");
/// `HTTP/1.1` when the application spoke HTTP/1 and the request rides the tunnel as HTTP/2.
pub const ORIG_PROTO_HEADER: HeaderName = HeaderName::from_static("ambit-orig-proto");
/// The value of [`ORIG_PROTO_HEADER`].
const HTTP1: HeaderValue = HeaderValue::from_static("HTTP/1.1");
/// How long a client may take to send a request's headers (slowloris).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest request head accepted (431 beyond).
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// Headers that describe one hop and must not be forwarded.
const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
];

fn strip_hop_by_hop(h: &mut HeaderMap) {
    // Headers named in Connection are hop-by-hop too.
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named.iter().chain(HOP_BY_HOP.iter()) {
        h.remove(n);
    }
    if h.get(header::TE).is_some_and(|v| v != "trailers") {
        h.remove(header::TE);
    }
}

/// An error response that says whose fault it was.
pub fn error_response(e: &ProxyError) -> Response<Body> {
    let status = match e {
        ProxyError::Client(_) => StatusCode::BAD_REQUEST,
        ProxyError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
        ProxyError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        ProxyError::Upstream(_) => StatusCode::BAD_GATEWAY,
        ProxyError::Identity(_) => StatusCode::SERVICE_UNAVAILABLE,
        ProxyError::Denied(_) => StatusCode::FORBIDDEN,
        ProxyError::NoRoute(_) => StatusCode::NOT_FOUND,
        ProxyError::BadRoute(_) => StatusCode::INTERNAL_SERVER_ERROR,
        ProxyError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let mut resp = Response::new(body::text(format!("{e}\n")));
    *resp.status_mut() = status;
    if let Ok(v) = HeaderValue::from_str(&e.to_string().replace(['\r', '\n'], " ")) {
        resp.headers_mut().insert(ERROR_HEADER, v);
    }
    resp
}

/// How long an application's HTTP/1 connection must be quiet, once its pod's listeners
/// have stopped, before it is closed (its next response says `connection: close` anyway).
pub const DRAIN_IDLE: std::time::Duration = std::time::Duration::from_secs(2);

/// Serves an application connection detected as HTTP until it closes; it counts in the
/// TCP metrics as any connection does, to `dst_service` (what `dst` resolved to when it
/// was opened; the hop's `tls` is each request's, not the connection's).
pub(super) async fn serve_outbound(
    io: Rewind<TcpStream>,
    proto: Protocol,
    dst: SocketAddr,
    dst_service: DstService,
    pod: Arc<PodContext>,
    shared: Arc<Shared>,
) {
    let metrics = shared.metrics.clone();
    let (io, activity) = super::idle::Tracked::new(io);
    let mut tcp = TrafficLabels::outbound(&pod.workload, String::new(), dst_service);
    tcp.tls = String::new();
    let shared_idle = shared.http_idle_timeout;
    let stall = super::write_stall_limit(&shared);
    let labels = TrafficLabels::outbound(&pod.workload, String::new(), DstService::default());
    let conn = Arc::new(ConnMetrics {
        series: Arc::new(ConnectionSeries::new(shared.http.clone(), labels)),
        routes: RouteCache::default(),
        tcp: Arc::new(TcpConnection::opened(&metrics, tcp, activity.clone())),
    });
    // Set once the pod's listeners stop (the pod left, or the proxy drains or handed its
    // listeners over): each HTTP/1 response from then on says `connection: close`.
    let closing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let service = {
        let closing = closing.clone();
        let pod = pod.clone();
        service_fn(move |req: Request<Incoming>| {
            let (pod, shared, conn) = (pod.clone(), shared.clone(), conn.clone());
            let closing = closing.clone();
            async move {
                let mut resp = outbound_request(req, dst, &pod, &shared, &conn).await;
                if closing.load(std::sync::atomic::Ordering::Relaxed) {
                    resp.headers_mut()
                        .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
                }
                Ok::<_, std::convert::Infallible>(resp)
            }
        })
    };
    let io = ambit_serving::WriteDeadline::new(io, stall);
    let io = TokioIo::new(io);
    let idle = activity.idle_for(shared_idle);
    // Winding down: an HTTP/2 client gets GOAWAY at once (its requests in flight finish,
    // its next ones go on a new connection: to whichever process accepts by then). An
    // HTTP/1 connection is not closed under a client that may be sending its next request
    // — the race every keep-alive client loses now and then — but answered with
    // `connection: close`, and closed once it has been quiet for [`DRAIN_IDLE`].
    let mut stopped = pod.stopped.clone();
    let quiet = activity.clone();
    let drain = async move {
        let _ = stopped.wait_for(|s| *s).await;
        if proto != Protocol::Http2 {
            closing.store(true, std::sync::atomic::Ordering::Relaxed);
            quiet.idle_for(DRAIN_IDLE).await;
        }
    };
    let result = match proto {
        Protocol::Http2 => {
            let conn = super::h2_server(super::H2_APP_MAX_STREAMS).serve_connection(io, service);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => r,
                _ = idle => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
                _ = drain => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            }
        }
        _ => {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .max_buf_size(MAX_HEADER_BYTES)
                .serve_connection(io, service)
                .with_upgrades();
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => r,
                _ = idle => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
                _ = drain => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            }
        }
    };
    if let Err(error) = result {
        metrics.error("outbound", "client");
        tracing::debug!(%error, "outbound HTTP connection ended with an error");
    }
}

/// What an outbound connection's requests share for their metrics.
struct ConnMetrics {
    /// Shared with the tasks that send a route's mirrored copies.
    series: Arc<ConnectionSeries>,
    routes: RouteCache,
    /// Held by the connection's server and by the relay of a connection it upgraded.
    tcp: Arc<TcpConnection>,
}

/// An application's HTTP connection in the TCP metrics: its bytes counted after each
/// request ([`Self::flush`]) — a keep-alive connection that lives for hours shows its
/// traffic as it goes, as Linkerd's do —, closed when the last holder lets go: the HTTP
/// server, or the relay of an upgrade (hyper's connection ends when it hands an upgraded
/// connection over).
pub(super) struct TcpConnection {
    metrics: super::metrics::TcpMetrics,
    labels: TrafficLabels,
    activity: super::idle::Activity,
    counters: (Counter, Counter),
    /// The bytes already added to `counters`, read and written.
    flushed: (AtomicU64, AtomicU64),
}

impl TcpConnection {
    fn opened(
        metrics: &super::metrics::TcpMetrics,
        labels: TrafficLabels,
        activity: super::idle::Activity,
    ) -> Self {
        metrics.opened(&labels);
        Self {
            counters: metrics.byte_counters(&labels),
            metrics: metrics.clone(),
            labels,
            activity,
            flushed: Default::default(),
        }
    }

    /// Adds the bytes moved since the last flush to the connection's counters.
    pub(super) fn flush(&self) {
        let (read, written) = self.activity.bytes();
        let add = |counter: &Counter, flushed: &AtomicU64, now: u64| {
            let before = flushed.swap(now, Ordering::Relaxed);
            counter.inc_by(now.saturating_sub(before));
        };
        add(&self.counters.0, &self.flushed.0, read);
        add(&self.counters.1, &self.flushed.1, written);
    }
}

impl Drop for TcpConnection {
    fn drop(&mut self) {
        self.flush();
        self.metrics.ended(&self.labels);
    }
}

async fn outbound_request(
    req: Request<Incoming>,
    dst: SocketAddr,
    pod: &Arc<PodContext>,
    shared: &Arc<Shared>,
    conn: &ConnMetrics,
) -> Response<Body> {
    let grpc = super::classify::is_grpc(req.headers());
    let resp = route_request(req, dst, pod, shared, conn).await;
    conn.tcp.flush();
    if grpc {
        grpc_answer(resp)
    } else {
        resp
    }
}

/// A gRPC client's answer: an error the proxy made itself (it carries `ambit-proxy-error`
/// and no gRPC status) becomes a trailers-only gRPC status, which gRPC clients read (an
/// HTTP 504 would reach them as a bare UNAVAILABLE without the message).
fn grpc_answer(resp: Response<Body>) -> Response<Body> {
    let own = resp.headers().contains_key(super::ERROR_HEADER)
        && !resp.headers().contains_key("grpc-status");
    if !own {
        return resp;
    }
    let code = match resp.status().as_u16() {
        504 => "4",        // DEADLINE_EXCEEDED
        404 => "12",       // UNIMPLEMENTED
        403 => "7",        // PERMISSION_DENIED
        502 | 503 => "14", // UNAVAILABLE
        _ => "13",         // INTERNAL
    };
    let (mut parts, _) = resp.into_parts();
    let message = parts.headers.get(super::ERROR_HEADER).cloned();
    parts.status = StatusCode::OK;
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    parts
        .headers
        .insert("grpc-status", HeaderValue::from_static(code));
    if let Some(m) = message {
        parts.headers.insert("grpc-message", m);
    }
    Response::from_parts(parts, body::empty())
}

async fn route_request(
    req: Request<Incoming>,
    dst: SocketAddr,
    pod: &Arc<PodContext>,
    shared: &Arc<Shared>,
    conn: &ConnMetrics,
) -> Response<Body> {
    let conn_series = &conn.series;
    let start = Instant::now();
    let original = match Resolved::now(dst, shared).await {
        Ok(r) => r,
        Err(e) => {
            let series = conn_series.get(&DstService::default(), None, None);
            series.request();
            return series.response(start.elapsed(), error_response(&e));
        }
    };
    let dst_service = original.dst_service();
    let refused = |e: ProxyError| {
        let series = conn_series.get(&dst_service, None, None);
        series.request();
        series.response(start.elapsed(), error_response(&e))
    };
    let rule = match super::route::rule(&req, &original, &pod.workload.namespace, shared) {
        Ok(r) => r,
        Err(e) => return refused(e),
    };
    let (mut parts, body) = req.into_parts();
    if let Some(r) = rule.as_ref().filter(|r| r.redirect.is_none()) {
        super::route::rewrite(r, &mut parts);
    }
    let req = Request::from_parts(parts, body);
    if super::upgrade::is_upgrade(&req) && rule.as_ref().is_none_or(|r| r.redirect.is_none()) {
        // An upgrade is never retried: one endpoint, and the connection becomes a stream.
        let picked = super::route::backend(rule.as_deref(), &original, shared)
            .await
            .and_then(|(_, resolved)| resolved.pick(shared, &pod.workload));
        let (target, pick) = match picked {
            Ok(p) => p,
            Err(e) => return refused(e),
        };
        let series = conn_series.get(&dst_service, target.identity.as_ref(), target.pod.as_ref());
        series.request();
        let (addr, id, hold) = (target.addr, target.identity.clone(), conn.tcp.clone());
        let result = super::upgrade::forward(req, addr, id, pod, shared, hold).await;
        return series.response(start.elapsed(), finish(result, pick));
    }
    let (parts, body) = req.into_parts();
    let body = body::incoming(body);
    let Some(rule) = rule else {
        let req = Request::from_parts(parts, body);
        return try_once(req, &original, None, pod, shared, conn_series, &dst_service)
            .await
            .0;
    };
    let trying = super::route::Trying {
        rule,
        original: &original,
        dst_service: &dst_service,
        pod,
        shared,
        conn_series,
        cache: &conn.routes,
    };
    trying.serve(parts, body).await
}

/// One try of a request: to an endpoint of `resolved` chosen by the balancer, within
/// `deadline` (to the response's headers), counted in the golden metrics. Also returns
/// the proxy's error kind when no response came from upstream.
pub(super) async fn try_once(
    req: Request<Body>,
    resolved: &Resolved,
    deadline: Option<Duration>,
    pod: &PodContext,
    shared: &Shared,
    conn_series: &ConnectionSeries,
    dst_service: &DstService,
) -> (Response<Body>, Option<&'static str>) {
    let start = Instant::now();
    let (target, pick) = match resolved.pick(shared, &pod.workload) {
        Ok(p) => p,
        Err(e) => {
            let series = conn_series.get(dst_service, None, None);
            series.request();
            return (
                series.response(start.elapsed(), error_response(&e)),
                Some(e.kind()),
            );
        }
    };
    let series = conn_series.get(dst_service, target.identity.as_ref(), target.pod.as_ref());
    series.request();
    let exchange = async {
        match &target.identity {
            Some(id) => via_mesh(req, target.addr, id.clone(), pod, shared).await,
            None => deliver_as_sent(req, target.addr, pod).await,
        }
    };
    let result = match deadline {
        None => exchange.await,
        Some(d) => tokio::time::timeout(d, exchange).await.unwrap_or_else(|_| {
            Err(ProxyError::Timeout(format!(
                "no response within the route's timeout of {d:?}"
            )))
        }),
    };
    let error = result.as_ref().err().map(ProxyError::kind);
    (
        series.response(start.elapsed(), finish(result, pick)),
        error,
    )
}

fn finish(result: Result<Response<Body>, ProxyError>, pick: Option<Pick>) -> Response<Body> {
    settle_response(pick, &result);
    result.unwrap_or_else(|e| {
        tracing::info!(error = %e, "outbound request failed");
        error_response(&e)
    })
}

/// The request's authority: from an absolute URI (HTTP/2, proxies) or the Host header.
fn authority<B>(req: &Request<B>, fallback: SocketAddr) -> String {
    req.uri()
        .authority()
        .map(|a| a.to_string())
        .or_else(|| {
            req.headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_string)
        })
        .unwrap_or_else(|| fallback.to_string())
}

fn path_and_query(uri: &Uri) -> &str {
    uri.path_and_query().map_or("/", |p| p.as_str())
}

async fn via_mesh(
    req: Request<Body>,
    target: SocketAddr,
    expected: WorkloadIdentity,
    pod: &PodContext,
    shared: &Shared,
) -> Result<Response<Body>, ProxyError> {
    let tunnel = Tunnel::from_pod(pod, shared, target.ip(), expected)?;
    let authority = authority(&req, target);
    let orig_http1 = req.version() != Version::HTTP_2;
    let (mut parts, body) = req.into_parts();
    parts.uri = Uri::builder()
        .scheme("http")
        .authority(authority.as_str())
        .path_and_query(path_and_query(&parts.uri))
        .build()
        .map_err(|e| ProxyError::Client(format!("request target: {e}")))?;
    parts.version = Version::HTTP_2;
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(header::HOST);
    insert(&mut parts.headers, DST_HEADER, &target.to_string());
    if orig_http1 {
        parts.headers.insert(ORIG_PROTO_HEADER, HTTP1);
    }
    let resp = shared
        .pool
        .send(
            &tunnel,
            Request::from_parts(parts, body),
            "request through the tunnel to",
            &target,
        )
        .await?;
    let (mut parts, b) = resp.into_parts();
    parts.headers.remove(DST_HEADER);
    Ok(Response::from_parts(parts, body::incoming(b)))
}

/// Whether an I/O timeout is somewhere in `e`'s chain of causes.
fn timed_out(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        cur = err.source();
    }
    false
}

fn insert(h: &mut HeaderMap, name: HeaderName, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        h.insert(name, v);
    }
}

/// Sends `req` from the pod's netns to `target` in the application's protocol.
async fn deliver_as_sent(
    req: Request<Body>,
    target: SocketAddr,
    pod: &PodContext,
) -> Result<Response<Body>, ProxyError> {
    let http2 = req.version() == Version::HTTP_2;
    deliver(req, target, http2, pod).await
}

/// Sends `req` to `target` from the pod's netns, as HTTP/2 or HTTP/1.1.
pub(super) async fn deliver(
    req: Request<Body>,
    target: SocketAddr,
    http2: bool,
    pod: &PodContext,
) -> Result<Response<Body>, ProxyError> {
    let (mut parts, body) = req.into_parts();
    let host = parts
        .uri
        .authority()
        .map(|a| a.to_string())
        .or_else(|| {
            parts
                .headers
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_string)
        })
        .unwrap_or_else(|| target.to_string());
    // The authority stays the application's; the client connects to `target` regardless.
    parts.uri = Uri::builder()
        .scheme("http")
        .authority(host.as_str())
        .path_and_query(path_and_query(&parts.uri))
        .build()
        .map_err(|e| ProxyError::Client(format!("request target: {e}")))?;
    strip_hop_by_hop(&mut parts.headers);
    if http2 {
        parts.version = Version::HTTP_2;
        parts.headers.remove(header::HOST);
    } else {
        parts.version = Version::HTTP_11;
        insert(&mut parts.headers, header::HOST, &host);
    }
    let client = pod.clients.get(target, http2);
    let resp = client
        .request(Request::from_parts(parts, body))
        .await
        .map_err(|e| {
            let cause = std::error::Error::source(&e)
                .map(|s| format!(": {s}"))
                .unwrap_or_default();
            if timed_out(&e) {
                ProxyError::Timeout(format!("connecting to {target}{cause}"))
            } else {
                ProxyError::Upstream(format!("{target}: {e}{cause}"))
            }
        })?;
    let (mut parts, b) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    Ok(Response::from_parts(parts, body::incoming(b)))
}

/// Inbound: a request that came through the tunnel, for the application in this pod.
pub(super) async fn inbound_request(
    req: Request<Incoming>,
    pod: &PodContext,
    client_id: &WorkloadIdentity,
    conn_series: &ConnectionSeries,
) -> Response<Body> {
    let w = &pod.workload;
    let series = conn_series.get(&DstService::default(), None, None);
    series.request();
    let start = Instant::now();
    let target: Option<SocketAddr> = req
        .headers()
        .get(DST_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let result = match target {
        None => Err(ProxyError::Client(format!(
            "request without a valid {DST_HEADER} header"
        ))),
        Some(t) if !w.ips.contains(&t.ip()) => Err(ProxyError::Client(format!(
            "{t} is not an address of this pod"
        ))),
        Some(t) if super::is_proxy_port(t.port()) => Err(ProxyError::Client(format!(
            "{t} is one of the proxy's own ports (4140, 4143, 4144)"
        ))),
        Some(t) => {
            let http1 = req
                .headers()
                .get(ORIG_PROTO_HEADER)
                .is_some_and(|v| v == "HTTP/1.1");
            let (mut parts, b) = req.into_parts();
            parts.headers.remove(DST_HEADER);
            parts.headers.remove(ORIG_PROTO_HEADER);
            deliver(
                Request::from_parts(parts, body::incoming(b)),
                t,
                !http1,
                pod,
            )
            .await
        }
    };
    let resp = result.unwrap_or_else(|e| {
        tracing::info!(error = %e, client = %client_id, "inbound request failed");
        error_response(&e)
    });
    series.response(start.elapsed(), resp)
}

#[cfg(test)]
mod tests;
