//! Test helpers: an in-process CA that issues real X.509-SVIDs, and network namespaces
//! made for one test.
//!
//! The node proxy never links the control plane, so its own tests sign with this small CA
//! (rcgen, the same algorithms and extensions as the real one). End-to-end tests in
//! `tests/` run the real control plane instead.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use crate::identity::{CaClient, CaError};
use ambit_api::proto::identity::CertifyResponse;
use ambit_api::WorkloadIdentity;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls_pki_types::CertificateDer;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use time::OffsetDateTime;

/// A root and an issuer, and switches to make the CA fail.
pub struct TestCa {
    pub root_der: CertificateDer<'static>,
    pub root_pem: String,
    issuer_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
    pub trust_domain: String,
    pub lifetime: Mutex<Duration>,
    pub unavailable: AtomicBool,
    pub calls: AtomicUsize,
    pub issued: AtomicUsize,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

fn ca_params(cn: &str, bc: BasicConstraints) -> CertificateParams {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(bc);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    p.not_before = OffsetDateTime::now_utc() - Duration::from_secs(3600);
    p.not_after = OffsetDateTime::now_utc() + Duration::from_secs(365 * 86400);
    p
}

impl TestCa {
    pub fn new(trust_domain: &str) -> Arc<Self> {
        let root_key = KeyPair::generate().unwrap();
        let root_params = ca_params(
            &format!("root.{trust_domain}"),
            BasicConstraints::Unconstrained,
        );
        let root = root_params.self_signed(&root_key).unwrap();
        let root_issuer = Issuer::new(root_params, root_key);
        let issuer_key = KeyPair::generate().unwrap();
        let issuer_params = ca_params(
            &format!("issuer.{trust_domain}"),
            BasicConstraints::Constrained(0),
        );
        let issuer_cert = issuer_params.signed_by(&issuer_key, &root_issuer).unwrap();
        Arc::new(Self {
            root_pem: root.pem(),
            root_der: root.der().clone(),
            issuer_der: issuer_cert.der().clone(),
            issuer: Issuer::new(issuer_params, issuer_key),
            trust_domain: trust_domain.to_string(),
            lifetime: Mutex::new(Duration::from_secs(24 * 3600)),
            unavailable: AtomicBool::new(false),
            calls: AtomicUsize::new(0),
            issued: AtomicUsize::new(0),
        })
    }

    pub fn bundle(&self) -> crate::tls::TrustBundle {
        crate::tls::TrustBundle::from_der(std::slice::from_ref(&self.root_der), &self.trust_domain)
            .unwrap()
    }

    pub fn identity(&self, ns: &str, sa: &str) -> WorkloadIdentity {
        WorkloadIdentity::new(&self.trust_domain, ns, sa).unwrap()
    }

    /// Signs an SVID for `uris` (normally exactly one SPIFFE ID) valid from `not_before`
    /// for `lifetime`, for the public key in `csr`.
    pub fn sign(
        &self,
        csr_der: &[u8],
        uris: &[String],
        not_before: SystemTime,
        lifetime: Duration,
    ) -> Vec<u8> {
        let mut csr = CertificateSigningRequestParams::from_der(&csr_der.to_vec().into()).unwrap();
        let p = &mut csr.params;
        p.distinguished_name = DistinguishedName::new();
        p.subject_alt_names = uris
            .iter()
            .map(|u| SanType::URI(u.clone().try_into().unwrap()))
            .collect();
        p.is_ca = IsCa::ExplicitNoCa;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        p.not_before = OffsetDateTime::from(not_before);
        p.not_after = OffsetDateTime::from(not_before + lifetime);
        csr.signed_by(&self.issuer).unwrap().der().to_vec()
    }

    /// A fresh key and an SVID for `id`, as rustls wants them.
    pub fn certified_key(&self, id: &WorkloadIdentity) -> Arc<rustls::sign::CertifiedKey> {
        self.certified_key_with(
            &[id.to_string()],
            SystemTime::now() - Duration::from_secs(20),
            Duration::from_secs(3600),
        )
    }

    pub fn certified_key_with(
        &self,
        uris: &[String],
        not_before: SystemTime,
        lifetime: Duration,
    ) -> Arc<rustls::sign::CertifiedKey> {
        let key = KeyPair::generate().unwrap();
        let csr = CertificateParams::default()
            .serialize_request(&key)
            .unwrap();
        let leaf = self.sign(csr.der(), uris, not_before, lifetime);
        let key_der = rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
        let signing = crate::tls::provider()
            .key_provider
            .load_private_key(key_der)
            .unwrap();
        Arc::new(rustls::sign::CertifiedKey::new(
            vec![leaf.into(), self.issuer_der.clone()],
            signing,
        ))
    }
}

impl CaClient for TestCa {
    fn certify(&self, id: &WorkloadIdentity, csr_der: Vec<u8>) -> crate::identity::Certify {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let result = if self.unavailable.load(Ordering::SeqCst) {
            Err(CaError::Unavailable("test CA is down".into()))
        } else {
            self.issued.fetch_add(1, Ordering::SeqCst);
            let lifetime = *self.lifetime.lock().unwrap();
            let not_before = SystemTime::now() - Duration::from_secs(20);
            let leaf = self.sign(
                &csr_der,
                &[id.to_string()],
                not_before,
                lifetime + Duration::from_secs(20),
            );
            Ok(CertifyResponse {
                leaf_der: leaf,
                intermediates_der: vec![self.issuer_der.to_vec()],
                not_after_unix: 0,
                not_before_unix: 0,
            })
        };
        Box::pin(async move { result })
    }
}

/// A network namespace of the test's own (`ip netns add ambit-unit-<tag>-<pid>`, loopback
/// up), deleted on drop, also when the test fails.
#[derive(Debug)]
pub struct TestNetns(String);

impl TestNetns {
    /// Makes the namespace; panics with `ip`'s error if it cannot (tests run as root).
    pub fn new(tag: &str) -> Self {
        let name = format!("ambit-unit-{tag}-{}", std::process::id());
        let run = |args: &[&str]| {
            let out = std::process::Command::new("ip")
                .args(args)
                .output()
                .unwrap_or_else(|e| panic!("ip: {e}"));
            assert!(out.status.success(), "ip {args:?}: {out:?}");
        };
        run(&["netns", "add", &name]);
        let ns = Self(name);
        run(&["-n", &ns.0, "link", "set", "lo", "up"]);
        ns
    }

    /// Its name, for `ip netns exec`.
    pub fn name(&self) -> &str {
        &self.0
    }

    /// `/run/netns/<name>`.
    pub fn path(&self) -> std::path::PathBuf {
        std::path::PathBuf::from(format!("/run/netns/{}", self.0))
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "delete", &self.0])
            .output();
    }
}
