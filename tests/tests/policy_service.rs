//! The inbound policy service end to end, without a data path: the real control plane on
//! the local backend, read by a raw tonic `InboundPolicyClient` with node tokens, as a
//! node proxy reads it. A node gets a snapshot of its own meshed pods only — Servers'
//! ports with the AuthorizationPolicies that target them, probe paths, the default policy
//! — then a delta when the YAML changes; another node's token is refused; a policy whose
//! reference does not resolve allows nothing and is counted; a Server's HTTPRoute arrives
//! as its port's routes, each with the policies targeting the route.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use ambit_api::proto::policy::inbound_policy_client::InboundPolicyClient;
use ambit_api::proto::policy::{PodPolicy, Update, WatchRequest};
use ambit_e2e::policy::{service_rules, watch_request};
use ambit_e2e::{metric_sum, ControlPlane, NAMESPACES};
use std::time::Duration;
use tonic::Streaming;

fn pods() -> String {
    let pod = |name: &str, ns: &str, node: &str, labels: &str| {
        format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}, labels: {{{labels}}}}}\n\
             spec:\n  nodeName: {node}\n  serviceAccountName: {name}\n  containers:\n  - name: app\n    \
             ports: [{{name: http, containerPort: 8080}}]\n    readinessProbe: {{httpGet: {{port: http, path: /ready}}}}\n\
             status: {{podIP: 10.1.0.{}, phase: Running}}\n",
            name.len()
        )
    };
    [
        pod("web-0", "shop", "node-a", "app: web"),
        pod("cli", "shop", "node-a", "app: cli"),
        pod("api", "shop", "node-b", "app: web"),
        pod("old", "legacy", "node-a", "app: web"),
    ]
    .concat()
}

const POLICY: &str = "---
apiVersion: policy.ambit.dev/v1alpha1
kind: Server
metadata: {name: web-http, namespace: shop}
spec: {podSelector: {matchLabels: {app: web}}, port: http, proxyProtocol: HTTP/1}
---
apiVersion: policy.ambit.dev/v1alpha1
kind: AuthorizationPolicy
metadata: {name: from-cli, namespace: shop}
spec:
  targetRef: {group: policy.ambit.dev, kind: Server, name: web-http}
  requiredAuthenticationRefs: [{group: policy.ambit.dev, kind: MeshTLSAuthentication, name: cli}]
---
apiVersion: policy.ambit.dev/v1alpha1
kind: MeshTLSAuthentication
metadata: {name: cli, namespace: shop}
spec: {identities: ['spiffe://cluster.local/ns/shop/sa/cli']}
";

fn cluster(policy: &str) -> String {
    format!("{NAMESPACES}{}{policy}", pods())
}

async fn next(stream: &mut Streaming<Update>) -> Update {
    tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("an update within 10 s")
        .unwrap()
        .expect("the stream is open")
}

fn pod<'a>(u: &'a Update, name: &str) -> &'a PodPolicy {
    u.pods
        .iter()
        .find(|p| p.pod == name)
        .unwrap_or_else(|| panic!("{name} in {u:?}"))
}

/// A port as the tests compare it: (port, kind, name, authorization names, probe paths).
type Port = (u32, String, String, Vec<String>, Vec<String>);

/// Each port of `p`.
fn ports(p: &PodPolicy) -> Vec<Port> {
    p.ports
        .iter()
        .map(|p| {
            (
                p.port,
                p.kind.clone(),
                p.name.clone(),
                p.authorizations.iter().map(|a| a.name.clone()).collect(),
                p.probe_paths.clone(),
            )
        })
        .collect()
}

fn port(n: u32, kind: &str, name: &str, authz: &[&str], probes: &[&str]) -> Port {
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
    (n, kind.into(), name.into(), strings(authz), strings(probes))
}

#[tokio::test]
async fn a_node_gets_its_own_meshed_pods_servers_then_a_delta_when_the_yaml_changes() {
    ambit_e2e::init_test_logging();
    let cp = ControlPlane::start(&cluster(POLICY), &["node-a", "node-b"]).await;
    let mut client = InboundPolicyClient::new(cp.channel(&cp.policy_url()));
    let mut stream = client
        .watch(watch_request("node-a", "node-a"))
        .await
        .unwrap()
        .into_inner();

    let snapshot = next(&mut stream).await;
    assert!(snapshot.snapshot && !snapshot.more, "{snapshot:?}");
    let names: Vec<&str> = snapshot.pods.iter().map(|p| p.pod.as_str()).collect();
    assert_eq!(
        names,
        ["shop/cli", "shop/web-0"],
        "node-a's meshed pods: not api (node-b) nor legacy/old"
    );
    let web = pod(&snapshot, "shop/web-0");
    assert_eq!(
        ports(web),
        [port(8080, "server", "web-http", &["from-cli"], &["/ready"])]
    );
    let http = &web.ports[0];
    assert_eq!(http.protocol, "HTTP/1");
    let tls = http.authorizations[0].mesh_tls.as_ref().unwrap();
    assert_eq!(tls.identities.len(), 1);
    let default = web.default.as_ref().unwrap();
    assert_eq!(
        (default.kind.as_str(), default.name.as_str()),
        ("default", "all-unauthenticated")
    );
    // cli is selected by no Server: its probed port carries the default and the path.
    let cli = pod(&snapshot, "shop/cli");
    assert_eq!(
        ports(cli),
        [port(
            8080,
            "default",
            "all-unauthenticated",
            &["all-unauthenticated"],
            &["/ready"]
        )]
    );

    // A NetworkAuthentication added to the policy, and the namespace set to deny: a delta
    // with both pods of node-a, nothing for node-b's stream to care about here.
    let changed = POLICY.replace(
        "name: cli}]",
        "name: cli}, {kind: NetworkAuthentication, name: pods}]",
    ) + "---
apiVersion: policy.ambit.dev/v1alpha1
kind: NetworkAuthentication
metadata: {name: pods, namespace: shop}
spec: {networks: [{cidr: 10.1.0.0/16, except: [10.1.0.3/32]}]}
";
    let with_deny = cluster(&changed).replacen(
        "{ambit.dev/mesh: enabled}",
        "{ambit.dev/mesh: enabled, config.ambit.dev/default-inbound-policy: deny}",
        1,
    );
    cp.set_cluster(&with_deny);
    let delta = next(&mut stream).await;
    assert!(!delta.snapshot && !delta.more, "{delta:?}");
    let web = pod(&delta, "shop/web-0");
    let networks = &web.ports[0].authorizations[0].networks;
    assert_eq!(networks.len(), 1);
    assert_eq!(
        (networks[0].cidr.as_str(), networks[0].except.as_slice()),
        ("10.1.0.0/16", &["10.1.0.3/32".to_string()][..])
    );
    assert_eq!(web.default.as_ref().unwrap().name, "deny");
    assert_eq!(
        ports(pod(&delta, "shop/cli")),
        [port(8080, "default", "deny", &[], &["/ready"])]
    );

    // cli leaves: removed.
    cp.set_cluster(&with_deny.replace(
        "name: cli, namespace: shop, labels",
        "name: cli, namespace: legacy, labels",
    ));
    let delta = next(&mut stream).await;
    assert!(delta.pods.is_empty(), "{delta:?}");
    assert_eq!(delta.removed_pods, ["shop/cli"]);

    let m = cp.metrics().await;
    assert_eq!(metric_sum(&m, "policy_streams", &[]), 1, "{m}");
    assert!(metric_sum(&m, "policy_updates_total", &[]) >= 3, "{m}");
    cp.stop().await;
}

#[tokio::test]
async fn another_nodes_token_is_refused_and_a_policy_that_does_not_resolve_allows_nothing() {
    ambit_e2e::init_test_logging();
    let broken = POLICY.replace(
        "kind: MeshTLSAuthentication, name: cli}",
        "kind: MeshTLSAuthentication, name: clli}",
    );
    let cp = ControlPlane::start(&cluster(&broken), &["node-a", "node-b"]).await;
    let mut client = InboundPolicyClient::new(cp.channel(&cp.policy_url()));

    let refused = client
        .watch(watch_request("node-b", "node-a"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("belongs to node node-a"),
        "{refused:?}"
    );
    let mut anonymous = tonic::Request::new(WatchRequest {
        node: "node-b".into(),
    });
    anonymous
        .metadata_mut()
        .insert("authorization", "Bearer not-a-node-token".parse().unwrap());
    let refused = client.watch(anonymous).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");

    // node-b's own token: its pod, whose Server allows nobody (from-cli is skipped).
    let mut stream = client
        .watch(watch_request("node-b", "node-b"))
        .await
        .unwrap()
        .into_inner();
    let snapshot = next(&mut stream).await;
    let names: Vec<&str> = snapshot.pods.iter().map(|p| p.pod.as_str()).collect();
    assert_eq!(names, ["shop/api"]);
    assert_eq!(
        ports(&snapshot.pods[0]),
        [port(8080, "server", "web-http", &[], &["/ready"])]
    );

    let m = cp.metrics().await;
    assert_eq!(
        metric_sum(&m, "policy_watches_refused_total", &[]),
        2,
        "{m}"
    );
    assert_eq!(
        metric_sum(&m, "policy_authorization_policies_unresolved", &[]),
        1,
        "{m}"
    );

    // Fixed: a delta allows cli again.
    cp.set_cluster(&cluster(POLICY));
    let delta = next(&mut stream).await;
    assert_eq!(
        ports(pod(&delta, "shop/api")),
        [port(8080, "server", "web-http", &["from-cli"], &["/ready"])]
    );
    assert_eq!(
        metric_sum(
            &cp.metrics().await,
            "policy_authorization_policies_unresolved",
            &[]
        ),
        0
    );
    cp.stop().await;
}

const ROUTES: &str = "---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: api, namespace: shop, annotations: {retry.ambit.dev/http: gateway-error, retry.ambit.dev/limit: '2', timeout.ambit.dev/request: 3s}}
spec: {clusterIP: 10.96.0.11, ports: [{port: 8080}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web-split, namespace: shop}
spec:
  parentRefs: [{group: core, kind: Service, name: web, port: 80}]
  rules:
  - backendRefs: [{name: web-v1, port: 80, weight: 90}, {name: web-v2, port: 80, weight: 10}]
    retry: {codes: [503], attempts: 2, backoff: 50ms}
  - matches: [{headers: [{name: X-Canary, value: 'true'}]}]
    backendRefs: [{name: web-v2, port: 80}]
";

#[tokio::test]
async fn routes_reach_every_node_in_precedence_order_then_as_deltas_of_the_changed_services() {
    ambit_e2e::init_test_logging();
    let cp = ControlPlane::start(
        &cluster(&format!("{POLICY}{ROUTES}")),
        &["node-a", "node-b"],
    )
    .await;
    let mut client = InboundPolicyClient::new(cp.channel(&cp.policy_url()));
    let mut stream = client
        .watch(watch_request("node-b", "node-b"))
        .await
        .unwrap()
        .into_inner();

    // Not node-scoped: node-b has no client pod of these Services and gets them all.
    let snapshot = next(&mut stream).await;
    assert!(snapshot.snapshot && !snapshot.more, "{snapshot:?}");
    let names: Vec<&str> = snapshot
        .services
        .iter()
        .map(|s| s.service.as_str())
        .collect();
    assert_eq!(names, ["shop/api", "shop/web"]);
    // The header match ranks before the rule without matches although written after it.
    assert_eq!(
        service_rules(&snapshot, "shop/web"),
        [
            "80 HTTPRoute/web-split [x-canary] [shop/web-v2:80@1]  t0",
            "80 HTTPRoute/web-split [] [shop/web-v1:80@90,shop/web-v2:80@10] retry 2x 503-503 50ms t0",
        ]
    );
    // Annotations only: one default rule with the Service's retry and timeout.
    assert_eq!(
        service_rules(&snapshot, "shop/api"),
        ["8080 default/default [] [] retry 2x 502-504 25ms t3000"]
    );

    // A change to the route: a delta with that Service only.
    let split = ROUTES.replace(
        "weight: 90}, {name: web-v2, port: 80, weight: 10}",
        "weight: 50}, {name: web-v2, port: 80, weight: 50}",
    );
    cp.set_cluster(&cluster(&format!("{POLICY}{split}")));
    let delta = next(&mut stream).await;
    assert!(!delta.snapshot && delta.pods.is_empty(), "{delta:?}");
    let names: Vec<&str> = delta.services.iter().map(|s| s.service.as_str()).collect();
    assert_eq!(names, ["shop/web"]);
    assert!(service_rules(&delta, "shop/web")[1].contains("shop/web-v1:80@50,shop/web-v2:80@50"));

    // A typo in a route: refused by file, object and field; the last good routes stay.
    let typo = split.replace("{name: web-v2, port: 80}]", "{name: web-v2, prot: 80}]");
    cp.set_cluster(&cluster(&format!("{POLICY}{typo}")));
    let dir = cp.cluster_file().parent().unwrap().to_path_buf();
    let e = ambit_control::local::load_index(&dir, "cluster.local").unwrap_err();
    assert_eq!(e.file, cp.cluster_file());
    assert_eq!(e.object.as_deref(), Some("HTTPRoute web-split"));
    assert_eq!(
        e.field.as_deref(),
        Some("spec.rules[1].backendRefs[0].prot")
    );
    let waited = tokio::time::timeout(Duration::from_secs(3), stream.message()).await;
    assert!(waited.is_err(), "no update for a refused file: {waited:?}");
    let m = cp.metrics().await;
    assert_eq!(
        metric_sum(&m, "local_reloads_total", &["failure"]),
        1,
        "{m}"
    );

    // The route deleted: web has no annotation left and is removed; api stays.
    let no_route = ROUTES.split("---\napiVersion: gateway").next().unwrap();
    cp.set_cluster(&cluster(&format!("{POLICY}{no_route}")));
    let delta = next(&mut stream).await;
    assert!(delta.services.is_empty(), "{delta:?}");
    assert_eq!(delta.removed_services, ["shop/web"]);
    let m = cp.metrics().await;
    assert_eq!(metric_sum(&m, "policy_routed_services", &[]), 1, "{m}");
    assert_eq!(metric_sum(&m, "policy_routes_unsupported", &[]), 0, "{m}");
    cp.stop().await;
}

const SERVER_ROUTES: &str = "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web-api, namespace: shop}
spec:
  parentRefs: [{group: policy.ambit.dev, kind: Server, name: web-http}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /api}}, {path: {type: Exact, value: /admin}}]
---
apiVersion: policy.ambit.dev/v1alpha1
kind: AuthorizationPolicy
metadata: {name: api-from-cli, namespace: shop}
spec:
  targetRef: {group: gateway.networking.k8s.io, kind: HTTPRoute, name: web-api}
  requiredAuthenticationRefs: [{kind: ServiceAccount, name: cli}]
---
apiVersion: policy.ambit.dev/v1alpha1
kind: AuthorizationPolicy
metadata: {name: on-no-route, namespace: shop}
spec:
  targetRef: {group: gateway.networking.k8s.io, kind: HTTPRoute, name: missing}
  requiredAuthenticationRefs: []
";

/// Each InboundRoute of a port: `kind/name path [authorization names]`.
fn inbound_routes(p: &PodPolicy, port: u32) -> Vec<String> {
    use ambit_api::proto::policy::path_match::Kind;
    let p = p.ports.iter().find(|p| p.port == port).unwrap();
    p.routes
        .iter()
        .map(|r| {
            let path = match r
                .r#match
                .as_ref()
                .and_then(|m| m.path.as_ref()?.kind.clone())
            {
                Some(Kind::Exact(p)) => format!("={p}"),
                Some(Kind::Prefix(p)) => format!("{p}*"),
                Some(Kind::Regex(p)) => format!("~{p}"),
                None => String::new(),
            };
            let authz: Vec<&str> = r.authorizations.iter().map(|a| a.name.as_str()).collect();
            format!("{}/{} {path} {authz:?}", r.kind, r.name)
        })
        .collect()
}

#[tokio::test]
async fn a_servers_httproute_and_its_policy_reach_the_nodes_snapshot_then_a_delta_when_it_changes()
{
    ambit_e2e::init_test_logging();
    let cp = ControlPlane::start(
        &cluster(&format!("{POLICY}{SERVER_ROUTES}")),
        &["node-a", "node-b"],
    )
    .await;
    let mut client = InboundPolicyClient::new(cp.channel(&cp.policy_url()));
    let mut stream = client
        .watch(watch_request("node-a", "node-a"))
        .await
        .unwrap()
        .into_inner();

    let snapshot = next(&mut stream).await;
    let web = pod(&snapshot, "shop/web-0");
    assert_eq!(
        inbound_routes(web, 8080),
        [
            r#"HTTPRoute/web-api =/admin ["api-from-cli"]"#,
            r#"HTTPRoute/web-api /api* ["api-from-cli"]"#,
        ],
        "one per match, the exact path first although written second"
    );
    let cli = &web.ports[0].routes[0].authorizations[0];
    assert_eq!(
        cli.mesh_tls.as_ref().unwrap().identities[0]
            .pattern
            .clone()
            .unwrap(),
        ambit_api::proto::policy::identity_pattern::Pattern::Exact(
            "spiffe://cluster.local/ns/shop/sa/cli".into()
        )
    );
    // The Server's own authorizations are unchanged; a pod it does not select has none.
    assert_eq!(
        ports(web),
        [port(8080, "server", "web-http", &["from-cli"], &["/ready"])]
    );
    assert!(pod(&snapshot, "shop/cli").ports[0].routes.is_empty());
    // The policy on a route that does not exist allows nothing and is counted.
    let m = cp.metrics().await;
    assert_eq!(
        metric_sum(&m, "policy_authorization_policies_unresolved", &[]),
        1,
        "{m}"
    );

    // A change to the route: a delta with the pod its Server selects on this node only.
    let changed = SERVER_ROUTES.replace("value: /api}", "value: /v2}");
    cp.set_cluster(&cluster(&format!("{POLICY}{changed}")));
    let delta = next(&mut stream).await;
    assert!(!delta.snapshot && delta.services.is_empty(), "{delta:?}");
    let names: Vec<&str> = delta.pods.iter().map(|p| p.pod.as_str()).collect();
    assert_eq!(names, ["shop/web-0"]);
    assert_eq!(
        inbound_routes(&delta.pods[0], 8080),
        [
            r#"HTTPRoute/web-api =/admin ["api-from-cli"]"#,
            r#"HTTPRoute/web-api /v2* ["api-from-cli"]"#,
        ]
    );

    // The route's policy retargeted at a route that does not exist: the route stays with
    // no authorization of its own (only the Server's allow), and the policy is counted.
    let retargeted = changed.replace("name: web-api}", "name: web-apx}");
    cp.set_cluster(&cluster(&format!("{POLICY}{retargeted}")));
    let delta = next(&mut stream).await;
    assert_eq!(
        inbound_routes(pod(&delta, "shop/web-0"), 8080),
        [
            r#"HTTPRoute/web-api =/admin []"#,
            r#"HTTPRoute/web-api /v2* []"#,
        ]
    );
    let m = cp.metrics().await;
    assert_eq!(
        metric_sum(&m, "policy_authorization_policies_unresolved", &[]),
        2,
        "{m}"
    );
    cp.stop().await;
}
