//! The switch for sockmap on the in-pod hops, and where the proxy's own sockets get paired.
//!
//! `sockops` pairs both ends of an in-pod hop as each becomes established, so both ends
//! must be in a cgroup the program runs for: the pods' (the cgroup the programs attach
//! to) and the proxy's. On a node the programs attach to the root cgroup, which holds the
//! proxy too. Where the proxy runs outside that cgroup (tests, benchmarks), `sockops` is
//! attached to the proxy's own cgroup as well, by a link this process owns — never to a
//! root cgroup.

use crate::{io_err, map_err, program_mut, sys, Error, Redirection};
use ambit_ebpf_common::{maps, programs, SockKey, SETTING_SOCKMAP, SOCKMAP_BUDGET};
use aya::programs::SkMsg;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

/// How the proxy's sockets come under `sockops` (see [`Redirection::enable_sockmap`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProxyCoverage {
    /// The proxy's cgroup is the programs' cgroup or below it.
    Covered,
    /// `sockops` was attached to the proxy's own cgroup too (for as long as the
    /// [`Redirection`] lives).
    OwnCgroup(PathBuf),
}

/// Whether `dir` is the root of a cgroup v2 hierarchy (only non-root cgroups have
/// `cgroup.type`).
fn is_root_cgroup(dir: &Path) -> bool {
    !dir.join("cgroup.type").exists()
}

/// Whether the proxy's cgroup `own` is `programs` or below it. A root `programs` holds
/// every process, whatever path the proxy sees it at (a node's root mounted at
/// `/host/sys/fs/cgroup` in a container with a cgroup namespace of its own).
fn covered(own: &Path, programs: &Path) -> bool {
    if is_root_cgroup(programs) {
        return true;
    }
    match (own.canonicalize(), programs.canonicalize()) {
        (Ok(own), Ok(programs)) => own.starts_with(programs),
        _ => false,
    }
}

impl Redirection {
    /// Turns sockmap on for new connections: the `sk_msg` program is attached to
    /// `INPOD_SOCKETS` (it stays with the pinned map, a later attach replaces it), the
    /// proxy's own sockets are brought under `sockops` (see [`ProxyCoverage`]; `cgroup` is
    /// where [`Self::attach_cgroup`] attached the programs), and the switch in `SETTINGS`
    /// is set, with the default budget. Connections made before keep the path they had.
    pub fn enable_sockmap(&mut self, cgroup: &Path) -> Result<ProxyCoverage, Error> {
        let own = sys::own_cgroup_dir().map_err(io_err("finding the proxy's cgroup v2"))?;
        let coverage = if covered(&own, cgroup) {
            ProxyCoverage::Covered
        } else if is_root_cgroup(&own) {
            return Err(Error::Sockmap(format!(
                "the proxy runs in the root cgroup ({}), which is not below --cgroup-path {}: \
                 its sockets cannot be paired (run it in a cgroup of its own, or below {})",
                own.display(),
                cgroup.display(),
                cgroup.display()
            )));
        } else {
            ProxyCoverage::OwnCgroup(own.clone())
        };
        {
            let p: &mut SkMsg = program_mut(&mut self.ebpf, programs::SK_MSG)?;
            if p.fd().is_err() {
                p.load().map_err(|source| Error::Program {
                    name: programs::SK_MSG,
                    source,
                })?;
            }
        }
        let prog = self.program_fd(programs::SK_MSG)?;
        sys::prog_attach(prog, self.inpod.fd().as_fd(), sys::BPF_SK_MSG_VERDICT)
            .map_err(io_err("attaching sk_msg to AMBIT_INPOD_SOCKETS"))?;
        if let ProxyCoverage::OwnCgroup(dir) = &coverage {
            if self.own_sockops.is_none() {
                let file = std::fs::File::open(dir)
                    .map_err(io_err(format!("opening cgroup {}", dir.display())))?;
                let sockops = self.program_fd(programs::SOCKOPS)?;
                let link = sys::link_create(sockops, file.as_fd(), sys::BPF_CGROUP_SOCK_OPS)
                    .map_err(io_err(format!("attaching sockops to {}", dir.display())))?;
                self.own_sockops = Some(link);
            }
        }
        self.set_sockmap_budget(SOCKMAP_BUDGET)?;
        self.set_settings(SETTING_SOCKMAP)?;
        Ok(coverage)
    }

    /// How many bytes a paired socket may move by `sk_msg` before it goes back to TCP for
    /// good (default [`SOCKMAP_BUDGET`]; for connections paired from now on and those
    /// still within it).
    pub fn set_sockmap_budget(&mut self, bytes: u32) -> Result<(), Error> {
        self.settings
            .set(1, bytes, 0)
            .map_err(map_err(maps::SETTINGS))
    }

    /// Turns sockmap off for new connections (the switch in `SETTINGS`); connections
    /// paired before keep their path until they close.
    pub fn disable_sockmap(&mut self) -> Result<(), Error> {
        self.own_sockops = None;
        self.set_settings(0)
    }

    /// The bytes the paired socket `key` has moved by `sk_msg` so far.
    pub fn sockmap_redirected(&self, key: &SockKey) -> Option<u64> {
        let counts: aya::maps::HashMap<_, SockKey, u64> =
            aya::maps::HashMap::try_from(self.ebpf.map(maps::REDIRECTED)?).ok()?;
        counts.get(key, 0).ok()
    }

    fn set_settings(&mut self, flags: u32) -> Result<(), Error> {
        self.settings
            .set(0, flags, 0)
            .map_err(map_err(maps::SETTINGS))
    }

    /// The sockets paired in `INPOD_SOCKETS` now (both ends of each in-pod hop).
    pub fn inpod_sockets(&self) -> Vec<SockKey> {
        self.inpod.keys().filter_map(Result::ok).collect()
    }
}

/// The sockets paired in the `INPOD_SOCKETS` map pinned under `pin_dir`, read without
/// loading anything (what a running proxy has paired: for tests and diagnostics).
pub fn pinned_pairs(pin_dir: &Path) -> Result<Vec<SockKey>, Error> {
    let path = pin_dir.join(maps::INPOD_SOCKETS);
    let data = aya::maps::MapData::from_pin(&path).map_err(map_err(maps::INPOD_SOCKETS))?;
    let map: aya::maps::SockHash<_, SockKey> =
        aya::maps::SockHash::try_from(aya::maps::Map::SockHash(data))
            .map_err(map_err(maps::INPOD_SOCKETS))?;
    Ok(map.keys().filter_map(Result::ok).collect())
}
