//! Reading ahead beneath rustls on the pooled tunnel.
//!
//! rustls reads at most one record's worth a call, and after each record it has handed on
//! it shrinks its buffer to 4 KiB, so a bulk stream cost ~5 system calls per 64 KiB on the
//! receiving proxy (`PROFILE=iperf-syscalls bench/mesh/run.sh`: 96,864 `recvfrom` per GB
//! for both proxies). [`ReadAhead`] reads up to [`TUNNEL_READ_AHEAD`] bytes a call and
//! serves rustls's small reads from memory: one copy more, a quarter of the calls (BENCHMARKS.md,
//! "Bulk throughput against the crypto floor").
//!
//! It starts off, reading straight through, and is switched on once the handshake has
//! chosen the HTTP/2 tunnel: the opaque transport hands its socket to kernel TLS at the
//! record where rustls stopped, so nothing may have been read ahead there.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes one read of a tunnel connection may take from the kernel.
pub const TUNNEL_READ_AHEAD: usize = 256 * 1024;

/// An I/O object whose reads, once [`enable`](ReadAhead::enable)d, take as much as the
/// kernel has (up to the buffer) and hand it out in the sizes asked for; writes pass
/// through.
#[derive(Debug)]
pub struct ReadAhead<T> {
    inner: T,
    /// Empty until enabled.
    buf: Vec<u8>,
    pos: usize,
    filled: usize,
}

impl<T> ReadAhead<T> {
    /// Reads straight through until [`enable`](Self::enable)d.
    pub fn new(inner: T) -> Self {
        Self {
            inner,
            buf: Vec::new(),
            pos: 0,
            filled: 0,
        }
    }

    /// From now on, reads take up to `capacity` bytes from `inner` at a time. (The buffer's
    /// pages become resident as bulk traffic fills them.)
    pub fn enable(&mut self, capacity: usize) {
        if self.buf.is_empty() {
            self.buf = vec![0; capacity.max(1)];
        }
    }

    /// The I/O object, if no byte read from it is still held here.
    pub fn into_inner(self) -> Result<T, io::Error> {
        if self.pos < self.filled {
            return Err(io::Error::other(
                "bytes were read ahead of the TLS records: the socket cannot be handed on",
            ));
        }
        Ok(self.inner)
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ReadAhead<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.pos == this.filled {
            // Nothing held: off, or asked for at least a buffer's worth, read straight in.
            if this.buf.is_empty() || out.remaining() >= this.buf.len() {
                return Pin::new(&mut this.inner).poll_read(cx, out);
            }
            let mut ahead = ReadBuf::new(&mut this.buf);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut ahead))?;
            this.pos = 0;
            this.filled = ahead.filled().len();
            if this.filled == 0 {
                return Poll::Ready(Ok(())); // end of stream
            }
        }
        let n = out.remaining().min(this.filled - this.pos);
        out.put_slice(&this.buf[this.pos..this.pos + n]);
        this.pos += n;
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ReadAhead<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// Hands out `data` in reads of whatever size is asked, counting the reads.
    struct Counted {
        data: Vec<u8>,
        at: usize,
        reads: Vec<usize>,
    }

    impl AsyncRead for Counted {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            out: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let n = out.remaining().min(self.data.len() - self.at);
            let at = self.at;
            out.put_slice(&self.data[at..at + n]);
            self.at += n;
            self.reads.push(n);
            Poll::Ready(Ok(()))
        }
    }

    fn counted(len: usize) -> Counted {
        Counted {
            data: (0..len).map(|i| (i % 251) as u8).collect(),
            at: 0,
            reads: Vec::new(),
        }
    }

    async fn read_in(r: &mut ReadAhead<Counted>, chunk: usize) -> Vec<u8> {
        let mut got = Vec::new();
        let mut buf = vec![0; chunk];
        loop {
            let n = r.read(&mut buf).await.unwrap_or_else(|e| panic!("{e}"));
            if n == 0 {
                return got;
            }
            got.extend_from_slice(&buf[..n]);
        }
    }

    #[tokio::test]
    async fn off_it_reads_straight_through() {
        let mut r = ReadAhead::new(counted(40_000));
        let got = read_in(&mut r, 4096).await;
        assert_eq!(got, counted(40_000).data);
        // Ten reads of what was asked, and the end.
        assert_eq!(r.inner.reads.len(), 11);
        assert!(r.inner.reads.iter().all(|&n| n <= 4096));
        assert!(r.into_inner().is_ok());
    }

    #[tokio::test]
    async fn on_it_takes_a_buffer_a_call_and_hands_it_out_in_order() {
        let mut r = ReadAhead::new(counted(600_000));
        r.enable(256 * 1024);
        let got = read_in(&mut r, 4096).await;
        assert_eq!(got, counted(600_000).data, "every byte, in order");
        // Three reads of up to 256 KiB and the end, instead of ~147 of 4 KiB.
        assert_eq!(r.inner.reads, vec![262_144, 262_144, 75_712, 0]);
    }

    #[tokio::test]
    async fn a_read_as_large_as_the_buffer_bypasses_it() {
        let mut r = ReadAhead::new(counted(100_000));
        r.enable(16 * 1024);
        let got = read_in(&mut r, 64 * 1024).await;
        assert_eq!(got, counted(100_000).data);
        assert_eq!(r.inner.reads, vec![65_536, 34_464, 0]);
    }

    #[tokio::test]
    async fn bytes_held_keep_the_socket_from_being_handed_on() {
        let mut r = ReadAhead::new(counted(10_000));
        r.enable(8192);
        let mut one = [0u8; 1];
        assert_eq!(r.read(&mut one).await.unwrap_or_else(|e| panic!("{e}")), 1);
        let err = r
            .into_inner()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("read ahead"), "{err}");
    }
}
