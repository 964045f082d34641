//! The mesh PKI: trust bundle, issuer, and the signing of workload certificates.
//!
//! Trust anchor (root, ~10 y) → issuer (intermediate, ~1 y) → workload leaf (24 h by
//! default). The control plane holds the issuer key; workload keys never leave the nodes.

mod ca;
pub mod generate;
mod pem;

pub use ca::{CaConfig, CaFiles, CertificateAuthority, CsrError, IssuedCertificate, LoadError};
pub use pem::{parse_certificates, parse_private_key};

use std::time::{Duration, SystemTime};

/// Errors from the certificate library while creating certificates.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// rcgen could not create or sign a certificate.
    #[error("certificate generation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
}

/// Default lifetime of a workload certificate.
pub const DEFAULT_LEAF_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// How far a workload certificate's notBefore is backdated for clock skew between nodes.
pub const DEFAULT_CLOCK_SKEW_ALLOWANCE: Duration = Duration::from_secs(20);

/// Seconds since the Unix epoch of `t`, saturating at 0.
pub fn unix_seconds(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests;
