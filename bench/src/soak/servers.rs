//! The applications of the server pods and churn pods, run in this process on listeners
//! bound inside each pod's network namespace: HTTP/1.1 and HTTP/2 (h2c) on one port, a
//! unary gRPC service, and a TCP echo on the opaque port. Aborted on drop, connections
//! and all (a churn pod's server goes with its pod).

use crate::cluster::{GRPC_PORT, HTTP_PORT, OPAQUE_PORT};
use ambit_api::proto::identity::identity_server::{Identity, IdentityServer};
use ambit_api::proto::identity::{CertifyRequest, CertifyResponse};
use ambit_proxy::netns::Netns;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

/// A pod's running servers; aborted on drop.
#[derive(Debug, Default)]
pub struct Servers(Vec<JoinHandle<()>>);

impl Drop for Servers {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// Starts `name`'s HTTP server in the netns at `netns` and, with `all`, its gRPC and
/// echo servers.
pub async fn start(netns: &Path, name: &str, all: bool) -> anyhow::Result<Servers> {
    let ns = Netns::open(netns)?;
    let bind = |port: u16| ns.bind(SocketAddr::from(([0, 0, 0, 0], port)));
    let mut servers = Servers::default();
    servers
        .0
        .push(tokio::spawn(http(bind(HTTP_PORT).await?, name.to_string())));
    if all {
        servers.0.push(tokio::spawn(echo(bind(OPAQUE_PORT).await?)));
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(bind(GRPC_PORT).await?);
        servers.0.push(tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(IdentityServer::new(Unary))
                .serve_with_incoming(incoming)
                .await;
        }));
    }
    Ok(servers)
}

/// Accepts on `listener`, each connection served by `conn` in a set the accept loop owns
/// (so that aborting the loop ends them too).
async fn accept_loop<F, Fut>(listener: TcpListener, conn: F)
where
    F: Fn(tokio::net::TcpStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((s, _)) => {
                    conns.spawn(conn(s));
                }
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// HTTP/1.1 and HTTP/2: 200 `ok <name>` to every request, after reading its body.
async fn http(listener: TcpListener, name: String) {
    let body: Bytes = format!("ok {name}").into();
    accept_loop(listener, move |s| {
        let body = body.clone();
        async move {
            let svc =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let body = body.clone();
                    async move {
                        let _ = req.into_body().collect().await;
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(body)))
                    }
                });
            let _ =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                    .await;
        }
    })
    .await
}

/// Echoes every byte back, then half-closes when the client has.
async fn echo(listener: TcpListener) {
    accept_loop(listener, |mut s| async move {
        let (mut r, mut w) = s.split();
        let _ = tokio::io::copy(&mut r, &mut w).await;
        let _ = w.shutdown().await;
    })
    .await
}

/// A unary gRPC service: the identity service's `Certify` as a stand-in, answering an
/// empty response at once.
#[derive(Debug, Clone, Copy)]
struct Unary;

#[tonic::async_trait]
impl Identity for Unary {
    async fn certify(
        &self,
        _: tonic::Request<CertifyRequest>,
    ) -> Result<tonic::Response<CertifyResponse>, tonic::Status> {
        Ok(tonic::Response::new(CertifyResponse::default()))
    }
}
