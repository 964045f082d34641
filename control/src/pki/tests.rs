use super::generate::{issuer, trust_anchor, CaMaterial, Validity};
use super::*;
use ambit_api::WorkloadIdentity;
use rcgen::{CertificateParams, KeyPair, SanType, PKCS_ECDSA_P256_SHA256, PKCS_ECDSA_P384_SHA384};
use std::path::PathBuf;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::{FromDer, X509Certificate};

const TD: &str = "cluster.local";

fn files() -> CaFiles {
    CaFiles {
        trust_anchors: PathBuf::from("/etc/ambit/trust-anchors.pem"),
        issuer_cert: PathBuf::from("/etc/ambit/issuer.crt"),
        issuer_key: PathBuf::from("/etc/ambit/issuer.key"),
    }
}

fn config() -> CaConfig {
    CaConfig {
        trust_domain: TD.into(),
        leaf_lifetime: DEFAULT_LEAF_LIFETIME,
        clock_skew_allowance: DEFAULT_CLOCK_SKEW_ALLOWANCE,
    }
}

fn pki() -> (CaMaterial, CaMaterial) {
    let root = trust_anchor(TD, Validity::starting_now(generate::DEFAULT_ROOT_LIFETIME)).unwrap();
    let iss = issuer(
        &root,
        TD,
        Validity::starting_now(generate::DEFAULT_ISSUER_LIFETIME),
    )
    .unwrap();
    (root, iss)
}

fn ca_from(bundle: &str, iss: &CaMaterial) -> Result<CertificateAuthority, LoadError> {
    CertificateAuthority::from_pem(
        &files(),
        bundle.as_bytes(),
        iss.cert_pem.as_bytes(),
        iss.key_pem.as_bytes(),
        config(),
    )
}

fn web() -> WorkloadIdentity {
    WorkloadIdentity::new(TD, "shop", "web").unwrap()
}

fn csr(params: &CertificateParams, key: &KeyPair) -> Vec<u8> {
    params.serialize_request(key).unwrap().der().to_vec()
}

fn plain_csr() -> Vec<u8> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    csr(&CertificateParams::default(), &key)
}

fn cert(der: &[u8]) -> X509Certificate<'_> {
    X509Certificate::from_der(der).unwrap().1
}

#[test]
fn trust_anchor_and_issuer_are_critical_ca_certificates() {
    let (root, iss) = pki();
    for (m, pathlen) in [(&root, None), (&iss, Some(0))] {
        let der = rustls_pki_types::pem::PemObject::from_pem_slice(m.cert_pem.as_bytes());
        let der: rustls_pki_types::CertificateDer<'_> = der.unwrap();
        let c = cert(&der);
        let bc = c.basic_constraints().unwrap().unwrap();
        assert!(bc.critical && bc.value.ca);
        assert_eq!(bc.value.path_len_constraint, pathlen);
        let ku = c.key_usage().unwrap().unwrap();
        assert!(ku.critical && ku.value.key_cert_sign() && ku.value.crl_sign());
        assert!(!ku.value.digital_signature());
        assert_eq!(spiffe_trust_domain(&der).as_deref(), Some(TD));
    }
}

#[test]
fn a_bundle_of_another_trust_domain_is_refused_naming_it() {
    let (_, iss) = pki();
    let other = trust_anchor(
        "other.example",
        Validity::starting_now(generate::DEFAULT_ROOT_LIFETIME),
    )
    .unwrap();
    let err = ca_from(&other.cert_pem, &iss).unwrap_err().to_string();
    assert!(
        err.contains("certificate #1 is a root of trust domain other.example, not cluster.local"),
        "{err}"
    );
}

#[test]
fn leaf_carries_exactly_the_identity_the_ca_decides() {
    let (root, iss) = pki();
    let ca = ca_from(&root.cert_pem, &iss).unwrap();
    let issued = ca.certify(&web(), &plain_csr()).unwrap();
    let leaf = cert(&issued.leaf_der);

    let san = leaf.subject_alternative_name().unwrap().unwrap();
    let uris: Vec<_> = san
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::URI(u) => Some(*u),
            _ => None,
        })
        .collect();
    assert_eq!(uris, ["spiffe://cluster.local/ns/shop/sa/web"]);
    let dns: Vec<_> = san
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::DNSName(d) => Some(*d),
            _ => None,
        })
        .collect();
    assert_eq!(
        dns,
        ["web.shop.serviceaccount.identity.ambit.cluster.local"]
    );
    assert_eq!(san.value.general_names.len(), 2);

    let bc = leaf.basic_constraints().unwrap().unwrap();
    assert!(!bc.value.ca);
    let ku = leaf.key_usage().unwrap().unwrap();
    assert!(ku.critical && ku.value.digital_signature() && !ku.value.key_cert_sign());
    let eku = leaf.extended_key_usage().unwrap().unwrap();
    assert!(eku.value.server_auth && eku.value.client_auth && !eku.value.any);

    let v = leaf.validity();
    let lifetime = v.not_after.timestamp() - v.not_before.timestamp();
    assert_eq!(
        lifetime,
        (DEFAULT_LEAF_LIFETIME + DEFAULT_CLOCK_SKEW_ALLOWANCE).as_secs() as i64
    );
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    assert!(
        v.not_before.timestamp() <= now - 19,
        "notBefore is backdated by the skew allowance"
    );
    assert_eq!(unix_seconds(issued.not_after), v.not_after.timestamp());
    assert_eq!(
        issued.intermediates_der.len(),
        1,
        "the issuer comes with the leaf"
    );
}

#[test]
fn csr_asking_for_extra_names_and_ca_is_not_granted() {
    let (root, iss) = pki();
    let ca = ca_from(&root.cert_pem, &iss).unwrap();
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = CertificateParams::new(vec!["evil.example.com".to_string()]).unwrap();
    params.subject_alt_names.push(SanType::URI(
        "spiffe://cluster.local/ns/kube-system/sa/admin"
            .try_into()
            .unwrap(),
    ));
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let issued = ca.certify(&web(), &csr(&params, &key)).unwrap();
    let leaf = cert(&issued.leaf_der);
    for ext in leaf.extensions() {
        if let ParsedExtension::SubjectAlternativeName(san) = ext.parsed_extension() {
            let names = format!("{:?}", san.general_names);
            assert!(
                !names.contains("evil") && !names.contains("kube-system"),
                "{names}"
            );
        }
    }
    assert!(!leaf.basic_constraints().unwrap().unwrap().value.ca);
}

#[test]
fn malformed_tampered_and_foreign_key_csrs_are_refused() {
    let (root, iss) = pki();
    let ca = ca_from(&root.cert_pem, &iss).unwrap();
    assert!(matches!(
        ca.certify(&web(), b"not a csr"),
        Err(CsrError::Malformed(_))
    ));

    let mut tampered = plain_csr();
    let last = tampered.len() - 1;
    tampered[last] ^= 0x01; // inside the signature
    assert!(matches!(
        ca.certify(&web(), &tampered),
        Err(CsrError::BadSignature)
    ));

    let p384 = KeyPair::generate_for(&PKCS_ECDSA_P384_SHA384).unwrap();
    let err = ca
        .certify(&web(), &csr(&CertificateParams::default(), &p384))
        .unwrap_err();
    assert!(matches!(err, CsrError::UnsupportedKey(_)), "{err}");
}

#[test]
fn expired_issuer_is_refused_at_load() {
    let (root, _) = pki();
    let now = time::OffsetDateTime::now_utc();
    let past = Validity {
        not_before: now - time::Duration::days(400),
        not_after: now - time::Duration::days(1),
    };
    let iss = issuer(&root, TD, past).unwrap();
    let err = ca_from(&root.cert_pem, &iss).unwrap_err();
    assert!(matches!(err, LoadError::IssuerExpired { .. }), "{err}");
    assert!(err.to_string().contains("expired at"), "{err}");
}

#[test]
fn issuer_key_that_does_not_match_is_refused_at_load() {
    let (root, iss) = pki();
    let other = issuer(
        &root,
        TD,
        Validity::starting_now(generate::DEFAULT_ISSUER_LIFETIME),
    )
    .unwrap();
    let mismatched = CaMaterial {
        cert_pem: iss.cert_pem,
        key_pem: other.key_pem,
    };
    let err = ca_from(&root.cert_pem, &mismatched).unwrap_err();
    assert!(matches!(err, LoadError::KeyMismatch { .. }), "{err}");
    assert!(err.to_string().contains("--issuer-key"), "{err}");
}

#[test]
fn issuer_from_another_root_is_refused_at_load() {
    let (root, _) = pki();
    let (_, foreign_issuer) = pki();
    let err = ca_from(&root.cert_pem, &foreign_issuer).unwrap_err();
    assert!(matches!(err, LoadError::NotChained { .. }), "{err}");
}

#[test]
fn root_used_as_issuer_without_ca_rights_is_refused() {
    // A leaf (not a CA) offered as issuer.
    let (root, iss) = pki();
    let ca = ca_from(&root.cert_pem, &iss).unwrap();
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let leaf = ca
        .certify(&web(), &csr(&CertificateParams::default(), &key))
        .unwrap();
    let leaf_pem = ::pem::encode(&::pem::Pem::new("CERTIFICATE", leaf.leaf_der));
    let not_ca = CaMaterial {
        cert_pem: leaf_pem,
        key_pem: key.serialize_pem(),
    };
    let err = ca_from(&root.cert_pem, &not_ca).unwrap_err();
    assert!(matches!(err, LoadError::NotCa { .. }), "{err}");
}

#[test]
fn bundle_with_two_roots_accepts_an_issuer_of_either() {
    let (old_root, old_issuer) = pki();
    let (new_root, new_issuer) = pki();
    let bundle = format!("{}{}", old_root.cert_pem, new_root.cert_pem);
    let a = ca_from(&bundle, &old_issuer).unwrap();
    let b = ca_from(&bundle, &new_issuer).unwrap();
    assert_eq!(a.roots().len(), 2);
    assert_eq!(b.roots().len(), 2);
}

#[test]
fn empty_bundle_is_refused_with_the_file_named() {
    let (_, iss) = pki();
    let err = ca_from("", &iss).unwrap_err();
    assert!(
        err.to_string().contains("/etc/ambit/trust-anchors.pem"),
        "{err}"
    );
}

/// `openssl verify` accepts the chain for both TLS client and server purposes.
#[test]
fn openssl_verifies_the_issued_chain() {
    let (root, iss) = pki();
    let ca = ca_from(&root.cert_pem, &iss).unwrap();
    let issued = ca.certify(&web(), &plain_csr()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let leaf_pem = ::pem::encode(&::pem::Pem::new("CERTIFICATE", issued.leaf_der));
    std::fs::write(dir.path().join("root.pem"), &root.cert_pem).unwrap();
    std::fs::write(dir.path().join("issuer.pem"), &iss.cert_pem).unwrap();
    std::fs::write(dir.path().join("leaf.pem"), leaf_pem).unwrap();
    for purpose in ["sslclient", "sslserver"] {
        let out = std::process::Command::new("openssl")
            .current_dir(dir.path())
            .args([
                "verify",
                "-x509_strict",
                "-purpose",
                purpose,
                "-CAfile",
                "root.pem",
                "-untrusted",
                "issuer.pem",
                "leaf.pem",
            ])
            .output()
            .expect("openssl must be installed (the test script installs it)");
        assert!(
            out.status.success(),
            "{purpose}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "leaf.pem: OK");
    }
    // And it does not verify against an unrelated root.
    let (other_root, _) = pki();
    std::fs::write(dir.path().join("other.pem"), &other_root.cert_pem).unwrap();
    let out = std::process::Command::new("openssl")
        .current_dir(dir.path())
        .args([
            "verify",
            "-CAfile",
            "other.pem",
            "-untrusted",
            "issuer.pem",
            "leaf.pem",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
}
