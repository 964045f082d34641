//! `ambit-ebpf`: loads Ambit's redirection programs, attaches them, and drives their maps.
//!
//! # Layout
//!
//! - [`Redirection`]: the loaded programs and their pinned maps. The node proxy holds one,
//!   attaches the `connect`/`sockops` programs to the pods' cgroup once, and then, per
//!   meshed pod: registers its listeners, its addresses and netns, and attaches
//!   `sk_lookup` to its netns ([`Redirection::add_pod`]); looks up the original
//!   destination of each accepted outbound connection ([`Redirection::original_dst`]).
//!   With sockmap on ([`Redirection::enable_sockmap`]), the in-pod hops' sockets are
//!   paired by `sockops` and their bytes moved by the `sk_msg` program ([`sockmap`]).
//! - [`sys`]: the kernel calls aya 0.13 lacks (owned, pinnable `bpf_link`s; netns cookie;
//!   bpffs).
//!
//! Everything lives under one pin directory on bpffs (`/sys/fs/bpf/ambit` by default):
//! the maps by name, and the links under `links/`. Pinned links stay attached when the
//! proxy exits, and the pinned maps keep the pods registered, so a meshed pod whose proxy
//! is gone has its connections refused — never sent around the proxy (fail closed). A
//! proxy that starts again loads the programs anew, points the pinned links at them, and
//! finds its maps as it left them.
//!
//! The programs themselves are in `ebpf/programs` (built by `build.rs`); the types both
//! sides share are in `ebpf/common`.

pub mod sockmap;
pub mod sys;

pub use ambit_ebpf_common as common;

use ambit_ebpf_common::{
    maps, programs, ConnKey, InboundPod, ListenerKey, OrigDst, OutboundPod, PodIp, PortRange,
    PortRanges, SockKey, FAMILY_V4, FAMILY_V6, LISTENER_MESH, LISTENER_PLAIN, MAX_PORT_RANGES,
};
use aya::maps::{Array, HashMap, MapData, SockHash};
use aya::programs::{CgroupSockAddr, SkLookup, SockOps};
use aya::{Ebpf, EbpfLoader};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};

/// The compiled programs (`ebpf/programs`, built by `build.rs`).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/ambit-redirect.o"));

/// The default pin directory.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/ambit";

/// Why redirection could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kernel refused the programs or maps (no BTF, an old kernel, no CAP_BPF).
    #[error("loading the eBPF programs: {0}")]
    Load(#[from] aya::EbpfError),
    /// A program could not be loaded or attached.
    #[error("eBPF program {name}: {source}")]
    Program {
        /// The program.
        name: &'static str,
        /// What the kernel said.
        source: aya::programs::ProgramError,
    },
    /// A map is missing or refused an update.
    #[error("eBPF map {name}: {detail}")]
    Map {
        /// The map.
        name: &'static str,
        /// What went wrong.
        detail: String,
    },
    /// A system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: io::Error,
    },
    /// Sockmap cannot pair the proxy's sockets: its cgroup is not below the one the
    /// programs are attached to, and is a root cgroup, which Ambit never attaches to.
    #[error("sockmap: {0}")]
    Sockmap(String),
    /// A pod asks for more skip-port ranges than the programs hold.
    #[error("{what}: {count} port ranges, at most {MAX_PORT_RANGES} are supported")]
    TooManyRanges {
        /// Which annotation.
        what: &'static str,
        /// How many ranges it has.
        count: usize,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

fn map_err(name: &'static str) -> impl FnOnce(aya::maps::MapError) -> Error {
    move |e| Error::Map {
        name,
        detail: e.to_string(),
    }
}

/// What [`Redirection::add_pod`] needs to know of a meshed pod.
#[derive(Debug)]
pub struct PodRedirect<'a> {
    /// A name for the pod's pinned link: unique on the node and per netns, stable across
    /// proxy restarts (the proxy uses `<namespace>_<name>_<netns cookie>`).
    pub id: &'a str,
    /// The pod's network namespace.
    pub netns: BorrowedFd<'a>,
    /// Its cookie ([`sys::netns_cookie`] of a socket in it).
    pub netns_cookie: u64,
    /// The pod's addresses.
    pub ips: &'a [IpAddr],
    /// Inclusive port ranges that bypass inbound redirection.
    pub skip_inbound: &'a [(u16, u16)],
    /// Inclusive port ranges that bypass outbound redirection.
    pub skip_outbound: &'a [(u16, u16)],
}

/// The loaded programs and their maps.
pub struct Redirection {
    ebpf: Ebpf,
    pin_dir: PathBuf,
    meshed: HashMap<MapData, u64, OutboundPod>,
    pod_ips: HashMap<MapData, PodIp, InboundPod>,
    listeners: SockHash<MapData, ListenerKey>,
    orig_dst: HashMap<MapData, ConnKey, OrigDst>,
    settings: Array<MapData, u32>,
    inpod: SockHash<MapData, SockKey>,
    /// `sockops` on the proxy's own cgroup, when the programs' cgroup does not hold it
    /// ([`Self::enable_sockmap`]); detached when this is dropped.
    own_sockops: Option<std::os::fd::OwnedFd>,
}

impl std::fmt::Debug for Redirection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redirection")
            .field("pin_dir", &self.pin_dir)
            .finish_non_exhaustive()
    }
}

/// Makes sure `pin_dir` can be created on a bpffs: mounts one at `/sys/fs/bpf` if
/// nothing is mounted there (as Cilium and Istio do), refuses any other non-bpffs place.
fn ensure_bpffs(pin_dir: &Path) -> Result<(), Error> {
    // Two loaders in one process must not both mount: the second mount would hide what
    // the first pinned.
    static MOUNTING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = MOUNTING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let parent = pin_dir.parent().unwrap_or(Path::new("/"));
    let on_bpffs = sys::is_bpffs(parent).map_err(io_err(format!("{}", parent.display())))?;
    if on_bpffs {
        return Ok(());
    }
    if parent == Path::new("/sys/fs/bpf") {
        return sys::mount_bpffs(parent).map_err(io_err("mounting bpffs at /sys/fs/bpf"));
    }
    Err(Error::Io {
        what: format!(
            "{} is not on a bpffs (mount one with `mount -t bpf bpf {}`)",
            pin_dir.display(),
            parent.display()
        ),
        source: io::Error::from(io::ErrorKind::Unsupported),
    })
}

fn take<T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<T, Error> {
    let map = ebpf.take_map(name).ok_or(Error::Map {
        name,
        detail: "not in the object".into(),
    })?;
    T::try_from(map).map_err(map_err(name))
}

/// Address words as the programs see them, and the family.
pub fn ip_words(ip: IpAddr) -> ([u32; 4], u16) {
    match ip {
        IpAddr::V4(v4) => ([u32::from_ne_bytes(v4.octets()), 0, 0, 0], FAMILY_V4),
        IpAddr::V6(v6) => {
            let o = v6.octets();
            let w = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
            ([w(0), w(4), w(8), w(12)], FAMILY_V6)
        }
    }
}

fn ranges(what: &'static str, list: &[(u16, u16)]) -> Result<PortRanges, Error> {
    if list.len() > MAX_PORT_RANGES {
        return Err(Error::TooManyRanges {
            what,
            count: list.len(),
        });
    }
    let mut r = PortRanges::default();
    for (i, (first, last)) in list.iter().enumerate() {
        r.ranges[i] = PortRange {
            first: *first,
            last: *last,
        };
    }
    r.len = list.len() as u32;
    Ok(r)
}

/// Whether the kernel takes the programs: loads them (through the verifier) with their
/// maps pinned in a fresh directory under `bpffs` — `/sys/fs/bpf` on a node — attaches
/// nothing, and removes the directory again, so that it leaves nothing behind (`ambit check
/// --pre`).
pub fn probe(bpffs: &Path) -> Result<(), Error> {
    let dir = bpffs.join(format!("ambit-probe-{}", std::process::id()));
    let loaded = Redirection::load(&dir);
    let removed = remove_pinned(&dir);
    loaded?;
    removed.map_err(io_err(format!("removing {}", dir.display())))
}

impl Redirection {
    /// Loads the programs, reusing (or creating) the maps pinned in `pin_dir`.
    pub fn load(pin_dir: &Path) -> Result<Self, Error> {
        ensure_bpffs(pin_dir)?;
        std::fs::create_dir_all(pin_dir.join("links"))
            .map_err(io_err(format!("creating {}", pin_dir.display())))?;
        let mut ebpf = EbpfLoader::new().map_pin_path(pin_dir).load(OBJECT)?;
        for name in [programs::CONNECT4, programs::CONNECT6] {
            let p: &mut CgroupSockAddr = program_mut(&mut ebpf, name)?;
            p.load().map_err(|source| Error::Program { name, source })?;
        }
        let p: &mut SockOps = program_mut(&mut ebpf, programs::SOCKOPS)?;
        p.load().map_err(|source| Error::Program {
            name: programs::SOCKOPS,
            source,
        })?;
        let p: &mut SkLookup = program_mut(&mut ebpf, programs::SK_LOOKUP)?;
        p.load().map_err(|source| Error::Program {
            name: programs::SK_LOOKUP,
            source,
        })?;

        // Only the proxy's own sockets skip redirection by its mark: tell the programs
        // which cgroup it runs in.
        let own = sys::own_cgroup_id().map_err(io_err("finding the proxy's cgroup v2 id"))?;
        let mut proxy_cgroup: Array<MapData, u64> = take(&mut ebpf, maps::PROXY_CGROUP)?;
        proxy_cgroup
            .set(0, own, 0)
            .map_err(map_err(maps::PROXY_CGROUP))?;
        let r = Self {
            meshed: take(&mut ebpf, maps::MESHED_NETNS)?,
            pod_ips: take(&mut ebpf, maps::POD_IPS)?,
            listeners: take(&mut ebpf, maps::LISTENERS)?,
            orig_dst: take(&mut ebpf, maps::ORIG_DST)?,
            settings: take(&mut ebpf, maps::SETTINGS)?,
            inpod: take(&mut ebpf, maps::INPOD_SOCKETS)?,
            own_sockops: None,
            ebpf,
            pin_dir: pin_dir.to_path_buf(),
        };
        // Hand back what loading freed (the parsed object, the verifier's log buffers)
        // rather than keep it in the proxy's RSS. The kernel's BTF is not parsed: the
        // objects have no BTF relocations (aya as patched in vendor/aya).
        sys::release_free_memory();
        Ok(r)
    }

    fn program_fd(&self, name: &'static str) -> Result<BorrowedFd<'_>, Error> {
        let program = self.ebpf.program(name).ok_or(Error::Map {
            name,
            detail: "program not in the object".into(),
        })?;
        let fd = program
            .fd()
            .map_err(|source| Error::Program { name, source })?;
        Ok(fd.as_fd())
    }

    /// Attaches `program` to `target` through a link pinned at `links/<link>`; a link
    /// already pinned there (left by an earlier run) is pointed at the program instead.
    fn attach_pinned(
        &self,
        program: &'static str,
        target: BorrowedFd<'_>,
        attach_type: u32,
        link: &str,
    ) -> Result<(), Error> {
        let path = self.pin_dir.join("links").join(link);
        let prog = self.program_fd(program)?;
        if path.exists() {
            let fd = sys::obj_get(&path).map_err(io_err(format!("opening {}", path.display())))?;
            return sys::link_update(fd.as_fd(), prog)
                .map_err(io_err(format!("updating {}", path.display())));
        }
        let fd = sys::link_create(prog, target, attach_type)
            .map_err(io_err(format!("attaching {program} ({link})")))?;
        sys::obj_pin(fd.as_fd(), &path).map_err(io_err(format!("pinning {}", path.display())))
    }

    /// Attaches the outbound programs to the cgroup at `cgroup` (cgroup v2): the root
    /// cgroup on a Kubernetes node, where the netns-cookie filter confines them to meshed
    /// pods; a dedicated child cgroup in tests.
    pub fn attach_cgroup(&self, cgroup: &Path) -> Result<(), Error> {
        let dir = std::fs::File::open(cgroup)
            .map_err(io_err(format!("opening cgroup {}", cgroup.display())))?;
        let fd = dir.as_fd();
        self.attach_pinned(
            programs::CONNECT4,
            fd,
            sys::BPF_CGROUP_INET4_CONNECT,
            "cgroup-connect4",
        )?;
        self.attach_pinned(
            programs::CONNECT6,
            fd,
            sys::BPF_CGROUP_INET6_CONNECT,
            "cgroup-connect6",
        )?;
        self.attach_pinned(
            programs::SOCKOPS,
            fd,
            sys::BPF_CGROUP_SOCK_OPS,
            "cgroup-sockops",
        )
    }

    /// Registers the in-pod listeners of the pod address `ip`.
    pub fn set_listeners(
        &mut self,
        ip: IpAddr,
        mesh: &impl AsRawFd,
        plain: &impl AsRawFd,
    ) -> Result<(), Error> {
        let (words, family) = ip_words(ip);
        for (kind, fd) in [
            (LISTENER_MESH, mesh.as_raw_fd()),
            (LISTENER_PLAIN, plain.as_raw_fd()),
        ] {
            let key = ListenerKey {
                ip: words,
                family: u32::from(family),
                kind,
            };
            self.listeners
                .insert(key, fd, 0)
                .map_err(map_err(maps::LISTENERS))?;
        }
        Ok(())
    }

    /// Redirects the pod: its netns is meshed for `connect`, its addresses for
    /// `sk_lookup`, and `sk_lookup` is attached to its netns (a pinned link). Call it
    /// after [`Self::set_listeners`]: from here on, a connection finds the proxy or fails.
    pub fn add_pod(&mut self, pod: &PodRedirect<'_>) -> Result<(), Error> {
        let outbound = OutboundPod {
            skip: ranges("skip-outbound-ports", pod.skip_outbound)?,
        };
        let inbound = InboundPod {
            skip: ranges("skip-inbound-ports", pod.skip_inbound)?,
        };
        for ip in pod.ips {
            let (ip, family) = ip_words(*ip);
            let key = PodIp {
                ip,
                family: u32::from(family),
            };
            self.pod_ips
                .insert(key, inbound, 0)
                .map_err(map_err(maps::POD_IPS))?;
        }
        self.meshed
            .insert(pod.netns_cookie, outbound, 0)
            .map_err(map_err(maps::MESHED_NETNS))?;
        self.attach_pinned(
            programs::SK_LOOKUP,
            pod.netns,
            sys::BPF_SK_LOOKUP,
            &format!("pod-{}", pod.id),
        )
    }

    /// Stops redirecting the pod (it left the mesh or was deleted): its entries go and
    /// its `sk_lookup` link is detached. Missing state is not an error.
    pub fn remove_pod(&mut self, id: &str, netns_cookie: u64, ips: &[IpAddr]) {
        let _ = self.meshed.remove(&netns_cookie);
        self.forget_addresses(ips);
        // Removing the pin drops the last reference to the link: it detaches.
        let _ = std::fs::remove_file(self.pin_dir.join("links").join(format!("pod-{id}")));
    }

    /// Forgets addresses a pod no longer has (its netns stays redirected: `sk_lookup` now
    /// refuses them). Missing entries are not an error.
    pub fn forget_addresses(&mut self, ips: &[IpAddr]) {
        for ip in ips {
            let (words, family) = ip_words(*ip);
            let _ = self.pod_ips.remove(&PodIp {
                ip: words,
                family: u32::from(family),
            });
            for kind in [LISTENER_MESH, LISTENER_PLAIN] {
                let _ = self.listeners.remove(&ListenerKey {
                    ip: words,
                    family: u32::from(family),
                    kind,
                });
            }
        }
    }

    /// The original destination of a connection accepted on a pod's outbound listener,
    /// from the pod's netns cookie and the client's address; the entry is consumed.
    pub fn original_dst(&mut self, netns_cookie: u64, client: SocketAddr) -> Option<SocketAddr> {
        let family = match client.ip() {
            IpAddr::V4(_) => FAMILY_V4,
            IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => FAMILY_V4,
            IpAddr::V6(_) => FAMILY_V6,
        };
        let key = ConnKey {
            netns_cookie,
            port: client.port(),
            family,
            pad: 0,
        };
        let dst = self.orig_dst.get(&key, 0).ok()?;
        let _ = self.orig_dst.remove(&key);
        Some(orig_to_addr(&dst))
    }
}

fn orig_to_addr(d: &OrigDst) -> SocketAddr {
    let ip = if d.family == FAMILY_V4 {
        IpAddr::V4(Ipv4Addr::from(d.ip[0].to_ne_bytes()))
    } else {
        let mut o = [0u8; 16];
        for (i, w) in d.ip.iter().enumerate() {
            o[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
        }
        IpAddr::V6(Ipv6Addr::from(o))
    };
    SocketAddr::new(ip, d.port)
}

fn program_mut<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T, Error>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let p = ebpf.program_mut(name).ok_or(Error::Map {
        name,
        detail: "program not in the object".into(),
    })?;
    p.try_into()
        .map_err(|source| Error::Program { name, source })
}

/// Detaches everything pinned under `pin_dir` and removes it: the cgroup and pod links
/// (their last reference goes, so they detach) and the maps. For uninstall and tests.
pub fn remove_pinned(pin_dir: &Path) -> io::Result<()> {
    if !pin_dir.exists() {
        return Ok(());
    }
    let links = pin_dir.join("links");
    if links.exists() {
        for entry in std::fs::read_dir(&links)? {
            std::fs::remove_file(entry?.path())?;
        }
        std::fs::remove_dir(&links)?;
    }
    for entry in std::fs::read_dir(pin_dir)? {
        std::fs::remove_file(entry?.path())?;
    }
    std::fs::remove_dir(pin_dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_through_the_programs_layout() {
        for addr in ["10.1.2.3:80", "[fd00::1:2]:8443"] {
            let addr: SocketAddr = addr.parse().unwrap_or_else(|e| panic!("{addr}: {e}"));
            let (ip, family) = ip_words(addr.ip());
            let d = OrigDst {
                ip,
                port: addr.port(),
                family,
            };
            assert_eq!(orig_to_addr(&d), addr);
        }
        // IPv4 as the kernel hands it over: the first octet in the lowest byte.
        let (ip, _) = ip_words(
            "10.1.2.3"
                .parse()
                .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        );
        assert_eq!(ip[0].to_ne_bytes(), [10, 1, 2, 3]);
    }

    #[test]
    fn more_skip_ranges_than_the_programs_hold_are_refused() {
        let many: Vec<(u16, u16)> = (0..17).map(|i| (i * 10, i * 10 + 1)).collect();
        assert!(matches!(
            ranges("skip-inbound-ports", &many),
            Err(Error::TooManyRanges { count: 17, .. })
        ));
        let r = ranges("skip-inbound-ports", &many[..16]).unwrap_or_default();
        assert!(r.contains(151) && !r.contains(152) && r.contains(0));
    }
}
