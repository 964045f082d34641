//! The chart's images, run as the chart runs them. `scripts/images.sh` builds them (with
//! podman, from the binaries built here: `scripts/test.sh` runs it first); each test
//! renders the chart with the real Helm library (`tests/helm/render.py`) and turns what a
//! kubelet would do with the container into `podman run` flags — the image, command and
//! args, env, user and group, `readOnlyRootFilesystem`, capabilities dropped and added,
//! `allowPrivilegeEscalation`, and every volume mount, with folders and files of the
//! test's own in place of the ConfigMaps, Secrets and host paths, owned and moded as the
//! kubelet makes them. So an image that lacks what its binary needs, a binary that cannot
//! read what the chart mounts as the user the chart runs it as, or a port the chart
//! exposes that nothing serves fails here. Run as root.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use ambit_e2e::netns::Topology;
use ambit_proxy::netns::Netns;
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// What `scripts/images.sh` built: each image's reference, and the flags podman needs
/// on this machine.
struct Images {
    refs: BTreeMap<String, String>,
    engine: Vec<String>,
}

fn images() -> Images {
    let file = root().join("target/images/images.json");
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| {
        panic!(
            "{}: {e}: build the images first with ./scripts/images.sh (./scripts/test.sh does)",
            file.display()
        )
    });
    let v: Value = serde_json::from_str(&text).unwrap();
    let refs = ["control", "proxy", "cni"]
        .iter()
        .map(|k| (k.to_string(), v[k].as_str().unwrap().to_string()))
        .collect();
    let engine = serde_json::from_value(v["engine"].clone()).unwrap();
    Images { refs, engine }
}

/// The chart as render.py prints it: `{"control"|"proxy"|"cni": {args, env, runtime}}`.
fn rendered() -> Value {
    let python = std::env::var_os("AMBIT_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/venv/bin/python"));
    let out = Command::new(&python)
        .arg("render.py")
        .current_dir(root().join("tests/helm"))
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}: run ./scripts/install-python-tools.sh",
                python.display()
            )
        });
    assert!(
        out.status.success(),
        "render.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn podman(args: &[String]) -> Output {
    Command::new("podman").args(args).output().unwrap()
}

/// A container of this test's, removed (by name) when dropped.
struct Container {
    name: String,
}

impl Container {
    fn logs(&self) -> String {
        let out = podman(&["logs".into(), self.name.clone()]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    fn state(&self, field: &str) -> String {
        let out = podman(&[
            "inspect".into(),
            "--format".into(),
            format!("{{{{.State.{field}}}}}"),
            self.name.clone(),
        ]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// `podman stop` (SIGTERM, as the kubelet ends a pod) and the exit code.
    fn stop(&self) -> i64 {
        let out = podman(&["stop".into(), "-t".into(), "20".into(), self.name.clone()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.state("ExitCode").parse().unwrap()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman(&[
            "rm".into(),
            "-f".into(),
            "-t".into(),
            "0".into(),
            self.name.clone(),
        ]);
    }
}

/// What a volume mount is backed by in this test: a folder of its own, with files in it
/// for a ConfigMap or Secret (written with the volume's mode), or a host folder.
enum Source {
    /// Files (name, content) of a ConfigMap or Secret.
    Files(Vec<(&'static str, String)>),
    /// A folder of the test's, in place of a hostPath.
    Dir(PathBuf),
}

/// Starts `image` as the chart runs `chart` (one of render.py's entries): its mounts
/// backed by `sources` (by volume name; every mount must have one), with `env` over the
/// chart's, `extra` flags (network, further mounts) and `args` after the chart's.
fn run_as_chart(
    images: &Images,
    image: &str,
    chart: &Value,
    sources: BTreeMap<&str, Source>,
    scratch: &Path,
    env: &[(&str, String)],
    extra: &[String],
) -> Container {
    let rt = &chart["runtime"];
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let name = format!("ambit-test-{}-{image}-{n}", std::process::id());
    let _ = podman(&["rm".into(), "-f".into(), name.clone()]);
    let mut flags: Vec<String> = vec!["run".into(), "-d".into(), "--name".into(), name.clone()];
    flags.extend(images.engine.iter().cloned());
    let uid = rt["user"].as_u64();
    let gid = rt["group"].as_u64().or(uid.map(|_| 0));
    if let Some(uid) = uid {
        flags.extend(["--user".into(), format!("{uid}:{}", gid.unwrap())]);
    }
    if let Some(fs_group) = rt["fsGroup"].as_u64() {
        flags.extend(["--group-add".into(), fs_group.to_string()]);
    }
    if rt["readOnlyRootFilesystem"] == true {
        flags.push("--read-only".into());
    }
    if rt["privileged"] == true {
        flags.push("--privileged".into());
    }
    if rt["allowPrivilegeEscalation"] == false {
        flags.extend(["--security-opt".into(), "no-new-privileges".into()]);
    }
    for cap in rt["capabilities"]["drop"].as_array().unwrap() {
        flags.extend(["--cap-drop".into(), cap.as_str().unwrap().into()]);
    }
    for cap in rt["capabilities"]["add"].as_array().unwrap() {
        flags.extend(["--cap-add".into(), cap.as_str().unwrap().into()]);
    }
    let mut sources = sources;
    for m in rt["mounts"].as_array().unwrap() {
        let volume = m["name"].as_str().unwrap();
        let source = sources.remove(volume).unwrap_or_else(|| {
            panic!("the chart mounts volume {volume}: the test has no source for it")
        });
        let host = match source {
            Source::Dir(d) => d,
            Source::Files(files) => kubelet_volume(scratch, volume, m, rt, &files),
        };
        let mut opts = Vec::new();
        if m["readOnly"] == true {
            opts.push("ro");
        }
        if m["propagation"] == "Bidirectional" {
            opts.push("rshared");
        }
        let opts = if opts.is_empty() {
            String::new()
        } else {
            format!(":{}", opts.join(","))
        };
        flags.extend([
            "-v".into(),
            format!(
                "{}:{}{opts}",
                host.display(),
                m["mountPath"].as_str().unwrap()
            ),
        ]);
    }
    assert!(
        sources.is_empty(),
        "volumes the chart does not mount: {:?}",
        sources.keys().collect::<Vec<_>>()
    );
    let mut vars: BTreeMap<String, String> = chart["env"]
        .as_object()
        .unwrap()
        .iter()
        .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
        .collect();
    vars.extend(env.iter().map(|(k, v)| (k.to_string(), v.clone())));
    for (k, v) in vars {
        flags.extend(["-e".into(), format!("{k}={v}")]);
    }
    flags.extend(extra.iter().cloned());
    // Kubernetes' `command` replaces the image's ENTRYPOINT; `args` follow it.
    if let Some(command) = rt["command"].as_array() {
        let command: Vec<&str> = command.iter().map(|c| c.as_str().unwrap()).collect();
        flags.extend([
            "--entrypoint".into(),
            serde_json::to_string(&command).unwrap(),
        ]);
    }
    flags.push(images.refs[image].clone());
    let args: Vec<String> = serde_json::from_value(chart["args"].clone()).unwrap();
    flags.extend(args);
    let out = podman(&flags);
    assert!(
        out.status.success(),
        "podman {flags:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Container { name }
}

/// A ConfigMap or Secret volume as the kubelet writes it: files owned by root, with the
/// volume's `defaultMode`; with the pod's `fsGroup`, group-owned by it and group-readable.
fn kubelet_volume(
    scratch: &Path,
    volume: &str,
    mount: &Value,
    rt: &Value,
    files: &[(&str, String)],
) -> PathBuf {
    let dir = scratch.join(format!("volume-{volume}"));
    std::fs::create_dir_all(&dir).unwrap();
    let fs_group = rt["fsGroup"].as_u64().map(|g| g as u32);
    let mut mode = mount["defaultMode"].as_u64().unwrap_or(0o644) as u32;
    if fs_group.is_some() {
        mode |= 0o440;
    }
    for (name, content) in files {
        let path = dir.join(name);
        std::fs::write(&path, content).unwrap();
        std::os::unix::fs::chown(&path, Some(0), Some(fs_group.unwrap_or(0))).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    std::os::unix::fs::chown(&dir, Some(0), Some(fs_group.unwrap_or(0))).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// An HTTP/1.1 GET inside `netns`; the status code, or why there is none.
async fn get_in(netns: &Netns, addr: SocketAddr, path: &str) -> Result<u16, String> {
    let mut s = tokio::time::timeout(Duration::from_secs(2), netns.connect(addr, 0))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| e.to_string())?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: ambit\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut answer))
        .await
        .map_err(|_| "no answer".to_string())?
        .map_err(|e| e.to_string())?;
    answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or(format!("not HTTP: {answer:?}"))
}

/// Polls `f` until it is true (at most `within`), else fails with the container's logs.
async fn until(
    c: &Container,
    what: &str,
    within: Duration,
    mut f: impl AsyncFnMut() -> Result<bool, String>,
) {
    let deadline = Instant::now() + within;
    loop {
        let last = f().await;
        if last == Ok(true) {
            return;
        }
        assert!(
            c.state("Running") == "true" || last.is_ok(),
            "{what}: the container exited ({}): {last:?}\n{}",
            c.state("ExitCode"),
            c.logs()
        );
        assert!(
            Instant::now() < deadline,
            "{what}: not within {within:?}: {last:?}\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_image_serves_as_the_chart_runs_it() {
    let images = images();
    let chart = rendered();
    let control = &chart["control"];
    let env = |k: &str| control["env"][k].as_str().unwrap().to_string();
    let scratch = tempfile::tempdir().unwrap();
    let (root_ca, issuer) = ambit_e2e::test_pki();

    // The chart's mounts hold what it names (AMBIT_TRUST_ANCHORS, AMBIT_ISSUER_*); the
    // file names are the chart's.
    let file_in = |var: &str| {
        let p = PathBuf::from(env(var));
        p.file_name().unwrap().to_str().unwrap().to_string()
    };
    let (anchors, cert, key) = (
        file_in("AMBIT_TRUST_ANCHORS"),
        file_in("AMBIT_ISSUER_CERT"),
        file_in("AMBIT_ISSUER_KEY"),
    );
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    let sources = BTreeMap::from([
        (
            "trust-roots",
            Source::Files(vec![(leak(anchors), root_ca.cert_pem.clone())]),
        ),
        (
            "issuer",
            Source::Files(vec![
                (leak(cert), issuer.cert_pem.clone()),
                (leak(key), issuer.key_pem.clone()),
            ]),
        ),
    ]);
    // Not the chart's: the kube backend needs an API server, so this control plane reads
    // the same objects from a folder (the local backend), mounted read-only beside.
    let local = scratch.path().join("local");
    std::fs::create_dir_all(local.join("cluster")).unwrap();
    std::fs::write(local.join("cluster/cluster.yaml"), ambit_e2e::NAMESPACES).unwrap();
    std::fs::write(
        local.join("tokens.yaml"),
        format!("nodes:\n  node-a: {}\n", ambit_e2e::node_token("node-a")),
    )
    .unwrap();
    for f in ["", "cluster", "cluster/cluster.yaml", "tokens.yaml"] {
        let p = local.join(f);
        let mode = if p.is_dir() { 0o755 } else { 0o644 };
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();

    // Its own network namespace (the pod's): the chart's addresses, 0.0.0.0 and its ports.
    let t = Topology::new(&["control"]);
    let pod = t.pod("control");
    let c = run_as_chart(
        &images,
        "control",
        control,
        sources,
        scratch.path(),
        &[
            ("AMBIT_BACKEND", "local".into()),
            ("AMBIT_LOCAL_DIR", "/var/lib/ambit-local/cluster".into()),
            (
                "AMBIT_NODE_TOKENS",
                "/var/lib/ambit-local/tokens.yaml".into(),
            ),
        ],
        &[
            "--network".into(),
            format!("ns:{}", pod.path()),
            "-v".into(),
            format!("{}:/var/lib/ambit-local:ro", local.display()),
        ],
    );
    let netns = Netns::open(Path::new(&pod.path())).unwrap();
    let admin = SocketAddr::from(([127, 0, 0, 1], 9990));
    until(&c, "/ready", Duration::from_secs(60), async || {
        get_in(&netns, admin, "/ready")
            .await
            .map(|code| code == 200)
    })
    .await;
    // Every port the chart exposes is served, on the pod's address.
    for port in control["runtime"]["ports"].as_array().unwrap() {
        let addr = SocketAddr::from((pod.ip, port.as_u64().unwrap() as u16));
        netns
            .connect(addr, 0)
            .await
            .unwrap_or_else(|e| panic!("the chart's port {addr}: {e}\n{}", c.logs()));
    }
    assert_eq!(get_in(&netns, admin, "/live").await, Ok(200));
    assert_eq!(c.stop(), 0, "SIGTERM ends it cleanly:\n{}", c.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cni_image_installs_and_rechains_the_plugin_as_the_chart_runs_it() {
    let images = images();
    let chart = rendered();
    let cni = &chart["cni"];
    let scratch = tempfile::tempdir().unwrap();
    let (bin, conf) = (scratch.path().join("bin"), scratch.path().join("net.d"));
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&conf).unwrap();
    let primary = r#"{"cniVersion": "1.0.0", "name": "k8s", "plugins": [{"type": "bridge"}]}"#;
    let list = conf.join("10-bridge.conflist");
    std::fs::write(&list, primary).unwrap();
    let sources = BTreeMap::from([
        ("cni-bin", Source::Dir(bin.clone())),
        ("cni-conf", Source::Dir(conf.clone())),
    ]);
    let c = run_as_chart(
        &images,
        "cni",
        cni,
        sources,
        scratch.path(),
        &[],
        &["--network".into(), "none".into()],
    );
    let chained = async || -> Result<bool, String> {
        let text = std::fs::read_to_string(&list).map_err(|e| e.to_string())?;
        let v: Value = serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))?;
        Ok(v["plugins"][1]["type"] == "ambit-cni" && bin.join("ambit-cni").is_file())
    };
    until(
        &c,
        "the plugin chained and installed",
        Duration::from_secs(60),
        chained,
    )
    .await;
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&list).unwrap()).unwrap();
    let args: Vec<String> = serde_json::from_value(cni["args"].clone()).unwrap();
    let socket = &args[args.iter().position(|a| a == "--socket").unwrap() + 1];
    assert_eq!(v["plugins"][1]["socket"], socket.as_str(), "{v}");
    // The binary it copied out of the image runs on the host, as the runtime runs it.
    let out = Command::new(bin.join("ambit-cni"))
        .env("CNI_COMMAND", "VERSION")
        .output()
        .unwrap();
    let versions: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert!(
        versions["supportedVersions"].as_array().is_some(),
        "{versions}"
    );

    // The primary CNI rewrites its conflist: the installer (--watch) chains it again.
    std::fs::write(&list, primary).unwrap();
    until(
        &c,
        "chained again after a rewrite",
        Duration::from_secs(60),
        chained,
    )
    .await;
    assert_eq!(c.stop(), 0, "SIGTERM ends it cleanly:\n{}", c.logs());
}

/// A folder of the test's made a mount point of its own with shared propagation (a bind
/// of itself, or a new bpffs instance), so that what a container mounts under it with
/// the chart's `mountPropagation: Bidirectional` reaches the host as it does on a node;
/// lazily unmounted, with everything under it, when dropped.
struct SharedMount(PathBuf);

impl SharedMount {
    fn new(dir: &Path, fstype: Option<&str>) -> Self {
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
struct CgroupParent(PathBuf);

impl CgroupParent {
    /// `cgroup`'s path in the cgroup2 hierarchy, as `--cgroup-parent` takes it.
    fn relative(cgroup: &Path) -> String {
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
fn remove_cgroup_tree(dir: &Path) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup_tree(&e.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}

const WEB_ID: &str = "spiffe://cluster.local/ns/shop/sa/web";
const CLI_ID: &str = "spiffe://cluster.local/ns/shop/sa/cli";

/// `cli` on node-a calls the Service `web`, whose pod is on node-b; `web_ip` is `None`
/// until the kubelet reports it (after CNI ADD).
fn mesh_cluster(web_ip: Option<&str>) -> String {
    let web_status = web_ip
        .map(|ip| format!("status: {{podIP: {ip}, phase: Running}}"))
        .unwrap_or_else(|| "status: {phase: Pending}".into());
    format!(
        r#"{}---
apiVersion: v1
kind: Pod
metadata: {{name: cli, namespace: shop}}
spec: {{nodeName: node-a, serviceAccountName: cli, containers: []}}
status: {{podIP: 10.78.1.10, phase: Running}}
---
apiVersion: v1
kind: Pod
metadata: {{name: web, namespace: shop}}
spec: {{nodeName: node-b, serviceAccountName: web, containers: []}}
{web_status}
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: shop}}
spec: {{clusterIP: 10.96.0.10, ports: [{{name: http, port: 80}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: web-1, namespace: shop, labels: {{kubernetes.io/service-name: web}}}}
addressType: IPv4
ports: [{{name: http, port: 8080}}]
endpoints: [{{addresses: [10.78.2.10], targetRef: {{kind: Pod, name: web, namespace: shop}}}}]
"#,
        ambit_e2e::NAMESPACES
    )
}

/// A free loopback port (bound and released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_image_runs_a_node_of_the_mesh_as_the_chart_runs_it() {
    // The chart's `redirect: auto`: eBPF here (the programs are in the binary).
    proxy_node(None, "ebpf").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_image_redirects_with_its_own_nft() {
    // `proxy.redirect: nftables`: the image's nft (with JSON), on the image's PATH.
    proxy_node(Some("nftables"), "nftables").await;
}

/// Two nodes, node-b's proxy the image run as the chart runs it with `redirect` (the
/// chart's when `None`), which must end up as `mode`: a request through the mesh, the
/// pod's sandbox and pins on the node, a clean SIGTERM, fail closed while it is gone, a
/// new pod of it serving the node's pods again without a new ADD.
async fn proxy_node(redirect: Option<&str>, mode: &str) {
    use ambit_e2e::cni::Cluster;
    use ambit_e2e::{http_get, http_server, metric_sum, ControlPlane, NodeProxy};
    use std::sync::Arc;

    let images = images();
    let chart = rendered();
    let proxy = &chart["proxy"];
    // Two nodes wired by the real CNI plugins with ambit-cni chained (tests/src/cni.rs):
    // node-a's proxy runs in this process, node-b's is the image.
    let cni = Path::new(env!("CARGO_BIN_EXE_ambit-cni-e2e"));
    let c = Arc::new(Cluster::new(
        &format!("img{mode}"),
        &["node-a", "node-b"],
        cni,
    ));
    let cp = ControlPlane::start(&mesh_cluster(None), &["node-a", "node-b"]).await;
    let a = NodeProxy::start_config(
        c.node("node-a")
            .proxy_config(&cp, ambit_proxy::proxy::Redirect::Nftables),
    )
    .await;

    // node-b as the DaemonSet's pod has it: the hostPath volumes are the test node's own.
    // The run directory and bpffs are shared mounts (Bidirectional in the chart), the
    // bpffs a new instance of the test's, so that the chart's pin path
    // (/sys/fs/bpf/ambit) is the test's alone; the chart's host cgroup root is the test
    // node's cgroup (never the machine's root cgroup).
    let node_b = c.node("node-b");
    let scratch = tempfile::tempdir().unwrap();
    let run = SharedMount::new(&node_b.run_dir, None);
    let bpffs = SharedMount::new(&scratch.path().join("bpffs"), Some("bpf"));
    // The chart's CNI socket is in its run directory; the installer chained the plugin
    // with the node's socket path: the same file.
    let socket_in_image = PathBuf::from(proxy["env"]["AMBIT_CNI_SOCKET"].as_str().unwrap());
    let run_in_image = PathBuf::from(proxy["env"]["AMBIT_RUN_DIR"].as_str().unwrap());
    let socket_on_node = run
        .0
        .join(socket_in_image.strip_prefix(&run_in_image).unwrap());
    std::os::unix::fs::symlink(&socket_on_node, &node_b.socket).unwrap();
    let file_of = |var: &str| -> &'static str {
        let p = PathBuf::from(proxy["env"][var].as_str().unwrap());
        Box::leak(
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .to_string()
                .into_boxed_str(),
        )
    };
    let sources = || {
        BTreeMap::from([
            ("run", Source::Dir(run.0.clone())),
            ("bpffs", Source::Dir(bpffs.0.clone())),
            ("cgroup", Source::Dir(node_b.cgroup.clone())),
            ("host-proc", Source::Dir("/proc".into())),
            (
                "token",
                Source::Files(vec![(
                    file_of("AMBIT_TOKEN_FILE"),
                    ambit_e2e::node_token("node-b"),
                )]),
            ),
            (
                "trust-roots",
                Source::Files(vec![(
                    file_of("AMBIT_TRUST_ANCHORS"),
                    cp.root.cert_pem.clone(),
                )]),
            ),
        ])
    };
    // Not the chart's: the node name (a fieldRef), the control plane's addresses (this
    // test's, on loopback, in place of the Service) and the admin port (a free one of
    // loopback: the container shares this test's network namespace, as the in-process
    // node-a does, which is where the control plane is).
    let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut env = vec![
        ("AMBIT_NODE_NAME", "node-b".to_string()),
        ("AMBIT_IDENTITY_URL", cp.identity_url()),
        ("AMBIT_DISCOVERY_URL", cp.discovery_url()),
        ("AMBIT_POLICY_URL", cp.policy_url()),
        ("AMBIT_ADMIN_ADDR", admin.to_string()),
    ];
    env.extend(redirect.map(|r| ("AMBIT_REDIRECT", r.to_string())));
    // The proxy's pod runs under the node's cgroup, as a kubelet's pods run under the
    // root cgroup the chart mounts: its own sockets meet the programs it attaches there
    // (and skip them by its mark and cgroup).
    let _parents = CgroupParent(node_b.cgroup.clone());
    let parent = CgroupParent::relative(&node_b.cgroup);
    let start = |scratch: &Path| {
        run_as_chart(
            &images,
            "proxy",
            proxy,
            sources(),
            scratch,
            &env,
            &[
                "--network".into(),
                "host".into(),
                "--cgroup-parent".into(),
                parent.clone(),
            ],
        )
    };
    let b = start(scratch.path());
    until(&b, "node-b's /ready", Duration::from_secs(60), async || {
        Ok(http_get(admin, "/ready").await.0 == 200)
    })
    .await;

    // The pods arrive through CNI ADD: node-b's through the image's socket.
    let web = {
        let c = c.clone();
        tokio::task::spawn_blocking(move || c.add_pod("node-b", "shop", "web", 10))
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("CNI ADD through the image's socket: {e}\n{}", b.logs()))
    };
    let cli = c.add("node-a", "shop", "cli", 10).await;
    cp.set_cluster(&mesh_cluster(Some("10.78.2.10")));
    let web_ns = Netns::open(Path::new(&web.path())).unwrap();
    let seen = http_server(&web_ns, 8080, "hello from web").await;

    let mesh_requests = |m: &str| {
        metric_sum(
            m,
            "response_total",
            &[
                &format!("server_id=\"{WEB_ID}\""),
                "tls=\"true\"",
                "status_code=\"200\"",
            ],
        )
    };
    let through_mesh = async |url: &str| {
        let mut got = Err(String::new());
        for _ in 0..100 {
            let before = mesh_requests(&a.metrics().await);
            got = c.curl_async(&cli, url).await;
            if matches!(&got, Ok((200, _))) && mesh_requests(&a.metrics().await) > before {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        got
    };
    for url in ["http://10.96.0.10/", "http://10.78.2.10:8080/"] {
        assert_eq!(
            through_mesh(url).await,
            Ok((200, "hello from web".into())),
            "{url}\n{}",
            b.logs()
        );
    }
    // web saw its own (in-pod) proxy; the image's proxy terminated mTLS from cli.
    assert!(
        seen.lock()
            .unwrap()
            .iter()
            .all(|p| p.ip() == std::net::IpAddr::V4(web.ip)),
        "{seen:?}"
    );
    let mb = http_get(admin, "/metrics").await.1;
    let inbound = [
        "direction=\"inbound\"",
        "pod=\"web\"",
        &format!("client_id=\"{CLI_ID}\""),
        "tls=\"true\"",
    ];
    assert!(metric_sum(&mb, "request_total", &inbound) >= 2, "{mb}");
    assert!(
        mb.contains("cni_requests_total{command=\"add\",result=\"redirected\"} 1"),
        "{mb}"
    );
    let dump: Value = serde_json::from_str(&http_get(admin, "/config_dump").await.1).unwrap();
    assert_eq!(dump["redirect_mode"], mode, "{dump}\n{}", b.logs());
    assert_eq!(
        dump["pods"][0]["cni_sandbox"],
        web.container_id.as_str(),
        "{dump}"
    );
    // eBPF: pinned in the chart's pin directory, on the node's bpffs.
    let pin_dir = PathBuf::from(proxy["env"]["AMBIT_BPF_PIN_DIR"].as_str().unwrap());
    let pins = bpffs.0.join(pin_dir.strip_prefix("/sys/fs/bpf").unwrap());
    assert_eq!(
        std::fs::read_dir(pins.join("links")).is_ok_and(|mut d| d.next().is_some()),
        mode == "ebpf",
        "links pinned under {}",
        pins.display()
    );
    // The pod's netns handle, mounted by the proxy inside its container, is a mount of
    // the node's (Bidirectional): what a restarted proxy finds its pods by.
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let handles = run.0.join("netns");
    assert!(
        mountinfo.contains(&format!(" {}/", handles.display())),
        "no netns handle of the image's proxy under {} on the node",
        handles.display()
    );

    // The kubelet ends the pod (SIGTERM): it drains and exits 0; web is then reached
    // neither through the mesh nor around it.
    assert_eq!(b.stop(), 0, "SIGTERM ends it cleanly:\n{}", b.logs());
    drop(b);
    let reached = seen.lock().unwrap().len();
    let out = c.curl_async(&cli, "http://10.78.2.10:8080/").await;
    assert!(!matches!(out, Ok((200, _))), "{out:?}");
    assert_eq!(
        seen.lock().unwrap().len(),
        reached,
        "web reached around its proxy"
    );

    // The DaemonSet starts a new pod: from the node's run directory and pins it serves
    // web again, with no new ADD.
    let scratch2 = tempfile::tempdir().unwrap();
    let b = start(scratch2.path());
    until(
        &b,
        "node-b's /ready again",
        Duration::from_secs(60),
        async || Ok(http_get(admin, "/ready").await.0 == 200),
    )
    .await;
    assert_eq!(
        through_mesh("http://10.96.0.10/").await,
        Ok((200, "hello from web".into())),
        "{}",
        b.logs()
    );
    let mb = http_get(admin, "/metrics").await.1;
    assert!(!mb.contains("cni_requests_total{command=\"add\""), "{mb}");

    c.del_all(&[&web, &cli]).await;
    assert_eq!(b.stop(), 0, "SIGTERM ends it cleanly:\n{}", b.logs());
    drop(b);
    a.stop().await;
    cp.stop().await;
}

/// An image's files (paths without a leading `/`, directories with a trailing one) and one
/// file's text, read from `podman export` of a container made (not started) from it.
struct ImageFiles {
    files: Vec<String>,
    passwd: String,
    path: Vec<String>,
    entrypoint: Vec<String>,
}

fn image_files(images: &Images, image: &str) -> ImageFiles {
    let reference = &images.refs[image];
    let mut create = vec!["create".to_string()];
    create.extend(images.engine.iter().cloned());
    create.push(reference.clone());
    let out = podman(&create);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("image.tar");
    let exported = podman(&[
        "export".into(),
        "-o".into(),
        archive.display().to_string(),
        id.clone(),
    ]);
    let _ = podman(&["rm".into(), "-f".into(), id]);
    assert!(
        exported.status.success(),
        "{}",
        String::from_utf8_lossy(&exported.stderr)
    );
    let tar = |args: &[&str]| {
        let out = Command::new("tar")
            .args(args)
            .arg("-f")
            .arg(&archive)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let files = tar(&["-t"])
        .lines()
        .map(|l| l.trim_start_matches("./").to_string())
        .collect();
    let passwd = tar(&["-xO", "etc/passwd"]);
    let inspect = podman(&[
        "image".into(),
        "inspect".into(),
        "--format".into(),
        "{{json .Config}}".into(),
        reference.clone(),
    ]);
    let config: Value = serde_json::from_slice(&inspect.stdout).unwrap();
    let path = config["Env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e.as_str()?.strip_prefix("PATH="))
        .flat_map(|p| p.split(':').map(str::to_string))
        .collect();
    let entrypoint = serde_json::from_value(config["Entrypoint"].clone()).unwrap();
    ImageFiles {
        files,
        passwd,
        path,
        entrypoint,
    }
}

impl ImageFiles {
    fn has(&self, path: &str) -> bool {
        let p = path.trim_start_matches('/');
        self.files.iter().any(|f| f == p)
    }

    /// Where `name` resolves: itself when absolute, else the first match on the image's PATH.
    fn which(&self, name: &str) -> Option<String> {
        if name.starts_with('/') {
            return self.has(name).then(|| name.to_string());
        }
        self.path
            .iter()
            .map(|dir| format!("{}/{name}", dir.trim_end_matches('/')))
            .find(|p| self.has(p))
    }
}

/// The chart and the Dockerfile cannot drift apart: what the chart runs is in the image,
/// what it runs as is a user of the image, and no mount hides a file of the image.
#[test]
fn the_images_hold_what_the_chart_names() {
    let images = images();
    let chart = rendered();
    for image in ["control", "proxy", "cni"] {
        let rt = &chart[image]["runtime"];
        let files = image_files(&images, image);
        // The chart's command, or else the image's ENTRYPOINT, is a file of the image.
        let command: Vec<String> = match rt["command"].as_array() {
            Some(c) => c.iter().map(|s| s.as_str().unwrap().to_string()).collect(),
            None => files.entrypoint.clone(),
        };
        assert!(
            files.which(&command[0]).is_some(),
            "{image}: {} is not in the image (PATH {:?})",
            command[0],
            files.path
        );
        // What the binary runs: the proxy's nftables redirection runs `nft -j`.
        if image == "proxy" {
            assert!(
                files.which("nft").is_some(),
                "proxy: no nft on the image's PATH {:?}",
                files.path
            );
        }
        // No shell, no package manager.
        for tool in ["sh", "bash", "apt-get", "dpkg"] {
            assert!(files.which(tool).is_none(), "{image}: the image has {tool}");
        }
        // A non-root user of the chart's is one the image knows (its files are owned so).
        if let Some(uid) = rt["user"].as_u64().filter(|u| *u != 0) {
            assert!(
                files
                    .passwd
                    .lines()
                    .any(|l| l.split(':').nth(2) == Some(&uid.to_string())),
                "{image}: the chart runs it as {uid}, not in the image's /etc/passwd:\n{}",
                files.passwd
            );
        }
        // A mount hides what the image has at its path.
        for m in rt["mounts"].as_array().unwrap() {
            let at = m["mountPath"]
                .as_str()
                .unwrap()
                .trim_start_matches('/')
                .trim_end_matches('/');
            let hidden: Vec<&String> = files
                .files
                .iter()
                .filter(|f| f.starts_with(&format!("{at}/")) && !f.ends_with('/'))
                .collect();
            assert!(
                hidden.is_empty(),
                "{image}: the chart's mount {at} hides the image's {hidden:?}"
            );
        }
    }
}
