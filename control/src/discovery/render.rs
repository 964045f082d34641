//! One resource of the index as protobuf: a pod, a Service (without its endpoints), an
//! endpoint. The catalog renders each object once per change and shares the result with
//! every stream that holds it.

use crate::index::{ClusterIndex, EndpointInfo, ServiceInfo, Workload};
use ambit_api::ports::PortSet;
use ambit_api::proto::discovery as pb;

pub(super) fn ranges(set: &PortSet) -> Vec<pb::PortRange> {
    set.ranges()
        .iter()
        .map(|(a, b)| pb::PortRange {
            first: u32::from(*a),
            last: u32::from(*b),
        })
        .collect()
}

/// A pod that has not terminated. Pods without an address yet are rendered too: the CNI
/// plugin hands a pod to its node proxy before the kubelet has reported the pod's IP.
pub(super) fn workload(index: &ClusterIndex, w: &Workload) -> pb::Workload {
    let hints = index.port_hints(&w.pod);
    pb::Workload {
        namespace: w.pod.namespace.clone(),
        name: w.pod.name.clone(),
        uid: w.pod.uid.clone().unwrap_or_default(),
        node: w.pod.node_name.clone().unwrap_or_default(),
        ips: w.pod.ips.iter().map(ToString::to_string).collect(),
        identity: w.identity.to_string(),
        meshed: w.meshed,
        netns: w.pod.netns.clone().unwrap_or_default(),
        opaque_ports: ranges(&hints.opaque),
        skip_inbound_ports: ranges(&hints.skip_inbound),
        skip_outbound_ports: ranges(&hints.skip_outbound),
        workload: w.pod.workload.clone(),
        workload_kind: w.pod.workload_kind.clone(),
        ready: w.pod.ready,
    }
}

/// A Service's own fields; its endpoints go separately ([`endpoint`]).
pub(super) fn service_meta(svc: &ServiceInfo) -> pb::Service {
    pb::Service {
        namespace: svc.namespace.clone(),
        name: svc.name.clone(),
        cluster_ips: svc.cluster_ips.iter().map(ToString::to_string).collect(),
        ports: svc
            .ports
            .iter()
            .map(|p| pb::ServicePort {
                name: p.name.clone().unwrap_or_default(),
                port: u32::from(p.port),
                protocol: p.protocol.clone(),
            })
            .collect(),
        endpoints: Vec::new(),
    }
}

/// One endpoint, with what a client's proxy needs of the pod behind it: the identity to
/// require when it is meshed, its node and its opaque ports. `pod` is that pod as
/// rendered: the slice's targetRef, else the running pod that has the address (an
/// endpoint that does not say who it is still takes a meshed pod's identity, so that a
/// meshed pod is never reached in plaintext).
pub(super) fn endpoint(ep: &EndpointInfo, pod: Option<&pb::Workload>) -> pb::Endpoint {
    let meshed = pod.is_some_and(|p| p.meshed);
    pb::Endpoint {
        address: ep.address.to_string(),
        ports: ep
            .ports
            .iter()
            .map(|(n, p)| (n.clone().unwrap_or_default(), u32::from(*p)))
            .collect(),
        ready: ep.ready,
        identity: pod
            .filter(|p| p.meshed)
            .map(|p| p.identity.clone())
            .unwrap_or_default(),
        node: ep
            .node_name
            .clone()
            .or_else(|| pod.map(|p| p.node.clone()).filter(|n| !n.is_empty()))
            .unwrap_or_default(),
        meshed,
        pod: ep
            .pod
            .as_ref()
            .map(|(ns, n)| format!("{ns}/{n}"))
            .or_else(|| pod.map(|p| format!("{}/{}", p.namespace, p.name)))
            .unwrap_or_default(),
        opaque_ports: pod.map(|p| p.opaque_ports.clone()).unwrap_or_default(),
        workload: pod.map(|p| p.workload.clone()).unwrap_or_default(),
        workload_kind: pod.map(|p| p.workload_kind.clone()).unwrap_or_default(),
    }
}
