//! The admin server (:4191). `/metrics`, `/ready` and `/live` answer anyone (kubelet and
//! Prometheus scrape them over the node's network); the admin views — `/config_dump`,
//! `/log-level`, `/shutdown`, `/renew-certificates` — answer loopback clients only.

use crate::logging::LogLevel;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::Arc;

/// Whether the proxy is ready, and if not, why.
pub type ReadyProbe = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;
/// The effective configuration and state, as JSON (never a private key or token).
pub type ConfigDump = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;
/// Renews every workload certificate now; returns the identities renewed.
pub type RenewCertificates = Arc<dyn Fn() -> Vec<String> + Send + Sync>;

/// What the admin handlers reach.
#[derive(Clone)]
pub struct Admin {
    /// Metrics to expose.
    pub registry: Arc<Registry>,
    /// Readiness.
    pub ready: ReadyProbe,
    /// `/config_dump`.
    pub dump: ConfigDump,
    /// `/log-level`.
    pub log_level: Arc<dyn LogLevel>,
    /// Flipped by `POST /shutdown`.
    pub shutdown: tokio::sync::watch::Sender<bool>,
    /// `POST /renew-certificates` (after the control plane's issuer changed).
    pub renew: RenewCertificates,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin").finish_non_exhaustive()
    }
}

/// How long an admin client may take to send a request's head, and an idle keep-alive
/// connection waits for the next one: scrapers and probes send theirs at once; a slowloris
/// holds a connection this long, not forever.
pub const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// Connections the admin server holds at once (its own cap, apart from the node's budget
/// that pods' traffic may fill): its clients are a Prometheus or two and the kubelet's
/// probes.
pub const MAX_CONNECTIONS: usize = 128;
/// How long an answer may wait for a client that does not read it.
pub const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Serves `router` on `listener` (HTTP/1.1) until `shutdown`, with at most
/// [`MAX_CONNECTIONS`] connections (over it: closed at once, counted in
/// `tcp_connections_refused_total{listener="admin"}`), [`HEADER_READ_TIMEOUT`] and
/// [`WRITE_TIMEOUT`]; then
/// lets the open connections finish their request and returns. The handlers see the
/// client's address (`ConnectInfo`).
///
/// Not `axum::serve`: it bounds neither the connections nor the time to send a request.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: crate::limits::Limits,
    gate: crate::handover::Gate,
    shutdown: impl std::future::Future<Output = ()>,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    let own = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let (closing, _) = tokio::sync::watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = gate.accept(|| listener.accept()) => match accepted {
                Ok(a) => a,
                Err(error) => {
                    tracing::warn!(%error, "admin: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(permit) = limits.admit_own("admin", &own) else {
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let service = TowerToHyperService::new(
            router
                .clone()
                .layer(axum::Extension(axum::extract::ConnectInfo(peer))),
        );
        let io = ambit_serving::WriteDeadline::new(tcp, WRITE_TIMEOUT);
        let conn = http.serve_connection(TokioIo::new(io), service);
        let mut closing = closing.subscribe();
        tokio::spawn(async move {
            tokio::pin!(conn);
            let _permit = permit;
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(error) = r {
                        tracing::debug!(%peer, %error, "admin connection ended");
                    }
                    return;
                }
                _ = closing.wait_for(|c| *c) => conn.as_mut().graceful_shutdown(),
            }
            let _ = conn.await;
            drop(closing);
        });
    }
    drop(listener);
    closing.send_replace(true);
    // Each connection holds a receiver: this returns once the last one has ended.
    closing.closed().await;
}

/// The admin routes; [`serve`] them (the admin views need the client's address).
pub fn router(admin: Admin) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/ready", get(ready))
        .route("/live", get(|| async { "live\n" }))
        .route("/config_dump", get(config_dump))
        .route("/log-level", get(get_log_level).put(put_log_level))
        .route("/shutdown", axum::routing::post(shutdown))
        .route(
            "/renew-certificates",
            axum::routing::post(renew_certificates),
        )
        .with_state(admin)
}

/// `Some(403)` for a client that is not on loopback.
fn loopback_only(peer: SocketAddr) -> Option<Response> {
    if peer.ip().is_loopback() {
        None
    } else {
        Some((
            StatusCode::FORBIDDEN,
            "admin views answer loopback clients only; use `kubectl port-forward` or exec into the proxy\n",
        )
            .into_response())
    }
}

async fn metrics(State(a): State<Admin>) -> Response {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &a.registry) {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {e}\n"),
        )
            .into_response(),
    }
}

async fn ready(State(a): State<Admin>) -> Response {
    match (a.ready)() {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response(),
    }
}

async fn config_dump(
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    State(a): State<Admin>,
) -> Response {
    if let Some(r) = loopback_only(peer) {
        return r;
    }
    let body = serde_json::to_string_pretty(&(a.dump)()).unwrap_or_default();
    ([(header::CONTENT_TYPE, "application/json")], body + "\n").into_response()
}

async fn get_log_level(
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    State(a): State<Admin>,
) -> Response {
    if let Some(r) = loopback_only(peer) {
        return r;
    }
    format!("{}\n", a.log_level.get()).into_response()
}

async fn put_log_level(
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    State(a): State<Admin>,
    body: Bytes,
) -> Response {
    if let Some(r) = loopback_only(peer) {
        return r;
    }
    let filter = String::from_utf8_lossy(&body).trim().to_string();
    match a.log_level.set(&filter) {
        Ok(()) => {
            tracing::info!(%filter, "log filter changed");
            format!("{filter}\n").into_response()
        }
        Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    }
}

async fn shutdown(ConnectInfo(peer): ConnectInfo<SocketAddr>, State(a): State<Admin>) -> Response {
    if let Some(r) = loopback_only(peer) {
        return r;
    }
    tracing::info!("shutdown requested on the admin server; draining");
    a.shutdown.send_replace(true);
    (StatusCode::ACCEPTED, "shutting down\n").into_response()
}

/// Every workload certificate renewed now, off schedule, with its key: after the control
/// plane's issuer changed, so that the node holds certificates of the new issuer before
/// the old trust anchor is removed (docs/OPERATIONS.md). Each keeps being served until its
/// replacement arrives. Answers at once with the identities asked for; `/config_dump`
/// shows the new chains as they arrive.
async fn renew_certificates(
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    State(a): State<Admin>,
) -> Response {
    if let Some(r) = loopback_only(peer) {
        return r;
    }
    let renewing = (a.renew)();
    tracing::info!(
        identities = renewing.len(),
        "certificate renewal requested on the admin server"
    );
    let body = serde_json::json!({ "renewing": renewing }).to_string();
    (
        StatusCode::ACCEPTED,
        [(header::CONTENT_TYPE, "application/json")],
        body + "\n",
    )
        .into_response()
}

#[cfg(test)]
mod tests;
