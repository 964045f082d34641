//! The inbound policy service (gRPC, :8090): what may reach each port of each meshed pod,
//! streamed to the node proxy of the pod's node.
//!
//! A proxy opens one `Watch` for its node (the node token, checked as discovery checks it:
//! a node sees only its own pods). It first receives a snapshot of every meshed pod on the
//! node, then a delta whenever the index changes what one of them may be reached by — a
//! Server, an AuthorizationPolicy or an authentication, a route attached to a Server, an
//! annotation on a namespace or pod: changes apply to running pods at once.
//!
//! - `render`: the index and the defaults → each pod's `PodPolicy` (a pure function).
//! - `authz`: AuthorizationPolicies and their authentications → `Authorization`s.
//! - `server_routes`: the HTTPRoutes/GRPCRoutes attached to Servers → the
//!   `InboundRoute`s of their ports (per-route authorization).
//! - `routes`: the index → every Service's `ServiceRoutes` (outbound; every node gets
//!   all of them).
//! - `publish`: one rendering per change for every stream, each node's share on its own
//!   channel, the routes on one channel all streams share.
//! - `update`: deltas and chunks.

mod authz;
mod metrics;
mod publish;
mod render;
mod routes;
mod server_routes;
mod update;

pub use metrics::PolicyMetrics;
pub use publish::PolicyPublisher;
pub use render::{
    policy_problems, render, render_nodes, Defaults, NodePolicies, Problems, Rendered,
};
pub use routes::{render_routes, RenderedRoutes, RouteProblems, ServiceRoutesMap};
pub use update::{chunks, delta_chunks, diff, diff_services, snapshot_chunks, split};

use crate::auth::NodeAuth;
use crate::discovery::Hub;
use crate::index::SharedIndex;
use ambit_api::proto::policy::inbound_policy_server::{InboundPolicy, InboundPolicyServer};
use ambit_api::proto::policy::{Update, WatchRequest};
use std::pin::Pin;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// Pods per message (a pod's policy is a few hundred bytes: 256 stay far below 1 MiB).
const CHUNK: usize = 256;
/// Bytes per chunk past its first pod (a pod with many authorizations may be large); the
/// proxy decodes up to 16 MiB a message.
const CHUNK_BYTES: usize = 1 << 20;

/// The gRPC inbound policy service.
#[derive(Clone)]
pub struct PolicyService {
    index: SharedIndex,
    /// Discovery's: rendering waits until the backend has loaded everything once.
    started: Hub,
    publisher: PolicyPublisher,
    auth: NodeAuth,
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
        started: Hub,
        auth: NodeAuth,
        defaults: Defaults,
        metrics: PolicyMetrics,
    ) -> Self {
        Self {
            index,
            started,
            publisher: PolicyPublisher::new(defaults, metrics.clone()),
            auth,
            metrics,
            drain: tokio::sync::watch::Sender::new(false).subscribe(),
        }
    }

    /// Ends every stream when `drain` turns true.
    pub fn with_drain(mut self, drain: tokio::sync::watch::Receiver<bool>) -> Self {
        self.drain = drain;
        self
    }

    /// Renders the watched nodes once per change for every stream; runs until `shutdown`.
    pub fn publisher(
        &self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.publisher
            .clone()
            .run(self.index.clone(), self.started.clone(), shutdown)
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
    /// A snapshot, then a delta per change of the node's pods or of any Service's routes,
    /// until the client goes away.
    async fn stream(&self, node: &str, tx: &mpsc::Sender<Result<Update, Status>>) {
        let mut channel = self.publisher.subscribe(node);
        let mut routes = self.publisher.subscribe_routes();
        // The node's first rendering and the routes' (once the backend has loaded
        // everything).
        let first = tokio::select! {
            first = async {
                let pods = channel.wait_for(Option::is_some).await.ok().and_then(|p| p.clone());
                let services = routes.wait_for(Option::is_some).await.ok().and_then(|s| s.clone());
                pods.zip(services)
            } => first,
            _ = tx.closed() => return,
        };
        let Some((mut current, mut services)) = first else {
            return;
        };
        tracing::info!(%node, pods = current.len(), services = services.len(), "policy stream opened");
        if !self
            .send(tx, snapshot_chunks(&current, &services, CHUNK, CHUNK_BYTES))
            .await
        {
            return;
        }
        loop {
            tokio::select! {
                changed = channel.changed() => if changed.is_err() { return },
                changed = routes.changed() => if changed.is_err() { return },
                _ = tx.closed() => return,
            }
            let mut delta = Update::default();
            if let Some(next) = channel.borrow_and_update().clone() {
                delta = diff(&current, &next);
                current = next;
            }
            if let Some(next) = routes.borrow_and_update().clone() {
                // The whole map is shared: the same Arc means nothing changed.
                if !std::sync::Arc::ptr_eq(&services, &next) {
                    diff_services(&services, &next, &mut delta);
                    services = next;
                }
            }
            if update::is_empty(&delta) {
                continue;
            }
            if !self.send(tx, delta_chunks(delta, CHUNK, CHUNK_BYTES)).await {
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
