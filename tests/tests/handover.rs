//! Hitless restart of the node proxy (issue 13), with the real `ambit-proxy` binary as
//! node-b's proxy:
//!
//! - a second process started beside it with the same run directory takes its listeners
//!   over while clients send at a fixed rate — through node-b's proxy inbound (a client on
//!   node-a to a server on node-b) and outbound (a client on node-b to a server on
//!   node-a), over keep-alive connections and a new connection per request — and not one
//!   request fails; a long opaque stream opened before the hand-over runs on to its end
//!   through the old process, which drains and exits on SIGTERM; a third process then
//!   takes over from the second the same way;
//! - SIGTERM alone drains the same way: new connections are refused (fail closed), an
//!   open opaque stream runs on to its end, and the process exits when it has.
//!
//! Counts are asserted, never timings. Needs `target/debug/ambit-proxy`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use ambit_e2e::binary::{self, Killed};
use ambit_e2e::load::{connect, get, until_served, Client};
use ambit_e2e::netns::Topology;
use ambit_e2e::testapp::{self, Seen};
use ambit_e2e::{http_get, metric_sum, ControlPlane, NetnsHandles, NodeProxy, NAMESPACES};
use ambit_proxy::netns::Netns;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

/// How often each client sends.
const EVERY: Duration = Duration::from_millis(20);

/// An opaque port (one of the defaults): relayed as opaque TCP (a CONNECT stream, or a
/// kernel TLS connection of its own), never parsed.
const OPAQUE: u16 = 5432;

fn cluster(t: &Topology) -> String {
    let pod = |name: &str, node: &str| {
        let p = t.pod(name);
        format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: shop, annotations: {{local.ambit.dev/netns: {}}}}}\nspec: {{nodeName: {node}, serviceAccountName: {name}, containers: []}}\nstatus: {{podIP: {}, phase: Running}}\n",
            p.path(),
            p.ip
        )
    };
    format!(
        "{NAMESPACES}{}{}{}{}",
        pod("client", "node-a"),
        pod("remote", "node-a"),
        pod("server", "node-b"),
        pod("local", "node-b"),
    )
}

/// Two nodes: node-a's proxy in this process, node-b's the binary.
struct Mesh {
    t: Topology,
    cp: ControlPlane,
    a: NodeProxy,
    handles: NetnsHandles,
    server_seen: Seen,
    remote_seen: Seen,
    admin: u16,
}

impl Mesh {
    fn addr(&self, pod: &str, port: u16) -> SocketAddr {
        SocketAddr::new(self.t.pod(pod).ip.into(), port)
    }

    fn netns(&self, pod: &str) -> PathBuf {
        PathBuf::from(self.t.pod(pod).path())
    }
}

async fn mesh() -> Mesh {
    let t = Topology::new(&["client", "remote", "server", "local"]);
    let cp = ControlPlane::start(&cluster(&t), &["node-a", "node-b"]).await;
    let a = NodeProxy::start(&cp, "node-a").await;
    let handles = NetnsHandles(NodeProxy::config(&cp, "node-b").run_dir);
    let open = |pod: &str| Netns::open(Path::new(&t.pod(pod).path())).unwrap();
    let server_ns = open("server");
    let server_seen = testapp::serve(&server_ns, 8080, "server").await;
    echo_server(&server_ns).await;
    let remote_seen = testapp::serve(&open("remote"), 8080, "remote").await;
    let admin = binary::free_port();
    Mesh {
        t,
        cp,
        a,
        handles,
        server_seen,
        remote_seen,
        admin,
    }
}

/// An echo server in `netns` on [`OPAQUE`].
async fn echo_server(netns: &Netns) {
    let listener = netns
        .bind(SocketAddr::from(([0, 0, 0, 0], OPAQUE)))
        .await
        .unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
}

/// An opaque stream from the pod at `netns` to `dst`: 1 KiB every 50 ms until `stop`,
/// each echoed back; then a half-close and the echo read to its end. Returns the bytes
/// sent and the bytes echoed, and how many chunks went out after `mark` turned true.
fn stream(
    netns: PathBuf,
    dst: SocketAddr,
    mark: watch::Receiver<bool>,
    stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<(Vec<u8>, Vec<u8>, usize)> {
    tokio::spawn(async move {
        let netns = Netns::open(&netns).unwrap();
        let mut s = netns.connect(dst, 0).await.unwrap();
        let (mut r, mut w) = s.split();
        let mut sent = Vec::new();
        let mut after = 0;
        let send = async {
            let mut i: u8 = 0;
            while !*stop.borrow() {
                let chunk = vec![i; 1024];
                i = i.wrapping_add(1);
                if w.write_all(&chunk).await.is_err() {
                    break;
                }
                sent.extend_from_slice(&chunk);
                if *mark.borrow() {
                    after += 1;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let _ = w.shutdown().await;
        };
        let mut got = Vec::new();
        let recv = async {
            let _ = tokio::time::timeout(Duration::from_secs(120), r.read_to_end(&mut got)).await;
        };
        tokio::join!(send, recv);
        (sent, got, after)
    })
}

/// Waits until `admin`'s `/ready` answers 200.
async fn until_ready(admin: u16) {
    let addr = SocketAddr::from(([127, 0, 0, 1], admin));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = tokio::time::timeout(Duration::from_secs(2), http_get(addr, "/ready")).await;
        if matches!(ready, Ok((200, _))) {
            return;
        }
        assert!(Instant::now() < deadline, "never ready: {ready:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits for the process to exit (60 s at most); its status.
async fn until_exit(p: &mut Killed) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = p.exited() {
            return status;
        }
        assert!(Instant::now() < deadline, "the proxy did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_proxy_in_a_pod_of_its_own_takes_over_without_a_failed_request() {
    take_over(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_proxy_on_the_same_admin_address_takes_over_without_a_failed_request() {
    take_over(true).await;
}

/// The old proxy, clients at a fixed rate and an opaque stream; a new proxy takes over.
/// `shared_admin`: the new one is started with the old one's admin address (host network,
/// one machine) and gets its admin listener; else it has its own (the DaemonSet's surge
/// pod, in a network namespace of its own).
async fn take_over(shared_admin: bool) {
    let m = mesh().await;
    let mut old = Killed(binary::spawn(&m.cp, "node-b", m.admin, &[]));
    until_ready(m.admin).await;
    let (inbound, outbound) = (m.addr("server", 8080), m.addr("remote", 8080));
    until_served(&m.netns("client"), inbound).await;
    until_served(&m.netns("local"), outbound).await;

    let (stop_tx, stop) = watch::channel(false);
    let loads = [
        (
            "inbound keep-alive",
            Client::new(m.netns("client"), inbound, true, EVERY).start(stop.clone()),
        ),
        (
            "inbound new connections",
            Client::new(m.netns("client"), inbound, false, EVERY).start(stop.clone()),
        ),
        (
            "outbound keep-alive",
            Client::new(m.netns("local"), outbound, true, EVERY).start(stop.clone()),
        ),
        (
            "outbound new connections",
            Client::new(m.netns("local"), outbound, false, EVERY).start(stop.clone()),
        ),
    ];
    let (taken_tx, taken) = watch::channel(false);
    let (end_stream, stream_stop) = watch::channel(false);
    let opaque = stream(
        m.netns("client"),
        m.addr("server", OPAQUE),
        taken,
        stream_stop,
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = m.server_seen.total() + m.remote_seen.total();

    // A new process takes over; the opaque stream opened before runs on through the old
    // one, which, drained, exits on SIGTERM once the stream has ended.
    let (new, admin) = hand_over(&m, m.admin, shared_admin).await;
    taken_tx.send_replace(true);
    tokio::time::sleep(Duration::from_secs(2)).await;
    end_stream.send_replace(true);
    let (sent, echoed, after) = opaque.await.unwrap();
    assert!(after > 0, "the stream did not outlive the hand-over");
    assert_eq!(echoed.len(), sent.len(), "opaque stream cut short");
    assert!(echoed == sent, "opaque stream corrupted");
    old.terminate();
    assert!(until_exit(&mut old).await.success());

    // And again, from the process that took over: hand-overs chain.
    let (mut newer, newest_admin) = hand_over(&m, admin, shared_admin).await;
    let mut new = new;
    tokio::time::sleep(Duration::from_secs(1)).await;
    new.terminate();
    assert!(until_exit(&mut new).await.success());
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop_tx.send_replace(true);
    tokio::time::sleep(Duration::from_millis(100)).await;

    for (what, l) in &loads {
        let failed = l.all_failed();
        let ok = l.total_ok();
        eprintln!(
            "{what}: {ok} served, {} connections, {} failed",
            l.connections(),
            failed.len()
        );
        assert!(
            failed.is_empty(),
            "{what}: {} failed: {failed:?}",
            failed.len()
        );
        // That the load ran across the hand-overs, not a rate: the host serves ~500 in this
        // window, the emulated guest of scripts/ktls-tests.sh ~90.
        assert!(ok > 40, "{what}: only {ok} served");
    }
    // The keep-alive client on node-b was moved to each new process (its connection
    // answered `connection: close`), not cut; node-a's proxy moved its tunnel (GOAWAY).
    assert!(
        loads[2].1.connections() >= 3,
        "outbound keep-alive: not moved at each hand-over"
    );
    assert!(m.server_seen.total() + m.remote_seen.total() > before);
    // Both directions were served by the last process.
    let metrics = http_get(SocketAddr::from(([127, 0, 0, 1], newest_admin)), "/metrics").await;
    for direction in ["inbound", "outbound"] {
        let label = format!("direction=\"{direction}\"");
        assert!(
            metric_sum(&metrics.1, "request_total", &[&label]) > 0,
            "no {direction} request served by the last process: {}",
            metrics.1
        );
    }
    until_served(&m.netns("client"), inbound).await;
    until_served(&m.netns("local"), outbound).await;

    newer.terminate();
    assert!(until_exit(&mut newer).await.success());
    m.a.stop().await;
    m.cp.stop().await;
    drop(m.handles);
    drop(m.t);
}

/// Starts a process to take over from the one whose admin port is `old_admin`: on that
/// port (`shared_admin`, handed over) or a port of its own. Returns once it is ready —
/// serving every pod — with its admin port.
async fn hand_over(m: &Mesh, old_admin: u16, shared_admin: bool) -> (Killed, u16) {
    let admin = if shared_admin {
        old_admin
    } else {
        binary::free_port()
    };
    let new = Killed(binary::spawn(&m.cp, "node-b", admin, &[]));
    // Its admin port answers for it once it has introduced itself (the old one's, handed
    // over, or its own), and says ready once it serves the pods.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let dump = tokio::time::timeout(
            Duration::from_secs(2),
            http_get(SocketAddr::from(([127, 0, 0, 1], admin)), "/config_dump"),
        )
        .await;
        let dump: serde_json::Value = match dump {
            Ok((200, body)) => serde_json::from_str(&body).unwrap_or_default(),
            _ => serde_json::Value::Null,
        };
        if dump["pid"] == new.0.id() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the admin port never answered for the new process"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    until_ready(admin).await;
    if !shared_admin {
        // The old process keeps its own admin port: still live, draining.
        let old = SocketAddr::from(([127, 0, 0, 1], old_admin));
        assert_eq!(http_get(old, "/live").await.0, 200);
        let (status, why) = http_get(old, "/ready").await;
        assert_eq!(status, 503, "{why}");
        assert!(why.contains("handed over"), "{why}");
    }
    (new, admin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_open_streams_and_refuses_new_connections() {
    let m = mesh().await;
    let mut old = Killed(binary::spawn(
        &m.cp,
        "node-b",
        m.admin,
        &["--shutdown-grace-period", "5m"],
    ));
    until_ready(m.admin).await;
    let inbound = m.addr("server", 8080);
    until_served(&m.netns("client"), inbound).await;

    let (signalled_tx, signalled) = watch::channel(false);
    let (end_stream, stream_stop) = watch::channel(false);
    let opaque = stream(
        m.netns("client"),
        m.addr("server", OPAQUE),
        signalled,
        stream_stop,
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    old.terminate();
    signalled_tx.send_replace(true);
    // Draining: a new connection is refused (fail closed), the stream goes on.
    let netns = Netns::open(&m.netns("client")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let served = match connect(&netns, inbound).await {
            Ok(mut send) => matches!(get(&mut send, &inbound.to_string()).await, Ok((200, _))),
            Err(_) => false,
        };
        if !served {
            break;
        }
        assert!(Instant::now() < deadline, "still served after SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(old.exited().is_none(), "exited with a stream open");
    tokio::time::sleep(Duration::from_secs(1)).await;
    end_stream.send_replace(true);
    let (sent, echoed, after) = opaque.await.unwrap();
    assert!(after > 0, "nothing sent after SIGTERM");
    assert_eq!(echoed.len(), sent.len(), "opaque stream cut short");
    assert!(echoed == sent, "opaque stream corrupted");
    // The last connection over: the process exits, well before its 5-minute grace period
    // (the test gives it 60 s).
    assert!(until_exit(&mut old).await.success());

    m.a.stop().await;
    m.cp.stop().await;
    drop(m.handles);
    drop(m.t);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_that_dies_before_taking_over_leaves_the_old_proxy_serving() {
    let m = mesh().await;
    let mut old = Killed(binary::spawn(&m.cp, "node-b", m.admin, &[]));
    until_ready(m.admin).await;
    let inbound = m.addr("server", 8080);
    let outbound = m.addr("remote", 8080);
    until_served(&m.netns("client"), inbound).await;
    until_served(&m.netns("local"), outbound).await;
    let (stop_tx, stop) = watch::channel(false);
    let loads = [
        Client::new(m.netns("client"), inbound, true, EVERY).start(stop.clone()),
        Client::new(m.netns("local"), outbound, false, EVERY).start(stop.clone()),
    ];

    // A successor that trusts other anchors: neither the control plane nor the
    // certificates the old proxy kept are good to it, so it can never serve. It takes the
    // admin address (shared) and waits.
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("other-anchors.pem");
    std::fs::write(&other, ambit_e2e::test_pki().0.cert_pem).unwrap();
    let mut doomed = Killed(binary::spawn_trusting(
        &m.cp,
        "node-b",
        m.admin,
        &other,
        &[],
    ));
    let admin = SocketAddr::from(([127, 0, 0, 1], m.admin));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = http_get(admin, "/config_dump").await;
        let dump: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if status == 200 && dump["pid"] == doomed.0.id() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the successor never took the admin port"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_ne!(
        http_get(admin, "/ready").await.0,
        200,
        "a successor without certificates is ready"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    // It dies before taking over: the old proxy answers on its admin port again and has
    // served throughout.
    doomed.0.kill().unwrap();
    doomed.0.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, body) = http_get(admin, "/config_dump").await;
        let dump: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if dump["pid"] == old.0.id() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the old proxy never took its admin port back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    until_ready(m.admin).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop_tx.send_replace(true);
    tokio::time::sleep(Duration::from_millis(100)).await;
    for l in &loads {
        let failed = l.all_failed();
        assert!(failed.is_empty(), "{} failed: {failed:?}", failed.len());
        // That the load ran throughout, not a rate: the emulated guest of
        // scripts/ktls-tests.sh serves a fraction of what the host does.
        assert!(l.total_ok() > 10, "only {} served", l.total_ok());
    }
    assert!(old.exited().is_none());

    old.terminate();
    assert!(until_exit(&mut old).await.success());
    m.a.stop().await;
    m.cp.stop().await;
    drop(m.handles);
    drop(m.t);
}
