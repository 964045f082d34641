//! Metrics of the discovery service.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::time::Duration;

/// Streams open, updates sent, watches refused, subscriptions, and the cost of a change.
#[derive(Clone, Debug)]
pub struct DiscoveryMetrics {
    streams: Gauge,
    updates: Counter,
    refused: Counter,
    resynced: Counter,
    subscriptions: Counter,
    targets_refused: Counter,
    targets: Gauge,
    workloads: Gauge,
    services: Gauge,
    changed: Counter,
    publish_seconds: Histogram,
}

impl Default for DiscoveryMetrics {
    fn default() -> Self {
        Self {
            streams: Gauge::default(),
            updates: Counter::default(),
            refused: Counter::default(),
            resynced: Counter::default(),
            subscriptions: Counter::default(),
            targets_refused: Counter::default(),
            targets: Gauge::default(),
            workloads: Gauge::default(),
            services: Gauge::default(),
            changed: Counter::default(),
            publish_seconds: Histogram::new([0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0]),
        }
    }
}

impl DiscoveryMetrics {
    /// Creates the metrics and registers them.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "discovery_streams",
            "Discovery streams open",
            m.streams.clone(),
        );
        registry.register(
            "discovery_updates",
            "Discovery updates sent (snapshots and deltas)",
            m.updates.clone(),
        );
        registry.register(
            "discovery_watches_refused",
            "Discovery watches refused (bad token, another node's name, a proxy that does not subscribe)",
            m.refused.clone(),
        );
        registry.register(
            "discovery_stream_resyncs",
            "Snapshots sent to streams that fell behind their queue",
            m.resynced.clone(),
        );
        registry.register(
            "discovery_subscriptions",
            "Targets subscribed by node proxies (addresses and Services)",
            m.subscriptions.clone(),
        );
        registry.register(
            "discovery_targets_refused",
            "Targets refused: neither an address nor a Service name",
            m.targets_refused.clone(),
        );
        registry.register(
            "discovery_targets",
            "Targets subscribed now, over every stream",
            m.targets.clone(),
        );
        registry.register(
            "discovery_catalog_workloads",
            "Pods rendered in the discovery catalog",
            m.workloads.clone(),
        );
        registry.register(
            "discovery_catalog_services",
            "Services rendered in the discovery catalog",
            m.services.clone(),
        );
        registry.register(
            "discovery_changed_resources",
            "Pods, Services and targets whose rendering changed",
            m.changed.clone(),
        );
        registry.register(
            "discovery_publish_seconds",
            "Time to render an index change and queue it for the streams that hold it",
            m.publish_seconds.clone(),
        );
        m
    }

    pub(super) fn published(
        &self,
        changed: usize,
        took: Duration,
        workloads: usize,
        services: usize,
        targets: usize,
    ) {
        self.changed.inc_by(changed as u64);
        self.publish_seconds.observe(took.as_secs_f64());
        self.workloads.set(workloads as i64);
        self.services.set(services as i64);
        self.targets.set(targets as i64);
    }

    pub(super) fn subscribed(&self, subscribed: usize, refused: usize, targets: usize) {
        self.subscriptions.inc_by(subscribed as u64);
        self.targets_refused.inc_by(refused as u64);
        self.targets.set(targets as i64);
    }

    pub(super) fn resynced(&self) {
        self.resynced.inc();
    }

    pub(super) fn stream_opened(&self) {
        self.streams.inc();
    }

    pub(super) fn stream_closed(&self) {
        self.streams.dec();
    }

    pub(super) fn update_sent(&self) {
        self.updates.inc();
    }

    pub(super) fn refused(&self) {
        self.refused.inc();
    }
}
