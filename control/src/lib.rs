//! Ambit control plane: the mesh CA, discovery and policy.
//!
//! # Layout
//!
//! - [`config`]: flags and environment variables, validated up front.
//! - [`pki`]: trust bundle and issuer loading (and reloading when the files change), CSR
//!   checking and signing; `ambit pki`'s certificates.
//! - [`index`]: the in-memory model of the cluster (pods, namespaces, Services, ...),
//!   fed by a backend.
//! - [`backend`]: the seam: a backend feeds the index and authenticates node proxies.
//! - [`local`]: the local backend (Kubernetes objects as YAML files in a directory) and
//!   its node credentials.
//! - [`kubernetes`]: the Kubernetes backend (kube-rs watchers; TokenReview).
//! - [`auth`]: node authentication as the services see it (refusals counted by reason).
//! - [`identity`]: the identity gRPC service with node-scoped authorization.
//! - [`discovery`]: the discovery gRPC service: a snapshot, then deltas, per node proxy.
//! - [`policy`]: the inbound policy gRPC service: each node's meshed pods' policies.
//! - [`tls`]: the control plane's own SVID and TLS on its gRPC ports.
//! - [`admin`]: `/metrics`, `/ready`, `/live`; [`ready`]: what `/ready` waits for.
//! - [`limits`]: connection limits, HTTP/2 limits and timeouts of every server.
//! - [`blocking`]: loads and renderings of a large cluster, off the async workers.
//!
//! [`Control::build`] loads and checks everything; [`Control::serve`] takes
//! already-bound listeners, so tests bind port 0.

pub mod admin;
pub mod auth;
pub mod backend;
pub mod blocking;
pub mod config;
pub mod discovery;
pub mod identity;
pub mod index;
pub mod kubernetes;
pub mod limits;
pub mod local;
pub mod pki;
pub mod policy;
pub mod ready;
pub mod tls;

use auth::NodeAuth;
use backend::Backend;
use config::Config;
use identity::{IdentityMetrics, IdentityService};
use index::SharedIndex;
use local::LocalError;
use pki::reload::{CaMetrics, CaReloader};
use pki::{CaConfig, CaFiles, SharedCa};
use prometheus_client::registry::Registry;
use ready::Readiness;
use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;

/// Why the control plane cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Invalid flags or environment.
    #[error("invalid configuration:\n  {}", .0.join("\n  "))]
    Config(Vec<String>),
    /// The CA material is unusable.
    #[error(transparent)]
    Ca(#[from] pki::LoadError),
    /// The local directory does not load.
    #[error("local cluster state: {0}")]
    Local(#[from] LocalError),
    /// The node credentials do not load.
    #[error("{0}")]
    NodeTokens(String),
    /// The Kubernetes client cannot be set up.
    #[error("Kubernetes API: {0}")]
    Kube(String),
    /// A server failed.
    #[error("{what} server: {message}")]
    Serve {
        /// Which server.
        what: &'static str,
        /// What happened.
        message: String,
    },
}

/// What `/ready` waits for until the gRPC servers run.
const SERVERS: &str = "gRPC servers starting";
/// What `/ready` says once shutdown has begun.
const SHUTTING_DOWN: &str = "shutting down";

/// A control plane that has loaded its CA and cluster state and is ready to serve.
pub struct Control {
    config: Config,
    index: SharedIndex,
    identity: IdentityService,
    discovery: discovery::DiscoveryService,
    policy: policy::PolicyService,
    registry: Registry,
    connections: limits::ConnectionMetrics,
    backend: Box<dyn Backend>,
    /// The CA's files, watched while serving.
    reloader: CaReloader,
    /// The CA, the control plane's identity, its serving certificate and its notAfter.
    tls: (
        SharedCa,
        ambit_api::WorkloadIdentity,
        tls::ServingCert,
        std::time::SystemTime,
    ),
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The listeners the control plane serves on.
#[derive(Debug)]
pub struct Listeners {
    /// Identity gRPC (:8080).
    pub identity: TcpListener,
    /// Discovery gRPC (:8086).
    pub discovery: TcpListener,
    /// Inbound policy gRPC (:8090).
    pub policy: TcpListener,
    /// Admin HTTP (:9990).
    pub admin: TcpListener,
}

impl Control {
    /// Validates `config`, loads the CA and the cluster state. Fails with a message that
    /// says what to fix.
    pub async fn build(config: Config) -> Result<Self, StartError> {
        config.validate().map_err(StartError::Config)?;
        let mut registry = Registry::default();
        let reloader = CaReloader::load(
            CaFiles {
                trust_anchors: config.trust_anchors.clone(),
                issuer_cert: config.issuer_cert.clone(),
                issuer_key: config.issuer_key.clone(),
            },
            CaConfig {
                trust_domain: config.trust_domain.clone(),
                leaf_lifetime: config.cert_lifetime,
                clock_skew_allowance: config.clock_skew_allowance,
            },
            config.pki_poll_interval,
            CaMetrics::register(&mut registry),
        )?;
        let ca = reloader.ca();
        let identity_metrics = IdentityMetrics::register(&mut registry);
        let discovery_metrics = discovery::DiscoveryMetrics::register(&mut registry);
        let policy_metrics = policy::PolicyMetrics::register(&mut registry);
        let connections = limits::ConnectionMetrics::register(&mut registry);
        let backend = backend::build(&config, &mut registry).await?;
        let index = backend.index();
        let auth = NodeAuth::new(backend.authenticator(), &mut registry);
        let own_id = ambit_api::WorkloadIdentity::new(
            &config.trust_domain,
            &config.control_namespace,
            &config.control_service_account,
        )
        .map_err(|e| StartError::Config(vec![format!("control plane identity: {e}")]))?;
        let (serving, serving_not_after) =
            tls::ServingCert::new(&ca.current(), &own_id).map_err(|e| {
                StartError::Config(vec![format!(
                    "issuing the control plane's own certificate: {e}"
                )])
            })?;
        let identity = IdentityService::new(
            ca.clone(),
            index.clone(),
            auth.clone(),
            identity_metrics,
            own_id.clone(),
        );
        let discovery =
            discovery::DiscoveryService::new(index.clone(), auth.clone(), discovery_metrics);
        let policy = policy::PolicyService::new(
            index.clone(),
            discovery.hub(),
            auth,
            policy::Defaults {
                policy: config.default_inbound_policy.clone(),
                cluster_networks: ambit_api::policy::split_networks(&config.cluster_networks),
            },
            policy_metrics,
        );
        Ok(Self {
            config,
            index,
            identity,
            discovery,
            policy,
            registry,
            connections,
            backend,
            reloader,
            tls: (ca, own_id, serving, serving_not_after),
        })
    }

    /// The shared index, for tests and for the services added later.
    pub fn index(&self) -> SharedIndex {
        self.index.clone()
    }

    /// Serves until `shutdown` resolves, then drains and returns.
    pub async fn serve(
        self,
        listeners: Listeners,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), StartError> {
        let (drain_tx, drain_rx) = tokio::sync::watch::channel(false);
        let drain_rx2 = drain_rx.clone();
        let drained = move || {
            let mut rx = drain_rx.clone();
            async move {
                let _ = rx.wait_for(|d| *d).await;
            }
        };
        tracing::info!(config = %serde_json::to_string(&self.config).unwrap_or_default(), "starting ambit-control");

        let ready = Readiness::default();
        ready.pending(SERVERS);
        let watcher = tokio::spawn(self.backend.run(ready.clone(), Box::pin(drained())));

        let limit = |server| {
            let max = match server {
                "admin" => limits::ADMIN_MAX_CONNECTIONS,
                _ => self.config.max_connections,
            };
            limits::ConnectionLimit::new(server, max, &self.connections)
        };
        let admin = admin::router(Arc::new(self.registry), ready.clone());
        let admin_task = tokio::spawn(admin::serve(
            listeners.admin,
            admin,
            limit("admin"),
            drained(),
        ));

        let (ca, own_id, serving, not_after) = self.tls;
        let acceptor = serving.acceptor().map_err(|e| StartError::Serve {
            what: "TLS",
            message: e.to_string(),
        })?;
        let renewal = tokio::spawn(serving.renew(ca, own_id, not_after));
        let reloader = tokio::spawn(self.reloader.run(drained()));
        let identity = limits::grpc_server()
            .add_service(self.identity.into_server())
            .serve_with_incoming_shutdown(
                tls::incoming(listeners.identity, acceptor.clone(), limit("identity")),
                drained(),
            );
        let publisher = tokio::spawn(self.discovery.publisher(ready.clone(), drained()));
        let policy_publisher = tokio::spawn(self.policy.publisher(drained()));
        let discovery = limits::grpc_server()
            .add_service(self.discovery.with_drain(drain_rx2.clone()).into_server())
            .serve_with_incoming_shutdown(
                tls::incoming(listeners.discovery, acceptor.clone(), limit("discovery")),
                drained(),
            );
        let policy = limits::grpc_server()
            .add_service(self.policy.with_drain(drain_rx2).into_server())
            .serve_with_incoming_shutdown(
                tls::incoming(listeners.policy, acceptor, limit("policy")),
                drained(),
            );
        let identity_task = tokio::spawn(identity);
        let discovery_task = tokio::spawn(discovery);
        let policy_task = tokio::spawn(policy);
        ready.done(SERVERS);

        shutdown.await;
        tracing::info!("shutting down");
        ready.pending(SHUTTING_DOWN);
        let _ = drain_tx.send(true);
        let _ = watcher.await;
        let _ = publisher.await;
        let _ = policy_publisher.await;
        renewal.abort();
        let _ = reloader.await;
        let serve_err = |what, message: String| StartError::Serve { what, message };
        for (what, task) in [
            ("identity", identity_task),
            ("discovery", discovery_task),
            ("policy", policy_task),
        ] {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(serve_err(what, e.to_string())),
                Err(e) => return Err(serve_err(what, e.to_string())),
            }
        }
        match admin_task.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(serve_err("admin", e.to_string())),
            Err(e) => Err(serve_err("admin", e.to_string())),
        }
    }
}
