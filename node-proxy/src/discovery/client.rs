//! The discovery stream client, with reconnection and backoff.

use super::DiscoveryState;
use crate::stream::{Chunks, Reconnect};
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

/// The largest discovery message the proxy decodes. The control plane sends snapshots and
/// deltas in chunks of at most 256 resources and 1 MiB (past a chunk's first resource),
/// so a message is at most that or one resource: a Service is about 110 bytes per
/// endpoint, so 16 MiB allows ~150,000 endpoints behind one Service (tonic's default of
/// 4 MiB, ~38,000). Measured: largest message 263 KB in the 100,000-pod benchmark, 770 KB
/// in the test with a 5,000-endpoint Service (BENCHMARKS.md). One stream per proxy, from
/// an authenticated control plane: the room costs nothing until it is used.
pub const MAX_MESSAGE: usize = 16 << 20;

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
        let reconnect = Reconnect {
            name: "discovery",
            reconnects: metrics.reconnects.clone(),
            connected: metrics.connected.clone(),
            backoff_initial: self.backoff_initial,
            backoff_max: self.backoff_max,
        };
        reconnect
            .run(|| self.stream(&state, &metrics), shutdown)
            .await;
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
            .max_decoding_message_size(MAX_MESSAGE)
            .watch(req)
            .await
            .map_err(|s| format!("watch refused ({:?}): {}", s.code(), s.message()))?
            .into_inner();
        metrics.connected.set(1);
        let mut delivered = false;
        let mut chunks = Chunks::default();
        loop {
            let update = match stream.message().await {
                Ok(Some(u)) => u,
                Ok(None) => return Ok(delivered),
                Err(s) => {
                    // Said either way: a stream that dies after delivering (an oversized
                    // message, a control plane going away) must not pass in silence.
                    tracing::warn!(code = ?s.code(), error = %s.message(), delivered, "discovery stream ended with an error; reconnecting");
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
