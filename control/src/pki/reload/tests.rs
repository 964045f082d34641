use super::*;
use crate::pki::generate::{issuer, trust_anchor, CaMaterial, Validity};
use crate::pki::{DEFAULT_CLOCK_SKEW_ALLOWANCE, DEFAULT_LEAF_LIFETIME};
use ambit_api::WorkloadIdentity;
use rcgen::{CertificateParams, KeyPair};
use std::path::Path;
use x509_parser::prelude::{FromDer, X509Certificate};

const TD: &str = "cluster.local";

fn anchor() -> CaMaterial {
    trust_anchor(
        TD,
        Validity::starting_now(Duration::from_secs(86_400 * 3650)),
    )
    .unwrap()
}

fn issuer_of(root: &CaMaterial) -> CaMaterial {
    issuer(
        root,
        TD,
        Validity::starting_now(Duration::from_secs(86_400 * 365)),
    )
    .unwrap()
}

struct Pki {
    dir: tempfile::TempDir,
    old: (CaMaterial, CaMaterial),
    new: (CaMaterial, CaMaterial),
}

impl Pki {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (old_root, new_root) = (anchor(), anchor());
        let (old_iss, new_iss) = (issuer_of(&old_root), issuer_of(&new_root));
        let pki = Self {
            dir,
            old: (old_root, old_iss),
            new: (new_root, new_iss),
        };
        pki.write(&pki.old.0.cert_pem, &pki.old.1);
        pki
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }

    fn files(&self) -> CaFiles {
        CaFiles {
            trust_anchors: self.path("ca-bundle.crt"),
            issuer_cert: self.path("tls.crt"),
            issuer_key: self.path("tls.key"),
        }
    }

    fn write(&self, bundle: &str, iss: &CaMaterial) {
        std::fs::write(self.path("ca-bundle.crt"), bundle).unwrap();
        std::fs::write(self.path("tls.crt"), &iss.cert_pem).unwrap();
        std::fs::write(self.path("tls.key"), &iss.key_pem).unwrap();
    }

    fn both(&self) -> String {
        format!("{}{}", self.old.0.cert_pem, self.new.0.cert_pem)
    }
}

fn config() -> CaConfig {
    CaConfig {
        trust_domain: TD.into(),
        leaf_lifetime: DEFAULT_LEAF_LIFETIME,
        clock_skew_allowance: DEFAULT_CLOCK_SKEW_ALLOWANCE,
    }
}

fn reloader(pki: &Pki) -> (CaReloader, CaMetrics) {
    let metrics = CaMetrics::default();
    let r = CaReloader::load(
        pki.files(),
        config(),
        Duration::from_millis(100),
        metrics.clone(),
    )
    .unwrap();
    (r, metrics)
}

fn read(pki: &Pki) -> Snapshot {
    let files = pki.files();
    FilePoller::new(
        vec![files.trust_anchors, files.issuer_cert, files.issuer_key],
        Vec::new(),
    )
    .read()
}

fn der(pem: &str) -> Vec<u8> {
    crate::pki::parse_certificates(Path::new("x"), pem.as_bytes(), "x").unwrap()[0].to_vec()
}

/// The issuer (its DER) of a certificate the CA in use signs now.
fn signs_with(ca: &SharedCa) -> Vec<u8> {
    let key = KeyPair::generate().unwrap();
    let csr = CertificateParams::default()
        .serialize_request(&key)
        .unwrap();
    let id = WorkloadIdentity::new(TD, "shop", "web").unwrap();
    let issued = ca.current().certify(&id, csr.der()).unwrap();
    let (_, leaf) = X509Certificate::from_der(&issued.leaf_der).unwrap();
    let (_, iss) = X509Certificate::from_der(&issued.intermediates_der[0]).unwrap();
    assert!(leaf.verify_signature(Some(iss.public_key())).is_ok());
    issued.intermediates_der[0].clone()
}

fn reloads(m: &CaMetrics, result: Outcome) -> u64 {
    m.reloads.get_or_create(&ReloadLabels { result }).get()
}

#[test]
fn the_three_steps_of_a_rotation_are_taken_and_new_certificates_come_from_the_new_issuer() {
    let pki = Pki::new();
    let (r, metrics) = reloader(&pki);
    let ca = r.ca();
    assert_eq!(signs_with(&ca), der(&pki.old.1.cert_pem));

    // 1. Both anchors; the old issuer still signs.
    pki.write(&pki.both(), &pki.old.1);
    r.apply(read(&pki)).unwrap();
    assert_eq!(ca.current().roots().len(), 2);
    assert_eq!(signs_with(&ca), der(&pki.old.1.cert_pem));
    // 2. The new issuer.
    pki.write(&pki.both(), &pki.new.1);
    r.apply(read(&pki)).unwrap();
    assert_eq!(signs_with(&ca), der(&pki.new.1.cert_pem));
    assert_eq!(
        ca.current().issuer_root().map(|c| c.to_vec()),
        Some(der(&pki.new.0.cert_pem)),
        "signed by the new anchor"
    );
    // 3. The old anchor gone.
    pki.write(&pki.new.0.cert_pem, &pki.new.1);
    r.apply(read(&pki)).unwrap();
    assert_eq!(ca.current().roots().len(), 1);
    assert_eq!(signs_with(&ca), der(&pki.new.1.cert_pem));
    assert_eq!(reloads(&metrics, Outcome::Ok), 3);
    assert_eq!(reloads(&metrics, Outcome::Error), 0);

    let mut registry = Registry::default();
    registry.register("identity_ca_reloads", "", metrics.reloads.clone());
    registry.register("a", "", metrics.anchors.clone());
    registry.register("i", "", metrics.issuer.clone());
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let (old_root, new_root) = (
        sha256_hex(&der(&pki.old.0.cert_pem)),
        sha256_hex(&der(&pki.new.0.cert_pem)),
    );
    assert!(
        text.contains(&new_root) && !text.contains(&old_root),
        "{text}"
    );
    assert!(
        text.contains("identity_ca_reloads_total{result=\"ok\"} 3"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "sha256=\"{}\"",
            sha256_hex(&der(&pki.new.1.cert_pem))
        )),
        "{text}"
    );
}

#[test]
fn files_that_do_not_make_a_ca_are_refused_and_the_ca_in_use_stays() {
    let pki = Pki::new();
    let (r, metrics) = reloader(&pki);
    let ca = r.ca();
    /// What is wrong, how the files are made so, what the refusal says.
    type Case<'a> = (&'a str, Box<dyn Fn() + 'a>, &'a str);
    let bad: Vec<Case<'_>> = vec![
        (
            "the old anchor removed while the old issuer signs",
            Box::new(|| pki.write(&pki.new.0.cert_pem, &pki.old.1)),
            "does not chain to any root",
        ),
        (
            "a new issuer before its anchor is in the bundle",
            Box::new(|| pki.write(&pki.old.0.cert_pem, &pki.new.1)),
            "does not chain to any root",
        ),
        (
            "the new certificate with the old key",
            Box::new(|| {
                pki.write(&pki.both(), &pki.new.1);
                std::fs::write(pki.path("tls.key"), &pki.old.1.key_pem).unwrap();
            }),
            "does not match issuer certificate",
        ),
        (
            "an empty bundle",
            Box::new(|| pki.write("", &pki.old.1)),
            "no CERTIFICATE block",
        ),
        (
            "a missing key",
            Box::new(|| {
                pki.write(&pki.both(), &pki.old.1);
                std::fs::remove_file(pki.path("tls.key")).unwrap();
            }),
            "tls.key",
        ),
    ];
    for (i, (what, write, says)) in bad.into_iter().enumerate() {
        write();
        let error = r.apply(read(&pki)).unwrap_err();
        assert!(error.contains(says), "{what}: {error}");
        assert_eq!(reloads(&metrics, Outcome::Error), i as u64 + 1, "{what}");
        assert_eq!(ca.current().roots().len(), 1, "{what}: the CA in use stays");
        assert_eq!(signs_with(&ca), der(&pki.old.1.cert_pem), "{what}");
    }
}

#[tokio::test]
async fn the_files_are_polled_and_a_new_issuer_is_taken_without_a_restart() {
    let pki = Pki::new();
    let (r, metrics) = reloader(&pki);
    let ca = r.ca();
    let mut replaced = ca.subscribe();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(r.run(async move {
        let _ = stopped.await;
    }));
    pki.write(&pki.both(), &pki.new.1);
    tokio::time::timeout(Duration::from_secs(10), replaced.changed())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(signs_with(&ca), der(&pki.new.1.cert_pem));
    assert_eq!(reloads(&metrics, Outcome::Ok), 1);
    let _ = stop.send(());
    task.await.unwrap();
}
