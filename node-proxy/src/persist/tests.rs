use super::*;
use crate::identity::{IdentityConfig, IdentityMetrics};
use crate::testing::TestCa;
use ambit_api::proto::discovery as dpb;
use ambit_api::proto::policy as ppb;
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

const NODE: &str = "node-a";

fn owner() -> Owner {
    Owner {
        node: NODE.into(),
        trust_domain: "cluster.local".into(),
    }
}

fn deny() -> PortPolicy {
    PortPolicy::default_policy("deny", &[]).unwrap()
}

fn workload(name: &str, node: &str, ip: &str) -> dpb::Workload {
    dpb::Workload {
        namespace: "shop".into(),
        name: name.into(),
        node: node.into(),
        ips: vec![ip.into()],
        identity: format!("spiffe://cluster.local/ns/shop/sa/{name}"),
        meshed: true,
        ..Default::default()
    }
}

fn discovery_state() -> DiscoveryState {
    let mut s = DiscoveryState::default();
    s.apply(dpb::Update {
        snapshot: true,
        workloads: vec![
            workload("web", NODE, "10.1.0.5"),
            workload("db", "node-b", "10.2.0.5"),
        ],
        ..Default::default()
    });
    s
}

fn policy_state() -> PolicyState {
    let mut s = PolicyState::new(deny());
    let refused = s.apply(ppb::Update {
        snapshot: true,
        pods: vec![ppb::PodPolicy {
            pod: "shop/web".into(),
            ports: vec![],
            default: Some(ppb::PortPolicy {
                kind: "default".into(),
                name: "all-unauthenticated".into(),
                authorizations: vec![ppb::Authorization {
                    kind: "default".into(),
                    name: "all-unauthenticated".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
        }],
        ..Default::default()
    });
    assert!(refused.is_empty(), "{refused:?}");
    s
}

fn manager(ca: &Arc<TestCa>) -> IdentityManager {
    IdentityManager::new(
        ca.clone(),
        IdentityConfig::default(),
        IdentityMetrics::default(),
    )
}

/// A state directory with the discovery, policy and `web`'s certificate written as the
/// writer writes them; the CA that signed it.
async fn written_dir() -> (tempfile::TempDir, Arc<TestCa>) {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("cluster.local");
    let m = manager(&ca);
    let web = ca.identity("shop", "web");
    m.pod_added("shop/web", &web);
    m.ready(&web).await.unwrap();
    let p = loaded(dir.path(), &ca, &manager(&ca)).persister;
    p.write(
        writer::Batch {
            discovery: Some(Arc::new(discovery_state())),
            policy: Some(Arc::new(policy_state())),
            certificates: Some(m.certificates()),
        },
        &mut identities::Written::new(),
    );
    (dir, ca)
}

fn loaded(dir: &Path, ca: &TestCa, m: &IdentityManager) -> Loaded {
    load_from(
        dir,
        owner(),
        &ca.bundle(),
        deny(),
        m,
        PersistMetrics::default(),
    )
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn identity_file(dir: &Path) -> PathBuf {
    dir.join(identities::DIR).join("shop.web.pem")
}

#[tokio::test]
async fn what_is_written_is_read_back_whole_and_private() {
    let (dir, ca) = written_dir().await;
    let d = dir.path();
    assert_eq!(mode(d), 0o700);
    assert_eq!(mode(&d.join(identities::DIR)), 0o700);
    for f in [
        d.join(discovery::FILE),
        d.join(policy::FILE),
        identity_file(d),
    ] {
        assert_eq!(mode(&f), 0o600, "{}", f.display());
    }

    let m = manager(&ca);
    ca.unavailable.store(true, Ordering::SeqCst);
    let calls = ca.calls.load(Ordering::SeqCst);
    let l = loaded(d, &ca, &m);
    assert!(
        l.discovery.synced,
        "served as the control plane's snapshot would be"
    );
    assert_eq!(l.discovery.to_snapshot(), discovery_state().to_snapshot());
    assert_eq!(l.policy.to_snapshot(), policy_state().to_snapshot());
    assert!(l.policy.synced());
    let (discovery, policy, _) = l.persister.status.dump();
    assert_eq!(discovery["source"], "disk");
    assert_eq!(policy["source"], "disk");
    assert!(discovery["age_seconds"].as_u64().unwrap() < 60);

    // The certificate is served from the identity's first pod on, with the CA down.
    let web = ca.identity("shop", "web");
    m.pod_added("shop/web", &web);
    let cert = m.current(&web).expect("the restored certificate is served");
    assert!(cert.restored());
    assert_eq!(
        ca.calls.load(Ordering::SeqCst),
        calls,
        "nothing asked of the CA yet"
    );
    let dump = l.persister.config_dump(Arc::new(|| json!({})))();
    assert_eq!(
        dump["persisted_state"]["identities"][0]["source"], "disk",
        "{dump}"
    );
}

#[tokio::test]
async fn a_damaged_file_is_refused_and_counted_never_trusted() {
    let (dir, ca) = written_dir().await;
    let d = dir.path();
    let path = d.join(discovery::FILE);
    let good = std::fs::read(&path).unwrap();
    let damaged: Vec<(&str, Vec<u8>)> = vec![
        ("a flipped byte", {
            let mut b = good.clone();
            let last = b.len() - 3;
            b[last] ^= 0x40;
            b
        }),
        ("cut short", good[..good.len() - 5].to_vec()),
        ("garbage", b"not a state file at all".to_vec()),
        ("empty", Vec::new()),
    ];
    for (what, bytes) in damaged {
        write_private(&path, &bytes);
        let why = discovery::decode(&std::fs::read(&path).unwrap(), &owner()).unwrap_err();
        assert!(
            matches!(why, Rejected::Corrupt(_) | Rejected::Format(_)),
            "{what}: {why}"
        );
        let metrics = PersistMetrics::default();
        let l = load_from(
            d,
            owner(),
            &ca.bundle(),
            deny(),
            &manager(&ca),
            metrics.clone(),
        );
        assert!(!l.discovery.synced, "{what}: not served from");
        assert_eq!(l.persister.status.dump().0["source"], "none");
        assert_eq!(metrics.rejected_count(Kind::Discovery), 1, "{what}");
        // Without discovery, no identity is known to be on the node: not restored.
        assert_eq!(metrics.rejected_count(Kind::Identity), 1, "{what}");
    }

    // A policy file of another node, and one of another trust domain.
    let policy = std::fs::read(d.join(policy::FILE)).unwrap();
    let other = Owner {
        node: "node-b".into(),
        ..owner()
    };
    assert!(matches!(
        policy::decode(&policy, &other, deny()),
        Err(Rejected::OtherNode { .. })
    ));
    let other = Owner {
        trust_domain: "other.example".into(),
        ..owner()
    };
    assert!(matches!(
        policy::decode(&policy, &other, deny()),
        Err(Rejected::OtherTrustDomain { .. })
    ));
    // A discovery file where policy is expected.
    assert!(matches!(
        policy::decode(&good, &owner(), deny()),
        Err(Rejected::Format(_))
    ));
}

fn write_private(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

#[tokio::test]
async fn files_others_could_have_written_or_read_are_refused() {
    let (dir, ca) = written_dir().await;
    let d = dir.path();
    std::fs::set_permissions(
        d.join(discovery::FILE),
        std::fs::Permissions::from_mode(0o620),
    )
    .unwrap();
    // A key readable by others may have leaked: not used.
    std::fs::set_permissions(identity_file(d), std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(matches!(
        files::read_checked(&identity_file(d), true),
        Err(Rejected::Mode { mode: 0o644, .. })
    ));
    let metrics = PersistMetrics::default();
    let m = manager(&ca);
    let l = load_from(d, owner(), &ca.bundle(), deny(), &m, metrics.clone());
    assert!(!l.discovery.synced);
    assert_eq!(metrics.rejected_count(Kind::Discovery), 1);
    assert!(m.certificates().is_empty());
}

/// A certificate for `web` signed by `ca` from `not_before` for `lifetime`, as a file.
fn cert_file(ca: &TestCa, not_before: SystemTime, lifetime: Duration) -> Vec<u8> {
    let key = rcgen::KeyPair::generate().unwrap();
    let csr = rcgen::CertificateParams::default()
        .serialize_request(&key)
        .unwrap();
    let leaf = ca.sign(
        csr.der(),
        &["spiffe://cluster.local/ns/shop/sa/web".to_string()],
        not_before,
        lifetime,
    );
    let issuer = ca.certified_key(&ca.identity("shop", "x")).cert[1].to_vec();
    let mut out = pem::encode(&pem::Pem::new("CERTIFICATE", leaf));
    out.push_str(&pem::encode(&pem::Pem::new("CERTIFICATE", issuer)));
    out.push_str(&pem::encode(&pem::Pem::new(
        "PRIVATE KEY",
        key.serialize_der(),
    )));
    out.into_bytes()
}

#[test]
fn a_certificate_is_restored_only_if_valid_trusted_and_still_wanted() {
    let ca = TestCa::new("cluster.local");
    let web = ca.identity("shop", "web");
    let wanted = BTreeSet::from([web.clone()]);
    let now = SystemTime::now();
    let hour = Duration::from_secs(3600);

    let good = cert_file(&ca, now - Duration::from_secs(20), hour);
    let r = identities::decode(&good, &ca.bundle(), &wanted).unwrap();
    assert_eq!(r.cert.identity(), &web);
    assert!(r.cert.restored());

    let expired = cert_file(&ca, now - 3 * hour, hour);
    assert!(matches!(
        identities::decode(&expired, &ca.bundle(), &wanted),
        Err(Rejected::Expired)
    ));

    // Signed by another CA (or under an anchor rotated away): not trusted.
    let other = TestCa::new("cluster.local");
    match identities::decode(&good, &other.bundle(), &wanted) {
        Err(Rejected::Untrusted(_)) => {}
        other => panic!("{other:?}"),
    }
    // Of another trust domain than the proxy's.
    let foreign = TestCa::new("other.example");
    let bundle =
        TrustBundle::from_der(std::slice::from_ref(&ca.root_der), "other.example").unwrap();
    assert!(matches!(
        identities::decode(&good, &bundle, &wanted),
        Err(Rejected::Untrusted(_))
    ));
    drop(foreign);

    // No pod of the node runs as web any more.
    assert!(matches!(
        identities::decode(&good, &ca.bundle(), &BTreeSet::new()),
        Err(Rejected::NotWanted(_))
    ));

    // The key of another certificate.
    let text = String::from_utf8(good.clone()).unwrap();
    let other_key = String::from_utf8(cert_file(&ca, now, hour)).unwrap();
    let key_at = |t: &str| t.find("-----BEGIN PRIVATE KEY").unwrap();
    let swapped = format!(
        "{}{}",
        &text[..key_at(&text)],
        &other_key[key_at(&other_key)..]
    );
    assert!(matches!(
        identities::decode(swapped.as_bytes(), &ca.bundle(), &wanted),
        Err(Rejected::Corrupt(why)) if why.contains("not for our key")
    ));
    // A tampered certificate.
    let mut tampered = pem::parse_many(&good).unwrap();
    let mut leaf = tampered[0].contents().to_vec();
    let mid = leaf.len() / 2;
    leaf[mid] ^= 1;
    tampered[0] = pem::Pem::new("CERTIFICATE", leaf);
    let tampered: String = tampered.iter().map(pem::encode).collect();
    assert!(identities::decode(tampered.as_bytes(), &ca.bundle(), &wanted).is_err());
}

#[tokio::test]
async fn the_writer_follows_changes_and_the_control_plane_replaces_the_disk() {
    let (dir, ca) = written_dir().await;
    let d = dir.path();
    let m = manager(&ca);
    let l = loaded(d, &ca, &m);
    let (state_tx, state_rx) = tokio::sync::watch::channel(l.discovery.clone());
    let (_policy_tx, policy_rx) = tokio::sync::watch::channel(l.policy.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let persister = l.persister.clone();
    let task = tokio::spawn(persister.clone().run(state_rx, policy_rx, async move {
        let _ = stopped.await;
    }));
    let web = ca.identity("shop", "web");
    m.pod_added("shop/web", &web);

    // The control plane's snapshot: web gone, api on the node.
    state_tx.send_modify(|s| {
        Arc::make_mut(s).apply(dpb::Update {
            snapshot: true,
            workloads: vec![workload("api", NODE, "10.1.0.6")],
            ..Default::default()
        });
    });
    m.pod_removed("shop/web");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let on_disk = std::fs::read(d.join(discovery::FILE)).unwrap();
        let (_, s) = discovery::decode(&on_disk, &owner()).unwrap();
        if s.workload("shop/api").is_some() && !identity_file(d).exists() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never written");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (discovery, policy, last_write) = persister.status.dump();
    assert_eq!(discovery["source"], "control-plane");
    assert_eq!(
        policy["source"], "disk",
        "policy has not been heard from yet"
    );
    assert!(last_write.is_some());
    stop.send(()).unwrap();
    task.await.unwrap();
}
