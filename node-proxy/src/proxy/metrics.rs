//! Connection metrics of the data path, with Linkerd's names.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels of a proxied TCP connection.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TcpLabels {
    /// `inbound` or `outbound`.
    pub direction: String,
    /// The local pod's namespace.
    pub namespace: String,
    /// The local pod.
    pub pod: String,
    /// The local pod's workload.
    pub workload: String,
    /// The peer's proven identity: the client's on inbound, the server's on outbound.
    pub peer_id: String,
    /// `true` when the hop to the peer proxy is mTLS, `no_identity` otherwise.
    pub tls: String,
}

/// Why a connection failed, for `tcp_errors_total{error}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// `inbound` or `outbound`.
    pub direction: String,
    /// A short cause an operator can act on.
    pub error: String,
}

/// TCP golden metrics.
#[derive(Clone, Debug, Default)]
pub struct TcpMetrics {
    open_total: Family<TcpLabels, Counter>,
    close_total: Family<TcpLabels, Counter>,
    open_connections: Family<TcpLabels, Gauge>,
    read_bytes: Family<TcpLabels, Counter>,
    write_bytes: Family<TcpLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
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
        m
    }

    /// A connection opened.
    pub fn opened(&self, l: &TcpLabels) {
        self.open_total.get_or_create(l).inc();
        self.open_connections.get_or_create(l).inc();
    }

    /// A connection closed after moving `read` and `written` bytes.
    pub fn closed(&self, l: &TcpLabels, read: u64, written: u64) {
        self.close_total.get_or_create(l).inc();
        self.open_connections.get_or_create(l).dec();
        self.read_bytes.get_or_create(l).inc_by(read);
        self.write_bytes.get_or_create(l).inc_by(written);
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
