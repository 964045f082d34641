//! Gateway API's precedence among the rules of one port, so that the proxy can take the
//! first rule that matches.
//!
//! HTTPRoute (Gateway API's HTTPRouteRule, with Linkerd's place for regexes): an exact
//! path; then a regular expression (longer pattern first); then the longest prefix; then
//! a method; then the most header matches; then the most query parameter matches.
//! Regexes rank above prefixes, as in Linkerd's proxy: below them a catch-all prefix `/`
//! (a rule without matches) would shadow every regex. GRPCRoute (Gateway API's
//! GRPCRouteRule): service and method, then service only, then method only, then
//! neither; within each the longer service, then the longer method; then the most header
//! matches.
//!
//! Ties: the oldest route (creationTimestamp; none, as in local YAML, counts as oldest),
//! then `<namespace>/<name>` alphabetically, then the rule's order in its route, then
//! the match's order in its rule.

use crate::index::route::{
    GrpcMatch, HttpMatch, PathMatch, RequestMatch, RouteInfo, RouteKind, RouteRule,
};
use std::cmp::Reverse;

/// A match's rank: lower is preferred (compared element-wise).
type Key = (u8, Reverse<usize>, u8, Reverse<usize>, Reverse<usize>);

/// One (rule, match) of a route, in its place: outbound it becomes a `Rule`, inbound an
/// `InboundRoute`, so that both sides order routes the same way.
pub(in crate::policy) struct Ranked<'a> {
    /// The route.
    pub(in crate::policy) route: &'a RouteInfo,
    /// Its rule.
    pub(in crate::policy) rule: &'a RouteRule,
    /// The match (what matches everything for a rule without matches).
    pub(in crate::policy) matched: RequestMatch,
    key: Key,
    rule_index: usize,
    match_index: usize,
}

/// Every (rule, match) of `routes` in precedence order; a rule without matches has one
/// that matches everything (HTTP: PathPrefix `/`; gRPC: any service and method).
pub(in crate::policy) fn ranked<'a>(routes: &[&'a RouteInfo]) -> Vec<Ranked<'a>> {
    let mut out = Vec::new();
    for route in routes {
        for (rule_index, rule) in route.rules.iter().enumerate() {
            let everything = [match route.kind {
                RouteKind::Http => match_everything_http(),
                RouteKind::Grpc => match_everything_grpc(),
            }];
            let matches = if rule.matches.is_empty() {
                &everything[..]
            } else {
                &rule.matches[..]
            };
            for (match_index, m) in matches.iter().enumerate() {
                out.push(Ranked {
                    route,
                    rule,
                    matched: m.clone(),
                    key: key(m),
                    rule_index,
                    match_index,
                });
            }
        }
    }
    sort(&mut out);
    out
}

/// What a rule without matches matches: Gateway API's default, PathPrefix `/`.
fn match_everything_http() -> RequestMatch {
    RequestMatch::Http(HttpMatch {
        path: PathMatch::Prefix("/".into()),
        headers: vec![],
        query_params: vec![],
        method: None,
    })
}

/// What a gRPC rule without matches matches: any service and method.
fn match_everything_grpc() -> RequestMatch {
    RequestMatch::Grpc(GrpcMatch {
        service: None,
        method: None,
        headers: vec![],
    })
}

/// The rank of a match.
fn key(m: &RequestMatch) -> Key {
    match m {
        RequestMatch::Http(h) => {
            let (rank, len) = match &h.path {
                PathMatch::Exact(p) => (0, p.len()),
                PathMatch::Regex(p) => (1, p.len()),
                PathMatch::Prefix(p) => (2, p.len()),
            };
            (
                rank,
                Reverse(len),
                u8::from(h.method.is_none()),
                Reverse(h.headers.len()),
                Reverse(h.query_params.len()),
            )
        }
        RequestMatch::Grpc(g) => {
            let len = |s: &Option<String>| s.as_ref().map_or(0, String::len);
            let rank = match (&g.service, &g.method) {
                (Some(_), Some(_)) => 0,
                (Some(_), None) => 1,
                (None, Some(_)) => 2,
                (None, None) => 3,
            };
            (
                rank,
                Reverse(len(&g.service)),
                0,
                Reverse(len(&g.method)),
                Reverse(g.headers.len()),
            )
        }
    }
}

/// Sorts `entries` into precedence order.
fn sort(entries: &mut [Ranked<'_>]) {
    entries.sort_by(|a, b| {
        a.key
            .cmp(&b.key)
            .then_with(|| a.route.created.cmp(&b.route.created))
            .then_with(|| a.route.namespace.cmp(&b.route.namespace))
            .then_with(|| a.route.name.cmp(&b.route.name))
            .then_with(|| a.rule_index.cmp(&b.rule_index))
            .then_with(|| a.match_index.cmp(&b.match_index))
    });
}
