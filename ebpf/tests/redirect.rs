//! The redirection programs in a real kernel: a "pod" network namespace joined to a
//! "peer" one by a veth, the outbound programs attached to a cgroup made for the test,
//! real clients (python3 sockets, moved into that cgroup) connecting out of the pod and
//! into it. Runs as root; everything is named after the test and the pid, and removed on
//! drop, also when the test fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use ambit_ebpf::{PodRedirect, Redirection};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

static NEXT: AtomicU8 = AtomicU8::new(0);

fn run(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A pod netns and a peer netns on a veth, a test cgroup and a pin dir; removed on drop.
struct Lab {
    pod: String,
    peer: String,
    pod_ip: Ipv4Addr,
    peer_ip: Ipv4Addr,
    cgroup: PathBuf,
    pin_dir: PathBuf,
}

impl Lab {
    fn new(test: &str) -> Self {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let tag = format!("{test}-{}-{n}", std::process::id());
        let (pod, peer) = (format!("ebpf-{tag}-pod"), format!("ebpf-{tag}-peer"));
        let lab = Self {
            pod: pod.clone(),
            peer: peer.clone(),
            pod_ip: Ipv4Addr::new(10, 211, n, 2),
            peer_ip: Ipv4Addr::new(10, 211, n, 3),
            cgroup: ambit_ebpf::sys::cgroup2_mount().join(format!("ambit-{tag}")),
            pin_dir: PathBuf::from(format!("/sys/fs/bpf/ambit-{tag}")),
        };
        std::fs::create_dir(&lab.cgroup).unwrap();
        run(&["ip", "netns", "add", &pod]);
        run(&["ip", "netns", "add", &peer]);
        run(&[
            "ip", "-n", &pod, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0",
            "netns", &peer,
        ]);
        for (ns, ip, host) in [(&pod, lab.pod_ip, 2), (&peer, lab.peer_ip, 3)] {
            let ip4 = format!("{ip}/24");
            run(&["ip", "-n", ns, "addr", "add", &ip4, "dev", "eth0"]);
            // Dual-stack; nodad: usable at once.
            let ip6 = format!("fd11:{n}::{host}/64");
            run(&["ip", "-n", ns, "addr", "add", &ip6, "dev", "eth0", "nodad"]);
            run(&["ip", "-n", ns, "link", "set", "eth0", "up"]);
            run(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        lab
    }

    fn netns_file(&self, ns: &str) -> std::fs::File {
        std::fs::File::open(format!("/run/netns/{ns}")).unwrap()
    }

    /// Runs `f` on a thread inside netns `ns` (sockets made there stay there).
    fn in_netns<T: Send + 'static>(&self, ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        let file = self.netns_file(ns);
        std::thread::spawn(move || {
            nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            f()
        })
        .join()
        .unwrap()
    }

    fn listen(&self, ns: &str, port: u16) -> TcpListener {
        let l = self.in_netns(ns, move || TcpListener::bind(("0.0.0.0", port)).unwrap());
        l.set_nonblocking(true).unwrap();
        l
    }

    /// An IPv6-only listener on `[::]:port` inside `ns` (beside the IPv4 one, as the
    /// proxy has for a dual-stack pod).
    fn listen6(&self, ns: &str, port: u16) -> TcpListener {
        let l: TcpListener = self.in_netns(ns, move || {
            let s =
                socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::STREAM, None).unwrap();
            s.set_only_v6(true).unwrap();
            s.bind(&SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port)).into())
                .unwrap();
            s.listen(128).unwrap();
            s.into()
        });
        l.set_nonblocking(true).unwrap();
        l
    }

    fn pod_ip6(&self) -> std::net::Ipv6Addr {
        format!("fd11:{}::2", self.pod_ip.octets()[2])
            .parse()
            .unwrap()
    }

    /// Connects from netns `ns` as a client in the test cgroup (a python3 process that
    /// moves itself there first), sends `hello`, returns what it printed or its error.
    fn client(&self, ns: &str, dst: SocketAddr, mark: u32) -> Result<String, String> {
        const SCRIPT: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET6 if ":" in sys.argv[2] else socket.AF_INET)
if int(sys.argv[4]):
    s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, int(sys.argv[4]))
s.settimeout(5)
s.connect((sys.argv[2], int(sys.argv[3])))
s.sendall(b"hello")
s.shutdown(socket.SHUT_WR)
print(s.recv(100).decode(), end="")
"#;
        let procs = self.cgroup.join("cgroup.procs");
        // Into the cgroup first: `ip netns exec` mounts a sysfs of the netns, which hides
        // the cgroup tree.
        let out = Command::new("sh")
            .arg("-c")
            .arg(r#"echo $$ > "$0" && exec ip netns exec "$1" python3 -c "$2" "$3" "$4" "$5" "$6""#)
            .arg(procs)
            .args([ns, SCRIPT, "-"])
            .arg(dst.ip().to_string())
            .arg(dst.port().to_string())
            .arg(mark.to_string())
            .output()
            .unwrap();
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = ambit_ebpf::remove_pinned(&self.pin_dir);
        for ns in [&self.pod, &self.peer] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

/// Accepts one connection within 5 s, reads what the client sent, answers `reply`.
fn serve_one(listener: &TcpListener, reply: &str) -> Option<(TcpStream, SocketAddr, String)> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match listener.accept() {
            Ok((mut s, peer)) => {
                s.set_nonblocking(false).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut got = String::new();
                s.read_to_string(&mut got).unwrap();
                s.write_all(reply.as_bytes()).unwrap();
                return Some((s, peer, got));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
}

/// Nothing waiting to be accepted on `listener`.
fn nothing_pending(listener: &TcpListener) -> bool {
    matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// The proxy's three in-pod listeners.
struct PodListeners {
    outbound: TcpListener,
    mesh: TcpListener,
    plain: TcpListener,
}

fn open_listeners(lab: &Lab) -> PodListeners {
    PodListeners {
        outbound: lab.listen(&lab.pod, 4140),
        mesh: lab.listen(&lab.pod, 4143),
        plain: lab.listen(&lab.pod, 4144),
    }
}

fn register(lab: &Lab, r: &mut Redirection, l: &PodListeners) -> u64 {
    let cookie = ambit_ebpf::sys::netns_cookie(l.outbound.as_fd()).unwrap();
    let ip = IpAddr::V4(lab.pod_ip);
    r.set_listeners(ip, &l.mesh, &l.plain).unwrap();
    let netns = lab.netns_file(&lab.pod);
    r.add_pod(&PodRedirect {
        id: "shop_web-0",
        netns: netns.as_fd(),
        netns_cookie: cookie,
        ips: &[ip],
        skip_inbound: &[(22, 22)],
        skip_outbound: &[(5432, 5433)],
    })
    .unwrap();
    cookie
}

#[test]
fn outbound_connects_reach_the_outbound_listener_with_their_original_destination() {
    let lab = &Lab::new("out");
    let mut r = Redirection::load(&lab.pin_dir).unwrap();
    r.attach_cgroup(&lab.cgroup).unwrap();
    let l = open_listeners(lab);
    let cookie = register(lab, &mut r, &l);

    // An address nothing answers at: only the redirection can make this connect work.
    let dst: SocketAddr = "10.211.250.9:80".parse().unwrap();
    let client = std::thread::scope(|s| {
        let c = s.spawn(move || lab.client(&lab.pod, dst, 0));
        let (_, peer, got) = serve_one(&l.outbound, "from-proxy").expect("redirected");
        assert_eq!(got, "hello");
        assert_eq!(r.original_dst(cookie, peer), Some(dst));
        // Consumed: a second lookup finds nothing.
        assert_eq!(r.original_dst(cookie, peer), None);
        c.join().unwrap()
    });
    assert_eq!(client.unwrap(), "from-proxy");

    // A skip-outbound port and loopback go direct.
    let direct = lab.listen(&lab.peer, 5433);
    std::thread::scope(|s| {
        let c = s.spawn(move || lab.client(&lab.pod, SocketAddr::new(lab.peer_ip.into(), 5433), 0));
        assert!(serve_one(&direct, "direct").is_some());
        assert_eq!(c.join().unwrap().unwrap(), "direct");
    });
    // A pod's process that puts the proxy's mark on its socket is redirected all the same:
    // only sockets of the proxy's own cgroup skip by the mark (tests/tests/proxy_cgroup.rs
    // runs a proxy below the hooks).
    std::thread::scope(|s| {
        let dst = SocketAddr::new(lab.peer_ip.into(), 7000);
        let c = s.spawn(move || lab.client(&lab.pod, dst, ambit_ebpf::common::PROXY_MARK));
        let (_, peer, _) = serve_one(&l.outbound, "from-proxy").expect("redirected");
        assert_eq!(r.original_dst(cookie, peer), Some(dst));
        assert_eq!(c.join().unwrap().unwrap(), "from-proxy");
    });
    let local = lab.listen(&lab.pod, 7001);
    std::thread::scope(|s| {
        let c = s.spawn(move || lab.client(&lab.pod, "127.0.0.1:7001".parse().unwrap(), 0));
        assert!(serve_one(&local, "loopback").is_some());
        assert_eq!(c.join().unwrap().unwrap(), "loopback");
    });
    assert!(nothing_pending(&l.outbound));

    // A process in the same cgroup but an unmeshed netns is left alone.
    let unmeshed = lab.listen(&lab.peer, 7003);
    std::thread::scope(|s| {
        let dst = SocketAddr::new(lab.peer_ip.into(), 7003);
        let c = s.spawn(move || lab.client(&lab.peer, dst, 0));
        assert!(serve_one(&unmeshed, "unmeshed").is_some());
        assert_eq!(c.join().unwrap().unwrap(), "unmeshed");
    });
    assert!(nothing_pending(&l.outbound));
}

#[test]
fn inbound_connects_are_steered_to_the_mesh_and_plaintext_listeners() {
    let lab = &Lab::new("in");
    let mut r = Redirection::load(&lab.pin_dir).unwrap();
    let l = open_listeners(lab);
    register(lab, &mut r, &l);
    let app = lab.listen(&lab.pod, 8080);
    let pod = IpAddr::V4(lab.pod_ip);

    std::thread::scope(|s| {
        let c = s.spawn(move || lab.client(&lab.peer, SocketAddr::new(pod, 8080), 0));
        let Some((stream, _, got)) = serve_one(&l.plain, "plain") else {
            panic!("not steered to 4144: client {:?}", c.join());
        };
        assert_eq!(got, "hello");
        // No NAT: the accepted socket's own address is the original destination.
        assert_eq!(stream.local_addr().unwrap(), SocketAddr::new(pod, 8080));
        assert_eq!(c.join().unwrap().unwrap(), "plain");
    });
    std::thread::scope(|s| {
        let c = s.spawn(move || lab.client(&lab.peer, SocketAddr::new(pod, 4143), 0));
        assert!(serve_one(&l.mesh, "mesh").is_some(), "steered to 4143");
        assert_eq!(c.join().unwrap().unwrap(), "mesh");
    });
    assert!(
        nothing_pending(&app),
        "the application saw nothing directly"
    );

    // A skip-inbound port reaches the application directly.
    let ssh = lab.listen(&lab.pod, 22);
    std::thread::scope(|s| {
        let c = s.spawn(move || lab.client(&lab.peer, SocketAddr::new(pod, 22), 0));
        assert!(serve_one(&ssh, "ssh").is_some());
        assert_eq!(c.join().unwrap().unwrap(), "ssh");
    });

    // The pod to itself (as the proxy delivers to the application) takes the ordinary
    // path, from the pod's own address.
    let delivered = lab.in_netns(&lab.pod, move || {
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.connect(&SocketAddr::new(pod, 8080).into()).map(|_| ())
    });
    delivered.unwrap();
    assert!(serve_one(&app, "app").is_some());
}

#[test]
fn a_pod_whose_listeners_are_gone_fails_closed_and_a_new_loader_restores_it() {
    let lab = &Lab::new("closed");
    let mut r = Redirection::load(&lab.pin_dir).unwrap();
    r.attach_cgroup(&lab.cgroup).unwrap();
    let l = open_listeners(lab);
    register(lab, &mut r, &l);
    let app = lab.listen(&lab.pod, 8080);
    let remote = lab.listen(&lab.peer, 9000);
    let pod = IpAddr::V4(lab.pod_ip);

    // The proxy exits: its listeners close and the loader goes away. The pinned links
    // and maps stay.
    drop(l);
    drop(r);
    let inbound = lab.client(&lab.peer, SocketAddr::new(pod, 8080), 0);
    assert!(inbound.is_err(), "inbound must be refused: {inbound:?}");
    assert!(
        nothing_pending(&app),
        "nothing reached the application in plaintext"
    );
    let outbound = lab.client(&lab.pod, SocketAddr::new(lab.peer_ip.into(), 9000), 0);
    assert!(outbound.is_err(), "outbound must be refused: {outbound:?}");
    assert!(
        nothing_pending(&remote),
        "nothing left the pod around the proxy"
    );

    // A new proxy: loads again over the same pins, opens new listeners, and the pod is
    // served again.
    let mut r = Redirection::load(&lab.pin_dir).unwrap();
    r.attach_cgroup(&lab.cgroup).unwrap();
    let l = open_listeners(lab);
    register(lab, &mut r, &l);
    std::thread::scope(|s| {
        let c = s.spawn(move || lab.client(&lab.peer, SocketAddr::new(pod, 8080), 0));
        assert!(serve_one(&l.plain, "back").is_some());
        assert_eq!(c.join().unwrap().unwrap(), "back");
    });

    // Removing the pod from the mesh hands its traffic back to the application.
    let cookie = ambit_ebpf::sys::netns_cookie(l.outbound.as_fd()).unwrap();
    r.remove_pod("shop_web-0", cookie, &[pod]);
    std::thread::scope(|s| {
        let c = s.spawn(move || lab.client(&lab.peer, SocketAddr::new(pod, 8080), 0));
        assert!(serve_one(&app, "direct").is_some());
        assert_eq!(c.join().unwrap().unwrap(), "direct");
    });
    std::thread::scope(|s| {
        let dst = SocketAddr::new(lab.peer_ip.into(), 9000);
        let c = s.spawn(move || lab.client(&lab.pod, dst, 0));
        assert!(serve_one(&remote, "direct").is_some());
        assert_eq!(c.join().unwrap().unwrap(), "direct");
    });
}

#[test]
fn ipv6_and_v4_mapped_connects_and_ipv6_inbound_are_redirected_too() {
    let lab = &Lab::new("six");
    let mut r = Redirection::load(&lab.pin_dir).unwrap();
    r.attach_cgroup(&lab.cgroup).unwrap();
    let v4 = open_listeners(lab);
    let v6 = PodListeners {
        outbound: lab.listen6(&lab.pod, 4140),
        mesh: lab.listen6(&lab.pod, 4143),
        plain: lab.listen6(&lab.pod, 4144),
    };
    let cookie = ambit_ebpf::sys::netns_cookie(v4.outbound.as_fd()).unwrap();
    let (ip4, ip6) = (IpAddr::V4(lab.pod_ip), IpAddr::V6(lab.pod_ip6()));
    r.set_listeners(ip4, &v4.mesh, &v4.plain).unwrap();
    r.set_listeners(ip6, &v6.mesh, &v6.plain).unwrap();
    let netns = lab.netns_file(&lab.pod);
    r.add_pod(&PodRedirect {
        id: "shop_web-0",
        netns: netns.as_fd(),
        netns_cookie: cookie,
        ips: &[ip4, ip6],
        skip_inbound: &[],
        skip_outbound: &[],
    })
    .unwrap();

    // IPv6 out: to the IPv6 outbound listener, original destination kept.
    let dst: SocketAddr = "[fd11:250::9]:80".parse().unwrap();
    std::thread::scope(|s| {
        let c = s.spawn(move || lab.client(&lab.pod, dst, 0));
        let Some((_, peer, _)) = serve_one(&v6.outbound, "six") else {
            panic!("not redirected: {:?}", c.join());
        };
        assert_eq!(r.original_dst(cookie, peer), Some(dst));
        assert_eq!(c.join().unwrap().unwrap(), "six");
    });
    // A v4-mapped destination from an IPv6 socket is IPv4 on the wire: the IPv4
    // listener gets it, with the IPv4 destination.
    let mapped: SocketAddr = "[::ffff:10.211.250.9]:81".parse().unwrap();
    std::thread::scope(|s| {
        let c = s.spawn(move || lab.client(&lab.pod, mapped, 0));
        let Some((_, peer, _)) = serve_one(&v4.outbound, "mapped") else {
            panic!("not redirected: {:?}", c.join());
        };
        assert_eq!(
            r.original_dst(cookie, peer),
            Some("10.211.250.9:81".parse().unwrap())
        );
        assert_eq!(c.join().unwrap().unwrap(), "mapped");
    });
    // IPv6 in: steered to the IPv6 plaintext listener, no NAT.
    let to_pod = SocketAddr::new(ip6, 8080);
    std::thread::scope(|s| {
        let c = s.spawn(move || lab.client(&lab.peer, to_pod, 0));
        let Some((stream, _, _)) = serve_one(&v6.plain, "in6") else {
            panic!("not steered to {to_pod}: {:?}", c.join());
        };
        assert_eq!(stream.local_addr().unwrap(), to_pod);
        assert_eq!(c.join().unwrap().unwrap(), "in6");
    });
}
