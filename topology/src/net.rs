//! Pods as network namespaces joined by a bridge in a namespace of its own. Each pod has one
//! IPv4 address in a /24 and one IPv6 address in a /64, and a default route to the bridge
//! (so that Service ClusterIPs are connectable); the bridge has no uplink, so nothing a pod
//! sends leaves the topology's namespaces.

use crate::run;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Where network namespaces made by `ip netns add` are.
pub const NETNS_DIR: &str = "/run/netns";

/// The pods' subnets: pod `i` (0-based, in the order given) gets host `i + 2` of each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Addressing {
    /// The IPv4 /24 (its last octet is ignored).
    pub v4: Ipv4Addr,
    /// The IPv6 /64 (its host part is ignored).
    pub v6: Ipv6Addr,
}

impl Addressing {
    /// 10.77.0.0/24 and fd77::/64: the end-to-end tests'.
    pub const TESTS: Self = Self {
        v4: Ipv4Addr::new(10, 77, 0, 0),
        v6: Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 0),
    };

    /// Host `host` of the IPv4 subnet.
    pub fn v4_host(&self, host: u8) -> Ipv4Addr {
        let [a, b, c, _] = self.v4.octets();
        Ipv4Addr::new(a, b, c, host)
    }

    /// Host `host` of the IPv6 subnet.
    pub fn v6_host(&self, host: u8) -> Ipv6Addr {
        let s = self.v6.segments();
        Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, u16::from(host))
    }
}

/// A pod: a network namespace with one IPv4 and one IPv6 address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodNet {
    /// The netns name (under /run/netns).
    pub name: String,
    /// Its IPv4 address.
    pub ip: Ipv4Addr,
    /// Its IPv6 address.
    pub ip6: Ipv6Addr,
}

impl PodNet {
    /// `/run/netns/<name>`.
    pub fn path(&self) -> String {
        format!("{NETNS_DIR}/{}", self.name)
    }

    /// The pod netns's nftables ruleset, as `nft list ruleset` prints it.
    pub fn nft_ruleset(&self) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.name, "nft", "list", "ruleset"])
            .output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }
}

/// Pods on a bridge: netns `<prefix>-br` holds the bridge, netns `<prefix>-<name>` each
/// pod. Everything is deleted on drop, unless [`Topology::keep`] hands it over.
#[derive(Debug)]
pub struct Topology {
    prefix: String,
    /// Every netns made, the bridge's first.
    netns: Vec<String>,
    /// The pods, in the order asked for.
    pub pods: Vec<PodNet>,
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

impl Topology {
    /// A throwaway topology for a test: a prefix unique to this process and call
    /// (`amb<pid>x<n>`) and the tests' subnets; panics if a step fails.
    pub fn new(names: &[&str]) -> Self {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let prefix = format!("amb{}x{n}", std::process::id());
        Self::create(&prefix, Addressing::TESTS, names)
            .unwrap_or_else(|e| panic!("creating the test's network namespaces: {e}"))
    }

    /// Creates netns `<prefix>-br` with a bridge, and one netns `<prefix>-<name>` per name
    /// on it. On an error, what was made is removed again.
    pub fn create(prefix: &str, addressing: Addressing, names: &[&str]) -> io::Result<Self> {
        if names.len() > 250 {
            return Err(io::Error::other("at most 250 pods fit one /24"));
        }
        let mut t = Self {
            prefix: prefix.to_string(),
            netns: Vec::new(),
            pods: Vec::new(),
        };
        let br = format!("{prefix}-br");
        run(&["ip", "netns", "add", &br])?;
        t.netns.push(br.clone());
        run(&["ip", "-n", &br, "link", "add", "br0", "type", "bridge"])?;
        run(&["ip", "-n", &br, "link", "set", "br0", "up"])?;
        for (i, name) in names.iter().enumerate() {
            let host = (i + 2) as u8;
            let pod = PodNet {
                name: format!("{prefix}-{name}"),
                ip: addressing.v4_host(host),
                ip6: addressing.v6_host(host),
            };
            run(&["ip", "netns", "add", &pod.name])?;
            t.netns.push(pod.name.clone());
            t.wire(&pod, &format!("p{i}"))?;
            t.pods.push(pod);
        }
        Ok(t)
    }

    /// The pod's veth to the bridge (`veth` names the bridge's end; names must fit 15
    /// characters and live only inside the namespaces), its addresses and routes.
    fn wire(&self, pod: &PodNet, veth: &str) -> io::Result<()> {
        let (ns, br) = (pod.name.as_str(), self.netns[0].as_str());
        run(&[
            "ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", veth, "netns",
            br,
        ])?;
        run(&["ip", "-n", br, "link", "set", veth, "master", "br0", "up"])?;
        run(&[
            "ip",
            "-n",
            ns,
            "addr",
            "add",
            &format!("{}/24", pod.ip),
            "dev",
            "eth0",
        ])?;
        // nodad: the address is usable at once, without duplicate address detection.
        let ip6 = format!("{}/64", pod.ip6);
        run(&["ip", "-n", ns, "addr", "add", &ip6, "dev", "eth0", "nodad"])?;
        run(&["ip", "-n", ns, "link", "set", "eth0", "up"])?;
        run(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
        // Service ClusterIPs need a route to be connectable; the bridge has no uplink.
        run(&["ip", "-n", ns, "route", "add", "default", "dev", "eth0"])
    }

    /// The topology's prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The pod called `name` (without the prefix); panics if there is none.
    pub fn pod(&self, name: &str) -> &PodNet {
        let full = format!("{}-{name}", self.prefix);
        self.pods
            .iter()
            .find(|p| p.name == full)
            .unwrap_or_else(|| panic!("no pod {name} in topology {}", self.prefix))
    }

    /// Leaves everything in place when this value goes away (for a topology that outlives
    /// its maker, as the demo's); returns the netns names made. [`remove_netns`] removes
    /// them later by prefix.
    pub fn keep(mut self) -> Vec<String> {
        std::mem::take(&mut self.netns)
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for ns in self.netns.iter().rev() {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

/// The network namespaces named `<prefix>-*` under /run/netns.
pub fn netns_with_prefix(prefix: &str) -> Vec<String> {
    let start = format!("{prefix}-");
    let Ok(dir) = std::fs::read_dir(Path::new(NETNS_DIR)) else {
        return Vec::new();
    };
    let mut names: Vec<String> = dir
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&start))
        .collect();
    names.sort();
    names
}

/// Deletes every network namespace named `<prefix>-*` (what a [`Topology`] with that
/// prefix made, also after the process that made it crashed); returns their names.
pub fn remove_netns(prefix: &str) -> io::Result<Vec<String>> {
    let names = netns_with_prefix(prefix);
    for ns in &names {
        run(&["ip", "netns", "del", ns])?;
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_of_the_subnets() {
        let a = Addressing {
            v4: Ipv4Addr::new(10, 80, 0, 99),
            v6: "fd80::99".parse().unwrap(),
        };
        assert_eq!(a.v4_host(2), Ipv4Addr::new(10, 80, 0, 2));
        assert_eq!(a.v6_host(7), "fd80::7".parse::<Ipv6Addr>().unwrap());
    }
}
