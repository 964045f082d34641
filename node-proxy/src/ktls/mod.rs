//! Kernel TLS (kTLS): after a rustls handshake, the TLS 1.3 record layer of a connection is
//! handed to the kernel (`TCP_ULP "tls"`, then `TLS_TX` and `TLS_RX` with the traffic
//! secrets and sequence numbers rustls exports), so that the kernel encrypts what is
//! written to the socket and decrypts what is read from it — and `splice(2)` can move bytes
//! between it and another socket without a copy through user space ([`splice`]).
//!
//! Not every kernel has it (`CONFIG_TLS`, the `tls` module loaded): [`probe`] finds out
//! once, on a loopback connection of the proxy's own, and says why not.
//!
//! What the kernel does not do for us, and this module does:
//! - non-data records: a `close_notify` alert is sent on half-close ([`send_close_notify`])
//!   and recognised on receipt ([`read_control`]); any other alert or handshake message
//!   ends the connection with an error (kTLS here does not do TLS 1.3 KeyUpdate; rustls
//!   only sends one after ~2^24 records under one key).

pub mod splice;
mod sys;

use nix::sys::socket::{setsockopt, sockopt};
use rustls::ConnectionTrafficSecrets;
use std::io;
use std::os::fd::AsFd;
use std::sync::OnceLock;

/// TLS record content types.
const RECORD_ALERT: u8 = 21;
/// Alert description `close_notify`.
const CLOSE_NOTIFY: u8 = 0;

/// The kernel's description of one direction: TLS 1.3 has no explicit nonce, so the
/// 12-byte IV rustls exports is the kernel's 4-byte salt and 8-byte IV (ChaCha20-Poly1305
/// takes all 12 as IV); the record sequence number is big-endian.
fn crypto_info(
    (seq, secrets): &(u64, ConnectionTrafficSecrets),
) -> io::Result<sockopt::TlsCryptoInfo> {
    fn info(cipher_type: u16) -> libc::tls_crypto_info {
        libc::tls_crypto_info {
            version: libc::TLS_1_3_VERSION,
            cipher_type,
        }
    }
    fn copy<const N: usize>(src: &[u8]) -> io::Result<[u8; N]> {
        src.try_into().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("kernel TLS: {} bytes where {N} were expected", src.len()),
            )
        })
    }
    let rec_seq = seq.to_be_bytes();
    Ok(match secrets {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv } => {
            let iv = iv.as_ref();
            sockopt::TlsCryptoInfo::Aes128Gcm(libc::tls12_crypto_info_aes_gcm_128 {
                info: info(libc::TLS_CIPHER_AES_GCM_128),
                iv: copy(&iv[4..])?,
                key: copy(key.as_ref())?,
                salt: copy(&iv[..4])?,
                rec_seq,
            })
        }
        ConnectionTrafficSecrets::Aes256Gcm { key, iv } => {
            let iv = iv.as_ref();
            sockopt::TlsCryptoInfo::Aes256Gcm(libc::tls12_crypto_info_aes_gcm_256 {
                info: info(libc::TLS_CIPHER_AES_GCM_256),
                iv: copy(&iv[4..])?,
                key: copy(key.as_ref())?,
                salt: copy(&iv[..4])?,
                rec_seq,
            })
        }
        ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
            sockopt::TlsCryptoInfo::Chacha20Poly1305(libc::tls12_crypto_info_chacha20_poly1305 {
                info: info(libc::TLS_CIPHER_CHACHA20_POLY1305),
                iv: copy(iv.as_ref())?,
                key: copy(key.as_ref())?,
                salt: [],
                rec_seq,
            })
        }
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "kernel TLS: no kernel cipher for the negotiated suite",
            ))
        }
    })
}

/// Hands the record layer of a connection whose TLS 1.3 handshake rustls has completed to
/// the kernel. The caller must not have let rustls read past the handshake (or the last
/// record it consumed): the kernel takes the byte stream from where rustls stopped.
pub fn install(socket: &impl AsFd, secrets: &rustls::ExtractedSecrets) -> io::Result<()> {
    let step = |what: &str, e: nix::Error| {
        io::Error::new(io::Error::from(e).kind(), format!("{what}: {e}"))
    };
    setsockopt(socket, sockopt::TcpUlp::default(), b"tls")
        .map_err(|e| step("setsockopt(TCP_ULP, \"tls\")", e))?;
    setsockopt(socket, sockopt::TcpTlsTx, &crypto_info(&secrets.tx)?)
        .map_err(|e| step("setsockopt(SOL_TLS, TLS_TX)", e))?;
    setsockopt(socket, sockopt::TcpTlsRx, &crypto_info(&secrets.rx)?)
        .map_err(|e| step("setsockopt(SOL_TLS, TLS_RX)", e))
}

/// Whether this kernel does TLS 1.3 in the kernel: `Ok` or why not. Found once per process
/// on a loopback connection of its own (with a throwaway key: nothing is sent).
pub fn probe() -> Result<(), String> {
    static PROBED: OnceLock<Result<(), String>> = OnceLock::new();
    PROBED.get_or_init(probe_now).clone()
}

fn probe_now() -> Result<(), String> {
    use std::net::{Ipv4Addr, TcpListener, TcpStream};
    let fail = |what: &str, e: io::Error| format!("{what}: {e}");
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| fail("a loopback socket to probe with", e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| fail("a loopback socket to probe with", e))?;
    let conn = TcpStream::connect(addr).map_err(|e| fail("a loopback connection", e))?;
    let secrets = |seq| {
        (
            seq,
            ConnectionTrafficSecrets::Aes256Gcm {
                key: rustls::crypto::cipher::AeadKey::from([7u8; 32]),
                iv: rustls::crypto::cipher::Iv::new([9; 12]),
            },
        )
    };
    let extracted = rustls::ExtractedSecrets {
        tx: secrets(0),
        rx: secrets(0),
    };
    match install(&conn, &extracted) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(format!(
            "the kernel has no TLS upper-layer protocol ({e}): build it with CONFIG_TLS, or load the module (`modprobe tls`)"
        )),
        Err(e) => Err(format!("the kernel refused TLS on a test connection: {e}")),
    }
}

/// Sends a `close_notify` alert on a kTLS socket (before shutting its write side, so that
/// a peer reading with rustls in user space sees a clean end, not a truncation).
pub fn send_close_notify(socket: &impl AsFd) -> io::Result<()> {
    sys::send_record(socket, RECORD_ALERT, &[1, CLOSE_NOTIFY])
}

/// Reads the record at the head of a kTLS socket's receive queue after `splice` refused it
/// as a non-data record (`EINVAL`). `Ok(())` for the peer's `close_notify` (the end of its
/// data); any other alert, or a handshake message (KeyUpdate, NewSessionTicket), is an
/// error; `WouldBlock` when nothing is queued.
pub fn read_control(socket: &impl AsFd) -> io::Result<()> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, TlsGetRecordType};
    use std::os::fd::AsRawFd;
    let mut data = [0u8; 64];
    let mut space = nix::cmsg_space!(u8);
    let (record, n) = {
        let mut iov = [io::IoSliceMut::new(&mut data)];
        let msg = recvmsg::<()>(
            socket.as_fd().as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_DONTWAIT,
        )
        .map_err(io::Error::from)?;
        let record = msg.cmsgs().map_err(io::Error::from)?.find_map(|c| match c {
            ControlMessageOwned::TlsGetRecordType(t) => Some(t),
            _ => None,
        });
        (record, msg.bytes)
    };
    let body = &data[..n];
    match record {
        Some(TlsGetRecordType::Alert) if body.get(1) == Some(&CLOSE_NOTIFY) => Ok(()),
        Some(TlsGetRecordType::Alert) => Err(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            format!("the peer sent TLS alert {body:?}"),
        )),
        Some(TlsGetRecordType::Handshake) => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "the peer sent a TLS handshake message (type {:?}) that kernel TLS cannot take",
                body.first()
            ),
        )),
        other => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a TLS record ({other:?}) where a control record was expected"),
        )),
    }
}

/// `--kernel-tls`: whether opaque streams between node proxies take kernel TLS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// When this kernel has it (and sockmap is off); today's HTTP/2 CONNECT streams otherwise.
    Auto,
    /// Required: the proxy does not start without it.
    On,
    /// Never: opaque streams ride HTTP/2 CONNECT streams on the pooled tunnel (the default).
    #[default]
    Off,
}

/// What `--kernel-tls` amounts to on this start, and why.
#[derive(Clone, Debug)]
pub struct KernelTls {
    mode: Mode,
    enabled: bool,
    why: String,
}

impl KernelTls {
    /// Decides from the flag, whether sockmap is on (its in-pod hops cannot be spliced:
    /// docs/ARCHITECTURE.md, "Sockmap on the in-pod hops") and what the kernel can do; `Err`
    /// only when `--kernel-tls on` cannot be honoured.
    pub fn decide(mode: Mode, sockmap_on: bool) -> Result<Self, String> {
        let state = |enabled, why: &str| Self {
            mode,
            enabled,
            why: why.to_string(),
        };
        if mode == Mode::Off {
            return Ok(state(false, "off (--kernel-tls off)"));
        }
        if sockmap_on {
            let why = "sockmap is on: splice(2) cannot read the bytes it redirects";
            return match mode {
                Mode::On => Err(format!("--kernel-tls on: {why}; turn one of them off")),
                _ => Ok(state(false, why)),
            };
        }
        match (probe(), mode) {
            (Ok(()), _) => Ok(state(true, "the kernel does TLS 1.3 (TCP_ULP \"tls\")")),
            (Err(why), Mode::On) => Err(format!("--kernel-tls on: {why}")),
            (Err(why), _) => Ok(state(false, &why)),
        }
    }

    /// Whether opaque streams take their own kTLS connection.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// For `/config_dump`.
    pub fn config_dump(&self) -> serde_json::Value {
        serde_json::json!({
            "mode": self.mode,
            "enabled": self.enabled,
            "why": self.why,
        })
    }
}

impl std::fmt::Display for KernelTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let on = if self.enabled { "on" } else { "off" };
        write!(f, "kernel TLS {on}: {}", self.why)
    }
}

#[cfg(test)]
mod tests;
