//! The node proxy application end to end: it watches discovery, obtains a certificate for
//! each identity on its node, reports readiness, and serves its admin views.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use ambit_e2e::{http_get, node_token, proxy_config, ControlPlane, NodeProxy};
use ambit_proxy::config::Config;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CLUSTER: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: shop, annotations: {ambit.dev/mesh: enabled}}
---
apiVersion: v1
kind: Pod
metadata: {name: web-0, namespace: shop, annotations: {local.ambit.dev/netns: /run/netns/web-0}}
spec: {nodeName: node-a, serviceAccountName: web, containers: []}
status: {podIP: 10.1.0.5, phase: Running}
"#;

async fn request(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}", body.len());
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let code = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    (
        code,
        text.split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default(),
    )
}

async fn wait_for_status(addr: SocketAddr, path: &str, want: u16) -> String {
    for _ in 0..300 {
        let (code, body) = http_get(addr, path).await;
        if code == want {
            return body;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "{path} never answered {want}: {:?}",
        http_get(addr, path).await
    );
}

#[tokio::test]
async fn the_proxy_gets_its_pods_identities_and_reports_ready() {
    let t = ambit_e2e::netns::Topology::new(&["web"]);
    let cluster = CLUSTER.replace("/run/netns/web-0", &t.pod("web").path());
    let cp = ControlPlane::start(&cluster, &["node-a"]).await;
    let config = NodeProxy::config(&cp, "node-a");
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = admin.local_addr().unwrap();
    let (subscriber, log_level) =
        ambit_proxy::logging::subscriber("info", ambit_proxy::logging::LogFormat::Plain).unwrap();
    let _guard = tracing::subscriber::set_default(subscriber);
    let proxy = tokio::spawn(ambit_proxy::app::run(
        config,
        admin,
        log_level,
        std::future::pending(),
    ));

    wait_for_status(addr, "/ready", 200).await;
    let (code, dump) = request(addr, "GET", "/config_dump", "").await;
    assert_eq!(code, 200);
    let dump: serde_json::Value = serde_json::from_str(&dump).unwrap();
    assert_eq!(dump["pods"][0]["pod"], "shop/web-0");
    assert_eq!(dump["pods"][0]["netns"], t.pod("web").path());
    assert_eq!(
        dump["identities"][0]["identity"],
        "spiffe://cluster.local/ns/shop/sa/web"
    );
    assert!(
        dump["identities"][0]["cert_not_after_unix"]
            .as_u64()
            .unwrap()
            > 0
    );
    let text = dump.to_string();
    assert!(
        !text.contains("PRIVATE KEY") && !text.contains(&node_token("node-a")),
        "secrets in {text}"
    );
    let (_, metrics) = http_get(addr, "/metrics").await;
    assert!(metrics.contains("identity_cert_expiration_timestamp_seconds{identity=\"spiffe://cluster.local/ns/shop/sa/web\"}"), "{metrics}");
    assert!(metrics.contains("discovery_connected 1"), "{metrics}");

    // A second pod with a new identity: fetched ahead, and /ready reflects it.
    cp.set_cluster(&format!("{cluster}---\napiVersion: v1\nkind: Pod\nmetadata: {{name: db-0, namespace: shop}}\nspec: {{nodeName: node-a, serviceAccountName: db, containers: []}}\nstatus: {{podIP: 10.1.0.6}}\n"));
    for _ in 0..300 {
        let (_, d) = request(addr, "GET", "/config_dump", "").await;
        if d.contains("sa/db\"") && d.matches("cert_not_after_unix\": null").count() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, d) = request(addr, "GET", "/config_dump", "").await;
    assert!(d.contains("spiffe://cluster.local/ns/shop/sa/db"), "{d}");
    wait_for_status(addr, "/ready", 200).await;

    // Run-time log level.
    assert_eq!(
        request(addr, "PUT", "/log-level", "ambit_proxy=debug")
            .await
            .0,
        200
    );
    assert_eq!(
        request(addr, "GET", "/log-level", "").await.1,
        "ambit_proxy=debug\n"
    );
    assert_eq!(request(addr, "PUT", "/log-level", "=[").await.0, 400);

    // POST /shutdown drains and the proxy returns cleanly.
    assert_eq!(request(addr, "POST", "/shutdown", "").await.0, 202);
    tokio::time::timeout(Duration::from_secs(10), proxy)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    cp.stop().await;
}

#[tokio::test]
async fn the_proxy_is_not_ready_while_the_control_plane_is_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    std::fs::write(dir.path().join("token"), "0123456789abcdef-token").unwrap();
    let root = ambit_control::pki::generate::trust_anchor(
        "cluster.local",
        ambit_control::pki::generate::Validity::starting_now(Duration::from_secs(3600)),
    )
    .unwrap();
    std::fs::write(dir.path().join("root.crt"), root.cert_pem).unwrap();
    let config = proxy_config(
        "node-a",
        format!("https://{closed}"),
        format!("https://{closed}"),
        dir.path().join("token"),
        dir.path().join("root.crt"),
    );
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = admin.local_addr().unwrap();
    let (_, log_level) =
        ambit_proxy::logging::subscriber("info", ambit_proxy::logging::LogFormat::Plain).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let proxy = tokio::spawn(ambit_proxy::app::run(
        config,
        admin,
        log_level,
        async move {
            let _ = stopped.await;
        },
    ));
    let body = wait_for_status(addr, "/ready", 503).await;
    assert!(
        body.contains("discovery has not delivered a snapshot"),
        "{body}"
    );
    assert_eq!(http_get(addr, "/live").await.0, 200);
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), proxy)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn bad_configuration_is_reported_all_at_once() {
    let config = Config {
        identity_url: "ambit-control:8080".into(),
        trust_domain: "Bad Domain".into(),
        ..proxy_config(
            "",
            String::new(),
            "https://ok:8086".into(),
            "/nonexistent/token".into(),
            "/nonexistent/roots.pem".into(),
        )
    };
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (_, log_level) =
        ambit_proxy::logging::subscriber("info", ambit_proxy::logging::LogFormat::Plain).unwrap();
    let err = ambit_proxy::app::run(config, admin, log_level, std::future::pending())
        .await
        .unwrap_err()
        .to_string();
    for want in [
        "--node-name",
        "--identity-url",
        "--trust-domain",
        "--token-file",
        "--trust-anchors",
    ] {
        assert!(err.contains(want), "missing {want} in {err}");
    }
}
