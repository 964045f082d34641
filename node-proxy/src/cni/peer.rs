//! Who is on the other end of the CNI socket.
//!
//! The socket is created mode 0600 (root only); the proxy checks again, on every
//! connection, with the kernel's word on the peer (`SO_PEERCRED`, taken when the peer
//! connected): its uid must be 0 (root in the proxy's user namespace, as the container
//! runtime that runs the plugin is). Optionally ([`PeerPolicy::plugin_binary`]) the
//! peer's executable must be the plugin's file: the same device and inode as the path
//! names now (stat on each connection, so a plugin upgraded by an atomic rename is
//! recognised at once), read through `<proc root>/<pid>/exe`.
//!
//! Neither check keeps out a root process that runs the plugin binary itself with
//! whatever `CNI_*` environment it likes: they keep out everything that is not root, and
//! root processes that talk to the socket directly.

use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The CNI error code of a refused peer.
pub use ambit_api::cni::code::PEER_REFUSED;

/// What the CNI socket demands of its peers.
#[derive(Clone, Debug, Default)]
pub struct PeerPolicy {
    /// The plugin's executable (`--cni-plugin-binary`): the peer must be running this
    /// very file. `None`: not checked (the uid is).
    pub plugin_binary: Option<PathBuf>,
    /// The proc filesystem of the proxy's pid namespace, where `<pid>/exe` is read (empty:
    /// `/proc`). `SO_PEERCRED` gives the peer's pid in the proxy's pid namespace, so this
    /// must be that namespace's proc (the host's, with `hostPID`).
    pub proc_root: PathBuf,
}

/// Why a peer was turned away: a reason for the metric, and the CNI error's text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// `uid`, `binary`, `pid_namespace`, or `unverifiable`
    /// (`cni_peers_refused_total{reason}`).
    pub reason: &'static str,
    /// What was refused.
    pub msg: String,
    /// What to do.
    pub details: String,
}

/// The peer, as the kernel described it when it connected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Its (effective) uid.
    pub uid: u32,
    /// Its pid in the proxy's pid namespace; 0 when it has none there.
    pub pid: i32,
}

impl Peer {
    /// The credentials of the process at the other end of `sock` (`SO_PEERCRED`).
    pub fn of(sock: &impl AsFd) -> io::Result<Self> {
        let cred = nix::sys::socket::getsockopt(sock, nix::sys::socket::sockopt::PeerCredentials)
            .map_err(io::Error::from)?;
        Ok(Self {
            uid: cred.uid(),
            pid: cred.pid(),
        })
    }
}

const NOTHING_DONE: &str = "nothing was done";

impl PeerPolicy {
    /// Checks the peer at the other end of `sock`.
    pub fn check(&self, sock: &impl AsFd) -> Result<Peer, Refusal> {
        let peer = Peer::of(sock).map_err(|e| Refusal {
            reason: "unverifiable",
            msg: format!(
                "the node proxy cannot read the CNI peer's credentials (SO_PEERCRED): {e}"
            ),
            details: format!("{NOTHING_DONE}; the request is retried by the runtime"),
        })?;
        self.check_peer(peer).map(|()| peer)
    }

    /// Checks `peer` against the policy.
    pub fn check_peer(&self, peer: Peer) -> Result<(), Refusal> {
        if peer.uid != 0 {
            return Err(Refusal {
                reason: "uid",
                msg: format!(
                    "the CNI socket serves root only; this peer runs as uid {} (pid {})",
                    peer.uid, peer.pid
                ),
                details: format!(
                    "{NOTHING_DONE}; pods are handed over by the ambit-cni plugin, which the container runtime runs as root. \
                     The socket is created mode 0600: check what made it reachable to uid {}",
                    peer.uid
                ),
            });
        }
        let Some(plugin) = &self.plugin_binary else {
            return Ok(());
        };
        if peer.pid <= 0 {
            return Err(Refusal {
                reason: "pid_namespace",
                msg: format!(
                    "the CNI socket cannot tell which program the peer runs: it is outside the node proxy's pid namespace (pid {})",
                    peer.pid
                ),
                details: format!(
                    "{NOTHING_DONE}; checking the plugin's binary ({}) takes the proxy in the host's pid namespace (hostPID: true, --proc-root the host's /proc); \
                     otherwise set --cni-plugin-binary (AMBIT_CNI_PLUGIN_BINARY) empty to check only that the peer is root",
                    plugin.display()
                ),
            });
        }
        let expected = std::fs::metadata(plugin).map_err(|e| Refusal {
            reason: "unverifiable",
            msg: format!(
                "the CNI socket cannot check the peer's program: --cni-plugin-binary {}: {e}",
                plugin.display()
            ),
            details: format!(
                "{NOTHING_DONE}; point --cni-plugin-binary (AMBIT_CNI_PLUGIN_BINARY) at the installed ambit-cni, or set it empty to check only that the peer is root"
            ),
        })?;
        let proc_root = if self.proc_root.as_os_str().is_empty() {
            Path::new("/proc")
        } else {
            &self.proc_root
        };
        let exe = proc_root.join(peer.pid.to_string()).join("exe");
        // `stat` follows the magic link to the very file the process runs (also if it
        // was renamed or removed since).
        let running = std::fs::metadata(&exe).map_err(|e| Refusal {
            reason: "unverifiable",
            msg: format!(
                "the CNI socket cannot check the peer's program: {}: {e}",
                exe.display()
            ),
            details: format!(
                "{NOTHING_DONE}; the proxy reads the peer's executable with CAP_SYS_PTRACE from --proc-root ({}), which must be its own pid namespace's /proc",
                proc_root.display()
            ),
        })?;
        if (running.dev(), running.ino()) != (expected.dev(), expected.ino()) {
            let shown = std::fs::read_link(&exe)
                .map(|p| p.display().to_string())
                .unwrap_or_else(|_| "another program".into());
            return Err(Refusal {
                reason: "binary",
                msg: format!(
                    "the CNI socket serves the plugin {} only; the peer (pid {}) runs {shown}",
                    plugin.display(),
                    peer.pid
                ),
                details: format!(
                    "{NOTHING_DONE}; if ambit-cni is installed elsewhere, set --cni-plugin-binary (AMBIT_CNI_PLUGIN_BINARY) to its path; \
                     a plugin that was running when it was replaced is refused once, its retry runs the new file"
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(plugin: Option<&Path>) -> PeerPolicy {
        PeerPolicy {
            plugin_binary: plugin.map(Path::to_path_buf),
            proc_root: PathBuf::new(),
        }
    }

    fn me() -> Peer {
        Peer {
            uid: 0,
            pid: i32::try_from(std::process::id()).unwrap_or(0),
        }
    }

    #[test]
    fn only_root_is_served_and_the_binary_is_checked_by_inode_when_asked() {
        let refused = |p: &PeerPolicy, peer: Peer| p.check_peer(peer).err().map(|r| r.reason);
        // Without a binary: any root peer, whatever its pid namespace.
        assert_eq!(refused(&policy(None), me()), None);
        assert_eq!(refused(&policy(None), Peer { uid: 0, pid: 0 }), None);
        let r = policy(None)
            .check_peer(Peer {
                uid: 65534,
                pid: 42,
            })
            .err();
        let r = r.unwrap_or_else(|| panic!("uid 65534 served"));
        assert_eq!(r.reason, "uid");
        assert!(r.msg.contains("uid 65534 (pid 42)"), "{r:?}");

        // With a binary: this process runs the test binary, the same file by any path.
        let exe = std::fs::read_link("/proc/self/exe").unwrap_or_else(|e| panic!("{e}"));
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let link = dir.path().join("plugin");
        std::os::unix::fs::symlink(&exe, &link).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(refused(&policy(Some(&exe)), me()), None);
        assert_eq!(refused(&policy(Some(&link)), me()), None);
        // Another file (same content or not) is another program.
        let copy = dir.path().join("copy");
        std::fs::copy(&exe, &copy).unwrap_or_else(|e| panic!("{e}"));
        let r = policy(Some(&copy)).check_peer(me()).err();
        let r = r.unwrap_or_else(|| panic!("another binary served"));
        assert_eq!(r.reason, "binary");
        assert!(r.msg.contains(&exe.display().to_string()), "{r:?}");
        // Upgraded in place by an atomic rename: the path now names this binary.
        std::fs::rename(&link, &copy).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(refused(&policy(Some(&copy)), me()), None);
        // No pid in our namespace, a missing plugin, a vanished peer: refused, each
        // saying why.
        let r = policy(Some(&exe)).check_peer(Peer { uid: 0, pid: 0 }).err();
        let r = r.unwrap_or_else(|| panic!("pid 0 served"));
        assert_eq!(r.reason, "pid_namespace");
        assert!(r.details.contains("hostPID"), "{r:?}");
        assert_eq!(
            refused(&policy(Some(&dir.path().join("absent"))), me()),
            Some("unverifiable")
        );
        assert_eq!(
            refused(
                &policy(Some(&exe)),
                Peer {
                    uid: 0,
                    pid: i32::MAX
                }
            ),
            Some("unverifiable")
        );
    }
}
