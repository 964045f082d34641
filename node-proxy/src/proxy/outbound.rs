//! Outbound (4140): a pod's own connections, redirected here, go to their original
//! destination — through the mesh tunnel when the destination is a meshed pod.

use super::balance::Pick;
use super::detect::{detect, Protocol};
use super::tunnel::Tunnel;
use super::{relay, serve_each, PodContext, ProxyError, Shared, TrafficLabels, PROXY_MARK};
use crate::discovery::{Destination, DiscoveryState};
use ambit_api::ports::{PortSet, DEFAULT_OPAQUE_PORTS};
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
    serve_each(
        listener,
        stop,
        pod,
        shared,
        ("outbound", "outbound"),
        |stream, _, pod, shared| async move { proxy(stream, &pod, &shared).await },
    )
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

/// Whether connections to `dst` skip protocol detection: the destination pod's
/// opaque-ports (or, for a Service, its endpoints'), else Linkerd's defaults.
fn is_opaque(dst: SocketAddr, state: &DiscoveryState) -> bool {
    match state.resolve(dst) {
        Destination::Service { endpoints, .. } => endpoints.iter().any(|(addr, _)| {
            state
                .workload_by_ip(addr.ip())
                .is_some_and(|w| w.opaque_ports.contains(addr.port()))
        }),
        Destination::Pod(w, addr) => w.opaque_ports.contains(addr.port()),
        Destination::Unknown(addr) => DEFAULT_OPAQUE_PORTS
            .parse::<PortSet>()
            .is_ok_and(|p| p.contains(addr.port())),
    }
}

/// Where the connection goes, the balancer's pick when there was a choice, and the
/// destination Service for the metrics.
fn route(dst: SocketAddr, shared: &Shared) -> Result<(Route, Option<Pick>, String), ProxyError> {
    let state = shared.state.borrow().clone();
    match state.resolve(dst) {
        Destination::Service {
            service, endpoints, ..
        } => {
            let addrs: Vec<SocketAddr> = endpoints.iter().map(|(a, _)| *a).collect();
            let Some((i, pick)) = shared.balancer.pick(&addrs) else {
                return Err(ProxyError::Unavailable(format!(
                    "no ready endpoints for Service {}/{} port {}",
                    service.namespace,
                    service.name,
                    dst.port()
                )));
            };
            let (addr, ep) = &endpoints[i];
            let route = match &ep.identity {
                Some(id) => Route::Mesh {
                    peer: addr.ip(),
                    target: *addr,
                    expected: id.clone(),
                },
                None => Route::Direct(*addr),
            };
            Ok((
                route,
                Some(pick),
                format!("{}.{}", service.name, service.namespace),
            ))
        }
        Destination::Pod(w, addr) if w.meshed => Ok((
            Route::Mesh {
                peer: addr.ip(),
                target: addr,
                expected: w.identity.clone(),
            },
            None,
            String::new(),
        )),
        Destination::Pod(_, addr) => Ok((Route::Direct(addr), None, String::new())),
        Destination::Unknown(addr) => {
            shared.outbound_unknown.check(addr)?;
            Ok((Route::Direct(addr), None, String::new()))
        }
    }
}

async fn proxy(
    client: TcpStream,
    pod: &Arc<PodContext>,
    shared: &Shared,
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
    let opaque = is_opaque(dst, &shared.state.borrow().clone());
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
    let w = &pod.workload;
    let (route, pick, dst_service) = route(dst, shared)?;
    let labels = |server_id: String| TrafficLabels::outbound(w, server_id, dst_service.clone());
    match route {
        Route::Direct(target) => {
            let connected = pod.netns.connect(target, PROXY_MARK).await;
            let mut server = match (connected, pick) {
                (Ok(s), p) => {
                    settle(p, true);
                    s
                }
                (Err(e), p) => {
                    settle(p, false);
                    return Err(ProxyError::Upstream(format!("connecting to {target}: {e}")));
                }
            };
            let l = labels(String::new());
            shared.metrics.opened(&l);
            let (read, written) = relay(&mut client, &mut server).await;
            shared.metrics.closed(&l, read, written);
        }
        Route::Mesh {
            peer,
            target,
            expected,
        } => {
            let tunnel = Tunnel::from_pod(pod, shared, peer, expected.clone())?;
            let upgraded = match (shared.pool.open(&tunnel, target).await, pick) {
                (Ok(u), p) => {
                    settle(p, true);
                    u
                }
                (Err(e), p) => {
                    settle(p, false);
                    return Err(e);
                }
            };
            let mut server = hyper_util::rt::TokioIo::new(upgraded);
            let l = labels(expected.to_string());
            shared.metrics.opened(&l);
            let (read, written) = relay(&mut client, &mut server).await;
            shared.metrics.closed(&l, read, written);
        }
    }
    Ok(())
}

/// Reports to the balancer how using the picked endpoint went.
fn settle(pick: Option<Pick>, ok: bool) {
    match (pick, ok) {
        (Some(p), true) => p.success(),
        (Some(p), false) => p.failure(),
        (None, _) => {}
    }
}
