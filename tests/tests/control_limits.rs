//! The control plane's limits (issue 10, "Nothing grows without bound"), against a real
//! control plane on loopback: connections per listener, HTTP/2 rapid reset, a slowloris
//! on the admin server. Each test asserts counts and outcomes; the timeouts below are
//! deadlines, never performance thresholds.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use ambit_api::proto::discovery::discovery_client::DiscoveryClient;
use ambit_api::proto::identity::identity_client::IdentityClient;
use ambit_api::proto::identity::{CertifyRequest, CertifyResponse};
use ambit_control::config::Config;
use ambit_control::limits;
use ambit_control::{Control, Listeners};
use ambit_e2e::{csr, http_get, metric_sum, node_token, raw_certify, test_pki, ControlPlane};
use ambit_proxy::tls::{self, SpiffeServerVerifier, TrustBundle};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const CLUSTER: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: shop, annotations: {ambit.dev/mesh: enabled}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: web, namespace: shop}
---
apiVersion: v1
kind: Pod
metadata: {name: web-0, namespace: shop}
spec: {nodeName: node-a, serviceAccountName: web, containers: [{name: app, image: web}]}
status: {podIP: 10.1.0.5, phase: Running}
"#;

/// A deadline for what should happen at once (a refusal, an answer).
const PROMPTLY: Duration = Duration::from_secs(5);

/// A control plane started with `--max-connections`: the harness's [`ControlPlane`] takes
/// no extra flags for the local backend, so this starts one the same way (flags parsed as
/// the binary does, listeners on loopback port 0) with that one flag more.
struct Limited {
    _dir: tempfile::TempDir,
    root_pem: String,
    identity: SocketAddr,
    discovery: SocketAddr,
    admin: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Limited {
    async fn start(max_connections: usize) -> Self {
        let (root, iss) = test_pki();
        let dir = tempfile::tempdir().unwrap();
        let p = |n: &str| dir.path().join(n);
        let arg = |n: &str| p(n).to_string_lossy().into_owned();
        std::fs::create_dir(p("cluster")).unwrap();
        std::fs::write(p("cluster/cluster.yaml"), CLUSTER).unwrap();
        std::fs::write(
            p("tokens.yaml"),
            format!("nodes:\n  node-a: {}\n", node_token("node-a")),
        )
        .unwrap();
        std::fs::write(p("root.crt"), &root.cert_pem).unwrap();
        std::fs::write(p("issuer.crt"), &iss.cert_pem).unwrap();
        std::fs::write(p("issuer.key"), &iss.key_pem).unwrap();
        let args = [
            "ambit-control".to_string(),
            "--trust-anchors".into(),
            arg("root.crt"),
            "--issuer-cert".into(),
            arg("issuer.crt"),
            "--issuer-key".into(),
            arg("issuer.key"),
            "--backend".into(),
            "local".into(),
            "--local-dir".into(),
            arg("cluster"),
            "--node-tokens".into(),
            arg("tokens.yaml"),
            "--max-connections".into(),
            max_connections.to_string(),
        ];
        let config = <Config as clap::Parser>::try_parse_from(&args).unwrap();
        assert_eq!(config.max_connections, max_connections);
        let bind = || tokio::net::TcpListener::bind("127.0.0.1:0");
        let (identity, discovery, admin) = (
            bind().await.unwrap(),
            bind().await.unwrap(),
            bind().await.unwrap(),
        );
        let addrs = [&identity, &discovery, &admin].map(|l| l.local_addr().unwrap());
        let control = Control::build(config).await.unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let listeners = Listeners {
                identity,
                discovery,
                policy: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
                admin,
            };
            control
                .serve(listeners, async move {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        let cp = Self {
            _dir: dir,
            root_pem: root.cert_pem,
            identity: addrs[0],
            discovery: addrs[1],
            admin: addrs[2],
            stop: Some(stop),
            task: Some(task),
        };
        let ready = async {
            while http_get(cp.admin, "/ready").await.0 != 200 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), ready)
            .await
            .expect("control plane ready");
        cp
    }

    /// A node proxy's channel to `addr` (TLS, the control plane's identity required).
    fn channel(&self, addr: SocketAddr) -> tonic::transport::Channel {
        let bundle = TrustBundle::from_pem(self.root_pem.as_bytes(), "cluster.local").unwrap();
        let id = ambit_proxy::control::default_identity("cluster.local").unwrap();
        ambit_proxy::control::channel(&format!("https://{addr}"), &bundle, id, PROMPTLY).unwrap()
    }

    async fn certify(&self) -> Result<CertifyResponse, tonic::Status> {
        let mut client = IdentityClient::new(self.channel(self.identity));
        let mut req = tonic::Request::new(CertifyRequest {
            namespace: "shop".into(),
            service_account: "web".into(),
            csr_der: csr(),
        });
        let token = format!("Bearer {}", node_token("node-a"));
        req.metadata_mut()
            .insert("authorization", token.parse().unwrap());
        client.certify(req).await.map(tonic::Response::into_inner)
    }

    /// Opens a discovery stream as node-a's proxy does; the number of workloads in its
    /// first update.
    async fn watch(&self) -> Result<usize, tonic::Status> {
        let mut client = DiscoveryClient::new(self.channel(self.discovery));
        let (req, _requests) = ambit_e2e::discovery::watch_request("node-a", Some("node-a"), &[]);
        let mut stream = client.watch(req).await?.into_inner();
        let first = stream.message().await?.expect("a snapshot");
        assert!(first.snapshot);
        Ok(first.workloads.len())
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap();
    }
}

/// A TLS client config for the control plane's gRPC ports, as a node proxy's.
fn client_tls(root_pem: &str) -> rustls::ClientConfig {
    let bundle = TrustBundle::from_pem(root_pem.as_bytes(), "cluster.local").unwrap();
    let id = ambit_proxy::control::default_identity("cluster.local").unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(SpiffeServerVerifier::new(bundle, vec![id])))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    config
}

async fn tls_connect(
    root_pem: &str,
    addr: SocketAddr,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = rustls_pki_types::ServerName::IpAddress(addr.ip().into());
    tokio_rustls::TlsConnector::from(Arc::new(client_tls(root_pem)))
        .connect(name, tcp)
        .await
}

/// Whether the server closed `s` (EOF or reset) before `deadline`; what it sent first.
async fn closed_within(s: &mut TcpStream, deadline: Duration) -> (bool, Vec<u8>) {
    let mut got = Vec::new();
    let closed = tokio::time::timeout(deadline, async {
        let mut buf = [0u8; 1024];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    (closed, got)
}

/// Whether the server still holds `s` open (nothing to read, no EOF).
fn still_open(s: &TcpStream) -> bool {
    let mut buf = [0u8; 1];
    matches!(s.try_read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

#[tokio::test]
async fn connections_over_the_limit_are_closed_at_once_counted_and_served_once_places_free() {
    const LIMIT: usize = 4;
    const EXTRA: usize = 3;
    ambit_e2e::init_test_logging();
    let cp = Limited::start(LIMIT).await;

    // Fill both gRPC listeners with idle TCP connections (no TLS handshake: each holds
    // its place until the handshake timeout, far beyond this test's steps).
    let mut idle = Vec::new();
    for addr in [cp.identity, cp.discovery] {
        let mut held = Vec::new();
        for _ in 0..LIMIT {
            held.push(TcpStream::connect(addr).await.unwrap());
        }
        // Accepted in order: these come after the limit and are closed at once.
        for _ in 0..EXTRA {
            let mut s = TcpStream::connect(addr).await.unwrap();
            let (closed, got) = closed_within(&mut s, PROMPTLY).await;
            assert!(closed, "a connection over the limit of {addr} was kept");
            assert!(got.is_empty());
        }
        assert!(
            held.iter().all(still_open),
            "a connection within the limit was closed"
        );
        idle.push(held);
    }
    let metrics = http_get(cp.admin, "/metrics").await.1;
    for server in ["identity", "discovery"] {
        let label = format!("server=\"{server}\"");
        assert_eq!(
            metric_sum(&metrics, "control_connections_refused_total", &[&label]),
            EXTRA as u64,
            "{metrics}"
        );
        assert_eq!(
            metric_sum(&metrics, "control_connections_open", &[&label]),
            LIMIT as u64,
            "{metrics}"
        );
    }

    // A node proxy is refused while the listeners are full...
    let refused = cp.certify().await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    let metrics = http_get(cp.admin, "/metrics").await.1;
    assert!(
        metric_sum(
            &metrics,
            "control_connections_refused_total",
            &["server=\"identity\""]
        ) > EXTRA as u64,
        "{metrics}"
    );

    // ... and served once places free up (each closed connection gives its place back).
    drop(idle);
    let served = async {
        loop {
            if let Ok(r) = cp.certify().await {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let issued = tokio::time::timeout(Duration::from_secs(10), served)
        .await
        .expect("the identity service serves again once connections close");
    assert!(!issued.leaf_der.is_empty());
    let watched = async {
        loop {
            if let Ok(n) = cp.watch().await {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let workloads = tokio::time::timeout(Duration::from_secs(10), watched)
        .await
        .expect("the discovery service serves again once connections close");
    assert_eq!(workloads, 1, "node-a's snapshot has web-0");
    cp.stop().await;
}

#[tokio::test]
async fn http2_rapid_reset_gets_goaway_while_other_clients_are_served() {
    ambit_e2e::init_test_logging();
    let cp = ControlPlane::start(CLUSTER, &["node-a"]).await;
    // Another proxy, connected before the attack and served throughout.
    let mut other = IdentityClient::new(cp.channel(&cp.identity_url()));
    let certify = |client: &mut IdentityClient<tonic::transport::Channel>| {
        let mut req = tonic::Request::new(CertifyRequest {
            namespace: "shop".into(),
            service_account: "web".into(),
            csr_der: csr(),
        });
        let token = format!("Bearer {}", node_token("node-a"));
        req.metadata_mut()
            .insert("authorization", token.parse().unwrap());
        let mut client = client.clone();
        async move { client.certify(req).await }
    };
    certify(&mut other).await.unwrap();

    let tls = tls_connect(&cp.root.cert_pem, cp.identity_addr)
        .await
        .unwrap();
    let (send, conn) = h2::client::handshake(tls).await.unwrap();
    let conn = tokio::spawn(conn);
    // The server's SETTINGS bound the streams a client may open at once.
    let settings = async {
        while send.current_max_send_streams() == usize::MAX {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(PROMPTLY, settings)
        .await
        .expect("the server's SETTINGS");
    assert_eq!(
        send.current_max_send_streams(),
        limits::MAX_CONCURRENT_STREAMS as usize
    );

    // Open and reset streams as fast as the client can: each one is work the server
    // would start and never finish. The server must close the connection. In batches,
    // each written at once, so that the server reads a batch whole: it then closes with
    // nothing unread, and the client reads the GOAWAY rather than a reset connection.
    let mut conn = conn;
    let mut reset = 0;
    let mut ended = None;
    'attack: for _ in 0..40 {
        for _ in 0..2 * limits::HTTP2_MAX_PENDING_ACCEPT_RESET_STREAMS {
            let Ok(mut ready) = send.clone().ready().await else {
                break 'attack;
            };
            let req = http::Request::post(format!(
                "https://{}/ambit.identity.v1.Identity/Certify",
                cp.identity_addr
            ))
            .header("content-type", "application/grpc")
            .body(())
            .unwrap();
            let Ok((_response, mut stream)) = ready.send_request(req, false) else {
                break 'attack;
            };
            stream.send_reset(h2::Reason::CANCEL);
            reset += 1;
        }
        tokio::select! {
            r = &mut conn => {
                ended = Some(r.unwrap());
                break;
            }
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
    let ended = match ended {
        Some(e) => e,
        None => tokio::time::timeout(PROMPTLY, conn)
            .await
            .expect("the server closes a connection that resets streams without end")
            .unwrap(),
    };
    let error = ended.expect_err("closed with an error");
    assert!(error.is_go_away(), "{error:?} after {reset} resets");
    assert_eq!(
        error.reason(),
        Some(h2::Reason::ENHANCE_YOUR_CALM),
        "{error:?} after {reset} resets"
    );

    // The other proxy is still served, on its connection and on a new one.
    certify(&mut other).await.unwrap();
    raw_certify(&cp, Some(&node_token("node-a")), "shop", "web", csr())
        .await
        .unwrap();
    cp.stop().await;
}

#[tokio::test]
async fn a_slowloris_on_admin_is_closed_by_the_header_read_timeout_while_metrics_answer() {
    ambit_e2e::init_test_logging();
    let cp = ControlPlane::start(CLUSTER, &["node-a"]).await;
    let mut slow = Vec::new();
    for _ in 0..8 {
        let mut s = TcpStream::connect(cp.admin_addr).await.unwrap();
        // A request line and part of a header; never the blank line that ends the head.
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0")
            .await
            .unwrap();
        slow.push(s);
    }
    let (code, metrics) = http_get(cp.admin_addr, "/metrics").await;
    assert_eq!(code, 200, "{metrics}");
    // The slow ones are open (and counted) while others are answered.
    assert!(
        metric_sum(&metrics, "control_connections_open", &["server=\"admin\""]) > 8,
        "{metrics}"
    );
    let deadline = limits::ADMIN_HEADER_READ_TIMEOUT + PROMPTLY;
    for s in &mut slow {
        let (closed, got) = closed_within(s, deadline).await;
        assert!(
            closed,
            "a slowloris held the admin server past its header-read timeout"
        );
        // Closed, or told it timed out: never served.
        let head = String::from_utf8_lossy(&got);
        assert!(got.is_empty() || head.starts_with("HTTP/1.1 408"), "{head}");
    }
    let (code, metrics) = http_get(cp.admin_addr, "/metrics").await;
    assert_eq!(code, 200);
    assert_eq!(
        metric_sum(&metrics, "control_connections_open", &["server=\"admin\""]),
        1,
        "only this scrape is open: {metrics}"
    );
    cp.stop().await;
}

#[tokio::test]
async fn the_admin_server_holds_at_most_its_limit_and_idle_connections_time_out() {
    const EXTRA: usize = 3;
    ambit_e2e::init_test_logging();
    let cp = ControlPlane::start(CLUSTER, &["node-a"]).await;
    let mut held = Vec::new();
    for _ in 0..limits::ADMIN_MAX_CONNECTIONS {
        held.push(TcpStream::connect(cp.admin_addr).await.unwrap());
    }
    let mut extra = Vec::new();
    for _ in 0..EXTRA {
        let mut s = TcpStream::connect(cp.admin_addr).await.unwrap();
        let (closed, got) = closed_within(&mut s, PROMPTLY).await;
        assert!(closed, "a connection over the admin limit was kept");
        assert!(got.is_empty());
        extra.push(s);
    }
    // Idle connections that never send a request are closed by the header-read timeout,
    // so the held places come back without the clients' help.
    let deadline = limits::ADMIN_HEADER_READ_TIMEOUT + PROMPTLY;
    for s in &mut held {
        assert!(
            closed_within(s, deadline).await.0,
            "an idle admin connection was kept"
        );
    }
    let (code, metrics) = http_get(cp.admin_addr, "/metrics").await;
    assert_eq!(code, 200, "{metrics}");
    assert_eq!(
        metric_sum(
            &metrics,
            "control_connections_refused_total",
            &["server=\"admin\""]
        ),
        EXTRA as u64,
        "{metrics}"
    );
    cp.stop().await;
}
