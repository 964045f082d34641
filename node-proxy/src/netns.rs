//! Sockets inside a pod's network namespace.
//!
//! A socket belongs to the network namespace of the thread that created it, for its whole
//! life, whichever thread uses it later. So each pod gets one helper thread that enters its
//! netns once (`setns`) and creates sockets on request; the sockets are then driven by the
//! tokio runtime as usual. This is the model of Istio's ztunnel in-pod mode.

use nix::sched::{setns, CloneFlags};
use std::fs::File;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use tokio::sync::oneshot;

type Job = Box<dyn FnOnce() + Send>;

/// A pod's network namespace and the thread that creates sockets in it.
#[derive(Debug)]
pub struct Netns {
    path: PathBuf,
    /// The namespace itself, held open (eBPF attaches `sk_lookup` to it).
    file: File,
    jobs: mpsc::Sender<Job>,
}

impl Netns {
    /// Opens the netns at `path` (e.g. `/run/netns/<pod>` or `/proc/<pid>/ns/net`) and
    /// starts its helper thread, which ends when the handle is dropped.
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = File::open(path).map_err(|e| {
            io::Error::new(e.kind(), format!("opening netns {}: {e}", path.display()))
        })?;
        let held = file.try_clone()?;
        let (jobs, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        std::thread::Builder::new()
            .name(format!("netns-{name}"))
            .spawn(move || {
                let entered = setns(&file, CloneFlags::CLONE_NEWNET).map_err(io::Error::from);
                let ok = entered.is_ok();
                let _ = ready_tx.send(entered);
                if !ok {
                    return;
                }
                while let Ok(job) = rx.recv() {
                    job();
                }
            })?;
        ready_rx
            .recv()
            .map_err(|_| io::Error::other("netns thread died"))?
            .map_err(|e| {
                io::Error::new(e.kind(), format!("entering netns {}: {e}", path.display()))
            })?;
        Ok(Self {
            path: path.to_path_buf(),
            file: held,
            jobs,
        })
    }

    /// The namespace's identity (device and inode of its nsfs file): two handles with the
    /// same id are the same namespace, whatever their paths.
    pub fn id(&self) -> io::Result<(u64, u64)> {
        use std::os::unix::fs::MetadataExt;
        let m = self.file.metadata()?;
        Ok((m.dev(), m.ino()))
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

    /// Runs `f` on the thread inside the netns.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> io::Result<T> {
        let (tx, rx) = oneshot::channel();
        self.jobs
            .send(Box::new(move || {
                let _ = tx.send(f());
            }))
            .map_err(|_| io::Error::other("netns thread is gone"))?;
        rx.await
            .map_err(|_| io::Error::other("netns thread is gone"))
    }

    /// A listener bound to `addr` inside the netns.
    pub async fn bind(&self, addr: SocketAddr) -> io::Result<tokio::net::TcpListener> {
        let std = self
            .run(move || -> io::Result<std::net::TcpListener> {
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
            .await??;
        tokio::net::TcpListener::from_std(std)
    }

    /// An unconnected TCP socket inside the netns for connecting to `dst`, carrying `mark`
    /// so that the pod's redirection leaves the proxy's own connections alone.
    pub async fn socket(&self, dst: SocketAddr, mark: u32) -> io::Result<tokio::net::TcpSocket> {
        let std = self
            .run(move || -> io::Result<std::net::TcpStream> {
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
            .await??;
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
