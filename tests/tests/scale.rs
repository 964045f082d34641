//! Discovery at scale (issues 10 and 22): in a cluster of 100,000 pods on the local
//! backend, a node proxy is sent its own node's pods and what it subscribes to — not the
//! cluster; it becomes ready; no message comes near the decode limit; a Service of 5,000
//! endpoints is sent whole once, and one endpoint's change as a delta of that endpoint.
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

use ambit_api::proto::discovery as pb;
use ambit_api::proto::discovery::discovery_client::DiscoveryClient;
use ambit_e2e::{http_get, metric_sum, ControlPlane, NodeProxy, NAMESPACES};
use prost::Message;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

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
/// The largest message a client accepts here: tonic's default, a quarter of what the node
/// proxy's discovery client takes (`MAX_MESSAGE`, 16 MiB).
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

/// A stream's snapshot (each message as decoded, with its encoded size), the stream, and
/// where its requests go.
type Watch = (
    Vec<(usize, pb::Update)>,
    tonic::Streaming<pb::Update>,
    tokio::sync::mpsc::Sender<pb::WatchRequest>,
);

/// Opens `node`'s discovery stream subscribed to `subscribe`, as its proxy does, and
/// reads its snapshot. An error is what the proxy would retry on (a watch answered after
/// the channel's timeout while a reload renders, a stream ended).
async fn open_watch(cp: &ControlPlane, node: &str, subscribe: &[&str]) -> Result<Watch, String> {
    let mut client = DiscoveryClient::new(cp.channel(&cp.discovery_url()))
        .max_decoding_message_size(DECODE_LIMIT);
    let (req, requests) = ambit_e2e::discovery::watch_request(node, Some(node), subscribe);
    let mut stream = client
        .watch(req)
        .await
        .map_err(|s| format!("watch: {s}"))?
        .into_inner();
    let mut chunks = Vec::new();
    loop {
        let u = stream
            .message()
            .await
            .map_err(|s| format!("snapshot: {s}"))?
            .ok_or("the stream ended in its snapshot")?;
        let more = u.more;
        chunks.push((u.encoded_len(), u));
        if !more {
            return Ok((chunks, stream, requests));
        }
    }
}

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
    // A proxy connected before the cluster loads: the load reaches it as deltas of its
    // node's pods.
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

    // The node's stream: its 100 pods, and the wide Service it subscribes to (sent
    // whole once), nothing else of the cluster. Until the reload is rendered a stream sees
    // the namespaces alone: wait for the node's pods.
    let t = Instant::now();
    let mut snapshot = Vec::new();
    let mut watch = None;
    wait("discovery serves the node's pods", async || {
        let (chunks, stream, requests) = open_watch(&cp, &proxy_node, &["10.95.0.1"]).await?;
        let workloads: usize = chunks.iter().map(|(_, u)| u.workloads.len()).sum();
        snapshot = chunks;
        watch = Some((stream, requests));
        (workloads == PODS_PER_NODE)
            .then_some(())
            .ok_or(format!("{workloads} workloads"))
    })
    .await;
    let total: usize = snapshot.iter().map(|(n, _)| *n).sum();
    let largest = snapshot.iter().map(|(n, _)| *n).max().unwrap();
    eprintln!(
        "node snapshot: {} messages, {total} bytes, largest {largest} bytes ({:.1?} to publish and read)",
        snapshot.len(),
        t.elapsed()
    );
    let workloads: Vec<&pb::Workload> = snapshot.iter().flat_map(|(_, u)| &u.workloads).collect();
    assert!(
        workloads.iter().all(|w| w.node == proxy_node),
        "a node's stream holds no other node's pods"
    );
    let services: Vec<&pb::Service> = snapshot.iter().flat_map(|(_, u)| &u.services).collect();
    assert_eq!(services.len(), 1, "only the Service subscribed to");
    assert_eq!(services[0].endpoints.len(), WIDE_ENDPOINTS);
    assert!(largest <= DECODE_LIMIT, "{largest} bytes");

    // One pod of the wide Service churns (its slice marks it not ready): the subscriber
    // is sent that endpoint, not the Service's 5,000.
    let (mut stream, _requests) = watch.take().unwrap();
    let unready =
        wide_service_file().replacen("conditions: {ready: true}", "conditions: {ready: false}", 1);
    std::fs::write(cp.dir.path().join("cluster/scale/wide.yaml"), unready).unwrap();
    let delta = tokio::time::timeout(DEADLINE, stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    eprintln!("endpoint delta: {} bytes", delta.encoded_len());
    assert!(
        delta.services.is_empty() && delta.workloads.is_empty(),
        "{delta:?}"
    );
    assert_eq!(delta.endpoint_deltas.len(), 1, "{delta:?}");
    assert_eq!(delta.endpoint_deltas[0].upserted.len(), 1, "{delta:?}");
    assert!(!delta.endpoint_deltas[0].upserted[0].ready);

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
        dump["discovery"]["workloads"], PODS_PER_NODE,
        "its own pods, not the cluster's: {}",
        dump["discovery"]
    );
    assert_eq!(dump["discovery"]["services"], 0, "{}", dump["discovery"]);
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
    let c = cp.metrics().await;
    assert_eq!(
        metric_sum(&c, "discovery_stream_resyncs_total", &[]),
        0,
        "{c}"
    );
    // The early proxy, connected before the cluster loaded, got its node's pods as a
    // delta, without reconnecting.
    wait("the early proxy holds its node's pods", async || {
        let dump: serde_json::Value =
            serde_json::from_str(&http_get(early.admin_addr, "/config_dump").await.1)
                .map_err(|e| e.to_string())?;
        (dump["discovery"]["workloads"] == PODS_PER_NODE)
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
