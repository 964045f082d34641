//! The pod lifecycle, above the data path: which local pods the proxy serves — meshed
//! pods on this node that discovery lists, with the network namespace the CNI plugin (or
//! enrolment) handed over, or that discovery names itself (local mode) — and what happens
//! when one stops being served. [`crate::proxy::open`] opens a pod's listeners and
//! redirection; this module decides when, and how it ends ([`ending`]):
//!
//! - an explicit end (CNI DEL, its netns gone, discovery listing it as not meshed, its
//!   sandbox replaced) closes its listeners and removes its redirection;
//! - anything else (the pod gone from discovery: a partial reload, a control-plane bug)
//!   closes its listeners but keeps its redirection, so that its traffic is refused — fail
//!   closed — and says so: `/ready` names it, `pods_failing_closed` counts it, a warning
//!   is logged. It is served again when discovery lists it again. A restarted proxy holds
//!   the pods handed over earlier that discovery does not list the same way.

mod ending;

pub use ending::{ending, Ending, Leaving};

use crate::cni::CniPods;
use crate::discovery::{DiscoveryState, Workload};
use crate::netns::Netns;
use crate::proxy::{PodContext, PodListeners, ServedPod, Shared, PRUNE_EVERY, START_RETRY};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, watch};

/// Every pod whose listeners (and redirection) are in place: `<namespace>/<name>` and the
/// netns they were opened in. A watch, so that the CNI socket can wait for a change.
pub type ServingPods = Arc<watch::Sender<BTreeMap<String, PathBuf>>>;

/// Pods whose redirection stays while they are not served (their traffic is refused), and
/// why: for `/ready`.
pub type HeldPods = Arc<watch::Sender<BTreeMap<String, String>>>;

/// The local pods to serve: meshed pods on `node` that the CNI plugin handed over (with
/// the netns and addresses it gave), or that name their netns themselves (local mode).
pub fn to_serve(
    state: &DiscoveryState,
    cni: &CniPods,
    node: &str,
) -> BTreeMap<String, Arc<Workload>> {
    state
        .local_workloads(node)
        .into_iter()
        .filter_map(|w| match cni.get(&w.key()) {
            Some(pod) => {
                let mut w = (*w).clone();
                w.netns = Some(pod.netns.clone());
                if !pod.ips.is_empty() {
                    w.ips = pod.ips.clone();
                }
                Some((w.key(), Arc::new(w)))
            }
            None => w.netns.is_some().then(|| (w.key(), w)),
        })
        .collect()
}

/// `pods_failing_closed`.
#[derive(Clone, Debug, Default)]
pub struct PodMetrics {
    failing_closed: Gauge,
}

impl PodMetrics {
    /// Registers `pods_failing_closed`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "pods_failing_closed",
            "Meshed pods whose redirection stays while the proxy does not serve them (not in discovery as they are): their traffic is refused",
            m.failing_closed.clone(),
        );
        m
    }
}

/// A pod's listeners that a running proxy handed over, and the netns they were opened in.
#[derive(Debug)]
pub struct HandedPod {
    /// The netns's (device, inode).
    pub netns_id: (u64, u64),
    /// Per address family.
    pub listeners: Vec<PodListeners>,
}

/// A served pod's listeners, for a hand-over to another process.
#[derive(Debug)]
pub struct ExportedPod {
    /// `<namespace>/<name>`.
    pub key: String,
    /// The netns path.
    pub netns: PathBuf,
    /// The netns's (device, inode).
    pub netns_id: (u64, u64),
    /// Per address family.
    pub listeners: Vec<PodListeners>,
}

/// What a hand-over asks of the lifecycle (`crate::handover`).
#[derive(Debug)]
pub enum Request {
    /// Every served pod's listeners.
    Export(oneshot::Sender<Vec<ExportedPod>>),
    /// Stop accepting everywhere (redirection stays) and end: another process serves
    /// the pods from now on. Answered once every accept loop has stopped.
    Release(oneshot::Sender<()>),
}

/// The lifecycle's side of a hand-over.
#[derive(Debug, Default)]
pub struct Handover {
    /// Listeners handed over by the process this one took over from, by pod: used when
    /// the pod is opened on the first pass (same netns, same families), closed otherwise.
    pub handed: BTreeMap<String, HandedPod>,
    /// Told, after the first pass, how many handed pods are served.
    pub first_pass: Option<oneshot::Sender<usize>>,
    /// Requests from a process taking over from this one.
    pub requests: Option<mpsc::Receiver<Request>>,
}

/// What the lifecycle needs.
#[derive(Debug)]
pub struct Lifecycle {
    /// The data path's shared state (discovery's view is `shared.state`).
    pub shared: Shared,
    /// Pods handed over by the CNI plugin or enrolment (their netns and addresses).
    pub cni: watch::Receiver<CniPods>,
    /// Published: the pods served.
    pub serving: ServingPods,
    /// Published: the pods held (failing closed).
    pub held: HeldPods,
    /// This node.
    pub node: String,
    /// Discovery-named namespaces must be under it.
    pub local_netns_dir: PathBuf,
    /// `pods_failing_closed`.
    pub metrics: PodMetrics,
    /// Listeners handed over, and requests to hand them over.
    pub handover: Handover,
}

struct Served {
    pod: ServedPod,
    from_cni: bool,
    /// Whether its listeners were handed over by the process this one took over from.
    from_handover: bool,
}

/// The next hand-over request; pending while there is none to come.
async fn next_request(requests: &mut Option<mpsc::Receiver<Request>>) -> Request {
    if let Some(rx) = requests {
        if let Some(r) = rx.recv().await {
            return r;
        }
        *requests = None;
    }
    std::future::pending().await
}

/// Every served pod's listeners.
fn export(served: &BTreeMap<String, Served>) -> Vec<ExportedPod> {
    served
        .iter()
        .filter_map(|(key, p)| {
            let netns = &p.pod.pod.netns;
            Some(ExportedPod {
                key: key.clone(),
                netns: netns.path().to_path_buf(),
                netns_id: netns.id().ok()?,
                listeners: p.pod.listeners.clone(),
            })
        })
        .collect()
}

struct Held {
    pod: Arc<PodContext>,
    from_cni: bool,
    why: String,
}

/// Whether `w` is to be served as `pod` is (same netns, same addresses).
fn same(w: &Workload, pod: &PodContext) -> bool {
    w.netns == pod.workload.netns && w.ips == pod.workload.ips
}

/// A discovery-named netns that no longer leads to the namespace the pod was served in.
fn netns_gone(pod: &PodContext) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(pod.netns.path()), pod.netns.id()) {
        (Ok(m), Ok(id)) => (m.dev(), m.ino()) != id,
        _ => true,
    }
}

impl Lifecycle {
    /// Opens listeners in each local pod's netns as pods arrive, and ends each as its
    /// [`ending`] says, until `shutdown`; then closes every listener (redirection stays:
    /// a stopped proxy fails closed).
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        // One `Shared` for every pod's accept loop and connections, rather than a copy
        // (768 bytes) per pod.
        let shared = Arc::new(self.shared.clone());
        let mut state = self.shared.state.clone();
        let mut served: BTreeMap<String, Served> = BTreeMap::new();
        let mut released = None;
        let mut held: BTreeMap<String, Held> = BTreeMap::new();
        // Idle tunnels are dropped even when discovery has nothing new to say.
        let mut prune = tokio::time::interval(PRUNE_EVERY);
        prune.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let s = state.borrow_and_update().clone();
            let cni = self.cni.borrow_and_update().clone();
            crate::proxy::prune(&self.shared, &s, served.values().map(|p| &*p.pod.pod));
            let want = to_serve(&s, &cni, &self.node);

            // Served pods no longer wanted as they are.
            let leaving: Vec<String> = served
                .iter()
                .filter(|(key, p)| !want.get(*key).is_some_and(|w| same(w, &p.pod.pod)))
                .map(|(key, _)| key.clone())
                .collect();
            let mut readdressed = Vec::new();
            for key in leaving {
                let Some(p) = served.remove(&key) else {
                    continue;
                };
                let pod = p.pod.close().await;
                // Same netns, other addresses: the redirection stays (no window in which
                // nothing redirects); the new listeners are opened below, and then the
                // old addresses forgotten.
                if want
                    .get(&key)
                    .is_some_and(|w| w.netns == pod.workload.netns)
                {
                    tracing::info!(pod = %key, "addresses changed; reopening its listeners, redirection kept");
                    readdressed.push(pod);
                    continue;
                }
                forget_later(
                    &self.shared,
                    &pod.workload,
                    state.clone(),
                    self.node.clone(),
                );
                self.end_or_hold(&key, pod, p.from_cni, &want, &s, &cni, &mut held)
                    .await;
            }
            // Held pods: an explicit end now, or wanted again.
            let keys: Vec<String> = held.keys().cloned().collect();
            for key in keys {
                let Some(h) = held.remove(&key) else { continue };
                if want.get(&key).is_some_and(|w| same(w, &h.pod)) {
                    tracing::info!(pod = %key, "held pod is listed again; serving it");
                    continue;
                }
                self.end_or_hold(&key, h.pod, h.from_cni, &want, &s, &cni, &mut held)
                    .await;
            }
            // Pods to open.
            let mut failed = false;
            for (key, w) in want.iter() {
                if served.contains_key(key) {
                    continue;
                }
                let from_cni = cni.contains_key(key);
                let handed = self.handover.handed.remove(key);
                match self
                    .open(&shared, w.clone(), from_cni, &served, handed)
                    .await
                {
                    Ok((pod, from_handover)) => {
                        served.insert(
                            key.clone(),
                            Served {
                                pod,
                                from_cni,
                                from_handover,
                            },
                        );
                    }
                    Err(error) => {
                        failed = true;
                        tracing::error!(pod = %key, %error, retry_in = ?START_RETRY, "cannot open listeners in the pod's network namespace");
                    }
                }
            }
            for old in readdressed {
                let now = served
                    .get(&old.workload.key())
                    .map(|p| p.pod.pod.workload.ips.clone())
                    .unwrap_or_default();
                let gone: Vec<_> = old
                    .workload
                    .ips
                    .iter()
                    .filter(|ip| !now.contains(ip))
                    .copied()
                    .collect();
                self.shared.redirector.forget_addresses(&gone);
            }
            self.publish(&s, &cni, &want, &served, &held);
            if let Some(done) = self.handover.first_pass.take() {
                for key in std::mem::take(&mut self.handover.handed).into_keys() {
                    tracing::warn!(pod = %key, "handed-over listeners of a pod this proxy does not serve: closed");
                }
                let _ = done.send(served.values().filter(|p| p.from_handover).count());
            }
            // A pod whose netns could not be entered (not there yet, a port taken) is
            // tried again after a while even if discovery has nothing new to say.
            let retry = async {
                if failed {
                    tokio::time::sleep(START_RETRY).await
                } else {
                    std::future::pending().await
                }
            };
            tokio::select! {
                _ = &mut shutdown => break,
                changed = state.changed() => if changed.is_err() { break },
                changed = self.cni.changed() => if changed.is_err() { break },
                _ = retry => {}
                _ = prune.tick() => {}
                request = next_request(&mut self.handover.requests) => match request {
                    Request::Export(reply) => {
                        let _ = reply.send(export(&served));
                    }
                    Request::Release(reply) => {
                        released = Some(reply);
                        break;
                    }
                },
            }
        }
        // Shutting down (or handed over): stop accepting everywhere, and return only once
        // every listener is closed, so that a stopped proxy leaves nothing that accepts
        // (fail closed) — a process that took the listeners over accepts on them instead.
        for (_, p) in served {
            p.pod.close().await;
        }
        if let Some(reply) = released {
            let _ = reply.send(());
        }
    }

    /// Ends `pod`'s redirection on an explicit end, else holds it (failing closed).
    #[allow(clippy::too_many_arguments)]
    async fn end_or_hold(
        &self,
        key: &str,
        pod: Arc<PodContext>,
        from_cni: bool,
        want: &BTreeMap<String, Arc<Workload>>,
        s: &DiscoveryState,
        cni: &CniPods,
        held: &mut BTreeMap<String, Held>,
    ) {
        let leaving = Leaving {
            key,
            from_cni,
            replaced: want.contains_key(key),
            netns_gone: !from_cni && netns_gone(&pod),
        };
        match ending(leaving, s, cni, &self.node) {
            Ending::End(why) => {
                tracing::info!(pod = %key, %why, "pod left; listeners closed, redirection removed");
                // Done before any pod starts: a new sandbox of the same pod may take the
                // same addresses.
                if let Err(error) = pod.remove_redirection(&self.shared.redirector).await {
                    tracing::debug!(pod = %key, %error, "redirection not removed (netns gone?)");
                }
            }
            Ending::Hold(why) => {
                if held.get(key).is_none_or(|h| h.why != why) {
                    tracing::warn!(pod = %key, %why, "pod not served: its redirection stays and its traffic is refused until discovery lists it again or it ends (CNI DEL)");
                }
                held.insert(key.to_string(), Held { pod, from_cni, why });
            }
        }
    }

    /// Checks `workload`'s netns and opens its listeners (or takes those `handed` over,
    /// when they were opened in the same netns for the same address families) and
    /// redirection; says whether the handed ones were taken.
    async fn open(
        &self,
        shared: &Arc<crate::proxy::Shared>,
        workload: Arc<Workload>,
        from_cni: bool,
        served: &BTreeMap<String, Served>,
        handed: Option<HandedPod>,
    ) -> std::io::Result<(ServedPod, bool)> {
        let path = workload.netns.clone().unwrap_or_default();
        if workload.ips.is_empty() {
            // Redirection is per address: a pod is not reported redirected before its
            // addresses are known (the runtime starts no container before ADD succeeds).
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "its addresses are not known yet (neither the CNI result nor discovery has them); not redirected until they are",
            ));
        }
        if !from_cni {
            netns_allowed(&path, &self.local_netns_dir)?;
        }
        let netns = Netns::open(&path)?;
        let id = netns.id()?;
        if crate::netns::own_id().is_ok_and(|own| own == id) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("{} is the proxy's own (the node's) network namespace; refusing to serve a pod there", path.display()),
            ));
        }
        if let Some((other, _)) = served
            .iter()
            .find(|(_, p)| p.pod.pod.netns.id().is_ok_and(|o| o == id))
        {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} is pod {other}'s network namespace; one pod's namespace is never served for another", path.display()),
            ));
        }
        let families: Vec<bool> = std::iter::once(false)
            .chain(
                workload
                    .ips
                    .iter()
                    .any(std::net::IpAddr::is_ipv6)
                    .then_some(true),
            )
            .collect();
        let handed = handed.and_then(|h| {
            let fits = h.netns_id == id && h.listeners.iter().map(|l| l.ipv6).eq(families.iter().copied());
            if !fits {
                tracing::warn!(pod = %workload.key(), "listeners handed over for another netns or other address families: closed, new ones opened");
            }
            fits.then_some(h.listeners)
        });
        let from_handover = handed.is_some();
        let pod = crate::proxy::open(shared, workload, netns, handed).await?;
        Ok((pod, from_handover))
    }

    /// Publishes the pods served and held (with the pods handed over earlier that are
    /// neither: a restarted proxy's, whose redirection from before is in place).
    fn publish(
        &self,
        s: &DiscoveryState,
        cni: &CniPods,
        want: &BTreeMap<String, Arc<Workload>>,
        served: &BTreeMap<String, Served>,
        held: &BTreeMap<String, Held>,
    ) {
        let mut report: BTreeMap<String, String> = held
            .iter()
            .map(|(k, h)| (k.clone(), h.why.clone()))
            .collect();
        if s.synced {
            for key in cni.keys() {
                if served.contains_key(key) || want.contains_key(key) || report.contains_key(key) {
                    continue;
                }
                let leaving = Leaving {
                    key,
                    from_cni: true,
                    replaced: false,
                    netns_gone: false,
                };
                if let Ending::Hold(why) = ending(leaving, s, cni, &self.node) {
                    report.insert(key.clone(), why);
                }
            }
        }
        // Served first, held next, the gauge last: whoever sees a pod released (by the
        // gauge or /ready) also sees its listeners open.
        self.serving.send_replace(
            served
                .iter()
                .map(|(k, p)| (k.clone(), p.pod.pod.netns.path().to_path_buf()))
                .collect(),
        );
        let failing = i64::try_from(report.len()).unwrap_or(i64::MAX);
        self.held.send_replace(report);
        self.metrics.failing_closed.set(failing);
    }
}

/// Drops a departed pod's series after the TTL, unless it is back on the node by then.
fn forget_later(
    shared: &Shared,
    w: &Workload,
    state: watch::Receiver<Arc<DiscoveryState>>,
    node: String,
) {
    let (shared, key, ns, pod) = (shared.clone(), w.key(), w.namespace.clone(), w.name.clone());
    tokio::spawn(async move {
        tokio::time::sleep(shared.departed_metrics_ttl).await;
        let back = state
            .borrow()
            .local_workloads(&node)
            .iter()
            .any(|w| w.key() == key);
        if !back {
            shared.metrics.forget_pod(&ns, &pod);
            shared.http.forget_pod(&ns, &pod);
            shared.authz.forget_pod(&ns, &pod);
            shared.routes.forget_pod(&ns, &pod);
        }
    });
}

/// Checks that a netns named by discovery (not handed over by the CNI plugin) is under
/// `dir`, symlinks resolved: a pod must not point the proxy at the host's or another
/// pod's namespace.
fn netns_allowed(path: &Path, dir: &Path) -> std::io::Result<()> {
    let refused = |why: String| {
        std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "netns {} {why}; discovery may only name namespaces under {} (--local-netns-dir)",
                path.display(),
                dir.display()
            ),
        )
    };
    let real =
        std::fs::canonicalize(path).map_err(|e| refused(format!("cannot be resolved ({e})")))?;
    let dir = std::fs::canonicalize(dir).map_err(|e| {
        refused(format!(
            "is not allowed: the directory cannot be resolved ({e})"
        ))
    })?;
    if real.starts_with(&dir) && real != dir {
        Ok(())
    } else {
        Err(refused(format!("resolves to {}", real.display())))
    }
}
