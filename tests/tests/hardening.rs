//! Hardening of the node proxy's in-pod listeners (issue 10), end to end with the real CNI
//! chain and unmodified clients: nothing outside a pod reaches its outbound listener; the
//! proxy's own ports are never a destination; one pod's flood of connections is refused
//! beyond its budget while the node's other pods are served; idle HTTP connections are
//! closed; a Service endpoint whose slice does not name its pod still goes through the mesh
//! when that pod is meshed; `--outbound-unknown deny` refuses what discovery does not know;
//! pod-named network namespaces outside the allowed directory are refused; a pod gone from
//! discovery stays redirected, failing closed. Run as root.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use ambit_e2e::cni::{Cluster, CniPod};
use ambit_e2e::{http_server, metric_sum, running_pod as pod, ControlPlane, NodeProxy, NAMESPACES};
use ambit_proxy::netns::Netns;
use ambit_proxy::proxy::Redirect;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;

const CNI: &str = env!("CARGO_BIN_EXE_ambit-cni-e2e");

fn cluster_yaml() -> String {
    format!(
        "{NAMESPACES}{}{}{}{}---
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
---
apiVersion: v1
kind: Service
metadata: {{name: api, namespace: shop}}
spec: {{clusterIP: 10.96.0.11, ports: [{{name: http, port: 80}}]}}
---
# A slice without targetRef: it does not say which pod (nor identity) is behind it.
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: api-1, namespace: shop, labels: {{kubernetes.io/service-name: api}}}}
addressType: IPv4
ports: [{{name: http, port: 8080}}]
endpoints: [{{addresses: [10.78.2.11]}}]
",
        pod("cli", "shop", "node-a", "10.78.1.10"),
        pod("web", "shop", "node-b", "10.78.2.10"),
        pod("api", "shop", "node-b", "10.78.2.11"),
        pod("old", "legacy", "node-a", "10.78.1.20"),
    )
}

/// Runs `script` with python3 as a process of `pod` (its netns and cgroup, so redirected
/// as an application is); its stdout.
async fn python(c: &Arc<Cluster>, pod: &CniPod, script: &str) -> String {
    let (c, pod, script) = (c.clone(), pod.clone(), script.to_string());
    let out = tokio::task::spawn_blocking(move || c.exec(&pod, &["python3", "-c", &script]))
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "python3: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Sends an HTTP request on a raw connection from `pod` to `addr` and prints what came
/// back before the connection closed (empty: closed without an answer).
fn raw_request(addr: &str) -> String {
    let (host, port) = addr.rsplit_once(':').unwrap();
    format!(
        r#"
import socket
s = socket.create_connection(("{host}", {port}), timeout=10)
got = b""
try:
    s.sendall(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    while True:
        b = s.recv(4096)
        if not b: break
        got += b
except OSError as e:
    pass
print(got.split(b"\r\n")[0].decode() if got else "closed")
"#
    )
}

async fn scenario(test: &str, redirect: Redirect) {
    let c = Arc::new(Cluster::new(test, &["node-a", "node-b"], Path::new(CNI)));
    let cp = ControlPlane::start(&cluster_yaml(), &["node-a", "node-b"]).await;
    let mut config_a = c.node("node-a").proxy_config(&cp, redirect);
    config_a.http_idle_timeout = Duration::from_secs(2);
    config_a.outbound_unknown = ambit_proxy::proxy::OutboundUnknown::Deny;
    let mut config_b = c.node("node-b").proxy_config(&cp, redirect);
    config_b.max_connections_per_pod = 20;
    let a = NodeProxy::start_config(config_a).await;
    let b = NodeProxy::start_config(config_b).await;
    let web = c.add("node-b", "shop", "web", 10).await;
    let api = c.add("node-b", "shop", "api", 11).await;
    let cli = c.add("node-a", "shop", "cli", 10).await;
    let old = c.add("node-a", "legacy", "old", 20).await;
    let web_ns = Netns::open(Path::new(&web.path())).unwrap();
    let seen = http_server(&web_ns, 8080, "hello from web").await;
    let api_ns = Netns::open(Path::new(&api.path())).unwrap();
    http_server(&api_ns, 8080, "hello from api").await;
    assert_eq!(
        c.curl_async(&cli, "http://10.96.0.10/").await,
        Ok((200, "hello from web".into()))
    );

    // The outbound listener is on loopback only: nothing outside the pod reaches it.
    let listeners = c.listeners(&web);
    assert!(listeners.contains("127.0.0.1:4140"), "{listeners}");
    assert!(
        !listeners.contains("0.0.0.0:4140") && !listeners.contains("*:4140"),
        "{listeners}"
    );
    // From outside the mesh, the proxy's ports in the pod answer nothing.
    for port in [4140, 4143, 4144] {
        let got = python(&c, &old, &raw_request(&format!("10.78.2.10:{port}"))).await;
        assert!(!got.starts_with("HTTP/1.1 200"), "port {port}: {got}");
    }
    // Through the mesh, the proxy's own ports are refused as targets (ambit-dst) with a
    // reason, where before a request "to 4144" was delivered to the plaintext listener.
    let reached = seen.lock().unwrap().len();
    for port in [4140, 4143, 4144] {
        let out = tokio::task::spawn_blocking({
            let (c, cli) = (c.clone(), cli.clone());
            move || {
                c.exec(
                    &cli,
                    &[
                        "curl",
                        "-sS",
                        "--max-time",
                        "10",
                        "-D",
                        "-",
                        "-o",
                        "/dev/null",
                        &format!("http://10.78.2.10:{port}/"),
                    ],
                )
            }
        })
        .await
        .unwrap();
        let head = String::from_utf8_lossy(&out.stdout).to_lowercase();
        assert!(head.starts_with("http/1.1 400"), "port {port}: {head}");
        assert!(head.contains("proxy's own ports"), "port {port}: {head}");
    }
    assert_eq!(seen.lock().unwrap().len(), reached);

    // A flood of connections to web (from outside the mesh, through 4144) is admitted up to
    // web's budget of 20; the rest are closed at once and counted.
    let old_ns = Netns::open(Path::new(&old.path())).unwrap();
    let mut held = Vec::new();
    for _ in 0..30 {
        let target: SocketAddr = "10.78.2.10:8080".parse().unwrap();
        if let Ok(s) = old_ns.connect(target, 0).await {
            held.push(s);
        }
    }
    // The refused ones are counted (the proxy counts, then closes, at accept: once the
    // count is in, so are the closes) ...
    let refused_now = || async {
        let m = b.metrics().await;
        let n = metric_sum(
            &m,
            "tcp_connections_refused_total",
            &["listener=\"inbound_plain\"", "reason=\"pod_limit\""],
        );
        (n, m)
    };
    let (mut refused, mut m) = refused_now().await;
    for _ in 0..100 {
        if refused >= 10 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        (refused, m) = refused_now().await;
    }
    // ... 20, less the pooled mesh connection from cli's proxy that web's budget also holds.
    assert!((10..=11).contains(&refused), "{m}");
    // ... and closed; the admitted ones reach web and stay open.
    let mut closed = 0;
    for s in &mut held {
        let mut one = [0u8; 1];
        if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(500), s.read(&mut one)).await
        {
            closed += 1;
        }
    }
    assert_eq!(closed, refused);
    // web is full, but the node's other pod is served, by the mesh and in plaintext.
    assert_eq!(
        c.curl_async(&cli, "http://10.78.2.11:8080/").await,
        Ok((200, "hello from api".into()))
    );
    assert_eq!(
        c.curl_async(&old, "http://10.78.2.11:8080/").await,
        Ok((200, "hello from api".into()))
    );
    // Once the flood ends, web's budget is back.
    drop(held);
    let mut back = Err(String::new());
    for _ in 0..50 {
        back = c.curl_async(&cli, "http://10.96.0.10/").await;
        if back == Ok((200, "hello from web".into())) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(back, Ok((200, "hello from web".into())));

    // An application's keep-alive HTTP connection that goes quiet is closed by its proxy
    // after --http-idle-timeout (2 s here), gracefully: the request in flight was answered.
    let idle = python(
        &c,
        &cli,
        r#"
import socket, time
s = socket.create_connection(("10.96.0.10", 80), timeout=30)
s.sendall(b"GET / HTTP/1.1\r\nhost: web\r\n\r\n")
got = b""
while b"hello from web" not in got:
    got += s.recv(4096)
start = time.monotonic()
try:
    rest = s.recv(4096)
    print("closed" if rest == b"" else "data")
except socket.timeout:
    print("still open after 30 s")
"#,
    )
    .await;
    assert_eq!(idle, "closed");

    // A Service endpoint whose slice does not name its pod is still reached through the
    // mesh when the pod at that address is meshed: never in plaintext.
    assert_eq!(
        c.curl_async(&cli, "http://10.96.0.11/").await,
        Ok((200, "hello from api".into()))
    );
    let inbound_api = [
        "direction=\"inbound\"",
        "pod=\"api\"",
        "client_id=\"spiffe://cluster.local/ns/shop/sa/cli\"",
        "tls=\"true\"",
    ];
    assert!(
        metric_sum(&b.metrics().await, "request_total", &inbound_api) >= 2,
        "{}",
        b.metrics().await
    );

    // --outbound-unknown deny (cli's proxy): a pod outside the mesh but known is reached;
    // once discovery no longer knows the address, it is refused with a reason.
    http_server(&old_ns, 8080, "hello from old").await;
    assert_eq!(
        c.curl_async(&cli, "http://10.78.1.20:8080/").await,
        Ok((200, "hello from old".into()))
    );
    cp.set_cluster(&cluster_yaml().replace(&pod("old", "legacy", "node-a", "10.78.1.20"), ""));
    let mut head = String::new();
    for _ in 0..100 {
        let out = tokio::task::spawn_blocking({
            let (c, cli) = (c.clone(), cli.clone());
            move || {
                c.exec(
                    &cli,
                    &[
                        "curl",
                        "-sS",
                        "--max-time",
                        "10",
                        "-D",
                        "-",
                        "-o",
                        "/dev/null",
                        "http://10.78.1.20:8080/",
                    ],
                )
            }
        })
        .await
        .unwrap();
        head = String::from_utf8_lossy(&out.stdout).to_lowercase();
        if head.starts_with("http/1.1 403") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(head.starts_with("http/1.1 403"), "{head}");
    assert!(head.contains("--outbound-unknown deny"), "{head}");

    a.stop().await;
    b.stop().await;
    c.del_all(&[&web, &api, &cli, &old]).await;
    cp.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listeners_are_bounded_and_unreachable_around_redirection_with_ebpf() {
    scenario("hardebpf", Redirect::Ebpf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listeners_are_bounded_and_unreachable_around_redirection_with_nftables() {
    scenario("hardnft", Redirect::Nftables).await;
}

/// A pod whose netns (named by discovery, local mode) is outside --local-netns-dir, or is
/// the proxy's own (the node's) namespace, is never served, and /ready says so; the others
/// are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_cannot_point_the_proxy_at_another_network_namespace() {
    let t = ambit_e2e::netns::Topology::new(&["good"]);
    let good = t.pods[0].clone();
    let dir = tempfile::tempdir().unwrap();
    // A path outside the allowed directory, to a real namespace (the good pod's).
    let outside = dir.path().join("elsewhere");
    std::fs::write(&outside, b"").unwrap();
    let bind = std::process::Command::new("mount")
        .args(["--bind", &good.path(), outside.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(bind.status.success(), "{bind:?}");
    // Under the allowed directory, but the node's own namespace (this process's: the proxy
    // runs in it).
    let host = format!("{}-host", good.name);
    let attach = std::process::Command::new("ip")
        .args(["netns", "attach", &host, &std::process::id().to_string()])
        .output()
        .unwrap();
    assert!(attach.status.success(), "{attach:?}");
    let yaml = format!(
        "{NAMESPACES}{}{}{}",
        netns_pod("good", &good.path(), &good.ip.to_string()),
        netns_pod("elsewhere", outside.to_str().unwrap(), "10.77.0.200"),
        netns_pod("host", &format!("/run/netns/{host}"), "10.77.0.201"),
    );
    let cp = ControlPlane::start(&yaml, &["node-a"]).await;
    // No redirection: were the check missing, nothing would be written into the node's
    // own namespace but the listeners this test looks for.
    let mut config = NodeProxy::config(&cp, "node-a");
    config.redirect = Redirect::None;
    let proxy = NodeProxy::spawn_config(config);
    let mut ready = String::new();
    for _ in 0..100 {
        ready = ambit_e2e::http_get(proxy.admin_addr, "/ready").await.1;
        if ready.contains("listeners not open yet") && !ready.contains("shop/good") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        ready.contains("shop/elsewhere") && ready.contains("shop/host"),
        "{ready}"
    );
    assert!(!ready.contains("shop/good"), "{ready}");
    let in_good = std::process::Command::new("ip")
        .args(["netns", "exec", &good.name, "ss", "-ltnH"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&in_good.stdout).contains(":4143"));
    // Nothing of the proxy listens in the node's namespace, nor in the good pod's twice.
    let own = std::process::Command::new("ss")
        .args(["-ltnH"])
        .output()
        .unwrap();
    let own = String::from_utf8_lossy(&own.stdout);
    assert!(!own.contains(":4143 "), "{own}");
    proxy.stop().await;
    cp.stop().await;
    let _ = std::process::Command::new("umount").arg(&outside).output();
    let _ = std::process::Command::new("ip")
        .args(["netns", "delete", &host])
        .output();
    drop(t);
}

fn netns_pod(name: &str, netns: &str, ip: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: shop, \
         annotations: {{local.ambit.dev/netns: \"{netns}\"}}}}\n\
         spec: {{nodeName: node-a, serviceAccountName: {name}, containers: []}}\n\
         status: {{podIP: {ip}, phase: Running}}\n"
    )
}

/// Waits until the proxy at `admin` says `pods_failing_closed` is `n` and, when `n` is 0,
/// until `/ready` answers 200 (listeners and a certificate for a pod served again follow
/// its release by a moment); its `/ready`.
async fn failing_closed(proxy: &NodeProxy, n: u64) -> (u16, String) {
    let mut ready = (0, String::new());
    for _ in 0..200 {
        let m = proxy.metrics().await;
        if metric_sum(&m, "pods_failing_closed", &[]) == n {
            ready = ambit_e2e::http_get(proxy.admin_addr, "/ready").await;
            if n > 0 || ready.0 == 200 {
                return ready;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "pods_failing_closed never became {n} with /ready {ready:?}:\n{}",
        proxy.metrics().await
    );
}

/// Only an explicit end removes a pod's redirection: a pod that merely disappears from
/// discovery (a partial reload, a control-plane bug), also across a proxy restart, stays
/// redirected with its traffic refused, and /ready and `pods_failing_closed` say so; it is
/// served again when listed again; CNI DEL ends it.
async fn gone_from_discovery(test: &str, redirect: Redirect) {
    let c = Arc::new(Cluster::new(test, &["node-a", "node-b"], Path::new(CNI)));
    let with_web = cluster_yaml();
    let without_web = with_web.replace(&pod("web", "shop", "node-b", "10.78.2.10"), "");
    assert_ne!(with_web, without_web);
    let cp = ControlPlane::start(&with_web, &["node-a", "node-b"]).await;
    let a = NodeProxy::start_config(c.node("node-a").proxy_config(&cp, redirect)).await;
    let config_b = c.node("node-b").proxy_config(&cp, redirect);
    let b = NodeProxy::start_config(config_b.clone()).await;
    let web = c.add("node-b", "shop", "web", 10).await;
    let old = c.add("node-a", "legacy", "old", 20).await;
    let web_ns = Netns::open(Path::new(&web.path())).unwrap();
    let seen = http_server(&web_ns, 8080, "hello from web").await;
    let hello = Ok((200, "hello from web".to_string()));
    assert_eq!(c.curl_async(&old, "http://10.78.2.10:8080/").await, hello);

    // web vanishes from discovery: not served, still redirected, its traffic refused.
    cp.set_cluster(&without_web);
    let (status, ready) = failing_closed(&b, 1).await;
    assert_eq!(status, 503, "{ready}");
    assert!(ready.contains("shop/web (not in discovery)"), "{ready}");
    let reached = seen.lock().unwrap().len();
    let plain = c.curl_async(&old, "http://10.78.2.10:8080/").await;
    assert!(!matches!(plain, Ok((200, _))), "{plain:?}");
    assert_eq!(
        seen.lock().unwrap().len(),
        reached,
        "web reached around its proxy"
    );

    // Listed again: served again.
    cp.set_cluster(&with_web);
    assert_eq!(failing_closed(&b, 0).await.0, 200);
    assert_eq!(c.curl_async(&old, "http://10.78.2.10:8080/").await, hello);

    // A restart while discovery does not list it: held from the first snapshot.
    cp.set_cluster(&without_web);
    failing_closed(&b, 1).await;
    b.stop().await;
    let b = NodeProxy::spawn_config(config_b.clone());
    let reached = seen.lock().unwrap().len();
    let (status, ready) = failing_closed(&b, 1).await;
    assert_eq!(status, 503, "{ready}");
    assert!(ready.contains("shop/web"), "{ready}");
    let plain = c.curl_async(&old, "http://10.78.2.10:8080/").await;
    assert!(!matches!(plain, Ok((200, _))), "{plain:?}");
    assert_eq!(
        seen.lock().unwrap().len(),
        reached,
        "web reached around its proxy"
    );

    // CNI DEL is an explicit end: nothing held any more.
    c.del_all(&[&web]).await;
    assert_eq!(failing_closed(&b, 0).await.0, 200);

    a.stop().await;
    b.stop().await;
    c.del_all(&[&old]).await;
    cp.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_gone_from_discovery_stays_redirected_and_fails_closed_with_ebpf() {
    gone_from_discovery("goneebpf", Redirect::Ebpf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_gone_from_discovery_stays_redirected_and_fails_closed_with_nftables() {
    gone_from_discovery("gonenft", Redirect::Nftables).await;
}

/// `--redirect auto` never switches a node whose pods an earlier run redirected with eBPF
/// to nftables (with the programs still attached every outbound connection would fail):
/// when the kernel refuses eBPF now, the proxy does not start, and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_does_not_fall_back_to_nftables_over_pinned_ebpf() {
    let c = Arc::new(Cluster::new(
        "autopin",
        &["node-a", "node-b"],
        Path::new(CNI),
    ));
    let cp = ControlPlane::start(&cluster_yaml(), &["node-a", "node-b"]).await;
    let config = c.node("node-b").proxy_config(&cp, Redirect::Ebpf);
    let b = NodeProxy::start_config(config.clone()).await;
    let web = c.add("node-b", "shop", "web", 10).await;
    b.stop().await;
    // The same node, auto, on a "kernel" that refuses the programs (no cgroup to attach
    // to): before, it fell back to nftables under the pinned eBPF programs.
    let mut auto = config.clone();
    auto.redirect = Redirect::Auto;
    auto.cgroup_path = "/nonexistent-cgroup".into();
    let err = NodeProxy::spawn_config(auto).exit().await.unwrap_err();
    assert!(err.contains("does not fall back to nftables"), "{err}");
    assert!(err.contains("links pinned under"), "{err}");
    // With eBPF available it starts, in eBPF mode, and still serves the pod.
    let mut auto = config.clone();
    auto.redirect = Redirect::Auto;
    let b = NodeProxy::start_config(auto).await;
    let dump: serde_json::Value =
        serde_json::from_str(&ambit_e2e::http_get(b.admin_addr, "/config_dump").await.1).unwrap();
    assert_eq!(dump["redirect_mode"], "ebpf", "{dump}");
    b.stop().await;
    c.del_all(&[&web]).await;
    cp.stop().await;
}

/// eBPF inbound covers every address of a meshed pod: an address the proxy was not told of
/// (here an IPv6 address on a pod redirected for IPv4 only) is refused, never delivered to
/// the application around the proxy; the pod's known address is served as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_of_a_meshed_pod_the_proxy_does_not_know_is_refused_with_ebpf() {
    let c = Arc::new(Cluster::new(
        "v6hole",
        &["node-a", "node-b"],
        Path::new(CNI),
    ));
    // old-b: outside the mesh, on web's node (the same link).
    let yaml = cluster_yaml() + &pod("old-b", "legacy", "node-b", "10.78.2.20");
    let cp = ControlPlane::start(&yaml, &["node-a", "node-b"]).await;
    let b = NodeProxy::start_config(c.node("node-b").proxy_config(&cp, Redirect::Ebpf)).await;
    let a = NodeProxy::start_config(c.node("node-a").proxy_config(&cp, Redirect::Ebpf)).await;
    let web = c.add("node-b", "shop", "web", 10).await;
    let old = c.add("node-b", "legacy", "old-b", 20).await;
    // Both pods get an IPv6 address on the same link (the proxy knows only web's IPv4).
    for (pod, ip) in [(&web, "fd00:78::10/64"), (&old, "fd00:78::20/64")] {
        let out = std::process::Command::new("ip")
            .args([
                "-n", &pod.netns, "-6", "addr", "add", ip, "dev", "eth0", "nodad",
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    // web's application listens on every address, IPv4 and IPv6.
    let web_ns = Netns::open(Path::new(&web.path())).unwrap();
    let v4 = http_server(&web_ns, 8080, "hello from web").await;
    let v6 = web_ns.bind("[::]:8080".parse().unwrap()).await.unwrap();
    let reached = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = reached.clone();
    tokio::spawn(async move {
        while let Ok((_s, _)) = v6.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    assert_eq!(
        c.curl_async(&old, "http://10.78.2.10:8080/").await,
        Ok((200, "hello from web".into()))
    );
    assert!(!v4.lock().unwrap().is_empty());
    // From old-b (outside the mesh) to web's IPv6 address: refused, not delivered.
    let got = python(
        &c,
        &old,
        r#"
import socket
try:
    s = socket.create_connection(("fd00:78::10", 8080), timeout=3)
    s.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    print("connected", s.recv(100))
except OSError as e:
    print("refused", e)
"#,
    )
    .await;
    assert!(got.starts_with("refused"), "{got}");
    assert_eq!(
        reached.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "delivered around the proxy"
    );
    a.stop().await;
    b.stop().await;
    c.del_all(&[&web, &old]).await;
    cp.stop().await;
}
