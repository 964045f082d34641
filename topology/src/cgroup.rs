//! Cgroups made for a run, under the cgroup v2 mount (`/sys/fs/cgroup`, or
//! `/sys/fs/cgroup/unified` on a hybrid machine). The eBPF programs of a run attach to one
//! of these, never to the machine's root cgroup; killing one ends every process in it and
//! below it, whatever those processes did (forked, changed their process group).

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The cgroup v2 mount point.
pub fn cgroup2_mount() -> PathBuf {
    ambit_ebpf::sys::cgroup2_mount()
}

/// A cgroup directory. Dropping it kills its processes and removes it (children first),
/// unless [`Cgroup::keep`] hands it over.
#[derive(Debug)]
pub struct Cgroup {
    path: PathBuf,
    remove_on_drop: bool,
}

impl Cgroup {
    /// Makes `<cgroup2 mount>/<relative>` (its parents too); an existing one is an error
    /// (a run that did not clean up: remove it with [`Cgroup::open`] and
    /// [`Cgroup::remove`]).
    pub fn create(relative: &str) -> io::Result<Self> {
        let path = cgroup2_mount().join(relative);
        if path.exists() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("cgroup {} exists already", path.display()),
            ));
        }
        std::fs::create_dir_all(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", path.display())))?;
        Ok(Self {
            path,
            remove_on_drop: true,
        })
    }

    /// `<cgroup2 mount>/<relative>` if it exists (left by an earlier run); dropping the
    /// value does not remove it.
    pub fn open(relative: &str) -> Option<Self> {
        let path = cgroup2_mount().join(relative);
        path.is_dir().then_some(Self {
            path,
            remove_on_drop: false,
        })
    }

    /// Its directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The processes in it and in every cgroup below it.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids = Vec::new();
        for dir in subtree(&self.path) {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            pids.extend(procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
        pids
    }

    /// Kills every process in it and below it, and waits (up to 5 s) until none is left.
    /// With `cgroup.kill` (Linux 5.14) the kernel does it at once; before that, each
    /// process gets SIGKILL.
    pub fn kill(&self) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let pids = self.pids();
            if pids.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "processes {pids:?} of {} did not end",
                    self.path.display()
                )));
            }
            let kill_file = self.path.join("cgroup.kill");
            if kill_file.exists() {
                std::fs::write(&kill_file, "1")?;
            } else {
                for pid in pids {
                    let _ = crate::run(&["kill", "-KILL", &pid.to_string()]);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills its processes and removes it and every cgroup below it.
    pub fn remove(mut self) -> io::Result<()> {
        self.remove_on_drop = false;
        self.kill()?;
        let mut dirs = subtree(&self.path);
        dirs.reverse(); // deepest last in `subtree`: remove them first
                        // A cgroup whose last process has just been killed may refuse rmdir (EBUSY) until
                        // the kernel has finished that exit, after cgroup.procs already reads empty.
        let deadline = Instant::now() + Duration::from_secs(5);
        for dir in dirs {
            loop {
                match std::fs::remove_dir(&dir) {
                    Ok(()) => break,
                    Err(e)
                        if e.kind() == io::ErrorKind::ResourceBusy && Instant::now() < deadline =>
                    {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) => {
                        return Err(io::Error::new(
                            e.kind(),
                            format!("removing {}: {e}", dir.display()),
                        ))
                    }
                }
            }
        }
        Ok(())
    }

    /// Leaves it in place when this value goes away; returns its path.
    pub fn keep(mut self) -> PathBuf {
        self.remove_on_drop = false;
        self.path.clone()
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        if self.remove_on_drop {
            let this = Self {
                path: self.path.clone(),
                remove_on_drop: false,
            };
            let _ = this.remove();
        }
    }
}

/// `dir` and every directory below it, parents before children.
fn subtree(dir: &Path) -> Vec<PathBuf> {
    let mut all = vec![dir.to_path_buf()];
    let mut i = 0;
    while i < all.len() {
        if let Ok(entries) = std::fs::read_dir(&all[i]) {
            let mut children: Vec<PathBuf> = entries
                .filter_map(|e| e.ok())
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect();
            children.sort();
            all.extend(children);
        }
        i += 1;
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subtree_lists_parents_before_children() {
        let dir = std::env::temp_dir().join(format!("ambit-topology-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        std::fs::create_dir_all(dir.join("c")).unwrap();
        std::fs::write(dir.join("a/file"), "").unwrap();
        let got: Vec<String> = subtree(&dir)
            .iter()
            .map(|p| p.strip_prefix(&dir).unwrap().display().to_string())
            .collect();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(got, ["", "a", "c", "a/b"]);
    }
}
