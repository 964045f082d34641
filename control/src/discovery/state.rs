//! What the discovery service sends: the index rendered as protobuf, and deltas between
//! two renderings.

use crate::index::{ClusterIndex, Workload};
use ambit_api::ports::PortSet;
use ambit_api::proto::discovery as pb;
use std::collections::BTreeMap;

/// The cluster as one discovery stream sees it, keyed by "<namespace>/<name>".
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeView {
    /// Pods with an IP.
    pub workloads: BTreeMap<String, pb::Workload>,
    /// Services with their endpoints.
    pub services: BTreeMap<String, pb::Service>,
}

impl NodeView {
    /// All of it as one update.
    pub fn to_update(&self, snapshot: bool) -> pb::Update {
        pb::Update {
            snapshot,
            workloads: self.workloads.values().cloned().collect(),
            services: self.services.values().cloned().collect(),
            ..pb::Update::default()
        }
    }

    /// All of it as a snapshot in chunks of at most `per_chunk` resources and, past a
    /// chunk's first resource, `max_bytes` encoded, made as they are taken (a stream holds
    /// one chunk at a time, not a copy of the cluster). The first has `snapshot`, all but
    /// the last `more`; an empty view is one empty chunk.
    pub fn snapshot_chunks(
        &self,
        per_chunk: usize,
        max_bytes: usize,
    ) -> impl Iterator<Item = pb::Update> + '_ {
        use prost::Message;
        let per_chunk = per_chunk.max(1);
        let mut workloads = self.workloads.values().peekable();
        let mut services = self.services.values().peekable();
        let mut first = true;
        std::iter::from_fn(move || {
            if !first && workloads.peek().is_none() && services.peek().is_none() {
                return None;
            }
            let mut u = pb::Update {
                snapshot: first,
                ..pb::Update::default()
            };
            first = false;
            let (mut count, mut bytes) = (0usize, 0usize);
            let mut fits = |len: usize| {
                let ok = count == 0 || (count < per_chunk && bytes + len <= max_bytes);
                if ok {
                    count += 1;
                    bytes += len;
                }
                ok
            };
            while let Some(w) = workloads.next_if(|w| fits(w.encoded_len())) {
                u.workloads.push(w.clone());
            }
            if workloads.peek().is_none() {
                while let Some(s) = services.next_if(|s| fits(s.encoded_len())) {
                    u.services.push(s.clone());
                }
            }
            u.more = workloads.peek().is_some() || services.peek().is_some();
            Some(u)
        })
    }
}

fn ranges(set: &PortSet) -> Vec<pb::PortRange> {
    set.ranges()
        .iter()
        .map(|(a, b)| pb::PortRange {
            first: u32::from(*a),
            last: u32::from(*b),
        })
        .collect()
}

fn workload(index: &ClusterIndex, w: &Workload) -> pb::Workload {
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
        ready: w.pod.ready,
    }
}

/// Renders the index.
pub fn snapshot(index: &ClusterIndex) -> NodeView {
    let workloads: BTreeMap<_, _> = index
        .workloads()
        .iter()
        // Pods without an address yet are sent too: the CNI plugin hands a pod to its
        // node proxy before the kubelet has reported the pod's IP.
        .map(|w| {
            (
                format!("{}/{}", w.pod.namespace, w.pod.name),
                workload(index, w),
            )
        })
        .collect();
    let services = index
        .services()
        .map(|svc| {
            let endpoints = index
                .service_endpoints(&svc.namespace, &svc.name)
                .into_iter()
                .map(|ep| {
                    let pod = ep
                        .pod
                        .as_ref()
                        .and_then(|(ns, name)| index.workload_by_name(ns, name));
                    pb::Endpoint {
                        address: ep.address.to_string(),
                        ports: ep
                            .ports
                            .iter()
                            .map(|(n, p)| (n.clone().unwrap_or_default(), u32::from(*p)))
                            .collect(),
                        ready: ep.ready,
                        identity: pod
                            .as_ref()
                            .filter(|p| p.meshed)
                            .map(|p| p.identity.to_string())
                            .unwrap_or_default(),
                        node: ep
                            .node_name
                            .clone()
                            .or_else(|| pod.as_ref().and_then(|p| p.pod.node_name.clone()))
                            .unwrap_or_default(),
                        meshed: pod.as_ref().is_some_and(|p| p.meshed),
                        pod: ep
                            .pod
                            .as_ref()
                            .map(|(ns, n)| format!("{ns}/{n}"))
                            .unwrap_or_default(),
                    }
                })
                .collect();
            let s = pb::Service {
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
                endpoints,
            };
            (format!("{}/{}", svc.namespace, svc.name), s)
        })
        .collect();
    NodeView {
        workloads,
        services,
    }
}

/// The delta that turns `old` into `new`, or `None` when nothing changed.
/// `delta` in chunks of at most `per_chunk` resources (workloads, services and removals
/// together) and, past the first resource of a chunk, `max_bytes` encoded: all but the last
/// have `more`, so a proxy applies the delta whole. A delta of the whole cluster (the first
/// load of a big one, a re-list) would otherwise be one message over every proxy's decode
/// limit (30 MB at 100,000 pods, BENCHMARKS.md). A small delta is one chunk.
pub fn delta_chunks(delta: pb::Update, per_chunk: usize, max_bytes: usize) -> Vec<pb::Update> {
    use prost::Message;
    let per_chunk = per_chunk.max(1);
    let mut out = vec![pb::Update::default()];
    let (mut count, mut bytes) = (0usize, 0usize);
    let mut room = |len: usize, out: &mut Vec<pb::Update>| {
        if count > 0 && (count >= per_chunk || bytes + len > max_bytes) {
            out.push(pb::Update::default());
            count = 0;
            bytes = 0;
        }
        count += 1;
        bytes += len;
    };
    for w in delta.workloads {
        room(w.encoded_len(), &mut out);
        if let Some(u) = out.last_mut() {
            u.workloads.push(w);
        }
    }
    for s in delta.services {
        room(s.encoded_len(), &mut out);
        if let Some(u) = out.last_mut() {
            u.services.push(s);
        }
    }
    for k in delta.removed_workloads {
        room(k.len() + 4, &mut out);
        if let Some(u) = out.last_mut() {
            u.removed_workloads.push(k);
        }
    }
    for k in delta.removed_services {
        room(k.len() + 4, &mut out);
        if let Some(u) = out.last_mut() {
            u.removed_services.push(k);
        }
    }
    let last = out.len() - 1;
    for (i, u) in out.iter_mut().enumerate() {
        u.more = i < last;
    }
    out
}

pub fn diff(old: &NodeView, new: &NodeView) -> Option<pb::Update> {
    fn changes<T: Clone + PartialEq>(
        old: &BTreeMap<String, T>,
        new: &BTreeMap<String, T>,
    ) -> (Vec<T>, Vec<String>) {
        let upserted = new
            .iter()
            .filter(|(k, v)| old.get(*k) != Some(v))
            .map(|(_, v)| v.clone())
            .collect();
        let removed = old
            .keys()
            .filter(|k| !new.contains_key(*k))
            .cloned()
            .collect();
        (upserted, removed)
    }
    let (workloads, removed_workloads) = changes(&old.workloads, &new.workloads);
    let (services, removed_services) = changes(&old.services, &new.services);
    let update = pb::Update {
        snapshot: false,
        workloads,
        removed_workloads,
        services,
        removed_services,
        more: false,
    };
    let empty = update.workloads.is_empty()
        && update.removed_workloads.is_empty()
        && update.services.is_empty()
        && update.removed_services.is_empty();
    (!empty).then_some(update)
}
