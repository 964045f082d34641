//! Protocol detection on a connection's first bytes, bounded in size and time.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

/// The HTTP/2 connection preface.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Detection reads at most this much; a request line longer than this is not HTTP we
/// proxy at L7 (it is passed through as opaque TCP).
pub const DETECT_LIMIT: usize = 8 * 1024;

/// What the client speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.x.
    Http1,
    /// HTTP/2 with prior knowledge (gRPC among it).
    Http2,
    /// Anything else: a TLS ClientHello, a binary protocol, a server-speaks-first protocol
    /// (nothing arrived in time), or an empty connection.
    Opaque,
}

/// A stream with bytes already read from it put back in front.
#[derive(Debug)]
pub struct Rewind<S> {
    prefix: Vec<u8>,
    pos: usize,
    inner: S,
}

impl<S> Rewind<S> {
    /// `inner`, with `prefix` to be read first.
    pub fn new(prefix: Vec<u8>, inner: S) -> Self {
        Self {
            prefix,
            pos: 0,
            inner,
        }
    }

    /// What was read ahead and not yet consumed, and the stream itself.
    pub fn into_parts(mut self) -> (Vec<u8>, S) {
        self.prefix.drain(..self.pos);
        (self.prefix, self.inner)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.pos < self.prefix.len() {
            let n = (self.prefix.len() - self.pos).min(buf.remaining());
            let start = self.pos;
            buf.put_slice(&self.prefix[start..start + n]);
            self.pos += n;
            if self.pos == self.prefix.len() {
                self.prefix = Vec::new();
                self.pos = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Classifies what has been read so far: `None` while more bytes could change the answer.
pub fn classify(buf: &[u8], done: bool) -> Option<Protocol> {
    if buf.is_empty() {
        return done.then_some(Protocol::Opaque);
    }
    if buf.len() >= H2_PREFACE.len() && buf.starts_with(H2_PREFACE) {
        return Some(Protocol::Http2);
    }
    if H2_PREFACE.starts_with(buf) && !done {
        return None; // could still be the preface ("PRI" is also a valid HTTP/1 token start)
    }
    if buf[0] == 0x16 {
        return Some(Protocol::Opaque); // TLS ClientHello: passed through untouched
    }
    // HTTP/1: a method token, a space, a target, " HTTP/1.x\r\n".
    let method_len = buf.iter().take_while(|b| b.is_ascii_uppercase()).count();
    if method_len == 0 || method_len > 16 {
        return Some(Protocol::Opaque);
    }
    if method_len == buf.len() {
        return if done { Some(Protocol::Opaque) } else { None };
    }
    if buf[method_len] != b' ' {
        return Some(Protocol::Opaque);
    }
    match buf.iter().position(|b| *b == b'\n') {
        Some(eol) => {
            let line = &buf[..eol];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            Some(
                if line.ends_with(b" HTTP/1.1") || line.ends_with(b" HTTP/1.0") {
                    Protocol::Http1
                } else {
                    Protocol::Opaque
                },
            )
        }
        None if done || buf.len() >= DETECT_LIMIT => Some(Protocol::Opaque),
        None => None,
    }
}

/// Reads until the protocol is known, the limit is reached, the peer half-closes, or
/// `timeout` passes (a server-speaks-first protocol: opaque). Returns the protocol and the
/// stream with what was read put back.
pub async fn detect<S: AsyncRead + Unpin>(
    mut stream: S,
    timeout: Duration,
) -> io::Result<(Protocol, Rewind<S>)> {
    let mut buf = Vec::with_capacity(1024);
    let deadline = tokio::time::Instant::now() + timeout;
    let protocol = loop {
        if let Some(p) = classify(&buf, false) {
            break p;
        }
        let mut chunk = [0u8; 1024];
        let want = chunk.len().min(DETECT_LIMIT - buf.len());
        match tokio::time::timeout_at(deadline, stream.read(&mut chunk[..want])).await {
            Err(_) => break classify(&buf, true).unwrap_or(Protocol::Opaque),
            Ok(Ok(0)) => break classify(&buf, true).unwrap_or(Protocol::Opaque),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
            Ok(Err(e)) => return Err(e),
        }
    };
    Ok((protocol, Rewind::new(buf, stream)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_what_it_sees() {
        assert_eq!(
            classify(b"GET / HTTP/1.1\r\nHost: a\r\n", false),
            Some(Protocol::Http1)
        );
        assert_eq!(
            classify(b"POST /x HTTP/1.0\n", false),
            Some(Protocol::Http1)
        );
        assert_eq!(classify(H2_PREFACE, false), Some(Protocol::Http2));
        assert_eq!(classify(b"PRI * HTTP/2", false), None);
        assert_eq!(classify(b"GET / HT", false), None);
        assert_eq!(classify(b"GE", true), Some(Protocol::Opaque));
        assert_eq!(classify(&[0x16, 0x03, 0x01], false), Some(Protocol::Opaque));
        assert_eq!(
            classify(b"\x00\x00\x00\x08garbage", false),
            Some(Protocol::Opaque)
        );
        assert_eq!(
            classify(b"get / HTTP/1.1\r\n", false),
            Some(Protocol::Opaque)
        );
        assert_eq!(classify(b"GET / SPDY/3\r\n", false), Some(Protocol::Opaque));
        assert_eq!(classify(b"", true), Some(Protocol::Opaque));
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_client_is_opaque_after_the_timeout() {
        let (client, _server_end_kept_open) = tokio::io::duplex(64);
        let (p, _) = detect(client, Duration::from_secs(10)).await.unwrap();
        assert_eq!(p, Protocol::Opaque);
    }

    #[tokio::test]
    async fn detected_bytes_are_read_again() {
        let (client, mut server) = tokio::io::duplex(64);
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            server.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
            server.write_all(b"Host: a\r\n\r\n").await.unwrap();
            drop(server);
        });
        let (p, mut s) = detect(client, Duration::from_secs(10)).await.unwrap();
        assert_eq!(p, Protocol::Http1);
        let mut all = Vec::new();
        s.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    }

    #[tokio::test]
    async fn a_byte_at_a_time_client_is_still_detected() {
        let (client, mut server) = tokio::io::duplex(64);
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for b in H2_PREFACE {
                server.write_all(&[*b]).await.unwrap();
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        });
        let (p, _) = detect(client, Duration::from_secs(10)).await.unwrap();
        assert_eq!(p, Protocol::Http2);
    }
}
