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
use std::os::fd::{AsRawFd, OwnedFd};
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

    /// The pods now.
    pub fn pods(&self) -> CniPods {
        self.pods.borrow().clone()
    }

    /// A receiver that sees every change.
    pub fn subscribe(&self) -> watch::Receiver<CniPods> {
        self.pods.subscribe()
    }

    /// Takes a pod on: keeps a handle on `netns` and records it. An `ADD` repeated for
    /// the same sandbox changes nothing; one for a new sandbox replaces the old one.
    pub fn add(&self, pod: CniPod, netns: OwnedFd) -> io::Result<CniPod> {
        let _write = self.write.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(old) = self.pods.borrow().get(&pod.key()) {
            if old.container_id == pod.container_id && is_netns(&old.netns) {
                return Ok(old.clone());
            }
        }
        self.insert(pod, netns)
    }

    /// Takes on a pod found running (enrolment), unless it has a record already: a CNI
    /// `ADD` that came first is the better word on the pod. `None` if it had one.
    pub fn enrol(&self, mut pod: CniPod, netns: OwnedFd) -> io::Result<Option<CniPod>> {
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

    /// Forgets a pod (`DEL`): releases its netns handle and its record. With a sandbox
    /// given, only that sandbox's entry goes — or an enrolled pod's, which has no sandbox
    /// id (the sandbox it ran in is the only one it had). Whether there was one.
    pub fn remove(&self, namespace: &str, name: &str, container_id: Option<&str>) -> bool {
        let _write = self.write.lock().unwrap_or_else(PoisonError::into_inner);
        let key = format!("{namespace}/{name}");
        let Some(pod) = self.pods.borrow().get(&key).cloned() else {
            return false;
        };
        let other_sandbox = container_id.is_some_and(|c| !c.is_empty() && c != pod.container_id);
        if other_sandbox && pod.source == PodSource::Cni {
            return false;
        }
        unmount(&pod.netns);
        let _ = std::fs::remove_file(
            self.dir
                .join("pods")
                .join(format!("{}.json", file_name(namespace, name))),
        );
        self.pods.send_modify(|pods| {
            Arc::make_mut(pods).remove(&key);
        });
        true
    }

    /// Forgets every CNI pod whose sandbox is not in `valid` (CNI `GC`); returns their
    /// keys. Enrolled pods have no sandbox id to match: they go with `DEL` or when
    /// discovery says they are not meshed.
    pub fn retain_sandboxes(&self, valid: &[String]) -> Vec<String> {
        let stale: Vec<CniPod> = self
            .pods()
            .values()
            .filter(|p| p.source == PodSource::Cni && !valid.contains(&p.container_id))
            .cloned()
            .collect();
        stale
            .into_iter()
            .filter(|p| self.remove(&p.namespace, &p.name, Some(&p.container_id)))
            .map(|p| p.key())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(dir: &Path, name: &str, netns: &Path) {
        let pod = CniPod {
            namespace: "shop".into(),
            name: name.into(),
            uid: String::new(),
            container_id: format!("sandbox-{name}"),
            ips: vec!["10.1.0.5".parse().unwrap_or(IpAddr::from([0, 0, 0, 0]))],
            netns: netns.to_path_buf(),
            source: PodSource::Cni,
        };
        let json = serde_json::to_vec(&pod).unwrap_or_default();
        let _ = std::fs::write(dir.join("pods").join(format!("shop_{name}.json")), json);
    }

    #[test]
    fn a_restart_restores_pods_whose_netns_is_mounted_and_forgets_the_others() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let _ = PodRegistry::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        // A real namespace file (this process's netns) and a plain file left behind.
        record(dir.path(), "alive", Path::new("/proc/self/ns/net"));
        let stale = dir.path().join("netns").join("shop_gone_x");
        let _ = std::fs::write(&stale, b"");
        record(dir.path(), "gone", &stale);
        let _ = std::fs::write(dir.path().join("pods").join("garbage.json"), b"{not json");

        let reg = PodRegistry::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        let pods = reg.pods();
        assert_eq!(pods.keys().collect::<Vec<_>>(), ["shop/alive"]);
        assert!(!dir.path().join("pods/shop_gone.json").exists());
        assert!(!dir.path().join("pods/garbage.json").exists());
        assert!(!stale.exists());
        // DEL of another sandbox, and GC listing this one, leave the pod alone.
        assert!(!reg.remove("shop", "alive", Some("another-sandbox")));
        assert!(!reg.remove("shop", "unknown", None));
        assert_eq!(
            reg.retain_sandboxes(&["sandbox-alive".into()]),
            Vec::<String>::new()
        );
        assert_eq!(reg.pods().len(), 1);
    }

    #[test]
    fn an_enrolled_pod_survives_gc_and_a_restart_yields_to_cni_and_goes_with_del() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let reg = PodRegistry::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        let netns = || -> OwnedFd {
            File::open("/proc/self/ns/net")
                .unwrap_or_else(|e| panic!("{e}"))
                .into()
        };
        let pod = |name: &str, container_id: &str| CniPod {
            namespace: "shop".into(),
            name: name.into(),
            uid: "0b9c0a4e-3f4c-4f8e-9a51-2b7d8c1e6f00".into(),
            container_id: container_id.into(),
            ips: Vec::new(),
            netns: PathBuf::new(),
            source: PodSource::Cni,
        };
        let enrolled = reg
            .enrol(pod("web", "ignored"), netns())
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("not enrolled"));
        assert_eq!(enrolled.source, PodSource::Proc);
        assert!(enrolled.container_id.is_empty());
        assert!(is_netns(&enrolled.netns), "{}", enrolled.netns.display());
        // A second enrolment, or one of a pod CNI handed over, changes nothing.
        assert!(matches!(reg.enrol(pod("web", ""), netns()), Ok(None)));
        // GC has no sandbox to match it against: it stays.
        assert!(reg.retain_sandboxes(&[]).is_empty());
        // A restart restores it as enrolled.
        let reg = PodRegistry::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(reg.pods().get("shop/web"), Some(&enrolled));
        // The DEL of its sandbox (whatever its id) releases it.
        assert!(reg.remove("shop", "web", Some("the-real-sandbox")));
        assert!(!enrolled.netns.exists());
        assert!(reg.pods().is_empty());
    }
}
