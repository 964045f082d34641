//! Per-route authorization: the HTTPRoutes and GRPCRoutes attached to each Server,
//! rendered as the `InboundRoute`s of the ports the Server selects.
//!
//! A route attaches to a Server when one of its parentRefs names it (group
//! `policy.ambit.dev`, kind `Server`) and the Server exists in the route's own namespace
//! (as Linkerd, a Server takes no route of another namespace). When a GRPCRoute attaches
//! to a Server, its HTTPRoutes do not, as on a Service port outbound. What does not
//! attach is reported with the outbound route problems (`policy_routes_unsupported`).
//!
//! Each attached route becomes one `InboundRoute` per (rule, match) — a rule without
//! matches: PathPrefix `/` for HTTP, no match for gRPC — in the same precedence as the
//! outbound rules (`routes/precedence.rs`), so that the proxy takes the first that
//! matches; each carries the authorizations of the AuthorizationPolicies that target its
//! route (`authz.rs`).

use super::routes::{precedence, request_match, RouteProblems};
use crate::index::route::{RouteInfo, RouteKind, RouteParent};
use crate::index::ClusterIndex;
use ambit_api::proto::policy as pb;
use std::collections::{HashMap, HashSet};

/// (namespace, name) of a Server.
pub(super) type ServerKey = (String, String);

/// (kind, namespace, name) of a route.
pub(super) type RouteKey = (RouteKind, String, String);

/// The routes attached to Servers.
#[derive(Debug, Default)]
pub(super) struct ServerRoutes<'a> {
    /// Server → its routes, in the index's order (kind, name).
    by_server: HashMap<ServerKey, Vec<&'a RouteInfo>>,
    /// Every route attached to at least one Server.
    attached: HashSet<RouteKey>,
}

impl ServerRoutes<'_> {
    /// Whether the route is attached to a Server (an AuthorizationPolicy targeting it
    /// applies somewhere).
    pub(super) fn is_attached(&self, route: &RouteKey) -> bool {
        self.attached.contains(route)
    }
}

/// The key of `route`.
pub(super) fn route_key(route: &RouteInfo) -> RouteKey {
    (route.kind, route.namespace.clone(), route.name.clone())
}

/// Every Server's routes; what cannot attach is added to `problems`.
pub(super) fn attachments<'a>(
    index: &'a ClusterIndex,
    problems: &mut RouteProblems,
) -> ServerRoutes<'a> {
    let mut by_server: HashMap<ServerKey, Vec<&'a RouteInfo>> = HashMap::new();
    for route in index.routes() {
        for parent in &route.parents {
            let RouteParent::Server { namespace, name } = parent else {
                continue;
            };
            let why = if *namespace != route.namespace {
                Some("is in another namespace: a Server takes the routes of its own namespace only")
            } else if !index.servers_in(namespace).any(|s| s.name == *name) {
                Some("does not exist")
            } else {
                None
            };
            match why {
                Some(why) => {
                    problems.insert(
                        problem_key(route, namespace, name),
                        format!("its parent Server {namespace}/{name} {why}"),
                    );
                }
                None => by_server
                    .entry((namespace.clone(), name.clone()))
                    .or_default()
                    .push(route),
            }
        }
    }
    let mut attached = HashSet::new();
    for ((namespace, name), routes) in &mut by_server {
        if routes.iter().any(|r| r.kind == RouteKind::Grpc) {
            routes.retain(|r| {
                let shadowed = r.kind == RouteKind::Http;
                if shadowed {
                    problems.insert(
                        problem_key(r, namespace, name),
                        format!("a GRPCRoute is attached to Server {namespace}/{name} too, and applies instead"),
                    );
                }
                !shadowed
            });
        }
        attached.extend(routes.iter().map(|r| route_key(r)));
    }
    ServerRoutes {
        by_server,
        attached,
    }
}

fn problem_key(route: &RouteInfo, namespace: &str, name: &str) -> String {
    format!(
        "{} {}/{} parent Server {namespace}/{name}",
        route.kind.as_str(),
        route.namespace,
        route.name
    )
}

/// Route → the authorizations of the AuthorizationPolicies targeting it (in name order).
pub(super) type RouteAuthorizations = HashMap<RouteKey, Vec<pb::Authorization>>;

/// Server → its `InboundRoute`s in precedence order (a Server with no route: absent).
pub(super) type InboundRoutes = HashMap<ServerKey, Vec<pb::InboundRoute>>;

/// Every Server's routes as `InboundRoute`s, with the authorizations of each route.
pub(super) fn inbound_routes(
    attached: &ServerRoutes<'_>,
    authz: &RouteAuthorizations,
) -> InboundRoutes {
    attached
        .by_server
        .iter()
        .filter(|(_, routes)| !routes.is_empty())
        .map(|(server, routes)| {
            let rendered = precedence::ranked(routes)
                .iter()
                .map(|r| pb::InboundRoute {
                    kind: r.route.kind.as_str().into(),
                    name: r.route.name.clone(),
                    r#match: request_match(&r.matched),
                    authorizations: authz.get(&route_key(r.route)).cloned().unwrap_or_default(),
                })
                .collect();
            (server.clone(), rendered)
        })
        .collect()
}
