//! The policy stream client: one `Watch` kept open with reconnection and backoff; each
//! whole update applied to the [`PolicyState`] and published on a `watch` channel. While
//! the control plane is away the last policy stays in use.

use super::PolicyState;
use crate::stream::{Chunks, Reconnect, StreamEnd};
use crate::token::TokenSource;
use ambit_api::proto::policy::inbound_policy_client::InboundPolicyClient;
use ambit_api::proto::policy::WatchRequest;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::future::Future;
use std::sync::Arc;
use tokio::sync::watch;
use tonic::transport::Channel;

/// The largest policy message the proxy decodes (the control plane chunks as it does
/// discovery's).
pub const MAX_MESSAGE: usize = 16 << 20;

/// Updates applied, reconnects, pod policies refused, and whether the stream is up.
#[derive(Clone, Debug, Default)]
pub struct PolicyMetrics {
    updates: Counter,
    reconnects: Counter,
    invalid: Counter,
    connected: Gauge,
}

impl PolicyMetrics {
    /// Creates the metrics and registers them.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "policy_updates",
            "Inbound policy updates applied",
            m.updates.clone(),
        );
        registry.register(
            "policy_reconnects",
            "Policy streams re-opened after a failure",
            m.reconnects.clone(),
        );
        registry.register(
            "policy_invalid_pods",
            "Pod policies refused as invalid (the pod kept its last good one)",
            m.invalid.clone(),
        );
        registry.register(
            "policy_connected",
            "1 while the policy stream is open",
            m.connected.clone(),
        );
        m
    }
}

/// Watches the control plane's policy service for one node.
#[derive(Clone, Debug)]
pub struct PolicyClient {
    channel: Channel,
    token: TokenSource,
    node: String,
}

impl PolicyClient {
    /// A client of the policy service over `channel` for `node`.
    pub fn new(channel: Channel, token: impl Into<TokenSource>, node: String) -> Self {
        Self {
            channel,
            token: token.into(),
            node,
        }
    }

    /// Streams updates into `state` until `shutdown` resolves; reconnects with backoff.
    pub async fn run(
        self,
        state: watch::Sender<Arc<PolicyState>>,
        metrics: PolicyMetrics,
        shutdown: impl Future<Output = ()>,
    ) {
        let reconnect = Reconnect {
            name: "policy",
            reconnects: metrics.reconnects.clone(),
            connected: metrics.connected.clone(),
            backoff_initial: crate::stream::BACKOFF_INITIAL,
            backoff_max: crate::stream::BACKOFF_MAX,
        };
        reconnect
            .run(|| self.stream(&state, &metrics), shutdown)
            .await;
    }

    /// One stream, until it ends: it delivered at least one update, or how it failed.
    async fn stream(
        &self,
        state: &watch::Sender<Arc<PolicyState>>,
        metrics: &PolicyMetrics,
    ) -> StreamEnd {
        let mut req = tonic::Request::new(WatchRequest {
            node: self.node.clone(),
        });
        let header = match self.token.current().bearer() {
            Ok(h) => h,
            Err(e) => return StreamEnd::Failed(e.to_string()),
        };
        req.metadata_mut().insert("authorization", header);
        let mut stream = match InboundPolicyClient::new(self.channel.clone())
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
            let update = match stream.message().await {
                Ok(Some(u)) => u,
                Ok(None) => return StreamEnd::Ended { delivered },
                Err(s) => {
                    tracing::warn!(code = ?s.code(), error = %s.message(), delivered, "policy stream ended with an error; reconnecting");
                    return if delivered {
                        StreamEnd::Ended { delivered }
                    } else {
                        StreamEnd::from_status("policy stream", &s)
                    };
                }
            };
            metrics.updates.inc();
            let Some(update) = chunks.push(update) else {
                continue;
            };
            delivered = true;
            state.send_modify(|s| {
                for bad in Arc::make_mut(s).apply(update) {
                    metrics.invalid.inc();
                    tracing::warn!(error = %bad, "refusing a policy; what it was for keeps its last good one");
                }
            });
        }
    }
}

impl crate::stream::Chunked for ambit_api::proto::policy::Update {
    fn is_snapshot(&self) -> bool {
        self.snapshot
    }

    fn more(&self) -> bool {
        self.more
    }

    fn append(&mut self, mut later: Self) {
        self.pods.append(&mut later.pods);
        self.removed_pods.append(&mut later.removed_pods);
        self.services.append(&mut later.services);
        self.removed_services.append(&mut later.removed_services);
        self.more = later.more;
    }
}
