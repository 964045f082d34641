//! Connection metrics of the data path, with Linkerd's names.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};

/// Labels of proxied traffic: a TCP connection's, and (with Linkerd) a request's, whose
/// responses add their status.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TrafficLabels {
    /// `inbound` or `outbound`.
    pub direction: String,
    /// The local pod's namespace.
    pub namespace: String,
    /// The local pod.
    pub pod: String,
    /// The local pod's workload.
    pub workload: String,
    /// Inbound: the client's proven identity ("" without mTLS).
    pub client_id: String,
    /// Outbound: the server's proven identity ("" without mTLS).
    pub server_id: String,
    /// Outbound: the destination Service as `<name>.<namespace>`, when there is one.
    pub dst_service: String,
    /// `true` when the hop to the peer proxy is mTLS, `no_identity` otherwise.
    pub tls: String,
}

impl TrafficLabels {
    /// An inbound connection to `w` from `client_id` ("" without mTLS).
    pub fn inbound(w: &crate::discovery::Workload, client_id: String) -> Self {
        let tls = if client_id.is_empty() {
            "no_identity"
        } else {
            "true"
        };
        Self::new("inbound", w, client_id, String::new(), String::new(), tls)
    }

    /// An outbound connection from `w` to `server_id` ("" without mTLS), to `dst_service`.
    pub fn outbound(
        w: &crate::discovery::Workload,
        server_id: String,
        dst_service: String,
    ) -> Self {
        let tls = if server_id.is_empty() {
            "no_identity"
        } else {
            "true"
        };
        Self::new("outbound", w, String::new(), server_id, dst_service, tls)
    }

    fn new(
        direction: &str,
        w: &crate::discovery::Workload,
        client_id: String,
        server_id: String,
        dst_service: String,
        tls: &str,
    ) -> Self {
        Self {
            direction: direction.into(),
            namespace: w.namespace.clone(),
            pod: w.name.clone(),
            workload: w.workload.clone(),
            client_id,
            server_id,
            dst_service,
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
        self.close_total.get_or_create(l).inc();
        self.open_connections.get_or_create(l).dec();
        self.read_bytes.get_or_create(l).inc_by(read);
        self.write_bytes.get_or_create(l).inc_by(written);
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

    #[test]
    fn a_departed_pods_series_are_dropped() {
        let mut r = Registry::default();
        let m = TcpMetrics::register(&mut r);
        let l = |pod: &str| TrafficLabels {
            direction: "inbound".into(),
            namespace: "shop".into(),
            pod: pod.into(),
            workload: pod.into(),
            client_id: String::new(),
            server_id: String::new(),
            dst_service: String::new(),
            tls: "true".into(),
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
