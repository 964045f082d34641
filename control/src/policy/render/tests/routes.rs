//! Per-route authorization: the routes attached to a Server, in precedence order, each
//! with the policies that target it.

use super::*;
use crate::policy::{render_routes, ServiceRoutesMap};
use pb::path_match::Kind as Path;

/// An HTTPRoute (or `kind`) of `shop` with these parentRefs and rules.
fn route(kind: &str, name: &str, created: &str, parents: &str, rules: &str) -> String {
    format!(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: {kind}\n\
         metadata: {{name: {name}, namespace: shop, creationTimestamp: '{created}'}}\n\
         spec:\n  parentRefs: {parents}\n  rules: {rules}\n"
    )
}

const WEB_HTTP: &str = "[{group: policy.ambit.dev, kind: Server, name: web-http}]";

/// An AuthorizationPolicy of `shop` targeting the route `kind` `target`, requiring the
/// ServiceAccount `sa` of `shop`.
fn policy_on(name: &str, kind: &str, target: &str, sa: &str) -> String {
    format!(
        "---\napiVersion: policy.ambit.dev/v1alpha1\nkind: AuthorizationPolicy\n\
         metadata: {{name: {name}, namespace: shop}}\n\
         spec:\n  targetRef: {{group: gateway.networking.k8s.io, kind: {kind}, name: {target}}}\n  \
         requiredAuthenticationRefs: [{{kind: ServiceAccount, name: {sa}, namespace: shop}}]\n"
    )
}

/// Each route of a port as "kind name: match [authorization names]".
fn routes(p: &pb::PortPolicy) -> Vec<String> {
    p.routes
        .iter()
        .map(|r| {
            let m = r.r#match.clone().unwrap_or_default();
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
            let authz: Vec<&str> = r.authorizations.iter().map(|a| a.name.as_str()).collect();
            format!("{} {}: {path}{grpc}{} {authz:?}", r.kind, r.name, m.method)
        })
        .collect()
}

fn server_port<'a>(r: &'a NodePolicies, pod: &str, port: u32) -> &'a pb::PortPolicy {
    r[pod]
        .ports
        .iter()
        .find(|p| p.port == port)
        .unwrap_or_else(|| panic!("no port {port} on {pod}"))
}

#[test]
fn a_servers_httproutes_in_precedence_each_with_its_policies_and_the_servers_own_unchanged() {
    let yaml = format!(
        "{CLUSTER}{POLICY}{}{}{}{}{}{}",
        // The older route, with a catch-all rule: its exact path ranks first, its "/" last.
        route(
            "HTTPRoute",
            "login",
            "2026-01-01T00:00:00Z",
            WEB_HTTP,
            "[{matches: [{path: {type: Exact, value: /login}}]}, {}]"
        ),
        route(
            "HTTPRoute",
            "api",
            "2026-02-01T00:00:00Z",
            // A Service parent too: outbound as well, no difference here.
            "[{group: policy.ambit.dev, kind: Server, name: web-http}, {group: core, kind: Service, name: web}]",
            "[{matches: [{path: {type: PathPrefix, value: /api}, method: POST}, {path: {type: PathPrefix, value: /api}}]}]"
        ),
        // Attached to the Service only: not the Server's.
        route(
            "HTTPRoute",
            "outbound-only",
            "2026-01-01T00:00:00Z",
            "[{group: core, kind: Service, name: web}]",
            "[{}]"
        ),
        policy_on("login-from-cli", "HTTPRoute", "login", "cli"),
        policy_on("api-from-batch", "HTTPRoute", "api", "batch"),
        policy_on("api-from-admin", "HTTPRoute", "api", "admin"),
    );
    let d = defaults("all-unauthenticated");
    let rendered = render_nodes(&index(&yaml), &d, |n| n == "node-a");
    assert!(
        rendered.problems.unresolved.is_empty(),
        "{:?}",
        rendered.problems
    );
    let node = &rendered.nodes["node-a"];
    let http = server_port(node, "shop/web", 8080);
    assert_eq!(
        routes(http),
        [
            r#"HTTPRoute login: =/login ["login-from-cli"]"#,
            r#"HTTPRoute api: /api*POST ["api-from-admin", "api-from-batch"]"#,
            r#"HTTPRoute api: /api* ["api-from-admin", "api-from-batch"]"#,
            r#"HTTPRoute login: /* ["login-from-cli"]"#,
        ],
        "exact, then prefix with a method, then prefix; a rule without matches is PathPrefix /; policies in name order"
    );
    let cli = &http.routes[0].authorizations[0];
    assert_eq!(cli.kind, "authorizationpolicy");
    assert_eq!(
        cli.mesh_tls.as_ref().unwrap().identities[0].pattern,
        Some(Pattern::Exact(
            "spiffe://cluster.local/ns/shop/sa/cli".into()
        ))
    );
    // The Server's own authorizations are those it had without routes.
    let without = render(&index(&format!("{CLUSTER}{POLICY}")), "node-a", &d);
    let before = server_port(&without, "shop/web", 8080);
    assert_eq!(http.authorizations, before.authorizations);
    assert!(before.routes.is_empty());
    assert_eq!(
        authz_names(http),
        [
            ("authorizationpolicy", "from-cli"),
            ("authorizationpolicy", "monitoring")
        ],
        "route policies are not the Server's"
    );
    assert!(
        server_port(node, "shop/web", 9901).routes.is_empty(),
        "another Server of the pod has none"
    );
    // A change to an attached route changes the pod's policy (what the publisher diffs).
    let after = render(
        &index(&yaml.replace("value: /login", "value: /signin")),
        "node-a",
        &d,
    );
    let delta = diff(node, &after);
    assert_eq!(
        delta
            .pods
            .iter()
            .map(|p| p.pod.as_str())
            .collect::<Vec<_>>(),
        ["shop/web"]
    );
}

#[test]
fn a_policy_on_a_missing_or_unattached_route_allows_nothing_and_is_counted() {
    let yaml = format!(
        "{CLUSTER}{POLICY}{}{}{}{}{}{}{}",
        route(
            "HTTPRoute",
            "outbound-only",
            "2026-01-01T00:00:00Z",
            "[{group: core, kind: Service, name: web}]",
            "[{}]"
        ),
        route(
            "HTTPRoute",
            "orphan",
            "2026-01-01T00:00:00Z",
            "[{group: policy.ambit.dev, kind: Server, name: gone}]",
            "[{}]"
        ),
        route(
            "HTTPRoute",
            "kept",
            "2026-01-01T00:00:00Z",
            WEB_HTTP,
            "[{}]"
        ),
        policy_on("on-missing", "HTTPRoute", "nowhere", "cli"),
        policy_on("on-outbound", "HTTPRoute", "outbound-only", "cli"),
        policy_on("on-orphan", "HTTPRoute", "orphan", "cli"),
        // Resolves nothing: skipped whole, and the route it targets allows only what the
        // Server allows.
        "---\napiVersion: policy.ambit.dev/v1alpha1\nkind: AuthorizationPolicy\n\
         metadata: {name: on-kept, namespace: shop}\n\
         spec: {targetRef: {group: gateway.networking.k8s.io, kind: HTTPRoute, name: kept}, \
         requiredAuthenticationRefs: [{kind: MeshTLSAuthentication, name: missing}]}\n",
    );
    let idx = index(&yaml);
    let d = defaults("all-unauthenticated");
    let rendered = render_nodes(&idx, &d, |n| n == "node-a");
    let p = &rendered.problems.unresolved;
    assert_eq!(
        p.keys().collect::<Vec<_>>(),
        [
            "shop/on-kept",
            "shop/on-missing",
            "shop/on-orphan",
            "shop/on-outbound"
        ]
    );
    assert!(
        p["shop/on-missing"].contains("HTTPRoute shop/nowhere, which does not exist"),
        "{p:?}"
    );
    assert!(
        p["shop/on-outbound"].contains("attached to no Server"),
        "{p:?}"
    );
    assert!(
        p["shop/on-orphan"].contains("attached to no Server"),
        "{p:?}"
    );
    assert!(
        p["shop/on-kept"].contains("MeshTLSAuthentication shop/missing does not exist"),
        "{p:?}"
    );
    assert_eq!(
        policy_problems(&idx, &d),
        rendered.problems,
        "the same without a stream"
    );
    let http = server_port(&rendered.nodes["node-a"], "shop/web", 8080);
    assert_eq!(routes(http), [r#"HTTPRoute kept: /* []"#]);
    // The route whose Server does not exist is reported with the other route parents.
    let route_problems = render_routes(&idx, &ServiceRoutesMap::new()).problems;
    assert!(
        route_problems["HTTPRoute shop/orphan parent Server shop/gone"].contains("does not exist"),
        "{route_problems:?}"
    );
}

#[test]
fn a_grpcroute_parent_shadows_the_servers_httproutes_and_renders_grpc_matches() {
    let grpc_server = "[{group: policy.ambit.dev, kind: Server, name: grpc}]";
    let api_pod = "---\napiVersion: v1\nkind: Pod\nmetadata: {name: api, namespace: shop, labels: {app: api}}\n\
         spec: {nodeName: node-a, containers: [{name: api, ports: [{name: grpc, containerPort: 9090}]}]}\n";
    let yaml = format!(
        "{CLUSTER}{POLICY}{api_pod}{}{}{}{}",
        route(
            "GRPCRoute",
            "cart",
            "2026-02-01T00:00:00Z",
            grpc_server,
            "[{}, {matches: [{method: {service: shop.Cart}}, {method: {service: shop.Cart, method: Get}}]}]"
        ),
        route(
            "HTTPRoute",
            "web",
            "2026-01-01T00:00:00Z",
            grpc_server,
            "[{}]"
        ),
        policy_on("cart-from-cli", "GRPCRoute", "cart", "cli"),
        policy_on("web-from-cli", "HTTPRoute", "web", "cli"),
    );
    let idx = index(&yaml);
    let rendered = render_nodes(&idx, &defaults("deny"), |n| n == "node-a");
    let grpc = server_port(&rendered.nodes["node-a"], "shop/api", 9090);
    assert_eq!(
        routes(grpc),
        [
            r#"GRPCRoute cart: shop.Cart/Get ["cart-from-cli"]"#,
            r#"GRPCRoute cart: shop.Cart/ ["cart-from-cli"]"#,
            r#"GRPCRoute cart:  ["cart-from-cli"]"#,
        ],
        "service and method, then service; a rule without matches has no match"
    );
    assert!(grpc.routes[2].r#match.is_none());
    assert!(grpc.audit, "the Server's accessPolicy is kept");
    assert!(
        rendered.problems.unresolved["shop/web-from-cli"].contains("attached to no Server"),
        "{:?}",
        rendered.problems
    );
    let route_problems = render_routes(&idx, &ServiceRoutesMap::new()).problems;
    assert!(
        route_problems["HTTPRoute shop/web parent Server shop/grpc"].contains("GRPCRoute"),
        "{route_problems:?}"
    );
}

#[test]
fn a_server_of_another_namespace_takes_no_route() {
    let yaml = format!(
        "{CLUSTER}{POLICY}---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n\
         metadata: {{name: foreign, namespace: open}}\n\
         spec: {{parentRefs: [{{group: policy.ambit.dev, kind: Server, name: web-http, namespace: shop}}], rules: [{{}}]}}\n"
    );
    let idx = index(&yaml);
    let r = render(&idx, "node-a", &defaults("deny"));
    assert!(server_port(&r, "shop/web", 8080).routes.is_empty());
    let route_problems = render_routes(&idx, &ServiceRoutesMap::new()).problems;
    assert!(
        route_problems["HTTPRoute open/foreign parent Server shop/web-http"]
            .contains("another namespace"),
        "{route_problems:?}"
    );
}
