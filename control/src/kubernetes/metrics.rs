//! Metrics of the Kubernetes backend.

use crate::index::Kind;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

/// Watches, objects and TokenReviews.
#[derive(Clone, Debug, Default)]
pub struct KubeMetrics {
    restarts: Family<KindLabels, Counter>,
    errors: Family<KindLabels, Counter>,
    invalid: Family<KindLabels, Counter>,
    objects: Family<KindLabels, Gauge>,
    token_reviews: Family<ResultLabels, Counter>,
}

impl KubeMetrics {
    /// Creates the metrics and registers them.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "kube_watch_restarts",
            "Re-lists of a kind after the first list (a 410 Gone, a lost connection), by kind",
            m.restarts.clone(),
        );
        registry.register(
            "kube_watch_errors",
            "Errors of a kind's watch (each retried with backoff), by kind",
            m.errors.clone(),
        );
        registry.register(
            "kube_objects_invalid",
            "Objects skipped because the mesh cannot use them (logged with the field), by kind",
            m.invalid.clone(),
        );
        registry.register(
            "kube_objects",
            "Objects held from the API server, by kind",
            m.objects.clone(),
        );
        registry.register(
            "kube_token_reviews",
            "Node tokens checked, by result (reviewed: a TokenReview was made; cached: a recent answer was reused; shared: the answer of a review in progress for the same token; failed: the API server could not be asked)",
            m.token_reviews.clone(),
        );
        m
    }

    pub(super) fn restarted(&self, kind: Kind) {
        self.restarts.get_or_create(&labels(kind)).inc();
    }

    pub(super) fn error(&self, kind: Kind) {
        self.errors.get_or_create(&labels(kind)).inc();
    }

    pub(super) fn invalid(&self, kind: Kind) {
        self.invalid.get_or_create(&labels(kind)).inc();
    }

    pub(super) fn set_objects(&self, kind: Kind, n: usize) {
        self.objects
            .get_or_create(&labels(kind))
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub(super) fn token_review(&self, result: &'static str) {
        self.token_reviews
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }
}

fn labels(kind: Kind) -> KindLabels {
    KindLabels {
        kind: kind.as_str().into(),
    }
}
