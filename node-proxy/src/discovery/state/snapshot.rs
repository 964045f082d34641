//! The state back as a discovery snapshot: what the proxy keeps on disk so that a restart
//! while the control plane is away starts from the last view instead of from nothing
//! (`crate::persist`). Applying the snapshot to an empty state gives this state again.

use super::{DiscoveryState, Endpoint, Resolution, Service, Workload};
use ambit_api::ports::PortSet;
use ambit_api::proto::discovery as pb;

fn ranges(ports: &PortSet) -> Vec<pb::PortRange> {
    ports
        .ranges()
        .iter()
        .map(|&(first, last)| pb::PortRange {
            first: first.into(),
            last: last.into(),
        })
        .collect()
}

fn workload(w: &Workload) -> pb::Workload {
    pb::Workload {
        namespace: w.namespace.clone(),
        name: w.name.clone(),
        uid: w.uid.clone(),
        node: w.node.clone(),
        ips: w.ips.iter().map(ToString::to_string).collect(),
        identity: w.identity.to_string(),
        meshed: w.meshed,
        netns: w
            .netns
            .as_ref()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default(),
        opaque_ports: ranges(&w.opaque_ports),
        skip_inbound_ports: ranges(&w.skip_inbound_ports),
        skip_outbound_ports: ranges(&w.skip_outbound_ports),
        workload: w.workload.clone(),
        workload_kind: w.workload_kind.clone(),
        ready: w.ready,
    }
}

fn endpoint(e: &Endpoint) -> pb::Endpoint {
    pb::Endpoint {
        address: e.address.to_string(),
        ports: e
            .ports
            .iter()
            .map(|(name, port)| (name.clone(), u32::from(*port)))
            .collect(),
        ready: e.ready,
        // Kept only for meshed endpoints (`service` in the parent reads it so).
        identity: e
            .identity
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        meshed: e.identity.is_some(),
        node: e.node.clone(),
        pod: e.pod.clone().unwrap_or_default(),
        opaque_ports: ranges(&e.opaque_ports),
        workload: e
            .workload
            .as_ref()
            .map(|w| w.workload.clone())
            .unwrap_or_default(),
        workload_kind: e
            .workload
            .as_ref()
            .map(|w| w.workload_kind.clone())
            .unwrap_or_default(),
    }
}

fn resolution(target: &str, r: &Resolution) -> pb::Resolution {
    let mut out = pb::Resolution {
        target: target.to_string(),
        ..pb::Resolution::default()
    };
    match r {
        Resolution::Service(k) => out.service = k.clone(),
        Resolution::Workload(k) => out.workload = k.clone(),
        Resolution::Outside => {}
        Resolution::Refused(why) => out.refused = why.clone(),
    }
    out
}

fn service(s: &Service) -> pb::Service {
    pb::Service {
        namespace: s.namespace.clone(),
        name: s.name.clone(),
        cluster_ips: s.cluster_ips.iter().map(ToString::to_string).collect(),
        ports: s
            .ports
            .iter()
            .map(|p| pb::ServicePort {
                name: p.name.clone(),
                port: p.port.into(),
                protocol: String::new(),
            })
            .collect(),
        endpoints: s.endpoints.iter().map(endpoint).collect(),
    }
}

impl DiscoveryState {
    /// The whole state as one snapshot update (not chunked: it is not sent on the wire).
    pub fn to_snapshot(&self) -> pb::Update {
        pb::Update {
            snapshot: true,
            workloads: self.workloads.values().map(|w| workload(w)).collect(),
            services: self.services.values().map(|s| service(s)).collect(),
            resolutions: self
                .resolutions
                .iter()
                .map(|(t, r)| resolution(t, r))
                .collect(),
            ..pb::Update::default()
        }
    }
}
