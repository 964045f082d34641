//! The destinations this node's pods use: subscribed on the discovery stream when a pod
//! first connects to one, kept while they are used, dropped after an idle period.
//!
//! The data path calls [`Subscriptions::touch`] for each destination it resolves (an
//! address, or a route's backend Service by name) and, when discovery does not know it
//! yet, [`Subscriptions::wait`]s for the answer with a bound — then fails the connection
//! (fail closed: never around the mesh, never in plaintext to a peer that may be meshed).
//! The discovery client (`client.rs`) sends the set on each stream it opens and what
//! changes while it is open; a sweep drops what was not used for the idle period.

use super::{DiscoveryState, Lookup};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// How long a destination nobody used stays subscribed.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// How long the first connection to a destination discovery does not know waits for the
/// control plane's answer (a round trip on a healthy control plane: milliseconds).
pub const DEFAULT_LOOKUP_TIMEOUT: Duration = Duration::from_secs(3);
/// At most this many destinations subscribed at once (the control plane's bound per
/// stream too): a pod that walks addresses must not grow the proxy without bound.
pub const MAX_SUBSCRIPTIONS: usize = 16_384;

/// A destination, as subscribed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// An address a pod connects to (a ClusterIP, a pod IP, anything).
    Addr(IpAddr),
    /// A Service by "<namespace>/<name>" (a route's backend).
    Service(Arc<str>),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Addr(ip) => write!(f, "{ip}"),
            Target::Service(k) => f.write_str(k),
        }
    }
}

impl Target {
    /// A target as the wire (and the discovery state) names it.
    pub fn parse(s: &str) -> Option<Target> {
        match s.parse() {
            Ok(ip) => Some(Target::Addr(ip)),
            Err(_) => s.contains('/').then(|| Target::Service(s.into())),
        }
    }
}

/// Why a wait for discovery's answer ended without one.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    /// No answer in time (or none to a wait that ended `waited` ago, `again`).
    #[error("discovery did not say what {target} is {}{}", if *.again { format!("(no answer to a lookup {}ms ago)", .waited.as_millis()) } else { format!("within {}ms", .waited.as_millis()) }, if *.connected { "" } else { " (the control plane is unreachable)" })]
    Timeout {
        /// The destination.
        target: Target,
        /// How long it waited, or how long ago the unanswered wait ended.
        waited: Duration,
        /// Whether the discovery stream was up.
        connected: bool,
        /// Failed at once: a wait for it ended unanswered within a lookup timeout.
        again: bool,
    },
    /// The proxy is shutting down.
    #[error("the proxy is shutting down")]
    Closed,
    /// The node's pods use too many destinations at once.
    #[error("this node's pods already use {MAX_SUBSCRIPTIONS} destinations discovery is asked about; {0} is refused until some go unused (--discovery-idle-timeout)")]
    TooMany(Target),
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WaitLabels {
    result: &'static str,
}

/// Subscriptions and waits.
#[derive(Clone, Debug)]
pub struct SubscriptionMetrics {
    subscriptions: Gauge,
    subscribed: Counter,
    expired: Counter,
    waits: Family<WaitLabels, Counter>,
    wait_seconds: Histogram,
    /// 1 while the discovery stream is open (shared with the client's metrics).
    pub(super) connected: Gauge,
}

impl Default for SubscriptionMetrics {
    fn default() -> Self {
        Self {
            subscriptions: Gauge::default(),
            subscribed: Counter::default(),
            expired: Counter::default(),
            waits: Family::default(),
            wait_seconds: Histogram::new([
                0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0, 3.0,
            ]),
            connected: Gauge::default(),
        }
    }
}

impl SubscriptionMetrics {
    /// Creates the metrics and registers them.
    pub fn register(registry: &mut Registry, connected: Gauge) -> Self {
        let m = Self {
            connected,
            ..Self::default()
        };
        registry.register(
            "discovery_subscriptions",
            "Destinations subscribed on the discovery stream (addresses and Services)",
            m.subscriptions.clone(),
        );
        registry.register(
            "discovery_subscribed",
            "Destinations subscribed when a pod first used them",
            m.subscribed.clone(),
        );
        registry.register(
            "discovery_subscriptions_expired",
            "Destinations unsubscribed after going unused for the idle timeout",
            m.expired.clone(),
        );
        registry.register(
            "discovery_lookup_waits",
            "Connections and requests that waited for discovery to answer for a new destination, by result (resolved, timeout, recently_unanswered: failed at once after a timeout)",
            m.waits.clone(),
        );
        registry.register(
            "discovery_lookup_wait_seconds",
            "How long connections and requests waited for discovery's answer for a new destination",
            m.wait_seconds.clone(),
        );
        m
    }
}

#[derive(Debug)]
struct Inner {
    /// Target → when it was last used, in milliseconds since `epoch`.
    targets: RwLock<HashMap<Target, AtomicU64>>,
    /// Targets whose last wait ended without an answer, and when: a connection to one
    /// within a lookup timeout of that fails at once instead of waiting again (the
    /// requests of one connection, a client retrying in a loop during an outage).
    unanswered: std::sync::Mutex<HashMap<Target, Instant>>,
    epoch: Instant,
    /// Bumped whenever the set changes.
    changed: watch::Sender<u64>,
    metrics: SubscriptionMetrics,
}

/// The destinations subscribed for this node.
#[derive(Clone, Debug)]
pub struct Subscriptions {
    inner: Arc<Inner>,
}

impl Default for Subscriptions {
    fn default() -> Self {
        Self::new(SubscriptionMetrics::default())
    }
}

impl Subscriptions {
    /// No destinations yet.
    pub fn new(metrics: SubscriptionMetrics) -> Self {
        Self {
            inner: Arc::new(Inner {
                targets: RwLock::default(),
                unanswered: std::sync::Mutex::default(),
                epoch: Instant::now(),
                changed: watch::Sender::new(0),
                metrics,
            }),
        }
    }

    fn now(&self) -> u64 {
        self.inner.epoch.elapsed().as_millis() as u64
    }

    /// Records a use of `target`, subscribing to it if it was not; false when it is not
    /// subscribed and [`MAX_SUBSCRIPTIONS`] are.
    pub fn touch(&self, target: &Target) -> bool {
        let now = self.now();
        {
            let targets = self
                .inner
                .targets
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(t) = targets.get(target) {
                t.store(now, Ordering::Relaxed);
                return true;
            }
        }
        let added = {
            let mut targets = self
                .inner
                .targets
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            if targets.len() >= MAX_SUBSCRIPTIONS && !targets.contains_key(target) {
                return false;
            }
            let added = targets
                .insert(target.clone(), AtomicU64::new(now))
                .is_none();
            self.inner.metrics.subscriptions.set(targets.len() as i64);
            added
        };
        if added {
            self.inner.metrics.subscribed.inc();
            self.inner.changed.send_modify(|g| *g += 1);
        }
        true
    }

    /// Subscribes to what the proxy held before a restart (the state kept on disk), as
    /// used now.
    pub fn restore(&self, targets: impl IntoIterator<Item = Target>) {
        for t in targets {
            let _ = self.touch(&t);
        }
    }

    /// The subscribed targets.
    pub fn current(&self) -> BTreeSet<Target> {
        self.inner
            .targets
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }

    /// A receiver that sees every change of the set.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.inner.changed.subscribe()
    }

    /// Drops the targets not used for `idle`; returns them.
    pub fn expire(&self, idle: Duration) -> Vec<Target> {
        let cutoff = self.now().saturating_sub(idle.as_millis() as u64);
        let gone: Vec<Target> = {
            let mut targets = self
                .inner
                .targets
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            let gone: Vec<Target> = targets
                .iter()
                .filter(|(_, used)| used.load(Ordering::Relaxed) < cutoff)
                .map(|(t, _)| t.clone())
                .collect();
            for t in &gone {
                targets.remove(t);
            }
            self.inner.metrics.subscriptions.set(targets.len() as i64);
            gone
        };
        // Unanswered lookups are remembered for a lookup timeout: a minute is plenty.
        let now = Instant::now();
        self.inner
            .unanswered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|_, at| now.duration_since(*at) < Duration::from_secs(60));
        if !gone.is_empty() {
            self.inner.metrics.expired.inc_by(gone.len() as u64);
            self.inner.changed.send_modify(|g| *g += 1);
            tracing::debug!(
                count = gone.len(),
                "unsubscribed destinations unused for the idle timeout"
            );
        }
        gone
    }

    /// What `lookup` finds in the discovery state, waiting up to `timeout` for the
    /// control plane's answer when it is `Pending` (`target` is subscribed first).
    pub async fn wait<T>(
        &self,
        state: &watch::Receiver<Arc<DiscoveryState>>,
        target: &Target,
        timeout: Duration,
        lookup: impl Fn(&DiscoveryState) -> Lookup<T>,
    ) -> Result<T, WaitError> {
        let subscribed = self.touch(target);
        if let Lookup::Known(t) = lookup(&state.borrow()) {
            return Ok(t);
        }
        if !subscribed {
            return Err(WaitError::TooMany(target.clone()));
        }
        let started = Instant::now();
        let m = &self.inner.metrics;
        let failed_at = self
            .inner
            .unanswered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(target)
            .copied();
        if let Some(at) = failed_at.filter(|at| started.duration_since(*at) < timeout) {
            m.waits
                .get_or_create(&WaitLabels {
                    result: "recently_unanswered",
                })
                .inc();
            return Err(WaitError::Timeout {
                target: target.clone(),
                waited: started.duration_since(at),
                connected: m.connected.get() == 1,
                again: true,
            });
        }
        let mut state = state.clone();
        let deadline = started + timeout;
        loop {
            match tokio::time::timeout_at(deadline, state.changed()).await {
                Ok(Ok(())) => {
                    if let Lookup::Known(t) = lookup(&state.borrow_and_update()) {
                        self.inner
                            .unanswered
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .remove(target);
                        m.wait_seconds.observe(started.elapsed().as_secs_f64());
                        m.waits
                            .get_or_create(&WaitLabels { result: "resolved" })
                            .inc();
                        return Ok(t);
                    }
                }
                Ok(Err(_)) => return Err(WaitError::Closed),
                Err(_) => {
                    m.wait_seconds.observe(started.elapsed().as_secs_f64());
                    m.waits
                        .get_or_create(&WaitLabels { result: "timeout" })
                        .inc();
                    self.inner
                        .unanswered
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(target.clone(), Instant::now());
                    return Err(WaitError::Timeout {
                        target: target.clone(),
                        waited: timeout,
                        connected: m.connected.get() == 1,
                        again: false,
                    });
                }
            }
        }
    }
}

/// Drops unused subscriptions every so often (a quarter of `idle`, at most a minute)
/// until `shutdown`.
pub async fn sweep(
    subs: Subscriptions,
    idle: Duration,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let every = (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(60));
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tokio::time::sleep(every) => {}
        }
        subs.expire(idle);
    }
}

#[cfg(test)]
mod tests;
