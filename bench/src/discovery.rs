//! Discovery fan-out: how long one pod change takes to reach every node proxy's stream,
//! and what the control plane holds in memory, with many nodes and many pods.
//!
//! ```sh
//! cargo build --release -p ambit-bench -p ambit-control
//! target/release/discovery-bench --pods 10000 --streams 1000 \
//!     --control-bin target/release/ambit-control
//! ```
//!
//! Two measurements:
//!
//! 1. In process: a control plane (local backend) holding `--pods` pods, `--streams`
//!    discovery streams (one per simulated node, each its own TLS connection and node
//!    token). A pod is changed in the index; the clock runs from that change until the
//!    last stream has received the delta. Repeated `--changes` times; run with
//!    `--streams 1` as well to see that the cost does not grow with the streams.
//! 2. With `--control-bin`: the real `ambit-control` binary with the same cluster, the
//!    same streams connected; its VmRSS and VmHWM are read from `/proc`.

use ambit_api::proto::discovery::discovery_client::DiscoveryClient;
use ambit_api::proto::discovery::WatchRequest;
use ambit_control::index::KubeObject;
use ambit_e2e::{http_get, node_token, ControlPlane};
use anyhow::Context;
use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

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

/// Pod `i`; a later `generation` moves it to another IP (a change discovery sends).
fn pod_yaml(i: usize, nodes: usize, generation: usize) -> String {
    let ip = match generation {
        0 => format!("10.{}.{}.{}", i / 65_000 + 1, (i / 250) % 256, i % 250 + 1),
        g => format!("10.250.{}.{}", g % 256, i % 250 + 1),
    };
    format!(
        "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: pod-{i}, namespace: shop}}\nspec: {{nodeName: {}, serviceAccountName: sa-{}, containers: []}}\nstatus: {{podIP: {ip}, phase: Running}}\n",
        node(i % nodes),
        i % 50,
    )
}

/// The pods, and a Service per ten pods with one EndpointSlice of their addresses (so
/// that rendering does the work a real cluster's Services cost).
fn cluster(pods: usize, nodes: usize) -> String {
    let mut y = String::from(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop, annotations: {ambit.dev/mesh: enabled}}\n",
    );
    for i in 0..pods {
        y.push_str(&pod_yaml(i, nodes, 0));
    }
    for s in 0..pods.div_ceil(10) {
        y.push_str(&format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc-{s}, namespace: shop}}\nspec: {{clusterIP: 10.96.{}.{}, ports: [{{name: http, port: 80}}]}}\n",
            s / 250,
            s % 250 + 1
        ));
        let endpoints: Vec<String> = (s * 10..(s * 10 + 10).min(pods))
            .map(|i| {
                format!(
                    "{{addresses: [10.{}.{}.{}], targetRef: {{kind: Pod, name: pod-{i}, namespace: shop}}}}",
                    i / 65_000 + 1,
                    (i / 250) % 256,
                    i % 250 + 1
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
        let mut client = DiscoveryClient::new(cp.channel(&format!("https://{addr}")))
            .max_decoding_message_size(64 << 20);
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
        tokio::time::timeout(Duration::from_secs(300), ready_rx.recv())
            .await
            .context("streams did not all open within 5 minutes")?
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
        for _ in 0..600 {
            if http_get(admin, "/ready").await.0 == 200 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
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
    let nodes: Vec<String> = (0..args.streams).map(node).collect();
    let node_refs: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let cp = ControlPlane::start(&cluster(args.pods, args.streams), &node_refs).await;
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
