use super::*;
use crate::testing::TestCa;
use rustls_pki_types::UnixTime;

fn reloads(m: &BundleMetrics, result: Outcome) -> u64 {
    m.reloads.get_or_create(&ReloadLabels { result }).get()
}

/// A root of trust domain `td` that says so (`spiffe://<td>` URI SAN), PEM.
fn root_naming(td: &str) -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::default();
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    p.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
    p.subject_alt_names = vec![rcgen::SanType::URI(
        format!("spiffe://{td}").try_into().unwrap(),
    )];
    p.self_signed(&key).unwrap().pem()
}

struct Setup {
    _dir: tempfile::TempDir,
    file: PathBuf,
    old: Arc<TestCa>,
    new: Arc<TestCa>,
    bundle: TrustBundle,
    metrics: BundleMetrics,
    reloader: BundleReloader,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ca-bundle.crt");
    let (old, new) = (TestCa::new("cluster.local"), TestCa::new("cluster.local"));
    std::fs::write(&file, &old.root_pem).unwrap();
    let bundle = TrustBundle::from_pem(old.root_pem.as_bytes(), "cluster.local").unwrap();
    let metrics = BundleMetrics::default();
    let reloader = BundleReloader::new(
        &file,
        bundle.clone(),
        old.root_pem.clone().into_bytes(),
        Duration::from_millis(100),
        metrics.clone(),
    );
    Setup {
        _dir: dir,
        file,
        old,
        new,
        bundle,
        metrics,
        reloader,
    }
}

/// Whether `bundle` verifies an SVID of `ca`.
fn trusts(bundle: &TrustBundle, ca: &TestCa) -> bool {
    let key = ca.certified_key(&ca.identity("shop", "web"));
    crate::tls::verify_own_svid(bundle, &key.cert, UnixTime::now()).is_ok()
}

#[tokio::test(start_paused = true)]
async fn a_changed_file_replaces_the_roots_of_every_clone_and_a_removed_root_is_refused() {
    let s = setup();
    let clone = s.bundle.clone();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(s.reloader.clone().run(
        move |a: &Anchors| {
            let _ = tx.send(a.len());
        },
        async move {
            let _ = stopped.await;
        },
    ));
    assert!(trusts(&clone, &s.old) && !trusts(&clone, &s.new));

    // Step 1 of a rotation: both roots.
    std::fs::write(&s.file, format!("{}{}", s.old.root_pem, s.new.root_pem)).unwrap();
    assert_eq!(rx.recv().await, Some(2));
    assert!(trusts(&clone, &s.old) && trusts(&clone, &s.new));
    // Step 3: the old root gone.
    std::fs::write(&s.file, &s.new.root_pem).unwrap();
    assert_eq!(rx.recv().await, Some(1));
    assert!(!trusts(&clone, &s.old) && trusts(&clone, &s.new));
    assert_eq!(reloads(&s.metrics, Outcome::Ok), 2);
    assert_eq!(reloads(&s.metrics, Outcome::Error), 0);

    let _ = stop.send(());
    task.await.unwrap();
}

#[test]
fn a_bad_file_is_refused_counted_and_shown_and_the_roots_in_use_stay() {
    let s = setup();
    let bad: Vec<(&str, Result<Vec<u8>, String>)> = vec![
        ("empty", Ok(Vec::new())),
        (
            "garbage",
            Ok(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_vec()),
        ),
        (
            "another trust domain",
            Ok(root_naming("other.example").into_bytes()),
        ),
        ("unreadable", Err("ca-bundle.crt: No such file".to_string())),
    ];
    for (i, (what, read)) in bad.into_iter().enumerate() {
        assert!(s.reloader.apply(read).is_none(), "{what} taken");
        assert_eq!(reloads(&s.metrics, Outcome::Error), i as u64 + 1, "{what}");
        assert!(trusts(&s.bundle, &s.old), "{what}: the old roots stay");
        assert_eq!(s.bundle.anchors().len(), 1);
    }
    let mut registry = Registry::default();
    registry.register("trust_bundle_reloads", "", s.metrics.reloads.clone());
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("trust_bundle_reloads_total{result=\"error\"} 4"),
        "{text}"
    );
    let dump = s.reloader.config_dump(Arc::new(|| json!({})))();
    let error = dump["trust_bundle"]["last_error"].as_str().unwrap();
    assert!(error.contains("No such file"), "{error}");

    // A root that names our own trust domain is fine; a good file clears the error.
    let ours = root_naming("cluster.local");
    assert!(s
        .reloader
        .apply(Ok(format!("{}{ours}", s.old.root_pem).into_bytes()))
        .is_some());
    let dump = s.reloader.config_dump(Arc::new(|| json!({})))();
    assert!(dump["trust_bundle"]["last_error"].is_null());
}

#[test]
fn config_dump_and_metrics_name_each_root_by_fingerprint_with_its_expiry() {
    let s = setup();
    s.reloader
        .apply(Ok(
            format!("{}{}", s.old.root_pem, s.new.root_pem).into_bytes()
        ))
        .unwrap();
    let dump = s.reloader.config_dump(Arc::new(|| json!({"version": "x"})))();
    assert_eq!(dump["version"], "x", "what was dumped before stays");
    let anchors = dump["trust_bundle"]["anchors"].as_array().unwrap();
    let want: Vec<String> = [&s.old, &s.new]
        .iter()
        .map(|ca| crate::tls::sha256_hex(&ca.root_der))
        .collect();
    let got: Vec<&str> = anchors
        .iter()
        .map(|a| a["sha256"].as_str().unwrap())
        .collect();
    assert_eq!(got, want);
    assert!(anchors[0]["subject"]
        .as_str()
        .unwrap()
        .contains("root.cluster.local"));
    assert!(anchors[0]["not_after_unix"].as_i64().unwrap() > 0);
    assert_eq!(dump["trust_bundle"]["file"], json!(s.file));

    let mut registry = Registry::default();
    registry.register("x", "x", s.metrics.expiration.clone());
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for fp in &want {
        assert!(text.contains(fp), "{text}");
    }
}
