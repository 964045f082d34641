use super::*;

fn objects(yaml: &str) -> Vec<KubeObject> {
    let mut skipped = 0;
    crate::local::parse_file(std::path::Path::new("test.yaml"), yaml, &mut skipped)
        .unwrap()
        .into_iter()
        .map(|o| {
            let mut obj = o.object;
            obj.default_namespace("default");
            obj
        })
        .collect()
}

const CLUSTER: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: shop, annotations: {ambit.dev/mesh: enabled}}
---
apiVersion: v1
kind: Namespace
metadata: {name: legacy}
---
apiVersion: v1
kind: Pod
metadata: {name: web-0, namespace: shop}
spec: {nodeName: node-a, serviceAccountName: web, containers: []}
status: {podIP: 10.1.0.5, phase: Running, conditions: [{type: Ready, status: "True"}]}
---
apiVersion: v1
kind: Pod
metadata: {name: batch, namespace: shop, annotations: {ambit.dev/mesh: disabled}}
spec: {nodeName: node-a, containers: []}
status: {podIP: 10.1.0.6}
---
apiVersion: v1
kind: Pod
metadata: {name: old-app, namespace: legacy}
spec: {nodeName: node-a, serviceAccountName: app, containers: []}
---
apiVersion: v1
kind: Pod
metadata: {name: pilot, namespace: legacy, annotations: {ambit.dev/mesh: enabled}}
spec: {nodeName: node-b, serviceAccountName: pilot, containers: []}
---
apiVersion: v1
kind: Pod
metadata: {name: node-exporter, namespace: shop}
spec: {nodeName: node-a, hostNetwork: true, containers: []}
---
apiVersion: v1
kind: Pod
metadata: {name: job-done, namespace: shop}
spec: {nodeName: node-b, serviceAccountName: job, containers: []}
status: {phase: Succeeded}
"#;

fn index() -> ClusterIndex {
    ClusterIndex::from_objects("cluster.local", objects(CLUSTER)).unwrap()
}

fn names(ws: &[Workload]) -> Vec<String> {
    let mut n: Vec<_> = ws
        .iter()
        .map(|w| format!("{}/{}", w.pod.namespace, w.pod.name))
        .collect();
    n.sort();
    n
}

#[test]
fn pods_on_a_node_and_which_are_meshed() {
    let idx = index();
    assert_eq!(
        names(&idx.workloads_on_node("node-a")),
        [
            "legacy/old-app",
            "shop/batch",
            "shop/node-exporter",
            "shop/web-0"
        ]
    );
    // Namespace annotation meshes web-0; batch opts out; legacy is not meshed;
    // hostNetwork pods cannot be.
    assert_eq!(
        names(&idx.meshed_workloads_on_node("node-a")),
        ["shop/web-0"]
    );
    // A pod annotation opts a single pod in; a finished pod is not on the node any more.
    assert_eq!(
        names(&idx.meshed_workloads_on_node("node-b")),
        ["legacy/pilot"]
    );
}

#[test]
fn identity_comes_from_the_service_account_with_default_fallback() {
    let idx = index();
    let web = idx.workload_by_name("shop", "web-0").unwrap();
    assert_eq!(
        web.identity.to_string(),
        "spiffe://cluster.local/ns/shop/sa/web"
    );
    assert_eq!(
        web.pod.ips,
        ["10.1.0.5".parse::<std::net::IpAddr>().unwrap()]
    );
    assert!(web.pod.ready);
    let batch = idx.workload_by_name("shop", "batch").unwrap();
    assert_eq!(
        batch.identity.to_string(),
        "spiffe://cluster.local/ns/shop/sa/default"
    );
}

#[test]
fn node_scoped_authorization_follows_scheduling() {
    let mut idx = index();
    assert!(idx.node_runs_service_account("node-a", "shop", "web"));
    assert!(!idx.node_runs_service_account("node-b", "shop", "web"));
    assert!(!idx.node_runs_service_account("node-a", "other", "web"));
    // Only meshed pods entitle their node: not legacy's unmeshed app, not an opted-out
    // or hostNetwork pod.
    assert!(!idx.node_runs_service_account("node-a", "legacy", "app"));
    assert!(!idx.node_runs_service_account("node-a", "shop", "default"));
    assert!(idx.node_runs_service_account("node-b", "legacy", "pilot"));
    // Terminated pods no longer entitle their node.
    assert!(!idx.node_runs_service_account("node-b", "shop", "job"));
    // Deleting the pod revokes the entitlement.
    idx.delete(&ObjectRef {
        kind: Kind::Pod,
        namespace: Some("shop".into()),
        name: "web-0".into(),
    });
    assert!(!idx.node_runs_service_account("node-a", "shop", "web"));
}

#[test]
fn applying_a_namespace_annotation_meshes_its_pods() {
    let mut idx = index();
    assert!(idx
        .meshed_workloads_on_node("node-a")
        .iter()
        .all(|w| w.pod.namespace != "legacy"));
    for o in objects("apiVersion: v1\nkind: Namespace\nmetadata: {name: legacy, annotations: {ambit.dev/mesh: enabled}}\n") {
        idx.apply(o).unwrap();
    }
    assert!(idx
        .meshed_workloads_on_node("node-a")
        .iter()
        .any(|w| w.pod.name == "old-app"));
}

#[test]
fn invalid_mesh_annotation_and_pod_ip_name_the_field() {
    let err = ClusterIndex::from_objects("cluster.local", objects(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, annotations: {ambit.dev/mesh: enable}}\nspec: {containers: []}\n",
    )).unwrap_err().1;
    assert_eq!(err.object, "Pod default/p");
    assert_eq!(err.field, "metadata.annotations[\"ambit.dev/mesh\"]");
    assert!(err.message.contains("\"enabled\" or \"disabled\""), "{err}");

    let err = ClusterIndex::from_objects("cluster.local", objects(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: []}\nstatus: {podIP: 10.0.0.300}\n",
    )).unwrap_err().1;
    assert_eq!(err.field, "status.podIP");
}

#[test]
fn services_and_their_endpoints() {
    let idx = ClusterIndex::from_objects(
        "cluster.local",
        objects(
            r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-abc, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [10.1.0.5]
  nodeName: node-a
  targetRef: {kind: Pod, name: web-0}
- addresses: [10.1.0.7]
  conditions: {ready: false}
"#,
        ),
    )
    .unwrap();
    let svc = idx.service("shop", "web").unwrap();
    assert_eq!(
        svc.cluster_ips,
        ["10.96.0.10".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!(svc.ports[0].port, 80);
    let eps = idx.service_endpoints("shop", "web");
    assert_eq!(eps.len(), 2);
    assert_eq!(eps[0].pod, Some(("shop".into(), "web-0".into())));
    assert!(eps[0].ready && !eps[1].ready);
    assert_eq!(eps[0].ports, [(Some("http".into()), 8080)]);
}

#[test]
fn a_relist_replaces_one_kind_and_drops_what_was_deleted_meanwhile() {
    let mut idx = index();
    let pods_before = idx.count(Kind::Pod);
    assert!(pods_before > 1);
    // A re-list of Pods that no longer holds web-0 (deleted while the watch was down),
    // plus one invalid pod, which is skipped and reported.
    let relist = objects(
        r#"
apiVersion: v1
kind: Pod
metadata: {name: batch, namespace: shop}
spec: {nodeName: node-a, containers: []}
status: {podIP: 10.1.0.6}
---
apiVersion: v1
kind: Pod
metadata: {name: broken, namespace: shop}
spec: {nodeName: node-a, containers: []}
status: {podIP: 10.1.0.999}
---
apiVersion: v1
kind: Pod
metadata: {name: pilot, namespace: legacy, annotations: {ambit.dev/mesh: maybe}}
spec: {nodeName: node-b, serviceAccountName: pilot, containers: []}
---
apiVersion: v1
kind: Namespace
metadata: {name: stray}
"#,
    );
    let errors = idx.reset(Kind::Pod, relist);
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert_eq!(errors[0].field, "status.podIP");
    assert!(errors[1].field.contains("ambit.dev/mesh"), "{errors:?}");
    assert!(errors[2].message.contains("re-list of Pod"), "{errors:?}");
    // batch, and pilot as it was before its re-listed version went bad (still meshed).
    assert_eq!(idx.count(Kind::Pod), 2);
    assert!(idx.workload_by_name("legacy", "pilot").unwrap().meshed);
    assert!(idx.workload_by_name("shop", "broken").is_none());
    assert!(idx.workload_by_name("shop", "web-0").is_none());
    assert!(idx.workload_by_name("shop", "batch").is_some());
    // Other kinds are untouched; the stray Namespace was not applied.
    assert_eq!(idx.count(Kind::Namespace), 2);
    assert!(idx.workloads_on_node("node-a")[0].meshed);
}

#[test]
fn kinds_name_themselves_as_the_api_does() {
    for kind in Kind::ALL {
        assert_eq!(Kind::from_name(kind.as_str()), Some(kind));
    }
    assert_eq!(Kind::EndpointSlice.api_version(), "discovery.k8s.io/v1");
    assert!(!Kind::Namespace.is_namespaced() && Kind::Pod.is_namespaced());
    assert_eq!(Kind::from_name("Deployment"), None);
}

#[test]
fn only_the_local_backend_lets_a_pod_name_its_network_namespace() {
    let pod = r#"
apiVersion: v1
kind: Pod
metadata: {name: sneaky, namespace: shop, annotations: {local.ambit.dev/netns: /proc/1/ns/net}}
spec: {nodeName: node-a, containers: []}
"#;
    // From an API server, anyone who can create a pod sets its annotations.
    let api = ClusterIndex::from_objects("cluster.local", objects(pod)).unwrap();
    let w = api.workload_by_name("shop", "sneaky").unwrap();
    assert_eq!(w.pod.netns, None);
    let local = ClusterIndex::new("cluster.local")
        .with_local_netns()
        .with_objects(objects(pod))
        .unwrap();
    let w = local.workload_by_name("shop", "sneaky").unwrap();
    assert_eq!(w.pod.netns.as_deref(), Some("/proc/1/ns/net"));
}

#[test]
fn endpoints_follow_their_slices_through_relabel_delete_and_relist() {
    let slice = |name: &str, service: &str, ip: &str| {
        format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}, namespace: shop, labels: {{kubernetes.io/service-name: {service}}}}}\naddressType: IPv4\nendpoints: [{{addresses: [{ip}]}}]\n"
        )
    };
    let mut idx = ClusterIndex::new("cluster.local");
    for o in objects(&format!(
        "{}---\n{}",
        slice("web-1", "web", "10.1.0.1"),
        slice("web-2", "web", "10.1.0.2")
    )) {
        idx.apply(o).unwrap();
    }
    let ips = |idx: &ClusterIndex, svc: &str| -> Vec<String> {
        idx.service_endpoints("shop", svc)
            .iter()
            .map(|e| e.address.to_string())
            .collect()
    };
    assert_eq!(ips(&idx, "web"), ["10.1.0.1", "10.1.0.2"]);
    // A slice moved to another Service leaves the first.
    idx.apply(objects(&slice("web-2", "api", "10.1.0.2")).remove(0))
        .unwrap();
    assert_eq!(ips(&idx, "web"), ["10.1.0.1"]);
    assert_eq!(ips(&idx, "api"), ["10.1.0.2"]);
    idx.delete(
        &objects(&slice("web-1", "web", "10.1.0.1"))
            .remove(0)
            .object_ref(),
    );
    assert!(ips(&idx, "web").is_empty());
    // A re-list without web-2 drops it from api.
    let errors = idx.reset(
        Kind::EndpointSlice,
        objects(&slice("web-3", "web", "10.1.0.3")),
    );
    assert!(errors.is_empty());
    assert!(ips(&idx, "api").is_empty());
    assert_eq!(ips(&idx, "web"), ["10.1.0.3"]);
}

#[test]
fn a_servers_opaque_protocol_makes_its_port_opaque_for_clients() {
    let yaml = r#"
apiVersion: v1
kind: Namespace
metadata: {name: shop, annotations: {ambit.dev/mesh: enabled}}
---
apiVersion: v1
kind: Pod
metadata: {name: db-0, namespace: shop, labels: {app: db}, annotations: {config.ambit.dev/opaque-ports: "7000"}}
spec: {nodeName: node-a, serviceAccountName: db, containers: [{name: db, ports: [{name: sql, containerPort: 5433}, {name: admin, containerPort: 8080}]}]}
status: {podIP: 10.1.0.9, phase: Running}
---
apiVersion: policy.ambit.dev/v1alpha1
kind: Server
metadata: {name: db-sql, namespace: shop}
spec: {podSelector: {matchLabels: {app: db}}, port: sql, proxyProtocol: opaque}
---
apiVersion: policy.ambit.dev/v1alpha1
kind: Server
metadata: {name: db-admin, namespace: shop}
spec: {podSelector: {matchLabels: {app: db}}, port: 8080, proxyProtocol: HTTP/1}
"#;
    let index = ClusterIndex::from_objects("cluster.local", objects(yaml)).unwrap();
    let pod = index
        .workloads()
        .into_iter()
        .find(|w| w.pod.name == "db-0")
        .unwrap()
        .pod;
    let hints = index.port_hints(&pod);
    // The annotation's port and the opaque Server's named port; not the HTTP Server's.
    assert!(hints.opaque.contains(7000));
    assert!(hints.opaque.contains(5433));
    assert!(!hints.opaque.contains(8080));
    // Without the Server, the annotation alone.
    let without = ClusterIndex::from_objects(
        "cluster.local",
        objects(&yaml.replace("proxyProtocol: opaque", "proxyProtocol: unknown")),
    )
    .unwrap();
    assert!(!without.port_hints(&pod).opaque.contains(5433));
}
