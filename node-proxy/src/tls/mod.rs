//! TLS for the mesh tunnel: the trust bundle (`bundle`, swapped at run time by
//! [`reload`]), SPIFFE-aware verifiers, and rustls configs.
//!
//! One crypto provider for the whole workspace: aws-lc-rs. The mesh speaks TLS 1.3 only,
//! with mutual authentication and ALPN `h2`.

mod bundle;
pub mod reload;
mod verifier;

pub use bundle::{sha256_hex, AnchorInfo, Anchors, BundleError, TrustBundle};
pub use verifier::{
    svid_identity, verify_own_svid, SpiffeClientVerifier, SpiffeServerVerifier, SvidError,
};

use ambit_api::WorkloadIdentity;
use rustls::sign::CertifiedKey;
use std::sync::Arc;

/// ALPN protocol of the mesh tunnel.
pub const MESH_ALPN: &[u8] = b"h2";

/// The crypto provider used by every TLS config in Ambit: aws-lc-rs, with AES-128-GCM
/// preferred (faster than AES-256-GCM per byte; both are in TLS 1.3's mandatory set).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::crypto::aws_lc_rs::cipher_suite;
    let mut p = rustls::crypto::aws_lc_rs::default_provider();
    p.cipher_suites = vec![
        cipher_suite::TLS13_AES_128_GCM_SHA256,
        cipher_suite::TLS13_AES_256_GCM_SHA384,
        cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
    ];
    Arc::new(p)
}

/// A client config that presents `own` and requires the server to prove one of `expected`.
pub fn client_config(
    bundle: &TrustBundle,
    own: Arc<CertifiedKey>,
    expected: Vec<WorkloadIdentity>,
) -> Result<rustls::ClientConfig, rustls::Error> {
    let verifier = Arc::new(SpiffeServerVerifier::new(bundle.clone(), expected));
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(own)));
    config.alpn_protocols = vec![MESH_ALPN.to_vec()];
    Ok(config)
}

/// A server config that presents `own` and requires a client SVID of the trust domain.
pub fn server_config(
    bundle: &TrustBundle,
    own: Arc<CertifiedKey>,
) -> Result<rustls::ServerConfig, rustls::Error> {
    server_config_with(bundle, Arc::new(rustls::sign::SingleCertAndKey::from(own)))
}

/// As [`server_config`], with the certificate chosen per handshake by `resolver` (so that a
/// renewed certificate is used at once).
pub fn server_config_with(
    bundle: &TrustBundle,
    resolver: Arc<dyn rustls::server::ResolvesServerCert>,
) -> Result<rustls::ServerConfig, rustls::Error> {
    let verifier = Arc::new(SpiffeClientVerifier::new(bundle.clone()));
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![MESH_ALPN.to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests;
