//! Sockets inside a pod's network namespace.
//!
//! A socket belongs to the network namespace of the thread that created it, for its whole
//! life, whichever thread uses it later. So sockets for pods are made by one helper thread
//! that, for each request, enters the pod's netns (`setns`), creates the socket and
//! returns to the proxy's own netns; the sockets are then driven by the tokio runtime as
//! usual. This is the model of Istio's ztunnel in-pod mode. One thread for every pod, not
//! one per pod: a thread costs ~10 kB of resident stack and a 16 kB kernel stack (outside
//! RSS, but charged to the proxy's memory cgroup), which with 1,000 pods on a node was
//! 10 MB of the proxy's RSS and 16 MB of kernel stacks (BENCHMARKS.md, "Memory: start-up
//! peak and 1,000 pods"). Whatever else is to run in a pod's netns ([`Netns::run`]: `nft`,
//! which forks) runs on a short-lived thread of its own, so that a slow command never
//! holds up a connection.

use nix::sched::{setns, CloneFlags};
use std::fs::File;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use tokio::sync::oneshot;

/// A request to the socket thread: run `job` inside `netns`; `job` is told whether the
/// netns could be entered.
struct Request {
    netns: Arc<File>,
    job: Box<dyn FnOnce(io::Result<()>) + Send>,
}

/// The socket thread's queue (started on first use, and again if it ever ended).
static SOCKET_THREAD: Mutex<Option<mpsc::Sender<Request>>> = Mutex::new(None);

/// Hands `request` to the socket thread, starting one if there is none.
fn submit(request: Request) -> io::Result<()> {
    let mut thread = SOCKET_THREAD.lock().unwrap_or_else(PoisonError::into_inner);
    let request = match thread.as_ref() {
        Some(tx) => match tx.send(request) {
            Ok(()) => return Ok(()),
            // The thread ended (it could not return to the proxy's netns): a new one.
            Err(mpsc::SendError(request)) => request,
        },
        None => request,
    };
    let tx = start_socket_thread()?;
    let sent = tx
        .send(request)
        .map_err(|_| io::Error::other("netns thread is gone"));
    *thread = Some(tx);
    sent
}

fn start_socket_thread() -> io::Result<mpsc::Sender<Request>> {
    // The proxy's own netns: where the thread returns after each job, so that it never
    // keeps a pod's namespace alive after the pod is gone.
    let home = File::open("/proc/self/ns/net")?;
    let (tx, rx) = mpsc::channel::<Request>();
    std::thread::Builder::new()
        .name("netns".into())
        .spawn(move || {
            while let Ok(Request { netns, job }) = rx.recv() {
                let entered = setns(&*netns, CloneFlags::CLONE_NEWNET).map_err(io::Error::from);
                let inside = entered.is_ok();
                job(entered);
                if !inside {
                    continue;
                }
                if let Err(error) = setns(&home, CloneFlags::CLONE_NEWNET) {
                    // Never create another socket from a pod's netns by mistake: this
                    // thread ends (the requests still queued fail) and the next request
                    // starts a new one.
                    tracing::error!(%error, "the netns thread cannot return to the proxy's network namespace; replacing it");
                    return;
                }
            }
        })?;
    Ok(tx)
}

/// A pod's network namespace, in which sockets are created on request.
#[derive(Debug)]
pub struct Netns {
    path: PathBuf,
    /// The namespace itself, held open (eBPF attaches `sk_lookup` to it).
    file: Arc<File>,
    /// Its (device, inode).
    id: (u64, u64),
}

impl Netns {
    /// Opens the netns at `path` (e.g. `/run/netns/<pod>` or `/proc/<pid>/ns/net`) and
    /// checks that it can be entered.
    pub fn open(path: &Path) -> io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let file = File::open(path).map_err(|e| {
            io::Error::new(e.kind(), format!("opening netns {}: {e}", path.display()))
        })?;
        let m = file.metadata()?;
        let netns = Self {
            path: path.to_path_buf(),
            file: Arc::new(file),
            id: (m.dev(), m.ino()),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        submit(Request {
            netns: netns.file.clone(),
            job: Box::new(move |entered| {
                let _ = tx.send(entered);
            }),
        })?;
        rx.recv()
            .map_err(|_| io::Error::other("netns thread is gone"))?
            .map_err(|e| {
                io::Error::new(e.kind(), format!("entering netns {}: {e}", path.display()))
            })?;
        Ok(netns)
    }

    /// The namespace's identity (device and inode of its nsfs file): two handles with the
    /// same id are the same namespace, whatever their paths.
    pub fn id(&self) -> io::Result<(u64, u64)> {
        Ok(self.id)
    }

    /// The netns path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The namespace's file descriptor.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.file.as_fd()
    }

    /// Runs `f` inside the netns, on a thread of its own that ends with it (`f` may take
    /// long: it never holds up the sockets of other pods).
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> io::Result<T> {
        let (tx, rx) = oneshot::channel();
        let netns = self.file.clone();
        std::thread::Builder::new()
            .name("netns-run".into())
            .spawn(move || {
                // The thread ends here: it never has to return to the proxy's netns.
                let _ = tx.send(
                    setns(&*netns, CloneFlags::CLONE_NEWNET)
                        .map_err(io::Error::from)
                        .map(|()| f()),
                );
            })?;
        rx.await
            .map_err(|_| io::Error::other("netns thread is gone"))?
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("entering netns {}: {e}", self.path.display()),
                )
            })
    }

    /// Runs `f` inside the netns on the socket thread (`f` must be quick: every pod's
    /// sockets are made there).
    async fn socket_job<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        let (tx, rx) = oneshot::channel();
        submit(Request {
            netns: self.file.clone(),
            job: Box::new(move |entered| {
                let _ = tx.send(entered.map(|()| f()));
            }),
        })?;
        rx.await
            .map_err(|_| io::Error::other("netns thread is gone"))?
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("entering netns {}: {e}", self.path.display()),
                )
            })?
    }

    /// A listener bound to `addr` inside the netns.
    pub async fn bind(&self, addr: SocketAddr) -> io::Result<tokio::net::TcpListener> {
        let std = self
            .socket_job(move || -> io::Result<std::net::TcpListener> {
                let socket = socket2::Socket::new(
                    socket2::Domain::for_address(addr),
                    socket2::Type::STREAM,
                    None,
                )?;
                if addr.is_ipv6() {
                    // The IPv4 listener on the same port is a socket of its own.
                    socket.set_only_v6(true)?;
                }
                socket.set_reuse_address(true)?;
                socket.set_nonblocking(true)?;
                socket.bind(&addr.into())?;
                socket.listen(1024)?;
                Ok(socket.into())
            })
            .await?;
        tokio::net::TcpListener::from_std(std)
    }

    /// An unconnected TCP socket inside the netns for connecting to `dst`, carrying `mark`
    /// so that the pod's redirection leaves the proxy's own connections alone.
    pub async fn socket(&self, dst: SocketAddr, mark: u32) -> io::Result<tokio::net::TcpSocket> {
        let std = self
            .socket_job(move || -> io::Result<std::net::TcpStream> {
                let socket = socket2::Socket::new(
                    socket2::Domain::for_address(dst),
                    socket2::Type::STREAM,
                    None,
                )?;
                socket.set_mark(mark)?;
                socket.set_nonblocking(true)?;
                socket.set_tcp_nodelay(true)?;
                Ok(socket.into())
            })
            .await?;
        Ok(tokio::net::TcpSocket::from_std_stream(std))
    }

    /// Connects to `dst` from inside the netns.
    pub async fn connect(&self, dst: SocketAddr, mark: u32) -> io::Result<tokio::net::TcpStream> {
        self.socket(dst, mark).await?.connect(dst).await
    }
}

/// The identity (device, inode) of the network namespace the proxy itself runs in.
pub fn own_id() -> io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata("/proc/self/ns/net")?;
    Ok((m.dev(), m.ino()))
}

/// The destination a connection had before an nftables REDIRECT sent it to us.
pub fn original_dst(stream: &tokio::net::TcpStream) -> io::Result<SocketAddr> {
    use nix::sys::socket::{getsockopt, sockopt};
    if stream.local_addr()?.is_ipv6() {
        let sin6 = getsockopt(stream, sockopt::Ip6tOriginalDst).map_err(io::Error::from)?;
        let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
        return Ok(SocketAddr::from((ip, u16::from_be(sin6.sin6_port))));
    }
    let sin = getsockopt(stream, sockopt::OriginalDst).map_err(io::Error::from)?;
    let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
    Ok(SocketAddr::from((ip, u16::from_be(sin.sin_port))))
}

/// The addresses of the interfaces in the network namespace `ns`, listed by a short-lived
/// thread that enters it (the caller's thread stays where it is).
pub fn addresses(ns: &File) -> io::Result<Vec<std::net::IpAddr>> {
    let ns = ns.try_clone()?;
    let lister = std::thread::Builder::new()
        .name("netns-addresses".into())
        .spawn(move || -> io::Result<Vec<std::net::IpAddr>> {
            setns(&ns, CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
            let mut ips = Vec::new();
            for ifa in nix::ifaddrs::getifaddrs().map_err(io::Error::from)? {
                let Some(addr) = ifa.address else { continue };
                if let Some(v4) = addr.as_sockaddr_in() {
                    ips.push(std::net::IpAddr::V4(v4.ip()));
                } else if let Some(v6) = addr.as_sockaddr_in6() {
                    ips.push(std::net::IpAddr::V6(v6.ip()));
                }
            }
            Ok(ips)
        })?;
    lister
        .join()
        .map_err(|_| io::Error::other("the thread listing addresses panicked"))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TestNetns;
    use std::os::fd::AsFd;

    fn thread_netns() -> (u64, u64) {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata("/proc/thread-self/ns/net").unwrap_or_else(|e| panic!("{e}"));
        (m.dev(), m.ino())
    }

    fn threads_named(name: &str) -> usize {
        std::fs::read_dir("/proc/self/task")
            .map(|tasks| {
                tasks
                    .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                    .filter(|comm| comm.trim() == name)
                    .count()
            })
            .unwrap_or(0)
    }

    #[tokio::test]
    async fn each_pods_sockets_are_made_in_its_own_namespace_by_one_thread_for_all() {
        let (a, b) = (TestNetns::new("netns-a"), TestNetns::new("netns-b"));
        let (na, nb) = (Netns::open(&a.path()), Netns::open(&b.path()));
        let (na, nb) = (
            na.unwrap_or_else(|e| panic!("{e}")),
            nb.unwrap_or_else(|e| panic!("{e}")),
        );
        // The same port on loopback in both: only possible in two namespaces.
        let addr: SocketAddr = "127.0.0.1:4140".parse().unwrap_or_else(|e| panic!("{e}"));
        let la = na.bind(addr).await.unwrap_or_else(|e| panic!("{e}"));
        let lb = nb.bind(addr).await.unwrap_or_else(|e| panic!("{e}"));
        let cookie = |l: &tokio::net::TcpListener| {
            ambit_ebpf::sys::netns_cookie(l.as_fd()).unwrap_or_else(|e| panic!("{e}"))
        };
        assert_ne!(cookie(&la), cookie(&lb));
        // A client socket is made in the pod's namespace too: it reaches that listener.
        let client = na.connect(addr, 0).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(client.peer_addr().ok(), Some(addr));
        assert_ne!(na.id().ok(), nb.id().ok());
        assert!(
            threads_named("netns") <= 1,
            "one socket thread for every pod"
        );
    }

    #[tokio::test]
    async fn run_runs_inside_the_namespace_and_leaves_the_caller_where_it_is() {
        let ns = TestNetns::new("netns-run");
        let netns = Netns::open(&ns.path()).unwrap_or_else(|e| panic!("{e}"));
        let before = thread_netns();
        let inside = netns
            .run(thread_netns)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(Some(inside), netns.id().ok());
        assert_eq!(thread_netns(), before);
    }

    #[tokio::test]
    async fn a_file_that_is_not_a_network_namespace_is_refused_and_the_thread_carries_on() {
        let refused = Netns::open(Path::new("/proc/self/ns/uts"));
        let error = refused.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("entering netns"), "{error}");
        let ns = TestNetns::new("netns-after");
        let netns = Netns::open(&ns.path()).unwrap_or_else(|e| panic!("{e}"));
        let addr: SocketAddr = "127.0.0.1:4141".parse().unwrap_or_else(|e| panic!("{e}"));
        netns.bind(addr).await.unwrap_or_else(|e| panic!("{e}"));
    }
}
