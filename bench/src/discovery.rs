//! Discovery fan-out: how long one pod change takes to reach every node proxy's stream,
//! how large the snapshot of a cluster is, and what the control plane holds in memory,
//! with many nodes and many pods.
//!
//! ```sh
//! cargo build --release -p ambit-bench -p ambit-control -p ambit-proxy
//! target/release/discovery-bench --pods 100000 --streams 1000 \
//!     --control-bin target/release/ambit-control
//! ```
//!
//! The cluster (`--pods` over `--streams` nodes, a Service and EndpointSlice per ten pods)
//! is written as files of at most 1,000 pods each into the control plane's directory after
//! it has started on the namespace alone, and loaded on its next poll: the local backend
//! reads one file in time quadratic in its documents (`parse_file` revisits every object
//! of the file per document), so 100,000 pods in one file would take minutes to load.
//!
//! Measurements:
//!
//! 1. The snapshot, over one stream of a node with no pods (`node-idle`): its messages,
//!    their encoded sizes (as they come off the wire, what tonic compares with its decode
//!    limit) and the time from opening the stream to its last chunk; then a real node
//!    proxy (in process) from its start to `/ready`, i.e. the snapshot applied.
//! 2. In process: a control plane (local backend) holding `--pods` pods, `--streams`
//!    discovery streams (one per simulated node, each its own TLS connection and node
//!    token). A pod is changed in the index; the clock runs from that change until the
//!    last stream has received the delta. Repeated `--changes` times; run with
//!    `--streams 1` as well to see that the cost does not grow with the streams.
//! 3. With `--control-bin`: the real `ambit-control` binary with the same cluster, the
//!    same streams connected; its VmRSS and VmHWM are read from `/proc`.
//!
//! Every stream keeps tonic's default decode limit (4 MiB), as the node proxy does: a
//! message over it fails the benchmark.

use ambit_api::proto::discovery::discovery_client::DiscoveryClient;
use ambit_api::proto::discovery::WatchRequest;
use ambit_control::index::{Kind, KubeObject};
use ambit_e2e::{http_get, node_token, ControlPlane, NodeProxy};
use anyhow::Context;
use clap::Parser;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

#[derive(Debug, Parser)]
struct Args {
    /// Pods in the cluster.
    #[arg(long, default_value_t = 10_000)]
    pods: usize,
    /// Discovery streams, one per simulated node.
    #[arg(long, default_value_t = 1000)]
    streams: usize,
    /// Pod changes to time.
    #[arg(long, default_value_t = 5)]
    changes: usize,
    /// The release `ambit-control` binary, to measure its memory with the streams open.
    #[arg(long)]
    control_bin: Option<PathBuf>,
}

fn node(i: usize) -> String {
    format!("node-{i:04}")
}

/// A node with a token and no pods: the snapshot's stream and the proxy's.
const IDLE_NODE: &str = "node-idle";

/// Pods per file of the cluster directory.
const PODS_PER_FILE: usize = 1000;

/// The largest message a stream accepts: tonic's default, which the node proxy's
/// discovery client keeps.
const DECODE_LIMIT: usize = 4 << 20;

/// Pod `i`'s address at first: unique up to 62,500 × 254 pods.
fn pod_ip(i: usize) -> String {
    format!("10.{}.{}.{}", i / 62_500 + 1, (i / 250) % 250, i % 250 + 1)
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

/// The namespace, alone: the control plane starts on it.
const NAMESPACE: &str =
    "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop, annotations: {ambit.dev/mesh: enabled}}\n";

/// Pods `first..end`, and a Service per ten of them with one EndpointSlice of their
/// addresses (so that rendering does the work a real cluster's Services cost).
fn cluster_part(first: usize, end: usize, nodes: usize) -> String {
    let mut y = String::new();
    for i in first..end {
        y.push_str(&pod_yaml(i, nodes, 0));
    }
    for s in first.div_ceil(10)..end.div_ceil(10) {
        y.push_str(&format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc-{s}, namespace: shop}}\nspec: {{clusterIP: 10.96.{}.{}, ports: [{{name: http, port: 80}}]}}\n",
            s / 250,
            s % 250 + 1
        ));
        let endpoints: Vec<String> = (s * 10..(s * 10 + 10).min(end))
            .map(|i| {
                format!(
                    "{{addresses: [{}], targetRef: {{kind: Pod, name: pod-{i}, namespace: shop}}}}",
                    pod_ip(i)
                )
            })
            .collect();
        y.push_str(&format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: svc-{s}-1, namespace: shop, labels: {{kubernetes.io/service-name: svc-{s}}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints: [{}]\n",
            endpoints.join(", ")
        ));
    }
    y
}

/// Writes the cluster into `dir` (the control plane's directory) as files of
/// [`PODS_PER_FILE`] pods, moved in at once so that no poll sees half of it.
fn write_cluster(dir: &Path, pods: usize, nodes: usize) -> anyhow::Result<()> {
    let staging = dir.with_extension("staging");
    std::fs::create_dir(&staging)?;
    for first in (0..pods).step_by(PODS_PER_FILE) {
        let end = (first + PODS_PER_FILE).min(pods);
        std::fs::write(
            staging.join(format!("pods-{first:07}.yaml")),
            cluster_part(first, end, nodes),
        )?;
    }
    std::fs::rename(&staging, dir.join("pods"))?;
    Ok(())
}

/// A discovery message as it came off the wire: its encoded size, and the fields of
/// `Update` the benchmark needs, read by hand (this crate has no protobuf runtime).
#[derive(Debug)]
struct RawUpdate {
    len: usize,
    more: bool,
    workloads: usize,
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

/// The top-level fields of an `Update` (ambit.discovery.v1) that matter here: 2
/// workloads (counted), 6 more; others skipped.
fn raw_update(mut b: &[u8]) -> Option<RawUpdate> {
    let mut u = RawUpdate {
        len: b.len(),
        more: false,
        workloads: 0,
    };
    while !b.is_empty() {
        let (key, rest) = varint(b)?;
        b = rest;
        match key & 7 {
            0 => {
                let (v, rest) = varint(b)?;
                b = rest;
                if key >> 3 == 6 {
                    u.more = v != 0;
                }
            }
            2 => {
                let (len, rest) = varint(b)?;
                b = rest.get(usize::try_from(len).ok()?..)?;
                if key >> 3 == 2 {
                    u.workloads += 1;
                }
            }
            _ => return None,
        }
    }
    Some(u)
}

/// Runs a future that never waits (I/O on memory) to its end.
fn at_once<F: Future>(f: F) -> Option<F::Output> {
    match std::pin::pin!(f).poll(&mut TaskContext::from_waker(Waker::noop())) {
        Poll::Ready(out) => Some(out),
        Poll::Pending => None,
    }
}

/// Sends a `WatchRequest` (its node name) and yields each message undecoded. tonic's
/// buffers are `bytes` types, which this crate does not depend on: they are read and
/// filled through tokio's I/O helpers, which take any `Buf` / `BufMut`, on memory.
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
        use tokio::io::AsyncReadExt;
        // WatchRequest { node = 1 }: key, length (a node name is far below 128), bytes.
        let len = u8::try_from(node.len())
            .ok()
            .filter(|l| *l < 128)
            .ok_or_else(|| tonic::Status::internal("node name too long"))?;
        let message = [&[0x0a, len][..], node.as_bytes()].concat();
        let mut rest = &message[..];
        while !rest.is_empty() {
            match at_once(rest.read_buf(dst)) {
                Some(Ok(n)) if n > 0 => {}
                _ => return Err(tonic::Status::internal("cannot fill the buffer")),
            }
        }
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = RawUpdate;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<RawUpdate>, tonic::Status> {
        use tokio::io::AsyncWriteExt;
        let mut bytes = Vec::new();
        match at_once(bytes.write_all_buf(src)) {
            Some(Ok(())) => {}
            _ => return Err(tonic::Status::internal("cannot read the buffer")),
        }
        raw_update(&bytes)
            .map(Some)
            .ok_or_else(|| tonic::Status::internal("not an Update"))
    }
}

/// One snapshot read over a fresh stream of [`IDLE_NODE`]: each message, and the time
/// from opening the stream to its last chunk.
async fn raw_snapshot(cp: &ControlPlane) -> anyhow::Result<(Vec<RawUpdate>, Duration)> {
    // Over the limit too, to measure a snapshot that would not pass it.
    let mut grpc = tonic::client::Grpc::new(cp.channel(&cp.discovery_url()))
        .max_decoding_message_size(usize::MAX);
    let start = Instant::now();
    grpc.ready().await.context("discovery channel")?;
    let mut req = tonic::Request::new(IDLE_NODE.to_string());
    let header = format!("Bearer {}", node_token(IDLE_NODE));
    req.metadata_mut()
        .insert("authorization", header.parse().context("header")?);
    let path =
        tonic::codegen::http::uri::PathAndQuery::from_static("/ambit.discovery.v1.Discovery/Watch");
    let mut stream = grpc
        .server_streaming(req, path, RawCodec)
        .await?
        .into_inner();
    let mut chunks = Vec::new();
    loop {
        let u = stream.message().await?.context("the stream ended")?;
        let more = u.more;
        chunks.push(u);
        if !more {
            return Ok((chunks, start.elapsed()));
        }
    }
}

/// Waits for the publisher to serve the whole cluster, then reads the snapshot three
/// times and reports it.
async fn measure_snapshot(cp: &ControlPlane, pods: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let (chunks, _) = raw_snapshot(cp).await?;
        if chunks.iter().map(|u| u.workloads).sum::<usize>() == pods {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "discovery did not serve {pods} pods within 5 minutes"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut times = Vec::new();
    let mut last = Vec::new();
    for _ in 0..3 {
        let (chunks, took) = raw_snapshot(cp).await?;
        times.push(took);
        last = chunks;
    }
    times.sort();
    let total: usize = last.iter().map(|u| u.len).sum();
    let largest = last.iter().map(|u| u.len).max().unwrap_or(0);
    println!(
        "| snapshot of {pods} pods: messages, total encoded size | {} messages, {:.1} MB |",
        last.len(),
        total as f64 / 1e6
    );
    println!("| snapshot: largest message (decode limit {DECODE_LIMIT} bytes) | {largest} bytes |");
    println!(
        "| snapshot: stream open → last chunk received, one stream, median of 3 | {:.0} ms (min {:.0}, max {:.0}) |",
        times[1].as_secs_f64() * 1000.0,
        times[0].as_secs_f64() * 1000.0,
        times[2].as_secs_f64() * 1000.0
    );
    anyhow::ensure!(
        largest <= DECODE_LIMIT,
        "a snapshot message of {largest} bytes is over the proxy's decode limit"
    );
    Ok(())
}

/// A node proxy of [`IDLE_NODE`] in this process: from its start to `/ready` (no pods,
/// so ready means the snapshot is applied).
async fn measure_proxy(cp: &ControlPlane, pods: usize) -> anyhow::Result<()> {
    let start = Instant::now();
    let proxy = NodeProxy::spawn(cp, IDLE_NODE).await;
    let deadline = start + Duration::from_secs(300);
    let ready = loop {
        if http_get(proxy.admin_addr, "/ready").await.0 == 200 {
            break start.elapsed();
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the proxy was not ready within 5 minutes"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let dump = http_get(proxy.admin_addr, "/config_dump").await.1;
    let metrics = http_get(proxy.admin_addr, "/metrics").await.1;
    proxy.stop().await;
    anyhow::ensure!(
        dump.contains(&format!("\"workloads\": {pods}")),
        "the proxy's /config_dump does not hold {pods} workloads"
    );
    anyhow::ensure!(
        metrics.contains("discovery_reconnects_total 0"),
        "the proxy's discovery stream was re-opened: {metrics}"
    );
    println!(
        "| node proxy start → /ready (snapshot of {pods} pods applied) | {:.0} ms |",
        ready.as_secs_f64() * 1000.0
    );
    Ok(())
}

/// Opens one stream per node (32 opening at a time, as proxies rolling out would);
/// returns once every stream has its snapshot, with a channel on which each stream
/// reports the arrival of each later update.
async fn open_streams(
    cp: &ControlPlane,
    addr: SocketAddr,
    n: usize,
) -> anyhow::Result<mpsc::UnboundedReceiver<Instant>> {
    let (arrivals, rx) = mpsc::unbounded_channel();
    let (ready_tx, mut ready_rx) = mpsc::channel::<anyhow::Result<()>>(n);
    let opening = std::sync::Arc::new(tokio::sync::Semaphore::new(32));
    for i in 0..n {
        // The proxy's decode limit: a message over it fails the benchmark.
        let mut client = DiscoveryClient::new(cp.channel(&format!("https://{addr}")))
            .max_decoding_message_size(DECODE_LIMIT);
        let arrivals = arrivals.clone();
        let ready = ready_tx.clone();
        let opening = opening.clone();
        tokio::spawn(async move {
            let open = async {
                let _permit = opening.acquire().await?;
                let mut req = tonic::Request::new(WatchRequest { node: node(i) });
                let header = format!("Bearer {}", node_token(&node(i)));
                req.metadata_mut()
                    .insert("authorization", header.parse().context("header")?);
                let mut stream = client.watch(req).await?.into_inner();
                // The snapshot comes in chunks; it is whole at the first without `more`.
                while stream.message().await?.context("no snapshot")?.more {}
                anyhow::Ok(stream)
            };
            match open.await {
                Ok(mut stream) => {
                    let _ = ready.send(Ok(())).await;
                    while let Ok(Some(_)) = stream.message().await {
                        let _ = arrivals.send(Instant::now());
                    }
                }
                Err(e) => {
                    let _ = ready
                        .send(Err(e.context(format!("stream of {}", node(i)))))
                        .await;
                }
            }
        });
    }
    for _ in 0..n {
        tokio::time::timeout(Duration::from_secs(1800), ready_rx.recv())
            .await
            .context("streams did not all open within 30 minutes")?
            .context("a stream task ended")??;
    }
    Ok(rx)
}

/// Changes one pod in the index and waits for every stream's delta.
async fn time_change(
    cp: &ControlPlane,
    arrivals: &mut mpsc::UnboundedReceiver<Instant>,
    streams: usize,
    pods: usize,
    generation: usize,
) -> anyhow::Result<Duration> {
    let mut skipped = 0;
    let yaml = pod_yaml(generation % pods, streams, generation);
    let obj: KubeObject =
        ambit_control::local::parse_file(std::path::Path::new("change.yaml"), &yaml, &mut skipped)?
            .remove(0)
            .object;
    let start = Instant::now();
    cp.index.apply(obj)?;
    let mut last = start;
    for _ in 0..streams {
        last = tokio::time::timeout(Duration::from_secs(60), arrivals.recv())
            .await
            .context("a stream did not receive the delta within 60 s")?
            .context("streams ended")?;
    }
    Ok(last - start)
}

fn proc_status(pid: u32, field: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .map(|l| l[field.len()..].trim().to_string())
        .unwrap_or_default()
}

/// Starts the real binary on the same cluster, opens the streams, reads its memory.
async fn binary_memory(cp: &ControlPlane, bin: &PathBuf, streams: usize) -> anyhow::Result<()> {
    let d = cp.dir.path();
    let free = |_| -> anyhow::Result<SocketAddr> {
        Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
    };
    let (discovery, admin, identity) = (free(0)?, free(1)?, free(2)?);
    let mut child = std::process::Command::new(bin)
        .args(["--trust-anchors", &d.join("root.crt").to_string_lossy()])
        .args(["--issuer-cert", &d.join("issuer.crt").to_string_lossy()])
        .args(["--issuer-key", &d.join("issuer.key").to_string_lossy()])
        .args(["--local-dir", &d.join("cluster").to_string_lossy()])
        .args(["--node-tokens", &d.join("tokens.yaml").to_string_lossy()])
        .args(["--discovery-addr", &discovery.to_string()])
        .args(["--admin-addr", &admin.to_string()])
        .args(["--identity-addr", &identity.to_string()])
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
            "| ambit-control start → ready (cluster loaded) | {:.1} s |",
            started.elapsed().as_secs_f64()
        );
        // The publisher renders once ready; let it settle.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let loaded = proc_status(pid, "VmRSS:");
        let _arrivals = open_streams(cp, discovery, streams).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        println!(
            "| ambit-control VmRSS, cluster loaded, no streams | {loaded} |\n| ambit-control VmRSS, {streams} streams open | {} |\n| ambit-control VmHWM | {} |",
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

async fn run(args: Args) -> anyhow::Result<()> {
    let mut nodes: Vec<String> = (0..args.streams).map(node).collect();
    nodes.push(IDLE_NODE.into());
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
        "| cluster of {} pods written and loaded by the local backend (in process) | {:.1} s |",
        args.pods,
        loading.elapsed().as_secs_f64()
    );
    measure_snapshot(&cp, args.pods).await?;
    measure_proxy(&cp, args.pods).await?;
    let opened = Instant::now();
    let mut arrivals = open_streams(&cp, cp.discovery_addr, args.streams).await?;
    println!(
        "| {} streams opened (snapshot of {} pods each) | {:.1} s |",
        args.streams,
        args.pods,
        opened.elapsed().as_secs_f64()
    );
    let mut times = Vec::new();
    for g in 1..=args.changes {
        times.push(time_change(&cp, &mut arrivals, args.streams, args.pods, g).await?);
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "| pod change → last of {} streams' delta ({} pods), median of {} | {:.1} ms (min {:.1}, max {:.1}) |",
        args.streams,
        args.pods,
        times.len(),
        ms(times[times.len() / 2]),
        ms(times[0]),
        ms(times[times.len() - 1])
    );
    if let Some(bin) = &args.control_bin {
        binary_memory(&cp, bin, args.streams).await?;
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
