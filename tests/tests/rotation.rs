//! Trust rotation under load (issue 13), as docs/OPERATIONS.md walks through it, with the
//! files the control plane and both node proxies read rewritten in place and nothing
//! restarted:
//!
//! 1. the bundle holds the old and the new trust anchor — each proxy and the control plane
//!    take it (their `/config_dump` and metrics name both roots), and node-b's mesh port
//!    accepts a certificate of an issuer under the new anchor;
//! 2. the issuer is one signed by the new anchor — the control plane signs with it and
//!    serves its own certificate from it, and once the proxies are told to renew
//!    (`POST /renew-certificates`) every workload certificate comes from it;
//! 3. the bundle holds the new anchor only (after a file that does not parse was written
//!    and refused by all three) — node-b's mesh port refuses a certificate of the old
//!    issuer: the old anchor is gone.
//!
//! Meanwhile a client on node-a sends to a server on node-b at a fixed rate over a
//! keep-alive connection and over a new connection per request, and a probe on node-a
//! every 2.5 s over a new tunnel each time (node-b closes a tunnel idle for 1 s), so that
//! proxy-to-proxy handshakes happen under each bundle. Not one request fails. Counts are
//! asserted, never timings.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use ambit_api::WorkloadIdentity;
use ambit_control::pki::generate::{issuer, trust_anchor, CaMaterial, Validity};
use ambit_control::pki::{CaConfig, CaFiles, CertificateAuthority};
use ambit_e2e::load::{until_served, Client};
use ambit_e2e::netns::Topology;
use ambit_e2e::{http_get, metric_sum, testapp, ControlPlane, NetnsHandles, NodeProxy, NAMESPACES};
use ambit_proxy::netns::Netns;
use ambit_proxy::tls::{sha256_hex, SpiffeServerVerifier, TrustBundle};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::Value;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

/// How often the proxies and the control plane read their files in this test.
const POLL: &str = "100ms";

/// The phases of the test; each request counts in the one it started in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// The old anchor and issuer.
    Before,
    /// Step 1 taken: both anchors.
    BothAnchors,
    /// Step 2 taken: the new issuer.
    NewIssuer,
    /// Step 3 taken: the new anchor only.
    NewAnchorOnly,
}

const PHASES: [Phase; 4] = [
    Phase::Before,
    Phase::BothAnchors,
    Phase::NewIssuer,
    Phase::NewAnchorOnly,
];

/// `client` and `probe` on node-a, `server` on node-b; each names its netns.
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
        "{NAMESPACES}{}{}{}",
        pod("client", "node-a"),
        pod("probe", "node-a"),
        pod("server", "node-b")
    )
}

/// Waits (a minute at most) until `check` holds; `what` names it if never.
async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match check().await {
            Ok(()) => return,
            Err(why) => assert!(Instant::now() < deadline, "{what}: {why}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn metrics(addr: SocketAddr) -> String {
    http_get(addr, "/metrics").await.1
}

async fn config_dump(addr: SocketAddr) -> Value {
    serde_json::from_str(&http_get(addr, "/config_dump").await.1).unwrap_or_default()
}

/// POSTs `path` to `addr`; the status.
async fn http_post(addr: SocketAddr, path: &str) -> u16 {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf);
    text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0)
}

/// The DER certificates of `pem`.
fn ders(pem: &str) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .unwrap()
}

/// The SHA-256 of the first certificate of `pem`.
fn fingerprint(pem: &str) -> String {
    sha256_hex(&ders(pem)[0])
}

/// The roots a proxy trusts, by fingerprint (`/config_dump`'s `trust_bundle`).
fn trusted(dump: &Value) -> BTreeSet<String> {
    dump["trust_bundle"]["anchors"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["sha256"].as_str().map(String::from))
        .collect()
}

/// The fingerprint of the issuer of each of a proxy's workload certificates.
fn issuers(dump: &Value) -> Vec<String> {
    dump["identities"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| {
            let chain = ders(i["cert_chain_pem"].as_str().unwrap_or_default());
            chain.get(1).map(|c| sha256_hex(c)).unwrap_or_default()
        })
        .collect()
}

/// The roots the control plane's CA holds, by fingerprint (its metrics).
fn control_roots(m: &str) -> BTreeSet<String> {
    m.lines()
        .filter(|l| l.starts_with("identity_trust_anchor_expiration_timestamp_seconds{"))
        .filter_map(|l| {
            l.split("sha256=\"")
                .nth(1)?
                .split('"')
                .next()
                .map(String::from)
        })
        .collect()
}

/// The fingerprint of the issuer the control plane signs with (its metrics).
fn control_issuer(m: &str) -> Option<String> {
    m.lines()
        .find(|l| l.starts_with("identity_issuer_info{"))
        .and_then(|l| {
            l.split("sha256=\"")
                .nth(1)?
                .split('"')
                .next()
                .map(String::from)
        })
}

/// Writes `contents` over `path` as a kubelet or `ambit pki` does: a new file renamed over
/// the old one.
fn replace(path: &Path, contents: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A certificate for `id` from `iss` (signed by `anchor`), with its key, as rustls wants it.
fn svid(anchor: &CaMaterial, iss: &CaMaterial, id: &WorkloadIdentity) -> Arc<CertifiedKey> {
    let p = Path::new("test");
    let ca = CertificateAuthority::from_pem(
        &CaFiles {
            trust_anchors: p.into(),
            issuer_cert: p.into(),
            issuer_key: p.into(),
        },
        anchor.cert_pem.as_bytes(),
        iss.cert_pem.as_bytes(),
        iss.key_pem.as_bytes(),
        CaConfig {
            trust_domain: "cluster.local".into(),
            leaf_lifetime: Duration::from_secs(3600),
            clock_skew_allowance: Duration::from_secs(20),
        },
    )
    .unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let csr = rcgen::CertificateParams::default()
        .serialize_request(&key)
        .unwrap();
    let issued = ca.certify(id, csr.der()).unwrap();
    let mut chain = vec![CertificateDer::from(issued.leaf_der)];
    chain.extend(
        issued
            .intermediates_der
            .into_iter()
            .map(CertificateDer::from),
    );
    let signing = ambit_proxy::tls::provider()
        .key_provider
        .load_private_key(PrivateKeyDer::Pkcs8(key.serialize_der().into()))
        .unwrap();
    Arc::new(CertifiedKey::new(chain, signing))
}

/// A raw mTLS handshake with the proxy on `server`'s mesh port (4143), from the pod at
/// `from` (with the proxy's socket mark, so it is not redirected), presenting `own` and
/// requiring the server to prove `expected` under `trust`. `Ok` with the chain the server
/// presented if the server took the client certificate (it answered the HTTP/2 preface),
/// `Err` saying why not.
async fn mesh_handshake(
    from: &Netns,
    server: SocketAddr,
    own: Arc<CertifiedKey>,
    trust: &TrustBundle,
    expected: WorkloadIdentity,
) -> Result<Vec<CertificateDer<'static>>, String> {
    let config = ambit_proxy::tls::client_config(trust, own, vec![expected]).unwrap();
    let tcp = from
        .connect(
            SocketAddr::new(server.ip(), 4143),
            ambit_proxy::proxy::PROXY_MARK,
        )
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let name = ServerName::IpAddress(server.ip().into());
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let chain = tls
        .get_ref()
        .1
        .peer_certificates()
        .unwrap_or_default()
        .to_vec();
    // TLS 1.3: the client is done before the server has checked its certificate; the
    // server's verdict is its first answer — SETTINGS, or an alert.
    tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut buf = [0u8; 64];
    match tokio::time::timeout(Duration::from_secs(5), tls.read(&mut buf)).await {
        Ok(Ok(n)) if n > 0 => Ok(chain),
        Ok(Ok(_)) => Err("closed without a word".into()),
        Ok(Err(e)) => Err(format!("refused: {e}")),
        Err(_) => Err("no answer in 5 s".into()),
    }
}

/// A TLS handshake with the control plane's identity port, requiring its identity under
/// `trust` (only the new anchor, once its serving certificate is from the new issuer).
async fn control_handshake(addr: SocketAddr, trust: &TrustBundle) -> Result<(), String> {
    let id = ambit_proxy::control::default_identity("cluster.local").unwrap();
    let verifier = Arc::new(SpiffeServerVerifier::new(trust.clone(), vec![id]));
    let mut config = rustls::ClientConfig::builder_with_provider(ambit_proxy::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("ambit-control").unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trust_anchor_and_issuer_rotate_under_load_without_a_failed_request_or_a_restart() {
    let t = Topology::new(&["client", "probe", "server"]);
    let cp = ControlPlane::start_with_flags(
        &cluster(&t),
        &["node-a", "node-b"],
        &["--pki-poll-interval", POLL],
    )
    .await;
    let (bundle_file, issuer_cert, issuer_key) = (
        cp.dir.path().join("root.crt"),
        cp.dir.path().join("issuer.crt"),
        cp.dir.path().join("issuer.key"),
    );
    let poll = ambit_api::duration::parse_duration(POLL).unwrap();
    // Both proxies read the bundle file the control plane reads.
    let mut config_a = NodeProxy::config(&cp, "node-a");
    config_a.trust_anchors_poll_interval = poll;
    let mut config_b = NodeProxy::config(&cp, "node-b");
    config_b.trust_anchors_poll_interval = poll;
    // An idle tunnel is closed after 1 s: the probe's every request opens a new one.
    config_b.http_idle_timeout = Duration::from_secs(1);
    let handles = (
        NetnsHandles(config_a.run_dir.clone()),
        NetnsHandles(config_b.run_dir.clone()),
    );
    let a = NodeProxy::start_config(config_a).await;
    let b = NodeProxy::start_config(config_b).await;
    let server_ns = Netns::open(Path::new(&t.pod("server").path())).unwrap();
    let probe_ns = Netns::open(Path::new(&t.pod("probe").path())).unwrap();
    let _seen = testapp::serve(&server_ns, 8080, "server").await;
    let server = SocketAddr::new(t.pod("server").ip.into(), 8080);
    let id = |sa: &str| WorkloadIdentity::new("cluster.local", "shop", sa).unwrap();
    until_served(Path::new(&t.pod("client").path()), server).await;

    let (old_root, old_issuer) = (cp.root.clone(), cp.issuer.clone());
    let lasting = |days: u64| Validity::starting_now(Duration::from_secs(86_400 * days));
    let new_root = trust_anchor("cluster.local", lasting(3650)).unwrap();
    let new_issuer = issuer(&new_root, "cluster.local", lasting(365)).unwrap();
    let (old_fp, new_fp) = (
        fingerprint(&old_root.cert_pem),
        fingerprint(&new_root.cert_pem),
    );
    let new_issuer_fp = fingerprint(&new_issuer.cert_pem);
    let both_pem = format!("{}{}", old_root.cert_pem, new_root.cert_pem);
    let (old_only, both, new_only) = (
        TrustBundle::from_pem(old_root.cert_pem.as_bytes(), "cluster.local").unwrap(),
        TrustBundle::from_pem(both_pem.as_bytes(), "cluster.local").unwrap(),
        TrustBundle::from_pem(new_root.cert_pem.as_bytes(), "cluster.local").unwrap(),
    );
    // A client certificate of each issuer, as a pod's proxy would present it.
    let old_svid = svid(&old_root, &old_issuer, &id("probe"));
    let new_svid = svid(&new_root, &new_issuer, &id("probe"));
    let proxies = [("node-a", a.admin_addr), ("node-b", b.admin_addr)];
    let refreshes = |m: &str| metric_sum(m, "identity_cert_refresh_total", &[]);
    let refreshed_at_start = (refreshes(&a.metrics().await), refreshes(&b.metrics().await));
    assert_eq!(
        refreshed_at_start,
        (2, 1),
        "client and probe on node-a, server on node-b"
    );

    // Before: the new issuer's certificates are refused, the control plane is not trusted
    // under the new anchor alone.
    let refused = mesh_handshake(&probe_ns, server, new_svid.clone(), &both, id("server")).await;
    assert!(
        refused.is_err(),
        "a certificate under the new anchor is taken before step 1"
    );
    assert!(control_handshake(cp.identity_addr, &new_only)
        .await
        .is_err());

    let phase = Arc::new(AtomicUsize::new(Phase::Before as usize));
    let set = |p: Phase| phase.store(p as usize, Ordering::SeqCst);
    let (stop_tx, stop) = watch::channel(false);
    let client = PathBuf::from(t.pod("client").path());
    let probe = PathBuf::from(t.pod("probe").path());
    let every = Duration::from_millis(50);
    let start = |netns: &PathBuf, keepalive: bool, every: Duration| {
        Client {
            phase: phase.clone(),
            phases: PHASES.len(),
            ..Client::new(netns.clone(), server, keepalive, every)
        }
        .start(stop.clone())
    };
    let loads = [
        ("keep-alive", start(&client, true, every)),
        ("new connection per request", start(&client, false, every)),
        (
            "probe, a new tunnel each time",
            start(&probe, false, Duration::from_millis(2500)),
        ),
    ];
    // A phase lasts until each client has been served in it: 20 requests, 2 probes.
    let served_in = |p: Phase| {
        let loads = &loads;
        move || async move {
            let counts: Vec<u64> = loads.iter().map(|(_, l)| l.ok(p as usize)).collect();
            (counts[0] >= 20 && counts[1] >= 20 && counts[2] >= 2)
                .then_some(())
                .ok_or(format!("served in {p:?}: {counts:?}"))
        }
    };
    until("served before the rotation", served_in(Phase::Before)).await;

    // Step 1: the bundle with both anchors.
    replace(&bundle_file, &both_pem);
    let want = &BTreeSet::from([old_fp.clone(), new_fp.clone()]);
    for (node, admin) in proxies {
        until(&format!("{node} trusts both anchors"), || async move {
            let got = trusted(&config_dump(admin).await);
            (got == *want).then_some(()).ok_or(format!("{got:?}"))
        })
        .await;
    }
    until("the control plane holds both anchors", || async {
        let got = control_roots(&cp.metrics().await);
        (got.len() == 2).then_some(()).ok_or(format!("{got:?}"))
    })
    .await;
    set(Phase::BothAnchors);
    let chain = mesh_handshake(&probe_ns, server, new_svid.clone(), &old_only, id("server"))
        .await
        .expect("node-b takes a certificate under the new anchor");
    assert_eq!(
        sha256_hex(&chain[1]),
        fingerprint(&old_issuer.cert_pem),
        "still the old issuer's"
    );
    until("served with both anchors", served_in(Phase::BothAnchors)).await;

    // Step 2: the new issuer, its certificate and key written one after the other.
    replace(&issuer_cert, &new_issuer.cert_pem);
    replace(&issuer_key, &new_issuer.key_pem);
    until("the control plane signs with the new issuer", || async {
        let got = control_issuer(&cp.metrics().await);
        (got.as_deref() == Some(new_issuer_fp.as_str()))
            .then_some(())
            .ok_or(format!("{got:?}"))
    })
    .await;
    until(
        "the control plane serves a certificate of the new issuer",
        || async { control_handshake(cp.identity_addr, &new_only).await },
    )
    .await;
    set(Phase::NewIssuer);
    for (node, admin) in proxies {
        assert_eq!(http_post(admin, "/renew-certificates").await, 202, "{node}");
    }
    let want = &new_issuer_fp;
    for (node, admin) in proxies {
        until(
            &format!("{node}'s certificates come from the new issuer"),
            || async move {
                let got = issuers(&config_dump(admin).await);
                (!got.is_empty() && got.iter().all(|i| i == want))
                    .then_some(())
                    .ok_or(format!("{got:?}"))
            },
        )
        .await;
    }
    let chain = mesh_handshake(&probe_ns, server, old_svid.clone(), &new_only, id("server"))
        .await
        .expect("node-b presents the new issuer's chain, and still takes the old one's");
    assert_eq!(sha256_hex(&chain[1]), new_issuer_fp);
    let refreshed = (refreshes(&a.metrics().await), refreshes(&b.metrics().await));
    assert_eq!(refreshed, (4, 2), "one renewal per identity");
    until("served with the new issuer", served_in(Phase::NewIssuer)).await;

    // A bundle that does not parse is refused by all three, and changes nothing.
    replace(
        &bundle_file,
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    );
    for (node, admin) in proxies {
        until(
            &format!("{node} refuses the broken bundle"),
            || async move {
                let m = metrics(admin).await;
                let errors = metric_sum(&m, "trust_bundle_reloads_total", &["result=\"error\""]);
                (errors == 1).then_some(()).ok_or(format!("{errors}"))
            },
        )
        .await;
    }
    until("the control plane refuses the broken bundle", || async {
        let m = cp.metrics().await;
        let errors = metric_sum(&m, "identity_ca_reloads_total", &["result=\"error\""]);
        (errors == 1).then_some(()).ok_or(format!("{errors}"))
    })
    .await;
    for (node, admin) in proxies {
        let dump = config_dump(admin).await;
        assert_eq!(trusted(&dump).len(), 2, "{node} still trusts both");
        assert!(
            dump["trust_bundle"]["last_error"].is_string(),
            "{node}: {dump}"
        );
    }

    // Step 3: the new anchor only.
    replace(&bundle_file, &new_root.cert_pem);
    let want = &BTreeSet::from([new_fp.clone()]);
    for (node, admin) in proxies {
        until(
            &format!("{node} trusts the new anchor only"),
            || async move {
                let got = trusted(&config_dump(admin).await);
                (got == *want).then_some(()).ok_or(format!("{got:?}"))
            },
        )
        .await;
    }
    until("the control plane holds the new anchor only", || async {
        let got = control_roots(&cp.metrics().await);
        (got == *want).then_some(()).ok_or(format!("{got:?}"))
    })
    .await;
    set(Phase::NewAnchorOnly);
    let refused = mesh_handshake(&probe_ns, server, old_svid, &new_only, id("server")).await;
    let why = refused.expect_err("node-b takes a certificate of the old issuer after step 3");
    assert!(why.contains("refused"), "{why}");
    let chain = mesh_handshake(&probe_ns, server, new_svid, &new_only, id("server"))
        .await
        .expect("node-b takes the new issuer's certificates");
    assert_eq!(sha256_hex(&chain[1]), new_issuer_fp);
    until(
        "served with the new anchor only",
        served_in(Phase::NewAnchorOnly),
    )
    .await;
    stop_tx.send_replace(true);

    // Not one request failed; nothing was renewed but when asked; each reload counted.
    for (what, l) in &loads {
        let counts: Vec<_> = PHASES
            .iter()
            .map(|p| {
                let (ok, failed) = (l.ok(*p as usize), l.failed(*p as usize).len());
                format!("{p:?} {ok} ok, {failed} failed")
            })
            .collect();
        eprintln!("{what}: {}", counts.join("; "));
        for p in PHASES {
            let failed = l.failed(p as usize);
            assert!(failed.is_empty(), "{what}, {p:?}: {failed:?}");
        }
    }
    assert_eq!(
        (refreshes(&a.metrics().await), refreshes(&b.metrics().await)),
        (4, 2),
        "the new anchor alone verified every certificate: no renewal at step 3"
    );
    for (node, admin) in proxies {
        let m = metrics(admin).await;
        assert_eq!(
            metric_sum(&m, "trust_bundle_reloads_total", &["result=\"ok\""]),
            2,
            "{node}"
        );
        assert_eq!(
            metric_sum(&m, "trust_bundle_reloads_total", &["result=\"error\""]),
            1,
            "{node}"
        );
    }
    let m = cp.metrics().await;
    assert_eq!(
        metric_sum(&m, "identity_ca_reloads_total", &["result=\"ok\""]),
        3
    );
    assert_eq!(
        metric_sum(&m, "identity_ca_reloads_total", &["result=\"error\""]),
        1
    );

    a.stop().await;
    b.stop().await;
    cp.stop().await;
    drop(handles);
    std::mem::forget(server_ns);
    drop(probe_ns);
    drop(t);
}
