//! Nodes and pods as network namespaces and cgroups on one machine — the topology the
//! end-to-end tests, the benchmarks (`bench/`) and `ambit demo` all run the mesh on.
//!
//! - [`net`]: pods as network namespaces on a bridge of their own ([`Topology`]); nothing
//!   they send leaves their namespaces.
//! - [`cgroup`]: cgroups made for a run ([`Cgroup`]): the eBPF programs attach to these,
//!   never to the machine's root cgroup, and killing one ends every process in it.
//! - [`process`]: a pod's processes, started in a pod's netns and a node's cgroup as a
//!   container runtime would ([`pod_command`]).
//!
//! Everything made here is named with a prefix the caller chooses, so that a run that
//! crashed can be cleaned up by name ([`net::remove_netns`], [`Cgroup::open`]).

pub mod cgroup;
pub mod net;
pub mod process;

pub use cgroup::Cgroup;
pub use net::{Addressing, PodNet, Topology};
pub use process::{cgroup_command, pod_command};

use std::io;
use std::process::Command;

/// Runs a command; the error carries its arguments and stderr.
pub(crate) fn run(args: &[&str]) -> io::Result<()> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", args.join(" "))))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}
