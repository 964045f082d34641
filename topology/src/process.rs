//! A pod's processes: started in a node's cgroup (where that node's eBPF programs are
//! attached) and in the pod's network namespace, as a container runtime starts a
//! container — an unmodified application, no mark, no proxy settings.

use std::path::Path;
use std::process::Command;

/// A command that runs `program args` as a process of the pod in netns `netns`, in
/// `cgroup` when given. The process keeps the pid of the spawned child: a shell moves
/// itself into the cgroup and execs `ip netns exec`, which execs the program.
///
/// Into the cgroup first: `ip netns exec` mounts a sysfs of the netns, which hides the
/// cgroup tree.
pub fn pod_command<S: AsRef<std::ffi::OsStr>>(
    cgroup: Option<&Path>,
    netns: &str,
    program: impl AsRef<std::ffi::OsStr>,
    args: impl IntoIterator<Item = S>,
) -> Command {
    let mut c = Command::new("sh");
    match cgroup {
        Some(cg) => {
            c.arg("-c")
                .arg(r#"cg=$0; ns=$1; shift; echo $$ > "$cg/cgroup.procs" && exec ip netns exec "$ns" "$@""#)
                .arg(cg)
                .arg(netns);
        }
        None => {
            c.arg("-c")
                .arg(r#"exec ip netns exec "$0" "$@""#)
                .arg(netns);
        }
    }
    c.arg(program).args(args);
    c
}

/// A command that runs `program args` on the host (no pod netns) in `cgroup`: for the
/// processes of the mesh itself (control plane, node proxies) in a cgroup of the run's, so
/// that killing that cgroup ends them.
pub fn cgroup_command<S: AsRef<std::ffi::OsStr>>(
    cgroup: &Path,
    program: impl AsRef<std::ffi::OsStr>,
    args: impl IntoIterator<Item = S>,
) -> Command {
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(r#"echo $$ > "$0/cgroup.procs" && exec "$@""#)
        .arg(cgroup)
        .arg(program)
        .args(args);
    c
}
