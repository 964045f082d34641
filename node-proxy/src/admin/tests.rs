use super::*;
use axum::body::Body;
use axum::http::{Method, Request};
use http_body_util::BodyExt;
use std::sync::Mutex;
use tower::ServiceExt;

/// A log level that records what it is set to (the real one needs a global subscriber).
struct Recorded(Mutex<String>);

impl LogLevel for Recorded {
    fn get(&self) -> String {
        self.0.lock().unwrap().clone()
    }
    fn set(&self, filter: &str) -> Result<(), String> {
        tracing_subscriber::EnvFilter::try_new(filter).map_err(|e| e.to_string())?;
        *self.0.lock().unwrap() = filter.into();
        Ok(())
    }
}

fn admin(ready: Result<(), String>) -> (Router, tokio::sync::watch::Receiver<bool>) {
    let (tx, rx) = tokio::sync::watch::channel(false);
    let a = Admin {
        registry: Arc::new(Registry::default()),
        ready: Arc::new(move || ready.clone()),
        dump: Arc::new(|| serde_json::json!({"identities": []})),
        log_level: Arc::new(Recorded(Mutex::new("info".into()))),
        shutdown: tx,
        renew: Arc::new(|| vec!["spiffe://cluster.local/ns/shop/sa/web".into()]),
    };
    (router(a), rx)
}

async fn call(
    r: &Router,
    method: Method,
    path: &str,
    from: [u8; 4],
    body: &str,
) -> (StatusCode, String) {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .body(Body::from(body.to_string()))
        .unwrap();
    req.extensions_mut()
        .insert(ConnectInfo(SocketAddr::from((from, 40000))));
    let resp = r.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

const LOOPBACK: [u8; 4] = [127, 0, 0, 1];
const REMOTE: [u8; 4] = [10, 0, 0, 7];

#[tokio::test]
async fn admin_views_answer_loopback_only() {
    let (r, rx) = admin(Ok(()));
    for (method, path) in [
        (Method::GET, "/config_dump"),
        (Method::GET, "/log-level"),
        (Method::PUT, "/log-level"),
        (Method::POST, "/shutdown"),
        (Method::POST, "/renew-certificates"),
    ] {
        let (status, body) = call(&r, method.clone(), path, REMOTE, "debug").await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}");
        assert!(body.contains("loopback clients only"), "{body}");
    }
    assert!(!*rx.borrow(), "a remote client cannot shut the proxy down");
    // Probes and metrics answer anyone.
    assert_eq!(
        call(&r, Method::GET, "/ready", REMOTE, "").await.0,
        StatusCode::OK
    );
    assert_eq!(
        call(&r, Method::GET, "/live", REMOTE, "").await.0,
        StatusCode::OK
    );
    assert_eq!(
        call(&r, Method::GET, "/metrics", REMOTE, "").await.0,
        StatusCode::OK
    );
}

#[tokio::test]
async fn log_level_is_read_changed_and_validated() {
    let (r, _) = admin(Ok(()));
    assert_eq!(
        call(&r, Method::GET, "/log-level", LOOPBACK, "").await.1,
        "info\n"
    );
    let (status, _) = call(
        &r,
        Method::PUT,
        "/log-level",
        LOOPBACK,
        "ambit_proxy=debug,info",
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        call(&r, Method::GET, "/log-level", LOOPBACK, "").await.1,
        "ambit_proxy=debug,info\n"
    );
    let (status, body) = call(&r, Method::PUT, "/log-level", LOOPBACK, "ambit_proxy=loud").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(
        call(&r, Method::GET, "/log-level", LOOPBACK, "").await.1,
        "ambit_proxy=debug,info\n"
    );
}

#[tokio::test]
async fn not_ready_says_why_and_shutdown_flips_the_drain() {
    let (r, rx) = admin(Err(
        "no valid certificate yet for spiffe://cluster.local/ns/a/sa/b".into(),
    ));
    let (status, body) = call(&r, Method::GET, "/ready", REMOTE, "").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("spiffe://cluster.local/ns/a/sa/b"), "{body}");
    assert_eq!(
        call(&r, Method::POST, "/shutdown", LOOPBACK, "").await.0,
        StatusCode::ACCEPTED
    );
    assert!(*rx.borrow());
}

#[tokio::test]
async fn renew_certificates_answers_with_the_identities_renewed() {
    let (r, _) = admin(Ok(()));
    let (status, body) = call(&r, Method::POST, "/renew-certificates", LOOPBACK, "").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        body,
        serde_json::json!({"renewing": ["spiffe://cluster.local/ns/shop/sa/web"]})
    );
    assert_eq!(
        call(&r, Method::GET, "/renew-certificates", LOOPBACK, "")
            .await
            .0,
        StatusCode::METHOD_NOT_ALLOWED
    );
}
