//! Where an outbound connection or request goes: the one resolution of an original
//! destination that the opaque path and the HTTP path share — whether it skips protocol
//! detection, the endpoints it may reach (each with the identity it must prove, or none
//! for plaintext), the Service for metrics and routes, and the balancer's choice.

use super::balance::{AccrualFor, NoPick, Pick};
use super::classify::{classify, Class, GrpcCode};
use super::{ProxyError, Shared};
use crate::discovery::{
    Destination, DiscoveryState, Lookup, PodRef, Subscriptions, Target as Subscribed, WaitError,
    Workload,
};
use ambit_api::ports::{PortSet, DEFAULT_OPAQUE_PORTS};
use ambit_api::WorkloadIdentity;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// How the data path learns what a destination is when discovery has not said yet:
/// it subscribes and waits, with a bound, then fails closed.
#[derive(Clone, Debug)]
pub struct Destinations {
    /// What this node's pods use.
    pub subscriptions: Subscriptions,
    /// How long a first connection waits for the control plane's answer.
    pub timeout: Duration,
    /// This node (its own pods are known without subscribing).
    pub node: String,
}

impl Destinations {
    /// Subscribes this proxy to `target` if it is not already and records a use; when
    /// `lookup` does not know it yet, waits for the answer (at most `timeout`).
    async fn wait<T>(
        &self,
        shared: &Shared,
        target: Subscribed,
        lookup: impl Fn(&DiscoveryState) -> Lookup<T>,
    ) -> Result<T, ProxyError> {
        self.subscriptions
            .wait(&shared.state, &target, self.timeout, lookup)
            .await
            .map_err(|e| match e {
                WaitError::Timeout { .. } => ProxyError::Unavailable(format!(
                    "{e}; refusing rather than connecting around the mesh (--discovery-lookup-timeout)"
                )),
                WaitError::Closed | WaitError::TooMany(_) => ProxyError::Unavailable(e.to_string()),
            })
    }
}

/// One place a connection or request may go.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Target {
    pub addr: SocketAddr,
    /// The identity the peer must prove: through the mesh tunnel. None: in plaintext,
    /// straight from the pod's netns (not a meshed pod).
    pub identity: Option<WorkloadIdentity>,
    /// The pod behind it, for metrics, when it is one discovery knows.
    pub pod: Option<Arc<PodRef>>,
}

/// A Service port connected to, as routes name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ServicePort {
    pub namespace: String,
    pub name: String,
    pub port: u16,
}

/// What an original destination resolves to now.
#[derive(Clone, Debug)]
pub(super) struct Resolved {
    /// The destination as the application asked for it.
    pub dst: SocketAddr,
    /// The Service connected to, when `dst` is a Service's ClusterIP and port.
    pub service: Option<ServicePort>,
    /// Where it may go: the Service's ready endpoints, else `dst` itself.
    pub targets: Vec<Target>,
    /// Neither a Service nor a known pod: subject to `--outbound-unknown`.
    unknown: bool,
    /// Connections skip protocol detection (see [`Self::opaque`]).
    opaque: bool,
}

impl Resolved {
    /// Resolves `dst` with the proxy's discovery state: a destination it holds is
    /// resolved at once (and its subscription kept alive); one it does not, first
    /// subscribed and waited for — then refused if discovery does not answer in time.
    pub async fn now(dst: SocketAddr, shared: &Shared) -> Result<Self, ProxyError> {
        let d = &shared.destinations;
        let known = match shared.state.borrow().lookup(dst) {
            // This node's own pods need no subscription.
            Lookup::Known(Destination::Pod(w, a)) if w.node == d.node => {
                Some(Destination::Pod(w, a))
            }
            _ => None,
        };
        let dest = match known {
            Some(dest) => dest,
            None => {
                d.wait(shared, Subscribed::Addr(dst.ip()), |s| s.lookup(dst))
                    .await?
            }
        };
        Self::of(dst, dest)
    }

    /// Port `port` of Service `namespace`/`name` (a route's backend); None when discovery
    /// says there is no such Service port. Waits for discovery's answer as [`Self::now`].
    pub async fn service(
        namespace: &str,
        name: &str,
        port: u16,
        shared: &Shared,
    ) -> Result<Option<Self>, ProxyError> {
        let target = Subscribed::Service(format!("{namespace}/{name}").into());
        let Some(dest) = shared
            .destinations
            .wait(shared, target, |s| s.service(namespace, name, port))
            .await?
        else {
            return Ok(None);
        };
        // A backend has no address of its own: its ClusterIP is never connected to.
        let dst = SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), port);
        Self::of(dst, dest).map(Some)
    }

    fn of(dst: SocketAddr, dest: Destination) -> Result<Self, ProxyError> {
        Ok(match dest {
            Destination::Service {
                service,
                port,
                endpoints,
            } => Self {
                dst,
                service: Some(ServicePort {
                    namespace: service.namespace.clone(),
                    name: service.name.clone(),
                    port: port.port,
                }),
                opaque: endpoints
                    .iter()
                    .any(|(addr, e)| e.opaque_ports.contains(addr.port())),
                targets: endpoints
                    .into_iter()
                    .map(|(addr, e)| Target {
                        addr,
                        identity: e.identity,
                        pod: e.workload,
                    })
                    .collect(),
                unknown: false,
            },
            Destination::Pod(w, addr) => Self {
                dst,
                service: None,
                opaque: w.opaque_ports.contains(addr.port()),
                targets: vec![Target {
                    addr,
                    identity: w.meshed.then(|| w.identity.clone()),
                    pod: Some(Arc::new(PodRef::of(&w))),
                }],
                unknown: false,
            },
            Destination::Unknown(addr) => Self {
                dst,
                service: None,
                opaque: default_opaque_ports().contains(addr.port()),
                targets: vec![Target {
                    addr,
                    identity: None,
                    pod: None,
                }],
                unknown: true,
            },
            Destination::Refused(why) => {
                return Err(ProxyError::Unavailable(format!(
                    "discovery refused to resolve {dst}: {why}"
                )))
            }
        })
    }

    /// Whether connections skip protocol detection: the destination pod's opaque ports
    /// (for a Service, any of its endpoints'), else Linkerd's default opaque ports. Asked
    /// once per connection, not per request.
    pub fn opaque(&self) -> bool {
        self.opaque
    }

    /// The `dst_namespace` and `dst_service` labels: the Service's namespace and name;
    /// a pod's namespace and "" for a pod; both empty outside the cluster.
    pub fn dst_service(&self) -> (String, String) {
        match (
            &self.service,
            self.targets.first().and_then(|t| t.pod.as_ref()),
        ) {
            (Some(s), _) => (s.namespace.clone(), s.name.clone()),
            (None, Some(p)) => (p.namespace.clone(), String::new()),
            (None, None) => Default::default(),
        }
    }

    /// Chooses where this connection or request goes: a Service's endpoint by the
    /// balancer (the pick to settle when it is known how it went), or the one address;
    /// refused when the Service has no ready endpoint or an unknown destination is not
    /// allowed. `client` is the pod asking (failure accrual is kept per client pod).
    pub fn pick(
        &self,
        shared: &Shared,
        client: &Workload,
    ) -> Result<(Target, Option<Pick>), ProxyError> {
        if self.unknown {
            shared.outbound_unknown.check(self.dst)?;
        }
        let Some(service) = &self.service else {
            return Ok((self.targets[0].clone(), None));
        };
        let addrs: Vec<SocketAddr> = self.targets.iter().map(|t| t.addr).collect();
        // The Service's failure accrual: opt-in by annotation, as Linkerd's circuit
        // breaking.
        let accrual = shared
            .policy
            .borrow()
            .routes(&service.namespace, &service.name)
            .and_then(|r| r.failure_accrual);
        let key: Option<Arc<str>> = accrual
            .is_some()
            .then(|| format!("{}/{}", client.namespace, client.name).into());
        let accrual_for = accrual
            .as_ref()
            .zip(key.as_ref())
            .map(|(policy, client)| AccrualFor { policy, client });
        match shared.balancer.choose(&addrs, accrual_for) {
            Ok((i, pick)) => Ok((self.targets[i].clone(), Some(pick))),
            Err(NoPick::Empty) => Err(ProxyError::Unavailable(format!(
                "no ready endpoints for Service {}/{} port {}",
                service.namespace, service.name, service.port
            ))),
            Err(NoPick::AllEjected) => Err(ProxyError::Unavailable(format!(
                "every endpoint of Service {}/{} port {} is ejected by failure accrual after failing repeatedly",
                service.namespace, service.name, service.port
            ))),
        }
    }
}

/// Reports to the balancer how using the picked endpoint went: connected or not.
pub(super) fn settle(pick: Option<Pick>, ok: bool) {
    match (pick, ok) {
        (Some(p), true) => p.success(),
        (Some(p), false) => p.failure(),
        (None, _) => {}
    }
}

/// Reports to the balancer how a request to the picked endpoint went: no response, or a
/// response classified as a success or a failure (failure accrual counts those).
pub(super) fn settle_response<B>(
    pick: Option<Pick>,
    result: &Result<http::Response<B>, ProxyError>,
) {
    let Some(p) = pick else {
        return;
    };
    match result {
        Err(_) => p.failure(),
        Ok(resp) => match classify(resp.status(), GrpcCode::of(resp.headers())) {
            Class::Success => p.success(),
            Class::Failure => p.failed_response(),
        },
    }
}

/// Linkerd's default opaque ports.
pub(super) fn default_opaque_ports() -> &'static PortSet {
    static PORTS: OnceLock<PortSet> = OnceLock::new();
    PORTS.get_or_init(|| DEFAULT_OPAQUE_PORTS.parse().unwrap_or_default())
}
