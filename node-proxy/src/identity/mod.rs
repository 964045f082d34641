//! The identity manager: one key and certificate per workload identity on this node.
//!
//! When the first pod of an identity appears, the manager generates an ECDSA P-256 key
//! (it never leaves this process), asks the CA for a certificate, and from then on renews
//! it at 70 % of its lifetime (less a random jitter, so that a node's identities and a
//! cluster's nodes do not all renew at once). While the CA is unreachable it retries with
//! exponential backoff — the delay never more than a quarter of the time the current
//! certificate has left, so retries come every few seconds near its expiry — and keeps
//! serving the current certificate until it expires. When the last pod of an identity
//! leaves, its key and certificate are dropped.
//!
//! [`IdentityManager::renew`] renews certificates now, off schedule: every one after the
//! control plane's issuer changed (`POST /renew-certificates`), or those a new trust
//! bundle no longer verifies ([`IdentityManager::renew_unverified`]).
//!
//! A restarted proxy may hand the manager the keys and certificates it kept on disk
//! ([`IdentityManager::restore`], see `crate::persist`): an identity's first pod then
//! starts with that certificate, renewed on the same schedule, instead of with none.

mod ca;
mod certificate;
mod metrics;

pub use ca::{CaClient, CaError, Certify, GrpcCaClient};
pub use certificate::WorkloadCertificate;
pub use metrics::IdentityMetrics;

use ambit_api::WorkloadIdentity;
use metrics::IdentityLabels;
use rcgen::{CertificateParams, DistinguishedName, KeyPair, PKCS_ECDSA_P256_SHA256};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};
use tokio::sync::{watch, Notify, Semaphore};
use tokio::task::JoinHandle;

/// When and how the manager renews and retries.
#[derive(Clone, Debug)]
pub struct IdentityConfig {
    /// Fraction of the lifetime at which a certificate is renewed (0.7).
    pub renew_fraction: f64,
    /// Up to this fraction of the lifetime is taken off the renewal time at random (0.05).
    pub renew_jitter_fraction: f64,
    /// First retry delay after a failure.
    pub backoff_initial: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// Certificate requests in flight to the CA at once, over all identities (16). A node
    /// that starts with many identities (a proxy restarted beside a thousand pods, one
    /// ServiceAccount each) asks for them in turn instead of all at once: the CA is not
    /// hit by a thousand signatures in the same instant, and the proxy does not hold a
    /// thousand requests and answers in memory at once — whose freed pieces stayed
    /// scattered over the heap for good.
    pub max_requests_in_flight: usize,
}

impl Default for IdentityConfig {
    fn default() -> Self {
        Self {
            renew_fraction: 0.7,
            renew_jitter_fraction: 0.05,
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            max_requests_in_flight: 16,
        }
    }
}

/// The state of one identity, as `/config_dump` and `/ready` show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentityStatus {
    /// The identity.
    pub identity: WorkloadIdentity,
    /// Pods on this node running as it.
    pub pods: Vec<String>,
    /// notAfter of the usable certificate, if there is one.
    pub not_after: Option<SystemTime>,
    /// The usable certificate's chain (leaf first; public), if there is one.
    pub chain: Vec<rustls_pki_types::CertificateDer<'static>>,
}

type CertSlot = watch::Sender<Option<Arc<WorkloadCertificate>>>;

/// A key and certificate kept from before a restart, for an identity's first pod.
pub struct Restored {
    /// The key the certificate is for; renewals go on with it.
    pub key: KeyPair,
    /// The certificate ([`WorkloadCertificate::restore`]).
    pub cert: Arc<WorkloadCertificate>,
}

impl std::fmt::Debug for Restored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Restored")
            .field("cert", &self.cert)
            .finish_non_exhaustive()
    }
}

struct Entry {
    pods: BTreeSet<String>,
    slot: CertSlot,
    task: JoinHandle<()>,
    /// Wakes the task to renew now ([`IdentityManager::renew`]).
    renew: Arc<Notify>,
}

struct Inner {
    ca: Arc<dyn CaClient>,
    config: IdentityConfig,
    metrics: IdentityMetrics,
    entries: Mutex<BTreeMap<WorkloadIdentity, Entry>>,
    pods: Mutex<BTreeMap<String, WorkloadIdentity>>,
    /// Kept from before a restart, until the identity's first pod claims it.
    restored: Mutex<BTreeMap<WorkloadIdentity, Restored>>,
    /// Bumped whenever a certificate is obtained, withdrawn or dropped.
    changes: watch::Sender<u64>,
    /// Permits for requests to the CA ([`IdentityConfig::max_requests_in_flight`]).
    in_flight: Arc<Semaphore>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let entries = self
            .entries
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        for e in entries.values() {
            e.task.abort();
        }
    }
}

/// Keys and certificates of the workload identities on this node.
#[derive(Clone)]
pub struct IdentityManager {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for IdentityManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentityManager")
            .field("identities", &self.status())
            .finish_non_exhaustive()
    }
}

/// Asked for an identity no pod on this node has.
#[derive(Debug, thiserror::Error)]
#[error("no pod on this node runs as {0}")]
pub struct NotManaged(pub WorkloadIdentity);

impl IdentityManager {
    /// A manager that obtains certificates from `ca`. Must be created inside a tokio runtime.
    pub fn new(ca: Arc<dyn CaClient>, config: IdentityConfig, metrics: IdentityMetrics) -> Self {
        let in_flight = Arc::new(Semaphore::new(config.max_requests_in_flight.max(1)));
        Self {
            inner: Arc::new(Inner {
                in_flight,
                ca,
                config,
                metrics,
                entries: Mutex::default(),
                pods: Mutex::default(),
                restored: Mutex::default(),
                changes: watch::channel(0).0,
            }),
        }
    }

    /// A pod running as `identity` is on the node: start fetching its certificate if it is
    /// the identity's first pod. Adding the same pod again changes nothing.
    pub fn pod_added(&self, pod: &str, identity: &WorkloadIdentity) {
        let previous = lock(&self.inner.pods).insert(pod.to_string(), identity.clone());
        if let Some(prev) = previous.filter(|p| p != identity) {
            self.release(pod, &prev);
        }
        let mut entries = lock(&self.inner.entries);
        if let Some(e) = entries.get_mut(identity) {
            e.pods.insert(pod.to_string());
            return;
        }
        let restored = lock(&self.inner.restored)
            .remove(identity)
            .filter(|r| !r.cert.is_expired());
        let (slot, _) = watch::channel(restored.as_ref().map(|r| r.cert.clone()));
        match &restored {
            Some(r) => {
                tracing::info!(%identity, not_after = unix_seconds(r.cert.not_after()), "new identity on this node; serving the certificate kept from before the restart");
                self.inner.changes.send_modify(|n| *n += 1);
            }
            None => {
                tracing::info!(%identity, "new identity on this node; fetching its certificate")
            }
        }
        let renew = Arc::new(Notify::new());
        let task = tokio::spawn(run(Box::new(Task {
            identity: identity.clone(),
            restored: restored.map(|r| r.key),
            shared: Shared {
                ca: self.inner.ca.clone(),
                config: self.inner.config.clone(),
                metrics: self.inner.metrics.clone(),
                changes: self.inner.changes.clone(),
                renew: renew.clone(),
                in_flight: self.inner.in_flight.clone(),
            },
            slot: slot.clone(),
        })));
        entries.insert(
            identity.clone(),
            Entry {
                pods: BTreeSet::from([pod.to_string()]),
                slot,
                task,
                renew,
            },
        );
    }

    /// A pod left the node; when it was its identity's last, the key is dropped.
    pub fn pod_removed(&self, pod: &str) {
        let removed = lock(&self.inner.pods).remove(pod);
        if let Some(identity) = removed {
            self.release(pod, &identity);
        }
    }

    fn release(&self, pod: &str, identity: &WorkloadIdentity) {
        let mut entries = lock(&self.inner.entries);
        let Some(e) = entries.get_mut(identity) else {
            return;
        };
        e.pods.remove(pod);
        if e.pods.is_empty() {
            if let Some(e) = entries.remove(identity) {
                e.task.abort();
            }
            self.inner.changes.send_modify(|n| *n += 1);
            self.inner.metrics.remove(&IdentityLabels::new(identity));
            tracing::info!(%identity, "last pod of identity left; key and certificate dropped");
        }
    }

    /// The identity's certificate, if it has one that has not expired.
    pub fn current(&self, identity: &WorkloadIdentity) -> Option<Arc<WorkloadCertificate>> {
        let entries = lock(&self.inner.entries);
        let cert = entries.get(identity)?.slot.borrow().clone()?;
        (!cert.is_expired()).then_some(cert)
    }

    /// Waits for the identity's first certificate.
    pub async fn ready(
        &self,
        identity: &WorkloadIdentity,
    ) -> Result<Arc<WorkloadCertificate>, NotManaged> {
        loop {
            let mut rx = {
                let entries = lock(&self.inner.entries);
                let e = entries
                    .get(identity)
                    .ok_or_else(|| NotManaged(identity.clone()))?;
                e.slot.subscribe()
            };
            let got = rx
                .wait_for(|c| c.as_ref().is_some_and(|c| !c.is_expired()))
                .await
                .map(|c| c.clone());
            match got {
                Ok(Some(cert)) => return Ok(cert),
                // The identity was dropped while we waited; look again.
                _ => continue,
            }
        }
    }

    /// Keys and certificates kept from before a restart: each is served from its
    /// identity's first pod on (if it has not expired by then), and renewed on schedule.
    /// Replaces what an earlier call left unclaimed.
    pub fn restore(&self, restored: Vec<Restored>) {
        let mut kept = lock(&self.inner.restored);
        kept.clear();
        for r in restored {
            kept.insert(r.cert.identity().clone(), r);
        }
    }

    /// Every certificate the manager holds that has not expired (those restored and not
    /// claimed yet included), with its key: what `crate::persist` keeps on disk.
    pub fn certificates(&self) -> Vec<Arc<WorkloadCertificate>> {
        let mut certs: BTreeMap<WorkloadIdentity, Arc<WorkloadCertificate>> =
            lock(&self.inner.restored)
                .iter()
                .map(|(id, r)| (id.clone(), r.cert.clone()))
                .collect();
        for (id, e) in lock(&self.inner.entries).iter() {
            match e.slot.borrow().clone() {
                Some(c) => certs.insert(id.clone(), c),
                None => certs.remove(id),
            };
        }
        certs.into_values().filter(|c| !c.is_expired()).collect()
    }

    /// Renews now, with its key and whatever its schedule, the certificate of every
    /// identity for which `which` holds (given the current certificate, if there is one);
    /// returns those identities. The current certificate is served until the new one
    /// arrives; a failure is retried as a renewal's is.
    pub fn renew(
        &self,
        which: impl Fn(Option<&WorkloadCertificate>) -> bool,
    ) -> Vec<WorkloadIdentity> {
        let entries = lock(&self.inner.entries);
        entries
            .iter()
            .filter(|(_, e)| which(e.slot.borrow().as_deref()))
            .map(|(id, e)| {
                e.renew.notify_one();
                id.clone()
            })
            .collect()
    }

    /// Renews now every certificate `bundle` does not verify (the trust anchors changed
    /// under it): with the control plane issuing under the new anchors, the node's
    /// identities are trusted again within a round trip, not at their next renewal.
    pub fn renew_unverified(&self, bundle: &crate::tls::TrustBundle) -> Vec<WorkloadIdentity> {
        let now = rustls_pki_types::UnixTime::now();
        self.renew(|cert| {
            cert.is_none_or(|c| {
                crate::tls::verify_own_svid(bundle, &c.certified_key().cert, now).is_err()
            })
        })
    }

    /// Changes whenever a certificate is obtained, withdrawn or dropped.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    /// Whether every identity on the node has a usable certificate.
    pub fn all_ready(&self) -> bool {
        self.status().iter().all(|s| s.not_after.is_some())
    }

    /// Every identity on the node with its pods and certificate expiry.
    pub fn status(&self) -> Vec<IdentityStatus> {
        let entries = lock(&self.inner.entries);
        entries
            .iter()
            .map(|(id, e)| IdentityStatus {
                identity: id.clone(),
                pods: e.pods.iter().cloned().collect(),
                not_after: e
                    .slot
                    .borrow()
                    .as_ref()
                    .filter(|c| !c.is_expired())
                    .map(|c| c.not_after()),
                chain: e
                    .slot
                    .borrow()
                    .as_ref()
                    .filter(|c| !c.is_expired())
                    .map(|c| c.certified_key().cert.clone())
                    .unwrap_or_default(),
            })
            .collect()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What every identity's task shares.
struct Shared {
    ca: Arc<dyn CaClient>,
    config: IdentityConfig,
    metrics: IdentityMetrics,
    changes: watch::Sender<u64>,
    renew: Arc<Notify>,
    in_flight: Arc<Semaphore>,
}

/// Sleeps until `at`, or until asked to renew now.
async fn until(at: tokio::time::Instant, renew: &Notify) {
    tokio::select! {
        _ = tokio::time::sleep_until(at) => {}
        _ = renew.notified() => {}
    }
}

/// What an identity's task starts with: one box, so that the task's future does not hold
/// these twice (as its arguments and as the locals they are moved into).
struct Task {
    identity: WorkloadIdentity,
    restored: Option<KeyPair>,
    shared: Shared,
    slot: CertSlot,
}

/// Generates the identity's key (or goes on with a restored one, whose certificate is in
/// `slot` already), then obtains and renews its certificate until aborted.
async fn run(task: Box<Task>) {
    let Task {
        identity,
        restored,
        shared,
        slot,
    } = *task;
    let Shared {
        ca,
        config,
        metrics,
        changes,
        renew,
        in_flight,
    } = shared;
    let labels = IdentityLabels::new(&identity);
    let publish = |cert: Option<Arc<WorkloadCertificate>>| {
        slot.send_replace(cert);
        changes.send_modify(|n| *n += 1);
    };
    // The key is kept as its PKCS#8 between requests and parsed for each one: parsed, it
    // is an aws-lc key object of its own (~0.6 kB), and the certificate's rustls signer
    // already holds one.
    let key = match restored {
        Some(key) => {
            if let Some(cert) = slot.borrow().clone() {
                metrics
                    .expiration
                    .get_or_create(&labels)
                    .set(unix_seconds(cert.not_after()));
            }
            key.serialize_der()
        }
        None => match KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256) {
            Ok(k) => k.serialize_der(),
            Err(error) => {
                tracing::error!(%identity, %error, "cannot generate a key; the identity stays without a certificate");
                return;
            }
        },
    };
    // A restored certificate is renewed on its own schedule (now, if that is past).
    let restored_cert = slot.borrow().clone();
    if let Some(cert) = restored_cert {
        let jitter = jitter(&cert, config.renew_jitter_fraction);
        until(cert.refresh_at(config.renew_fraction, jitter), &renew).await;
    }
    let mut backoff = config.backoff_initial;
    loop {
        // Boxed: the request's state (CSR, the call) lives only while it runs, not in
        // every identity's task for as long as the identity is on the node.
        let fetched = {
            let _permit = in_flight.acquire().await;
            Box::pin(fetch(&identity, &key, ca.as_ref())).await
        };
        // When to wake next; nothing of this round is held while the task sleeps (the
        // task sits in `until` for most of its life, for every identity on the node).
        let wake = match fetched {
            Ok(cert) => {
                metrics.refreshes.get_or_create(&labels).inc();
                let not_after = cert.not_after();
                metrics
                    .expiration
                    .get_or_create(&labels)
                    .set(unix_seconds(not_after));
                let jitter = jitter(&cert, config.renew_jitter_fraction);
                let refresh_at = cert.refresh_at(config.renew_fraction, jitter);
                tracing::info!(%identity, not_after = unix_seconds(not_after), "workload certificate obtained");
                publish(Some(Arc::new(cert)));
                backoff = config.backoff_initial;
                refresh_at
            }
            Err(error) => {
                metrics.failures.get_or_create(&labels).inc();
                let current = slot.borrow().clone();
                match &current {
                    Some(c) if !c.is_expired() => {
                        tracing::warn!(%identity, %error, retry_in = ?backoff, "certificate renewal failed; the current certificate stays in use until it expires")
                    }
                    Some(_) => {
                        tracing::error!(%identity, %error, retry_in = ?backoff, "certificate expired and renewal failed; connections for this identity fail until the CA answers");
                        publish(None);
                    }
                    None => {
                        tracing::warn!(%identity, %error, retry_in = ?backoff, "cannot obtain a certificate yet")
                    }
                }
                let current = current.filter(|c| !c.is_expired());
                // Full backoff plus up to 10 % more, so that nodes do not retry in
                // lockstep; never more than a quarter of the time the certificate has
                // left, so that a CA back shortly before expiry is not missed.
                let mut delay = backoff + backoff.mul_f64(fastrand::f64() * 0.1);
                if let Some(c) = &current {
                    let left = c
                        .expires_at()
                        .saturating_duration_since(tokio::time::Instant::now());
                    delay = delay.min((left / 4).max(config.backoff_initial));
                }
                let retry_at = tokio::time::Instant::now() + delay;
                backoff = (backoff * 2).min(config.backoff_max);
                // Wake at expiry too, to withdraw an expired certificate promptly.
                match current {
                    Some(c) => retry_at.min(c.expires_at()),
                    None => retry_at,
                }
            }
        };
        until(wake, &renew).await;
    }
}

async fn fetch(
    identity: &WorkloadIdentity,
    key_pkcs8: &[u8],
    ca: &dyn CaClient,
) -> Result<WorkloadCertificate, CaError> {
    let key = &KeyPair::try_from(key_pkcs8)
        .map_err(|e| CaError::BadResponse(format!("reading the identity's own key: {e}")))?;
    // The CA decides every name in the certificate; the CSR only carries the key.
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    let csr = params
        .serialize_request(key)
        .map_err(|e| CaError::BadResponse(format!("creating the CSR: {e}")))?;
    let resp = ca.certify(identity, csr.der().to_vec()).await?;
    WorkloadCertificate::from_response(identity, key, resp)
}

fn jitter(cert: &WorkloadCertificate, fraction: f64) -> Duration {
    let lifetime = cert
        .not_after()
        .duration_since(cert.not_before())
        .unwrap_or_default();
    lifetime.mul_f64(fraction * fastrand::f64())
}

fn unix_seconds(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests;
