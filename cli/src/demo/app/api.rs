//! `ambit demo app api`: the HTTP back end — the same small JSON list for any request.

use super::{respond, serve_http};
use hyper::StatusCode;
use std::future::Future;
use std::net::SocketAddr;
use tokio::net::TcpListener;

/// Flags of `ambit demo app api`.
#[derive(Debug, clap::Args)]
pub struct ApiArgs {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
}

/// What every request gets.
const ITEMS: &str = r#"{"items":[{"name":"widget","price_cents":250},{"name":"gadget","price_cents":1200},{"name":"gizmo","price_cents":799}]}"#;

/// Answers every request on `listener` with [`ITEMS`] until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let handler =
        |_request| async { respond(StatusCode::OK, "application/json", format!("{ITEMS}\n")) };
    serve_http(listener, handler, shutdown).await
}

#[cfg(test)]
mod tests {
    use super::super::{get, http_client};
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn any_path_gets_the_items_as_json() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, std::future::pending()));
        let client = http_client();
        for path in ["/items", "/", "/anything/else"] {
            let uri = format!("http://{addr}{path}").parse().unwrap();
            let (status, body) = get(&client, uri, Duration::from_secs(10)).await.unwrap();
            assert_eq!(status, StatusCode::OK, "{path}");
            let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(json["items"].as_array().map(Vec::len), Some(3), "{path}");
        }
    }
}
