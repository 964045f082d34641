//! The body type every proxied message is converted to.

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};

/// Any error a body can end with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// A boxed body.
pub type Body = BoxBody<Bytes, BoxError>;

/// A streamed body from hyper.
pub fn incoming(b: hyper::body::Incoming) -> Body {
    b.map_err(|e| Box::new(e) as BoxError).boxed()
}

/// An empty body.
pub fn empty() -> Body {
    Empty::new().map_err(|e| match e {}).boxed()
}

/// A body with `text`.
pub fn text(text: String) -> Body {
    Full::new(Bytes::from(text)).map_err(|e| match e {}).boxed()
}

/// `body`, ended with an error when no frame comes for `idle` (a route's
/// `timeout.ambit.dev/idle`): a stalled response does not hold its client for ever.
pub fn idle_timeout(body: Body, idle: std::time::Duration) -> Body {
    Timed {
        inner: body,
        idle: Some(idle),
        timer: Box::pin(tokio::time::sleep(idle)),
    }
    .boxed()
}

/// `body`, ended with an error if it has not ended by `deadline` (a route's request
/// timeout covers the whole response, not only its headers).
pub fn deadline(body: Body, deadline: tokio::time::Instant) -> Body {
    Timed {
        inner: body,
        idle: None,
        timer: Box::pin(tokio::time::sleep_until(deadline)),
    }
    .boxed()
}

/// A body with a timer: reset by every frame when `idle` is set, else a fixed deadline.
struct Timed {
    inner: Body,
    idle: Option<std::time::Duration>,
    timer: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl http_body::Body for Timed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        use std::task::Poll;
        match std::pin::Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                if let Some(idle) = self.idle {
                    let next = tokio::time::Instant::now() + idle;
                    self.timer.as_mut().reset(next);
                }
                Poll::Ready(frame)
            }
            Poll::Pending => match std::future::Future::poll(self.timer.as_mut(), cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(match self.idle {
                    Some(idle) => format!("no data for {idle:?} (the route's idle timeout)"),
                    None => "the route's request timeout passed".to_string(),
                }
                .into()))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// What a body's end tells whoever counts it (the golden and the route metrics).
pub trait OnEnd: Send + Sync + Unpin + 'static {
    /// The body's trailers went by.
    fn trailers(&mut self, trailers: &http::HeaderMap);
    /// The body failed before its end.
    fn failed(&mut self);
    /// The body ended, or was dropped before its end: called once.
    fn end(self);
}

/// `body`, calling `on` as it goes and once when it ends (or is dropped).
pub fn on_end<E: OnEnd>(body: Body, on: E) -> Body {
    Ending {
        inner: body,
        on: Some(on),
    }
    .boxed()
}

struct Ending<E: OnEnd> {
    inner: Body,
    on: Option<E>,
}

impl<E: OnEnd> http_body::Body for Ending<E> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        use std::task::Poll;
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(on), Some(t)) = (self.on.as_mut(), frame.trailers_ref()) {
                    on.trailers(t);
                }
            }
            Poll::Ready(Some(Err(_))) => {
                if let Some(on) = self.on.as_mut() {
                    on.failed();
                }
            }
            Poll::Ready(None) => {
                if let Some(on) = self.on.take() {
                    on.end();
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl<E: OnEnd> Drop for Ending<E> {
    fn drop(&mut self) {
        if let Some(on) = self.on.take() {
            on.end();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use futures::StreamExt;

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stalls_past_its_idle_timeout_ends_with_an_error() {
        use bytes::Bytes;
        // One frame, then nothing for ever.
        let frames = futures::stream::iter([Ok::<_, BoxError>(http_body::Frame::data(
            Bytes::from_static(b"first"),
        ))])
        .chain(futures::stream::pending());
        let stalled = BodyExt::boxed(http_body_util::StreamBody::new(frames));
        let mut body = idle_timeout(stalled, std::time::Duration::from_secs(5));
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "first");
        let start = tokio::time::Instant::now();
        let end = body.frame().await.unwrap();
        assert!(end.unwrap_err().to_string().contains("idle timeout"));
        assert_eq!(start.elapsed(), std::time::Duration::from_secs(5));
        // A body that keeps coming is not cut.
        let mut body = idle_timeout(text("all of it".into()), std::time::Duration::from_secs(5));
        assert!(body.frame().await.unwrap().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_past_its_deadline_ends_with_an_error_though_data_keeps_coming() {
        use bytes::Bytes;
        // A frame every second, for ever.
        let frames = futures::stream::unfold((), |()| async {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            Some((
                Ok::<_, BoxError>(http_body::Frame::data(Bytes::from_static(b"."))),
                (),
            ))
        });
        let trickle = BodyExt::boxed(http_body_util::StreamBody::new(frames));
        let start = tokio::time::Instant::now();
        let mut body = deadline(trickle, start + std::time::Duration::from_millis(3500));
        let mut frames = 0;
        let end = loop {
            match body.frame().await.unwrap() {
                Ok(_) => frames += 1,
                Err(e) => break e,
            }
        };
        assert_eq!(frames, 3);
        assert!(end.to_string().contains("request timeout"), "{end}");
        assert_eq!(start.elapsed(), std::time::Duration::from_millis(3500));
    }
}
