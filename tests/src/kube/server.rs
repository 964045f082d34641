//! HTTPS and routing: the caller's bearer token, the API paths kube-rs builds, list and
//! get (with `limit`/`continue` paging and selectors); watches go to `watch`, reviews
//! to `tokenreview`, pods/proxy to `proxy`.

use super::proxy::PodProxy;
use super::select::Filter;
use super::status::Failure;
use super::store::{key, Store};
use super::watch::WatchRequest;
use super::{proxy, tokenreview, watch, RequestRecord, Shared};
use bytes::Bytes;
use futures::StreamExt;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// A response body: whole, or a watch's stream.
type Body = UnsyncBoxBody<Bytes, Infallible>;

/// When `timeoutSeconds` is absent the API server picks 30 to 60 minutes.
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

/// Accepts connections until the task is aborted. While the server is down, a
/// connection is closed as soon as it is accepted.
pub(crate) async fn serve(listener: TcpListener, tls: TlsAcceptor, shared: Arc<Shared>) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        // Subscribed before looking at `down`: an outage that starts in between still
        // cuts this connection.
        let mut sever = shared.sever.subscribe();
        if shared.down.load(Ordering::SeqCst) {
            drop(tcp);
            continue;
        }
        let tls = tls.clone();
        let shared = shared.clone();
        tokio::spawn(async move {
            let conn = async {
                let Ok(stream) = tls.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(|req| {
                    let shared = shared.clone();
                    async move { Ok::<_, Infallible>(handle(&shared, req).await) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            };
            // Severing drops the connection (and any watch it carries) mid-flight, as an
            // API server that goes away does.
            tokio::select! {
                _ = conn => {}
                _ = sever.changed() => {}
            }
        });
    }
}

/// What a path names.
#[derive(Debug)]
enum Route {
    Objects {
        kind: usize,
        namespace: Option<String>,
        name: Option<String>,
    },
    TokenReviews,
    Version,
    PodProxy(PodProxy),
}

async fn handle(shared: &Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let method = req.method().clone();
    let uri = req.uri().to_string();
    let query = query(req.uri().query().unwrap_or_default());
    let authorized = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| t == shared.settings.control_token);
    let route = route(&shared.lock_store(), req.uri().path());
    let (verb, resource) = describe(shared, &method, &route, req.uri().path(), &query);
    let response = if !authorized {
        failure(&Failure::unauthorized())
    } else if shared.is_forbidden(&resource) {
        failure(&Failure::forbidden(&verb, &resource))
    } else {
        match (route, method.clone()) {
            (Some(Route::Version), Method::GET) => whole(200, &version()),
            (Some(Route::PodProxy(target)), Method::GET) => {
                match proxy::forward(shared, &target, req.uri().query()).await {
                    Ok(answer) => answer.map(|b| UnsyncBoxBody::new(Full::new(b))),
                    Err(f) => failure(&f),
                }
            }
            (Some(Route::TokenReviews), Method::POST) => match req.into_body().collect().await {
                Ok(body) => create_review(shared, &body.to_bytes()),
                Err(e) => failure(&Failure::bad_request(e.to_string())),
            },
            (
                Some(Route::Objects {
                    kind,
                    namespace,
                    name,
                }),
                Method::GET,
            ) => {
                let flag = |k: &str| matches!(query.get(k).map(String::as_str), Some("true" | "1"));
                match (name, flag("watch")) {
                    (Some(name), _) => get(shared, kind, namespace.as_deref(), &name),
                    (None, true) => start_watch(shared, kind, namespace, &query),
                    (None, false) => list(shared, kind, namespace, &query),
                }
            }
            (Some(_), m) => failure(&Failure::method_not_allowed(m.as_str())),
            (None, _) => failure(&Failure::no_such_resource()),
        }
    };
    shared.record(RequestRecord {
        method: method.to_string(),
        uri,
        verb,
        resource,
        status: response.status().as_u16(),
    });
    response
}

/// The API server's verb and resource for a request, as its audit log names them (also
/// for a resource this server does not have: a kind whose CRD is not installed).
fn describe(
    shared: &Shared,
    method: &Method,
    route: &Option<Route>,
    path: &str,
    query: &HashMap<String, String>,
) -> (String, String) {
    let watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    let objects_verb = |named: bool| match (named, watch) {
        (true, _) => "get",
        (false, true) => "watch",
        (false, false) => "list",
    };
    let (verb, resource) = match (route, method) {
        (Some(Route::TokenReviews), _) => ("create", "tokenreviews".to_string()),
        (Some(Route::Version), _) => ("get", "version".to_string()),
        (Some(Route::PodProxy(_)), m) => (
            if m == Method::GET { "get" } else { "other" },
            "pods/proxy".to_string(),
        ),
        (Some(Route::Objects { kind, name, .. }), &Method::GET) => (
            objects_verb(name.is_some()),
            shared.lock_store().ty(*kind).plural.clone(),
        ),
        (Some(Route::Objects { kind, .. }), _) => {
            ("other", shared.lock_store().ty(*kind).plural.clone())
        }
        (None, m) => match ObjectPath::parse(path) {
            Some(p) if m == Method::GET => (objects_verb(p.name.is_some()), p.plural.into()),
            _ => ("unknown", String::new()),
        },
    };
    (verb.to_string(), resource)
}

/// A path that names objects, served or not: `/api/v1/[namespaces/NS/]PLURAL[/NAME]` or
/// `/apis/GROUP/VERSION/[namespaces/NS/]PLURAL[/NAME]`.
struct ObjectPath<'a> {
    group: &'a str,
    version: &'a str,
    namespace: Option<&'a str>,
    plural: &'a str,
    name: Option<&'a str>,
}

impl<'a> ObjectPath<'a> {
    fn parse(path: &'a str) -> Option<Self> {
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (group, version, rest) = match segments[..] {
            ["api", version, ref rest @ ..] => ("", version, rest),
            ["apis", group, version, ref rest @ ..] => (group, version, rest),
            _ => return None,
        };
        let (namespace, plural, name) = match *rest {
            ["namespaces", ns, plural] => (Some(ns), plural, None),
            ["namespaces", ns, plural, name] => (Some(ns), plural, Some(name)),
            [plural] => (None, plural, None),
            [plural, name] => (None, plural, Some(name)),
            _ => return None,
        };
        Some(Self {
            group,
            version,
            namespace,
            plural,
            name,
        })
    }
}

/// `/version`, pods/proxy, TokenReviews, and the objects of the kinds the store serves.
fn route(store: &Store, path: &str) -> Option<Route> {
    if let Some(target) = PodProxy::parse(path) {
        return Some(Route::PodProxy(target));
    }
    match path.trim_matches('/') {
        "version" => return Some(Route::Version),
        "apis/authentication.k8s.io/v1/tokenreviews" => return Some(Route::TokenReviews),
        _ => {}
    }
    let p = ObjectPath::parse(path)?;
    let kind = store.find(p.group, p.version, p.plural)?;
    if p.namespace.is_some() && !store.ty(kind).namespaced {
        return None;
    }
    if p.name.is_some() && p.namespace.is_none() && store.ty(kind).namespaced {
        return None;
    }
    Some(Route::Objects {
        kind,
        namespace: p.namespace.map(String::from),
        name: p.name.map(String::from),
    })
}

fn get(shared: &Shared, kind: usize, namespace: Option<&str>, name: &str) -> Response<Body> {
    let store = shared.lock_store();
    match store.get(kind, &key(namespace.unwrap_or_default(), name)) {
        Some(object) => whole(200, object),
        None => failure(&Failure::not_found(&store.ty(kind).plural, name)),
    }
}

fn list(
    shared: &Shared,
    kind: usize,
    namespace: Option<String>,
    query: &HashMap<String, String>,
) -> Response<Body> {
    match super::list::list(&shared.lock_store(), kind, namespace, query) {
        Ok(list) => whole(200, &list),
        Err(f) => failure(&f),
    }
}

fn start_watch(
    shared: &Arc<Shared>,
    kind: usize,
    namespace: Option<String>,
    query: &HashMap<String, String>,
) -> Response<Body> {
    let ty = shared.lock_store().ty(kind).clone();
    let q = |k: &str| query.get(k).map(String::as_str);
    let filter = match Filter::parse(&ty, namespace, q("labelSelector"), q("fieldSelector")) {
        Ok(f) => f,
        Err(f) => return failure(&f),
    };
    let timeout = q("timeoutSeconds")
        .and_then(|t| t.parse().ok())
        .map_or(DEFAULT_WATCH_TIMEOUT, Duration::from_secs);
    let request = WatchRequest {
        kind,
        filter,
        rv: q("resourceVersion").map(String::from),
        bookmarks: q("allowWatchBookmarks") == Some("true"),
        initial_events: q("sendInitialEvents") == Some("true"),
        timeout,
    };
    match watch::start(shared, request) {
        Ok(lines) => {
            let body = StreamBody::new(lines.map(|line| Ok(Frame::data(line))));
            Response::builder()
                .status(StatusCode::OK)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(UnsyncBoxBody::new(body))
                .unwrap_or_default()
        }
        Err(f) => failure(&f),
    }
}

fn create_review(shared: &Shared, body: &[u8]) -> Response<Body> {
    let answer = {
        let store = shared.lock_store();
        let tokens = shared.tokens.lock().unwrap_or_else(|e| e.into_inner());
        tokenreview::review(&store, &tokens, body)
    };
    match answer {
        Ok(review) => {
            shared.token_reviews.fetch_add(1, Ordering::SeqCst);
            whole(201, &review)
        }
        Err(f) => failure(&f),
    }
}

fn version() -> Value {
    json!({
        "major": "1",
        "minor": "34",
        "gitVersion": "v1.34.0-ambit-fake",
        "platform": "linux/amd64",
    })
}

fn whole(code: u16, body: &Value) -> Response<Body> {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(UnsyncBoxBody::new(Full::new(Bytes::from(bytes))))
        .unwrap_or_default()
}

fn failure(f: &Failure) -> Response<Body> {
    whole(f.code, &f.to_status())
}

/// The query's parameters, percent-decoded (the last of a repeated one wins).
fn query(raw: &str) -> HashMap<String, String> {
    raw.split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'+', _) => out.push(b' '),
            (b'%', Some(b)) => {
                out.push(b);
                i += 2;
            }
            (b, _) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
