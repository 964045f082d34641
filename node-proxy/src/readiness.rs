//! Readiness: whether this process can serve the node's pods (`/ready`, and before a
//! hand-over, [`until_can_serve`]).

use crate::admin;
use crate::discovery::DiscoveryState;
use crate::identity::IdentityManager;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Resolves once this process has what serving the node's pods needs: discovery's
/// snapshot, the policy snapshot, and a certificate for every identity on the node.
pub async fn until_can_serve(
    identities: &IdentityManager,
    state: &watch::Receiver<Arc<DiscoveryState>>,
    policy: &watch::Receiver<Arc<crate::policy::PolicyState>>,
    node: &str,
) {
    let mut every = tokio::time::interval(Duration::from_millis(50));
    let mut last = String::new();
    loop {
        every.tick().await;
        let why = if policy.borrow().synced() {
            can_serve(identities, &state.borrow(), node).err()
        } else {
            Some("the policy has not been delivered yet".into())
        };
        match why {
            None => return,
            Some(why) if why != last => {
                tracing::info!(%why, "waiting before taking over");
                last = why;
            }
            Some(_) => {}
        }
    }
}

/// `Err` says what serving the node's pods still lacks: discovery's snapshot, or
/// certificates.
fn can_serve(identities: &IdentityManager, s: &DiscoveryState, node: &str) -> Result<(), String> {
    if !s.synced {
        return Err("discovery has not delivered a snapshot yet".into());
    }
    // Every identity discovery has on this node, whether or not the identity manager has
    // been told of it yet (it follows discovery asynchronously): checking only what the
    // manager holds answered "ready" with identities still to come.
    let certified: std::collections::BTreeSet<String> = identities
        .status()
        .into_iter()
        .filter(|st| st.not_after.is_some())
        .map(|st| st.identity.to_string())
        .collect();
    let missing: Vec<_> = s
        .local_workloads(node)
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
}

/// `/ready`: `Err` says what is missing (drain, discovery, listeners, held pods,
/// certificates).
pub fn ready_probe(
    identities: IdentityManager,
    state: watch::Receiver<Arc<DiscoveryState>>,
    (pods, serving, held): (
        crate::cni::PodRegistry,
        crate::pods::ServingPods,
        crate::pods::HeldPods,
    ),
    node: String,
    stopping: watch::Receiver<Option<String>>,
) -> admin::ReadyProbe {
    Arc::new(move || {
        if let Some(why) = stopping.borrow().clone() {
            return Err(why);
        }
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
        can_serve(&identities, &s, &node)
    })
}
