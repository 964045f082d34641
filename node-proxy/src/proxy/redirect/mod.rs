//! How a meshed pod's traffic reaches the proxy's in-pod listeners, and how the proxy
//! learns where each redirected connection was going.
//!
//! | mode | outbound (4140) | inbound (4143/4144) | original destination |
//! |---|---|---|---|
//! | `ebpf` | `cgroup/connect4/6` rewrite `connect()` to loopback:4140 | `sk_lookup` on the pod's netns | outbound: a map keyed by (netns cookie, client port), filled by `sockops`; inbound: the accepted socket's own address |
//! | `nftables` | linkerd-init's `REDIRECT` rules in the pod's netns | the same | `SO_ORIGINAL_DST` |
//! | `none` | something else redirects | | `SO_ORIGINAL_DST` |
//!
//! `auto` (the default) picks `ebpf` when the kernel takes the programs and `nftables`
//! otherwise. Both modes fail closed: when the proxy is gone its listeners are gone, and
//! the pod's redirected connections are refused rather than sent around it.
//!
//! With eBPF, `--sockmap on` also moves the bytes of the in-pod hops (application ↔
//! proxy) past the loopback TCP stack ([`sockmap`]).

pub mod nftables;
pub mod sockmap;

pub use sockmap::{Sockmap, SockmapState};

use crate::discovery::Workload;
use crate::netns::Netns;
use ambit_ebpf::{PodRedirect, Redirection};
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use tokio::net::{TcpListener, TcpStream};

/// How pod traffic is redirected, as configured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Redirect {
    /// eBPF when the kernel supports it, else nftables.
    Auto,
    /// eBPF programs (`connect4/6`, `sockops`, `sk_lookup`).
    Ebpf,
    /// The proxy writes nftables rules in the pod's netns (linkerd-init's rules).
    Nftables,
    /// Something else redirects (the operator, another tool).
    None,
}

/// The redirection in effect, and whether sockmap is.
#[derive(Clone, Debug)]
pub struct Redirector {
    kind: Kind,
    sockmap: SockmapState,
}

#[derive(Clone, Debug)]
enum Kind {
    /// eBPF programs, and the maps the proxy drives.
    Ebpf(Arc<Mutex<Redirection>>),
    /// nftables rules in each pod.
    Nftables,
    /// Nothing: something else redirects.
    None,
}

/// One address family's listeners in a pod.
#[derive(Debug)]
pub struct FamilyListeners<'a> {
    /// Whether these are the IPv6 ones.
    pub ipv6: bool,
    /// 4140.
    pub outbound: &'a TcpListener,
    /// 4143.
    pub mesh: &'a TcpListener,
    /// 4144.
    pub plain: &'a TcpListener,
}

/// The file in the run directory where the mode in effect is kept, with the pods it
/// redirected.
pub const MODE_RECORD: &str = "redirect-mode";

/// What `--redirect` resolves to on this start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// eBPF; `fallback` to nftables when the kernel refuses the programs.
    Ebpf {
        /// Whether nftables may be used instead.
        fallback: bool,
    },
    /// nftables.
    Nftables,
    /// Nothing.
    None,
}

/// Resolves `asked` against what an earlier run left on the node: the mode it recorded,
/// and whether eBPF links are pinned. The choice is kept with the pods: `auto` never
/// switches a node whose pods were redirected by eBPF to nftables (with the eBPF
/// programs still attached, every outbound connection would fail) nor the other way;
/// an explicit `nftables` with eBPF links still pinned is an error.
pub fn plan(
    asked: Redirect,
    recorded: Option<Redirect>,
    links_pinned: bool,
    pin_dir: &Path,
) -> Result<Plan, String> {
    let earlier = if links_pinned {
        Some(Redirect::Ebpf)
    } else {
        recorded.filter(|r| matches!(r, Redirect::Ebpf | Redirect::Nftables))
    };
    match (asked, earlier) {
        (Redirect::Auto, Some(Redirect::Ebpf)) | (Redirect::Ebpf, _) => {
            Ok(Plan::Ebpf { fallback: false })
        }
        (Redirect::Auto, Some(_)) => Ok(Plan::Nftables),
        (Redirect::Auto, None) => Ok(Plan::Ebpf { fallback: true }),
        (Redirect::Nftables, _) if links_pinned => Err(format!(
            "eBPF links of an earlier run are pinned under {}: pods on this node are redirected by eBPF. \
             Use --redirect ebpf (or auto), or drain the node and remove {} first",
            pin_dir.join("links").display(),
            pin_dir.display()
        )),
        (Redirect::Nftables, _) => Ok(Plan::Nftables),
        (Redirect::None, _) => Ok(Plan::None),
    }
}

impl Redirector {
    /// Sets up `mode` as [`plan`] resolves it against what an earlier run left (the mode
    /// recorded in `record`, links pinned under `pin_dir`), and records the mode in
    /// effect. With `auto` on a fresh node, a kernel that refuses the programs means
    /// nftables (logged); otherwise it is an error. Then `sockmap` as eBPF allows
    /// (unavailable is logged, never an error: it only saves work), with its gauge in
    /// `registry`.
    pub fn new(
        mode: Redirect,
        sockmap: Sockmap,
        (pin_dir, cgroup, record): (&Path, &Path, &Path),
        registry: &mut prometheus_client::registry::Registry,
    ) -> Result<Self, String> {
        let kind = Kind::new(mode, pin_dir, cgroup, record)?;
        let sockmap = match &kind {
            Kind::Ebpf(r) => sockmap::apply(&mut Self::ebpf(r), sockmap, cgroup),
            _ => sockmap::without_ebpf(sockmap),
        };
        sockmap::register(registry, &sockmap);
        Ok(Self { kind, sockmap })
    }

    /// The mode's name, for `/config_dump` and the logs.
    pub fn mode(&self) -> &'static str {
        match self.kind {
            Kind::Ebpf(_) => "ebpf",
            Kind::Nftables => "nftables",
            Kind::None => "none",
        }
    }

    /// Whether sockmap is in effect, and why not.
    pub fn sockmap(&self) -> &SockmapState {
        &self.sockmap
    }
}

impl Kind {
    fn new(mode: Redirect, pin_dir: &Path, cgroup: &Path, record: &Path) -> Result<Self, String> {
        let recorded = std::fs::read_to_string(record)
            .ok()
            .and_then(|m| <Redirect as clap::ValueEnum>::from_str(m.trim(), false).ok());
        let links_pinned =
            std::fs::read_dir(pin_dir.join("links")).is_ok_and(|mut d| d.next().is_some());
        let ebpf = || -> Result<Self, String> {
            let r = Redirection::load(pin_dir).map_err(|e| format!("ebpf: {e}"))?;
            r.attach_cgroup(cgroup).map_err(|e| format!("ebpf: {e}"))?;
            Ok(Self::Ebpf(Arc::new(Mutex::new(r))))
        };
        let redirector = match plan(mode, recorded, links_pinned, pin_dir)? {
            Plan::Ebpf { fallback: false } if mode == Redirect::Auto => ebpf().map_err(|e| {
                format!("{e}; eBPF redirection of an earlier run is in place (links pinned under {}, or {} says ebpf), so auto does not fall back to nftables", pin_dir.display(), record.display())
            })?,
            Plan::Ebpf { fallback: false } => ebpf()?,
            Plan::Ebpf { fallback: true } => ebpf().or_else(|error| {
                tracing::warn!(%error, "eBPF redirection unavailable; using nftables");
                Ok::<_, String>(Self::Nftables)
            })?,
            Plan::Nftables => Self::Nftables,
            Plan::None => Self::None,
        };
        if let Some(dir) = record.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let name = match &redirector {
            Self::Ebpf(_) => "ebpf",
            Self::Nftables => "nftables",
            Self::None => "none",
        };
        std::fs::write(record, name)
            .map_err(|e| format!("recording the redirect mode in {}: {e}", record.display()))?;
        Ok(redirector)
    }
}

impl Redirector {
    fn ebpf(r: &Arc<Mutex<Redirection>>) -> std::sync::MutexGuard<'_, Redirection> {
        r.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Redirects the pod's traffic to `listeners` (which must already be open, so that a
    /// redirected connection always finds one); returns the pod's netns cookie (eBPF),
    /// or 0.
    pub async fn install(
        &self,
        netns: &Netns,
        w: &Workload,
        listeners: &[FamilyListeners<'_>],
    ) -> io::Result<u64> {
        match &self.kind {
            // SO_NETNS_COOKIE (Linux 5.14) is only asked for where eBPF needs it: the
            // nftables fallback is for kernels that may not have it.
            Kind::Nftables => nftables::install(netns, w).await.map(|()| 0),
            Kind::None => Ok(0),
            Kind::Ebpf(r) => {
                let cookie = match listeners.first() {
                    Some(l) => ambit_ebpf::sys::netns_cookie(l.outbound.as_fd())?,
                    None => 0,
                };
                let mut r = Self::ebpf(r);
                for ip in &w.ips {
                    let l = listeners
                        .iter()
                        .find(|l| l.ipv6 == ip.is_ipv6())
                        .ok_or_else(|| io::Error::other(format!("no listener for {ip}")))?;
                    r.set_listeners(*ip, l.mesh, l.plain)
                        .map_err(io::Error::other)?;
                }
                let skip_in = w.skip_inbound_ports.ranges();
                let skip_out = w.skip_outbound_ports.ranges();
                r.add_pod(&PodRedirect {
                    id: &pin_id(w, cookie),
                    netns: netns.fd(),
                    netns_cookie: cookie,
                    ips: &w.ips,
                    skip_inbound: skip_in,
                    skip_outbound: skip_out,
                })
                .map_err(io::Error::other)?;
                Ok(cookie)
            }
        }
    }

    /// Stops redirecting a pod that left the mesh (its netns may be gone already).
    pub async fn remove(&self, netns: &Netns, w: &Workload, cookie: u64) -> io::Result<()> {
        match &self.kind {
            Kind::Nftables => nftables::remove(netns).await,
            Kind::None => Ok(()),
            Kind::Ebpf(r) => {
                Self::ebpf(r).remove_pod(&pin_id(w, cookie), cookie, &w.ips);
                Ok(())
            }
        }
    }

    /// Forgets addresses a pod no longer has, its redirection staying (nftables rules
    /// name no address: nothing to do).
    pub fn forget_addresses(&self, ips: &[std::net::IpAddr]) {
        if let Kind::Ebpf(r) = &self.kind {
            Self::ebpf(r).forget_addresses(ips);
        }
    }

    /// Where a connection accepted on a pod's outbound listener was going.
    pub fn outbound_dst(&self, stream: &TcpStream, netns_cookie: u64) -> io::Result<SocketAddr> {
        match &self.kind {
            Kind::Ebpf(r) => {
                let client = stream.peer_addr()?;
                Self::ebpf(r)
                    .original_dst(netns_cookie, client)
                    .ok_or_else(|| {
                        io::Error::new(
                            io::ErrorKind::NotFound,
                            "no original destination recorded for this connection",
                        )
                    })
            }
            _ => crate::netns::original_dst(stream),
        }
    }

    /// Where a connection accepted on a pod's plaintext inbound listener was going.
    pub fn inbound_dst(&self, stream: &TcpStream) -> io::Result<SocketAddr> {
        match self.kind {
            // sk_lookup does no NAT: the socket's own address is the destination.
            Kind::Ebpf(_) => stream.local_addr(),
            _ => crate::netns::original_dst(stream),
        }
    }
}

/// The name of the pod's pinned `sk_lookup` link: stable across proxy restarts (same pod,
/// same netns), different for a new sandbox of the same pod (a new netns).
fn pin_id(w: &Workload, netns_cookie: u64) -> String {
    format!("{}_{}_{netns_cookie:x}", w.namespace, w.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new(mode: Redirect, dir: &Path, cgroup: &Path, record: &Path) -> Result<Redirector, String> {
        let mut registry = prometheus_client::registry::Registry::default();
        Redirector::new(mode, Sockmap::Off, (dir, cgroup, record), &mut registry)
    }

    fn pin_dir(test: &str) -> std::path::PathBuf {
        std::path::PathBuf::from(format!(
            "/sys/fs/bpf/ambit-unit-{test}-{}",
            std::process::id()
        ))
    }

    #[test]
    fn auto_falls_back_to_nftables_and_ebpf_says_why_it_cannot() {
        // A cgroup that does not exist stands for a kernel without the hooks: the
        // programs load, attaching fails. (Root; no cgroup is touched.)
        let dir = pin_dir("fallback");
        let run = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let record = |name: &str| run.path().join(name);
        let nowhere = Path::new("/nonexistent/cgroup");
        let auto = new(Redirect::Auto, &dir, nowhere, &record("a"));
        let forced = new(Redirect::Ebpf, &dir, nowhere, &record("b"));
        let _ = ambit_ebpf::remove_pinned(&dir);
        assert_eq!(auto.map(|r| r.mode()), Ok("nftables"));
        assert_eq!(
            std::fs::read_to_string(record("a")).ok().as_deref(),
            Some("nftables")
        );
        let err = forced.map(|r| r.mode()).unwrap_err();
        assert!(err.contains("/nonexistent/cgroup"), "{err}");
        assert_eq!(
            new(Redirect::Nftables, &dir, nowhere, &record("c")).map(|r| r.mode()),
            Ok("nftables")
        );
        assert_eq!(
            new(Redirect::None, &dir, nowhere, &record("d")).map(|r| r.mode()),
            Ok("none")
        );
        // A node whose pods an earlier run redirected with eBPF: auto does not fall back.
        std::fs::write(record("e"), "ebpf").unwrap_or_else(|e| panic!("{e}"));
        let err = new(Redirect::Auto, &dir, nowhere, &record("e"))
            .map(|r| r.mode())
            .unwrap_err();
        let _ = ambit_ebpf::remove_pinned(&dir);
        assert!(err.contains("does not fall back to nftables"), "{err}");
        assert_eq!(
            std::fs::read_to_string(record("e")).ok().as_deref(),
            Some("ebpf")
        );
    }

    #[test]
    fn the_mode_is_kept_with_the_pods() {
        let dir = Path::new("/sys/fs/bpf/ambit");
        let ebpf = |fallback| Ok(Plan::Ebpf { fallback });
        // A fresh node: auto tries eBPF and may fall back.
        assert_eq!(plan(Redirect::Auto, None, false, dir), ebpf(true));
        // Pods redirected by eBPF (links pinned, or recorded): eBPF or nothing.
        assert_eq!(plan(Redirect::Auto, None, true, dir), ebpf(false));
        assert_eq!(
            plan(Redirect::Auto, Some(Redirect::Ebpf), false, dir),
            ebpf(false)
        );
        let err = plan(Redirect::Nftables, None, true, dir).unwrap_err();
        assert!(err.contains("/sys/fs/bpf/ambit/links"), "{err}");
        // Pods redirected by nftables: auto stays with nftables, even on a kernel that
        // would take eBPF now.
        assert_eq!(
            plan(Redirect::Auto, Some(Redirect::Nftables), false, dir),
            Ok(Plan::Nftables)
        );
        // An explicit choice is the operator's.
        assert_eq!(
            plan(Redirect::Ebpf, Some(Redirect::Nftables), false, dir),
            ebpf(false)
        );
        assert_eq!(
            plan(Redirect::Nftables, Some(Redirect::Ebpf), false, dir),
            Ok(Plan::Nftables)
        );
        assert_eq!(plan(Redirect::None, None, true, dir), Ok(Plan::None));
    }
}
