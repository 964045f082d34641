//! The inbound policy of a pod as the proxy matches it: the control plane's PodPolicy
//! (`ambit.policy.v1`), parsed once — CIDRs and identity patterns — and checked. A policy
//! that does not parse is refused whole (the pod keeps its last good one): dropping a part
//! of it could widen what a pod accepts (a Server's port falling back to a more permissive
//! default).

use super::routes::{Matcher, RequestParts};
use ambit_api::proto::policy as pb;
use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

/// A CIDR: an address and how many leading bits of it must match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    bits: u8,
}

impl Cidr {
    /// Parses `10.0.0.0/8`, `fd00::/8`, or a bare address (all bits).
    pub fn parse(s: &str) -> Result<Self, String> {
        let (addr, bits) = match s.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?} is not a CIDR (e.g. 10.0.0.0/8)"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            None => max,
            Some(b) => b
                .parse::<u8>()
                .ok()
                .filter(|b| *b <= max)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0..={max}"))?,
        };
        Ok(Self { addr, bits })
    }

    /// Whether `ip` is in it (an IPv4-mapped IPv6 address counts as its IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => prefix_eq(&net.octets(), &ip.octets(), self.bits),
            (IpAddr::V6(net), IpAddr::V6(ip)) => prefix_eq(&net.octets(), &ip.octets(), self.bits),
            _ => false,
        }
    }
}

fn prefix_eq(a: &[u8], b: &[u8], bits: u8) -> bool {
    let (full, rest) = (usize::from(bits / 8), bits % 8);
    if a[..full] != b[..full] {
        return false;
    }
    rest == 0 || (a[full] ^ b[full]) >> (8 - rest) == 0
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.bits)
    }
}

/// A network a client may come from: a CIDR minus the CIDRs within it that may not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Network {
    /// The CIDR.
    pub cidr: Cidr,
    /// Excluded from it.
    pub except: Vec<Cidr>,
}

impl Network {
    /// Whether `ip` is in the network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.cidr.contains(ip) && !self.except.iter().any(|e| e.contains(ip))
    }
}

/// The client identities an authorization accepts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MeshTls {
    /// Any mTLS client of the trust domain.
    Any,
    /// One of these: `Ok` an exact SPIFFE ID, `Err` a prefix.
    Identities(Vec<IdentityPattern>),
}

/// An identity an authorization names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IdentityPattern {
    /// This SPIFFE ID.
    Exact(String),
    /// Any SPIFFE ID starting with this.
    Prefix(String),
}

impl IdentityPattern {
    fn matches(&self, id: &str) -> bool {
        match self {
            IdentityPattern::Exact(e) => e == id,
            IdentityPattern::Prefix(p) => id.starts_with(p.as_str()),
        }
    }
}

/// One way in: every condition present must hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Authorization {
    /// For metrics: `authorizationpolicy`, `default`, `probe`.
    pub kind: String,
    /// For metrics: its name.
    pub name: String,
    /// Required client identities; `None`: any client, meshed or not.
    pub mesh_tls: Option<MeshTls>,
    /// Required client networks; empty: any address.
    pub networks: Vec<Network>,
}

/// Who is asking.
#[derive(Clone, Copy, Debug)]
pub struct Client<'a> {
    /// The client's proven SPIFFE ID (mTLS); `None` for plaintext.
    pub identity: Option<&'a str>,
    /// Its address (the mesh peer's is the source pod's, as the tunnel reports it).
    pub addr: IpAddr,
}

impl Authorization {
    /// Whether `client` meets every condition.
    pub fn matches(&self, client: &Client<'_>) -> bool {
        let tls = match (&self.mesh_tls, client.identity) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(MeshTls::Any), Some(_)) => true,
            (Some(MeshTls::Identities(ids)), Some(id)) => ids.iter().any(|p| p.matches(id)),
        };
        tls && (self.networks.is_empty() || self.networks.iter().any(|n| n.contains(client.addr)))
    }
}

/// What may reach one port of a pod (or every port no Server selects).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortPolicy {
    /// For metrics (`srv_kind`): `server` or `default`.
    pub kind: String,
    /// For metrics (`srv_name`): the Server's or the default policy's name.
    pub name: String,
    /// Server.spec.proxyProtocol (`unknown` when not a Server's).
    pub protocol: String,
    /// Allowed when any matches.
    pub authorizations: Vec<Authorization>,
    /// When none matches: allow, and count what would have been denied.
    pub audit: bool,
    /// Paths of the kubelet's probes on this port: a plaintext GET of one is allowed.
    pub probe_paths: Vec<String>,
    /// Per-route authorization: the routes of the port's Server (empty: none).
    pub routes: InboundRoutes,
}

/// A route of a Server (an HTTPRoute or GRPCRoute rule's match) and who may use it.
#[derive(Clone, Debug)]
pub struct InboundRoute {
    /// For metrics (`route_kind`, `route_name`).
    pub kind: String,
    pub name: String,
    matcher: Option<Matcher>,
    /// Allowed on this route besides the Server's authorizations.
    pub authorizations: Vec<Authorization>,
}

/// A port's routes, in precedence order; compared by what the control plane sent (a
/// compiled regex has no equality).
#[derive(Clone, Debug, Default)]
pub struct InboundRoutes {
    pub(crate) source: Vec<pb::InboundRoute>,
    routes: Arc<Vec<InboundRoute>>,
}

impl PartialEq for InboundRoutes {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

// No floating-point fields in an InboundRoute: equality is an equivalence.
impl Eq for InboundRoutes {}

impl InboundRoutes {
    /// The routes, in precedence order.
    pub fn iter(&self) -> impl Iterator<Item = &InboundRoute> {
        self.routes.iter()
    }

    pub(crate) fn from_pb(routes: &[pb::InboundRoute]) -> Result<Self, String> {
        let parsed = routes
            .iter()
            .map(|r| {
                let what = format!("{} {}", r.kind, r.name);
                Ok(InboundRoute {
                    kind: r.kind.clone(),
                    name: r.name.clone(),
                    matcher: r
                        .r#match
                        .as_ref()
                        .map(Matcher::from_pb)
                        .transpose()
                        .map_err(|e| format!("{what}: {e}"))?,
                    authorizations: r
                        .authorizations
                        .iter()
                        .map(authorization)
                        .collect::<Result<_, _>>()
                        .map_err(|e| format!("{what}: {e}"))?,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Self {
            source: routes.to_vec(),
            routes: Arc::new(parsed),
        })
    }

    /// Whether the port has routes.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// The first route `req` matches.
    pub fn select(&self, req: &RequestParts<'_>) -> Option<&InboundRoute> {
        self.routes
            .iter()
            .find(|r| r.matcher.as_ref().is_none_or(|m| m.matches(req)))
    }
}

/// The outcome of a check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Allowed by this authorization (kind, name).
    Allow { kind: String, name: String },
    /// No authorization matched, but the policy audits: allowed and counted.
    Audit,
    /// Denied.
    Deny,
    /// The port's Server has routes and the request matches none (HTTP 404).
    NoRoute,
}

impl Verdict {
    /// Whether the connection or request goes on.
    pub fn allowed(&self) -> bool {
        !matches!(self, Verdict::Deny | Verdict::NoRoute)
    }
}

impl PortPolicy {
    /// Checks `client`; `probe` is the path of a plaintext GET (HTTP only), which a probe
    /// path of this port allows whatever the authorizations say.
    pub fn check(&self, client: &Client<'_>, probe: Option<&str>) -> Verdict {
        if let Some(a) = self.authorizations.iter().find(|a| a.matches(client)) {
            return Verdict::Allow {
                kind: a.kind.clone(),
                name: a.name.clone(),
            };
        }
        if let Some(v) = self.check_probe(client, probe) {
            return v;
        }
        if self.audit {
            Verdict::Audit
        } else {
            Verdict::Deny
        }
    }

    /// Checks an HTTP request `req`: with routes, the first route it matches — whose
    /// authorizations allow it besides the port's — or, when none matches, `NoRoute`; a
    /// probe path passes either way. Also returns the route (kind, name) for metrics.
    pub fn check_request(
        &self,
        client: &Client<'_>,
        req: &RequestParts<'_>,
        probe: Option<&str>,
    ) -> (Verdict, Option<(&str, &str)>) {
        if self.routes.is_empty() {
            return (self.check(client, probe), None);
        }
        let Some(route) = self.routes.select(req) else {
            let verdict = match self.check_probe(client, probe) {
                Some(v) => v,
                None => Verdict::NoRoute,
            };
            return (verdict, None);
        };
        let named = Some((route.kind.as_str(), route.name.as_str()));
        if let Some(a) = route.authorizations.iter().find(|a| a.matches(client)) {
            let v = Verdict::Allow {
                kind: a.kind.clone(),
                name: a.name.clone(),
            };
            return (v, named);
        }
        (self.check(client, probe), named)
    }

    /// `Allow` of kind `probe` when `probe` is a plaintext GET of one of the port's probe
    /// paths.
    fn check_probe(&self, client: &Client<'_>, probe: Option<&str>) -> Option<Verdict> {
        let is_probe = client.identity.is_none()
            && probe.is_some_and(|p| self.probe_paths.iter().any(|q| path_of(p) == q));
        is_probe.then(|| Verdict::Allow {
            kind: "probe".into(),
            name: "probe".into(),
        })
    }

    /// The policy a proxy applies on its own: before the control plane's first snapshot,
    /// and to a pod it has none for. `name` is a default policy's name
    /// (`ambit_api::policy`, the definition the control plane renders too).
    pub fn default_policy(name: &str, cluster_networks: &[Network]) -> Result<Self, String> {
        let networks: Vec<String> = cluster_networks
            .iter()
            .map(|n| n.cidr.to_string())
            .collect();
        port_policy(&ambit_api::policy::default_port_policy(name, 0, &networks)?)
    }
}

/// A request target's path, without its query.
fn path_of(target: &str) -> &str {
    target.split(['?', '#']).next().unwrap_or(target)
}

/// The inbound policy of one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodPolicy {
    /// Ports a Server selects (or that carry probes).
    pub ports: HashMap<u16, Arc<PortPolicy>>,
    /// Every other port.
    pub default: Arc<PortPolicy>,
}

impl PodPolicy {
    /// The policy of `port`.
    pub fn port(&self, port: u16) -> &Arc<PortPolicy> {
        self.ports.get(&port).unwrap_or(&self.default)
    }

    /// Parses the control plane's policy of a pod; the error names what is wrong.
    pub fn from_pb(p: &pb::PodPolicy) -> Result<Self, String> {
        let default = p
            .default
            .as_ref()
            .ok_or("no default port policy")
            .and_then(|d| port_policy(d).map_err(|_| "the default port policy is invalid"))
            .map_err(|e| format!("pod {}: {e}", p.pod))?;
        let mut ports = HashMap::new();
        for pp in &p.ports {
            let port = u16::try_from(pp.port)
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| format!("pod {}: port {} is not a port", p.pod, pp.port))?;
            let parsed = port_policy(pp).map_err(|e| format!("pod {} port {port}: {e}", p.pod))?;
            ports.insert(port, Arc::new(parsed));
        }
        Ok(Self {
            ports,
            default: Arc::new(default),
        })
    }
}

fn port_policy(p: &pb::PortPolicy) -> Result<PortPolicy, String> {
    let authorizations = p
        .authorizations
        .iter()
        .map(authorization)
        .collect::<Result<_, _>>()?;
    Ok(PortPolicy {
        kind: p.kind.clone(),
        name: p.name.clone(),
        protocol: if p.protocol.is_empty() {
            "unknown".into()
        } else {
            p.protocol.clone()
        },
        authorizations,
        audit: p.audit,
        probe_paths: p.probe_paths.clone(),
        routes: InboundRoutes::from_pb(&p.routes)
            .map_err(|e| format!("{} {}: {e}", p.kind, p.name))?,
    })
}

fn authorization(a: &pb::Authorization) -> Result<Authorization, String> {
    let mesh_tls = match &a.mesh_tls {
        None => None,
        Some(m) if m.any => Some(MeshTls::Any),
        Some(m) => {
            let ids = m
                .identities
                .iter()
                .map(|i| match &i.pattern {
                    Some(pb::identity_pattern::Pattern::Exact(e)) if !e.is_empty() => {
                        Ok(IdentityPattern::Exact(e.clone()))
                    }
                    Some(pb::identity_pattern::Pattern::Prefix(p)) if !p.is_empty() => {
                        Ok(IdentityPattern::Prefix(p.clone()))
                    }
                    _ => Err(format!("authorization {}: an empty identity", a.name)),
                })
                .collect::<Result<Vec<_>, _>>()?;
            // No identity at all would match no one: say so rather than deny in silence.
            if ids.is_empty() {
                return Err(format!(
                    "authorization {}: mesh TLS names no identity",
                    a.name
                ));
            }
            Some(MeshTls::Identities(ids))
        }
    };
    let networks = a
        .networks
        .iter()
        .map(|n| {
            Ok(Network {
                cidr: Cidr::parse(&n.cidr)?,
                except: n
                    .except
                    .iter()
                    .map(|e| Cidr::parse(e))
                    .collect::<Result<_, String>>()?,
            })
        })
        .collect::<Result<_, String>>()
        .map_err(|e| format!("authorization {}: {e}", a.name))?;
    Ok(Authorization {
        kind: a.kind.clone(),
        name: a.name.clone(),
        mesh_tls,
        networks,
    })
}

/// Parses `--cluster-networks`-style lists: CIDRs separated by commas.
pub fn parse_networks(s: &str) -> Result<Vec<Network>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(|c| {
            Ok(Network {
                cidr: Cidr::parse(c)?,
                except: vec![],
            })
        })
        .collect()
}
