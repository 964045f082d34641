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

/// The pipe each direction's bytes pass through: what one `splice` out moves at most.
/// Filled from as many reads as the source has ready before it is drained (a kTLS socket
/// gives one record, at most 16 KiB, per `splice`; a TCP socket what has arrived): fewer,
/// larger writes, and full TLS records on the way out. 256 KiB: 8 system calls a MiB at
/// best, as the user-space relay's 64 KiB buffers do 16 (BENCHMARKS.md, "Kernel TLS").
const PIPE_SIZE: usize = 256 * 1024;

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
        let (n, end) = fill(from, pipe, from_tls).await?;
        let mut left = n;
        while left > 0 {
            left -= writing(to, || splice(&pipe.read, to, left)).await?;
        }
        moved.fetch_add(n as u64, Ordering::Relaxed);
        if end {
            if !from_tls {
                // `to` is the kTLS socket: a clean TLS end before the FIN.
                writing(to, || super::send_close_notify(to)).await?;
            }
            return shutdown_write(to);
        }
    }
}

/// Moves what `from` has into the empty pipe — waiting for a first byte, then as much
/// more as is there without waiting, up to the pipe's size. Returns the bytes in the pipe
/// and whether the stream ended (a FIN, or the peer's `close_notify` on a kTLS socket).
async fn fill(from: &TcpStream, pipe: &Pipe, from_tls: bool) -> io::Result<(usize, bool)> {
    let mut n = 0;
    loop {
        if n == 0 {
            from.readable().await?;
        }
        match from.try_io(Interest::READABLE, || {
            splice(from, &pipe.write, pipe.size - n)
        }) {
            Ok(0) => return Ok((n, true)),
            Ok(m) => {
                n += m;
                if n == pipe.size {
                    return Ok((n, false));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if n > 0 {
                    return Ok((n, false));
                }
            }
            // kTLS splices data records only: a control record (an alert) is next.
            Err(e) if from_tls && e.raw_os_error() == Some(libc::EINVAL) => {
                match super::read_control(from) {
                    Ok(()) => return Ok((n, true)),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock && n > 0 => {
                        return Ok((n, false))
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
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
    /// Its capacity: [`PIPE_SIZE`], or what the kernel allowed.
    size: usize,
}

impl Pipe {
    fn new() -> io::Result<Self> {
        use nix::fcntl::{fcntl, FcntlArg, OFlag};
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
        // Beyond /proc/sys/fs/pipe-max-size (1 MiB by default) only with CAP_SYS_RESOURCE;
        // the default (64 KiB) serves when the kernel says no.
        let size = fcntl(&write, FcntlArg::F_SETPIPE_SZ(PIPE_SIZE as libc::c_int))
            .or_else(|_| fcntl(&write, FcntlArg::F_GETPIPE_SZ))?;
        Ok(Self {
            read,
            write,
            size: size as usize,
        })
    }
}
