//! The real `ambit-proxy` binary killed with SIGKILL (issue 13): its pods fail closed —
//! meshed requests are refused by the client's proxy (nothing answers on the server pod's
//! 4143) and a plaintext client's connection is refused (the pod's nftables rules stay and
//! send it to a port nobody listens on), nothing reaches the application around the proxy
//! — and a new process restores service from the same run directory. The gap, from the
//! new process's start to the first request served, is printed (measured, not asserted:
//! the machines are shared).
//!
//! Needs `target/debug/ambit-proxy` (`./scripts/test.sh` builds it before the tests).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use ambit_e2e::binary::{self, Killed};
use ambit_e2e::netns::Topology;
use ambit_e2e::testapp::{self, Client};
use ambit_e2e::{ControlPlane, NetnsHandles, NodeProxy, NAMESPACES};
use ambit_proxy::netns::Netns;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn cluster(t: &Topology) -> String {
    let pod = |name: &str, node: &str, extra: &str| {
        let p = t.pod(name);
        format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: shop, annotations: {{local.ambit.dev/netns: {}{extra}}}}}\nspec: {{nodeName: {node}, serviceAccountName: {name}, containers: []}}\nstatus: {{podIP: {}, phase: Running}}\n",
            p.path(),
            p.ip
        )
    };
    format!(
        "{NAMESPACES}{}{}{}",
        pod("client", "node-a", ""),
        pod("server", "node-b", ""),
        pod("outside", "node-a", ", ambit.dev/mesh: disabled"),
    )
}

/// A GET from the client pod through the mesh: the status, or 0 when the connection
/// failed.
async fn get(client: &Netns, server: std::net::SocketAddr) -> u16 {
    let tried = tokio::time::timeout(Duration::from_secs(5), async {
        let mut c = Client::connect(client, server).await;
        c.try_get("/", &[]).await.map(|r| r.status).unwrap_or(0)
    })
    .await;
    tried.unwrap_or(0)
}

/// Whether a plaintext connection from `outside` to the server's 8080 opens.
fn plaintext_opens(t: &Topology) -> bool {
    let server = t.pod("server").ip;
    Command::new("ip")
        .args(["netns", "exec", &t.pod("outside").name, "bash", "-c"])
        .arg(format!("exec 3<>/dev/tcp/{server}/8080"))
        .status()
        .unwrap()
        .success()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_killed_with_sigkill_fails_closed_and_a_new_one_restores_service() {
    let t = Topology::new(&["client", "server", "outside"]);
    let cp = ControlPlane::start(&cluster(&t), &["node-a", "node-b"]).await;
    let a = NodeProxy::start(&cp, "node-a").await;
    let handles = NetnsHandles(NodeProxy::config(&cp, "node-b").run_dir);
    let server_ns = Netns::open(Path::new(&t.pod("server").path())).unwrap();
    let seen = testapp::serve(&server_ns, 8080, "server").await;
    let client = Netns::open(Path::new(&t.pod("client").path())).unwrap();
    let server = std::net::SocketAddr::new(t.pod("server").ip.into(), 8080);

    let admin = binary::free_port();
    let mut proxy = Killed(binary::spawn(&cp, "node-b", admin, &[]));
    // Served through the binary.
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(&client, server).await != 200 {
        assert!(Instant::now() < deadline, "never served through the binary");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // SIGKILL: no drain, no cleanup.
    proxy.0.kill().unwrap();
    proxy.0.wait().unwrap();
    let before = seen.total();
    for _ in 0..5 {
        assert_ne!(
            get(&client, server).await,
            200,
            "served with the proxy dead"
        );
    }
    assert!(
        !plaintext_opens(&t),
        "a plaintext connection reached the pod with its proxy dead"
    );
    assert_eq!(
        seen.total(),
        before,
        "something reached the application around the proxy"
    );

    // A new process, the same run directory: its pods are served again.
    let started = Instant::now();
    proxy = Killed(binary::spawn(&cp, "node-b", binary::free_port(), &[]));
    let deadline = started + Duration::from_secs(30);
    let mut refused = 0;
    while get(&client, server).await != 200 {
        refused += 1;
        assert!(Instant::now() < deadline, "service never came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "SIGKILL recovery: first request served {:?} after the new proxy started ({refused} refused meanwhile)",
        started.elapsed()
    );
    assert!(seen.total() > before);
    assert!(
        plaintext_opens(&t),
        "plaintext not served again after the restart"
    );

    drop(proxy);
    a.stop().await;
    cp.stop().await;
    drop(handles);
    std::mem::forget(server_ns);
    drop(t);
}
