use super::*;
use crate::index::KubeObject;
use crate::policy::{delta_chunks, diff, snapshot_chunks};
use pb::identity_pattern::Pattern;

mod routes;

fn objects(yaml: &str) -> Vec<KubeObject> {
    let mut skipped = 0;
    crate::local::parse_file(std::path::Path::new("test.yaml"), yaml, &mut skipped)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .map(|o| o.object)
        .collect()
}

fn index(yaml: &str) -> ClusterIndex {
    ClusterIndex::from_objects("cluster.local", objects(yaml))
        .unwrap_or_else(|(_, e)| panic!("{e}"))
}

fn defaults(policy: &str) -> Defaults {
    Defaults {
        policy: policy.into(),
        cluster_networks: vec!["10.0.0.0/8".into(), "fd00::/8".into()],
    }
}

const CLUSTER: &str = "
apiVersion: v1
kind: Namespace
metadata: {name: shop, annotations: {ambit.dev/mesh: enabled, config.ambit.dev/default-inbound-policy: all-authenticated}}
---
apiVersion: v1
kind: Namespace
metadata: {name: open, annotations: {ambit.dev/mesh: enabled}}
---
apiVersion: v1
kind: Namespace
metadata: {name: legacy}
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: shop, labels: {app: web}}
spec:
  nodeName: node-a
  containers:
  - name: web
    ports: [{name: http, containerPort: 8080}, {name: admin, containerPort: 9901}]
    readinessProbe: {httpGet: {port: admin, path: '/ready?verbose=1'}}
    livenessProbe: {httpGet: {port: 8080}}
status: {podIP: 10.1.0.5}
---
apiVersion: v1
kind: Pod
metadata: {name: locked, namespace: shop, annotations: {config.ambit.dev/default-inbound-policy: deny}}
spec: {nodeName: node-a, containers: []}
status: {podIP: 10.1.0.6}
---
apiVersion: v1
kind: Pod
metadata: {name: anyone, namespace: open}
spec: {nodeName: node-a, containers: []}
status: {podIP: 10.1.0.7}
---
apiVersion: v1
kind: Pod
metadata: {name: elsewhere, namespace: open}
spec: {nodeName: node-b, containers: []}
status: {podIP: 10.1.0.8}
---
apiVersion: v1
kind: Pod
metadata: {name: old, namespace: legacy}
spec: {nodeName: node-a, containers: []}
status: {podIP: 10.1.0.9}
---
apiVersion: v1
kind: Pod
metadata: {name: done, namespace: open}
spec: {nodeName: node-a, containers: []}
status: {podIP: 10.1.0.10, phase: Succeeded}
";

fn ports(p: &pb::PodPolicy) -> Vec<(u32, &str, &str, Vec<String>)> {
    p.ports
        .iter()
        .map(|p| {
            (
                p.port,
                p.kind.as_str(),
                p.name.as_str(),
                p.probe_paths.clone(),
            )
        })
        .collect()
}

#[test]
fn only_the_nodes_meshed_pods_pod_over_namespace_over_cluster_and_probes_per_port() {
    let r = render(
        &index(CLUSTER),
        "node-a",
        &defaults("cluster-unauthenticated"),
    );
    assert_eq!(
        r.keys().collect::<Vec<_>>(),
        ["open/anyone", "shop/locked", "shop/web"],
        "not another node's, an unmeshed or a terminated pod"
    );
    let name = |k: &str| r[k].default.as_ref().unwrap().name.clone();
    assert_eq!(name("shop/web"), "all-authenticated", "the namespace's");
    assert_eq!(name("shop/locked"), "deny", "the pod's own");
    assert_eq!(
        name("open/anyone"),
        "cluster-unauthenticated",
        "the cluster's"
    );
    let web = &r["shop/web"];
    assert_eq!(
        ports(web),
        [
            (8080, "default", "all-authenticated", vec!["/".to_string()]),
            (9901, "default", "all-authenticated", vec!["/ready".into()])
        ]
    );
    assert_eq!(
        web.ports[0].authorizations,
        web.default.as_ref().unwrap().authorizations
    );
    assert!(web.default.as_ref().unwrap().probe_paths.is_empty());
    assert!(render(&index(CLUSTER), "node-c", &defaults("deny")).is_empty());
}

#[test]
fn each_default_policy_renders_its_synthetic_authorizations() {
    for name in DEFAULT_POLICIES {
        let r = render(&index(CLUSTER), "node-b", &defaults(name));
        let d = r["open/elsewhere"].default.clone().unwrap();
        assert_eq!(
            (d.port, d.kind.as_str(), d.name.as_str()),
            (0, "default", name)
        );
        let shape: Vec<(bool, usize)> = d
            .authorizations
            .iter()
            .map(|a| {
                assert_eq!((a.kind.as_str(), a.name.as_str()), ("default", name));
                (a.mesh_tls.as_ref().is_some_and(|m| m.any), a.networks.len())
            })
            .collect();
        let want: &[(bool, usize)] = match name {
            "all-unauthenticated" => &[(false, 0)],
            "all-authenticated" => &[(true, 0)],
            "cluster-unauthenticated" => &[(false, 2)],
            "cluster-authenticated" => &[(true, 2)],
            _ => &[],
        };
        assert_eq!(shape, want, "{name}");
        assert_eq!(d.audit, name == "audit", "{name}");
    }
}

const POLICY: &str = "
---
apiVersion: policy.ambit.dev/v1alpha1
kind: Server
metadata: {name: web-http, namespace: shop}
spec:
  podSelector: {matchExpressions: [{key: app, operator: In, values: [web, api]}]}
  port: http
  proxyProtocol: HTTP/1
---
apiVersion: policy.ambit.dev/v1alpha1
kind: Server
metadata: {name: web-admin, namespace: shop}
spec: {podSelector: {matchLabels: {app: web}}, port: 9901, accessPolicy: cluster-authenticated}
---
apiVersion: policy.ambit.dev/v1alpha1
kind: Server
metadata: {name: grpc, namespace: shop}
spec: {podSelector: {}, port: grpc, accessPolicy: audit}
---
apiVersion: policy.ambit.dev/v1alpha1
kind: AuthorizationPolicy
metadata: {name: from-cli, namespace: shop}
spec:
  targetRef: {group: policy.ambit.dev, kind: Server, name: web-http}
  requiredAuthenticationRefs:
  - {group: policy.ambit.dev, kind: MeshTLSAuthentication, name: clients}
  - {kind: NetworkAuthentication, name: office, namespace: infra}
---
apiVersion: policy.ambit.dev/v1alpha1
kind: AuthorizationPolicy
metadata: {name: monitoring, namespace: shop}
spec:
  targetRef: {kind: Namespace, name: shop}
  requiredAuthenticationRefs: [{kind: ServiceAccount, name: prometheus, namespace: monitoring}]
---
apiVersion: policy.ambit.dev/v1alpha1
kind: MeshTLSAuthentication
metadata: {name: clients, namespace: shop}
spec:
  identities: ['spiffe://cluster.local/ns/shop/sa/cli']
  identityRefs: [{kind: Namespace, name: batch}]
---
apiVersion: policy.ambit.dev/v1alpha1
kind: NetworkAuthentication
metadata: {name: office, namespace: infra}
spec: {networks: [{cidr: 10.0.0.0/8, except: [10.9.0.0/16]}]}
";

fn authz_names(p: &pb::PortPolicy) -> Vec<(&str, &str)> {
    p.authorizations
        .iter()
        .map(|a| (a.kind.as_str(), a.name.as_str()))
        .collect()
}

#[test]
fn servers_select_ports_by_number_and_name_with_the_policies_that_target_them() {
    let idx = index(&format!("{CLUSTER}{POLICY}"));
    let r = render(&idx, "node-a", &defaults("all-unauthenticated"));
    let web = &r["shop/web"];
    assert_eq!(
        ports(web),
        [
            (8080, "server", "web-http", vec!["/".to_string()]),
            (9901, "server", "web-admin", vec!["/ready".into()])
        ],
        "the named port resolved; the probes ride on the Servers' ports; grpc names no port of web"
    );
    let http = &web.ports[0];
    assert_eq!((http.protocol.as_str(), http.audit), ("HTTP/1", false));
    assert_eq!(
        authz_names(http),
        [
            ("authorizationpolicy", "from-cli"),
            ("authorizationpolicy", "monitoring")
        ],
        "deny: only the policies, in name order"
    );
    let cli = &http.authorizations[0];
    let ids: Vec<_> = cli
        .mesh_tls
        .as_ref()
        .unwrap()
        .identities
        .iter()
        .map(|i| i.pattern.clone().unwrap())
        .collect();
    assert_eq!(
        ids,
        [
            Pattern::Exact("spiffe://cluster.local/ns/shop/sa/cli".into()),
            Pattern::Prefix("spiffe://cluster.local/ns/batch/sa/".into())
        ]
    );
    assert_eq!(
        cli.networks,
        [pb::Network {
            cidr: "10.0.0.0/8".into(),
            except: vec!["10.9.0.0/16".into()]
        }]
    );
    let mon = &http.authorizations[1];
    assert!(mon.networks.is_empty());
    assert_eq!(
        mon.mesh_tls.as_ref().unwrap().identities[0].pattern,
        Some(Pattern::Exact(
            "spiffe://cluster.local/ns/monitoring/sa/prometheus".into()
        ))
    );
    // The accessPolicy's authorizations follow the policies'.
    assert_eq!(
        authz_names(&web.ports[1]),
        [
            ("authorizationpolicy", "monitoring"),
            ("default", "cluster-authenticated")
        ]
    );
    assert!(
        web.ports[1].authorizations[1]
            .mesh_tls
            .as_ref()
            .unwrap()
            .any
    );
    // Every other port keeps the default policy.
    assert_eq!(web.default.as_ref().unwrap().name, "all-authenticated");
    // A pod without the labels is not selected (web-admin), but the empty selector of
    // grpc selects it — on no port, since it has no port named grpc.
    assert!(r["shop/locked"].ports.is_empty());
}

#[test]
fn audit_and_a_named_port_on_a_pod_that_has_it() {
    let yaml = format!(
        "{CLUSTER}{POLICY}---\napiVersion: v1\nkind: Pod\nmetadata: {{name: api, namespace: shop, labels: {{app: api}}}}\n\
         spec: {{nodeName: node-a, containers: [{{name: api, ports: [{{name: grpc, containerPort: 9090}}, {{name: http, containerPort: 8081}}]}}]}}\n"
    );
    let r = render(&index(&yaml), "node-a", &defaults("deny"));
    let api = &r["shop/api"];
    assert_eq!(
        ports(api),
        [
            (8081, "server", "web-http", vec![]),
            (9090, "server", "grpc", vec![])
        ]
    );
    let grpc = &api.ports[1];
    assert!(grpc.audit);
    assert_eq!(authz_names(grpc), [("authorizationpolicy", "monitoring")]);
}

#[test]
fn a_policy_whose_refs_do_not_resolve_is_skipped_and_reported_never_widened() {
    let broken = POLICY
        .replace("kind: NetworkAuthentication, name: office", "kind: NetworkAuthentication, name: ofice")
        .replace(
            "requiredAuthenticationRefs: [{kind: ServiceAccount, name: prometheus, namespace: monitoring}]",
            "requiredAuthenticationRefs: [{kind: ServiceAccount, name: prometheus, namespace: monitoring}, {kind: MeshTLSAuthentication, name: clients}]",
        );
    let extra = "---
apiVersion: policy.ambit.dev/v1alpha1
kind: AuthorizationPolicy
metadata: {name: nobody, namespace: shop}
spec: {targetRef: {kind: Server, name: web-http}, requiredAuthenticationRefs: [{kind: MeshTLSAuthentication, name: empty}]}
---
apiVersion: policy.ambit.dev/v1alpha1
kind: MeshTLSAuthentication
metadata: {name: empty, namespace: shop}
spec: {identities: []}
---
apiVersion: policy.ambit.dev/v1alpha1
kind: AuthorizationPolicy
metadata: {name: by-route, namespace: shop}
spec: {targetRef: {group: gateway.networking.k8s.io, kind: HTTPRoute, name: r}, requiredAuthenticationRefs: []}
";
    let idx = index(&format!("{CLUSTER}{broken}{extra}"));
    let d = defaults("all-unauthenticated");
    let rendered = render_nodes(&idx, &d, |n| n == "node-a");
    let web = &rendered.nodes["node-a"]["shop/web"];
    assert!(
        web.ports[0].authorizations.is_empty(),
        "web-http denies everyone: {:?}",
        web.ports[0]
    );
    assert_eq!(
        authz_names(&web.ports[1]),
        [("default", "cluster-authenticated")]
    );
    let p = &rendered.problems;
    assert_eq!(
        p.unresolved.keys().collect::<Vec<_>>(),
        [
            "shop/by-route",
            "shop/from-cli",
            "shop/monitoring",
            "shop/nobody"
        ]
    );
    assert!(
        p.unresolved["shop/from-cli"].contains("NetworkAuthentication infra/ofice does not exist")
    );
    assert!(
        p.unresolved["shop/monitoring"].contains("one identity"),
        "{p:?}"
    );
    assert!(
        p.unresolved["shop/nobody"].contains("names no identity"),
        "{p:?}"
    );
    assert!(
        p.unresolved["shop/by-route"].contains("HTTPRoute shop/r, which does not exist"),
        "{p:?}"
    );
    assert!(p.conflicts.is_empty());
}

#[test]
fn the_oldest_server_wins_a_pod_port_and_the_other_is_reported() {
    let server = |name: &str, created: &str| {
        format!(
            "---\napiVersion: policy.ambit.dev/v1alpha1\nkind: Server\nmetadata: {{name: {name}, namespace: shop{created}}}\n\
             spec: {{podSelector: {{matchLabels: {{app: web}}}}, port: 8080}}\n"
        )
    };
    let yaml = format!(
        "{CLUSTER}{}{}{}",
        server("a-new", ", creationTimestamp: '2026-03-01T00:00:00Z'"),
        server("z-old", ", creationTimestamp: '2026-01-01T00:00:00Z'"),
        server("m-new", ", creationTimestamp: '2026-03-01T00:00:00Z'"),
    );
    let rendered = render_nodes(&index(&yaml), &defaults("deny"), |_| true);
    assert_eq!(rendered.nodes["node-a"]["shop/web"].ports[0].name, "z-old");
    assert_eq!(
        rendered.problems.conflicts.keys().collect::<Vec<_>>(),
        ["shop/a-new", "shop/m-new"]
    );
    assert!(rendered.problems.conflicts["shop/a-new"].contains("Server z-old"));
    // Without timestamps (local YAML), by name.
    let yaml = format!("{CLUSTER}{}{}", server("b", ""), server("a", ""));
    let r = render(&index(&yaml), "node-a", &defaults("deny"));
    assert_eq!(r["shop/web"].ports[0].name, "a");
}

#[test]
fn deltas_and_chunks_bounded_by_count_and_bytes() {
    let d = defaults("all-unauthenticated");
    let before = render(&index(CLUSTER), "node-a", &d);
    let changed = CLUSTER.replace(
        "default-inbound-policy: deny}",
        "default-inbound-policy: audit}",
    );
    let after = render(&index(&changed), "node-a", &d);
    let delta = diff(&before, &after);
    assert_eq!(delta.pods.len(), 1);
    assert_eq!(delta.pods[0].pod, "shop/locked");
    assert!(delta.pods[0].default.as_ref().unwrap().audit);
    let gone = diff(&after, &BTreeMap::new());
    assert_eq!(gone.removed_pods.len(), 3);
    let chunks = snapshot_chunks(&after, &Default::default(), 2, 1 << 20);
    assert_eq!(chunks.len(), 2);
    assert!(chunks[0].snapshot && chunks[0].more && !chunks[1].snapshot && !chunks[1].more);
    // One byte allowed: one pod a chunk (a pod larger than the bound goes alone).
    let chunks = snapshot_chunks(&after, &Default::default(), 256, 1);
    assert_eq!(
        chunks.iter().map(|c| c.pods.len()).collect::<Vec<_>>(),
        [1, 1, 1]
    );
    let empty = snapshot_chunks(&BTreeMap::new(), &Default::default(), 2, 1 << 20);
    assert!(empty.len() == 1 && empty[0].snapshot && !empty[0].more);
    let mut both = diff(&before, &after);
    both.pods = after.values().cloned().collect();
    both.removed_pods = vec!["shop/gone".into()];
    let chunks = delta_chunks(both, 2, 1 << 20);
    assert_eq!(chunks.len(), 2);
    assert!(!chunks[0].snapshot && chunks[0].removed_pods.is_empty());
    assert_eq!(chunks[1].removed_pods, ["shop/gone"]);
}

#[test]
fn a_policy_annotation_typo_is_refused_by_field() {
    let bad = CLUSTER.replace(
        "default-inbound-policy: deny}",
        "default-inbound-policy: dney}",
    );
    let (_, e) = ClusterIndex::from_objects("cluster.local", objects(&bad)).unwrap_err();
    assert!(e.object.contains("shop/locked"), "{e}");
    assert!(
        e.field.contains("config.ambit.dev/default-inbound-policy"),
        "{e}"
    );
    assert!(
        e.message.contains("\"dney\"") && e.message.contains("all-unauthenticated"),
        "{e}"
    );
}
