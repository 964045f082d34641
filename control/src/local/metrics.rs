//! Metrics of the local backend.

use crate::index::ClusterIndex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

/// Reloads of the local directory and what it holds.
#[derive(Clone, Debug, Default)]
pub struct LocalMetrics {
    reloads: Family<ResultLabels, Counter>,
    objects: Family<KindLabels, Gauge>,
}

impl LocalMetrics {
    /// Creates the metrics and registers them.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "local_reloads",
            "Reloads of the local cluster directory, by result (success, failure)",
            m.reloads.clone(),
        );
        registry.register(
            "local_objects",
            "Objects held from the local cluster directory, by kind",
            m.objects.clone(),
        );
        m
    }

    /// Records a good (re)load of `index`.
    pub fn record_success(&self, index: &ClusterIndex) {
        self.reloads.get_or_create(&result("success")).inc();
        self.set_objects(index);
    }

    /// Records a reload that failed (the last good state stays).
    pub fn record_failure(&self) {
        self.reloads.get_or_create(&result("failure")).inc();
    }

    /// Sets the object gauges from `index`.
    pub fn set_objects(&self, index: &ClusterIndex) {
        for (kind, n) in index.counts() {
            self.objects
                .get_or_create(&KindLabels {
                    kind: kind.as_str().into(),
                })
                .set(n as i64);
        }
    }
}

fn result(r: &str) -> ResultLabels {
    ResultLabels { result: r.into() }
}
