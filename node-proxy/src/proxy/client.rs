//! HTTP clients whose connections leave from a pod's network namespace.

use super::body::Body;
use super::PROXY_MARK;
use crate::netns::Netns;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// How long connecting to an application or endpoint may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects to one target from inside a netns, with the proxy's mark, whatever authority
/// the request names (the authority is the application's, and is kept as it was).
#[derive(Clone, Debug)]
pub struct NetnsConnector {
    netns: Arc<Netns>,
    target: SocketAddr,
}

impl tower_service::Service<http::Uri> for NetnsConnector {
    type Response = TokioIo<tokio::net::TcpStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: http::Uri) -> Self::Future {
        let (netns, addr) = (self.netns.clone(), self.target);
        Box::pin(async move {
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

/// A client of one target, and when it was last used.
type Pooled = (Client<NetnsConnector, Body>, Instant);

/// Pooled HTTP/1.1 and HTTP/2 clients of one pod, one per target endpoint.
#[derive(Debug)]
pub struct PodClients {
    netns: Arc<Netns>,
    clients: Mutex<HashMap<(SocketAddr, bool), Pooled>>,
}

impl PodClients {
    /// Clients connecting from `netns`.
    pub fn new(netns: Arc<Netns>) -> Self {
        Self {
            netns,
            clients: Mutex::default(),
        }
    }

    /// Drops the clients (and their idle connections) of targets that `known` no longer
    /// names (endpoints that left discovery) and that were not used for `idle` (a
    /// destination outside the cluster is never known, and keeps its client while in use).
    /// Returns how many remain.
    pub fn prune(&self, known: impl Fn(SocketAddr) -> bool, idle: Duration) -> usize {
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        clients.retain(|(target, _), (_, used)| known(*target) || used.elapsed() < idle);
        clients.len()
    }

    /// The client for `target`, speaking HTTP/2 (prior knowledge) or HTTP/1.1.
    pub fn get(&self, target: SocketAddr, http2: bool) -> Client<NetnsConnector, Body> {
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        let (client, used) = clients.entry((target, http2)).or_insert_with(|| {
            let connector = NetnsConnector {
                netns: self.netns.clone(),
                target,
            };
            let mut b = Client::builder(TokioExecutor::new());
            b.http2_only(http2);
            (b.build(connector), Instant::now())
        });
        *used = Instant::now();
        client.clone()
    }
}
