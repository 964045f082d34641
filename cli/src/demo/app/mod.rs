//! The demo's sample application (`ambit demo app <web|api|catalog|load>`): small servers
//! and a load generator that the demo starts inside its pods' network namespaces, where
//! they bind and connect as any workload does — the mesh is invisible to them.
//!
//! # Layout
//!
//! - `web`: the HTTP front end; each request calls `api` over HTTP and `catalog` over
//!   gRPC, and answers 502 naming the one that failed.
//! - `api`: the HTTP back end, a fixed JSON list.
//! - `catalog`: the gRPC back end (`demo.Catalog/Lookup`), failing a set share of calls
//!   and adding a set delay on demand.
//! - `load`: a bounded load generator: a fixed rate, a cap on requests in flight.
//!
//! Each has a `serve`/`run` function that takes an already-bound listener (when it has
//! one) and a shutdown future, so that tests run it on `127.0.0.1:0`.

mod api;
mod catalog;
mod load;
mod web;

use anyhow::Context;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::graceful::GracefulShutdown;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpListener;

/// An app of the demo.
#[derive(Debug, clap::Subcommand)]
pub enum AppCommand {
    /// HTTP front end
    Web(web::WebArgs),
    /// HTTP back end
    Api(api::ApiArgs),
    /// gRPC back end
    Catalog(catalog::CatalogArgs),
    /// bounded load generator
    Load(load::LoadArgs),
}

/// Runs one app until SIGTERM or SIGINT.
pub fn run(cmd: AppCommand) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async {
        match cmd {
            AppCommand::Web(args) => {
                let listener = bind("web", args.listen).await?;
                web::serve(listener, args, shutdown_signal()).await
            }
            AppCommand::Api(args) => {
                let listener = bind("api", args.listen).await?;
                api::serve(listener, shutdown_signal()).await
            }
            AppCommand::Catalog(args) => {
                let listener = bind("catalog", args.listen).await?;
                catalog::serve(listener, args, shutdown_signal()).await
            }
            AppCommand::Load(args) => {
                eprintln!(
                    "load: GET {} at {}/s, at most {} in flight (a request due when all \
                     are busy is skipped)",
                    args.target, args.rps, args.concurrency
                );
                let total = load::run(args, shutdown_signal()).await?;
                eprintln!("load: in all: {total}");
                Ok(())
            }
        }
    })
}

async fn bind(app: &str, addr: SocketAddr) -> anyhow::Result<TcpListener> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("{app}: binding {addr}"))?;
    eprintln!("{app}: listening on {addr}");
    Ok(listener)
}

/// Resolves on SIGTERM (how the demo stops its apps) or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// The body of every HTTP answer the apps give.
type Body = Full<Bytes>;

/// How long open connections get to finish their requests once shutdown begins.
const DRAIN_GRACE: Duration = Duration::from_secs(5);

/// Serves HTTP/1.1 and HTTP/2 on `listener` with `handler` until `shutdown`, then lets
/// open connections finish for up to [`DRAIN_GRACE`].
async fn serve_http<H, F>(
    listener: TcpListener,
    handler: H,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()>
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let server = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, most likely: wait rather than spin.
                    eprintln!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let handler = handler.clone();
        let service = hyper::service::service_fn(move |req| {
            let answer = handler(req);
            async move { Ok::<_, Infallible>(answer.await) }
        });
        let conn = server.serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn.into_owned());
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(DRAIN_GRACE, graceful.shutdown()).await;
    Ok(())
}

/// A response with `status`, a content type and `body`.
fn respond(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}

/// The HTTP client of `web` and `load`: plain HTTP, connections kept alive in a pool.
type HttpClient = Client<HttpConnector, Empty<Bytes>>;

fn http_client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(connector)
}

/// `GET uri`, body and all (a connection goes back to the pool only once its response
/// has been read), within `timeout`; the error says what went wrong, for a person.
async fn get(
    client: &HttpClient,
    uri: Uri,
    timeout: Duration,
) -> Result<(StatusCode, Bytes), String> {
    let exchange = async {
        let response = client.get(uri).await.map_err(|e| error_chain(&e))?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("reading the body: {}", error_chain(&e)))?;
        Ok((status, body.to_bytes()))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {timeout:?}")))
}

/// An error and its causes, `: `-separated (hyper's own message alone is "client error
/// (Connect)"; the cause says "Connection refused").
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
