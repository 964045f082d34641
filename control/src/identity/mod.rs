//! The identity service (gRPC, :8080): signs workload certificates for node proxies.
//!
//! A node proxy authenticates with its node credential and asks for a certificate on
//! behalf of one workload identity. The CA signs only if a pod running as that
//! ServiceAccount is scheduled on the caller's node, so a compromised node can obtain
//! identities of its own pods and no others.

mod metrics;

pub use metrics::IdentityMetrics;

use crate::index::SharedIndex;
use crate::local::NodeTokens;
use crate::pki::{unix_seconds, CertificateAuthority, CsrError};
use ambit_api::proto::identity::identity_server::{Identity, IdentityServer};
use ambit_api::proto::identity::{CertifyRequest, CertifyResponse};
use ambit_api::WorkloadIdentity;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// Finds the node a bearer token belongs to.
pub trait NodeAuthenticator: Send + Sync + 'static {
    /// The node's name, or `None` for a token that is not a node credential.
    fn authenticate<'a>(
        &'a self,
        token: &'a str,
    ) -> Pin<Box<dyn Future<Output = Option<String>> + Send + 'a>>;
}

impl NodeAuthenticator for NodeTokens {
    fn authenticate<'a>(
        &'a self,
        token: &'a str,
    ) -> Pin<Box<dyn Future<Output = Option<String>> + Send + 'a>> {
        let node = self.node_for(token).map(str::to_string);
        Box::pin(async move { node })
    }
}

/// The node a request comes from, by its `authorization: Bearer <token>` metadata.
pub(crate) async fn authenticate<T>(
    auth: &dyn NodeAuthenticator,
    req: &Request<T>,
) -> Result<String, Status> {
    let header = req
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok());
    let Some(token) = header.and_then(|h| h.strip_prefix("Bearer ")) else {
        return Err(Status::unauthenticated(
            "no node credential: send `authorization: Bearer <node token>`",
        ));
    };
    auth.authenticate(token.trim()).await.ok_or_else(|| {
        Status::unauthenticated(
            "node token not recognised; check the node proxy's token against the control plane's node credentials",
        )
    })
}

/// The gRPC identity service.
#[derive(Clone)]
pub struct IdentityService {
    ca: Arc<CertificateAuthority>,
    index: SharedIndex,
    auth: Arc<dyn NodeAuthenticator>,
    metrics: IdentityMetrics,
}

impl std::fmt::Debug for IdentityService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentityService")
            .field("ca", &self.ca)
            .finish_non_exhaustive()
    }
}

impl IdentityService {
    /// A service that signs with `ca`, authorizes against `index` and authenticates with
    /// `auth`.
    pub fn new(
        ca: Arc<CertificateAuthority>,
        index: SharedIndex,
        auth: Arc<dyn NodeAuthenticator>,
        metrics: IdentityMetrics,
    ) -> Self {
        metrics.set_issuer_expiry(unix_seconds(ca.issuer_not_after()));
        Self {
            ca,
            index,
            auth,
            metrics,
        }
    }

    /// The tonic server for this service.
    pub fn into_server(self) -> IdentityServer<Self> {
        IdentityServer::new(self)
    }

    async fn certify_inner(&self, req: Request<CertifyRequest>) -> Result<CertifyResponse, Status> {
        let node = authenticate(self.auth.as_ref(), &req).await?;
        let req = req.into_inner();
        let id =
            WorkloadIdentity::new(self.ca.trust_domain(), &req.namespace, &req.service_account)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let authorized = self.index.read().node_runs_service_account(
            &node,
            id.namespace(),
            id.service_account(),
        );
        if !authorized {
            return Err(Status::permission_denied(format!(
                "node {node} runs no pod with ServiceAccount {}/{}",
                id.namespace(),
                id.service_account()
            )));
        }
        let issued = self.ca.certify(&id, &req.csr_der).map_err(|e| match e {
            CsrError::Internal(_) => Status::internal(e.to_string()),
            _ => Status::invalid_argument(e.to_string()),
        })?;
        tracing::info!(%node, identity = %id, not_after = unix_seconds(issued.not_after), "issued workload certificate");
        Ok(CertifyResponse {
            leaf_der: issued.leaf_der,
            intermediates_der: issued.intermediates_der,
            not_after_unix: unix_seconds(issued.not_after),
            not_before_unix: unix_seconds(issued.not_before),
        })
    }
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn certify(
        &self,
        req: Request<CertifyRequest>,
    ) -> Result<Response<CertifyResponse>, Status> {
        let peer = req.remote_addr();
        match self.certify_inner(req).await {
            Ok(resp) => {
                self.metrics.issued();
                Ok(Response::new(resp))
            }
            Err(status) => {
                self.metrics.refused(status.code());
                tracing::warn!(?peer, code = ?status.code(), message = status.message(), "refused certificate request");
                Err(status)
            }
        }
    }
}
