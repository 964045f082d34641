//! The TokenReview answer cache: bounded, keyed by the token's SHA-256 (never the token),
//! each answer reused until its own deadline.

use crate::auth::Refusal;
use std::collections::HashMap;
use std::time::Duration;
use tokio::time::Instant;

/// An answer and until when it is reused.
type Entry = (Instant, Result<String, Refusal>);

/// Recent TokenReview answers.
#[derive(Debug)]
pub(super) struct ReviewCache {
    entries: HashMap<[u8; 32], Entry>,
    capacity: usize,
}

impl ReviewCache {
    /// A cache of at most `capacity` answers.
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            entries: HashMap::new(),
            capacity: capacity.max(1),
        }
    }

    /// The answer for `key`, if one is still fresh at `now`.
    pub(super) fn get(&self, key: &[u8; 32], now: Instant) -> Option<Result<String, Refusal>> {
        self.entries
            .get(key)
            .filter(|(expires, _)| *expires > now)
            .map(|(_, answer)| answer.clone())
    }

    /// Keeps `answer` for `ttl`. When full, expired answers go first, then the one that
    /// expires soonest.
    pub(super) fn put(
        &mut self,
        key: [u8; 32],
        answer: Result<String, Refusal>,
        ttl: Duration,
        now: Instant,
    ) {
        if self.entries.len() >= self.capacity && !self.entries.contains_key(&key) {
            self.entries.retain(|_, (expires, _)| *expires > now);
            if self.entries.len() >= self.capacity {
                let soonest = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (expires, _))| *expires)
                    .map(|(k, _)| *k);
                if let Some(k) = soonest {
                    self.entries.remove(&k);
                }
            }
        }
        self.entries.insert(key, (now + ttl, answer));
    }

    /// How many answers are held.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> [u8; 32] {
        [n; 32]
    }

    #[test]
    fn answers_expire_at_their_own_deadline_and_the_cache_stays_bounded() {
        let t0 = Instant::now();
        let mut c = ReviewCache::new(2);
        c.put(key(1), Ok("node-a".into()), Duration::from_secs(60), t0);
        let refused = Refusal::denied("wrong_service_account", "no");
        c.put(key(2), Err(refused.clone()), Duration::from_secs(5), t0);
        assert_eq!(c.get(&key(1), t0), Some(Ok("node-a".into())));
        assert_eq!(
            c.get(&key(2), t0 + Duration::from_secs(4)),
            Some(Err(refused))
        );
        assert_eq!(c.get(&key(2), t0 + Duration::from_secs(5)), None);
        assert_eq!(c.get(&key(1), t0 + Duration::from_secs(60)), None);
        // Full: the expired answer goes first.
        c.put(
            key(3),
            Ok("node-c".into()),
            Duration::from_secs(60),
            t0 + Duration::from_secs(10),
        );
        assert_eq!(c.len(), 2);
        assert!(c.get(&key(1), t0 + Duration::from_secs(10)).is_some());
        // Full of fresh answers: the one expiring soonest goes.
        c.put(
            key(4),
            Ok("node-d".into()),
            Duration::from_secs(60),
            t0 + Duration::from_secs(20),
        );
        assert_eq!(c.len(), 2);
        assert!(c.get(&key(1), t0 + Duration::from_secs(20)).is_none());
        assert!(c.get(&key(3), t0 + Duration::from_secs(20)).is_some());
        assert!(c.get(&key(4), t0 + Duration::from_secs(20)).is_some());
    }
}
