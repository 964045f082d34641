//! Route metrics, with Linkerd's names: per HTTPRoute or GRPCRoute rule (and the default
//! rule of a Service's annotations), the requests' duration and statuses, the backends
//! chosen, and what retries did — `outbound_http_route_*` and `outbound_grpc_route_*`.
//! Labels, Linkerd's: the client pod (`namespace`, `pod`, `deployment`/`statefulset`/...,
//! and the scrape-proof `source_workload*`, see [`super::metrics::TrafficLabels`]),
//! `parent_*` (the Service: group `core`, kind `Service`), `route_*` (the route: group
//! `gateway.networking.k8s.io`, or none for the default route); statuses by
//! `http_status` or `grpc_status`, and `error`.

use super::body::Body;
use super::classify::GrpcCode;
use crate::discovery::Workload;
use crate::policy::routes::{Backend, Rule};
use prometheus_client::encoding::{EncodeLabel, EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Request duration buckets in seconds, as Linkerd's route metrics.
const BUCKETS: [f64; 10] = [0.05, 0.5, 1.0, 10.0, 0.005, 0.01, 0.025, 0.1, 0.25, 2.5];

/// A route of a client pod.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct RouteLabels {
    pub namespace: String,
    pub pod: String,
    pub workload: String,
    pub workload_kind: String,
    pub parent_namespace: String,
    pub parent_name: String,
    pub parent_port: String,
    pub route_kind: String,
    pub route_namespace: String,
    pub route_name: String,
}

impl RouteLabels {
    /// The labels of `rule` of Service port `parent` for requests from `w`.
    pub(super) fn new(w: &Workload, parent: &super::resolve::ServicePort, rule: &Rule) -> Self {
        Self {
            namespace: w.namespace.clone(),
            pod: w.name.clone(),
            workload: w.workload.clone(),
            workload_kind: w.workload_kind.clone(),
            parent_namespace: parent.namespace.clone(),
            parent_name: parent.name.clone(),
            parent_port: parent.port.to_string(),
            route_kind: rule.route_kind.clone(),
            route_namespace: rule.route_namespace.clone(),
            route_name: rule.route_name.clone(),
        }
    }
}

impl EncodeLabelSet for RouteLabels {
    fn encode(&self, e: &mut LabelSetEncoder<'_>) -> std::fmt::Result {
        let pod = [
            &self.namespace,
            &self.pod,
            &self.workload,
            &self.workload_kind,
        ];
        super::metrics::encode_pod(e, "source", pod.map(String::as_str))?;
        let mut l = |k: &str, v: &str| (k, v).encode(e.encode_label());
        l("parent_group", "core")?;
        l("parent_kind", "Service")?;
        l("parent_namespace", &self.parent_namespace)?;
        l("parent_name", &self.parent_name)?;
        l("parent_port", &self.parent_port)?;
        l("parent_section_name", "")?;
        let group = match self.route_kind.as_str() {
            "HTTPRoute" | "GRPCRoute" => "gateway.networking.k8s.io",
            _ => "",
        };
        l("route_group", group)?;
        l("route_kind", &self.route_kind)?;
        l("route_namespace", &self.route_namespace)?;
        l("route_name", &self.route_name)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct StatusLabels {
    route: RouteLabels,
    /// A gRPC route's (the status is `grpc_status`, else `http_status`).
    grpc: bool,
    /// The HTTP status (HTTP routes) or the gRPC status (gRPC routes); empty when no
    /// response came.
    status: String,
    /// Why no response came: the proxy's error kind; empty otherwise.
    error: String,
}

impl EncodeLabelSet for StatusLabels {
    fn encode(&self, e: &mut LabelSetEncoder<'_>) -> std::fmt::Result {
        self.route.encode(e)?;
        let key = if self.grpc {
            "grpc_status"
        } else {
            "http_status"
        };
        (key, self.status.as_str()).encode(e.encode_label())?;
        ("error", self.error.as_str()).encode(e.encode_label())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabels {
    #[prometheus(flatten)]
    route: RouteLabels,
    backend_namespace: String,
    backend_name: String,
    backend_port: String,
}

/// A mirrored copy of a route's request: where it went and how it ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MirrorLabels {
    #[prometheus(flatten)]
    backend: BackendLabels,
    /// `sent` (a response came; its status is not judged), `failed` (no response: no
    /// endpoint, an error, the mirror's timeout), `dropped` (too many mirrored requests
    /// in flight, or a body that could not be copied).
    result: &'static str,
}

/// How a mirrored copy ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mirrored {
    Sent,
    Failed,
    Dropped,
}

type Durations = Family<RouteLabels, Histogram, fn() -> Histogram>;

fn duration_histogram() -> Histogram {
    let mut b = BUCKETS;
    b.sort_by(f64::total_cmp);
    Histogram::new(b)
}

/// One protocol's families (HTTP or gRPC).
#[derive(Clone, Debug)]
struct Families {
    durations: Durations,
    statuses: Family<StatusLabels, Counter>,
    backends: Family<BackendLabels, Counter>,
    mirrors: Family<MirrorLabels, Counter>,
    retry_requests: Family<RouteLabels, Counter>,
    retry_successes: Family<RouteLabels, Counter>,
    retry_limit_exceeded: Family<RouteLabels, Counter>,
    retry_overflow: Family<RouteLabels, Counter>,
    retry_budget_exhausted: Family<RouteLabels, Counter>,
}

impl Families {
    fn register(registry: &mut Registry, proto: &str, status: &str) -> Self {
        let f = Self {
            durations: Family::new_with_constructor(duration_histogram as fn() -> Histogram),
            statuses: Family::default(),
            backends: Family::default(),
            mirrors: Family::default(),
            retry_requests: Family::default(),
            retry_successes: Family::default(),
            retry_limit_exceeded: Family::default(),
            retry_overflow: Family::default(),
            retry_budget_exhausted: Family::default(),
        };
        let p = format!("outbound_{proto}_route");
        registry.register(
            format!("{p}_request_duration_seconds"),
            "Time from a route's request to its response's end, retries included",
            f.durations.clone(),
        );
        registry.register(
            format!("{p}_request_statuses"),
            format!("A route's requests by {status}, or by the error that ended them"),
            f.statuses.clone(),
        );
        registry.register(
            format!("{p}_backend_requests"),
            "Tries sent to each backend of a route",
            f.backends.clone(),
        );
        registry.register(
            format!("{p}_mirror_requests"),
            "Copies of a route's requests sent by its RequestMirror filters, by how they ended",
            f.mirrors.clone(),
        );
        for (name, help, family) in [
            ("retry_requests", "Retries sent", &f.retry_requests),
            (
                "retry_successes",
                "Requests that succeeded on a retry",
                &f.retry_successes,
            ),
            (
                "retry_limit_exceeded",
                "Retryable failures returned because the retry limit was reached",
                &f.retry_limit_exceeded,
            ),
            (
                "retry_overflow",
                "Retryable failures returned because the request body could not be sent again (over 64 KiB, or still streaming)",
                &f.retry_overflow,
            ),
            (
                "retry_budget_exhausted",
                "Retryable failures returned because the retry budget was spent",
                &f.retry_budget_exhausted,
            ),
        ] {
            registry.register(format!("{p}_{name}"), help, family.clone());
        }
        f
    }

    fn remove(&self, l: &RouteLabels) {
        self.durations.remove(l);
        for f in [
            &self.retry_requests,
            &self.retry_successes,
            &self.retry_limit_exceeded,
            &self.retry_overflow,
            &self.retry_budget_exhausted,
        ] {
            f.remove(l);
        }
    }
}

/// Why a retryable failure was returned without another try.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotRetried {
    Limit,
    Overflow,
    Budget,
}

/// The route metrics.
#[derive(Clone, Debug)]
pub struct RouteMetrics {
    http: Families,
    grpc: Families,
    routes: super::metrics::SeriesTracker<RouteLabels>,
    statuses: super::metrics::SeriesTracker<StatusLabels>,
    backends: super::metrics::SeriesTracker<BackendLabels>,
    mirrors: super::metrics::SeriesTracker<MirrorLabels>,
}

impl RouteMetrics {
    /// Creates the metrics and registers them.
    pub fn register(registry: &mut Registry) -> Self {
        Self {
            http: Families::register(registry, "http", "HTTP status"),
            grpc: Families::register(registry, "grpc", "gRPC status"),
            routes: Default::default(),
            statuses: Default::default(),
            backends: Default::default(),
            mirrors: Default::default(),
        }
    }

    /// Drops every series of a pod that left the node.
    pub fn forget_pod(&self, namespace: &str, pod: &str) {
        for l in self.routes.take(namespace, pod) {
            self.http.remove(&l);
            self.grpc.remove(&l);
        }
        for l in self.statuses.take(namespace, pod) {
            self.http.statuses.remove(&l);
            self.grpc.statuses.remove(&l);
        }
        for l in self.backends.take(namespace, pod) {
            self.http.backends.remove(&l);
            self.grpc.backends.remove(&l);
        }
        for l in self.mirrors.take(namespace, pod) {
            self.http.mirrors.remove(&l);
            self.grpc.mirrors.remove(&l);
        }
    }

    /// The handles of one route for one client pod, resolved once: a connection keeps
    /// them ([`RouteCache`]), so that a request does not hash nine labels into each
    /// family (as [`super::http_metrics::ConnectionSeries`] does for the golden metrics).
    pub fn handles(&self, labels: RouteLabels, grpc: bool) -> Arc<RouteHandles> {
        self.routes.track(&labels.namespace, &labels.pod, &labels);
        let f = if grpc { &self.grpc } else { &self.http };
        Arc::new(RouteHandles {
            durations: f.durations.get_or_create(&labels).clone(),
            metrics: self.clone(),
            labels,
            grpc,
            statuses: Mutex::default(),
            backends: Mutex::default(),
        })
    }
}

/// Counters of one route for one client pod.
#[derive(Debug)]
pub struct RouteHandles {
    metrics: RouteMetrics,
    labels: RouteLabels,
    grpc: bool,
    durations: Histogram,
    /// By (status, error), as they appear.
    statuses: Mutex<Vec<(String, &'static str, Counter)>>,
    /// By backend (namespace, name, port), as they appear.
    backends: Mutex<Vec<(String, String, u16, Counter)>>,
}

/// Distinct statuses or backends a route's handles keep; beyond, they are resolved each
/// time.
const MAX_KEPT: usize = 16;

impl RouteHandles {
    /// A request on the route starts.
    pub fn request(self: &Arc<Self>) -> RouteRequest {
        RouteRequest {
            handles: self.clone(),
            start: tokio::time::Instant::now(),
        }
    }

    fn families(&self) -> &Families {
        if self.grpc {
            &self.metrics.grpc
        } else {
            &self.metrics.http
        }
    }
}

/// The routes' handles one connection has used, by rule (its requests mostly take the
/// same few).
#[derive(Debug, Default)]
pub struct RouteCache(Mutex<Vec<CachedRoute>>);

/// A rule, whether its requests were gRPC, and its handles.
type CachedRoute = (Arc<Rule>, bool, Arc<RouteHandles>);

impl RouteCache {
    /// The handles of `rule` (gRPC or not), made with `labels` the first time.
    pub fn get(
        &self,
        metrics: &RouteMetrics,
        rule: &Arc<Rule>,
        grpc: bool,
        labels: impl FnOnce() -> RouteLabels,
    ) -> Arc<RouteHandles> {
        let mut seen = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, _, h)) = seen
            .iter()
            .find(|(r, g, _)| Arc::ptr_eq(r, rule) && *g == grpc)
        {
            return h.clone();
        }
        let h = metrics.handles(labels(), grpc);
        if seen.len() >= MAX_KEPT {
            // Routes replaced by policy updates: start again.
            seen.clear();
        }
        seen.push((rule.clone(), grpc, h.clone()));
        h
    }
}

/// One request on a route, counted as it goes.
#[derive(Clone, Debug)]
pub struct RouteRequest {
    handles: Arc<RouteHandles>,
    start: tokio::time::Instant,
}

impl RouteRequest {
    fn families(&self) -> &Families {
        self.handles.families()
    }

    /// A try goes to `backend` (None: the parent Service).
    pub(super) fn backend(&self, backend: Option<&Backend>, parent: &super::resolve::ServicePort) {
        let (namespace, name, port) = match backend {
            Some(b) => (&b.namespace, &b.name, b.port),
            None => (&parent.namespace, &parent.name, parent.port),
        };
        let h = &self.handles;
        let mut kept = h.backends.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, _, _, c)) = kept
            .iter()
            .find(|(ns, n, p, _)| ns == namespace && n == name && *p == port)
        {
            c.inc();
            return;
        }
        let l = BackendLabels {
            route: h.labels.clone(),
            backend_namespace: namespace.clone(),
            backend_name: name.clone(),
            backend_port: port.to_string(),
        };
        h.metrics
            .backends
            .track(&l.route.namespace, &l.route.pod, &l);
        let c = self.families().backends.get_or_create(&l).clone();
        c.inc();
        if kept.len() < MAX_KEPT {
            kept.push((namespace.clone(), name.clone(), port, c));
        }
    }

    /// A mirrored copy to `backend` ended as `result` (resolved each time: mirrors are
    /// rare beside tries).
    pub(super) fn mirrored(&self, backend: &Backend, result: Mirrored) {
        let h = &self.handles;
        let l = MirrorLabels {
            backend: BackendLabels {
                route: h.labels.clone(),
                backend_namespace: backend.namespace.clone(),
                backend_name: backend.name.clone(),
                backend_port: backend.port.to_string(),
            },
            result: match result {
                Mirrored::Sent => "sent",
                Mirrored::Failed => "failed",
                Mirrored::Dropped => "dropped",
            },
        };
        h.metrics
            .mirrors
            .track(&h.labels.namespace, &h.labels.pod, &l);
        self.families().mirrors.get_or_create(&l).inc();
    }

    /// A retry is sent.
    pub fn retry(&self) {
        self.families()
            .retry_requests
            .get_or_create(&self.handles.labels)
            .inc();
    }

    /// A retryable failure is returned without another try.
    pub fn not_retried(&self, why: NotRetried) {
        let f = self.families();
        match why {
            NotRetried::Limit => &f.retry_limit_exceeded,
            NotRetried::Overflow => &f.retry_overflow,
            NotRetried::Budget => &f.retry_budget_exhausted,
        }
        .get_or_create(&self.handles.labels)
        .inc();
    }

    /// The request failed without a response (`error`, the proxy's error kind) or got
    /// `resp`, `retried` when a retry made it. The response's body is wrapped so that the
    /// request is counted when it ends, with the gRPC status of its trailers.
    pub fn finish(
        self,
        resp: http::Response<Body>,
        error: Option<&'static str>,
        retried: bool,
    ) -> http::Response<Body> {
        let grpc = GrpcCode::of(resp.headers());
        let status = resp.status();
        let (parts, body) = resp.into_parts();
        let end = End {
            request: self,
            status,
            grpc,
            error,
            retried,
        };
        http::Response::from_parts(parts, super::body::on_end(body, end))
    }
}

struct End {
    request: RouteRequest,
    status: http::StatusCode,
    grpc: Option<GrpcCode>,
    error: Option<&'static str>,
    retried: bool,
}

impl End {
    fn record(self, elapsed: Duration) {
        let h = &self.request.handles;
        h.durations.observe(elapsed.as_secs_f64());
        let status = match (self.error, h.grpc) {
            (Some(_), _) => String::new(),
            (None, true) => self.grpc.map(GrpcCode::label).unwrap_or_default(),
            (None, false) => self.status.as_u16().to_string(),
        };
        let success = super::classify::classify(self.status, self.grpc)
            == super::classify::Class::Success
            && self.error.is_none();
        if self.retried && success {
            h.families().retry_successes.get_or_create(&h.labels).inc();
        }
        let error = self.error.unwrap_or_default();
        let mut kept = h.statuses.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, _, c)) = kept.iter().find(|(s, e, _)| *s == status && *e == error) {
            c.inc();
            return;
        }
        let l = StatusLabels {
            route: h.labels.clone(),
            grpc: h.grpc,
            status: status.clone(),
            error: error.to_string(),
        };
        h.metrics
            .statuses
            .track(&l.route.namespace, &l.route.pod, &l);
        let c = h.families().statuses.get_or_create(&l).clone();
        c.inc();
        if kept.len() < MAX_KEPT {
            kept.push((status, error, c));
        }
    }
}

impl super::body::OnEnd for End {
    fn trailers(&mut self, t: &http::HeaderMap) {
        if let Some(g) = GrpcCode::of(t) {
            self.grpc = Some(g);
        }
    }

    fn failed(&mut self) {
        self.error = Some("stream");
    }

    fn end(self) {
        let elapsed = self.request.start.elapsed();
        self.record(elapsed);
    }
}
