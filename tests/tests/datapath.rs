//! The data path end to end, in network namespaces: pods on two nodes, one node proxy per
//! node listening inside its pods, the real control plane, nftables redirection in the
//! pods (eBPF comes with the redirection issue). Run as root.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use ambit_e2e::netns::Topology;
use ambit_e2e::{ControlPlane, NodeProxy, NAMESPACES};
use ambit_proxy::netns::Netns;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn cluster(t: &Topology) -> String {
    let (client, server, outsider) = (t.pod("client"), t.pod("server"), t.pod("outsider"));
    format!(
        r#"{NAMESPACES}---
apiVersion: v1
kind: Pod
metadata: {{name: client, namespace: shop, annotations: {{local.ambit.dev/netns: {}}}}}
spec: {{nodeName: node-a, serviceAccountName: client, containers: []}}
status: {{podIP: {}, phase: Running}}
---
apiVersion: v1
kind: Pod
metadata: {{name: server, namespace: shop, annotations: {{local.ambit.dev/netns: {}}}}}
spec: {{nodeName: node-b, serviceAccountName: server, containers: []}}
status: {{podIP: {}, phase: Running}}
---
apiVersion: v1
kind: Pod
metadata: {{name: outsider, namespace: legacy}}
spec: {{nodeName: node-a, containers: []}}
status: {{podIP: {}, phase: Running}}
---
apiVersion: v1
kind: Service
metadata: {{name: server, namespace: shop}}
spec: {{clusterIP: 10.96.0.7, ports: [{{name: echo, port: 80}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: server-1, namespace: shop, labels: {{kubernetes.io/service-name: server}}}}
addressType: IPv4
ports: [{{name: echo, port: 7000}}]
endpoints: [{{addresses: [{}], targetRef: {{kind: Pod, name: server, namespace: shop}}}}]
"#,
        client.path(),
        client.ip,
        server.path(),
        server.ip,
        outsider.ip,
        server.ip
    )
}

/// An echo server inside `netns` on :7000 that records each client's address.
async fn echo_server(netns: &Netns) -> Arc<Mutex<Vec<SocketAddr>>> {
    let listener = netns.bind("0.0.0.0:7000".parse().unwrap()).await.unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, peer)) = listener.accept().await else {
                return;
            };
            record.lock().unwrap().push(peer);
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    seen
}

/// Connects from inside `netns` as an unmodified application would (no mark), sends
/// `payload`, half-closes, and reads the echo to the end.
async fn echo_through(netns: &Netns, dst: SocketAddr, payload: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut s = tokio::time::timeout(Duration::from_secs(10), netns.connect(dst, 0)).await??;
    let (mut r, mut w) = s.split();
    let send = async {
        w.write_all(payload).await?;
        w.shutdown().await
    };
    let mut got = Vec::new();
    let recv = r.read_to_end(&mut got);
    let (sent, received) =
        tokio::time::timeout(Duration::from_secs(20), async { tokio::join!(send, recv) }).await?;
    sent?;
    received?;
    Ok(got)
}

fn payload(n: usize) -> Vec<u8> {
    (0..n).map(|_| fastrand_byte()).collect()
}

fn fastrand_byte() -> u8 {
    use std::cell::Cell;
    thread_local!(static S: Cell<u64> = const { Cell::new(0x2545_f491_4f6c_dd1d) });
    S.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        (x >> 24) as u8
    })
}

fn metric_sum(metrics: &str, name: &str, labels: &[&str]) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

fn metric_line<'a>(metrics: &'a str, name: &str, labels: &[&str]) -> Option<&'a str> {
    metrics
        .lines()
        .find(|l| l.starts_with(name) && labels.iter().all(|want| l.contains(want)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meshed_pods_talk_through_both_proxies_with_mutual_tls() {
    let t = Topology::new(&["client", "server", "outsider"]);
    let cp = ControlPlane::start(&cluster(&t), &["node-a", "node-b"]).await;
    let (a, b) = (
        NodeProxy::start(&cp, "node-a").await,
        NodeProxy::start(&cp, "node-b").await,
    );
    let client_ns = Netns::open(std::path::Path::new(&t.pod("client").path())).unwrap();
    let server_ns = Netns::open(std::path::Path::new(&t.pod("server").path())).unwrap();
    let outsider_ns = Netns::open(std::path::Path::new(&t.pod("outsider").path())).unwrap();
    let seen = echo_server(&server_ns).await;
    let server_ip = t.pod("server").ip;

    // By pod IP, and by the Service's ClusterIP (resolved to the endpoint by the proxy).
    let data = payload(1 << 20);
    for dst in [
        SocketAddr::from((server_ip, 7000)),
        "10.96.0.7:80".parse().unwrap(),
    ] {
        let got = echo_through(&client_ns, dst, &data).await.unwrap();
        assert_eq!(got.len(), data.len(), "via {dst}");
        assert!(got == data, "bytes changed on the way via {dst}");
    }
    // The server application sees connections from its own proxy, inside its own pod.
    for peer in seen.lock().unwrap().iter() {
        assert_eq!(
            peer.ip(),
            std::net::IpAddr::V4(server_ip),
            "connection bypassed the server's proxy"
        );
    }

    let ma = a.metrics().await;
    let outbound = [
        "direction=\"outbound\"",
        "pod=\"client\"",
        "server_id=\"spiffe://cluster.local/ns/shop/sa/server\"",
        "tls=\"true\"",
    ];
    assert_eq!(
        metric_sum(&ma, "tcp_open_total", &outbound),
        2,
        "client side:\n{ma}"
    );
    let mut by_service = outbound.to_vec();
    by_service.push("dst_namespace=\"shop\",dst_service=\"server\",dst_pod=\"server\"");
    // A pod without a controller is its own workload, of kind Pod.
    by_service.push("destination_workload=\"server\",destination_workload_kind=\"Pod\"");
    assert_eq!(metric_sum(&ma, "tcp_open_total", &by_service), 1, "{ma}");
    let mb = b.metrics().await;
    let line = metric_line(
        &mb,
        "tcp_open_total",
        &[
            "direction=\"inbound\"",
            "pod=\"server\"",
            "client_id=\"spiffe://cluster.local/ns/shop/sa/client\"",
            "tls=\"true\"",
        ],
    );
    assert!(
        line.is_some_and(|l| l.ends_with(" 2")),
        "server side:\n{mb}"
    );
    let line = metric_line(
        &mb,
        "tcp_read_bytes_total",
        &["direction=\"inbound\"", "pod=\"server\""],
    )
    .unwrap();
    assert!(line.ends_with(&format!(" {}", 2 * data.len())), "{line}");
    // Both streams were carried as /config_dump says: on kernel TLS connections of their
    // own where the kernel has TLS (the KVM guest pass), else CONNECT streams.
    let dump: serde_json::Value =
        serde_json::from_str(&ambit_e2e::http_get(a.admin_addr, "/config_dump").await.1).unwrap();
    let kernel_tls = &dump["kernel_tls"];
    assert!(
        kernel_tls["why"].as_str().is_some_and(|w| !w.is_empty()),
        "{kernel_tls}"
    );
    let carried = if kernel_tls["enabled"] == true {
        "kernel_tls"
    } else {
        "h2_connect"
    };
    for (m, direction) in [(&ma, "outbound"), (&mb, "inbound")] {
        let labels = [
            &format!("direction=\"{direction}\"")[..],
            &format!("transport=\"{carried}\""),
        ];
        assert_eq!(
            metric_sum(m, "tcp_mesh_transport_total", &labels),
            2,
            "{kernel_tls}\n{m}"
        );
    }

    // A client outside the mesh reaches the server in plaintext through 4144.
    let got = echo_through(
        &outsider_ns,
        SocketAddr::from((server_ip, 7000)),
        b"hello from outside",
    )
    .await
    .unwrap();
    assert_eq!(got, b"hello from outside");
    let mb = b.metrics().await;
    assert!(
        metric_line(
            &mb,
            "tcp_open_total",
            &["direction=\"inbound\"", "tls=\"no_identity\""]
        )
        .is_some(),
        "{mb}"
    );

    a.stop().await;
    b.stop().await;
    cp.stop().await;
}

/// A server that speaks first (a banner), as SMTP or MySQL do, then echoes.
async fn banner_server(netns: &Netns, port: u16) {
    let listener = netns
        .bind(SocketAddr::from(([0, 0, 0, 0], port)))
        .await
        .unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                s.write_all(b"220 ready\r\n").await.unwrap();
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_speaks_first_protocols_work_on_any_port() {
    let t = Topology::new(&["client", "server", "outsider"]);
    let cp = ControlPlane::start(&cluster(&t), &["node-a", "node-b"]).await;
    // A short detection timeout keeps the test quick; the default is 10 s.
    let a = NodeProxy::start_with(&cp, "node-a", Duration::from_millis(300)).await;
    let b = NodeProxy::start(&cp, "node-b").await;
    let server_ns = Netns::open(std::path::Path::new(&t.pod("server").path())).unwrap();
    let client_ns = Netns::open(std::path::Path::new(&t.pod("client").path())).unwrap();
    // 7001: detection waits for the client, times out, and relays opaquely.
    // 3306: a default opaque port, relayed without detection.
    for port in [7001u16, 3306] {
        banner_server(&server_ns, port).await;
        let mut s = client_ns
            .connect(SocketAddr::from((t.pod("server").ip, port)), 0)
            .await
            .unwrap();
        let mut banner = [0u8; 11];
        tokio::time::timeout(Duration::from_secs(20), s.read_exact(&mut banner))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&banner, b"220 ready\r\n", "port {port}");
        s.write_all(b"QUIT\r\n").await.unwrap();
        s.shutdown().await.unwrap();
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"QUIT\r\n", "port {port}");
    }
    let ma = a.metrics().await;
    let line = metric_line(
        &ma,
        "tcp_open_total",
        &["direction=\"outbound\"", "tls=\"true\""],
    );
    assert!(line.is_some_and(|l| l.ends_with(" 2")), "{ma}");
    a.stop().await;
    b.stop().await;
    cp.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_installs_redirection_and_a_stopped_proxy_fails_closed() {
    let t = Topology::new(&["client", "server", "outsider"]);
    let cp = ControlPlane::start(&cluster(&t), &["node-a", "node-b"]).await;
    let (a, b) = (
        NodeProxy::start(&cp, "node-a").await,
        NodeProxy::start(&cp, "node-b").await,
    );
    // nftables rules in meshed pods only (with AMBIT_TEST_SOCKMAP=on the proxies redirect
    // with eBPF: no rules to see, the rest holds all the same).
    let nft = !ambit_e2e::sockmap::on();
    let rules = t.pod("client").nft_ruleset();
    assert!(
        !nft || rules.contains("redirect to :4140") && rules.contains("redirect to :4144"),
        "{rules}"
    );
    assert!(
        !t.pod("outsider").nft_ruleset().contains("ambit"),
        "an unmeshed pod is untouched"
    );

    let server_ns = Netns::open(std::path::Path::new(&t.pod("server").path())).unwrap();
    let client_ns = Netns::open(std::path::Path::new(&t.pod("client").path())).unwrap();
    let seen = echo_server(&server_ns).await;
    let dst = SocketAddr::from((t.pod("server").ip, 7000));
    assert_eq!(
        echo_through(&client_ns, dst, b"meshed").await.unwrap(),
        b"meshed"
    );
    let before = seen.lock().unwrap().len();

    // The client's node proxy stops: its rules stay, nothing listens — connections fail
    // instead of going out in the clear, and nothing reaches the server.
    a.stop().await;
    let err = echo_through(&client_ns, dst, b"in the clear?").await;
    assert!(
        err.is_err(),
        "a connection succeeded after the node proxy stopped"
    );
    assert_eq!(
        seen.lock().unwrap().len(),
        before,
        "plaintext reached the destination"
    );
    assert!(!nft || t.pod("client").nft_ruleset().contains("redirect to :4140"));

    // Back again: service restored without touching the pod.
    let a = NodeProxy::start(&cp, "node-a").await;
    assert_eq!(
        echo_through(&client_ns, dst, b"restored").await.unwrap(),
        b"restored"
    );

    // Opting the pod out removes its rules (eBPF: its map entries, tests/tests/redirection.rs).
    if !nft {
        a.stop().await;
        b.stop().await;
        cp.stop().await;
        return;
    }
    let yaml = cluster(&t).replace(
        "metadata: {name: client, namespace: shop, annotations: {",
        "metadata: {name: client, namespace: shop, annotations: {ambit.dev/mesh: disabled, ",
    );
    cp.set_cluster(&yaml);
    let mut removed = false;
    for _ in 0..200 {
        if !t.pod("client").nft_ruleset().contains("ambit") {
            removed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        removed,
        "rules left behind:\n{}",
        t.pod("client").nft_ruleset()
    );
    a.stop().await;
    b.stop().await;
    cp.stop().await;
}

/// Deletes a network namespace on drop.
struct NetnsGuard(String);

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.0])
            .output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_whose_netns_appears_later_is_picked_up() {
    let name = format!("amb{}late", std::process::id());
    let yaml = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: shop, annotations: {{ambit.dev/mesh: enabled}}}}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: late, namespace: shop, annotations: {{local.ambit.dev/netns: /run/netns/{name}}}}}\n\
         spec: {{nodeName: node-a, containers: []}}\nstatus: {{podIP: 10.77.0.9}}\n"
    );
    let cp = ControlPlane::start(&yaml, &["node-a"]).await;
    let a = NodeProxy::spawn(&cp, "node-a").await;
    // Not ready while a pod on the node has no listeners.
    let mut said = String::new();
    for _ in 0..200 {
        said = ambit_e2e::http_get(a.admin_addr, "/ready").await.1;
        if said.contains("listeners not open yet for shop/late") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        said.contains("listeners not open yet for shop/late"),
        "{said}"
    );
    // The netns comes into being only now (a sandbox still being set up).
    let guard = NetnsGuard(name.clone());
    let out = std::process::Command::new("ip")
        .args(["netns", "add", &name])
        .output()
        .unwrap();
    assert!(out.status.success());
    let pod = ambit_e2e::netns::PodNet {
        name: guard.0.clone(),
        ip: "10.77.0.9".parse().unwrap(),
        ip6: "fd77::9".parse().unwrap(),
    };
    // (With AMBIT_TEST_SOCKMAP=on the redirection is eBPF: being ready says it.)
    let mut picked_up = ambit_e2e::sockmap::on();
    for _ in 0..150 {
        if picked_up || pod.nft_ruleset().contains("redirect to :4140") {
            picked_up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(picked_up, "the proxy never retried the pod");
    a.wait_ready("node-a").await;
    a.stop().await;
    cp.stop().await;
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_stack_pods_talk_over_ipv6_through_the_mesh() {
    let t = Topology::new(&["client", "server", "outsider"]);
    let (c, srv) = (t.pod("client"), t.pod("server"));
    let yaml = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: shop, annotations: {{ambit.dev/mesh: enabled}}}}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: client, namespace: shop, annotations: {{local.ambit.dev/netns: {}}}}}\n\
         spec: {{nodeName: node-a, serviceAccountName: client, containers: []}}\nstatus: {{podIPs: [{{ip: {}}}, {{ip: \"{}\"}}]}}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: server, namespace: shop, annotations: {{local.ambit.dev/netns: {}}}}}\n\
         spec: {{nodeName: node-b, serviceAccountName: server, containers: []}}\nstatus: {{podIPs: [{{ip: {}}}, {{ip: \"{}\"}}]}}\n",
        c.path(), c.ip, c.ip6, srv.path(), srv.ip, srv.ip6
    );
    let cp = ControlPlane::start(&yaml, &["node-a", "node-b"]).await;
    let (a, b) = (
        NodeProxy::start(&cp, "node-a").await,
        NodeProxy::start(&cp, "node-b").await,
    );
    let server_ns = Netns::open(std::path::Path::new(&srv.path())).unwrap();
    let client_ns = Netns::open(std::path::Path::new(&c.path())).unwrap();
    // The application listens on IPv6 only.
    let listener = server_ns.bind("[::]:7000".parse().unwrap()).await.unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    let dst = SocketAddr::from((srv.ip6, 7000));
    let data = payload(64 * 1024);
    assert_eq!(echo_through(&client_ns, dst, &data).await.unwrap(), data);
    let ma = a.metrics().await;
    let outbound = [
        "direction=\"outbound\"",
        "server_id=\"spiffe://cluster.local/ns/shop/sa/server\"",
        "tls=\"true\"",
    ];
    assert_eq!(metric_sum(&ma, "tcp_open_total", &outbound), 1, "{ma}");
    a.stop().await;
    b.stop().await;
    cp.stop().await;
}
