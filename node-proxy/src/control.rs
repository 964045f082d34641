//! Channels to the control plane: TLS 1.3, the server proving the control plane's SPIFFE
//! identity against the trust bundle. The node token travels inside this TLS session.

use crate::tls::{self, SpiffeServerVerifier, TrustBundle};
use ambit_api::WorkloadIdentity;
use hyper_util::rt::TokioIo;
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

/// Why a channel cannot be built.
#[derive(Debug, thiserror::Error)]
#[error("control plane address {url:?}: {reason}")]
pub struct ChannelError {
    url: String,
    reason: String,
}

/// The control plane identity for `trust_domain` with the default namespace and
/// ServiceAccount.
pub fn default_identity(trust_domain: &str) -> Result<WorkloadIdentity, ambit_api::IdentityError> {
    WorkloadIdentity::new(
        trust_domain,
        ambit_api::CONTROL_PLANE_NAMESPACE,
        ambit_api::CONTROL_PLANE_SERVICE_ACCOUNT,
    )
}

/// A lazily connecting gRPC channel to `url` (`http://host:port` or `https://host:port`:
/// either way the connection is TLS) that accepts only a server proving `expected`.
pub fn channel(
    url: &str,
    bundle: &TrustBundle,
    expected: WorkloadIdentity,
    timeout: Duration,
) -> Result<Channel, ChannelError> {
    let err = |reason: String| ChannelError {
        url: url.to_string(),
        reason,
    };
    // The control plane speaks only TLS: an http:// URL is refused, not silently
    // upgraded. TLS is ours (the connector below), so tonic sees plain http.
    let Some(rest) = url.strip_prefix("https://") else {
        return Err(err(match url.strip_prefix("http://") {
            Some(rest) => format!("the control plane speaks only TLS; use https://{rest}"),
            None => "not an https:// URL".into(),
        }));
    };
    let plain = format!("http://{rest}");
    let endpoint = Endpoint::from_shared(plain)
        .map_err(|e| err(e.to_string()))?
        .connect_timeout(timeout)
        .timeout(timeout)
        .tcp_nodelay(true);
    let verifier = Arc::new(SpiffeServerVerifier::new(bundle.clone(), vec![expected]));
    let mut config = rustls::ClientConfig::builder_with_provider(tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| err(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let service = tower::service_fn(move |uri: http::Uri| {
        let connector = connector.clone();
        async move {
            let host = uri
                .host()
                .unwrap_or_default()
                .trim_matches(['[', ']'])
                .to_string();
            let port = uri.port_u16().unwrap_or(80);
            let tcp = tokio::time::timeout(
                timeout,
                tokio::net::TcpStream::connect((host.as_str(), port)),
            )
            .await
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out")
            })??;
            tcp.set_nodelay(true)?;
            let name = rustls_pki_types::ServerName::try_from(host)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
            let tls = connector.connect(name, tcp).await?;
            Ok::<_, std::io::Error>(TokioIo::new(tls))
        }
    });
    Ok(endpoint.connect_with_connector_lazy(service))
}
