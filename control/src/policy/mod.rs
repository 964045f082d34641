//! The inbound policy service (gRPC, :8090): what may reach each port of each meshed pod,
//! streamed to the node proxy of the pod's node.
//!
//! A proxy opens one `Watch` for its node (the node token, checked as discovery checks it:
//! a node sees only its own pods). It first receives a snapshot of every meshed pod on the
//! node, then a delta whenever the index changes what one of them may be reached by — an
//! annotation on a namespace or pod applies to running pods at once. Each stream renders
//! only its own node's pods on a change, so the cost of a change is the cluster's meshed
//! pods once, whatever the number of streams.

mod render;

pub use render::{diff, render, snapshot_chunks, Defaults};

use crate::auth::NodeAuth;
use crate::discovery::Publisher;
use crate::index::SharedIndex;
use ambit_api::proto::policy::inbound_policy_server::{InboundPolicy, InboundPolicyServer};
use ambit_api::proto::policy::{Update, WatchRequest};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::pin::Pin;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// Pods per message (a pod's policy is a few hundred bytes: 256 stay far below 1 MiB).
const CHUNK: usize = 256;

/// Streams open, updates sent, watches refused.
#[derive(Clone, Debug, Default)]
pub struct PolicyMetrics {
    streams: Gauge,
    updates: Counter,
    refused: Counter,
}

impl PolicyMetrics {
    /// Creates the metrics and registers them.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register("policy_streams", "Policy streams open", m.streams.clone());
        registry.register(
            "policy_updates",
            "Policy updates sent (snapshots and deltas, in chunks)",
            m.updates.clone(),
        );
        registry.register(
            "policy_watches_refused",
            "Policy watches refused (bad token or another node's name)",
            m.refused.clone(),
        );
        m
    }
}

/// The gRPC inbound policy service.
#[derive(Clone)]
pub struct PolicyService {
    index: SharedIndex,
    /// Discovery's: streams wait until the backend has loaded everything once.
    started: Publisher,
    auth: NodeAuth,
    defaults: Defaults,
    metrics: PolicyMetrics,
    drain: tokio::sync::watch::Receiver<bool>,
}

impl std::fmt::Debug for PolicyService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyService").finish_non_exhaustive()
    }
}

impl PolicyService {
    /// A service that streams `index`'s policy to nodes authenticated by `auth`, once
    /// `started` has.
    pub fn new(
        index: SharedIndex,
        started: Publisher,
        auth: NodeAuth,
        defaults: Defaults,
        metrics: PolicyMetrics,
    ) -> Self {
        Self {
            index,
            started,
            auth,
            defaults,
            metrics,
            drain: tokio::sync::watch::Sender::new(false).subscribe(),
        }
    }

    /// Ends every stream when `drain` turns true.
    pub fn with_drain(mut self, drain: tokio::sync::watch::Receiver<bool>) -> Self {
        self.drain = drain;
        self
    }

    /// The tonic server for this service.
    pub fn into_server(self) -> InboundPolicyServer<Self> {
        InboundPolicyServer::new(self)
    }
}

type UpdateStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<Update, Status>> + Send>>;

#[tonic::async_trait]
impl InboundPolicy for PolicyService {
    type WatchStream = UpdateStream;

    async fn watch(
        &self,
        req: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let node = match self.auth.authenticate(&req).await {
            Ok(node) => node,
            Err(status) => {
                self.metrics.refused.inc();
                return Err(status);
            }
        };
        let want = req.into_inner().node;
        if want != node {
            self.metrics.refused.inc();
            return Err(Status::permission_denied(format!(
                "this token belongs to node {node}, not {want:?}; a proxy may only watch its own node"
            )));
        }
        let (tx, rx) = mpsc::channel(16);
        let this = self.clone();
        tokio::spawn(async move {
            this.metrics.streams.inc();
            let mut drain = this.drain.clone();
            tokio::select! {
                _ = this.stream(&node, &tx) => {}
                _ = async { drop(drain.wait_for(|d| *d).await) } => {
                    let _ = tx.send(Err(Status::unavailable("control plane shutting down; reconnect"))).await;
                }
            }
            this.metrics.streams.dec();
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

impl PolicyService {
    /// A snapshot, then a delta per change, until the client goes away.
    async fn stream(&self, node: &str, tx: &mpsc::Sender<Result<Update, Status>>) {
        tokio::select! {
            _ = self.started.started() => {}
            _ = tx.closed() => return,
        }
        let mut changes = self.index.subscribe();
        changes.mark_unchanged();
        let mut current = render(&self.index.read(), node, &self.defaults);
        tracing::info!(%node, pods = current.len(), "policy stream opened");
        if !self.send(tx, snapshot_chunks(&current, CHUNK)).await {
            return;
        }
        loop {
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                _ = tx.closed() => return,
            }
            let next = render(&self.index.read(), node, &self.defaults);
            let delta = diff(&current, &next);
            current = next;
            if delta.pods.is_empty() && delta.removed_pods.is_empty() {
                continue;
            }
            if !self.send(tx, delta_chunks(delta)).await {
                return;
            }
        }
    }

    async fn send(&self, tx: &mpsc::Sender<Result<Update, Status>>, chunks: Vec<Update>) -> bool {
        for chunk in chunks {
            if tx.send(Ok(chunk)).await.is_err() {
                return false;
            }
            self.metrics.updates.inc();
        }
        true
    }
}

/// A delta in chunks of at most [`CHUNK`] pods (removals in the last).
fn delta_chunks(mut delta: Update) -> Vec<Update> {
    if delta.pods.len() <= CHUNK {
        return vec![delta];
    }
    let pods = std::mem::take(&mut delta.pods);
    let mut chunks: Vec<Update> = pods
        .chunks(CHUNK)
        .map(|c| Update {
            pods: c.to_vec(),
            more: true,
            ..Update::default()
        })
        .collect();
    if let Some(last) = chunks.last_mut() {
        last.removed_pods = delta.removed_pods;
        last.more = false;
    }
    chunks
}
