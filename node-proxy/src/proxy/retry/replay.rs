//! A request body kept to be sent again. It is recorded as a try sends it (at most
//! [`MAX_REPLAY_BYTES`]); another try can send it again once it has ended within that
//! size — only a body sent whole is retried (issue 12). A try that gave the body up
//! before reading any of it (a connection that failed first) hands it back untouched, so
//! the next try sends it. A body larger than the limit, one that failed, one a try gave
//! up part-way, or one still being sent by the previous try (its response came first) is
//! not sent again.

use super::super::body::{Body, BoxError};
use bytes::Bytes;
use http::HeaderMap;
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

/// The largest request body kept for a retry.
pub const MAX_REPLAY_BYTES: usize = 64 * 1024;

/// Why a body cannot be sent again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotReplayable {
    /// Over [`MAX_REPLAY_BYTES`].
    TooBig,
    /// The previous try is still sending it.
    Streaming,
    /// Reading it failed.
    Failed,
}

/// What was recorded of a request body.
#[derive(Debug, Default)]
struct Recorded {
    chunks: Vec<Bytes>,
    len: usize,
    trailers: Option<HeaderMap>,
    ended: bool,
    too_big: bool,
    failed: bool,
    /// The body, untouched, when a try gave it up before reading any of it.
    untouched: Option<Body>,
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
            inner: Some(body),
            replay: replay.clone(),
        };
        (recording.boxed(), replay)
    }

    fn lock(&self) -> MutexGuard<'_, Recorded> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The body again for another try, when it can be sent again.
    pub fn replay(&self) -> Result<Body, NotReplayable> {
        let mut r = self.lock();
        if r.too_big {
            return Err(NotReplayable::TooBig);
        }
        if r.failed {
            return Err(NotReplayable::Failed);
        }
        if r.ended {
            return Ok(Replayed {
                chunks: r.chunks.iter().cloned().collect(),
                trailers: r.trailers.clone(),
            }
            .boxed());
        }
        let Some(untouched) = r.untouched.take() else {
            return Err(NotReplayable::Streaming);
        };
        drop(r);
        Ok(Recording {
            inner: Some(untouched),
            replay: self.clone(),
        }
        .boxed())
    }
}

/// A recorded body sent again.
struct Replayed {
    chunks: VecDeque<Bytes>,
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

/// A body that keeps a copy of what it yields, and hands itself back to the [`Replay`]
/// when it is dropped before it yielded anything.
struct Recording {
    /// Taken only when dropped.
    inner: Option<Body>,
    replay: Replay,
}

impl http_body::Body for Recording {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(inner).poll_frame(cx);
        let end_stream = self.inner.as_ref().is_none_or(|b| b.is_end_stream());
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
                // The sender stops polling once the body says it has ended (hyper does
                // not wait for the final None): that is the end too.
                if end_stream {
                    r.ended = true;
                }
            }
            // A body that failed cannot be sent again.
            Poll::Ready(Some(Err(_))) => r.failed = true,
            Poll::Ready(None) => r.ended = true,
            Poll::Pending => {}
        }
        drop(r);
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), |b| b.size_hint())
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        let mut r = self.replay.lock();
        let untouched = !r.ended && !r.too_big && !r.failed && r.len == 0 && r.trailers.is_none();
        if untouched {
            // Given up before any of it was read: the next try may send it.
            r.untouched = self.inner.take();
        }
    }
}
