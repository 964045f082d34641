//! A pod's accept loop: one task accepts on all its listeners (4140, 4143, 4144, per
//! address family) and starts each connection in a task of its own, within the pod's and
//! the node's connection budgets.
//!
//! One task per pod, not one per listener: each task kept its own copy of the loop's state
//! (~1 kB), three or six per pod, which with 1,000 pods on a node was 3 MB (BENCHMARKS.md,
//! "Memory: start-up peak and 1,000 pods").

use super::{
    inbound, keepalive, outbound, PodContext, PodListeners, ProxyError, Shared, FAILURE_LOGS,
};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

/// What a pod's listener is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// 4140.
    Outbound,
    /// 4143.
    Mesh,
    /// 4144.
    Plain,
}

impl Kind {
    /// `direction` of `tcp_errors_total`, and the listener as
    /// `tcp_connections_refused_total` names it.
    fn names(self) -> (&'static str, &'static str) {
        match self {
            Kind::Outbound => ("outbound", "outbound"),
            Kind::Mesh => ("inbound", "inbound_mesh"),
            Kind::Plain => ("inbound", "inbound_plain"),
        }
    }
}

/// Accepts on every one of `listeners` until `stop` turns true.
pub(super) async fn serve_pod(
    listeners: Vec<PodListeners>,
    pod: Arc<PodContext>,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let acceptor = match inbound::acceptor(&pod, &shared) {
        Ok(a) => Some(a),
        Err(error) => {
            tracing::error!(%error, "cannot build the mesh TLS server; the pod's mesh port accepts nothing");
            None
        }
    };
    let sockets: Vec<(Kind, Arc<TcpListener>)> = listeners
        .iter()
        .flat_map(|l| {
            [
                (Kind::Outbound, l.outbound.clone()),
                (Kind::Mesh, l.mesh.clone()),
                (Kind::Plain, l.plain.clone()),
            ]
        })
        .filter(|(kind, _)| *kind != Kind::Mesh || acceptor.is_some())
        .collect();
    let mut next = 0;
    loop {
        let (kind, accepted) = tokio::select! {
            _ = async { drop(stop.wait_for(|s| *s).await) } => return,
            accepted = std::future::poll_fn(|cx| poll_any(&sockets, &mut next, cx)) => accepted,
        };
        match accepted {
            Ok((stream, peer)) => start(kind, stream, peer, &pod, &shared, acceptor.as_ref()),
            Err(error) => {
                // EMFILE and friends: back off briefly rather than spin.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

/// The first listener with a connection (or an error) to take, starting after the one
/// that had the last, so that a busy listener does not starve the others.
fn poll_any(
    sockets: &[(Kind, Arc<TcpListener>)],
    next: &mut usize,
    cx: &mut Context<'_>,
) -> Poll<(Kind, std::io::Result<(TcpStream, SocketAddr)>)> {
    for i in 0..sockets.len() {
        let at = (*next + i) % sockets.len();
        let (kind, listener) = &sockets[at];
        if let Poll::Ready(accepted) = listener.poll_accept(cx) {
            *next = at + 1;
            return Poll::Ready((*kind, accepted));
        }
    }
    Poll::Pending
}

/// Starts one accepted connection in its own task if the budgets let it in (the permit
/// lives as long as the connection); one they refuse is closed at once.
fn start(
    kind: Kind,
    stream: TcpStream,
    peer: SocketAddr,
    pod: &Arc<PodContext>,
    shared: &Arc<Shared>,
    acceptor: Option<&TlsAcceptor>,
) {
    let (direction, name) = kind.names();
    let Some(permit) = shared.limits.admit(name, Some(&pod.budget)) else {
        return;
    };
    let _ = stream.set_nodelay(true);
    let _ = keepalive(&stream);
    // Every log line of the connection says whose it was; the destination is recorded
    // once known (`record_dst`).
    let span = tracing::info_span!(
        "conn",
        pod = %pod.workload.key(),
        listener = name,
        %peer,
        dst = tracing::field::Empty,
    );
    let (pod, shared) = (pod.clone(), shared.clone());
    // One spawn per kind: each connection's task is only as large as its own future.
    match (kind, acceptor) {
        (Kind::Outbound, _) => spawn(direction, span, permit, shared.clone(), async move {
            outbound::proxy(stream, &pod, &shared).await
        }),
        (Kind::Mesh, Some(acceptor)) => {
            let acceptor = acceptor.clone();
            spawn(direction, span, permit, shared.clone(), async move {
                inbound::mesh_connection(stream, peer, &pod, &shared, acceptor).await
            })
        }
        (Kind::Mesh, None) => {}
        (Kind::Plain, _) => spawn(direction, span, permit, shared.clone(), async move {
            inbound::plain_connection(stream, peer, &pod, &shared).await
        }),
    }
}

/// Runs a connection in its span; a failure is counted in `tcp_errors_total{direction}`
/// and logged (at most [`FAILURE_LOGS`] a second).
fn spawn(
    direction: &'static str,
    span: tracing::Span,
    permit: crate::limits::Admitted,
    shared: Arc<Shared>,
    connection: impl Future<Output = Result<(), ProxyError>> + Send + 'static,
) {
    use tracing::Instrument;
    tokio::spawn(
        async move {
            if let Err(error) = connection.await {
                shared.metrics.error(direction, error.kind());
                if let Some(suppressed) = FAILURE_LOGS.take() {
                    tracing::info!(direction, %error, suppressed, "connection failed");
                }
            }
            drop(permit);
        }
        .instrument(span),
    );
}
