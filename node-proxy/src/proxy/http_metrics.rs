//! HTTP golden metrics, with Linkerd's names: requests, responses by status and
//! classification (gRPC status included), latency.

use super::body::Body;
use super::classify::{classify, GrpcCode};
use super::metrics::{DstService, TrafficLabels};
use crate::discovery::PodRef;
use ambit_api::WorkloadIdentity;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Latency buckets in milliseconds, as Linkerd's.
const BUCKETS_MS: [f64; 25] = [
    1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 100.0, 200.0, 300.0, 400.0, 500.0,
    1000.0, 2000.0, 3000.0, 4000.0, 5000.0, 10000.0, 20000.0, 30000.0, 40000.0, 50000.0,
];

/// Labels of a response.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResponseLabels {
    #[prometheus(flatten)]
    base: TrafficLabels,
    status_code: String,
    classification: String,
    grpc_status: String,
}

type LatencyFamily = Family<TrafficLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(BUCKETS_MS)
}

/// HTTP metrics.
#[derive(Clone, Debug)]
pub struct HttpMetrics {
    series: super::metrics::SeriesTracker<TrafficLabels>,
    response_series: super::metrics::SeriesTracker<ResponseLabels>,
    requests: Family<TrafficLabels, Counter>,
    responses: Family<ResponseLabels, Counter>,
    latency: LatencyFamily,
}

impl Default for HttpMetrics {
    fn default() -> Self {
        Self {
            series: Default::default(),
            response_series: Default::default(),
            requests: Family::default(),
            responses: Family::default(),
            latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
        }
    }
}

impl HttpMetrics {
    /// Creates the metrics and registers them.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register("request", "HTTP requests", m.requests.clone());
        registry.register(
            "response",
            "HTTP responses, by status, classification and gRPC status",
            m.responses.clone(),
        );
        registry.register(
            "response_latency_ms",
            "Time to response headers, in milliseconds",
            m.latency.clone(),
        );
        m
    }

    /// Drops every series of a pod that left the node.
    pub fn forget_pod(&self, namespace: &str, pod: &str) {
        for l in self.series.take(namespace, pod) {
            self.requests.remove(&l);
            self.latency.remove(&l);
        }
        for l in self.response_series.take(namespace, pod) {
            self.responses.remove(&l);
        }
    }

    /// The handles of one label set, resolved now for every request that shares it.
    pub fn handles(&self, labels: TrafficLabels) -> Series {
        self.series.track(&labels.namespace, &labels.pod, &labels);
        Series(Arc::new(SeriesInner {
            requests: self.requests.get_or_create(&labels).clone(),
            latency: self.latency.get_or_create(&labels).clone(),
            responses: Mutex::default(),
            metrics: self.clone(),
            labels,
        }))
    }
}

/// The series of one connection's requests: they share every label but the destination
/// Service and the endpoint's identity, so each request finds its metric handles with a
/// comparison or two instead of hashing eight strings into each family (BENCHMARKS.md).
#[derive(Debug)]
pub struct ConnectionSeries {
    metrics: HttpMetrics,
    /// The connection's labels; `server_id`, `dst_*` empty.
    base: TrafficLabels,
    seen: Mutex<Vec<(Seen, Series)>>,
}

/// What a connection's series differ by: the destination Service, the endpoint's
/// identity and pod.
type Seen = (DstService, Option<WorkloadIdentity>, Option<Arc<PodRef>>);

/// Series a connection keeps (one per Service, endpoint identity and endpoint pod: a
/// Service of up to 64 pods over one keep-alive connection); beyond this, requests
/// resolve their handles each time.
const MAX_SERIES: usize = 64;

impl ConnectionSeries {
    /// The series of a connection whose requests carry `base`.
    pub fn new(metrics: HttpMetrics, base: TrafficLabels) -> Self {
        Self {
            metrics,
            base,
            seen: Mutex::default(),
        }
    }

    /// The series of requests to `dst` (empty when not a Service) served by `server`
    /// (an mTLS peer) in `pod`.
    pub fn get(
        &self,
        dst: &DstService,
        server: Option<&WorkloadIdentity>,
        pod: Option<&Arc<PodRef>>,
    ) -> Series {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let same_pod = |p: &Option<Arc<PodRef>>| match (p, pod) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
            _ => false,
        };
        if let Some((_, r)) = seen
            .iter()
            .find(|((d, s, p), _)| d == dst && s.as_ref() == server && same_pod(p))
        {
            return r.clone();
        }
        let mut labels = self.base.clone();
        (labels.dst_namespace, labels.dst_service) = dst.clone();
        labels.dst = pod.cloned();
        if let Some(id) = server {
            labels.server_id = id.to_string();
            labels.tls = "true".into();
        }
        let series = self.metrics.handles(labels);
        if seen.len() < MAX_SERIES {
            seen.push(((dst.clone(), server.cloned(), pod.cloned()), series.clone()));
        }
        series
    }
}

/// The metric handles of one label set.
#[derive(Clone, Debug)]
pub struct Series(Arc<SeriesInner>);

#[derive(Debug)]
struct SeriesInner {
    metrics: HttpMetrics,
    labels: TrafficLabels,
    requests: Counter,
    latency: Histogram,
    /// Response counters by (status, gRPC status), as they appear.
    responses: Mutex<Vec<(u16, Option<GrpcCode>, Counter)>>,
}

impl Series {
    /// A request started.
    pub fn request(&self) {
        self.0.requests.inc();
    }

    /// Response headers arrived after `elapsed`; the body is wrapped so that the response
    /// is counted, with its gRPC status, when it ends.
    pub fn response(&self, elapsed: Duration, resp: http::Response<Body>) -> http::Response<Body> {
        self.0.latency.observe(elapsed.as_secs_f64() * 1000.0);
        let status = resp.status();
        let grpc = GrpcCode::of(resp.headers());
        let (parts, body) = resp.into_parts();
        let finish = Finish {
            series: self.clone(),
            status,
            grpc,
        };
        http::Response::from_parts(parts, super::body::on_end(body, finish))
    }
}

struct Finish {
    series: Series,
    status: http::StatusCode,
    grpc: Option<GrpcCode>,
}

impl Finish {
    fn record(self) {
        let r = &self.series.0;
        let code = self.status.as_u16();
        let mut responses = r.responses.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, _, c)) = responses
            .iter()
            .find(|(s, g, _)| *s == code && *g == self.grpc)
        {
            c.inc();
            return;
        }
        let labels = ResponseLabels {
            base: r.labels.clone(),
            status_code: code.to_string(),
            classification: classify(self.status, self.grpc).label().into(),
            grpc_status: self.grpc.map(GrpcCode::label).unwrap_or_default(),
        };
        let m = &r.metrics;
        m.response_series
            .track(&labels.base.namespace, &labels.base.pod, &labels);
        let counter = m.responses.get_or_create(&labels).clone();
        counter.inc();
        if responses.len() < MAX_SERIES {
            responses.push((code, self.grpc, counter));
        }
    }
}

impl super::body::OnEnd for Finish {
    fn trailers(&mut self, t: &http::HeaderMap) {
        if let Some(g) = GrpcCode::of(t) {
            self.grpc = Some(g);
        }
    }

    fn failed(&mut self) {
        // A body cut short is a failure whatever the status said.
        self.status = http::StatusCode::BAD_GATEWAY;
    }

    fn end(self) {
        self.record();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> TrafficLabels {
        TrafficLabels {
            direction: "outbound".into(),
            namespace: "shop".into(),
            pod: "web-0".into(),
            workload: "web".into(),
            workload_kind: "StatefulSet".into(),
            identity: "spiffe://cluster.local/ns/shop/sa/web".into(),
            client_id: String::new(),
            server_id: String::new(),
            tls: "no_identity".into(),
            dst_service: String::new(),
            dst_namespace: String::new(),
            dst: None,
        }
    }

    fn api() -> DstService {
        ("shop".into(), "api".into())
    }

    fn respond(series: &Series, status: u16, grpc: Option<&str>) {
        let mut resp = http::Response::new(super::super::body::empty());
        *resp.status_mut() = http::StatusCode::from_u16(status).unwrap();
        if let Some(g) = grpc {
            resp.headers_mut().insert("grpc-status", g.parse().unwrap());
        }
        // The response is counted when its body ends (here: is dropped).
        drop(series.response(Duration::from_millis(3), resp));
    }

    fn text(r: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, r).unwrap();
        text
    }

    /// The value of the one line that starts with `metric{` and holds every label given.
    fn value(text: &str, metric: &str, labels: &[&str]) -> Option<f64> {
        let mut found = text.lines().filter(|l| {
            l.starts_with(&format!("{metric}{{")) && labels.iter().all(|x| l.contains(x))
        });
        let line = found.next()?;
        assert!(
            found.next().is_none(),
            "more than one series for {labels:?}:\n{text}"
        );
        line.rsplit(' ').next()?.parse().ok()
    }

    #[test]
    fn grpc_status_labels_from_the_network_take_only_known_values() {
        let mut r = Registry::default();
        let m = HttpMetrics::register(&mut r);
        let conn_series = ConnectionSeries::new(m.clone(), base());
        let series = conn_series.get(&DstService::default(), None, None);
        // An upstream outside the mesh answering with a new grpc-status each time.
        for i in 0..200 {
            let junk = format!("{i}-junk");
            respond(&series, 200, Some(&junk));
            respond(&series, 200, Some(&(1000 + i).to_string()));
        }
        respond(&series, 200, Some("16"));
        let t = text(&r);
        let series: std::collections::BTreeSet<&str> = t
            .lines()
            .filter(|l| l.starts_with("response_total{"))
            .filter_map(|l| l.split("grpc_status=\"").nth(1)?.split('"').next())
            .collect();
        assert_eq!(series, ["16", "unknown"].into(), "{t}");
        assert_eq!(
            value(&t, "response_total", &["grpc_status=\"unknown\""]),
            Some(400.0),
            "{t}"
        );
    }

    #[test]
    fn a_connections_requests_share_series_by_destination_and_peer() {
        let mut r = Registry::default();
        let m = HttpMetrics::register(&mut r);
        let conn_series = ConnectionSeries::new(m.clone(), base());
        let a = WorkloadIdentity::new("cluster.local", "shop", "api").unwrap();
        let b = WorkloadIdentity::new("cluster.local", "shop", "api-canary").unwrap();
        for (svc, peer, status, grpc) in [
            (api(), Some(&a), 200, None),
            (api(), Some(&a), 200, None),
            (api(), Some(&a), 503, None),
            (api(), Some(&b), 200, Some("14")),
            (DstService::default(), None, 200, None),
        ] {
            let series = conn_series.get(&svc, peer, None);
            series.request();
            respond(&series, status, grpc);
        }
        let t = text(&r);
        let to_a = [
            "dst_namespace=\"shop\",dst_service=\"api\"",
            "server_id=\"spiffe://cluster.local/ns/shop/sa/api\"",
            "tls=\"true\"",
        ];
        assert_eq!(value(&t, "request_total", &to_a), Some(3.0), "{t}");
        let ok_a = [
            &to_a[..],
            &["status_code=\"200\"", "classification=\"success\""],
        ]
        .concat();
        assert_eq!(value(&t, "response_total", &ok_a), Some(2.0), "{t}");
        let failed_a = [
            &to_a[..],
            &["status_code=\"503\"", "classification=\"failure\""],
        ]
        .concat();
        assert_eq!(value(&t, "response_total", &failed_a), Some(1.0), "{t}");
        assert_eq!(
            value(&t, "response_latency_ms_count", &to_a),
            Some(3.0),
            "{t}"
        );
        // Another endpoint identity behind the same Service is its own series; a gRPC
        // error status is a failure whatever the HTTP status.
        let grpc_b = [
            "sa/api-canary\"",
            "grpc_status=\"14\"",
            "classification=\"failure\"",
        ];
        assert_eq!(value(&t, "response_total", &grpc_b), Some(1.0), "{t}");
        assert_eq!(
            value(&t, "request_total", &["tls=\"no_identity\""]),
            Some(1.0),
            "{t}"
        );
        // A departed pod's series go, cached handles or not.
        m.forget_pod("shop", "web-0");
        assert!(!text(&r).contains("web-0"), "{}", text(&r));
    }
}
