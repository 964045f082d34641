//! Service: its cluster IPs and ports.

use super::annotations::{routing_annotations, On};
use super::{namespaced_name, parse_ip, port, ConvertError};
use crate::index::model::{ServiceInfo, ServicePort};
use k8s_openapi::api::core::v1::Service;

/// The Service as the mesh sees it.
pub(crate) fn service(svc: &Service) -> Result<ServiceInfo, ConvertError> {
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
    let routing = routing_annotations(&svc.metadata, &object, On::Service)?;
    Ok(ServiceInfo {
        created: svc.metadata.creation_timestamp.clone(),
        routing,
        namespace,
        name,
        cluster_ips,
        ports,
    })
}
