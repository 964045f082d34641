//! The Kubernetes backend: the cluster from the API server, node proxies by TokenReview.
//!
//! - [`watch`]: one kube-rs watcher per kind, feeding the index (a re-list replaces that
//!   kind; bad objects are skipped and counted).
//! - [`tokenreview`]: node authentication ([`TokenReviewAuth`]).
//! - [`metrics`]: watch restarts, errors, objects by kind; TokenReviews.
//!
//! The client comes from `--kubeconfig` (or `KUBECONFIG`), else the in-cluster
//! configuration (the pod's ServiceAccount), as kubectl and client-go find it.

mod cache;
mod crd;
mod metrics;
pub mod tokenreview;
mod watch;

pub use metrics::KubeMetrics;
pub use tokenreview::TokenReviewAuth;

use crate::auth::NodeAuthenticator;
use crate::backend::{Backend, Shutdown};
use crate::config::Config;
use crate::index::crd::{
    AuthorizationPolicy, MeshTlsAuthentication, NetworkAuthentication, Server,
};
use crate::index::gateway::{GrpcRoute, HttpRoute};
use crate::index::{ClusterIndex, Kind, KubeObject, SharedIndex};
use crate::ready::Readiness;
use crate::StartError;
use futures::FutureExt;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use prometheus_client::registry::Registry;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use watch::{pending_label, watch, WatchContext};

/// The API server as the source of the cluster and the judge of node tokens.
pub struct KubeBackend {
    client: kube::Client,
    index: SharedIndex,
    auth: Arc<TokenReviewAuth>,
    metrics: KubeMetrics,
}

impl KubeBackend {
    /// Builds the client from `--kubeconfig` or the in-cluster configuration.
    pub async fn build(config: &Config, registry: &mut Registry) -> Result<Self, StartError> {
        let client = client(config).await?;
        let metrics = KubeMetrics::register(registry);
        let index = SharedIndex::new(ClusterIndex::new(config.trust_domain.clone()));
        let proxy_account = config.proxy_service_account().ok_or_else(|| {
            StartError::Config(vec![
                "--proxy-service-account: not <namespace>/<name>".into()
            ])
        })?;
        let auth = Arc::new(TokenReviewAuth::new(
            client.clone(),
            config.token_audience.clone(),
            proxy_account,
            index.clone(),
            config.token_review_cache_ttl,
            metrics.clone(),
        ));
        Ok(Self {
            client,
            index,
            auth,
            metrics,
        })
    }
}

/// One kind's watch. Adding a kind is one line here (and its conversion in the index).
fn watch_kind(
    c: &kube::Client,
    kind: Kind,
    cx: WatchContext,
) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    let c = c.clone();
    match kind {
        Kind::Namespace => Box::pin(watch(
            Api::<Namespace>::all(c),
            kind,
            KubeObject::Namespace,
            cx,
        )),
        Kind::Pod => Box::pin(watch(Api::<Pod>::all(c), kind, KubeObject::Pod, cx)),
        Kind::ServiceAccount => Box::pin(watch(
            Api::<ServiceAccount>::all(c),
            kind,
            KubeObject::ServiceAccount,
            cx,
        )),
        Kind::Service => Box::pin(watch(Api::<Service>::all(c), kind, KubeObject::Service, cx)),
        Kind::EndpointSlice => Box::pin(watch(
            Api::<EndpointSlice>::all(c),
            kind,
            KubeObject::EndpointSlice,
            cx,
        )),
        Kind::Server => Box::pin(watch(Api::<Server>::all(c), kind, KubeObject::Server, cx)),
        Kind::AuthorizationPolicy => Box::pin(watch(
            Api::<AuthorizationPolicy>::all(c),
            kind,
            KubeObject::AuthorizationPolicy,
            cx,
        )),
        Kind::MeshTlsAuthentication => Box::pin(watch(
            Api::<MeshTlsAuthentication>::all(c),
            kind,
            KubeObject::MeshTlsAuthentication,
            cx,
        )),
        Kind::NetworkAuthentication => Box::pin(watch(
            Api::<NetworkAuthentication>::all(c),
            kind,
            KubeObject::NetworkAuthentication,
            cx,
        )),
        Kind::HttpRoute => Box::pin(watch(
            Api::<HttpRoute>::all(c),
            kind,
            KubeObject::HttpRoute,
            cx,
        )),
        Kind::GrpcRoute => Box::pin(watch(
            Api::<GrpcRoute>::all(c),
            kind,
            KubeObject::GrpcRoute,
            cx,
        )),
    }
}

/// Runs one kind's watch for ever: a watch that ends or panics (a bug: kube-rs retries
/// errors itself) is logged, counted and started again, which re-lists the kind.
async fn supervise(client: kube::Client, kind: Kind, cx: WatchContext) {
    loop {
        let ended = AssertUnwindSafe(watch_kind(&client, kind, cx.clone()))
            .catch_unwind()
            .await;
        tracing::error!(%kind, panicked = ended.is_err(), "watch ended; starting it again");
        cx.metrics.error(kind);
        tokio::time::sleep(WATCH_RESTART_DELAY).await;
    }
}

/// How long a watch that ended waits before it starts again.
const WATCH_RESTART_DELAY: std::time::Duration = std::time::Duration::from_secs(1);

impl std::fmt::Debug for KubeBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeBackend").finish_non_exhaustive()
    }
}

async fn client(config: &Config) -> Result<kube::Client, StartError> {
    let kube_config = match &config.kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path).map_err(|e| {
                StartError::Kube(format!("--kubeconfig {}: {e}", path.display()))
            })?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| StartError::Kube(format!("--kubeconfig {}: {e}", path.display())))?
        }
        None => kube::Config::infer().await.map_err(|e| {
            StartError::Kube(format!(
                "no in-cluster configuration and no kubeconfig ({e}); run in a pod, or pass --kubeconfig"
            ))
        })?,
    };
    kube::Client::try_from(kube_config).map_err(|e| StartError::Kube(e.to_string()))
}

impl Backend for KubeBackend {
    fn index(&self) -> SharedIndex {
        self.index.clone()
    }

    fn authenticator(&self) -> Arc<dyn NodeAuthenticator> {
        self.auth.clone()
    }

    fn run(
        self: Box<Self>,
        ready: Readiness,
        shutdown: Shutdown,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        for kind in Kind::ALL {
            ready.pending(pending_label(kind));
        }
        let cx = WatchContext {
            index: self.index.clone(),
            metrics: self.metrics.clone(),
            ready,
        };
        let client = self.client.clone();
        Box::pin(async move {
            let mut tasks = tokio::task::JoinSet::new();
            for kind in Kind::ALL {
                tasks.spawn(supervise(client.clone(), kind, cx.clone()));
            }
            shutdown.await;
            tasks.shutdown().await;
        })
    }
}
