//! The one system call of kernel TLS that `nix` does not wrap: sending a record of a given
//! type (an alert) with a `TLS_SET_RECORD_TYPE` control message.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, AsRawFd};

/// `cmsg_type` of the record type to send, at level `SOL_TLS` (`<linux/tls.h>`).
const TLS_SET_RECORD_TYPE: libc::c_int = 1;

/// Sends `data` as one record of `record_type` on a kTLS socket, without blocking.
pub fn send_record(socket: &impl AsFd, record_type: u8, data: &[u8]) -> io::Result<()> {
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(1) } as usize;
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: msghdr is plain data (all zeroes is valid); the pointers set below point to
    // `iov` and `control`, which outlive the sendmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: the control buffer has room for one cmsg header and one byte of data
    // (CMSG_SPACE(1)), so CMSG_FIRSTHDR is non-null and CMSG_DATA points inside it.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_TLS;
        (*cmsg).cmsg_type = TLS_SET_RECORD_TYPE;
        (*cmsg).cmsg_len = libc::CMSG_LEN(1) as _;
        *libc::CMSG_DATA(cmsg) = record_type;
    }
    let fd = socket.as_fd().as_raw_fd();
    // SAFETY: `msg` is fully initialised and its buffers are alive; `fd` is open (borrowed).
    let rc = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}
