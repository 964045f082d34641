//! Gateway API's `HTTPRoute` and `GRPCRoute` (`gateway.networking.k8s.io/v1`) as they are
//! written, in the shapes of `helm/ambit-crds/templates/gateway-api.yaml` (Gateway API's
//! own, as far as a mesh uses them).
//!
//! As in `crd.rs`, every field is optional and nothing is refused here: the conversion
//! (`convert/route/`) checks values and names the object and the field, because a watcher
//! that cannot decode one object fails its whole list. Fields Ambit does not support but
//! Gateway API has (other filter types, hostnames, session persistence) are kept as
//! untyped JSON, so that the local backend's round trip does not take them for typos and
//! the conversion can refuse them by name.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

/// The API group of the route kinds.
pub const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";
/// The version of the route kinds Ambit reads.
pub const GATEWAY_VERSION: &str = "v1";
/// `apiVersion` of the route kinds.
pub const GATEWAY_API_VERSION: &str = "gateway.networking.k8s.io/v1";

macro_rules! route_kind {
    ($(#[$doc:meta])* $name:ident, $match:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
        #[serde(rename_all = "camelCase")]
        pub struct $name {
            /// `gateway.networking.k8s.io/v1`.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub api_version: Option<String>,
            /// The kind's name.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub kind: Option<String>,
            /// Standard object metadata.
            #[serde(default)]
            pub metadata: ObjectMeta,
            /// What the route says.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub spec: Option<RouteSpec<$match>>,
            /// Written by Gateway API controllers; not read.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub status: Option<Json>,
        }
    };
}

route_kind!(
    /// HTTP requests to a parent (a Service, or a Server for per-route authorization),
    /// matched and sent to weighted backends.
    HttpRoute,
    HttpRouteMatch
);
route_kind!(
    /// gRPC calls to a parent, matched by service and method.
    GrpcRoute,
    GrpcRouteMatch
);

/// `spec` of either route kind; `M` is the kind's match.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteSpec<M> {
    /// What the route attaches to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_refs: Option<Vec<ParentRef>>,
    /// Gateways' hostnames; a mesh route's parent is a Service, which has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostnames: Option<Vec<String>>,
    /// The rules, each its matches and what to do with what they match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<Vec<RouteRule<M>>>,
}

/// `spec.parentRefs[]`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentRef {
    /// `""`/`core` for a Service, `policy.ambit.dev` for a Server; unset: Gateway API's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// `Service`, `Server`; unset: `Gateway` (not a mesh parent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Unset: the route's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The parent's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A Gateway's listener; not used for Services (use `port`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
    /// The Service port the route applies to; unset: every port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i64>,
}

/// `spec.rules[]`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteRule<M> {
    /// The rule's name (for status; not used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Any one of these; none: every request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matches: Option<Vec<M>>,
    /// Header modifiers, RequestRedirect, URLRewrite, RequestMirror (others are refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filters: Option<Vec<Filter>>,
    /// Where matching requests go, by weight; none: the parent itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_refs: Option<Vec<BackendRef>>,
    /// `request` and `backendRequest`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<RouteTimeouts>,
    /// Gateway API v1.2's experimental retry stanza.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RouteRetry>,
    /// Gateway API's; not supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_persistence: Option<Json>,
}

/// An HTTPRoute rule's `matches[]`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteMatch {
    /// Unset: PathPrefix `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathMatch>,
    /// Every one must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<Vec<ValueMatch>>,
    /// Every one must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query_params: Option<Vec<ValueMatch>>,
    /// An HTTP method (upper case).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
}

/// A GRPCRoute rule's `matches[]`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GrpcRouteMatch {
    /// The service and method.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<GrpcMethodMatch>,
    /// Every one must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<Vec<ValueMatch>>,
}

/// `matches[].path`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PathMatch {
    /// `Exact`, `PathPrefix` (the default) or `RegularExpression`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The path; unset: `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// A header or query parameter match.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ValueMatch {
    /// `Exact` (the default) or `RegularExpression`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The header's or parameter's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The value, or the pattern.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// A GRPCRoute match's `method`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GrpcMethodMatch {
    /// `Exact` (the default); `RegularExpression` is not supported.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The fully qualified service, e.g. `shop.Catalog`; unset: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// The method, e.g. `List`; unset: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
}

/// `rules[].filters[]`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Filter {
    /// The filter's type.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Headers set, added or removed on the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_header_modifier: Option<HeaderModifier>,
    /// Headers set, added or removed on the response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_header_modifier: Option<HeaderModifier>,
    /// Answer with a redirect instead of sending the request (HTTPRoute only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_redirect: Option<RequestRedirect>,
    /// Rewrite the host and path before sending (HTTPRoute only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_rewrite: Option<UrlRewrite>,
    /// Send a copy of the request to another Service as well, its answer ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_mirror: Option<RequestMirror>,
    /// Gateway API's; not supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extension_ref: Option<Json>,
    /// Gateway API's; not supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cors: Option<Json>,
}

/// A RequestRedirect filter.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestRedirect {
    /// `http` or `https`; unset: the request's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// Unset: the request's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Unset: the request's path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathModifier>,
    /// Unset: the scheme's well-known port, or the port the request was sent to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i64>,
    /// 301 (the default), 302, 303, 307 or 308.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_code: Option<i64>,
}

/// A URLRewrite filter.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UrlRewrite {
    /// The Host (or `:authority`) the backend sees; unset: unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Unset: the path unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathModifier>,
}

/// A redirect's or rewrite's `path`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PathModifier {
    /// `ReplaceFullPath` or `ReplacePrefixMatch`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// With `ReplaceFullPath`: the new path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace_full_path: Option<String>,
    /// With `ReplacePrefixMatch`: what replaces the matched prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace_prefix_match: Option<String>,
}

/// A RequestMirror filter.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestMirror {
    /// Where the copies go (a Service and its port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_ref: Option<BackendRef>,
    /// The share of requests mirrored, 0 to 100; unset (and no fraction): all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<i64>,
    /// The share of requests mirrored, as a fraction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction: Option<Fraction>,
}

/// `numerator / denominator` (default 100).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Fraction {
    /// The share's numerator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numerator: Option<i64>,
    /// The share's denominator; unset: 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub denominator: Option<i64>,
}

/// A RequestHeaderModifier or ResponseHeaderModifier.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HeaderModifier {
    /// Replace (or add) these.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set: Option<Vec<HeaderValue>>,
    /// Add these (beside any of the same name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add: Option<Vec<HeaderValue>>,
    /// Remove these names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remove: Option<Vec<String>>,
}

/// A header name and value.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HeaderValue {
    /// The name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// `rules[].backendRefs[]`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendRef {
    /// `""`/`core`; unset: core.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// `Service` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The Service's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Unset: the route's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The Service port (required for a Service).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i64>,
    /// Share of the requests (default 1; 0: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i64>,
    /// Per-backend filters: header modifiers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filters: Option<Vec<Filter>>,
}

/// `rules[].timeouts`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteTimeouts {
    /// The whole request, retries included (a Gateway API duration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// Each try.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_request: Option<String>,
}

/// `rules[].retry` (Gateway API v1.2, experimental).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteRetry {
    /// HTTP statuses retried (400-599); unset: every 5xx.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub codes: Option<Vec<i64>>,
    /// Retries after the first try; unset: 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<i64>,
    /// The base backoff (a Gateway API duration); unset: 25 ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<String>,
}
