//! What each meshed pod may be reached by, rendered into the one shape the node proxy
//! matches (`ambit.policy.v1`): a pure function of the index and the cluster's defaults.
//!
//! For each meshed pod:
//!
//! - **`ports`**: one `PortPolicy` per port a Server of the pod's namespace selects (by
//!   number, or by the name of one of the pod's container ports): kind `server`, the
//!   Server's name and proxyProtocol, the authorizations of the AuthorizationPolicies that
//!   target the Server or its namespace and resolve (`authz.rs`), then those of its
//!   accessPolicy when that is a default policy that allows someone; `audit` when the
//!   accessPolicy is `audit`; the `routes` attached to the Server, each with the
//!   authorizations of the policies that target it (`server_routes.rs`). When two
//!   Servers select the same port of a pod, the older wins (creationTimestamp, then
//!   name; one without a timestamp — local YAML — counts as oldest), as in Linkerd, and
//!   the conflict is reported.
//! - **`default`**: the default inbound policy in effect — the pod's
//!   `config.ambit.dev/default-inbound-policy`, else its namespace's, else the cluster's
//!   (`--default-inbound-policy`) — as kind `default` named after the policy, with its
//!   synthetic authorizations (`ambit_api::policy::default_port_policy`).
//! - **Probes**: every port the kubelet probes with `httpGet` (liveness, readiness,
//!   startup; named ports resolved) carries the probe paths: a Server's `PortPolicy` gets
//!   them, and a probed port no Server selects gets a `PortPolicy` of its own that is the
//!   default policy (kind `default`, same name and authorizations) plus the paths. The
//!   default `PortPolicy` itself (port 0) never carries probe paths: it stands for every
//!   port, and a probe path is only allowed on the port it is probed on.

use super::authz::{authorizations, ServerAuthorizations};
use super::routes::RouteProblems;
use super::server_routes::{attachments, inbound_routes, InboundRoutes};
use crate::index::{ClusterIndex, PodInfo};
use ambit_api::policy::{default_port_policy, DEFAULT_INBOUND_POLICY_ANNOTATION, DEFAULT_POLICIES};
use ambit_api::proto::policy as pb;
use std::collections::BTreeMap;

/// The cluster-wide settings rendering needs.
#[derive(Clone, Debug)]
pub struct Defaults {
    /// The cluster's default inbound policy (validated).
    pub policy: String,
    /// The cluster's networks, for the cluster-* policies.
    pub cluster_networks: Vec<String>,
}

/// The pods of one node: `<namespace>/<name>` → policy.
pub type NodePolicies = BTreeMap<String, pb::PodPolicy>;

/// Metrics' `srv_kind` of a Server's port policy.
pub const SERVER_KIND: &str = "server";

/// What rendering left out, keyed so that a change is noticed once: each value says why.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Problems {
    /// AuthorizationPolicies (`<ns>/<name>`) skipped because a reference does not resolve
    /// or their route is attached to no Server: they allow nothing.
    pub unresolved: BTreeMap<String, String>,
    /// Servers that lost a pod port to an older Server (`<ns>/<loser>`).
    pub conflicts: BTreeMap<String, String>,
}

/// A rendering of some nodes.
#[derive(Clone, Debug, Default)]
pub struct Rendered {
    /// Node → its meshed pods' policies (a node with none is absent).
    pub nodes: BTreeMap<String, NodePolicies>,
    /// What was left out.
    pub problems: Problems,
}

/// Every meshed pod on `node`: `<namespace>/<name>` → its policy.
pub fn render(index: &ClusterIndex, node: &str, d: &Defaults) -> NodePolicies {
    render_nodes(index, d, |n| n == node)
        .nodes
        .remove(node)
        .unwrap_or_default()
}

/// What rendering would leave out of any node's pods but conflicts between Servers (which
/// are found pod by pod): the AuthorizationPolicies skipped.
pub fn policy_problems(index: &ClusterIndex, d: &Defaults) -> Problems {
    let mut problems = Problems::default();
    // Routes that cannot attach are reported with the outbound routes (`render_routes`).
    let attached = attachments(index, &mut RouteProblems::new());
    authorizations(index, &d.cluster_networks, &attached, &mut problems);
    problems
}

/// What every port a Server selects gets, whichever pod it is.
struct Servers {
    authorizations: ServerAuthorizations,
    routes: InboundRoutes,
}

/// Every meshed pod on the nodes `wanted` says yes to, with what was left out.
pub fn render_nodes(index: &ClusterIndex, d: &Defaults, wanted: impl Fn(&str) -> bool) -> Rendered {
    let mut problems = Problems::default();
    // Routes that cannot attach are reported with the outbound routes (`render_routes`).
    let attached = attachments(index, &mut RouteProblems::new());
    let authz = authorizations(index, &d.cluster_networks, &attached, &mut problems);
    let servers = Servers {
        routes: inbound_routes(&attached, &authz.routes),
        authorizations: authz.servers,
    };
    let mut nodes: BTreeMap<String, NodePolicies> = BTreeMap::new();
    for pod in index.meshed_pods() {
        let Some(node) = pod.node_name.as_deref().filter(|n| wanted(n)) else {
            continue;
        };
        let policy = pod_policy(index, pod, d, &servers, &mut problems);
        nodes
            .entry(node.to_string())
            .or_default()
            .insert(policy.pod.clone(), policy);
    }
    Rendered { nodes, problems }
}

fn pod_policy(
    index: &ClusterIndex,
    pod: &PodInfo,
    d: &Defaults,
    servers: &Servers,
    problems: &mut Problems,
) -> pb::PodPolicy {
    let default = default_policy(index, pod, d);
    let mut ports: BTreeMap<u16, pb::PortPolicy> = BTreeMap::new();
    for (port, selecting) in index.servers_selecting(pod) {
        let winner = selecting[0];
        for loser in &selecting[1..] {
            problems.conflicts.insert(
                format!("{}/{}", loser.namespace, loser.name),
                format!(
                    "selects port {port} of pod {}/{} as Server {} does, which is older and applies",
                    pod.namespace, pod.name, winner.name
                ),
            );
        }
        let key = (winner.namespace.clone(), winner.name.clone());
        let authorizations = servers
            .authorizations
            .get(&key)
            .cloned()
            .unwrap_or_default();
        ports.insert(
            port,
            pb::PortPolicy {
                port: u32::from(port),
                kind: SERVER_KIND.into(),
                name: winner.name.clone(),
                protocol: winner.protocol.clone(),
                authorizations,
                audit: winner.access_policy == "audit",
                probe_paths: pod.probes.get(&port).cloned().unwrap_or_default(),
                routes: servers.routes.get(&key).cloned().unwrap_or_default(),
            },
        );
    }
    for (port, paths) in &pod.probes {
        ports.entry(*port).or_insert_with(|| pb::PortPolicy {
            port: u32::from(*port),
            probe_paths: paths.clone(),
            ..default.clone()
        });
    }
    let key = format!("{}/{}", pod.namespace, pod.name);
    pb::PodPolicy {
        pod: key,
        ports: ports.into_values().collect(),
        default: Some(default),
    }
}

/// The default policy in effect for `pod`: its annotation, else its namespace's, else the
/// cluster's. Values were checked when the objects were read; one that still names no
/// policy is passed over, and `deny` is the last resort, never a wider policy.
fn default_policy(index: &ClusterIndex, pod: &PodInfo, d: &Defaults) -> pb::PortPolicy {
    let valid = |v: &&String| DEFAULT_POLICIES.contains(&v.as_str());
    let name = pod
        .annotations
        .get(DEFAULT_INBOUND_POLICY_ANNOTATION)
        .filter(valid)
        .or_else(|| {
            index
                .namespace(&pod.namespace)
                .and_then(|ns| ns.annotations.get(DEFAULT_INBOUND_POLICY_ANNOTATION))
                .filter(valid)
        })
        .unwrap_or(&d.policy);
    default_port_policy(name, 0, &d.cluster_networks)
        .or_else(|_| default_port_policy("deny", 0, &d.cluster_networks))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
