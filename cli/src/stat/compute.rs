//! From two scrapes of the node proxies to one row per workload, pod or namespace: what
//! PromQL computes over the same two samples of each series.
//!
//! - An increase is `after − before`; a decrease means the counter was reset (the proxy
//!   restarted) and the increase is `after`, as `rate` / `increase` count it. Prometheus
//!   extrapolates a range's increase to the range's ends; with the two samples at the
//!   window's ends there is nothing to extrapolate, so its `rate` is increase / window.
//! - A series only in the second scrape of a proxy that answered both counts from 0: the
//!   proxy creates a series at its first event (and drops a departed pod's), so it was 0
//!   before. (Prometheus needs two samples of a series and would skip it — unless it
//!   ingests created timestamps as zeros.) A proxy that answered only one scrape is left
//!   out: every counter of it would look new.
//! - SUCCESS = increase of `response_total{classification="success"}` / increase of
//!   `response_total`; RPS = increase of `request_total` / window; LATENCY_Pxx =
//!   `histogram_quantile(q, sum by (le) (increase(response_latency_ms_bucket)))`; TCP_CONN
//!   = `tcp_open_connections` now; READ/WRITE = byte counters' increase / window (the proxy
//!   adds a connection's bytes when it closes); TLS = the share of requests over mTLS (of
//!   connections opened, for TCP-only traffic).
//! - Without `--from` / `--to`, a row counts the inbound series of its pods (as Linkerd: the
//!   server's view). `--from X`: the outbound series of X's pods, one row per destination;
//!   `--to X`: the outbound series whose destination is X, one row per client.

use super::parse::{Labels, Sample};
use super::quantile::histogram_quantile;
use super::traffic::{Direction, Directory, Peer, Traffic};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

/// The kinds of rows `ambit stat` shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    /// A workload (a Deployment, StatefulSet, … — the proxies' `workload` label).
    Deploy,
    /// A pod.
    Pod,
    /// A namespace.
    Namespace,
}

impl Resource {
    /// `deploy` (`deployment`, `deployments`, `workload`), `pod` (`po`, `pods`), `ns`
    /// (`namespace`, `namespaces`).
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "deploy" | "deployment" | "deployments" | "workload" | "workloads" => {
                Ok(Resource::Deploy)
            }
            "pod" | "po" | "pods" => Ok(Resource::Pod),
            "ns" | "namespace" | "namespaces" => Ok(Resource::Namespace),
            _ => Err(format!(
                "{s:?} is not a resource type: use deploy, pod or ns (e.g. `ambit stat deploy` or `--to deploy/web`)"
            )),
        }
    }

    /// The short name rows carry.
    pub fn kind(self) -> &'static str {
        match self {
            Resource::Deploy => "deploy",
            Resource::Pod => "pod",
            Resource::Namespace => "ns",
        }
    }
}

/// The resource of `--from` / `--to`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Its type.
    pub resource: Resource,
    /// Its name.
    pub name: String,
    /// Its namespace (any when `None`; not used for a namespace).
    pub namespace: Option<String>,
}

impl Target {
    /// `TYPE/NAME` (`deploy/web`, `pod/web-0`, `ns/shop`).
    pub fn parse(s: &str, namespace: Option<String>) -> Result<Self, String> {
        let (kind, name) = s
            .split_once('/')
            .filter(|(_, n)| !n.is_empty() && !n.contains('/'))
            .ok_or_else(|| format!("{s:?}: expected TYPE/NAME, e.g. deploy/web or ns/shop"))?;
        Ok(Self {
            resource: Resource::parse(kind)?,
            name: name.to_string(),
            namespace,
        })
    }

    /// Whether the local pod of `t` belongs to this resource.
    fn holds(&self, t: &Traffic) -> bool {
        let ns_ok = self.namespace.as_deref().is_none_or(|n| n == t.namespace);
        match self.resource {
            Resource::Deploy => ns_ok && t.workload == self.name,
            Resource::Pod => ns_ok && t.pod == self.name,
            Resource::Namespace => t.namespace == self.name,
        }
    }

    /// Whether `peer` is (in) this resource.
    fn is(&self, peer: &Peer) -> bool {
        let ns_ok = self
            .namespace
            .as_deref()
            .is_none_or(|n| n == peer.namespace());
        match self.resource {
            Resource::Deploy => {
                matches!(peer, Peer::Workload { name, .. } if *name == self.name) && ns_ok
            }
            // A destination's pod is not recorded (refused by `Selection::check`).
            Resource::Pod => false,
            Resource::Namespace => peer.namespace() == self.name,
        }
    }
}

/// Whose traffic a row counts.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum Edge {
    /// Everything the row's pods receive.
    #[default]
    All,
    /// What X's pods send, by destination.
    From(Target),
    /// What is sent to X, by client.
    To(Target),
}

/// What `ambit stat` shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selection {
    /// The kind of rows.
    pub resource: Resource,
    /// Only the row of this name.
    pub name: Option<String>,
    /// Only rows in this namespace.
    pub namespace: Option<String>,
    /// `--from` / `--to`.
    pub edge: Edge,
}

impl Selection {
    /// Refuses what the metrics cannot answer, saying why and what to use instead.
    pub fn check(&self) -> Result<(), String> {
        match &self.edge {
            Edge::From(_) if self.resource == Resource::Pod => Err(
                "`stat pod --from …` needs the destination pod, which the proxies do not record on the client side; use `stat deploy --from …` (or `stat pod` without --from for each pod's inbound traffic)"
                    .into(),
            ),
            Edge::To(t) if t.resource == Resource::Pod => Err(
                "`--to pod/NAME` needs the destination pod, which the proxies do not record on the client side; use `--to deploy/NAME`"
                    .into(),
            ),
            _ => Ok(()),
        }
    }

    /// The row a series counts in, if any.
    fn row_of(&self, t: &Traffic, dir: &Directory) -> Option<Key> {
        let key = match &self.edge {
            Edge::All => (t.direction == Direction::Inbound).then(|| Key::local(self.resource, t)),
            Edge::From(x) => (t.direction == Direction::Outbound && x.holds(t))
                .then(|| Key::peer(self.resource, &dir.server(t))),
            Edge::To(x) => (t.direction == Direction::Outbound && x.is(&dir.server(t)))
                .then(|| Key::local(self.resource, t)),
        }?;
        self.keeps(&key).then_some(key)
    }

    fn keeps(&self, key: &Key) -> bool {
        self.namespace.as_deref().is_none_or(|n| n == key.namespace)
            && self.name.as_deref().is_none_or(|n| n == key.name)
    }
}

/// A row's identity: sorted by namespace, then name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    namespace: String,
    name: String,
    kind: &'static str,
}

impl Key {
    /// The row of the local pod of `t`.
    fn local(r: Resource, t: &Traffic) -> Self {
        let name = match r {
            Resource::Deploy => &t.workload,
            Resource::Pod => &t.pod,
            Resource::Namespace => &t.namespace,
        };
        Self {
            namespace: t.namespace.clone(),
            name: name.clone(),
            kind: r.kind(),
        }
    }

    /// The row of a peer.
    fn peer(r: Resource, p: &Peer) -> Self {
        match r {
            Resource::Namespace if !p.namespace().is_empty() => Self {
                namespace: p.namespace().into(),
                name: p.namespace().into(),
                kind: "ns",
            },
            _ => Self {
                namespace: p.namespace().into(),
                name: p.name().into(),
                kind: p.kind(),
            },
        }
    }
}

/// The metrics of the proxies that answered one scrape, by admin URL.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Each proxy's samples.
    pub proxies: BTreeMap<String, Vec<Sample>>,
}

/// One row of `ambit stat`; `-o json` prints it with `linkerd viz stat -o json`'s keys
/// first (see the `Serialize` below), so that jq scripts written for Linkerd work.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// `deploy`, `pod`, `ns`; with `--from`, a destination that is no workload the
    /// proxies report: `svc` (a Service), `sa` (an identity), `unknown`.
    pub resource: &'static str,
    /// Its namespace ("" when unknown).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Pods with metrics (`null` for a `svc` / `sa` / `unknown` row).
    pub meshed_pods: Option<usize>,
    /// Pods in all: only meshed pods are seen here, so the same as `meshed_pods`.
    pub pods: Option<usize>,
    /// Requests in the window.
    pub requests: f64,
    /// Successful responses / responses (`null` without responses).
    pub success_rate: Option<f64>,
    /// Requests per second.
    pub rps: f64,
    /// Latency quantiles in milliseconds (`null` without responses).
    pub latency_ms_p50: Option<f64>,
    /// 95th percentile.
    pub latency_ms_p95: Option<f64>,
    /// 99th percentile.
    pub latency_ms_p99: Option<f64>,
    /// TCP connections open now.
    pub tcp_connections: f64,
    /// Bytes per second read from clients (closed connections).
    pub read_bytes_per_sec: f64,
    /// Bytes per second written to clients (closed connections).
    pub write_bytes_per_sec: f64,
    /// The share of requests (or, without requests, of connections opened) over mTLS
    /// (`null` without either).
    pub tls_share: Option<f64>,
}

/// Linkerd's `kind` for a row's `resource`.
fn linkerd_kind(resource: &str) -> &str {
    match resource {
        "deploy" => "deployment",
        "ns" => "namespace",
        "svc" => "service",
        "sa" => "serviceaccount",
        "sts" => "statefulset",
        "ds" => "daemonset",
        other => other,
    }
}

impl Serialize for Row {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut m = s.serialize_struct("Row", 16)?;
        // Linkerd's keys, in its order.
        m.serialize_field("namespace", &self.namespace)?;
        m.serialize_field("kind", linkerd_kind(self.resource))?;
        m.serialize_field("name", &self.name)?;
        let meshed = self
            .meshed_pods
            .zip(self.pods)
            .map(|(m, p)| format!("{m}/{p}"));
        m.serialize_field("meshed", &meshed)?;
        m.serialize_field("success", &self.success_rate)?;
        m.serialize_field("rps", &self.rps)?;
        m.serialize_field("latency_ms_p50", &self.latency_ms_p50)?;
        m.serialize_field("latency_ms_p95", &self.latency_ms_p95)?;
        m.serialize_field("latency_ms_p99", &self.latency_ms_p99)?;
        m.serialize_field("tcp_open_connections", &self.tcp_connections)?;
        m.serialize_field("tcp_read_bytes_rate", &self.read_bytes_per_sec)?;
        m.serialize_field("tcp_write_bytes_rate", &self.write_bytes_per_sec)?;
        // Ambit's.
        m.serialize_field("resource", self.resource)?;
        m.serialize_field("meshed_pods", &self.meshed_pods)?;
        m.serialize_field("pods", &self.pods)?;
        m.serialize_field("requests", &self.requests)?;
        m.serialize_field("tls_share", &self.tls_share)?;
        m.end()
    }
}

#[derive(Debug, Default)]
struct Acc {
    requests: f64,
    tls_requests: f64,
    responses: f64,
    successes: f64,
    /// (upper bound, increase) of every bucket series.
    buckets: Vec<(f64, f64)>,
    open_now: f64,
    opened: f64,
    tls_opened: f64,
    read: f64,
    written: f64,
}

/// What PromQL's `increase` counts between two samples of a counter.
pub fn increase(before: Option<f64>, after: f64) -> f64 {
    match before {
        Some(b) if after >= b => after - b,
        // A reset (or a series that did not exist yet): all of `after` is new.
        _ => after,
    }
}

/// The rows of `sel` over `window`, from the proxies that answered both scrapes.
pub fn compute(before: &Snapshot, after: &Snapshot, window: Duration, sel: &Selection) -> Vec<Row> {
    let secs = window.as_secs_f64().max(f64::MIN_POSITIVE);
    let both: Vec<(&Vec<Sample>, &Vec<Sample>)> = after
        .proxies
        .iter()
        .filter_map(|(url, a)| before.proxies.get(url).map(|b| (b, a)))
        .collect();
    let dir = Directory::of(both.iter().flat_map(|(_, a)| a.iter()));
    let mut rows: BTreeMap<Key, Acc> = BTreeMap::new();
    if sel.edge == Edge::All {
        // Every resource with metrics has a row, with traffic in the window or not.
        let mut keys = BTreeSet::new();
        for ((ns, pod), workload) in dir.pods() {
            let name = match sel.resource {
                Resource::Deploy => workload,
                Resource::Pod => pod,
                Resource::Namespace => ns,
            };
            keys.insert(Key {
                namespace: ns.clone(),
                name: name.clone(),
                kind: sel.resource.kind(),
            });
        }
        for k in keys.into_iter().filter(|k| sel.keeps(k)) {
            rows.entry(k).or_default();
        }
    }
    for (before, after) in both {
        let prev: HashMap<(&str, &Labels), f64> = before
            .iter()
            .map(|s| ((s.name.as_str(), &s.labels), s.value))
            .collect();
        for s in after {
            let Some(t) = Traffic::of(s) else { continue };
            let Some(key) = sel.row_of(&t, &dir) else {
                continue;
            };
            let inc = increase(prev.get(&(s.name.as_str(), &s.labels)).copied(), s.value);
            let acc = rows.entry(key).or_default();
            match s.name.as_str() {
                "request_total" => {
                    acc.requests += inc;
                    if t.tls {
                        acc.tls_requests += inc;
                    }
                }
                "response_total" => {
                    acc.responses += inc;
                    if s.label("classification") == "success" {
                        acc.successes += inc;
                    }
                }
                "response_latency_ms_bucket" => {
                    if let Some(le) = super::parse::parse_value(s.label("le")) {
                        acc.buckets.push((le, inc));
                    }
                }
                "tcp_open_connections" => acc.open_now += s.value,
                // An application's HTTP connection has no `tls` of its own (its requests
                // have): not in the share of connections over mTLS.
                "tcp_open_total" if !s.label("tls").is_empty() => {
                    acc.opened += inc;
                    if t.tls {
                        acc.tls_opened += inc;
                    }
                }
                "tcp_read_bytes_total" => acc.read += inc,
                "tcp_write_bytes_total" => acc.written += inc,
                _ => {}
            }
        }
    }
    rows.into_iter()
        .map(|(key, acc)| {
            let pods = match key.kind {
                "deploy" => Some(dir.pod_count(&key.namespace, Some(&key.name))),
                "pod" => Some(1),
                "ns" => Some(dir.pod_count(&key.namespace, None)),
                _ => None,
            };
            let q = |q: f64| histogram_quantile(q, &acc.buckets);
            Row {
                resource: key.kind,
                meshed_pods: pods,
                pods,
                requests: acc.requests,
                success_rate: (acc.responses > 0.0).then(|| acc.successes / acc.responses),
                rps: acc.requests / secs,
                latency_ms_p50: q(0.5),
                latency_ms_p95: q(0.95),
                latency_ms_p99: q(0.99),
                tcp_connections: acc.open_now,
                read_bytes_per_sec: acc.read / secs,
                write_bytes_per_sec: acc.written / secs,
                tls_share: if acc.requests > 0.0 {
                    Some(acc.tls_requests / acc.requests)
                } else if acc.opened > 0.0 {
                    Some(acc.tls_opened / acc.opened)
                } else {
                    None
                },
                namespace: key.namespace,
                name: key.name,
            }
        })
        .collect()
}
