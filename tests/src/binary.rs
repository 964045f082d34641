//! The real `ambit-proxy` binary (`target/debug/ambit-proxy`, which `./scripts/test.sh`
//! builds before the tests), run as a node's proxy against a test control plane: for
//! what an in-process proxy cannot show — a process killed, signalled, or replaced.

use crate::{ControlPlane, NodeProxy};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The binary.
pub fn path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/ambit-proxy")
}

/// A free loopback port (for the binary's admin server).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The binary as `node`'s proxy, configured as the in-process test proxies are (its run
/// directory among them), with nftables redirection, no CNI socket, its admin server on
/// `127.0.0.1:<admin>`, and `extra` arguments.
pub fn spawn(cp: &ControlPlane, node: &str, admin: u16, extra: &[&str]) -> Child {
    let anchors = NodeProxy::config(cp, node).trust_anchors;
    spawn_trusting(cp, node, admin, &anchors, extra)
}

/// [`spawn`], with the trust anchors read from `anchors`.
pub fn spawn_trusting(
    cp: &ControlPlane,
    node: &str,
    admin: u16,
    anchors: &Path,
    extra: &[&str],
) -> Child {
    spawn_binary(&path(), cp, node, admin, anchors, extra)
}

/// [`spawn_trusting`] with the binary at `bin` (a release build, for a benchmark).
pub fn spawn_binary(
    bin: &Path,
    cp: &ControlPlane,
    node: &str,
    admin: u16,
    anchors: &Path,
    extra: &[&str],
) -> Child {
    let c = NodeProxy::config(cp, node);
    Command::new(bin)
        .args(["--node-name", node])
        .args(["--identity-url", &c.identity_url])
        .args(["--discovery-url", &c.discovery_url])
        .args(["--policy-url", &c.policy_url])
        .arg("--token-file")
        .arg(&c.token_file)
        .arg("--trust-anchors")
        .arg(anchors)
        .args(["--trust-domain", &c.trust_domain])
        .args(["--admin-addr", &format!("127.0.0.1:{admin}")])
        .args(crate::sockmap::binary_args(&c))
        .args(["--cni-socket", ""])
        .arg("--run-dir")
        .arg(&c.run_dir)
        .arg("--bpf-pin-dir")
        .arg(&c.bpf_pin_dir)
        .arg("--cgroup-path")
        .arg(&c.cgroup_path)
        .args(["--log", "warn"])
        .args(extra)
        .stdin(Stdio::null())
        .spawn()
        .expect("target/debug/ambit-proxy (cargo build -p ambit-proxy)")
}

/// A child process killed on drop (a failing test must not leave the binary running).
#[derive(Debug)]
pub struct Killed(pub Child);

impl Killed {
    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let sent = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -TERM {}", self.0.id());
    }

    /// Whether it has exited (reaped if so), with its status.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.0.try_wait().unwrap()
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
