//! Reading the policy stream as a node proxy does, for tests on either backend.

use ambit_api::proto::policy::{Update, WatchRequest};

/// A watch of `node`'s policy, authenticated with `token_of`'s node token.
pub fn watch_request(node: &str, token_of: &str) -> tonic::Request<WatchRequest> {
    let mut req = tonic::Request::new(WatchRequest { node: node.into() });
    req.metadata_mut().insert(
        "authorization",
        format!("Bearer {}", crate::node_token(token_of))
            .parse()
            .unwrap(),
    );
    req
}

/// A Service's rules as the tests compare them, one string per rule in the stream's
/// order: `port kind/name [headers matched] [service:port@weight,...] retry Nx
/// statuses backoff t<request timeout ms>`.
pub fn service_rules(u: &Update, service: &str) -> Vec<String> {
    let s = u
        .services
        .iter()
        .find(|s| s.service == service)
        .unwrap_or_else(|| panic!("{service} in {u:?}"));
    s.ports
        .iter()
        .flat_map(|p| p.rules.iter().map(move |r| (p.port, r)))
        .map(|(port, r)| {
            let m = r.r#match.clone().unwrap_or_default();
            let headers: Vec<String> = m.headers.iter().map(|h| h.name.clone()).collect();
            let backends: Vec<String> = r
                .backends
                .iter()
                .map(|b| format!("{}:{}@{}", b.service, b.port, b.weight))
                .collect();
            let retry = r
                .retry
                .as_ref()
                .map(|r| {
                    let statuses: Vec<String> = r
                        .http_statuses
                        .iter()
                        .map(|s| format!("{}-{}", s.min, s.max))
                        .collect();
                    format!(
                        "retry {}x {} {}ms",
                        r.limit,
                        statuses.join(","),
                        r.backoff_ms
                    )
                })
                .unwrap_or_default();
            let timeout = r.timeouts.map(|t| t.request_ms).unwrap_or_default();
            format!(
                "{port} {}/{} [{}] [{}] {retry} t{timeout}",
                r.route_kind,
                r.route_name,
                headers.join(","),
                backends.join(",")
            )
        })
        .collect()
}
