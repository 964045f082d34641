//! Retries of a route's requests: which responses are retried, the backoff between tries,
//! the request body kept to send again, and the budget that keeps retries from
//! multiplying an outage.
//!
//! A request is retried only when its body is known whole and small: it is recorded as it
//! is sent (at most [`MAX_REPLAY_BYTES`]), and a try can be repeated only once the body
//! has ended within that size — a larger or still-streaming body is sent once, as
//! Linkerd's proxy does.

use super::body::{Body, BoxError};
use super::classify::GrpcCode;
use crate::policy::routes::Retry;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;

/// The largest request body kept for a retry.
pub const MAX_REPLAY_BYTES: usize = 64 * 1024;
/// The longest pause between tries.
pub const MAX_BACKOFF: Duration = Duration::from_millis(250);

/// Whether a try's outcome — its response's status and, for a trailers-only gRPC
/// response, its gRPC status — is one `retry` retries.
pub fn retryable(retry: &Retry, status: StatusCode, headers: &HeaderMap) -> bool {
    let code = status.as_u16();
    if retry
        .http_statuses
        .iter()
        .any(|(min, max)| (*min..=*max).contains(&code))
    {
        return true;
    }
    matches!(GrpcCode::of(headers), Some(GrpcCode::Code(c)) if retry.grpc_codes.contains(&c))
}

/// The pause before retry number `n` (1 for the first): `base` doubled each time up to
/// [`MAX_BACKOFF`], of which a random half (`jitter` in 0..1) is taken off, so that
/// clients retrying together spread out.
pub fn backoff(base: Duration, n: u32, jitter: f64) -> Duration {
    let exp = base.saturating_mul(1u32 << n.saturating_sub(1).min(16));
    let d = exp.min(MAX_BACKOFF);
    d.mul_f64(1.0 - 0.5 * jitter.clamp(0.0, 1.0))
}

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

/// What was recorded of a request body.
#[derive(Debug, Default)]
struct Recorded {
    chunks: Vec<Bytes>,
    len: usize,
    trailers: Option<HeaderMap>,
    ended: bool,
    too_big: bool,
}

/// A request body's copy, for the next try.
#[derive(Clone, Debug, Default)]
pub struct Replay(Arc<Mutex<Recorded>>);

impl Replay {
    /// Wraps `body` so that what it sends is kept (up to [`MAX_REPLAY_BYTES`]).
    pub fn record(body: Body) -> (Body, Replay) {
        let replay = Replay::default();
        if http_body::Body::is_end_stream(&body) {
            replay.lock().ended = true;
            return (body, replay);
        }
        if http_body::Body::size_hint(&body).lower() > MAX_REPLAY_BYTES as u64 {
            replay.lock().too_big = true;
            return (body, replay);
        }
        let recording = Recording {
            inner: body,
            replay: replay.clone(),
        };
        (recording.boxed(), replay)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recorded> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The body again, when it was sent whole and small enough; else why not.
    pub fn replay(&self) -> Result<Body, &'static str> {
        let r = self.lock();
        if r.too_big {
            return Err("body larger than 64 KiB");
        }
        if !r.ended {
            return Err("body still streaming");
        }
        Ok(Replayed {
            chunks: r.chunks.iter().cloned().collect(),
            trailers: r.trailers.clone(),
        }
        .boxed())
    }
}

/// A recorded body sent again.
struct Replayed {
    chunks: std::collections::VecDeque<Bytes>,
    trailers: Option<HeaderMap>,
}

impl http_body::Body for Replayed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(c) = self.chunks.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(c))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_empty() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.chunks.iter().map(|c| c.len() as u64).sum())
    }
}

/// A body that keeps a copy of what it yields.
struct Recording {
    inner: Body,
    replay: Replay,
}

impl http_body::Body for Recording {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        let mut r = self.replay.lock();
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if !r.too_big {
                        r.len += data.len();
                        if r.len > MAX_REPLAY_BYTES {
                            r.too_big = true;
                            r.chunks.clear();
                        } else {
                            r.chunks.push(data.clone());
                        }
                    }
                } else if let Some(t) = frame.trailers_ref() {
                    r.trailers = Some(t.clone());
                }
            }
            // A body that failed cannot be sent again.
            Poll::Ready(Some(Err(_))) => r.too_big = true,
            Poll::Ready(None) => r.ended = true,
            Poll::Pending => {}
        }
        // The sender stops polling once the body says it has ended (hyper does not wait
        // for the final None): that is the end too.
        if matches!(polled, Poll::Ready(Some(Ok(_)))) && self.inner.is_end_stream() {
            r.ended = true;
        }
        drop(r);
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The retry budget of each route (per Service port and route, as Linkerd keeps one per
/// route), kept across policy updates.
#[derive(Clone, Debug, Default)]
pub struct Budgets(Arc<Mutex<std::collections::HashMap<String, Arc<Budget>>>>);

/// Budgets kept at most; beyond, the oldest routes' are forgotten all at once (routes
/// that churn must not grow the map for ever).
const MAX_BUDGETS: usize = 10_000;

impl Budgets {
    /// The budget of `rule` of Service port `parent`.
    pub(super) fn get(
        &self,
        parent: &super::resolve::ServicePort,
        rule: &crate::policy::routes::Rule,
    ) -> Arc<Budget> {
        let key = format!(
            "{}/{}:{} {} {}/{}",
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

#[cfg(test)]
mod tests;
