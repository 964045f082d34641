//! A plaintext connection (4144) whose port's policy does not authorize its client. If it
//! speaks HTTP, each request is judged on its own: the kubelet's probes (a GET of one of
//! the port's probe paths) reach the application, so that a `deny` default does not make
//! pods unready; every other request is answered 403 (gRPC: PERMISSION_DENIED) without
//! reaching it. Anything else is closed.

use super::authz::{self, Proto};
use super::body::{self, Body};
use super::detect::{detect, Protocol};
use super::http::{deliver, error_response, HEADER_READ_TIMEOUT, MAX_HEADER_BYTES};
use super::{PodContext, ProxyError, Shared};
use crate::policy::Client;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;

/// How long a denied client may take to show it speaks HTTP.
const DETECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Streams a denied HTTP/2 client may have open at once.
const MAX_STREAMS: u32 = 4;
/// How long a denied client's connection is served at most (a probe takes one request).
const MAX_LIFETIME: Duration = Duration::from_secs(30);

/// Serves (or closes) the denied connection from `peer` to `target` in `pod`.
pub(super) async fn serve(
    client: TcpStream,
    peer: SocketAddr,
    target: SocketAddr,
    pod: Arc<PodContext>,
    shared: Arc<Shared>,
) -> Result<(), ProxyError> {
    let unauthorized = || {
        ProxyError::Denied(format!(
            "{peer} to port {}: unauthorized by the pod's policy",
            target.port()
        ))
    };
    let (proto, io) = detect(client, shared.detect_timeout.min(DETECT_TIMEOUT))
        .await
        .map_err(|e| ProxyError::Client(format!("reading from {peer}: {e}")))?;
    let anonymous = Client {
        identity: None,
        addr: peer.ip(),
    };
    if proto == Protocol::Opaque {
        authz::check(
            &shared,
            &pod.workload,
            target.port(),
            &anonymous,
            None,
            Proto::Tcp,
        );
        return Err(unauthorized());
    }
    let stall = super::write_stall_limit(&shared);
    let service = service_fn(move |req: http::Request<Incoming>| {
        let (pod, shared) = (pod.clone(), shared.clone());
        async move {
            Ok::<_, std::convert::Infallible>(
                request(req, peer, target, &pod, &shared, proto).await,
            )
        }
    });
    let io = TokioIo::new(ambit_serving::WriteDeadline::new(io, stall));
    // HTTP/1: one request, then the connection closes (a probe makes one); HTTP/2: a few
    // streams at once. Either way the connection is served for a bounded time only.
    let served = async {
        match proto {
            Protocol::Http2 => {
                super::h2_server(MAX_STREAMS)
                    .serve_connection(io, service)
                    .await
            }
            _ => {
                hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .max_buf_size(MAX_HEADER_BYTES)
                    .keep_alive(false)
                    .serve_connection(io, service)
                    .await
            }
        }
    };
    match tokio::time::timeout(MAX_LIFETIME, served).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(ProxyError::Client(format!("HTTP from {peer}: {e}"))),
        Err(_) => Err(unauthorized()),
    }
}

/// One request of a denied client: a probe goes to the application, anything else is
/// answered here.
async fn request(
    req: http::Request<Incoming>,
    peer: SocketAddr,
    target: SocketAddr,
    pod: &PodContext,
    shared: &Shared,
    proto: Protocol,
) -> http::Response<Body> {
    let anonymous = Client {
        identity: None,
        addr: peer.ip(),
    };
    let probe = (req.method() == http::Method::GET)
        .then(|| req.uri().path_and_query().map(|p| p.as_str().to_string()))
        .flatten();
    let verdict = authz::check_http(
        shared,
        &pod.workload,
        target.port(),
        &anonymous,
        &req,
        probe.as_deref(),
    );
    if !verdict.allowed() {
        return authz::refusal(&verdict, req.headers(), false);
    }
    let (parts, b) = req.into_parts();
    let req = http::Request::from_parts(parts, body::incoming(b));
    deliver(req, target, proto == Protocol::Http2, pod)
        .await
        .unwrap_or_else(|e| error_response(&e))
}
