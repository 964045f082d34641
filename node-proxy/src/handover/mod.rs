//! Hitless restart: a new `ambit-proxy` started beside a running one on the same node
//! takes its listening sockets over, so that no connection is refused in between.
//!
//! The running process listens on [`SOCKET`] in the run directory (a `SOCK_SEQPACKET`
//! unix socket, mode 0600, peers with our own uid only). A new process connects at start:
//!
//! 1. `hello` → `admin`. When the new process could not bind the admin address because
//!    the running one has it (host network, or one machine), the admin listener rides
//!    along: the new process answers the probes from now on (not ready yet), the running
//!    one stops accepting on it. In a pod of its own (the DaemonSet's surge pod) the new
//!    process has its own admin port, and the old one keeps answering on its own.
//! 2. The new process gets discovery, policy and a certificate for every identity on the
//!    node (from the control plane, or from what was persisted), then `take` → the running
//!    one stops accepting on the CNI socket, lets the requests in flight finish, and sends
//!    `cni` + that listener and one `pod` message per served pod with its listening
//!    sockets (4140, 4143, 4144 per address family), then `done`.
//! 3. The new process accepts on them — the same sockets: connections queued in the
//!    kernel are not lost, the `sk_lookup` map and the nftables rules still point at them
//!    — and says `serving` → the running one stops accepting everywhere (`released`) and
//!    drains: requests in flight finish, HTTP/2 peers get GOAWAY, HTTP/1 responses say
//!    `connection: close`, opaque streams run until they end or the grace period does.
//!
//! Descriptor passing rather than a second set of `SO_REUSEPORT` listeners: the sockets
//! stay the same, so neither redirection map nor rule changes, nothing queued on an old
//! listener is dropped when it closes, and it works alike for eBPF and nftables.
//!
//! If the new process goes away before `serving`, the running one opens its gates again
//! and goes on as before. After the hand-over the old process stays (drained, idle) until
//! it is told to stop: exiting on its own would have Kubernetes restart its container, and
//! the restarted old version would take the listeners back.

mod gate;
pub mod wire;

pub use gate::Gate;

use crate::pods::{ExportedPod, HandedPod, Request};
use crate::proxy::PodListeners;
use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, watch};
use wire::{Channel, Listener, Message};

/// The hand-over socket's name in the run directory.
pub const SOCKET: &str = "handover.sock";

/// The process this one takes over from.
#[derive(Debug)]
pub struct Predecessor {
    channel: Channel,
    /// Its pid, once it has answered.
    pub pid: u32,
}

/// What a predecessor handed over.
#[derive(Debug, Default)]
pub struct Handed {
    /// The CNI socket's listener.
    pub cni: Option<std::os::unix::net::UnixListener>,
    /// Each pod's listeners.
    pub pods: BTreeMap<String, HandedPod>,
}

fn tcp_listener(fd: OwnedFd) -> io::Result<Arc<tokio::net::TcpListener>> {
    let std = std::net::TcpListener::from(fd);
    std.set_nonblocking(true)?;
    Ok(Arc::new(tokio::net::TcpListener::from_std(std)?))
}

impl Predecessor {
    /// Connects to a proxy running with `run_dir`, taking its admin listener if
    /// `want_admin`; `None` when none runs.
    pub async fn connect(
        run_dir: &Path,
        want_admin: bool,
    ) -> io::Result<Option<(Self, Option<tokio::net::TcpListener>)>> {
        let path = run_dir.join(SOCKET);
        let Some(channel) = Channel::connect(&path)? else {
            return Ok(None);
        };
        let hello = Message::Hello {
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").into(),
            admin: want_admin,
        };
        channel.send(&hello, &[]).await?;
        let (pid, version, admin) = channel
            .expect("admin", |m, mut fds| match m {
                Message::Admin { pid, version } if fds.len() == usize::from(want_admin) => {
                    Some((pid, version, fds.pop()))
                }
                _ => None,
            })
            .await?;
        let admin = match admin {
            Some(fd) => {
                let admin = std::net::TcpListener::from(fd);
                admin.set_nonblocking(true)?;
                Some(tokio::net::TcpListener::from_std(admin)?)
            }
            None => None,
        };
        tracing::info!(pid, %version, admin = admin.is_some(), "taking over from the running proxy");
        Ok(Some((Self { channel, pid }, admin)))
    }

    /// Asks for the CNI socket and every pod's listeners.
    pub async fn take(&self) -> io::Result<Handed> {
        self.channel.send(&Message::Take, &[]).await?;
        let mut handed = Handed::default();
        loop {
            let (msg, fds) = self
                .channel
                .expect("the pods", |m, fds| Some((m, fds)))
                .await?;
            match msg {
                Message::Cni if fds.len() == 1 => {
                    let fd = fds
                        .into_iter()
                        .next()
                        .ok_or_else(|| io::Error::other("cni"))?;
                    let l = std::os::unix::net::UnixListener::from(fd);
                    l.set_nonblocking(true)?;
                    handed.cni = Some(l);
                }
                Message::Pod {
                    key,
                    netns_id,
                    ipv6,
                    ..
                } if fds.len() == 3 * ipv6.len() && !ipv6.is_empty() => {
                    let mut fds = fds.into_iter();
                    let mut listeners = Vec::new();
                    for ipv6 in ipv6 {
                        let mut next = || {
                            fds.next()
                                .ok_or_else(|| io::Error::other("descriptor missing"))
                                .and_then(tcp_listener)
                        };
                        listeners.push(PodListeners {
                            ipv6,
                            outbound: next()?,
                            mesh: next()?,
                            plain: next()?,
                        });
                    }
                    handed.pods.insert(
                        key,
                        HandedPod {
                            netns_id,
                            listeners,
                        },
                    );
                }
                Message::Done { pods } if pods == handed.pods.len() => return Ok(handed),
                other => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "hand-over: unexpected {other:?} with {} descriptors",
                            fds.len()
                        ),
                    ))
                }
            }
        }
    }

    /// Tells the predecessor that its pods are served here: it stops accepting and
    /// drains. Returns once it has stopped accepting.
    pub async fn serving(self) -> io::Result<()> {
        self.channel.send(&Message::Serving, &[]).await?;
        self.channel
            .expect("released", |m, _| {
                matches!(m, Message::Released).then_some(())
            })
            .await
    }
}

/// What a running proxy hands over, and how it stops using it.
#[derive(Debug)]
pub struct Running {
    /// The admin listener, and the gate on its accept loop.
    pub admin: (OwnedFd, Gate),
    /// The CNI socket's listener and gate, when there is one.
    pub cni: Option<(OwnedFd, Gate)>,
    /// The pod lifecycle.
    pub lifecycle: mpsc::Sender<Request>,
    /// Whether a successor is in the middle of a hand-over (a SIGTERM then waits for it).
    pub in_progress: Arc<watch::Sender<bool>>,
    /// Why this process no longer serves, for /ready: set before the successor hears that
    /// it may call itself ready.
    pub stopping: Arc<watch::Sender<Option<String>>>,
}

/// Serves the hand-over socket at `listener`, one successor at a time, until one has taken
/// everything over: returns its pid (the lifecycle has stopped accepting by then).
pub async fn serve(listener: Listener, running: Running) -> u32 {
    loop {
        let channel = match listener.accept().await {
            Ok(c) => c,
            Err(error) => {
                tracing::warn!(%error, socket = %listener.path().display(), "hand-over: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        running.in_progress.send_replace(true);
        let result = successor(&channel, &running).await;
        running.in_progress.send_replace(false);
        match result {
            Ok(pid) => return pid,
            Err(error) => {
                tracing::warn!(%error, "hand-over failed; serving on as before");
                let _ = channel
                    .send(
                        &Message::Error {
                            message: error.to_string(),
                        },
                        &[],
                    )
                    .await;
                running.admin.1.open();
                if let Some((_, gate)) = &running.cni {
                    gate.open();
                }
            }
        }
    }
}

async fn successor(channel: &Channel, running: &Running) -> io::Result<u32> {
    let (pid, version, admin) = channel
        .expect("hello", |m, _| match m {
            Message::Hello {
                pid,
                version,
                admin,
            } => Some((pid, version, admin)),
            _ => None,
        })
        .await?;
    let own = Message::Admin {
        pid: std::process::id(),
        version: env!("CARGO_PKG_VERSION").into(),
    };
    if admin {
        tracing::info!(pid, %version, "a new proxy is taking over: its admin server answers from now on");
        running.admin.1.close();
        channel.send(&own, &[running.admin.0.as_fd()]).await?;
    } else {
        tracing::info!(pid, %version, "a new proxy is taking over");
        channel.send(&own, &[]).await?;
    }

    channel
        .expect("take", |m, _| matches!(m, Message::Take).then_some(()))
        .await?;
    if let Some((fd, gate)) = &running.cni {
        gate.close();
        // A CNI ADD in flight waits for its pod's listeners: let it finish here, so that
        // the pod is among those handed over.
        gate.empty().await;
        channel.send(&Message::Cni, &[fd.as_fd()]).await?;
    }
    let (tx, rx) = oneshot::channel();
    running
        .lifecycle
        .send(Request::Export(tx))
        .await
        .map_err(|_| io::Error::other("the pod lifecycle has stopped (shutting down)"))?;
    let pods: Vec<ExportedPod> = rx
        .await
        .map_err(|_| io::Error::other("the pod lifecycle has stopped (shutting down)"))?;
    for pod in &pods {
        let fds: Vec<BorrowedFd<'_>> = pod
            .listeners
            .iter()
            .flat_map(|l| [l.outbound.as_fd(), l.mesh.as_fd(), l.plain.as_fd()])
            .collect();
        let msg = Message::Pod {
            key: pod.key.clone(),
            netns: pod.netns.clone(),
            netns_id: pod.netns_id,
            ipv6: pod.listeners.iter().map(|l| l.ipv6).collect(),
        };
        channel.send(&msg, &fds).await?;
    }
    channel
        .send(&Message::Done { pods: pods.len() }, &[])
        .await?;
    drop(pods);

    channel
        .expect("serving", |m, _| {
            matches!(m, Message::Serving).then_some(())
        })
        .await?;
    let (tx, rx) = oneshot::channel();
    if running.lifecycle.send(Request::Release(tx)).await.is_ok() {
        let _ = rx.await;
    }
    tracing::info!(
        pid,
        "the new proxy serves every pod: stopped accepting, draining"
    );
    running.stopping.send_replace(Some(format!(
        "handed over to the proxy with pid {pid}; draining"
    )));
    // The successor may be gone by now; it has the listeners either way.
    let _ = channel.send(&Message::Released, &[]).await;
    Ok(pid)
}
