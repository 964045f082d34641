//! The discovery stream client, with reconnection and backoff.

use super::subscriptions::{Subscriptions, Target};
use super::DiscoveryState;
use crate::stream::{Chunks, Reconnect, StreamEnd};
use crate::token::TokenSource;
use ambit_api::proto::discovery::discovery_client::DiscoveryClient as PbClient;
use ambit_api::proto::discovery::WatchRequest;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
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
    /// The gauge that is 1 while the stream is open.
    pub fn connected_gauge(&self) -> Gauge {
        self.connected.clone()
    }

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
    subscriptions: Subscriptions,
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
            subscriptions: Subscriptions::default(),
            backoff_initial: crate::stream::BACKOFF_INITIAL,
            backoff_max: crate::stream::BACKOFF_MAX,
        }
    }

    /// Subscribes, on every stream, to the destinations `subscriptions` holds.
    pub fn with_subscriptions(mut self, subscriptions: Subscriptions) -> Self {
        self.subscriptions = subscriptions;
        self
    }

    /// The destinations this client subscribes to.
    pub fn subscriptions(&self) -> &Subscriptions {
        &self.subscriptions
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

    /// One stream, until it ends: it delivered at least one update, or how it failed.
    async fn stream(
        &self,
        state: &watch::Sender<Arc<DiscoveryState>>,
        metrics: &DiscoveryMetrics,
    ) -> StreamEnd {
        let channel = self.channel.clone();
        let mut changes = self.subscriptions.changes();
        changes.mark_unchanged();
        let mut sent: BTreeSet<Target> = self.subscriptions.current();
        let (requests, rx) = mpsc::channel(16);
        let first = WatchRequest {
            node: self.node.clone(),
            subscribe: sent.iter().map(ToString::to_string).collect(),
            unsubscribe: Vec::new(),
            by_need: true,
        };
        if requests.send(first).await.is_err() {
            return StreamEnd::Failed("request channel closed".into());
        }
        let mut req = tonic::Request::new(ReceiverStream::new(rx));
        let header = match self.token.current().bearer() {
            Ok(h) => h,
            Err(e) => return StreamEnd::Failed(e.to_string()),
        };
        req.metadata_mut().insert("authorization", header);
        let mut stream = match PbClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE)
            .watch(req)
            .await
        {
            Ok(s) => s.into_inner(),
            Err(s) => return StreamEnd::from_status("watch refused", &s),
        };
        metrics.connected.set(1);
        let mut delivered = false;
        let mut chunks = Chunks::default();
        loop {
            let message = tokio::select! {
                m = stream.message() => m,
                changed = changes.changed() => {
                    if changed.is_err() {
                        return StreamEnd::Failed("subscriptions closed".into());
                    }
                    let now = self.subscriptions.current();
                    let update = WatchRequest {
                        subscribe: now.difference(&sent).map(ToString::to_string).collect(),
                        unsubscribe: sent.difference(&now).map(ToString::to_string).collect(),
                        ..WatchRequest::default()
                    };
                    sent = now;
                    if requests.send(update).await.is_err() {
                        return StreamEnd::Failed("the stream's requests closed".into());
                    }
                    continue;
                }
            };
            let update = match message {
                Ok(Some(u)) => u,
                Ok(None) => return StreamEnd::Ended { delivered },
                Err(s) => {
                    // Said either way: a stream that dies after delivering (an oversized
                    // message, a control plane going away) must not pass in silence.
                    tracing::warn!(code = ?s.code(), error = %s.message(), delivered, "discovery stream ended with an error; reconnecting");
                    return if delivered {
                        StreamEnd::Ended { delivered }
                    } else {
                        StreamEnd::from_status("discovery stream", &s)
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
