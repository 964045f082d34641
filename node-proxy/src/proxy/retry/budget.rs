//! The retry budget: retries at most a share of the requests plus a floor per second, over
//! a sliding window — one per route and client pod.

use std::sync::{Arc, Mutex, PoisonError};
use tokio::time::Instant;

/// A retry budget: over the last `window`, retries may be at most `ratio` of the requests
/// plus `min_per_second` a second — so that retries add at most a fifth more load by
/// default, and never turn a failing backend's outage into a storm.
#[derive(Debug)]
pub struct Budget {
    ratio: f64,
    min_per_second: u32,
    slots: Mutex<Slots>,
}

/// Ten one-second slots of (requests, retries).
#[derive(Debug)]
struct Slots {
    counts: [(u64, u64); SLOTS],
    /// The second (since `epoch`) the newest slot counts.
    newest: u64,
    epoch: Instant,
}

const SLOTS: usize = 10;

impl Default for Budget {
    /// 20 % of requests plus 10 a second over 10 s.
    fn default() -> Self {
        Self::new(0.2, 10)
    }
}

impl Budget {
    pub fn new(ratio: f64, min_per_second: u32) -> Self {
        Self {
            ratio,
            min_per_second,
            slots: Mutex::new(Slots {
                counts: [(0, 0); SLOTS],
                newest: 0,
                epoch: Instant::now(),
            }),
        }
    }

    /// A request that may be retried was made.
    pub fn deposit(&self) {
        self.with(|s, i| s.counts[i].0 += 1);
    }

    /// Takes one retry from the budget; false when it is spent.
    pub fn withdraw(&self) -> bool {
        let (ratio, min) = (self.ratio, u64::from(self.min_per_second));
        self.with(|s, i| {
            let (requests, retries) = s
                .counts
                .iter()
                .fold((0, 0), |(a, b), (r, t)| (a + r, b + t));
            let allowed = min * SLOTS as u64 + (ratio * requests as f64) as u64;
            if retries < allowed {
                s.counts[i].1 += 1;
                true
            } else {
                false
            }
        })
    }

    /// Runs `f` on the slots with the current second's index, after clearing the slots of
    /// the seconds that passed.
    fn with<T>(&self, f: impl FnOnce(&mut Slots, usize) -> T) -> T {
        let mut s = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let now = s.epoch.elapsed().as_secs();
        let passed = now.saturating_sub(s.newest);
        for k in 1..=passed.min(SLOTS as u64) {
            let i = ((s.newest + k) % SLOTS as u64) as usize;
            s.counts[i] = (0, 0);
        }
        s.newest = s.newest.max(now);
        let i = (s.newest % SLOTS as u64) as usize;
        f(&mut s, i)
    }
}

/// The retry budget of each route (per Service port and route, as Linkerd keeps one per
/// route) and client pod, kept across policy updates.
#[derive(Clone, Debug, Default)]
pub struct Budgets(Arc<Mutex<std::collections::HashMap<String, Arc<Budget>>>>);

/// Budgets kept at most; beyond, the oldest routes' are forgotten all at once (routes
/// that churn must not grow the map for ever).
const MAX_BUDGETS: usize = 10_000;

impl Budgets {
    /// The budget of `rule` of Service port `parent` for requests from `client` (one pod's
    /// storm must not spend the retries of the other pods of the node).
    pub(in crate::proxy) fn get(
        &self,
        parent: &super::super::resolve::ServicePort,
        rule: &crate::policy::routes::Rule,
        client: &crate::discovery::Workload,
    ) -> Arc<Budget> {
        let key = format!(
            "{}/{} {}/{}:{} {} {}/{}",
            client.namespace,
            client.name,
            parent.namespace,
            parent.name,
            parent.port,
            rule.route_kind,
            rule.route_namespace,
            rule.route_name
        );
        let mut m = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if m.len() >= MAX_BUDGETS && !m.contains_key(&key) {
            m.clear();
        }
        m.entry(key).or_default().clone()
    }
}
