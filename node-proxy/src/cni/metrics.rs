//! The CNI socket's counters: `cni_requests_total` and `cni_peers_refused_total`.

use ambit_api::cni::Response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Labels of `cni_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CniLabels {
    /// add, del, check, status, gc, invalid, or busy (not read: too many at once).
    pub command: String,
    /// redirected, not_meshed, ok, or error.
    pub result: String,
}

/// Labels of `cni_peers_refused_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerLabels {
    /// uid, binary, pid_namespace, or unverifiable ([`super::peer::Refusal::reason`]).
    pub reason: String,
}

/// Metrics of the CNI socket.
#[derive(Clone, Debug, Default)]
pub struct CniMetrics {
    requests: Family<CniLabels, Counter>,
    peers_refused: Family<PeerLabels, Counter>,
}

impl CniMetrics {
    /// Registers `cni_requests_total` and `cni_peers_refused_total`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "cni_requests",
            "Requests from the CNI plugin, by command and result",
            m.requests.clone(),
        );
        registry.register(
            "cni_peers_refused",
            "Connections to the CNI socket refused before their request was read: a peer that is not root, or not the plugin's binary, or that could not be checked",
            m.peers_refused.clone(),
        );
        m
    }

    /// A connection refused before its request was read, for `reason`.
    pub(super) fn peer_refused(&self, reason: &str) {
        self.peers_refused
            .get_or_create(&PeerLabels {
                reason: reason.into(),
            })
            .inc();
    }

    /// A request answered with `response`.
    pub(super) fn count(&self, command: &str, response: &Response) {
        let result = match response {
            Response::Redirected => "redirected",
            Response::NotMeshed => "not_meshed",
            Response::Ok => "ok",
            Response::Error { .. } => "error",
        };
        self.requests
            .get_or_create(&CniLabels {
                command: command.into(),
                result: result.into(),
            })
            .inc();
    }
}
