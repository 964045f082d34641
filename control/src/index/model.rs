//! Domain types of the index: what the mesh needs to know of each object.

use ambit_api::WorkloadIdentity;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// A pod, reduced to what the mesh needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodInfo {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// metadata.uid, if set.
    pub uid: Option<String>,
    /// spec.nodeName: where the pod is scheduled, if it is.
    pub node_name: Option<String>,
    /// status.podIPs (or status.podIP).
    pub ips: Vec<IpAddr>,
    /// spec.serviceAccountName, `default` when unset.
    pub service_account: String,
    /// The pod's identity, derived from its ServiceAccount.
    pub identity: WorkloadIdentity,
    /// The pod's own `ambit.dev/mesh` annotation: `Some(true)` enabled, `Some(false)` disabled.
    pub mesh_annotation: Option<bool>,
    /// spec.hostNetwork.
    pub host_network: bool,
    /// status.phase.
    pub phase: Option<String>,
    /// The Ready condition is True.
    pub ready: bool,
    /// All annotations (per-port hints are read from here).
    pub annotations: BTreeMap<String, String>,
    /// metadata.labels.
    pub labels: BTreeMap<String, String>,
    /// The workload the pod belongs to, for metrics: its controller's name (a
    /// Deployment's, for a pod of a ReplicaSet), else the pod's own name.
    pub workload: String,
    /// The workload's kind (`Deployment`, `StatefulSet`, ..., `Pod` without a controller).
    pub workload_kind: String,
    /// Local mode: the pod's network namespace, from the `local.ambit.dev/netns` annotation.
    pub netns: Option<String>,
    /// The kubelet's HTTP probes: port → paths (they stay authorized under any policy).
    pub probes: BTreeMap<u16, Vec<String>>,
    /// Named container ports, name → port (a Server may name its port).
    pub container_ports: BTreeMap<String, u16>,
}

impl PodInfo {
    /// Succeeded or Failed: the pod's containers will not run again.
    pub fn is_terminated(&self) -> bool {
        matches!(self.phase.as_deref(), Some("Succeeded" | "Failed"))
    }
}

/// A namespace's mesh settings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceInfo {
    /// `ambit.dev/mesh: enabled`.
    pub meshed: bool,
    /// All annotations (per-port hints default from here).
    pub annotations: BTreeMap<String, String>,
}

/// Per-port behaviour of a pod, from its annotations or its namespace's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortHints {
    /// Ports whose traffic is proxied as opaque TCP, without protocol detection.
    pub opaque: ambit_api::ports::PortSet,
    /// Inbound ports that bypass the proxy.
    pub skip_inbound: ambit_api::ports::PortSet,
    /// Outbound ports that bypass the proxy.
    pub skip_outbound: ambit_api::ports::PortSet,
}

/// A Service port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    /// The port's name, if any.
    pub name: Option<String>,
    /// The Service port.
    pub port: u16,
    /// TCP, UDP or SCTP.
    pub protocol: String,
}

/// A Service.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceInfo {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// spec.clusterIPs (empty for headless Services).
    pub cluster_ips: Vec<IpAddr>,
    /// spec.ports.
    pub ports: Vec<ServicePort>,
    /// metadata.creationTimestamp.
    pub created: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// The retry, timeout and failure-accrual annotations (checked).
    pub routing: super::route::RouteAnnotations,
}

/// One address of an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointInfo {
    /// The endpoint's address.
    pub address: IpAddr,
    /// conditions.ready (absent means ready, as Kubernetes says).
    pub ready: bool,
    /// The pod behind it (targetRef of kind Pod), as (namespace, name).
    pub pod: Option<(String, String)>,
    /// nodeName.
    pub node_name: Option<String>,
    /// The slice's ports as (name, port).
    pub ports: Vec<(Option<String>, u16)>,
}
