//! The node proxy's CNI socket, seen from the plugin.

use ambit_api::cni::{decode, encode, Request, Response, MAX_MESSAGE};
use std::io::{self, IoSlice, Read};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// Why the proxy could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing listens on the socket (the proxy is not running on this node).
    #[error("cannot reach the node proxy at {socket}: {source}")]
    Unreachable {
        /// The socket path.
        socket: String,
        /// Why.
        source: io::Error,
    },
    /// The proxy took the request but did not answer in time, or hung up.
    #[error("no answer from the node proxy at {socket}: {detail}")]
    NoAnswer {
        /// The socket path.
        socket: String,
        /// Why.
        detail: String,
    },
}

/// Sends `request` (with `fd` attached, if any) and waits up to `timeout` for the answer.
pub fn ask(
    socket: &Path,
    request: &Request,
    fd: Option<BorrowedFd<'_>>,
    timeout: Duration,
) -> Result<Response, ClientError> {
    let name = socket.display().to_string();
    let no_answer = |detail: String| ClientError::NoAnswer {
        socket: name.clone(),
        detail,
    };
    let mut stream = UnixStream::connect(socket).map_err(|source| ClientError::Unreachable {
        socket: name.clone(),
        source,
    })?;
    stream
        .set_write_timeout(Some(timeout))
        .and_then(|()| stream.set_read_timeout(Some(timeout)))
        .map_err(|e| no_answer(e.to_string()))?;
    let bytes = encode(request).map_err(|e| no_answer(e.to_string()))?;
    send_all(&stream, &bytes, fd).map_err(|e| no_answer(format!("sending: {e}")))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).map_err(|e| {
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) {
                no_answer(format!("timed out after {timeout:?}"))
            } else {
                no_answer(e.to_string())
            }
        })?;
        if n == 0 {
            return Err(no_answer(
                "the proxy closed the connection without answering".into(),
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_MESSAGE + 4 {
            return Err(no_answer("answer too long".into()));
        }
        if let Some(response) = decode::<Response>(&buf).map_err(|e| no_answer(e.to_string()))? {
            return Ok(response);
        }
    }
}

/// Writes `bytes`, the descriptor riding with the first chunk.
fn send_all(stream: &UnixStream, bytes: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let raw = fd.map(|f| [f.as_raw_fd()]);
    let mut sent = 0;
    while sent < bytes.len() {
        let iov = [IoSlice::new(&bytes[sent..])];
        let cmsg: Vec<ControlMessage<'_>> = match (&raw, sent) {
            (Some(fds), 0) => vec![ControlMessage::ScmRights(fds)],
            _ => Vec::new(),
        };
        sent += sendmsg::<()>(
            stream.as_raw_fd(),
            &iov,
            &cmsg,
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(io::Error::from)?;
    }
    Ok(())
}
