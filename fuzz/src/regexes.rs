//! The regular expressions of a policy update: route matches on paths, headers and query
//! parameters, inbound (a Server's routes) and outbound (a Service's).

use ambit_api::proto::policy as pb;

/// Every regex in one request match.
fn of_match(m: &pb::RequestMatch, out: &mut Vec<String>) {
    if let Some(pb::path_match::Kind::Regex(r)) = m.path.as_ref().and_then(|p| p.kind.as_ref()) {
        out.push(r.clone());
    }
    for v in m.headers.iter().chain(&m.query_params) {
        if let Some(pb::value_match::Value::Regex(r)) = &v.value {
            out.push(r.clone());
        }
    }
}

/// Every regex of a pod's policy.
pub fn of_pod(p: &pb::PodPolicy) -> Vec<String> {
    let mut out = Vec::new();
    for port in p.ports.iter().chain(&p.default) {
        for route in &port.routes {
            if let Some(m) = &route.r#match {
                of_match(m, &mut out);
            }
        }
    }
    out
}

/// Every regex of a Service's routes.
pub fn of_service(s: &pb::ServiceRoutes) -> Vec<String> {
    let mut out = Vec::new();
    for port in &s.ports {
        for rule in &port.rules {
            if let Some(m) = &rule.r#match {
                of_match(m, &mut out);
            }
        }
    }
    out
}

/// Whether `pattern` is a regular expression on its own. The proxy and the control plane
/// match it anchored, as `^(?:pattern)$`: a pattern that only parses inside that wrapping
/// (`a)|(.*`) would close the group early and match far more than it says.
pub fn stands_alone(pattern: &str) -> bool {
    regex_syntax::Parser::new().parse(pattern).is_ok()
}
