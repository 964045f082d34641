//! The opaque transport: one mTLS connection per opaque TCP stream between two node
//! proxies, handed to kernel TLS after the handshake and relayed with `splice(2)`
//! ([`crate::ktls`]), instead of a CONNECT stream on the pooled HTTP/2 tunnel.
//!
//! On the wire (TLS 1.3, ALPN [`TRANSPORT_ALPN`], the same certificates and checks as the
//! tunnel), after the handshake:
//!
//! ```text
//! client → server   u16 length, "ip:port"                   (the target, in the pod)
//! server → client   u16 status, u16 length, cause           (200 and "" when connected)
//! then the stream's bytes, both ways; close_notify and FIN for each direction's end.
//! ```
//!
//! Nothing else is sent before those two frames, and each side waits for the other's:
//! rustls therefore never reads past the record it needs, and the kernel takes the byte
//! stream from the record boundary where rustls stopped. A server that does not offer the
//! ALPN (a proxy of an earlier version) answers `h2`, and the stream takes a CONNECT
//! stream instead; either side without kernel TLS speaks the same records in user space.

use super::inbound::Stream;
use super::read_ahead::ReadAhead;
use super::tunnel::{self, Tunnel};
use super::{relay, ProxyError};
use crate::ktls::{self, splice};
use crate::tls;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// ALPN of the opaque transport (as Linkerd's `transport.l5d.io/v1`).
pub const TRANSPORT_ALPN: &[u8] = b"transport.ambit.dev/v1";
/// Longest target frame accepted ("[v6 address]:port" fits in 64).
const MAX_TARGET: usize = 64;
/// Longest cause sent with a refusal.
const MAX_CAUSE: usize = 1024;

/// Opens a stream to `target` through the peer proxy on a connection of its own with kernel
/// TLS. `None` when the peer does not speak the transport (it chose `h2`): the caller takes
/// a CONNECT stream.
pub(super) async fn open(
    t: &Tunnel<'_>,
    target: SocketAddr,
) -> Result<Option<TcpStream>, ProxyError> {
    let (addr, tcp) = tunnel::connect_tcp(t).await?;
    tokio::time::timeout(tunnel::HANDSHAKE_TIMEOUT, handshake(t, addr, tcp, target))
        .await
        .map_err(|_| {
            ProxyError::Timeout(format!(
                "TLS handshake and stream set-up with the peer proxy at {addr}: not done in {:?}",
                tunnel::HANDSHAKE_TIMEOUT
            ))
        })?
}

async fn handshake(
    t: &Tunnel<'_>,
    addr: SocketAddr,
    tcp: TcpStream,
    target: SocketAddr,
) -> Result<Option<TcpStream>, ProxyError> {
    let mut config = tls::client_config(t.bundle, t.source.1.clone(), vec![t.expected.clone()])
        .map_err(|e| ProxyError::Internal(e.to_string()))?;
    config.alpn_protocols = vec![TRANSPORT_ALPN.to_vec(), tls::MESH_ALPN.to_vec()];
    config.enable_secret_extraction = true;
    let name = rustls_pki_types::ServerName::IpAddress(t.peer.into());
    let mut stream = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| {
            ProxyError::Identity(format!("mTLS with {addr} (expecting {}): {e}", t.expected))
        })?;
    if stream.get_ref().1.alpn_protocol() != Some(TRANSPORT_ALPN) {
        return Ok(None);
    }
    let failed =
        |e: std::io::Error| ProxyError::Upstream(format!("stream set-up with {addr}: {e}"));
    stream
        .write_all(&target_frame(target))
        .await
        .map_err(failed)?;
    stream.flush().await.map_err(failed)?;
    let (mut tcp, conn) = stream.into_inner();
    let secrets = conn
        .dangerous_extract_secrets()
        .map_err(|e| ProxyError::Internal(format!("TLS secrets for kernel TLS: {e}")))?;
    ktls::install(&tcp, &secrets).map_err(|e| {
        ProxyError::Internal(format!("kernel TLS on the connection to {addr}: {e}"))
    })?;
    drop(secrets);
    let (status, cause) = read_status(&mut tcp).await.map_err(failed)?;
    if status != 200 {
        return Err(ProxyError::Upstream(format!(
            "peer proxy at {} answered {status} for {target}: {cause}",
            t.peer
        )));
    }
    Ok(Some(tcp))
}

/// Serves a connection from a peer proxy that chose the transport: reads the target,
/// delivers it as the CONNECT path does ([`Stream`]), and relays — spliced through kernel
/// TLS when this proxy has it, through rustls otherwise.
pub(super) async fn serve(
    mut tls: tokio_rustls::server::TlsStream<ReadAhead<TcpStream>>,
    deadline: tokio::time::Instant,
    stream: impl FnOnce(SocketAddr) -> Stream,
) -> Result<(), ProxyError> {
    let target = tokio::time::timeout_at(deadline, read_target(&mut tls))
        .await
        .map_err(|_| ProxyError::Client("no stream target in time".into()))?
        .map_err(|e| ProxyError::Client(format!("reading the stream target: {e}")))?;
    let stream = stream(target);
    let server = stream.connect().await;
    let status = match &server {
        Ok(_) => status_frame(200, ""),
        Err((status, cause)) => status_frame(status.as_u16(), cause),
    };
    let failed = |e: std::io::Error| ProxyError::Client(format!("answering {}: {e}", stream.peer));
    if stream.shared.kernel_tls.enabled() {
        let (io, conn) = tls.into_inner();
        // Never enabled on this path: nothing read past rustls's last record.
        let mut tcp = io
            .into_inner()
            .map_err(|e| ProxyError::Internal(format!("kernel TLS: {e}")))?;
        let secrets = conn
            .dangerous_extract_secrets()
            .map_err(|e| ProxyError::Internal(format!("TLS secrets for kernel TLS: {e}")))?;
        ktls::install(&tcp, &secrets)
            .map_err(|e| ProxyError::Internal(format!("kernel TLS: {e}")))?;
        drop(secrets);
        tcp.write_all(&status).await.map_err(failed)?;
        let Ok(server) = server else {
            let _ = ktls::send_close_notify(&tcp);
            return Ok(());
        };
        stream.shared.metrics.transport("inbound", "kernel_tls");
        stream
            .relay(splice::relay(&tcp, &server, splice::Ktls::Client))
            .await;
    } else {
        tls.write_all(&status).await.map_err(failed)?;
        tls.flush().await.map_err(failed)?;
        let Ok(mut server) = server else {
            let _ = tls.shutdown().await;
            return Ok(());
        };
        stream.shared.metrics.transport("inbound", "tls");
        stream.relay(relay(&mut tls, &mut server)).await;
    }
    Ok(())
}

fn target_frame(target: SocketAddr) -> Vec<u8> {
    let text = target.to_string();
    let mut frame = Vec::with_capacity(2 + text.len());
    frame.extend_from_slice(&(text.len() as u16).to_be_bytes());
    frame.extend_from_slice(text.as_bytes());
    frame
}

async fn read_target(r: &mut (impl AsyncRead + Unpin)) -> std::io::Result<SocketAddr> {
    let invalid = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    let len = r.read_u16().await? as usize;
    if len > MAX_TARGET {
        return Err(invalid(format!(
            "a target of {len} bytes (at most {MAX_TARGET})"
        )));
    }
    let mut text = vec![0; len];
    r.read_exact(&mut text).await?;
    let text = String::from_utf8_lossy(&text);
    text.parse()
        .map_err(|_| invalid(format!("target {text:?} is not ip:port")))
}

fn status_frame(status: u16, cause: &str) -> Vec<u8> {
    let mut end = cause.len().min(MAX_CAUSE);
    while !cause.is_char_boundary(end) {
        end -= 1;
    }
    let cause = &cause[..end];
    let mut frame = Vec::with_capacity(4 + cause.len());
    frame.extend_from_slice(&status.to_be_bytes());
    frame.extend_from_slice(&(cause.len() as u16).to_be_bytes());
    frame.extend_from_slice(cause.as_bytes());
    frame
}

async fn read_status(r: &mut (impl AsyncRead + Unpin)) -> std::io::Result<(u16, String)> {
    let status = r.read_u16().await?;
    let len = r.read_u16().await? as usize;
    if len > MAX_CAUSE {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a refusal cause of {len} bytes (at most {MAX_CAUSE})"),
        ));
    }
    let mut cause = vec![0; len];
    r.read_exact(&mut cause).await?;
    Ok((status, String::from_utf8_lossy(&cause).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netns::Netns;
    use crate::testing::{TestCa, TestNetns};
    use ambit_api::WorkloadIdentity;

    /// A peer proxy's mesh port in `netns` offering `alpn`: when the transport is chosen, it
    /// reads the target, answers 200 and echoes in user space (rustls).
    async fn peer(netns: &Netns, ca: &TestCa, id: &WorkloadIdentity, alpn: Vec<Vec<u8>>) {
        let listener = netns
            .bind(SocketAddr::from(([127, 0, 0, 1], super::super::MESH_PORT)))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut config = tls::server_config(&ca.bundle(), ca.certified_key(id))
            .unwrap_or_else(|e| panic!("{e}"));
        config.alpn_protocols = alpn;
        config.send_tls13_tickets = 0;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut s) = acceptor.accept(tcp).await else {
                        return;
                    };
                    if s.get_ref().1.alpn_protocol() != Some(TRANSPORT_ALPN) {
                        return;
                    }
                    if read_target(&mut s).await.is_err() {
                        return;
                    }
                    let _ = s.write_all(&status_frame(200, "")).await;
                    let (mut r, mut w) = tokio::io::split(s);
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                    let _ = w.shutdown().await;
                });
            }
        });
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_peer_without_the_transport_leaves_the_stream_to_connect() {
        let ca = TestCa::new("cluster.local");
        let (cli, web) = (ca.identity("shop", "cli"), ca.identity("shop", "web"));
        let bundle = ca.bundle();
        let target: SocketAddr = "127.0.0.1:7000".parse().unwrap_or_else(|e| panic!("{e}"));
        for offered in [vec![tls::MESH_ALPN.to_vec()], vec![TRANSPORT_ALPN.to_vec()]] {
            let ns = TestNetns::new("transport");
            let netns = Netns::open(&ns.path()).unwrap_or_else(|e| panic!("{e}"));
            peer(&netns, &ca, &web, offered.clone()).await;
            let t = Tunnel {
                netns: &netns,
                source: (&cli, ca.certified_key(&cli)),
                expected: web.clone(),
                peer: std::net::IpAddr::from([127, 0, 0, 1]),
                bundle: &bundle,
            };
            let opened = open(&t, target).await;
            if offered[0] == tls::MESH_ALPN {
                // A proxy of an earlier version: no stream here, a CONNECT stream instead.
                assert!(matches!(opened, Ok(None)), "{:?}", opened.map(|_| ()));
                continue;
            }
            match crate::ktls::probe() {
                // Kernel TLS on our side, rustls on the peer's: the same records.
                Ok(()) => {
                    let mut s = opened
                        .unwrap_or_else(|e| panic!("{e}"))
                        .unwrap_or_else(|| panic!("the transport was offered"));
                    s.write_all(b"ping").await.unwrap_or_else(|e| panic!("{e}"));
                    let mut got = [0u8; 4];
                    s.read_exact(&mut got)
                        .await
                        .unwrap_or_else(|e| panic!("{e}"));
                    assert_eq!(&got, b"ping");
                }
                // Never called so where the kernel has no TLS (`KernelTls` is off); the
                // failure is precise.
                Err(_) => {
                    let err = opened.map(|_| ()).unwrap_err();
                    assert!(err.to_string().contains("TCP_ULP"), "{err}");
                }
            }
        }
    }

    #[tokio::test]
    async fn frames_round_trip_and_bad_ones_are_refused() {
        let target: SocketAddr = "[fd00::1]:8080".parse().unwrap_or_else(|e| panic!("{e}"));
        let frame = target_frame(target);
        assert_eq!(read_target(&mut &frame[..]).await.ok(), Some(target));
        // Too long, not an address, cut short.
        let mut long = vec![0, 200];
        long.extend([b'1'; 200]);
        let err = read_target(&mut &long[..]).await.map(|_| ()).unwrap_err();
        assert!(err.to_string().contains("at most 64"), "{err}");
        let err = read_target(&mut &[0u8, 3, b'a', b'b', b'c'][..])
            .await
            .map(|_| ())
            .unwrap_err();
        assert!(err.to_string().contains("not ip:port"), "{err}");
        assert!(read_target(&mut &[0u8, 9, b'1'][..]).await.is_err());
        // A status with a cause longer than the limit is cut at a character boundary.
        let cause = "é".repeat(MAX_CAUSE);
        let frame = status_frame(403, &cause);
        let (status, got) = read_status(&mut &frame[..])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(status, 403);
        assert_eq!(got.len(), MAX_CAUSE);
        assert!(cause.starts_with(&got));
    }
}
