//! The pods/proxy subresource: `GET /api/v1/namespaces/NS/pods/[SCHEME:]NAME[:PORT]/proxy/PATH`
//! forwarded to the pod, as `kubectl get --raw` and `ambit stat --kube` use it.
//!
//! Like the API server, the fake dials the pod's own address — `status.podIP` and the
//! port in the path, else the pod's first container port — and passes the answer back as
//! the pod gave it; a pod it cannot reach is 503 `ServiceUnavailable`, "error trying to
//! reach service". So a test gives its pods `podIP: 127.0.0.1` and, as the port, one its
//! server listens on: no address map to keep beside the pods, and the port lives in the
//! pod, where a client that reads the container ports finds it. Only `GET` over plain
//! HTTP is forwarded (the API server also forwards other methods, upgrades and `https:`).

use super::status::Failure;
use super::store::key;
use super::Shared;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::time::Duration;

/// How long the fake tries to reach a pod (the API server's dial timeout is 30 s).
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// A pods/proxy request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodProxy {
    namespace: String,
    pod: String,
    /// `http` or `https`, when the path names one.
    scheme: Option<String>,
    /// The port the path names.
    port: Option<String>,
    /// The path to ask the pod for (`/` when none follows `proxy`).
    path: String,
}

impl PodProxy {
    /// The request `path` names, if it is a pods/proxy path.
    pub(crate) fn parse(path: &str) -> Option<Self> {
        let rest = path.strip_prefix("/api/v1/namespaces/")?;
        let (namespace, rest) = rest.split_once("/pods/")?;
        let (target, rest) = rest.split_once('/')?;
        let path = match rest.strip_prefix("proxy")? {
            "" => "/",
            p if p.starts_with('/') => p,
            _ => return None,
        };
        // As the API server splits it: NAME, NAME:PORT or SCHEME:NAME:PORT.
        let (scheme, pod, port) = match target.split(':').collect::<Vec<_>>()[..] {
            [pod] => (None, pod, None),
            [pod, port] => (None, pod, Some(port)),
            [scheme, pod, port] => (Some(scheme), pod, Some(port)),
            _ => return None,
        };
        if namespace.contains('/') || pod.is_empty() {
            return None;
        }
        Some(Self {
            namespace: namespace.into(),
            pod: pod.into(),
            scheme: scheme.map(String::from),
            port: port.filter(|p| !p.is_empty()).map(String::from),
            path: path.into(),
        })
    }
}

/// Forwards `request` (with `query`) to its pod: the pod's answer, or the API server's
/// failure.
pub(crate) async fn forward(
    shared: &Shared,
    request: &PodProxy,
    query: Option<&str>,
) -> Result<Response<Bytes>, Failure> {
    let pod = {
        let store = shared.lock_store();
        let kind = store.find_named("pods");
        store
            .get(kind, &key(&request.namespace, &request.pod))
            .cloned()
            .ok_or_else(|| Failure::not_found("pods", &request.pod))?
    };
    if request.scheme.as_deref().is_some_and(|s| s != "http") {
        return Err(Failure::bad_request(format!(
            "the fake API server proxies to pods over plain HTTP only, not {:?}",
            request.scheme.as_deref().unwrap_or_default()
        )));
    }
    let port = match &request.port {
        Some(p) => p.clone(),
        None => first_container_port(&pod).unwrap_or_default(),
    };
    let ip = pod["status"]["podIP"].as_str().unwrap_or_default();
    let addr = format!("{ip}:{port}");
    let path = match query {
        Some(q) => format!("{}?{q}", request.path),
        None => request.path.clone(),
    };
    tokio::time::timeout(DIAL_TIMEOUT, get(&addr, &path))
        .await
        .unwrap_or_else(|_| Err(format!("dial tcp {addr}: i/o timeout")))
        .map_err(|e| Failure::service_unavailable(format!("error trying to reach service: {e}")))
}

/// The port of the pod's first container that has one, as the API server picks it.
fn first_container_port(pod: &Value) -> Option<String> {
    pod["spec"]["containers"]
        .as_array()?
        .iter()
        .find_map(|c| c["ports"][0]["containerPort"].as_u64())
        .map(|p| p.to_string())
}

/// `GET path` from `addr` over HTTP/1.1: its status, content type and body.
async fn get(addr: &str, path: &str) -> Result<Response<Bytes>, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("dial tcp {addr}: connect: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| e.to_string())?;
    let conn = tokio::spawn(conn);
    let request = Request::get(path)
        .header(http::header::HOST, addr)
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let answer = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        let mut forwarded = Response::builder().status(parts.status);
        if let Some(t) = parts.headers.get(http::header::CONTENT_TYPE) {
            forwarded = forwarded.header(http::header::CONTENT_TYPE, t);
        }
        forwarded.body(body).map_err(|e| e.to_string())
    }
    .await;
    conn.abort();
    answer
}
