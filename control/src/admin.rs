//! The admin server (:9990): `/metrics`, `/ready`, `/live`, over HTTP/1.1, with at most
//! [`ADMIN_MAX_CONNECTIONS`](crate::limits::ADMIN_MAX_CONNECTIONS) connections and
//! [`ADMIN_HEADER_READ_TIMEOUT`] to send a request's head (a slowloris is closed, not
//! served forever).

use crate::limits::{ConnectionLimit, ADMIN_HEADER_READ_TIMEOUT, ADMIN_WRITE_TIMEOUT};
use crate::ready::Readiness;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use prometheus_client::registry::Registry;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

#[derive(Clone)]
struct AdminState {
    registry: Arc<Registry>,
    ready: Readiness,
}

/// The admin routes. `/ready` answers 200 once nothing in `ready` is pending.
pub fn router(registry: Arc<Registry>, ready: Readiness) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/ready", get(ready_handler))
        .route("/live", get(|| async { "live\n" }))
        .route(
            "/version",
            get(|| async { concat!(env!("CARGO_PKG_VERSION"), "\n") }),
        )
        .with_state(AdminState { registry, ready })
}

/// Serves `router` on `listener` until `shutdown` resolves, then lets open connections
/// finish their request (an idle one closes at once, a slow one within the header-read
/// timeout) and returns.
///
/// Not `axum::serve`: it cannot bound connections nor set hyper's header-read timeout
/// (which needs a timer it does not give).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    mut limit: ConnectionLimit,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(ADMIN_HEADER_READ_TIMEOUT);
    let (closing_tx, closing_rx) = tokio::sync::watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut shutdown => break,
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(error) => {
                    tracing::warn!(%error, "admin: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(permit) = limit.admit(&tcp, peer) else {
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let conn = http.serve_connection(
            TokioIo::new(ambit_serving::WriteDeadline::new(tcp, ADMIN_WRITE_TIMEOUT)),
            TowerToHyperService::new(router.clone()),
        );
        let mut closing = closing_rx.clone();
        tokio::spawn(async move {
            tokio::pin!(conn);
            // Declared after `conn`, so dropped before it: the place is free by the time
            // the client sees the connection close.
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
    let _ = closing_tx.send(true);
    drop(closing_rx);
    // Every connection task holds a receiver: this waits for the last one to end.
    closing_tx.closed().await;
    Ok(())
}

async fn metrics(State(s): State<AdminState>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &s.registry) {
        Ok(()) => (
            StatusCode::OK,
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

async fn ready_handler(State(s): State<AdminState>) -> impl IntoResponse {
    match s.ready.check() {
        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
        Err(pending) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready; waiting for: {}\n", pending.join(", ")),
        ),
    }
}
