//! The orchestrator: the mesh set up, the load started, churn, restarts and samples run
//! side by side until the time is up (or SIGINT/SIGTERM), then everything taken down —
//! pods DELeted, proxies stopped, namespaces, cgroups and pins removed — and the report
//! written.

use crate::churn::{self, Churn};
use crate::clients::{LoadProcess, Reports};
use crate::cluster::{self, Pod, CLIENT_SA};
use crate::proxy::{clock_ticks, Launcher, Proxy};
use crate::{report, restart, sample, servers};
use ambit_e2e::cni::{self, CniPod};
use ambit_e2e::ControlPlane;
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The soak's flags.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// How long the load runs, in minutes.
    #[arg(long, default_value_t = 30.0)]
    pub minutes: f64,
    /// How often a node proxy is restarted (the nodes in turn, node-b first).
    #[arg(long, default_value = "5m", value_parser = ambit_api::duration::parse_duration)]
    pub restart_every: Duration,
    /// How often a churn pod is added (and the oldest one taken out of its Service, then
    /// deleted one period later).
    #[arg(long, default_value = "4s", value_parser = ambit_api::duration::parse_duration)]
    pub churn_every: Duration,
    /// How often the policy and a Service change.
    #[arg(long, default_value = "30s", value_parser = ambit_api::duration::parse_duration)]
    pub change_every: Duration,
    /// How often each proxy's memory, descriptors and CPU are sampled.
    #[arg(long, default_value = "5s", value_parser = ambit_api::duration::parse_duration)]
    pub sample_every: Duration,
    /// Requests per second of each HTTP and gRPC kind, per client pod.
    #[arg(long, default_value_t = 20.0)]
    pub rate: f64,
    /// Seconds each long opaque stream lasts (not a divisor of the restart period, so
    /// that streams span the hand-overs at ever different points).
    #[arg(long, default_value_t = 55)]
    pub stream_secs: u64,
    /// The proxies' `--shutdown-grace-period` (longer than a long stream, which a
    /// draining proxy would otherwise cut).
    #[arg(long, default_value = "90s")]
    pub grace: String,
    /// The results directory.
    #[arg(long)]
    pub out: PathBuf,
    /// The `ambit-proxy` binary.
    #[arg(long)]
    pub proxy_bin: PathBuf,
    /// The `ambit-cni` binary (installed into each node's CNI directory).
    #[arg(long)]
    pub cni_bin: PathBuf,
}

/// Churn pods kept in the `churn` Service's endpoints.
pub const CHURN_KEPT: usize = 4;

/// Counts of what the orchestrator did.
#[derive(Debug, Default)]
pub struct Stats {
    pub pods_added: AtomicU64,
    pub pods_deleted: AtomicU64,
    pub cni_add_failed: AtomicU64,
    pub cni_del_failed: AtomicU64,
    pub restarts: AtomicU64,
    pub restarts_failed: AtomicU64,
    pub changes: AtomicU64,
}

impl Stats {
    /// Adds one to `counter`.
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Events with their time (seconds since the start): `events.csv`, and stderr.
#[derive(Debug)]
pub struct Events {
    start: Instant,
    file: Mutex<std::fs::File>,
    /// Every event: (time, what, detail).
    pub list: Mutex<Vec<(f64, String, String)>>,
}

impl Events {
    fn new(start: Instant, path: PathBuf) -> anyhow::Result<Self> {
        let mut file = std::fs::File::create(path)?;
        writeln!(file, "t_s,event,detail")?;
        Ok(Self {
            start,
            file: Mutex::new(file),
            list: Mutex::default(),
        })
    }

    /// Records `what` with `detail`.
    pub fn log(&self, what: &str, detail: impl std::fmt::Display) {
        let t = self.start.elapsed().as_secs_f64();
        let detail = detail.to_string().replace('"', "'");
        eprintln!("[{t:8.1}s] {what}: {detail}");
        if let Ok(mut f) = self.file.lock() {
            let _ = writeln!(f, "{t:.1},{what},\"{detail}\"");
        }
        if let Ok(mut l) = self.list.lock() {
            l.push((t, what.into(), detail));
        }
    }
}

/// A proxy that has handed over and been sent SIGTERM, draining until it exits.
#[derive(Debug)]
pub struct Draining {
    /// The process.
    pub proxy: Proxy,
    /// Its node's index.
    pub node: usize,
    /// When SIGTERM was sent.
    pub since: Instant,
}

/// Everything the soak runs. Fields drop in order: the load, the proxies and the servers
/// before the CNI cluster (whose cgroups must be empty to go) and the control plane.
#[derive(Debug)]
pub struct Soak {
    pub args: RunArgs,
    pub start: Instant,
    /// When the load started (set once the clients are ready).
    pub load_start: Mutex<Option<Instant>>,
    pub ticks: f64,
    pub loads: Mutex<Vec<LoadProcess>>,
    /// Each node's current proxy (index 0 node-a, 1 node-b).
    pub proxies: Mutex<Vec<Proxy>>,
    pub draining: Mutex<Vec<Draining>>,
    pub servers: Mutex<Vec<servers::Servers>>,
    /// The pods made at the start (clients and servers).
    pub pods: Mutex<Vec<CniPod>>,
    pub reports: Arc<Reports>,
    pub events: Events,
    pub stats: Stats,
    pub samples: Mutex<Vec<sample::Sample>>,
    pub objects: tokio::sync::Mutex<cluster::Cluster>,
    pub launcher: Launcher,
    pub cluster: Arc<cni::Cluster>,
    pub cp: ControlPlane,
}

/// The fixed pods: a client and a server on each node.
fn fixed_pods() -> Vec<Pod> {
    let pod = |name: &str, node: &str, subnet: u8, host: u8, sa: &str, app| Pod {
        name: name.into(),
        node: node.into(),
        ip: Ipv4Addr::new(10, 78, subnet, host),
        sa: sa.into(),
        app,
        running: true,
    };
    vec![
        pod("cli-a", "node-a", 1, 10, CLIENT_SA, "cli"),
        pod("cli-b", "node-b", 2, 10, CLIENT_SA, "cli"),
        pod("srv-a", "node-a", 1, 20, "server", "srv"),
        pod("srv-b", "node-b", 2, 20, "server", "srv"),
    ]
}

/// Runs the soak with `args`.
pub async fn main(args: RunArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out)?;
    let start = Instant::now();
    let stop = Arc::new(watch::channel(false).0);
    tokio::spawn(signals(stop.clone()));
    let soak = Arc::new(setup(args, start).await?);
    let outcome = run(&soak, &stop).await;
    if let Err(e) = &outcome {
        soak.events.log("error", format!("{e:#}"));
    }
    stop.send_replace(true);
    teardown(&soak, outcome.unwrap_or_default()).await;
    report::write(&soak)?;
    Ok(())
}

/// SIGINT or SIGTERM stops the soak early (it still takes everything down and reports).
async fn signals(stop: Arc<watch::Sender<bool>>) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
    eprintln!("signalled: stopping");
    stop.send_replace(true);
}

/// The nodes (CNI), the control plane and a proxy per node, ready.
async fn setup(args: RunArgs, start: Instant) -> anyhow::Result<Soak> {
    let cni_bin = args.cni_bin.clone();
    let cluster = Arc::new(
        tokio::task::spawn_blocking(move || {
            cni::Cluster::new("soak", &["node-a", "node-b"], &cni_bin)
        })
        .await
        .map_err(|e| anyhow::anyhow!("setting up the CNI nodes: {e}"))?,
    );
    let mut objects = cluster::Cluster::new(PathBuf::new(), fixed_pods());
    let cp = ControlPlane::start(&objects.yaml(), &["node-a", "node-b"]).await;
    objects.file = cp.cluster_file();
    let events = Events::new(start, args.out.join("events.csv"))?;
    let launcher = Launcher {
        bin: args.proxy_bin.clone(),
        logs: args.out.clone(),
        grace: args.grace.clone(),
    };
    let mut proxies = Vec::new();
    for node in &cluster.nodes {
        let mut p = launcher.spawn(&cp, node, 0)?;
        let took = p.until_ready(Duration::from_secs(120)).await?;
        events.log(
            "proxy_started",
            format!("{} pid {} ready in {took:.2?}", node.name, p.pid()),
        );
        proxies.push(p);
    }
    Ok(Soak {
        args,
        start,
        load_start: Mutex::new(None),
        ticks: clock_ticks(),
        loads: Mutex::default(),
        proxies: Mutex::new(proxies),
        draining: Mutex::default(),
        servers: Mutex::default(),
        pods: Mutex::default(),
        reports: Arc::default(),
        events,
        stats: Stats::default(),
        samples: Mutex::default(),
        objects: tokio::sync::Mutex::new(objects),
        launcher,
        cluster,
        cp,
    })
}

/// CNI ADD of `namespace/name` on `node` at host `host` of its subnet, on a blocking
/// thread as a runtime waits for its chain.
pub async fn cni_add(soak: &Soak, node: &str, name: &str, host: u8) -> Result<CniPod, String> {
    let (c, node, name) = (soak.cluster.clone(), node.to_string(), name.to_string());
    tokio::task::spawn_blocking(move || c.add_pod(&node, cluster::NAMESPACE, &name, host))
        .await
        .map_err(|e| e.to_string())?
}

/// CNI DEL of `pod`, then its netns removed, as the runtime does when a sandbox goes.
pub async fn cni_del(soak: &Soak, pod: &CniPod) -> Result<(), String> {
    let (c, pod) = (soak.cluster.clone(), pod.clone());
    tokio::task::spawn_blocking(move || {
        let deleted = c.del_pod(&pod);
        c.remove_netns(&pod);
        deleted
    })
    .await
    .map_err(|e| e.to_string())?
}

/// The pods, servers and load; then churn, restarts and samples until the time is up.
async fn run(soak: &Arc<Soak>, stop: &Arc<watch::Sender<bool>>) -> anyhow::Result<Churn> {
    for p in fixed_pods() {
        let host = p.ip.octets()[3];
        let pod = cni_add(soak, &p.node, &p.name, host)
            .await
            .map_err(|e| anyhow::anyhow!("CNI ADD of {}: {e}", p.name))?;
        if p.app == "srv" {
            let s = servers::start(std::path::Path::new(&pod.path()), &p.name, true).await?;
            lock(&soak.servers).push(s);
        }
        lock(&soak.pods).push(pod);
    }
    soak.events.log("pods", "clients and servers added");
    let mut churn = Churn::default();
    for _ in 0..CHURN_KEPT {
        churn.add(soak).await;
    }
    start_load(soak, stop).await?;
    let load_start = Instant::now();
    *lock(&soak.load_start) = Some(load_start);
    soak.events.log(
        "load_started",
        format!("{} clients", lock(&soak.loads).len()),
    );

    let length = Duration::from_secs_f64(soak.args.minutes * 60.0);
    let tasks = (
        tokio::spawn(sample::run(soak.clone(), stop.subscribe())),
        tokio::spawn(churn::run(soak.clone(), churn, stop.subscribe())),
        tokio::spawn(restart::run(
            soak.clone(),
            load_start,
            load_start + length,
            stop.subscribe(),
        )),
    );
    let mut stopped = stop.subscribe();
    tokio::select! {
        _ = tokio::time::sleep_until((load_start + length).into()) => {}
        _ = crate::run::stopped(&mut stopped) => {}
    }
    soak.events.log("load_stopping", "time is up or signalled");
    // The clients first (their last counts), then the rest.
    stop_load(soak).await;
    stop.send_replace(true);
    let churn = tasks.1.await?;
    tasks.2.await?;
    tasks.0.await?;
    sample::take(soak);
    Ok(churn)
}

/// Starts a load process in each client pod and waits until each has warmed up.
async fn start_load(soak: &Soak, stop: &watch::Sender<bool>) -> anyhow::Result<()> {
    let pods = lock(&soak.pods).clone();
    for pod in pods.iter().filter(|p| p.name.starts_with("cli-")) {
        let node = &soak.cluster.nodes[pod.node];
        let load = LoadProcess::start(
            node,
            pod,
            soak.args.rate,
            soak.args.stream_secs,
            &soak.args.out,
            soak.start,
            soak.reports.clone(),
        )?;
        lock(&soak.loads).push(load);
    }
    let wanted = lock(&soak.loads).len();
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let errors = soak.reports.errors();
        anyhow::ensure!(errors.is_empty(), "a client gave up: {errors:?}");
        if soak.reports.ready_done().0 == wanted {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "the clients never warmed up");
        anyhow::ensure!(!*stop.borrow(), "signalled during the warm-up");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Stops the load processes and waits (30 s at most) for their last counts.
async fn stop_load(soak: &Soak) {
    for l in lock(&soak.loads).iter_mut() {
        l.stop();
    }
    let wanted = lock(&soak.loads).len();
    let deadline = Instant::now() + Duration::from_secs(30);
    while soak.reports.ready_done().1 < wanted && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let done = soak.reports.ready_done().1;
    soak.events.log(
        "load_stopped",
        format!("{done} of {wanted} clients reported"),
    );
}

/// Everything down: the load, every pod DELeted (the proxies still serving, as a
/// runtime would), the proxies stopped with SIGTERM; the namespaces, cgroups and pins go
/// with the CNI cluster when the soak is dropped.
async fn teardown(soak: &Soak, churn: Churn) {
    if soak.reports.ready_done().1 < lock(&soak.loads).len() {
        stop_load(soak).await;
    }
    lock(&soak.loads).clear();
    churn.delete_all(soak).await;
    lock(&soak.servers).clear();
    let pods = std::mem::take(&mut *lock(&soak.pods));
    for pod in pods.iter().rev() {
        if let Err(e) = cni_del(soak, pod).await {
            soak.events
                .log("cni_del_failed", format!("{}: {e}", pod.name));
        }
    }
    // The draining ones have had their SIGTERM.
    let mut procs: Vec<Proxy> = std::mem::take(&mut *lock(&soak.proxies));
    for p in &mut procs {
        p.sigterm();
    }
    procs.extend(
        std::mem::take(&mut *lock(&soak.draining))
            .into_iter()
            .map(|d| d.proxy),
    );
    for mut p in procs {
        let status = p.until_exit(Duration::from_secs(40)).await;
        soak.events.log(
            "proxy_stopped",
            format!("pid {} generation {}: {status:?}", p.pid(), p.generation),
        );
    }
}

/// Resolves once `stop` is true (or its sender has gone).
pub async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Locks `m`, whatever a panicking holder left.
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
