//! An echo backend in the manner of Gateway API's conformance suite's (its `echo-advanced`
//! server): each HTTP request is answered 200 with lines `Key=Value` naming the pod, its
//! namespace, the method, the URL (path and query) and Host it received, and every
//! request header as `RequestHeader=Name:Value`; each gRPC call (any method, here the
//! identity service's Certify as the wire shape) is answered OK with the same facts in
//! its response metadata (`echo-hostname`, `echo-namespace`, `echo-request-<name>` with a
//! repeated header's values joined by `,`).
//!
//! It counts the requests it received by path (gRPC: by `x-test-case`), so that a test
//! sees mirrored copies arrive; `x-echo-delay-ms: N` delays the answer; and a test can
//! hold every answer ([`Echo::hold`]) to see that a request does not wait for it.

use ambit_api::proto::identity::identity_server::{Identity, IdentityServer};
use ambit_api::proto::identity::{CertifyRequest, CertifyResponse};
use ambit_proxy::netns::Netns;
use bytes::Bytes;
use http_body_util::Full;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What an echo pod received, shared with the test.
#[derive(Clone, Debug)]
pub struct Echo {
    pod: Arc<str>,
    namespace: Arc<str>,
    by_path: Arc<Mutex<HashMap<String, u32>>>,
    held: Arc<AtomicBool>,
    released: Arc<tokio::sync::Notify>,
    waiting: Arc<AtomicU32>,
}

impl Echo {
    fn new(pod: &str, namespace: &str) -> Self {
        Self {
            pod: pod.into(),
            namespace: namespace.into(),
            by_path: Arc::default(),
            held: Arc::default(),
            released: Arc::default(),
            waiting: Arc::default(),
        }
    }

    /// Requests received with `path` (gRPC: with `x-test-case: path`).
    pub fn count(&self, path: &str) -> u32 {
        self.by_path.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    /// Answers nothing until [`Self::release`].
    pub fn hold(&self) {
        self.held.store(true, Ordering::SeqCst);
    }

    /// Answers again, the held requests first.
    pub fn release(&self) {
        self.held.store(false, Ordering::SeqCst);
        self.released.notify_waiters();
    }

    /// Requests held now.
    pub fn waiting(&self) -> u32 {
        self.waiting.load(Ordering::SeqCst)
    }

    async fn received(&self, key: &str, delay_ms: Option<&str>) {
        *self
            .by_path
            .lock()
            .unwrap()
            .entry(key.to_string())
            .or_default() += 1;
        if let Some(ms) = delay_ms.and_then(|v| v.parse().ok()) {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        while self.held.load(Ordering::SeqCst) {
            self.waiting.fetch_add(1, Ordering::SeqCst);
            let released = self.released.notified();
            if self.held.load(Ordering::SeqCst) {
                released.await;
            }
            self.waiting.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Serves the echo pod `pod` of `namespace` in `netns`: HTTP/1.1 and h2c on `http_port`,
/// gRPC on `grpc_port`.
pub async fn serve(
    netns: &Netns,
    pod: &str,
    namespace: &str,
    http_port: u16,
    grpc_port: u16,
) -> Echo {
    let echo = Echo::new(pod, namespace);
    let listener = netns
        .bind(SocketAddr::from(([0, 0, 0, 0], http_port)))
        .await
        .unwrap();
    let e = echo.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let e = e.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let e = e.clone();
                    async move { Ok::<_, std::convert::Infallible>(answer(&e, req).await) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                .await;
            });
        }
    });
    let grpc = netns
        .bind(SocketAddr::from(([0, 0, 0, 0], grpc_port)))
        .await
        .unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(IdentityServer::new(GrpcEcho(echo.clone())))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(grpc)),
    );
    echo
}

async fn answer(
    e: &Echo,
    req: http::Request<hyper::body::Incoming>,
) -> http::Response<Full<Bytes>> {
    let delay = req
        .headers()
        .get("x-echo-delay-ms")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    e.received(req.uri().path(), delay.as_deref()).await;
    let host = req
        .headers()
        .get(http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| req.uri().authority().map(|a| a.to_string()))
        .unwrap_or_default();
    let mut out = format!(
        "Hostname={}\nNamespace={}\nMethod={}\nURL={}\nHost={host}\nProto={:?}\n",
        e.pod,
        e.namespace,
        req.method(),
        req.uri().path_and_query().map_or("/", |p| p.as_str()),
        req.version(),
    );
    for (name, value) in req.headers() {
        out.push_str(&format!(
            "RequestHeader={}:{}\n",
            name,
            String::from_utf8_lossy(value.as_bytes())
        ));
    }
    http::Response::new(Full::new(Bytes::from(out)))
}

/// The gRPC side.
#[derive(Clone)]
struct GrpcEcho(Echo);

#[tonic::async_trait]
impl Identity for GrpcEcho {
    async fn certify(
        &self,
        req: tonic::Request<CertifyRequest>,
    ) -> Result<tonic::Response<CertifyResponse>, tonic::Status> {
        let md = req.metadata().clone().into_headers();
        let case = md
            .get("x-test-case")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        self.0.received(&case, None).await;
        let mut resp = tonic::Response::new(CertifyResponse::default());
        let out = resp.metadata_mut();
        let put = |out: &mut tonic::metadata::MetadataMap, k: String, v: &str| {
            if let (Ok(k), Ok(v)) = (
                tonic::metadata::MetadataKey::from_bytes(k.as_bytes()),
                v.parse(),
            ) {
                out.insert(k, v);
            }
        };
        put(out, "echo-hostname".into(), &self.0.pod);
        put(out, "echo-namespace".into(), &self.0.namespace);
        let mut names: Vec<&http::HeaderName> = md.keys().collect();
        names.dedup();
        for name in names {
            if name.as_str().starts_with("grpc-") || name.as_str() == "content-type" {
                continue;
            }
            let joined: Vec<String> = md
                .get_all(name)
                .iter()
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .collect();
            put(out, format!("echo-request-{name}"), &joined.join(","));
        }
        Ok(resp)
    }
}
