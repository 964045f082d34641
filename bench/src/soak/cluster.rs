//! The cluster as the control plane's local backend reads it: the soak's pods, Services,
//! EndpointSlices, the Server and its AuthorizationPolicy, an HTTPRoute — one YAML file,
//! rewritten whole (a temporary file renamed over it) at each change, as the API server
//! would change its objects.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The meshed namespace everything runs in.
pub const NAMESPACE: &str = "soak";
/// The servers' HTTP/1.1 and HTTP/2 port (the `web` Service's target).
pub const HTTP_PORT: u16 = 8080;
/// The servers' gRPC port.
pub const GRPC_PORT: u16 = 9090;
/// The servers' echo port: one of the default opaque ports, so never parsed.
pub const OPAQUE_PORT: u16 = 5432;

/// `web`: HTTP/1.1 and HTTP/2 on the two server pods.
pub const WEB: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 96, 0, 10), 80);
/// `churn`: HTTP/1.1 on the churn pods, its endpoints changing every few seconds.
pub const CHURN: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 96, 0, 20), 80);
/// `grpc`: unary gRPC on the two server pods.
pub const GRPC: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 96, 0, 30), GRPC_PORT);
/// `extra`: a Service on the churn pods that comes and goes (no client uses it).
pub const EXTRA: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 96, 0, 40), 80);
/// `db`: the echo on the opaque port of the two server pods.
pub const DB: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 96, 0, 50), OPAQUE_PORT);

/// The ServiceAccount of the client pods, which the AuthorizationPolicies allow.
pub const CLIENT_SA: &str = "client";

/// One pod of the cluster.
#[derive(Clone, Debug)]
pub struct Pod {
    /// Its name.
    pub name: String,
    /// The node it is scheduled on.
    pub node: String,
    /// The address its CNI ADD asks for (host-local's `IP` argument).
    pub ip: Ipv4Addr,
    /// Its ServiceAccount.
    pub sa: String,
    /// Its `app` label.
    pub app: &'static str,
    /// Running with its address reported (else Pending, as before its sandbox exists).
    pub running: bool,
}

/// What the cluster holds; [`Cluster::yaml`] renders it.
#[derive(Debug)]
pub struct Cluster {
    /// Every pod: the fixed ones, then the churn pods alive.
    pub pods: Vec<Pod>,
    /// The churn pods in the `churn` Service's endpoints.
    pub churn_endpoints: Vec<String>,
    /// Which AuthorizationPolicy allows the clients to `web` (1 or 2: two objects of
    /// different names and kinds of authentication, the same clients allowed).
    pub policy: u8,
    /// Whether the `churn` Service has its HTTPRoute (a request timeout).
    pub route: bool,
    /// Whether the `extra` Service exists.
    pub extra: bool,
    /// The file it is written to.
    pub file: PathBuf,
    last_write: Option<Instant>,
}

impl Cluster {
    /// The cluster written to `file` (the control plane's cluster directory's file).
    pub fn new(file: PathBuf, pods: Vec<Pod>) -> Self {
        Self {
            pods,
            churn_endpoints: Vec::new(),
            policy: 1,
            route: false,
            extra: false,
            file,
            last_write: None,
        }
    }

    /// Writes the cluster as it is now: a temporary file beside the directory, renamed over
    /// the file, so that the backend never reads half of it; at least 20 ms after the last
    /// write, so that the backend's fingerprint (size and mtime) sees every change.
    pub async fn write(&mut self) -> std::io::Result<()> {
        if let Some(last) = self.last_write {
            let since = last.elapsed();
            if since < Duration::from_millis(20) {
                tokio::time::sleep(Duration::from_millis(20) - since).await;
            }
        }
        let dir = self
            .file
            .parent()
            .and_then(Path::parent)
            .unwrap_or(Path::new("/tmp"));
        let tmp = dir.join("cluster.yaml.tmp");
        std::fs::write(&tmp, self.yaml())?;
        std::fs::rename(&tmp, &self.file)?;
        self.last_write = Some(Instant::now());
        Ok(())
    }

    /// The AuthorizationPolicy in place.
    pub fn policy_name(&self) -> &'static str {
        if self.policy == 1 {
            "web-by-id"
        } else {
            "web-by-sa"
        }
    }

    /// The pod called `name`.
    pub fn pod_mut(&mut self, name: &str) -> Option<&mut Pod> {
        self.pods.iter_mut().find(|p| p.name == name)
    }

    /// The whole cluster as multi-document YAML.
    pub fn yaml(&self) -> String {
        let mut y = format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NAMESPACE}, annotations: {{ambit.dev/mesh: enabled}}}}\n"
        );
        for p in &self.pods {
            let status = if p.running {
                format!("{{podIP: {}, phase: Running}}", p.ip)
            } else {
                "{phase: Pending}".to_string()
            };
            let _ = write!(
                y,
                "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {}, namespace: {NAMESPACE}, labels: {{app: {}}}}}\n\
                 spec: {{nodeName: {}, serviceAccountName: {}, containers: []}}\nstatus: {status}\n",
                p.name, p.app, p.node, p.sa
            );
        }
        let running = |app: &str| -> Vec<&Pod> {
            self.pods
                .iter()
                .filter(|p| p.running && p.app == app)
                .collect()
        };
        let servers = running("srv");
        y += &service("web", WEB, HTTP_PORT, &servers);
        y += &service("grpc", GRPC, GRPC_PORT, &servers);
        y += &service("db", DB, OPAQUE_PORT, &servers);
        let churn: Vec<&Pod> = running("churn")
            .into_iter()
            .filter(|p| self.churn_endpoints.contains(&p.name))
            .collect();
        y += &service("churn", CHURN, HTTP_PORT, &churn);
        if self.extra {
            y += &service("extra", EXTRA, HTTP_PORT, &running("churn"));
        }
        if self.route {
            y += ROUTE;
        }
        y += SERVER;
        y += if self.policy == 1 { POLICY_1 } else { POLICY_2 };
        y
    }
}

/// A Service on `addr` and its EndpointSlice: `pods` on `target`.
fn service(name: &str, addr: SocketAddrV4, target: u16, pods: &[&Pod]) -> String {
    let endpoints: Vec<String> = pods
        .iter()
        .map(|p| {
            format!(
                "{{addresses: ['{}'], targetRef: {{kind: Pod, name: {}, namespace: {NAMESPACE}}}}}",
                p.ip, p.name
            )
        })
        .collect();
    format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {NAMESPACE}}}\n\
         spec: {{clusterIP: {}, ports: [{{name: p, port: {}}}]}}\n\
         ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{name: {name}-1, namespace: {NAMESPACE}, labels: {{kubernetes.io/service-name: {name}}}}}\n\
         addressType: IPv4\nports: [{{name: p, port: {target}}}]\nendpoints: [{}]\n",
        addr.ip(),
        addr.port(),
        endpoints.join(", ")
    )
}

/// The `churn` Service's HTTPRoute: one rule to the Service itself, with a request
/// timeout far above what a request takes.
const ROUTE: &str = "---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: churn, namespace: soak, annotations: {timeout.ambit.dev/request: 10s}}
spec:
  parentRefs: [{group: core, kind: Service, name: churn, port: 80}]
  rules: [{matches: [{path: {type: PathPrefix, value: /}}], backendRefs: [{name: churn, port: 80}]}]
";

/// The server pods' HTTP port: only what an AuthorizationPolicy allows gets in.
const SERVER: &str = "---
apiVersion: policy.ambit.dev/v1alpha1
kind: Server
metadata: {name: web-http, namespace: soak}
spec: {podSelector: {matchLabels: {app: srv}}, port: 8080}
";

/// The clients allowed by their SPIFFE ID.
const POLICY_1: &str = "---
apiVersion: policy.ambit.dev/v1alpha1
kind: MeshTLSAuthentication
metadata: {name: clients-by-id, namespace: soak}
spec: {identities: ['spiffe://cluster.local/ns/soak/sa/client']}
---
apiVersion: policy.ambit.dev/v1alpha1
kind: AuthorizationPolicy
metadata: {name: web-by-id, namespace: soak}
spec:
  targetRef: {group: policy.ambit.dev, kind: Server, name: web-http}
  requiredAuthenticationRefs: [{group: policy.ambit.dev, kind: MeshTLSAuthentication, name: clients-by-id}]
";

/// The same clients allowed by their ServiceAccount.
const POLICY_2: &str = "---
apiVersion: policy.ambit.dev/v1alpha1
kind: MeshTLSAuthentication
metadata: {name: clients-by-sa, namespace: soak}
spec: {identityRefs: [{kind: ServiceAccount, name: client}]}
---
apiVersion: policy.ambit.dev/v1alpha1
kind: AuthorizationPolicy
metadata: {name: web-by-sa, namespace: soak}
spec:
  targetRef: {group: policy.ambit.dev, kind: Server, name: web-http}
  requiredAuthenticationRefs: [{group: policy.ambit.dev, kind: MeshTLSAuthentication, name: clients-by-sa}]
";

/// `addr` as a socket address.
pub fn sock(addr: SocketAddrV4) -> SocketAddr {
    SocketAddr::V4(addr)
}
