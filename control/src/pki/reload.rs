//! The CA's files — trust anchors, issuer certificate, issuer key — watched while the
//! control plane runs. When their content changes (a rotation: a bundle with a new root,
//! a new issuer; in Kubernetes the kubelet swaps the mounted ConfigMap and Secret in
//! place) the CA is built again with every check of start-up, and replaces the one in use:
//! the next certificate is signed by the new issuer, and the control plane's own serving
//! certificate is re-issued from it at once (`tls.rs`). Files that do not make a CA — an
//! issuer that does not chain to the bundle, a key of another certificate, an expired
//! issuer, a file that does not parse — are refused: logged as an error that says what to
//! fix, counted in `identity_ca_reloads_total{result="error"}`, and the CA in use stays.
//!
//! The files are polled by content ([`ambit_serving::FilePoller`]); a change is taken once
//! the three files have read the same twice, so a certificate and its key written one
//! after the other are taken together.

use super::{
    sha256_hex, unix_seconds, CaConfig, CaFiles, CertificateAuthority, LoadError, SharedCa,
};
use ambit_serving::files::Snapshot;
use ambit_serving::FilePoller;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::future::Future;
use std::time::Duration;
use x509_parser::prelude::{FromDer, X509Certificate};

/// How a reload ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Outcome {
    /// The new CA is in use.
    Ok,
    /// Refused; the CA in use stays.
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
struct CertLabels {
    sha256: String,
    subject: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct IssuerLabels {
    sha256: String,
    subject: String,
    /// The trust anchor that signed it.
    anchor_sha256: String,
}

/// The reloads and the certificates in use.
#[derive(Clone, Debug, Default)]
pub struct CaMetrics {
    reloads: Family<ReloadLabels, Counter>,
    anchors: Family<CertLabels, Gauge>,
    issuer: Family<IssuerLabels, Gauge>,
    issuer_expiry: Gauge,
}

impl CaMetrics {
    /// Creates the metrics and registers them.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "identity_ca_reloads",
            "Changes of the trust anchors and issuer files taken (ok) or refused (error)",
            m.reloads.clone(),
        );
        registry.register(
            "identity_trust_anchor_expiration_timestamp_seconds",
            "notAfter of each trust anchor in the bundle in use, seconds since the Unix epoch",
            m.anchors.clone(),
        );
        registry.register(
            "identity_issuer_expiration_timestamp_seconds",
            "notAfter of the issuer certificate, seconds since the Unix epoch",
            m.issuer_expiry.clone(),
        );
        registry.register(
            "identity_issuer_info",
            "The issuer in use (1), with the trust anchor that signed it",
            m.issuer.clone(),
        );
        m
    }

    fn count(&self, result: Outcome) {
        self.reloads.get_or_create(&ReloadLabels { result }).inc();
    }

    fn in_use(&self, ca: &CertificateAuthority) {
        self.anchors.clear();
        for root in ca.roots() {
            let (subject, not_after) = subject_and_expiry(root);
            self.anchors
                .get_or_create(&CertLabels {
                    sha256: sha256_hex(root),
                    subject,
                })
                .set(not_after);
        }
        self.issuer.clear();
        self.issuer
            .get_or_create(&IssuerLabels {
                sha256: sha256_hex(ca.issuer_der()),
                subject: subject_and_expiry(ca.issuer_der()).0,
                anchor_sha256: ca.issuer_root().map(|r| sha256_hex(r)).unwrap_or_default(),
            })
            .set(1);
        self.issuer_expiry.set(unix_seconds(ca.issuer_not_after()));
    }
}

/// A certificate's subject and notAfter (Unix seconds), for labels and logs.
fn subject_and_expiry(der: &[u8]) -> (String, i64) {
    match X509Certificate::from_der(der) {
        Ok((_, c)) => (c.subject().to_string(), c.validity().not_after.timestamp()),
        Err(_) => (String::new(), 0),
    }
}

/// Builds the CA from its files and replaces it when they change.
#[derive(Debug)]
pub struct CaReloader {
    files: CaFiles,
    config: CaConfig,
    ca: SharedCa,
    every: Duration,
    metrics: CaMetrics,
    /// The contents the CA in use was built from (bundle, issuer certificate, key).
    loaded: Vec<Vec<u8>>,
}

impl CaReloader {
    /// Reads the files and builds the CA, as start-up does (refusing what it refuses);
    /// [`Self::run`] then checks the files every `every`.
    pub fn load(
        files: CaFiles,
        config: CaConfig,
        every: Duration,
        metrics: CaMetrics,
    ) -> Result<Self, LoadError> {
        let read = |what, path: &std::path::Path| {
            std::fs::read(path).map_err(|source| LoadError::Read {
                what,
                path: path.to_path_buf(),
                source,
            })
        };
        let loaded = vec![
            read("trust bundle", &files.trust_anchors)?,
            read("issuer certificate", &files.issuer_cert)?,
            read("issuer key", &files.issuer_key)?,
        ];
        let ca = build(&files, &config, &loaded)?;
        metrics.in_use(&ca);
        Ok(Self {
            ca: SharedCa::new(ca),
            files,
            config,
            every,
            metrics,
            loaded,
        })
    }

    /// The CA in use, replaced on every reload.
    pub fn ca(&self) -> SharedCa {
        self.ca.clone()
    }

    /// Checks the files until `shutdown`.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let paths = vec![
            self.files.trust_anchors.clone(),
            self.files.issuer_cert.clone(),
            self.files.issuer_key.clone(),
        ];
        let mut poller = FilePoller::new(paths, self.loaded.clone());
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                changed = poller.changed(self.every) => {
                    let _ = self.apply(changed);
                }
            }
        }
    }

    /// Builds a CA from the files' new contents and puts it in use, or says why not.
    pub fn apply(&self, read: Snapshot) -> Result<(), String> {
        let built = read.and_then(|contents| {
            build(&self.files, &self.config, &contents).map_err(|e| e.to_string())
        });
        match built {
            Ok(ca) => {
                let anchors: Vec<String> = ca.roots().iter().map(|r| sha256_hex(r)).collect();
                tracing::info!(
                    issuer = %sha256_hex(ca.issuer_der()),
                    issuer_subject = %subject_and_expiry(ca.issuer_der()).0,
                    signed_by = %ca.issuer_root().map(|r| sha256_hex(r)).unwrap_or_default(),
                    ?anchors,
                    "trust anchors and issuer reloaded: new certificates are signed by this issuer"
                );
                self.metrics.count(Outcome::Ok);
                self.metrics.in_use(&ca);
                self.ca.replace(ca);
                Ok(())
            }
            Err(error) => {
                tracing::error!(%error, trust_anchors = %self.files.trust_anchors.display(), issuer_cert = %self.files.issuer_cert.display(), "the trust anchors or issuer files changed but are refused; the CA in use stays (certificates go on being signed by the issuer before). Fix the files; `ambit pki inspect` shows what they hold");
                self.metrics.count(Outcome::Error);
                Err(error)
            }
        }
    }
}

fn build(
    files: &CaFiles,
    config: &CaConfig,
    contents: &[Vec<u8>],
) -> Result<CertificateAuthority, LoadError> {
    let [bundle, issuer, key] = contents else {
        return Err(LoadError::Invalid(format!(
            "expected the trust bundle, the issuer certificate and its key; read {} files",
            contents.len()
        )));
    };
    CertificateAuthority::from_pem(files, bundle, issuer, key, config.clone())
}

#[cfg(test)]
mod tests;
