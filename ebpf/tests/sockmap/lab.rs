//! A pod for the sockmap tests: a network namespace with an address, the programs loaded
//! from a pin directory of the test's and attached to a cgroup of the test's, and this test
//! process moved into that cgroup for the test's duration — so that both the
//! "application's" and the "proxy's" sockets, made on this process's threads, come under
//! `sockops`, as on a node where the programs hang off the root cgroup. One lab at a time
//! (the process can be in one cgroup only); everything is removed on drop, also when the
//! test fails, and the process goes back to the cgroup it came from.

use ambit_ebpf::common::{SockKey, PROXY_MARK};
use ambit_ebpf::{PodRedirect, Redirection};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

static ONE_AT_A_TIME: Mutex<u8> = Mutex::new(0);

/// The pod's skip-outbound ports.
pub const SKIP_OUTBOUND: (u16, u16) = (9000, 9099);

pub fn run(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Moves this whole process into the cgroup `dir`.
pub fn move_into(dir: &Path) {
    std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string())
        .unwrap_or_else(|e| panic!("moving into {}: {e}", dir.display()));
}

pub struct Lab {
    pub pod: String,
    pub pod_ip: Ipv4Addr,
    pub cgroup: PathBuf,
    /// A second cgroup (`<cgroup>-proxy`, beside the first, not below it), for a test that
    /// runs the "proxy" outside the programs' cgroup.
    pub proxy_cgroup: PathBuf,
    pub pin_dir: PathBuf,
    pub netns_cookie: u64,
    pub r: Redirection,
    /// The proxy's outbound listener (127.0.0.1:4140 in the pod).
    pub outbound: TcpListener,
    /// Its IPv6 one (`[::1]:4140`, v6-only).
    pub outbound6: TcpListener,
    home: PathBuf,
    _mesh: TcpListener,
    _plain: TcpListener,
    _one: MutexGuard<'static, u8>,
}

impl Lab {
    /// A meshed pod with sockmap on (`sockmap`) or off, this process in the programs'
    /// cgroup.
    pub fn new(test: &str, sockmap: bool) -> Self {
        Self::build(test, sockmap, false)
    }

    /// As [`Self::new`], this process (the "proxy") in a cgroup of its own beside the
    /// programs' cgroup; the "application" must then be another process, in
    /// [`Self::cgroup`].
    pub fn with_proxy_outside(test: &str) -> Self {
        Self::build(test, true, true)
    }

    fn build(test: &str, sockmap: bool, proxy_outside: bool) -> Self {
        let mut one = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
        *one = one.wrapping_add(1);
        let n = *one;
        let tag = format!("{test}-{}-{n}", std::process::id());
        let pod = format!("sockmap-{tag}");
        let cgroup = ambit_ebpf::sys::cgroup2_mount().join(format!("ambit-sm-{tag}"));
        let proxy_cgroup = ambit_ebpf::sys::cgroup2_mount().join(format!("ambit-sm-{tag}-proxy"));
        let pin_dir = PathBuf::from(format!("/sys/fs/bpf/ambit-sm-{tag}"));
        let home = ambit_ebpf::sys::own_cgroup_dir().unwrap();
        let pod_ip = Ipv4Addr::new(10, 212, n, 2);
        // The guard's drop undoes what was made so far if a step below fails.
        let mut guard = Cleanup {
            pod: pod.clone(),
            cgroups: vec![cgroup.clone(), proxy_cgroup.clone()],
            pin_dir: pin_dir.clone(),
            home: home.clone(),
        };
        std::fs::create_dir(&cgroup).unwrap();
        std::fs::create_dir(&proxy_cgroup).unwrap();
        run(&["ip", "netns", "add", &pod]);
        run(&["ip", "-n", &pod, "link", "set", "lo", "up"]);
        run(&[
            "ip", "-n", &pod, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1",
        ]);
        let addr = format!("{pod_ip}/24");
        run(&["ip", "-n", &pod, "addr", "add", &addr, "dev", "eth0"]);
        let addr6 = format!("fd12:{n}::2/64");
        run(&[
            "ip", "-n", &pod, "addr", "add", &addr6, "dev", "eth0", "nodad",
        ]);
        run(&["ip", "-n", &pod, "link", "set", "eth0", "up"]);
        move_into(if proxy_outside {
            &proxy_cgroup
        } else {
            &cgroup
        });
        // Loaded after the move: the programs learn the proxy's cgroup from the loader's.
        let mut r = Redirection::load(&pin_dir).unwrap();
        r.attach_cgroup(&cgroup).unwrap();
        let file = std::fs::File::open(format!("/run/netns/{pod}")).unwrap();
        let outbound = listen_in(&pod, SocketAddr::from(([127, 0, 0, 1], 4140)));
        let outbound6 = listen6_in(&pod, SocketAddr::from((Ipv6Addr::LOCALHOST, 4140)));
        let mesh = listen_in(&pod, SocketAddr::from(([0, 0, 0, 0], 4143)));
        let plain = listen_in(&pod, SocketAddr::from(([0, 0, 0, 0], 4144)));
        let netns_cookie = ambit_ebpf::sys::netns_cookie(outbound.as_fd()).unwrap();
        let ip = IpAddr::V4(pod_ip);
        r.set_listeners(ip, &mesh, &plain).unwrap();
        r.add_pod(&PodRedirect {
            id: &tag,
            netns: file.as_fd(),
            netns_cookie,
            ips: &[ip],
            skip_inbound: &[],
            // The pod's connections to itself on these go direct (anything else goes to
            // the proxy's 4140).
            skip_outbound: &[SKIP_OUTBOUND],
        })
        .unwrap();
        if sockmap {
            r.enable_sockmap(&cgroup).unwrap();
        }
        guard.disarm();
        Self {
            pod,
            pod_ip,
            cgroup,
            proxy_cgroup,
            pin_dir,
            netns_cookie,
            r,
            outbound,
            outbound6,
            home,
            _mesh: mesh,
            _plain: plain,
            _one: one,
        }
    }

    /// Runs `f` on a thread inside the pod's netns (sockets made there stay there).
    pub fn in_pod<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        in_netns(&self.pod, f)
    }

    /// The application connecting out (to an address nothing answers at, so only the
    /// redirection can make it work) and the proxy's socket accepted on 4140: the outbound
    /// in-pod hop. `(application, proxy)`.
    pub fn outbound_hop(&self) -> (TcpStream, TcpStream) {
        let app = self.in_pod(|| TcpStream::connect("10.212.250.9:80").unwrap());
        (app, accept_within(&self.outbound))
    }

    /// The proxy connecting from the pod's netns to the application at the pod's own
    /// address (with the proxy's mark, as it delivers inbound connections) and the
    /// application's accepted socket: the delivery hop. `(proxy, application)`.
    pub fn delivery_hop(&self, app: &TcpListener) -> (TcpStream, TcpStream) {
        let dst = app.local_addr().unwrap();
        let proxy = self.in_pod(move || {
            let s = socket2::Socket::new(
                socket2::Domain::for_address(dst),
                socket2::Type::STREAM,
                None,
            )
            .unwrap();
            s.set_mark(PROXY_MARK).unwrap();
            s.connect(&dst.into()).unwrap();
            TcpStream::from(s)
        });
        (proxy, accept_within(app))
    }

    /// A listener of the application at the pod's address.
    pub fn app_listener(&self, port: u16) -> TcpListener {
        listen_in(&self.pod, SocketAddr::new(self.pod_ip.into(), port))
    }

    /// The pod's IPv6 address.
    pub fn pod_ip6(&self) -> Ipv6Addr {
        format!("fd12:{}::2", self.pod_ip.octets()[2])
            .parse()
            .unwrap()
    }

    /// As [`Self::outbound_hop`], the application's socket an IPv6 one connecting to
    /// `dst` (IPv6: the proxy's `[::1]:4140` takes it; v4-mapped: its `127.0.0.1:4140`).
    pub fn outbound_hop6(&self, dst: SocketAddr) -> (TcpStream, TcpStream) {
        let app = self.in_pod(move || {
            let s =
                socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::STREAM, None).unwrap();
            s.set_only_v6(false).unwrap();
            s.connect(&dst.into()).unwrap();
            TcpStream::from(s)
        });
        let listener = if dst.ip().to_canonical().is_ipv4() {
            &self.outbound
        } else {
            &self.outbound6
        };
        (app, accept_within(listener))
    }

    /// The keys paired now.
    pub fn paired(&self) -> Vec<SockKey> {
        self.r.inpod_sockets()
    }

    /// Whether both ends of the connection `s` is an end of are paired.
    pub fn both_paired(&self, s: &TcpStream) -> bool {
        let key = key_of(self.netns_cookie, s);
        let paired = self.paired();
        paired.contains(&key) && paired.contains(&key.peer())
    }
}

/// What `sockops` keys `s` by (a v4-mapped IPv6 socket as IPv4).
pub fn key_of(netns_cookie: u64, s: &TcpStream) -> SockKey {
    let (local, remote) = (s.local_addr().unwrap(), s.peer_addr().unwrap());
    let (local_ip, family) = ambit_ebpf::ip_words(local.ip().to_canonical());
    let (remote_ip, _) = ambit_ebpf::ip_words(remote.ip().to_canonical());
    SockKey {
        netns_cookie,
        local_ip,
        remote_ip,
        local_port: u32::from(local.port()),
        remote_port: u32::from(remote.port()),
        family: u32::from(family),
        pad: 0,
    }
}

/// Runs `f` on a thread inside netns `ns`.
pub fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let file = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
    std::thread::spawn(move || {
        nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        f()
    })
    .join()
    .unwrap()
}

/// A listener (non-blocking: see [`accept_within`]) made inside netns `ns`.
pub fn listen_in(ns: &str, addr: SocketAddr) -> TcpListener {
    let l = in_netns(ns, move || TcpListener::bind(addr).unwrap());
    l.set_nonblocking(true).unwrap();
    l
}

/// A v6-only listener made inside netns `ns` (non-blocking).
pub fn listen6_in(ns: &str, addr: SocketAddr) -> TcpListener {
    let l: TcpListener = in_netns(ns, move || {
        let s = socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::STREAM, None).unwrap();
        s.set_only_v6(true).unwrap();
        s.bind(&addr.into()).unwrap();
        s.listen(128).unwrap();
        s.into()
    });
    l.set_nonblocking(true).unwrap();
    l
}

/// Accepts one connection within 10 s (a test waits, it does not hang), blocking.
pub fn accept_within(listener: &TcpListener) -> TcpStream {
    let mut accepted = None;
    let found = eventually(Duration::from_secs(10), || match listener.accept() {
        Ok((s, _)) => {
            accepted = Some(s);
            true
        }
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(e) => panic!("accept: {e}"),
    });
    assert!(found, "nothing to accept on {:?}", listener.local_addr());
    let s = accepted.unwrap();
    s.set_nonblocking(false).unwrap();
    s
}

/// Bytes TCP itself carried on `s`: (acknowledged by the peer, received), from `TCP_INFO`.
/// Bytes moved by `sk_msg` are in neither.
pub fn tcp_bytes(s: &TcpStream) -> (u64, u64) {
    let mut info = [0u8; 256];
    let mut len = info.len() as libc::socklen_t;
    // SAFETY: `info` and `len` are valid for writes of the sizes given.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    assert_eq!(r, 0, "TCP_INFO: {}", std::io::Error::last_os_error());
    let u64_at = |off: usize| u64::from_ne_bytes(info[off..off + 8].try_into().unwrap());
    // struct tcp_info: tcpi_bytes_acked at 120, tcpi_bytes_received at 128.
    (u64_at(120), u64_at(128))
}

/// `n` bytes of a pattern that shows where a byte came from (and any reordering).
pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed)
        .collect()
}

/// Reads `s` to its end (EOF) within `limit`.
pub fn read_all(s: &mut TcpStream, limit: Duration) -> Vec<u8> {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got)
        .unwrap_or_else(|e| panic!("after {} bytes: {e}", got.len()));
    got
}

/// Reads exactly `n` bytes within `limit`.
pub fn read_n(s: &mut TcpStream, n: usize, limit: Duration) -> Vec<u8> {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut got = vec![0u8; n];
    s.read_exact(&mut got).unwrap();
    got
}

/// Writes all of `data` (blocking).
pub fn write_all(s: &mut TcpStream, data: &[u8]) {
    s.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(data).unwrap();
}

/// Polls `f` until it holds or `limit` passes.
pub fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        Cleanup {
            pod: self.pod.clone(),
            cgroups: vec![self.cgroup.clone(), self.proxy_cgroup.clone()],
            pin_dir: self.pin_dir.clone(),
            home: self.home.clone(),
        };
    }
}

/// Undoes a lab: the process back home, pins (and so links) removed, netns and cgroups
/// deleted.
struct Cleanup {
    pod: String,
    cgroups: Vec<PathBuf>,
    pin_dir: PathBuf,
    home: PathBuf,
}

impl Cleanup {
    /// The lab is made: from here on [`Lab`]'s drop undoes it.
    fn disarm(&mut self) {
        self.pod.clear();
        self.cgroups.clear();
        self.pin_dir = PathBuf::new();
        self.home = PathBuf::new();
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if !self.home.as_os_str().is_empty() {
            let _ = std::fs::write(
                self.home.join("cgroup.procs"),
                std::process::id().to_string(),
            );
        }
        if !self.pin_dir.as_os_str().is_empty() {
            let _ = ambit_ebpf::remove_pinned(&self.pin_dir);
        }
        if !self.pod.is_empty() {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.pod])
                .output();
        }
        for dir in &self.cgroups {
            let _ = std::fs::remove_dir(dir);
        }
    }
}
