//! The traffic series of the node proxies (`direction`, `namespace`, `pod`, the local
//! workload from `source_workload`/`destination_workload`, `client_id` / `server_id`,
//! `dst_namespace` + `dst_service`, `destination_workload*`, `tls`; older proxies'
//! `workload` and `dst_service="name.namespace"` too), typed, and who the peer at the other
//! end of a series was.
//!
//! A proxy labels its own pod fully. Outbound, today's proxies also name the workload that
//! served (`destination_workload`), which names the peer; inbound, and from older proxies,
//! the peer is known only by identity (and, outbound, by the Service the client asked
//! for): it is named after a workload the proxies report when its identity's
//! ServiceAccount, or else the destination Service, has that workload's name (the usual
//! convention); otherwise it is shown as the Service (`svc/NAME`) or the identity
//! (`sa/NAME`).

use super::parse::Sample;
use ambit_api::WorkloadIdentity;
use std::collections::{BTreeMap, BTreeSet};

/// Which side of the proxy a series counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Direction {
    /// Traffic to the local pod.
    Inbound,
    /// Traffic from the local pod.
    Outbound,
}

/// The labels of a traffic series.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Traffic {
    /// Inbound or outbound.
    pub direction: Direction,
    /// The local pod's namespace.
    pub namespace: String,
    /// The local pod.
    pub pod: String,
    /// The local pod's workload (its Deployment, …).
    pub workload: String,
    /// The peer's proven identity: inbound `client_id`, outbound `server_id` ("" without
    /// mTLS).
    pub peer_id: String,
    /// Outbound: the destination Service's namespace and name ("" when none).
    pub dst_service: Option<(String, String)>,
    /// Outbound: the workload that served, as `(namespace, name)`, when the proxy knew it.
    pub dst_workload: Option<(String, String)>,
    /// `tls="true"`: the hop to the peer proxy was mTLS.
    pub tls: bool,
}

impl Traffic {
    /// The traffic labels of `s`; `None` for series that are not per-pod traffic.
    pub fn of(s: &Sample) -> Option<Self> {
        let direction = match s.label("direction") {
            "inbound" => Direction::Inbound,
            "outbound" => Direction::Outbound,
            _ => return None,
        };
        let (namespace, pod) = (s.label("namespace"), s.label("pod"));
        if namespace.is_empty() || pod.is_empty() {
            return None;
        }
        // The scrape-proof name of the local workload; `workload` from proxies before
        // the label set of docs/ARCHITECTURE.md "Metrics".
        let local = match direction {
            Direction::Inbound => "destination_workload",
            Direction::Outbound => "source_workload",
        };
        let workload = [s.label(local), s.label("workload"), pod]
            .into_iter()
            .find(|w| !w.is_empty())
            .unwrap_or_default();
        let dst_service = match (s.label("dst_namespace"), s.label("dst_service")) {
            (_, "") => None,
            ("", old) => old
                .split_once('.')
                .map(|(name, ns)| (ns.to_string(), name.to_string())),
            (ns, name) => Some((ns.to_string(), name.to_string())),
        };
        let dst_workload = match direction {
            Direction::Outbound => Some((
                s.label("destination_workload_namespace"),
                s.label("destination_workload"),
            ))
            .filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
            .map(|(ns, name)| (ns.to_string(), name.to_string())),
            Direction::Inbound => None,
        };
        let peer_id = match direction {
            Direction::Inbound => s.label("client_id"),
            Direction::Outbound => s.label("server_id"),
        };
        Some(Self {
            direction,
            namespace: namespace.to_string(),
            pod: pod.to_string(),
            workload: workload.to_string(),
            peer_id: peer_id.to_string(),
            dst_service,
            dst_workload,
            tls: s.label("tls") == "true",
        })
    }
}

/// The other end of a series.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Peer {
    /// A workload the proxies report.
    Workload {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// A destination Service named after no workload the proxies report.
    Service {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// An mTLS identity whose ServiceAccount is named after no workload the proxies report.
    Identity {
        /// The identity's namespace.
        namespace: String,
        /// Its ServiceAccount.
        service_account: String,
    },
    /// A client without mTLS: outside the mesh.
    Unmeshed,
    /// A destination outside the mesh that is no Service.
    Unknown,
}

impl Peer {
    /// The peer's namespace ("" when not known).
    pub fn namespace(&self) -> &str {
        match self {
            Peer::Workload { namespace, .. }
            | Peer::Service { namespace, .. }
            | Peer::Identity { namespace, .. } => namespace,
            Peer::Unmeshed | Peer::Unknown => "",
        }
    }

    /// The peer's bare name.
    pub fn name(&self) -> &str {
        match self {
            Peer::Workload { name, .. } | Peer::Service { name, .. } => name,
            Peer::Identity {
                service_account, ..
            } => service_account,
            Peer::Unmeshed => "unmeshed",
            Peer::Unknown => "unknown",
        }
    }

    /// What kind of name [`Peer::name`] is: `deploy`, `svc`, `sa`, `unmeshed`, `unknown`.
    pub fn kind(&self) -> &'static str {
        match self {
            Peer::Workload { .. } => "deploy",
            Peer::Service { .. } => "svc",
            Peer::Identity { .. } => "sa",
            Peer::Unmeshed => "unmeshed",
            Peer::Unknown => "unknown",
        }
    }
}

/// The pods and workloads the proxies report, to name peers after.
#[derive(Clone, Debug, Default)]
pub struct Directory {
    /// (namespace, pod) → workload.
    pods: BTreeMap<(String, String), String>,
    /// (namespace, workload).
    workloads: BTreeSet<(String, String)>,
}

impl Directory {
    /// The pods and workloads of the traffic series among `samples`.
    pub fn of<'a>(samples: impl IntoIterator<Item = &'a Sample>) -> Self {
        let mut d = Self::default();
        for t in samples.into_iter().filter_map(Traffic::of) {
            d.workloads
                .insert((t.namespace.clone(), t.workload.clone()));
            d.pods.insert((t.namespace, t.pod), t.workload);
        }
        d
    }

    /// Whether workload `namespace/name` has series.
    pub fn has_workload(&self, namespace: &str, name: &str) -> bool {
        self.workloads
            .contains(&(namespace.to_string(), name.to_string()))
    }

    /// The pods with series, as ((namespace, pod), workload).
    pub fn pods(&self) -> impl Iterator<Item = (&(String, String), &String)> {
        self.pods.iter()
    }

    /// How many pods with series `namespace` holds (of `workload`, when given).
    pub fn pod_count(&self, namespace: &str, workload: Option<&str>) -> usize {
        self.pods
            .iter()
            .filter(|((ns, _), w)| ns == namespace && workload.is_none_or(|x| x == w.as_str()))
            .count()
    }

    /// The workload an identity is named after, or the identity.
    fn identity(&self, id: &str) -> Option<Peer> {
        let id: WorkloadIdentity = id.parse().ok()?;
        let (namespace, sa) = (id.namespace(), id.service_account());
        Some(if self.has_workload(namespace, sa) {
            Peer::Workload {
                namespace: namespace.into(),
                name: sa.into(),
            }
        } else {
            Peer::Identity {
                namespace: namespace.into(),
                service_account: sa.into(),
            }
        })
    }

    /// The destination of an outbound series: the workload the proxy named, else the one
    /// named by the server's identity, else by the destination Service; else the Service;
    /// else the identity; else unknown.
    pub fn server(&self, t: &Traffic) -> Peer {
        if let Some((namespace, name)) = &t.dst_workload {
            return Peer::Workload {
                namespace: namespace.clone(),
                name: name.clone(),
            };
        }
        let by_id = self.identity(&t.peer_id);
        if let Some(p @ Peer::Workload { .. }) = by_id {
            return p;
        }
        if let Some((namespace, name)) = &t.dst_service {
            if self.has_workload(namespace, name) {
                return Peer::Workload {
                    namespace: namespace.clone(),
                    name: name.clone(),
                };
            }
            return Peer::Service {
                namespace: namespace.clone(),
                name: name.clone(),
            };
        }
        by_id.unwrap_or(Peer::Unknown)
    }

    /// The client of an inbound series: the workload named by its identity, else the
    /// identity; unmeshed without one.
    pub fn client(&self, t: &Traffic) -> Peer {
        if t.peer_id.is_empty() {
            return Peer::Unmeshed;
        }
        self.identity(&t.peer_id).unwrap_or(Peer::Unknown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stat::parse::parse;

    const TEXT: &str = "\
request_total{direction=\"outbound\",namespace=\"shop\",pod=\"web-1\",workload=\"web\",client_id=\"\",server_id=\"spiffe://cluster.local/ns/shop/sa/api\",dst_service=\"api.shop\",tls=\"true\"} 1
request_total{direction=\"outbound\",namespace=\"shop\",pod=\"web-1\",workload=\"web\",client_id=\"\",server_id=\"spiffe://cluster.local/ns/shop/sa/default\",dst_service=\"orders.shop\",tls=\"true\"} 1
request_total{direction=\"outbound\",namespace=\"shop\",pod=\"web-1\",workload=\"web\",client_id=\"\",server_id=\"spiffe://cluster.local/ns/pay/sa/default\",dst_service=\"\",tls=\"true\"} 1
request_total{direction=\"outbound\",namespace=\"shop\",pod=\"web-1\",workload=\"web\",client_id=\"\",server_id=\"\",dst_service=\"db.data\",tls=\"no_identity\"} 1
tcp_open_total{direction=\"outbound\",namespace=\"shop\",pod=\"web-1\",workload=\"web\",client_id=\"\",server_id=\"\",dst_service=\"\",tls=\"no_identity\"} 1
request_total{direction=\"inbound\",namespace=\"shop\",pod=\"api-7\",workload=\"api\",client_id=\"spiffe://cluster.local/ns/shop/sa/web\",server_id=\"\",dst_service=\"\",tls=\"true\"} 1
request_total{direction=\"inbound\",namespace=\"shop\",pod=\"orders-0\",workload=\"orders\",client_id=\"spiffe://cluster.local/ns/shop/sa/default\",server_id=\"\",dst_service=\"\",tls=\"true\"} 1
tcp_open_total{direction=\"inbound\",namespace=\"shop\",pod=\"api-8\",workload=\"api\",client_id=\"\",server_id=\"\",dst_service=\"\",tls=\"no_identity\"} 1
tcp_errors_total{direction=\"inbound\",error=\"client\"} 1
";

    #[test]
    fn peers_are_named_after_workloads_the_proxies_report() {
        let samples = parse(TEXT).unwrap();
        let dir = Directory::of(&samples);
        assert_eq!(dir.pod_count("shop", Some("api")), 2);
        assert_eq!(dir.pod_count("shop", None), 4);
        let t: Vec<Traffic> = samples.iter().filter_map(Traffic::of).collect();
        assert_eq!(t.len(), 8, "tcp_errors_total is no pod's traffic");
        let w = |ns: &str, n: &str| Peer::Workload {
            namespace: ns.into(),
            name: n.into(),
        };
        // By the server identity's ServiceAccount.
        assert_eq!(dir.server(&t[0]), w("shop", "api"));
        // `default` names no workload: by the Service.
        assert_eq!(dir.server(&t[1]), w("shop", "orders"));
        // Neither: the identity.
        assert_eq!(
            dir.server(&t[2]),
            Peer::Identity {
                namespace: "pay".into(),
                service_account: "default".into()
            }
        );
        // A Service outside the mesh.
        let db = dir.server(&t[3]);
        assert_eq!(
            (db.kind(), db.name(), db.namespace()),
            ("svc", "db", "data")
        );
        assert_eq!(dir.server(&t[4]), Peer::Unknown);
        // Inbound: the client's identity.
        assert_eq!(dir.client(&t[5]), w("shop", "web"));
        let c = dir.client(&t[6]);
        assert_eq!(
            (c.kind(), c.name(), c.namespace()),
            ("sa", "default", "shop")
        );
        assert_eq!(dir.client(&t[7]), Peer::Unmeshed);
    }

    /// The label set of today's proxies (docs/ARCHITECTURE.md "Metrics"): the local
    /// workload from `source_workload`/`destination_workload`, the server from
    /// `destination_workload`, the Service from `dst_namespace` and `dst_service`.
    #[test]
    fn the_scrape_proof_labels_name_the_local_workload_and_the_server() {
        let text = "\
request_total{direction=\"outbound\",namespace=\"shop\",pod=\"web-5d-x\",deployment=\"web\",server_id=\"spiffe://cluster.local/ns/shop/sa/default\",dst_namespace=\"shop\",dst_service=\"api\",dst_pod=\"api-0\",dst_statefulset=\"api-db\",tls=\"true\",source_workload_namespace=\"shop\",source_workload=\"web\",source_workload_kind=\"Deployment\",destination_workload_namespace=\"shop\",destination_workload=\"api-db\",destination_workload_kind=\"StatefulSet\"} 1
request_total{direction=\"outbound\",namespace=\"shop\",pod=\"web-5d-x\",deployment=\"web\",dst_namespace=\"data\",dst_service=\"db\",source_workload_namespace=\"shop\",source_workload=\"web\"} 1
request_total{direction=\"inbound\",namespace=\"shop\",pod=\"api-0\",statefulset=\"api-db\",client_id=\"spiffe://cluster.local/ns/shop/sa/web\",tls=\"true\",destination_workload_namespace=\"shop\",destination_workload=\"api-db\",destination_workload_kind=\"StatefulSet\",source_workload_namespace=\"shop\",source_principal=\"spiffe://cluster.local/ns/shop/sa/web\"} 1
";
        let samples = parse(text).unwrap();
        let dir = Directory::of(&samples);
        let t: Vec<Traffic> = samples.iter().filter_map(Traffic::of).collect();
        let w: Vec<&str> = t.iter().map(|t| t.workload.as_str()).collect();
        assert_eq!(w, ["web", "web", "api-db"]);
        // The proxy named the server's workload: not the identity's `default`.
        let api = Peer::Workload {
            namespace: "shop".into(),
            name: "api-db".into(),
        };
        assert_eq!(dir.server(&t[0]), api);
        let db = dir.server(&t[1]);
        assert_eq!(
            (db.kind(), db.name(), db.namespace()),
            ("svc", "db", "data")
        );
        assert_eq!(dir.pod_count("shop", Some("api-db")), 1);
    }
}
