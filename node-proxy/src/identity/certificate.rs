//! A workload's current certificate and key, ready for rustls.

use super::CaError;
use crate::tls::svid_identity;
use ambit_api::proto::identity::CertifyResponse;
use ambit_api::WorkloadIdentity;
use rcgen::KeyPair;
use rustls::sign::CertifiedKey;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::time::Instant;
use x509_parser::prelude::{FromDer, X509Certificate};

/// A workload certificate with its chain and key.
#[derive(Clone)]
pub struct WorkloadCertificate {
    identity: WorkloadIdentity,
    certified: Arc<CertifiedKey>,
    not_before: SystemTime,
    not_after: SystemTime,
    /// `not_after` on the runtime's clock, so that timers (and tests with paused time)
    /// agree with expiry.
    expires_at: Instant,
    received_at: Instant,
    /// How old the certificate was when it arrived (notBefore is backdated).
    age_at_receipt: Duration,
    /// The private key, PKCS#8 DER: a secret, kept only to be written to the proxy's
    /// state directory (mode 0600) so that a restart can serve with it.
    key_pkcs8: Arc<[u8]>,
    /// Read back from the state directory rather than obtained from the CA by this process.
    restored: bool,
}

impl std::fmt::Debug for WorkloadCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkloadCertificate")
            .field("identity", &self.identity.to_string())
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .field("restored", &self.restored)
            .finish_non_exhaustive()
    }
}

fn bad(msg: impl Into<String>) -> CaError {
    CaError::BadResponse(msg.into())
}

impl WorkloadCertificate {
    /// Checks the CA's answer against what was asked (identity, our key, validity) and
    /// builds the rustls key.
    pub(crate) fn from_response(
        id: &WorkloadIdentity,
        key: &KeyPair,
        resp: CertifyResponse,
    ) -> Result<Self, CaError> {
        let mut chain = vec![CertificateDer::from(resp.leaf_der)];
        chain.extend(resp.intermediates_der.into_iter().map(CertificateDer::from));
        Self::from_chain(id, key, chain, false)
    }

    /// A certificate read back from disk: the same checks as the CA's answer gets (the
    /// caller verifies the chain against the trust anchors first).
    pub fn restore(
        id: &WorkloadIdentity,
        key: &KeyPair,
        chain: Vec<CertificateDer<'static>>,
    ) -> Result<Self, CaError> {
        Self::from_chain(id, key, chain, true)
    }

    /// Checks `chain` (leaf first) against what was asked (identity, our key, validity)
    /// and builds the rustls key.
    fn from_chain(
        id: &WorkloadIdentity,
        key: &KeyPair,
        chain: Vec<CertificateDer<'static>>,
        restored: bool,
    ) -> Result<Self, CaError> {
        let leaf = chain
            .first()
            .cloned()
            .ok_or_else(|| bad("no certificate"))?;
        let got = svid_identity(&leaf).map_err(|e| bad(e.to_string()))?;
        if &got != id {
            return Err(bad(format!("asked for {id}, got a certificate for {got}")));
        }
        let (_, x509) = X509Certificate::from_der(&leaf).map_err(|e| bad(e.to_string()))?;
        if x509.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
            return Err(bad("the certificate is not for our key"));
        }
        let validity = x509.validity();
        let not_before = SystemTime::from(validity.not_before.to_datetime());
        let not_after = SystemTime::from(validity.not_after.to_datetime());
        let now = SystemTime::now();
        let remaining = not_after
            .duration_since(now)
            .map_err(|_| bad("the certificate has already expired"))?;

        let key_pkcs8: Arc<[u8]> = key.serialize_der().into();
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key_pkcs8.to_vec()));
        let signing_key = crate::tls::provider()
            .key_provider
            .load_private_key(key_der)
            .map_err(|e| bad(format!("loading our own key: {e}")))?;
        drop(x509);
        let received_at = Instant::now();
        Ok(Self {
            identity: id.clone(),
            certified: Arc::new(CertifiedKey::new(chain, signing_key)),
            not_before,
            not_after,
            expires_at: received_at + remaining,
            received_at,
            age_at_receipt: now.duration_since(not_before).unwrap_or_default(),
            key_pkcs8,
            restored,
        })
    }

    /// The private key, PKCS#8 DER. A secret: for the state directory only.
    pub(crate) fn key_pkcs8_der(&self) -> &[u8] {
        &self.key_pkcs8
    }

    /// Whether it was read back from disk (a restart) rather than obtained from the CA.
    pub fn restored(&self) -> bool {
        self.restored
    }

    /// The identity the certificate proves.
    pub fn identity(&self) -> &WorkloadIdentity {
        &self.identity
    }

    /// The chain and key, for rustls.
    pub fn certified_key(&self) -> Arc<CertifiedKey> {
        self.certified.clone()
    }

    /// notBefore.
    pub fn not_before(&self) -> SystemTime {
        self.not_before
    }

    /// notAfter.
    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    /// Whether the certificate is past its notAfter.
    pub fn is_expired(&self) -> bool {
        Instant::now() >= self.expires_at
    }

    /// When to renew: at `fraction` of the lifetime, less `jitter`.
    pub(crate) fn refresh_at(&self, fraction: f64, jitter: Duration) -> Instant {
        let lifetime = self
            .not_after
            .duration_since(self.not_before)
            .unwrap_or_default();
        let target = lifetime.mul_f64(fraction).saturating_sub(jitter);
        self.received_at + target.saturating_sub(self.age_at_receipt)
    }

    /// When it expires, on the runtime's clock.
    pub(crate) fn expires_at(&self) -> Instant {
        self.expires_at
    }
}
