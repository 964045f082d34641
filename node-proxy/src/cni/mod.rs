//! The CNI socket: `ambit-cni` hands each new pod to the proxy here, and the proxy answers
//! only once the pod's listeners and redirection are in place (or the pod is not meshed).
//!
//! - [`registry`]: the pods handed over, on disk, with a handle on each netns.
//! - [`CniServer`]: the unix socket (`/var/run/ambit/cni.sock`), one request per
//!   connection ([`ambit_api::cni`]), the netns riding along as a file descriptor.
//! - [`peer`]: who may talk to the socket (root, and optionally the plugin's binary only).
//! - `wire`: one request read off the socket with its descriptor; `metrics`: its counters.
//!
//! The descriptor of an `ADD` must be a network namespace (nsfs, `NS_GET_NSTYPE`), and a
//! sandbox the proxy holds is never moved to another network namespace; `DEL` and
//! `CHECK` act on the sandbox they name only (an empty id names none).
//!
//! Whether a pod is meshed is the control plane's word (discovery): the namespace and pod
//! annotations. The proxy waits a while for discovery to show a pod it has not seen yet
//! (the API server knows a pod before its sandbox exists, so this is short).

mod metrics;
pub mod peer;
pub mod registry;
mod wire;

pub use metrics::{CniLabels, CniMetrics, PeerLabels};
pub use peer::{PeerPolicy, PEER_REFUSED};
pub use registry::{CniPod, CniPods, PodRegistry, PodSource};

use crate::discovery::DiscoveryState;
use crate::pods::ServingPods;
use ambit_api::cni::{code, encode, PodAdd, PodRef, Request, Response};
use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;

/// How long a client has to send its whole request.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Requests served at once (an ADD waits up to `--cni-add-timeout` for its pod). A node
/// starts at most a few hundred pods at once (110 by default); beyond this, a request is
/// answered "try again later" (code 11) without being read, so that a flood of
/// connections cannot hold the proxy's descriptors and memory.
pub const MAX_CONNECTIONS: usize = 256;

/// What the CNI socket needs of the proxy.
#[derive(Clone, Debug)]
pub struct CniServer {
    /// Where pods handed over are kept.
    pub registry: PodRegistry,
    /// Discovery's view (is the pod meshed, and on this node?).
    pub state: watch::Receiver<Arc<DiscoveryState>>,
    /// Pods whose listeners are open, with their netns.
    pub serving: ServingPods,
    /// This node.
    pub node: String,
    /// How long `ADD` waits for discovery and for the listeners.
    pub add_timeout: Duration,
    /// Counters.
    pub metrics: CniMetrics,
    /// Who may talk to the socket.
    pub peers: PeerPolicy,
}

fn error(code: u32, msg: impl Into<String>, details: impl Into<String>) -> Response {
    Response::Error {
        code,
        msg: msg.into(),
        details: details.into(),
    }
}

/// Binds the CNI socket at `path` (replacing a stale one), readable by root only; `None`
/// when `path` is empty (no CNI plugin on this node).
pub fn bind(path: &std::path::Path) -> io::Result<Option<UnixListener>> {
    use std::os::unix::fs::PermissionsExt;
    if path.as_os_str().is_empty() {
        return Ok(None);
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(Some(listener))
}

/// Serves the CNI socket until `shutdown`, accepting while `gate` is open (a hand-over
/// closes it, and waits for the requests in flight).
pub async fn serve(
    listener: UnixListener,
    server: CniServer,
    gate: crate::handover::Gate,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            accepted = gate.accept(|| listener.accept()) => match accepted {
                Ok((stream, _)) => {
                    let server = server.clone();
                    let inside = gate.enter();
                    match slots.clone().try_acquire_owned() {
                        Ok(slot) => {
                            tokio::spawn(async move {
                                server.connection(stream).await;
                                drop((slot, inside));
                            });
                        }
                        Err(_) => {
                            tokio::spawn(async move { server.busy(stream).await });
                        }
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "CNI socket: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

impl CniServer {
    /// Answers a connection over [`MAX_CONNECTIONS`] without reading it.
    async fn busy(&self, mut stream: UnixStream) {
        let response = error(
            code::TRY_AGAIN,
            "the node proxy is busy",
            format!("{MAX_CONNECTIONS} CNI requests are in progress; the runtime retries"),
        );
        self.metrics.count("busy", &response);
        if let Ok(bytes) = encode(&response) {
            let _ = tokio::time::timeout(READ_TIMEOUT, stream.write_all(&bytes)).await;
            let _ = stream.shutdown().await;
        }
    }

    /// The netns the pod's listeners are open in, if they are.
    fn served_netns(&self, key: &str) -> Option<std::path::PathBuf> {
        self.serving.borrow().get(key).cloned()
    }

    /// Waits until `done` holds of the served pods, or `deadline`; whether it held.
    async fn wait_serving(
        &self,
        deadline: tokio::time::Instant,
        done: impl FnMut(&BTreeMap<String, std::path::PathBuf>) -> bool,
    ) -> bool {
        let mut serving = self.serving.subscribe();
        let held = matches!(
            tokio::time::timeout_at(deadline, serving.wait_for(done)).await,
            Ok(Ok(_))
        );
        held
    }

    async fn connection(&self, mut stream: UnixStream) {
        // The peer first: nothing it sends is read (nor any descriptor taken) unless it
        // may talk to the proxy.
        if let Err(refusal) = self.peers.check(&stream) {
            self.metrics.peer_refused(refusal.reason);
            let response = error(PEER_REFUSED, refusal.msg, refusal.details);
            self.metrics.count("invalid", &response);
            if let Response::Error { msg, details, .. } = &response {
                tracing::warn!(reason = refusal.reason, %msg, %details, "CNI socket: peer refused");
            }
            if let Ok(bytes) = encode(&response) {
                let _ = stream.write_all(&bytes).await;
                let _ = stream.shutdown().await;
            }
            // Until the peer has sent its request and read the answer (closing the
            // socket under a request still being written would leave it a broken pipe
            // instead of the reason); what it sends is discarded, descriptors too.
            let mut sink = [0u8; 4096];
            let mut left = ambit_api::cni::MAX_MESSAGE + 4;
            let drained = async {
                while left > 0 {
                    match stream.read(&mut sink).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => left = left.saturating_sub(n),
                    }
                }
            };
            let _ = tokio::time::timeout(READ_TIMEOUT, drained).await;
            return;
        }
        let (command, response) =
            match tokio::time::timeout(READ_TIMEOUT, wire::read_request(&stream)).await {
                Ok(Ok((request, fd))) => {
                    let command = command_name(&request);
                    (command, self.handle(request, fd).await)
                }
                Ok(Err(e)) => (
                    "invalid",
                    error(
                        code::DECODE,
                        "unreadable request on the CNI socket",
                        e.to_string(),
                    ),
                ),
                Err(_) => (
                    "invalid",
                    error(
                        code::DECODE,
                        "incomplete request on the CNI socket",
                        format!("no whole request within {READ_TIMEOUT:?}"),
                    ),
                ),
            };
        self.metrics.count(command, &response);
        if let Response::Error { msg, details, .. } = &response {
            tracing::warn!(command, %msg, %details, "CNI request failed");
        }
        if let Ok(bytes) = encode(&response) {
            let _ = stream.write_all(&bytes).await;
            let _ = stream.shutdown().await;
        }
    }

    async fn handle(&self, request: Request, netns: Option<OwnedFd>) -> Response {
        // Names become file names under the run directory: check them before anything.
        let pod = match &request {
            Request::Add(add) => Some(&add.pod),
            Request::Del(pod) | Request::Check(pod) => Some(pod),
            Request::Status | Request::Gc { .. } => None,
        };
        if let Some(Err(e)) = pod.map(PodRef::validate) {
            return error(
                code::INVALID_ENV,
                "invalid pod reference",
                format!("{e}; nothing was done"),
            );
        }
        // The descriptor is mounted as the pod's netns handle: it must be one.
        if let (Request::Add(add), Some(fd)) = (&request, &netns) {
            if let Err(what) = registry::netns_of(fd.as_fd()) {
                return error(
                    code::INVALID_ENV,
                    format!(
                        "ADD for {}/{}: the descriptor passed as CNI_NETNS is {what}, not a network namespace",
                        add.pod.namespace, add.pod.name
                    ),
                    format!(
                        "nothing was done; the plugin sends the file CNI_NETNS names ({:?}), which must be the sandbox's network namespace",
                        add.netns_path
                    ),
                );
            }
        }
        match request {
            Request::Add(add) => self.add(add, netns).await,
            Request::Del(pod) => self.del(&pod).await,
            Request::Check(pod) => self.check(&pod),
            Request::Status => {
                if self.state.borrow().synced {
                    Response::Ok
                } else {
                    error(
                        code::NOT_AVAILABLE,
                        "the node proxy has no view of the cluster yet",
                        "discovery has not delivered a snapshot; is ambit-control reachable?",
                    )
                }
            }
            Request::Gc {
                valid_container_ids,
            } => {
                // A GC that lists nothing valid would drop every pod handed over: each
                // would stop being redirected. Sandboxes go one by one, by DEL (or by a
                // GC that keeps something); this one changes nothing.
                if valid_container_ids.iter().all(|id| id.trim().is_empty()) {
                    tracing::warn!(
                        "CNI GC listed no valid attachment; keeping every pod redirected"
                    );
                    return error(
                        code::INVALID_CONFIG,
                        "GC listed no valid attachment",
                        "refusing to drop every pod on the node; send DEL for each sandbox that is gone",
                    );
                }
                let removed = self.registry.retain_sandboxes(&valid_container_ids);
                tracing::info!(?removed, "CNI GC");
                Response::Ok
            }
        }
    }

    async fn add(&self, add: PodAdd, netns: Option<OwnedFd>) -> Response {
        let key = format!("{}/{}", add.pod.namespace, add.pod.name);
        let deadline = tokio::time::Instant::now() + self.add_timeout;
        let mut state = self.state.clone();
        let workload = loop {
            let found = state
                .borrow_and_update()
                .workloads()
                .find(|w| w.key() == key)
                .cloned();
            if let Some(w) = found {
                break w;
            }
            match tokio::time::timeout_at(deadline, state.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => {
                    return error(
                        code::TRY_AGAIN,
                        "the node proxy is shutting down",
                        "the runtime retries the pod once the proxy is back",
                    )
                }
                Err(_) => {
                    return error(
                        code::TRY_AGAIN,
                        format!(
                            "pod {key} is not known to the control plane as a pod of node {:?} yet",
                            self.node
                        ),
                        format!(
                            "waited {:?} for discovery to list it (a node is sent its own pods only);                              check that the pod is scheduled on this node and that ambit-control watches its namespace",
                            self.add_timeout
                        ),
                    )
                }
            }
        };
        if !workload.meshed {
            return Response::NotMeshed;
        }
        if workload.node != self.node {
            return error(
                code::NOT_REDIRECTED,
                format!("pod {key} is scheduled on node {:?}", workload.node),
                format!("this is the proxy of node {:?}", self.node),
            );
        }
        let Some(fd) = netns else {
            return error(
                code::INVALID_ENV,
                format!("ADD for {key} came without the pod's netns descriptor"),
                "the plugin passes CNI_NETNS as an open file",
            );
        };
        let pod = CniPod {
            namespace: add.pod.namespace,
            name: add.pod.name,
            uid: add.uid,
            container_id: add.pod.container_id,
            ips: add.ips,
            netns: Default::default(),
            source: PodSource::Cni,
        };
        let pod = match self.registry.add(pod, fd) {
            Ok(pod) => pod,
            Err(e) => {
                return match registry::Refused::of(&e) {
                    Some(refused @ registry::Refused::NotNetns(_)) => error(
                        code::INVALID_ENV,
                        format!("ADD for {key}: {refused}"),
                        "nothing was done; CNI_NETNS must name the sandbox's network namespace",
                    ),
                    Some(refused @ registry::Refused::OtherPod { .. }) => error(
                        code::INVALID_ENV,
                        format!("ADD for {key} refused: {refused}"),
                        "nothing was changed: a sandbox belongs to one pod, and the runtime gives each its own CNI_CONTAINERID; \
                         the pod holding it stays redirected until its DEL",
                    ),
                    Some(refused) => error(
                        code::INVALID_ENV,
                        format!("ADD for {key} refused: {refused}"),
                        "nothing was changed: the sandbox stays redirected in the network namespace it was added with. \
                         A sandbox cannot move; DEL it first (the runtime does before it sets up a sandbox again), or give the new one its own CNI_CONTAINERID",
                    ),
                    None => error(
                        code::IO_FAILURE,
                        format!("taking pod {key} on"),
                        e.to_string(),
                    ),
                };
            }
        };
        tracing::info!(pod = %key, netns = %pod.netns.display(), ips = ?pod.ips, "CNI ADD: waiting for the pod's listeners and redirection");
        if self
            .wait_serving(deadline, |s| s.get(&key) == Some(&pod.netns))
            .await
        {
            return Response::Redirected;
        }
        error(
            code::NOT_REDIRECTED,
            format!("the node proxy could not redirect pod {key} in time"),
            format!(
                "listeners or redirection not in place after {:?}; see the proxy's log",
                self.add_timeout
            ),
        )
    }

    /// Forgets the pod, and answers once its listeners are closed (peers told to go
    /// away), so that the runtime tears the network down only after that.
    async fn del(&self, pod: &PodRef) -> Response {
        let key = format!("{}/{}", pod.namespace, pod.name);
        let netns = self
            .registry
            .sandbox(&pod.namespace, &pod.name, &pod.container_id)
            .map(|p| p.netns);
        let removed = self
            .registry
            .remove(&pod.namespace, &pod.name, Some(&pod.container_id));
        tracing::info!(pod = %key, removed, "CNI DEL");
        if removed {
            let deadline = tokio::time::Instant::now() + self.add_timeout;
            self.wait_serving(deadline, |s| {
                netns.is_none() || s.get(&key) != netns.as_ref()
            })
            .await;
        }
        Response::Ok
    }

    fn check(&self, pod: &PodRef) -> Response {
        let key = format!("{}/{}", pod.namespace, pod.name);
        let registered = self
            .registry
            .sandbox(&pod.namespace, &pod.name, &pod.container_id);
        if let (None, Some(other)) = (&registered, self.registry.pods().get(&key)) {
            return error(
                code::NOT_REDIRECTED,
                format!(
                    "sandbox {:?} of pod {key} was never handed to the node proxy",
                    pod.container_id
                ),
                format!(
                    "the proxy holds the pod's sandbox {:?}; the runtime's ADD of this sandbox hands it over",
                    other.container_id
                ),
            );
        }
        let Some(registered) = registered else {
            return if self
                .state
                .borrow()
                .local_workloads(&self.node)
                .iter()
                .any(|w| w.key() == key)
            {
                error(
                    code::NOT_REDIRECTED,
                    format!("meshed pod {key} was never handed to the node proxy"),
                    "the proxy enrols it once it finds the pod's processes in /proc (see pod_enrolments_total and the proxy's log)",
                )
            } else {
                Response::Ok
            };
        };
        let served = self.served_netns(&key);
        if served.as_ref() == Some(&registered.netns) {
            Response::Ok
        } else {
            error(
                code::NOT_REDIRECTED,
                format!("pod {key} is not redirected"),
                "its listeners are not open; see the proxy's log",
            )
        }
    }
}

fn command_name(r: &Request) -> &'static str {
    match r {
        Request::Add(_) => "add",
        Request::Del(_) => "del",
        Request::Check(_) => "check",
        Request::Status => "status",
        Request::Gc { .. } => "gc",
    }
}
