//! Enrolment: pods that were already running when they were meshed (their namespace or
//! the pod annotated `ambit.dev/mesh: enabled` afterwards, or a node proxy starting on a
//! node whose pods have no records), taken on without a CNI `ADD`.
//!
//! - [`cgroup`]: which pod a process belongs to, from the kubelet's cgroup names.
//! - [`procfs`]: a bounded scan of `/proc` for the processes of given pods.
//! - [`Enroller`]: follows discovery; for each meshed pod of this node that has an address,
//!   names no netns and has no record, finds the oldest process whose cgroup carries the
//!   pod's UID and which is not in the host's network namespace, checks that its netns
//!   holds the pod's address, and records the pod in the [`PodRegistry`] exactly as a CNI
//!   hand-off does (a bind-mounted netns handle under the run dir, so a restart keeps it).
//!   The data path then opens the pod's listeners and redirection as for any other pod.
//!   A pod that discovery lists as present and not meshed has its record dropped (its
//!   listeners and redirection go as soon as discovery says so); an enrolled pod that
//!   discovery no longer lists (or lists with another UID) only once no process is left in
//!   its network namespace — its explicit end, since it has no sandbox for a CNI DEL to
//!   name: until then it stays redirected, failing closed, as a CNI pod does.
//!
//! Connections opened before enrolment are left alone: `sk_lookup` and nftables'
//! `REDIRECT` act on new connections only, and `connect()` hooks on new `connect()`s.
//!
//! Scans run when discovery or the registry changes and a pod is waiting, at most once a
//! [`MIN_SCAN_INTERVAL`]; a pod not found is looked for again after [`RETRY_INITIAL`],
//! doubling up to [`RETRY_MAX`].

pub mod cgroup;
pub mod procfs;

use crate::cni::{CniPod, PodRegistry, PodSource};
use crate::discovery::{DiscoveryState, Workload};
use procfs::{NsId, PodProcess};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// The least time between two scans of `/proc`.
pub const MIN_SCAN_INTERVAL: Duration = Duration::from_secs(1);
/// How soon a pod that was not found is looked for again (doubling from there).
pub const RETRY_INITIAL: Duration = Duration::from_secs(2);
/// The longest wait between two looks for one pod.
pub const RETRY_MAX: Duration = Duration::from_secs(60);

/// Labels of `pod_enrolments_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EnrolLabels {
    /// enrolled, not_found, or error.
    pub result: String,
}

/// Metrics of enrolment.
#[derive(Clone, Debug, Default)]
pub struct EnrolMetrics {
    enrolments: Family<EnrolLabels, Counter>,
    released: Counter,
    scans: Counter,
}

impl EnrolMetrics {
    /// Registers `pod_enrolments_total{result}`, `pod_enrolment_releases_total` and
    /// `pod_enrolment_scans_total`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "pod_enrolments",
            "Attempts to take on a running pod without a CNI ADD, by result",
            m.enrolments.clone(),
        );
        registry.register(
            "pod_enrolment_releases",
            "Pod records dropped because discovery lists the pod as not meshed (or no longer lists an enrolled pod)",
            m.released.clone(),
        );
        registry.register(
            "pod_enrolment_scans",
            "Scans of /proc for the processes of meshed pods",
            m.scans.clone(),
        );
        m
    }

    fn count(&self, result: &str) {
        self.enrolments
            .get_or_create(&EnrolLabels {
                result: result.into(),
            })
            .inc();
    }
}

/// Why a running pod could not be taken on.
#[derive(Debug, thiserror::Error)]
pub enum EnrolError {
    /// Discovery's UID for the pod cannot be matched against cgroup names.
    #[error("the pod's UID {0:?} is not a Kubernetes UID")]
    InvalidUid(String),
    /// The proc filesystem could not be read.
    #[error("scanning {path}: {source}")]
    Scan {
        /// The proc root.
        path: PathBuf,
        /// What went wrong.
        source: io::Error,
    },
    /// The process's network namespace could not be opened.
    #[error("opening the network namespace of process {pid}: {source}")]
    Open {
        /// The process.
        pid: u32,
        /// What went wrong.
        source: io::Error,
    },
    /// Between the scan and the open the pid went to another process (or netns).
    #[error("process {pid} is no longer the pod's; looking again")]
    Moved {
        /// The process.
        pid: u32,
    },
    /// The namespace's addresses could not be listed.
    #[error("listing the addresses in the network namespace of process {pid}: {source}")]
    Addresses {
        /// The process.
        pid: u32,
        /// What went wrong.
        source: io::Error,
    },
    /// The namespace found is not the pod's: none of the pod's addresses is in it.
    #[error("the network namespace of process {pid} holds none of the pod's addresses {ips:?}")]
    WrongAddresses {
        /// The process.
        pid: u32,
        /// The pod's addresses, as discovery has them.
        ips: Vec<IpAddr>,
    },
    /// The registry could not keep the pod.
    #[error("keeping the pod's network namespace: {0}")]
    Keep(io::Error),
    /// A blocking task failed.
    #[error("internal: {0}")]
    Internal(String),
}

/// When a pod that was not taken on is looked for again.
#[derive(Clone, Copy, Debug)]
struct Retry {
    at: Instant,
    delay: Duration,
}

/// Takes on running pods as discovery meshes them, and lets go of those it un-meshes.
#[derive(Clone, Debug)]
pub struct Enroller {
    /// Where pods are kept (shared with the CNI socket).
    pub registry: PodRegistry,
    /// Discovery's view.
    pub state: watch::Receiver<Arc<DiscoveryState>>,
    /// This node.
    pub node: String,
    /// The host's proc filesystem (empty: pods are only released, never enrolled).
    pub proc_root: PathBuf,
    /// Counters.
    pub metrics: EnrolMetrics,
}

impl Enroller {
    /// Follows discovery and the registry until `shutdown`.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut state = self.state.clone();
        let mut records = self.registry.subscribe();
        let mut retries: HashMap<String, Retry> = HashMap::new();
        let mut next_scan = Instant::now();
        loop {
            let s = state.borrow_and_update().clone();
            records.borrow_and_update();
            let mut wake = None;
            if s.synced {
                self.release(&s);
                let (due, later) = self.due(&s, &mut retries);
                wake = later;
                let now = Instant::now();
                if !due.is_empty() && now >= next_scan {
                    next_scan = now + MIN_SCAN_INTERVAL;
                    self.enrol(due, &mut retries).await;
                    continue;
                }
                if !due.is_empty() {
                    wake = Some(wake.map_or(next_scan, |w: Instant| w.min(next_scan)));
                }
            }
            let timer = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = &mut shutdown => return,
                changed = state.changed() => if changed.is_err() { return },
                changed = records.changed() => if changed.is_err() { return },
                _ = timer => {}
            }
        }
    }

    /// Drops the record of every pod that discovery lists as not meshed, and of every
    /// enrolled pod it no longer lists (or lists with another UID: a new pod of the same
    /// name) once no process is left in its netns. CNI records of unlisted pods wait for
    /// `DEL` or `GC`, which enrolled pods, having no sandbox id, would never match.
    fn release(&self, s: &DiscoveryState) {
        for (key, pod) in self.registry.pods().iter() {
            let reason = match s.workload(key) {
                Some(w) if !w.meshed => "the pod is no longer meshed",
                None if pod.source == PodSource::Proc => {
                    if self.netns_in_use(&pod.netns) {
                        continue;
                    }
                    "discovery no longer lists the pod and no process is left in its netns"
                }
                Some(w) if pod.source == PodSource::Proc && w.uid != pod.uid => {
                    if self.netns_in_use(&pod.netns) {
                        continue;
                    }
                    "the pod was replaced by another of the same name and no process is left in its netns"
                }
                _ => continue,
            };
            if self.registry.remove(&pod.namespace, &pod.name, None) {
                self.metrics.released.inc();
                tracing::info!(pod = %key, source = ?pod.source, reason, "record and netns handle dropped");
            }
        }
    }

    /// Whether a process still runs in the netns `handle` holds (without a proc root to
    /// look in, or when it cannot be read: assume so, and keep the pod failing closed).
    fn netns_in_use(&self, handle: &std::path::Path) -> bool {
        if self.proc_root.as_os_str().is_empty() {
            return true;
        }
        match procfs::NsId::of(handle) {
            Ok(id) => procfs::netns_in_use(&self.proc_root, id).unwrap_or(true),
            Err(_) => false,
        }
    }

    /// The pods to look for now, and when the next of the others is due.
    fn due(
        &self,
        s: &DiscoveryState,
        retries: &mut HashMap<String, Retry>,
    ) -> (Vec<Arc<Workload>>, Option<Instant>) {
        if self.proc_root.as_os_str().is_empty() {
            return (Vec::new(), None);
        }
        let records = self.registry.pods();
        // Pods that name their netns (local mode) or have no address yet (their CNI ADD
        // is under way) are not for enrolment; nor are pods without a UID.
        let waiting: Vec<Arc<Workload>> = s
            .local_workloads(&self.node)
            .into_iter()
            .filter(|w| w.netns.is_none() && !w.ips.is_empty() && !w.uid.is_empty())
            .filter(|w| !records.contains_key(&w.key()))
            .collect();
        retries.retain(|key, _| waiting.iter().any(|w| &w.key() == key));
        let now = Instant::now();
        let mut later: Option<Instant> = None;
        let mut due = Vec::new();
        for w in waiting {
            match retries.get(&w.key()) {
                Some(r) if r.at > now => later = Some(later.map_or(r.at, |l| l.min(r.at))),
                _ => due.push(w),
            }
        }
        (due, later)
    }

    /// One scan for every pod in `due`, then each found pod taken on.
    async fn enrol(&self, due: Vec<Arc<Workload>>, retries: &mut HashMap<String, Retry>) {
        let (valid, invalid): (Vec<_>, Vec<_>) =
            due.into_iter().partition(|w| cgroup::valid_uid(&w.uid));
        for w in invalid {
            self.failed(&w, &EnrolError::InvalidUid(w.uid.clone()), retries);
        }
        if valid.is_empty() {
            return;
        }
        let uids: HashSet<String> = valid.iter().map(|w| w.uid.clone()).collect();
        let root = self.proc_root.clone();
        self.metrics.scans.inc();
        let scanned = tokio::task::spawn_blocking(move || {
            let host = procfs::host_netns(&root);
            procfs::scan(&root, &uids, &host).map_err(|source| EnrolError::Scan {
                path: root.clone(),
                source,
            })
        })
        .await
        .unwrap_or_else(|e| Err(EnrolError::Internal(e.to_string())));
        let scan = match scanned {
            Ok(scan) => scan,
            Err(error) => {
                for w in valid {
                    self.failed(&w, &error, retries);
                }
                return;
            }
        };
        if scan.truncated {
            tracing::warn!(
                processes = scan.processes,
                "the /proc scan stopped at its limit; some pods may not be found"
            );
        }
        for w in valid {
            match scan.found.get(&w.uid) {
                None => self.not_found(&w, retries),
                Some(process) => self.take_on(&w, *process, retries).await,
            }
        }
    }

    async fn take_on(
        &self,
        w: &Arc<Workload>,
        process: PodProcess,
        retries: &mut HashMap<String, Retry>,
    ) {
        let (root, registry, pod) = (self.proc_root.clone(), self.registry.clone(), w.clone());
        let taken = tokio::task::spawn_blocking(move || take(&root, &registry, &pod, process))
            .await
            .unwrap_or_else(|e| Err(EnrolError::Internal(e.to_string())));
        match taken {
            Ok(Some(pod)) => {
                retries.remove(&w.key());
                self.metrics.count("enrolled");
                tracing::info!(pod = %w.key(), pid = process.pid, netns = %pod.netns.display(), "enrolled a running pod (no CNI ADD): opening its listeners and redirection");
            }
            Ok(None) => {
                tracing::debug!(pod = %w.key(), "a CNI ADD took the pod on first");
            }
            Err(error) => self.failed(w, &error, retries),
        }
    }

    fn not_found(&self, w: &Workload, retries: &mut HashMap<String, Retry>) {
        self.metrics.count("not_found");
        let first = !retries.contains_key(&w.key());
        let retry = backoff(retries, &w.key());
        if first {
            tracing::info!(pod = %w.key(), uid = %w.uid, retry_in = ?retry, "meshed pod has no record and no running process on this node yet");
        } else {
            tracing::debug!(pod = %w.key(), retry_in = ?retry, "meshed pod still not found running");
        }
    }

    fn failed(&self, w: &Workload, error: &EnrolError, retries: &mut HashMap<String, Retry>) {
        self.metrics.count("error");
        let retry = backoff(retries, &w.key());
        tracing::warn!(pod = %w.key(), %error, retry_in = ?retry, "cannot enrol a running pod");
    }
}

/// Schedules the next look for `key`; the wait before it.
fn backoff(retries: &mut HashMap<String, Retry>, key: &str) -> Duration {
    let delay = retries
        .get(key)
        .map_or(RETRY_INITIAL, |r| (r.delay * 2).min(RETRY_MAX));
    retries.insert(
        key.to_string(),
        Retry {
            at: Instant::now() + delay,
            delay,
        },
    );
    delay
}

/// Opens the process's network namespace, checks that it is still the pod's and holds
/// the pod's address, and records the pod (`None`: a record appeared meanwhile).
fn take(
    proc_root: &Path,
    registry: &PodRegistry,
    w: &Workload,
    process: PodProcess,
) -> Result<Option<CniPod>, EnrolError> {
    let pid = process.pid;
    let ns = std::fs::File::open(proc_root.join(pid.to_string()).join("ns/net"))
        .map_err(|source| EnrolError::Open { pid, source })?;
    // Opened first, checked second: if the pid was reused between the scan and the open,
    // the check sees the new process and refuses; once open, the handle is this netns.
    let same_pod = procfs::pod_uids_of(proc_root, pid).is_ok_and(|u| u.contains(&w.uid));
    if !same_pod || NsId::of_file(&ns).ok() != Some(process.netns) {
        return Err(EnrolError::Moved { pid });
    }
    let addresses =
        crate::netns::addresses(&ns).map_err(|source| EnrolError::Addresses { pid, source })?;
    if !w.ips.iter().any(|ip| addresses.contains(ip)) {
        return Err(EnrolError::WrongAddresses {
            pid,
            ips: w.ips.clone(),
        });
    }
    let pod = CniPod {
        namespace: w.namespace.clone(),
        name: w.name.clone(),
        uid: w.uid.clone(),
        container_id: String::new(),
        // Discovery's addresses stay authoritative for an enrolled pod.
        ips: Vec::new(),
        netns: PathBuf::new(),
        source: PodSource::Proc,
    };
    registry.enrol(pod, ns.into()).map_err(EnrolError::Keep)
}

#[cfg(test)]
mod tests;
