//! Renders the index once per change and shares the result among every discovery stream.
//!
//! What discovery sends is the same for every node (a proxy must recognise any meshed
//! pod IP), so the [`Publisher`] renders the index once per change, diffs it once against
//! the previous rendering, and broadcasts the delta; each stream clones an `Arc`. The
//! cost of a change therefore grows with the size of the change and the number of streams
//! only by a channel send each — not by a render and a diff each, under the index's lock.
//!
//! Versions count published deltas. A stream starts from the latest rendering (as a
//! snapshot) and then applies deltas with later versions; a stream too slow to keep up
//! with the broadcast buffer gets a fresh snapshot instead of the deltas it missed.

use super::state::{delta_chunks, diff, snapshot, NodeView};
use crate::index::SharedIndex;
use crate::ready::Readiness;
use ambit_api::proto::discovery as pb;
use std::future::Future;
use std::sync::{Arc, PoisonError, RwLock};
use tokio::sync::{broadcast, watch};

/// How many deltas a stream may fall behind before it is sent a snapshot instead.
pub(super) const DELTA_BUFFER: usize = 256;

/// One rendering of the index.
#[derive(Debug)]
pub struct Rendering {
    /// The number of deltas published before this rendering.
    pub version: u64,
    /// What every stream sees.
    pub view: NodeView,
}

/// A delta, in the chunks it is sent as (`delta_chunks`), and the version it leads to.
pub type Delta = (u64, Arc<Vec<pb::Update>>);

/// The latest rendering and the stream of deltas, shared by every discovery stream.
#[derive(Clone, Debug)]
pub struct Publisher {
    latest: Arc<RwLock<Arc<Rendering>>>,
    deltas: broadcast::Sender<Delta>,
    /// Whether the backend has loaded everything once: until then nothing is served
    /// (a cluster half listed — Pods before their Namespaces — would tell every proxy
    /// that its pods are not meshed).
    started: Arc<watch::Sender<bool>>,
}

impl Publisher {
    /// Renders `index` as it is now.
    pub fn new(index: &SharedIndex) -> Self {
        let view = snapshot(&index.read());
        Self {
            latest: Arc::new(RwLock::new(Arc::new(Rendering { version: 0, view }))),
            deltas: broadcast::channel(DELTA_BUFFER).0,
            started: Arc::new(watch::Sender::new(false)),
        }
    }

    /// Renders the index as it is now and opens the streams waiting in
    /// [`Self::started`]. Call once the backend has loaded everything.
    pub fn start(&self, index: &SharedIndex) {
        let view = snapshot(&index.read());
        let version = self.latest().version;
        *self.latest.write().unwrap_or_else(PoisonError::into_inner) =
            Arc::new(Rendering { version, view });
        self.started.send_replace(true);
    }

    /// Resolves once [`Self::start`] has run.
    pub async fn started(&self) {
        let mut rx = self.started.subscribe();
        // The sender lives as long as `self`: this cannot fail.
        let _ = rx.wait_for(|s| *s).await;
    }

    /// The latest rendering.
    pub fn latest(&self) -> Arc<Rendering> {
        self.latest
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Deltas published from now on. Subscribe before reading [`Self::latest`], then skip
    /// deltas whose version is not newer than the rendering's.
    pub fn subscribe(&self) -> broadcast::Receiver<Delta> {
        self.deltas.subscribe()
    }

    /// Once `ready` (the backend has loaded everything), starts, then renders `index`
    /// after every change until `shutdown` resolves.
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
        self.start(&index);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                changed = changes.changed() => if changed.is_err() { return },
            }
            self.publish(&index);
        }
    }

    /// Renders the index and publishes the delta from the last rendering, if any.
    pub fn publish(&self, index: &SharedIndex) {
        let view = snapshot(&index.read());
        let previous = self.latest();
        let Some(delta) = diff(&previous.view, &view) else {
            return;
        };
        let version = previous.version + 1;
        // Store before sending: a stream that subscribed and then read the latest
        // rendering either has this version already (and skips the delta) or receives it.
        *self.latest.write().unwrap_or_else(PoisonError::into_inner) =
            Arc::new(Rendering { version, view });
        let chunks = delta_chunks(delta, super::SNAPSHOT_CHUNK, super::CHUNK_BYTES);
        let _ = self.deltas.send((version, Arc::new(chunks)));
    }
}
