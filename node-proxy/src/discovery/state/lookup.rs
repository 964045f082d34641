//! What a destination is, from what the proxy holds: known (a Service port, a pod, not in
//! the cluster, refused) or not yet known — then the caller subscribes and waits
//! (`crate::discovery::Subscriptions`).

use super::{Destination, DiscoveryState, Lookup, Resolution, Service};
use std::net::SocketAddr;
use std::sync::Arc;

impl DiscoveryState {
    /// What an outbound connection to `addr` reaches: a Service's ClusterIP and port, a
    /// pod this proxy holds (one of its node, or one subscribed by address), or what the
    /// control plane answered for the address — `Pending` while it has not.
    pub fn lookup(&self, addr: SocketAddr) -> Lookup<Destination> {
        if let Some(dest) = self
            .by_vip
            .get(&addr.ip())
            .and_then(|k| self.services.get(k))
            .and_then(|svc| self.service_port(svc, addr.port()))
        {
            return Lookup::Known(dest);
        }
        if let Some(w) = self.workload_by_ip(addr.ip()) {
            return Lookup::Known(Destination::Pod(w, addr));
        }
        match self.resolutions.get(&addr.ip().to_string()) {
            None => Lookup::Pending,
            Some(Resolution::Outside) => Lookup::Known(Destination::Unknown(addr)),
            Some(Resolution::Refused(why)) => Lookup::Known(Destination::Refused(why.clone())),
            // A ClusterIP on a port the Service does not have is not the Service (as
            // kube-proxy drops it; the proxy connects as asked).
            Some(Resolution::Service(k)) if self.services.contains_key(k) => {
                Lookup::Known(Destination::Unknown(addr))
            }
            // Named, but what it names has not arrived yet (it comes in the same update
            // or the next).
            Some(Resolution::Service(_) | Resolution::Workload(_)) => Lookup::Pending,
        }
    }

    /// What [`Self::lookup`] says, with `Pending` as not in the cluster: for what the
    /// proxy does not wait on (tests, the state read back from disk).
    pub fn resolve(&self, addr: SocketAddr) -> Destination {
        match self.lookup(addr) {
            Lookup::Known(d) => d,
            Lookup::Pending => Destination::Unknown(addr),
        }
    }

    /// Port `port` of Service `namespace`/`name` (a route's backend): `Known(None)` when
    /// the Service or the port does not exist, `Pending` until the control plane has said.
    pub fn service(&self, namespace: &str, name: &str, port: u16) -> Lookup<Option<Destination>> {
        let key = format!("{namespace}/{name}");
        if let Some(svc) = self.services.get(&key) {
            return Lookup::Known(self.service_port(svc, port));
        }
        match self.resolutions.get(&key) {
            Some(Resolution::Outside | Resolution::Workload(_)) => Lookup::Known(None),
            Some(Resolution::Refused(why)) => {
                Lookup::Known(Some(Destination::Refused(why.clone())))
            }
            Some(Resolution::Service(_)) | None => Lookup::Pending,
        }
    }

    /// The ready endpoints behind port `port` of `svc`, if it has that port.
    pub(super) fn service_port(&self, svc: &Arc<Service>, port: u16) -> Option<Destination> {
        let port = svc.ports.iter().find(|p| p.port == port)?;
        let endpoints = svc
            .endpoints
            .iter()
            .filter(|e| e.ready)
            .filter_map(|e| {
                let p = e.ports.get(&port.name).copied().or_else(|| {
                    // A Service with a single unnamed port maps to the slice's only port.
                    (e.ports.len() == 1)
                        .then(|| e.ports.values().next().copied())
                        .flatten()
                })?;
                let mut e = e.clone();
                // A meshed pod is reached through the tunnel even when its
                // EndpointSlice does not say who it is (never in plaintext): the control
                // plane fills it in, and so does this proxy for a pod it holds.
                if e.identity.is_none() {
                    if let Some(w) = self.workload_by_ip(e.address).filter(|w| w.meshed) {
                        e.identity = Some(w.identity.clone());
                        e.opaque_ports = w.opaque_ports.clone();
                    }
                }
                Some((SocketAddr::new(e.address, p), e))
            })
            .collect();
        Some(Destination::Service {
            service: svc.clone(),
            port: port.clone(),
            endpoints,
        })
    }
}
