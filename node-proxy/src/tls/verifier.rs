//! rustls verifiers for the mesh: the peer's chain must verify against the trust bundle
//! **and** its single URI SAN must be the SPIFFE ID we expect. webpki alone checks DNS and
//! IP names only, so the identity check is ours.

use super::TrustBundle;
use ambit_api::WorkloadIdentity;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use std::sync::Arc;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

/// Why a peer's certificate is not a valid SVID of the identity we want.
#[derive(thiserror::Error)]
pub enum SvidError {
    /// The certificate cannot be parsed.
    #[error("peer certificate is not valid X.509: {0}")]
    Malformed(String),
    /// The certificate has no, or more than one, URI SAN.
    #[error("peer certificate must carry exactly one URI SAN (a SPIFFE ID), found {0}")]
    UriSanCount(usize),
    /// The URI SAN is not a workload SPIFFE ID.
    #[error("peer certificate's URI SAN: {0}")]
    NotWorkload(#[from] ambit_api::IdentityError),
    /// The SPIFFE ID is in another trust domain.
    #[error("peer identity {got} is outside trust domain {want}")]
    TrustDomain {
        /// What the peer presented.
        got: WorkloadIdentity,
        /// Our trust domain.
        want: String,
    },
    /// The peer proved an identity we did not ask for.
    #[error("peer presented identity {got}, expected {}", expected.iter().map(ToString::to_string).collect::<Vec<_>>().join(" or "))]
    Unexpected {
        /// What the peer presented.
        got: WorkloadIdentity,
        /// What we wanted.
        expected: Vec<WorkloadIdentity>,
    },
}

// rustls prints the inner error of `CertificateError::Other` with `Debug`; make that the
// operator-facing message.
impl std::fmt::Debug for SvidError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl From<SvidError> for rustls::Error {
    fn from(e: SvidError) -> Self {
        rustls::Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(Arc::new(e))))
    }
}

/// The workload identity in an SVID: its single URI SAN, parsed.
pub fn svid_identity(cert: &CertificateDer<'_>) -> Result<WorkloadIdentity, SvidError> {
    let (_, x509) =
        X509Certificate::from_der(cert).map_err(|e| SvidError::Malformed(e.to_string()))?;
    let san = x509
        .subject_alternative_name()
        .map_err(|e| SvidError::Malformed(e.to_string()))?;
    let uris: Vec<&str> = san
        .iter()
        .flat_map(|s| s.value.general_names.iter())
        .filter_map(|n| match n {
            GeneralName::URI(u) => Some(*u),
            _ => None,
        })
        .collect();
    match uris.as_slice() {
        [uri] => Ok(uri.parse()?),
        _ => Err(SvidError::UriSanCount(uris.len())),
    }
}

fn webpki_error(e: webpki::Error) -> rustls::Error {
    use webpki::Error as W;
    let ce = match e {
        W::CertExpired { .. } => CertificateError::Expired,
        W::CertNotValidYet { .. } => CertificateError::NotValidYet,
        W::UnknownIssuer => CertificateError::UnknownIssuer,
        W::InvalidSignatureForPublicKey => CertificateError::BadSignature,
        W::RequiredEkuNotFoundContext(_) => CertificateError::InvalidPurpose,
        other => CertificateError::Other(rustls::OtherError(Arc::new(other))),
    };
    rustls::Error::InvalidCertificate(ce)
}

/// Verifies a chain for `usage` against `bundle` and returns the leaf's identity, which
/// must be in the bundle's trust domain.
fn verify_chain(
    bundle: &TrustBundle,
    algs: &WebPkiSupportedAlgorithms,
    end_entity: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
    now: UnixTime,
    usage: webpki::KeyUsage,
) -> Result<WorkloadIdentity, rustls::Error> {
    let cert = webpki::EndEntityCert::try_from(end_entity).map_err(webpki_error)?;
    // The roots of this moment: a bundle replaced since applies from this handshake on.
    let anchors = bundle.anchors();
    cert.verify_for_usage(
        algs.all,
        anchors.roots(),
        intermediates,
        now,
        usage,
        None,
        None,
    )
    .map_err(webpki_error)?;
    let id = svid_identity(end_entity)?;
    if id.trust_domain() != bundle.trust_domain() {
        return Err(SvidError::TrustDomain {
            got: id,
            want: bundle.trust_domain().to_string(),
        }
        .into());
    }
    Ok(id)
}

/// Verifies one of this proxy's own SVIDs (a chain kept on disk across a restart) as its
/// peers will: against `bundle`'s anchors at `now`, for both ends of the tunnel, in the
/// bundle's trust domain. Returns its identity.
pub fn verify_own_svid(
    bundle: &TrustBundle,
    chain: &[CertificateDer<'_>],
    now: UnixTime,
) -> Result<WorkloadIdentity, rustls::Error> {
    let (leaf, intermediates) = chain
        .split_first()
        .ok_or(rustls::Error::NoCertificatesPresented)?;
    let algs = algorithms();
    for usage in [
        webpki::KeyUsage::server_auth(),
        webpki::KeyUsage::client_auth(),
    ] {
        verify_chain(bundle, &algs, leaf, intermediates, now, usage)?;
    }
    svid_identity(leaf).map_err(Into::into)
}

fn algorithms() -> WebPkiSupportedAlgorithms {
    rustls::crypto::aws_lc_rs::default_provider().signature_verification_algorithms
}

/// Client side of the mesh tunnel: the server must prove one of the expected identities.
/// The server name is not checked — we connect by pod IP, and the identity is what counts.
#[derive(Debug)]
pub struct SpiffeServerVerifier {
    bundle: TrustBundle,
    expected: Vec<WorkloadIdentity>,
    algs: WebPkiSupportedAlgorithms,
}

impl SpiffeServerVerifier {
    /// Accepts a server that proves any of `expected`.
    pub fn new(bundle: TrustBundle, expected: Vec<WorkloadIdentity>) -> Self {
        Self {
            bundle,
            expected,
            algs: algorithms(),
        }
    }
}

impl ServerCertVerifier for SpiffeServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let id = verify_chain(
            &self.bundle,
            &self.algs,
            end_entity,
            intermediates,
            now,
            webpki::KeyUsage::server_auth(),
        )?;
        if !self.expected.contains(&id) {
            return Err(SvidError::Unexpected {
                got: id,
                expected: self.expected.clone(),
            }
            .into());
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

/// Server side of the mesh tunnel: the client must present an SVID of our trust domain.
/// Which identities may connect is a policy decision taken after the handshake, on the
/// identity [`svid_identity`] reads from the peer certificate.
#[derive(Debug)]
pub struct SpiffeClientVerifier {
    bundle: TrustBundle,
    algs: WebPkiSupportedAlgorithms,
}

impl SpiffeClientVerifier {
    /// Requires a client certificate chaining to `bundle`.
    pub fn new(bundle: TrustBundle) -> Self {
        Self {
            bundle,
            algs: algorithms(),
        }
    }
}

impl ClientCertVerifier for SpiffeClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        verify_chain(
            &self.bundle,
            &self.algs,
            end_entity,
            intermediates,
            now,
            webpki::KeyUsage::client_auth(),
        )?;
        Ok(ClientCertVerified::assertion())
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}
