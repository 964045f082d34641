//! HTTP/1.1 upgrades (WebSocket and the like): the request head is forwarded as bytes over
//! an opaque stream — a CONNECT stream through the mesh, or a direct connection — and once
//! the server answers 101 the two connections are relayed as they are.

use super::body::{self, Body};
use super::detect::Rewind;
use super::tunnel::Tunnel;
use super::{relay, PodContext, ProxyError, Shared, PROXY_MARK};
use ambit_api::WorkloadIdentity;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// How long the server may take to answer the upgrade request.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest response head accepted.
const MAX_HEAD: usize = 64 * 1024;

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Whether `req` asks to switch protocols (`Connection: upgrade` and `Upgrade: ...`).
pub(super) fn is_upgrade(req: &Request<Incoming>) -> bool {
    let connection_upgrade = req
        .headers()
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    connection_upgrade && req.headers().contains_key(http::header::UPGRADE)
}

fn head_bytes(req: &Request<Incoming>) -> Vec<u8> {
    let pq = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let mut head = format!("{} {pq} HTTP/1.1\r\n", req.method()).into_bytes();
    for (name, value) in req.headers() {
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    head
}

/// Reads a response head; returns it parsed, and the bytes read past it.
async fn read_head(io: &mut (dyn Io + '_)) -> Result<(Response<Body>, Vec<u8>), ProxyError> {
    let mut buf = Vec::with_capacity(1024);
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() >= MAX_HEAD {
            return Err(ProxyError::Upstream(
                "upgrade response head too large".into(),
            ));
        }
        let mut chunk = [0u8; 4096];
        let n = io
            .read(&mut chunk)
            .await
            .map_err(|e| ProxyError::Upstream(format!("reading the upgrade response: {e}")))?;
        if n == 0 {
            return Err(ProxyError::Upstream(
                "server closed before answering the upgrade".into(),
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let text = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut lines = text.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse::<u16>().ok())
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or_else(|| ProxyError::Upstream("malformed upgrade response status line".into()))?;
    let mut resp = Response::new(body::empty());
    *resp.status_mut() = status;
    for line in lines.filter(|l| !l.is_empty()) {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| ProxyError::Upstream(format!("malformed header {line:?}")))?;
        if let (Ok(n), Ok(v)) = (
            http::header::HeaderName::from_bytes(name.trim().as_bytes()),
            http::header::HeaderValue::from_str(value.trim()),
        ) {
            resp.headers_mut().append(n, v);
        }
    }
    Ok((resp, buf[end..].to_vec()))
}

/// Forwards an upgrade request to `target` and, on 101, relays the two connections.
pub(super) async fn forward(
    mut req: Request<Incoming>,
    target: SocketAddr,
    identity: Option<WorkloadIdentity>,
    pod: &PodContext,
    shared: &Shared,
    connection: Arc<super::http::TcpConnection>,
) -> Result<Response<Body>, ProxyError> {
    let client_side = hyper::upgrade::on(&mut req);
    let head = head_bytes(&req);
    let mut upstream: Box<dyn Io> = match identity {
        Some(expected) => {
            let tunnel = Tunnel::from_pod(pod, shared, target.ip(), expected)?;
            Box::new(TokioIo::new(shared.pool.open(&tunnel, target).await?))
        }
        None => Box::new(
            pod.netns
                .connect(target, PROXY_MARK)
                .await
                .map_err(|e| ProxyError::Upstream(format!("connecting to {target}: {e}")))?,
        ),
    };
    upstream
        .write_all(&head)
        .await
        .map_err(|e| ProxyError::Upstream(format!("sending the upgrade request: {e}")))?;
    let (resp, rest) = tokio::time::timeout(RESPONSE_TIMEOUT, read_head(upstream.as_mut()))
        .await
        .map_err(|_| ProxyError::Timeout(format!("upgrade response from {target}")))??;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        tokio::spawn(async move {
            // The application's connection is open in the metrics until the relay ends.
            let _connection = connection;
            match client_side.await {
                Ok(client) => {
                    let mut client = TokioIo::new(client);
                    let mut upstream = Rewind::new(rest, upstream);
                    relay(&mut client, &mut upstream).await;
                }
                Err(error) => tracing::debug!(%error, "client went away before the upgrade"),
            }
        });
    }
    Ok(resp)
}
