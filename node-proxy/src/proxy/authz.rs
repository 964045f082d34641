//! Inbound authorization in the data path: a connection (plaintext, 4144) or a CONNECT
//! stream or request (mesh, 4143) is checked against its pod's port policy
//! ([`crate::policy`]) before anything reaches the application, counted with Linkerd's
//! metric names, and — for what lasts (opaque connections and streams) — checked again
//! whenever the policy changes, ending what is now denied.

use super::Shared;
use crate::discovery::Workload;
use crate::policy::routes::RequestParts;
use crate::policy::{Client, PortPolicy, Verdict};
use prometheus_client::encoding::{EncodeLabel, EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use std::sync::Arc;

/// Denials are counted each, logged at most 20 a second.
static DENY_LOGS: crate::limits::LogBudget = crate::limits::LogBudget::new(20);

/// Labels of an authorization decision: the pod (Linkerd's `namespace`, `pod` and
/// `deployment`/... and the scrape-proof `destination_workload*`, as the traffic
/// metrics), the policy (`srv_*`) and what allowed it (`authz_*`; empty on a denial).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct AuthzLabels {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod.
    pub pod: String,
    /// Its workload.
    pub workload: String,
    /// The workload's kind.
    pub workload_kind: String,
    /// The port the client asked for.
    pub target_port: String,
    /// `server` or `default`.
    pub srv_kind: String,
    /// The Server's or the default policy's name.
    pub srv_name: String,
    /// `authorizationpolicy`, `default`, `probe` or `audit` (allowed by an audit policy).
    pub authz_kind: String,
    /// Its name.
    pub authz_name: String,
    /// The route the request took (`HTTPRoute`, `GRPCRoute`; empty without routes or for
    /// a connection).
    pub route_kind: String,
    /// Its name.
    pub route_name: String,
}

impl EncodeLabelSet for AuthzLabels {
    fn encode(&self, e: &mut LabelSetEncoder<'_>) -> std::fmt::Result {
        let pod = [
            &self.namespace,
            &self.pod,
            &self.workload,
            &self.workload_kind,
        ];
        super::metrics::encode_pod(e, "destination", pod.map(String::as_str))?;
        let mut l = |k: &str, v: &str| (k, v).encode(e.encode_label());
        l("target_port", &self.target_port)?;
        l("srv_kind", &self.srv_kind)?;
        l("srv_name", &self.srv_name)?;
        l("authz_kind", &self.authz_kind)?;
        l("authz_name", &self.authz_name)?;
        l("route_kind", &self.route_kind)?;
        l("route_name", &self.route_name)
    }
}

/// `inbound_{http,tcp}_authz_{allow,deny}_total`, `inbound_tcp_authz_terminate_total`.
#[derive(Clone, Debug, Default)]
pub struct AuthzMetrics {
    series: super::metrics::SeriesTracker<AuthzLabels>,
    http_allow: Family<AuthzLabels, Counter>,
    http_deny: Family<AuthzLabels, Counter>,
    tcp_allow: Family<AuthzLabels, Counter>,
    tcp_deny: Family<AuthzLabels, Counter>,
    tcp_terminate: Family<AuthzLabels, Counter>,
}

impl AuthzMetrics {
    /// Creates the metrics and registers them.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        for (name, help, family) in [
            (
                "inbound_http_authz_allow",
                "Inbound HTTP requests authorized",
                &m.http_allow,
            ),
            (
                "inbound_http_authz_deny",
                "Inbound HTTP requests denied by policy",
                &m.http_deny,
            ),
            (
                "inbound_tcp_authz_allow",
                "Inbound connections and CONNECT streams authorized",
                &m.tcp_allow,
            ),
            (
                "inbound_tcp_authz_deny",
                "Inbound connections and CONNECT streams denied by policy",
                &m.tcp_deny,
            ),
            (
                "inbound_tcp_authz_terminate",
                "Open connections ended because a policy change denied them",
                &m.tcp_terminate,
            ),
        ] {
            registry.register(name, help, family.clone());
        }
        m
    }

    /// Drops every series of a pod that left the node.
    pub fn forget_pod(&self, namespace: &str, pod: &str) {
        for l in self.series.take(namespace, pod) {
            for f in [
                &self.http_allow,
                &self.http_deny,
                &self.tcp_allow,
                &self.tcp_deny,
                &self.tcp_terminate,
            ] {
                f.remove(&l);
            }
        }
    }

    fn count(&self, family: &Family<AuthzLabels, Counter>, labels: &AuthzLabels) {
        self.series.track(&labels.namespace, &labels.pod, labels);
        family.get_or_create(labels).inc();
    }
}

/// HTTP (counted per request) or TCP (per connection or CONNECT stream).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    /// An HTTP request.
    Http,
    /// A connection or CONNECT stream.
    Tcp,
}

/// The pod key the policy state is indexed by: `<namespace>/<name>`.
pub fn pod_key(w: &Workload) -> String {
    format!("{}/{}", w.namespace, w.name)
}

/// Checks `client` against the policy of `port` of `w` (a connection or CONNECT stream:
/// the port's authorizations, not its routes), counts the decision and logs a denial (and
/// an audited one); the verdict and the policy it came from.
pub fn check(
    shared: &Shared,
    w: &Workload,
    port: u16,
    client: &Client<'_>,
    probe: Option<&str>,
    proto: Proto,
) -> (Verdict, Arc<PortPolicy>) {
    let policy = shared.policy.borrow().port(&pod_key(w), port);
    let verdict = policy.check(client, probe);
    record(shared, w, port, &policy, &verdict, proto, None);
    log(client, port, &policy, &verdict);
    (verdict, policy)
}

/// Checks an HTTP request `req` from `client` against the policy of `port` of `w` — its
/// Server's routes, when it has some —, counts the decision and logs a denial.
pub fn check_http<B>(
    shared: &Shared,
    w: &Workload,
    port: u16,
    client: &Client<'_>,
    req: &http::Request<B>,
    probe: Option<&str>,
) -> Verdict {
    let policy = shared.policy.borrow().port(&pod_key(w), port);
    let (verdict, route) = policy.check_request(client, &RequestParts::of(req), probe);
    record(shared, w, port, &policy, &verdict, Proto::Http, route);
    log(client, port, &policy, &verdict);
    verdict
}

fn log(client: &Client<'_>, port: u16, policy: &PortPolicy, verdict: &Verdict) {
    if matches!(verdict, Verdict::Allow { .. }) {
        return;
    }
    if let Some(suppressed) = DENY_LOGS.take() {
        let audit = *verdict == Verdict::Audit;
        tracing::info!(
            client = client.identity.unwrap_or("(no identity)"),
            client_addr = %client.addr,
            port,
            srv = %format!("{}/{}", policy.kind, policy.name),
            audit,
            suppressed,
            "{}",
            match verdict {
                Verdict::Audit => "no authorization matched; allowed by audit",
                Verdict::NoRoute => "no route of the Server matches the request",
                _ => "denied by policy",
            }
        );
    }
}

fn record(
    shared: &Shared,
    w: &Workload,
    port: u16,
    policy: &PortPolicy,
    verdict: &Verdict,
    proto: Proto,
    route: Option<(&str, &str)>,
) {
    let (authz_kind, authz_name) = match verdict {
        Verdict::Allow { kind, name } => (kind.clone(), name.clone()),
        Verdict::Audit => ("audit".to_string(), policy.name.clone()),
        Verdict::Deny | Verdict::NoRoute => (String::new(), String::new()),
    };
    let (route_kind, route_name) = route.unwrap_or_default();
    let labels = AuthzLabels {
        namespace: w.namespace.clone(),
        pod: w.name.clone(),
        workload: w.workload.clone(),
        workload_kind: w.workload_kind.clone(),
        target_port: port.to_string(),
        srv_kind: policy.kind.clone(),
        srv_name: policy.name.clone(),
        authz_kind,
        authz_name,
        route_kind: route_kind.to_string(),
        route_name: route_name.to_string(),
    };
    let m = &shared.authz;
    let family = match (proto, verdict.allowed()) {
        (Proto::Http, true) => &m.http_allow,
        (Proto::Http, false) => &m.http_deny,
        (Proto::Tcp, true) => &m.tcp_allow,
        (Proto::Tcp, false) => &m.tcp_deny,
    };
    m.count(family, &labels);
}

/// Resolves once a policy change denies what `client` holds open on `port` of `w` (an
/// opaque connection or a CONNECT stream), counting the termination; never while the
/// policy keeps allowing it.
pub async fn revoked(
    shared: &Shared,
    w: &Workload,
    port: u16,
    identity: Option<String>,
    addr: std::net::IpAddr,
) {
    let mut rx = shared.policy.clone();
    let key = pod_key(w);
    loop {
        if rx.changed().await.is_err() {
            // The proxy is shutting down: the connection ends with it, not here.
            return std::future::pending().await;
        }
        let client = Client {
            identity: identity.as_deref(),
            addr,
        };
        let policy = rx.borrow_and_update().port(&key, port);
        if !policy.check(&client, None).allowed() {
            let labels = AuthzLabels {
                namespace: w.namespace.clone(),
                pod: w.name.clone(),
                workload: w.workload.clone(),
                workload_kind: w.workload_kind.clone(),
                target_port: port.to_string(),
                srv_kind: policy.kind.clone(),
                srv_name: policy.name.clone(),
                authz_kind: String::new(),
                authz_name: String::new(),
                route_kind: String::new(),
                route_name: String::new(),
            };
            shared.authz.count(&shared.authz.tcp_terminate, &labels);
            tracing::info!(
                client = client.identity.unwrap_or("(no identity)"),
                client_addr = %addr,
                port,
                "a policy change denies this connection; closing it"
            );
            return;
        }
    }
}

/// The answer to a denied request: gRPC's PERMISSION_DENIED (status 7, in a trailers-only
/// response) to a gRPC client, 403 to any other. Only a meshed client (another proxy) is
/// told why in the `ambit-proxy-error` header; an unmeshed one learns nothing of the policy.
/// The answer to a request `verdict` refuses: 404 (gRPC: UNIMPLEMENTED) when no route of
/// the Server matches it, else [`denied_response`].
pub fn refusal(
    verdict: &Verdict,
    headers: &http::HeaderMap,
    meshed: bool,
) -> http::Response<super::body::Body> {
    if *verdict != Verdict::NoRoute {
        return denied_response(headers, meshed);
    }
    let mut resp = if super::classify::is_grpc(headers) {
        let mut r = http::Response::new(super::body::empty());
        let h = r.headers_mut();
        h.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/grpc"),
        );
        h.insert("grpc-status", http::HeaderValue::from_static("12"));
        h.insert("grpc-message", http::HeaderValue::from_static("no route"));
        r
    } else {
        let mut r = http::Response::new(super::body::text("no route\n".to_string()));
        *r.status_mut() = http::StatusCode::NOT_FOUND;
        r
    };
    if meshed {
        resp.headers_mut().insert(
            super::ERROR_HEADER,
            http::HeaderValue::from_static(
                "no route: the destination's Server has no route for this request",
            ),
        );
    }
    resp
}

pub fn denied_response(
    headers: &http::HeaderMap,
    meshed: bool,
) -> http::Response<super::body::Body> {
    let grpc = super::classify::is_grpc(headers);
    let mut resp = http::Response::new(if grpc {
        super::body::empty()
    } else {
        super::body::text("denied by policy\n".to_string())
    });
    let h = resp.headers_mut();
    if grpc {
        h.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/grpc"),
        );
        h.insert("grpc-status", http::HeaderValue::from_static("7"));
        h.insert(
            "grpc-message",
            http::HeaderValue::from_static("denied by policy"),
        );
    } else {
        *resp.status_mut() = http::StatusCode::FORBIDDEN;
    }
    if meshed {
        resp.headers_mut().insert(
            super::ERROR_HEADER,
            http::HeaderValue::from_static("denied: unauthorized by the destination's policy"),
        );
    }
    resp
}
