//! The local backend as a [`Backend`]: loads the directory at start (failing start-up on
//! invalid YAML), then polls it for changes.

use super::{fingerprint, load_index, watch, Fingerprint, LocalMetrics, NodeTokens};
use crate::auth::NodeAuthenticator;
use crate::backend::{Backend, Shutdown};
use crate::config::Config;
use crate::index::SharedIndex;
use crate::ready::Readiness;
use crate::StartError;
use prometheus_client::registry::Registry;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// Kubernetes YAML in a directory, and a file of node tokens.
#[derive(Debug)]
pub struct LocalBackend {
    dir: PathBuf,
    trust_domain: String,
    poll_interval: Duration,
    index: SharedIndex,
    tokens: Arc<NodeTokens>,
    metrics: LocalMetrics,
    /// The directory as it was just before the index was loaded, so that a change made
    /// while loading is not missed.
    loaded: Fingerprint,
}

impl LocalBackend {
    /// Loads `--local-dir` and `--node-tokens`.
    pub fn build(config: &Config, registry: &mut Registry) -> Result<Self, StartError> {
        let dir = config.local_dir.clone().unwrap_or_default();
        let metrics = LocalMetrics::register(registry);
        let loaded = fingerprint(&dir);
        let index = load_index(&dir, &config.trust_domain)?;
        metrics.record_success(&index);
        let tokens_path = config.node_tokens.clone().unwrap_or_default();
        let tokens = NodeTokens::load(&tokens_path).map_err(StartError::NodeTokens)?;
        Ok(Self {
            dir,
            trust_domain: config.trust_domain.clone(),
            poll_interval: config.local_poll_interval,
            index: SharedIndex::new(index),
            tokens: Arc::new(tokens),
            metrics,
            loaded,
        })
    }
}

impl Backend for LocalBackend {
    fn index(&self) -> SharedIndex {
        self.index.clone()
    }

    fn authenticator(&self) -> Arc<dyn NodeAuthenticator> {
        self.tokens.clone()
    }

    fn run(
        self: Box<Self>,
        _ready: Readiness,
        shutdown: Shutdown,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        // Loaded in `build`: nothing to wait for.
        Box::pin(watch(
            self.loaded,
            self.dir,
            self.trust_domain,
            self.index,
            self.poll_interval,
            self.metrics,
            shutdown,
        ))
    }
}
