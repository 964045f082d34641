//! Bad input on the mesh port (4143): plaintext, TLS from a foreign CA, an expired client
//! certificate, no client certificate, resets. Each is refused and counted, nothing reaches
//! the application, the proxy keeps serving, and no file descriptor leaks. One test in this
//! binary, so that the descriptor count is not disturbed by other tests.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use ambit_e2e::netns::Topology;
use ambit_e2e::{ControlPlane, NodeProxy};
use ambit_proxy::netns::Netns;
use ambit_proxy::testing::TestCa;
use ambit_proxy::tls::{self, TrustBundle};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn cluster(t: &Topology) -> String {
    let (client, server) = (t.pod("client"), t.pod("server"));
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: shop, annotations: {{ambit.dev/mesh: enabled}}}}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: client, namespace: shop, annotations: {{local.ambit.dev/netns: {}}}}}\n\
         spec: {{nodeName: node-a, serviceAccountName: client, containers: []}}\nstatus: {{podIP: {}}}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: server, namespace: shop, annotations: {{local.ambit.dev/netns: {}}}}}\n\
         spec: {{nodeName: node-b, serviceAccountName: server, containers: []}}\nstatus: {{podIP: {}}}\n",
        client.path(),
        client.ip,
        server.path(),
        server.ip
    )
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// TLS to `addr` from `netns` with `config`; returns whether application data came back.
async fn tls_attempt(netns: &Netns, addr: SocketAddr, config: rustls::ClientConfig) -> bool {
    let tcp = netns.connect(addr, 0).await.unwrap();
    let name = rustls_pki_types::ServerName::IpAddress(addr.ip().into());
    let Ok(mut s) = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
    else {
        return false;
    };
    // In TLS 1.3 a rejected client certificate shows up at the first read.
    let _ = s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
    let mut buf = [0u8; 64];
    matches!(tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await, Ok(Ok(n)) if n > 0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mesh_port_refuses_bad_input_without_leaking() {
    let t = Topology::new(&["client", "server", "outsider"]);
    let cp = ControlPlane::start(&cluster(&t), &["node-a", "node-b"]).await;
    let (a, b) = (
        NodeProxy::start(&cp, "node-a").await,
        NodeProxy::start(&cp, "node-b").await,
    );
    let server_ns = Netns::open(Path::new(&t.pod("server").path())).unwrap();
    let outsider = Netns::open(Path::new(&t.pod("outsider").path())).unwrap();
    let client_ns = Netns::open(Path::new(&t.pod("client").path())).unwrap();

    // The application counts what reaches it.
    let reached = Arc::new(AtomicUsize::new(0));
    let listener = server_ns
        .bind("0.0.0.0:7000".parse().unwrap())
        .await
        .unwrap();
    let count = reached.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });

    let mesh = SocketAddr::from((t.pod("server").ip, 4143));
    let server_id = ambit_api::WorkloadIdentity::new("cluster.local", "shop", "server").unwrap();
    let real = TrustBundle::from_pem(cp.root.cert_pem.as_bytes(), "cluster.local").unwrap();
    let rogue = TestCa::new("cluster.local");
    let impostor = rogue.identity("shop", "client");
    let expired = rogue.certified_key_with(
        &[impostor.to_string()],
        SystemTime::now() - Duration::from_secs(7200),
        Duration::from_secs(3600),
    );

    let fds_before = open_fds();
    for round in 0..10 {
        // Plaintext HTTP on the mTLS port.
        let mut s = outsider.connect(mesh, 0).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf))
            .await
            .unwrap();
        assert!(
            buf.is_empty() || !String::from_utf8_lossy(&buf).contains("200"),
            "round {round}"
        );

        // A certificate from another CA, and an expired one.
        let foreign = tls::client_config(
            &real,
            rogue.certified_key(&impostor),
            vec![server_id.clone()],
        )
        .unwrap();
        assert!(
            !tls_attempt(&outsider, mesh, foreign).await,
            "foreign CA accepted"
        );
        let old = tls::client_config(&real, expired.clone(), vec![server_id.clone()]).unwrap();
        assert!(
            !tls_attempt(&outsider, mesh, old).await,
            "expired certificate accepted"
        );

        // No client certificate at all.
        let verifier = Arc::new(tls::SpiffeServerVerifier::new(
            real.clone(),
            vec![server_id.clone()],
        ));
        let mut anonymous = rustls::ClientConfig::builder_with_provider(tls::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        anonymous.alpn_protocols = vec![b"h2".to_vec()];
        assert!(
            !tls_attempt(&outsider, mesh, anonymous).await,
            "no client certificate accepted"
        );

        // Open and reset at once.
        let s = outsider.connect(mesh, 0).await.unwrap();
        socket2::SockRef::from(&s)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(s);
    }
    assert_eq!(
        reached.load(Ordering::SeqCst),
        0,
        "bad input reached the application"
    );

    // The mesh still works for real clients.
    let mut s = client_ns
        .connect(SocketAddr::from((t.pod("server").ip, 7000)), 0)
        .await
        .unwrap();
    s.write_all(b"still serving").await.unwrap();
    let mut buf = [0u8; 13];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"still serving");
    drop(s);

    // Every refused connection was closed: the descriptor count settles back.
    let mut settled = false;
    for _ in 0..100 {
        if open_fds() <= fds_before + 8 {
            settled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        settled,
        "descriptors leaked: {fds_before} before, {} after",
        open_fds()
    );

    let mb = b.metrics().await;
    let errors: u64 = mb
        .lines()
        .filter(|l| l.starts_with("tcp_errors_total") && l.contains("direction=\"inbound\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(errors >= 40, "refusals counted: {errors}\n{mb}");
    a.stop().await;
    b.stop().await;
    cp.stop().await;
}
