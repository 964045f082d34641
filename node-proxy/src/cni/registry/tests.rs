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

/// Unmounts, on drop, the netns handles a test's registry made (also when it fails).
struct Handles(PathBuf);

impl Drop for Handles {
    fn drop(&mut self) {
        for e in std::fs::read_dir(self.0.join("netns"))
            .into_iter()
            .flatten()
            .flatten()
        {
            unmount(&e.path());
        }
    }
}

/// A network namespace of its own: a thread unshares one and hands back a descriptor
/// (the namespace goes when the last descriptor and mount of it do).
fn new_netns() -> OwnedFd {
    std::thread::spawn(|| {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
            .unwrap_or_else(|e| panic!("unshare (tests run as root): {e}"));
        OwnedFd::from(File::open("/proc/thread-self/ns/net").unwrap_or_else(|e| panic!("{e}")))
    })
    .join()
    .unwrap_or_else(|_| panic!("unshare thread"))
}

fn open(path: &str) -> OwnedFd {
    File::open(path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .into()
}

#[test]
fn only_a_network_namespace_is_taken_and_said_what_it_is_otherwise() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let file = dir.path().join("plain");
    let _ = std::fs::write(&file, b"");
    let (pipe, _w) = nix::unistd::pipe().unwrap_or_else(|e| panic!("{e}"));
    for (fd, what) in [
        (open(&file.to_string_lossy()), "a regular file"),
        (pipe, "a pipe"),
        (open("/proc/self/ns/mnt"), "a mount namespace"),
        (open("/proc/self/ns/uts"), "a UTS namespace"),
        (open("/proc/self"), "a directory"),
    ] {
        assert_eq!(netns_of(fd.as_fd()), Err(what.to_string()));
    }
    let here = netns_of(open("/proc/self/ns/net").as_fd());
    assert!(here.is_ok(), "{here:?}");
    // The same namespace by another path is the same id; another one is not.
    assert_eq!(here, netns_of(open("/proc/thread-self/ns/net").as_fd()));
    assert_ne!(here, netns_of(new_netns().as_fd()));

    // The registry takes nothing else either, and says so.
    let _handles = Handles(dir.path().into());
    let reg = PodRegistry::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let pod = CniPod {
        namespace: "shop".into(),
        name: "web".into(),
        uid: String::new(),
        container_id: "s1".into(),
        ips: Vec::new(),
        netns: PathBuf::new(),
        source: PodSource::Cni,
    };
    let e = reg
        .add(pod.clone(), open(&file.to_string_lossy()))
        .err()
        .unwrap_or_else(|| panic!("a regular file taken as a netns"));
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    assert_eq!(
        Refused::of(&e),
        Some(&Refused::NotNetns("a regular file".into()))
    );
    let e = reg.enrol(pod, open("/proc/self/ns/uts")).err();
    assert!(e.is_some_and(|e| Refused::of(&e).is_some()));
    assert!(reg.pods().is_empty());
    assert_eq!(
        std::fs::read_dir(dir.path().join("netns"))
            .map(Iterator::count)
            .unwrap_or(1),
        0
    );
}

#[test]
fn a_live_sandbox_keeps_its_netns_and_its_pod() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let _handles = Handles(dir.path().into());
    let reg = PodRegistry::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let pod = |name: &str, container_id: &str| CniPod {
        namespace: "shop".into(),
        name: name.into(),
        uid: String::new(),
        container_id: container_id.into(),
        ips: Vec::new(),
        netns: PathBuf::new(),
        source: PodSource::Cni,
    };
    let (a, b) = (new_netns(), new_netns());
    let dup = |fd: &OwnedFd| fd.try_clone().unwrap_or_else(|e| panic!("{e}"));
    let web = reg
        .add(pod("web", "s1"), dup(&a))
        .unwrap_or_else(|e| panic!("{e}"));
    let held = netns_at(&web.netns);
    assert_eq!(held, netns_of(a.as_fd()).ok());
    // Again, with the same namespace by another path (the proxy's own handle): the
    // same record.
    let again = reg.add(pod("web", "s1"), open(&web.netns.to_string_lossy()));
    assert_eq!(again.ok().as_ref(), Some(&web));
    // The same sandbox in another namespace: refused, nothing changed.
    let e = reg
        .add(pod("web", "s1"), dup(&b))
        .err()
        .unwrap_or_else(|| panic!("the sandbox moved"));
    assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
    assert!(
        matches!(Refused::of(&e), Some(Refused::OtherNetns { container_id, .. }) if container_id == "s1"),
        "{e}"
    );
    // The same sandbox for another pod: refused, whatever the namespace.
    for fd in [dup(&a), dup(&b)] {
        let e = reg.add(pod("api", "s1"), fd).err();
        let e = e.unwrap_or_else(|| panic!("sandbox s1 taken by another pod"));
        assert_eq!(
            Refused::of(&e),
            Some(&Refused::OtherPod {
                pod: "shop/api".into(),
                container_id: "s1".into(),
                owner: "shop/web".into(),
            })
        );
    }
    assert_eq!(reg.pods().len(), 1);
    assert_eq!(reg.pods().get("shop/web"), Some(&web));
    assert_eq!(netns_at(&web.netns), held);
    // A new sandbox of the pod replaces the old one (the runtime set it up again).
    let web2 = reg
        .add(pod("web", "s2"), dup(&b))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(netns_at(&web2.netns), netns_of(b.as_fd()).ok());
    assert!(!web.netns.exists());
    assert!(reg.remove("shop", "web", Some("s2")));
}

#[test]
fn an_empty_sandbox_id_matches_nothing() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let _handles = Handles(dir.path().into());
    let _ = PodRegistry::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    // A CNI record without a sandbox id (written before ids were checked).
    let pod = CniPod {
        namespace: "shop".into(),
        name: "blank".into(),
        uid: String::new(),
        container_id: String::new(),
        ips: Vec::new(),
        netns: PathBuf::from("/proc/self/ns/net"),
        source: PodSource::Cni,
    };
    let json = serde_json::to_vec(&pod).unwrap_or_default();
    let _ = std::fs::write(dir.path().join("pods/shop_blank.json"), json);
    let reg = PodRegistry::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let enrolled = reg
        .enrol(
            CniPod {
                name: "enrolled".into(),
                ..pod.clone()
            },
            open("/proc/self/ns/net"),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(enrolled.is_some());
    assert_eq!(reg.pods().len(), 2);
    for name in ["blank", "enrolled"] {
        assert_eq!(reg.sandbox("shop", name, ""), None, "{name}");
        assert!(!reg.remove("shop", name, Some("")), "{name}");
    }
    // An enrolled pod is named by any real sandbox id.
    assert!(reg.sandbox("shop", "enrolled", "s9").is_some());
    assert!(reg.sandbox("shop", "blank", "s9").is_none());
    assert_eq!(reg.pods().len(), 2);
    // GC: an empty entry keeps nothing; the record without a sandbox goes, the
    // enrolled pod stays (no sandbox to match it against).
    assert_eq!(
        reg.retain_sandboxes(&[String::new(), "s9".into()]),
        ["shop/blank"]
    );
    assert_eq!(reg.pods().keys().collect::<Vec<_>>(), ["shop/enrolled"]);
    assert!(reg.remove("shop", "enrolled", None));
}
