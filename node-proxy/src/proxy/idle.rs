//! Idle connections: an I/O wrapper that notes when bytes last moved, and a future that
//! resolves once they have not for a while — the server then shuts the connection down
//! gracefully (a request in flight finishes; an HTTP/2 peer gets GOAWAY).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// When bytes last moved on a connection, in milliseconds since its start, and how many
/// moved each way (the connection's `tcp_read_bytes`/`tcp_write_bytes`).
#[derive(Clone, Debug)]
pub struct Activity {
    start: Instant,
    moved: Arc<Moved>,
}

#[derive(Debug, Default)]
struct Moved {
    last_ms: AtomicU64,
    read: AtomicU64,
    written: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            moved: Arc::default(),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.moved.last_ms.store(ms, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.start + Duration::from_millis(self.moved.last_ms.load(Ordering::Relaxed))
    }

    fn wrote(&self, n: usize) {
        if n > 0 {
            self.touch();
            self.moved.written.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// Bytes read from and written to the connection so far.
    pub fn bytes(&self) -> (u64, u64) {
        (
            self.moved.read.load(Ordering::Relaxed),
            self.moved.written.load(Ordering::Relaxed),
        )
    }

    /// Resolves once nothing has moved for `timeout`.
    pub async fn idle_for(&self, timeout: Duration) {
        loop {
            let deadline = self.last() + timeout;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// `io`, noting in an [`Activity`] each read or write that moves bytes.
#[derive(Debug)]
pub struct Tracked<T> {
    io: T,
    activity: Activity,
}

impl<T> Tracked<T> {
    /// Wraps `io`; the activity starts now.
    pub fn new(io: T) -> (Self, Activity) {
        let activity = Activity::new();
        (
            Self {
                io,
                activity: activity.clone(),
            },
            activity,
        )
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Tracked<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.activity.touch();
            self.activity
                .moved
                .read
                .fetch_add(n as u64, Ordering::Relaxed);
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Tracked<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = r {
            self.activity.wrote(n);
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = r {
            self.activity.wrote(n);
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn idle_resolves_only_after_a_quiet_period() {
        let (a, mut b) = tokio::io::duplex(64);
        let (mut a, activity) = Tracked::new(a);
        let idle = activity.clone();
        let watcher = tokio::spawn(async move { idle.idle_for(Duration::from_secs(10)).await });
        tokio::time::sleep(Duration::from_secs(6)).await;
        a.write_all(b"x").await.unwrap();
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert!(!watcher.is_finished(), "bytes 6 s ago: not idle");
        let mut one = [0u8; 1];
        b.write_all(b"y").await.unwrap();
        a.read_exact(&mut one).await.unwrap();
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert!(!watcher.is_finished(), "a read 9 s ago: not idle");
        tokio::time::sleep(Duration::from_secs(2)).await;
        tokio::task::yield_now().await;
        assert!(watcher.is_finished(), "11 s without a byte: idle");
        a.write_all(b"zz").await.unwrap();
        assert_eq!(activity.bytes(), (1, 3), "read 1 byte, wrote 3");
    }
}
