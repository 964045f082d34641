//! The node proxy's side of the identity service: ask the CA for a certificate.

use crate::token::TokenSource;
use ambit_api::proto::identity::identity_client::IdentityClient;
use ambit_api::proto::identity::{CertifyRequest, CertifyResponse};
use ambit_api::WorkloadIdentity;
use std::future::Future;
use std::pin::Pin;
use tonic::transport::Channel;

/// Why the CA did not issue a certificate.
#[derive(Clone, Debug, thiserror::Error)]
pub enum CaError {
    /// The CA could not be reached or did not answer in time: retry later.
    #[error("identity service unavailable: {0}")]
    Unavailable(String),
    /// The CA answered with a refusal (bad token, not on this node, bad CSR).
    #[error("identity service refused ({code}): {message}")]
    Refused {
        /// The gRPC code name.
        code: String,
        /// The CA's message.
        message: String,
    },
    /// The CA's answer is not a usable certificate for the identity we asked for.
    #[error("identity service answer unusable: {0}")]
    BadResponse(String),
}

/// The CA's answer to one CSR, to come.
pub type Certify = Pin<Box<dyn Future<Output = Result<CertifyResponse, CaError>> + Send + 'static>>;

/// Something that signs CSRs for workload identities: the control plane over gRPC, or an
/// in-process CA in tests.
pub trait CaClient: Send + Sync + 'static {
    /// Asks for a certificate for `id` with the public key of `csr_der`.
    fn certify(&self, id: &WorkloadIdentity, csr_der: Vec<u8>) -> Certify;
}

/// The control plane's identity service, reached over gRPC with the node's token.
#[derive(Clone, Debug)]
pub struct GrpcCaClient {
    client: IdentityClient<Channel>,
    token: TokenSource,
}

impl GrpcCaClient {
    /// A client for the identity service over `channel` (see [`crate::control::channel`];
    /// it connects lazily, so the proxy starts while the control plane is still away),
    /// sending the token `token` holds at the time of each request.
    pub fn new(channel: Channel, token: impl Into<TokenSource>) -> Self {
        Self {
            client: IdentityClient::new(channel),
            token: token.into(),
        }
    }
}

impl CaClient for GrpcCaClient {
    fn certify(&self, id: &WorkloadIdentity, csr_der: Vec<u8>) -> Certify {
        let mut client = self.client.clone();
        let mut req = tonic::Request::new(CertifyRequest {
            namespace: id.namespace().to_string(),
            service_account: id.service_account().to_string(),
            csr_der,
        });
        let header = self.token.current().bearer();
        Box::pin(async move {
            let header = header.map_err(|e| CaError::Refused {
                code: "InvalidToken".into(),
                message: e.to_string(),
            })?;
            req.metadata_mut().insert("authorization", header);
            client
                .certify(req)
                .await
                .map(tonic::Response::into_inner)
                .map_err(|s| match s.code() {
                    tonic::Code::Unavailable
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Cancelled
                    | tonic::Code::Unknown
                    | tonic::Code::ResourceExhausted => {
                        CaError::Unavailable(s.message().to_string())
                    }
                    code => CaError::Refused {
                        code: format!("{code:?}"),
                        message: s.message().to_string(),
                    },
                })
        })
    }
}
