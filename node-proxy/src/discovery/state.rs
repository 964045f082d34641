//! The node proxy's view of the cluster, built from discovery updates.

use ambit_api::ports::PortSet;
use ambit_api::proto::discovery as pb;
use ambit_api::WorkloadIdentity;
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

/// A pod with an IP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// metadata.uid.
    pub uid: String,
    /// The node it runs on.
    pub node: String,
    /// Its IPs.
    pub ips: Vec<IpAddr>,
    /// Its identity.
    pub identity: WorkloadIdentity,
    /// Whether it is in the mesh.
    pub meshed: bool,
    /// Local mode: its network namespace.
    pub netns: Option<PathBuf>,
    /// Ports proxied without protocol detection.
    pub opaque_ports: PortSet,
    /// Inbound ports that bypass the proxy.
    pub skip_inbound_ports: PortSet,
    /// Outbound ports that bypass the proxy.
    pub skip_outbound_ports: PortSet,
    /// Workload name for metrics.
    pub workload: String,
    /// Ready condition.
    pub ready: bool,
}

impl Workload {
    /// "<namespace>/<name>".
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// A Service port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    /// Name ("" when unnamed).
    pub name: String,
    /// Port.
    pub port: u16,
}

/// An endpoint of a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Address.
    pub address: IpAddr,
    /// Ports by name.
    pub ports: BTreeMap<String, u16>,
    /// Ready.
    pub ready: bool,
    /// The identity to require when the endpoint is meshed.
    pub identity: Option<WorkloadIdentity>,
    /// Its node.
    pub node: String,
    /// "<namespace>/<name>" of its pod.
    pub pod: Option<String>,
}

/// A Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Service {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// ClusterIPs.
    pub cluster_ips: Vec<IpAddr>,
    /// Ports.
    pub ports: Vec<ServicePort>,
    /// Endpoints.
    pub endpoints: Vec<Endpoint>,
}

/// Where an outbound connection goes.
#[derive(Clone, Debug, PartialEq)]
pub enum Destination {
    /// A Service's ClusterIP and port: balance over these ready endpoints.
    Service {
        /// The Service.
        service: Arc<Service>,
        /// The Service port connected to.
        port: ServicePort,
        /// Ready endpoints with the endpoint port that port maps to.
        endpoints: Vec<(SocketAddr, Endpoint)>,
    },
    /// A pod IP.
    Pod(Arc<Workload>, SocketAddr),
    /// Not known to the mesh: connect as asked, in plaintext.
    Unknown(SocketAddr),
}

/// Everything discovery has told this proxy.
#[derive(Clone, Debug, Default)]
pub struct DiscoveryState {
    workloads: BTreeMap<String, Arc<Workload>>,
    services: BTreeMap<String, Arc<Service>>,
    by_ip: HashMap<IpAddr, String>,
    by_vip: HashMap<IpAddr, String>,
    /// A snapshot has been received.
    pub synced: bool,
}

/// Why a discovery resource was ignored.
#[derive(Debug, thiserror::Error)]
#[error("discovery sent an invalid {kind} {key}: {reason}")]
pub struct InvalidResource {
    kind: &'static str,
    key: String,
    reason: String,
}

fn ports(ranges: &[pb::PortRange]) -> PortSet {
    PortSet::from_ranges(
        ranges
            .iter()
            .filter_map(|r| Some((u16::try_from(r.first).ok()?, u16::try_from(r.last).ok()?))),
    )
}

fn parse_ips(ips: &[String]) -> Result<Vec<IpAddr>, String> {
    ips.iter()
        .map(|ip| ip.parse().map_err(|_| format!("{ip:?} is not an IP")))
        .collect()
}

fn workload(w: pb::Workload) -> Result<Workload, String> {
    Ok(Workload {
        ips: parse_ips(&w.ips)?,
        identity: w.identity.parse().map_err(|e| format!("identity: {e}"))?,
        netns: (!w.netns.is_empty()).then(|| PathBuf::from(&w.netns)),
        opaque_ports: ports(&w.opaque_ports),
        skip_inbound_ports: ports(&w.skip_inbound_ports),
        skip_outbound_ports: ports(&w.skip_outbound_ports),
        namespace: w.namespace,
        name: w.name,
        uid: w.uid,
        node: w.node,
        meshed: w.meshed,
        workload: w.workload,
        ready: w.ready,
    })
}

fn service(s: pb::Service) -> Result<Service, String> {
    let mut endpoints = Vec::new();
    for e in s.endpoints {
        endpoints.push(Endpoint {
            address: e
                .address
                .parse()
                .map_err(|_| format!("endpoint {:?} is not an IP", e.address))?,
            ports: e
                .ports
                .into_iter()
                .filter_map(|(n, p)| Some((n, u16::try_from(p).ok()?)))
                .collect(),
            ready: e.ready,
            identity: if e.meshed && !e.identity.is_empty() {
                Some(
                    e.identity
                        .parse()
                        .map_err(|err| format!("endpoint identity: {err}"))?,
                )
            } else {
                None
            },
            node: e.node,
            pod: (!e.pod.is_empty()).then_some(e.pod),
        });
    }
    Ok(Service {
        cluster_ips: parse_ips(&s.cluster_ips)?,
        ports: s
            .ports
            .into_iter()
            .filter_map(|p| {
                Some(ServicePort {
                    port: u16::try_from(p.port).ok()?,
                    name: p.name,
                })
            })
            .collect(),
        namespace: s.namespace,
        name: s.name,
        endpoints,
    })
}

impl DiscoveryState {
    /// Applies an update (a snapshot replaces everything). Invalid resources are skipped
    /// and returned, so that one bad object does not cost the proxy the rest.
    pub fn apply(&mut self, update: pb::Update) -> Vec<InvalidResource> {
        let mut invalid = Vec::new();
        if update.snapshot {
            self.workloads.clear();
            self.services.clear();
            self.synced = true;
        }
        for key in &update.removed_workloads {
            self.workloads.remove(key);
        }
        for key in &update.removed_services {
            self.services.remove(key);
        }
        for w in update.workloads {
            let key = format!("{}/{}", w.namespace, w.name);
            match workload(w) {
                Ok(w) => {
                    self.workloads.insert(key, Arc::new(w));
                }
                Err(reason) => invalid.push(InvalidResource {
                    kind: "workload",
                    key,
                    reason,
                }),
            }
        }
        for s in update.services {
            let key = format!("{}/{}", s.namespace, s.name);
            match service(s) {
                Ok(s) => {
                    self.services.insert(key, Arc::new(s));
                }
                Err(reason) => invalid.push(InvalidResource {
                    kind: "service",
                    key,
                    reason,
                }),
            }
        }
        self.reindex();
        invalid
    }

    fn reindex(&mut self) {
        self.by_ip = self
            .workloads
            .iter()
            .flat_map(|(k, w)| w.ips.iter().map(move |ip| (*ip, k.clone())))
            .collect();
        self.by_vip = self
            .services
            .iter()
            .flat_map(|(k, s)| s.cluster_ips.iter().map(move |ip| (*ip, k.clone())))
            .collect();
    }

    /// The meshed pods scheduled on `node`.
    pub fn local_workloads(&self, node: &str) -> Vec<Arc<Workload>> {
        self.workloads
            .values()
            .filter(|w| w.meshed && w.node == node)
            .cloned()
            .collect()
    }

    /// The workload `<namespace>/<name>`.
    pub fn workload(&self, key: &str) -> Option<&Arc<Workload>> {
        self.workloads.get(key)
    }

    /// Every workload.
    pub fn workloads(&self) -> impl Iterator<Item = &Arc<Workload>> {
        self.workloads.values()
    }

    /// Every address discovery knows: pod IPs and Service endpoints.
    pub fn known_ips(&self) -> std::collections::HashSet<IpAddr> {
        let mut ips: std::collections::HashSet<IpAddr> = self.by_ip.keys().copied().collect();
        for s in self.services.values() {
            ips.extend(s.endpoints.iter().map(|e| e.address));
        }
        ips
    }

    /// The pod that has `ip`.
    pub fn workload_by_ip(&self, ip: IpAddr) -> Option<Arc<Workload>> {
        self.by_ip
            .get(&ip)
            .and_then(|k| self.workloads.get(k))
            .cloned()
    }

    /// What an outbound connection to `addr` reaches.
    pub fn resolve(&self, addr: SocketAddr) -> Destination {
        if let Some(dest) = self
            .by_vip
            .get(&addr.ip())
            .and_then(|k| self.services.get(k))
            .and_then(|svc| self.service_port(svc, addr.port()))
        {
            return dest;
        }
        match self.workload_by_ip(addr.ip()) {
            Some(w) => Destination::Pod(w, addr),
            None => Destination::Unknown(addr),
        }
    }

    /// Port `port` of Service `namespace`/`name` (a route's backend), if both exist.
    pub fn service(&self, namespace: &str, name: &str, port: u16) -> Option<Destination> {
        let svc = self.services.get(&format!("{namespace}/{name}"))?;
        self.service_port(svc, port)
    }

    /// The ready endpoints behind port `port` of `svc`, if it has that port.
    fn service_port(&self, svc: &Arc<Service>, port: u16) -> Option<Destination> {
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
                // EndpointSlice does not say who it is (never in plaintext).
                if e.identity.is_none() {
                    e.identity = self
                        .workload_by_ip(e.address)
                        .filter(|w| w.meshed)
                        .map(|w| w.identity.clone());
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

mod snapshot;

#[cfg(test)]
mod tests;
