//! The trust anchors file, watched: when its content changes (an edit, a rename over it, a
//! Kubernetes ConfigMap's symlink swap) the new bundle replaces the old one in every
//! verifier of the process, for the next handshake on; connections already open stay.
//! A file that does not make a bundle (unreadable, not PEM, empty, another trust domain's
//! root) is refused — logged as an error naming the file and what is wrong, counted in
//! `trust_bundle_reloads_total{result="error"}` — and the bundle in use stays.
//!
//! The file is polled by content ([`ambit_serving::FilePoller`]), not watched with
//! inotify: polling follows symlink swaps and costs one small read per interval.

use super::{AnchorInfo, Anchors, TrustBundle};
use crate::admin::ConfigDump;
use ambit_serving::FilePoller;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::json;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

/// How a reload ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Outcome {
    /// The new bundle is in use.
    Ok,
    /// Refused; the previous bundle stays.
    Error,
}

impl EncodeLabelValue for Outcome {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        use std::fmt::Write;
        encoder.write_str(match self {
            Self::Ok => "ok",
            Self::Error => "error",
        })
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    result: Outcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AnchorLabels {
    sha256: String,
    subject: String,
}

/// The reloads, and the roots in use.
#[derive(Clone, Debug, Default)]
pub struct BundleMetrics {
    reloads: Family<ReloadLabels, Counter>,
    expiration: Family<AnchorLabels, Gauge>,
}

impl BundleMetrics {
    /// Creates the metrics and registers them.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "trust_bundle_reloads",
            "Changes of the trust anchors file taken (ok) or refused (error)",
            m.reloads.clone(),
        );
        registry.register(
            "trust_anchor_expiration_timestamp_seconds",
            "notAfter of each trust anchor in use, seconds since the Unix epoch",
            m.expiration.clone(),
        );
        m
    }

    fn count(&self, result: Outcome) {
        self.reloads.get_or_create(&ReloadLabels { result }).inc();
    }

    fn anchors(&self, anchors: &[AnchorInfo]) {
        self.expiration.clear();
        for a in anchors {
            self.expiration
                .get_or_create(&AnchorLabels {
                    sha256: a.sha256.clone(),
                    subject: a.subject.clone(),
                })
                .set(a.not_after_unix);
        }
    }
}

/// What `/config_dump` shows of the bundle.
#[derive(Debug, Default)]
struct Status {
    /// When the bundle in use was loaded (start-up or the last reload).
    loaded: Option<SystemTime>,
    /// The last refusal, if the last change was refused.
    error: Option<String>,
}

/// Watches the trust anchors file and replaces the bundle's roots when it changes.
#[derive(Clone, Debug)]
pub struct BundleReloader {
    path: PathBuf,
    bundle: TrustBundle,
    every: Duration,
    metrics: BundleMetrics,
    status: Arc<Mutex<Status>>,
    /// The file's content the bundle was built from.
    loaded_pem: Vec<u8>,
}

impl BundleReloader {
    /// Watches `path`, from which `bundle` was built out of `pem`, every `every`.
    pub fn new(
        path: &Path,
        bundle: TrustBundle,
        pem: Vec<u8>,
        every: Duration,
        metrics: BundleMetrics,
    ) -> Self {
        metrics.anchors(&bundle.anchors().describe());
        Self {
            path: path.to_path_buf(),
            bundle,
            every,
            metrics,
            status: Arc::new(Mutex::new(Status {
                loaded: Some(SystemTime::now()),
                error: None,
            })),
            loaded_pem: pem,
        }
    }

    /// Polls until `shutdown`; after each bundle taken, calls `changed` with its roots
    /// (the identity manager renews what they no longer verify).
    pub async fn run(self, mut changed: impl FnMut(&Anchors), shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut poller = FilePoller::new(vec![self.path.clone()], vec![self.loaded_pem.clone()]);
        loop {
            let snapshot = tokio::select! {
                _ = &mut shutdown => return,
                s = poller.changed(self.every) => s,
            };
            let read = snapshot
                .and_then(|mut files| files.pop().ok_or_else(|| "nothing read".to_string()));
            if let Some(anchors) = self.apply(read) {
                changed(&anchors);
            }
        }
    }

    /// Takes the file's new content (or why it could not be read); the roots now in use
    /// if they changed.
    fn apply(&self, read: Result<Vec<u8>, String>) -> Option<Arc<Anchors>> {
        let file = self.path.display();
        let replaced = read.and_then(|pem| self.bundle.replace(&pem).map_err(|e| e.to_string()));
        let mut status = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        match replaced {
            Ok(anchors) => {
                let described = anchors.describe();
                let fingerprints: Vec<&str> = described.iter().map(|a| a.sha256.as_str()).collect();
                tracing::info!(file = %file, anchors = ?fingerprints, "trust bundle reloaded: new handshakes verify against these roots");
                self.metrics.count(Outcome::Ok);
                self.metrics.anchors(&described);
                *status = Status {
                    loaded: Some(SystemTime::now()),
                    error: None,
                };
                Some(anchors)
            }
            Err(error) => {
                tracing::error!(file = %file, %error, "trust anchors file changed but is refused; the bundle in use stays. Fix the file (PEM root certificates of this trust domain; `ambit pki inspect` shows what it holds)");
                self.metrics.count(Outcome::Error);
                status.error = Some(format!("{file}: {error}"));
                None
            }
        }
    }

    /// `inner`, with the bundle in use under `trust_bundle`.
    pub fn config_dump(&self, inner: ConfigDump) -> ConfigDump {
        let this = self.clone();
        Arc::new(move || {
            let mut dump = inner();
            let status = this.status.lock().unwrap_or_else(PoisonError::into_inner);
            let unix = |t: SystemTime| {
                t.duration_since(SystemTime::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0)
            };
            if let Some(map) = dump.as_object_mut() {
                map.insert(
                    "trust_bundle".into(),
                    json!({
                        "file": this.path,
                        "anchors": this.bundle.anchors().describe(),
                        "loaded_unix": status.loaded.map(unix),
                        "last_error": status.error,
                    }),
                );
            }
            dump
        })
    }
}

#[cfg(test)]
mod tests;
