//! What a running demo is made of, written to `<dir>/state.json` as it is made, so that
//! `ambit demo down` (and `ambit stat`, `ambit check`) find it — also after `up` crashed
//! or its terminal was killed.
//!
//! Everything the demo makes is named after [`PREFIX`]: network namespaces
//! `ambit-demo-*`, the cgroup `ambit-demo` (and those below it), bpffs pins
//! `/sys/fs/bpf/ambit-demo-*`, and [`DIR`]. `down` removes them by name even without a
//! state file.

use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The demo's directory: its state, PKI, cluster YAML, logs and run directories.
pub const DIR: &str = "/run/ambit-demo";
/// The prefix of everything else it makes.
pub const PREFIX: &str = "ambit-demo";
/// Its cgroup (relative to the cgroup v2 mount); the nodes' and the system's are below.
pub const CGROUP: &str = "ambit-demo";
/// The bpffs directory the pins of node `node` go to.
pub fn pin_dir(node: &str) -> PathBuf {
    PathBuf::from(format!("/sys/fs/bpf/{PREFIX}-{node}"))
}

/// The demo's state file.
pub fn state_file() -> PathBuf {
    Path::new(DIR).join("state.json")
}

/// A running demo.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct State {
    /// Its directory ([`DIR`]).
    pub dir: PathBuf,
    /// The redirection the proxies use: `ebpf` or `nftables` ("" until known).
    pub redirect: String,
    /// The control plane.
    pub control: Control,
    /// The node proxies.
    pub nodes: Vec<Node>,
    /// The pods, in address order.
    pub pods: Vec<Pod>,
    /// Every process it started, in start order.
    pub processes: Vec<Process>,
}

/// Where the control plane answers.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Control {
    /// Its identity service (`https://…`).
    pub identity_url: String,
    /// Its discovery service (`https://…`).
    pub discovery_url: String,
    /// Its inbound policy service (`https://…`).
    #[serde(default)]
    pub policy_url: String,
    /// Its admin server (`http://…`).
    pub admin_url: String,
    /// The trust anchors (PEM).
    pub trust_anchors: PathBuf,
    /// The issuer certificate (PEM).
    pub issuer_cert: PathBuf,
    /// The directory of Kubernetes YAML it reads (live).
    pub cluster_dir: PathBuf,
}

/// A node and its proxy.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Node {
    /// `node-a`, `node-b`.
    pub name: String,
    /// The proxy's admin server (`http://127.0.0.1:PORT`).
    pub admin_url: String,
    /// The cgroup its pods' processes run in (where its eBPF programs attach).
    pub cgroup: PathBuf,
}

/// A pod of the sample application.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Pod {
    /// Its Kubernetes name.
    pub name: String,
    /// Its workload (Deployment).
    pub workload: String,
    /// Its node.
    pub node: String,
    /// Its IPv4 address.
    pub ip: String,
    /// Its network namespace (`/run/netns/...`).
    pub netns: String,
}

/// A process the demo started.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Process {
    /// What it is (`ambit-control`, `ambit-proxy node-a`, `web` …).
    pub name: String,
    /// Its pid.
    pub pid: u32,
    /// Its start time (field 22 of /proc/PID/stat), so that a reused pid is never killed.
    pub start_time: u64,
    /// Its log file.
    pub log: PathBuf,
}

impl State {
    /// The state of the running demo: `None` when there is none.
    pub fn load() -> anyhow::Result<Option<Self>> {
        let path = state_file();
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .with_context(|| format!("{}: not a demo state file", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Writes it (through a temporary file: never half-written).
    pub fn save(&self) -> anyhow::Result<()> {
        let path = state_file();
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))
    }

    /// The proxies' admin URLs.
    pub fn proxy_admins(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.admin_url.clone()).collect()
    }
}

/// The start time of process `pid` (clock ticks after boot), if it runs (a zombie, which
/// has exited but not been reaped, does not).
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from its end.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    if fields.next()? == "Z" {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_of_this_process() {
        let t = start_time(std::process::id()).unwrap();
        assert!(t > 0);
        assert_eq!(start_time(std::process::id()), Some(t));
        assert_eq!(start_time(u32::MAX), None);
    }
}
