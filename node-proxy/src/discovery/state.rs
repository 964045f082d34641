//! The node proxy's view of the cluster, built from discovery updates: the pods of its
//! node, and the destinations its pods use (subscribed on demand: `super::subscriptions`)
//! with what each target resolves to.

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
    /// Its kind (`Deployment`, `StatefulSet`, ..., `Pod`; empty from an older control
    /// plane).
    pub workload_kind: String,
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
    /// Its pod's opaque ports (connections to them skip protocol detection).
    pub opaque_ports: PortSet,
    /// Its pod as metrics name it (`dst_pod`, `dst_<kind>`), when it is one.
    pub workload: Option<Arc<PodRef>>,
}

/// A pod as metrics name it: made once per endpoint, shared by every series.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct PodRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub pod: String,
    /// Its workload ("" when the control plane did not say).
    pub workload: String,
    /// The workload's kind (`Deployment`, ..., `Pod`).
    pub workload_kind: String,
}

impl PodRef {
    /// The pod `w`.
    pub fn of(w: &Workload) -> Self {
        Self {
            namespace: w.namespace.clone(),
            pod: w.name.clone(),
            workload: w.workload.clone(),
            workload_kind: w.workload_kind.clone(),
        }
    }
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
    /// The control plane will not say what it is (the reason): refuse it.
    Refused(String),
}

/// What a subscribed target is, as the control plane answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// A Service ("<ns>/<name>"): its ClusterIP, or the Service by name.
    Service(String),
    /// The pod ("<ns>/<name>") that has this address.
    Workload(String),
    /// Not in the cluster: an address outside it, or a Service that does not exist.
    Outside,
    /// The control plane will not answer it (why).
    Refused(String),
}

/// What discovery says of a destination now.
#[derive(Clone, Debug, PartialEq)]
pub enum Lookup<T> {
    /// Known.
    Known(T),
    /// Not known yet: subscribe to it and wait for the answer.
    Pending,
}

/// Everything discovery has told this proxy.
#[derive(Clone, Debug, Default)]
pub struct DiscoveryState {
    workloads: BTreeMap<String, Arc<Workload>>,
    services: BTreeMap<String, Arc<Service>>,
    by_ip: HashMap<IpAddr, String>,
    by_vip: HashMap<IpAddr, String>,
    /// Subscribed targets ("10.96.0.10", "<ns>/<name>") and what they are.
    resolutions: BTreeMap<String, Resolution>,
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
        workload_kind: w.workload_kind,
        ready: w.ready,
    })
}

fn endpoint(e: pb::Endpoint) -> Result<Endpoint, String> {
    Ok(Endpoint {
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
        workload: e.pod.split_once('/').map(|(namespace, pod)| {
            Arc::new(PodRef {
                namespace: namespace.to_string(),
                pod: pod.to_string(),
                workload: e.workload,
                workload_kind: e.workload_kind,
            })
        }),
        pod: (!e.pod.is_empty()).then_some(e.pod),
        opaque_ports: ports(&e.opaque_ports),
    })
}

fn service(s: pb::Service) -> Result<Service, String> {
    let mut endpoints = Vec::new();
    for e in s.endpoints {
        endpoints.push(endpoint(e)?);
    }
    endpoints.sort_by_key(|e| e.address);
    endpoints.dedup_by_key(|e| e.address);
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

fn resolution(r: &pb::Resolution) -> Resolution {
    if !r.refused.is_empty() {
        Resolution::Refused(r.refused.clone())
    } else if !r.service.is_empty() {
        Resolution::Service(r.service.clone())
    } else if !r.workload.is_empty() {
        Resolution::Workload(r.workload.clone())
    } else {
        Resolution::Outside
    }
}

impl DiscoveryState {
    /// Applies an update (a snapshot replaces everything), in the order the protocol
    /// gives: removals, then upserts, of pods and then Services, then endpoint deltas, then
    /// resolutions. Invalid resources are skipped and returned, so that one bad object does
    /// not cost the proxy the rest.
    pub fn apply(&mut self, update: pb::Update) -> Vec<InvalidResource> {
        let mut invalid = Vec::new();
        if update.snapshot {
            self.workloads.clear();
            self.services.clear();
            self.resolutions.clear();
            self.synced = true;
        }
        for key in &update.removed_workloads {
            self.workloads.remove(key);
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
        for key in &update.removed_services {
            self.services.remove(key);
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
        for d in update.endpoint_deltas {
            if let Err(reason) = self.apply_endpoints(&d) {
                invalid.push(InvalidResource {
                    kind: "endpoint delta of service",
                    key: d.service,
                    reason,
                });
            }
        }
        for t in &update.removed_resolutions {
            self.resolutions.remove(t);
        }
        for r in &update.resolutions {
            self.resolutions.insert(r.target.clone(), resolution(r));
        }
        self.reindex();
        invalid
    }

    /// Endpoints of a Service this proxy holds, changed one by one.
    fn apply_endpoints(&mut self, d: &pb::EndpointDelta) -> Result<(), String> {
        let Some(svc) = self.services.get_mut(&d.service) else {
            return Err("a Service this proxy was not sent".into());
        };
        let mut upserted = Vec::with_capacity(d.upserted.len());
        for e in &d.upserted {
            upserted.push(endpoint(e.clone())?);
        }
        let removed: std::collections::HashSet<IpAddr> =
            d.removed.iter().filter_map(|a| a.parse().ok()).collect();
        let svc = Arc::make_mut(svc);
        svc.endpoints.retain(|e| {
            !removed.contains(&e.address) && !upserted.iter().any(|u| u.address == e.address)
        });
        svc.endpoints.extend(upserted);
        svc.endpoints.sort_by_key(|e| e.address);
        Ok(())
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

    /// Every workload: the node's pods and the pods subscribed by address.
    pub fn workloads(&self) -> impl Iterator<Item = &Arc<Workload>> {
        self.workloads.values()
    }

    /// Every Service held.
    pub fn services(&self) -> impl Iterator<Item = &Arc<Service>> {
        self.services.values()
    }

    /// Every subscribed target and what it is.
    pub fn resolutions(&self) -> &BTreeMap<String, Resolution> {
        &self.resolutions
    }

    /// Every address discovery knows: pod IPs and Service endpoints.
    pub fn known_ips(&self) -> std::collections::HashSet<IpAddr> {
        let mut ips: std::collections::HashSet<IpAddr> = self.by_ip.keys().copied().collect();
        for s in self.services.values() {
            ips.extend(s.endpoints.iter().map(|e| e.address));
        }
        ips
    }

    /// The pod that has `ip`, if this proxy holds it.
    pub fn workload_by_ip(&self, ip: IpAddr) -> Option<Arc<Workload>> {
        self.by_ip
            .get(&ip)
            .and_then(|k| self.workloads.get(k))
            .cloned()
    }
}

mod lookup;
mod snapshot;

#[cfg(test)]
mod tests;
