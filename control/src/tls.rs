//! TLS on the control plane's gRPC ports. The control plane issues itself an SVID
//! (`spiffe://<td>/ns/ambit/sa/ambit-control` by default) from its own CA, renews it at
//! 70 % of its lifetime, and serves identity and discovery over TLS 1.3 with it; node
//! proxies check it against the trust bundle, so node tokens and CSRs never cross the
//! network in the clear.

use crate::limits::{self, ConnectionLimit, ConnectionPermit};
use crate::pki::{CertificateAuthority, CsrError, SharedCa};
use ambit_api::WorkloadIdentity;
use rcgen::{CertificateParams, KeyPair, PKCS_ECDSA_P256_SHA256};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::io;
use std::pin::Pin;
use std::sync::{Arc, PoisonError, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;

/// How long a client may take to complete the TLS handshake. A node proxy completes it in
/// a round trip or two; one that sends nothing (or trickles bytes) holds its connection,
/// and its place under the listener's limit, this long at most.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The control plane's own certificate, swapped in place on renewal.
#[derive(Clone, Debug)]
pub struct ServingCert {
    current: Arc<RwLock<Arc<CertifiedKey>>>,
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        )
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Issues a certificate for `id` from `ca`, with a fresh key; returns it and its notAfter.
fn issue(
    ca: &CertificateAuthority,
    id: &WorkloadIdentity,
) -> Result<(Arc<CertifiedKey>, SystemTime), CsrError> {
    let internal = |e: String| CsrError::Internal(e);
    let key =
        KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(|e| internal(e.to_string()))?;
    let csr = CertificateParams::default()
        .serialize_request(&key)
        .map_err(|e| internal(e.to_string()))?;
    let issued = ca.certify(id, csr.der())?;
    let mut chain = vec![CertificateDer::from(issued.leaf_der)];
    chain.extend(
        issued
            .intermediates_der
            .into_iter()
            .map(CertificateDer::from),
    );
    let signing = provider()
        .key_provider
        .load_private_key(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
            key.serialize_der(),
        )))
        .map_err(|e| internal(e.to_string()))?;
    Ok((
        Arc::new(CertifiedKey::new(chain, signing)),
        issued.not_after,
    ))
}

impl ServingCert {
    /// Issues the first certificate.
    pub fn new(
        ca: &CertificateAuthority,
        id: &WorkloadIdentity,
    ) -> Result<(Self, SystemTime), CsrError> {
        let (cert, not_after) = issue(ca, id)?;
        Ok((
            Self {
                current: Arc::new(RwLock::new(cert)),
            },
            not_after,
        ))
    }

    /// Renews at 70 % of the remaining lifetime, and at once when the CA is replaced (a
    /// new issuer: proxies that trust only the new trust anchor must be able to connect),
    /// forever (retrying a minute later on error).
    pub async fn renew(self, ca: SharedCa, id: WorkloadIdentity, mut not_after: SystemTime) {
        let mut replaced = ca.subscribe();
        loop {
            let left = not_after
                .duration_since(SystemTime::now())
                .unwrap_or_default();
            let due = tokio::time::sleep(left.mul_f64(0.7).max(Duration::from_secs(1)));
            let why = tokio::select! {
                _ = due => "renewed",
                Ok(()) = replaced.changed() => "re-issued from the CA reloaded",
            };
            match issue(&ca.current(), &id) {
                Ok((cert, next)) => {
                    *self.current.write().unwrap_or_else(PoisonError::into_inner) = cert;
                    not_after = next;
                    tracing::info!(identity = %id, "control plane certificate {why}");
                }
                Err(error) => {
                    tracing::error!(identity = %id, %error, "cannot renew the control plane certificate");
                    not_after = SystemTime::now() + Duration::from_secs(60) * 10 / 7;
                }
            }
        }
    }

    /// A TLS 1.3 acceptor presenting this certificate (ALPN `h2`). Clients are not asked
    /// for certificates: they authenticate with their node token inside the TLS session.
    pub fn acceptor(&self) -> Result<TlsAcceptor, rustls::Error> {
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(self.clone()));
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

/// An accepted TLS connection, as tonic serves it; holds its place under the listener's
/// connection limit until tonic drops it.
#[derive(Debug)]
pub struct TlsConn {
    // First, so dropped first: the place is free by the time the client sees the close.
    _permit: ConnectionPermit,
    tls: tokio_rustls::server::TlsStream<TcpStream>,
}

impl tonic::transport::server::Connected for TlsConn {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.tls.get_ref().0.connect_info()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tls).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tls).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tls).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tls).poll_shutdown(cx)
    }
}

/// Accepts on `listener` up to `limit` connections at once (one over it is closed at once
/// and counted), completes TLS handshakes (each in its own task, bounded in time, so a
/// slow client holds up nobody), and yields the connections. Stops when the stream is
/// dropped.
pub fn incoming(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    mut limit: ConnectionLimit,
) -> tokio_stream::wrappers::ReceiverStream<io::Result<TlsConn>> {
    let (tx, rx) = mpsc::channel(128);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = tx.closed() => return,
                a = listener.accept() => a,
            };
            let (tcp, peer) = match accepted {
                Ok(a) => a,
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Some(permit) = limit.admit(&tcp, peer) else {
                continue;
            };
            if let Err(error) = limits::configure_socket(&tcp) {
                tracing::debug!(%peer, %error, "cannot set TCP_NODELAY or keepalive");
            }
            let (tx, acceptor) = (tx.clone(), acceptor.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx
                            .send(Ok(TlsConn {
                                tls,
                                _permit: permit,
                            }))
                            .await;
                    }
                    Ok(Err(error)) => tracing::info!(%peer, %error, "TLS handshake failed"),
                    Err(_) => tracing::info!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
