//! Only the node proxy's own sockets skip eBPF redirection by the proxy's mark: a pod's
//! process that sets the mark itself (`SO_MARK` takes only `CAP_NET_RAW`, which containers
//! get by default) is redirected all the same. Here the proxy runs, as on a node, below the
//! cgroup the programs are attached to — this test process moves itself into
//! `<node-a cgroup>/ambit-proxy` before the proxies start (and back when it ends), so the
//! proxy's own marked sockets go through the hooks and must still pass. Its own file: the
//! move is for the whole process. Run as root.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use ambit_e2e::cni::Cluster;
use ambit_e2e::{http_server, metric_sum, running_pod as pod, ControlPlane, NodeProxy, NAMESPACES};
use ambit_proxy::netns::Netns;
use ambit_proxy::proxy::Redirect;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const CNI: &str = env!("CARGO_BIN_EXE_ambit-cni-e2e");

/// This process in `cgroup` until dropped, then back where it was.
struct InCgroup {
    back: PathBuf,
    dir: PathBuf,
}

impl InCgroup {
    fn enter(dir: PathBuf) -> Self {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let path = own.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
        let back = ambit_ebpf::sys::cgroup2_mount().join(path.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string()).unwrap();
        Self { back, dir }
    }
}

impl Drop for InCgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(
            self.back.join("cgroup.procs"),
            std::process::id().to_string(),
        );
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn cluster_yaml() -> String {
    format!(
        "{NAMESPACES}{}{}{}",
        pod("cli", "shop", "node-a", "10.78.1.10"),
        pod("web", "shop", "node-b", "10.78.2.10"),
        pod("old", "legacy", "node-a", "10.78.1.20"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_sets_the_proxys_mark_is_redirected_all_the_same() {
    let c = Arc::new(Cluster::new(
        "markcg",
        &["node-a", "node-b"],
        Path::new(CNI),
    ));
    let moved = InCgroup::enter(c.node("node-a").cgroup.join("ambit-proxy"));
    let cp = ControlPlane::start(&cluster_yaml(), &["node-a", "node-b"]).await;
    let a = NodeProxy::start_config(c.node("node-a").proxy_config(&cp, Redirect::Ebpf)).await;
    let b = NodeProxy::start_config(c.node("node-b").proxy_config(&cp, Redirect::Ebpf)).await;
    let web = c.add("node-b", "shop", "web", 10).await;
    let cli = c.add("node-a", "shop", "cli", 10).await;
    let old = c.add("node-a", "legacy", "old", 20).await;
    http_server(
        &Netns::open(Path::new(&web.path())).unwrap(),
        8080,
        "hello from web",
    )
    .await;
    http_server(
        &Netns::open(Path::new(&old.path())).unwrap(),
        8080,
        "hello from old",
    )
    .await;
    // The proxy's own marked sockets, from its cgroup below the hooks, pass: the mesh works.
    assert_eq!(
        c.curl_async(&cli, "http://10.78.2.10:8080/").await,
        Ok((200, "hello from web".into()))
    );
    // A pod's process with the proxy's mark on its socket goes through its proxy anyway.
    let outbound = |m: &str| {
        metric_sum(
            m,
            "request_total",
            &["direction=\"outbound\"", "pod=\"cli\""],
        )
    };
    let before = outbound(&a.metrics().await);
    let script = r#"
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, 36, 0x0a3b0000)  # SO_MARK, the proxy's mark
s.settimeout(10)
s.connect(("10.78.1.20", 8080))
s.sendall(b"GET / HTTP/1.1\r\nhost: old\r\nconnection: close\r\n\r\n")
got = b""
while True:
    b = s.recv(4096)
    if not b: break
    got += b
print(got.split(b"\r\n")[0].decode())
"#;
    let out = tokio::task::spawn_blocking({
        let (c, cli) = (c.clone(), cli.clone());
        move || c.exec(&cli, &["python3", "-c", script])
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "HTTP/1.1 200 OK"
    );
    let after = outbound(&a.metrics().await);
    assert_eq!(
        after,
        before + 1,
        "the marked connection went around the proxy"
    );
    a.stop().await;
    b.stop().await;
    c.del_all(&[&web, &cli, &old]).await;
    cp.stop().await;
    drop(moved);
}
