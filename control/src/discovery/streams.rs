//! Who holds what: each stream's node and subscribed targets, and which streams hold
//! each resource, so that a change goes to the streams that hold it and to no other.
//!
//! A stream holds a resource when it is a pod of the stream's node, or what one of its
//! targets resolves to. [`Streams::apply`] turns the catalog's [`Changed`] into
//! [`Out`]s on the channels of exactly those streams: a resource newly held is sent
//! whole, one no longer held is removed, one that changed is sent again (a Service's
//! endpoints as a delta). Each change is rendered once (in the catalog) and shared as an
//! `Arc`; its cost is one channel send per stream that holds it.

use super::catalog::{Catalog, Changed, Resolved};
use ambit_api::proto::discovery as pb;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// At most this many targets per stream: what a node's pods call is far fewer, and a
/// proxy that asks for more (a compromised node walking the cluster's addresses) gets
/// refusals instead of the cluster.
pub const MAX_TARGETS: usize = 16_384;
/// Pieces queued per stream before it is considered behind and sent a snapshot instead.
pub const QUEUE: usize = 4_096;

/// Identifies a stream.
pub type StreamId = u64;

/// One piece of an update for one stream.
#[derive(Clone, Debug)]
pub enum Out {
    /// A pod, whole.
    Workload(Arc<pb::Workload>),
    /// A pod the stream no longer holds.
    RemoveWorkload(Arc<str>),
    /// A Service with its endpoints.
    Service(Arc<pb::Service>),
    /// A Service the stream no longer holds.
    RemoveService(Arc<str>),
    /// Endpoints of a Service the stream holds.
    Endpoints(Arc<pb::EndpointDelta>),
    /// What a target is.
    Resolution(pb::Resolution),
    /// A target the stream unsubscribed.
    RemoveResolution(Arc<str>),
}

/// A resource a stream may hold.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Res {
    Workload(Arc<str>),
    Service(Arc<str>),
}

/// Why a target was not subscribed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BadTarget {
    /// Neither an address nor a Service name.
    #[error("{0:?} is neither an IP address nor a Service as <namespace>/<name>")]
    Invalid(String),
}

/// A target in canonical form: an IP as `IpAddr` prints it, or `<namespace>/<name>`.
pub fn canonical(target: &str) -> Result<Arc<str>, BadTarget> {
    if let Ok(ip) = target.parse::<IpAddr>() {
        return Ok(ip.to_string().into());
    }
    let bad = || BadTarget::Invalid(target.chars().take(300).collect());
    let (ns, name) = target.split_once('/').ok_or_else(bad)?;
    let label = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    if !label(ns) || !label(name) {
        return Err(bad());
    }
    Ok(target.into())
}

/// One stream's side.
#[derive(Debug)]
struct Stream {
    node: String,
    tx: mpsc::Sender<Out>,
    /// Set when `tx` was full: the stream sends a snapshot instead of what it missed.
    behind: Arc<AtomicBool>,
    /// Targets and what each resolves to now.
    targets: BTreeMap<Arc<str>, Resolved>,
    /// Resources some target resolves to, with how many.
    refs: HashMap<Res, u32>,
    /// What the proxy has been sent.
    held: HashSet<Res>,
}

impl Stream {
    fn send(&self, out: Out) {
        if self.behind.load(Ordering::Relaxed) {
            return;
        }
        if self.tx.try_send(out).is_err() {
            self.behind.store(true, Ordering::Relaxed);
        }
    }
}

/// Every open stream and what it holds.
#[derive(Debug, Default)]
pub struct Streams {
    streams: HashMap<StreamId, Stream>,
    next: StreamId,
    /// Resource → the streams holding it.
    holders: HashMap<Res, HashSet<StreamId>>,
    /// Node → its streams.
    by_node: HashMap<String, HashSet<StreamId>>,
    /// Target → the streams subscribed to it.
    by_target: HashMap<Arc<str>, HashSet<StreamId>>,
    /// Targets over every stream.
    n_targets: usize,
}

/// A registered stream's end: its id, its queue and whether it fell behind.
#[derive(Debug)]
pub struct Registered {
    /// The stream.
    pub id: StreamId,
    /// Pieces to send, in order, after the snapshot.
    pub rx: mpsc::Receiver<Out>,
    /// Set when pieces were dropped: send a snapshot ([`Streams::snapshot`]).
    pub behind: Arc<AtomicBool>,
}

impl Streams {
    /// Registers a stream for `node` (no targets yet).
    pub fn register(&mut self, node: &str) -> Registered {
        let id = self.next;
        self.next += 1;
        let (tx, rx) = mpsc::channel(QUEUE);
        let behind = Arc::new(AtomicBool::new(false));
        self.streams.insert(
            id,
            Stream {
                node: node.to_string(),
                tx,
                behind: behind.clone(),
                targets: BTreeMap::new(),
                refs: HashMap::new(),
                held: HashSet::new(),
            },
        );
        self.by_node.entry(node.to_string()).or_default().insert(id);
        Registered { id, rx, behind }
    }

    /// Forgets a stream.
    pub fn unregister(&mut self, id: StreamId) {
        let Some(s) = self.streams.remove(&id) else {
            return;
        };
        for r in &s.held {
            remove_from(&mut self.holders, r, id);
        }
        for t in s.targets.keys() {
            remove_from(&mut self.by_target, t, id);
        }
        self.n_targets -= s.targets.len();
        remove_from(&mut self.by_node, &s.node, id);
    }

    /// The number of targets over every stream.
    pub fn targets(&self) -> usize {
        self.n_targets
    }

    /// Everything stream `id` holds, from scratch: its node's pods, its targets' resources
    /// and resolutions — what a new stream or one that fell behind is sent as a snapshot.
    /// Drops what is queued for it (the snapshot supersedes it).
    pub fn snapshot(
        &mut self,
        catalog: &Catalog,
        id: StreamId,
        rx: &mut mpsc::Receiver<Out>,
    ) -> Vec<Out> {
        while rx.try_recv().is_ok() {}
        let Some(s) = self.streams.get_mut(&id) else {
            return Vec::new();
        };
        s.behind.store(false, Ordering::Relaxed);
        for r in s.held.drain() {
            remove_from(&mut self.holders, &r, id);
        }
        let mut want: Vec<Res> = catalog
            .on_node(&s.node)
            .map(|k| Res::Workload(k.clone()))
            .collect();
        want.extend(s.refs.keys().cloned());
        let mut out = Vec::new();
        for r in want {
            if s.held.contains(&r) {
                continue;
            }
            if let Some(piece) = whole(catalog, &r) {
                out.push(piece);
                s.held.insert(r.clone());
                self.holders.entry(r).or_default().insert(id);
            }
        }
        out.extend(
            s.targets
                .iter()
                .map(|(t, r)| Out::Resolution(resolution(t, r))),
        );
        out
    }

    /// Subscribes stream `id` to `targets` (canonical; already subscribed ones are
    /// skipped), queueing what they resolve to and their resolutions.
    pub fn subscribe(&mut self, catalog: &Catalog, id: StreamId, targets: Vec<Arc<str>>) {
        for t in targets {
            let Some(s) = self.streams.get_mut(&id) else {
                return;
            };
            if s.targets.contains_key(&t) {
                continue;
            }
            if s.targets.len() >= MAX_TARGETS {
                s.send(Out::Resolution(pb::Resolution {
                    target: t.to_string(),
                    refused: format!(
                        "this node already has {MAX_TARGETS} destinations subscribed; \
                         unused ones are dropped after the proxy's --discovery-idle-timeout"
                    ),
                    ..pb::Resolution::default()
                }));
                continue;
            }
            s.targets.insert(t.clone(), Resolved::default());
            self.n_targets += 1;
            self.by_target.entry(t.clone()).or_default().insert(id);
            self.retarget(catalog, id, &t, true);
        }
    }

    /// Answers `target` of stream `id` with a refusal (`why`), without subscribing it.
    pub fn refuse(&mut self, id: StreamId, target: String, why: String) {
        if let Some(s) = self.streams.get(&id) {
            s.send(Out::Resolution(pb::Resolution {
                target,
                refused: why,
                ..pb::Resolution::default()
            }));
        }
    }

    /// Unsubscribes stream `id` from `targets`: their resolutions are removed, and what
    /// they resolved to unless something else holds it.
    pub fn unsubscribe(&mut self, catalog: &Catalog, id: StreamId, targets: Vec<Arc<str>>) {
        for t in targets {
            let Some(s) = self.streams.get_mut(&id) else {
                return;
            };
            let Some(old) = s.targets.remove(&t) else {
                continue;
            };
            self.n_targets -= 1;
            remove_from(&mut self.by_target, &t, id);
            s.send(Out::RemoveResolution(t.clone()));
            for r in resources(&old) {
                self.unref(id, &r);
                self.reconcile(catalog, id, &r, None);
            }
        }
    }

    /// Sends `changes` to the streams they concern.
    pub fn apply(&mut self, catalog: &Catalog, changes: &[Changed]) {
        for c in changes {
            match c {
                Changed::Workload { key, old, new } => {
                    let r = Res::Workload(key.clone());
                    let mut ids: HashSet<StreamId> =
                        self.holders.get(&r).cloned().unwrap_or_default();
                    for w in [old, new].into_iter().flatten() {
                        ids.extend(self.by_node.get(&w.node).into_iter().flatten().copied());
                    }
                    for id in ids {
                        self.reconcile(catalog, id, &r, Some(c));
                    }
                }
                Changed::Service { key, .. } => {
                    let r = Res::Service(key.clone());
                    let ids: Vec<StreamId> = self
                        .holders
                        .get(&r)
                        .into_iter()
                        .flatten()
                        .copied()
                        .collect();
                    for id in ids {
                        self.reconcile(catalog, id, &r, Some(c));
                    }
                }
                Changed::Target(t) => {
                    let ids: Vec<StreamId> = self
                        .by_target
                        .get(t)
                        .into_iter()
                        .flatten()
                        .copied()
                        .collect();
                    for id in ids {
                        self.retarget(catalog, id, t, false);
                    }
                }
            }
        }
    }

    /// Resolves target `t` of stream `id` again; when it moved (or `first`: it was just
    /// subscribed), holds the new resource (sent before the resolution that names it),
    /// lets go of the old, and sends the resolution.
    fn retarget(&mut self, catalog: &Catalog, id: StreamId, t: &Arc<str>, first: bool) {
        let now = catalog.resolve(t);
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        let Some(before) = s.targets.insert(t.clone(), now.clone()) else {
            return;
        };
        if before == now && !first {
            return;
        }
        for r in resources(&now) {
            *s.refs.entry(r).or_insert(0) += 1;
        }
        for r in resources(&now) {
            self.reconcile(catalog, id, &r, None);
        }
        if !first {
            for r in resources(&before) {
                self.unref(id, &r);
                self.reconcile(catalog, id, &r, None);
            }
        }
        if let Some(s) = self.streams.get(&id) {
            s.send(Out::Resolution(resolution(t, &now)));
        }
    }

    fn unref(&mut self, id: StreamId, r: &Res) {
        if let Some(s) = self.streams.get_mut(&id) {
            if let Some(n) = s.refs.get_mut(r) {
                *n -= 1;
                if *n == 0 {
                    s.refs.remove(r);
                }
            }
        }
    }

    /// Brings what stream `id` holds of `r` in line with what it should hold: sent whole
    /// when newly held, removed when no longer, sent again (or its endpoints' delta) when
    /// `change` changed it.
    fn reconcile(&mut self, catalog: &Catalog, id: StreamId, r: &Res, change: Option<&Changed>) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        let should = match r {
            Res::Workload(k) => catalog
                .workload(k)
                .is_some_and(|w| w.node == s.node || s.refs.contains_key(r)),
            Res::Service(k) => catalog.service(k).is_some() && s.refs.contains_key(r),
        };
        let held = s.held.contains(r);
        match (should, held) {
            (true, false) => {
                if let Some(piece) = whole(catalog, r) {
                    s.send(piece);
                    s.held.insert(r.clone());
                    self.holders.entry(r.clone()).or_default().insert(id);
                }
            }
            (false, true) => {
                s.send(match r {
                    Res::Workload(k) => Out::RemoveWorkload(k.clone()),
                    Res::Service(k) => Out::RemoveService(k.clone()),
                });
                s.held.remove(r);
                remove_from(&mut self.holders, r, id);
            }
            (true, true) => match change {
                Some(Changed::Workload { new: Some(w), .. }) => s.send(Out::Workload(w.clone())),
                Some(Changed::Service {
                    whole: true, key, ..
                }) => {
                    if let Some(piece) = whole(catalog, &Res::Service(key.clone())) {
                        s.send(piece);
                    }
                }
                Some(Changed::Service { endpoints, .. }) => {
                    s.send(Out::Endpoints(endpoints.clone()))
                }
                _ => {}
            },
            (false, false) => {}
        }
    }
}

fn remove_from<K, Q>(map: &mut HashMap<K, HashSet<StreamId>>, key: &Q, id: StreamId)
where
    K: std::hash::Hash + Eq + Clone + std::borrow::Borrow<Q>,
    Q: std::hash::Hash + Eq + ?Sized,
{
    if let Some(set) = map.get_mut(key) {
        set.remove(&id);
        if set.is_empty() {
            map.remove(key);
        }
    }
}

fn resources(r: &Resolved) -> Vec<Res> {
    let mut out = Vec::new();
    if let Some(s) = &r.service {
        out.push(Res::Service(s.clone()));
    }
    if let Some(w) = &r.workload {
        out.push(Res::Workload(w.clone()));
    }
    out
}

fn resolution(t: &str, r: &Resolved) -> pb::Resolution {
    pb::Resolution {
        target: t.to_string(),
        service: r.service.as_deref().unwrap_or_default().to_string(),
        workload: r.workload.as_deref().unwrap_or_default().to_string(),
        refused: String::new(),
    }
}

fn whole(catalog: &Catalog, r: &Res) -> Option<Out> {
    match r {
        Res::Workload(k) => catalog.workload(k).map(|w| Out::Workload(w.clone())),
        Res::Service(k) => catalog
            .service(k)
            .map(|s| Out::Service(Arc::new(s.whole()))),
    }
}
