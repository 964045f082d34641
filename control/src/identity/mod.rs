//! The identity service (gRPC, :8080): signs workload certificates for node proxies.
//!
//! A node proxy authenticates with its node credential and asks for a certificate on
//! behalf of one workload identity. The CA signs only if a pod running as that
//! ServiceAccount is scheduled on the caller's node, so a compromised node can obtain
//! identities of its own pods and no others.

mod metrics;

pub use metrics::IdentityMetrics;

use crate::auth::NodeAuth;
use crate::index::SharedIndex;
use crate::pki::{unix_seconds, CsrError, SharedCa};
use ambit_api::proto::identity::identity_server::{Identity, IdentityServer};
use ambit_api::proto::identity::{CertifyRequest, CertifyResponse};
use ambit_api::WorkloadIdentity;
use tonic::{Request, Response, Status};

/// The gRPC identity service.
#[derive(Clone)]
pub struct IdentityService {
    /// The CA in use: each request signs with the one current when it runs.
    ca: SharedCa,
    index: SharedIndex,
    auth: NodeAuth,
    metrics: IdentityMetrics,
    /// The control plane's own identity: never issued to a node, whatever runs there
    /// (proxies trust the control plane by it).
    reserved: WorkloadIdentity,
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
        ca: SharedCa,
        index: SharedIndex,
        auth: NodeAuth,
        metrics: IdentityMetrics,
        reserved: WorkloadIdentity,
    ) -> Self {
        Self {
            ca,
            index,
            auth,
            metrics,
            reserved,
        }
    }

    /// The tonic server for this service.
    pub fn into_server(self) -> IdentityServer<Self> {
        IdentityServer::new(self)
    }

    async fn certify_inner(&self, req: Request<CertifyRequest>) -> Result<CertifyResponse, Status> {
        let node = self.auth.authenticate(&req).await?;
        let req = req.into_inner();
        let ca = self.ca.current();
        let id = WorkloadIdentity::new(ca.trust_domain(), &req.namespace, &req.service_account)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        if id == self.reserved {
            return Err(Status::permission_denied(format!(
                "{id} is the control plane's own identity, which is never issued to a node (proxies trust the control plane by it)"
            )));
        }
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
        let issued = ca.certify(&id, &req.csr_der).map_err(|e| match e {
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
