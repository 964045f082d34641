//! The certificate authority: loads and checks the issuer, signs workload CSRs.

use ambit_api::WorkloadIdentity;
use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PublicKeyData, SanType, SignatureAlgorithm, PKCS_ECDSA_P256_SHA256,
};
use rustls_pki_types::CertificateDer;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use time::OffsetDateTime;
use x509_parser::certificate::X509Certificate;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::oid_registry::{OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY};
use x509_parser::prelude::FromDer;

use super::generate::random_serial;
use super::{parse_certificates, parse_private_key};

/// How the CA issues workload certificates.
#[derive(Clone, Debug)]
pub struct CaConfig {
    /// The trust domain of every SPIFFE ID issued.
    pub trust_domain: String,
    /// Lifetime of a workload certificate.
    pub leaf_lifetime: Duration,
    /// How far notBefore is backdated.
    pub clock_skew_allowance: Duration,
}

/// Why the CA refuses to start. Each message says what is wrong and what to do.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file could not be read.
    #[error("cannot read {what} {}: {source}", path.display())]
    Read {
        /// Role of the file.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file's content is not what it should be.
    #[error("{0}")]
    Invalid(String),
    /// The issuer certificate is past its notAfter.
    #[error("issuer certificate {} expired at {not_after}; issue a new issuer from a root in the trust bundle (`ambit pki init` creates both) and restart", path.display())]
    IssuerExpired {
        /// The issuer certificate file.
        path: PathBuf,
        /// Its notAfter.
        not_after: String,
    },
    /// The issuer certificate's notBefore is in the future.
    #[error("issuer certificate {} is not valid before {not_before}; check this machine's clock", path.display())]
    IssuerNotYetValid {
        /// The issuer certificate file.
        path: PathBuf,
        /// Its notBefore.
        not_before: String,
    },
    /// The issuer key is not the key of the issuer certificate.
    #[error("issuer key {} does not match issuer certificate {} (their public keys differ); point --issuer-key at the key the certificate was issued for", key.display(), cert.display())]
    KeyMismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
    },
    /// The issuer was not signed by any root of the bundle.
    #[error("issuer certificate {} ({subject}) does not chain to any root in trust bundle {}; sign the issuer with one of the bundle's roots, or add its root to the bundle", cert.display(), bundle.display())]
    NotChained {
        /// The issuer certificate file.
        cert: PathBuf,
        /// Its subject.
        subject: String,
        /// The bundle file.
        bundle: PathBuf,
    },
    /// The issuer certificate may not sign certificates.
    #[error("issuer certificate {} is not a CA allowed to sign certificates (needs basicConstraints cA=true and keyUsage keyCertSign)", path.display())]
    NotCa {
        /// The issuer certificate file.
        path: PathBuf,
    },
}

/// Why a CSR was refused. All are the caller's fault (gRPC INVALID_ARGUMENT) but `Internal`.
#[derive(Debug, thiserror::Error)]
pub enum CsrError {
    /// Not DER PKCS#10.
    #[error("the CSR is not a DER-encoded PKCS#10 request ({0})")]
    Malformed(String),
    /// The CSR's self-signature does not verify.
    #[error("the CSR's signature does not verify against the public key it carries")]
    BadSignature,
    /// Not an ECDSA P-256 key.
    #[error("the CSR carries a {0} key; workload keys must be ECDSA P-256")]
    UnsupportedKey(String),
    /// Signing failed on our side.
    #[error("internal error while signing: {0}")]
    Internal(String),
}

/// A signed workload certificate with its chain.
#[derive(Clone, Debug)]
pub struct IssuedCertificate {
    /// The leaf, DER.
    pub leaf_der: Vec<u8>,
    /// The chain above the leaf (issuer first), DER; the trust anchor is not included.
    pub intermediates_der: Vec<Vec<u8>>,
    /// notBefore of the leaf.
    pub not_before: SystemTime,
    /// notAfter of the leaf.
    pub not_after: SystemTime,
}

/// The mesh CA: an issuer key and certificate that chain to the trust bundle.
pub struct CertificateAuthority {
    config: CaConfig,
    issuer: Issuer<'static, KeyPair>,
    chain_der: Vec<Vec<u8>>,
    issuer_not_after: SystemTime,
    roots: Vec<CertificateDer<'static>>,
    /// The root of `roots` that signed the issuer.
    issuer_root: usize,
}

impl std::fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("config", &self.config)
            .field("issuer_not_after", &self.issuer_not_after)
            .field("roots", &self.roots.len())
            .finish_non_exhaustive()
    }
}

/// Where the CA's files are.
#[derive(Clone, Debug)]
pub struct CaFiles {
    /// PEM bundle of trust anchors (one or more roots).
    pub trust_anchors: PathBuf,
    /// PEM issuer certificate, optionally followed by further intermediates.
    pub issuer_cert: PathBuf,
    /// PEM issuer private key.
    pub issuer_key: PathBuf,
}

impl CertificateAuthority {
    /// Loads the bundle and issuer from files, refusing an issuer that is expired, does not
    /// match its key, or does not chain to the bundle.
    pub fn load(files: &CaFiles, config: CaConfig) -> Result<Self, LoadError> {
        let read = |what, path: &Path| {
            std::fs::read(path).map_err(|source| LoadError::Read {
                what,
                path: path.to_path_buf(),
                source,
            })
        };
        let bundle_pem = read("trust bundle", &files.trust_anchors)?;
        let issuer_pem = read("issuer certificate", &files.issuer_cert)?;
        let key_pem = read("issuer key", &files.issuer_key)?;
        Self::from_pem(files, &bundle_pem, &issuer_pem, &key_pem, config)
    }

    /// As [`Self::load`], from file contents; `files` names them in errors.
    pub fn from_pem(
        files: &CaFiles,
        bundle_pem: &[u8],
        issuer_pem: &[u8],
        key_pem: &[u8],
        config: CaConfig,
    ) -> Result<Self, LoadError> {
        let roots = parse_certificates(&files.trust_anchors, bundle_pem, "trust bundle")
            .map_err(LoadError::Invalid)?;
        check_trust_domain(files, &roots, &config.trust_domain)?;
        let chain = parse_certificates(&files.issuer_cert, issuer_pem, "issuer certificate")
            .map_err(LoadError::Invalid)?;
        let key_der = parse_private_key(&files.issuer_key, key_pem).map_err(LoadError::Invalid)?;
        let key = KeyPair::try_from(&key_der).map_err(|e| {
            LoadError::Invalid(format!(
                "issuer key {}: unsupported key ({e}); use an ECDSA P-256/P-384, Ed25519 or RSA key",
                files.issuer_key.display()
            ))
        })?;

        let issuer_der = &chain[0];
        let issuer_cert = parse_cert(&files.issuer_cert, issuer_der)?;
        let issuer_not_after = check_issuer(files, &issuer_cert, &key)?;
        let issuer_root = check_chains_to_bundle(files, &issuer_cert, &roots)?;

        let issuer = Issuer::from_ca_cert_der(issuer_der, key).map_err(|e| {
            LoadError::Invalid(format!(
                "issuer certificate {}: {e}",
                files.issuer_cert.display()
            ))
        })?;
        Ok(Self {
            config,
            issuer,
            chain_der: chain.iter().map(|c| c.to_vec()).collect(),
            issuer_not_after,
            roots,
            issuer_root,
        })
    }

    /// The issuer certificate, DER.
    pub fn issuer_der(&self) -> &[u8] {
        self.chain_der
            .first()
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// The trust anchor that signed the issuer.
    pub fn issuer_root(&self) -> Option<&CertificateDer<'static>> {
        self.roots.get(self.issuer_root)
    }

    /// notAfter of the issuer certificate.
    pub fn issuer_not_after(&self) -> SystemTime {
        self.issuer_not_after
    }

    /// The trust anchors, DER.
    pub fn roots(&self) -> &[CertificateDer<'static>] {
        &self.roots
    }

    /// The configured trust domain.
    pub fn trust_domain(&self) -> &str {
        &self.config.trust_domain
    }

    /// Signs a workload certificate for `id` with the public key of `csr_der`.
    ///
    /// The CA decides the certificate's names: exactly one URI SAN (the SPIFFE ID) and the
    /// identity's DNS SAN. Whatever else the CSR asks for (names, usages, CA) is not granted.
    pub fn certify(
        &self,
        id: &WorkloadIdentity,
        csr_der: &[u8],
    ) -> Result<IssuedCertificate, CsrError> {
        let public_key = verified_csr_key(csr_der)?;
        let now = SystemTime::now();
        let not_before = now - self.config.clock_skew_allowance;
        let not_after = now + self.config.leaf_lifetime;

        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, id.dns_name());
        params.distinguished_name = dn;
        let internal = |e: rcgen::Error| CsrError::Internal(e.to_string());
        params.subject_alt_names = vec![
            SanType::URI(id.spiffe_id().try_into().map_err(internal)?),
            SanType::DnsName(id.dns_name().try_into().map_err(internal)?),
        ];
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.not_before = OffsetDateTime::from(not_before);
        params.not_after = OffsetDateTime::from(not_after);
        params.serial_number = Some(random_serial());
        params.use_authority_key_identifier_extension = true;
        let cert = params
            .signed_by(&public_key, &self.issuer)
            .map_err(internal)?;

        Ok(IssuedCertificate {
            leaf_der: cert.der().to_vec(),
            intermediates_der: self.chain_der.clone(),
            // Certificates carry whole seconds.
            not_before: truncate_to_second(not_before),
            not_after: truncate_to_second(not_after),
        })
    }
}

/// An ECDSA P-256 public key taken from a verified CSR.
struct CsrPublicKey(Vec<u8>);

impl PublicKeyData for CsrPublicKey {
    fn der_bytes(&self) -> &[u8] {
        &self.0
    }

    fn algorithm(&self) -> &'static SignatureAlgorithm {
        &PKCS_ECDSA_P256_SHA256
    }
}

fn verified_csr_key(der: &[u8]) -> Result<CsrPublicKey, CsrError> {
    let (rest, csr) =
        X509CertificationRequest::from_der(der).map_err(|e| CsrError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(CsrError::Malformed(format!(
            "{} trailing bytes after the request",
            rest.len()
        )));
    }
    let spki = &csr.certification_request_info.subject_pki;
    let is_p256 = spki.algorithm.algorithm == OID_KEY_TYPE_EC_PUBLIC_KEY
        && spki
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| p.as_oid().ok())
            .is_some_and(|curve| curve == OID_EC_P256);
    if !is_p256 {
        return Err(CsrError::UnsupportedKey(
            spki.algorithm.algorithm.to_id_string(),
        ));
    }
    csr.verify_signature().map_err(|_| CsrError::BadSignature)?;
    Ok(CsrPublicKey(spki.subject_public_key.data.to_vec()))
}

fn parse_cert<'a>(path: &Path, der: &'a [u8]) -> Result<X509Certificate<'a>, LoadError> {
    X509Certificate::from_der(der).map(|(_, c)| c).map_err(|e| {
        LoadError::Invalid(format!("{}: not an X.509 certificate: {e}", path.display()))
    })
}

/// Checks the issuer's validity window, CA flags and key; returns its notAfter.
fn check_issuer(
    files: &CaFiles,
    cert: &X509Certificate<'_>,
    key: &KeyPair,
) -> Result<SystemTime, LoadError> {
    let now = OffsetDateTime::now_utc();
    let validity = cert.validity();
    if validity.not_after.to_datetime() < now {
        return Err(LoadError::IssuerExpired {
            path: files.issuer_cert.clone(),
            not_after: validity.not_after.to_string(),
        });
    }
    if validity.not_before.to_datetime() > now {
        return Err(LoadError::IssuerNotYetValid {
            path: files.issuer_cert.clone(),
            not_before: validity.not_before.to_string(),
        });
    }
    let can_sign = cert
        .key_usage()
        .ok()
        .flatten()
        .is_none_or(|ku| ku.value.key_cert_sign());
    if !cert.is_ca() || !can_sign {
        return Err(LoadError::NotCa {
            path: files.issuer_cert.clone(),
        });
    }
    if cert.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
        return Err(LoadError::KeyMismatch {
            cert: files.issuer_cert.clone(),
            key: files.issuer_key.clone(),
        });
    }
    Ok(SystemTime::from(validity.not_after.to_datetime()))
}

/// Refuses a root that names another trust domain (a `spiffe://<trust domain>` URI SAN,
/// which `ambit pki` writes into the roots it makes): a bundle of another mesh.
fn check_trust_domain(
    files: &CaFiles,
    roots: &[CertificateDer<'static>],
    trust_domain: &str,
) -> Result<(), LoadError> {
    for (i, der) in roots.iter().enumerate() {
        let Some(named) = super::spiffe_trust_domain(der) else {
            continue;
        };
        if named != trust_domain {
            return Err(LoadError::Invalid(format!(
                "trust bundle {}: certificate #{} is a root of trust domain {named}, not {trust_domain}; is this the bundle of another mesh?",
                files.trust_anchors.display(),
                i + 1
            )));
        }
    }
    Ok(())
}

/// The position in `roots` of the root that signed `issuer`.
fn check_chains_to_bundle(
    files: &CaFiles,
    issuer: &X509Certificate<'_>,
    roots: &[CertificateDer<'static>],
) -> Result<usize, LoadError> {
    for (i, root_der) in roots.iter().enumerate() {
        let root = X509Certificate::from_der(root_der)
            .map(|(_, c)| c)
            .map_err(|e| {
                LoadError::Invalid(format!(
                    "trust bundle {}: certificate #{} is not X.509: {e}",
                    files.trust_anchors.display(),
                    i + 1
                ))
            })?;
        if root.subject() == issuer.issuer()
            && issuer.verify_signature(Some(root.public_key())).is_ok()
        {
            return Ok(i);
        }
    }
    Err(LoadError::NotChained {
        cert: files.issuer_cert.clone(),
        subject: issuer.subject().to_string(),
        bundle: files.trust_anchors.clone(),
    })
}

fn truncate_to_second(t: SystemTime) -> SystemTime {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}
