//! Relaying between a plain TCP socket and a kTLS socket with `splice(2)`: bytes move
//! socket → pipe → socket inside the kernel, which encrypts or decrypts them on the kTLS
//! side; nothing is copied through user space.
//!
//! It behaves as [`crate::proxy::relay`] does: each direction runs until its source ends,
//! then half-closes its destination (after a `close_notify` when the destination is the
//! kTLS socket); the relay ends when both have, or at the first error (both sockets are
//! then dropped by the caller).

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Bytes asked of one `splice` into a pipe: the pipe's default capacity (16 pages).
const CHUNK: usize = 64 * 1024;

/// Which side of a relay is the kTLS socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ktls {
    /// The client side (inbound: the connection from the peer proxy).
    Client,
    /// The server side (outbound: the connection to the peer proxy).
    Server,
}

/// Copies both ways with `splice` until both sides have closed, passing half-closes
/// through; returns the bytes read from and written to `client`, as far as they got.
pub async fn relay(client: &TcpStream, server: &TcpStream, ktls: Ktls) -> (u64, u64) {
    let (up, down) = (AtomicU64::new(0), AtomicU64::new(0));
    let result = async {
        let (a, b) = (Pipe::new()?, Pipe::new()?);
        let to_server = pump(client, server, &a, ktls == Ktls::Client, &up);
        let to_client = pump(server, client, &b, ktls == Ktls::Server, &down);
        tokio::try_join!(to_server, to_client)
    }
    .await;
    if let Err(error) = result {
        tracing::debug!(%error, "connection ended with an error");
    }
    (up.into_inner(), down.into_inner())
}

/// One direction: `from` → pipe → `to` until `from` ends, then half-close `to`.
async fn pump(
    from: &TcpStream,
    to: &TcpStream,
    pipe: &Pipe,
    from_tls: bool,
    moved: &AtomicU64,
) -> io::Result<()> {
    loop {
        let n = fill(from, pipe, from_tls).await?;
        if n == 0 {
            if !from_tls {
                // `to` is the kTLS socket: a clean TLS end before the FIN.
                writing(to, || super::send_close_notify(to)).await?;
            }
            return shutdown_write(to);
        }
        let mut left = n;
        while left > 0 {
            left -= writing(to, || splice(&pipe.read, to, left)).await?;
        }
        moved.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Moves what `from` has (up to [`CHUNK`]) into the empty pipe; 0 at the end of the stream
/// (a FIN, or the peer's `close_notify` on a kTLS socket).
async fn fill(from: &TcpStream, pipe: &Pipe, from_tls: bool) -> io::Result<usize> {
    loop {
        from.readable().await?;
        match from.try_io(Interest::READABLE, || splice(from, &pipe.write, CHUNK)) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            // kTLS splices data records only: a control record (an alert) is next.
            Err(e) if from_tls && e.raw_os_error() == Some(libc::EINVAL) => {
                match super::read_control(from) {
                    Ok(()) => return Ok(0),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// Runs a non-blocking write operation on `to` when it is writable, until it does not
/// answer `WouldBlock`.
async fn writing<T>(to: &TcpStream, mut op: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        to.writable().await?;
        match to.try_io(Interest::WRITABLE, &mut op) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

fn shutdown_write(to: &TcpStream) -> io::Result<()> {
    match nix::sys::socket::shutdown(to.as_raw_fd(), nix::sys::socket::Shutdown::Write) {
        // The peer is gone already: nothing left to tell it.
        Ok(()) | Err(nix::errno::Errno::ENOTCONN) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn splice(from: impl AsFd, to: impl AsFd, len: usize) -> io::Result<usize> {
    use nix::fcntl::SpliceFFlags;
    nix::fcntl::splice(
        from,
        None,
        to,
        None,
        len,
        SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK,
    )
    .map_err(io::Error::from)
}

/// A non-blocking pipe: the kernel buffer bytes pass through.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    fn new() -> io::Result<Self> {
        use nix::fcntl::OFlag;
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
        Ok(Self { read, write })
    }
}
