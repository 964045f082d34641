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

const CNI: &str = env!("CARGO_BIN_EXE_ambit-cni-e2e");

use ambit_e2e::cni::Cluster;
use ambit_e2e::images::files::image_files;
use ambit_e2e::images::mounts::{CgroupParent, SharedMount};
use ambit_e2e::images::run::{run_as_chart, Source};
use ambit_e2e::images::{get_in, images, rendered, until, Container};
use ambit_e2e::kube::{FakeKube, ResourceType};
use ambit_e2e::netns::Topology;
use ambit_proxy::netns::Netns;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

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
        ("kube-api-access", api_access("unused", "unused")),
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
    // No API server to ask (--network none): it cannot tell an uninstall from an update,
    // and the plugin stays.
    assert_eq!(c.stop(), 0, "SIGTERM ends it cleanly:\n{}", c.logs());
    assert!(chained().await.unwrap(), "{}", c.logs());
    assert!(
        c.logs().contains("cannot tell an uninstall from an update"),
        "{}",
        c.logs()
    );
}

/// The ServiceAccount volume the kubelet projects (what `automountServiceAccountToken`
/// would mount), with `token` and the API server's CA.
fn api_access(token: &str, ca_pem: &str) -> Source {
    Source::Files(vec![
        ("token", token.to_string()),
        ("ca.crt", ca_pem.to_string()),
        ("namespace", "ambit".to_string()),
    ])
}

/// Issue 26: `helm uninstall` leaves every node able to start pods. The chart's CNI
/// installer, run as the chart runs it against a node of the CNI cluster (the real
/// `bridge` chain) and a fake API server, asks when it stops whether its DaemonSet is
/// being deleted. Still there (a rolling update) or no answer (RBAC refuses it): the
/// plugin stays, and a meshed pod cannot start without its proxy (fail closed). Deleted
/// (helm's background deletion: 404) or being deleted (foreground: `deletionTimestamp`):
/// the plugin leaves the chain and the binary the node, and a pod ADD through the primary
/// CNI succeeds with no `ambit-cni` in the chain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_uninstall_takes_the_plugin_out_of_the_node_and_an_update_does_not() {
    let images = images();
    let chart = rendered();
    let cni = &chart["cni"];
    let cluster = Cluster::new("uninst", &["node-a", "node-b"], Path::new(CNI));
    let node = cluster.node("node-a");
    let kube = FakeKube::start().await;
    kube.register(ResourceType::new(
        "apps",
        "v1",
        "DaemonSet",
        "daemonsets",
        true,
    ));
    let daemonset = |deleting: bool| {
        let mut ds = json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "ambit-proxy", "namespace": "ambit"},
            "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "ambit-proxy"}}},
        });
        if deleting {
            ds["metadata"]["deletionTimestamp"] = json!("2026-12-07T06:00:00Z");
            ds["metadata"]["finalizers"] = json!(["foregroundDeletion"]);
        }
        ds
    };
    kube.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ambit"}}));
    kube.apply(daemonset(false));
    let args: Vec<String> = serde_json::from_value(cni["args"].clone()).unwrap();
    let socket = args[args.iter().position(|a| a == "--socket").unwrap() + 1].clone();
    let list = node.conf_dir.join("10-podnet.conflist");
    let ours = || -> Option<Value> {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&list).ok()?).ok()?;
        v["plugins"]
            .as_array()?
            .iter()
            .find(|p| p["type"] == "ambit-cni")
            .cloned()
    };
    let installed = || node.bin_dir.join("ambit-cni").exists();
    let port = kube.addr().port().to_string();
    let installer = || {
        let scratch = tempfile::tempdir().unwrap();
        let sources = BTreeMap::from([
            ("cni-bin", Source::Dir(node.bin_dir.clone())),
            ("cni-conf", Source::Dir(node.conf_dir.clone())),
            (
                "kube-api-access",
                api_access(kube.control_token(), kube.ca_pem()),
            ),
        ]);
        let env = [
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1".to_string()),
            ("KUBERNETES_SERVICE_PORT", port.clone()),
        ];
        let flags = ["--network".to_string(), "host".to_string()];
        let c = run_as_chart(&images, "cni", cni, sources, scratch.path(), &env, &flags);
        (c, scratch)
    };
    let chained_by_the_image = async |c: &Container| {
        let what = "the image's installer chained the plugin";
        until(c, what, Duration::from_secs(60), async || {
            Ok(ours().is_some_and(|p| p["socket"] == socket.as_str()) && installed())
        })
        .await;
    };

    // A rolling update: the DaemonSet is there when its pod stops.
    let (c, _scratch) = installer();
    chained_by_the_image(&c).await;
    assert_eq!(c.stop(), 0, "{}", c.logs());
    assert!(c.logs().contains("is still there"), "{}", c.logs());
    assert!(ours().is_some() && installed(), "{}", c.logs());
    let refused = cluster.add_pod("node-a", "shop", "web", 10).unwrap_err();
    assert!(
        refused.contains("ambit-cni ADD"),
        "a meshed pod waits for its proxy: {refused}"
    );

    // RBAC refuses the question: no answer, the plugin stays (fail closed).
    kube.forbid("daemonsets");
    let (c, _scratch) = installer();
    chained_by_the_image(&c).await;
    assert_eq!(c.stop(), 0, "{}", c.logs());
    let logs = c.logs();
    assert!(
        logs.contains("cannot tell an uninstall from an update") && logs.contains("403"),
        "{logs}"
    );
    assert!(ours().is_some() && installed(), "{logs}");
    kube.allow("daemonsets");

    // `helm uninstall --cascade foreground`: the DaemonSet is being deleted.
    let (c, _scratch) = installer();
    chained_by_the_image(&c).await;
    kube.apply(daemonset(true));
    assert_eq!(c.stop(), 0, "{}", c.logs());
    assert!(
        c.logs().contains("is being deleted (an uninstall)"),
        "{}",
        c.logs()
    );
    assert_eq!(ours(), None, "{}", c.logs());
    assert!(!installed(), "{}", c.logs());

    // `helm uninstall` (background deletion): the DaemonSet is gone when its pod stops.
    kube.apply(daemonset(false));
    let (c, _scratch) = installer();
    chained_by_the_image(&c).await;
    assert!(kube.delete("DaemonSet", "ambit", "ambit-proxy"));
    assert_eq!(c.stop(), 0, "{}", c.logs());
    assert!(c.logs().contains("is gone (an uninstall)"), "{}", c.logs());
    assert_eq!(ours(), None, "{}", c.logs());
    assert!(!installed(), "{}", c.logs());
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&list).unwrap()).unwrap();
    assert_eq!(v["plugins"].as_array().unwrap().len(), 1, "{v}");

    // The node starts pods again, through the primary CNI alone.
    let pod = cluster
        .add_pod("node-a", "shop", "web", 11)
        .unwrap_or_else(|e| panic!("a pod ADD after the uninstall: {e}"));
    assert_eq!(pod.results.len(), 1, "{:?}", pod.results);
    let ip = pod.results[0]["ips"][0]["address"].as_str().unwrap();
    assert!(ip.starts_with("10.78."), "{:?}", pod.results);
    cluster.del_pod(&pod).unwrap();
    // Each stop asked; the refused one asked twice.
    assert_eq!(kube.requests("get", "daemonsets"), 5);
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
