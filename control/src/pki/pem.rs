//! Reading PEM files with errors that name the file.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;

/// Parses every `CERTIFICATE` block of a PEM file. `what` names the file's role in errors.
pub fn parse_certificates(
    path: &Path,
    pem: &[u8],
    what: &str,
) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{what} {}: not valid PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{what} {}: no CERTIFICATE block found; expected PEM-encoded X.509 certificates",
            path.display()
        ));
    }
    Ok(certs)
}

/// Parses the single private key (PKCS#8, SEC1 or PKCS#1) of a PEM file.
pub fn parse_private_key(path: &Path, pem: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| {
        format!(
            "issuer key {}: no usable private key ({e}); expected a PEM PRIVATE KEY block",
            path.display()
        )
    })
}
