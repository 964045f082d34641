//! Conversion of Gateway API's HTTPRoute and GRPCRoute: parentRefs (a Service for
//! outbound, a Server for inbound; other parents such as Gateways are not the mesh's and
//! are left out), each rule's matches (`matches.rs`), filters, backends, timeouts and
//! retry (`rule.rs`), and the route's retry/timeout annotations. Everything one object
//! alone can be checked for is refused here by object and field; precedence, defaults
//! and the Services the route names are the rendering's (`crate::policy::routes`).

mod matches;
mod rule;

use super::annotations::{routing_annotations, On};
use super::{err, namespaced_name, port, ConvertError};
use crate::index::crd::POLICY_GROUP;
use crate::index::gateway::{GrpcRoute, HttpRoute, ParentRef, RouteRule as RuleSpec, RouteSpec};
use crate::index::route::{RequestMatch, RouteInfo, RouteKind, RouteParent, RouteRule};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The HTTPRoute as the mesh sees it.
pub(crate) fn http_route(r: &HttpRoute) -> Result<RouteInfo, ConvertError> {
    route(&r.metadata, r.spec.as_ref(), RouteKind::Http, |m, o, f| {
        matches::http(m, o, f).map(RequestMatch::Http)
    })
}

/// The GRPCRoute as the mesh sees it.
pub(crate) fn grpc_route(r: &GrpcRoute) -> Result<RouteInfo, ConvertError> {
    route(&r.metadata, r.spec.as_ref(), RouteKind::Grpc, |m, o, f| {
        matches::grpc(m, o, f).map(RequestMatch::Grpc)
    })
}

type MatchFn<'a, M> = dyn Fn(&M, &str, &str) -> Result<RequestMatch, ConvertError> + 'a;

fn route<M>(
    meta: &ObjectMeta,
    spec: Option<&RouteSpec<M>>,
    kind: RouteKind,
    convert_match: impl Fn(&M, &str, &str) -> Result<RequestMatch, ConvertError>,
) -> Result<RouteInfo, ConvertError> {
    let (namespace, name) = namespaced_name(meta, kind.as_str())?;
    let object = format!("{} {namespace}/{name}", kind.as_str());
    let spec = spec.ok_or_else(|| err(&object, "spec", "required"))?;
    let mut parents = Vec::new();
    for (i, p) in spec.parent_refs.iter().flatten().enumerate() {
        if let Some(parent) = parent(p, &namespace, &object, &format!("spec.parentRefs[{i}]"))? {
            parents.push(parent);
        }
    }
    let namespaces = rule::Namespaces {
        route: &namespace,
        consumer_of: parents
            .iter()
            .filter_map(|p| match p {
                RouteParent::Service { namespace: ns, .. } if *ns != namespace => Some(ns.as_str()),
                _ => None,
            })
            .collect(),
    };
    let mut rules = Vec::new();
    for (i, r) in spec.rules.iter().flatten().enumerate() {
        rules.push(rule_of(
            r,
            &namespaces,
            kind,
            &object,
            &format!("spec.rules[{i}]"),
            &convert_match,
        )?);
    }
    Ok(RouteInfo {
        kind,
        created: meta.creation_timestamp.clone(),
        annotations: routing_annotations(meta, &object, On::Route(kind))?,
        namespace,
        name,
        parents,
        rules,
    })
}

fn rule_of<M>(
    r: &RuleSpec<M>,
    namespaces: &rule::Namespaces<'_>,
    kind: RouteKind,
    object: &str,
    field: &str,
    convert_match: &MatchFn<'_, M>,
) -> Result<RouteRule, ConvertError> {
    let mut matches = Vec::new();
    for (j, m) in r.matches.iter().flatten().enumerate() {
        matches.push(convert_match(m, object, &format!("{field}.matches[{j}]"))?);
    }
    rule::rule(r, kind, matches, namespaces, object, field)
}

/// A parentRef: a Service (core group) or a Server (policy.ambit.dev); `None` for a
/// parent that is not the mesh's (a Gateway, the default kind).
fn parent(
    p: &ParentRef,
    namespace: &str,
    object: &str,
    field: &str,
) -> Result<Option<RouteParent>, ConvertError> {
    let group = p
        .group
        .as_deref()
        .unwrap_or(crate::index::gateway::GATEWAY_GROUP);
    let kind = p.kind.as_deref().unwrap_or("Gateway");
    let name = || {
        p.name
            .clone()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| err(object, &format!("{field}.name"), "required"))
    };
    let ns = p.namespace.clone().unwrap_or_else(|| namespace.to_string());
    match (group, kind) {
        ("" | "core", "Service") => {
            if let Some(section) = &p.section_name {
                return Err(err(
                    object,
                    &format!("{field}.sectionName"),
                    format!("{section:?}: a Service parent is narrowed by port number; use port"),
                ));
            }
            let port = p
                .port
                .map(|n| {
                    let n = i32::try_from(n).unwrap_or(0);
                    port(n, object, &format!("{field}.port"))
                })
                .transpose()?;
            Ok(Some(RouteParent::Service {
                namespace: ns,
                name: name()?,
                port,
            }))
        }
        (POLICY_GROUP, "Server") => Ok(Some(RouteParent::Server {
            namespace: ns,
            name: name()?,
        })),
        (g, "Service" | "Server") => Err(err(
            object,
            &format!("{field}.group"),
            format!(
                "{g:?} is not the group of {kind}; use {:?}",
                if kind == "Service" {
                    "core"
                } else {
                    POLICY_GROUP
                }
            ),
        )),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests;
