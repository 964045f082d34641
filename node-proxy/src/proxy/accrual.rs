//! Failure accrual, as Linkerd's consecutive-failures policy (opt-in per Service, by
//! `balancer.ambit.dev/failure-accrual`): an endpoint that fails
//! `max_failures` times in a row (a connection error, or a response classified as a
//! failure) is ejected — not picked — for a penalty that doubles with each ejection in a
//! row (from `min_penalty` up to `max_penalty`, part of it taken off at random); once the
//! penalty has passed, one probation request is let through: a success restores the
//! endpoint, a failure ejects it again for longer. When every endpoint of a destination is
//! ejected, requests fail fast (503) rather than wait.

pub use crate::policy::routes::Accrual;
use std::time::Duration;
use tokio::time::Instant;

impl Accrual {
    /// The penalty of ejection number `n` in a row (1 for the first), `roll` in 0..1.
    pub fn penalty(&self, n: u32, roll: f64) -> Duration {
        let exp = self
            .min_penalty
            .saturating_mul(1u32 << n.saturating_sub(1).min(20));
        let d = exp.min(self.max_penalty);
        d.mul_f64(1.0 - self.jitter.clamp(0.0, 1.0) * roll.clamp(0.0, 1.0))
    }
}

/// How long a probation request may take before another may be sent: an endpoint that
/// accepts and never answers must not stay out for ever once it recovers.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// One endpoint's standing (for one client pod).
#[derive(Clone, Debug, Default)]
pub struct Health {
    consecutive: u32,
    ejections: u32,
    ejected_until: Option<Instant>,
    /// When the probation request in flight was sent.
    probing: Option<Instant>,
}

impl Health {
    /// Whether the endpoint may be picked at `now`: not ejected, or its penalty has passed
    /// and no probation request is in flight (or the one in flight is overdue).
    pub fn available(&self, now: Instant) -> bool {
        match self.ejected_until {
            None => true,
            Some(t) => now >= t && self.probing.is_none_or(|p| now >= p + PROBE_TIMEOUT),
        }
    }

    /// The endpoint was picked at `now`; true when this is its probation request.
    pub fn picked(&mut self, now: Instant) -> bool {
        let probe = self.ejected_until.is_some() && self.available(now);
        if probe {
            self.probing = Some(now);
        }
        probe
    }

    /// A pick was abandoned before it was known how it went: a probation left untried
    /// can be tried again.
    pub fn abandoned(&mut self, probe: bool) {
        if probe {
            self.probing = None;
        }
    }

    /// Whether nothing is held against the endpoint (its entry can be forgotten).
    pub fn in_good_standing(&self) -> bool {
        self.consecutive == 0 && self.ejected_until.is_none()
    }

    /// A use of the endpoint (`probe`: its probation request) succeeded or failed at `now`,
    /// under `policy`; true when this ejected it. While the endpoint is ejected, only its
    /// probe counts: requests sent before the ejection that end after it neither lengthen
    /// the penalty nor lift it.
    pub fn record(
        &mut self,
        ok: bool,
        probe: bool,
        now: Instant,
        policy: &Accrual,
        roll: f64,
    ) -> bool {
        if self.ejected_until.is_some() && !probe {
            return false;
        }
        if ok {
            *self = Health::default();
            return false;
        }
        self.consecutive = self.consecutive.saturating_add(1);
        let eject = probe || self.consecutive >= policy.max_failures.max(1);
        self.probing = None;
        if eject {
            self.ejections = self.ejections.saturating_add(1);
            self.ejected_until = Some(now + policy.penalty(self.ejections, roll));
        }
        eject
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn penalties_double_up_to_the_cap_and_jitter_takes_off_up_to_its_share() {
        let a = Accrual::default();
        assert_eq!(a.penalty(1, 0.0), Duration::from_secs(1));
        assert_eq!(a.penalty(2, 0.0), Duration::from_secs(2));
        assert_eq!(a.penalty(6, 0.0), Duration::from_secs(32));
        assert_eq!(a.penalty(7, 0.0), Duration::from_secs(60));
        assert_eq!(a.penalty(99, 0.0), Duration::from_secs(60));
        assert_eq!(a.penalty(1, 1.0), Duration::from_millis(500));
    }

    #[tokio::test(start_paused = true)]
    async fn consecutive_failures_eject_then_one_probe_restores_or_ejects_for_longer() {
        let policy = Accrual {
            jitter: 0.0,
            ..Accrual::default()
        };
        let mut h = Health::default();
        let now = Instant::now();
        // Six failures and a success: the count starts again.
        for _ in 0..6 {
            assert!(!h.record(false, false, now, &policy, 0.0));
        }
        assert!(!h.record(true, false, now, &policy, 0.0));
        for _ in 0..6 {
            assert!(!h.record(false, false, now, &policy, 0.0));
        }
        // The seventh in a row ejects it for 1 s.
        assert!(h.record(false, false, now, &policy, 0.0));
        // Requests sent before the ejection and ending after it change nothing: late
        // failures do not lengthen the penalty, a late success does not lift it.
        for _ in 0..40 {
            assert!(!h.record(false, false, now, &policy, 0.0));
        }
        assert!(!h.record(true, false, now, &policy, 0.0));
        assert!(!h.available(now));
        tokio::time::advance(Duration::from_secs(1)).await;
        let now = Instant::now();
        // One probation request, and only one at a time.
        assert!(h.available(now));
        assert!(h.picked(now));
        assert!(!h.available(now));
        // It fails: ejected again, for 2 s.
        assert!(h.record(false, true, now, &policy, 0.0));
        tokio::time::advance(Duration::from_millis(1999)).await;
        assert!(!h.available(Instant::now()));
        tokio::time::advance(Duration::from_millis(1)).await;
        let now = Instant::now();
        assert!(h.picked(now));
        // An abandoned probe can be tried again; a successful one restores the endpoint.
        h.abandoned(true);
        assert!(h.available(now));
        assert!(h.picked(now));
        assert!(!h.record(true, true, now, &policy, 0.0));
        assert!(h.available(now));
        assert!(
            !h.picked(now),
            "a restored endpoint is no longer on probation"
        );
    }
}
