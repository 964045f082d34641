//! Discovery by need: what a pod change costs with many nodes and many pods, which
//! streams it reaches, what a node's stream holds, what the control plane holds in
//! memory, and what the first request to a destination a node has never seen waits.
//!
//! ```sh
//! cargo build --release -p ambit-bench -p ambit-control -p ambit-proxy
//! target/release/discovery-bench --pods 100000 --streams 5000 \
//!     --control-bin target/release/ambit-control --proxy-bin target/release/ambit-proxy
//! target/release/discovery-bench --pods 10000 --streams 500 \
//!     --control-bin target/release/ambit-control --proxy-bin target/release/ambit-proxy
//! ```
//!
//! The cluster: `--pods` meshed pods over `--streams` nodes (pod `i` on node `i %
//! streams`) and a Service with one EndpointSlice of ten endpoints per ten pods, written
//! as files of 1,000 pods into the control plane's directory (the local backend).
//! One discovery stream per node, each its own TLS connection and node token, each
//! subscribed to `--services-per-node` Services (the Services its pods call; chosen per
//! node, spread over the cluster's), with the node proxy's decode limit.
//!
//! Measurements:
//!
//! 1. What a node's snapshot holds (its pods, its Services with their endpoints): bytes
//!    and messages, median and largest over the streams.
//! 2. Changes, in process: an endpoint of a subscribed Service turns not ready (an
//!    EndpointSlice update), or a pod's address changes; the clock runs from the change in
//!    the index to each stream's update. Every stream that holds the object must receive
//!    it (latency p50/p99/max over them), and no other stream may receive anything (an
//!    extra half second is waited for strays).
//! 3. First request to a never-seen destination: a node subscribes to Services it never
//!    used, one at a time, through the node proxy's own code (`Subscriptions::wait`, what
//!    the data path awaits before it connects), while every other stream stays open.
//! 4. With `--control-bin`: the real `ambit-control` binary on the same cluster with the
//!    same streams connected; its VmRSS and VmHWM from `/proc`.
//! 5. With `--proxy-bin`: the real `ambit-proxy` binary of node 0 (its pods, no traffic)
//!    at rest against the in-process control plane: its VmRSS, and what its
//!    `/config_dump` says it holds.

use ambit_api::proto::discovery::discovery_client::DiscoveryClient as PbClient;
use ambit_api::proto::discovery::{Update, WatchRequest};
use ambit_control::index::{Kind, KubeObject};
use ambit_e2e::{http_get, node_token, ControlPlane};
use ambit_proxy::discovery::{
    DiscoveryClient, DiscoveryMetrics, DiscoveryState, Lookup, SubscriptionMetrics, Subscriptions,
    Target,
};
use anyhow::Context;
use clap::Parser;
use prost::Message;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

#[derive(Debug, Parser)]
struct Args {
    /// Pods in the cluster.
    #[arg(long, default_value_t = 10_000)]
    pods: usize,
    /// Discovery streams, one per simulated node.
    #[arg(long, default_value_t = 500)]
    streams: usize,
    /// Services each node's pods call (each stream subscribes to so many).
    #[arg(long, default_value_t = 20)]
    services_per_node: usize,
    /// Changes to time (alternately an endpoint's readiness and a pod's address).
    #[arg(long, default_value_t = 20)]
    changes: usize,
    /// First requests to never-seen destinations to time.
    #[arg(long, default_value_t = 500)]
    first_requests: usize,
    /// The release `ambit-control` binary, to measure its memory with the streams open.
    #[arg(long)]
    control_bin: Option<PathBuf>,
    /// The release `ambit-proxy` binary, to measure a node proxy's memory at rest.
    #[arg(long)]
    proxy_bin: Option<PathBuf>,
}

fn node(i: usize) -> String {
    format!("node-{i:04}")
}

/// The node whose stream times the first requests.
const PROBE_NODE: &str = "node-probe";

/// Pods per file of the cluster directory.
const PODS_PER_FILE: usize = 1000;

/// The node proxy's decode limit (`ambit_proxy::discovery` `MAX_MESSAGE`).
const DECODE_LIMIT: usize = 16 << 20;

/// Pod `i`'s address at first: unique up to 62,500 × 254 pods.
fn pod_ip(i: usize) -> String {
    format!("10.{}.{}.{}", i / 62_500 + 1, (i / 250) % 250, i % 250 + 1)
}

fn service_ip(s: usize) -> String {
    format!("10.96.{}.{}", s / 250, s % 250 + 1)
}

/// Pod `i`; a later `generation` moves it to another IP (a change discovery sends).
fn pod_yaml(i: usize, nodes: usize, generation: usize) -> String {
    let ip = match generation {
        0 => pod_ip(i),
        g => format!("10.250.{}.{}", g % 256, i % 250 + 1),
    };
    format!(
        "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: pod-{i}, namespace: shop}}\nspec: {{nodeName: {}, serviceAccountName: sa-{}, containers: []}}\nstatus: {{podIP: {ip}, phase: Running}}\n",
        node(i % nodes),
        i % 50,
    )
}

/// Service `s`'s EndpointSlice: its ten pods, `unready` among them not ready.
fn slice_yaml(s: usize, pods: usize, unready: Option<usize>) -> String {
    let endpoints: Vec<String> = (s * 10..(s * 10 + 10).min(pods))
        .map(|i| {
            let ready = if unready == Some(i) { "false" } else { "true" };
            format!(
                "{{addresses: [{}], conditions: {{ready: {ready}}}, targetRef: {{kind: Pod, name: pod-{i}, namespace: shop}}}}",
                pod_ip(i)
            )
        })
        .collect();
    format!(
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: svc-{s}-1, namespace: shop, labels: {{kubernetes.io/service-name: svc-{s}}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints: [{}]\n",
        endpoints.join(", ")
    )
}

/// The namespace, alone: the control plane starts on it.
const NAMESPACE: &str =
    "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop, annotations: {ambit.dev/mesh: enabled}}\n";

/// Pods `first..end`, and a Service per ten of them with one EndpointSlice.
fn cluster_part(first: usize, end: usize, pods: usize, nodes: usize) -> String {
    let mut y = String::new();
    for i in first..end {
        y.push_str(&pod_yaml(i, nodes, 0));
    }
    for s in first.div_ceil(10)..end.div_ceil(10) {
        y.push_str(&format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc-{s}, namespace: shop}}\nspec: {{clusterIP: {}, ports: [{{name: http, port: 80}}]}}\n",
            service_ip(s)
        ));
        y.push_str(&slice_yaml(s, pods, None));
    }
    y
}

/// Writes the cluster into `dir` as files of [`PODS_PER_FILE`] pods, moved in at once.
fn write_cluster(dir: &Path, pods: usize, nodes: usize) -> anyhow::Result<()> {
    let staging = dir.with_extension("staging");
    std::fs::create_dir(&staging)?;
    for first in (0..pods).step_by(PODS_PER_FILE) {
        let end = (first + PODS_PER_FILE).min(pods);
        std::fs::write(
            staging.join(format!("pods-{first:07}.yaml")),
            cluster_part(first, end, pods, nodes),
        )?;
    }
    std::fs::rename(&staging, dir.join("pods"))?;
    Ok(())
}

/// The Services node `n`'s pods call: spread over the cluster by a multiplicative hash.
fn services_of(n: usize, per_node: usize, services: usize) -> Vec<usize> {
    let mut out = BTreeSet::new();
    let mut k = 0usize;
    while out.len() < per_node.min(services) {
        out.insert((n.wrapping_mul(7919).wrapping_add(k.wrapping_mul(104_729))) % services);
        k += 1;
    }
    out.into_iter().collect()
}

fn object(yaml: &str) -> anyhow::Result<KubeObject> {
    let mut skipped = 0;
    Ok(
        ambit_control::local::parse_file(Path::new("change.yaml"), yaml, &mut skipped)?
            .remove(0)
            .object,
    )
}

/// A stream's report: which stream, when an update arrived.
type Arrival = (usize, Instant);

/// What opening a stream measured: its snapshot's bytes and messages, its largest message.
#[derive(Clone, Copy, Debug, Default)]
struct Snapshot {
    bytes: usize,
    messages: usize,
    largest: usize,
}

/// Opens one stream per node (64 opening at a time, as proxies rolling out would), each
/// subscribed to its Services; returns once every stream has its snapshot, with what each
/// snapshot held and a channel on which each stream reports each later update.
async fn open_streams(
    cp: &ControlPlane,
    addr: SocketAddr,
    n: usize,
    subscriptions: &[Vec<usize>],
) -> anyhow::Result<(Vec<Snapshot>, mpsc::UnboundedReceiver<Arrival>)> {
    let (arrivals, rx) = mpsc::unbounded_channel();
    let (ready_tx, mut ready_rx) = mpsc::channel::<anyhow::Result<(usize, Snapshot)>>(n);
    let opening = Arc::new(tokio::sync::Semaphore::new(64));
    for (i, services) in subscriptions.iter().enumerate().take(n) {
        let mut client = PbClient::new(cp.channel(&format!("https://{addr}")))
            .max_decoding_message_size(DECODE_LIMIT);
        let arrivals = arrivals.clone();
        let ready = ready_tx.clone();
        let opening = opening.clone();
        let subscribe: Vec<String> = services.iter().map(|s| service_ip(*s)).collect();
        tokio::spawn(async move {
            let (requests, rx) = mpsc::channel(1);
            let open = async {
                let _permit = opening.acquire().await?;
                requests
                    .send(WatchRequest {
                        node: node(i),
                        subscribe,
                        by_need: true,
                        ..WatchRequest::default()
                    })
                    .await?;
                let mut req = tonic::Request::new(ReceiverStream::new(rx));
                let header = format!("Bearer {}", node_token(&node(i)));
                req.metadata_mut()
                    .insert("authorization", header.parse().context("header")?);
                let mut stream = client.watch(req).await?.into_inner();
                let mut snap = Snapshot::default();
                // The snapshot comes in chunks; it is whole at the first without `more`.
                loop {
                    let u: Update = stream.message().await?.context("no snapshot")?;
                    let len = u.encoded_len();
                    snap.bytes += len;
                    snap.messages += 1;
                    snap.largest = snap.largest.max(len);
                    if !u.more {
                        break;
                    }
                }
                anyhow::Ok((stream, snap))
            };
            match open.await {
                Ok((mut stream, snap)) => {
                    let _ = ready.send(Ok((i, snap))).await;
                    while let Ok(Some(_)) = stream.message().await {
                        let _ = arrivals.send((i, Instant::now()));
                    }
                    drop(requests);
                }
                Err(e) => {
                    let _ = ready
                        .send(Err(e.context(format!("stream of {}", node(i)))))
                        .await;
                }
            }
        });
    }
    let mut snaps = vec![Snapshot::default(); n];
    for _ in 0..n {
        let (i, s) = tokio::time::timeout(Duration::from_secs(1800), ready_rx.recv())
            .await
            .context("streams did not all open within 30 minutes")?
            .context("a stream task ended")??;
        snaps[i] = s;
    }
    Ok((snaps, rx))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The figures of a set of latencies.
fn spread(mut d: Vec<Duration>) -> String {
    d.sort();
    format!(
        "p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (n = {})",
        ms(percentile(&d, 0.5)),
        ms(percentile(&d, 0.99)),
        ms(percentile(&d, 1.0)),
        d.len()
    )
}

/// Makes change `c` in the index and waits for the streams that hold what changed; the
/// latency of each, and how many other streams received something.
async fn time_change(
    cp: &ControlPlane,
    args: &Args,
    subscriptions: &[Vec<usize>],
    arrivals: &mut mpsc::UnboundedReceiver<Arrival>,
    c: usize,
) -> anyhow::Result<(Vec<Duration>, usize)> {
    let (obj, expected): (KubeObject, BTreeSet<usize>) = if c.is_multiple_of(2) {
        // An endpoint of a Service some node calls turns not ready, and at the next such
        // change ready again.
        let k = c / 2;
        let s = subscriptions[(k / 2 * 7) % args.streams][0];
        let unready = k.is_multiple_of(2).then_some(s * 10 + (k / 2) % 10);
        let expected = (0..args.streams)
            .filter(|n| subscriptions[*n].contains(&s))
            .collect();
        (object(&slice_yaml(s, args.pods, unready))?, expected)
    } else {
        // A pod moves to another address: its node's stream holds it (and no Service's
        // rendering changes: the slice still names the old address).
        let i = (c * 7_919) % args.pods;
        (
            object(&pod_yaml(i, args.streams, c))?,
            [i % args.streams].into(),
        )
    };
    while arrivals.try_recv().is_ok() {}
    let start = Instant::now();
    cp.index.apply(obj)?;
    let mut seen = BTreeSet::new();
    let mut latencies = Vec::new();
    let mut strays = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while seen.len() < expected.len() {
        let (i, at) = tokio::time::timeout_at(deadline, arrivals.recv())
            .await
            .with_context(|| {
                let missing: Vec<_> = expected.difference(&seen).collect();
                format!(
                    "change {c}: {} of {} subscribed streams did not receive it within 60 s ({missing:?}; {strays} strays)",
                    missing.len(),
                    expected.len()
                )
            })?
            .context("streams ended")?;
        if expected.contains(&i) {
            if seen.insert(i) {
                latencies.push(at - start);
            }
        } else {
            strays += 1;
        }
    }
    // Strays that come later.
    let late = tokio::time::Instant::now() + Duration::from_millis(500);
    while let Ok(Some((i, _))) = tokio::time::timeout_at(late, arrivals.recv()).await {
        if !expected.contains(&i) {
            strays += 1;
        }
    }
    Ok((latencies, strays))
}

/// A node that never called them subscribes to `n` Services one at a time through the
/// node proxy's discovery client, as its data path does on a first connection.
async fn first_requests(cp: &ControlPlane, args: &Args) -> anyhow::Result<Vec<Duration>> {
    let (tx, state) = watch::channel(Arc::new(DiscoveryState::default()));
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = DiscoveryMetrics::register(&mut registry);
    let subs = Subscriptions::new(SubscriptionMetrics::register(
        &mut registry,
        metrics.connected_gauge(),
    ));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let client = DiscoveryClient::new(
        cp.channel(&cp.discovery_url()),
        node_token(PROBE_NODE),
        PROBE_NODE.to_string(),
    )
    .with_subscriptions(subs.clone());
    let task = tokio::spawn(client.run(tx, metrics, async move {
        let _ = stopped.await;
    }));
    let mut synced = state.clone();
    tokio::time::timeout(Duration::from_secs(60), synced.wait_for(|s| s.synced))
        .await
        .context("the probe's stream had no snapshot in 60 s")??;
    let services = args.pods.div_ceil(10);
    let mut times = Vec::new();
    for k in 0..args.first_requests.min(services) {
        let s = (k * 7_907 + 3) % services;
        let addr: SocketAddr = format!("{}:80", service_ip(s)).parse()?;
        let start = Instant::now();
        let got = subs
            .wait(
                &state,
                &Target::Addr(addr.ip()),
                Duration::from_secs(10),
                |st| st.lookup(addr),
            )
            .await?;
        times.push(start.elapsed());
        anyhow::ensure!(
            matches!(got, ambit_proxy::discovery::Destination::Service { .. }),
            "{addr} resolved to {got:?}"
        );
        // Known now: a second lookup does not wait.
        anyhow::ensure!(matches!(state.borrow().lookup(addr), Lookup::Known(_)));
    }
    let _ = stop.send(());
    let _ = task.await;
    Ok(times)
}

fn proc_status(pid: u32, field: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .map(|l| l[field.len()..].trim().to_string())
        .unwrap_or_default()
}

/// Starts the real control plane on the same cluster, opens the streams, reads its
/// memory.
async fn control_memory(
    cp: &ControlPlane,
    bin: &PathBuf,
    args: &Args,
    subscriptions: &[Vec<usize>],
) -> anyhow::Result<()> {
    let d = cp.dir.path();
    let free = |_| -> anyhow::Result<SocketAddr> {
        Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
    };
    let (discovery, admin, identity, policy) = (free(0)?, free(1)?, free(2)?, free(3)?);
    let mut child = std::process::Command::new(bin)
        .args(["--trust-anchors", &d.join("root.crt").to_string_lossy()])
        .args(["--issuer-cert", &d.join("issuer.crt").to_string_lossy()])
        .args(["--issuer-key", &d.join("issuer.key").to_string_lossy()])
        .args(["--local-dir", &d.join("cluster").to_string_lossy()])
        .args(["--node-tokens", &d.join("tokens.yaml").to_string_lossy()])
        .args(["--discovery-addr", &discovery.to_string()])
        .args(["--admin-addr", &admin.to_string()])
        .args(["--identity-addr", &identity.to_string()])
        .args(["--policy-addr", &policy.to_string()])
        .args(["--log", "warn"])
        .envs(std::env::vars().filter(|(k, _)| k.starts_with("MALLOC_")))
        .spawn()
        .context("starting ambit-control")?;
    let pid = child.id();
    let result = async {
        let started = Instant::now();
        while http_get(admin, "/ready").await.0 != 200 {
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(600),
                "ambit-control was not ready within 10 minutes"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        println!(
            "| `ambit-control` start → ready (local backend loads the cluster) | {:.1} s |",
            started.elapsed().as_secs_f64()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        let loaded = proc_status(pid, "VmRSS:");
        let opened = Instant::now();
        let (_snaps, _arrivals) = open_streams(cp, discovery, args.streams, subscriptions).await?;
        let took = opened.elapsed();
        tokio::time::sleep(Duration::from_secs(2)).await;
        println!(
            "| `ambit-control` VmRSS, cluster loaded, no streams | {loaded} |\n| opening {} streams ({} subscriptions each, 64 opening at a time) | {:.1} s |\n| `ambit-control` VmRSS / VmHWM, {} streams open | {} / {} |",
            args.streams,
            args.services_per_node,
            took.as_secs_f64(),
            args.streams,
            proc_status(pid, "VmRSS:"),
            proc_status(pid, "VmHWM:")
        );
        anyhow::Ok(())
    }
    .await;
    let _ = child.kill();
    let _ = child.wait();
    result
}

/// The real node proxy of node 0 at rest against the in-process control plane.
async fn proxy_memory(cp: &ControlPlane, bin: &Path, args: &Args) -> anyhow::Result<()> {
    let admin = ambit_e2e::binary::free_port();
    let anchors = cp.dir.path().join("root.crt");
    let child =
        ambit_e2e::binary::spawn_binary(bin, cp, &node(0), admin, &anchors, &["--proc-root", ""]);
    let child = ambit_e2e::binary::Killed(child);
    let addr: SocketAddr = format!("127.0.0.1:{admin}").parse()?;
    let started = Instant::now();
    loop {
        let dump = http_get(addr, "/config_dump").await.1;
        if dump.contains("\"synced\": true") || http_get(addr, "/ready").await.0 == 200 {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(120),
            "the proxy had no discovery snapshot within 2 minutes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let pid = child.0.id();
    let dump = http_get(addr, "/config_dump").await.1;
    let workloads = dump
        .split("\"workloads\": ")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .unwrap_or("?")
        .to_string();
    println!(
        "| `ambit-proxy` of a node with {} of the {} pods, at rest: VmRSS / VmHWM; workloads it holds | {} / {}; {workloads} |",
        args.pods.div_ceil(args.streams),
        args.pods,
        proc_status(pid, "VmRSS:"),
        proc_status(pid, "VmHWM:")
    );
    Ok(())
}

async fn run(args: Args) -> anyhow::Result<()> {
    let mut nodes: Vec<String> = (0..args.streams).map(node).collect();
    nodes.push(PROBE_NODE.into());
    let node_refs: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let cp = ControlPlane::start(NAMESPACE, &node_refs).await;
    let loading = Instant::now();
    write_cluster(&cp.dir.path().join("cluster"), args.pods, args.streams)?;
    while cp.index.read().count(Kind::Pod) < args.pods {
        anyhow::ensure!(
            loading.elapsed() < Duration::from_secs(600),
            "the control plane did not load the cluster within 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "| cluster of {} pods, {} Services, {} nodes, {} Services called per node | loaded in {:.1} s (in process) |",
        args.pods,
        args.pods.div_ceil(10),
        args.streams,
        args.services_per_node,
        loading.elapsed().as_secs_f64()
    );
    let services = args.pods.div_ceil(10);
    let subscriptions: Vec<Vec<usize>> = (0..args.streams)
        .map(|n| services_of(n, args.services_per_node, services))
        .collect();
    let opened = Instant::now();
    let (snaps, mut arrivals) =
        open_streams(&cp, cp.discovery_addr, args.streams, &subscriptions).await?;
    println!(
        "| opening {} streams, in process (64 at a time) | {:.1} s |",
        args.streams,
        opened.elapsed().as_secs_f64()
    );
    let mut bytes: Vec<usize> = snaps.iter().map(|s| s.bytes).collect();
    bytes.sort_unstable();
    let largest = snaps.iter().map(|s| s.largest).max().unwrap_or(0);
    let messages = snaps.iter().map(|s| s.messages).max().unwrap_or(0);
    println!(
        "| a node's snapshot (its pods, {} Services with their endpoints): median, max; largest message; messages | {:.1} KB, {:.1} KB; {largest} bytes; {messages} |",
        args.services_per_node,
        bytes[bytes.len() / 2] as f64 / 1e3,
        bytes[bytes.len() - 1] as f64 / 1e3,
    );
    let mut endpoint = Vec::new();
    let mut pod = Vec::new();
    let mut strays = 0;
    let mut receivers = 0;
    for c in 0..args.changes {
        let (l, s) = time_change(&cp, &args, &subscriptions, &mut arrivals, c).await?;
        strays += s;
        receivers += l.len();
        if c % 2 == 0 {
            endpoint.extend(l);
        } else {
            pod.extend(l);
        }
    }
    println!(
        "| an endpoint turns not ready / ready → each subscribed stream's update | {} |",
        spread(endpoint)
    );
    println!(
        "| a pod's address changes → its node's stream's update | {} |",
        spread(pod)
    );
    println!(
        "| updates received by streams that do not hold what changed ({} changes, {receivers} expected updates) | {strays} |",
        args.changes
    );
    anyhow::ensure!(
        strays == 0,
        "{strays} updates reached streams that do not hold what changed"
    );
    println!(
        "| first request to a never-seen Service: the wait for discovery's answer ({} streams open) | {} |",
        args.streams,
        spread(first_requests(&cp, &args).await?)
    );
    if let Some(bin) = &args.proxy_bin {
        proxy_memory(&cp, bin, &args).await?;
    }
    drop(arrivals);
    if let Some(bin) = &args.control_bin {
        control_memory(&cp, bin, &args, &subscriptions).await?;
    }
    cp.stop().await;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(args))
}
