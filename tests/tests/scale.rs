//! Discovery at scale (issue 10): a cluster of 100,000 pods on the local backend is
//! streamed, in chunks, to a node proxy whose discovery client keeps tonic's default
//! decode limit; the proxy becomes ready, and no message comes near the limit.
//!
//! The cluster: 1,000 nodes of 100 pods each; a Service with one EndpointSlice per ten
//! pods (10,000), one in ten of them in the namespace that is not meshed; and one wide
//! Service of 5,000 endpoints over 50 slices, the largest single resource (the chunks are
//! of 256 resources, so a message is as large as the resources it happens to hold).
//!
//! The cluster is written as 100 files, not one: the local backend's `parse_file` does
//! work per document for every object of the file read so far (quadratic in a file's
//! documents; ~120,000 documents in one file did not load in 15 minutes of a debug build).
//! The control plane starts on the namespaces alone and loads the files on its next poll.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use ambit_e2e::{http_get, metric_sum, node_token, ControlPlane, NodeProxy, NAMESPACES};
use bytes::{Buf, BufMut};
use std::fmt::Write as _;
use std::time::{Duration, Instant};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

const NODES: usize = 1_000;
const PODS_PER_NODE: usize = 100;
const PODS: usize = NODES * PODS_PER_NODE;
const PODS_PER_SERVICE: usize = 10;
const SERVICES: usize = PODS / PODS_PER_SERVICE;
/// Services per file.
const SERVICES_PER_FILE: usize = 100;
/// Endpoints of the wide Service, and per slice of it (the EndpointSlice controller's
/// default).
const WIDE_ENDPOINTS: usize = 5_000;
const WIDE_SLICE: usize = 100;
/// The largest message a client accepts: tonic's default, which the node proxy's
/// discovery client keeps (it sets no `max_decoding_message_size`).
const DECODE_LIMIT: usize = 4 << 20;
/// How long anything may take before the test fails rather than hangs: not a performance
/// threshold (a debug build on a shared machine).
const DEADLINE: Duration = Duration::from_secs(180);

fn node(n: usize) -> String {
    format!("node-{n:04}")
}

/// Pod `i` runs on node `i % NODES`, the `i / NODES`-th pod there, with an address from
/// that node's /24.
fn pod_ip(i: usize) -> String {
    let (n, slot) = (i % NODES, i / NODES);
    format!("10.{}.{}.{}", 1 + n / 256, n % 256, slot + 1)
}

/// Service `s` (pods `10 s .. 10 s + 9`, ServiceAccount `svc-<s>`): one in ten is in
/// `legacy`, not meshed.
fn namespace(s: usize) -> &'static str {
    if s % 10 == 9 {
        "legacy"
    } else {
        "shop"
    }
}

fn pod_name(i: usize) -> String {
    let s = i / PODS_PER_SERVICE;
    format!("svc-{s}-7d9f8-{i}")
}

/// An EndpointSlice entry for pod `i`.
fn endpoint(i: usize) -> String {
    let (ip, ns, name, n) = (
        pod_ip(i),
        namespace(i / PODS_PER_SERVICE),
        pod_name(i),
        node(i % NODES),
    );
    format!("{{addresses: [{ip}], conditions: {{ready: true}}, nodeName: {n}, targetRef: {{kind: Pod, name: {name}, namespace: {ns}}}}}")
}

/// Services `first..first + SERVICES_PER_FILE`: each one's pods (a Deployment's: owner,
/// labels, ServiceAccount, Ready), the Service and its EndpointSlice.
fn services_file(first: usize) -> String {
    let mut y = String::with_capacity(SERVICES_PER_FILE * PODS_PER_SERVICE * 800);
    for s in first..first + SERVICES_PER_FILE {
        let ns = namespace(s);
        let pods = s * PODS_PER_SERVICE..(s + 1) * PODS_PER_SERVICE;
        for i in pods.clone() {
            let (name, ip, n) = (pod_name(i), pod_ip(i), node(i % NODES));
            write!(
                y,
                "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}, uid: {i:08x}-7d9f-4c3d-8e4f-{s:012x}, labels: {{app: svc-{s}, pod-template-hash: 7d9f8}}, ownerReferences: [{{apiVersion: apps/v1, kind: ReplicaSet, name: svc-{s}-7d9f8, uid: {s:08x}-0000-4000-8000-000000000000, controller: true}}]}}\nspec: {{nodeName: {n}, serviceAccountName: svc-{s}, containers: [{{name: app, image: app:1}}]}}\nstatus: {{phase: Running, podIP: {ip}, podIPs: [{{ip: {ip}}}], conditions: [{{type: Ready, status: \"True\"}}]}}\n"
            )
            .unwrap();
        }
        let endpoints: Vec<String> = pods.map(endpoint).collect();
        write!(
            y,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc-{s}, namespace: {ns}}}\nspec: {{clusterIP: 10.96.{}.{}, selector: {{app: svc-{s}}}, ports: [{{name: http, port: 80, targetPort: http}}]}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: svc-{s}-abcde, namespace: {ns}, labels: {{kubernetes.io/service-name: svc-{s}}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints: [{}]\n",
            s / 250,
            s % 250 + 1,
            endpoints.join(", ")
        )
        .unwrap();
    }
    y
}

/// The wide Service `shop/all`: the first `WIDE_ENDPOINTS` pods of `shop`, in slices of
/// `WIDE_SLICE`.
fn wide_service_file() -> String {
    let mut y = String::from("apiVersion: v1\nkind: Service\nmetadata: {name: all, namespace: shop}\nspec: {clusterIP: 10.95.0.1, ports: [{name: http, port: 80, targetPort: http}]}\n");
    let pods: Vec<usize> = (0..PODS)
        .filter(|i| namespace(i / PODS_PER_SERVICE) == "shop")
        .take(WIDE_ENDPOINTS)
        .collect();
    for (k, slice) in pods.chunks(WIDE_SLICE).enumerate() {
        let endpoints: Vec<String> = slice.iter().copied().map(endpoint).collect();
        write!(
            y,
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: all-{k}, namespace: shop, labels: {{kubernetes.io/service-name: all}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints: [{}]\n",
            endpoints.join(", ")
        )
        .unwrap();
    }
    y
}

/// Writes the cluster beside the control plane's directory, then moves it in at once (a
/// poll never sees half of it).
fn write_cluster(cp: &ControlPlane) -> usize {
    let staging = cp.dir.path().join("staging");
    std::fs::create_dir(&staging).unwrap();
    let mut bytes = 0;
    for first in (0..SERVICES).step_by(SERVICES_PER_FILE) {
        let y = services_file(first);
        bytes += y.len();
        std::fs::write(staging.join(format!("services-{first:05}.yaml")), y).unwrap();
    }
    let y = wide_service_file();
    bytes += y.len();
    std::fs::write(staging.join("wide.yaml"), y).unwrap();
    std::fs::rename(&staging, cp.dir.path().join("cluster/scale")).unwrap();
    bytes
}

/// A discovery message as it came off the wire: its encoded size, and the fields of
/// `Update` the test needs, read by hand (this crate has no protobuf runtime; the size is
/// the one tonic compares with the decode limit).
#[derive(Debug)]
struct RawUpdate {
    len: usize,
    snapshot: bool,
    more: bool,
    workloads: usize,
    services: usize,
}

/// A varint at the start of `b`, and what follows it.
fn varint(mut b: &[u8]) -> Option<(u64, &[u8])> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = b.split_first()?;
        b = rest;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some((v, b));
        }
    }
    None
}

/// The top-level fields of an `Update` (ambit.discovery.v1): 1 snapshot, 2 workloads,
/// 4 services, 6 more; others skipped.
fn raw_update(mut b: &[u8]) -> Option<RawUpdate> {
    let mut u = RawUpdate {
        len: b.len(),
        snapshot: false,
        more: false,
        workloads: 0,
        services: 0,
    };
    while !b.is_empty() {
        let (key, rest) = varint(b)?;
        b = rest;
        match key & 7 {
            0 => {
                let (v, rest) = varint(b)?;
                b = rest;
                match key >> 3 {
                    1 => u.snapshot = v != 0,
                    6 => u.more = v != 0,
                    _ => {}
                }
            }
            2 => {
                let (len, rest) = varint(b)?;
                b = rest.get(usize::try_from(len).ok()?..)?;
                match key >> 3 {
                    2 => u.workloads += 1,
                    4 => u.services += 1,
                    _ => {}
                }
            }
            _ => return None,
        }
    }
    Some(u)
}

/// Sends a `WatchRequest` (its node name) and yields each message undecoded.
#[derive(Clone, Copy, Debug, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = String;
    type Decode = RawUpdate;
    type Encoder = Self;
    type Decoder = Self;
    fn encoder(&mut self) -> Self {
        Self
    }
    fn decoder(&mut self) -> Self {
        Self
    }
}

impl Encoder for RawCodec {
    type Item = String;
    type Error = tonic::Status;
    fn encode(&mut self, node: String, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        // WatchRequest { node = 1 }: key, length, bytes (a node name is far below 128).
        dst.put_u8(0x0a);
        dst.put_u8(u8::try_from(node.len()).map_err(|_| tonic::Status::internal("long name"))?);
        dst.put_slice(node.as_bytes());
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = RawUpdate;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<RawUpdate>, tonic::Status> {
        let bytes = src.copy_to_bytes(src.remaining());
        raw_update(&bytes)
            .map(Some)
            .ok_or_else(|| tonic::Status::internal("not an Update"))
    }
}

/// Opens a stream for `node` with the proxy's decode limit and reads one whole snapshot.
async fn raw_snapshot(cp: &ControlPlane, node: &str) -> Vec<RawUpdate> {
    let mut grpc = tonic::client::Grpc::new(cp.channel(&cp.discovery_url()))
        .max_decoding_message_size(DECODE_LIMIT);
    grpc.ready().await.unwrap();
    let mut req = tonic::Request::new(node.to_string());
    req.metadata_mut().insert(
        "authorization",
        format!("Bearer {}", node_token(node)).parse().unwrap(),
    );
    let path = http::uri::PathAndQuery::from_static("/ambit.discovery.v1.Discovery/Watch");
    let mut stream = grpc
        .server_streaming(req, path, RawCodec)
        .await
        .unwrap()
        .into_inner();
    let mut chunks = Vec::new();
    loop {
        let u = stream
            .message()
            .await
            .unwrap_or_else(|s| panic!("after {} messages: {s:?}", chunks.len()))
            .expect("the stream ended inside a snapshot");
        assert_eq!(
            u.snapshot,
            chunks.is_empty(),
            "only the first is marked snapshot"
        );
        let more = u.more;
        chunks.push(u);
        if !more {
            return chunks;
        }
    }
}

/// Polls `done` until it succeeds; fails the test after [`DEADLINE`] with its last answer.
async fn wait(what: &str, mut done: impl AsyncFnMut() -> Result<(), String>) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        match done().await {
            Ok(()) => return,
            Err(why) if Instant::now() > deadline => {
                panic!("{what}: not within {DEADLINE:?}: {why}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_becomes_ready_with_100000_pods_in_the_cluster() {
    let started = Instant::now();
    let proxy_node = node(0);
    let early_node = node(1);
    let cp = ControlPlane::start(NAMESPACES, &[&proxy_node, &early_node]).await;
    // A proxy connected before the cluster loads: the load reaches it as one delta of the
    // whole cluster, which must come in chunks it can decode (30 MB in one message before).
    let early = NodeProxy::start(&cp, &early_node).await;

    let t = Instant::now();
    let bytes = write_cluster(&cp);
    eprintln!(
        "cluster written: {:.1} MB in {:.1?}",
        bytes as f64 / 1e6,
        t.elapsed()
    );
    let t = Instant::now();
    wait("the control plane loads the cluster", async || {
        let m = cp.metrics().await;
        let pods = metric_sum(&m, "local_objects", &["kind=\"Pod\""]);
        assert_eq!(
            metric_sum(&m, "local_reloads_total", &["failure"]),
            0,
            "{m}"
        );
        (pods == PODS as u64)
            .then_some(())
            .ok_or(format!("{pods} pods"))
    })
    .await;
    eprintln!("control plane loaded the cluster in {:.1?}", t.elapsed());

    // The publisher renders the loaded index after the reload: until then a stream gets
    // the namespaces-only rendering. This stream also measures what the proxy is sent.
    let t = Instant::now();
    let mut snapshot = Vec::new();
    wait("discovery serves the whole cluster", async || {
        snapshot = raw_snapshot(&cp, &proxy_node).await;
        let workloads: usize = snapshot.iter().map(|u| u.workloads).sum();
        (workloads == PODS)
            .then_some(())
            .ok_or(format!("{workloads} workloads"))
    })
    .await;
    let total: usize = snapshot.iter().map(|u| u.len).sum();
    let largest = snapshot.iter().map(|u| u.len).max().unwrap();
    let services: usize = snapshot.iter().map(|u| u.services).sum();
    eprintln!(
        "snapshot: {} messages, {total} bytes, largest {largest} bytes ({:.1?} to publish and read)",
        snapshot.len(),
        t.elapsed()
    );
    assert_eq!(services, SERVICES + 1);
    assert!(largest <= DECODE_LIMIT, "{largest} bytes");

    let t = Instant::now();
    let proxy = NodeProxy::spawn(&cp, &proxy_node).await;
    wait("the proxy is ready", async || {
        match http_get(proxy.admin_addr, "/ready").await {
            (200, _) => Ok(()),
            (code, body) => Err(format!("{code} {body}")),
        }
    })
    .await;
    eprintln!("proxy ready in {:.1?}", t.elapsed());

    let dump: serde_json::Value =
        serde_json::from_str(&http_get(proxy.admin_addr, "/config_dump").await.1).unwrap();
    assert_eq!(dump["discovery"]["synced"], true, "{}", dump["discovery"]);
    assert_eq!(
        dump["discovery"]["workloads"], PODS,
        "{}",
        dump["discovery"]
    );
    // Its pods (100, of 100 Services in `shop`) name no netns: not served, but each
    // identity has its certificate (what /ready waited for).
    let ids = dump["identities"].as_array().unwrap();
    assert_eq!(ids.len(), PODS_PER_NODE, "{}", dump["identities"]);
    assert!(ids.iter().all(|i| i["cert_not_after_unix"].is_u64()));

    let m = proxy.metrics().await;
    assert_eq!(metric_sum(&m, "discovery_reconnects_total", &[]), 0, "{m}");
    assert_eq!(
        metric_sum(&m, "discovery_invalid_resources_total", &[]),
        0,
        "{m}"
    );
    assert_eq!(metric_sum(&m, "discovery_connected", &[]), 1, "{m}");
    // Every message of its snapshot arrived and decoded: as many as the raw stream's.
    assert_eq!(
        metric_sum(&m, "discovery_updates_total", &[]),
        snapshot.len() as u64,
        "{m}"
    );
    let c = cp.metrics().await;
    assert_eq!(
        metric_sum(&c, "discovery_stream_resyncs_total", &[]),
        0,
        "{c}"
    );
    // The early proxy got the whole cluster as a (chunked) delta, without reconnecting.
    wait("the early proxy holds the whole cluster", async || {
        let dump: serde_json::Value =
            serde_json::from_str(&http_get(early.admin_addr, "/config_dump").await.1)
                .map_err(|e| e.to_string())?;
        (dump["discovery"]["workloads"] == PODS)
            .then_some(())
            .ok_or(format!("{}", dump["discovery"]))
    })
    .await;
    let m = early.metrics().await;
    assert_eq!(metric_sum(&m, "discovery_reconnects_total", &[]), 0, "{m}");
    assert_eq!(
        metric_sum(&m, "discovery_invalid_resources_total", &[]),
        0,
        "{m}"
    );
    eprintln!("total {:.1?}", started.elapsed());
    early.stop().await;
    proxy.stop().await;
    cp.stop().await;
}
