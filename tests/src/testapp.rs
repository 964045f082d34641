//! A purpose-built HTTP test server for routes, timeouts and retries, and a keep-alive
//! client that sends from inside a pod's network namespace (so the pod's redirection takes
//! the connection to its node proxy, as an application's would be).
//!
//! The server answers each request as its headers ask:
//! - `x-test-status: N` — with status N;
//! - `x-test-fail: N` with `x-test-key: K` — 503 to the first N requests with key K, then
//!   200 (the counts are per server, and visible to the test);
//! - `x-test-delay-ms: N` — after N milliseconds;
//! - `x-test-early: 1` — without reading the request's body (which may still be coming);
//! - `x-test-stall-ms: N` — its body's first line at once, the rest N milliseconds later;
//! - otherwise with the status the test set on the server ([`Seen::set_status`]), or 200.
//!
//! A 200's body names the server, the size of the request body it read, and the request's
//! headers, one `name: value` a line; every response has `x-served-by: <name>`.

use ambit_proxy::netns::Netns;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What a test server has seen.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    /// Requests by `x-test-key` ("" when none).
    pub by_key: Arc<Mutex<HashMap<String, u32>>>,
    /// The status every request gets unless it asks otherwise (0: 200).
    status: Arc<std::sync::atomic::AtomicU16>,
}

impl Seen {
    /// From now on, answer `status` to requests that do not ask for another.
    pub fn set_status(&self, status: u16) {
        self.status
            .store(status, std::sync::atomic::Ordering::SeqCst);
    }

    /// How many requests with `key` arrived.
    pub fn count(&self, key: &str) -> u32 {
        self.by_key.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    /// Every request, whatever its key.
    pub fn total(&self) -> u32 {
        self.by_key.lock().unwrap().values().sum()
    }
}

/// Serves HTTP/1.1 and HTTP/2 (h2c) on `port` in `netns`, as `name`.
pub async fn serve(netns: &Netns, port: u16, name: &'static str) -> Seen {
    let listener = netns
        .bind(SocketAddr::from(([0, 0, 0, 0], port)))
        .await
        .unwrap();
    let seen = Seen::default();
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let record = record.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let record = record.clone();
                    async move { Ok::<_, std::convert::Infallible>(answer(req, name, &record).await) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                .await;
            });
        }
    });
    seen
}

fn header_value(v: &Option<String>) -> u64 {
    v.as_deref().and_then(|v| v.parse().ok()).unwrap_or(0)
}

fn header<'a>(req: &'a http::Request<hyper::body::Incoming>, name: &str) -> Option<&'a str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

async fn answer(
    req: http::Request<hyper::body::Incoming>,
    name: &str,
    seen: &Seen,
) -> http::Response<ClientBody> {
    let key = header(&req, "x-test-key").unwrap_or("").to_string();
    let n = {
        let mut m = seen.by_key.lock().unwrap();
        let c = m.entry(key).or_default();
        *c += 1;
        *c
    };
    let fail_first: u32 = header(&req, "x-test-fail")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let fixed = seen.status.load(std::sync::atomic::Ordering::SeqCst);
    let status: u16 = match header(&req, "x-test-status").and_then(|v| v.parse().ok()) {
        Some(s) => s,
        None if n <= fail_first => 503,
        None if fixed != 0 => fixed,
        None => 200,
    };
    let delay: u64 = header(&req, "x-test-delay-ms")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let early = header(&req, "x-test-early").is_some();
    let stall_ms = header(&req, "x-test-stall-ms").map(str::to_string);
    let mut text = format!("{name}\n");
    for (k, v) in req.headers() {
        text.push_str(&format!("{k}: {}\n", v.to_str().unwrap_or("?")));
    }
    if !early {
        let body = req.into_body().collect().await.map(|c| c.to_bytes().len());
        text.push_str(&format!("body-bytes: {}\n", body.unwrap_or(0)));
    }
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    let stall: u64 = header_value(&stall_ms);
    let body = if stall > 0 {
        let parts = [Bytes::from(format!("{name}\n")), Bytes::from(text)];
        let frames = futures::stream::unfold(0usize, move |i| {
            let part = parts.get(i).cloned();
            async move {
                let part = part?;
                if i > 0 {
                    tokio::time::sleep(Duration::from_millis(stall)).await;
                }
                Some((Ok(hyper::body::Frame::data(part)), i + 1))
            }
        });
        BodyExt::boxed(http_body_util::StreamBody::new(frames))
    } else {
        Full::new(Bytes::from(text)).boxed()
    };
    let mut resp = http::Response::new(body);
    *resp.status_mut() = http::StatusCode::from_u16(status).unwrap();
    resp.headers_mut()
        .insert("x-served-by", http::HeaderValue::from_str(name).unwrap());
    resp
}

/// A request body as the client sends it.
pub type ClientBody = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

/// A keep-alive HTTP/1.1 client connection from inside a pod.
#[derive(Debug)]
pub struct Client {
    send: hyper::client::conn::http1::SendRequest<ClientBody>,
    host: String,
}

/// A response as the test reads it.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: String,
}

impl Reply {
    /// `x-served-by`, or "" (an answer of the proxy's own).
    pub fn served_by(&self) -> &str {
        self.headers
            .get("x-served-by")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

impl Client {
    /// Connects from `netns` to `dst` (an application connection: redirected to the
    /// node proxy by the pod's rules).
    pub async fn connect(netns: &Netns, dst: SocketAddr) -> Self {
        let stream = netns.connect(dst, 0).await.unwrap();
        let (send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        Self {
            send,
            host: dst.to_string(),
        }
    }

    /// Sends `host` as the Host header from now on (the default: the address dialled).
    pub fn set_host(&mut self, host: &str) {
        self.host = host.to_string();
    }

    /// Sends `method path` with `headers` and `body`; the connection stays open.
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Reply {
        self.send_body(method, path, headers, Full::new(body).boxed())
            .await
    }

    /// POSTs `first` as the beginning of a body that never ends (a stream still being
    /// sent): the reply, which the server must give without waiting for the rest. The
    /// connection cannot be used again.
    pub async fn send_unending(
        &mut self,
        path: &str,
        headers: &[(&str, &str)],
        first: Bytes,
    ) -> Reply {
        use futures::StreamExt;
        let frames = futures::stream::iter([Ok(hyper::body::Frame::data(first))])
            .chain(futures::stream::pending());
        let body = BodyExt::boxed(http_body_util::StreamBody::new(frames));
        self.send_body("POST", path, headers, body).await
    }

    async fn send_body(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: ClientBody,
    ) -> Reply {
        self.exchange(method, path, headers, body).await.unwrap()
    }

    async fn exchange(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: ClientBody,
    ) -> Result<Reply, String> {
        let mut b = http::Request::builder()
            .method(method)
            .uri(path)
            .header("host", &self.host);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        self.send.ready().await.unwrap();
        let resp = self.send.send_request(b.body(body).unwrap()).await.unwrap();
        let (parts, mut body) = resp.into_parts();
        let mut got = Vec::new();
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(f) => got.extend_from_slice(f.data_ref().map_or(&[][..], |d| &d[..])),
                Err(e) => {
                    return Err(format!(
                        "{} then {e:?} after {:?}",
                        parts.status,
                        String::from_utf8_lossy(&got)
                    ))
                }
            }
        }
        Ok(Reply {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body: String::from_utf8_lossy(&got).into_owned(),
        })
    }

    /// A GET of `path` with `headers`.
    pub async fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> Reply {
        self.send("GET", path, headers, Bytes::new()).await
    }

    /// A GET of `path` with `headers`: the reply, or how its body failed (with the
    /// status and what came before the failure).
    pub async fn try_get(&mut self, path: &str, headers: &[(&str, &str)]) -> Result<Reply, String> {
        self.exchange("GET", path, headers, Full::new(Bytes::new()).boxed())
            .await
    }
}
