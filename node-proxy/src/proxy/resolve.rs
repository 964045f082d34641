//! Where an outbound connection or request goes: the one resolution of an original
//! destination that the opaque path and the HTTP path share — whether it skips protocol
//! detection, the endpoints it may reach (each with the identity it must prove, or none
//! for plaintext), the Service for metrics and routes, and the balancer's choice.

use super::balance::{AccrualFor, NoPick, Pick};
use super::classify::{classify, Class, GrpcCode};
use super::{ProxyError, Shared};
use crate::discovery::{Destination, DiscoveryState, Workload};
use ambit_api::ports::{PortSet, DEFAULT_OPAQUE_PORTS};
use ambit_api::WorkloadIdentity;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

/// One place a connection or request may go.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Target {
    pub addr: SocketAddr,
    /// The identity the peer must prove: through the mesh tunnel. None: in plaintext,
    /// straight from the pod's netns (not a meshed pod).
    pub identity: Option<WorkloadIdentity>,
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
}

impl Resolved {
    /// Resolves `dst` against what discovery knows.
    pub fn new(dst: SocketAddr, state: &DiscoveryState) -> Self {
        Self::of(dst, state.resolve(dst))
    }

    /// Port `port` of Service `namespace`/`name` (a route's backend); None when discovery
    /// knows no such Service port.
    pub fn service(namespace: &str, name: &str, port: u16, state: &DiscoveryState) -> Option<Self> {
        let dest = state.service(namespace, name, port)?;
        // A backend has no address of its own: its ClusterIP is never connected to.
        let dst = SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), port);
        Some(Self::of(dst, dest))
    }

    fn of(dst: SocketAddr, dest: Destination) -> Self {
        match dest {
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
                targets: endpoints
                    .into_iter()
                    .map(|(addr, e)| Target {
                        addr,
                        identity: e.identity,
                    })
                    .collect(),
                unknown: false,
            },
            Destination::Pod(w, addr) => Self {
                dst,
                service: None,
                targets: vec![Target {
                    addr,
                    identity: w.meshed.then(|| w.identity.clone()),
                }],
                unknown: false,
            },
            Destination::Unknown(addr) => Self {
                dst,
                service: None,
                targets: vec![Target {
                    addr,
                    identity: None,
                }],
                unknown: true,
            },
        }
    }

    /// Whether connections skip protocol detection: the destination pod's opaque ports
    /// (for a Service, any of its endpoints'), else Linkerd's default opaque ports. Asked
    /// once per connection, not per request.
    pub fn opaque(&self, state: &DiscoveryState) -> bool {
        if self.unknown {
            return default_opaque_ports().contains(self.dst.port());
        }
        self.targets.iter().any(|t| {
            state
                .workload_by_ip(t.addr.ip())
                .is_some_and(|w| w.opaque_ports.contains(t.addr.port()))
        })
    }

    /// Resolves `dst` with the proxy's current discovery state.
    pub fn now(dst: SocketAddr, shared: &Shared) -> Self {
        Self::new(dst, &shared.state.borrow())
    }

    /// The `dst_service` label: `<name>.<namespace>`, empty when not a Service.
    pub fn dst_service(&self) -> String {
        self.service
            .as_ref()
            .map(|s| format!("{}.{}", s.name, s.namespace))
            .unwrap_or_default()
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

fn default_opaque_ports() -> &'static PortSet {
    static PORTS: OnceLock<PortSet> = OnceLock::new();
    PORTS.get_or_init(|| DEFAULT_OPAQUE_PORTS.parse().unwrap_or_default())
}
