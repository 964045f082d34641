//! Creation of the mesh's trust anchors and issuers (`ambit pki`).

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber, PKCS_ECDSA_P256_SHA256,
};
use std::time::Duration;
use time::OffsetDateTime;

use super::PkiError;

/// Default lifetime of a trust anchor: ten years.
pub const DEFAULT_ROOT_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Default lifetime of an issuer: one year.
pub const DEFAULT_ISSUER_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);

/// A CA certificate and its private key, both PEM.
#[derive(Clone)]
pub struct CaMaterial {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The PKCS#8 private key, PEM.
    pub key_pem: String,
}

impl std::fmt::Debug for CaMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("CaMaterial").finish_non_exhaustive()
    }
}

/// Validity window of a generated CA certificate.
#[derive(Clone, Copy, Debug)]
pub struct Validity {
    /// notBefore.
    pub not_before: OffsetDateTime,
    /// notAfter.
    pub not_after: OffsetDateTime,
}

impl Validity {
    /// From now (backdated by a minute for clock skew) for `lifetime`.
    pub fn starting_now(lifetime: Duration) -> Self {
        let now = OffsetDateTime::now_utc();
        Self {
            not_before: now - Duration::from_secs(60),
            not_after: now + lifetime,
        }
    }
}

/// Creates a self-signed trust anchor (ECDSA P-256): CA, keyCertSign + cRLSign, with the
/// trust domain's SPIFFE ID (`spiffe://<trust domain>`) as its URI SAN, by which a proxy
/// refuses a bundle of another mesh.
pub fn trust_anchor(trust_domain: &str, validity: Validity) -> Result<CaMaterial, PkiError> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let params = ca_params(
        &format!("root.ambit.{trust_domain}"),
        trust_domain,
        BasicConstraints::Unconstrained,
        validity,
    )?;
    let cert = params.self_signed(&key)?;
    Ok(CaMaterial {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Creates an issuer (intermediate CA, path length 0) signed by `root`, whose key must be
/// its certificate's.
pub fn issuer(
    root: &CaMaterial,
    trust_domain: &str,
    validity: Validity,
) -> Result<CaMaterial, PkiError> {
    let root_key = KeyPair::from_pem(&root.key_pem)?;
    let root_der = rustls_pki_types::pem::PemObject::from_pem_slice(root.cert_pem.as_bytes())
        .map_err(|e| PkiError::Invalid(format!("the trust anchor certificate: {e}")))?;
    let root_der: rustls_pki_types::CertificateDer<'_> = root_der;
    let (_, root_cert) = x509_parser::prelude::FromDer::from_der(&root_der)
        .map_err(|e| PkiError::Invalid(format!("the trust anchor certificate: {e}")))?;
    let root_cert: x509_parser::certificate::X509Certificate<'_> = root_cert;
    if root_cert.public_key().subject_public_key.data.as_ref() != root_key.public_key_raw() {
        return Err(PkiError::Invalid(
            "the trust anchor key is not the key of the trust anchor certificate (their public keys differ)".into(),
        ));
    }
    let root_issuer = Issuer::from_ca_cert_pem(&root.cert_pem, root_key)?;
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut params = ca_params(
        &format!("identity.ambit.{trust_domain}"),
        trust_domain,
        BasicConstraints::Constrained(0),
        validity,
    )?;
    params.use_authority_key_identifier_extension = true;
    let cert = params.signed_by(&key, &root_issuer)?;
    Ok(CaMaterial {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

fn ca_params(
    common_name: &str,
    trust_domain: &str,
    bc: BasicConstraints,
    validity: Validity,
) -> Result<CertificateParams, PkiError> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    params.distinguished_name = dn;
    params.subject_alt_names = vec![SanType::URI(format!("spiffe://{trust_domain}").try_into()?)];
    // rcgen writes basicConstraints as a critical extension.
    params.is_ca = IsCa::Ca(bc);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = validity.not_before;
    params.not_after = validity.not_after;
    params.serial_number = Some(random_serial());
    Ok(params)
}

/// A random positive 128-bit serial number.
pub(crate) fn random_serial() -> SerialNumber {
    let mut bytes = [0u8; 16];
    // An RNG failure in the OS is not something we can recover from; fall back to
    // fastrand rather than issue a duplicate, predictable serial.
    if aws_lc_rs::rand::fill(&mut bytes).is_err() {
        bytes.iter_mut().for_each(|b| *b = fastrand::u8(..));
    }
    bytes[0] &= 0x7f; // keep it positive
    bytes[0] |= 0x01; // and of full length
    SerialNumber::from_slice(&bytes)
}
