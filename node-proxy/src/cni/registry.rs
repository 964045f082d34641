//! The pods the CNI plugin handed over (or that were enrolled while running, see
//! [`crate::enrol`]), kept on disk so that a restarted proxy serves them again without a
//! new `ADD`.
//!
//! Under the run directory (`/var/run/ambit` by default):
//!
//! - `pods/<namespace>_<name>.json`: the pod as the plugin described it;
//! - `netns/<namespace>_<name>_<sandbox>`: a bind mount of the pod's network namespace
//!   (as `ip netns add` makes), which keeps a handle on it whatever the runtime does with
//!   its own path (`<namespace>_<name>_proc` for an enrolled pod). `DEL` unmounts it.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::watch;

/// `NSFS_MAGIC`: what `statfs` says of a namespace file.
const NSFS_MAGIC: i64 = 0x6e73_6673;

/// How a pod reached the proxy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PodSource {
    /// A CNI `ADD` handed it over (with its sandbox id).
    #[default]
    Cni,
    /// It was running when it was meshed; its netns was found in `/proc` (no sandbox id).
    Proc,
}

/// A pod handed over by the CNI plugin, or enrolled while running.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniPod {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `metadata.uid`, when the runtime said.
    pub uid: String,
    /// The sandbox (`CNI_CONTAINERID`).
    pub container_id: String,
    /// The addresses the CNI chain gave it (authoritative before the API server has them).
    pub ips: Vec<IpAddr>,
    /// The proxy's handle on its network namespace (a bind mount).
    pub netns: PathBuf,
    /// How it reached the proxy (records older than this field are CNI's).
    #[serde(default)]
    pub source: PodSource,
}

impl CniPod {
    /// `<namespace>/<name>`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Every pod handed over, by `<namespace>/<name>`.
pub type CniPods = Arc<BTreeMap<String, CniPod>>;

/// The registry: on disk, and published on a watch channel for the data path.
#[derive(Clone, Debug)]
pub struct PodRegistry {
    dir: PathBuf,
    pods: Arc<watch::Sender<CniPods>>,
    /// One change at a time (mount, files, publication).
    write: Arc<Mutex<()>>,
}

fn file_name(namespace: &str, name: &str) -> String {
    format!("{namespace}_{name}")
}

/// Whether `path` is a mounted network namespace.
fn is_netns(path: &Path) -> bool {
    nix::sys::statfs::statfs(path).is_ok_and(|s| s.filesystem_type().0 == NSFS_MAGIC)
}

/// A network namespace as the kernel tells them apart: the nsfs device and inode (what
/// `ip netns identify` compares), whatever path or descriptor it was reached by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetnsId {
    dev: u64,
    ino: u64,
}

/// What a descriptor that is not a network namespace is, in words.
fn file_kind(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "a regular file",
        libc::S_IFIFO => "a pipe",
        libc::S_IFSOCK => "a socket",
        libc::S_IFDIR => "a directory",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFLNK => "a symbolic link",
        _ => "an anonymous file (eventfd, epoll, ...)",
    }
}

/// What kind of namespace `NS_GET_NSTYPE` answered.
fn namespace_kind(nstype: libc::c_int) -> &'static str {
    match nstype {
        libc::CLONE_NEWNS => "a mount namespace",
        libc::CLONE_NEWUTS => "a UTS namespace",
        libc::CLONE_NEWIPC => "an IPC namespace",
        libc::CLONE_NEWPID => "a pid namespace",
        libc::CLONE_NEWUSER => "a user namespace",
        libc::CLONE_NEWCGROUP => "a cgroup namespace",
        libc::CLONE_NEWTIME => "a time namespace",
        _ => "a namespace of an unknown type",
    }
}

/// Checks that `fd` is a network namespace (on nsfs, and `NS_GET_NSTYPE` says
/// `CLONE_NEWNET`); its id, or what the descriptor is instead (`"a regular file"`, `"a
/// mount namespace"`, ...).
pub fn netns_of(fd: BorrowedFd<'_>) -> Result<NetnsId, String> {
    let st = fd
        .try_clone_to_owned()
        .map(File::from)
        .and_then(|f| f.metadata())
        .map_err(|e| format!("a descriptor fstat fails on ({e})"))?;
    let fs = nix::sys::statfs::fstatfs(fd)
        .map_err(|e| format!("a descriptor fstatfs fails on ({e})"))?;
    if fs.filesystem_type().0 != NSFS_MAGIC {
        return Err(file_kind(st.mode()).into());
    }
    // SAFETY: NS_GET_NSTYPE takes no argument and only reads the descriptor, which is
    // open for the duration of the call (borrowed).
    #[allow(unsafe_code)]
    let nstype = unsafe { libc::ioctl(fd.as_raw_fd(), libc::NS_GET_NSTYPE) };
    if nstype < 0 {
        return Err(format!(
            "a namespace file whose type the kernel does not tell ({})",
            io::Error::last_os_error()
        ));
    }
    if nstype != libc::CLONE_NEWNET {
        return Err(namespace_kind(nstype).into());
    }
    Ok(NetnsId {
        dev: st.dev(),
        ino: st.ino(),
    })
}

/// The id of the network namespace mounted at `path`, if one is.
fn netns_at(path: &Path) -> Option<NetnsId> {
    if !is_netns(path) {
        return None;
    }
    let m = std::fs::metadata(path).ok()?;
    Some(NetnsId {
        dev: m.dev(),
        ino: m.ino(),
    })
}

/// Why the registry refused to take a pod on: the descriptor is not a network namespace,
/// or the sandbox is already another network namespace's (or another pod's). Rides in
/// the `io::Error` that [`PodRegistry::add`] returns (`InvalidInput` / `AlreadyExists`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The descriptor is something else (said in words).
    #[error("the descriptor passed as the pod's netns is {0}, not a network namespace")]
    NotNetns(String),
    /// The sandbox is registered with another network namespace, alive.
    #[error("sandbox {container_id} of pod {pod} is already attached to another network namespace (held at {held})")]
    OtherNetns {
        /// `<namespace>/<name>`.
        pod: String,
        /// The sandbox.
        container_id: String,
        /// The proxy's handle on the namespace it has.
        held: String,
    },
    /// The sandbox is registered for another pod.
    #[error("sandbox {container_id} is pod {owner}'s, not {pod}'s")]
    OtherPod {
        /// The pod asked for.
        pod: String,
        /// The sandbox.
        container_id: String,
        /// The pod it is registered for.
        owner: String,
    },
}

impl Refused {
    /// The refusal in `err`, if it is one.
    pub fn of(err: &io::Error) -> Option<&Self> {
        err.get_ref().and_then(|e| e.downcast_ref::<Self>())
    }

    fn into_io(self) -> io::Error {
        let kind = match self {
            Self::NotNetns(_) => io::ErrorKind::InvalidInput,
            Self::OtherNetns { .. } | Self::OtherPod { .. } => io::ErrorKind::AlreadyExists,
        };
        io::Error::new(kind, self)
    }
}

fn unmount(path: &Path) {
    let _ = nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH);
    let _ = std::fs::remove_file(path);
}

impl PodRegistry {
    /// Opens the registry in `dir`, restoring every pod whose namespace is still there
    /// (and forgetting those whose namespace is gone).
    pub fn open(dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(dir.join("pods"))?;
        std::fs::create_dir_all(dir.join("netns"))?;
        let mut pods = BTreeMap::new();
        for entry in std::fs::read_dir(dir.join("pods"))? {
            let path = entry?.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let pod: Option<CniPod> = std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok());
            match pod {
                Some(pod) if is_netns(&pod.netns) => {
                    tracing::info!(pod = %pod.key(), netns = %pod.netns.display(), "restored a pod handed over before the restart");
                    pods.insert(pod.key(), pod);
                }
                other => {
                    tracing::warn!(file = %path.display(), "forgetting a pod whose network namespace is gone");
                    if let Some(pod) = other {
                        unmount(&pod.netns);
                    }
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        let (tx, _) = watch::channel(Arc::new(pods));
        Ok(Self {
            dir: dir.to_path_buf(),
            pods: Arc::new(tx),
            write: Arc::new(Mutex::new(())),
        })
    }

    /// Adds the pods recorded in the directory since it was opened (by the process this
    /// one took over from); forgets nothing.
    pub fn refresh(&self) -> io::Result<()> {
        let _write = self
            .write
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut pods = (**self.pods.borrow()).clone();
        let mut added = 0;
        for entry in std::fs::read_dir(self.dir.join("pods"))? {
            let path = entry?.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let pod: Option<CniPod> = std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok());
            if let Some(pod) = pod.filter(|p| is_netns(&p.netns) && !pods.contains_key(&p.key())) {
                tracing::info!(pod = %pod.key(), "a pod handed over by the CNI plugin to the process taken over from");
                pods.insert(pod.key(), pod);
                added += 1;
            }
        }
        if added > 0 {
            self.pods.send_replace(Arc::new(pods));
        }
        Ok(())
    }

    /// The pods now.
    pub fn pods(&self) -> CniPods {
        self.pods.borrow().clone()
    }

    /// A receiver that sees every change.
    pub fn subscribe(&self) -> watch::Receiver<CniPods> {
        self.pods.subscribe()
    }

    /// Takes a pod on: keeps a handle on `netns` and records it. An `ADD` repeated for
    /// the same sandbox and network namespace changes nothing; one for a new sandbox
    /// replaces the old one. Refused ([`Refused`], in the error): a descriptor that is
    /// not a network namespace, a sandbox the registry holds with another live network
    /// namespace (namespaces compared by inode, not path), or a sandbox registered for
    /// another pod.
    pub fn add(&self, pod: CniPod, netns: OwnedFd) -> io::Result<CniPod> {
        let id = netns_of(netns.as_fd()).map_err(|what| Refused::NotNetns(what).into_io())?;
        let _write = self.write.lock().unwrap_or_else(PoisonError::into_inner);
        let pods = self.pods();
        let key = pod.key();
        if !pod.container_id.is_empty() {
            let owner = pods.values().find(|p| {
                p.key() != key
                    && p.source == PodSource::Cni
                    && p.container_id == pod.container_id
                    && is_netns(&p.netns)
            });
            if let Some(owner) = owner {
                return Err(Refused::OtherPod {
                    pod: key,
                    container_id: pod.container_id,
                    owner: owner.key(),
                }
                .into_io());
            }
        }
        if let Some(old) = pods.get(&key) {
            let same_sandbox = !pod.container_id.is_empty()
                && old.source == PodSource::Cni
                && old.container_id == pod.container_id;
            match netns_at(&old.netns) {
                Some(held) if same_sandbox && held == id => return Ok(old.clone()),
                Some(_) if same_sandbox => {
                    return Err(Refused::OtherNetns {
                        pod: key,
                        container_id: pod.container_id,
                        held: old.netns.display().to_string(),
                    }
                    .into_io())
                }
                // Another sandbox of the pod, or a handle that is gone: replaced.
                _ => {}
            }
        }
        self.insert(pod, netns)
    }

    /// Takes on a pod found running (enrolment), unless it has a record already: a CNI
    /// `ADD` that came first is the better word on the pod. `None` if it had one.
    pub fn enrol(&self, mut pod: CniPod, netns: OwnedFd) -> io::Result<Option<CniPod>> {
        netns_of(netns.as_fd()).map_err(|what| Refused::NotNetns(what).into_io())?;
        let _write = self.write.lock().unwrap_or_else(PoisonError::into_inner);
        if self.pods.borrow().contains_key(&pod.key()) {
            return Ok(None);
        }
        pod.source = PodSource::Proc;
        pod.container_id.clear();
        self.insert(pod, netns).map(Some)
    }

    /// Mounts the handle, writes the record, publishes; the write lock is held.
    fn insert(&self, mut pod: CniPod, netns: OwnedFd) -> io::Result<CniPod> {
        let key = pod.key();
        if let Some(old) = self.pods.borrow().get(&key).cloned() {
            unmount(&old.netns);
        }
        let sandbox: String = match pod.source {
            PodSource::Cni => pod
                .container_id
                .chars()
                .filter(char::is_ascii_alphanumeric)
                .take(16)
                .collect(),
            PodSource::Proc => "proc".into(),
        };
        let target = self.dir.join("netns").join(format!(
            "{}_{sandbox}",
            file_name(&pod.namespace, &pod.name)
        ));
        // A handle left by a proxy that stopped between mounting and recording.
        unmount(&target);
        File::create(&target)?;
        let source = format!("/proc/self/fd/{}", netns.as_raw_fd());
        if let Err(e) = nix::mount::mount(
            Some(source.as_str()),
            &target,
            None::<&str>,
            nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        ) {
            let _ = std::fs::remove_file(&target);
            return Err(io::Error::other(format!(
                "keeping a handle on the pod's netns at {}: {e}",
                target.display()
            )));
        }
        pod.netns = target;
        let json = serde_json::to_vec_pretty(&pod).map_err(io::Error::other)?;
        let file = self
            .dir
            .join("pods")
            .join(format!("{}.json", file_name(&pod.namespace, &pod.name)));
        let tmp = file.with_extension("json.tmp");
        std::fs::write(&tmp, json)?;
        std::fs::rename(&tmp, &file)?;
        self.pods.send_modify(|pods| {
            Arc::make_mut(pods).insert(key, pod.clone());
        });
        Ok(pod)
    }

    /// The pod `namespace/name` if `container_id` names its sandbox: a CNI pod's own, or
    /// any sandbox for an enrolled pod (which has no id; the sandbox it ran in is the only
    /// one it had). An empty id names no sandbox: it matches nothing.
    pub fn sandbox(&self, namespace: &str, name: &str, container_id: &str) -> Option<CniPod> {
        let pod = self.pods().get(&format!("{namespace}/{name}")).cloned()?;
        Self::names(&pod, container_id).then_some(pod)
    }

    fn names(pod: &CniPod, container_id: &str) -> bool {
        !container_id.is_empty()
            && match pod.source {
                PodSource::Cni => pod.container_id == container_id,
                PodSource::Proc => true,
            }
    }

    /// Forgets a pod (`DEL`): releases its netns handle and its record. With a sandbox
    /// given, only if it names the pod's (see [`Self::sandbox`]; an empty one names
    /// none). Whether there was one.
    pub fn remove(&self, namespace: &str, name: &str, container_id: Option<&str>) -> bool {
        self.remove_if(&format!("{namespace}/{name}"), |pod| {
            container_id.is_none_or(|c| Self::names(pod, c))
        })
    }

    /// Forgets the pod under `key` if `matches` holds of its record (under the write lock).
    fn remove_if(&self, key: &str, matches: impl FnOnce(&CniPod) -> bool) -> bool {
        let _write = self.write.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(pod) = self.pods.borrow().get(key).cloned() else {
            return false;
        };
        if !matches(&pod) {
            return false;
        }
        unmount(&pod.netns);
        let _ = std::fs::remove_file(
            self.dir
                .join("pods")
                .join(format!("{}.json", file_name(&pod.namespace, &pod.name))),
        );
        self.pods.send_modify(|pods| {
            Arc::make_mut(pods).remove(key);
        });
        true
    }

    /// Forgets every CNI pod whose sandbox is not in `valid` (CNI `GC`); returns their
    /// keys. An empty entry of `valid` keeps nothing (a CNI record without a sandbox id
    /// goes). Enrolled pods have no sandbox id to match: they go with `DEL` or when
    /// discovery says they are not meshed.
    pub fn retain_sandboxes(&self, valid: &[String]) -> Vec<String> {
        let kept = |p: &CniPod| {
            p.source != PodSource::Cni
                || (!p.container_id.is_empty() && valid.contains(&p.container_id))
        };
        let stale: Vec<CniPod> = self.pods().values().filter(|p| !kept(p)).cloned().collect();
        // Each goes only if its record is still the one seen (an ADD in between wins).
        stale
            .into_iter()
            .filter(|p| self.remove_if(&p.key(), |now| now == p))
            .map(|p| p.key())
            .collect()
    }
}

#[cfg(test)]
mod tests;
