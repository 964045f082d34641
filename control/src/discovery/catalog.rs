//! Every pod and Service of the cluster rendered once, kept current one object at a time.
//!
//! [`Catalog::update`] takes what changed in the index ([`Changes`]), renders those
//! objects again — a pod, the Services it is an endpoint of, the pods of a namespace whose
//! annotations changed — compares each rendering with the last, and returns what differs
//! as [`Changed`]: a pod, a Service's own fields, a Service's endpoints one by one, and
//! the addresses and names whose meaning moved. The streams (`streams.rs`) send those to
//! the proxies that hold them; nothing here knows of streams.

use super::render;
use crate::index::{Changes, ClusterIndex};
use ambit_api::proto::discovery as pb;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

/// A Service as rendered: its own fields, and its endpoints by address.
#[derive(Clone, Debug, PartialEq)]
pub struct RenderedService {
    /// The Service without endpoints.
    pub meta: Arc<pb::Service>,
    /// Endpoints by address (an address in two slices of the Service counts once).
    pub endpoints: BTreeMap<String, Arc<pb::Endpoint>>,
}

impl RenderedService {
    /// The Service with all its endpoints, as a proxy first receives it.
    pub fn whole(&self) -> pb::Service {
        let mut s = pb::Service::clone(&self.meta);
        s.endpoints = self
            .endpoints
            .values()
            .map(|e| pb::Endpoint::clone(e))
            .collect();
        s
    }
}

/// What a subscribed target is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resolved {
    /// The Service it is ("<ns>/<name>").
    pub service: Option<Arc<str>>,
    /// The pod that has the address ("<ns>/<name>").
    pub workload: Option<Arc<str>>,
}

/// One object whose rendering changed.
#[derive(Clone, Debug)]
pub enum Changed {
    /// A pod: `old` and `new` rendering (None: absent).
    Workload {
        /// "<ns>/<name>".
        key: Arc<str>,
        /// Before.
        old: Option<Arc<pb::Workload>>,
        /// Now.
        new: Option<Arc<pb::Workload>>,
    },
    /// A Service.
    Service {
        /// "<ns>/<name>".
        key: Arc<str>,
        /// Its own fields changed, it appeared or it left: send it whole (or its removal).
        whole: bool,
        /// Otherwise, its endpoints that changed.
        endpoints: Arc<pb::EndpointDelta>,
    },
    /// What a target (an address, or a Service by name) resolves to may have changed.
    Target(Arc<str>),
}

/// Every rendered pod and Service, with the indexes that resolve targets.
#[derive(Debug, Default)]
pub struct Catalog {
    workloads: HashMap<Arc<str>, Arc<pb::Workload>>,
    /// Node → its pods' keys.
    by_node: HashMap<String, BTreeSet<Arc<str>>>,
    /// Pod IP → pod key.
    by_ip: HashMap<IpAddr, Arc<str>>,
    services: HashMap<Arc<str>, RenderedService>,
    /// ClusterIP → Service key.
    by_vip: HashMap<IpAddr, Arc<str>>,
    /// Pod key → the Services it is an endpoint of (by targetRef or address).
    endpoint_pods: HashMap<Arc<str>, BTreeSet<Arc<str>>>,
    /// Address → the Services that have an endpoint there.
    endpoint_ips: HashMap<IpAddr, BTreeSet<Arc<str>>>,
}

fn key(ns: &str, name: &str) -> Arc<str> {
    format!("{ns}/{name}").into()
}

fn split(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}

fn ips(w: &pb::Workload) -> impl Iterator<Item = IpAddr> + '_ {
    w.ips.iter().filter_map(|ip| ip.parse().ok())
}

fn vips(s: &pb::Service) -> impl Iterator<Item = IpAddr> + '_ {
    s.cluster_ips.iter().filter_map(|ip| ip.parse().ok())
}

impl Catalog {
    /// The pod `key`.
    pub fn workload(&self, key: &str) -> Option<&Arc<pb::Workload>> {
        self.workloads.get(key)
    }

    /// The Service `key`.
    pub fn service(&self, key: &str) -> Option<&RenderedService> {
        self.services.get(key)
    }

    /// The keys of the pods scheduled on `node`.
    pub fn on_node(&self, node: &str) -> impl Iterator<Item = &Arc<str>> {
        self.by_node.get(node).into_iter().flatten()
    }

    /// Counts of rendered pods and Services.
    pub fn len(&self) -> (usize, usize) {
        (self.workloads.len(), self.services.len())
    }

    /// What `target` is now: a Service's ClusterIP (a Service wins over a pod, as
    /// kube-proxy's rules do), a pod IP, a Service by name, or nothing in the cluster.
    /// `target` is canonical (`streams::Target`).
    pub fn resolve(&self, target: &str) -> Resolved {
        if let Ok(ip) = target.parse::<IpAddr>() {
            if let Some(s) = self.by_vip.get(&ip) {
                return Resolved {
                    service: Some(s.clone()),
                    workload: None,
                };
            }
            return Resolved {
                service: None,
                workload: self.by_ip.get(&ip).cloned(),
            };
        }
        Resolved {
            service: self.services.get_key_value(target).map(|(k, _)| k.clone()),
            workload: None,
        }
    }

    /// Renders again what `changes` names and returns what differs, pods first (a
    /// Service's endpoints render from its pods), then Services, then the targets whose
    /// resolution may have moved.
    pub fn update(&mut self, index: &ClusterIndex, changes: &Changes) -> Vec<Changed> {
        let mut out = Vec::new();
        let mut targets: BTreeSet<Arc<str>> = BTreeSet::new();
        let mut services: BTreeSet<Arc<str>> = BTreeSet::new();
        let pods: BTreeSet<Arc<str>> = if changes.all {
            let mut all: BTreeSet<Arc<str>> = self.workloads.keys().cloned().collect();
            all.extend(
                index
                    .workloads()
                    .iter()
                    .map(|w| key(&w.pod.namespace, &w.pod.name)),
            );
            services.extend(self.services.keys().cloned());
            services.extend(index.services().map(|s| key(&s.namespace, &s.name)));
            all
        } else {
            let mut pods: BTreeSet<Arc<str>> =
                changes.pods.iter().map(|(ns, n)| key(ns, n)).collect();
            for ns in &changes.namespaces {
                pods.extend(index.pods_in(ns).map(|p| key(&p.namespace, &p.name)));
            }
            services.extend(changes.services.iter().map(|(ns, n)| key(ns, n)));
            pods
        };
        for k in pods {
            if let Some(c) = self.update_workload(index, k, &mut services, &mut targets) {
                out.push(c);
            }
        }
        for k in services {
            if let Some(c) = self.update_service(index, k, &mut targets) {
                out.push(c);
            }
        }
        out.extend(targets.into_iter().map(Changed::Target));
        out
    }

    fn update_workload(
        &mut self,
        index: &ClusterIndex,
        k: Arc<str>,
        services: &mut BTreeSet<Arc<str>>,
        targets: &mut BTreeSet<Arc<str>>,
    ) -> Option<Changed> {
        let (ns, name) = split(&k);
        let new = index
            .live_workload(ns, name)
            .map(|w| Arc::new(render::workload(index, &w)));
        let old = self.workloads.get(&k).cloned();
        if old.as_deref() == new.as_deref() {
            return None;
        }
        let before: BTreeSet<IpAddr> = old.iter().flat_map(|o| ips(o)).collect();
        let after: BTreeSet<IpAddr> = new.iter().flat_map(|n| ips(n)).collect();
        // An address that a pod gained or lost resolves to something else now.
        for ip in before.symmetric_difference(&after) {
            targets.insert(ip.to_string().into());
        }
        for ip in before.union(&after) {
            services.extend(self.endpoint_ips.get(ip).into_iter().flatten().cloned());
        }
        if let Some(o) = &old {
            if let Some(set) = self.by_node.get_mut(&o.node) {
                set.remove(&k);
                if set.is_empty() {
                    self.by_node.remove(&o.node);
                }
            }
            for ip in &before {
                if self.by_ip.get(ip) == Some(&k) {
                    self.by_ip.remove(ip);
                }
            }
        }
        match &new {
            Some(n) => {
                if !n.node.is_empty() {
                    self.by_node
                        .entry(n.node.clone())
                        .or_default()
                        .insert(k.clone());
                }
                for ip in &after {
                    self.by_ip.insert(*ip, k.clone());
                }
                self.workloads.insert(k.clone(), n.clone());
            }
            None => {
                self.workloads.remove(&k);
            }
        }
        services.extend(self.endpoint_pods.get(&k).into_iter().flatten().cloned());
        Some(Changed::Workload { key: k, old, new })
    }

    /// The pod behind an endpoint, as rendered: its targetRef (a terminated pod too,
    /// so that its address, if another pod now has it, is not reached in plaintext),
    /// else the running pod with the address.
    fn endpoint_pod(
        &self,
        index: &ClusterIndex,
        ep: &crate::index::EndpointInfo,
    ) -> Option<Arc<pb::Workload>> {
        match &ep.pod {
            Some((ns, name)) => self.workloads.get(&*key(ns, name)).cloned().or_else(|| {
                index
                    .workload_by_name(ns, name)
                    .map(|w| Arc::new(render::workload(index, &w)))
            }),
            None => self
                .by_ip
                .get(&ep.address)
                .and_then(|k| self.workloads.get(k))
                .cloned(),
        }
    }

    fn update_service(
        &mut self,
        index: &ClusterIndex,
        k: Arc<str>,
        targets: &mut BTreeSet<Arc<str>>,
    ) -> Option<Changed> {
        let (ns, name) = split(&k);
        let new = index.service(ns, name).map(|svc| {
            let mut endpoints = BTreeMap::new();
            for ep in index.service_endpoints(ns, name) {
                let pod = self.endpoint_pod(index, &ep);
                let e = render::endpoint(&ep, pod.as_deref());
                endpoints
                    .entry(e.address.clone())
                    .or_insert_with(|| Arc::new(e));
            }
            RenderedService {
                meta: Arc::new(render::service_meta(svc)),
                endpoints,
            }
        });
        let old = self.services.remove(&k);
        if old == new {
            if let Some(s) = old {
                self.services.insert(k, s);
            }
            return None;
        }
        let whole = old.as_ref().map(|s| &s.meta) != new.as_ref().map(|s| &s.meta);
        let mut delta = pb::EndpointDelta {
            service: k.to_string(),
            ..pb::EndpointDelta::default()
        };
        let before: BTreeSet<IpAddr> = old.iter().flat_map(|o| vips(&o.meta)).collect();
        let after: BTreeSet<IpAddr> = new.iter().flat_map(|n| vips(&n.meta)).collect();
        for ip in before.symmetric_difference(&after) {
            targets.insert(ip.to_string().into());
        }
        if let Some(o) = &old {
            for ip in &before {
                if self.by_vip.get(ip) == Some(&k) {
                    self.by_vip.remove(ip);
                }
            }
            for e in o.endpoints.values() {
                self.unlink_endpoint(&k, e);
            }
            if !whole {
                let now = new.as_ref().map(|n| &n.endpoints);
                delta.removed = o
                    .endpoints
                    .keys()
                    .filter(|a| !now.is_some_and(|n| n.contains_key(*a)))
                    .cloned()
                    .collect();
            }
        }
        if old.is_none() || new.is_none() {
            // The Service by name appeared or left.
            targets.insert(k.clone());
        }
        if let Some(n) = &new {
            for ip in &after {
                self.by_vip.insert(*ip, k.clone());
            }
            for e in n.endpoints.values() {
                self.link_endpoint(&k, e);
            }
            if !whole {
                let before = old.as_ref().map(|o| &o.endpoints);
                delta.upserted = n
                    .endpoints
                    .iter()
                    .filter(|(a, e)| before.and_then(|b| b.get(*a)) != Some(*e))
                    .map(|(_, e)| pb::Endpoint::clone(e))
                    .collect();
            }
            self.services.insert(k.clone(), n.clone());
        }
        Some(Changed::Service {
            key: k,
            whole,
            endpoints: Arc::new(delta),
        })
    }

    fn link_endpoint(&mut self, svc: &Arc<str>, e: &pb::Endpoint) {
        if !e.pod.is_empty() {
            let pod: Arc<str> = e.pod.as_str().into();
            self.endpoint_pods
                .entry(pod)
                .or_default()
                .insert(svc.clone());
        }
        if let Ok(ip) = e.address.parse() {
            self.endpoint_ips.entry(ip).or_default().insert(svc.clone());
        }
    }

    fn unlink_endpoint(&mut self, svc: &Arc<str>, e: &pb::Endpoint) {
        if let Some(set) = self.endpoint_pods.get_mut(e.pod.as_str()) {
            set.remove(svc);
            if set.is_empty() {
                self.endpoint_pods.remove(e.pod.as_str());
            }
        }
        if let Ok(ip) = e.address.parse::<IpAddr>() {
            if let Some(set) = self.endpoint_ips.get_mut(&ip) {
                set.remove(svc);
                if set.is_empty() {
                    self.endpoint_ips.remove(&ip);
                }
            }
        }
    }
}
