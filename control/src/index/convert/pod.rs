//! Pod: where it runs, its addresses, identity and mesh annotations.

use super::{
    check_policy_annotation, check_port_annotations, err, mesh_annotation, namespaced_name,
    parse_ip, ConvertError, NETNS_ANNOTATION,
};
use crate::index::model::PodInfo;
use ambit_api::WorkloadIdentity;
use k8s_openapi::api::core::v1::Pod;

/// The pod's workload and its kind: its controller's, a ReplicaSet with a
/// `pod-template-hash` being its Deployment's (the hash removed from the name); the pod
/// itself (`Pod`) without one.
fn workload(pod: &Pod, name: &str) -> (String, String) {
    let owner = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .or_else(|| pod.metadata.owner_references.iter().flatten().next());
    let Some(owner) = owner else {
        return (name.to_string(), "Pod".to_string());
    };
    let hash = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("pod-template-hash"));
    match (owner.kind.as_str(), hash) {
        ("ReplicaSet", Some(h)) => match owner.name.strip_suffix(&format!("-{h}")) {
            Some(deployment) => (deployment.to_string(), "Deployment".to_string()),
            None => (owner.name.clone(), owner.kind.clone()),
        },
        _ => (owner.name.clone(), owner.kind.clone()),
    }
}

/// The pod as the mesh sees it; its identity is in `trust_domain`.
pub(crate) fn pod(pod: &Pod, trust_domain: &str) -> Result<PodInfo, ConvertError> {
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
    check_policy_annotation(&pod.metadata, &object)?;
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let (workload, workload_kind) = workload(pod, &name);
    Ok(PodInfo {
        workload,
        workload_kind,
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
        probes: spec.map(probes).unwrap_or_default(),
        container_ports: spec.map(named_ports).unwrap_or_default(),
        namespace,
        name,
    })
}

/// Every container's named ports (TCP; names are unique within a pod), name → port.
fn named_ports(
    spec: &k8s_openapi::api::core::v1::PodSpec,
) -> std::collections::BTreeMap<String, u16> {
    spec.containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
        .filter_map(|p| {
            let port = u16::try_from(p.container_port).ok().filter(|n| *n != 0)?;
            Some((p.name.clone()?, port))
        })
        .collect()
}

/// The kubelet's HTTP probes (liveness, readiness, startup) of every container, as port →
/// paths (without a query); a named port is its container port's number. A probe whose
/// port names no container port is left out (the kubelet cannot run it either).
fn probes(
    spec: &k8s_openapi::api::core::v1::PodSpec,
) -> std::collections::BTreeMap<u16, Vec<String>> {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let mut out: std::collections::BTreeMap<u16, Vec<String>> = std::collections::BTreeMap::new();
    for c in &spec.containers {
        let named = |name: &str| {
            c.ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name))
                .and_then(|p| u16::try_from(p.container_port).ok())
        };
        for probe in [&c.liveness_probe, &c.readiness_probe, &c.startup_probe]
            .into_iter()
            .flatten()
        {
            let Some(get) = &probe.http_get else { continue };
            let port = match &get.port {
                IntOrString::Int(n) => u16::try_from(*n).ok(),
                IntOrString::String(name) => named(name),
            };
            if let Some(port) = port.filter(|p| *p != 0) {
                // Without its query: the proxy compares a request's path alone.
                let path = get
                    .path
                    .as_deref()
                    .and_then(|p| p.split(['?', '#']).next())
                    .filter(|p| !p.is_empty())
                    .unwrap_or("/")
                    .to_string();
                let paths = out.entry(port).or_default();
                if !paths.contains(&path) {
                    paths.push(path);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(kind: &str, owner: &str, hash: Option<&str>) -> Pod {
        let mut v = serde_json::json!({
            "metadata": {"name": "p-1", "namespace": "shop",
              "ownerReferences": [{"apiVersion": "apps/v1", "kind": kind, "name": owner,
                                   "uid": "u", "controller": true}]}
        });
        if let Some(h) = hash {
            v["metadata"]["labels"] = serde_json::json!({"pod-template-hash": h});
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_pods_workload_is_its_controller_and_a_replicaset_of_a_deployment_is_the_deployment() {
        let cases = [
            (
                owned("ReplicaSet", "web-5d4f8", Some("5d4f8")),
                ("web", "Deployment"),
            ),
            (
                owned("ReplicaSet", "web-5d4f8", None),
                ("web-5d4f8", "ReplicaSet"),
            ),
            (
                owned("ReplicaSet", "web", Some("5d4f8")),
                ("web", "ReplicaSet"),
            ),
            (owned("StatefulSet", "db", None), ("db", "StatefulSet")),
            (owned("DaemonSet", "agent", None), ("agent", "DaemonSet")),
            (owned("Job", "migrate-28", None), ("migrate-28", "Job")),
        ];
        for (pod, (name, kind)) in cases {
            assert_eq!(workload(&pod, "p-1"), (name.to_string(), kind.to_string()));
        }
        let bare: Pod =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "p-1"}})).unwrap();
        assert_eq!(workload(&bare, "p-1"), ("p-1".into(), "Pod".into()));
    }
}
