//! The control plane away (issue 13). Certificates live one minute (the shortest
//! `--cert-lifetime` the control plane takes) and are renewed at 70 % of their life; the
//! control plane is stopped soon after the proxies got theirs and comes back only once
//! each proxy has failed to renew several times (counted), before they expire. Meanwhile:
//!
//! - a client on node-a sends to a server on node-b through the mesh at a fixed rate,
//!   over a keep-alive connection and a new connection per request, and not one request
//!   fails — before the outage, during it, and after it;
//! - node-b's proxy (the real `ambit-proxy` binary) is stopped (SIGTERM) and started again
//!   in the middle of it: with nothing to ask, it serves its pod from what it kept on disk
//!   (`/config_dump` says discovery, policy and the certificate came from disk), and not
//!   one request fails once it is ready (those sent while no process ran are counted
//!   apart: with no proxy there is no service, and the pod fails closed);
//! - a new pod's CNI ADD on node-a is answered "try again" (its sandbox waits: the
//!   control plane does not know it yet, and neither does the proxy);
//! - once the control plane is back the certificates are renewed (refresh counters, a
//!   later notAfter), discovery's source is the control plane again, and the new pod's
//!   retried ADD succeeds and its requests are served.
//!
//! Counts are asserted, never timings. Needs `target/debug/ambit-proxy`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use ambit_api::cni::{PodAdd, PodRef, Request, Response};
use ambit_e2e::binary::{self, Killed};
use ambit_e2e::load::{connect, get, Client};
use ambit_e2e::netns::Topology;
use ambit_e2e::testapp;
use ambit_e2e::{http_get, metric_sum, ControlPlane, NetnsHandles, NodeProxy, NAMESPACES};
use ambit_proxy::netns::Netns;
use serde_json::Value;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How often each client sends.
const EVERY: Duration = Duration::from_millis(50);

/// The shortest certificate lifetime the control plane accepts.
const LIFETIME: &str = "1m";

/// The phases of the test; each request counts in the one it started in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Everything up.
    Before,
    /// The control plane stopped.
    Away,
    /// Node-b's proxy stopped and not serving again yet: failures expected, counted apart.
    Restarting,
    /// Node-b's new proxy serving from disk, the control plane still away.
    FromDisk,
    /// The control plane back.
    Back,
}

const PHASES: [Phase; 5] = [
    Phase::Before,
    Phase::Away,
    Phase::Restarting,
    Phase::FromDisk,
    Phase::Back,
];

/// `client` and the late pod `late` (only once it exists) on node-a, `server` on node-b.
/// `client` and `server` name their netns; `late` comes by CNI.
fn cluster(t: &Topology, with_late: bool) -> String {
    let pod = |name: &str, node: &str, netns: bool| {
        let p = t.pod(name);
        let annotations = if netns {
            format!(", annotations: {{local.ambit.dev/netns: {}}}", p.path())
        } else {
            String::new()
        };
        format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: shop{annotations}}}\nspec: {{nodeName: {node}, serviceAccountName: {name}, containers: []}}\nstatus: {{podIP: {}, phase: Running}}\n",
            p.ip
        )
    };
    let late = if with_late {
        pod("late", "node-a", false)
    } else {
        String::new()
    };
    format!(
        "{NAMESPACES}{}{}{late}",
        pod("client", "node-a", true),
        pod("server", "node-b", true),
    )
}

fn admin(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// `path` of an admin server, or an empty answer if it does not answer in 2 s.
async fn admin_get(addr: SocketAddr, path: &str) -> (u16, String) {
    tokio::time::timeout(Duration::from_secs(2), http_get(addr, path))
        .await
        .unwrap_or_default()
}

async fn metrics(addr: SocketAddr) -> String {
    admin_get(addr, "/metrics").await.1
}

async fn config_dump(addr: SocketAddr) -> Value {
    serde_json::from_str(&admin_get(addr, "/config_dump").await.1).unwrap_or_default()
}

/// Waits (a minute and a half at most) until `check` holds; `what` names it if never.
async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        match check().await {
            Ok(()) => return,
            Err(why) => assert!(Instant::now() < deadline, "{what}: {why}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Until a GET from `from` to `to` is served.
async fn until_served(from: &Path, to: SocketAddr) {
    let netns = Netns::open(from).unwrap();
    until(&format!("{to} served from {}", from.display()), || async {
        let mut send = connect(&netns, to).await?;
        match get(&mut send, &to.to_string()).await? {
            (200, _) => Ok(()),
            (status, _) => Err(format!("status {status}")),
        }
    })
    .await;
}

/// Until `/ready` of `addr` answers 200.
async fn until_ready(addr: SocketAddr) {
    until(&format!("{addr} ready"), || async {
        match admin_get(addr, "/ready").await {
            (200, _) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// Until the sum of `name` in `addr`'s metrics is at least `want`.
async fn until_metric(addr: SocketAddr, name: &str, labels: &[&str], want: u64) {
    until(&format!("{name}{labels:?} >= {want} at {addr}"), || async {
        let got = metric_sum(&metrics(addr).await, name, labels);
        (got >= want).then_some(()).ok_or(format!("{got}"))
    })
    .await;
}

/// A CNI ADD of `late` with its netns, as the plugin sends it.
async fn add_late(socket: &Path, t: &Topology) -> Response {
    let late = t.pod("late");
    let request = Request::Add(PodAdd {
        pod: PodRef {
            namespace: "shop".into(),
            name: "late".into(),
            container_id: "late-sandbox".into(),
        },
        uid: "uid-late".into(),
        netns_path: late.path(),
        ips: vec![late.ip.into()],
    });
    let fd: OwnedFd = std::fs::File::open(late.path()).unwrap().into();
    let socket = socket.to_path_buf();
    tokio::task::spawn_blocking(move || {
        ambit_cni::client::ask(&socket, &request, Some(fd.as_fd()), Duration::from_secs(30))
            .unwrap()
    })
    .await
    .unwrap()
}

/// The certificate's notAfter of each identity of a proxy's `/config_dump`.
fn not_after(dump: &Value) -> Vec<u64> {
    dump["identities"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["cert_not_after_unix"].as_u64())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_control_plane_away_traffic_flows_a_restarted_proxy_serves_from_disk_and_renewals_resume(
) {
    let t = Topology::new(&["client", "server", "late"]);
    let mut cp = ControlPlane::start_with_flags(
        &cluster(&t, false),
        &["node-a", "node-b"],
        &["--cert-lifetime", LIFETIME],
    )
    .await;
    // node-a in this process, with a CNI socket for the late pod; node-b the binary.
    let sock_dir = tempfile::tempdir().unwrap();
    let mut config = NodeProxy::config(&cp, "node-a");
    config.cni_socket = sock_dir.path().join("cni.sock");
    config.cni_add_timeout = Duration::from_secs(2);
    let cni_socket = config.cni_socket.clone();
    let handles_a = NetnsHandles(config.run_dir.clone());
    let a = NodeProxy::start_config(config).await;
    let handles_b = NetnsHandles(NodeProxy::config(&cp, "node-b").run_dir);
    let server_ns = Netns::open(Path::new(&t.pod("server").path())).unwrap();
    let seen = testapp::serve(&server_ns, 8080, "server").await;
    let b_admin = admin(binary::free_port());
    let grace = ["--shutdown-grace-period", "5s"];
    let mut b = Killed(binary::spawn(&cp, "node-b", b_admin.port(), &grace));
    until_ready(b_admin).await;
    let client = PathBuf::from(t.pod("client").path());
    let server = SocketAddr::new(t.pod("server").ip.into(), 8080);
    until_served(&client, server).await;
    // What node-b's proxy keeps is on disk before the outage.
    for kind in ["discovery", "policy", "identity"] {
        let label = format!("kind=\"{kind}\"");
        until_metric(b_admin, "persisted_state_writes_total", &[&label], 1).await;
    }

    let phase = Arc::new(AtomicUsize::new(Phase::Before as usize));
    let set = |p: Phase| phase.store(p as usize, Ordering::SeqCst);
    let (stop_tx, stop) = watch::channel(false);
    let loads = [
        (
            "keep-alive",
            Client {
                phase: phase.clone(),
                phases: PHASES.len(),
                ..Client::new(client.clone(), server, true, EVERY)
            }
            .start(stop.clone()),
        ),
        (
            "new connection per request",
            Client {
                phase: phase.clone(),
                phases: PHASES.len(),
                ..Client::new(client.clone(), server, false, EVERY)
            }
            .start(stop.clone()),
        ),
    ];
    let served = |p: Phase| loads.iter().map(|(_, l)| l.ok(p as usize)).sum::<u64>();
    until("served before the outage", || async {
        (served(Phase::Before) >= 20)
            .then_some(())
            .ok_or("not yet".into())
    })
    .await;

    // The control plane goes away.
    cp.pause().await;
    set(Phase::Away);
    let a_refreshed = metric_sum(&a.metrics().await, "identity_cert_refresh_total", &[]);
    until("served with the control plane away", || async {
        (served(Phase::Away) >= 20)
            .then_some(())
            .ok_or("not yet".into())
    })
    .await;
    // A new pod's sandbox waits: its ADD is answered "try again".
    cp.set_cluster(&cluster(&t, true));
    match add_late(&cni_socket, &t).await {
        Response::Error { code, msg, .. } => {
            assert_eq!(code, ambit_api::cni::code::TRY_AGAIN, "{msg}");
            assert!(msg.contains("not known to the control plane"), "{msg}");
        }
        other => panic!("the late pod's ADD: {other:?}"),
    }
    // A destination no pod of node-a used before the outage (the late pod's address):
    // discovery cannot say what it is, so the request fails closed — refused with the
    // reason and counted, not sent in plaintext — while the known server keeps serving.
    {
        let netns = Netns::open(&client).unwrap();
        let never_used = SocketAddr::new(t.pod("late").ip.into(), 8080);
        let mut send = connect(&netns, never_used).await.unwrap();
        let req = http::Request::get("/")
            .header("host", never_used.to_string())
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(10), send.send_request(req))
            .await
            .expect("an answer within the lookup timeout")
            .unwrap();
        assert_eq!(resp.status(), 503);
        let why = resp.headers()[ambit_proxy::proxy::ERROR_HEADER]
            .to_str()
            .unwrap()
            .to_string();
        assert!(
            why.contains("discovery did not say what") && why.contains("unreachable"),
            "{why}"
        );
        let m = a.metrics().await;
        assert_eq!(
            metric_sum(&m, "discovery_lookup_waits_total", &["result=\"timeout\""]),
            1,
            "{m}"
        );
    }

    // Node-b's proxy restarted within the outage: SIGTERM, then a new process.
    set(Phase::Restarting);
    b.terminate();
    let deadline = Instant::now() + Duration::from_secs(60);
    while b.exited().is_none() {
        assert!(Instant::now() < deadline, "node-b's proxy did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let b_admin = admin(binary::free_port());
    b = Killed(binary::spawn(&cp, "node-b", b_admin.port(), &grace));
    until_ready(b_admin).await;
    until_served(&client, server).await;
    set(Phase::FromDisk);
    // It serves from what it kept: nothing came from the control plane, nothing on disk
    // was refused.
    let dump = config_dump(b_admin).await;
    let persisted = &dump["persisted_state"];
    assert_eq!(persisted["discovery"]["source"], "disk", "{persisted}");
    assert_eq!(persisted["policy"]["source"], "disk", "{persisted}");
    assert_eq!(persisted["identities"][0]["source"], "disk", "{persisted}");
    assert_eq!(dump["discovery"]["synced"], true);
    let m = metrics(b_admin).await;
    assert_eq!(
        metric_sum(&m, "persisted_state_from_disk", &["kind=\"discovery\""]),
        1
    );
    assert_eq!(
        metric_sum(&m, "persisted_state_rejected_total", &[]),
        0,
        "{m}"
    );
    assert_eq!(metric_sum(&m, "identity_cert_refresh_total", &[]), 0);
    let b_not_after = not_after(&dump);
    assert_eq!(b_not_after.len(), 1, "{dump}");

    // Renewals fail, again and again, while requests keep flowing.
    until_metric(a.admin_addr, "identity_cert_refresh_failure_total", &[], 3).await;
    until_metric(b_admin, "identity_cert_refresh_failure_total", &[], 2).await;
    assert_eq!(
        metric_sum(&a.metrics().await, "identity_cert_refresh_total", &[]),
        a_refreshed,
        "node-a renewed with the control plane away"
    );
    let from_disk = served(Phase::FromDisk);
    assert!(
        from_disk > 0,
        "the restarted proxy served nothing from disk"
    );

    // The control plane comes back: renewals resume, discovery is its own again.
    cp.resume().await;
    set(Phase::Back);
    until_metric(
        a.admin_addr,
        "identity_cert_refresh_total",
        &[],
        a_refreshed + 1,
    )
    .await;
    until_metric(b_admin, "identity_cert_refresh_total", &[], 1).await;
    until(
        "node-b's certificate renewed and discovery from the control plane",
        || async {
            let dump = config_dump(b_admin).await;
            let later = not_after(&dump).iter().all(|n| *n > b_not_after[0]);
            let source = &dump["persisted_state"]["discovery"]["source"];
            (later && source == "control-plane")
                .then_some(())
                .ok_or(format!("{}", dump["persisted_state"]))
        },
    )
    .await;

    // The new pod's sandbox, retried as the runtime does, now starts and is served.
    let mut retries = 0;
    loop {
        match add_late(&cni_socket, &t).await {
            Response::Redirected => break,
            Response::Error { code, msg, .. } if code == ambit_api::cni::code::TRY_AGAIN => {
                retries += 1;
                assert!(retries < 60, "the late pod never started: {msg}");
            }
            other => panic!("the late pod's ADD: {other:?}"),
        }
    }
    let late = PathBuf::from(t.pod("late").path());
    let late_before = seen.total();
    until_served(&late, server).await;
    assert!(seen.total() > late_before);
    let m = metrics(b_admin).await;
    assert!(
        metric_sum(&m, "request_total", &["direction=\"inbound\"", "sa/late"]) > 0,
        "the late pod's requests did not arrive with its identity: {m}"
    );
    until("served with the control plane back", || async {
        (served(Phase::Back) >= 40)
            .then_some(())
            .ok_or("not yet".into())
    })
    .await;
    stop_tx.send_replace(true);

    for (what, l) in &loads {
        let counts: Vec<_> = PHASES
            .iter()
            .map(|p| {
                format!(
                    "{p:?} {} ok, {} failed",
                    l.ok(*p as usize),
                    l.failed(*p as usize).len()
                )
            })
            .collect();
        eprintln!("{what}: {}", counts.join("; "));
        for p in PHASES.into_iter().filter(|p| *p != Phase::Restarting) {
            let failed = l.failed(p as usize);
            assert!(failed.is_empty(), "{what}, {p:?}: {failed:?}");
            assert!(l.ok(p as usize) > 0, "{what}: nothing served in {p:?}");
        }
    }

    drop(b);
    a.stop().await;
    cp.stop().await;
    drop(handles_a);
    drop(handles_b);
    std::mem::forget(server_ns);
    drop(t);
}
