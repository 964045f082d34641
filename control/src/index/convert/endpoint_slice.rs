//! EndpointSlice: the addresses behind a Service, with the pods they belong to.

use super::{err, namespaced_name, parse_ip, port, ConvertError};
use crate::index::model::EndpointInfo;
use k8s_openapi::api::discovery::v1::EndpointSlice;

type SliceKey = (String, String);

/// The slice's key, the Service it belongs to, and its endpoints.
pub(crate) fn endpoint_slice(
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
