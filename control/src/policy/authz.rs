//! AuthorizationPolicies resolved into the `Authorization`s of the Servers and routes they
//! target.
//!
//! A policy's authentications must all match, so it becomes one `Authorization` whose
//! conditions are its MeshTLSAuthentication (or ServiceAccount) and its
//! NetworkAuthentication. A policy that cannot be rendered — a reference to an object that
//! does not exist, two identity or two network requirements (a client has one identity
//! and one address: name them in one authentication, as Linkerd requires), an
//! authentication naming no identity — is skipped whole and reported: dropping only the
//! requirement that does not resolve would widen what the policy allows.

use super::render::Problems;
use super::server_routes::{route_key, RouteAuthorizations, RouteKey, ServerKey, ServerRoutes};
use crate::index::policy::{
    AuthenticationRef, AuthorizationPolicyInfo, IdentityMatch, PolicyTarget, ServerInfo,
};
use crate::index::route::RouteKind;
use crate::index::ClusterIndex;
use ambit_api::proto::policy as pb;
use std::collections::HashMap;

/// Metrics' `authz_kind` of an AuthorizationPolicy's authorization.
pub const AUTHZ_KIND: &str = "authorizationpolicy";

/// (namespace, Server name) → the Server's authorizations: those of the
/// AuthorizationPolicies that target it or its namespace and resolve (in name order),
/// then those of its accessPolicy.
pub(super) type ServerAuthorizations = HashMap<ServerKey, Vec<pb::Authorization>>;

/// Every AuthorizationPolicy resolved, by what it applies to.
#[derive(Debug, Default)]
pub(super) struct Authorizations {
    /// Each Server's.
    pub(super) servers: ServerAuthorizations,
    /// Each route's that is attached to a Server (`server_routes.rs`).
    pub(super) routes: RouteAuthorizations,
}

/// Resolves every AuthorizationPolicy once and gives each Server and each route attached
/// to a Server its authorizations. A policy whose route does not exist or is attached to
/// no Server applies nowhere: reported as unresolved, as one whose references do not
/// resolve.
pub(super) fn authorizations(
    index: &ClusterIndex,
    cluster_networks: &[String],
    attached: &ServerRoutes<'_>,
    problems: &mut Problems,
) -> Authorizations {
    let mut by_namespace: HashMap<&str, Vec<(&AuthorizationPolicyInfo, pb::Authorization)>> =
        HashMap::new();
    let mut routes = RouteAuthorizations::new();
    for p in index.authorization_policies() {
        let key = format!("{}/{}", p.namespace, p.name);
        let route = match &p.target {
            PolicyTarget::Route(kind, name) => {
                attached_route(index, attached, p, kind, name).map(Some)
            }
            PolicyTarget::Server(_) | PolicyTarget::Namespace => Ok(None),
        };
        match route.and_then(|route| Ok((route, resolve(index, p)?))) {
            Ok((Some(route), a)) => routes.entry(route).or_default().push(a),
            Ok((None, a)) => by_namespace.entry(&p.namespace).or_default().push((p, a)),
            Err(why) => {
                problems.unresolved.insert(key, why);
            }
        }
    }
    let mut servers = ServerAuthorizations::new();
    for s in index.servers() {
        let mut authz: Vec<pb::Authorization> = by_namespace
            .get(s.namespace.as_str())
            .into_iter()
            .flatten()
            .filter(|(p, _)| targets(p, s))
            .map(|(_, a)| a.clone())
            .collect();
        authz.extend(access_policy(s, cluster_networks));
        servers.insert((s.namespace.clone(), s.name.clone()), authz);
    }
    Authorizations { servers, routes }
}

/// The route policy `p` targets (`kind` `name` in its namespace), if it is attached to a
/// Server; else why the policy applies nowhere.
fn attached_route(
    index: &ClusterIndex,
    attached: &ServerRoutes<'_>,
    p: &AuthorizationPolicyInfo,
    kind: &str,
    name: &str,
) -> Result<RouteKey, String> {
    let what = format!("{kind} {}/{name}", p.namespace);
    let route = RouteKind::from_name(kind)
        .and_then(|k| index.route(k, &p.namespace, name))
        .ok_or_else(|| format!("targets {what}, which does not exist"))?;
    let key = route_key(route);
    if !attached.is_attached(&key) {
        return Err(format!(
            "targets {what}, which is attached to no Server (its parentRefs name none that exists, or a GRPCRoute on the Server applies instead)"
        ));
    }
    Ok(key)
}

fn targets(p: &AuthorizationPolicyInfo, s: &ServerInfo) -> bool {
    match &p.target {
        PolicyTarget::Server(name) => *name == s.name,
        PolicyTarget::Namespace => true,
        PolicyTarget::Route(..) => false,
    }
}

/// The synthetic authorizations of a Server's accessPolicy (none for `deny` and `audit`),
/// as the default policy of that name has them.
fn access_policy(s: &ServerInfo, cluster_networks: &[String]) -> Vec<pb::Authorization> {
    ambit_api::policy::default_port_policy(&s.access_policy, 0, cluster_networks)
        .map(|p| p.authorizations)
        .unwrap_or_default()
}

/// The policy as one authorization, or why it cannot be one.
fn resolve(index: &ClusterIndex, p: &AuthorizationPolicyInfo) -> Result<pb::Authorization, String> {
    let mut mesh_tls: Option<(String, pb::MeshTls)> = None;
    let mut networks: Option<(String, Vec<pb::Network>)> = None;
    for r in &p.authentications {
        match r {
            AuthenticationRef::MeshTls(ns, name) => {
                let what = format!("MeshTLSAuthentication {ns}/{name}");
                let m = index
                    .mesh_tls_authentication(ns, name)
                    .ok_or_else(|| format!("{what} does not exist"))?;
                if m.identities.is_empty() {
                    return Err(format!("{what} names no identity"));
                }
                set_once(&mut mesh_tls, what, mesh_tls_of(&m.identities), "identity")?;
            }
            AuthenticationRef::ServiceAccount(id) => {
                let tls = mesh_tls_of(&[IdentityMatch::Exact(id.clone())]);
                set_once(
                    &mut mesh_tls,
                    format!("ServiceAccount {id}"),
                    tls,
                    "identity",
                )?;
            }
            AuthenticationRef::Network(ns, name) => {
                let what = format!("NetworkAuthentication {ns}/{name}");
                let n = index
                    .network_authentication(ns, name)
                    .ok_or_else(|| format!("{what} does not exist"))?;
                let nets = n
                    .networks
                    .iter()
                    .map(|n| pb::Network {
                        cidr: n.cidr.clone(),
                        except: n.except.clone(),
                    })
                    .collect();
                set_once(&mut networks, what, nets, "network")?;
            }
        }
    }
    Ok(pb::Authorization {
        kind: AUTHZ_KIND.into(),
        name: p.name.clone(),
        mesh_tls: mesh_tls.map(|(_, m)| m),
        networks: networks.map(|(_, n)| n).unwrap_or_default(),
    })
}

/// Sets `slot` to `value` from `what`, unless another requirement of the same sort set it.
fn set_once<T>(
    slot: &mut Option<(String, T)>,
    what: String,
    value: T,
    sort: &str,
) -> Result<(), String> {
    if let Some((first, _)) = slot {
        return Err(format!(
            "requires both {first} and {what}: a client has one {sort}; name every accepted {sort} in one authentication"
        ));
    }
    *slot = Some((what, value));
    Ok(())
}

fn mesh_tls_of(ids: &[IdentityMatch]) -> pb::MeshTls {
    use pb::identity_pattern::Pattern;
    if ids.contains(&IdentityMatch::Any) {
        return pb::MeshTls {
            any: true,
            identities: vec![],
        };
    }
    pb::MeshTls {
        any: false,
        identities: ids
            .iter()
            .filter_map(|id| {
                let pattern = match id {
                    IdentityMatch::Any => return None,
                    IdentityMatch::Exact(e) => Pattern::Exact(e.clone()),
                    IdentityMatch::Prefix(p) => Pattern::Prefix(p.clone()),
                };
                Some(pb::IdentityPattern {
                    pattern: Some(pattern),
                })
            })
            .collect(),
    }
}
