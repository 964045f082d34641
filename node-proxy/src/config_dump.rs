//! `/config_dump`: what the proxy runs with and what it serves — its configuration,
//! redirection, kernel TLS, discovery, the pods it serves and its identities.

use crate::admin;
use crate::config::Config;
use crate::discovery::DiscoveryState;
use crate::identity::IdentityManager;
use crate::tls::TrustBundle;
use serde_json::json;
use std::sync::Arc;
use std::time::SystemTime;
use tokio::sync::watch;

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

/// A Service as discovery holds it: its addresses, ports and endpoints.
fn service(svc: &crate::discovery::Service) -> serde_json::Value {
    json!({
        "cluster_ips": svc.cluster_ips,
        "ports": svc.ports.iter().map(|p| json!({"name": p.name, "port": p.port})).collect::<Vec<_>>(),
        "endpoints": svc.endpoints.iter().map(|e| json!({
            "address": e.address,
            "ports": e.ports,
            "ready": e.ready,
            "pod": e.pod,
            "node": e.node,
            "identity": e.identity.as_ref().map(ToString::to_string),
        })).collect::<Vec<_>>(),
    })
}

/// What `/config_dump` reads from.
#[derive(Debug)]
pub struct Sources {
    /// The flags it started with.
    pub config: Config,
    /// Its identities and their certificates.
    pub identities: IdentityManager,
    /// Discovery's view.
    pub state: watch::Receiver<Arc<DiscoveryState>>,
    /// The trust anchors.
    pub bundle: TrustBundle,
    /// How pod traffic reaches the listeners.
    pub redirector: crate::proxy::Redirector,
    /// The pods the CNI plugin handed over.
    pub cni_pods: crate::cni::PodRegistry,
    /// Whether opaque streams take kernel TLS.
    pub kernel_tls: crate::ktls::KernelTls,
    /// The inbound policy of the node's pods.
    pub policy: watch::Receiver<Arc<crate::policy::PolicyState>>,
}

/// The proxy's own part of `/config_dump` (the trust bundle's and the persisted state's
/// parts are added around it).
pub fn config_dump(sources: Sources) -> admin::ConfigDump {
    let Sources {
        config,
        identities,
        state,
        bundle,
        redirector,
        cni_pods,
        kernel_tls,
        policy,
    } = sources;
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
            // Which process answers: after a hand-over, the new one.
            "pid": std::process::id(),
            "config": config,
            "redirect_mode": redirector.mode(),
            "sockmap": redirector.sockmap().to_string(),
            "kernel_tls": kernel_tls.config_dump(),
            "trust_anchors": bundle.anchors().len(),
            "discovery": {
                "synced": s.synced,
                "workloads": s.workloads().count(),
                "services": s.services().count(),
                // What this node's pods use, subscribed on demand, and what each is.
                "destinations": s
                    .resolutions()
                    .iter()
                    .map(|(t, r)| {
                        let what = match r {
                            crate::discovery::Resolution::Service(k) => format!("service {k}"),
                            crate::discovery::Resolution::Workload(k) => format!("pod {k}"),
                            crate::discovery::Resolution::Outside => "outside the cluster".into(),
                            crate::discovery::Resolution::Refused(why) => format!("refused: {why}"),
                        };
                        (t.clone(), serde_json::Value::String(what))
                    })
                    .collect::<serde_json::Map<_, _>>(),
                // The Services it holds (those its pods use), with their endpoints.
                "endpoints": s
                    .services()
                    .map(|svc| (format!("{}/{}", svc.namespace, svc.name), service(svc)))
                    .collect::<serde_json::Map<_, _>>(),
            },
            "policy": crate::policy::dump::dump(&policy.borrow()),
            "pods": pods,
            "identities": ids,
        })
    })
}
