//! The discovery service (gRPC, :8086): streams the cluster to node proxies.
//!
//! A proxy opens one `Watch` for its node. It first receives a snapshot — every pod with
//! an IP (its node, identity, mesh status, per-port hints; the netns path in local mode)
//! and every Service with its endpoints (each with identity, node and mesh status) — and
//! then deltas whenever the index changes. Cluster-wide workloads are sent, not only the
//! node's own, because a proxy must recognise any meshed pod IP it is asked to reach.

mod metrics;
mod state;

pub use metrics::DiscoveryMetrics;
pub use state::{diff, snapshot, NodeView};

use crate::identity::NodeAuthenticator;
use crate::index::SharedIndex;
use ambit_api::proto::discovery::discovery_server::{Discovery, DiscoveryServer};
use ambit_api::proto::discovery::{Update, WatchRequest};
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// The gRPC discovery service.
#[derive(Clone)]
pub struct DiscoveryService {
    index: SharedIndex,
    auth: Arc<dyn NodeAuthenticator>,
    metrics: DiscoveryMetrics,
    drain: tokio::sync::watch::Receiver<bool>,
}

impl std::fmt::Debug for DiscoveryService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscoveryService").finish_non_exhaustive()
    }
}

impl DiscoveryService {
    /// A service that streams `index` to nodes authenticated by `auth`.
    pub fn new(
        index: SharedIndex,
        auth: Arc<dyn NodeAuthenticator>,
        metrics: DiscoveryMetrics,
    ) -> Self {
        Self {
            index,
            auth,
            metrics,
            drain: tokio::sync::watch::Sender::new(false).subscribe(),
        }
    }

    /// Ends every stream when `drain` turns true, so that shutdown is not held up by
    /// proxies that never hang up.
    pub fn with_drain(mut self, drain: tokio::sync::watch::Receiver<bool>) -> Self {
        self.drain = drain;
        self
    }

    /// The tonic server for this service.
    pub fn into_server(self) -> DiscoveryServer<Self> {
        DiscoveryServer::new(self)
    }
}

type UpdateStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<Update, Status>> + Send>>;

#[tonic::async_trait]
impl Discovery for DiscoveryService {
    type WatchStream = UpdateStream;

    async fn watch(
        &self,
        req: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let node = match crate::identity::authenticate(self.auth.as_ref(), &req).await {
            Ok(node) => node,
            Err(status) => {
                self.metrics.refused();
                return Err(status);
            }
        };
        let want = req.into_inner().node;
        if want != node {
            self.metrics.refused();
            return Err(Status::permission_denied(format!(
                "this token belongs to node {node}, not {want:?}; a proxy may only watch its own node"
            )));
        }
        let (tx, rx) = mpsc::channel(16);
        let index = self.index.clone();
        let metrics = self.metrics.clone();
        let mut drain = self.drain.clone();
        tokio::spawn(async move {
            metrics.stream_opened();
            tokio::select! {
                _ = stream_updates(&index, &node, &tx, &metrics) => {}
                _ = async { drop(drain.wait_for(|d| *d).await) } => {
                    let _ = tx.send(Err(Status::unavailable("control plane shutting down; reconnect"))).await;
                }
            }
            metrics.stream_closed();
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Sends a snapshot, then a delta after each index change, until the client goes away.
async fn stream_updates(
    index: &SharedIndex,
    node: &str,
    tx: &mpsc::Sender<Result<Update, Status>>,
    metrics: &DiscoveryMetrics,
) {
    let mut changes = index.subscribe();
    changes.mark_unchanged();
    let mut sent = snapshot(&index.read());
    tracing::info!(%node, workloads = sent.workloads.len(), services = sent.services.len(), "discovery stream opened");
    if tx.send(Ok(sent.to_update(true))).await.is_err() {
        return;
    }
    metrics.update_sent();
    loop {
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            _ = tx.closed() => return,
        }
        let now = snapshot(&index.read());
        let delta = diff(&sent, &now);
        sent = now;
        if let Some(update) = delta {
            if tx.send(Ok(update)).await.is_err() {
                return;
            }
            metrics.update_sent();
        }
    }
}
