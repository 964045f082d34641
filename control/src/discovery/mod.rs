//! The discovery service (gRPC, :8086): each node proxy is sent what its pods use, not
//! the cluster.
//!
//! A proxy opens one `Watch` for its node and is sent the pods scheduled there (what its
//! listeners, identities and inbound policy need), then whatever it subscribes to on the
//! same stream: an address one of its pods connects to (a Service's ClusterIP → the
//! Service and its endpoints, each with the identity to require, its node and opaque
//! ports; a pod IP → that pod; anything else → "not in the cluster") or a Service by
//! name (a route's backend). Each subscription is answered with a resolution and kept
//! current until the proxy unsubscribes, as Linkerd's destination service answers `Get`
//! per authority and Istio's on-demand discovery does for ztunnel.
//!
//! Layout:
//! - `render`: one object of the index as protobuf.
//! - `catalog`: every pod and Service rendered once, kept current object by object from
//!   the index's [`crate::index::Changes`] — a change costs the objects it touches.
//! - `streams`: which stream holds what, and the change's pieces on the queues of the
//!   streams that hold it (and no other).
//! - `stream`: one proxy's stream: its requests, a snapshot, then its queue as updates in
//!   bounded chunks.

mod catalog;
mod metrics;
mod render;
mod stream;
mod streams;

pub use catalog::{Catalog, Changed, RenderedService, Resolved};
pub use metrics::DiscoveryMetrics;
pub use stream::updates;
pub use streams::{canonical, Out, Registered, StreamId, Streams, MAX_TARGETS};

use crate::auth::NodeAuth;
use crate::index::SharedIndex;
use crate::ready::Readiness;
use ambit_api::proto::discovery::discovery_server::{Discovery, DiscoveryServer};
use ambit_api::proto::discovery::{Update, WatchRequest};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// The catalog and the streams, behind one lock: a change is rendered and handed to the
/// streams that hold it in one step, so no stream sees a resolution before what it names.
#[derive(Debug, Default)]
pub struct Core {
    /// Every rendered pod and Service.
    pub catalog: Catalog,
    /// Every open stream.
    pub streams: Streams,
}

/// What the discovery service's streams share: the [`Core`] and whether the backend has
/// loaded everything once.
#[derive(Clone, Debug)]
pub struct Hub {
    core: Arc<Mutex<Core>>,
    /// Until the backend has loaded everything once nothing is served (a cluster half
    /// listed — Pods before their Namespaces — would tell every proxy that its pods are
    /// not meshed).
    started: Arc<watch::Sender<bool>>,
    metrics: DiscoveryMetrics,
}

impl Hub {
    /// An empty hub.
    pub fn new(metrics: DiscoveryMetrics) -> Self {
        Self {
            core: Arc::default(),
            started: Arc::new(watch::Sender::new(false)),
            metrics,
        }
    }

    /// The catalog and streams. Hold it briefly: every stream waits for it.
    pub fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Renders what changed in `index` and hands it to the streams that hold it.
    pub fn publish(&self, index: &SharedIndex) {
        let changes = index.take_changes();
        if changes.is_empty() {
            return;
        }
        let started = std::time::Instant::now();
        let index = index.read();
        let mut core = self.lock();
        let Core { catalog, streams } = &mut *core;
        let changed = catalog.update(&index, &changes);
        streams.apply(catalog, &changed);
        let (workloads, services) = catalog.len();
        self.metrics.published(
            changed.len(),
            started.elapsed(),
            workloads,
            services,
            streams.targets(),
        );
    }

    /// Renders the index as it is now and opens the streams waiting in
    /// [`Self::started`]. Call once the backend has loaded everything.
    pub fn start(&self, index: &SharedIndex) {
        self.publish(index);
        self.started.send_replace(true);
    }

    /// Resolves once [`Self::start`] has run.
    pub async fn started(&self) {
        let mut rx = self.started.subscribe();
        // The sender lives as long as `self`: this cannot fail.
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Once `ready` (the backend has loaded everything), starts, then renders what
    /// changed in `index` after every change until `shutdown` resolves. Changes that
    /// arrive while one is rendered are taken together by the next.
    pub async fn run(
        self,
        index: SharedIndex,
        ready: Readiness,
        shutdown: impl Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        tokio::select! {
            _ = &mut shutdown => return,
            _ = ready.ready() => {}
        }
        let mut changes = index.subscribe();
        changes.mark_unchanged();
        // Rendering runs off the async workers (a whole cluster's change takes seconds).
        let (hub, at) = (self.clone(), index.clone());
        crate::blocking::run(move || hub.start(&at)).await;
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                changed = changes.changed() => if changed.is_err() { return },
            }
            let (hub, at) = (self.clone(), index.clone());
            crate::blocking::run(move || hub.publish(&at)).await;
        }
    }
}

/// The gRPC discovery service.
#[derive(Clone)]
pub struct DiscoveryService {
    index: SharedIndex,
    hub: Hub,
    auth: NodeAuth,
    metrics: DiscoveryMetrics,
    drain: watch::Receiver<bool>,
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
            hub: Hub::new(metrics.clone()),
            index,
            auth,
            metrics,
            drain: watch::Sender::new(false).subscribe(),
        }
    }

    /// Ends every stream when `drain` turns true, so that shutdown is not held up by
    /// proxies that never hang up.
    pub fn with_drain(mut self, drain: watch::Receiver<bool>) -> Self {
        self.drain = drain;
        self
    }

    /// Renders each change for the streams that hold it; runs until `shutdown`. Streams
    /// wait until `ready` (the backend has loaded everything).
    pub fn publisher(
        &self,
        ready: Readiness,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> impl Future<Output = ()> + Send + 'static {
        self.hub.clone().run(self.index.clone(), ready, shutdown)
    }

    /// The hub, whose `started` other services wait on too (nothing is served before the
    /// backend has loaded everything once).
    pub fn hub(&self) -> Hub {
        self.hub.clone()
    }

    /// The tonic server for this service.
    pub fn into_server(self) -> DiscoveryServer<Self> {
        DiscoveryServer::new(self)
    }
}

type UpdateStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<Update, Status>> + Send>>;

/// How long a proxy has to send its first request once the stream is open.
const FIRST_REQUEST: std::time::Duration = std::time::Duration::from_secs(10);

#[tonic::async_trait]
impl Discovery for DiscoveryService {
    type WatchStream = UpdateStream;

    async fn watch(
        &self,
        req: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let node = match self.auth.authenticate(&req).await {
            Ok(node) => node,
            Err(status) => {
                self.metrics.refused();
                return Err(status);
            }
        };
        let mut requests = req.into_inner();
        let first = match tokio::time::timeout(FIRST_REQUEST, requests.message()).await {
            Ok(Ok(Some(first))) => first,
            Ok(Ok(None)) => {
                return Err(Status::invalid_argument(
                    "the stream ended before its first request",
                ))
            }
            Ok(Err(status)) => return Err(status),
            Err(_) => {
                return Err(Status::deadline_exceeded(format!(
                    "no first request in {}s",
                    FIRST_REQUEST.as_secs()
                )))
            }
        };
        if first.node != node {
            self.metrics.refused();
            return Err(Status::permission_denied(format!(
                "this token belongs to node {node}, not {:?}; a proxy may only watch its own node",
                first.node
            )));
        }
        if !first.by_need {
            self.metrics.refused();
            return Err(Status::failed_precondition(
                "this control plane sends each node what its pods use (discovery by need), \
                 which this proxy does not ask for: upgrade the node proxy to the control \
                 plane's version (meanwhile it serves from its last discovery state)",
            ));
        }
        let (tx, rx) = mpsc::channel(16);
        let stream = stream::Stream {
            hub: self.hub.clone(),
            node,
            metrics: self.metrics.clone(),
            tx,
        };
        let mut drain = self.drain.clone();
        tokio::spawn(async move {
            let tx = stream.tx.clone();
            stream.metrics.stream_opened();
            let metrics = stream.metrics.clone();
            tokio::select! {
                _ = stream.serve(first, requests) => {}
                _ = async { drop(drain.wait_for(|d| *d).await) } => {
                    let _ = tx.send(Err(Status::unavailable("control plane shutting down; reconnect"))).await;
                }
            }
            metrics.stream_closed();
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

#[cfg(test)]
mod tests;
