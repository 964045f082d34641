//! A pod's ports: its per-port hints (annotations, and Servers whose protocol is opaque)
//! for discovery, and which Servers select which of its ports — one query that discovery
//! and policy rendering share.

use super::policy::{ServerInfo, ServerPort};
use super::{
    ClusterIndex, PodInfo, PortHints, OPAQUE_PORTS_ANNOTATION, SKIP_INBOUND_PORTS_ANNOTATION,
    SKIP_OUTBOUND_PORTS_ANNOTATION,
};
use std::collections::BTreeMap;

impl ClusterIndex {
    /// The pod's per-port hints: its own annotation, else its namespace's, else the
    /// defaults (Linkerd's opaque ports, no skipped ports). Values were validated on apply.
    pub fn port_hints(&self, pod: &PodInfo) -> PortHints {
        let ns = self.namespaces.get(&pod.namespace);
        let get = |key: &str, default: &str| -> ambit_api::ports::PortSet {
            pod.annotations
                .get(key)
                .or_else(|| ns.and_then(|n| n.annotations.get(key)))
                .map(String::as_str)
                .unwrap_or(default)
                .parse()
                .unwrap_or_default()
        };
        // A port whose Server says `proxyProtocol: opaque` is opaque too (its clients'
        // proxies must not try to detect a protocol on it), as in Linkerd.
        let annotated = get(
            OPAQUE_PORTS_ANNOTATION,
            ambit_api::ports::DEFAULT_OPAQUE_PORTS,
        );
        let opaque_servers: Vec<(u16, u16)> = self
            .servers_selecting(pod)
            .into_iter()
            .filter(|(_, selecting)| selecting[0].protocol == "opaque")
            .map(|(port, _)| (port, port))
            .collect();
        let opaque = if opaque_servers.is_empty() {
            annotated
        } else {
            ambit_api::ports::PortSet::from_ranges(
                annotated.ranges().iter().copied().chain(opaque_servers),
            )
        };
        PortHints {
            opaque,
            skip_inbound: get(SKIP_INBOUND_PORTS_ANNOTATION, ""),
            skip_outbound: get(SKIP_OUTBOUND_PORTS_ANNOTATION, ""),
        }
    }

    /// The Servers that select each port of `pod` (by number, or by the name of one of
    /// its container ports), oldest first: the first applies (creationTimestamp, then
    /// name; none counts as oldest), as in Linkerd.
    pub fn servers_selecting(&self, pod: &PodInfo) -> BTreeMap<u16, Vec<&ServerInfo>> {
        let mut by_port: BTreeMap<u16, Vec<&ServerInfo>> = BTreeMap::new();
        for s in self.servers_in(&pod.namespace) {
            if !s.selector.matches(&pod.labels) {
                continue;
            }
            let port = match &s.port {
                ServerPort::Number(n) => Some(*n),
                ServerPort::Name(name) => pod.container_ports.get(name).copied(),
            };
            if let Some(port) = port {
                by_port.entry(port).or_default().push(s);
            }
        }
        for selecting in by_port.values_mut() {
            selecting.sort_by(|a, b| (&a.created, &a.name).cmp(&(&b.created, &b.name)));
        }
        by_port
    }
}
