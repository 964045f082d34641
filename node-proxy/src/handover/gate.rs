//! A gate on a node listener's accept loop (the admin server, the CNI socket): a hand-over
//! closes it while another process accepts on the same socket, opens it again if that
//! process gives up, and waits for the connections it let in to finish.

use std::future::Future;
use std::sync::Arc;
use tokio::sync::watch;

/// Shared by an accept loop and the hand-over; cheap to clone.
#[derive(Clone, Debug)]
pub struct Gate {
    closed: Arc<watch::Sender<bool>>,
    inside: Arc<watch::Sender<usize>>,
}

impl Default for Gate {
    fn default() -> Self {
        Self {
            closed: Arc::new(watch::channel(false).0),
            inside: Arc::new(watch::channel(0).0),
        }
    }
}

/// One connection the gate let in; dropping it lets [`Gate::empty`] know.
#[derive(Debug)]
pub struct Inside(Arc<watch::Sender<usize>>);

impl Drop for Inside {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Gate {
    /// Stops the accept loop: from now on it accepts nothing (another process does).
    pub fn close(&self) {
        self.closed.send_replace(true);
    }

    /// Lets the accept loop accept again.
    pub fn open(&self) {
        self.closed.send_replace(false);
    }

    /// Runs `accept` (made anew each time) while the gate is open; while it is closed,
    /// waits. What `accept` returned is returned.
    pub async fn accept<F: Future>(&self, mut accept: impl FnMut() -> F) -> F::Output {
        let mut closed = self.closed.subscribe();
        loop {
            let _ = closed.wait_for(|c| !*c).await;
            tokio::select! {
                r = accept() => return r,
                _ = closed.wait_for(|c| *c) => {}
            }
        }
    }

    /// Counts a connection in until the guard is dropped.
    pub fn enter(&self) -> Inside {
        self.inside.send_modify(|n| *n += 1);
        Inside(self.inside.clone())
    }

    /// Resolves once no connection is inside.
    pub async fn empty(&self) {
        let mut inside = self.inside.subscribe();
        let _ = inside.wait_for(|n| *n == 0).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_closed_gate_accepts_nothing_until_opened() {
        let gate = Gate::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        gate.close();
        let _c = tokio::net::TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let waited = tokio::time::timeout(
            std::time::Duration::from_millis(200),
            gate.accept(|| listener.accept()),
        )
        .await;
        assert!(waited.is_err(), "accepted through a closed gate");
        gate.open();
        let accepted = gate.accept(|| listener.accept()).await;
        assert!(accepted.is_ok());
        let inside = gate.enter();
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), gate.empty())
                .await
                .is_err()
        );
        drop(inside);
        gate.empty().await;
    }
}
