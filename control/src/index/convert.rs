//! Conversion of Kubernetes objects into the index's domain types, with errors that name
//! the object and the field.

use super::model::{EndpointInfo, NamespaceInfo, PodInfo, ServiceInfo, ServicePort};
use super::MESH_ANNOTATION;
use ambit_api::ports::PortSet;
use ambit_api::WorkloadIdentity;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::fmt;
use std::net::IpAddr;

/// The kinds the index holds.
#[derive(Clone, Debug)]
#[allow(clippy::large_enum_variant)]
pub enum KubeObject {
    /// core/v1 Namespace.
    Namespace(Namespace),
    /// core/v1 Pod.
    Pod(Pod),
    /// core/v1 ServiceAccount.
    ServiceAccount(ServiceAccount),
    /// core/v1 Service.
    Service(Service),
    /// discovery.k8s.io/v1 EndpointSlice.
    EndpointSlice(EndpointSlice),
}

/// Kind, namespace and name of an object, for deletes and messages.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectRef {
    /// The kind, e.g. `Pod`.
    pub kind: String,
    /// The namespace, for namespaced kinds.
    pub namespace: Option<String>,
    /// The name.
    pub name: String,
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {}/{}", self.kind, ns, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// A field of an object that the mesh cannot use.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{object}: {field}: {message}")]
pub struct ConvertError {
    /// The object, as far as it could be named.
    pub object: String,
    /// The field path, e.g. `status.podIP`.
    pub field: String,
    /// What is wrong and what is expected.
    pub message: String,
}

impl KubeObject {
    /// The object's kind, namespace and name.
    pub fn object_ref(&self) -> ObjectRef {
        let (kind, meta) = match self {
            KubeObject::Namespace(o) => ("Namespace", &o.metadata),
            KubeObject::Pod(o) => ("Pod", &o.metadata),
            KubeObject::ServiceAccount(o) => ("ServiceAccount", &o.metadata),
            KubeObject::Service(o) => ("Service", &o.metadata),
            KubeObject::EndpointSlice(o) => ("EndpointSlice", &o.metadata),
        };
        ObjectRef {
            kind: kind.to_string(),
            namespace: meta.namespace.clone(),
            name: meta.name.clone().unwrap_or_default(),
        }
    }

    /// Sets `metadata.namespace` to `ns` where a namespaced object has none, as
    /// `kubectl apply` does.
    pub fn default_namespace(&mut self, ns: &str) {
        let meta = match self {
            KubeObject::Namespace(_) => return,
            KubeObject::Pod(o) => &mut o.metadata,
            KubeObject::ServiceAccount(o) => &mut o.metadata,
            KubeObject::Service(o) => &mut o.metadata,
            KubeObject::EndpointSlice(o) => &mut o.metadata,
        };
        meta.namespace.get_or_insert_with(|| ns.to_string());
    }
}

fn err(object: impl fmt::Display, field: &str, message: impl Into<String>) -> ConvertError {
    ConvertError {
        object: object.to_string(),
        field: field.to_string(),
        message: message.into(),
    }
}

pub(super) fn namespaced_name(
    meta: &ObjectMeta,
    kind: &str,
) -> Result<(String, String), ConvertError> {
    let name = meta
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| err(kind, "metadata.name", "required"))?;
    let ns = meta
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| err(format!("{kind} {name}"), "metadata.namespace", "required"))?;
    Ok((ns, name))
}

/// `enabled` → true, `disabled` → false, absent → None; anything else is an error.
fn mesh_annotation(meta: &ObjectMeta, object: &str) -> Result<Option<bool>, ConvertError> {
    match meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(MESH_ANNOTATION))
        .map(String::as_str)
    {
        None => Ok(None),
        Some("enabled") => Ok(Some(true)),
        Some("disabled") => Ok(Some(false)),
        Some(other) => Err(err(
            object,
            &format!("metadata.annotations[\"{MESH_ANNOTATION}\"]"),
            format!("{other:?} is not a valid value; use \"enabled\" or \"disabled\""),
        )),
    }
}

/// Annotation naming ports proxied as opaque TCP.
pub const OPAQUE_PORTS_ANNOTATION: &str = "config.ambit.dev/opaque-ports";
/// Annotation naming inbound ports that bypass the proxy.
pub const SKIP_INBOUND_PORTS_ANNOTATION: &str = "config.ambit.dev/skip-inbound-ports";
/// Annotation naming outbound ports that bypass the proxy.
pub const SKIP_OUTBOUND_PORTS_ANNOTATION: &str = "config.ambit.dev/skip-outbound-ports";
/// Local mode: the pod's network namespace path.
pub const NETNS_ANNOTATION: &str = "local.ambit.dev/netns";

/// Checks the per-port annotations of an object parse.
fn check_port_annotations(meta: &ObjectMeta, object: &str) -> Result<(), ConvertError> {
    let Some(a) = meta.annotations.as_ref() else {
        return Ok(());
    };
    for key in [
        OPAQUE_PORTS_ANNOTATION,
        SKIP_INBOUND_PORTS_ANNOTATION,
        SKIP_OUTBOUND_PORTS_ANNOTATION,
    ] {
        if let Some(v) = a.get(key) {
            v.parse::<PortSet>().map_err(|e| {
                err(
                    object,
                    &format!("metadata.annotations[\"{key}\"]"),
                    format!(
                        "{e}; use comma-separated ports and ranges, e.g. \"25,3306,4000-4100\""
                    ),
                )
            })?;
        }
    }
    Ok(())
}

pub(super) fn namespace(ns: &Namespace) -> Result<(String, NamespaceInfo), ConvertError> {
    let name = ns
        .metadata
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| err("Namespace", "metadata.name", "required"))?;
    let object = format!("Namespace {name}");
    let meshed = mesh_annotation(&ns.metadata, &object)?;
    check_port_annotations(&ns.metadata, &object)?;
    Ok((
        name,
        NamespaceInfo {
            meshed: meshed.unwrap_or(false),
            annotations: ns.metadata.annotations.clone().unwrap_or_default(),
        },
    ))
}

/// The pod's workload name: its controller's, with a ReplicaSet's template hash removed.
fn workload_name(pod: &Pod, name: &str) -> String {
    let owner = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .or_else(|| pod.metadata.owner_references.iter().flatten().next());
    let Some(owner) = owner else {
        return name.to_string();
    };
    let hash = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("pod-template-hash"));
    match (owner.kind.as_str(), hash) {
        ("ReplicaSet", Some(h)) => owner
            .name
            .strip_suffix(&format!("-{h}"))
            .unwrap_or(&owner.name)
            .to_string(),
        _ => owner.name.clone(),
    }
}

fn parse_ip(s: &str, object: &str, field: &str) -> Result<IpAddr, ConvertError> {
    s.parse()
        .map_err(|_| err(object, field, format!("{s:?} is not an IP address")))
}

pub(super) fn pod(pod: &Pod, trust_domain: &str) -> Result<PodInfo, ConvertError> {
    let (namespace, name) = namespaced_name(&pod.metadata, "Pod")?;
    let object = format!("Pod {namespace}/{name}");
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();

    let mut ips = Vec::new();
    if let Some(pod_ips) = status.and_then(|s| s.pod_ips.as_ref()) {
        for (i, ip) in pod_ips.iter().enumerate() {
            ips.push(parse_ip(
                &ip.ip,
                &object,
                &format!("status.podIPs[{i}].ip"),
            )?);
        }
    }
    if let Some(ip) = status.and_then(|s| s.pod_ip.as_deref()) {
        let ip = parse_ip(ip, &object, "status.podIP")?;
        if !ips.contains(&ip) {
            ips.insert(0, ip);
        }
    }

    let service_account = spec
        .and_then(|s| s.service_account_name.clone())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".to_string());
    let identity = WorkloadIdentity::new(trust_domain, &namespace, &service_account)
        .map_err(|e| err(&object, "spec.serviceAccountName", e.to_string()))?;

    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));

    check_port_annotations(&pod.metadata, &object)?;
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    Ok(PodInfo {
        workload: workload_name(pod, &name),
        netns: annotations.get(NETNS_ANNOTATION).cloned(),
        uid: pod.metadata.uid.clone(),
        node_name: spec
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty()),
        ips,
        service_account,
        identity,
        mesh_annotation: mesh_annotation(&pod.metadata, &object)?,
        host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
        phase: status.and_then(|s| s.phase.clone()),
        ready,
        annotations,
        labels: pod.metadata.labels.clone().unwrap_or_default(),
        namespace,
        name,
    })
}

fn port(n: i32, object: &str, field: &str) -> Result<u16, ConvertError> {
    u16::try_from(n)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| err(object, field, format!("{n} is not a port number (1-65535)")))
}

pub(super) fn service(svc: &Service) -> Result<ServiceInfo, ConvertError> {
    let (namespace, name) = namespaced_name(&svc.metadata, "Service")?;
    let object = format!("Service {namespace}/{name}");
    let spec = svc.spec.as_ref();
    let mut cluster_ips = Vec::new();
    let listed = spec
        .and_then(|s| s.cluster_ips.clone())
        .or_else(|| spec.and_then(|s| s.cluster_ip.clone()).map(|ip| vec![ip]))
        .unwrap_or_default();
    for (i, ip) in listed.iter().enumerate() {
        if ip == "None" || ip.is_empty() {
            continue; // headless
        }
        cluster_ips.push(parse_ip(ip, &object, &format!("spec.clusterIPs[{i}]"))?);
    }
    let mut ports = Vec::new();
    for (i, p) in spec
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .enumerate()
    {
        ports.push(ServicePort {
            name: p.name.clone(),
            port: port(p.port, &object, &format!("spec.ports[{i}].port"))?,
            protocol: p.protocol.clone().unwrap_or_else(|| "TCP".to_string()),
        });
    }
    Ok(ServiceInfo {
        namespace,
        name,
        cluster_ips,
        ports,
    })
}

type SliceKey = (String, String);

pub(super) fn endpoint_slice(
    slice: &EndpointSlice,
) -> Result<(SliceKey, String, Vec<EndpointInfo>), ConvertError> {
    let key = namespaced_name(&slice.metadata, "EndpointSlice")?;
    let object = format!("EndpointSlice {}/{}", key.0, key.1);
    let service = slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("kubernetes.io/service-name"))
        .cloned()
        .ok_or_else(|| {
            err(
                &object,
                "metadata.labels[\"kubernetes.io/service-name\"]",
                "required: names the Service the slice belongs to",
            )
        })?;
    let mut ports = Vec::new();
    for (i, p) in slice.ports.iter().flatten().enumerate() {
        if let Some(n) = p.port {
            ports.push((
                p.name.clone(),
                port(n, &object, &format!("ports[{i}].port"))?,
            ));
        }
    }
    let mut endpoints = Vec::new();
    for (i, ep) in slice.endpoints.iter().enumerate() {
        let pod = ep
            .target_ref
            .as_ref()
            .filter(|r| r.kind.as_deref() == Some("Pod"))
            .and_then(|r| {
                let ns = r.namespace.clone().unwrap_or_else(|| key.0.clone());
                r.name.clone().map(|n| (ns, n))
            });
        let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
        for (j, addr) in ep.addresses.iter().enumerate() {
            endpoints.push(EndpointInfo {
                address: parse_ip(addr, &object, &format!("endpoints[{i}].addresses[{j}]"))?,
                ready,
                pod: pod.clone(),
                node_name: ep.node_name.clone(),
                ports: ports.clone(),
            });
        }
    }
    Ok((key, service, endpoints))
}
