use super::*;
use crate::testing::TestCa;
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::{TlsAcceptor, TlsConnector};

struct Outcome {
    client: Result<WorkloadIdentity, String>,
    server: Result<WorkloadIdentity, String>,
}

/// Runs a mutual TLS handshake over an in-memory pipe and reports what each side learnt
/// of the other (or why it failed).
async fn handshake(
    client_bundle: &TrustBundle,
    client_key: Arc<CertifiedKey>,
    expected: Vec<WorkloadIdentity>,
    server_bundle: &TrustBundle,
    server_key: Arc<CertifiedKey>,
) -> Outcome {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let connector = TlsConnector::from(Arc::new(
        client_config(client_bundle, client_key, expected).unwrap(),
    ));
    let acceptor = TlsAcceptor::from(Arc::new(server_config(server_bundle, server_key).unwrap()));
    let server = tokio::spawn(async move {
        let mut tls = acceptor.accept(b).await.map_err(|e| e.to_string())?;
        let peer = tls
            .get_ref()
            .1
            .peer_certificates()
            .ok_or("no client certificate")?[0]
            .clone();
        let mut buf = [0u8; 4];
        tls.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
        tls.write_all(&buf).await.map_err(|e| e.to_string())?;
        tls.shutdown().await.ok();
        svid_identity(&peer).map_err(|e| e.to_string())
    });
    let client = async {
        let name = ServerName::try_from("10.0.0.1").unwrap();
        let mut tls = connector
            .connect(name, a)
            .await
            .map_err(|e| e.to_string())?;
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(MESH_ALPN));
        tls.write_all(b"ping").await.map_err(|e| e.to_string())?;
        let mut buf = [0u8; 4];
        tls.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
        assert_eq!(&buf, b"ping");
        let peer = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
        svid_identity(&peer).map_err(|e| e.to_string())
    }
    .await;
    let server = server.await.unwrap();
    Outcome { client, server }
}

use rustls_pki_types::ServerName;

#[tokio::test]
async fn mutual_tls_proves_both_identities() {
    let ca = TestCa::new("cluster.local");
    let (web, db) = (ca.identity("shop", "web"), ca.identity("shop", "db"));
    let b = ca.bundle();
    let out = handshake(
        &b,
        ca.certified_key(&web),
        vec![db.clone()],
        &b,
        ca.certified_key(&db),
    )
    .await;
    assert_eq!(
        out.client.unwrap(),
        db,
        "the client learns the server's identity"
    );
    assert_eq!(
        out.server.unwrap(),
        web,
        "the server learns the client's identity"
    );
}

#[tokio::test]
async fn server_with_another_identity_is_refused() {
    let ca = TestCa::new("cluster.local");
    let (web, db, cache) = (
        ca.identity("shop", "web"),
        ca.identity("shop", "db"),
        ca.identity("shop", "cache"),
    );
    let b = ca.bundle();
    let out = handshake(
        &b,
        ca.certified_key(&web),
        vec![db],
        &b,
        ca.certified_key(&cache),
    )
    .await;
    let err = out.client.unwrap_err();
    assert!(err.contains("presented identity spiffe://cluster.local/ns/shop/sa/cache, expected spiffe://cluster.local/ns/shop/sa/db"), "{err}");
    assert!(out.server.is_err());
}

#[tokio::test]
async fn client_from_a_foreign_ca_is_refused() {
    let ca = TestCa::new("cluster.local");
    let rogue = TestCa::new("cluster.local");
    let (web, db) = (ca.identity("shop", "web"), ca.identity("shop", "db"));
    let out = handshake(
        &ca.bundle(),
        rogue.certified_key(&web),
        vec![db.clone()],
        &ca.bundle(),
        ca.certified_key(&db),
    )
    .await;
    let err = out.server.unwrap_err();
    // Both CAs use the same names, so webpki finds the issuer by name and the signature fails.
    assert!(
        err.contains("invalid peer certificate: BadSignature"),
        "{err}"
    );
}

#[tokio::test]
async fn server_from_a_foreign_ca_is_refused() {
    let ca = TestCa::new("cluster.local");
    let rogue = TestCa::new("cluster.local");
    let (web, db) = (ca.identity("shop", "web"), ca.identity("shop", "db"));
    let out = handshake(
        &ca.bundle(),
        ca.certified_key(&web),
        vec![db.clone()],
        &rogue.bundle(),
        rogue.certified_key(&db),
    )
    .await;
    let err = out.client.unwrap_err();
    assert!(
        err.contains("invalid peer certificate: BadSignature"),
        "{err}"
    );
}

#[tokio::test]
async fn expired_certificate_is_refused() {
    let ca = TestCa::new("cluster.local");
    let (web, db) = (ca.identity("shop", "web"), ca.identity("shop", "db"));
    let past = SystemTime::now() - Duration::from_secs(7200);
    let expired = ca.certified_key_with(&[db.to_string()], past, Duration::from_secs(3600));
    let b = ca.bundle();
    let out = handshake(&b, ca.certified_key(&web), vec![db], &b, expired).await;
    let err = out.client.unwrap_err();
    assert!(err.to_lowercase().contains("expired"), "{err}");
}

#[tokio::test]
async fn certificate_with_two_spiffe_ids_is_refused() {
    let ca = TestCa::new("cluster.local");
    let (web, db) = (ca.identity("shop", "web"), ca.identity("shop", "db"));
    let two = ca.certified_key_with(
        &[db.to_string(), web.to_string()],
        SystemTime::now() - Duration::from_secs(20),
        Duration::from_secs(3600),
    );
    let b = ca.bundle();
    let out = handshake(&b, ca.certified_key(&web), vec![db], &b, two).await;
    let err = out.client.unwrap_err();
    assert!(err.contains("exactly one URI SAN"), "{err}");
}

#[tokio::test]
async fn identity_from_another_trust_domain_is_refused() {
    let ca = TestCa::new("cluster.local");
    let web = ca.identity("shop", "web");
    let foreign = WorkloadIdentity::new("other.domain", "shop", "db").unwrap();
    let b = ca.bundle();
    let out = handshake(
        &b,
        ca.certified_key(&web),
        vec![foreign.clone()],
        &b,
        ca.certified_key(&foreign),
    )
    .await;
    let err = out.client.unwrap_err();
    assert!(err.contains("outside trust domain cluster.local"), "{err}");
}

#[tokio::test]
async fn bundle_with_two_roots_accepts_either_during_rotation() {
    let old = TestCa::new("cluster.local");
    let new = TestCa::new("cluster.local");
    let both = TrustBundle::from_pem(
        format!("{}{}", old.root_pem, new.root_pem).as_bytes(),
        "cluster.local",
    )
    .unwrap();
    assert_eq!(both.anchors().len(), 2);
    let (web, db) = (old.identity("shop", "web"), old.identity("shop", "db"));
    // A client still on the old root talks to a server already on the new one.
    let out = handshake(
        &both,
        old.certified_key(&web),
        vec![db.clone()],
        &both,
        new.certified_key(&db),
    )
    .await;
    assert_eq!(out.client.unwrap(), db);
    assert_eq!(out.server.unwrap(), web);
    // With the old root alone, the new server is not trusted.
    let out = handshake(
        &old.bundle(),
        old.certified_key(&web),
        vec![db.clone()],
        &both,
        new.certified_key(&db),
    )
    .await;
    assert!(out.client.is_err());
}

#[test]
fn empty_or_garbage_bundles_are_errors() {
    assert!(matches!(
        TrustBundle::from_pem(b"", "cluster.local"),
        Err(BundleError::Empty)
    ));
    let garbage = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
    assert!(TrustBundle::from_pem(garbage, "cluster.local").is_err());
}

#[tokio::test]
async fn a_replaced_bundle_applies_to_the_next_handshake_of_configs_made_before() {
    let old = TestCa::new("cluster.local");
    let new = TestCa::new("cluster.local");
    let (web, db) = (old.identity("shop", "web"), old.identity("shop", "db"));
    let bundle = old.bundle();
    // A server config made once (as each pod's 4143 listener's is), a client on the new
    // root.
    let server = TlsAcceptor::from(Arc::new(
        server_config(&bundle, old.certified_key(&db)).unwrap(),
    ));
    let client = |b: &TrustBundle| {
        TlsConnector::from(Arc::new(
            client_config(b, new.certified_key(&web), vec![db.clone()]).unwrap(),
        ))
    };
    let both = TrustBundle::from_pem(
        format!("{}{}", old.root_pem, new.root_pem).as_bytes(),
        "cluster.local",
    )
    .unwrap();
    let attempt = |server: TlsAcceptor, client: TlsConnector| async move {
        let (a, b) = tokio::io::duplex(64 * 1024);
        let accepted = tokio::spawn(async move { server.accept(b).await.map(drop) });
        let name = ServerName::try_from("10.0.0.1").unwrap();
        // The client's end stays open until the server is done with its side.
        let connected = client.connect(name, a).await;
        let accepted = accepted.await.unwrap();
        (accepted.is_ok(), connected.is_ok())
    };
    let (accepted, _) = attempt(server.clone(), client(&both)).await;
    assert!(
        !accepted,
        "a client of the new root is refused before the bundle has it"
    );
    bundle
        .replace(format!("{}{}", old.root_pem, new.root_pem).as_bytes())
        .unwrap();
    assert_eq!(
        attempt(server.clone(), client(&both)).await,
        (true, true),
        "taken by the same server config once the bundle has both roots"
    );
    bundle.replace(new.root_pem.as_bytes()).unwrap();
    let (accepted, _) = attempt(server, client(&both)).await;
    assert!(
        accepted,
        "the client's chain is under the new root, still in the bundle"
    );
    assert_eq!(bundle.anchors().len(), 1);
}

#[test]
fn a_root_naming_another_trust_domain_is_refused() {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::default();
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    p.subject_alt_names = vec![rcgen::SanType::URI(
        "spiffe://other.example".try_into().unwrap(),
    )];
    let pem = p.self_signed(&key).unwrap().pem();
    match TrustBundle::from_pem(pem.as_bytes(), "cluster.local") {
        Err(BundleError::TrustDomain { index: 1, got, .. }) => assert_eq!(got, "other.example"),
        other => panic!("{other:?}"),
    }
    assert!(TrustBundle::from_pem(pem.as_bytes(), "other.example").is_ok());
}
