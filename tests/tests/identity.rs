//! The identity system end to end: the real control plane CA over gRPC on loopback, the
//! node proxy's identity manager and verifiers, certificates checked by rustls and openssl.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use ambit_api::proto::identity::identity_client::IdentityClient;
use ambit_api::proto::identity::CertifyRequest;
use ambit_api::WorkloadIdentity;
use ambit_e2e::{csr, node_token, raw_certify, ControlPlane};
use ambit_proxy::identity::{
    CaClient, GrpcCaClient, IdentityConfig, IdentityManager, IdentityMetrics,
};
use ambit_proxy::tls::{self, TrustBundle};
use rcgen::{CertificateParams, KeyPair};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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
---
apiVersion: v1
kind: Pod
metadata: {name: db-0, namespace: shop}
spec: {nodeName: node-b, serviceAccountName: db, containers: [{name: app, image: db}]}
status: {podIP: 10.2.0.5, phase: Running}
"#;

fn web() -> WorkloadIdentity {
    WorkloadIdentity::new("cluster.local", "shop", "web").unwrap()
}

fn db() -> WorkloadIdentity {
    WorkloadIdentity::new("cluster.local", "shop", "db").unwrap()
}

fn manager(cp: &ControlPlane, node: &str) -> IdentityManager {
    let ca = GrpcCaClient::new(cp.channel(&cp.identity_url()), node_token(node));
    let mut registry = prometheus_client::registry::Registry::default();
    IdentityManager::new(
        Arc::new(ca),
        IdentityConfig::default(),
        IdentityMetrics::register(&mut registry),
    )
}

#[tokio::test]
async fn proxies_on_two_nodes_get_certificates_and_complete_mutual_tls() {
    let cp = ControlPlane::start(CLUSTER, &["node-a", "node-b"]).await;
    let (a, b) = (manager(&cp, "node-a"), manager(&cp, "node-b"));
    a.pod_added("shop/web-0", &web());
    b.pod_added("shop/db-0", &db());
    let web_cert = tokio::time::timeout(Duration::from_secs(10), a.ready(&web()))
        .await
        .unwrap()
        .unwrap();
    let db_cert = tokio::time::timeout(Duration::from_secs(10), b.ready(&db()))
        .await
        .unwrap()
        .unwrap();

    // node-a (client, as web) to node-b (server, as db), over a real loopback socket.
    let bundle = TrustBundle::from_pem(cp.root.cert_pem.as_bytes(), "cluster.local").unwrap();
    let server_cfg = Arc::new(tls::server_config(&bundle, db_cert.certified_key()).unwrap());
    let client_cfg =
        Arc::new(tls::client_config(&bundle, web_cert.certified_key(), vec![db()]).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut s = tokio_rustls::TlsAcceptor::from(server_cfg)
            .accept(tcp)
            .await
            .unwrap();
        let client_id = tls::svid_identity(&s.get_ref().1.peer_certificates().unwrap()[0]).unwrap();
        let mut buf = vec![0u8; 5];
        s.read_exact(&mut buf).await.unwrap();
        s.write_all(&buf).await.unwrap();
        s.shutdown().await.unwrap();
        client_id
    });
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut c = tokio_rustls::TlsConnector::from(client_cfg)
        .connect(name, tcp)
        .await
        .unwrap();
    let server_id = tls::svid_identity(&c.get_ref().1.peer_certificates().unwrap()[0]).unwrap();
    assert_eq!(
        c.get_ref().1.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_3)
    );
    c.write_all(b"hello").await.unwrap();
    let mut echoed = Vec::new();
    c.read_to_end(&mut echoed).await.unwrap();
    assert_eq!(echoed, b"hello");
    assert_eq!(server_id, db());
    assert_eq!(server.await.unwrap(), web());

    let metrics = cp.metrics().await;
    assert!(
        metrics.contains("identity_certificates_issued_total 2"),
        "{metrics}"
    );
    cp.stop().await;
}

#[tokio::test]
async fn every_refusal_is_a_precise_grpc_status_and_is_counted() {
    let cp = ControlPlane::start(CLUSTER, &["node-a", "node-b"]).await;
    let token_a = node_token("node-a");

    let s = raw_certify(&cp, None, "shop", "web", csr())
        .await
        .unwrap_err();
    assert_eq!(s.code(), tonic::Code::Unauthenticated);
    assert!(s.message().contains("authorization: Bearer"), "{s:?}");

    let s = raw_certify(&cp, Some("not-a-node-token-at-all"), "shop", "web", csr())
        .await
        .unwrap_err();
    assert_eq!(s.code(), tonic::Code::Unauthenticated);
    assert!(s.message().contains("node token not recognised"), "{s:?}");

    // node-a runs web-0 but not db-0.
    let s = raw_certify(&cp, Some(&token_a), "shop", "db", csr())
        .await
        .unwrap_err();
    assert_eq!(s.code(), tonic::Code::PermissionDenied);
    assert_eq!(
        s.message(),
        "node node-a runs no pod with ServiceAccount shop/db"
    );

    // A ServiceAccount no pod uses anywhere.
    let s = raw_certify(&cp, Some(&token_a), "shop", "ghost", csr())
        .await
        .unwrap_err();
    assert_eq!(s.code(), tonic::Code::PermissionDenied);
    assert_eq!(
        s.message(),
        "node node-a runs no pod with ServiceAccount shop/ghost"
    );

    let s = raw_certify(&cp, Some(&token_a), "shop", "web", b"garbage".to_vec())
        .await
        .unwrap_err();
    assert_eq!(s.code(), tonic::Code::InvalidArgument);
    assert!(s.message().contains("not a DER-encoded PKCS#10"), "{s:?}");

    let s = raw_certify(&cp, Some(&token_a), "Shop", "web", csr())
        .await
        .unwrap_err();
    assert_eq!(s.code(), tonic::Code::InvalidArgument);
    assert!(s.message().contains("invalid namespace"), "{s:?}");

    // The proxy side sees the refusal as such, not as an outage.
    let client = GrpcCaClient::new(cp.channel(&cp.identity_url()), token_a.clone());
    let err = client.certify(&db(), csr()).await.unwrap_err();
    assert!(
        err.to_string().contains("refused (PermissionDenied)"),
        "{err}"
    );

    let m = cp.metrics().await;
    for line in [
        "identity_requests_refused_total{reason=\"unauthenticated\"} 2",
        "identity_requests_refused_total{reason=\"permission_denied\"} 3",
        "identity_requests_refused_total{reason=\"invalid_argument\"} 2",
        "identity_certificates_issued_total 0",
        "identity_issuer_expiration_timestamp_seconds ",
    ] {
        assert!(m.contains(line), "missing {line:?} in\n{m}");
    }
    cp.stop().await;
}

#[tokio::test]
async fn the_control_plane_serves_tls_with_its_own_identity_only() {
    let cp = ControlPlane::start(CLUSTER, &["node-a"]).await;
    // Plaintext gRPC is not answered.
    let plain = tonic::transport::Endpoint::from_shared(cp.identity_url())
        .unwrap()
        .connect()
        .await;
    let refused = match plain {
        Err(_) => true,
        Ok(ch) => IdentityClient::new(ch)
            .certify(CertifyRequest {
                namespace: "shop".into(),
                service_account: "web".into(),
                csr_der: csr(),
            })
            .await
            .is_err(),
    };
    assert!(refused, "the identity service answered plaintext gRPC");
    // A client that expects another identity for the control plane refuses it.
    let bundle = TrustBundle::from_pem(cp.root.cert_pem.as_bytes(), "cluster.local").unwrap();
    let other = WorkloadIdentity::new("cluster.local", "kube-system", "impostor").unwrap();
    let ch =
        ambit_proxy::control::channel(&cp.identity_url(), &bundle, other, Duration::from_secs(5))
            .unwrap();
    let err = GrpcCaClient::new(ch, node_token("node-a"))
        .certify(&web(), csr())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("unavailable"), "{err}");
    // With the right identity, the same request succeeds.
    raw_certify(&cp, Some(&node_token("node-a")), "shop", "web", csr())
        .await
        .unwrap();
    cp.stop().await;
}

#[tokio::test]
async fn csr_asking_for_extra_names_gets_only_its_identity() {
    let cp = ControlPlane::start(CLUSTER, &["node-a"]).await;
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["admin.kube-system.svc".to_string()]).unwrap();
    params.subject_alt_names.push(rcgen::SanType::URI(
        "spiffe://cluster.local/ns/kube-system/sa/admin"
            .try_into()
            .unwrap(),
    ));
    let csr_der = params.serialize_request(&key).unwrap().der().to_vec();
    let resp = raw_certify(&cp, Some(&node_token("node-a")), "shop", "web", csr_der)
        .await
        .unwrap();
    let leaf = rustls_pki_types::CertificateDer::from(resp.leaf_der.clone());
    assert_eq!(tls::svid_identity(&leaf).unwrap(), web());
    let (_, x509) = <x509_parser::certificate::X509Certificate<'_> as x509_parser::prelude::FromDer<'_, _>>::from_der(&resp.leaf_der).unwrap();
    let names = format!(
        "{:?}",
        x509.subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names
    );
    assert!(!names.contains("kube-system"), "{names}");
    assert_eq!(resp.intermediates_der.len(), 1);
    let lifetime = resp.not_after_unix - resp.not_before_unix;
    assert_eq!(lifetime, 24 * 3600 + 20);
    cp.stop().await;
}

#[tokio::test]
async fn authorization_follows_the_pod_when_the_local_state_changes() {
    let cp = ControlPlane::start(CLUSTER, &["node-a", "node-b"]).await;
    let (ta, tb) = (node_token("node-a"), node_token("node-b"));
    raw_certify(&cp, Some(&ta), "shop", "web", csr())
        .await
        .unwrap();
    assert_eq!(
        raw_certify(&cp, Some(&tb), "shop", "web", csr())
            .await
            .unwrap_err()
            .code(),
        tonic::Code::PermissionDenied
    );

    // web-0 is rescheduled to node-b.
    cp.set_cluster(&CLUSTER.replace("spec: {nodeName: node-a", "spec: {nodeName: node-b"));
    let mut moved = false;
    for _ in 0..200 {
        if raw_certify(&cp, Some(&tb), "shop", "web", csr())
            .await
            .is_ok()
        {
            moved = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(moved, "the reload did not reach the CA");
    assert_eq!(
        raw_certify(&cp, Some(&ta), "shop", "web", csr())
            .await
            .unwrap_err()
            .code(),
        tonic::Code::PermissionDenied
    );

    // A broken edit keeps the last good state.
    cp.set_cluster("apiVersion: v1\nkind: Pod\nmetadata: {name: x\n");
    tokio::time::sleep(Duration::from_millis(300)).await;
    raw_certify(&cp, Some(&tb), "shop", "web", csr())
        .await
        .unwrap();
    let m = cp.metrics().await;
    assert!(
        m.contains("local_reloads_total{result=\"failure\"} 1"),
        "{m}"
    );
    cp.stop().await;
}

#[tokio::test]
async fn an_unreachable_ca_is_an_outage_the_manager_retries() {
    let cp = ControlPlane::start(CLUSTER, &["node-a"]).await;
    // Nothing listens on this port (bound, then closed).
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let client = GrpcCaClient::new(cp.channel(&format!("https://{addr}")), node_token("node-a"));
    let err = client.certify(&web(), csr()).await.unwrap_err();
    assert!(
        matches!(err, ambit_proxy::identity::CaError::Unavailable(_)),
        "{err}"
    );
}
