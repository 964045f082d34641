//! Metrics of the identity manager.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct IdentityLabels {
    identity: String,
}

impl IdentityLabels {
    pub(super) fn new(id: &ambit_api::WorkloadIdentity) -> Self {
        Self {
            identity: id.to_string(),
        }
    }
}

/// Certificate expiry, refreshes and failures per workload identity.
#[derive(Clone, Debug, Default)]
pub struct IdentityMetrics {
    pub(super) expiration: Family<IdentityLabels, Gauge>,
    pub(super) refreshes: Family<IdentityLabels, Counter>,
    pub(super) failures: Family<IdentityLabels, Counter>,
}

impl IdentityMetrics {
    /// Creates the metrics and registers them.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "identity_cert_expiration_timestamp_seconds",
            "notAfter of the current workload certificate, seconds since the Unix epoch",
            m.expiration.clone(),
        );
        registry.register(
            "identity_cert_refresh",
            "Workload certificates obtained from the identity service",
            m.refreshes.clone(),
        );
        registry.register(
            "identity_cert_refresh_failure",
            "Failed attempts to obtain a workload certificate",
            m.failures.clone(),
        );
        m
    }

    /// Drops the series of an identity that left the node.
    pub(super) fn remove(&self, labels: &IdentityLabels) {
        self.expiration.remove(labels);
        self.refreshes.remove(labels);
        self.failures.remove(labels);
    }
}
