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
    IdleTimeout {
        inner: body,
        idle,
        timer: Box::pin(tokio::time::sleep(idle)),
    }
    .boxed()
}

struct IdleTimeout {
    inner: Body,
    idle: std::time::Duration,
    timer: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl http_body::Body for IdleTimeout {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        use std::task::Poll;
        match std::pin::Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                let deadline = tokio::time::Instant::now() + self.idle;
                self.timer.as_mut().reset(deadline);
                Poll::Ready(frame)
            }
            Poll::Pending => match std::future::Future::poll(self.timer.as_mut(), cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(format!(
                    "no data for {:?} (the route's idle timeout)",
                    self.idle
                )
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
}
