use super::*;
use ambit_api::proto::discovery as pb;
use std::os::unix::fs::symlink;

const A: &str = "4f5a2b1c-9d3e-4a7b-8c6d-0e1f2a3b4c5d";
const B: &str = "00000000-1111-4222-8333-444444444444";
const C: &str = "99999999-8888-4777-a666-555555555555";

/// Where a fake process's `ns/net` points.
enum Ns<'a> {
    /// This test process's own network namespace (the "host").
    Host,
    /// A file standing for a namespace of its own (shared by name).
    Own(&'a str),
}

/// Writes a fake `/proc/<pid>` with a `cgroup` file, a `stat` line with `start` as its
/// start time (and a command name with spaces and parentheses), and `ns/net`.
fn process(root: &Path, pid: u32, cgroup: &str, start: u64, ns: Ns<'_>) {
    let dir = root.join(pid.to_string());
    std::fs::create_dir_all(dir.join("ns")).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.join("cgroup"), cgroup).unwrap_or_else(|e| panic!("{e}"));
    let stat = format!("{pid} (odd (comm) x) S{} {start} 0 0\n", " 0".repeat(18));
    std::fs::write(dir.join("stat"), stat).unwrap_or_else(|e| panic!("{e}"));
    let target = match ns {
        Ns::Host => PathBuf::from("/proc/self/ns/net"),
        Ns::Own(name) => {
            let file = root.join(format!("netns-{name}"));
            if !file.exists() {
                std::fs::write(&file, name).unwrap_or_else(|e| panic!("{e}"));
            }
            file
        }
    };
    symlink(target, dir.join("ns/net")).unwrap_or_else(|e| panic!("{e}"));
}

fn fake_proc() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let r = root.path();
    let cgroupfs = |uid: &str| format!("0::/kubepods/besteffort/pod{uid}/ctr\n");
    process(r, 10, &cgroupfs(A), 500, Ns::Own("a"));
    // A later process of the same pod that made a netns of its own.
    process(r, 11, &cgroupfs(A), 900, Ns::Own("a2"));
    // An older one in the host's netns (as a hostNetwork pod's would be).
    process(r, 12, &cgroupfs(A), 100, Ns::Host);
    // Systemd naming on a v1 hybrid host.
    let b = B.replace('-', "_");
    let hybrid = format!(
        "12:pids:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{b}.slice/cri-containerd-1.scope\n\
         1:name=systemd:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{b}.slice/cri-containerd-1.scope\n\
         0::/\n"
    );
    process(r, 20, &hybrid, 300, Ns::Own("b"));
    // Pod C's process, with a cgroup below its own that claims to be pod B's, and older.
    let nested = format!("0::/kubepods/pod{C}/ctr/kubepods/besteffort/pod{B}/fake\n");
    process(r, 30, &nested, 1, Ns::Own("evil"));
    process(r, 40, "garbage\n\n:::\n", 1, Ns::Own("x"));
    std::fs::create_dir_all(r.join("41")).unwrap_or_else(|e| panic!("{e}"));
    for other in ["self", "sys", "net"] {
        std::fs::create_dir_all(r.join(other)).unwrap_or_else(|e| panic!("{e}"));
    }
    root
}

#[test]
fn a_scan_finds_each_pod_by_its_oldest_process_outside_the_host_netns() {
    let root = fake_proc();
    let wanted: HashSet<String> = [A, B].map(String::from).into();
    let host = procfs::host_netns(root.path());
    let scan = procfs::scan(root.path(), &wanted, &host).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(scan.processes, 7);
    assert!(!scan.truncated);
    let pid = |uid| scan.found.get(uid).map(|p| (p.pid, p.start_time));
    assert_eq!(pid(A), Some((10, 500)));
    assert_eq!(pid(B), Some((20, 300)));
    assert_eq!(scan.found.len(), 2);
    // The netns of the process found is the one its ns/net names.
    let a = NsId::of(&root.path().join("netns-a")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(scan.found.get(A).map(|p| p.netns), Some(a));
    // Nothing wanted, nothing found; a missing root is an error.
    let none = procfs::scan(root.path(), &HashSet::new(), &host).unwrap_or_else(|e| panic!("{e}"));
    assert!(none.found.is_empty());
    assert!(procfs::scan(&root.path().join("nope"), &wanted, &host).is_err());
}

fn workload(name: &str, uid: &str, meshed: bool) -> pb::Workload {
    pb::Workload {
        namespace: "shop".into(),
        name: name.into(),
        uid: uid.into(),
        node: "node-a".into(),
        ips: vec!["10.1.0.5".into()],
        identity: format!("spiffe://cluster.local/ns/shop/sa/{name}"),
        meshed,
        ..Default::default()
    }
}

fn metrics_text(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry)
        .unwrap_or_else(|e| panic!("{e}"));
    text
}

/// Runs as root: the registry bind-mounts a netns handle.
#[tokio::test]
async fn pods_not_found_or_unusable_are_counted_and_unmeshed_or_vanished_records_are_released() {
    let proc_root = fake_proc();
    let run = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let registry = PodRegistry::open(run.path()).unwrap_or_else(|e| panic!("{e}"));
    // A network namespace no process is in (made by a thread that leaves it at once).
    let empty_netns = || -> std::fs::File {
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                .unwrap_or_else(|e| panic!("{e}"));
            std::fs::File::open("/proc/thread-self/ns/net").unwrap_or_else(|e| panic!("{e}"))
        })
        .join()
        .unwrap_or_else(|_| panic!("unshare thread"))
    };
    let record_in = |name: &str, uid: &str, source: PodSource, ns: std::fs::File| {
        let pod = CniPod {
            namespace: "shop".into(),
            name: name.into(),
            uid: uid.into(),
            container_id: format!("sandbox-{name}"),
            ips: Vec::new(),
            netns: PathBuf::new(),
            source,
        };
        let kept = match source {
            PodSource::Proc => registry.enrol(pod, ns.into()).map(|p| p.is_some()),
            PodSource::Cni => registry.add(pod, ns.into()).map(|_| true),
        };
        assert!(kept.unwrap_or_else(|e| panic!("{e}")));
    };
    // The "host" netns: the fake /proc's pid 12 is in it.
    let host = || std::fs::File::open("/proc/self/ns/net").unwrap_or_else(|e| panic!("{e}"));
    let record = |name: &str, uid: &str, source: PodSource| record_in(name, uid, source, host());
    // Listed as not meshed: released, whatever brought it.
    record("old", C, PodSource::Proc);
    record("cni-old", C, PodSource::Cni);
    // Enrolled, then deleted while the proxy was away (no DEL seen), no process left in its
    // netns: released.
    record_in("gone", C, PodSource::Proc, empty_netns());
    // Enrolled, then replaced by a new pod of the same name, the old netns empty: released.
    record_in("replaced", C, PodSource::Proc, empty_netns());
    // Enrolled and no longer listed, but a process still runs in its netns (a partial
    // discovery, a force-deleted pod still running): kept, failing closed.
    record("unlisted-running", C, PodSource::Proc);
    // Handed over by CNI and not listed: kept for DEL or GC.
    record("cni-unlisted", C, PodSource::Cni);

    let local = pb::Workload {
        netns: "/run/netns/local".into(),
        ..workload("local", C, true)
    };
    let no_ip = pb::Workload {
        ips: Vec::new(),
        ..workload("pending", C, true)
    };
    let mut state = DiscoveryState::default();
    let invalid = state.apply(pb::Update {
        snapshot: true,
        workloads: vec![
            // Found, but its "netns" is a plain file: an error.
            workload("a", A, true),
            // No process with a cgroup of this pod.
            workload("b", "12345678-1234-4234-8234-123456789abc", true),
            // Not for enrolment: names its netns; no address yet; no UID; bad UID.
            local,
            no_ip,
            workload("no-uid", "", true),
            workload("bad-uid", "NOT-A-UID", true),
            workload("old", C, false),
            workload("cni-old", C, false),
            workload("replaced", "12345678-1234-4234-8234-000000000000", true),
        ],
        ..Default::default()
    });
    assert!(invalid.is_empty());
    let (_tx, rx) = watch::channel(Arc::new(state));
    let mut prom = Registry::default();
    let enroller = Enroller {
        registry: registry.clone(),
        state: rx,
        node: "node-a".into(),
        proc_root: proc_root.path().to_path_buf(),
        metrics: EnrolMetrics::register(&mut prom),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(enroller.run(async move {
        let _ = stopped.await;
    }));
    let want = [
        "pod_enrolments_total{result=\"error\"} 2",
        // b, and the pod that replaced "replaced".
        "pod_enrolments_total{result=\"not_found\"} 2",
        "pod_enrolment_releases_total 4",
        "pod_enrolment_scans_total 1",
    ];
    let mut text = String::new();
    for _ in 0..200 {
        text = metrics_text(&prom);
        if want.iter().all(|w| text.contains(w)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for w in want {
        assert!(text.contains(w), "{w}:\n{text}");
    }
    assert!(!text.contains("result=\"enrolled\""), "{text}");
    let kept: Vec<String> = registry.pods().keys().cloned().collect();
    assert_eq!(kept, ["shop/cni-unlisted", "shop/unlisted-running"]);
    assert!(registry.remove("shop", "cni-unlisted", None));
    assert!(registry.remove("shop", "unlisted-running", None));
    let _ = stop.send(());
    task.await.unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn the_wait_for_a_pod_doubles_up_to_the_limit() {
    let mut retries = HashMap::new();
    let waits: Vec<_> = (0..8).map(|_| backoff(&mut retries, "shop/a")).collect();
    assert_eq!(waits[0], RETRY_INITIAL);
    assert_eq!(waits[1], RETRY_INITIAL * 2);
    assert_eq!(waits[7], RETRY_MAX);
}
