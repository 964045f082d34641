//! Readiness of the control plane: the things still being waited for, by name.
//!
//! `/ready` answers 200 only when nothing is pending; otherwise 503 with the list, so an
//! operator sees what the control plane waits for (for example the initial list of Pods).

use std::collections::BTreeSet;
use std::sync::Arc;
use tokio::sync::watch;

/// What the control plane still waits for before it is ready.
#[derive(Clone, Debug)]
pub struct Readiness {
    pending: Arc<watch::Sender<BTreeSet<String>>>,
}

impl Default for Readiness {
    fn default() -> Self {
        Self {
            pending: Arc::new(watch::Sender::new(BTreeSet::new())),
        }
    }
}

impl Readiness {
    /// Marks `what` as not done yet.
    pub fn pending(&self, what: impl Into<String>) {
        let what = what.into();
        self.pending.send_modify(|p| {
            p.insert(what);
        });
    }

    /// Marks `what` as done.
    pub fn done(&self, what: &str) {
        self.pending.send_if_modified(|p| p.remove(what));
    }

    /// `Ok` when nothing is pending, else what is.
    pub fn check(&self) -> Result<(), Vec<String>> {
        let pending = self.pending.borrow();
        if pending.is_empty() {
            Ok(())
        } else {
            Err(pending.iter().cloned().collect())
        }
    }

    /// Resolves once nothing is pending.
    pub async fn ready(&self) {
        let mut rx = self.pending.subscribe();
        // The sender lives as long as `self`: this cannot fail.
        let _ = rx.wait_for(BTreeSet::is_empty).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn ready_only_when_nothing_is_pending() {
        let r = Readiness::default();
        assert!(r.check().is_ok());
        r.pending("servers");
        r.pending("initial list of Pod");
        assert_eq!(
            r.check(),
            Err(vec!["initial list of Pod".into(), "servers".into()])
        );
        r.done("servers");
        let waiter = {
            let r = r.clone();
            tokio::spawn(async move { r.ready().await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        r.done("initial list of Pod");
        assert!(r.check().is_ok());
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("{e}"));
    }
}
