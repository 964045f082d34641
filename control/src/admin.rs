//! The admin server (:9990): `/metrics`, `/ready`, `/live`.

use crate::ready::Readiness;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use prometheus_client::registry::Registry;
use std::sync::Arc;

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
        .with_state(AdminState { registry, ready })
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
