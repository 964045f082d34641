//! One proxy's discovery stream: its requests (subscribe, unsubscribe) in, a snapshot and
//! then the pieces queued for it out, as updates in bounded chunks.

use super::streams::{canonical, Out, StreamId};
use super::{DiscoveryMetrics, Hub};
use ambit_api::proto::discovery as pb;
use prost::Message;
use std::collections::{HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tonic::Status;

/// Resources per update. A snapshot of a node with many pods or subscriptions in one
/// message could pass a proxy's decode limit, and each stream's encode buffer keeps the
/// size of the largest message it sent.
pub(super) const CHUNK: usize = 256;
/// Bytes per update (past its first resource; one resource larger than this goes
/// alone): a Service of 5,000 endpoints is ~550 KB.
pub(super) const CHUNK_BYTES: usize = 1 << 20;

/// A stream being served.
pub(super) struct Stream {
    pub hub: Hub,
    /// The node, authenticated.
    pub node: String,
    pub metrics: DiscoveryMetrics,
    /// The response stream.
    pub tx: mpsc::Sender<Result<pb::Update, Status>>,
}

impl Stream {
    /// Serves the stream until the proxy goes away.
    pub async fn serve(
        &self,
        first: pb::WatchRequest,
        mut requests: impl tokio_stream::Stream<Item = Result<pb::WatchRequest, Status>> + Unpin,
    ) {
        // Nothing until the backend has loaded the whole cluster once.
        tokio::select! {
            _ = self.hub.started() => {}
            _ = self.tx.closed() => return,
        }
        let mut reg = self.hub.lock().streams.register(&self.node);
        let id = reg.id;
        let served = async {
            self.request(id, first);
            let snapshot = {
                let mut core = self.hub.lock();
                let super::Core { catalog, streams } = &mut *core;
                streams.snapshot(catalog, id, &mut reg.rx)
            };
            tracing::info!(node = %self.node, resources = snapshot.len(), "discovery stream opened");
            if !self.send(snapshot, true).await {
                return;
            }
            let mut reading = true;
            loop {
                tokio::select! {
                    req = requests.next(), if reading => match req {
                        Some(Ok(r)) => self.request(id, r),
                        // The proxy sends no more requests; the stream stays.
                        None => reading = false,
                        Some(Err(status)) => {
                            tracing::debug!(node = %self.node, %status, "discovery stream's requests failed");
                            return;
                        }
                    },
                    out = reg.rx.recv() => {
                        let Some(out) = out else { return };
                        let mut pending = VecDeque::from([out]);
                        while pending.len() < super::streams::QUEUE {
                            match reg.rx.try_recv() {
                                Ok(o) => pending.push_back(o),
                                Err(_) => break,
                            }
                        }
                        // Behind: what was queued is incomplete; the snapshot below replaces it.
                        if !reg.behind.load(Ordering::Relaxed)
                            && !self.send(pending.into(), false).await
                        {
                            return;
                        }
                    }
                    _ = self.tx.closed() => return,
                }
                if reg.behind.load(Ordering::Relaxed) {
                    let snapshot = {
                        let mut core = self.hub.lock();
                        let super::Core { catalog, streams } = &mut *core;
                        streams.snapshot(catalog, id, &mut reg.rx)
                    };
                    tracing::info!(node = %self.node, "discovery stream fell behind; sending a snapshot");
                    self.metrics.resynced();
                    if !self.send(snapshot, true).await {
                        return;
                    }
                }
            }
        };
        served.await;
        let targets = {
            let mut core = self.hub.lock();
            core.streams.unregister(id);
            core.streams.targets()
        };
        self.metrics.subscribed(0, 0, targets);
    }

    /// Applies one request: targets to add and to drop. A target that is neither an
    /// address nor a Service name is answered with a refusal (the proxy fails its
    /// connections at once instead of waiting).
    fn request(&self, id: StreamId, req: pb::WatchRequest) {
        let mut refused = Vec::new();
        let mut parse = |targets: Vec<String>| -> Vec<Arc<str>> {
            targets
                .into_iter()
                .filter_map(|t| match canonical(&t) {
                    Ok(c) => Some(c),
                    Err(e) => {
                        refused.push((t, e.to_string()));
                        None
                    }
                })
                .collect()
        };
        let subscribe = parse(req.subscribe);
        let unsubscribe = parse(req.unsubscribe);
        let mut core = self.hub.lock();
        let super::Core { catalog, streams } = &mut *core;
        streams.unsubscribe(catalog, id, unsubscribe);
        let (n_sub, n_refused) = (subscribe.len(), refused.len());
        streams.subscribe(catalog, id, subscribe);
        for (target, why) in refused {
            streams.refuse(id, target.chars().take(300).collect(), why);
        }
        let targets = streams.targets();
        drop(core);
        self.metrics.subscribed(n_sub, n_refused, targets);
    }

    /// Sends `pieces` as updates; `snapshot`: the first has `snapshot` and every one but
    /// the last `more`, so that the proxy applies the snapshot whole. False once the
    /// proxy has gone.
    async fn send(&self, pieces: Vec<Out>, snapshot: bool) -> bool {
        let updates = updates(pieces, snapshot, CHUNK, CHUNK_BYTES);
        for u in updates {
            if self.tx.send(Ok(u)).await.is_err() {
                return false;
            }
            self.metrics.update_sent();
        }
        true
    }
}

/// `pieces` as updates of at most `per_chunk` resources and (past the first) `max_bytes`.
/// A piece whose resource an earlier piece of the same update names starts a new update:
/// a proxy applies an update's removals before its upserts, so a pod sent and then
/// removed must not share one. For a snapshot the first update has `snapshot` (an empty
/// one too) and all but the last have `more`.
pub fn updates(
    pieces: Vec<Out>,
    snapshot: bool,
    per_chunk: usize,
    max_bytes: usize,
) -> Vec<pb::Update> {
    let per_chunk = per_chunk.max(1);
    let mut out = vec![pb::Update {
        snapshot,
        ..pb::Update::default()
    }];
    let (mut count, mut bytes) = (0usize, 0usize);
    let mut seen: HashSet<(u8, Arc<str>)> = HashSet::new();
    for piece in pieces {
        let (kind, key, len): (u8, Arc<str>, usize) = match &piece {
            Out::Workload(w) => (
                0,
                format!("{}/{}", w.namespace, w.name).into(),
                w.encoded_len(),
            ),
            Out::RemoveWorkload(k) => (0, k.clone(), k.len() + 4),
            Out::Service(s) => (
                1,
                format!("{}/{}", s.namespace, s.name).into(),
                s.encoded_len(),
            ),
            Out::RemoveService(k) => (1, k.clone(), k.len() + 4),
            Out::Endpoints(d) => (1, d.service.as_str().into(), d.encoded_len()),
            Out::Resolution(r) => (2, r.target.as_str().into(), r.encoded_len()),
            Out::RemoveResolution(t) => (2, t.clone(), t.len() + 4),
        };
        let repeat = seen.contains(&(kind, key.clone()));
        if count > 0 && (repeat || count >= per_chunk || bytes + len > max_bytes) {
            out.push(pb::Update::default());
            seen.clear();
            count = 0;
            bytes = 0;
        }
        seen.insert((kind, key));
        count += 1;
        bytes += len;
        let Some(u) = out.last_mut() else { break };
        match piece {
            Out::Workload(w) => u.workloads.push(pb::Workload::clone(&w)),
            Out::RemoveWorkload(k) => u.removed_workloads.push(k.to_string()),
            Out::Service(s) => u.services.push(pb::Service::clone(&s)),
            Out::RemoveService(k) => u.removed_services.push(k.to_string()),
            Out::Endpoints(d) => u.endpoint_deltas.push(pb::EndpointDelta::clone(&d)),
            Out::Resolution(r) => u.resolutions.push(r),
            Out::RemoveResolution(t) => u.removed_resolutions.push(t.to_string()),
        }
    }
    if snapshot {
        let last = out.len() - 1;
        for (i, u) in out.iter_mut().enumerate() {
            u.more = i < last;
        }
    }
    out
}
