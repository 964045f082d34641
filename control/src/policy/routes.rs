//! The routes of every Service, rendered into the one shape the node proxy matches
//! (`ambit.policy.v1.ServiceRoutes`): a pure function of the index, the same for every
//! node (any pod may call any Service).
//!
//! A Service is rendered when an HTTPRoute or GRPCRoute of its namespace names it as a
//! parent, or when it has a retry, timeout or failure-accrual annotation. Per Service
//! port (a parentRef with a port applies to that port only):
//!
//! - **Rules**: one per (rule, match) of every route attached to the port (a rule without
//!   matches matches everything), in Gateway API's precedence (`precedence.rs`). A port
//!   with GRPCRoutes ignores its HTTPRoutes (reported), as Linkerd does. A port without
//!   routes gets one `default` rule matching everything.
//! - **Timeouts and retry**, per field: the rule's own (`timeouts`, `retry`), else the
//!   route's annotations, else the Service's — each annotation group (`retry.*`,
//!   `timeout.*`) as a whole, as Linkerd: a route with any retry annotation does not
//!   inherit its Service's others. Retry defaults: 1 retry, every 5xx (and, for gRPC,
//!   cancelled, deadline-exceeded, resource-exhausted, internal, unavailable) when no
//!   status is named, 25 ms backoff; a limit (or `attempts`) of 0 is no retry.
//! - **Failure accrual**: the Service's annotation; unset leaves the proxy's default.
//!
//! A route whose parent Service is in another namespace is a **consumer route** (GAMMA):
//! it applies to the clients of the route's namespace only, and for them replaces the
//! Service's own (producer) routes on the ports it attaches to. They are rendered apart,
//! per consumer namespace (`ServiceRoutes.consumers`); the proxy picks by the client pod's
//! namespace.
//!
//! Left out and reported (`RouteProblems`): parents that do not exist,
//! ports a Service does not have, and HTTPRoutes under a GRPCRoute — and, for Server
//! parents (rendered into pods' policies, `server_routes.rs`), the same checks.

pub(super) mod precedence;

use super::server_routes;
use crate::index::route::{
    BackendRef, FailureAccrual, HeaderModifier, MatchValue, PathMatch, PathModifier, RequestMatch,
    RetryAnnotations, RouteAnnotations, RouteInfo, RouteKind, RouteParent, RouteRule,
    TimeoutAnnotations, ValueMatch,
};
use crate::index::{ClusterIndex, ServiceInfo};
use ambit_api::proto::policy as pb;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Every routed Service: `<namespace>/<name>` → its routes. Each is shared, so that a
/// rendering that did not change a Service keeps the previous one's `Arc` and streams
/// compare pointers, not messages.
pub type ServiceRoutesMap = BTreeMap<String, Arc<pb::ServiceRoutes>>;

/// What rendering left out: `<kind> <ns>/<name>` of a route (with ` parent <ns>/<name>`
/// when one parent could not take it) → why.
pub type RouteProblems = BTreeMap<String, String>;

/// The retry backoff when none is given.
pub const DEFAULT_BACKOFF: Duration = Duration::from_millis(25);
/// Metrics' `route_kind` (and `route_name`) of a port's rule when no route is attached.
pub const DEFAULT_ROUTE: &str = "default";
/// The gRPC codes retried when a retry names none (`retry.ambit.dev/grpc`'s five).
const DEFAULT_GRPC_CODES: [u32; 5] = [1, 4, 8, 13, 14];

/// A rendering of every Service's routes.
#[derive(Clone, Debug, Default)]
pub struct RenderedRoutes {
    /// The routed Services.
    pub services: ServiceRoutesMap,
    /// What was left out.
    pub problems: RouteProblems,
}

/// A route attached to a Service, on one port or all.
struct Attached<'a> {
    route: &'a RouteInfo,
    port: Option<u16>,
}

impl Attached<'_> {
    /// The namespace whose clients alone take the route, for a consumer route.
    fn consumer(&self, service_namespace: &str) -> Option<&str> {
        (self.route.namespace != service_namespace).then_some(self.route.namespace.as_str())
    }
}

/// Every routed Service's routes; Services unchanged since `previous` keep its `Arc`.
pub fn render_routes(index: &ClusterIndex, previous: &ServiceRoutesMap) -> RenderedRoutes {
    let mut problems = RouteProblems::new();
    let attached = attachments(index, &mut problems);
    // Server parents are rendered with each pod's policy; what they leave out is reported
    // here, with every other route parent, once per change whatever the streams.
    server_routes::attachments(index, &mut problems);
    let mut services = ServiceRoutesMap::new();
    let routed = index
        .services()
        .filter(|s| !s.routing.is_empty() || attached.contains_key(&key(s)));
    for svc in routed {
        let k = key(svc);
        let routes = attached.get(&k).map(Vec::as_slice).unwrap_or_default();
        let rendered = service_routes(svc, routes, &mut problems);
        let shared = match previous.get(&k) {
            Some(p) if **p == rendered => p.clone(),
            _ => Arc::new(rendered),
        };
        services.insert(k, shared);
    }
    RenderedRoutes { services, problems }
}

fn key(s: &ServiceInfo) -> String {
    format!("{}/{}", s.namespace, s.name)
}

fn route_key(r: &RouteInfo) -> String {
    format!("{} {}/{}", r.kind.as_str(), r.namespace, r.name)
}

/// Service → the routes attached to it; what cannot attach is reported.
fn attachments<'a>(
    index: &'a ClusterIndex,
    problems: &mut RouteProblems,
) -> BTreeMap<String, Vec<Attached<'a>>> {
    let mut out: BTreeMap<String, Vec<Attached<'a>>> = BTreeMap::new();
    for route in index.routes() {
        for parent in &route.parents {
            let RouteParent::Service {
                namespace,
                name,
                port,
            } = parent
            else {
                continue; // a Server: inbound (`server_routes.rs`)
            };
            let why = match index.service(namespace, name) {
                None => Some(format!(
                    "its parent Service {namespace}/{name} does not exist"
                )),
                Some(s) => port
                    .filter(|p| !s.ports.iter().any(|sp| sp.port == *p))
                    .map(|p| format!("its parent Service {namespace}/{name} has no port {p}")),
            };
            match why {
                Some(why) => {
                    problems.insert(
                        format!("{} parent {namespace}/{name}", route_key(route)),
                        why,
                    );
                }
                None => out
                    .entry(format!("{namespace}/{name}"))
                    .or_default()
                    .push(Attached { route, port: *port }),
            }
        }
    }
    out
}

fn service_routes(
    svc: &ServiceInfo,
    attached: &[Attached<'_>],
    problems: &mut RouteProblems,
) -> pb::ServiceRoutes {
    let producer: Vec<&Attached<'_>> = attached
        .iter()
        .filter(|a| a.consumer(&svc.namespace).is_none())
        .collect();
    let mut by_consumer: BTreeMap<&str, Vec<&Attached<'_>>> = BTreeMap::new();
    for a in attached {
        if let Some(ns) = a.consumer(&svc.namespace) {
            by_consumer.entry(ns).or_default().push(a);
        }
    }
    let consumers = by_consumer
        .into_iter()
        .map(|(ns, routes)| pb::ConsumerRoutes {
            namespace: ns.to_string(),
            ports: ports(svc, &routes, false, problems),
        })
        .collect();
    pb::ServiceRoutes {
        service: key(svc),
        ports: ports(svc, &producer, true, problems),
        failure_accrual: svc.routing.failure_accrual.as_ref().map(failure_accrual),
        consumers,
    }
}

/// Each TCP port of the Service with the rules of the routes attached to it; a port
/// without routes gets the default rule when `defaults` (the producer's), else is left
/// out (a consumer's: the producer's rules serve it).
fn ports(
    svc: &ServiceInfo,
    attached: &[&Attached<'_>],
    defaults: bool,
    problems: &mut RouteProblems,
) -> Vec<pb::PortRoutes> {
    let mut ports = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for sp in svc.ports.iter().filter(|p| p.protocol == "TCP") {
        if !seen.insert(sp.port) {
            continue;
        }
        let on_port: Vec<&RouteInfo> = attached
            .iter()
            .filter(|a| a.port.is_none_or(|p| p == sp.port))
            .map(|a| a.route)
            .collect();
        let grpc = on_port.iter().any(|r| r.kind == RouteKind::Grpc);
        let mut routes = Vec::new();
        for r in on_port {
            if grpc && r.kind == RouteKind::Http {
                problems.insert(
                    route_key(r),
                    format!("a GRPCRoute is attached to port {} of Service {}/{} too, and applies instead", sp.port, svc.namespace, svc.name),
                );
            } else {
                routes.push(r);
            }
        }
        let rules = if !routes.is_empty() {
            port_rules(svc, &routes)
        } else if defaults {
            vec![default_rule(svc)]
        } else {
            continue;
        };
        ports.push(pb::PortRoutes {
            port: u32::from(sp.port),
            rules,
        });
    }
    ports
}

/// The rules of the routes on one port, in precedence order.
fn port_rules(svc: &ServiceInfo, routes: &[&RouteInfo]) -> Vec<pb::Rule> {
    precedence::ranked(routes)
        .iter()
        .map(|r| route_rule(svc, r.route, r.rule, &r.matched))
        .collect()
}

fn default_rule(svc: &ServiceInfo) -> pb::Rule {
    let none = RouteAnnotations::default();
    pb::Rule {
        route_kind: DEFAULT_ROUTE.into(),
        route_namespace: svc.namespace.clone(),
        route_name: DEFAULT_ROUTE.into(),
        r#match: None,
        timeouts: timeouts(None, None, &none, &svc.routing),
        retry: retry(None, false, &none, &svc.routing),
        ..pb::Rule::default()
    }
}

fn route_rule(
    svc: &ServiceInfo,
    route: &RouteInfo,
    rule: &RouteRule,
    m: &RequestMatch,
) -> pb::Rule {
    let grpc = route.kind == RouteKind::Grpc;
    pb::Rule {
        route_kind: route.kind.as_str().into(),
        route_namespace: route.namespace.clone(),
        route_name: route.name.clone(),
        r#match: request_match(m),
        request_headers: rule.request_headers.as_ref().map(modifier),
        response_headers: rule.response_headers.as_ref().map(modifier),
        redirect: rule.redirect.as_ref().map(|r| pb::Redirect {
            scheme: r.scheme.clone().unwrap_or_default(),
            hostname: r.hostname.clone().unwrap_or_default(),
            path: r.path.as_ref().map(path_modifier),
            port: r.port.map_or(0, u32::from),
            status: u32::from(r.status),
        }),
        rewrite: rule.rewrite.as_ref().map(|r| pb::Rewrite {
            hostname: r.hostname.clone().unwrap_or_default(),
            path: r.path.as_ref().map(path_modifier),
        }),
        mirrors: rule
            .mirrors
            .iter()
            .map(|m| pb::Mirror {
                service: format!("{}/{}", m.backend.namespace, m.backend.name),
                port: u32::from(m.backend.port),
                numerator: m.numerator,
                denominator: m.denominator,
            })
            .collect(),
        backends: rule.backends.iter().map(backend).collect(),
        timeouts: timeouts(
            rule.request_timeout,
            rule.backend_request_timeout,
            &route.annotations,
            &svc.routing,
        ),
        retry: retry(rule.retry.as_ref(), grpc, &route.annotations, &svc.routing),
        grpc,
    }
}

fn ms(d: Option<Duration>) -> u64 {
    d.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The route's annotation group if it has one, else the Service's.
fn group<'a, T>(route: &'a Option<T>, service: &'a Option<T>) -> Option<&'a T> {
    route.as_ref().or(service.as_ref())
}

fn timeouts(
    request: Option<Duration>,
    backend_request: Option<Duration>,
    route: &RouteAnnotations,
    service: &RouteAnnotations,
) -> Option<pb::Timeouts> {
    let t: TimeoutAnnotations = group(&route.timeouts, &service.timeouts)
        .cloned()
        .unwrap_or_default();
    let per_try = group(&route.retry, &service.retry).and_then(|r| r.timeout);
    let out = pb::Timeouts {
        request_ms: ms(request.or(t.request)),
        backend_request_ms: ms(backend_request.or(per_try)),
        response_ms: ms(t.response),
        idle_ms: ms(t.idle),
    };
    (out != pb::Timeouts::default()).then_some(out)
}

fn retry(
    stanza: Option<&crate::index::route::RetryStanza>,
    grpc: bool,
    route: &RouteAnnotations,
    service: &RouteAnnotations,
) -> Option<pb::Retry> {
    let five_xx = || vec![pb::StatusRange { min: 500, max: 599 }];
    let out = if let Some(s) = stanza {
        pb::Retry {
            limit: s.attempts.unwrap_or(1),
            http_statuses: s.codes.as_ref().map_or_else(five_xx, |codes| {
                codes
                    .iter()
                    .map(|c| pb::StatusRange {
                        min: u32::from(*c),
                        max: u32::from(*c),
                    })
                    .collect()
            }),
            grpc_codes: if grpc {
                DEFAULT_GRPC_CODES.to_vec()
            } else {
                vec![]
            },
            backoff_ms: ms(Some(s.backoff.unwrap_or(DEFAULT_BACKOFF))),
        }
    } else {
        let r: &RetryAnnotations = group(&route.retry, &service.retry)?;
        let named = r.http.is_some() || r.grpc.is_some();
        pb::Retry {
            limit: r.limit.unwrap_or(1),
            http_statuses: match &r.http {
                Some(ranges) => ranges
                    .iter()
                    .map(|(lo, hi)| pb::StatusRange {
                        min: u32::from(*lo),
                        max: u32::from(*hi),
                    })
                    .collect(),
                None if named => vec![],
                None => five_xx(),
            },
            grpc_codes: match &r.grpc {
                Some(codes) => codes.clone(),
                None if named => vec![],
                None => DEFAULT_GRPC_CODES.to_vec(),
            },
            backoff_ms: ms(Some(DEFAULT_BACKOFF)),
        }
    };
    (out.limit > 0).then_some(out)
}

/// A route's match as the proxy matches it; `None` when it has no condition (a gRPC
/// rule without matches).
pub(super) fn request_match(m: &RequestMatch) -> Option<pb::RequestMatch> {
    let values = |v: &[ValueMatch]| -> Vec<pb::ValueMatch> {
        v.iter()
            .map(|v| pb::ValueMatch {
                name: v.name.clone(),
                value: Some(match &v.value {
                    MatchValue::Exact(s) => pb::value_match::Value::Exact(s.clone()),
                    MatchValue::Regex(s) => pb::value_match::Value::Regex(s.clone()),
                }),
            })
            .collect()
    };
    let out = match m {
        RequestMatch::Http(h) => pb::RequestMatch {
            path: Some(pb::PathMatch {
                kind: Some(match &h.path {
                    PathMatch::Exact(p) => pb::path_match::Kind::Exact(p.clone()),
                    PathMatch::Prefix(p) => pb::path_match::Kind::Prefix(p.clone()),
                    PathMatch::Regex(p) => pb::path_match::Kind::Regex(p.clone()),
                }),
            }),
            headers: values(&h.headers),
            query_params: values(&h.query_params),
            method: h.method.clone().unwrap_or_default(),
            grpc: None,
        },
        RequestMatch::Grpc(g) => pb::RequestMatch {
            headers: values(&g.headers),
            grpc: (g.service.is_some() || g.method.is_some()).then(|| pb::GrpcMethod {
                service: g.service.clone().unwrap_or_default(),
                method: g.method.clone().unwrap_or_default(),
            }),
            ..pb::RequestMatch::default()
        },
    };
    (out != pb::RequestMatch::default()).then_some(out)
}

fn modifier(m: &HeaderModifier) -> pb::HeaderModifier {
    let headers = |v: &[(String, String)]| {
        v.iter()
            .map(|(name, value)| pb::Header {
                name: name.clone(),
                value: value.clone(),
            })
            .collect()
    };
    pb::HeaderModifier {
        set: headers(&m.set),
        add: headers(&m.add),
        remove: m.remove.clone(),
    }
}

fn path_modifier(p: &PathModifier) -> pb::PathModifier {
    pb::PathModifier {
        kind: Some(match p {
            PathModifier::Full(v) => pb::path_modifier::Kind::Full(v.clone()),
            PathModifier::Prefix(v) => pb::path_modifier::Kind::Prefix(v.clone()),
        }),
    }
}

fn backend(b: &BackendRef) -> pb::Backend {
    pb::Backend {
        service: format!("{}/{}", b.namespace, b.name),
        port: u32::from(b.port),
        weight: b.weight,
        request_headers: b.request_headers.as_ref().map(modifier),
        response_headers: b.response_headers.as_ref().map(modifier),
    }
}

fn failure_accrual(f: &FailureAccrual) -> pb::FailureAccrual {
    match f {
        FailureAccrual::Disabled => pb::FailureAccrual {
            kind: "disabled".into(),
            ..pb::FailureAccrual::default()
        },
        FailureAccrual::Consecutive {
            max_failures,
            min_penalty,
            max_penalty,
            jitter_ratio,
        } => pb::FailureAccrual {
            kind: "consecutive".into(),
            max_failures: *max_failures,
            min_penalty_ms: ms(Some(*min_penalty)),
            max_penalty_ms: ms(Some(*max_penalty)),
            jitter_ratio: *jitter_ratio,
        },
    }
}

#[cfg(test)]
mod tests;
