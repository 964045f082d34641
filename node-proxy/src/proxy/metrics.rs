//! Connection metrics of the data path, with Linkerd's names.

use crate::discovery::PodRef;
use prometheus_client::encoding::{EncodeLabel, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};

/// Labels of proxied traffic: a TCP connection's, and (with Linkerd) a request's, whose
/// responses add their status.
///
/// A node proxy is scraped as a pod of namespace `ambit`, so a scrape that does not honour
/// the target's labels (a PodMonitor without `honorLabels`, most annotation scrapes)
/// renames our `namespace` and `pod` to `exported_namespace`/`exported_pod`. Each series
/// therefore says who it is about twice (docs/ARCHITECTURE.md "Metrics"):
/// - Linkerd's names, for Linkerd's queries and dashboards (they need `honorLabels`, as
///   the chart's PodMonitor sets): `namespace`, `pod` and the workload by kind
///   (`deployment`, `statefulset`, `daemonset`, `k8s_job`, ...) of the local pod;
///   `client_id` inbound; `server_id`, `dst_namespace`, `dst_service`, `dst_pod` and
///   `dst_<kind>` outbound;
/// - names no scrape rewrites, as ztunnel's: `source_*` and `destination_*` (workload,
///   its kind and namespace, principal; the destination Service).
///
/// Empty values are left out (Prometheus reads an empty label as no label).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct TrafficLabels {
    /// `inbound` or `outbound`.
    pub direction: String,
    /// The local pod's namespace.
    pub namespace: String,
    /// The local pod.
    pub pod: String,
    /// The local pod's workload.
    pub workload: String,
    /// Its kind (`Deployment`, ..., `Pod`).
    pub workload_kind: String,
    /// The local pod's identity.
    pub identity: String,
    /// Inbound: the client's proven identity ("" without mTLS).
    pub client_id: String,
    /// Outbound: the server's proven identity ("" without mTLS).
    pub server_id: String,
    /// Outbound: the destination Service's name, when there is one.
    pub dst_service: String,
    /// Outbound: the destination Service's namespace (or the destination pod's).
    pub dst_namespace: String,
    /// Outbound: the pod that served, when it is one the control plane knows.
    pub dst: Option<Arc<PodRef>>,
    /// `true` when the hop to the peer proxy is mTLS, `no_identity` otherwise.
    pub tls: String,
}

/// An outbound destination's `(dst_namespace, dst_service)`.
pub type DstService = (String, String);

/// Linkerd's label for a workload of `kind` (Prometheus' own `job` label is why a Job is
/// `k8s_job`); none for a bare pod or a kind Linkerd does not name.
pub fn kind_label(kind: &str) -> Option<&'static str> {
    Some(match kind {
        "Deployment" => "deployment",
        "StatefulSet" => "statefulset",
        "DaemonSet" => "daemonset",
        "Job" => "k8s_job",
        "CronJob" => "cronjob",
        "ReplicaSet" => "replicaset",
        "ReplicationController" => "replicationcontroller",
        _ => return None,
    })
}

fn label(
    encoder: &mut prometheus_client::encoding::LabelSetEncoder<'_>,
    key: &str,
    value: &str,
) -> std::fmt::Result {
    if value.is_empty() {
        return Ok(());
    }
    (key, value).encode(encoder.encode_label())
}

/// A local pod's labels on series that are about it alone (routes, authorization): as
/// Linkerd names them (`namespace`, `pod`, `<kind>`) and as no scrape renames them
/// (`{side}_workload_namespace`, `{side}_workload`, `{side}_workload_kind`; `side` is
/// `source` or `destination`).
pub fn encode_pod(
    e: &mut prometheus_client::encoding::LabelSetEncoder<'_>,
    side: &str,
    w: [&str; 4],
) -> std::fmt::Result {
    let [namespace, pod, workload, kind] = w;
    label(e, "namespace", namespace)?;
    label(e, "pod", pod)?;
    if let Some(k) = kind_label(kind) {
        label(e, k, workload)?;
    }
    label(e, &format!("{side}_workload_namespace"), namespace)?;
    label(e, &format!("{side}_workload"), workload)?;
    label(e, &format!("{side}_workload_kind"), kind)
}

impl prometheus_client::encoding::EncodeLabelSet for TrafficLabels {
    fn encode(&self, e: &mut prometheus_client::encoding::LabelSetEncoder<'_>) -> std::fmt::Result {
        let inbound = self.direction == "inbound";
        label(e, "direction", &self.direction)?;
        // Linkerd's.
        label(e, "namespace", &self.namespace)?;
        label(e, "pod", &self.pod)?;
        if let Some(k) = kind_label(&self.workload_kind) {
            label(e, k, &self.workload)?;
        }
        label(e, "client_id", &self.client_id)?;
        label(e, "server_id", &self.server_id)?;
        label(e, "dst_namespace", &self.dst_namespace)?;
        label(e, "dst_service", &self.dst_service)?;
        if let Some(d) = &self.dst {
            label(e, "dst_pod", &d.pod)?;
            if let Some(k) = kind_label(&d.workload_kind) {
                label(e, &format!("dst_{k}"), &d.workload)?;
            }
        }
        label(e, "tls", &self.tls)?;
        // ztunnel's, which no scrape renames.
        let (local, peer) = if inbound {
            ("destination", "source")
        } else {
            ("source", "destination")
        };
        label(e, &format!("{local}_workload_namespace"), &self.namespace)?;
        label(e, &format!("{local}_workload"), &self.workload)?;
        label(e, &format!("{local}_workload_kind"), &self.workload_kind)?;
        label(e, &format!("{local}_principal"), &self.identity)?;
        if inbound {
            // What the client proved: its namespace, not yet its workload.
            let client = self.client_id.parse::<ambit_api::WorkloadIdentity>().ok();
            let client_ns = client.as_ref().map(|c| c.namespace()).unwrap_or_default();
            label(e, "source_workload_namespace", client_ns)?;
            label(e, "source_principal", &self.client_id)?;
        } else {
            let ns = self
                .dst
                .as_ref()
                .map_or(&self.dst_namespace, |d| &d.namespace);
            label(e, &format!("{peer}_workload_namespace"), ns)?;
            if let Some(d) = &self.dst {
                label(e, "destination_workload", &d.workload)?;
                label(e, "destination_workload_kind", &d.workload_kind)?;
            }
            label(e, "destination_principal", &self.server_id)?;
            label(e, "destination_service_namespace", &self.dst_namespace)?;
            label(e, "destination_service_name", &self.dst_service)?;
        }
        Ok(())
    }
}

impl TrafficLabels {
    /// An inbound connection to `w` from `client_id` ("" without mTLS).
    pub fn inbound(w: &crate::discovery::Workload, client_id: String) -> Self {
        let tls = if client_id.is_empty() {
            "no_identity"
        } else {
            "true"
        };
        let mut l = Self::local("inbound", w, tls);
        l.client_id = client_id;
        l
    }

    /// An outbound connection from `w` to `server_id` ("" without mTLS), to `dst` (the
    /// Service's `(namespace, name)`, or the pod's namespace and "").
    pub fn outbound(w: &crate::discovery::Workload, server_id: String, dst: DstService) -> Self {
        let tls = if server_id.is_empty() {
            "no_identity"
        } else {
            "true"
        };
        let mut l = Self::local("outbound", w, tls);
        l.server_id = server_id;
        (l.dst_namespace, l.dst_service) = dst;
        l
    }

    fn local(direction: &str, w: &crate::discovery::Workload, tls: &str) -> Self {
        Self {
            direction: direction.into(),
            namespace: w.namespace.clone(),
            pod: w.name.clone(),
            workload: w.workload.clone(),
            workload_kind: w.workload_kind.clone(),
            identity: w.identity.to_string(),
            client_id: String::new(),
            server_id: String::new(),
            dst_service: String::new(),
            dst_namespace: String::new(),
            dst: None,
            tls: tls.into(),
        }
    }
}

/// Why a connection failed, for `tcp_errors_total{error}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// `inbound` or `outbound`.
    pub direction: String,
    /// A short cause an operator can act on.
    pub error: String,
}

/// (namespace, pod).
type PodKey = (String, String);

/// The label sets created for each local pod, so that a departed pod's series can be
/// dropped (bounded cardinality).
#[derive(Clone, Debug)]
pub struct SeriesTracker<L> {
    by_pod: Arc<Mutex<HashMap<PodKey, HashSet<L>>>>,
}

impl<L> Default for SeriesTracker<L> {
    fn default() -> Self {
        Self {
            by_pod: Arc::default(),
        }
    }
}

impl<L: Clone + Eq + Hash> SeriesTracker<L> {
    /// Remembers `labels` as a series of pod `namespace/pod`.
    pub fn track(&self, namespace: &str, pod: &str, labels: &L) {
        let mut m = self.by_pod.lock().unwrap_or_else(PoisonError::into_inner);
        let set = m
            .entry((namespace.to_string(), pod.to_string()))
            .or_default();
        if !set.contains(labels) {
            set.insert(labels.clone());
        }
    }

    /// Forgets the pod and returns its series.
    pub fn take(&self, namespace: &str, pod: &str) -> HashSet<L> {
        self.by_pod
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(namespace.to_string(), pod.to_string()))
            .unwrap_or_default()
    }
}

/// TCP golden metrics.
#[derive(Clone, Debug, Default)]
pub struct TcpMetrics {
    series: SeriesTracker<TrafficLabels>,
    open_total: Family<TrafficLabels, Counter>,
    close_total: Family<TrafficLabels, Counter>,
    open_connections: Family<TrafficLabels, Gauge>,
    read_bytes: Family<TrafficLabels, Counter>,
    write_bytes: Family<TrafficLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    transport: Family<TransportLabels, Counter>,
}

/// How an opaque stream between node proxies was carried, for `tcp_mesh_transport_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransportLabels {
    /// `inbound` or `outbound`.
    pub direction: String,
    /// `kernel_tls` (a connection of its own, spliced), `tls` (a connection of its own,
    /// rustls in user space: this end has no kernel TLS), or `h2_connect` (a CONNECT
    /// stream on the pooled tunnel).
    pub transport: String,
}

impl TcpMetrics {
    /// Creates the metrics and registers them.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register("tcp_open", "TCP connections opened", m.open_total.clone());
        registry.register("tcp_close", "TCP connections closed", m.close_total.clone());
        registry.register(
            "tcp_open_connections",
            "TCP connections open now",
            m.open_connections.clone(),
        );
        registry.register(
            "tcp_read_bytes",
            "Bytes read from the connection's client side",
            m.read_bytes.clone(),
        );
        registry.register(
            "tcp_write_bytes",
            "Bytes written to the connection's client side",
            m.write_bytes.clone(),
        );
        registry.register(
            "tcp_errors",
            "Connections that failed, by cause",
            m.errors.clone(),
        );
        registry.register(
            "tcp_mesh_transport",
            "Opaque streams between node proxies, by how they were carried",
            m.transport.clone(),
        );
        m
    }

    /// Drops every series of a pod that left the node.
    pub fn forget_pod(&self, namespace: &str, pod: &str) {
        for l in self.series.take(namespace, pod) {
            self.open_total.remove(&l);
            self.close_total.remove(&l);
            self.open_connections.remove(&l);
            self.read_bytes.remove(&l);
            self.write_bytes.remove(&l);
        }
    }

    /// A connection opened.
    pub fn opened(&self, l: &TrafficLabels) {
        self.series.track(&l.namespace, &l.pod, l);
        self.open_total.get_or_create(l).inc();
        self.open_connections.get_or_create(l).inc();
    }

    /// A connection closed after moving `read` and `written` bytes.
    pub fn closed(&self, l: &TrafficLabels, read: u64, written: u64) {
        self.ended(l);
        self.read_bytes.get_or_create(l).inc_by(read);
        self.write_bytes.get_or_create(l).inc_by(written);
    }

    /// A connection whose bytes were counted as they moved ([`Self::byte_counters`])
    /// closed.
    pub fn ended(&self, l: &TrafficLabels) {
        self.close_total.get_or_create(l).inc();
        self.open_connections.get_or_create(l).dec();
    }

    /// The read and written byte counters of `l`'s series, for a connection that counts
    /// its bytes while it is open (an atomic add each, no label lookup).
    pub fn byte_counters(&self, l: &TrafficLabels) -> (Counter, Counter) {
        (
            self.read_bytes.get_or_create(l).clone(),
            self.write_bytes.get_or_create(l).clone(),
        )
    }

    /// An opaque stream between node proxies opened on `transport`.
    pub fn transport(&self, direction: &str, transport: &str) {
        self.transport
            .get_or_create(&TransportLabels {
                direction: direction.into(),
                transport: transport.into(),
            })
            .inc();
    }

    /// A connection failed.
    pub fn error(&self, direction: &str, error: &str) {
        self.errors
            .get_or_create(&ErrorLabels {
                direction: direction.into(),
                error: error.into(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(direction: &str) -> TrafficLabels {
        TrafficLabels {
            direction: direction.into(),
            namespace: "shop".into(),
            pod: "web-5d4f8-x2".into(),
            workload: "web".into(),
            workload_kind: "Deployment".into(),
            identity: "spiffe://cluster.local/ns/shop/sa/web".into(),
            client_id: String::new(),
            server_id: String::new(),
            dst_service: String::new(),
            dst_namespace: String::new(),
            dst: None,
            tls: "true".into(),
        }
    }

    fn exposed(l: &TrafficLabels) -> String {
        let mut r = Registry::default();
        let m = TcpMetrics::register(&mut r);
        m.opened(l);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with("tcp_open_total{"))
            .unwrap();
        line.to_string()
    }

    #[test]
    fn inbound_labels_name_the_pod_as_linkerd_and_as_ztunnel_does() {
        let mut l = labels("inbound");
        l.client_id = "spiffe://cluster.local/ns/books/sa/catalog".into();
        assert_eq!(
            exposed(&l),
            "tcp_open_total{direction=\"inbound\",namespace=\"shop\",pod=\"web-5d4f8-x2\",\
             deployment=\"web\",client_id=\"spiffe://cluster.local/ns/books/sa/catalog\",\
             tls=\"true\",destination_workload_namespace=\"shop\",destination_workload=\"web\",\
             destination_workload_kind=\"Deployment\",\
             destination_principal=\"spiffe://cluster.local/ns/shop/sa/web\",\
             source_workload_namespace=\"books\",\
             source_principal=\"spiffe://cluster.local/ns/books/sa/catalog\"} 1"
        );
    }

    #[test]
    fn outbound_labels_name_the_endpoint_and_its_workload_and_a_job_is_k8s_job() {
        let mut l = labels("outbound");
        l.workload_kind = "Job".into();
        l.server_id = "spiffe://cluster.local/ns/books/sa/catalog".into();
        (l.dst_namespace, l.dst_service) = ("books".into(), "catalog".into());
        l.dst = Some(Arc::new(PodRef {
            namespace: "books".into(),
            pod: "catalog-0".into(),
            workload: "catalog".into(),
            workload_kind: "StatefulSet".into(),
        }));
        assert_eq!(
            exposed(&l),
            "tcp_open_total{direction=\"outbound\",namespace=\"shop\",pod=\"web-5d4f8-x2\",\
             k8s_job=\"web\",server_id=\"spiffe://cluster.local/ns/books/sa/catalog\",\
             dst_namespace=\"books\",dst_service=\"catalog\",dst_pod=\"catalog-0\",\
             dst_statefulset=\"catalog\",tls=\"true\",source_workload_namespace=\"shop\",\
             source_workload=\"web\",source_workload_kind=\"Job\",\
             source_principal=\"spiffe://cluster.local/ns/shop/sa/web\",\
             destination_workload_namespace=\"books\",destination_workload=\"catalog\",\
             destination_workload_kind=\"StatefulSet\",\
             destination_principal=\"spiffe://cluster.local/ns/books/sa/catalog\",\
             destination_service_namespace=\"books\",destination_service_name=\"catalog\"} 1"
        );
    }

    #[test]
    fn a_departed_pods_series_are_dropped() {
        let mut r = Registry::default();
        let m = TcpMetrics::register(&mut r);
        let l = |pod: &str| TrafficLabels {
            pod: pod.into(),
            ..labels("inbound")
        };
        m.opened(&l("web-0"));
        m.closed(&l("web-0"), 10, 20);
        m.opened(&l("web-1"));
        m.forget_pod("shop", "web-0");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        assert!(!text.contains("web-0"), "{text}");
        assert!(text.contains("pod=\"web-1\""), "{text}");
    }
}
