//! Outbound routes: how requests to a Service port are routed, as the control plane
//! rendered its HTTPRoutes, GRPCRoutes and annotations (`ambit.policy.v1.ServiceRoutes`).
//! The control plane has already ordered the rules by Gateway API's precedence; here a
//! request takes the first rule whose match matches, and that rule's backend by weight.
//! Everything is validated when it arrives (regexes compiled, header names and values
//! checked), so that matching a request cannot fail.

mod filters;

pub use filters::{Mirror, PathModifier, Redirect, Rewrite};

use ambit_api::proto::policy as pb;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::Method;
use regex::Regex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// The rules of each port.
type PortRules = HashMap<u16, Vec<Arc<Rule>>>;

/// The routes of one Service, by Service port: its own (producer routes), and for the
/// clients of a namespace with consumer routes to it, theirs.
#[derive(Debug)]
pub struct ServiceRoutes {
    ports: PortRules,
    /// Consumer routes by the clients' namespace: on the ports they attach to, they
    /// replace `ports` for those clients.
    consumers: HashMap<String, PortRules>,
    /// The Service's failure accrual (None: none, the default).
    pub failure_accrual: Option<Accrual>,
}

/// A destination's failure accrual policy (consecutive failures), as Linkerd's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Accrual {
    pub max_failures: u32,
    pub min_penalty: Duration,
    pub max_penalty: Duration,
    /// Up to this share of a penalty is taken off at random (0 to 1).
    pub jitter: f64,
}

impl Default for Accrual {
    /// Linkerd's defaults: 7 consecutive failures, 1 s to 1 min, half jittered.
    fn default() -> Self {
        Self {
            max_failures: 7,
            min_penalty: Duration::from_secs(1),
            max_penalty: Duration::from_secs(60),
            jitter: 0.5,
        }
    }
}

impl Accrual {
    /// `balancer.ambit.dev/failure-accrual` as the control plane sent it; unset: none
    /// (opt-in, as Linkerd's circuit breaking). Zero fields take the defaults.
    fn from_pb(f: Option<&pb::FailureAccrual>, service: &str) -> Result<Option<Self>, String> {
        let Some(f) = f else {
            return Ok(None);
        };
        match f.kind.as_str() {
            "disabled" => Ok(None),
            "consecutive" | "" => {
                let d = Self::default();
                let ms = |v: u64, or: Duration| if v == 0 { or } else { Duration::from_millis(v) };
                let a = Self {
                    max_failures: if f.max_failures == 0 {
                        d.max_failures
                    } else {
                        f.max_failures
                    },
                    min_penalty: ms(f.min_penalty_ms, d.min_penalty),
                    max_penalty: ms(f.max_penalty_ms, d.max_penalty),
                    jitter: f.jitter_ratio,
                };
                if !(0.0..=1.0).contains(&a.jitter) || a.min_penalty > a.max_penalty {
                    return Err(format!(
                        "Service {service}: failure accrual {f:?} is not one (jitter 0 to 1, min penalty at most max)"
                    ));
                }
                Ok(Some(a))
            }
            k => Err(format!(
                "Service {service}: failure accrual {k:?} is not consecutive or disabled"
            )),
        }
    }
}

impl ServiceRoutes {
    /// Parses one Service's routes; the whole Service is refused when any part does not
    /// parse (a rule left out could send its requests to another rule's backends).
    pub fn from_pb(s: &pb::ServiceRoutes) -> Result<Self, String> {
        let mut consumers = HashMap::new();
        for c in &s.consumers {
            let ports = port_rules(
                &c.ports,
                &format!("Service {} consumers {}", s.service, c.namespace),
            )?;
            if consumers.insert(c.namespace.clone(), ports).is_some() {
                return Err(format!(
                    "Service {}: consumer namespace {} twice",
                    s.service, c.namespace
                ));
            }
        }
        Ok(Self {
            ports: port_rules(&s.ports, &format!("Service {}", s.service))?,
            consumers,
            failure_accrual: Accrual::from_pb(s.failure_accrual.as_ref(), &s.service)?,
        })
    }

    /// The rules of `port` for a client of namespace `client`, in precedence order: its
    /// namespace's consumer routes when they attach to the port, else the Service's own;
    /// None when the port has none (served as a Service without routes).
    pub fn port(&self, client: &str, port: u16) -> Option<&[Arc<Rule>]> {
        self.consumers
            .get(client)
            .and_then(|c| c.get(&port))
            .or_else(|| self.ports.get(&port))
            .map(Vec::as_slice)
    }
}

fn port_rules(ports: &[pb::PortRoutes], what: &str) -> Result<PortRules, String> {
    let mut out = HashMap::new();
    for p in ports {
        let port = u16::try_from(p.port)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{what}: port {} is not a port", p.port))?;
        let rules = p
            .rules
            .iter()
            .enumerate()
            .map(|(i, r)| {
                Rule::from_pb(r)
                    .map(Arc::new)
                    .map_err(|e| format!("{what} port {port} rule {i}: {e}"))
            })
            .collect::<Result<_, _>>()?;
        out.insert(port, rules);
    }
    Ok(out)
}

/// The first rule of `rules` that matches the request, if any.
pub fn select<'a>(rules: &'a [Arc<Rule>], req: &RequestParts<'_>) -> Option<&'a Arc<Rule>> {
    rules.iter().find(|r| r.matches(req))
}

/// What matching looks at in a request.
#[derive(Clone, Copy, Debug)]
pub struct RequestParts<'a> {
    pub method: &'a Method,
    /// The URI's authority (HTTP/2 carries the host there, not in a `host` header).
    pub authority: Option<&'a str>,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub headers: &'a HeaderMap,
}

impl<'a> RequestParts<'a> {
    /// The parts of `req`.
    pub fn of<B>(req: &'a http::Request<B>) -> Self {
        Self {
            method: req.method(),
            authority: req.uri().authority().map(|a| a.as_str()),
            path: req.uri().path(),
            query: req.uri().query(),
            headers: req.headers(),
        }
    }
}

/// One rule: a match and what to do with the requests it matches.
#[derive(Debug)]
pub struct Rule {
    /// For metrics: `HTTPRoute`, `GRPCRoute` or `default`.
    pub route_kind: String,
    pub route_namespace: String,
    pub route_name: String,
    matcher: Option<Matcher>,
    pub request_headers: HeaderModifier,
    pub response_headers: HeaderModifier,
    /// RequestRedirect: answered by the proxy.
    pub redirect: Option<Redirect>,
    /// URLRewrite.
    pub rewrite: Option<Rewrite>,
    /// RequestMirror filters.
    pub mirrors: Vec<Mirror>,
    /// Empty: the parent Service itself.
    pub backends: Vec<Backend>,
    /// The sum of the backends' weights.
    total_weight: u64,
    pub timeouts: Timeouts,
    pub retry: Option<Retry>,
    /// A GRPCRoute's rule.
    pub grpc: bool,
}

impl Rule {
    fn from_pb(r: &pb::Rule) -> Result<Self, String> {
        let backends = r
            .backends
            .iter()
            .map(Backend::from_pb)
            .collect::<Result<Vec<_>, _>>()?;
        let total_weight = backends.iter().map(|b| u64::from(b.weight)).sum();
        let timeouts = r
            .timeouts
            .as_ref()
            .map(Timeouts::from_pb)
            .unwrap_or_default();
        Ok(Self {
            route_kind: r.route_kind.clone(),
            route_namespace: r.route_namespace.clone(),
            route_name: r.route_name.clone(),
            matcher: r.r#match.as_ref().map(Matcher::from_pb).transpose()?,
            request_headers: HeaderModifier::from_pb(r.request_headers.as_ref())
                .map_err(|e| format!("request header modifier: {e}"))?,
            response_headers: HeaderModifier::from_pb(r.response_headers.as_ref())
                .map_err(|e| format!("response header modifier: {e}"))?,
            redirect: r.redirect.as_ref().map(Redirect::from_pb).transpose()?,
            rewrite: r.rewrite.as_ref().map(Rewrite::from_pb).transpose()?,
            mirrors: r
                .mirrors
                .iter()
                .map(Mirror::from_pb)
                .collect::<Result<_, _>>()?,
            backends,
            total_weight,
            timeouts,
            retry: r.retry.as_ref().map(Retry::from_pb).transpose()?,
            grpc: r.grpc,
        })
    }

    /// The path prefix the rule's match matched (for ReplacePrefixMatch), without its
    /// trailing `/`; `Some("")` for a rule that matches every path.
    pub fn matched_prefix(&self) -> Option<&str> {
        match self.matcher.as_ref().map(|m| &m.path) {
            None | Some(None) => Some(""),
            Some(Some(PathMatch::Prefix(p))) => Some(p),
            Some(Some(_)) => None,
        }
    }

    /// Whether the request matches (a rule with no match matches everything).
    pub fn matches(&self, req: &RequestParts<'_>) -> bool {
        self.matcher.as_ref().is_none_or(|m| m.matches(req))
    }

    /// A backend by weight (`roll` uniform in 0..1 picks it); None when the rule has no
    /// backends (the parent Service) — or only backends of weight 0, which is an error
    /// the caller reports: Gateway API says such a rule answers 500.
    pub fn backend(&self, roll: f64) -> Option<&Backend> {
        if self.total_weight == 0 {
            return None;
        }
        // `roll` in [0, 1) scaled to the total: the first backend whose cumulative weight
        // exceeds it.
        let mut at = (roll * self.total_weight as f64) as u64;
        for b in &self.backends {
            let w = u64::from(b.weight);
            if at < w {
                return Some(b);
            }
            at -= w;
        }
        self.backends.iter().rev().find(|b| b.weight > 0)
    }

    /// Whether the rule names backends that may never be chosen (all weight 0).
    pub fn has_no_usable_backend(&self) -> bool {
        !self.backends.is_empty() && self.total_weight == 0
    }
}

/// A request match: every part present must match.
#[derive(Clone, Debug)]
pub(crate) struct Matcher {
    path: Option<PathMatch>,
    headers: Vec<(HeaderName, ValueMatch)>,
    query: Vec<(String, ValueMatch)>,
    method: Option<Method>,
    /// gRPC `/<service>/<method>`; an empty part matches any.
    grpc: Option<(String, String)>,
}

#[derive(Clone, Debug)]
enum PathMatch {
    Exact(String),
    Prefix(String),
    Regex(Regex),
}

#[derive(Clone, Debug)]
enum ValueMatch {
    Exact(String),
    Regex(Regex),
}

impl ValueMatch {
    fn from_pb(v: &pb::ValueMatch) -> Result<Self, String> {
        match &v.value {
            Some(pb::value_match::Value::Exact(s)) => Ok(ValueMatch::Exact(s.clone())),
            Some(pb::value_match::Value::Regex(r)) => Ok(ValueMatch::Regex(whole(r)?)),
            None => Err(format!("match on {:?} has no value", v.name)),
        }
    }

    fn matches(&self, v: &str) -> bool {
        match self {
            ValueMatch::Exact(s) => s == v,
            ValueMatch::Regex(r) => r.is_match(v),
        }
    }
}

/// A regex that must match the whole value. `r` must be a regex on its own: one that only
/// parses inside the anchoring group (`a)|(.*`) would close it early and match far more
/// than it says.
fn whole(r: &str) -> Result<Regex, String> {
    let bad = |e: regex::Error| format!("regular expression {r:?}: {e}");
    Regex::new(r).map_err(bad)?;
    Regex::new(&format!("^(?:{r})$")).map_err(bad)
}

impl Matcher {
    pub(crate) fn from_pb(m: &pb::RequestMatch) -> Result<Self, String> {
        let path = match m.path.as_ref().and_then(|p| p.kind.as_ref()) {
            None => None,
            Some(pb::path_match::Kind::Exact(p)) => Some(PathMatch::Exact(p.clone())),
            Some(pb::path_match::Kind::Prefix(p)) => {
                if !p.starts_with('/') {
                    return Err(format!("path prefix {p:?} does not start with /"));
                }
                // "/api/" and "/api" match the same paths.
                let p = p.trim_end_matches('/');
                Some(PathMatch::Prefix(p.to_string()))
            }
            Some(pb::path_match::Kind::Regex(r)) => Some(PathMatch::Regex(whole(r)?)),
        };
        let headers = m
            .headers
            .iter()
            .map(|h| {
                let name = HeaderName::from_bytes(h.name.as_bytes())
                    .map_err(|_| format!("{:?} is not a header name", h.name))?;
                Ok((name, ValueMatch::from_pb(h)?))
            })
            .collect::<Result<_, String>>()?;
        let query = m
            .query_params
            .iter()
            .map(|q| Ok((q.name.clone(), ValueMatch::from_pb(q)?)))
            .collect::<Result<_, String>>()?;
        let method = if m.method.is_empty() {
            None
        } else {
            Some(
                Method::from_bytes(m.method.as_bytes())
                    .map_err(|_| format!("{:?} is not a method", m.method))?,
            )
        };
        Ok(Self {
            path,
            headers,
            query,
            method,
            grpc: m
                .grpc
                .as_ref()
                .map(|g| (g.service.clone(), g.method.clone())),
        })
    }

    pub(crate) fn matches(&self, req: &RequestParts<'_>) -> bool {
        let path_ok = match &self.path {
            None => true,
            Some(PathMatch::Exact(p)) => req.path == p,
            Some(PathMatch::Prefix(p)) => {
                // Element-wise: "/api" matches "/api" and "/api/x", not "/apix".
                req.path
                    .strip_prefix(p.as_str())
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('/') || p.is_empty())
            }
            Some(PathMatch::Regex(r)) => r.is_match(req.path),
        };
        path_ok
            && self.method.as_ref().is_none_or(|m| m == req.method)
            && self.headers.iter().all(|(name, want)| {
                // Any of a repeated header's values may match; `host` is the authority
                // in HTTP/2.
                let host = (name == http::header::HOST && !req.headers.contains_key(name))
                    .then_some(req.authority)
                    .flatten();
                host.is_some_and(|h| want.matches(h))
                    || req
                        .headers
                        .get_all(name)
                        .iter()
                        .any(|v| v.to_str().is_ok_and(|v| want.matches(v)))
            })
            && self.query.iter().all(|(name, want)| {
                query_values(req.query, name)
                    .next()
                    .is_some_and(|v| want.matches(&v))
            })
            && self.grpc.as_ref().is_none_or(|(svc, method)| {
                let mut parts = req.path.strip_prefix('/').unwrap_or("").splitn(2, '/');
                let (s, m) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
                (svc.is_empty() || svc == s) && (method.is_empty() || method == m)
            })
    }
}

/// The values of query parameter `name`, first first: names and values compared decoded
/// (`%XX` and `+` for a space, as a form encodes them), so that `?q=a%20b` matches the
/// value `a b` a route writes.
fn query_values<'a>(query: Option<&'a str>, name: &'a str) -> impl Iterator<Item = String> + 'a {
    query.unwrap_or("").split('&').filter_map(move |kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (decode_query(k) == name).then(|| decode_query(v))
    })
}

/// `s` with `+` as a space and `%XX` decoded; an escape that is not two hex digits is
/// kept as sent, and bytes that are not UTF-8 are replaced (they match no route value).
fn decode_query(s: &str) -> String {
    if !s.contains(['%', '+']) {
        return s.to_string();
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let hex = |c: u8| (c as char).to_digit(16).and_then(|d| u8::try_from(d).ok());
    let mut i = 0;
    while i < b.len() {
        let escaped = (b[i] == b'%')
            .then(|| Some((hex(*b.get(i + 1)?)?, hex(*b.get(i + 2)?)?)))
            .flatten();
        match (b[i], escaped) {
            (_, Some((hi, lo))) => {
                out.push(hi << 4 | lo);
                i += 3;
                continue;
            }
            (b'+', _) => out.push(b' '),
            (c, _) => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// RequestHeaderModifier / ResponseHeaderModifier.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeaderModifier {
    set: Vec<(HeaderName, HeaderValue)>,
    add: Vec<(HeaderName, HeaderValue)>,
    remove: Vec<HeaderName>,
}

impl HeaderModifier {
    fn from_pb(m: Option<&pb::HeaderModifier>) -> Result<Self, String> {
        let Some(m) = m else {
            return Ok(Self::default());
        };
        let pair = |h: &pb::Header| -> Result<(HeaderName, HeaderValue), String> {
            let name = HeaderName::from_bytes(h.name.as_bytes())
                .map_err(|_| format!("{:?} is not a header name", h.name))?;
            let value = HeaderValue::from_str(&h.value)
                .map_err(|_| format!("{:?} is not a header value", h.value))?;
            Ok((name, value))
        };
        Ok(Self {
            set: m.set.iter().map(pair).collect::<Result<_, _>>()?,
            add: m.add.iter().map(pair).collect::<Result<_, _>>()?,
            remove: m
                .remove
                .iter()
                .map(|n| {
                    HeaderName::from_bytes(n.as_bytes())
                        .map_err(|_| format!("{n:?} is not a header name"))
                })
                .collect::<Result<_, _>>()?,
        })
    }

    /// Applies the modifier: set, then add, then remove (Gateway API's order).
    pub fn apply(&self, h: &mut HeaderMap) {
        for (n, v) in &self.set {
            h.insert(n.clone(), v.clone());
        }
        for (n, v) in &self.add {
            h.append(n.clone(), v.clone());
        }
        for n in &self.remove {
            h.remove(n);
        }
    }

    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.add.is_empty() && self.remove.is_empty()
    }
}

/// A backend Service port, its weight and its own filters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backend {
    pub namespace: String,
    pub name: String,
    pub port: u16,
    pub weight: u32,
    /// Applied to each try sent to it, after the rule's.
    pub request_headers: HeaderModifier,
    /// Applied to its responses, before the rule's.
    pub response_headers: HeaderModifier,
}

impl Backend {
    fn from_pb(b: &pb::Backend) -> Result<Self, String> {
        let (namespace, name) = b
            .service
            .split_once('/')
            .filter(|(ns, n)| !ns.is_empty() && !n.is_empty())
            .ok_or_else(|| format!("backend {:?} is not <namespace>/<name>", b.service))?;
        let port = u16::try_from(b.port)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("backend {}: port {} is not a port", b.service, b.port))?;
        let what = |e: String| format!("backend {}: {e}", b.service);
        Ok(Self {
            namespace: namespace.into(),
            name: name.into(),
            port,
            weight: b.weight,
            request_headers: HeaderModifier::from_pb(b.request_headers.as_ref()).map_err(what)?,
            response_headers: HeaderModifier::from_pb(b.response_headers.as_ref()).map_err(what)?,
        })
    }
}

/// A rule's timeouts; None: no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timeouts {
    /// The whole request, retries included.
    pub request: Option<Duration>,
    /// Each try.
    pub backend_request: Option<Duration>,
    /// Time to the response's headers.
    pub response: Option<Duration>,
    /// A response body with no frame for this long is ended.
    pub idle: Option<Duration>,
}

impl Timeouts {
    fn from_pb(t: &pb::Timeouts) -> Self {
        let ms = |v: u64| (v > 0).then(|| Duration::from_millis(v));
        Self {
            request: ms(t.request_ms),
            backend_request: ms(t.backend_request_ms),
            response: ms(t.response_ms),
            idle: ms(t.idle_ms),
        }
    }

    /// How long one try may take to its response's headers: the tighter of
    /// `backend_request` and `response` (`request` bounds all the tries together).
    pub fn per_try(&self) -> Option<Duration> {
        [self.backend_request, self.response]
            .into_iter()
            .flatten()
            .min()
    }
}

/// What is retried, how often.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retry {
    pub limit: u32,
    pub http_statuses: Vec<(u16, u16)>,
    pub grpc_codes: Vec<u8>,
    pub backoff: Duration,
}

impl Retry {
    fn from_pb(r: &pb::Retry) -> Result<Self, String> {
        let http_statuses = r
            .http_statuses
            .iter()
            .map(|s| {
                let ok = (100..=599).contains(&s.min) && s.min <= s.max && s.max <= 599;
                if ok {
                    Ok((s.min as u16, s.max as u16))
                } else {
                    Err(format!("retry status range {}-{} is not one", s.min, s.max))
                }
            })
            .collect::<Result<_, _>>()?;
        let grpc_codes = r
            .grpc_codes
            .iter()
            .map(|c| {
                u8::try_from(*c)
                    .ok()
                    .filter(|c| *c <= 16)
                    .ok_or_else(|| format!("retry gRPC code {c} is not one"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            limit: r.limit,
            http_statuses,
            grpc_codes,
            backoff: Duration::from_millis(r.backoff_ms),
        })
    }
}

#[cfg(test)]
mod tests;
