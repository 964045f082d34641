//! The node's side of the chart's hostPath volumes.

use std::path::{Path, PathBuf};

/// A folder of the test's made a mount point of its own with shared propagation (a bind
/// of itself, or a new bpffs instance), so that what a container mounts under it with
/// the chart's `mountPropagation: Bidirectional` reaches the host as it does on a node;
/// lazily unmounted, with everything under it, when dropped.
#[derive(Debug)]
pub struct SharedMount(pub PathBuf);

impl SharedMount {
    pub fn new(dir: &Path, fstype: Option<&str>) -> Self {
        use nix::mount::{mount, MsFlags};
        std::fs::create_dir_all(dir).unwrap();
        match fstype {
            Some(fs) => mount(Some(fs), dir, Some(fs), MsFlags::empty(), None::<&str>),
            None => mount(Some(dir), dir, None::<&str>, MsFlags::MS_BIND, None::<&str>),
        }
        .unwrap_or_else(|e| panic!("mounting {}: {e}", dir.display()));
        let guard = Self(dir.to_path_buf());
        mount(
            None::<&str>,
            dir,
            None::<&str>,
            MsFlags::MS_SHARED,
            None::<&str>,
        )
        .unwrap();
        guard
    }
}

impl Drop for SharedMount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Removes, when dropped, the cgroups podman made for `--cgroup-parent` in the cgroup v1
/// hierarchies of a hybrid host (the cgroup2 one is the test's own, removed by its owner).
#[derive(Debug)]
pub struct CgroupParent(pub PathBuf);

impl CgroupParent {
    /// `cgroup`'s path in the cgroup2 hierarchy, as `--cgroup-parent` takes it.
    pub fn relative(cgroup: &Path) -> String {
        let rel = cgroup
            .strip_prefix(ambit_ebpf::sys::cgroup2_mount())
            .unwrap();
        format!("/{}", rel.display())
    }
}

impl Drop for CgroupParent {
    fn drop(&mut self) {
        let rel = Self::relative(&self.0);
        let v2 = ambit_ebpf::sys::cgroup2_mount();
        for e in std::fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
        {
            let dir = e.path().join(rel.trim_start_matches('/'));
            if e.path() != v2 && dir.is_dir() {
                remove_cgroup_tree(&dir);
            }
        }
    }
}

/// Removes `dir` and the cgroups under it (podman's `conmon`, the container's), deepest
/// first; a cgroup's files go with its directory.
pub fn remove_cgroup_tree(dir: &Path) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup_tree(&e.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}
