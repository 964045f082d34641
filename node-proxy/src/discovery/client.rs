//! The discovery stream client, with reconnection and backoff.

use super::DiscoveryState;
use crate::token::TokenSource;
use ambit_api::proto::discovery::discovery_client::DiscoveryClient as PbClient;
use ambit_api::proto::discovery::WatchRequest;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tonic::transport::Channel;

/// Updates received, reconnects, resources skipped as invalid, and whether the stream is up.
#[derive(Clone, Debug, Default)]
pub struct DiscoveryMetrics {
    updates: Counter,
    reconnects: Counter,
    invalid: Counter,
    connected: Gauge,
}

impl DiscoveryMetrics {
    /// Creates the metrics and registers them.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "discovery_updates",
            "Discovery updates applied",
            m.updates.clone(),
        );
        registry.register(
            "discovery_reconnects",
            "Discovery streams re-opened after a failure",
            m.reconnects.clone(),
        );
        registry.register(
            "discovery_invalid_resources",
            "Discovery resources ignored as invalid",
            m.invalid.clone(),
        );
        registry.register(
            "discovery_connected",
            "1 while the discovery stream is open",
            m.connected.clone(),
        );
        m
    }
}

/// Watches the control plane's discovery service for one node.
#[derive(Clone, Debug)]
pub struct DiscoveryClient {
    channel: Channel,
    token: TokenSource,
    node: String,
    backoff_initial: Duration,
    backoff_max: Duration,
}

impl DiscoveryClient {
    /// A client of the discovery service over `channel` for `node`, authenticating with
    /// the token `token` holds when each stream opens.
    pub fn new(channel: Channel, token: impl Into<TokenSource>, node: String) -> Self {
        Self {
            channel,
            token: token.into(),
            node,
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
        }
    }

    /// Streams updates into `state` until `shutdown` resolves; reconnects with backoff.
    pub async fn run(
        self,
        state: watch::Sender<Arc<DiscoveryState>>,
        metrics: DiscoveryMetrics,
        shutdown: impl Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        let mut backoff = self.backoff_initial;
        let mut first = true;
        loop {
            if !first {
                metrics.reconnects.inc();
            }
            first = false;
            tokio::select! {
                _ = &mut shutdown => return,
                result = self.stream(&state, &metrics) => {
                    metrics.connected.set(0);
                    match result {
                        // The stream delivered something: start the backoff afresh.
                        Ok(true) => backoff = self.backoff_initial,
                        Ok(false) => {}
                        Err(error) => tracing::warn!(%error, retry_in = ?backoff, "discovery stream failed; keeping the last state"),
                    }
                }
            }
            let delay = backoff + backoff.mul_f64(fastrand::f64() * 0.1);
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(delay) => {}
            }
            backoff = (backoff * 2).min(self.backoff_max);
        }
    }

    /// One stream, until it ends; `Ok(true)` if it delivered at least one update.
    async fn stream(
        &self,
        state: &watch::Sender<Arc<DiscoveryState>>,
        metrics: &DiscoveryMetrics,
    ) -> Result<bool, String> {
        let channel = self.channel.clone();
        let mut req = tonic::Request::new(WatchRequest {
            node: self.node.clone(),
        });
        let header = self.token.current().bearer().map_err(|e| e.to_string())?;
        req.metadata_mut().insert("authorization", header);
        let mut stream = PbClient::new(channel)
            .watch(req)
            .await
            .map_err(|s| format!("watch refused ({:?}): {}", s.code(), s.message()))?
            .into_inner();
        metrics.connected.set(1);
        let mut delivered = false;
        let mut chunks = super::chunks::Chunks::default();
        loop {
            let update = match stream.message().await {
                Ok(Some(u)) => u,
                Ok(None) => return Ok(delivered),
                Err(s) => {
                    return if delivered {
                        Ok(true)
                    } else {
                        Err(format!("{:?}: {}", s.code(), s.message()))
                    };
                }
            };
            metrics.updates.inc();
            let Some(update) = chunks.push(update) else {
                continue;
            };
            delivered = true;
            let snapshot = update.snapshot;
            state.send_modify(|s| {
                for bad in Arc::make_mut(s).apply(update) {
                    metrics.invalid.inc();
                    tracing::warn!(error = %bad, "ignoring a discovery resource");
                }
            });
            tracing::debug!(snapshot, "discovery update applied");
        }
    }
}
