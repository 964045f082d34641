//! `ambit stat --kube` and `ambit edges --kube`, the real binary, against the fake API
//! server (`ambit_e2e::kube`): it lists the node proxy pods by the chart's label and
//! forwards pods/proxy to each pod's `podIP` and port — here 127.0.0.1 and the port of an
//! in-process admin server, given as the pod's `admin-http` container port. The admin
//! servers serve the recorded scrapes of `cli/src/stat/fixtures.rs`, so the rows are the
//! ones worked out by hand there; one test reads a real node proxy instead.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use ambit_e2e::kube::FakeKube;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const AMBIT: &str = env!("CARGO_BIN_EXE_ambit");

/// A recorded scrape of `cli/src/stat/fixtures.rs`: `A1`, `A2` (node a, 10 s apart), `B1`,
/// `B2` (node b).
fn recorded(name: &str) -> &'static str {
    const FIXTURES: &str = include_str!("../src/stat/fixtures.rs");
    let start = format!("pub const {name}: &str = r#\"");
    let at = FIXTURES.find(&start).unwrap() + start.len();
    &FIXTURES[at..at + FIXTURES[at..].find("\"#;").unwrap()]
}

/// A node proxy's admin server on 127.0.0.1 that answers `GET /metrics` with `first`, then
/// always with `then` (and anything else with 404); its address.
async fn admin_server(first: &'static str, then: &'static str) -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let served = served.clone();
            tokio::spawn(async move {
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let (status, body) = if req.starts_with(b"GET /metrics HTTP/1.1\r\n") {
                    let n = served.fetch_add(1, Ordering::SeqCst);
                    ("200 OK", if n == 0 { first } else { then })
                } else {
                    ("404 Not Found", "not found\n")
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(body.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

/// A port where nothing listens.
async fn closed_port() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap().port()
}

/// A pod of the chart's DaemonSet (or, with another `app`, of another workload) on `node`,
/// in `phase`, its admin port `port` on `ip`.
fn pod(ns: &str, name: &str, app: &str, node: &str, phase: &str, ip: &str, port: u16) -> Value {
    let mut status = json!({"phase": phase});
    if !ip.is_empty() {
        status["podIP"] = json!(ip);
    }
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": ns,
                        "labels": {"app.kubernetes.io/name": app,
                                   "app.kubernetes.io/instance": "ambit"}},
           "spec": {"nodeName": node, "containers": [
               {"name": "ambit-proxy", "image": "ambit-proxy",
                "ports": [{"name": "admin-http", "containerPort": port}]},
               {"name": "ambit-cni", "image": "ambit-cni"}]},
           "status": status})
}

fn namespace(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
}

/// Runs the binary: exit code, stdout, stderr.
async fn ambit(args: &[&str]) -> (i32, String, String) {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(AMBIT)
            .args(&args)
            .env_remove("RUST_BACKTRACE")
            .env_remove("KUBECONFIG")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stat_and_edges_read_the_node_proxy_pods_through_the_api_servers_pod_proxy() {
    let fake = FakeKube::start().await;
    let a = admin_server(recorded("A1"), recorded("A2")).await;
    let b = admin_server(recorded("B1"), recorded("B2")).await;
    let down = closed_port().await;
    fake.apply(namespace("ambit"));
    fake.apply(namespace("other"));
    let proxy = |name: &str, node: &str, phase: &str, port: u16| {
        pod("ambit", name, "ambit-proxy", node, phase, "127.0.0.1", port)
    };
    fake.apply(proxy("ambit-proxy-a", "node-a", "Running", a.port()));
    fake.apply(proxy("ambit-proxy-b", "node-b", "Running", b.port()));
    // Running, but its admin server does not answer: reported and skipped.
    fake.apply(proxy("ambit-proxy-c", "node-c", "Running", down));
    // Not scheduled yet: named, not asked.
    fake.apply(pod(
        "ambit",
        "ambit-proxy-d",
        "ambit-proxy",
        "",
        "Pending",
        "",
        4191,
    ));
    // Not the node proxies: another label, another namespace. Were they asked, their
    // address (TEST-NET) would not answer and the warnings would name them.
    fake.apply(pod(
        "ambit",
        "ambit-control-0",
        "ambit-control",
        "node-a",
        "Running",
        "192.0.2.1",
        4191,
    ));
    fake.apply(pod(
        "other",
        "ambit-proxy-x",
        "ambit-proxy",
        "node-a",
        "Running",
        "192.0.2.1",
        4191,
    ));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    fake.kubeconfig(&kubeconfig);

    let (code, out, err) = ambit(&[
        "stat",
        "deploy",
        "-o",
        "json",
        "-t",
        "300ms",
        "--kube",
        "--kubeconfig",
        path(&kubeconfig),
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    // The rows of the recording (cli/src/stat/tests.rs works them out): node a and b.
    let rows: Value = serde_json::from_str(&out).unwrap();
    let names: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["api", "load", "web"], "{out}");
    assert_eq!(rows[0]["requests"], 400.0);
    assert_eq!(rows[0]["success"], 0.99);
    assert_eq!(rows[0]["meshed_pods"], 2);
    assert_eq!(rows[2]["requests"], 200.0);
    assert_eq!(rows[2]["success"], 0.95);
    let warnings: Vec<&str> = err.lines().collect();
    assert_eq!(warnings.len(), 2, "{err}");
    assert_eq!(
        warnings[0],
        "skipping a node proxy: pod ambit/ambit-proxy-d (no node yet) is Pending, not Running; why: kubectl -n ambit describe pod ambit-proxy-d"
    );
    assert!(
        warnings[1].starts_with(&format!(
            "skipping a node proxy: pod ambit/ambit-proxy-c on node-c: the API server could not reach the pod's admin port {down} (503 Service Unavailable: error trying to reach service: dial tcp 127.0.0.1:{down}: connect: "
        )),
        "{err}"
    );
    assert!(
        warnings[1].ends_with(
            "is the node proxy running and ready (kubectl -n ambit logs -c ambit-proxy ambit-proxy-c)?"
        ),
        "{err}"
    );
    // One list; a, b and c scraped, then the two that answered.
    assert_eq!(fake.requests("list", "pods"), 1);
    let proxied: Vec<String> = fake
        .request_log()
        .into_iter()
        .filter(|r| r.resource == "pods/proxy")
        .map(|r| format!("{} {}", r.uri, r.status))
        .collect();
    assert_eq!(proxied.len(), 5, "{proxied:?}");
    assert!(proxied.contains(&format!(
        "/api/v1/namespaces/ambit/pods/ambit-proxy-a:{}/proxy/metrics 200",
        a.port()
    )));
    assert!(proxied.contains(&format!(
        "/api/v1/namespaces/ambit/pods/ambit-proxy-c:{down}/proxy/metrics 503"
    )));

    // edges: one scrape, the same source.
    let (code, out, err) = ambit(&[
        "edges",
        "pod",
        "-o",
        "json",
        "--kube",
        "--kubeconfig",
        path(&kubeconfig),
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    let edges: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(edges.as_array().unwrap().len(), 5, "{out}");
    assert_eq!(edges[4]["src"], "web-0");
    assert_eq!(edges[4]["dst"], "api-1");
    assert!(err.contains("ambit-proxy-c on node-c"), "{err}");

    // A namespace without node proxies: where to look.
    let (code, _, err) = ambit(&[
        "stat",
        "--kube",
        "--kubeconfig",
        path(&kubeconfig),
        "--proxy-namespace",
        "default",
    ])
    .await;
    assert_ne!(code, 0);
    assert!(
        err.contains("no pod labelled app.kubernetes.io/name=ambit-proxy in namespace default; is Ambit installed there"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_refused_with_what_to_check() {
    let fake = FakeKube::start().await;
    fake.apply(namespace("ambit"));
    let mut config = fake.kubeconfig_value();
    config["users"][0]["user"]["token"] = json!("not-the-token");
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, config.to_string()).unwrap();
    let (code, out, err) = ambit(&["stat", "--kube", "--kubeconfig", path(&kubeconfig)]).await;
    assert_ne!(code, 0);
    assert_eq!(out, "");
    assert!(
        err.contains(&format!(
            "listing the node proxy pods in namespace ambit at {}: the API server refused the credentials (401 Unauthorized); check the kubeconfig's user and token",
            fake.url()
        )),
        "{err}"
    );
    assert_eq!(fake.requests("list", "pods"), 1);
    assert_eq!(fake.requests("get", "pods/proxy"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_node_proxys_admin_server_is_read_through_the_pod_proxy() {
    // Its content type and every family it serves go through the fake's forwarding, the
    // kube client and the parser; its one pod has no netns here, so no traffic: no rows.
    let cluster = "---\napiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: shop}\n\
        spec: {nodeName: node-a, serviceAccountName: web, containers: []}\n\
        status: {podIP: 10.99.0.2, phase: Running}\n";
    let cp =
        ambit_e2e::ControlPlane::start(&format!("{}{cluster}", ambit_e2e::NAMESPACES), &["node-a"])
            .await;
    let node_proxy = ambit_e2e::NodeProxy::start(&cp, "node-a").await;
    let admin = node_proxy.admin_addr;
    let fake = FakeKube::start().await;
    fake.apply(namespace("ambit"));
    fake.apply(pod(
        "ambit",
        "ambit-proxy-a",
        "ambit-proxy",
        "node-a",
        "Running",
        &admin.ip().to_string(),
        admin.port(),
    ));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    fake.kubeconfig(&kubeconfig);
    let (code, out, err) = ambit(&[
        "stat",
        "-o",
        "json",
        "-t",
        "100ms",
        "--kube",
        "--kubeconfig",
        path(&kubeconfig),
    ])
    .await;
    assert_eq!((code, out.as_str(), err.as_str()), (0, "[]\n", ""));
    assert_eq!(fake.requests("get", "pods/proxy"), 2);
    node_proxy.stop().await;
    cp.stop().await;
}
