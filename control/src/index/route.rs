//! Domain types of the outbound routes: HTTPRoutes and GRPCRoutes as checked by their
//! conversion, and the retry, timeout and failure-accrual annotations of Services and
//! routes. Defaults are applied when routes are rendered (`crate::policy::routes`), where
//! a route's own fields, its annotations and its Service's annotations meet.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::time::Duration;

/// Which Gateway API route kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RouteKind {
    /// HTTPRoute.
    Http,
    /// GRPCRoute.
    Grpc,
}

impl RouteKind {
    /// The kind's name, as in `kind:` and the `route_kind` metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            RouteKind::Http => "HTTPRoute",
            RouteKind::Grpc => "GRPCRoute",
        }
    }

    /// The kind named `name` (as in `kind:`), if it is a route kind.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "HTTPRoute" => Some(RouteKind::Http),
            "GRPCRoute" => Some(RouteKind::Grpc),
            _ => None,
        }
    }
}

/// An HTTPRoute or GRPCRoute.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteInfo {
    /// HTTPRoute or GRPCRoute.
    pub kind: RouteKind,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// metadata.creationTimestamp: the older route wins a tie in precedence.
    pub created: Option<Time>,
    /// The parents the mesh serves (other parents, e.g. Gateways, are left out).
    pub parents: Vec<RouteParent>,
    /// spec.rules, in order.
    pub rules: Vec<RouteRule>,
    /// The route's retry and timeout annotations (they override its Services').
    pub annotations: RouteAnnotations,
}

/// A parentRef the mesh serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteParent {
    /// Outbound: requests to this Service (namespace, name), on one port or all.
    Service {
        /// The Service's namespace (the route's, unless a consumer route names another).
        namespace: String,
        /// The Service's name.
        name: String,
        /// parentRefs[].port; `None`: every port of the Service.
        port: Option<u16>,
    },
    /// Inbound: the Server (namespace, name), for per-route authorization.
    Server {
        /// The Server's namespace.
        namespace: String,
        /// The Server's name.
        name: String,
    },
}

/// One rule of a route.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteRule {
    /// Any one of these; a rule without matches has one that matches everything.
    pub matches: Vec<RequestMatch>,
    /// RequestHeaderModifier.
    pub request_headers: Option<HeaderModifier>,
    /// ResponseHeaderModifier.
    pub response_headers: Option<HeaderModifier>,
    /// RequestRedirect: the proxy answers, nothing is sent (the rule has no backends).
    pub redirect: Option<Redirect>,
    /// URLRewrite.
    pub rewrite: Option<Rewrite>,
    /// RequestMirror filters: copies sent, answers ignored.
    pub mirrors: Vec<Mirror>,
    /// backendRefs; empty: the parent itself.
    pub backends: Vec<BackendRef>,
    /// timeouts.request.
    pub request_timeout: Option<Duration>,
    /// timeouts.backendRequest.
    pub backend_request_timeout: Option<Duration>,
    /// The retry stanza.
    pub retry: Option<RetryStanza>,
}

/// A rule's match, of either kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestMatch {
    /// An HTTPRoute's.
    Http(HttpMatch),
    /// A GRPCRoute's.
    Grpc(GrpcMatch),
}

/// An HTTPRoute match: all its parts must hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpMatch {
    /// The path (PathPrefix `/` when unset).
    pub path: PathMatch,
    /// Header matches (names lower case).
    pub headers: Vec<ValueMatch>,
    /// Query parameter matches.
    pub query_params: Vec<ValueMatch>,
    /// The method, upper case.
    pub method: Option<String>,
}

/// A GRPCRoute match: all its parts must hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrpcMatch {
    /// The fully qualified service; `None`: any.
    pub service: Option<String>,
    /// The method; `None`: any.
    pub method: Option<String>,
    /// Header matches (names lower case).
    pub headers: Vec<ValueMatch>,
}

/// A path match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathMatch {
    /// This path exactly.
    Exact(String),
    /// Element-wise prefix.
    Prefix(String),
    /// A regular expression (checked to compile), matched against the whole path.
    Regex(String),
}

/// A header or query parameter match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValueMatch {
    /// The name.
    pub name: String,
    /// Exact or regex.
    pub value: MatchValue,
}

/// How a value is compared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MatchValue {
    /// Equal.
    Exact(String),
    /// A regular expression (checked to compile), matched against the whole value.
    Regex(String),
}

/// A header filter.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeaderModifier {
    /// (name, value) replaced or added.
    pub set: Vec<(String, String)>,
    /// (name, value) added.
    pub add: Vec<(String, String)>,
    /// Names removed.
    pub remove: Vec<String>,
}

/// How a redirect or a rewrite changes the path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathModifier {
    /// ReplaceFullPath: this path.
    Full(String),
    /// ReplacePrefixMatch: the prefix the rule matched replaced by this.
    Prefix(String),
}

/// A RequestRedirect filter; unset parts are the request's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Redirect {
    /// `http` or `https`.
    pub scheme: Option<String>,
    /// The host.
    pub hostname: Option<String>,
    /// The path.
    pub path: Option<PathModifier>,
    /// The port.
    pub port: Option<u16>,
    /// 301, 302, 303, 307 or 308.
    pub status: u16,
}

/// A URLRewrite filter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rewrite {
    /// The host the backend sees.
    pub hostname: Option<String>,
    /// The path the backend sees.
    pub path: Option<PathModifier>,
}

/// A RequestMirror filter: `numerator / denominator` of the requests copied to a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mirror {
    /// The Service and port (weight unused).
    pub backend: BackendRef,
    /// The share mirrored: numerator (at most the denominator).
    pub numerator: u32,
    /// The share mirrored: denominator (at least 1).
    pub denominator: u32,
}

/// A backendRef to a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendRef {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub name: String,
    /// The Service port.
    pub port: u16,
    /// Share of the requests (0: none).
    pub weight: u32,
    /// The backend's own RequestHeaderModifier (after the rule's).
    pub request_headers: Option<HeaderModifier>,
    /// The backend's own ResponseHeaderModifier.
    pub response_headers: Option<HeaderModifier>,
}

/// A rule's retry stanza, as written (defaults applied when rendered).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryStanza {
    /// HTTP statuses; `None`: every 5xx.
    pub codes: Option<Vec<u16>>,
    /// Retries after the first try; `None`: 1.
    pub attempts: Option<u32>,
    /// Base backoff; `None`: 25 ms.
    pub backoff: Option<Duration>,
}

/// The retry and timeout annotations of a Service or route, and a Service's failure
/// accrual. Each group applies as a whole, as in Linkerd: a route with any retry
/// annotation does not inherit its Service's others; likewise for timeouts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RouteAnnotations {
    /// `retry.ambit.dev/*`: `None` when none is present.
    pub retry: Option<RetryAnnotations>,
    /// `timeout.ambit.dev/*`: `None` when none is present.
    pub timeouts: Option<TimeoutAnnotations>,
    /// `balancer.ambit.dev/failure-accrual*` (Services only).
    pub failure_accrual: Option<FailureAccrual>,
}

impl RouteAnnotations {
    /// Whether any routing annotation is present.
    pub fn is_empty(&self) -> bool {
        self.retry.is_none() && self.timeouts.is_none() && self.failure_accrual.is_none()
    }
}

/// `retry.ambit.dev/http|grpc|limit|timeout`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetryAnnotations {
    /// Retried HTTP statuses as inclusive ranges; `None`: not given.
    pub http: Option<Vec<(u16, u16)>>,
    /// Retried gRPC status codes; `None`: not given.
    pub grpc: Option<Vec<u32>>,
    /// Retries after the first try; `None`: 1.
    pub limit: Option<u32>,
    /// Each try's timeout.
    pub timeout: Option<Duration>,
}

/// `timeout.ambit.dev/request|response|idle`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TimeoutAnnotations {
    /// The whole request.
    pub request: Option<Duration>,
    /// Time to the response's headers.
    pub response: Option<Duration>,
    /// A stream with no frame for this long is ended.
    pub idle: Option<Duration>,
}

/// `balancer.ambit.dev/failure-accrual` and its parameters (defaults applied).
#[derive(Clone, Debug, PartialEq)]
pub enum FailureAccrual {
    /// No ejection.
    Disabled,
    /// Eject an endpoint after consecutive failures.
    Consecutive {
        /// Failures in a row that eject.
        max_failures: u32,
        /// First ejection's length.
        min_penalty: Duration,
        /// Longest ejection.
        max_penalty: Duration,
        /// Jitter, a ratio of the penalty (0 to 1).
        jitter_ratio: f64,
    },
}
