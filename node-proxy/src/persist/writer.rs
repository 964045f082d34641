//! Follows discovery, policy and the identities, and writes what changed: at most once a
//! second (a burst of updates is one write), and never more than a tenth of the time (a
//! large cluster's discovery snapshot takes a while to encode: 100,000 pods are 8 MB,
//! ~0.3 s in a debug build), encoded and written on a blocking thread, so neither the
//! data path nor the streams ever wait for the disk.
//!
//! The first update from the control plane also marks that kind of state as coming from
//! it. On drain nothing more is written: a proxy handing over to a new one (hitless
//! restart) must not overwrite what the new one writes; what changed in the last second
//! before a stop is lost, and the control plane's next snapshot brings it back.

use super::status::Kind;
use super::{discovery, files, identities, policy, Persister};
use crate::discovery::DiscoveryState;
use crate::identity::WorkloadCertificate;
use crate::policy::PolicyState;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// The shortest time between two writes.
pub(super) const WRITE_INTERVAL: Duration = Duration::from_secs(1);
/// After a write that took `t`, the next waits at least `t` times this.
const WRITE_SPACING: u32 = 10;

/// What changed since the last write.
#[derive(Default)]
struct Dirty {
    discovery: bool,
    policy: bool,
    identities: bool,
}

/// One write's worth of state: what changed.
pub(super) struct Batch {
    pub discovery: Option<Arc<DiscoveryState>>,
    pub policy: Option<Arc<PolicyState>>,
    pub certificates: Option<Vec<Arc<WorkloadCertificate>>>,
}

impl Persister {
    /// Writes the state as it changes until `shutdown` resolves.
    pub async fn run(
        self,
        mut discovery: watch::Receiver<Arc<DiscoveryState>>,
        mut policy: watch::Receiver<Arc<PolicyState>>,
        shutdown: impl Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        let mut ids = self.identities.changes();
        let mut written = self.loaded.clone();
        // The identity files once at start: those refused at load go.
        let mut dirty = Dirty {
            identities: true,
            ..Dirty::default()
        };
        let mut next = Instant::now();
        loop {
            if !(dirty.discovery || dirty.policy || dirty.identities) {
                tokio::select! {
                    _ = &mut shutdown => return,
                    changed = discovery.changed() => {
                        if changed.is_err() { return }
                        dirty.discovery = true;
                    }
                    changed = policy.changed() => {
                        if changed.is_err() { return }
                        dirty.policy = true;
                    }
                    changed = ids.changed() => {
                        if changed.is_err() { return }
                        dirty.identities = true;
                    }
                }
            }
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep_until(next) => {}
            }
            // Whatever else changed meanwhile goes in the same write.
            dirty.discovery |= discovery.has_changed().unwrap_or(false);
            dirty.policy |= policy.has_changed().unwrap_or(false);
            dirty.identities |= ids.has_changed().unwrap_or(false);
            // Only the streams from the control plane change discovery and policy.
            for (kind, changed) in [
                (Kind::Discovery, dirty.discovery),
                (Kind::Policy, dirty.policy),
            ] {
                if changed && self.status.heard(kind) {
                    self.metrics.set_from_disk(kind, 0);
                    tracing::info!(
                        kind = kind.name(),
                        "the control plane answered; its state replaces any from disk"
                    );
                }
            }
            let batch = Batch {
                discovery: dirty
                    .discovery
                    .then(|| discovery.borrow_and_update().clone()),
                policy: dirty.policy.then(|| policy.borrow_and_update().clone()),
                certificates: dirty.identities.then(|| {
                    ids.borrow_and_update();
                    self.identities.certificates()
                }),
            };
            dirty = Dirty::default();
            let this = self.clone();
            let started = Instant::now();
            let job =
                tokio::task::spawn_blocking(move || (this.write(batch, &mut written), written));
            written = match job.await {
                Ok(((), w)) => w,
                Err(error) => {
                    tracing::error!(%error, "writing the state failed");
                    identities::Written::new()
                }
            };
            next = Instant::now() + WRITE_INTERVAL.max(started.elapsed() * WRITE_SPACING);
        }
    }

    /// Writes one batch (blocking).
    pub(super) fn write(&self, batch: Batch, written: &mut identities::Written) {
        if let Some(state) = batch.discovery {
            let bytes = discovery::encode(&state, &self.owner);
            self.write_file(Kind::Discovery, &self.dir.join(discovery::FILE), &bytes);
        }
        if let Some(state) = batch.policy {
            let bytes = policy::encode(&state, &self.owner);
            self.write_file(Kind::Policy, &self.dir.join(policy::FILE), &bytes);
        }
        if let Some(certs) = batch.certificates {
            let synced = identities::sync(&self.dir.join(identities::DIR), &certs, written);
            self.metrics.written(Kind::Identity, synced.written);
            for (path, error) in &synced.failed {
                self.metrics.write_failed(Kind::Identity);
                tracing::warn!(file = %path.display(), %error, "cannot write or remove an identity's key and certificate; a restart while the control plane is away may lack it");
            }
            let from_disk = certs.iter().filter(|c| c.restored()).count();
            self.metrics
                .set_from_disk(Kind::Identity, i64::try_from(from_disk).unwrap_or(i64::MAX));
        }
        self.status.wrote();
    }

    fn write_file(&self, kind: Kind, path: &Path, bytes: &[u8]) {
        match files::write_atomic(path, bytes) {
            Ok(()) => self.metrics.written(kind, 1),
            Err(error) => {
                self.metrics.write_failed(kind);
                tracing::warn!(file = %path.display(), kind = kind.name(), %error, "cannot write the state; a restart while the control plane is away would start from an older one");
            }
        }
    }
}
