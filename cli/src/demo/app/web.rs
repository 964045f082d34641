//! `ambit demo app web`: the HTTP front end. Every request it answers makes two through
//! the mesh — `GET {api}/items` over HTTP/1.1 and `demo.Catalog/Lookup` over gRPC — and it
//! answers 502 naming the back end that failed, so that a failure seen at the edge can
//! be traced to its hop.

use super::catalog::proto::{catalog_client::CatalogClient, LookupRequest};
use super::{get, http_client, respond, serve_http, Body, HttpClient};
use anyhow::Context;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode, Uri};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tonic::transport::{Channel, Endpoint};

/// Flags of `ambit demo app web`.
#[derive(Debug, Clone, clap::Args)]
pub struct WebArgs {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// The HTTP back end, e.g. http://10.96.0.11:8080 (each request GETs `/items`).
    #[arg(long)]
    pub api: Uri,
    /// The gRPC back end, e.g. http://10.96.0.12:9090.
    #[arg(long)]
    pub catalog: Uri,
}

/// How long each call to a back end may take, its body included.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);

/// The item looked up when the request's path names none.
const DEFAULT_ITEM: &str = "widget";

/// Serves the front end on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    args: WebArgs,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let upstreams = Arc::new(Upstreams::new(&args)?);
    let handler = move |request: Request<Incoming>| {
        let upstreams = upstreams.clone();
        async move { upstreams.answer(request).await }
    };
    serve_http(listener, handler, shutdown).await
}

/// The back ends, with their connections kept open across requests.
#[derive(Debug)]
struct Upstreams {
    http: HttpClient,
    items: Uri,
    catalog: CatalogClient<Channel>,
}

impl Upstreams {
    fn new(args: &WebArgs) -> anyhow::Result<Self> {
        let api = args.api.to_string();
        let items = format!("{}/items", api.trim_end_matches('/'))
            .parse()
            .with_context(|| format!("--api {api}: not a base URL"))?;
        // Lazily: the catalog may start after the front end, and its replicas come and go.
        let channel = Endpoint::from(args.catalog.clone())
            .connect_timeout(UPSTREAM_TIMEOUT)
            .connect_lazy();
        Ok(Self {
            http: http_client(),
            items,
            catalog: CatalogClient::new(channel),
        })
    }

    /// Calls both back ends at once; 200 naming both results, or 502 naming each failure.
    async fn answer(&self, request: Request<Incoming>) -> Response<Body> {
        let item = match request.uri().path().trim_matches('/') {
            "" => DEFAULT_ITEM.to_owned(),
            path => path.to_owned(),
        };
        let (api, catalog) = tokio::join!(self.api(), self.lookup(item));
        let text = match (api, catalog) {
            (Ok(api), Ok(catalog)) => {
                return respond(
                    StatusCode::OK,
                    "text/plain",
                    format!("web: {api}; {catalog}\n"),
                )
            }
            (Err(api), Ok(_)) => api,
            (Ok(_), Err(catalog)) => catalog,
            (Err(api), Err(catalog)) => format!("{api}; {catalog}"),
        };
        respond(
            StatusCode::BAD_GATEWAY,
            "text/plain",
            format!("web: {text}\n"),
        )
    }

    /// `GET {api}/items`: what came back, or why it failed.
    async fn api(&self) -> Result<String, String> {
        match get(&self.http, self.items.clone(), UPSTREAM_TIMEOUT).await {
            Ok((status, body)) if status.is_success() => {
                Ok(format!("api answered {status} ({} bytes)", body.len()))
            }
            Ok((status, _)) => Err(format!("api failed: it answered {status}")),
            Err(e) => Err(format!("api failed: {e}")),
        }
    }

    /// `demo.Catalog/Lookup` of `item`: what came back, or why it failed.
    async fn lookup(&self, item: String) -> Result<String, String> {
        let mut catalog = self.catalog.clone();
        let call = catalog.lookup(LookupRequest { item });
        match tokio::time::timeout(UPSTREAM_TIMEOUT, call).await {
            Ok(Ok(reply)) => {
                let reply = reply.into_inner();
                Ok(format!(
                    "catalog: {} in stock of {}, served by {}",
                    reply.stock, reply.item, reply.served_by
                ))
            }
            Ok(Err(status)) => Err(format!(
                "catalog failed: {:?}: {}",
                status.code(),
                status.message()
            )),
            Err(_) => Err(format!(
                "catalog failed: no answer within {UPSTREAM_TIMEOUT:?}"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{api, catalog};
    use super::*;
    use std::future::pending;

    async fn start_api() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(api::serve(listener, pending()));
        addr
    }

    async fn start_catalog(fail_percent: u32) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let args = catalog::CatalogArgs {
            listen: addr,
            fail_percent,
            delay: Duration::ZERO,
            name: "catalog-test".into(),
        };
        tokio::spawn(catalog::serve(listener, args, pending()));
        addr
    }

    /// An address nothing listens on: bound, then closed.
    async fn nothing_listening() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap()
    }

    /// Starts the front end in front of `api` and `catalog`; one GET of `path` through it.
    async fn get_web(api: SocketAddr, catalog: SocketAddr, path: &str) -> (StatusCode, String) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let args = WebArgs {
            listen: addr,
            api: format!("http://{api}").parse().unwrap(),
            catalog: format!("http://{catalog}").parse().unwrap(),
        };
        tokio::spawn(serve(listener, args, pending()));
        let uri = format!("http://{addr}{path}").parse().unwrap();
        let (status, body) = get(&http_client(), uri, Duration::from_secs(10))
            .await
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn both_upstreams_answering_gives_200_naming_both() {
        let (status, body) = get_web(start_api().await, start_catalog(0).await, "/gizmo").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(body.contains("api answered 200 OK"), "{body}");
        assert!(body.contains("of gizmo, served by catalog-test"), "{body}");
    }

    #[tokio::test]
    async fn a_failing_catalog_gives_502_naming_the_catalog_and_its_status() {
        let (status, body) = get_web(start_api().await, start_catalog(100).await, "/").await;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
        assert_eq!(
            body,
            "web: catalog failed: Internal: injected failure (--fail-percent 100)\n"
        );
    }

    #[tokio::test]
    async fn an_api_that_is_down_gives_502_naming_the_api() {
        let (status, body) = get_web(nothing_listening().await, start_catalog(0).await, "/").await;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
        assert!(body.starts_with("web: api failed: "), "{body}");
        assert!(!body.contains("catalog"), "{body}");
    }

    #[tokio::test]
    async fn both_down_gives_502_naming_both() {
        let (status, body) =
            get_web(nothing_listening().await, nothing_listening().await, "/").await;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
        assert!(body.contains("api failed: "), "{body}");
        assert!(body.contains("catalog failed: Unavailable"), "{body}");
    }
}
