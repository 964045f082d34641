//! Outbound (4140): a pod's own connections, redirected here, go to their original
//! destination — through the mesh tunnel when the destination is a meshed pod.

use super::detect::{detect, Protocol};
use super::resolve::{settle, Resolved};
use super::tunnel::Tunnel;
use super::{relay, PodContext, ProxyError, Shared, TrafficLabels, PROXY_MARK};
use std::sync::Arc;
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
    let resolved = Resolved::now(dst, shared);
    let opaque = resolved.opaque(&shared.state.borrow());
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
        super::http::serve_outbound(client, protocol, dst, pod.clone(), shared.clone()).await;
        return Ok(());
    }
    // Detection may have waited (a server-speaks-first protocol): resolve again.
    let resolved = if opaque {
        resolved
    } else {
        Resolved::now(dst, shared)
    };
    let (target, pick) = resolved.pick(shared, &pod.workload)?;
    let labels = |server_id: String| {
        TrafficLabels::outbound(&pod.workload, server_id, resolved.dst_service())
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
            let opened = shared.pool.open(&tunnel, target.addr).await;
            settle(pick, opened.is_ok());
            let mut server = hyper_util::rt::TokioIo::new(opened?);
            let l = labels(expected.to_string());
            shared.metrics.opened(&l);
            let (read, written) = relay(&mut client, &mut server).await;
            shared.metrics.closed(&l, read, written);
        }
    }
    Ok(())
}
