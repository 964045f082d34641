use super::*;
use pb::path_match::Kind as Path;

fn index(yaml: &str) -> ClusterIndex {
    let mut skipped = 0;
    let objects = crate::local::parse_file(std::path::Path::new("t.yaml"), yaml, &mut skipped)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .map(|o| o.object);
    ClusterIndex::from_objects("cluster.local", objects).unwrap_or_else(|(_, e)| panic!("{e}"))
}

fn render(yaml: &str) -> RenderedRoutes {
    render_routes(&index(yaml), &ServiceRoutesMap::new())
}

const SERVICES: &str = "
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec: {ports: [{name: http, port: 80}, {name: admin, port: 9000}]}
---
apiVersion: v1
kind: Service
metadata: {name: plain, namespace: shop}
spec: {ports: [{port: 80}]}
";

fn route(name: &str, created: Option<&str>, spec: &str) -> String {
    let created = created
        .map(|c| format!(", creationTimestamp: '{c}'"))
        .unwrap_or_default();
    format!("---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: shop{created}}}\nspec:\n  parentRefs: [{{group: core, kind: Service, name: web, port: 80}}]\n{spec}")
}

/// Each rule of a port as "route: what it matches".
fn rules(r: &RenderedRoutes, service: &str, port: u32) -> Vec<String> {
    let svc = r
        .services
        .get(service)
        .unwrap_or_else(|| panic!("{service} not rendered"));
    let port = svc
        .ports
        .iter()
        .find(|p| p.port == port)
        .unwrap_or_else(|| panic!("no port {port}"));
    port.rules
        .iter()
        .map(|rule| {
            let m = rule.r#match.clone().unwrap_or_default();
            let path = match m.path.and_then(|p| p.kind) {
                Some(Path::Exact(p)) => format!("={p}"),
                Some(Path::Prefix(p)) => format!("{p}*"),
                Some(Path::Regex(p)) => format!("~{p}"),
                None => String::new(),
            };
            let grpc = m
                .grpc
                .map(|g| format!("{}/{}", g.service, g.method))
                .unwrap_or_default();
            format!(
                "{}: {path}{grpc} {} h{} q{}",
                rule.route_name,
                m.method,
                m.headers.len(),
                m.query_params.len()
            )
        })
        .collect()
}

#[test]
fn rules_in_gateway_api_precedence_with_ties_by_age_name_and_order() {
    let yaml = format!(
        "{SERVICES}{}{}{}{}",
        route("b-new", Some("2026-02-01T00:00:00Z"), "  rules:\n  - matches: [{path: {type: PathPrefix, value: /api}}, {path: {type: PathPrefix, value: /api}, method: GET}]\n"),
        route("a-newer", Some("2026-03-01T00:00:00Z"), "  rules:\n  - matches: [{path: {type: PathPrefix, value: /api}}]\n  - {}\n"),
        route("z-old", Some("2026-01-01T00:00:00Z"), "  rules:\n  - matches: [{path: {type: PathPrefix, value: /api}}, {path: {type: Exact, value: /api/login}}]\n  - matches: [{path: {type: PathPrefix, value: /api/v2}}, {path: {type: RegularExpression, value: '/u/[0-9]+'}}]\n"),
        route("c-local", None, "  rules:\n  - matches: [{path: {value: /api}, headers: [{name: a, value: '1'}]}, {path: {value: /api}, headers: [{name: a, value: '1'}, {name: b, value: '2'}]}, {path: {value: /api}, queryParams: [{name: q, value: x}]}]\n"),
    );
    let r = render(&yaml);
    assert_eq!(
        rules(&r, "shop/web", 80),
        [
            "z-old: =/api/login  h0 q0", // an exact path first
            "z-old: ~/u/[0-9]+  h0 q0",  // then regexes
            "z-old: /api/v2*  h0 q0",    // then the longest prefix
            "b-new: /api* GET h0 q0",    // then a method
            "c-local: /api*  h2 q0",     // then the most headers
            "c-local: /api*  h1 q0",
            "c-local: /api*  h0 q1", // then query parameters
            // Equal matches: the oldest route first (2026-01, 02, 03).
            "z-old: /api*  h0 q0",
            "b-new: /api*  h0 q0",
            "a-newer: /api*  h0 q0",
            "a-newer: /*  h0 q0", // a rule without matches: PathPrefix /
        ]
    );
    // The parentRef names port 80 only: 9000 gets the default rule; plain is not routed.
    assert_eq!(rules(&r, "shop/web", 9000), ["default:   h0 q0"]);
    assert!(!r.services.contains_key("shop/plain"));
    assert!(r.problems.is_empty(), "{:?}", r.problems);
}

#[test]
fn same_route_ties_keep_rule_then_match_order_and_names_break_age_ties() {
    let same = "  rules:\n  - matches: [{path: {value: /x}, method: GET}, {path: {value: /x}, method: PUT}]\n  - matches: [{path: {value: /x}, method: POST}]\n";
    let yaml = format!(
        "{SERVICES}{}{}",
        route("m", Some("2026-01-01T00:00:00Z"), same),
        route("k", Some("2026-01-01T00:00:00Z"), same)
    );
    let r = render(&yaml);
    let got = rules(&r, "shop/web", 80);
    assert_eq!(
        got,
        [
            "k: /x* GET h0 q0",
            "k: /x* PUT h0 q0",
            "k: /x* POST h0 q0",
            "m: /x* GET h0 q0",
            "m: /x* PUT h0 q0",
            "m: /x* POST h0 q0"
        ]
    );
}

#[test]
fn grpc_precedence_and_a_grpcroute_shadows_httproutes_on_its_port() {
    let grpc = "---\napiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: g, namespace: shop}\nspec:\n  parentRefs: [{group: core, kind: Service, name: web}]\n  rules:\n  - matches: [{method: {method: Get}}, {method: {service: a.B}}, {method: {service: shop.Catalog, method: List}}, {method: {service: shop.Catalog}}]\n  - {}\n";
    let yaml = format!("{SERVICES}{}{grpc}", route("h", None, "  rules: [{}]\n"));
    let r = render(&yaml);
    assert_eq!(
        rules(&r, "shop/web", 80),
        [
            "g: shop.Catalog/List  h0 q0",
            "g: shop.Catalog/  h0 q0",
            "g: a.B/  h0 q0",
            "g: /Get  h0 q0",
            "g:   h0 q0"
        ]
    );
    assert!(r.services["shop/web"].ports[0].rules.iter().all(|r| r.grpc));
    assert!(
        r.problems["HTTPRoute shop/h"].contains("GRPCRoute"),
        "{:?}",
        r.problems
    );
}

fn with_annotations(svc: &str, route_ann: &str, spec: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: shop, annotations: {{{svc}}}}}\nspec: {{ports: [{{port: 80}}]}}\n\
         ---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r, namespace: shop, annotations: {{{route_ann}}}}}\n\
         spec:\n  parentRefs: [{{group: core, kind: Service, name: web}}]\n  rules: [{spec}]\n"
    )
}

fn first_rule(yaml: &str) -> pb::Rule {
    let r = render(yaml);
    r.services["shop/web"].ports[0].rules[0].clone()
}

#[test]
fn the_rule_wins_over_the_routes_annotations_which_win_over_the_services() {
    let svc = "retry.ambit.dev/http: '503', retry.ambit.dev/limit: '4', retry.ambit.dev/timeout: 1s, timeout.ambit.dev/request: 30s, timeout.ambit.dev/idle: 5m";
    // Only the Service's: inherited as a whole.
    let rule = first_rule(&with_annotations(svc, "", "{}"));
    let retry = rule.retry.clone().unwrap_or_default();
    assert_eq!((retry.limit, retry.backoff_ms), (4, 25));
    assert_eq!(
        retry.http_statuses,
        [pb::StatusRange { min: 503, max: 503 }]
    );
    assert!(
        retry.grpc_codes.is_empty(),
        "a named HTTP list does not add gRPC codes"
    );
    assert_eq!(
        rule.timeouts,
        Some(pb::Timeouts {
            request_ms: 30_000,
            backend_request_ms: 1000,
            response_ms: 0,
            idle_ms: 300_000
        })
    );
    // The route's retry group replaces the Service's whole (its limit too); its timeout
    // group likewise (no idle inherited).
    let rule = first_rule(&with_annotations(
        svc,
        "retry.ambit.dev/http: gateway-error, timeout.ambit.dev/response: 2s",
        "{}",
    ));
    let retry = rule.retry.clone().unwrap_or_default();
    assert_eq!(retry.limit, 1, "default limit, not the Service's 4");
    assert_eq!(
        retry.http_statuses,
        [pb::StatusRange { min: 502, max: 504 }]
    );
    assert_eq!(
        rule.timeouts,
        Some(pb::Timeouts {
            request_ms: 0,
            backend_request_ms: 0,
            response_ms: 2000,
            idle_ms: 0
        })
    );
    // The rule's own retry stanza and timeouts win over both.
    let rule = first_rule(&with_annotations(
        svc,
        "retry.ambit.dev/limit: '2'",
        "{timeouts: {request: 3s, backendRequest: 500ms}, retry: {attempts: 5, backoff: 100ms}}",
    ));
    let retry = rule.retry.clone().unwrap_or_default();
    assert_eq!((retry.limit, retry.backoff_ms), (5, 100));
    assert_eq!(
        retry.http_statuses,
        [pb::StatusRange { min: 500, max: 599 }],
        "no codes: every 5xx"
    );
    let t = rule.timeouts.unwrap_or_default();
    assert_eq!(
        (t.request_ms, t.backend_request_ms, t.idle_ms),
        (3000, 500, 300_000)
    );
    // attempts: 0 is no retry, whatever the annotations.
    assert!(
        first_rule(&with_annotations(svc, "", "{retry: {attempts: 0}}"))
            .retry
            .is_none()
    );
}

#[test]
fn defaults_a_service_with_annotations_only_and_one_with_none() {
    let r = render(
        "apiVersion: v1\nkind: Service\nmetadata: {name: api, namespace: shop, annotations: {retry.ambit.dev/limit: '2', balancer.ambit.dev/failure-accrual-consecutive-max-failures: '3'}}\n\
         spec: {ports: [{port: 80}, {port: 81}, {port: 53, protocol: UDP}]}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {name: quiet, namespace: shop}\nspec: {ports: [{port: 80}]}\n",
    );
    assert_eq!(r.services.keys().collect::<Vec<_>>(), ["shop/api"]);
    let api = &r.services["shop/api"];
    assert_eq!(
        api.ports.iter().map(|p| p.port).collect::<Vec<_>>(),
        [80, 81],
        "TCP ports only"
    );
    let rule = &api.ports[0].rules[0];
    assert_eq!(
        (
            rule.route_kind.as_str(),
            rule.route_namespace.as_str(),
            rule.route_name.as_str()
        ),
        ("default", "shop", "default")
    );
    assert!(rule.r#match.is_none() && rule.backends.is_empty() && rule.timeouts.is_none());
    let retry = rule.retry.clone().unwrap_or_default();
    assert_eq!(retry.limit, 2);
    assert_eq!(
        retry.http_statuses,
        [pb::StatusRange { min: 500, max: 599 }],
        "no statuses named: 5xx"
    );
    assert_eq!(
        retry.grpc_codes,
        [1, 4, 8, 13, 14],
        "and the five retryable gRPC codes"
    );
    assert_eq!(
        api.failure_accrual,
        Some(pb::FailureAccrual {
            kind: "consecutive".into(),
            max_failures: 3,
            min_penalty_ms: 1000,
            max_penalty_ms: 60_000,
            jitter_ratio: 0.5
        })
    );
}

#[test]
fn backends_render_even_when_missing_and_what_cannot_attach_is_reported() {
    let yaml = format!(
        "{SERVICES}{}---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: consumer, namespace: client}}\n\
         spec: {{parentRefs: [{{group: core, kind: Service, name: web, namespace: shop}}]}}\n---\n\
         apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: orphan, namespace: shop}}\n\
         spec: {{parentRefs: [{{group: core, kind: Service, name: gone}}, {{group: core, kind: Service, name: plain, port: 81}}]}}\n",
        route("split", None, "  rules: [{backendRefs: [{name: web-v1, port: 80, weight: 9}, {name: nowhere, port: 80}]}]\n"),
    );
    let r = render(&yaml);
    let rule = &r.services["shop/web"].ports[0].rules[0];
    let backends: Vec<(&str, u32, u32)> = rule
        .backends
        .iter()
        .map(|b| (b.service.as_str(), b.port, b.weight))
        .collect();
    assert_eq!(backends, [("shop/web-v1", 80, 9), ("shop/nowhere", 80, 1)]);
    assert!(
        !r.problems.keys().any(|k| k.contains("client/consumer")),
        "a consumer route attaches: {:?}",
        r.problems
    );
    assert!(r.problems["HTTPRoute shop/orphan parent shop/gone"].contains("does not exist"));
    assert!(r.problems["HTTPRoute shop/orphan parent shop/plain"].contains("has no port 81"));
    assert!(
        !r.services.contains_key("shop/plain"),
        "only a port it does not have: not routed"
    );
}

#[test]
fn an_unchanged_service_keeps_its_shared_rendering() {
    let yaml = format!("{SERVICES}{}", route("r", None, "  rules: [{}]\n"));
    let idx = index(&yaml);
    let first = render_routes(&idx, &ServiceRoutesMap::new());
    let again = render_routes(&idx, &first.services);
    assert!(Arc::ptr_eq(
        &first.services["shop/web"],
        &again.services["shop/web"]
    ));
}

#[test]
fn consumer_routes_render_per_client_namespace_and_only_on_their_ports() {
    let consumer = |ns: &str, name: &str, port: &str, path: &str| {
        format!(
            "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: {ns}}}\n\
             spec:\n  parentRefs: [{{group: core, kind: Service, name: web, namespace: shop{port}}}]\n  rules: [{{matches: [{{path: {{type: PathPrefix, value: {path}}}}}]}}]\n"
        )
    };
    let yaml = format!(
        "{SERVICES}{}{}{}{}",
        route(
            "producer",
            None,
            "  rules: [{matches: [{path: {type: PathPrefix, value: /p}}]}]\n"
        ),
        consumer("client", "mine", ", port: 80", "/c"),
        consumer("client", "also", "", "/d"),
        consumer("other", "theirs", ", port: 9000", "/o"),
    );
    let r = render(&yaml);
    let web = &r.services["shop/web"];
    assert_eq!(
        rules(&r, "shop/web", 80),
        ["producer: /p*  h0 q0"],
        "producers' own rules unchanged"
    );
    let port_rules = |ns: &str, port: u32| -> Vec<String> {
        let c = web.consumers.iter().find(|c| c.namespace == ns).unwrap();
        c.ports
            .iter()
            .find(|p| p.port == port)
            .map(|p| {
                p.rules
                    .iter()
                    .map(|r| format!("{}/{}", r.route_namespace, r.route_name))
                    .collect()
            })
            .unwrap_or_default()
    };
    let namespaces: Vec<&str> = web.consumers.iter().map(|c| c.namespace.as_str()).collect();
    assert_eq!(namespaces, ["client", "other"]);
    assert_eq!(
        port_rules("client", 80),
        ["client/also", "client/mine"],
        "both of client's routes, in precedence (name)"
    );
    assert_eq!(
        port_rules("client", 9000),
        ["client/also"],
        "the port-less route attaches to every port"
    );
    assert_eq!(
        port_rules("other", 80),
        Vec::<String>::new(),
        "a port its routes do not name is the producer's"
    );
    assert_eq!(port_rules("other", 9000), ["other/theirs"]);
    assert!(r.problems.is_empty(), "{:?}", r.problems);
}

#[test]
fn redirect_rewrite_and_mirror_filters_render_as_written() {
    let yaml = format!(
        "{SERVICES}{}",
        route(
            "filters",
            None,
            "  rules:\n  - matches: [{path: {type: PathPrefix, value: /old}}]\n    filters: [{type: RequestRedirect, requestRedirect: {scheme: https, hostname: example.com, port: 8443, statusCode: 302, path: {type: ReplacePrefixMatch, replacePrefixMatch: /new}}}]\n  - matches: [{path: {type: PathPrefix, value: /api}}]\n    filters:\n    - {type: URLRewrite, urlRewrite: {hostname: api.internal, path: {type: ReplaceFullPath, replaceFullPath: /v2}}}\n    - {type: RequestMirror, requestMirror: {backendRef: {name: plain, port: 80}, percent: 25}}\n    - {type: RequestMirror, requestMirror: {backendRef: {name: web, port: 9000}, fraction: {numerator: 1, denominator: 3}}}\n"
        ),
    );
    let r = render(&yaml);
    let rules = &r.services["shop/web"].ports[0].rules;
    let full = |v: &str| {
        Some(pb::PathModifier {
            kind: Some(pb::path_modifier::Kind::Full(v.into())),
        })
    };
    let prefix = |v: &str| {
        Some(pb::PathModifier {
            kind: Some(pb::path_modifier::Kind::Prefix(v.into())),
        })
    };
    let api = rules.iter().find(|r| r.rewrite.is_some()).unwrap();
    let old = rules.iter().find(|r| r.redirect.is_some()).unwrap();
    assert_eq!(
        old.redirect,
        Some(pb::Redirect {
            scheme: "https".into(),
            hostname: "example.com".into(),
            path: prefix("/new"),
            port: 8443,
            status: 302
        })
    );
    assert_eq!(
        api.rewrite,
        Some(pb::Rewrite {
            hostname: "api.internal".into(),
            path: full("/v2")
        })
    );
    let mirrors: Vec<(&str, u32, u32, u32)> = api
        .mirrors
        .iter()
        .map(|m| (m.service.as_str(), m.port, m.numerator, m.denominator))
        .collect();
    assert_eq!(
        mirrors,
        [("shop/plain", 80, 25, 100), ("shop/web", 9000, 1, 3)]
    );
}
