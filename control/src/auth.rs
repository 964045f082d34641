//! Node authentication: which node a node proxy's bearer token belongs to.
//!
//! Each backend provides its own [`NodeAuthenticator`] (the local backend a file of
//! per-node tokens, the Kubernetes backend TokenReview); the identity and discovery
//! services see only [`NodeAuth`], which turns a refusal into a gRPC status and counts it
//! by reason.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use tonic::{Request, Status};

/// Why a token was not accepted as a node credential.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// `Unauthenticated` (the token proves nothing) or `PermissionDenied` (it proves a
    /// caller that is not a node proxy), or `Unavailable` (the check could not be made).
    pub code: tonic::Code,
    /// A short, bounded label for the metric (`unknown_token`, `wrong_audience`, ...).
    pub reason: &'static str,
    /// What an operator reads: what was wrong and what to do.
    pub message: String,
}

impl Refusal {
    /// The token proves nothing.
    pub fn unauthenticated(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code: tonic::Code::Unauthenticated,
            reason,
            message: message.into(),
        }
    }

    /// The token proves a caller that may not act as a node proxy.
    pub fn denied(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code: tonic::Code::PermissionDenied,
            reason,
            message: message.into(),
        }
    }

    /// The token could not be checked now (the API server is away); the caller retries.
    pub fn unavailable(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code: tonic::Code::Unavailable,
            reason,
            message: message.into(),
        }
    }
}

/// The boxed future an authenticator returns.
pub type AuthFuture<'a> = Pin<Box<dyn Future<Output = Result<String, Refusal>> + Send + 'a>>;

/// Finds the node a bearer token belongs to.
pub trait NodeAuthenticator: Send + Sync + 'static {
    /// The node's name, or why the token is refused.
    fn authenticate<'a>(&'a self, token: &'a str) -> AuthFuture<'a>;
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

/// Node authentication as the gRPC services use it.
#[derive(Clone)]
pub struct NodeAuth {
    inner: Arc<dyn NodeAuthenticator>,
    refused: Family<ReasonLabels, Counter>,
}

impl std::fmt::Debug for NodeAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeAuth").finish_non_exhaustive()
    }
}

impl NodeAuth {
    /// Wraps `inner` and registers `node_authentication_refused_total{reason}`.
    pub fn new(inner: Arc<dyn NodeAuthenticator>, registry: &mut Registry) -> Self {
        let refused = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "node_authentication_refused",
            "Node credentials refused, by reason",
            refused.clone(),
        );
        Self { inner, refused }
    }

    /// The node a request comes from, by its `authorization: Bearer <token>` metadata.
    pub async fn authenticate<T>(&self, req: &Request<T>) -> Result<String, Status> {
        let header = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        let Some(token) = header.and_then(|h| h.strip_prefix("Bearer ")) else {
            self.count("no_credential");
            return Err(Status::unauthenticated(
                "no node credential: send `authorization: Bearer <node token>`",
            ));
        };
        self.inner
            .authenticate(token.trim())
            .await
            .map_err(|refusal| {
                self.count(refusal.reason);
                Status::new(refusal.code, refusal.message)
            })
    }

    fn count(&self, reason: &str) {
        self.refused
            .get_or_create(&ReasonLabels {
                reason: reason.into(),
            })
            .inc();
    }
}

/// SHA-256 of a token: what is kept of it (for comparison, or as a cache key).
pub fn token_digest(token: &str) -> [u8; 32] {
    let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}
