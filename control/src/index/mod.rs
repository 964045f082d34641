//! The control plane's in-memory model of the cluster.
//!
//! Backends (the local YAML directory today, the Kubernetes API later) turn what they read
//! into [`KubeObject`]s and apply them here; the identity, discovery and policy services
//! read the index. The index holds domain types only — no client or transport types — so
//! it is tested by applying objects synchronously.

mod changes;
mod convert;
pub mod crd;
pub mod gateway;
mod kind;
mod model;
pub mod policy;
mod ports;
pub mod route;

pub use changes::Changes;
pub use convert::{
    ConvertError, KubeObject, ObjectRef, FAILURE_ACCRUAL, FA_JITTER_RATIO, FA_MAX_FAILURES,
    FA_MAX_PENALTY, FA_MIN_PENALTY, NETNS_ANNOTATION, OPAQUE_PORTS_ANNOTATION, RETRY_GRPC,
    RETRY_HTTP, RETRY_LIMIT, RETRY_TIMEOUT, SKIP_INBOUND_PORTS_ANNOTATION,
    SKIP_OUTBOUND_PORTS_ANNOTATION, TIMEOUT_IDLE, TIMEOUT_REQUEST, TIMEOUT_RESPONSE,
};
pub use kind::Kind;
pub use model::{EndpointInfo, NamespaceInfo, PodInfo, PortHints, ServiceInfo, ServicePort};

use ambit_api::WorkloadIdentity;
use policy::{AuthorizationPolicyInfo, MeshTlsInfo, NetworkAuthInfo, ServerInfo};
use route::{RouteInfo, RouteKind};
use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};
use tokio::sync::watch;

/// Namespace or pod annotation that opts into (`enabled`) or out of (`disabled`) the mesh.
pub const MESH_ANNOTATION: &str = "ambit.dev/mesh";

/// The cluster as the control plane sees it.
#[derive(Clone, Debug, Default)]
pub struct ClusterIndex {
    trust_domain: String,
    namespaces: BTreeMap<String, NamespaceInfo>,
    pods: BTreeMap<(String, String), PodInfo>,
    service_accounts: BTreeMap<(String, String), ()>,
    services: BTreeMap<(String, String), ServiceInfo>,
    /// EndpointSlice (namespace, name) → (service name, endpoints).
    endpoint_slices: BTreeMap<(String, String), (String, Vec<EndpointInfo>)>,
    /// (namespace, Service) → its EndpointSlices' names: rendering a Service's endpoints
    /// looks up its slices instead of scanning every slice of the cluster.
    slices_by_service: BTreeMap<(String, String), std::collections::BTreeSet<String>>,
    /// Servers by (namespace, name).
    servers: BTreeMap<(String, String), ServerInfo>,
    /// AuthorizationPolicies by (namespace, name).
    authorization_policies: BTreeMap<(String, String), AuthorizationPolicyInfo>,
    /// MeshTLSAuthentications by (namespace, name).
    mesh_tls: BTreeMap<(String, String), MeshTlsInfo>,
    /// NetworkAuthentications by (namespace, name).
    network_auth: BTreeMap<(String, String), NetworkAuthInfo>,
    /// HTTPRoutes and GRPCRoutes by (kind, namespace, name).
    routes: BTreeMap<(RouteKind, String, String), RouteInfo>,
    /// Whether pods may name their network namespace (`local.ambit.dev/netns`): only
    /// the local backend, whose YAML the operator writes. From an API server, where
    /// anyone who can create a pod sets its annotations, the annotation is ignored.
    local_netns: bool,
    /// What changed since discovery last took the changes (`SharedIndex::take_changes`).
    changes: Changes,
}

/// A pod as the mesh sees it: where it runs, whether it is meshed, and its identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    /// The pod.
    pub pod: PodInfo,
    /// Whether the pod is in the mesh (namespace annotation, pod override, not hostNetwork).
    pub meshed: bool,
    /// The pod's identity (from its ServiceAccount).
    pub identity: WorkloadIdentity,
}

impl ClusterIndex {
    /// An empty index for a trust domain.
    pub fn new(trust_domain: impl Into<String>) -> Self {
        Self {
            trust_domain: trust_domain.into(),
            ..Self::default()
        }
    }

    /// Honours the `local.ambit.dev/netns` annotation (the local backend only).
    pub fn with_local_netns(mut self) -> Self {
        self.local_netns = true;
        self
    }

    /// Builds an index from a complete set of objects, failing on the first invalid one
    /// (with its position in `objects`).
    pub fn from_objects(
        trust_domain: &str,
        objects: impl IntoIterator<Item = KubeObject>,
    ) -> Result<Self, (usize, ConvertError)> {
        Self::new(trust_domain).with_objects(objects)
    }

    /// Applies a complete set of objects to this (empty) index, failing on the first
    /// invalid one (with its position in `objects`).
    pub fn with_objects(
        mut self,
        objects: impl IntoIterator<Item = KubeObject>,
    ) -> Result<Self, (usize, ConvertError)> {
        for (i, obj) in objects.into_iter().enumerate() {
            self.apply(obj).map_err(|e| (i, e))?;
        }
        Ok(self)
    }

    /// Adds or replaces one object.
    pub fn apply(&mut self, obj: KubeObject) -> Result<(), ConvertError> {
        match obj {
            KubeObject::Namespace(ns) => {
                let (name, info) = convert::namespace(&ns)?;
                self.changes.namespaces.insert(name.clone());
                self.namespaces.insert(name, info);
            }
            KubeObject::Pod(pod) => {
                let mut pod = convert::pod(&pod, &self.trust_domain)?;
                if !self.local_netns {
                    pod.netns = None;
                }
                let key = (pod.namespace.clone(), pod.name.clone());
                self.changes.pods.insert(key.clone());
                self.pods.insert(key, pod);
            }
            KubeObject::ServiceAccount(sa) => {
                let key = convert::namespaced_name(&sa.metadata, "ServiceAccount")?;
                self.service_accounts.insert(key, ());
            }
            KubeObject::Service(svc) => {
                let svc = convert::service(&svc)?;
                let key = (svc.namespace.clone(), svc.name.clone());
                self.changes.services.insert(key.clone());
                self.services.insert(key, svc);
            }
            KubeObject::EndpointSlice(slice) => {
                let (key, service, endpoints) = convert::endpoint_slice(&slice)?;
                if let Some((old, _)) = self.endpoint_slices.get(&key) {
                    // A slice that moved to another Service changes the one it left.
                    self.changes.services.insert((key.0.clone(), old.clone()));
                }
                self.unlink_slice(&key);
                self.changes
                    .services
                    .insert((key.0.clone(), service.clone()));
                self.slices_by_service
                    .entry((key.0.clone(), service.clone()))
                    .or_default()
                    .insert(key.1.clone());
                self.endpoint_slices.insert(key, (service, endpoints));
            }
            KubeObject::Server(s) => {
                let s = convert::server(&s)?;
                self.changes.namespaces.insert(s.namespace.clone());
                self.servers
                    .insert((s.namespace.clone(), s.name.clone()), s);
            }
            KubeObject::AuthorizationPolicy(p) => {
                let p = convert::authorization_policy(&p, &self.trust_domain)?;
                self.authorization_policies
                    .insert((p.namespace.clone(), p.name.clone()), p);
            }
            KubeObject::MeshTlsAuthentication(m) => {
                let (key, m) = convert::mesh_tls_authentication(&m, &self.trust_domain)?;
                self.mesh_tls.insert(key, m);
            }
            KubeObject::NetworkAuthentication(n) => {
                let (key, n) = convert::network_authentication(&n)?;
                self.network_auth.insert(key, n);
            }
            KubeObject::HttpRoute(r) => self.insert_route(convert::http_route(&r)?),
            KubeObject::GrpcRoute(r) => self.insert_route(convert::grpc_route(&r)?),
        }
        Ok(())
    }

    /// Removes one object; removing what is not there is not an error.
    pub fn delete(&mut self, obj: &ObjectRef) {
        let key = (obj.namespace.clone().unwrap_or_default(), obj.name.clone());
        match obj.kind {
            Kind::Namespace => {
                self.changes.namespaces.insert(obj.name.clone());
                self.namespaces.remove(&obj.name);
            }
            Kind::Pod => {
                self.changes.pods.insert(key.clone());
                self.pods.remove(&key);
            }
            Kind::ServiceAccount => {
                self.service_accounts.remove(&key);
            }
            Kind::Service => {
                self.changes.services.insert(key.clone());
                self.services.remove(&key);
            }
            Kind::EndpointSlice => {
                self.unlink_slice(&key);
                if let Some((svc, _)) = self.endpoint_slices.remove(&key) {
                    self.changes.services.insert((key.0.clone(), svc));
                }
            }
            Kind::Server => {
                self.changes.namespaces.insert(key.0.clone());
                self.servers.remove(&key);
            }
            Kind::AuthorizationPolicy => {
                self.authorization_policies.remove(&key);
            }
            Kind::MeshTlsAuthentication => {
                self.mesh_tls.remove(&key);
            }
            Kind::NetworkAuthentication => {
                self.network_auth.remove(&key);
            }
            Kind::HttpRoute | Kind::GrpcRoute => {
                self.routes.remove(&route_key(obj.kind, key));
            }
        }
    }

    /// Replaces every object of `kind` with `objects` (a watcher's re-list: objects of
    /// that kind deleted meanwhile disappear; other kinds are untouched). Objects that do
    /// not convert, or are of another kind, are skipped and returned; one that was there
    /// before keeps its last good version, as an update that does not convert does.
    pub fn reset(
        &mut self,
        kind: Kind,
        objects: impl IntoIterator<Item = KubeObject>,
    ) -> Vec<ConvertError> {
        // A re-list is rare (a watch that lost its place): discovery renders everything
        // again and sends what differs.
        self.changes.all = true;
        let mut errors = Vec::new();
        let mut listed = std::collections::BTreeSet::new();
        for obj in objects {
            if obj.kind() != kind {
                errors.push(ConvertError {
                    object: obj.object_ref().to_string(),
                    field: "kind".into(),
                    message: format!("expected a {kind} in a re-list of {kind}"),
                });
                continue;
            }
            let r = obj.object_ref();
            listed.insert((r.namespace.unwrap_or_default(), r.name));
            if let Err(e) = self.apply(obj) {
                errors.push(e);
            }
        }
        let keep = |key: &(String, String)| listed.contains(key);
        match kind {
            Kind::Namespace => self
                .namespaces
                .retain(|name, _| keep(&(String::new(), name.clone()))),
            Kind::Pod => self.pods.retain(|k, _| keep(k)),
            Kind::ServiceAccount => self.service_accounts.retain(|k, _| keep(k)),
            Kind::Service => self.services.retain(|k, _| keep(k)),
            Kind::EndpointSlice => {
                let gone: Vec<_> = self
                    .endpoint_slices
                    .keys()
                    .filter(|k| !keep(k))
                    .cloned()
                    .collect();
                for key in gone {
                    self.unlink_slice(&key);
                    self.endpoint_slices.remove(&key);
                }
            }
            Kind::Server => self.servers.retain(|k, _| keep(k)),
            Kind::AuthorizationPolicy => self.authorization_policies.retain(|k, _| keep(k)),
            Kind::MeshTlsAuthentication => self.mesh_tls.retain(|k, _| keep(k)),
            Kind::NetworkAuthentication => self.network_auth.retain(|k, _| keep(k)),
            Kind::HttpRoute | Kind::GrpcRoute => {
                let kind = route_key(kind, Default::default()).0;
                self.routes
                    .retain(|(k, ns, n), _| *k != kind || keep(&(ns.clone(), n.clone())));
            }
        }
        errors
    }

    /// The namespace `name`, if the index has it.
    pub fn namespace(&self, name: &str) -> Option<&NamespaceInfo> {
        self.namespaces.get(name)
    }

    /// The trust domain identities are issued in.
    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    /// Whether `pod` is in the mesh. A pod annotation wins over its namespace's;
    /// hostNetwork pods cannot be meshed (they share the node's network namespace).
    pub fn is_meshed(&self, pod: &PodInfo) -> bool {
        if pod.host_network {
            return false;
        }
        match pod.mesh_annotation {
            Some(enabled) => enabled,
            None => self
                .namespaces
                .get(&pod.namespace)
                .is_some_and(|n| n.meshed),
        }
    }

    /// Every pod that has not terminated, with its mesh status.
    pub fn workloads(&self) -> Vec<Workload> {
        self.pods
            .values()
            .filter(|p| !p.is_terminated())
            .map(|p| self.workload(p))
            .collect()
    }

    /// The pods of `namespace` (terminated ones too), by name.
    pub fn pods_in(&self, namespace: &str) -> impl Iterator<Item = &PodInfo> {
        let ns = namespace.to_string();
        self.pods
            .range((ns.clone(), String::new())..)
            .take_while(move |((n, _), _)| *n == ns)
            .map(|(_, p)| p)
    }

    /// A pod that has not terminated, with its mesh status.
    pub fn live_workload(&self, namespace: &str, name: &str) -> Option<Workload> {
        self.pods
            .get(&(namespace.to_string(), name.to_string()))
            .filter(|p| !p.is_terminated())
            .map(|p| self.workload(p))
    }

    /// Takes what changed since the last call.
    fn take_changes(&mut self) -> Changes {
        std::mem::take(&mut self.changes)
    }

    /// Every Service.
    pub fn services(&self) -> impl Iterator<Item = &ServiceInfo> {
        self.services.values()
    }

    /// Every pod scheduled on `node` that has not terminated, with its mesh status.
    pub fn workloads_on_node(&self, node: &str) -> Vec<Workload> {
        self.pods
            .values()
            .filter(|p| p.node_name.as_deref() == Some(node) && !p.is_terminated())
            .map(|p| self.workload(p))
            .collect()
    }

    /// The meshed pods on `node`.
    pub fn meshed_workloads_on_node(&self, node: &str) -> Vec<Workload> {
        let mut w = self.workloads_on_node(node);
        w.retain(|w| w.meshed);
        w
    }

    /// A pod by namespace and name.
    pub fn workload_by_name(&self, namespace: &str, name: &str) -> Option<Workload> {
        self.pods
            .get(&(namespace.to_string(), name.to_string()))
            .map(|p| self.workload(p))
    }

    /// Whether a non-terminated, meshed pod running as `namespace/service_account` is on
    /// `node`: the CA's node-scoped authorization. Only meshed pods: the proxy serves no
    /// other, so a compromised node gets no identity of its unmeshed or hostNetwork pods
    /// (which another node's meshed pods may share).
    pub fn node_runs_service_account(
        &self,
        node: &str,
        namespace: &str,
        service_account: &str,
    ) -> bool {
        self.pods.values().any(|p| {
            p.node_name.as_deref() == Some(node)
                && p.namespace == namespace
                && p.service_account == service_account
                && !p.is_terminated()
                && self.is_meshed(p)
        })
    }

    /// Whether the ServiceAccount object exists.
    pub fn has_service_account(&self, namespace: &str, name: &str) -> bool {
        self.service_accounts
            .contains_key(&(namespace.to_string(), name.to_string()))
    }

    /// A Service by namespace and name.
    pub fn service(&self, namespace: &str, name: &str) -> Option<&ServiceInfo> {
        self.services
            .get(&(namespace.to_string(), name.to_string()))
    }

    /// The endpoints of a Service, gathered from all its EndpointSlices.
    pub fn service_endpoints(&self, namespace: &str, service: &str) -> Vec<EndpointInfo> {
        let Some(slices) = self
            .slices_by_service
            .get(&(namespace.to_string(), service.to_string()))
        else {
            return Vec::new();
        };
        slices
            .iter()
            .filter_map(|name| {
                self.endpoint_slices
                    .get(&(namespace.to_string(), name.clone()))
            })
            .flat_map(|(_, eps)| eps.iter().cloned())
            .collect()
    }

    /// Every meshed pod that is scheduled and has not terminated, in (namespace, name)
    /// order.
    pub fn meshed_pods(&self) -> impl Iterator<Item = &PodInfo> {
        self.pods
            .values()
            .filter(|p| p.node_name.is_some() && !p.is_terminated() && self.is_meshed(p))
    }

    /// The Servers of `namespace`, by name.
    pub fn servers_in(&self, namespace: &str) -> impl Iterator<Item = &ServerInfo> {
        in_namespace(&self.servers, namespace)
    }

    /// Every Server.
    pub fn servers(&self) -> impl Iterator<Item = &ServerInfo> {
        self.servers.values()
    }

    /// The AuthorizationPolicies of `namespace`, by name.
    pub fn authorization_policies_in(
        &self,
        namespace: &str,
    ) -> impl Iterator<Item = &AuthorizationPolicyInfo> {
        in_namespace(&self.authorization_policies, namespace)
    }

    /// Every AuthorizationPolicy.
    pub fn authorization_policies(&self) -> impl Iterator<Item = &AuthorizationPolicyInfo> {
        self.authorization_policies.values()
    }

    /// A MeshTLSAuthentication by namespace and name.
    pub fn mesh_tls_authentication(&self, namespace: &str, name: &str) -> Option<&MeshTlsInfo> {
        self.mesh_tls
            .get(&(namespace.to_string(), name.to_string()))
    }

    /// A NetworkAuthentication by namespace and name.
    pub fn network_authentication(&self, namespace: &str, name: &str) -> Option<&NetworkAuthInfo> {
        self.network_auth
            .get(&(namespace.to_string(), name.to_string()))
    }

    /// Every HTTPRoute and GRPCRoute, by kind, namespace and name.
    pub fn routes(&self) -> impl Iterator<Item = &RouteInfo> {
        self.routes.values()
    }

    /// An HTTPRoute or GRPCRoute by kind, namespace and name.
    pub fn route(&self, kind: RouteKind, namespace: &str, name: &str) -> Option<&RouteInfo> {
        self.routes
            .get(&(kind, namespace.to_string(), name.to_string()))
    }

    fn insert_route(&mut self, r: RouteInfo) {
        self.routes
            .insert((r.kind, r.namespace.clone(), r.name.clone()), r);
    }

    /// Forgets which Service the slice `key` belonged to.
    fn unlink_slice(&mut self, key: &(String, String)) {
        let Some((service, _)) = self.endpoint_slices.get(key) else {
            return;
        };
        let by = (key.0.clone(), service.clone());
        if let Some(names) = self.slices_by_service.get_mut(&by) {
            names.remove(&key.1);
            if names.is_empty() {
                self.slices_by_service.remove(&by);
            }
        }
    }

    /// Counts of indexed objects by kind, for metrics and logs.
    pub fn counts(&self) -> [(Kind, usize); Kind::ALL.len()] {
        Kind::ALL.map(|k| (k, self.count(k)))
    }

    /// The number of indexed objects of `kind`.
    pub fn count(&self, kind: Kind) -> usize {
        match kind {
            Kind::Namespace => self.namespaces.len(),
            Kind::Pod => self.pods.len(),
            Kind::ServiceAccount => self.service_accounts.len(),
            Kind::Service => self.services.len(),
            Kind::EndpointSlice => self.endpoint_slices.len(),
            Kind::Server => self.servers.len(),
            Kind::AuthorizationPolicy => self.authorization_policies.len(),
            Kind::MeshTlsAuthentication => self.mesh_tls.len(),
            Kind::NetworkAuthentication => self.network_auth.len(),
            Kind::HttpRoute | Kind::GrpcRoute => {
                let kind = route_key(kind, Default::default()).0;
                self.routes.keys().filter(|(k, _, _)| *k == kind).count()
            }
        }
    }

    fn workload(&self, pod: &PodInfo) -> Workload {
        Workload {
            meshed: self.is_meshed(pod),
            identity: pod.identity.clone(),
            pod: pod.clone(),
        }
    }
}

/// The routes map's key of an object of a route `kind`.
fn route_key(kind: Kind, (ns, name): (String, String)) -> (RouteKind, String, String) {
    let kind = if kind == Kind::GrpcRoute {
        RouteKind::Grpc
    } else {
        RouteKind::Http
    };
    (kind, ns, name)
}

/// The values of `map` whose key's namespace is `namespace`, in name order.
fn in_namespace<'a, V>(
    map: &'a BTreeMap<(String, String), V>,
    namespace: &str,
) -> impl Iterator<Item = &'a V> {
    let ns = namespace.to_string();
    map.range((ns.clone(), String::new())..)
        .take_while(move |((n, _), _)| *n == ns)
        .map(|(_, v)| v)
}

/// The index shared between a backend (writer) and the services (readers), with a
/// generation number that changes on every update.
#[derive(Clone, Debug)]
pub struct SharedIndex {
    inner: Arc<RwLock<ClusterIndex>>,
    generation: watch::Sender<u64>,
    /// What changed since discovery last took it (one reader: the discovery catalog).
    changes: Arc<std::sync::Mutex<Changes>>,
}

impl SharedIndex {
    /// Shares `index`.
    pub fn new(index: ClusterIndex) -> Self {
        Self {
            inner: Arc::new(RwLock::new(index)),
            generation: watch::Sender::new(0),
            changes: Arc::new(std::sync::Mutex::new(Changes {
                all: true,
                ..Changes::default()
            })),
        }
    }

    /// What changed since the last call (everything, the first time). Taken by one reader,
    /// the discovery catalog; a change made after it is in the next call's, and rendering
    /// an object again that did not change sends nothing.
    pub fn take_changes(&self) -> Changes {
        std::mem::take(&mut *self.changes.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn record(&self, changes: Changes) {
        self.changes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .merge(changes);
    }

    /// A read view. Hold it briefly: writers wait for it.
    pub fn read(&self) -> RwLockReadGuard<'_, ClusterIndex> {
        self.inner.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Replaces the whole index (a backend's full resync) and notifies watchers.
    pub fn replace(&self, mut index: ClusterIndex) {
        {
            let mut current = self.inner.write().unwrap_or_else(PoisonError::into_inner);
            // What differs is the whole change: what building `index` recorded is every
            // object in it.
            let changes = Changes::between(&current, &index);
            index.take_changes();
            // Taken under the write lock, so that no reader sees the new index before
            // the changes that lead to it are recorded.
            self.record(changes);
            *current = index;
        }
        self.generation.send_modify(|g| *g += 1);
    }

    /// Applies a change and notifies watchers.
    pub fn update<T>(&self, f: impl FnOnce(&mut ClusterIndex) -> T) -> T {
        let out = {
            let mut index = self.inner.write().unwrap_or_else(PoisonError::into_inner);
            let out = f(&mut index);
            self.record(index.take_changes());
            out
        };
        self.generation.send_modify(|g| *g += 1);
        out
    }

    /// Adds or replaces one object and notifies watchers.
    pub fn apply(&self, obj: KubeObject) -> Result<(), ConvertError> {
        self.update(|i| i.apply(obj))
    }

    /// Removes one object and notifies watchers.
    pub fn delete(&self, obj: &ObjectRef) {
        self.update(|i| i.delete(obj))
    }

    /// Replaces every object of `kind` (see [`ClusterIndex::reset`]) and notifies
    /// watchers.
    pub fn reset(
        &self,
        kind: Kind,
        objects: impl IntoIterator<Item = KubeObject>,
    ) -> Vec<ConvertError> {
        self.update(|i| i.reset(kind, objects))
    }

    /// A receiver that sees every later update.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }
}

#[cfg(test)]
mod tests;
