use crate::index::route::*;
use crate::index::{ClusterIndex, ConvertError, KubeObject};
use crate::local::{parse_file, LocalError};
use std::time::Duration;

const H: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r, namespace: shop}\n";
const G: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: g, namespace: shop}\n";

fn parse(yaml: &str) -> Result<Vec<KubeObject>, LocalError> {
    let mut skipped = 0;
    Ok(
        parse_file(std::path::Path::new("routes.yaml"), yaml, &mut skipped)?
            .into_iter()
            .map(|o| o.object)
            .collect(),
    )
}

fn index(yaml: &str) -> Result<ClusterIndex, ConvertError> {
    let objects = parse(yaml).unwrap_or_else(|e| panic!("{e}"));
    ClusterIndex::from_objects("cluster.local", objects).map_err(|(_, e)| e)
}

fn one(yaml: &str) -> RouteInfo {
    let idx = index(yaml).unwrap_or_else(|e| panic!("{e}"));
    let r = idx.routes().next().cloned();
    r.unwrap_or_else(|| panic!("no route"))
}

/// (field, message) of the refusal of `spec` in an HTTPRoute (or `head`'s kind).
fn refused_in(head: &str, spec: &str) -> (String, String) {
    let e = index(&format!("{head}spec: {spec}\n")).expect_err("refused");
    (e.field, e.message)
}

fn refused(spec: &str) -> (String, String) {
    refused_in(H, spec)
}

#[test]
fn an_httproute_with_everything_it_may_say() {
    let r = one(&format!(
        "{H}spec:
  parentRefs:
  - {{group: core, kind: Service, name: web, port: 80}}
  - {{group: policy.ambit.dev, kind: Server, name: web-http}}
  - {{name: ingress}}
  rules:
  - matches:
    - path: {{type: Exact, value: /login}}
      headers: [{{name: X-User, value: alice}}, {{type: RegularExpression, name: x-tier, value: 'gold|silver'}}]
      queryParams: [{{name: Debug, value: '1'}}]
      method: POST
    - {{}}
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {{set: [{{name: X-Env, value: prod}}], remove: [X-Debug]}}
    - type: ResponseHeaderModifier
      responseHeaderModifier: {{add: [{{name: x-served-by, value: ambit}}]}}
    backendRefs: [{{name: web-v1, port: 80, weight: 90}}, {{name: web-v2, port: 8080}}, {{name: web-v3, port: 80, weight: 0}}]
    timeouts: {{request: 10s, backendRequest: 2s}}
    retry: {{codes: [502, 503], attempts: 3, backoff: 100ms}}
"
    ));
    assert_eq!(r.kind, RouteKind::Http);
    assert_eq!(
        r.parents,
        vec![
            RouteParent::Service {
                namespace: "shop".into(),
                name: "web".into(),
                port: Some(80)
            },
            RouteParent::Server {
                namespace: "shop".into(),
                name: "web-http".into()
            },
        ],
        "the Gateway parent is not the mesh's"
    );
    let rule = &r.rules[0];
    let RequestMatch::Http(m) = &rule.matches[0] else {
        panic!("http")
    };
    assert_eq!(m.path, PathMatch::Exact("/login".into()));
    assert_eq!(m.headers[0].name, "x-user", "header names lower case");
    assert_eq!(m.headers[1].value, MatchValue::Regex("gold|silver".into()));
    assert_eq!(m.query_params[0].name, "Debug", "query names as given");
    assert_eq!(m.method.as_deref(), Some("POST"));
    let RequestMatch::Http(all) = &rule.matches[1] else {
        panic!("http")
    };
    assert_eq!(
        all.path,
        PathMatch::Prefix("/".into()),
        "no path: PathPrefix /"
    );
    let req = rule.request_headers.clone().unwrap_or_default();
    assert_eq!(req.set, vec![("x-env".to_string(), "prod".to_string())]);
    assert_eq!(req.remove, vec!["x-debug".to_string()]);
    assert_eq!(
        rule.response_headers.clone().unwrap_or_default().add.len(),
        1
    );
    let weights: Vec<(String, u16, u32)> = rule
        .backends
        .iter()
        .map(|b| (b.name.clone(), b.port, b.weight))
        .collect();
    assert_eq!(
        weights,
        [
            ("web-v1".into(), 80, 90),
            ("web-v2".into(), 8080, 1),
            ("web-v3".into(), 80, 0)
        ],
        "weight 1 by default, 0 allowed"
    );
    assert_eq!(rule.request_timeout, Some(Duration::from_secs(10)));
    assert_eq!(rule.backend_request_timeout, Some(Duration::from_secs(2)));
    assert_eq!(
        rule.retry,
        Some(RetryStanza {
            codes: Some(vec![502, 503]),
            attempts: Some(3),
            backoff: Some(Duration::from_millis(100))
        })
    );
}

#[test]
fn redirect_rewrite_and_mirror_filters_with_their_defaults() {
    let r = one(&format!(
        "{H}spec:
  parentRefs: [{{group: core, kind: Service, name: web}}]
  rules:
  - filters: [{{type: RequestRedirect, requestRedirect: {{}}}}]
  - matches: [{{path: {{type: PathPrefix, value: /a}}}}, {{path: {{value: /b}}}}]
    filters:
    - {{type: URLRewrite, urlRewrite: {{path: {{type: ReplacePrefixMatch, replacePrefixMatch: ''}}}}}}
    - {{type: RequestMirror, requestMirror: {{backendRef: {{name: m, port: 8080}}}}}}
    - {{type: RequestMirror, requestMirror: {{backendRef: {{name: n, port: 80}}, fraction: {{numerator: 1}}}}}}
  - backendRefs:
    - name: web
      port: 80
      filters:
      - {{type: RequestHeaderModifier, requestHeaderModifier: {{add: [{{name: X-B, value: '1'}}]}}}}
      - {{type: ResponseHeaderModifier, responseHeaderModifier: {{remove: [X-C]}}}}
"
    ));
    assert_eq!(
        r.rules[0].redirect,
        Some(Redirect {
            scheme: None,
            hostname: None,
            path: None,
            port: None,
            status: 302
        }),
        "302 by default (Gateway API's), everything else the request's"
    );
    let b = &r.rules[2].backends[0];
    assert_eq!(
        b.request_headers.clone().unwrap_or_default().add,
        vec![("x-b".to_string(), "1".to_string())],
        "a backend's own header modifier"
    );
    assert_eq!(
        b.response_headers.clone().unwrap_or_default().remove,
        vec!["x-c".to_string()]
    );
    let rule = &r.rules[1];
    assert_eq!(
        rule.rewrite,
        Some(Rewrite {
            hostname: None,
            path: Some(PathModifier::Prefix(String::new()))
        }),
        "ReplacePrefixMatch with every match a PathPrefix (the default type)"
    );
    let mirrors: Vec<(&str, u16, u32, u32)> = rule
        .mirrors
        .iter()
        .map(|m| {
            (
                m.backend.name.as_str(),
                m.backend.port,
                m.numerator,
                m.denominator,
            )
        })
        .collect();
    assert_eq!(
        mirrors,
        [("m", 8080, 1, 1), ("n", 80, 1, 100)],
        "every request by default; a fraction's denominator 100"
    );
}

#[test]
fn a_consumer_route_may_send_to_its_parents_namespace_and_no_other() {
    // GAMMA's consumer route (the conformance suite's MeshConsumerRoute): in the
    // client's namespace, its parent and backend a Service of the producer's.
    let r = one(&format!("{H}spec: {{parentRefs: [{{group: core, kind: Service, name: echo, namespace: prod, port: 80}}], rules: [{{backendRefs: [{{name: echo-v1, namespace: prod, port: 80}}, {{name: local, port: 80}}]}}]}}\n"));
    let names: Vec<(&str, &str)> = r.rules[0]
        .backends
        .iter()
        .map(|b| (b.namespace.as_str(), b.name.as_str()))
        .collect();
    assert_eq!(names, [("prod", "echo-v1"), ("shop", "local")]);
    // A third namespace still needs a ReferenceGrant; so does a producer route's.
    let (f, m) = refused("{parentRefs: [{group: core, kind: Service, name: echo, namespace: prod}], rules: [{backendRefs: [{name: b, port: 80, namespace: third}]}]}");
    assert_eq!(f, "spec.rules[0].backendRefs[0].namespace", "{m}");
    assert!(m.contains("ReferenceGrant"), "{m}");
}

#[test]
fn a_grpcroute_matches_service_and_method() {
    let r = one(&format!(
        "{G}spec:
  parentRefs: [{{group: '', kind: Service, name: catalog}}]
  rules:
  - matches: [{{method: {{service: shop.Catalog, method: List}}, headers: [{{name: x-tenant, value: a}}]}}, {{method: {{method: Get}}}}]
"
    ));
    assert_eq!(r.kind, RouteKind::Grpc);
    let RequestMatch::Grpc(m) = &r.rules[0].matches[0] else {
        panic!("grpc")
    };
    assert_eq!(
        (m.service.as_deref(), m.method.as_deref()),
        (Some("shop.Catalog"), Some("List"))
    );
    let RequestMatch::Grpc(m) = &r.rules[0].matches[1] else {
        panic!("grpc")
    };
    assert_eq!(
        (m.service.as_deref(), m.method.as_deref()),
        (None, Some("Get"))
    );
}

#[test]
fn each_bad_value_is_refused_by_field() {
    let p = "parentRefs: [{group: core, kind: Service, name: web}], ";
    let cases: Vec<(String, &str, &str)> = vec![
        (format!("{{{p}rules: [{{matches: [{{path: {{type: RegularExpression, value: '/a('}}}}]}}]}}"), "spec.rules[0].matches[0].path.value", "not a regular expression"),
        (format!("{{{p}rules: [{{matches: [{{path: {{type: Exact, value: 'a'}}}}]}}]}}"), "spec.rules[0].matches[0].path.value", "must start with '/'"),
        (format!("{{{p}rules: [{{matches: [{{path: {{type: Glob, value: '/a'}}}}]}}]}}"), "spec.rules[0].matches[0].path.type", "Exact, PathPrefix or RegularExpression"),
        (format!("{{{p}rules: [{{matches: [{{headers: [{{type: RegularExpression, name: x, value: '['}}]}}]}}]}}"), "spec.rules[0].matches[0].headers[0].value", "not a regular expression"),
        // Found by the policy_objects fuzz target: only a regex inside `^(?:…)$`, where it
        // closed the group and matched every path.
        (format!("{{{p}rules: [{{matches: [{{path: {{type: RegularExpression, value: '/public)|(.*'}}}}]}}]}}"), "spec.rules[0].matches[0].path.value", "not a regular expression"),
        (format!("{{{p}rules: [{{matches: [{{queryParams: [{{type: RegularExpression, name: q, value: 'a)(?x)#'}}]}}]}}]}}"), "spec.rules[0].matches[0].queryParams[0].value", "not a regular expression"),
        (format!("{{{p}rules: [{{matches: [{{headers: [{{name: 'x y', value: a}}]}}]}}]}}"), "spec.rules[0].matches[0].headers[0].name", "not a header name"),
        (format!("{{{p}rules: [{{matches: [{{queryParams: [{{name: q}}]}}]}}]}}"), "spec.rules[0].matches[0].queryParams[0].value", "required"),
        (format!("{{{p}rules: [{{matches: [{{method: get}}]}}]}}"), "spec.rules[0].matches[0].method", "not a method"),
        (format!("{{{p}rules: [{{filters: [{{type: CORS, cors: {{}}}}]}}]}}"), "spec.rules[0].filters[0].type", "not supported"),
        (format!("{{{p}rules: [{{filters: [{{type: URLRewrite, urlRewrite: {{hostname: 'X_y'}}}}]}}]}}"), "spec.rules[0].filters[0].urlRewrite.hostname", "not a hostname"),
        (format!("{{{p}rules: [{{filters: [{{type: URLRewrite}}]}}]}}"), "spec.rules[0].filters[0].urlRewrite", "required"),
        (format!("{{{p}rules: [{{matches: [{{path: {{type: Exact, value: /a}}}}], filters: [{{type: URLRewrite, urlRewrite: {{path: {{type: ReplacePrefixMatch, replacePrefixMatch: /b}}}}}}]}}]}}"), "spec.rules[0].filters[0].urlRewrite.path.type", "PathPrefix"),
        (format!("{{{p}rules: [{{filters: [{{type: URLRewrite, urlRewrite: {{path: {{type: ReplaceFullPath, replaceFullPath: 'no-slash'}}}}}}]}}]}}"), "spec.rules[0].filters[0].urlRewrite.path.replaceFullPath", "not a path"),
        (format!("{{{p}rules: [{{filters: [{{type: RequestRedirect, requestRedirect: {{statusCode: 300}}}}]}}]}}"), "spec.rules[0].filters[0].requestRedirect.statusCode", "not a redirect status"),
        (format!("{{{p}rules: [{{filters: [{{type: RequestRedirect, requestRedirect: {{scheme: ftp}}}}]}}]}}"), "spec.rules[0].filters[0].requestRedirect.scheme", "http or https"),
        (format!("{{{p}rules: [{{filters: [{{type: RequestRedirect, requestRedirect: {{port: 70000}}}}]}}]}}"), "spec.rules[0].filters[0].requestRedirect.port", "not a port"),
        (format!("{{{p}rules: [{{filters: [{{type: RequestRedirect, requestRedirect: {{}}}}, {{type: URLRewrite, urlRewrite: {{}}}}]}}]}}"), "spec.rules[0].filters", "cannot be in one rule"),
        (format!("{{{p}rules: [{{filters: [{{type: RequestRedirect, requestRedirect: {{}}}}, {{type: RequestRedirect, requestRedirect: {{}}}}]}}]}}"), "spec.rules[0].filters[1].type", "a second RequestRedirect"),
        (format!("{{{p}rules: [{{filters: [{{type: RequestMirror, requestMirror: {{}}}}]}}]}}"), "spec.rules[0].filters[0].requestMirror.backendRef", "required"),
        (format!("{{{p}rules: [{{filters: [{{type: RequestMirror, requestMirror: {{backendRef: {{name: m, port: 80}}, percent: 101}}}}]}}]}}"), "spec.rules[0].filters[0].requestMirror.percent", "percentage"),
        (format!("{{{p}rules: [{{filters: [{{type: RequestMirror, requestMirror: {{backendRef: {{name: m, port: 80}}, fraction: {{numerator: 3, denominator: 2}}}}}}]}}]}}"), "spec.rules[0].filters[0].requestMirror.fraction.numerator", "not a numerator"),
        (format!("{{{p}rules: [{{filters: [{{type: RequestMirror, requestMirror: {{backendRef: {{name: m, port: 80}}, fraction: {{numerator: 1, denominator: 0}}}}}}]}}]}}"), "spec.rules[0].filters[0].requestMirror.fraction.denominator", "not a denominator"),
        (format!("{{{p}rules: [{{filters: [{{type: RequestMirror, requestMirror: {{backendRef: {{name: m}}}}}}]}}]}}"), "spec.rules[0].filters[0].requestMirror.backendRef.port", "required"),
        (format!("{{{p}rules: [{{backendRefs: [{{name: b, port: 80, filters: [{{type: URLRewrite, urlRewrite: {{}}}}]}}]}}]}}"), "spec.rules[0].backendRefs[0].filters[0].type", "not supported on a backend"),
        (format!("{{{p}rules: [{{filters: [{{type: RequestHeaderModifier}}]}}]}}"), "spec.rules[0].filters[0].requestHeaderModifier", "required"),
        (format!("{{{p}rules: [{{backendRefs: [{{name: b}}]}}]}}"), "spec.rules[0].backendRefs[0].port", "required"),
        (format!("{{{p}rules: [{{backendRefs: [{{name: b, port: 80, weight: -1}}]}}]}}"), "spec.rules[0].backendRefs[0].weight", "not a weight"),
        (format!("{{{p}rules: [{{backendRefs: [{{name: b, port: 80, namespace: other}}]}}]}}"), "spec.rules[0].backendRefs[0].namespace", "ReferenceGrant"),
        (format!("{{{p}rules: [{{backendRefs: [{{kind: Pod, name: b, port: 80}}]}}]}}"), "spec.rules[0].backendRefs[0].kind", "only Services"),
        (format!("{{{p}rules: [{{timeouts: {{request: 1.5s}}}}]}}"), "spec.rules[0].timeouts.request", "Gateway API duration"),
        (format!("{{{p}rules: [{{timeouts: {{request: 1s, backendRequest: 2s}}}}]}}"), "spec.rules[0].timeouts.backendRequest", "longer than timeouts.request"),
        (format!("{{{p}rules: [{{retry: {{codes: [200]}}}}]}}"), "spec.rules[0].retry.codes[0]", "400-599"),
        (format!("{{{p}rules: [{{retry: {{attempts: -1}}}}]}}"), "spec.rules[0].retry.attempts", "number of retries"),
        (format!("{{{p}rules: [{{retry: {{backoff: 1d}}}}]}}"), "spec.rules[0].retry.backoff", "Gateway API duration"),
        ("{parentRefs: [{kind: Service, name: web}]}".into(), "spec.parentRefs[0].group", "use \"core\""),
        ("{parentRefs: [{group: core, kind: Service, name: web, sectionName: http}]}".into(), "spec.parentRefs[0].sectionName", "use port"),
        ("{parentRefs: [{group: core, kind: Service, name: web, port: 0}]}".into(), "spec.parentRefs[0].port", "not a port"),
        ("{parentRefs: [{group: core, kind: Service}]}".into(), "spec.parentRefs[0].name", "required"),
    ];
    for (spec, field, message) in cases {
        let (f, m) = refused(&spec);
        assert_eq!(f, field, "{spec}: {m}");
        assert!(m.contains(message), "{spec}: {m}");
    }
    let (f, m) = refused_in(
        G,
        "{rules: [{matches: [{method: {type: RegularExpression, service: 'a.*'}}]}]}",
    );
    assert_eq!(f, "spec.rules[0].matches[0].method.type");
    assert!(m.contains("use Exact"), "{m}");
    let (f, m) = refused_in(
        G,
        "{rules: [{filters: [{type: RequestRedirect, requestRedirect: {}}]}]}",
    );
    assert_eq!(f, "spec.rules[0].filters[0].type");
    assert!(m.contains("HTTPRoute filter"), "{m}");
    let (f, _) = refused_in(G, "{rules: [{matches: [{method: {service: a/b}}]}]}");
    assert_eq!(f, "spec.rules[0].matches[0].method.service");
    let e = index("apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r, namespace: shop}\n").expect_err("no spec");
    assert_eq!(
        (e.object.as_str(), e.field.as_str()),
        ("HTTPRoute shop/r", "spec")
    );
}

#[test]
fn typos_and_other_versions_are_refused_by_file_object_and_field() {
    let e = parse(&format!(
        "{H}spec: {{rules: [{{backendRefs: [{{name: b, port: 80, wieght: 2}}]}}]}}\n"
    ))
    .expect_err("typo");
    assert_eq!(e.file, std::path::PathBuf::from("routes.yaml"));
    assert_eq!(e.object.as_deref(), Some("HTTPRoute r"));
    assert_eq!(
        e.field.as_deref(),
        Some("spec.rules[0].backendRefs[0].wieght")
    );
    let e = parse(&format!(
        "{G}spec: {{rules: [{{matches: [{{method: {{sevrice: a}}}}]}}]}}\n"
    ))
    .expect_err("typo");
    assert_eq!(
        e.field.as_deref(),
        Some("spec.rules[0].matches[0].method.sevrice")
    );
    let e = parse(&H.replace("/v1", "/v1beta1")).expect_err("version");
    assert_eq!(e.field.as_deref(), Some("apiVersion"));
    assert!(
        e.message.contains("gateway.networking.k8s.io/v1"),
        "{}",
        e.message
    );
    let e = parse(&H.replace("gateway.networking.k8s.io/v1", "policy.linkerd.io/v1beta3"))
        .expect_err("linkerd");
    assert!(
        e.message.contains("gateway.networking.k8s.io/v1"),
        "{}",
        e.message
    );
    // Another project's HTTPRoute is not ours; a status written by a controller is fine.
    assert!(
        parse(&H.replace("gateway.networking.k8s.io/v1", "example.com/v1"))
            .unwrap_or_else(|e| panic!("{e}"))
            .is_empty()
    );
    assert_eq!(
        parse(&format!("{H}spec: {{}}\nstatus: {{parents: []}}\n")).map(|o| o.len()),
        Ok(1)
    );
}

#[test]
fn route_annotations_override_by_group_and_are_checked() {
    let r = one(&H.replace(
        "namespace: shop}",
        "namespace: shop, annotations: {retry.ambit.dev/http: '5xx,429', retry.ambit.dev/timeout: 300ms, timeout.ambit.dev/idle: 1m}}",
    ).replace("metadata:", "spec: {}\nmetadata:"));
    let retry = r.annotations.retry.clone().unwrap_or_default();
    assert_eq!(retry.http, Some(vec![(500, 599), (429, 429)]));
    assert_eq!(
        (retry.limit, retry.timeout),
        (None, Some(Duration::from_millis(300)))
    );
    let t = r.annotations.timeouts.clone().unwrap_or_default();
    assert_eq!((t.request, t.idle), (None, Some(Duration::from_secs(60))));
    let with = |head: &str, ann: &str| {
        let e = index(&format!(
            "{}spec: {{}}\n",
            head.replace(
                "namespace: shop}",
                &format!("namespace: shop, annotations: {{{ann}}}}}")
            )
        ))
        .expect_err(ann);
        (e.field, e.message)
    };
    let (f, m) = with(H, "retry.ambit.dev/grpc: internal");
    assert_eq!(f, "metadata.annotations[\"retry.ambit.dev/grpc\"]");
    assert!(m.contains("not valid on an HTTPRoute"), "{m}");
    let (_, m) = with(G, "retry.ambit.dev/http: 5xx");
    assert!(m.contains("not valid on a GRPCRoute"), "{m}");
    let (_, m) = with(H, "balancer.ambit.dev/failure-accrual: consecutive");
    assert!(m.contains("per Service"), "{m}");
}

fn service(annotations: &str) -> Result<ClusterIndex, ConvertError> {
    index(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: shop, annotations: {{{annotations}}}}}\nspec: {{ports: [{{port: 80}}]}}\n"
    ))
}

#[test]
fn service_annotations_as_linkerd_reads_them() {
    let idx = service(
        "retry.ambit.dev/http: 'gateway-error, 500-501,429', retry.ambit.dev/grpc: 'unavailable,deadline-exceeded', \
         retry.ambit.dev/limit: '3', timeout.ambit.dev/request: 5s, timeout.ambit.dev/response: 1s, \
         balancer.ambit.dev/failure-accrual: consecutive, balancer.ambit.dev/failure-accrual-consecutive-max-failures: '3', \
         balancer.ambit.dev/failure-accrual-consecutive-jitter-ratio: '0.25'",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let a = idx
        .service("shop", "web")
        .map(|s| s.routing.clone())
        .unwrap_or_default();
    let retry = a.retry.unwrap_or_default();
    assert_eq!(retry.http, Some(vec![(502, 504), (500, 501), (429, 429)]));
    assert_eq!(retry.grpc, Some(vec![14, 4]));
    assert_eq!(retry.limit, Some(3));
    let t = a.timeouts.unwrap_or_default();
    assert_eq!(
        (t.request, t.response, t.idle),
        (
            Some(Duration::from_secs(5)),
            Some(Duration::from_secs(1)),
            None
        )
    );
    assert_eq!(
        a.failure_accrual,
        Some(FailureAccrual::Consecutive {
            max_failures: 3,
            min_penalty: Duration::from_secs(1),
            max_penalty: Duration::from_secs(60),
            jitter_ratio: 0.25
        })
    );
    let idx =
        service("balancer.ambit.dev/failure-accrual: disabled").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        idx.service("shop", "web")
            .and_then(|s| s.routing.failure_accrual.clone()),
        Some(FailureAccrual::Disabled)
    );
    let idx = service("other.example/x: y").unwrap_or_else(|e| panic!("{e}"));
    assert!(idx
        .service("shop", "web")
        .is_some_and(|s| s.routing.is_empty()));
}

#[test]
fn each_refused_annotation_value_names_the_annotation() {
    let cases = [
        ("retry.ambit.dev/http: '600'", "retry.ambit.dev/http", "not an HTTP status"),
        ("retry.ambit.dev/http: '504-500'", "retry.ambit.dev/http", "the range is empty"),
        ("retry.ambit.dev/http: '5xx,'", "retry.ambit.dev/http", "an empty item"),
        ("retry.ambit.dev/http: 4xx", "retry.ambit.dev/http", "gateway-error"),
        ("retry.ambit.dev/grpc: aborted", "retry.ambit.dev/grpc", "not a retryable gRPC status"),
        ("retry.ambit.dev/limit: many", "retry.ambit.dev/limit", "number of retries"),
        ("retry.ambit.dev/timeout: '5'", "retry.ambit.dev/timeout", "Gateway API duration"),
        ("retry.ambit.dev/limt: '2'", "retry.ambit.dev/limt", "not an Ambit annotation"),
        ("timeout.ambit.dev/request: 1 s", "timeout.ambit.dev/request", "Gateway API duration"),
        ("timeout.ambit.dev/idle: -1s", "timeout.ambit.dev/idle", "Gateway API duration"),
        ("balancer.ambit.dev/failure-accrual: always", "balancer.ambit.dev/failure-accrual", "consecutive"),
        ("balancer.ambit.dev/failure-accrual-consecutive-max-failures: '0'", "balancer.ambit.dev/failure-accrual-consecutive-max-failures", "1 or more"),
        ("balancer.ambit.dev/failure-accrual-consecutive-min-penalty: 2m", "balancer.ambit.dev/failure-accrual-consecutive-min-penalty", "longer than the max"),
        ("balancer.ambit.dev/failure-accrual-consecutive-jitter-ratio: '1.5'", "balancer.ambit.dev/failure-accrual-consecutive-jitter-ratio", "0 to 1"),
        ("{balancer.ambit.dev/failure-accrual: disabled, balancer.ambit.dev/failure-accrual-consecutive-max-failures: '3'}", "balancer.ambit.dev/failure-accrual-consecutive-max-failures", "disabled"),
    ];
    for (ann, key, message) in cases {
        let ann = ann.trim_start_matches('{').trim_end_matches('}');
        let e = service(ann).expect_err(ann);
        assert_eq!(e.object, "Service shop/web");
        assert_eq!(e.field, format!("metadata.annotations[\"{key}\"]"), "{ann}");
        assert!(e.message.contains(message), "{ann}: {}", e.message);
    }
}
