//! Outbound routing of one HTTP request to a Service with routes (HTTPRoute, GRPCRoute,
//! or the Service's own annotations): the first rule that matches, then one of its
//! backends by weight. A Service without routes is served as before: every request to its
//! endpoints.

use super::resolve::Resolved;
use super::{ProxyError, Shared};
use crate::policy::routes::{select, RequestParts, Rule};
use std::sync::Arc;

/// Where a request goes: the rule that matched it (None: the Service has no routes, or
/// the destination is not a Service) and the destination it resolved to — the Service
/// itself, or the backend the rule chose.
pub(super) struct Routed {
    pub rule: Option<Arc<Rule>>,
    pub resolved: Resolved,
}

/// Routes a request for `resolved` (its original destination).
pub(super) fn route<B>(
    req: &http::Request<B>,
    resolved: Resolved,
    shared: &Shared,
) -> Result<Routed, ProxyError> {
    let Some(svc) = resolved.service.clone() else {
        return Ok(Routed {
            rule: None,
            resolved,
        });
    };
    let routes = shared.policy.borrow().routes(&svc.namespace, &svc.name);
    let Some(rules) = routes.as_ref().and_then(|r| r.port(svc.port)) else {
        return Ok(Routed {
            rule: None,
            resolved,
        });
    };
    let rule = select(rules, &RequestParts::of(req))
        .ok_or_else(|| {
            ProxyError::NoRoute(format!(
                "no route of Service {}/{} port {} matches {} {}",
                svc.namespace,
                svc.name,
                svc.port,
                req.method(),
                req.uri().path()
            ))
        })?
        .clone();
    if rule.has_no_usable_backend() {
        return Err(ProxyError::BadRoute(format!(
            "every backend of {} {}/{} has weight 0",
            rule.route_kind, rule.route_namespace, rule.route_name
        )));
    }
    let Some(backend) = rule.backend(fastrand::f64()) else {
        // No backends: the parent Service.
        return Ok(Routed {
            rule: Some(rule),
            resolved,
        });
    };
    let resolved = Resolved::service(
        &backend.namespace,
        &backend.name,
        backend.port,
        &shared.state.borrow(),
    )
    .ok_or_else(|| {
        ProxyError::Unavailable(format!(
            "backend Service {}/{} port {} of {} {}/{} does not exist",
            backend.namespace,
            backend.name,
            backend.port,
            rule.route_kind,
            rule.route_namespace,
            rule.route_name
        ))
    })?;
    Ok(Routed {
        rule: Some(rule),
        resolved,
    })
}
