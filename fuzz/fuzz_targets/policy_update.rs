//! Inbound policy and outbound route updates applied to the node proxy's policy state
//! (`ambit_proxy::policy::PolicyState::apply`), gathered from chunks as the policy client
//! gathers them, then used the way the data path uses them: connections and requests
//! checked against a port's policy, requests routed and given a backend.
//!
//! Input: up to 8 `ambit.policy.v1.Update` messages, each length-delimited.
//!
//! Invariants: no panic; a pod's policy that parses is the one in force afterwards, and
//! one that does not leaves the pod's previous policy (or the fallback) in force; a
//! Service's routes that parse are there afterwards; every regular expression the proxy
//! accepted is one on its own (it is matched as `^(?:…)$`, which must not change its
//! meaning); a rule with a backend of non-zero weight always picks one of non-zero weight.
#![no_main]

use ambit_api::proto::policy as pb;
use ambit_fuzz::messages;
use ambit_fuzz::regexes::{of_pod, of_service, stands_alone};
use ambit_proxy::policy::routes::{select, RequestParts, ServiceRoutes};
use ambit_proxy::policy::{Client, PodPolicy, PolicyState, PortPolicy};
use ambit_proxy::stream::Chunks;
use http::{HeaderMap, Request};
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// Clients to check: plaintext and mTLS, in and out of the usual networks.
fn clients() -> [Client<'static>; 4] {
    let ip = |s: &str| s.parse::<IpAddr>().expect("an address");
    [
        Client {
            identity: None,
            addr: ip("10.1.0.9"),
        },
        Client {
            identity: None,
            addr: ip("192.0.2.1"),
        },
        Client {
            identity: Some("spiffe://cluster.local/ns/shop/sa/client"),
            addr: ip("10.2.0.5"),
        },
        Client {
            identity: Some("spiffe://cluster.local/ns/other/sa/x"),
            addr: ip("::ffff:10.2.0.5"),
        },
    ]
}

/// Requests to check: a few fixed ones and one per exact or prefix path the matches name.
fn requests(paths: &[String]) -> Vec<Request<()>> {
    let mut out = Vec::new();
    let fixed = ["/", "/ready", "/api/x?a=b&c", "/shop.Cart/Add"].map(String::from);
    for path in fixed.iter().chain(paths) {
        for method in ["GET", "POST"] {
            let mut headers = HeaderMap::new();
            headers.insert("x-canary", http::HeaderValue::from_static("1"));
            if let Ok(mut req) = Request::builder()
                .method(method)
                .uri(format!("http://web.shop:80{path}"))
                .body(())
            {
                *req.headers_mut() = headers;
                out.push(req);
            }
        }
    }
    out
}

/// The exact and prefix paths of `update`'s matches.
fn paths(update: &pb::Update) -> Vec<String> {
    let mut out = Vec::new();
    let mut add = |m: &Option<pb::RequestMatch>| {
        if let Some(kind) = m
            .as_ref()
            .and_then(|m| m.path.as_ref())
            .and_then(|p| p.kind.as_ref())
        {
            match kind {
                pb::path_match::Kind::Exact(p) | pb::path_match::Kind::Prefix(p) => {
                    out.push(p.clone())
                }
                pb::path_match::Kind::Regex(_) => {}
            }
        }
    };
    for p in &update.pods {
        for port in p.ports.iter().chain(&p.default) {
            port.routes.iter().for_each(|r| add(&r.r#match));
        }
    }
    for s in &update.services {
        s.ports
            .iter()
            .flat_map(|p| &p.rules)
            .for_each(|r| add(&r.r#match));
    }
    out.truncate(16);
    out
}

/// Checks connections and requests against one port's policy.
fn check_port(policy: &PortPolicy, reqs: &[Request<()>]) {
    for client in clients() {
        let _ = policy.check(&client, None);
        let _ = policy.check(&client, Some("/ready?x=1"));
        for req in reqs {
            let (verdict, route) =
                policy.check_request(&client, &RequestParts::of(req), Some(req.uri().path()));
            if route.is_none() && !policy.routes.is_empty() && verdict.allowed() {
                assert!(
                    client.identity.is_none(),
                    "no route but allowed: {verdict:?}"
                );
            }
        }
    }
}

/// Checks a Service's routes: rules selected, backends picked, headers modified.
fn check_routes(routes: &ServiceRoutes, ports: &[u32], reqs: &[Request<()>]) {
    for port in ports.iter().filter_map(|p| u16::try_from(*p).ok()) {
        let Some(rules) = routes.port("", port) else {
            continue;
        };
        for req in reqs {
            let Some(rule) = select(rules, &RequestParts::of(req)) else {
                continue;
            };
            for roll in [0.0, 0.25, 0.5, 0.999_999] {
                let picked = rule.backend(roll);
                if rule.backends.iter().any(|b| b.weight > 0) {
                    assert!(
                        picked.is_some_and(|b| b.weight > 0),
                        "roll {roll}: {picked:?}"
                    );
                } else {
                    assert!(picked.is_none());
                }
            }
            let mut headers = req.headers().clone();
            rule.request_headers.apply(&mut headers);
            rule.response_headers.apply(&mut headers);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let fallback = match PortPolicy::default_policy("all-unauthenticated", &[]) {
        Ok(p) => p,
        Err(e) => panic!("the fallback policy: {e}"),
    };
    let mut state = PolicyState::new(fallback);
    let mut chunks = Chunks::default();
    for chunk in messages::<pb::Update>(data, 8) {
        let Some(update) = chunks.push(chunk) else {
            continue;
        };
        let before = state.clone();
        let _ = state.apply(update.clone());
        let reqs = requests(&paths(&update));

        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        for p in &update.pods {
            *seen.entry(p.pod.as_str()).or_default() += 1;
        }
        for p in &update.pods {
            let mut ports: Vec<u16> = p
                .ports
                .iter()
                .filter_map(|pp| u16::try_from(pp.port).ok())
                .collect();
            ports.extend([0, 1, 80, 8080, 65535]);
            match PodPolicy::from_pb(p) {
                Ok(parsed) => {
                    for pattern in of_pod(p) {
                        assert!(
                            stands_alone(&pattern),
                            "pod {}: accepted regex {pattern:?}",
                            p.pod
                        );
                    }
                    if seen[p.pod.as_str()] == 1 {
                        for &port in &ports {
                            assert_eq!(
                                &state.port(&p.pod, port),
                                parsed.port(port),
                                "pod {} port {port}",
                                p.pod
                            );
                        }
                    }
                    for &port in &ports {
                        check_port(parsed.port(port), &reqs);
                    }
                }
                // (A pod removed and refused in one update falls back to the default.)
                Err(_) if seen[p.pod.as_str()] == 1 && !update.removed_pods.contains(&p.pod) => {
                    for &port in &ports {
                        assert_eq!(
                            state.port(&p.pod, port),
                            before.port(&p.pod, port),
                            "pod {} port {port}",
                            p.pod
                        );
                    }
                }
                Err(_) => {}
            }
        }
        for s in &update.services {
            let Ok(routes) = ServiceRoutes::from_pb(s) else {
                continue;
            };
            for pattern in of_service(s) {
                assert!(
                    stands_alone(&pattern),
                    "Service {}: accepted regex {pattern:?}",
                    s.service
                );
            }
            if let Some((ns, name)) = s.service.split_once('/') {
                assert!(
                    state.routes(ns, name).is_some(),
                    "Service {} has no routes",
                    s.service
                );
            }
            let ports: Vec<u32> = s.ports.iter().map(|p| p.port).collect();
            check_routes(&routes, &ports, &reqs);
        }
    }
});
