//! Enrolment end to end: a pod that already runs in a namespace that is not meshed is
//! meshed when the namespace is annotated — without a CNI ADD, its network namespace found
//! from `/proc` by the pod UID in its container's cgroup — and un-meshed when the
//! annotation goes. Two nodes wired by the real CNI plugins chained with `ambit-cni` (as
//! `redirection.rs`), one node proxy each, the real `/proc`; the pod's container is a
//! `sleep` in its netns and in `<node cgroup>/kubepods/besteffort/pod<uid>/<container>`.
//! The same scenario runs with eBPF and with nftables redirection. Run as root.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use ambit_e2e::cni::{Cluster, CniPod};
use ambit_e2e::{http_get, http_server, metric_sum, ControlPlane, NodeProxy, Peers, NAMESPACES};
use ambit_proxy::netns::Netns;
use ambit_proxy::proxy::Redirect;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const CNI: &str = env!("CARGO_BIN_EXE_ambit-cni-e2e");
const CLI_ID: &str = "spiffe://cluster.local/ns/shop/sa/cli";
const WEB_ID: &str = "spiffe://cluster.local/ns/late/sa/web";
const WEB_IP: [u8; 4] = [10, 78, 2, 10];
const CLI_IP: [u8; 4] = [10, 78, 1, 10];
const OLD_IP: [u8; 4] = [10, 78, 1, 20];

/// The cluster, with namespace `late` annotated or not. `web` in `late` has a UID (as
/// every pod from an API server has) and is running with its address.
fn cluster_yaml(late_meshed: bool, web_uid: &str) -> String {
    let annotations = if late_meshed {
        "{ambit.dev/mesh: enabled}"
    } else {
        "{}"
    };
    format!(
        r#"{NAMESPACES}---
apiVersion: v1
kind: Namespace
metadata: {{name: late, annotations: {annotations}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: cli, namespace: shop}}
spec: {{nodeName: node-a, serviceAccountName: cli, containers: []}}
status: {{podIP: 10.78.1.10, phase: Running}}
---
apiVersion: v1
kind: Pod
metadata: {{name: old, namespace: legacy}}
spec: {{nodeName: node-a, containers: []}}
status: {{podIP: 10.78.1.20, phase: Running}}
---
apiVersion: v1
kind: Pod
metadata: {{name: web, namespace: late, uid: {web_uid}}}
spec: {{nodeName: node-b, serviceAccountName: web, containers: []}}
status: {{podIP: 10.78.2.10, phase: Running}}
"#
    )
}

/// A line echo server inside `netns` on `port` that records each client's address.
async fn echo_server(netns: &Netns, port: u16) -> Peers {
    let listener = netns
        .bind(SocketAddr::from(([0, 0, 0, 0], port)))
        .await
        .unwrap();
    let seen = Peers::default();
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((s, peer)) = listener.accept().await {
            record.lock().unwrap().push(peer);
            tokio::spawn(async move {
                let (r, mut w) = s.into_split();
                let mut lines = BufReader::new(r).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if w.write_all(format!("{line}\n").as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    seen
}

/// Sends a line on `conn` and reads its echo.
async fn echo(conn: &mut BufReader<tokio::net::TcpStream>, line: &str) -> String {
    conn.get_mut()
        .write_all(format!("{line}\n").as_bytes())
        .await
        .unwrap();
    let mut back = String::new();
    tokio::time::timeout(Duration::from_secs(5), conn.read_line(&mut back))
        .await
        .expect("no echo within 5 s")
        .unwrap();
    back.trim_end().to_string()
}

/// Requests web received from cli over mTLS, as web's proxy counts them.
fn mesh_requests(metrics: &str) -> u64 {
    let labels = [
        "direction=\"inbound\"",
        "pod=\"web\"",
        &format!("client_id=\"{CLI_ID}\""),
        "tls=\"true\"",
    ];
    metric_sum(metrics, "request_total", &labels)
}

/// Curls web from cli until the request arrives from `via` (web's own address: through
/// web's proxy; cli's: plain); fails the test after 10 s.
async fn wait_for_route(c: &Arc<Cluster>, cli: &CniPod, seen: &Peers, via: [u8; 4], what: &str) {
    let mut last = Err(String::new());
    for _ in 0..100 {
        last = c.curl_async(cli, "http://10.78.2.10:8080/").await;
        let from = seen.lock().unwrap().last().map(SocketAddr::ip);
        if matches!(&last, Ok((200, _))) && from == Some(IpAddr::from(via)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "{what}: last curl {last:?}, peers {:?}",
        seen.lock().unwrap()
    );
}

/// Waits until `check` holds of the text `read` returns; fails the test after 10 s.
async fn eventually<F, Fut>(what: &str, read: F, check: impl Fn(&str) -> bool)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = String>,
{
    let mut text = String::new();
    for _ in 0..100 {
        text = read().await;
        if check(&text) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what}:\n{text}");
}

fn nft_ruleset(pod: &CniPod) -> String {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &pod.netns, "nft", "list", "ruleset"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Web is served by node-b's proxy: its listeners in web's netns, its record, and the
/// mTLS route from cli.
async fn assert_meshed(c: &Arc<Cluster>, cli: &CniPod, web: &CniPod, seen: &Peers, b: &NodeProxy) {
    wait_for_route(c, cli, seen, WEB_IP, "web never reached through its proxy").await;
    eventually(
        "web's proxy counted no mTLS request from cli",
        || b.metrics(),
        |m| mesh_requests(m) > 0,
    )
    .await;
    let listeners = c.listeners(web);
    assert!(listeners.contains(":4143"), "{listeners}");
    let record = c.node("node-b").run_dir.join("pods/late_web.json");
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(record).unwrap()).unwrap();
    assert_eq!(record["source"], "proc", "{record}");
    assert_eq!(record["container_id"], "", "{record}");
}

async fn scenario(test: &str, redirect: Redirect, uid: &str) {
    let c = Arc::new(Cluster::new(test, &["node-a", "node-b"], Path::new(CNI)));
    let cp = ControlPlane::start(&cluster_yaml(false, uid), &["node-a", "node-b"]).await;
    let config_b = c.node("node-b").proxy_config(&cp, redirect);
    let a = NodeProxy::start_config(c.node("node-a").proxy_config(&cp, redirect)).await;
    let mut b = NodeProxy::start_config(config_b.clone()).await;

    // The pods start; web's namespace is not meshed, so its ADD was answered not_meshed.
    let cli = c.add("node-a", "shop", "cli", 10).await;
    let old = c.add("node-a", "legacy", "old", 20).await;
    let web = c.add("node-b", "late", "web", 10).await;
    let container = c.start_container(&web, uid);
    let web_ns = Netns::open(Path::new(&web.path())).unwrap();
    let seen = http_server(&web_ns, 8080, "web").await;
    let echoed = echo_server(&web_ns, 7070).await;

    // Plain: cli's proxy connects to web directly, web sees cli's own address.
    wait_for_route(&c, &cli, &seen, CLI_IP, "web not reached in plaintext").await;
    assert!(!c.listeners(&web).contains(":4143"));
    let mb = b.metrics().await;
    assert!(
        mb.contains("cni_requests_total{command=\"add\",result=\"not_meshed\"} 1"),
        "{mb}"
    );
    assert!(!mb.contains("result=\"enrolled\""), "{mb}");

    // Connections opened before enrolment, to web (from the unmeshed pod) and from web
    // (an unmarked socket of its netns)...
    let old_ns = Netns::open(Path::new(&old.path())).unwrap();
    let old_echoed = echo_server(&old_ns, 7071).await;
    let stream = old_ns
        .connect(SocketAddr::from((WEB_IP, 7070)), 0)
        .await
        .unwrap();
    let mut before = BufReader::new(stream);
    assert_eq!(echo(&mut before, "before").await, "before");
    let stream = web_ns
        .connect(SocketAddr::from((OLD_IP, 7071)), 0)
        .await
        .unwrap();
    let mut outbound = BufReader::new(stream);
    assert_eq!(echo(&mut outbound, "before").await, "before");

    // Annotating the namespace meshes the running pod, without a CNI ADD.
    cp.set_cluster(&cluster_yaml(true, uid));
    assert_meshed(&c, &cli, &web, &seen, &b).await;
    let mb = b.metrics().await;
    assert!(
        mb.contains("pod_enrolments_total{result=\"enrolled\"} 1"),
        "{mb}"
    );
    assert!(
        !mb.contains("command=\"add\",result=\"redirected\""),
        "{mb}"
    );
    let ma = a.metrics().await;
    let out = [
        "pod=\"cli\"",
        &format!("server_id=\"{WEB_ID}\""),
        "tls=\"true\"",
    ];
    assert!(metric_sum(&ma, "request_total", &out) > 0, "{ma}");
    let dump: serde_json::Value =
        serde_json::from_str(&http_get(b.admin_addr, "/config_dump").await.1).unwrap();
    assert_eq!(dump["pods"][0]["pod"], "late/web", "{dump}");
    assert_eq!(dump["pods"][0]["source"], "proc", "{dump}");
    if redirect == Redirect::Nftables {
        assert!(nft_ruleset(&web).contains("table ip ambit"));
    }

    // ...finish as they started (directly); a new one goes through web's proxy.
    assert_eq!(echo(&mut before, "after").await, "after");
    assert_eq!(echo(&mut outbound, "after").await, "after");
    let peers: Vec<IpAddr> = old_echoed
        .lock()
        .unwrap()
        .iter()
        .map(SocketAddr::ip)
        .collect();
    assert_eq!(peers, [IpAddr::from(WEB_IP)]);
    let stream = old_ns
        .connect(SocketAddr::from((WEB_IP, 7070)), 0)
        .await
        .unwrap();
    let mut after = BufReader::new(stream);
    assert_eq!(echo(&mut after, "new").await, "new");
    let peers: Vec<IpAddr> = echoed.lock().unwrap().iter().map(SocketAddr::ip).collect();
    assert_eq!(peers, [IpAddr::from(OLD_IP), IpAddr::from(WEB_IP)]);
    drop((before, after, outbound));

    // A restart keeps the enrolled pod (its record and netns handle): no new enrolment.
    b.stop().await;
    b = NodeProxy::start_config(config_b.clone()).await;
    assert_meshed(&c, &cli, &web, &seen, &b).await;
    assert!(!b.metrics().await.contains("result=\"enrolled\""));

    // Removing the annotation un-meshes it: plaintext again, listeners, rules and record
    // gone.
    cp.set_cluster(&cluster_yaml(false, uid));
    wait_for_route(
        &c,
        &cli,
        &seen,
        CLI_IP,
        "web still reached through its proxy",
    )
    .await;
    eventually(
        "web's listeners stayed",
        || async { c.listeners(&web) },
        |l| !l.contains(":4143") && !l.contains(":4140"),
    )
    .await;
    assert!(!c.node("node-b").run_dir.join("pods/late_web.json").exists());
    assert!(!nft_ruleset(&web).contains("ambit"));
    let mb = b.metrics().await;
    assert!(mb.contains("pod_enrolment_releases_total 1"), "{mb}");

    // A proxy that starts on a node whose meshed pod has no record enrols it.
    b.stop().await;
    cp.set_cluster(&cluster_yaml(true, uid));
    let b = NodeProxy::start_config(config_b).await;
    assert_meshed(&c, &cli, &web, &seen, &b).await;
    assert!(b
        .metrics()
        .await
        .contains("pod_enrolments_total{result=\"enrolled\"} 1"));

    a.stop().await;
    b.stop().await;
    drop(container);
    c.del_all(&[&web, &cli, &old]).await;
    cp.stop().await;
}

/// A well-formed pod UID of this run (lowercase hex, 8-4-4-4-12).
fn uid(n: u32) -> String {
    format!("{:08x}-0000-4000-8000-{n:012x}", std::process::id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_pod_is_meshed_and_unmeshed_by_annotation_with_ebpf() {
    scenario("enrolebpf", Redirect::Ebpf, &uid(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_pod_is_meshed_and_unmeshed_by_annotation_with_nftables() {
    scenario("enrolnft", Redirect::Nftables, &uid(2)).await;
}
