//! The policy service's metrics.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Streams open, updates sent, watches refused, renderings, and what rendering left out.
#[derive(Clone, Debug, Default)]
pub struct PolicyMetrics {
    pub(super) streams: Gauge,
    pub(super) updates: Counter,
    pub(super) refused: Counter,
    pub(super) renders: Counter,
    pub(super) unresolved: Gauge,
    pub(super) conflicts: Gauge,
    pub(super) route_renders: Counter,
    pub(super) routes_unsupported: Gauge,
    pub(super) routed_services: Gauge,
}

impl PolicyMetrics {
    /// Creates the metrics and registers them.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register("policy_streams", "Policy streams open", m.streams.clone());
        registry.register(
            "policy_updates",
            "Policy updates sent (snapshots and deltas, in chunks)",
            m.updates.clone(),
        );
        registry.register(
            "policy_watches_refused",
            "Policy watches refused (bad token or another node's name)",
            m.refused.clone(),
        );
        registry.register(
            "policy_renders",
            "Renderings of the watched nodes' policies (one per index change, shared by every stream)",
            m.renders.clone(),
        );
        registry.register(
            "policy_authorization_policies_unresolved",
            "AuthorizationPolicies skipped because a reference does not resolve or their route is attached to no Server (they allow nothing)",
            m.unresolved.clone(),
        );
        registry.register(
            "policy_server_conflicts",
            "Servers that select a pod port an older Server selects too (the older applies)",
            m.conflicts.clone(),
        );
        registry.register(
            "policy_route_renders",
            "Renderings of every Service's routes (one per index change, shared by every stream)",
            m.route_renders.clone(),
        );
        registry.register(
            "policy_routes_unsupported",
            "Route parents left out (consumer routes, missing Services, ports or Servers, Servers of another namespace, HTTPRoutes under a GRPCRoute)",
            m.routes_unsupported.clone(),
        );
        registry.register(
            "policy_routed_services",
            "Services with routes or routing annotations, sent to every node",
            m.routed_services.clone(),
        );
        m
    }
}
