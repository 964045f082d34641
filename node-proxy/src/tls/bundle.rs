//! The trust bundle: the roots a peer's chain must end at, and the trust domain its
//! identity must be in. A [`TrustBundle`] is a handle shared by every verifier of the
//! process (mesh tunnel, both sides; the control-plane channels): [`TrustBundle::replace`]
//! swaps the roots for all of them at once, and each handshake reads the roots current
//! when it runs — that is how a rotated bundle is taken without a restart. Connections
//! already open stay: they were verified when they were made.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, TrustAnchor};
use std::sync::{Arc, PoisonError, RwLock};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

/// Why a trust bundle cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// Not PEM certificates.
    #[error("trust bundle is not PEM certificates: {0}")]
    Pem(String),
    /// No certificate at all.
    #[error("trust bundle holds no certificate")]
    Empty,
    /// A certificate cannot be a trust anchor.
    #[error("trust bundle certificate #{index} cannot be a trust anchor: {error}")]
    Anchor {
        /// Position in the bundle, from 1.
        index: usize,
        /// webpki's reason.
        error: String,
    },
    /// A certificate names another trust domain (its `spiffe://<trust domain>` URI SAN).
    #[error("trust bundle certificate #{index} is a root of trust domain {got}, not {want}")]
    TrustDomain {
        /// Position in the bundle, from 1.
        index: usize,
        /// The trust domain it names.
        got: String,
        /// Ours.
        want: String,
    },
}

/// One version of the bundle's roots.
#[derive(Debug)]
pub struct Anchors {
    certs: Vec<CertificateDer<'static>>,
    roots: Vec<TrustAnchor<'static>>,
}

impl Anchors {
    fn parse(certs: Vec<CertificateDer<'static>>, trust_domain: &str) -> Result<Self, BundleError> {
        if certs.is_empty() {
            return Err(BundleError::Empty);
        }
        let mut roots = Vec::with_capacity(certs.len());
        for (i, c) in certs.iter().enumerate() {
            let index = i + 1;
            let anchor = webpki::anchor_from_trusted_cert(c).map_err(|e| BundleError::Anchor {
                index,
                error: e.to_string(),
            })?;
            if let Some(got) = spiffe_trust_domain(c).filter(|td| td != trust_domain) {
                return Err(BundleError::TrustDomain {
                    index,
                    got,
                    want: trust_domain.to_string(),
                });
            }
            roots.push(anchor.to_owned());
        }
        Ok(Self { certs, roots })
    }

    /// The roots, as webpki takes them.
    pub fn roots(&self) -> &[TrustAnchor<'static>] {
        &self.roots
    }

    /// The root certificates, DER, in the bundle's order.
    pub fn certificates(&self) -> &[CertificateDer<'static>] {
        &self.certs
    }

    /// How many roots.
    pub fn len(&self) -> usize {
        self.roots.len()
    }

    /// Never: a bundle holds at least one root.
    pub fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }

    /// Each root's subject, SHA-256 fingerprint and validity (for `/config_dump`, logs and
    /// metrics).
    pub fn describe(&self) -> Vec<AnchorInfo> {
        self.certs.iter().map(|c| AnchorInfo::of(c)).collect()
    }
}

/// What an operator needs to tell one root from another.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct AnchorInfo {
    /// The subject, as OpenSSL prints it (`CN=root.ambit.cluster.local`).
    pub subject: String,
    /// SHA-256 of the DER certificate, lowercase hex (`openssl x509 -fingerprint -sha256`
    /// without the colons).
    pub sha256: String,
    /// notBefore, seconds since the Unix epoch.
    pub not_before_unix: i64,
    /// notAfter, seconds since the Unix epoch.
    pub not_after_unix: i64,
}

impl AnchorInfo {
    fn of(der: &CertificateDer<'_>) -> Self {
        let parsed = X509Certificate::from_der(der).ok().map(|(_, c)| c);
        Self {
            subject: parsed
                .as_ref()
                .map(|c| c.subject().to_string())
                .unwrap_or_default(),
            sha256: sha256_hex(der),
            not_before_unix: parsed
                .as_ref()
                .map(|c| c.validity().not_before.timestamp())
                .unwrap_or(0),
            not_after_unix: parsed
                .as_ref()
                .map(|c| c.validity().not_after.timestamp())
                .unwrap_or(0),
        }
    }
}

/// SHA-256 of `der`, lowercase hex.
pub fn sha256_hex(der: &[u8]) -> String {
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, der)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The trust domain a CA certificate names in a `spiffe://<trust domain>` URI SAN (the
/// SPIFFE ID of a trust domain, which `ambit pki` writes into the roots it makes), if any.
fn spiffe_trust_domain(der: &CertificateDer<'_>) -> Option<String> {
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let san = cert.subject_alternative_name().ok()??;
    san.value.general_names.iter().find_map(|n| match n {
        GeneralName::URI(u) => u
            .strip_prefix("spiffe://")
            .map(|rest| rest.split('/').next().unwrap_or_default().to_string()),
        _ => None,
    })
}

struct Shared {
    trust_domain: String,
    current: RwLock<Arc<Anchors>>,
}

/// The roots peers' chains must end at (several at once while a root is rotated), with
/// the trust domain identities must be in. Clones share the roots; see the module doc.
#[derive(Clone)]
pub struct TrustBundle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for TrustBundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrustBundle")
            .field("trust_domain", &self.shared.trust_domain)
            .field("anchors", &self.anchors().len())
            .finish()
    }
}

/// Parses every PEM certificate of `pem`.
fn pem_certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, BundleError> {
    CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| BundleError::Pem(e.to_string()))
}

impl TrustBundle {
    /// Parses a PEM bundle of one or more root certificates.
    pub fn from_pem(pem: &[u8], trust_domain: impl Into<String>) -> Result<Self, BundleError> {
        Self::from_der(&pem_certificates(pem)?, trust_domain)
    }

    /// Builds a bundle from DER root certificates.
    pub fn from_der(
        certs: &[CertificateDer<'_>],
        trust_domain: impl Into<String>,
    ) -> Result<Self, BundleError> {
        let trust_domain = trust_domain.into();
        let certs = certs.iter().map(|c| c.clone().into_owned()).collect();
        let anchors = Anchors::parse(certs, &trust_domain)?;
        Ok(Self {
            shared: Arc::new(Shared {
                trust_domain,
                current: RwLock::new(Arc::new(anchors)),
            }),
        })
    }

    /// The roots now (a snapshot: a later [`Self::replace`] does not change it).
    pub fn anchors(&self) -> Arc<Anchors> {
        self.shared
            .current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The trust domain peers must belong to.
    pub fn trust_domain(&self) -> &str {
        &self.shared.trust_domain
    }

    /// Replaces the roots with those of `pem`, for every clone of this bundle, from the
    /// next handshake on; returns them. A bundle that does not parse, is empty or names
    /// another trust domain is refused and the roots stay as they were.
    pub fn replace(&self, pem: &[u8]) -> Result<Arc<Anchors>, BundleError> {
        let anchors = Arc::new(Anchors::parse(
            pem_certificates(pem)?,
            &self.shared.trust_domain,
        )?);
        *self
            .shared
            .current
            .write()
            .unwrap_or_else(PoisonError::into_inner) = anchors.clone();
        Ok(anchors)
    }
}
