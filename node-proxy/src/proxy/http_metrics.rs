//! HTTP golden metrics, with Linkerd's names: requests, responses by status and
//! classification (gRPC status included), latency.

use super::body::{Body, BoxError};
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// Latency buckets in milliseconds, as Linkerd's.
const BUCKETS_MS: [f64; 25] = [
    1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 100.0, 200.0, 300.0, 400.0, 500.0,
    1000.0, 2000.0, 3000.0, 4000.0, 5000.0, 10000.0, 20000.0, 30000.0, 40000.0, 50000.0,
];

/// Labels of a request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    /// `inbound` or `outbound`.
    pub direction: String,
    /// The local pod's namespace.
    pub namespace: String,
    /// The local pod.
    pub pod: String,
    /// The local pod's workload.
    pub workload: String,
    /// Inbound: the client's proven identity ("" without mTLS).
    pub client_id: String,
    /// Outbound: the server's proven identity ("" without mTLS).
    pub server_id: String,
    /// `true` or `no_identity`.
    pub tls: String,
    /// The destination Service as `<name>.<namespace>`, when the request went to one.
    pub dst_service: String,
}

/// Labels of a response.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResponseLabels {
    #[prometheus(flatten)]
    base: HttpLabels,
    status_code: String,
    classification: String,
    grpc_status: String,
}

type LatencyFamily = Family<HttpLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(BUCKETS_MS)
}

/// HTTP metrics.
#[derive(Clone, Debug)]
pub struct HttpMetrics {
    series: super::metrics::SeriesTracker<HttpLabels>,
    response_series: super::metrics::SeriesTracker<ResponseLabels>,
    requests: Family<HttpLabels, Counter>,
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

    /// A request started.
    pub fn request(&self, l: &HttpLabels) {
        self.series.track(&l.namespace, &l.pod, l);
        self.requests.get_or_create(l).inc();
    }

    /// Response headers arrived after `elapsed`; the body is wrapped so that the response
    /// is counted, with its gRPC status, when it ends.
    pub fn response(
        &self,
        l: HttpLabels,
        elapsed: Duration,
        resp: http::Response<Body>,
    ) -> http::Response<Body> {
        self.latency
            .get_or_create(&l)
            .observe(elapsed.as_secs_f64() * 1000.0);
        let status = resp.status();
        let grpc = resp
            .headers()
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let (parts, body) = resp.into_parts();
        let observed = Observed {
            inner: body,
            finish: Some(Finish {
                metrics: self.clone(),
                labels: l,
                status,
                grpc,
            }),
        };
        http::Response::from_parts(parts, observed.boxed())
    }
}

struct Finish {
    metrics: HttpMetrics,
    labels: HttpLabels,
    status: http::StatusCode,
    grpc: Option<String>,
}

impl Finish {
    fn record(self) {
        let failed =
            self.status.is_server_error() || self.grpc.as_deref().is_some_and(|g| g != "0");
        let labels = ResponseLabels {
            base: self.labels,
            status_code: self.status.as_u16().to_string(),
            classification: if failed { "failure" } else { "success" }.into(),
            grpc_status: self.grpc.unwrap_or_default(),
        };
        self.metrics
            .response_series
            .track(&labels.base.namespace, &labels.base.pod, &labels);
        self.metrics.responses.get_or_create(&labels).inc();
    }
}

struct Observed {
    inner: Body,
    finish: Option<Finish>,
}

impl http_body::Body for Observed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(t) = frame.trailers_ref() {
                    if let (Some(f), Some(g)) = (self.finish.as_mut(), t.get("grpc-status")) {
                        f.grpc = g.to_str().ok().map(str::to_string);
                    }
                }
            }
            Poll::Ready(Some(Err(_))) => {
                if let Some(f) = self.finish.as_mut() {
                    // A body cut short is a failure whatever the status said.
                    f.status = http::StatusCode::BAD_GATEWAY;
                }
            }
            Poll::Ready(None) => {
                if let Some(f) = self.finish.take() {
                    f.record();
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Observed {
    fn drop(&mut self) {
        if let Some(f) = self.finish.take() {
            f.record();
        }
    }
}
