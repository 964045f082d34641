//! Wiring of the node proxy: configuration in, running services out.

use crate::admin::{self, Admin};
use crate::config::Config;
use crate::discovery::{
    DiscoveryClient, DiscoveryMetrics, DiscoveryState, SubscriptionMetrics, Subscriptions,
};
use crate::identity::{GrpcCaClient, IdentityConfig, IdentityManager, IdentityMetrics};
use crate::logging::LogLevel;
use crate::tls::TrustBundle;
use crate::token::TokenSource;
use ambit_api::WorkloadIdentity;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::future::Future;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;
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
    /// Taking the listeners over from a running proxy failed (it serves on).
    #[error("hand-over: {0}")]
    Handover(String),
}

/// How a proxy's run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Stopped (SIGTERM, `POST /shutdown`) and drained.
    Stopped,
    /// A new process took every listener over (its pid); this one drained. It should stay
    /// until it is told to stop (see [`crate::handover`]).
    HandedOver(u32),
}

/// Runs the proxy until `shutdown` resolves or `POST /shutdown` is received, then drains.
pub async fn run(
    config: Config,
    admin_listener: TcpListener,
    log_level: Arc<dyn LogLevel>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AppError> {
    run_taking_over(config, admin_listener, None, log_level, shutdown)
        .await
        .map(drop)
}

/// [`run`], taking over from `predecessor` (a proxy running with the same run directory,
/// whose admin listener `admin_listener` is) when there is one: its pods are served on
/// the listeners it hands over once this process has what serving needs. Until a new
/// process takes over from this one; then it drains and returns.
pub async fn run_taking_over(
    config: Config,
    admin_listener: TcpListener,
    predecessor: Option<crate::handover::Predecessor>,
    log_level: Arc<dyn LogLevel>,
    shutdown: impl Future<Output = ()>,
) -> Result<Outcome, AppError> {
    tokio::pin!(shutdown);
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
    crate::build_info::register(&mut registry);
    crate::process_metrics::register(&mut registry);
    let identity_metrics = IdentityMetrics::register(&mut registry);
    let discovery_metrics = DiscoveryMetrics::register(&mut registry);
    let subscription_metrics =
        SubscriptionMetrics::register(&mut registry, discovery_metrics.connected_gauge());
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
        config.sockmap,
        (
            &config.bpf_pin_dir,
            &config.cgroup_path,
            &config.run_dir.join(crate::proxy::redirect::MODE_RECORD),
        ),
        &mut registry,
    )
    .map_err(AppError::Redirect)?;
    let kernel_tls =
        crate::ktls::KernelTls::decide(config.kernel_tls, redirector.sockmap().enabled())
            .map_err(|e| AppError::Config(vec![e]))?;
    tracing::info!(kernel_tls = %kernel_tls, "opaque streams between node proxies");
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
    let persisted = crate::persist::load(
        &config,
        &bundle,
        fallback_policy,
        &identities,
        &mut registry,
    );
    // What the node's pods used before a restart stays subscribed (and is dropped
    // after the idle timeout if they no longer use it).
    let subscriptions = Subscriptions::new(subscription_metrics);
    subscriptions.restore(
        persisted
            .discovery
            .resolutions()
            .keys()
            .filter_map(|t| crate::discovery::Target::parse(t)),
    );
    let (state_tx, state_rx) = watch::channel(persisted.discovery);
    let discovery =
        DiscoveryClient::new(discovery_channel, token.clone(), config.node_name.clone())
            .with_subscriptions(subscriptions.clone());
    let discovery_task = tokio::spawn(discovery.run(state_tx, discovery_metrics, drained()));
    tokio::spawn(crate::discovery::sweep(
        subscriptions.clone(),
        config.discovery_idle_timeout,
        drained(),
    ));
    let (policy_tx, policy_rx) = watch::channel(persisted.policy);
    let policy = crate::policy::PolicyClient::new(policy_channel, token, config.node_name.clone());
    let policy_task = tokio::spawn(policy.run(policy_tx, policy_metrics, drained()));
    let persister = persisted.persister;
    tokio::spawn(
        persister
            .clone()
            .run(state_rx.clone(), policy_rx.clone(), drained()),
    );
    let reconcile_task = tokio::spawn(reconcile_identities(
        identities.clone(),
        state_rx.clone(),
        config.node_name.clone(),
        drained(),
    ));

    let serving = crate::pods::ServingPods::default();
    let held = crate::pods::HeldPods::default();
    let admin_gate = crate::handover::Gate::default();
    let admin_fd = admin_listener
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| AppError::Admin(format!("duplicating the admin listener: {e}")))?;
    // Why this process no longer serves (draining), for /ready.
    let stopping = Arc::new(watch::channel(None::<String>).0);
    // The trust anchors file, watched: a new bundle applies from the next handshake on,
    // and a certificate it no longer verifies is renewed at once (tls/reload.rs).
    let trust = crate::tls::reload::BundleReloader::new(
        &config.trust_anchors,
        bundle.clone(),
        anchors_pem,
        config.trust_anchors_poll_interval,
        crate::tls::reload::BundleMetrics::register(&mut registry),
    );
    let (ids, b) = (identities.clone(), bundle.clone());
    let renew_unverified = move |_: &crate::tls::Anchors| drop(ids.renew_unverified(&b));
    tokio::spawn(trust.clone().run(renew_unverified, drained()));
    let ids = identities.clone();
    let renew_all = move || {
        ids.renew(|_| true)
            .iter()
            .map(ToString::to_string)
            .collect()
    };
    let admin = Admin {
        registry: Arc::new(registry),
        ready: crate::readiness::ready_probe(
            identities.clone(),
            state_rx.clone(),
            (pods.clone(), serving.clone(), held.clone()),
            config.node_name.clone(),
            stopping.subscribe(),
        ),
        dump: trust.config_dump(persister.config_dump(crate::config_dump::config_dump(
            crate::config_dump::Sources {
                config: config.clone(),
                identities: identities.clone(),
                state: state_rx.clone(),
                bundle: bundle.clone(),
                redirector: redirector.clone(),
                cni_pods: pods.clone(),
                kernel_tls: kernel_tls.clone(),
                policy: policy_rx.clone(),
            },
        ))),
        log_level,
        shutdown: drain_tx.clone(),
        renew: Arc::new(renew_all),
    };
    // The admin server outlives the drain: the probes and metrics of a draining proxy
    // still answer (`/ready` says it is draining).
    let (admin_stop, mut admin_stopped) = watch::channel(false);
    let admin_task = tokio::spawn(admin::serve(
        admin_listener,
        admin::router(admin),
        limits.clone(),
        admin_gate.clone(),
        async move {
            let _ = admin_stopped.wait_for(|s| *s).await;
        },
    ));

    // Taking over: once this process can serve (discovery, policy, every certificate), the
    // running one hands over the CNI socket and its pods' listeners.
    let mut handover = crate::pods::Handover::default();
    let mut handed_cni = None;
    let mut took_over = None;
    if let Some(predecessor) = predecessor {
        let can_serve = crate::readiness::until_can_serve(
            &identities,
            &state_rx,
            &policy_rx,
            &config.node_name,
        );
        tokio::select! {
            _ = &mut shutdown => {
                drop(predecessor);
                drain_tx.send_replace(true);
                return Ok(Outcome::Stopped);
            }
            () = can_serve => {}
        }
        match predecessor.take().await {
            Ok(handed) => {
                tracing::info!(
                    pid = predecessor.pid,
                    pods = handed.pods.len(),
                    cni = handed.cni.is_some(),
                    "listeners handed over"
                );
                handed_cni = handed.cni;
                handover.handed = handed.pods;
                if let Err(error) = pods.refresh() {
                    tracing::warn!(%error, "re-reading the pods handed over by the CNI plugin");
                }
                let (tx, rx) = tokio::sync::oneshot::channel();
                handover.first_pass = Some(tx);
                took_over = Some((predecessor, rx));
            }
            Err(error) => {
                // The running proxy keeps serving (it opens its gates again); this one
                // stops rather than open listeners beside it. Restarted, it tries again.
                drain_tx.send_replace(true);
                return Err(AppError::Handover(format!(
                    "taking over from the proxy with pid {}: {error}",
                    predecessor.pid
                )));
            }
        }
    }

    let cni_gate = crate::handover::Gate::default();
    let cni_listener = match handed_cni {
        Some(l) => Some(tokio::net::UnixListener::from_std(l).map_err(|e| {
            AppError::File(format!(
                "--cni-socket {} (handed over): {e}",
                config.cni_socket.display()
            ))
        })?),
        None => crate::cni::bind(&config.cni_socket).map_err(|e| {
            AppError::File(format!("--cni-socket {}: {e}", config.cni_socket.display()))
        })?,
    };
    let cni_fd = match &cni_listener {
        Some(l) => Some(
            l.as_fd()
                .try_clone_to_owned()
                .map_err(|e| AppError::File(format!("duplicating the CNI listener: {e}")))?,
        ),
        None => None,
    };
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
    let cni_task = cni_listener.map(|listener| {
        tokio::spawn(crate::cni::serve(
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
            cni_gate.clone(),
            drained(),
        ))
    });
    let (lifecycle_tx, lifecycle_rx) = tokio::sync::mpsc::channel(1);
    handover.requests = Some(lifecycle_rx);
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
                destinations: crate::proxy::Destinations {
                    subscriptions: subscriptions.clone(),
                    timeout: config.discovery_lookup_timeout,
                    node: config.node_name.clone(),
                },
                departed_metrics_ttl: crate::proxy::DEPARTED_METRICS_TTL,
                redirector: redirector.clone(),
                limits: limits.clone(),
                http_idle_timeout: config.http_idle_timeout,
                outbound_unknown: config.outbound_unknown,
                policy: policy_rx.clone(),
                authz: authz_metrics,
                routes: route_metrics,
                budgets: Default::default(),
                kernel_tls: kernel_tls.clone(),
            },
            cni: pods.subscribe(),
            serving: serving.clone(),
            held: held.clone(),
            node: config.node_name.clone(),
            local_netns_dir: config.local_netns_dir.clone(),
            metrics: pod_metrics,
            handover,
        }
        .run(drained()),
    );
    if let Some((predecessor, first_pass)) = took_over {
        // Not ready until the predecessor has stopped accepting (and says so on its own
        // /ready): two processes never both answer ready for the same pods.
        let pid = predecessor.pid;
        stopping.send_replace(Some(format!("taking over from the proxy with pid {pid}")));
        // Once the handed-over pods are served here, the predecessor stops accepting.
        let served = first_pass.await.unwrap_or(0);
        let confirmed = predecessor.serving().await;
        stopping.send_replace(None);
        match confirmed {
            Ok(()) => tracing::info!(
                pid,
                pods = served,
                "took over: the process before has stopped accepting"
            ),
            Err(error) => {
                tracing::warn!(pid, %error, "the process taken over from did not confirm; it accepts until it stops")
            }
        }
    }
    // This process's own hand-over socket (replacing the predecessor's).
    let handover_path = config.run_dir.join(crate::handover::SOCKET);
    let handover_listener = crate::handover::wire::Listener::bind(&handover_path).map_err(|e| {
        AppError::File(format!(
            "--run-dir: the hand-over socket {}: {e}",
            handover_path.display()
        ))
    })?;
    let in_progress = Arc::new(watch::channel(false).0);
    let mut handover_task = tokio::spawn(crate::handover::serve(
        handover_listener,
        crate::handover::Running {
            admin: (admin_fd, admin_gate),
            cni: cni_fd.map(|fd| (fd, cni_gate)),
            lifecycle: lifecycle_tx,
            in_progress: in_progress.clone(),
            stopping: stopping.clone(),
        },
    ));
    tracing::info!(config = %serde_json::to_string(&config).unwrap_or_default(), "ambit-proxy started");

    let mut outcome = Outcome::Stopped;
    let mut told_to_stop = false;
    tokio::select! {
        _ = &mut shutdown => {
            told_to_stop = true;
            // Told to stop in the middle of a hand-over: the successor gets what it came
            // for first (within the grace period), so that the pods' listeners live on.
            if *in_progress.borrow() {
                let mut in_progress = in_progress.subscribe();
                tracing::info!("stopping: a hand-over is in progress; letting it finish first");
                tokio::select! {
                    pid = &mut handover_task => if let Ok(pid) = pid { outcome = Outcome::HandedOver(pid) },
                    _ = in_progress.wait_for(|p| !*p) => {}
                    _ = tokio::time::sleep(config.shutdown_grace_period) => {}
                }
            }
        }
        _ = drained() => {}
        pid = &mut handover_task => if let Ok(pid) = pid { outcome = Outcome::HandedOver(pid) },
    }
    handover_task.abort();
    tracing::info!(grace_period = ?config.shutdown_grace_period, "draining");
    stopping.send_replace(Some(match outcome {
        Outcome::HandedOver(pid) => format!("handed over to the proxy with pid {pid}; draining"),
        Outcome::Stopped => "stopping; draining".into(),
    }));
    drain_tx.send_replace(true);
    let _ = discovery_task.await;
    let _ = policy_task.await;
    let _ = enrol_task.await;
    let _ = reconcile_task.await;
    let _ = pods_task.await;
    if let Some(task) = cni_task {
        let _ = task.await;
        if outcome == Outcome::Stopped {
            let _ = std::fs::remove_file(&config.cni_socket);
        }
    }
    drain_connections(&limits, config.shutdown_grace_period).await;
    if let (Outcome::HandedOver(pid), false) = (outcome, told_to_stop) {
        // Exiting now would have Kubernetes restart the container, and the restarted old
        // version take the listeners back: stay, drained, until told to stop.
        tracing::info!(
            successor = pid,
            "handed over and drained; exits when told to stop (SIGTERM)"
        );
        shutdown.await;
    }
    admin_stop.send_replace(true);
    admin_task
        .await
        .map_err(|e| AppError::Admin(e.to_string()))?;
    Ok(outcome)
}

/// Waits until no connection is left, or `grace` has passed (what is left is closed when
/// the process exits).
async fn drain_connections(limits: &crate::limits::Limits, grace: Duration) {
    let deadline = tokio::time::Instant::now() + grace;
    let mut every = tokio::time::interval(Duration::from_millis(50));
    loop {
        let left = limits.active();
        if left == 0 {
            tracing::info!("drained: no connection left");
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(
                connections = left,
                ?grace,
                "grace period over: closing the connections left"
            );
            return;
        }
        every.tick().await;
    }
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
