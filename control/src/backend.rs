//! The seam between where cluster state comes from and the rest of the control plane.
//!
//! A [`Backend`] feeds the one [`SharedIndex`] and authenticates node proxies; nothing
//! else in the control plane knows which backend runs. Two exist:
//!
//! - `local` ([`crate::local`]): Kubernetes objects as YAML files in a directory, and a
//!   file of per-node tokens — the whole mesh on one machine;
//! - `kube` ([`crate::kubernetes`]): the API server, watched with kube-rs, and node
//!   proxies authenticated by TokenReview.

use crate::auth::NodeAuthenticator;
use crate::config::{Backend as Which, Config};
use crate::index::SharedIndex;
use crate::ready::Readiness;
use crate::StartError;
use prometheus_client::registry::Registry;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// A future that resolves when the control plane shuts down.
pub type Shutdown = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Where cluster state comes from, and who the node proxies are.
pub trait Backend: Send + 'static {
    /// The index this backend feeds.
    fn index(&self) -> SharedIndex;

    /// How node proxies' tokens are checked.
    fn authenticator(&self) -> Arc<dyn NodeAuthenticator>;

    /// Keeps the index up to date until `shutdown` resolves. Marks what it must load
    /// first as pending in `ready` before returning the future, and done once loaded.
    fn run(
        self: Box<Self>,
        ready: Readiness,
        shutdown: Shutdown,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// The backend `config` names, built and checked (a local directory that does not load,
/// a kubeconfig that does not parse, fail here).
pub async fn build(
    config: &Config,
    registry: &mut Registry,
) -> Result<Box<dyn Backend>, StartError> {
    match config.backend {
        Which::Local => Ok(Box::new(crate::local::LocalBackend::build(
            config, registry,
        )?)),
        Which::Kube => Ok(Box::new(
            crate::kubernetes::KubeBackend::build(config, registry).await?,
        )),
    }
}
