//! The discovery service (gRPC, :8086): streams the cluster to node proxies.
//!
//! A proxy opens one `Watch` for its node. It first receives a snapshot — every pod with
//! an IP (its node, identity, mesh status, per-port hints; the netns path in local mode)
//! and every Service with its endpoints (each with identity, node and mesh status) — and
//! then deltas whenever the index changes. Cluster-wide workloads are sent, not only the
//! node's own, because a proxy must recognise any meshed pod IP it is asked to reach.

mod metrics;
mod publish;
mod state;

pub use metrics::DiscoveryMetrics;
pub use publish::{Publisher, Rendering};
pub use state::{diff, snapshot, NodeView};

use crate::auth::NodeAuth;
use crate::index::SharedIndex;
use ambit_api::proto::discovery::discovery_server::{Discovery, DiscoveryServer};
use ambit_api::proto::discovery::{Update, WatchRequest};
use std::pin::Pin;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// The gRPC discovery service.
#[derive(Clone)]
pub struct DiscoveryService {
    index: SharedIndex,
    publisher: Publisher,
    auth: NodeAuth,
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
    pub fn new(index: SharedIndex, auth: NodeAuth, metrics: DiscoveryMetrics) -> Self {
        Self {
            publisher: Publisher::new(&index),
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

    /// Renders the index once per change for every stream; runs until `shutdown`.
    /// Streams wait until `ready` (the backend has loaded everything).
    pub fn publisher(
        &self,
        ready: crate::ready::Readiness,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.publisher
            .clone()
            .run(self.index.clone(), ready, shutdown)
    }

    /// The publisher, whose `started` other services wait on too (nothing is served
    /// before the backend has loaded everything once).
    pub fn publisher_handle(&self) -> Publisher {
        self.publisher.clone()
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
        let node = match self.auth.authenticate(&req).await {
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
        let publisher = self.publisher.clone();
        let metrics = self.metrics.clone();
        let mut drain = self.drain.clone();
        tokio::spawn(async move {
            metrics.stream_opened();
            tokio::select! {
                _ = stream_updates(&publisher, &node, &tx, &metrics) => {}
                _ = async { drop(drain.wait_for(|d| *d).await) } => {
                    let _ = tx.send(Err(Status::unavailable("control plane shutting down; reconnect"))).await;
                }
            }
            metrics.stream_closed();
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Resources per snapshot message. A snapshot of the whole cluster in one message would
/// pass tonic's 4 MiB decode limit at about 27,000 pods, and each stream's encode buffer
/// keeps the size of the largest message it sent: 1,000 streams of a 10,000-pod
/// snapshot held 1.6 GB (BENCHMARKS.md, "Discovery fan-out").
const SNAPSHOT_CHUNK: usize = 256;
/// Bytes per chunk, snapshot or delta (one resource larger than this goes alone): with 256
/// resources a chunk of Services with many endpoints reached 770 KB in the 100,000-pod
/// test; a chunk is cut at the first of the two bounds.
const CHUNK_BYTES: usize = 1 << 20;

/// Sends `rendering` as a snapshot in chunks; false when the client has gone.
async fn send_snapshot(
    rendering: &Rendering,
    tx: &mpsc::Sender<Result<Update, Status>>,
    metrics: &DiscoveryMetrics,
) -> bool {
    for chunk in rendering.view.snapshot_chunks(SNAPSHOT_CHUNK, CHUNK_BYTES) {
        if tx.send(Ok(chunk)).await.is_err() {
            return false;
        }
        metrics.update_sent();
    }
    true
}

/// Sends a snapshot, then each published delta, until the client goes away. A stream that
/// fell behind the broadcast gets a fresh snapshot.
async fn stream_updates(
    publisher: &Publisher,
    node: &str,
    tx: &mpsc::Sender<Result<Update, Status>>,
    metrics: &DiscoveryMetrics,
) {
    // Nothing until the backend has loaded the whole cluster once.
    tokio::select! {
        _ = publisher.started() => {}
        _ = tx.closed() => return,
    }
    let mut deltas = publisher.subscribe();
    let start = publisher.latest();
    tracing::info!(%node, workloads = start.view.workloads.len(), services = start.view.services.len(), "discovery stream opened");
    let mut version = start.version;
    if !send_snapshot(&start, tx, metrics).await {
        return;
    }
    drop(start);
    loop {
        let received = tokio::select! {
            received = deltas.recv() => received,
            _ = tx.closed() => return,
        };
        let chunks = match received {
            Ok((v, _)) if v <= version => continue,
            Ok((v, delta)) if v == version + 1 => {
                version = v;
                delta
            }
            Ok(_) | Err(RecvError::Lagged(_)) => {
                let latest = publisher.latest();
                tracing::info!(%node, from = version, to = latest.version, "discovery stream fell behind; sending a snapshot");
                metrics.resynced();
                version = latest.version;
                if !send_snapshot(&latest, tx, metrics).await {
                    return;
                }
                continue;
            }
            Err(RecvError::Closed) => return,
        };
        for chunk in chunks.iter() {
            if tx.send(Ok(Update::clone(chunk))).await.is_err() {
                return;
            }
            metrics.update_sent();
        }
    }
}

#[cfg(test)]
mod tests;
