//! The small cluster the policy-objects target adds the fuzzer's objects to: without
//! meshed pods, Services and ports, a Server or a route would select nothing and render
//! nothing.

use ambit_control::index::{ClusterIndex, KubeObject};
use ambit_control::local::parse_file;
use std::path::Path;

/// The trust domain of every index the targets build.
pub const TRUST_DOMAIN: &str = "cluster.local";
/// The node the base cluster's server pods run on.
pub const NODE: &str = "node-a";
/// The other node (the client pods').
pub const OTHER_NODE: &str = "node-b";

/// A meshed namespace `shop` with a web Deployment's two pods (port `http` 8080, probed on
/// `/ready`), a gRPC server pod, a client pod on the other node, their
/// ServiceAccounts, and Services `web` (80 → http) and `grpc` (9090) with their
/// EndpointSlices.
pub const BASE: &str = r#"apiVersion: v1
kind: Namespace
metadata: {name: shop, annotations: {ambit.dev/mesh: enabled}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: web, namespace: shop}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: client, namespace: shop}
---
apiVersion: v1
kind: Pod
metadata: {name: web-0, namespace: shop, labels: {app: web, tier: front}}
spec:
  nodeName: node-a
  serviceAccountName: web
  containers:
  - name: web
    image: web
    ports: [{name: http, containerPort: 8080}, {name: admin, containerPort: 9990}]
    readinessProbe: {httpGet: {path: /ready, port: http}}
status: {phase: Running, podIP: 10.1.0.5, podIPs: [{ip: 10.1.0.5}]}
---
apiVersion: v1
kind: Pod
metadata: {name: web-1, namespace: shop, labels: {app: web}}
spec:
  nodeName: node-a
  serviceAccountName: web
  containers: [{name: web, image: web, ports: [{name: http, containerPort: 8080}]}]
status: {phase: Running, podIP: 10.1.0.6, podIPs: [{ip: 10.1.0.6}]}
---
apiVersion: v1
kind: Pod
metadata: {name: grpc-0, namespace: shop, labels: {app: grpc}}
spec:
  nodeName: node-a
  serviceAccountName: web
  containers: [{name: grpc, image: grpc, ports: [{name: grpc, containerPort: 9090}]}]
status: {phase: Running, podIP: 10.1.0.7, podIPs: [{ip: 10.1.0.7}]}
---
apiVersion: v1
kind: Pod
metadata: {name: client-0, namespace: shop, labels: {app: client}}
spec: {nodeName: node-b, serviceAccountName: client, containers: [{name: c, image: c}]}
status: {phase: Running, podIP: 10.2.0.5, podIPs: [{ip: 10.2.0.5}]}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 10.96.0.10
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: http}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.1.0.5], nodeName: node-a, targetRef: {kind: Pod, name: web-0, namespace: shop}}
- {addresses: [10.1.0.6], nodeName: node-a, targetRef: {kind: Pod, name: web-1, namespace: shop}}
---
apiVersion: v1
kind: Service
metadata: {name: grpc, namespace: shop}
spec:
  clusterIP: 10.96.0.11
  selector: {app: grpc}
  ports: [{name: grpc, port: 9090, targetPort: 9090, appProtocol: kubernetes.io/h2c}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: grpc-1, namespace: shop, labels: {kubernetes.io/service-name: grpc}}
addressType: IPv4
ports: [{name: grpc, port: 9090}]
endpoints:
- {addresses: [10.1.0.7], nodeName: node-a, targetRef: {kind: Pod, name: grpc-0, namespace: shop}}
"#;

/// The base cluster's objects (it parses: checked by the first input every target run
/// sees).
pub fn base_objects() -> Vec<KubeObject> {
    let mut skipped = 0;
    match parse_file(Path::new("base.yaml"), BASE, &mut skipped) {
        Ok(objects) => objects.into_iter().map(|o| o.object).collect(),
        Err(e) => panic!("the fuzz crate's base cluster does not parse: {e}"),
    }
}

/// An index of the base cluster (as the local backend builds one).
pub fn base_index() -> ClusterIndex {
    match ClusterIndex::new(TRUST_DOMAIN)
        .with_local_netns()
        .with_objects(base_objects())
    {
        Ok(index) => index,
        Err((i, e)) => panic!("the fuzz crate's base cluster object {i} is refused: {e:?}"),
    }
}
