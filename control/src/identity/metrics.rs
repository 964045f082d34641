//! Metrics of the identity service.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

/// Certificates issued and refused (the issuer's expiry is `pki::reload`'s).
#[derive(Clone, Debug, Default)]
pub struct IdentityMetrics {
    issued: Counter,
    refused: Family<ReasonLabels, Counter>,
}

impl IdentityMetrics {
    /// Creates the metrics and registers them.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "identity_certificates_issued",
            "Workload certificates issued",
            m.issued.clone(),
        );
        registry.register(
            "identity_requests_refused",
            "Certificate requests refused, by reason (the gRPC status: unauthenticated, permission_denied, invalid_argument, internal)",
            m.refused.clone(),
        );
        m
    }

    pub(super) fn issued(&self) {
        self.issued.inc();
    }

    pub(super) fn refused(&self, code: tonic::Code) {
        let reason = match code {
            tonic::Code::Unauthenticated => "unauthenticated",
            tonic::Code::PermissionDenied => "permission_denied",
            tonic::Code::InvalidArgument => "invalid_argument",
            _ => "internal",
        };
        self.refused
            .get_or_create(&ReasonLabels {
                reason: reason.into(),
            })
            .inc();
    }
}
