//! A bounded scan of a proc filesystem for the processes of given pods.
//!
//! The scan reads, per process, at most a few KiB of `/proc/<pid>/cgroup` and
//! `/proc/<pid>/stat` and one `stat` of `/proc/<pid>/ns/net`, and stops after
//! [`MAX_PROCESSES`]. It runs when discovery names a meshed pod that the proxy does not
//! serve yet (rate-limited by the caller), never per connection.

use super::cgroup;
use std::collections::{HashMap, HashSet};
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The most processes one scan looks at.
pub const MAX_PROCESSES: usize = 65_536;
/// The most of a `cgroup` file read (a line per hierarchy, a path each).
const MAX_CGROUP_BYTES: u64 = 16 * 1024;
/// The most of a `stat` file read.
const MAX_STAT_BYTES: u64 = 4 * 1024;

/// A network namespace's identity: the device and inode of its nsfs file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NsId {
    dev: u64,
    ino: u64,
}

impl NsId {
    /// The namespace `path` is (or links to).
    pub fn of(path: &Path) -> io::Result<Self> {
        std::fs::metadata(path).map(|m| Self::from_metadata(&m))
    }

    /// The namespace an open file is.
    pub fn of_file(file: &std::fs::File) -> io::Result<Self> {
        file.metadata().map(|m| Self::from_metadata(&m))
    }

    fn from_metadata(m: &std::fs::Metadata) -> Self {
        Self {
            dev: m.dev(),
            ino: m.ino(),
        }
    }
}

/// The host's network namespaces, as far as they can be read: the proxy's own (it runs
/// with the host's network) and that of pid 1 of `proc_root`. Processes in these are
/// hostNetwork pods' and never the netns of a pod to mesh.
pub fn host_netns(proc_root: &Path) -> Vec<NsId> {
    [
        Path::new("/proc/self/ns/net").to_path_buf(),
        proc_root.join("1/ns/net"),
    ]
    .iter()
    .filter_map(|p| NsId::of(p).ok())
    .collect()
}

/// A process of a pod, outside the host's network namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodProcess {
    /// Its pid in `proc_root`.
    pub pid: u32,
    /// When it started (clock ticks after boot; `u64::MAX` if unknown).
    pub start_time: u64,
    /// Its network namespace.
    pub netns: NsId,
}

/// What a scan found.
#[derive(Debug, Default)]
pub struct Scan {
    /// For each pod UID asked for that has one: its oldest process outside the host's
    /// network namespace.
    pub found: HashMap<String, PodProcess>,
    /// Processes looked at.
    pub processes: usize,
    /// Whether the scan stopped at [`MAX_PROCESSES`].
    pub truncated: bool,
}

/// Reads at most `max` bytes of `path`, as text (invalid UTF-8 replaced).
pub fn read_bounded(path: &Path, max: u64) -> io::Result<String> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(max)
        .read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The pod UIDs the process `pid`'s cgroups name.
pub fn pod_uids_of(proc_root: &Path, pid: u32) -> io::Result<Vec<String>> {
    let content = read_bounded(
        &proc_root.join(pid.to_string()).join("cgroup"),
        MAX_CGROUP_BYTES,
    )?;
    Ok(cgroup::pod_uids(&content))
}

/// Field 22 of `/proc/<pid>/stat`, counted after the command name (which may hold
/// spaces and parentheses, so the fields start after its last `)`).
fn start_time(proc_root: &Path, pid: u32) -> Option<u64> {
    let stat = read_bounded(
        &proc_root.join(pid.to_string()).join("stat"),
        MAX_STAT_BYTES,
    )
    .ok()?;
    let (_, fields) = stat.rsplit_once(')')?;
    fields.split_whitespace().nth(19)?.parse().ok()
}

/// Finds, for each UID in `uids`, the pod's oldest process whose network namespace is not
/// one of `host`: the sandbox's own process starts before anything the pod runs, so a
/// container that made a network namespace of its own is not mistaken for the pod.
/// Whether any process of `proc_root` (up to [`MAX_PROCESSES`]; `true` beyond, as a
/// scan that could not finish cannot say no) is in the network namespace `netns`.
pub fn netns_in_use(proc_root: &Path, netns: NsId) -> io::Result<bool> {
    let mut seen = 0;
    for entry in std::fs::read_dir(proc_root)? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        seen += 1;
        if seen > MAX_PROCESSES {
            return Ok(true);
        }
        if NsId::of(&proc_root.join(pid.to_string()).join("ns/net")).is_ok_and(|n| n == netns) {
            return Ok(true);
        }
    }
    Ok(false)
}

pub fn scan(proc_root: &Path, uids: &HashSet<String>, host: &[NsId]) -> io::Result<Scan> {
    let mut scan = Scan::default();
    for entry in std::fs::read_dir(proc_root)? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if scan.processes == MAX_PROCESSES {
            scan.truncated = true;
            break;
        }
        scan.processes += 1;
        // A process may be gone by now; whatever cannot be read is passed over.
        let Ok(found) = pod_uids_of(proc_root, pid) else {
            continue;
        };
        let Some(uid) = found.into_iter().find(|u| uids.contains(u)) else {
            continue;
        };
        let Ok(netns) = NsId::of(&proc_root.join(pid.to_string()).join("ns/net")) else {
            continue;
        };
        if host.contains(&netns) {
            continue;
        }
        let process = PodProcess {
            pid,
            start_time: start_time(proc_root, pid).unwrap_or(u64::MAX),
            netns,
        };
        scan.found
            .entry(uid)
            .and_modify(|p| {
                if (process.start_time, process.pid) < (p.start_time, p.pid) {
                    *p = process;
                }
            })
            .or_insert(process);
    }
    Ok(scan)
}
