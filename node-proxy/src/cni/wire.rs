//! One request off the CNI socket: framed bytes ([`ambit_api::cni`]) and the network
//! namespace's descriptor riding along (`SCM_RIGHTS`).

use ambit_api::cni::{decode, Request};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use tokio::io::Interest;
use tokio::net::UnixStream;

/// Reads one framed request, and the file descriptor that came with it (if any).
pub(super) async fn read_request(stream: &UnixStream) -> io::Result<(Request, Option<OwnedFd>)> {
    let mut buf = Vec::new();
    let mut fd = None;
    loop {
        stream.readable().await?;
        let mut chunk = [0u8; 8192];
        let read = stream.try_io(Interest::READABLE, || {
            recv_with_fd(stream.as_raw_fd(), &mut chunk)
        });
        match read {
            Ok((0, _)) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the plugin closed before a whole request",
                ))
            }
            Ok((n, got)) => {
                buf.extend_from_slice(&chunk[..n]);
                if got.is_some() {
                    fd = got;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
        if let Some(request) = decode::<Request>(&buf).map_err(io::Error::other)? {
            return Ok((request, fd));
        }
    }
}

/// The most descriptors one message can carry (the kernel's `SCM_MAX_FD`).
const SCM_MAX_FD: usize = 253;

/// `recvmsg` keeping the first descriptor; any extra descriptors are closed. The control
/// buffer has room for as many as a message can carry: one that did not fit would be
/// installed in the proxy all the same, behind a truncated (`MSG_CTRUNC`) control message
/// that cannot be read back — leaked.
fn recv_with_fd(sock: RawFd, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut iov = [io::IoSliceMut::new(buf)];
    let mut space = nix::cmsg_space!([RawFd; SCM_MAX_FD]);
    let msg = recvmsg::<()>(sock, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
        .map_err(io::Error::from)?;
    let mut fd = None;
    for cmsg in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            for raw in fds {
                // SAFETY: the kernel just installed this descriptor for us; we own it.
                #[allow(unsafe_code)]
                let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                if fd.is_none() {
                    fd = Some(owned);
                }
            }
        }
    }
    Ok((msg.bytes, fd))
}
