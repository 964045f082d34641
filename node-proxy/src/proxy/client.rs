//! HTTP clients whose connections leave from a pod's network namespace.

use super::body::Body;
use super::PROXY_MARK;
use crate::netns::Netns;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// How long connecting to an application or endpoint may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects to the `ip:port` authority of a URI from inside a netns, with the proxy's mark.
#[derive(Clone, Debug)]
pub struct NetnsConnector {
    netns: Arc<Netns>,
}

impl tower_service::Service<http::Uri> for NetnsConnector {
    type Response = TokioIo<tokio::net::TcpStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let netns = self.netns.clone();
        Box::pin(async move {
            let addr: SocketAddr = uri
                .authority()
                .and_then(|a| a.as_str().parse().ok())
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{uri} has no ip:port authority"),
                    )
                })?;
            let stream = tokio::time::timeout(CONNECT_TIMEOUT, netns.connect(addr, PROXY_MARK))
                .await
                .map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("connecting to {addr} timed out"),
                    )
                })??;
            Ok(TokioIo::new(stream))
        })
    }
}

/// Pooled HTTP/1 and HTTP/2 clients for one pod.
#[derive(Clone, Debug)]
pub struct PodClients {
    /// HTTP/1.1.
    pub http1: Client<NetnsConnector, Body>,
    /// HTTP/2 with prior knowledge.
    pub http2: Client<NetnsConnector, Body>,
}

impl PodClients {
    /// Clients connecting from `netns`.
    pub fn new(netns: Arc<Netns>) -> Self {
        let connector = NetnsConnector { netns };
        Self {
            http1: Client::builder(TokioExecutor::new()).build(connector.clone()),
            http2: Client::builder(TokioExecutor::new())
                .http2_only(true)
                .build(connector),
        }
    }
}
