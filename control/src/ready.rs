//! Readiness of the control plane: the things still being waited for, by name.
//!
//! `/ready` answers 200 only when nothing is pending; otherwise 503 with the list, so an
//! operator sees what the control plane waits for (for example the initial list of Pods).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};

/// What the control plane still waits for before it is ready.
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    pending: Arc<Mutex<BTreeSet<String>>>,
}

impl Readiness {
    /// Marks `what` as not done yet.
    pub fn pending(&self, what: impl Into<String>) {
        self.lock().insert(what.into());
    }

    /// Marks `what` as done.
    pub fn done(&self, what: &str) {
        self.lock().remove(what);
    }

    /// `Ok` when nothing is pending, else what is.
    pub fn check(&self) -> Result<(), Vec<String>> {
        let pending = self.lock();
        if pending.is_empty() {
            Ok(())
        } else {
            Err(pending.iter().cloned().collect())
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_nothing_is_pending() {
        let r = Readiness::default();
        assert!(r.check().is_ok());
        r.pending("servers");
        r.pending("initial list of Pod");
        assert_eq!(
            r.check(),
            Err(vec!["initial list of Pod".into(), "servers".into()])
        );
        r.done("servers");
        r.done("initial list of Pod");
        assert!(r.check().is_ok());
    }
}
