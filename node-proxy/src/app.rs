//! Wiring of the node proxy: configuration in, running services out.

use crate::admin::{self, Admin};
use crate::config::Config;
use crate::discovery::{DiscoveryClient, DiscoveryMetrics, DiscoveryState};
use crate::identity::{GrpcCaClient, IdentityConfig, IdentityManager, IdentityMetrics};
use crate::logging::LogLevel;
use crate::tls::TrustBundle;
use crate::token::TokenSource;
use ambit_api::WorkloadIdentity;
use prometheus_client::registry::Registry;
use serde_json::json;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Why the proxy cannot start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// Invalid flags or environment.
    #[error("invalid configuration:\n  {}", .0.join("\n  "))]
    Config(Vec<String>),
    /// A file the proxy needs is unusable.
    #[error("{0}")]
    File(String),
    /// The admin server failed.
    #[error("admin server: {0}")]
    Admin(String),
    /// Redirection could not be set up (`--redirect ebpf` on a kernel that refuses it).
    #[error("--redirect {0}")]
    Redirect(String),
}

/// Runs the proxy until `shutdown` resolves or `POST /shutdown` is received, then drains.
pub async fn run(
    config: Config,
    admin_listener: TcpListener,
    log_level: Arc<dyn LogLevel>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AppError> {
    config.validate().map_err(AppError::Config)?;
    let anchors_pem = std::fs::read(&config.trust_anchors).map_err(|e| {
        AppError::File(format!(
            "--trust-anchors {}: {e}",
            config.trust_anchors.display()
        ))
    })?;
    let bundle = TrustBundle::from_pem(&anchors_pem, &config.trust_domain).map_err(|e| {
        AppError::File(format!(
            "--trust-anchors {}: {e}",
            config.trust_anchors.display()
        ))
    })?;

    let mut registry = Registry::default();
    let identity_metrics = IdentityMetrics::register(&mut registry);
    let discovery_metrics = DiscoveryMetrics::register(&mut registry);
    let tcp_metrics = crate::proxy::TcpMetrics::register(&mut registry);
    let http_metrics = crate::proxy::HttpMetrics::register(&mut registry);
    let cni_metrics = crate::cni::CniMetrics::register(&mut registry);
    let enrol_metrics = crate::enrol::EnrolMetrics::register(&mut registry);
    let pod_metrics = crate::pods::PodMetrics::register(&mut registry);
    let policy_metrics = crate::policy::PolicyMetrics::register(&mut registry);
    let authz_metrics = crate::proxy::authz::AuthzMetrics::register(&mut registry);
    let route_metrics = crate::proxy::route_metrics::RouteMetrics::register(&mut registry);
    let fd_limit = crate::limits::raise_fd_limit();
    let max_connections = match config.max_connections {
        0 => crate::limits::connections_for(fd_limit),
        n => n,
    };
    tracing::info!(
        fd_limit,
        max_connections,
        per_pod = config.max_connections_per_pod,
        "connection limits"
    );
    let limits = crate::limits::Limits::register(
        &mut registry,
        max_connections,
        config.max_connections_per_pod,
        fd_limit,
    );
    let token = TokenSource::file(
        &config.token_file,
        crate::token::TokenMetrics::register(&mut registry),
    )
    .map_err(|e| AppError::File(format!("--token-file {e}")))?;

    let redirector = crate::proxy::Redirector::new(
        config.redirect,
        &config.bpf_pin_dir,
        &config.cgroup_path,
        &config.run_dir.join(crate::proxy::redirect::MODE_RECORD),
    )
    .map_err(AppError::Redirect)?;
    let pods = crate::cni::PodRegistry::open(&config.run_dir)
        .map_err(|e| AppError::File(format!("--run-dir {}: {e}", config.run_dir.display())))?;

    let control_id = match &config.control_identity {
        Some(id) => id
            .parse()
            .map_err(|e| AppError::Config(vec![format!("--control-identity: {e}")]))?,
        None => crate::control::default_identity(&config.trust_domain)
            .map_err(|e| AppError::Config(vec![format!("--trust-domain: {e}")]))?,
    };
    let timeout = Duration::from_secs(10);
    let identity_channel =
        crate::control::channel(&config.identity_url, &bundle, control_id.clone(), timeout)
            .map_err(|e| AppError::Config(vec![format!("--identity-url: {e}")]))?;
    let discovery_channel =
        crate::control::channel(&config.discovery_url, &bundle, control_id.clone(), timeout)
            .map_err(|e| AppError::Config(vec![format!("--discovery-url: {e}")]))?;
    let policy_channel = crate::control::channel(&config.policy_url, &bundle, control_id, timeout)
        .map_err(|e| AppError::Config(vec![format!("--policy-url: {e}")]))?;
    let fallback_policy = config
        .fallback_policy()
        .map_err(|e| AppError::Config(vec![e]))?;
    let ca = GrpcCaClient::new(identity_channel, token.clone());
    let identities =
        IdentityManager::new(Arc::new(ca), IdentityConfig::default(), identity_metrics);

    let (drain_tx, drain_rx) = watch::channel(false);
    let drained = {
        let rx = drain_rx.clone();
        move || {
            let mut rx = rx.clone();
            async move {
                let _ = rx.wait_for(|d| *d).await;
            }
        }
    };

    // What the proxy kept on disk, served until the control plane answers (persist/).
    let persisted =
        crate::persist::load(&config, &bundle, fallback_policy, &identities, &mut registry);
    let (state_tx, state_rx) = watch::channel(persisted.discovery);
    let discovery =
        DiscoveryClient::new(discovery_channel, token.clone(), config.node_name.clone());
    let discovery_task = tokio::spawn(discovery.run(state_tx, discovery_metrics, drained()));
    let (policy_tx, policy_rx) = watch::channel(persisted.policy);
    let policy = crate::policy::PolicyClient::new(policy_channel, token, config.node_name.clone());
    let policy_task = tokio::spawn(policy.run(policy_tx, policy_metrics, drained()));
    let persister = persisted.persister;
    tokio::spawn(persister.clone().run(state_rx.clone(), policy_rx.clone(), drained()));
    let enrol_task = tokio::spawn(
        crate::enrol::Enroller {
            registry: pods.clone(),
            state: state_rx.clone(),
            node: config.node_name.clone(),
            proc_root: config.proc_root.clone(),
            metrics: enrol_metrics,
        }
        .run(drained()),
    );
    let reconcile_task = tokio::spawn(reconcile_identities(
        identities.clone(),
        state_rx.clone(),
        config.node_name.clone(),
        drained(),
    ));

    let serving = crate::pods::ServingPods::default();
    let cni_task = match crate::cni::bind(&config.cni_socket)
        .map_err(|e| AppError::File(format!("--cni-socket {}: {e}", config.cni_socket.display())))?
    {
        Some(listener) => Some(tokio::spawn(crate::cni::serve(
            listener,
            crate::cni::CniServer {
                registry: pods.clone(),
                state: state_rx.clone(),
                serving: serving.clone(),
                node: config.node_name.clone(),
                add_timeout: config.cni_add_timeout,
                metrics: cni_metrics,
                peers: crate::cni::PeerPolicy {
                    plugin_binary: Some(config.cni_plugin_binary.clone())
                        .filter(|p| !p.as_os_str().is_empty()),
                    proc_root: config.proc_root.clone(),
                },
            },
            drained(),
        ))),
        None => None,
    };
    let held = crate::pods::HeldPods::default();
    let pods_task = tokio::spawn(
        crate::pods::Lifecycle {
            shared: crate::proxy::Shared {
                identities: identities.clone(),
                state: state_rx.clone(),
                bundle: bundle.clone(),
                pool: crate::proxy::TunnelPool::default(),
                metrics: tcp_metrics,
                http: http_metrics,
                balancer: crate::proxy::Balancer::default(),
                detect_timeout: config.detect_timeout,
                departed_metrics_ttl: crate::proxy::DEPARTED_METRICS_TTL,
                redirector: redirector.clone(),
                limits: limits.clone(),
                http_idle_timeout: config.http_idle_timeout,
                outbound_unknown: config.outbound_unknown,
                policy: policy_rx.clone(),
                authz: authz_metrics,
                routes: route_metrics,
                budgets: Default::default(),
            },
            cni: pods.subscribe(),
            serving: serving.clone(),
            held: held.clone(),
            node: config.node_name.clone(),
            local_netns_dir: config.local_netns_dir.clone(),
            metrics: pod_metrics,
        }
        .run(drained()),
    );

    let admin = Admin {
        registry: Arc::new(registry),
        ready: ready_probe(
            identities.clone(),
            state_rx.clone(),
            (pods.clone(), serving, held),
            config.node_name.clone(),
        ),
        dump: persister.config_dump(config_dump(
            config.clone(),
            identities.clone(),
            state_rx,
            bundle,
            (redirector.mode(), pods),
        )),
        log_level,
        shutdown: drain_tx.clone(),
    };
    let admin_task = tokio::spawn(admin::serve(
        admin_listener,
        admin::router(admin),
        limits.clone(),
        drained(),
    ));
    tracing::info!(config = %serde_json::to_string(&config).unwrap_or_default(), "ambit-proxy started");

    tokio::select! {
        _ = shutdown => {}
        _ = drained() => {}
    }
    tracing::info!("draining");
    drain_tx.send_replace(true);
    let _ = discovery_task.await;
    let _ = policy_task.await;
    let _ = enrol_task.await;
    let _ = reconcile_task.await;
    let _ = pods_task.await;
    if let Some(task) = cni_task {
        let _ = task.await;
        let _ = std::fs::remove_file(&config.cni_socket);
    }
    admin_task.await.map_err(|e| AppError::Admin(e.to_string()))
}

/// Keeps the identity manager's pods in line with discovery's view of this node: a new
/// identity is fetched as soon as its first pod appears, and dropped with its last.
pub async fn reconcile_identities(
    identities: IdentityManager,
    mut state: watch::Receiver<Arc<DiscoveryState>>,
    node: String,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut known: BTreeMap<String, WorkloadIdentity> = BTreeMap::new();
    loop {
        let s = state.borrow_and_update().clone();
        if s.synced {
            let want: BTreeMap<_, _> = s
                .local_workloads(&node)
                .iter()
                .map(|w| (w.key(), w.identity.clone()))
                .collect();
            for (pod, id) in &want {
                if known.get(pod) != Some(id) {
                    identities.pod_added(pod, id);
                }
            }
            for pod in known.keys().filter(|p| !want.contains_key(*p)) {
                identities.pod_removed(pod);
            }
            known = want;
        }
        tokio::select! {
            _ = &mut shutdown => return,
            changed = state.changed() => if changed.is_err() { return },
        }
    }
}

fn ready_probe(
    identities: IdentityManager,
    state: watch::Receiver<Arc<DiscoveryState>>,
    (pods, serving, held): (
        crate::cni::PodRegistry,
        crate::pods::ServingPods,
        crate::pods::HeldPods,
    ),
    node: String,
) -> admin::ReadyProbe {
    Arc::new(move || {
        let s = state.borrow().clone();
        if !s.synced {
            return Err("discovery has not delivered a snapshot yet".into());
        }
        let open = serving.borrow().clone();
        let waiting: Vec<_> = crate::pods::to_serve(&s, &pods.pods(), &node)
            .into_values()
            .filter(|w| open.get(&w.key()) != w.netns.as_ref())
            .map(|w| w.key())
            .collect();
        if !waiting.is_empty() {
            return Err(format!("listeners not open yet for {}", waiting.join(", ")));
        }
        let held = held.borrow().clone();
        if !held.is_empty() {
            let pods: Vec<_> = held.iter().map(|(k, why)| format!("{k} ({why})")).collect();
            return Err(format!(
                "redirected but not served, their traffic refused (fail closed): {}",
                pods.join(", ")
            ));
        }
        // Every identity discovery has on this node, whether or not the identity manager
        // has been told of it yet (it follows discovery asynchronously): checking only
        // what the manager holds answered "ready" with identities still to come.
        let certified: std::collections::BTreeSet<String> = identities
            .status()
            .into_iter()
            .filter(|st| st.not_after.is_some())
            .map(|st| st.identity.to_string())
            .collect();
        let missing: Vec<_> = s
            .local_workloads(&node)
            .iter()
            .map(|w| w.identity.to_string())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .filter(|id| !certified.contains(id))
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "no valid certificate yet for {}",
                missing.join(", ")
            ))
        }
    })
}

/// PEM of a certificate chain.
fn pem_chain(chain: &[rustls_pki_types::CertificateDer<'_>]) -> String {
    chain
        .iter()
        .map(|c| pem::encode(&pem::Pem::new("CERTIFICATE", c.to_vec())))
        .collect()
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn config_dump(
    config: Config,
    identities: IdentityManager,
    state: watch::Receiver<Arc<DiscoveryState>>,
    bundle: TrustBundle,
    (redirect_mode, cni_pods): (&'static str, crate::cni::PodRegistry),
) -> admin::ConfigDump {
    Arc::new(move || {
        let s = state.borrow().clone();
        let cni = cni_pods.pods();
        let pods: Vec<_> = crate::pods::to_serve(&s, &cni, &config.node_name)
            .values()
            .map(|w| {
                json!({
                    "pod": w.key(),
                    "uid": w.uid,
                    "ips": w.ips,
                    "identity": w.identity.to_string(),
                    "workload": w.workload,
                    "netns": w.netns,
                    "cni_sandbox": cni.get(&w.key()).map(|p| p.container_id.clone()),
                    "source": cni.get(&w.key()).map(|p| p.source),
                    "opaque_ports": w.opaque_ports.to_string(),
                    "skip_inbound_ports": w.skip_inbound_ports.to_string(),
                    "skip_outbound_ports": w.skip_outbound_ports.to_string(),
                })
            })
            .collect();
        let ids: Vec<_> = identities
            .status()
            .into_iter()
            .map(|st| {
                json!({
                    "identity": st.identity.to_string(),
                    "pods": st.pods,
                    "cert_not_after_unix": st.not_after.map(unix),
                    // Public certificates (leaf first), for `ambit check --proxy`.
                    "cert_chain_pem": pem_chain(&st.chain),
                })
            })
            .collect();
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "config": config,
            "redirect_mode": redirect_mode,
            "trust_anchors": bundle.anchors().len(),
            "discovery": {
                "synced": s.synced,
                "workloads": s.workloads().count(),
            },
            "pods": pods,
            "identities": ids,
        })
    })
}
