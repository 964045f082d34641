//! The hand-over socket: a `SOCK_SEQPACKET` unix socket in the run directory. Each
//! message is one JSON object in one datagram, with the descriptors it hands over riding
//! in the same `sendmsg` (`SCM_RIGHTS`) — the kernel keeps message boundaries and ties
//! the descriptors to their message, so no framing is needed. Only a peer with our own
//! user id may talk on it (`SO_PEERCRED`): what it can take is every pod's listener.

use nix::sys::socket::{
    accept4, bind, connect, getsockopt, listen, recvmsg, sendmsg, socket, sockopt, AddressFamily,
    Backlog, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr,
};
use serde::{Deserialize, Serialize};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use tokio::io::unix::AsyncFd;

/// The largest message either side sends (a pod's key and netns path are the bulk).
pub const MAX_MESSAGE: usize = 64 * 1024;
/// The most descriptors one message carries: a dual-stack pod's six listeners.
pub const MAX_FDS: usize = 8;

/// What the two processes say to each other, in order (`→` from the new process, `←` from
/// the running one).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Message {
    /// → The new process introduces itself.
    Hello {
        /// Its pid (for the logs).
        pid: u32,
        /// Its version.
        version: String,
        /// Whether it wants the admin listener: it could not bind the admin address, which
        /// is the running process's (the same network namespace: host network, one
        /// machine). In a pod of its own it binds its own.
        admin: bool,
    },
    /// ← The running process answers; the admin listener rides with it when asked for,
    /// and from then on the new process answers the probes (not ready until it serves the
    /// pods).
    Admin {
        /// Its pid.
        pid: u32,
        /// Its version.
        version: String,
    },
    /// → The new process can serve (discovery, policy and every certificate in hand): hand
    /// over the CNI socket and the pods.
    Take,
    /// ← The CNI socket's listener (the running process no longer accepts on it).
    Cni,
    /// ← One pod's listeners, per address family `[outbound, mesh, plaintext]`.
    Pod {
        /// `<namespace>/<name>`.
        key: String,
        /// The netns path the listeners were opened in.
        netns: PathBuf,
        /// That netns's (device, inode): a pod whose netns changed is not handed over.
        netns_id: (u64, u64),
        /// For each family, whether it is IPv6; three descriptors each.
        ipv6: Vec<bool>,
    },
    /// ← Every pod has been sent.
    Done {
        /// How many.
        pods: usize,
    },
    /// → The new process accepts on every pod handed over that it serves: stop accepting
    /// and drain.
    Serving,
    /// ← Stopped accepting; draining now.
    Released,
    /// Either side: the hand-over cannot go on, and why.
    Error {
        /// What went wrong.
        message: String,
    },
}

/// One end of a hand-over connection.
#[derive(Debug)]
pub struct Channel {
    fd: AsyncFd<OwnedFd>,
}

/// Registers `fd` with the runtime. `AsyncFd::new` is deprecated because the descriptor
/// could be closed under it; an `OwnedFd` moved in lives exactly as long as the `AsyncFd`.
#[allow(deprecated)]
fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    AsyncFd::new(fd)
}

fn seqpacket() -> io::Result<OwnedFd> {
    socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )
    .map_err(io::Error::from)
}

/// Refuses a peer that does not run as our own user.
fn check_peer(fd: BorrowedFd<'_>) -> io::Result<()> {
    let cred = getsockopt(&fd, sockopt::PeerCredentials).map_err(io::Error::from)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    #[allow(unsafe_code)]
    let own = unsafe { libc::geteuid() };
    if cred.uid() == own {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "hand-over peer pid {} runs as uid {}, not {own}: refused",
                cred.pid(),
                cred.uid()
            ),
        ))
    }
}

impl Channel {
    /// Connects to the process listening at `path`. `Ok(None)` when nothing does (no
    /// socket file, or a stale one a killed process left).
    pub fn connect(path: &Path) -> io::Result<Option<Self>> {
        let fd = seqpacket()?;
        let addr = UnixAddr::new(path).map_err(io::Error::from)?;
        match connect(fd.as_raw_fd(), &addr) {
            Ok(()) => {}
            Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ECONNREFUSED) => return Ok(None),
            // A non-blocking connect on a unix socket completes at once or fails; EAGAIN
            // means the listener's backlog is full: as good as nobody there.
            Err(nix::errno::Errno::EAGAIN) => {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!(
                        "{}: the running proxy's hand-over backlog is full",
                        path.display()
                    ),
                ))
            }
            Err(e) => return Err(io::Error::from(e)),
        }
        check_peer(fd.as_fd())?;
        Ok(Some(Self { fd: register(fd)? }))
    }

    /// Sends `msg` with `fds`.
    pub async fn send(&self, msg: &Message, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
        let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
        loop {
            let mut guard = self.fd.writable().await?;
            let sent = guard.try_io(|fd| {
                let iov = [io::IoSlice::new(&body)];
                let cmsg: Vec<ControlMessage<'_>> = if raw.is_empty() {
                    Vec::new()
                } else {
                    vec![ControlMessage::ScmRights(&raw)]
                };
                sendmsg::<()>(fd.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None)
                    .map_err(io::Error::from)
            });
            match sent {
                Ok(r) => return r.map(drop),
                Err(_would_block) => continue,
            }
        }
    }

    /// The next message and the descriptors that came with it; `None` when the peer has
    /// closed the connection.
    pub async fn recv(&self) -> io::Result<Option<(Message, Vec<OwnedFd>)>> {
        let mut buf = vec![0u8; MAX_MESSAGE];
        loop {
            let mut guard = self.fd.readable().await?;
            let got = guard.try_io(|fd| recv(fd.as_raw_fd(), &mut buf));
            let (n, fds) = match got {
                Ok(r) => r?,
                Err(_would_block) => continue,
            };
            if n == 0 {
                return Ok(None);
            }
            let msg = serde_json::from_slice(&buf[..n]).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("hand-over message not understood: {e}"),
                )
            })?;
            return Ok(Some((msg, fds)));
        }
    }

    /// Waits for the next message, which must be one `accept` takes; an `Error` from the
    /// peer, a closed connection or another message is an error.
    pub async fn expect<T>(
        &self,
        what: &str,
        accept: impl Fn(Message, Vec<OwnedFd>) -> Option<T>,
    ) -> io::Result<T> {
        match self.recv().await? {
            None => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("the other process closed the hand-over while {what} was awaited"),
            )),
            Some((Message::Error { message }, _)) => Err(io::Error::other(format!(
                "the other process gave up the hand-over: {message}"
            ))),
            Some((msg, fds)) => {
                let shown = format!("{msg:?}");
                accept(msg, fds).ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("hand-over: {what} awaited, got {shown}"),
                    )
                })
            }
        }
    }
}

/// `recvmsg` taking every descriptor that came; a truncated message or control buffer is
/// an error (and what came is closed).
fn recv(sock: RawFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = [io::IoSliceMut::new(buf)];
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let msg = recvmsg::<()>(sock, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
        .map_err(io::Error::from)?;
    let mut fds = Vec::new();
    for cmsg in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(raw) = cmsg {
            for fd in raw {
                // SAFETY: the kernel just installed this descriptor for us; we own it.
                #[allow(unsafe_code)]
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    if msg
        .flags
        .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC)
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "hand-over message truncated (too large, or too many descriptors)",
        ));
    }
    Ok((msg.bytes, fds))
}

/// The listening end, bound at a path in the run directory (mode 0600).
#[derive(Debug)]
pub struct Listener {
    fd: AsyncFd<OwnedFd>,
    path: PathBuf,
}

impl Listener {
    /// Binds `path`, replacing what is there (a stale socket, or the one of the process
    /// this one took over from: that one has stopped listening by then).
    pub fn bind(path: &Path) -> io::Result<Self> {
        use std::os::unix::fs::PermissionsExt;
        let fd = seqpacket()?;
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        // Bound under a temporary name and renamed: a process connecting meanwhile finds
        // either the old socket or this one, never a socket with the wrong mode.
        let tmp = path.with_extension("tmp");
        let _ = std::fs::remove_file(&tmp);
        bind(
            fd.as_raw_fd(),
            &UnixAddr::new(&tmp).map_err(io::Error::from)?,
        )
        .map_err(io::Error::from)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
        listen(&fd, Backlog::new(4).map_err(io::Error::from)?).map_err(io::Error::from)?;
        std::fs::rename(&tmp, path)?;
        Ok(Self {
            fd: register(fd)?,
            path: path.to_path_buf(),
        })
    }

    /// The next connection from a peer with our user id (others are refused and logged).
    pub async fn accept(&self) -> io::Result<Channel> {
        loop {
            let mut guard = self.fd.readable().await?;
            let accepted = guard.try_io(|fd| {
                accept4(
                    fd.as_raw_fd(),
                    SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
                )
                .map_err(io::Error::from)
            });
            let raw = match accepted {
                Ok(r) => r?,
                Err(_would_block) => continue,
            };
            // SAFETY: accept4 returned a new descriptor that nothing else owns.
            #[allow(unsafe_code)]
            let fd = unsafe { OwnedFd::from_raw_fd(raw) };
            if let Err(error) = check_peer(fd.as_fd()) {
                tracing::warn!(%error, "hand-over socket: peer refused");
                continue;
            }
            return Ok(Channel { fd: register(fd)? });
        }
    }

    /// Where it is bound.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn messages_and_descriptors_cross_and_a_stale_socket_is_nobody() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("handover.sock");
        assert!(Channel::connect(&path)
            .unwrap_or_else(|e| panic!("{e}"))
            .is_none());
        let listener = Listener::bind(&path).unwrap_or_else(|e| panic!("{e}"));
        let client = Channel::connect(&path)
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("nobody listening"));
        let server = listener.accept().await.unwrap_or_else(|e| panic!("{e}"));
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let addr = tcp.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let hello = Message::Pod {
            key: "shop/web".into(),
            netns: "/run/netns/web".into(),
            netns_id: (1, 2),
            ipv6: vec![false],
        };
        server
            .send(&hello, &[tcp.as_fd()])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let (got, fds) = client
            .recv()
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("closed"));
        assert_eq!(got, hello);
        assert_eq!(fds.len(), 1);
        // The same listening socket: a connection to it is accepted through the copy.
        let copy = std::net::TcpListener::from(fds.into_iter().next().unwrap_or_else(|| panic!()));
        assert_eq!(copy.local_addr().unwrap_or_else(|e| panic!("{e}")), addr);
        drop(tcp);
        let _c = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{e}"));
        copy.accept().unwrap_or_else(|e| panic!("{e}"));
        // The peer gone: None; garbage: an error that says so.
        drop(server);
        assert!(client
            .recv()
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .is_none());
        drop(listener);
        assert!(Channel::connect(&path)
            .unwrap_or_else(|e| panic!("{e}"))
            .is_none());
    }

    #[tokio::test]
    async fn garbage_is_refused_with_a_reason() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("handover.sock");
        let listener = Listener::bind(&path).unwrap_or_else(|e| panic!("{e}"));
        let client = Channel::connect(&path)
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("nobody listening"));
        let server = listener.accept().await.unwrap_or_else(|e| panic!("{e}"));
        for garbage in [&b"{\"type\":\"steal\"}"[..], b"\x00\xffGET / HTTP/1.1"] {
            let n = nix::sys::socket::send(client.fd.as_raw_fd(), garbage, MsgFlags::MSG_NOSIGNAL)
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(n > 0);
            let err = server.recv().await.unwrap_err();
            assert!(err.to_string().contains("not understood"), "{err}");
        }
    }
}
