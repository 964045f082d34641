//! Metrics of the discovery service.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Streams open, updates sent, watches refused.
#[derive(Clone, Debug, Default)]
pub struct DiscoveryMetrics {
    streams: Gauge,
    updates: Counter,
    refused: Counter,
    resynced: Counter,
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
            "Discovery watches refused (bad token or another node's name)",
            m.refused.clone(),
        );
        registry.register(
            "discovery_stream_resyncs",
            "Snapshots sent to streams that fell behind the published deltas",
            m.resynced.clone(),
        );
        m
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
