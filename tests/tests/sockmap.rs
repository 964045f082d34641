//! Sockmap on the in-pod hops through the real node proxies (`--sockmap on`, eBPF
//! redirection; this test process in a cgroup of its own, see `tests/src/sockmap.rs`): a
//! meshed client on node-a talks to a meshed echo server on node-b; while the connection
//! is open, both in-pod hops — the client's redirected connection to node-a's proxy, and
//! node-b's proxy delivering to the server — are paired and TCP carries none of their
//! bytes (`ss`); a burst far past each socket's budget comes back intact (by TCP for the
//! rest, held back by it). `/config_dump` and `sockmap_enabled` say
//! it is on. The kernel-level cases (order, a missing peer, sendfile, half-close, close)
//! are in `ebpf/tests/sockmap`; the data-path suites run again with it on
//! (`AMBIT_TEST_SOCKMAP=on`, scripts/test.sh). Run as root.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use ambit_e2e::netns::Topology;
use ambit_e2e::{http_get, ControlPlane, NodeProxy, NAMESPACES};
use ambit_ebpf::common::SockKey;
use ambit_proxy::netns::Netns;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn cluster(t: &Topology) -> String {
    let (client, server) = (t.pod("client"), t.pod("server"));
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
"#,
        client.path(),
        client.ip,
        server.path(),
        server.ip,
    )
}

/// The key `sockops` pairs a socket of a pod by (IPv4).
fn key_of(s: &tokio::net::TcpStream) -> SockKey {
    let (local, remote) = (s.local_addr().unwrap(), s.peer_addr().unwrap());
    let (local_ip, family) = ambit_ebpf::ip_words(local.ip().to_canonical());
    let (remote_ip, _) = ambit_ebpf::ip_words(remote.ip().to_canonical());
    SockKey {
        netns_cookie: ambit_ebpf::sys::netns_cookie(s.as_fd()).unwrap(),
        local_ip,
        remote_ip,
        local_port: u32::from(local.port()),
        remote_port: u32::from(remote.port()),
        family: u32::from(family),
        pad: 0,
    }
}

/// Payload bytes TCP carried on the pod's established connection from `local`: what
/// `ss` reports as `bytes_acked` and `bytes_received` (absent when 0).
fn tcp_bytes(pod: &str, local: SocketAddr) -> (u64, u64) {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", pod, "ss", "-tinH", "state", "established"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    // One connection is two lines: the addresses, then the details.
    let lines: Vec<&str> = text.lines().collect();
    let i = lines
        .iter()
        .position(|l| l.split_whitespace().nth(2) == Some(&local.to_string()))
        .unwrap_or_else(|| panic!("{local} not in:\n{text}"));
    let details = lines.get(i + 1).copied().unwrap_or_default();
    let field = |name: &str| {
        details
            .split_whitespace()
            .find_map(|f| f.strip_prefix(name)?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (field("bytes_acked:"), field("bytes_received:"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_pod_hops_skip_tcp_through_the_real_proxies() {
    let t = Topology::new(&["client", "server"]);
    let cp = ControlPlane::start(&cluster(&t), &["node-a", "node-b"]).await;
    let mut configs = Vec::new();
    for node in ["node-a", "node-b"] {
        let mut c = NodeProxy::config(&cp, node);
        ambit_e2e::sockmap::apply_always(&mut c);
        configs.push(c);
    }
    let pins: Vec<_> = configs.iter().map(|c| c.bpf_pin_dir.clone()).collect();
    let b = NodeProxy::start_config(configs.pop().unwrap()).await;
    let a = NodeProxy::start_config(configs.pop().unwrap()).await;
    for p in [&a, &b] {
        let dump: serde_json::Value =
            serde_json::from_str(&http_get(p.admin_addr, "/config_dump").await.1).unwrap();
        let said = dump["sockmap"].as_str().unwrap_or_default();
        assert!(said.starts_with("on"), "{dump}");
        assert!(p.metrics().await.contains("sockmap_enabled 1"));
    }

    // The server: an echo that tells us its accepted socket (the delivery hop's end).
    let server_ns = Netns::open(std::path::Path::new(&t.pod("server").path())).unwrap();
    let listener = server_ns
        .bind("0.0.0.0:7000".parse().unwrap())
        .await
        .unwrap();
    let (accepted_tx, accepted_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let _ = accepted_tx.send((key_of(&s), s.local_addr().unwrap()));
        let (mut r, mut w) = s.split();
        let _ = tokio::io::copy(&mut r, &mut w).await;
        let _ = w.shutdown().await;
    });

    let client_ns = Netns::open(std::path::Path::new(&t.pod("client").path())).unwrap();
    let dst = SocketAddr::from((t.pod("server").ip, 7000));
    let mut s = client_ns.connect(dst, 0).await.unwrap();
    let client_key = key_of(&s);
    let client_local = s.local_addr().unwrap();
    let first = b"first bytes, read back before the rest";
    s.write_all(first).await.unwrap();
    let mut echoed = vec![0u8; first.len()];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut echoed))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&echoed, first);
    let (server_key, server_local) = accepted_rx.await.unwrap();

    // Both ends of both hops are paired: the client's with node-a's proxy, the server's
    // with node-b's.
    let paired_a = ambit_ebpf::sockmap::pinned_pairs(&pins[0]).unwrap();
    let paired_b = ambit_ebpf::sockmap::pinned_pairs(&pins[1]).unwrap();
    assert!(
        paired_a.contains(&client_key) && paired_a.contains(&client_key.peer()),
        "{paired_a:?}"
    );
    assert!(
        paired_b.contains(&server_key) && paired_b.contains(&server_key.peer()),
        "{paired_b:?}"
    );

    // 2 MiB in 64 KiB requests, each echoed: TCP carries none of it on the in-pod hops.
    let chunk: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
    for _ in 0..32 {
        s.write_all(&chunk).await.unwrap();
        let mut back = vec![0u8; chunk.len()];
        tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut back))
            .await
            .unwrap()
            .unwrap();
        assert!(back == chunk);
    }
    let client_tcp = tcp_bytes(&t.pod("client").name, client_local);
    let server_tcp = tcp_bytes(&t.pod("server").name, server_local);
    assert!(
        client_tcp.0 < 100 && client_tcp.1 < 100,
        "the client's hop carried {client_tcp:?} by TCP"
    );
    assert!(
        server_tcp.0 < 100 && server_tcp.1 < 100,
        "the server's hop carried {server_tcp:?} by TCP"
    );

    // Then 32 MiB at once each way, far past each socket's budget of 4 MiB by sk_msg and
    // faster than the proxies can forward it: the rest goes by TCP, which holds the
    // writers back, and every byte comes back in order.
    let data: Vec<u8> = (0..32 << 20).map(|i: u32| (i % 253) as u8).collect();
    let (mut r, mut w) = s.split();
    let send = async {
        w.write_all(&data).await.unwrap();
        w.shutdown().await.unwrap();
    };
    let mut back = Vec::new();
    let recv = r.read_to_end(&mut back);
    let ((), read) =
        tokio::time::timeout(Duration::from_secs(120), async { tokio::join!(send, recv) })
            .await
            .unwrap();
    read.unwrap();
    assert!(
        back == data,
        "echoed intact ({} of {} bytes)",
        back.len(),
        data.len()
    );
    drop(s);
    a.stop().await;
    b.stop().await;
    cp.stop().await;
}
