//! Peers that stop reading: an I/O wrapper that fails a write (or flush, or shutdown) that
//! has made no progress for a while, so that a client which never reads what it asked for
//! cannot hold a connection, its buffers and its place in a budget forever (a graceful
//! shutdown waits for its GOAWAY or response to be written, which then never happens).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// `io`, whose writes fail with `TimedOut` once blocked for `limit`.
#[derive(Debug)]
pub struct WriteDeadline<T> {
    io: T,
    limit: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<T> WriteDeadline<T> {
    /// Wraps `io`.
    pub fn new(io: T, limit: Duration) -> Self {
        Self {
            io,
            limit,
            stalled: None,
        }
    }

    /// Called when a write is pending: arms the deadline, or fails once it has passed.
    fn pending<R>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        let limit = self.limit;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        ready!(sleep.as_mut().poll(cx));
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the peer has read nothing for {limit:?}"),
        )))
    }

    fn progress<R>(&mut self, r: Poll<io::Result<R>>, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        match r {
            Poll::Pending => self.pending(cx),
            done => {
                self.stalled = None;
                done
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteDeadline<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, data);
        self.progress(r, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.progress(r, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_flush(cx);
        self.progress(r, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_shutdown(cx);
        self.progress(r, cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn a_write_to_a_peer_that_never_reads_fails_after_the_limit() {
        let (a, mut b) = tokio::io::duplex(16);
        let mut a = WriteDeadline::new(a, Duration::from_secs(10));
        // Written while the peer reads: no deadline, however long it takes overall.
        let reader = tokio::spawn(async move {
            let mut got = [0u8; 64];
            for _ in 0..4 {
                tokio::time::sleep(Duration::from_secs(6)).await;
                b.read_exact(&mut got[..16])
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
            }
            b
        });
        a.write_all(&[1u8; 64])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let _b = reader.await.unwrap_or_else(|e| panic!("{e}"));
        // Now the peer reads nothing: the write fails after 10 s.
        let start = tokio::time::Instant::now();
        let err = a.write_all(&[2u8; 64]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(start.elapsed(), Duration::from_secs(10));
    }
}
