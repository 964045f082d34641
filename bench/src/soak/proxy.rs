//! The node proxies: the real `ambit-proxy` binary per node, on the node's CNI socket, run
//! directory, eBPF pin directory and cgroup (the node's own, never the machine's root), each
//! process with an admin port of its own; and what `/proc` says about a process.

use ambit_e2e::binary::{free_port, Killed};
use ambit_e2e::cni::CniNode;
use ambit_e2e::{http_get, ControlPlane};
use ambit_proxy::proxy::Redirect;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One `ambit-proxy` process.
#[derive(Debug)]
pub struct Proxy {
    /// The process (killed on drop).
    pub child: Killed,
    /// Its admin port on loopback.
    pub admin: u16,
    /// Which process of its node this is (0 first, 1 after the first restart, ...).
    pub generation: u32,
}

/// How a node's proxies are started.
#[derive(Debug, Clone)]
pub struct Launcher {
    /// The binary.
    pub bin: PathBuf,
    /// Where each process's log goes (`proxy-<node>-<generation>.log`).
    pub logs: PathBuf,
    /// `--shutdown-grace-period`.
    pub grace: String,
}

impl Launcher {
    /// Starts process `generation` of `node`'s proxy, with eBPF redirection, against `cp`.
    pub fn spawn(
        &self,
        cp: &ControlPlane,
        node: &CniNode,
        generation: u32,
    ) -> anyhow::Result<Proxy> {
        let c = node.proxy_config(cp, Redirect::Ebpf);
        let admin = free_port();
        let log = std::fs::File::create(
            self.logs
                .join(format!("proxy-{}-{generation}.log", node.name)),
        )?;
        let child = Command::new(&self.bin)
            .args(["--node-name", &c.node_name])
            .args(["--identity-url", &c.identity_url])
            .args(["--discovery-url", &c.discovery_url])
            .args(["--policy-url", &c.policy_url])
            .arg("--token-file")
            .arg(&c.token_file)
            .arg("--trust-anchors")
            .arg(&c.trust_anchors)
            .args(["--trust-domain", &c.trust_domain])
            .args(["--admin-addr", &format!("127.0.0.1:{admin}")])
            .args(["--redirect", "ebpf"])
            .arg("--cni-socket")
            .arg(&c.cni_socket)
            .arg("--run-dir")
            .arg(&c.run_dir)
            .arg("--bpf-pin-dir")
            .arg(&c.bpf_pin_dir)
            .arg("--cgroup-path")
            .arg(&c.cgroup_path)
            // Running pods are not enrolled from /proc: every pod here comes through CNI,
            // and scanning this shared machine's processes would only add noise.
            .args(["--proc-root", ""])
            .args(["--shutdown-grace-period", &self.grace])
            .args(["--log", "info"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| anyhow::anyhow!("{}: {e}", self.bin.display()))?;
        Ok(Proxy {
            child: Killed(child),
            admin,
            generation,
        })
    }
}

impl Proxy {
    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.0.id()
    }

    /// Sends SIGTERM (by pid; nothing if it has exited).
    pub fn sigterm(&mut self) {
        if self.child.exited().is_some() {
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .stderr(Stdio::null())
            .status();
    }

    /// `/ready`: the status code and the body (0 when the admin port does not answer).
    pub async fn ready(&self) -> (u16, String) {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.admin));
        tokio::time::timeout(Duration::from_secs(2), http_get(addr, "/ready"))
            .await
            .unwrap_or((0, "no answer in 2 s".into()))
    }

    /// Waits until `/ready` is 200 (at most `limit`); how long that took.
    pub async fn until_ready(&mut self, limit: Duration) -> anyhow::Result<Duration> {
        let started = Instant::now();
        loop {
            let (status, body) = self.ready().await;
            if status == 200 {
                return Ok(started.elapsed());
            }
            if let Some(exit) = self.child.exited() {
                anyhow::bail!("exited ({exit}) before it was ready");
            }
            if started.elapsed() > limit {
                anyhow::bail!("not ready after {limit:?}: {status} {body}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits for the process to exit (at most `limit`); its status, or `None` if it is
    /// still running.
    pub async fn until_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Some(status) = self.child.exited() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }
}

/// What `/proc` says about one process.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// VmRSS, KiB.
    pub rss_kib: u64,
    /// Open descriptors.
    pub fds: u64,
    /// utime + stime, seconds.
    pub cpu_s: f64,
}

/// The clock ticks per second `/proc/<pid>/stat` counts in (`getconf CLK_TCK`; 100 if
/// that fails, which it is on Linux).
pub fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// `pid`'s memory, descriptors and CPU; `None` once it has gone.
pub fn usage(pid: u32, ticks: f64) -> Option<Usage> {
    let proc_dir = Path::new("/proc").join(pid.to_string());
    let status = std::fs::read_to_string(proc_dir.join("status")).ok()?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let fds = std::fs::read_dir(proc_dir.join("fd")).ok()?.count() as u64;
    let stat = std::fs::read_to_string(proc_dir.join("stat")).ok()?;
    // The fields after the command name (which may hold spaces): state is field 3,
    // utime 14 and stime 15.
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Some(Usage {
        rss_kib,
        fds,
        cpu_s: (tick(11) + tick(12)) / ticks,
    })
}
