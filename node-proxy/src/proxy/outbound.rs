//! Outbound (4140): a pod's own connections, redirected here, go to their original
//! destination — through the mesh tunnel when the destination is a meshed pod.

use super::tunnel::Tunnel;
use super::{accept_loop, relay, PodContext, ProxyError, Shared, TcpLabels, PROXY_MARK};
use crate::discovery::Destination;
use crate::netns::original_dst;
use ambit_api::WorkloadIdentity;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub(super) async fn serve(
    listener: TcpListener,
    pod: Arc<PodContext>,
    shared: Shared,
    stop: watch::Receiver<bool>,
) {
    accept_loop(listener, stop, move |stream, peer| {
        let (pod, shared) = (pod.clone(), shared.clone());
        async move {
            let span = tracing::debug_span!("outbound", pod = %pod.workload.key(), %peer);
            let _enter = span.enter();
            drop(_enter);
            if let Err(error) = proxy(stream, &pod, &shared).await {
                shared.metrics.error("outbound", error.kind());
                tracing::info!(pod = %pod.workload.key(), %peer, %error, "outbound connection failed");
            }
        }
    })
    .await;
}

/// Where the connection goes, and as what.
enum Route {
    /// Through the tunnel to `peer`'s proxy, to reach `target` in that pod.
    Mesh {
        peer: IpAddr,
        target: SocketAddr,
        expected: WorkloadIdentity,
    },
    /// Straight to `target`, in plaintext, from the pod's netns.
    Direct(SocketAddr),
}

fn route(dst: SocketAddr, shared: &Shared) -> Result<Route, ProxyError> {
    let state = shared.state.borrow().clone();
    match state.resolve(dst) {
        Destination::Service {
            service, endpoints, ..
        } => {
            if endpoints.is_empty() {
                return Err(ProxyError::Upstream(format!(
                    "Service {}/{} has no ready endpoints for {dst}",
                    service.namespace, service.name
                )));
            }
            let (addr, ep) = &endpoints[fastrand::usize(..endpoints.len())];
            Ok(match &ep.identity {
                Some(id) => Route::Mesh {
                    peer: addr.ip(),
                    target: *addr,
                    expected: id.clone(),
                },
                None => Route::Direct(*addr),
            })
        }
        Destination::Pod(w, addr) if w.meshed => Ok(Route::Mesh {
            peer: addr.ip(),
            target: addr,
            expected: w.identity.clone(),
        }),
        Destination::Pod(_, addr) | Destination::Unknown(addr) => Ok(Route::Direct(addr)),
    }
}

async fn proxy(mut client: TcpStream, pod: &PodContext, shared: &Shared) -> Result<(), ProxyError> {
    let dst = original_dst(&client).map_err(|e| {
        ProxyError::Client(format!(
            "no original destination (was the connection redirected?): {e}"
        ))
    })?;
    let local = client
        .local_addr()
        .map_err(|e| ProxyError::Internal(e.to_string()))?;
    if dst == local {
        return Err(ProxyError::Client(
            "connection made to the outbound port itself".into(),
        ));
    }
    let w = &pod.workload;
    let labels = |peer_id: String, tls: &str| TcpLabels {
        direction: "outbound".into(),
        namespace: w.namespace.clone(),
        pod: w.name.clone(),
        workload: w.workload.clone(),
        peer_id,
        tls: tls.into(),
    };
    match route(dst, shared)? {
        Route::Direct(target) => {
            let mut server = pod
                .netns
                .connect(target, PROXY_MARK)
                .await
                .map_err(|e| ProxyError::Upstream(format!("connecting to {target}: {e}")))?;
            let l = labels(String::new(), "no_identity");
            shared.metrics.opened(&l);
            let (read, written) = relay(&mut client, &mut server).await;
            shared.metrics.closed(&l, read, written);
        }
        Route::Mesh {
            peer,
            target,
            expected,
        } => {
            // Fail closed: without our own certificate there is no connection, never a
            // plaintext one.
            let cert = shared.identities.current(&w.identity).ok_or_else(|| {
                ProxyError::Identity(format!("no valid certificate for {} yet", w.identity))
            })?;
            let upgraded = shared
                .pool
                .open(Tunnel {
                    netns: &pod.netns,
                    source: (&w.identity, cert.certified_key()),
                    expected: expected.clone(),
                    peer,
                    target,
                    bundle: &shared.bundle,
                })
                .await?;
            let mut server = hyper_util::rt::TokioIo::new(upgraded);
            let l = labels(expected.to_string(), "true");
            shared.metrics.opened(&l);
            let (read, written) = relay(&mut client, &mut server).await;
            shared.metrics.closed(&l, read, written);
        }
    }
    Ok(())
}
