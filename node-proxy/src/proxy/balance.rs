//! Endpoint choice: power of two choices over peak-EWMA latency × outstanding requests, as
//! Linkerd does; an endpoint that just failed is not picked again for a while, unless
//! nothing else is left. The latency estimate fades towards zero while an endpoint is not
//! used (as tower's PeakEwma decays on every read), so an endpoint that was once slow is
//! tried again rather than left unused for ever.

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
}

impl Balancer {
    /// Chooses among `candidates` (indexes into the caller's list) and marks it in flight.
    pub fn pick(&self, candidates: &[SocketAddr]) -> Option<(usize, Pick)> {
        let now = Instant::now();
        let i = match candidates.len() {
            0 => return None,
            1 => 0,
            n => {
                let a = fastrand::usize(..n);
                let mut b = fastrand::usize(..n - 1);
                if b >= a {
                    b += 1;
                }
                let stats = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
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
        self.stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(addr)
            .or_insert_with(Stats::new)
            .pending += 1;
        Some((
            i,
            Pick {
                balancer: self.clone(),
                addr,
                start: now,
                done: false,
            },
        ))
    }

    fn finish(&self, addr: SocketAddr, rtt: Option<Duration>) {
        let now = Instant::now();
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
    }
}

impl Pick {
    /// The endpoint answered; its latency feeds the average.
    pub fn success(mut self) {
        self.done = true;
        self.balancer.finish(self.addr, Some(self.start.elapsed()));
    }

    /// The endpoint failed (refused, reset, timed out).
    pub fn failure(mut self) {
        self.done = true;
        self.balancer.finish(self.addr, None);
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
}
