//! Endpoint choice: power of two choices over peak-EWMA latency × outstanding requests, as
//! Linkerd does; an endpoint that just failed is not picked again for a while, unless
//! nothing else is left. The latency estimate fades towards zero while an endpoint is not
//! used (as tower's PeakEwma decays on every read), so an endpoint that was once slow is
//! tried again rather than left unused for ever. Endpoints that fail again and again are
//! ejected by failure accrual (`accrual.rs`).

use super::accrual::{Accrual, Health};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// How fast old latency samples fade.
const DECAY: Duration = Duration::from_secs(10);
/// Assumed latency of an endpoint never measured (optimistic, so new endpoints get tried).
const DEFAULT_RTT: Duration = Duration::from_millis(1);
/// How long a failed endpoint is avoided.
const FAILURE_PENALTY: Duration = Duration::from_secs(5);

#[derive(Debug)]
struct Stats {
    ewma_ns: f64,
    stamp: Instant,
    pending: u32,
    failed_at: Option<Instant>,
}

impl Stats {
    fn new() -> Self {
        Self {
            ewma_ns: DEFAULT_RTT.as_nanos() as f64,
            stamp: Instant::now(),
            pending: 0,
            failed_at: None,
        }
    }

    /// The latency estimate at `now`: faded by the time since the last sample.
    fn estimate(&self, now: Instant) -> f64 {
        let idle = now.duration_since(self.stamp).as_secs_f64();
        self.ewma_ns * (-idle / DECAY.as_secs_f64()).exp()
    }

    fn cost(&self, now: Instant) -> f64 {
        let penalised = self
            .failed_at
            .is_some_and(|t| now.duration_since(t) < FAILURE_PENALTY);
        let base = self.estimate(now) * f64::from(self.pending + 1);
        if penalised {
            base * 1e6
        } else {
            base
        }
    }
}

/// Latency and load of every endpoint this proxy has used.
#[derive(Clone, Debug, Default)]
pub struct Balancer {
    stats: Arc<Mutex<HashMap<SocketAddr, Stats>>>,
    /// Failure accrual's standing of each endpoint, per client pod: one pod's failing
    /// requests must not eject an endpoint for the other pods of the node (with a proxy
    /// per pod, as Linkerd's, they could not). Only endpoints not in good standing are kept.
    health: Arc<Mutex<HealthMap>>,
}

/// (client pod, endpoint) → failure accrual's standing.
type HealthMap = HashMap<(Arc<str>, SocketAddr), Health>;

/// Failure accrual for a pick: the destination's policy and the client pod.
#[derive(Clone, Copy, Debug)]
pub struct AccrualFor<'a> {
    pub policy: &'a Accrual,
    /// `<namespace>/<name>` of the client pod.
    pub client: &'a Arc<str>,
}

/// An in-flight use of an endpoint; report how it went with [`Pick::success`] or
/// [`Pick::failure`] (dropping it counts as neither).
#[derive(Debug)]
pub struct Pick {
    balancer: Balancer,
    /// The endpoint chosen.
    pub addr: SocketAddr,
    start: Instant,
    done: bool,
    /// The destination's failure accrual and the client (None: off).
    accrual: Option<(Accrual, Arc<str>)>,
    /// This is the endpoint's probation request.
    probe: bool,
}

/// Why no endpoint was picked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoPick {
    /// There are none.
    Empty,
    /// Every one is ejected by failure accrual.
    AllEjected,
}

impl Balancer {
    /// Chooses among `candidates` (indexes into the caller's list) and marks it in flight;
    /// no failure accrual.
    pub fn pick(&self, candidates: &[SocketAddr]) -> Option<(usize, Pick)> {
        self.choose(candidates, None).ok()
    }

    /// Chooses among the `candidates` that failure accrual (`accrual`; None: off) has not
    /// ejected, and marks it in flight.
    pub fn choose(
        &self,
        candidates: &[SocketAddr],
        accrual: Option<AccrualFor<'_>>,
    ) -> Result<(usize, Pick), NoPick> {
        if candidates.is_empty() {
            return Err(NoPick::Empty);
        }
        let now = Instant::now();
        let mut health = self.health.lock().unwrap_or_else(PoisonError::into_inner);
        let usable: Vec<usize> = match accrual {
            None => (0..candidates.len()).collect(),
            Some(a) => (0..candidates.len())
                .filter(|i| {
                    health
                        .get(&(a.client.clone(), candidates[*i]))
                        .is_none_or(|h| h.available(now))
                })
                .collect(),
        };
        let mut stats = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
        let i = match usable.len() {
            0 => return Err(NoPick::AllEjected),
            1 => usable[0],
            n => {
                let a = fastrand::usize(..n);
                let mut b = fastrand::usize(..n - 1);
                if b >= a {
                    b += 1;
                }
                let (a, b) = (usable[a], usable[b]);
                let cost = |i: usize| {
                    stats
                        .get(&candidates[i])
                        .map_or(DEFAULT_RTT.as_nanos() as f64, |s| s.cost(now))
                };
                if cost(b) < cost(a) {
                    b
                } else {
                    a
                }
            }
        };
        let addr = candidates[i];
        let s = stats.entry(addr).or_insert_with(Stats::new);
        s.pending += 1;
        let probe = accrual.is_some_and(|a| {
            health
                .get_mut(&(a.client.clone(), addr))
                .is_some_and(|h| h.picked(now))
        });
        Ok((
            i,
            Pick {
                balancer: self.clone(),
                addr,
                start: now,
                done: false,
                accrual: accrual.map(|a| (*a.policy, a.client.clone())),
                probe,
            },
        ))
    }

    /// A use of `addr` ended: `rtt` when it answered (None: it failed to), `ok` as the
    /// response was classified, for failure accrual under `accrual`.
    fn finish(&self, pick: &Pick, rtt: Option<Duration>, ok: bool) {
        let now = Instant::now();
        let addr = pick.addr;
        if let Some((policy, client)) = &pick.accrual {
            let mut health = self.health.lock().unwrap_or_else(PoisonError::into_inner);
            let key = (client.clone(), addr);
            let h = health.entry(key.clone()).or_default();
            if h.record(ok, pick.probe, now, policy, fastrand::f64()) {
                tracing::info!(endpoint = %addr, client = %client, "endpoint ejected by failure accrual");
            }
            if h.in_good_standing() {
                health.remove(&key);
            }
        }
        let mut stats = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
        let s = stats.entry(addr).or_insert_with(Stats::new);
        s.pending = s.pending.saturating_sub(1);
        match rtt {
            Some(rtt) => {
                let sample = rtt.as_nanos() as f64;
                // Peak-EWMA: jump up to a worse sample at once, decay towards better ones.
                let faded = s.estimate(now);
                s.ewma_ns = if sample > faded {
                    sample
                } else {
                    let w =
                        (-(now.duration_since(s.stamp).as_secs_f64()) / DECAY.as_secs_f64()).exp();
                    s.ewma_ns * w + sample * (1.0 - w)
                };
                s.stamp = now;
                s.failed_at = None;
            }
            None => s.failed_at = Some(now),
        }
    }

    /// Forgets endpoints for which `keep` is false (they left discovery).
    pub fn retain(&self, keep: impl Fn(&SocketAddr) -> bool) {
        self.stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|a, _| keep(a));
        self.health
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(_, a), _| keep(a));
    }
}

impl Pick {
    /// The endpoint answered, with a success; its latency feeds the average.
    pub fn success(mut self) {
        self.done = true;
        let rtt = self.start.elapsed();
        self.balancer.finish(&self, Some(rtt), true);
    }

    /// The endpoint answered with a failure (a 5xx, a gRPC error): its latency feeds the
    /// average, and failure accrual counts it.
    pub fn failed_response(mut self) {
        self.done = true;
        let rtt = self.start.elapsed();
        self.balancer.finish(&self, Some(rtt), false);
    }

    /// The endpoint failed (refused, reset, timed out).
    pub fn failure(mut self) {
        self.done = true;
        self.balancer.finish(&self, None, false);
    }
}

impl Drop for Pick {
    fn drop(&mut self) {
        if !self.done {
            let mut stats = self
                .balancer
                .stats
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(s) = stats.get_mut(&self.addr) {
                s.pending = s.pending.saturating_sub(1);
            }
            drop(stats);
            if let (true, Some((_, client))) = (self.probe, &self.accrual) {
                let mut health = self
                    .balancer
                    .health
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if let Some(h) = health.get_mut(&(client.clone(), self.addr)) {
                    h.abandoned(true);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs(n: u8) -> Vec<SocketAddr> {
        (1..=n)
            .map(|i| SocketAddr::from(([10, 0, 0, i], 80)))
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn prefers_the_faster_endpoint() {
        let b = Balancer::default();
        let eps = addrs(2);
        // Teach it: endpoint 0 takes 100 ms, endpoint 1 takes 1 ms.
        for (i, rtt) in [(0usize, 100u64), (1, 1)] {
            let (_, p) = b.pick(&eps[i..=i]).unwrap();
            tokio::time::advance(Duration::from_millis(rtt)).await;
            p.success();
        }
        let mut fast = 0;
        for _ in 0..100 {
            let (i, p) = b.pick(&eps).unwrap();
            fast += usize::from(i == 1);
            drop(p);
        }
        assert_eq!(fast, 100, "with two endpoints, p2c always compares both");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_endpoint_left_alone_is_tried_again() {
        let b = Balancer::default();
        let eps = addrs(2);
        for (i, rtt) in [(0usize, 100u64), (1, 1)] {
            let (_, p) = b.pick(&eps[i..=i]).unwrap();
            tokio::time::advance(Duration::from_millis(rtt)).await;
            p.success();
        }
        // Endpoint 1 keeps answering in 1 ms; endpoint 0's 100 ms fades while unused.
        let mut slow_picked_at = None;
        for step in 0..600 {
            let (i, p) = b.pick(&eps).unwrap();
            tokio::time::advance(Duration::from_millis(if i == 0 { 100 } else { 1 })).await;
            p.success();
            if i == 0 {
                slow_picked_at = Some(step);
                break;
            }
            tokio::time::advance(Duration::from_millis(99)).await;
        }
        // ln(100) × 10 s ≈ 46 s of 100 ms steps: tried again after ~460 steps, not never.
        let step = slow_picked_at.expect("the once-slow endpoint was never tried again");
        assert!((400..=500).contains(&step), "tried again at step {step}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_endpoint_is_avoided_then_forgiven() {
        let b = Balancer::default();
        let eps = addrs(2);
        let (_, p) = b.pick(&eps[..1]).unwrap();
        p.failure();
        for _ in 0..50 {
            let (i, p) = b.pick(&eps).unwrap();
            assert_eq!(i, 1, "the endpoint that just failed was picked again");
            drop(p);
        }
        tokio::time::advance(FAILURE_PENALTY + Duration::from_secs(1)).await;
        let picked_first = (0..200).any(|_| b.pick(&eps).unwrap().0 == 0);
        assert!(
            picked_first,
            "a failure is not held against an endpoint forever"
        );
        // Forgotten endpoints start afresh.
        b.retain(|a| *a != eps[0]);
        assert!(b.stats.lock().unwrap().get(&eps[0]).is_none());
        // With nothing else left, the failed endpoint is still used.
        let (_, p) = b.pick(&eps[..1]).unwrap();
        p.failure();
        assert_eq!(b.pick(&eps[..1]).unwrap().0, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn load_counts_against_an_endpoint() {
        let b = Balancer::default();
        let eps = addrs(2);
        let _busy: Vec<_> = (0..10).map(|_| b.pick(&eps[..1]).unwrap().1).collect();
        let (i, _) = b.pick(&eps).unwrap();
        assert_eq!(i, 1, "ten requests in flight make endpoint 0 the costlier");
    }

    #[tokio::test(start_paused = true)]
    async fn an_ejected_endpoint_is_skipped_probed_once_and_restored() {
        let b = Balancer::default();
        let eps = addrs(2);
        let accrual = Accrual {
            max_failures: 3,
            jitter: 0.0,
            ..Accrual::default()
        };
        let (web, other): (Arc<str>, Arc<str>) = ("shop/web".into(), "shop/other".into());
        let a = AccrualFor {
            policy: &accrual,
            client: &web,
        };
        // Three failed responses in a row from endpoint 0: ejected.
        for _ in 0..3 {
            let (_, p) = b.choose(&eps[..1], Some(a)).unwrap();
            p.failed_response();
        }
        for _ in 0..50 {
            let (i, p) = b.choose(&eps, Some(a)).unwrap();
            assert_eq!(i, 1, "an ejected endpoint was picked");
            p.success();
        }
        // Alone, it is not picked at all: fail fast.
        assert_eq!(
            b.choose(&eps[..1], Some(a)).unwrap_err(),
            NoPick::AllEjected
        );
        // Without accrual (a destination that has it disabled), it is; and for another
        // client pod, whose requests did not fail, it is in good standing.
        assert!(b.choose(&eps[..1], None).is_ok());
        let for_other = AccrualFor {
            policy: &accrual,
            client: &other,
        };
        assert!(b.choose(&eps[..1], Some(for_other)).is_ok());
        // After the penalty, one probation request, then a success restores it.
        tokio::time::advance(accrual.min_penalty).await;
        let (_, probe) = b.choose(&eps[..1], Some(a)).unwrap();
        assert_eq!(
            b.choose(&eps[..1], Some(a)).unwrap_err(),
            NoPick::AllEjected,
            "a second request while the probe is in flight"
        );
        probe.success();
        for _ in 0..5 {
            let (_, p) = b.choose(&eps[..1], Some(a)).unwrap();
            p.success();
        }
        assert_eq!(b.choose(&eps, Some(a)).map(|_| ()), Ok(()));
        assert_eq!(b.choose(&[], Some(a)).unwrap_err(), NoPick::Empty);
    }
}
