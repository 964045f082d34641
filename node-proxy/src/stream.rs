//! What the proxy's streams from the control plane share (discovery, policy): one stream
//! kept open with reconnection and jittered exponential backoff, and snapshots and deltas
//! that arrive in chunks and must be applied whole.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use std::future::Future;
use std::time::Duration;

/// An update that arrives in chunks: `more` set on every chunk but the last.
pub trait Chunked: Sized {
    /// The first chunk of a snapshot.
    fn is_snapshot(&self) -> bool;
    /// Whether more chunks follow.
    fn more(&self) -> bool;
    /// Adds the resources of a later chunk (and its `more`) to this one.
    fn append(&mut self, later: Self);
}

/// Gathers chunks into whole updates. A partial snapshot applied as if complete would make
/// every resource in the later chunks disappear for a moment — a pod that disappears from
/// discovery loses its listeners, one that disappears from policy its authorizations.
#[derive(Debug)]
pub struct Chunks<T> {
    pending: Option<T>,
}

impl<T> Default for Chunks<T> {
    fn default() -> Self {
        Self { pending: None }
    }
}

impl<T: Chunked> Chunks<T> {
    /// The update to apply once `update` has arrived, if any: a whole one when its last
    /// chunk is in. A new snapshot drops a partial one; a stream that ends mid-update
    /// leaves nothing applied (the next stream starts with a new snapshot).
    pub fn push(&mut self, update: T) -> Option<T> {
        if update.is_snapshot() {
            self.pending = None;
        }
        let whole = match self.pending.take() {
            Some(mut first) => {
                first.append(update);
                first
            }
            None => update,
        };
        if whole.more() {
            self.pending = Some(whole);
            None
        } else {
            Some(whole)
        }
    }
}

/// The first delay after a stream failed.
pub const BACKOFF_INITIAL: Duration = Duration::from_millis(500);
/// The longest delay after a control plane that answered with an error (it refused the
/// stream, or is overloaded): doubling up to here spares it.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// The longest delay while the control plane cannot be reached at all (connection
/// refused or timed out, or it said it is shutting down): an attempt then costs it
/// nothing, and a proxy must be back in sync within two seconds of it returning.
pub const UNREACHABLE_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// How one stream ended.
#[derive(Debug)]
pub enum StreamEnd {
    /// It ended after it was open; `delivered`: at least one update was applied.
    Ended {
        /// Something was applied.
        delivered: bool,
    },
    /// The control plane could not be reached (or is going away): retried soon.
    Unreachable(String),
    /// The control plane refused it, or it failed otherwise: retried with backoff.
    Failed(String),
}

impl StreamEnd {
    /// How a gRPC status ends a stream: `Unavailable` (no connection, a control plane
    /// shutting down) is retried within [`UNREACHABLE_BACKOFF_MAX`], the rest with
    /// backoff up to [`BACKOFF_MAX`].
    pub fn from_status(what: &str, s: &tonic::Status) -> Self {
        let text = format!("{what} ({:?}): {}", s.code(), s.message());
        if s.code() == tonic::Code::Unavailable {
            StreamEnd::Unreachable(text)
        } else {
            StreamEnd::Failed(text)
        }
    }
}

/// Reconnection state of one stream.
#[derive(Clone, Debug)]
pub struct Reconnect {
    /// What the stream is, for logs.
    pub name: &'static str,
    /// Counts re-opened streams.
    pub reconnects: Counter,
    /// 1 while the stream is open.
    pub connected: Gauge,
    /// The first delay after a failure.
    pub backoff_initial: Duration,
    /// The longest delay.
    pub backoff_max: Duration,
}

impl Reconnect {
    /// Runs `open` (one stream until it ends) again and again until `shutdown`
    /// resolves, waiting a jittered, doubling delay between attempts (reset after a
    /// stream that delivered; at most [`UNREACHABLE_BACKOFF_MAX`] while the control
    /// plane cannot be reached, so that a proxy resyncs soon after it returns — before,
    /// the doubling reached 30 s during an outage and resync came up to 33 s late).
    pub async fn run<F, Fut>(&self, mut open: F, shutdown: impl Future<Output = ()>)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = StreamEnd>,
    {
        tokio::pin!(shutdown);
        let mut backoff = self.backoff_initial;
        let mut first = true;
        loop {
            if !first {
                self.reconnects.inc();
            }
            first = false;
            let mut cap = self.backoff_max;
            tokio::select! {
                _ = &mut shutdown => return,
                end = open() => {
                    self.connected.set(0);
                    match end {
                        // The stream delivered something: start the backoff afresh.
                        StreamEnd::Ended { delivered: true } => backoff = self.backoff_initial,
                        StreamEnd::Ended { delivered: false } => {}
                        StreamEnd::Unreachable(error) => {
                            cap = cap.min(UNREACHABLE_BACKOFF_MAX);
                            tracing::warn!(stream = self.name, %error, retry_in = ?backoff.min(cap), "control plane unreachable; keeping the last state");
                        }
                        StreamEnd::Failed(error) => tracing::warn!(stream = self.name, %error, retry_in = ?backoff, "stream failed; keeping the last state"),
                    }
                }
            }
            let base = backoff.min(cap);
            let delay = base + base.mul_f64(fastrand::f64() * 0.1);
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(delay) => {}
            }
            backoff = (backoff * 2).min(self.backoff_max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gaps between a stream's attempts when each ends as `end` makes it.
    async fn gaps(end: fn() -> StreamEnd, attempts: usize) -> Vec<Duration> {
        let r = Reconnect {
            name: "test",
            reconnects: Counter::default(),
            connected: Gauge::default(),
            backoff_initial: BACKOFF_INITIAL,
            backoff_max: BACKOFF_MAX,
        };
        let times = std::sync::Mutex::new(Vec::new());
        let (done, stop) = tokio::sync::oneshot::channel::<()>();
        let done = std::sync::Mutex::new(Some(done));
        r.run(
            || {
                let mut t = times.lock().unwrap();
                t.push(tokio::time::Instant::now());
                if t.len() == attempts {
                    let _ = done.lock().unwrap().take().map(|d| d.send(()));
                }
                async move { end() }
            },
            async {
                let _ = stop.await;
            },
        )
        .await;
        let t = times.into_inner().unwrap();
        t.windows(2).map(|w| w[1] - w[0]).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreachable_control_plane_is_tried_again_every_second_at_most() {
        let g = gaps(|| StreamEnd::Unreachable("connection refused".into()), 12).await;
        assert!(g.iter().all(|d| *d <= Duration::from_millis(1100)), "{g:?}");
        assert!(g[0] >= BACKOFF_INITIAL, "{g:?}");
        // One that answers with an error backs off to half a minute.
        let g = gaps(|| StreamEnd::Failed("permission denied".into()), 12).await;
        assert!(g[10] >= BACKOFF_MAX, "{g:?}");
    }

    #[derive(Debug)]
    struct U {
        snapshot: bool,
        more: bool,
        names: Vec<&'static str>,
    }

    impl Chunked for U {
        fn is_snapshot(&self) -> bool {
            self.snapshot
        }
        fn more(&self) -> bool {
            self.more
        }
        fn append(&mut self, later: Self) {
            self.names.extend(later.names);
            self.more = later.more;
        }
    }

    fn chunk(snapshot: bool, more: bool, names: &[&'static str]) -> U {
        U {
            snapshot,
            more,
            names: names.to_vec(),
        }
    }

    #[test]
    fn a_snapshot_is_applied_whole_and_deltas_pass_through() {
        let mut c = Chunks::default();
        assert_eq!(c.push(chunk(false, false, &["d"])).unwrap().names, ["d"]);
        assert!(c.push(chunk(true, true, &["a"])).is_none());
        assert!(c.push(chunk(false, true, &["b"])).is_none());
        let whole = c.push(chunk(false, false, &["c"])).unwrap();
        assert!(whole.snapshot && !whole.more);
        assert_eq!(whole.names, ["a", "b", "c"]);
        // A new snapshot that starts before the last one ended replaces it.
        assert!(c.push(chunk(true, true, &["x"])).is_none());
        let whole = c.push(chunk(true, false, &["y"])).unwrap();
        assert_eq!(whole.names, ["y"]);
        // A delta in chunks (a big change) is applied whole too.
        assert!(c.push(chunk(false, true, &["d1"])).is_none());
        assert!(c.push(chunk(false, true, &["d2"])).is_none());
        let whole = c.push(chunk(false, false, &["d3"])).unwrap();
        assert!(!whole.snapshot && !whole.more);
        assert_eq!(whole.names, ["d1", "d2", "d3"]);
    }
}
