//! Outbound (4140): a pod's own connections, redirected here, go to their original
//! destination — through the mesh tunnel when the destination is a meshed pod.

use super::detect::Rewind;
use super::detect::{detect, Protocol};
use super::resolve::{settle, Resolved};
use super::transport;
use super::tunnel::Tunnel;
use super::{relay, PodContext, ProxyError, Shared, TrafficLabels, PROXY_MARK};
use crate::ktls::splice;
use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Serves one connection accepted on the outbound listener (`super::accept`).
pub(super) async fn proxy(
    client: TcpStream,
    pod: &Arc<PodContext>,
    shared: &Arc<Shared>,
) -> Result<(), ProxyError> {
    let dst = shared
        .redirector
        .outbound_dst(&client, pod.netns_cookie)
        .map_err(|e| {
            ProxyError::Client(format!(
                "no original destination (was the connection redirected?): {e}"
            ))
        })?;
    super::record_dst(dst);
    let local = client
        .local_addr()
        .map_err(|e| ProxyError::Internal(e.to_string()))?;
    if dst == local {
        return Err(ProxyError::Client(
            "connection made to the outbound port itself".into(),
        ));
    }
    // A destination discovery cannot describe (no answer in time) fails closed either
    // way; detection still runs on ports not opaque by default, so that an HTTP client is
    // answered 503 with the reason rather than a reset.
    let resolved = Resolved::now(dst, shared).await;
    let opaque = match &resolved {
        Ok(r) => r.opaque(),
        Err(_) => super::resolve::default_opaque_ports().contains(dst.port()),
    };
    let (protocol, mut client) = if opaque {
        (
            Protocol::Opaque,
            super::detect::Rewind::new(Vec::new(), client),
        )
    } else {
        detect(client, shared.detect_timeout)
            .await
            .map_err(|e| ProxyError::Client(format!("reading the first bytes: {e}")))?
    };
    if protocol != Protocol::Opaque {
        let dst_service = resolved.as_ref().map(Resolved::dst_service);
        let dst_service = dst_service.unwrap_or_default();
        super::http::serve_outbound(
            client,
            protocol,
            dst,
            dst_service,
            pod.clone(),
            shared.clone(),
        )
        .await;
        return Ok(());
    }
    // Detection may have waited (a server-speaks-first protocol): resolve again.
    let resolved = if opaque {
        resolved?
    } else {
        Resolved::now(dst, shared).await?
    };
    let (target, pick) = resolved.pick(shared, &pod.workload)?;
    let labels = |server_id: String| {
        let mut l = TrafficLabels::outbound(&pod.workload, server_id, resolved.dst_service());
        l.dst = target.pod.clone();
        l
    };
    match target.identity {
        None => {
            let connected = pod.netns.connect(target.addr, PROXY_MARK).await;
            settle(pick, connected.is_ok());
            let mut server = connected
                .map_err(|e| ProxyError::Upstream(format!("connecting to {}: {e}", target.addr)))?;
            let l = labels(String::new());
            shared.metrics.opened(&l);
            let (read, written) = relay(&mut client, &mut server).await;
            shared.metrics.closed(&l, read, written);
        }
        Some(expected) => {
            let tunnel = Tunnel::from_pod(pod, shared, target.addr.ip(), expected.clone())?;
            let l = labels(expected.to_string());
            if shared.kernel_tls.enabled() {
                match transport::open(&tunnel, target.addr).await {
                    Ok(Some(server)) => {
                        settle(pick, true);
                        return spliced(client, server, shared, &l).await;
                    }
                    // The peer proxy does not speak the transport: a CONNECT stream below.
                    Ok(None) => {}
                    Err(e) => {
                        settle(pick, false);
                        return Err(e);
                    }
                }
            }
            let opened = shared.pool.open(&tunnel, target.addr).await;
            settle(pick, opened.is_ok());
            let mut server = hyper_util::rt::TokioIo::new(opened?);
            shared.metrics.transport("outbound", "h2_connect");
            shared.metrics.opened(&l);
            let (read, written) = relay(&mut client, &mut server).await;
            shared.metrics.closed(&l, read, written);
        }
    }
    Ok(())
}

/// Relays the pod's connection and a kernel TLS connection to the peer proxy with
/// `splice(2)`; what detection read ahead goes first.
async fn spliced(
    client: Rewind<TcpStream>,
    mut server: TcpStream,
    shared: &Shared,
    l: &TrafficLabels,
) -> Result<(), ProxyError> {
    let (ahead, client) = client.into_parts();
    shared.metrics.transport("outbound", "kernel_tls");
    shared.metrics.opened(l);
    let sent = async {
        server.write_all(&ahead).await?;
        Ok::<_, std::io::Error>(ahead.len() as u64)
    };
    let (read, written) = match sent.await {
        Ok(ahead) => {
            let (read, written) = splice::relay(&client, &server, splice::Ktls::Server).await;
            (ahead + read, written)
        }
        Err(error) => {
            tracing::debug!(%error, "connection ended with an error");
            (0, 0)
        }
    };
    shared.metrics.closed(l, read, written);
    Ok(())
}
