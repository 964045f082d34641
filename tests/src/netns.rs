//! Network namespaces as pods, created for one test and removed when it ends (also when
//! it fails: the guard cleans up on drop). Names carry the process id and a counter.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// Runs a command; panics with its stderr if it fails.
pub(crate) fn run(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A pod: a network namespace with one address.
#[derive(Debug, Clone)]
pub struct PodNet {
    /// The netns name (under /run/netns).
    pub name: String,
    /// Its address.
    pub ip: std::net::Ipv4Addr,
    /// Its IPv6 address (every test pod is dual-stack).
    pub ip6: std::net::Ipv6Addr,
}

impl PodNet {
    /// `/run/netns/<name>`.
    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }

    /// The pod netns's nftables ruleset, as `nft list ruleset` prints it.
    pub fn nft_ruleset(&self) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.name, "nft", "list", "ruleset"])
            .output()
            .expect("nft (Debian nftables) must be installed");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// Pods joined by a bridge in their own namespace; everything is deleted on drop.
#[derive(Debug)]
pub struct Topology {
    prefix: String,
    netns: Vec<String>,
    /// The pods, in the order asked for.
    pub pods: Vec<PodNet>,
}

impl Topology {
    /// Creates one netns per name, each with an address in 10.77.0.0/24 on a veth to a
    /// bridge in a namespace of its own.
    pub fn new(names: &[&str]) -> Self {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let prefix = format!("amb{}x{n}", std::process::id());
        let mut t = Self {
            prefix: prefix.clone(),
            netns: Vec::new(),
            pods: Vec::new(),
        };
        let br = format!("{prefix}-br");
        run(&["ip", "netns", "add", &br]);
        t.netns.push(br.clone());
        run(&["ip", "-n", &br, "link", "add", "br0", "type", "bridge"]);
        run(&["ip", "-n", &br, "link", "set", "br0", "up"]);
        for (i, name) in names.iter().enumerate() {
            let ns = format!("{prefix}-{name}");
            run(&["ip", "netns", "add", &ns]);
            t.netns.push(ns.clone());
            let ip = std::net::Ipv4Addr::new(10, 77, 0, (i + 2) as u8);
            // veth names must fit 15 characters; they live only inside the namespaces.
            run(&[
                "ip",
                "-n",
                &ns,
                "link",
                "add",
                "eth0",
                "type",
                "veth",
                "peer",
                "name",
                &format!("p{i}"),
                "netns",
                &br,
            ]);
            run(&[
                "ip",
                "-n",
                &br,
                "link",
                "set",
                &format!("p{i}"),
                "master",
                "br0",
                "up",
            ]);
            run(&[
                "ip",
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{ip}/24"),
                "dev",
                "eth0",
            ]);
            let ip6: std::net::Ipv6Addr = format!("fd77::{}", i + 2).parse().unwrap();
            // nodad: the address is usable at once, without duplicate address detection.
            let ip6_cidr = format!("{ip6}/64");
            run(&[
                "ip", "-n", &ns, "addr", "add", &ip6_cidr, "dev", "eth0", "nodad",
            ]);
            run(&["ip", "-n", &ns, "link", "set", "eth0", "up"]);
            run(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
            // Service ClusterIPs need a route to be connectable; the bridge has no uplink,
            // so nothing leaves the test's namespaces.
            run(&["ip", "-n", &ns, "route", "add", "default", "dev", "eth0"]);
            t.pods.push(PodNet { name: ns, ip, ip6 });
        }
        t
    }

    /// The pod called `name`.
    pub fn pod(&self, name: &str) -> &PodNet {
        let full = format!("{}-{name}", self.prefix);
        self.pods.iter().find(|p| p.name == full).unwrap()
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for ns in self.netns.iter().rev() {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}
