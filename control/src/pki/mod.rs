//! The mesh PKI: trust bundle, issuer, and the signing of workload certificates.
//!
//! Trust anchor (root, ~10 y) → issuer (intermediate, ~1 y) → workload leaf (24 h by
//! default). The control plane holds the issuer key; workload keys never leave the nodes.
//! The CA in use is a [`SharedCa`]; [`reload`] replaces it when its files change (a
//! rotation), so that new certificates are signed by the new issuer without a restart.

mod ca;
pub mod generate;
mod pem;
pub mod reload;
mod shared;

pub use ca::{CaConfig, CaFiles, CertificateAuthority, CsrError, IssuedCertificate, LoadError};
pub use pem::{parse_certificates, parse_private_key};
pub use shared::SharedCa;

use std::time::{Duration, SystemTime};

/// Errors from the certificate library while creating certificates.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// rcgen could not create or sign a certificate.
    #[error("certificate generation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
    /// What was given to sign with is not usable.
    #[error("{0}")]
    Invalid(String),
}

/// Default lifetime of a workload certificate.
pub const DEFAULT_LEAF_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// How far a workload certificate's notBefore is backdated for clock skew between nodes.
pub const DEFAULT_CLOCK_SKEW_ALLOWANCE: Duration = Duration::from_secs(20);

/// SHA-256 of `der`, lowercase hex (`openssl x509 -fingerprint -sha256` without the
/// colons): how logs, metrics and `ambit pki inspect` name a certificate.
pub fn sha256_hex(der: &[u8]) -> String {
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, der)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The trust domain a CA certificate names in a `spiffe://<trust domain>` URI SAN, if it
/// names one.
pub fn spiffe_trust_domain(der: &[u8]) -> Option<String> {
    use x509_parser::extensions::GeneralName;
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let san = cert.subject_alternative_name().ok()??;
    san.value.general_names.iter().find_map(|n| match n {
        GeneralName::URI(u) => u
            .strip_prefix("spiffe://")
            .map(|rest| rest.split('/').next().unwrap_or_default().to_string()),
        _ => None,
    })
}

/// Seconds since the Unix epoch of `t`, saturating at 0.
pub fn unix_seconds(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests;
