//! The inbound policy service end to end, without a data path: the real control plane on
//! the local backend, read by a raw tonic `InboundPolicyClient` with node tokens, as a
//! node proxy reads it. A node gets a snapshot of its own meshed pods only — Servers'
//! ports with the AuthorizationPolicies that target them, probe paths, the default policy
//! — then a delta when the YAML changes; another node's token is refused; a policy whose
//! reference does not resolve allows nothing and is counted.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use ambit_api::proto::policy::inbound_policy_client::InboundPolicyClient;
use ambit_api::proto::policy::{PodPolicy, Update, WatchRequest};
use ambit_e2e::{metric_sum, node_token, ControlPlane, NAMESPACES};
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

fn watch(node: &str, token_of: &str) -> tonic::Request<WatchRequest> {
    let mut req = tonic::Request::new(WatchRequest { node: node.into() });
    req.metadata_mut().insert(
        "authorization",
        format!("Bearer {}", node_token(token_of)).parse().unwrap(),
    );
    req
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
        .watch(watch("node-a", "node-a"))
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

    let refused = client.watch(watch("node-b", "node-a")).await.unwrap_err();
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
        .watch(watch("node-b", "node-b"))
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
