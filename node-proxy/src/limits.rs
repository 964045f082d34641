//! What a client can hold of the proxy: connections per pod and per node, out of the
//! descriptor limit the proxy raised at start.
//!
//! Every listener admits a connection only with a permit from its pod's budget (so that one
//! pod's flood cannot take the others' share) and from the node's (so that the proxy never
//! runs out of descriptors and stops serving everyone). A connection over either limit is
//! closed at once, counted in `tcp_connections_refused_total{listener, reason}`, and logged
//! at most once a second per listener kind.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Descriptors kept aside for everything that is not a proxied connection (the netns
/// handles and threads of each pod, the control-plane channels, eBPF maps, files).
pub const RESERVED_FDS: u64 = 1024;
/// Descriptors one admitted connection may cost: the client's socket, the socket to the
/// application or peer, and a share of a tunnel.
pub const FDS_PER_CONNECTION: u64 = 3;

/// Labels of `tcp_connections_refused_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    /// `outbound`, `inbound_mesh`, `inbound_plain` or `admin`.
    pub listener: String,
    /// `pod_limit`, `node_limit` or `listener_limit` (a node listener's own cap).
    pub reason: String,
}

/// The node's connection budget and what it refused.
#[derive(Clone, Debug)]
pub struct Limits {
    node: Arc<Semaphore>,
    node_max: usize,
    per_pod: usize,
    refused: Family<RefusedLabels, Counter>,
    last_log: Arc<AtomicU64>,
}

/// One admitted connection's share of the budgets; dropping it gives them back.
#[derive(Debug)]
pub struct Admitted {
    _pod: Option<OwnedSemaphorePermit>,
    _node: Option<OwnedSemaphorePermit>,
}

impl Limits {
    /// A node budget of `node_max` connections, `per_pod` for each pod; registers
    /// `tcp_connections_refused_total` and `process_max_fds` (`fd_limit`).
    pub fn register(
        registry: &mut Registry,
        node_max: usize,
        per_pod: usize,
        fd_limit: u64,
    ) -> Self {
        let limits = Self::new(node_max, per_pod);
        registry.register(
            "tcp_connections_refused",
            "Connections closed on accept because the pod's or the node's connection limit was reached",
            limits.refused.clone(),
        );
        let fds = Gauge::<i64>::default();
        fds.set(i64::try_from(fd_limit).unwrap_or(i64::MAX));
        registry.register(
            "process_max_fds",
            "The proxy's descriptor limit (RLIMIT_NOFILE, raised to the hard limit at start)",
            fds,
        );
        let max = Gauge::<i64>::default();
        max.set(i64::try_from(node_max).unwrap_or(i64::MAX));
        registry.register(
            "proxy_max_connections",
            "Connections the node proxy admits at once, across all pods",
            max,
        );
        limits
    }

    /// Unregistered limits (tests).
    pub fn new(node_max: usize, per_pod: usize) -> Self {
        Self {
            node: Arc::new(Semaphore::new(node_max.min(Semaphore::MAX_PERMITS))),
            node_max,
            per_pod,
            refused: Family::default(),
            last_log: Arc::default(),
        }
    }

    /// Connections admitted now, across the node.
    pub fn active(&self) -> usize {
        self.node_max
            .min(Semaphore::MAX_PERMITS)
            .saturating_sub(self.node.available_permits())
    }

    /// A fresh budget for one pod's listeners.
    pub fn pod_budget(&self) -> Arc<Semaphore> {
        Arc::new(Semaphore::new(self.per_pod.min(Semaphore::MAX_PERMITS)))
    }

    /// Admits a connection on `listener` out of `pod`'s budget (if any) and the node's, or
    /// counts and logs the refusal.
    pub fn admit(&self, listener: &'static str, pod: Option<&Arc<Semaphore>>) -> Option<Admitted> {
        let pod_permit = match pod.map(|p| p.clone().try_acquire_owned()) {
            Some(Ok(p)) => Some(p),
            Some(Err(_)) => return self.refuse(listener, "pod_limit", self.per_pod),
            None => None,
        };
        match self.node.clone().try_acquire_owned() {
            Ok(node) => Some(Admitted {
                _pod: pod_permit,
                _node: Some(node),
            }),
            Err(_) => self.refuse(listener, "node_limit", self.node_max),
        }
    }

    /// Admits a connection to a node listener (the admin server) out of its own cap only:
    /// pods' traffic holding the node's budget must not take the kubelet's probes and
    /// Prometheus away.
    pub fn admit_own(&self, listener: &'static str, own: &Arc<Semaphore>) -> Option<Admitted> {
        match own.clone().try_acquire_owned() {
            Ok(p) => Some(Admitted {
                _pod: Some(p),
                _node: None,
            }),
            Err(_) => self.refuse(listener, "listener_limit", own.available_permits()),
        }
    }

    fn refuse(
        &self,
        listener: &'static str,
        reason: &'static str,
        limit: usize,
    ) -> Option<Admitted> {
        self.refused
            .get_or_create(&RefusedLabels {
                listener: listener.into(),
                reason: reason.into(),
            })
            .inc();
        // A flood must not become a flood of log lines: one a second.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        if self.last_log.swap(now, Ordering::Relaxed) != now {
            tracing::warn!(
                listener,
                reason,
                limit,
                "connection refused: limit reached (see tcp_connections_refused_total)"
            );
        }
        None
    }
}

/// At most `per_second` log lines a second for one kind of event (a flood of failing
/// connections must not become a flood of log lines); what was left out is counted and
/// said with the next line that is written.
#[derive(Debug)]
pub struct LogBudget {
    per_second: u64,
    second: AtomicU64,
    written: AtomicU64,
    suppressed: AtomicU64,
}

impl LogBudget {
    /// A budget of `per_second` lines.
    pub const fn new(per_second: u64) -> Self {
        Self {
            per_second,
            second: AtomicU64::new(0),
            written: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(lines left out since the last one written)` when a line may be written now.
    pub fn take(&self) -> Option<u64> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        if self.second.swap(now, Ordering::Relaxed) != now {
            self.written.store(0, Ordering::Relaxed);
        }
        if self.written.fetch_add(1, Ordering::Relaxed) < self.per_second {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// Raises the soft descriptor limit to the hard one (as Envoy and Linkerd's proxy need
/// in a busy node) and returns the limit in effect.
pub fn raise_fd_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(error) => {
                tracing::warn!(%error, soft, hard, "cannot raise the descriptor limit");
                soft
            }
        },
        Ok((soft, _)) => soft,
        Err(error) => {
            tracing::warn!(%error, "cannot read the descriptor limit");
            RESERVED_FDS * 2
        }
    }
}

/// The connections a node proxy with `fd_limit` descriptors can admit at once.
pub fn connections_for(fd_limit: u64) -> usize {
    let usable = fd_limit.saturating_sub(RESERVED_FDS) / FDS_PER_CONNECTION;
    usize::try_from(usable.max(16)).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_over_its_budget_is_refused_while_others_are_admitted() {
        let mut r = Registry::default();
        let limits = Limits::register(&mut r, 5, 2, 4096);
        let (a, b) = (limits.pod_budget(), limits.pod_budget());
        let a1 = limits.admit("outbound", Some(&a)).unwrap();
        let _a2 = limits.admit("outbound", Some(&a)).unwrap();
        assert!(limits.admit("inbound_plain", Some(&a)).is_none());
        let _b1 = limits.admit("outbound", Some(&b)).unwrap();
        let _b2 = limits.admit("outbound", Some(&b)).unwrap();
        let _admin = limits.admit("admin", None).unwrap();
        // A node listener's own cap is apart from the node's: full node, admin admitted.
        let own = Arc::new(Semaphore::new(1));
        let admin = limits.admit_own("admin", &own);
        assert!(admin.is_some());
        assert!(limits.admit_own("admin", &own).is_none());
        // The node's five are taken: pod b's budget is free again later, not the node's.
        let c = limits.pod_budget();
        assert!(limits.admit("outbound", Some(&c)).is_none());
        drop(a1);
        assert!(limits.admit("outbound", Some(&a)).is_some());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        for line in [
            "tcp_connections_refused_total{listener=\"inbound_plain\",reason=\"pod_limit\"} 1",
            "tcp_connections_refused_total{listener=\"outbound\",reason=\"node_limit\"} 1",
            "tcp_connections_refused_total{listener=\"admin\",reason=\"listener_limit\"} 1",
            "process_max_fds 4096",
            "proxy_max_connections 5",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
    }

    #[test]
    fn a_flood_of_log_lines_is_cut_to_the_budget_and_counted() {
        let budget = LogBudget::new(5);
        let written: Vec<_> = (0..100).filter_map(|_| budget.take()).collect();
        // Within one second five are written (unless the second turned meanwhile, when
        // the next five come with the count of those left out).
        assert!((5..=10).contains(&written.len()), "{written:?}");
        assert_eq!(written[..5], [0, 0, 0, 0, 0]);
    }

    #[test]
    fn the_node_budget_follows_the_descriptor_limit() {
        assert_eq!(connections_for(1024 + 3 * 1000), 1000);
        assert_eq!(connections_for(100), 16);
        assert!(raise_fd_limit() >= 16);
    }
}
