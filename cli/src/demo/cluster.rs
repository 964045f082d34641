//! The demo's cluster: two nodes, the sample application's pods on both, its Services —
//! and the Kubernetes YAML the control plane reads (the user may edit it while the demo
//! runs; the control plane reloads it).
//!
//! ```text
//!   node-a                       node-b
//!   load ──> web ──HTTP──────>   api
//!             └───gRPC──────>   catalog-1
//!                          └─>  catalog-2  (fails 20 % of its requests)
//! ```
//!
//! Both catalog replicas are on node-b: the node proxies balance by latency (peak EWMA over
//! two choices, as Linkerd's), which sends a replica of two that is consistently slower —
//! on the far node, or delayed — almost nothing, and the failures it injects would go
//! unseen. `ambit demo app catalog --delay` makes a replica slower, to watch that happen.
//! With two replicas of equal latency, two choices are always both replicas, so the
//! balancer sends nearly every call to the one with the lower EWMA until the other's decays
//! below it: the split swings (measured: from 10/90 to 90/10 over 10 s windows), and with
//! it `stat deploy`'s success rate for catalog, between 80 % and 100 %, while each
//! replica's own rate (`stat pod`) stays 100 % and 80 %. The summary says so.

use std::fmt::Write;
use std::net::Ipv4Addr;

/// The demo's namespace.
pub const NAMESPACE: &str = "demo";
/// The nodes.
pub const NODES: [&str; 2] = ["node-a", "node-b"];
/// The failing catalog replica's share of failed requests.
pub const CATALOG_FAIL_PERCENT: u32 = 20;
/// The load generator's rate (requests per second) and concurrency.
pub const LOAD_RPS: u32 = 20;
const LOAD_CONCURRENCY: u32 = 4;

/// The pods' subnet (10.80.0.0/24, fd80::/64): only inside the demo's namespaces.
pub const ADDRESSING: ambit_topology::Addressing = ambit_topology::Addressing {
    v4: Ipv4Addr::new(10, 80, 0, 0),
    v6: std::net::Ipv6Addr::new(0xfd80, 0, 0, 0, 0, 0, 0, 0),
};

/// A Service of the sample application.
#[derive(Clone, Copy, Debug)]
pub struct Service {
    /// Its name (and its pods' workload).
    pub name: &'static str,
    /// Its ClusterIP.
    pub cluster_ip: Ipv4Addr,
    /// Its port.
    pub port: u16,
    /// The port its pods listen on.
    pub target_port: u16,
    /// `http` or `grpc`.
    pub protocol: &'static str,
}

/// The Services.
pub const SERVICES: [Service; 3] = [
    Service {
        name: "web",
        cluster_ip: Ipv4Addr::new(10, 96, 80, 10),
        port: 80,
        target_port: 8080,
        protocol: "http",
    },
    Service {
        name: "api",
        cluster_ip: Ipv4Addr::new(10, 96, 80, 11),
        port: 80,
        target_port: 8080,
        protocol: "http",
    },
    Service {
        name: "catalog",
        cluster_ip: Ipv4Addr::new(10, 96, 80, 12),
        port: 9090,
        target_port: 9090,
        protocol: "grpc",
    },
];

/// The demo Service `name`.
pub fn service(name: &str) -> &'static Service {
    SERVICES
        .iter()
        .find(|s| s.name == name)
        .unwrap_or(&SERVICES[0])
}

fn url(name: &str) -> String {
    let s = service(name);
    format!("http://{}:{}", s.cluster_ip, s.port)
}

/// A pod of the sample application.
#[derive(Clone, Debug)]
pub struct PodPlan {
    /// Its short name: its network namespace is `ambit-demo-<short>`.
    pub short: &'static str,
    /// Its workload (Deployment), ServiceAccount and app label.
    pub workload: &'static str,
    /// Its ReplicaSet's template hash and its own suffix, as a Deployment names pods.
    pub hash: &'static str,
    /// The suffix of its name.
    pub suffix: &'static str,
    /// Its node.
    pub node: &'static str,
    /// The `ambit demo app` arguments of its one container.
    pub app: Vec<String>,
}

impl PodPlan {
    /// Its Kubernetes name.
    pub fn name(&self) -> String {
        format!("{}-{}-{}", self.workload, self.hash, self.suffix)
    }
}

/// The sample application's pods, in address order (10.80.0.2, .3, …).
pub fn pods() -> Vec<PodPlan> {
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let web = service("web").target_port;
    let api = service("api").target_port;
    let catalog = service("catalog").target_port;
    vec![
        PodPlan {
            short: "load",
            workload: "load",
            hash: "6c4f9d8b7",
            suffix: "q2xlm",
            node: "node-a",
            app: args(&[
                "load",
                "--target",
                &format!("{}/", url("web")),
                "--rps",
                &LOAD_RPS.to_string(),
                "--concurrency",
                &LOAD_CONCURRENCY.to_string(),
            ]),
        },
        PodPlan {
            short: "web",
            workload: "web",
            hash: "5d8f7c9b4",
            suffix: "x7k2p",
            node: "node-a",
            app: args(&[
                "web",
                "--listen",
                &format!("0.0.0.0:{web}"),
                "--api",
                &url("api"),
                "--catalog",
                &url("catalog"),
            ]),
        },
        PodPlan {
            short: "api",
            workload: "api",
            hash: "7b9d6f5c8",
            suffix: "m4n8r",
            node: "node-b",
            app: args(&["api", "--listen", &format!("0.0.0.0:{api}")]),
        },
        PodPlan {
            short: "catalog-1",
            workload: "catalog",
            hash: "84d7b6c9f",
            suffix: "a1b2c",
            node: "node-b",
            app: args(&[
                "catalog",
                "--listen",
                &format!("0.0.0.0:{catalog}"),
                "--name",
                "catalog-84d7b6c9f-a1b2c",
            ]),
        },
        PodPlan {
            short: "catalog-2",
            workload: "catalog",
            hash: "84d7b6c9f",
            suffix: "h5j6k",
            node: "node-b",
            app: args(&[
                "catalog",
                "--listen",
                &format!("0.0.0.0:{catalog}"),
                "--name",
                "catalog-84d7b6c9f-h5j6k",
                "--fail-percent",
                &CATALOG_FAIL_PERCENT.to_string(),
            ]),
        },
    ]
}

/// The cluster's YAML: the namespace, a ServiceAccount and a Pod per pod (owned by its
/// Deployment's ReplicaSet, so that the proxies report its workload), the Services and
/// their EndpointSlices. `netns` is each pod's network namespace path, in `pods()` order.
pub fn yaml(pods: &[PodPlan], net: &[ambit_topology::PodNet]) -> String {
    let mut y = String::from(
        "# The demo's cluster, as the control plane's local backend reads it. Edit it while the\n\
         # demo runs: the control plane reloads it (e.g. annotate a pod with\n\
         # ambit.dev/mesh: disabled and watch `ambit stat pod -n demo`).\n",
    );
    let _ = write!(
        y,
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NAMESPACE}, annotations: {{ambit.dev/mesh: enabled}}}}\n"
    );
    let mut accounts: Vec<&str> = pods.iter().map(|p| p.workload).collect();
    accounts.dedup();
    accounts.sort();
    accounts.dedup();
    for sa in accounts {
        let _ = write!(
            y,
            "---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {sa}, namespace: {NAMESPACE}}}\n"
        );
    }
    for (p, n) in pods.iter().zip(net) {
        let _ = write!(
            y,
            "---
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {NAMESPACE}
  labels: {{app: {w}, pod-template-hash: {hash}}}
  annotations: {{local.ambit.dev/netns: {netns}}}
  ownerReferences:
  - {{apiVersion: apps/v1, kind: ReplicaSet, name: {w}-{hash}, uid: {w}-{hash}, controller: true}}
spec: {{nodeName: {node}, serviceAccountName: {w}, containers: [{{name: {w}, image: ambit-demo}}]}}
status:
  phase: Running
  podIP: {ip}
  podIPs: [{{ip: {ip}}}, {{ip: '{ip6}'}}]
",
            name = p.name(),
            w = p.workload,
            hash = p.hash,
            netns = n.path(),
            node = p.node,
            ip = n.ip,
            ip6 = n.ip6,
        );
    }
    for s in &SERVICES {
        let endpoints: Vec<String> = pods
            .iter()
            .zip(net)
            .filter(|(p, _)| p.workload == s.name)
            .map(|(p, n)| {
                format!(
                    "  - {{addresses: [{}], nodeName: {}, targetRef: {{kind: Pod, name: {}, namespace: {NAMESPACE}}}}}\n",
                    n.ip,
                    p.node,
                    p.name()
                )
            })
            .collect();
        let _ = write!(
            y,
            "---
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: {NAMESPACE}}}
spec:
  clusterIP: {ip}
  selector: {{app: {name}}}
  ports: [{{name: {proto}, port: {port}, targetPort: {target}, appProtocol: {proto}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: {name}-1, namespace: {NAMESPACE}, labels: {{kubernetes.io/service-name: {name}}}}}
addressType: IPv4
ports: [{{name: {proto}, port: {target}}}]
endpoints:
{endpoints}",
            name = s.name,
            ip = s.cluster_ip,
            proto = s.protocol,
            port = s.port,
            target = s.target_port,
            endpoints = endpoints.concat(),
        );
    }
    y.push_str(&policy_and_routes());
    y
}

/// Only web may call api (a Server, its AuthorizationPolicy naming web's identity: from
/// another pod api answers 403), and an HTTPRoute on api's Service with a request timeout,
/// so that the authorization and route metrics (and their dashboards) have series.
fn policy_and_routes() -> String {
    let api = service("api");
    format!(
        "---
# Only web may call api: `ambit demo exec load -- curl -s http://{ip}/` gets 403.
apiVersion: policy.ambit.dev/v1alpha1
kind: Server
metadata: {{name: api, namespace: {NAMESPACE}}}
spec: {{podSelector: {{matchLabels: {{app: api}}}}, port: {target}}}
---
apiVersion: policy.ambit.dev/v1alpha1
kind: MeshTLSAuthentication
metadata: {{name: web, namespace: {NAMESPACE}}}
spec: {{identities: ['spiffe://cluster.local/ns/{NAMESPACE}/sa/web']}}
---
apiVersion: policy.ambit.dev/v1alpha1
kind: AuthorizationPolicy
metadata: {{name: api-from-web, namespace: {NAMESPACE}}}
spec:
  targetRef: {{group: policy.ambit.dev, kind: Server, name: api}}
  requiredAuthenticationRefs: [{{group: policy.ambit.dev, kind: MeshTLSAuthentication, name: web}}]
---
# Requests to api: a route with a timeout (outbound_http_route_* by route_name=\"api\").
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: api, namespace: {NAMESPACE}}}
spec:
  parentRefs: [{{group: core, kind: Service, name: api, port: {port}}}]
  rules: [{{backendRefs: [{{name: api, port: {port}}}], timeouts: {{request: 5s}}}}]
",
        ip = api.cluster_ip,
        target = api.target_port,
        port = api.port,
    )
}
