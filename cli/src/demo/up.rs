//! `ambit demo up`: a two-node mesh on this machine, out of network namespaces and cgroups
//! (`ambit_topology`, as the tests and benchmarks build theirs), with the sample
//! application running and traffic flowing through it.
//!
//! The steps, each recorded in the state file before the next (so that `down` can undo a
//! half-made demo): clean a stale demo; the PKI (as `ambit pki init`) and node tokens; the
//! pods' namespaces and the cgroups; the cluster YAML; the control plane on the local
//! backend; two node proxies (`--redirect auto`: eBPF, or nftables where the kernel
//! refuses it); the sample application's processes; then wait until every workload serves
//! requests.

use super::cluster::{self, PodPlan, NAMESPACE, NODES};
use super::state::{self, Control, Node, Pod, Process, State, CGROUP, DIR, PREFIX};
use super::term;
use crate::check::live::http_get;
use anyhow::{bail, Context};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The control plane's ports on 127.0.0.1: identity, discovery, policy, admin.
const CONTROL_PORTS: (u16, u16, u16, u16) = (17080, 17086, 17090, 17990);
/// The node proxies' admin ports on 127.0.0.1, one per node of [`NODES`].
const PROXY_ADMIN_PORTS: [u16; 2] = [17191, 17192];
/// How long each step may take before `up` gives up (and says where to look).
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// `ambit demo up` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    /// Where ambit-control and ambit-proxy are (default: next to this `ambit`).
    #[arg(long, value_name = "DIR")]
    pub bin_dir: Option<PathBuf>,
    /// The redirection the node proxies use: auto (eBPF, else nftables), ebpf or nftables.
    #[arg(long, default_value = "auto", value_parser = ["auto", "ebpf", "nftables"])]
    pub redirect: String,
}

/// Builds the demo and returns its state once traffic flows.
pub fn up(args: &UpArgs) -> anyhow::Result<State> {
    if !nix::unistd::geteuid().is_root() {
        bail!("ambit demo needs root (network namespaces, cgroups, eBPF): run it with sudo");
    }
    let bins = Binaries::find(args.bin_dir.as_deref())?;
    let stale = super::down::down().context("removing a stale demo")?;
    if stale.anything() {
        term::err("removed a stale demo first\n");
    }
    let dir = PathBuf::from(DIR);
    for sub in ["pki", "cluster", "logs"] {
        std::fs::create_dir_all(dir.join(sub))
            .with_context(|| format!("creating {}", dir.join(sub).display()))?;
    }
    let mut s = State {
        dir: dir.clone(),
        ..State::default()
    };
    s.save()?;

    step("the PKI and the nodes' tokens")?;
    crate::pki::init_quiet(&dir.join("pki"))?;
    let tokens = node_tokens(&dir)?;

    step("pods as network namespaces, nodes as cgroups")?;
    let plans = cluster::pods();
    let names: Vec<&str> = plans.iter().map(|p| p.short).collect();
    let topology = ambit_topology::Topology::create(PREFIX, cluster::ADDRESSING, &names)
        .context("creating the pods' network namespaces")?;
    let pods = topology.pods.clone();
    topology.keep();
    let system = cgroup(&format!("{CGROUP}/system"))?;
    for (node, port) in NODES.iter().zip(PROXY_ADMIN_PORTS) {
        s.nodes.push(Node {
            name: node.to_string(),
            admin_url: format!("http://127.0.0.1:{port}"),
            cgroup: cgroup(&format!("{CGROUP}/{node}"))?,
        });
    }
    for (p, n) in plans.iter().zip(&pods) {
        s.pods.push(Pod {
            name: p.name(),
            workload: p.workload.to_string(),
            node: p.node.to_string(),
            ip: n.ip.to_string(),
            netns: n.path(),
        });
    }
    let cluster_dir = dir.join("cluster");
    std::fs::write(cluster_dir.join("demo.yaml"), cluster::yaml(&plans, &pods))?;
    s.save()?;

    step("the control plane (local backend)")?;
    let (identity, discovery, policy, admin) = CONTROL_PORTS;
    let pki = dir.join("pki");
    s.control = Control {
        identity_url: format!("https://127.0.0.1:{identity}"),
        discovery_url: format!("https://127.0.0.1:{discovery}"),
        policy_url: format!("https://127.0.0.1:{policy}"),
        admin_url: format!("http://127.0.0.1:{admin}"),
        trust_anchors: pki.join(crate::pki::TRUST_ANCHOR_CERT),
        issuer_cert: pki.join(crate::pki::ISSUER_CERT),
        cluster_dir: cluster_dir.clone(),
    };
    let control_args: Vec<String> = vec![
        "--trust-anchors".into(),
        path(&s.control.trust_anchors),
        "--issuer-cert".into(),
        path(&s.control.issuer_cert),
        "--issuer-key".into(),
        path(&pki.join(crate::pki::ISSUER_KEY)),
        "--local-dir".into(),
        path(&cluster_dir),
        "--node-tokens".into(),
        path(&tokens),
        "--identity-addr".into(),
        format!("127.0.0.1:{identity}"),
        "--discovery-addr".into(),
        format!("127.0.0.1:{discovery}"),
        "--policy-addr".into(),
        format!("127.0.0.1:{policy}"),
        "--admin-addr".into(),
        format!("127.0.0.1:{admin}"),
    ];
    let cmd = ambit_topology::cgroup_command(&system, &bins.control, &control_args);
    spawn(&mut s, "ambit-control", cmd)?;
    wait_ready(
        &format!("{}/ready", s.control.admin_url),
        "ambit-control",
        &s,
    )?;

    step("two node proxies")?;
    for node in s.nodes.clone() {
        let run_dir = dir.join(format!("run-{}", node.name));
        let admin = node.admin_url.trim_start_matches("http://").to_string();
        let proxy_args: Vec<String> = vec![
            "--node-name".into(),
            node.name.clone(),
            "--identity-url".into(),
            s.control.identity_url.clone(),
            "--discovery-url".into(),
            s.control.discovery_url.clone(),
            "--policy-url".into(),
            s.control.policy_url.clone(),
            "--token-file".into(),
            path(&dir.join(format!("{}.token", node.name))),
            "--trust-anchors".into(),
            path(&s.control.trust_anchors),
            "--admin-addr".into(),
            admin,
            "--redirect".into(),
            args.redirect.clone(),
            "--cgroup-path".into(),
            path(&node.cgroup),
            "--bpf-pin-dir".into(),
            path(&state::pin_dir(&node.name)),
            "--cni-socket".into(),
            String::new(),
            "--run-dir".into(),
            path(&run_dir),
        ];
        let cmd = ambit_topology::cgroup_command(&system, &bins.proxy, &proxy_args);
        spawn(&mut s, &format!("ambit-proxy {}", node.name), cmd)?;
    }
    for node in s.nodes.clone() {
        wait_ready(
            &format!("{}/ready", node.admin_url),
            &format!("ambit-proxy {}", node.name),
            &s,
        )?;
    }
    s.redirect = std::fs::read_to_string(dir.join("run-node-a").join("redirect-mode"))
        .map(|m| m.trim().to_string())
        .unwrap_or_else(|_| args.redirect.clone());
    s.save()?;

    step("the sample application")?;
    for (plan, pod) in plans.iter().zip(&pods) {
        let node = s
            .nodes
            .iter()
            .find(|n| n.name == plan.node)
            .map(|n| n.cgroup.clone())
            .context("a pod on an unknown node")?;
        let cmd = app_command(&bins.ambit, plan, &node, &pod.name);
        spawn(&mut s, &plan.name(), cmd)?;
    }
    wait_for_traffic(&s)?;
    Ok(s)
}

/// Says which step runs; fails when a signal asked the demo to end (a foreground `ambit
/// demo` removes what was made).
fn step(what: &str) -> anyhow::Result<()> {
    term::check()?;
    term::err(&format!("  {what}\n"));
    Ok(())
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// The binaries the demo runs.
#[derive(Debug)]
struct Binaries {
    ambit: PathBuf,
    control: PathBuf,
    proxy: PathBuf,
}

impl Binaries {
    fn find(dir: Option<&Path>) -> anyhow::Result<Self> {
        let ambit = std::env::current_exe().context("finding this ambit binary")?;
        let dir = match dir {
            Some(d) => d.to_path_buf(),
            None => ambit
                .parent()
                .map(Path::to_path_buf)
                .context("the directory of this ambit binary")?,
        };
        let b = Self {
            ambit,
            control: dir.join("ambit-control"),
            proxy: dir.join("ambit-proxy"),
        };
        for bin in [&b.control, &b.proxy] {
            if !bin.is_file() {
                bail!(
                    "{} not found; build it beside ambit (cargo build --release -p ambit-control -p ambit-proxy -p ambit-cli) or point --bin-dir at it",
                    bin.display()
                );
            }
        }
        Ok(b)
    }
}

/// A cgroup of the demo's, kept (down removes it).
fn cgroup(relative: &str) -> anyhow::Result<PathBuf> {
    let cg = ambit_topology::Cgroup::create(relative)
        .with_context(|| format!("creating cgroup {relative}"))?;
    Ok(cg.keep())
}

/// Random node tokens, one file per node and the control plane's map of them.
fn node_tokens(dir: &Path) -> anyhow::Result<PathBuf> {
    let mut map = String::from("nodes:\n");
    for node in NODES {
        let mut bytes = [0u8; 16];
        std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut bytes)?;
        let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        map.push_str(&format!("  {node}: {token}\n"));
        std::fs::write(dir.join(format!("{node}.token")), &token)?;
    }
    let path = dir.join("tokens.yaml");
    std::fs::write(&path, map)?;
    Ok(path)
}

/// The pod's one container: `ambit demo app ...` in its netns and its node's cgroup.
fn app_command(ambit: &Path, plan: &PodPlan, node_cgroup: &Path, netns: &str) -> Command {
    let args = ["demo".to_string(), "app".to_string()]
        .into_iter()
        .chain(plan.app.iter().cloned());
    ambit_topology::pod_command(Some(node_cgroup), netns, ambit, args)
}

/// Starts `cmd` in a process group of its own (Ctrl-C in the terminal does not reach it;
/// `down` ends it), its output to `logs/<name>.log`, and records it.
fn spawn(s: &mut State, name: &str, mut cmd: Command) -> anyhow::Result<()> {
    let log = s
        .dir
        .join("logs")
        .join(format!("{}.log", name.replace(' ', "-")));
    let out = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {name}"))?;
    let pid = child.id();
    let start_time = state::start_time(pid).unwrap_or_default();
    s.processes.push(Process {
        name: name.to_string(),
        pid,
        start_time,
        log,
    });
    s.save()
}

/// Polls `url` until it answers 200; on a timeout or the process's exit, the error points
/// at its log.
fn wait_ready(url: &str, what: &str, s: &State) -> anyhow::Result<()> {
    let log = s
        .processes
        .iter()
        .rev()
        .find(|p| p.name == what)
        .map(|p| p.log.display().to_string())
        .unwrap_or_default();
    let rt = crate::stat::runtime()?;
    let deadline = Instant::now() + STEP_TIMEOUT;
    let mut last = String::new();
    while Instant::now() < deadline {
        term::check()?;
        if let Some(p) = s.processes.iter().rev().find(|p| p.name == what) {
            if state::start_time(p.pid) != Some(p.start_time) {
                bail!("{what} exited; its log: {log}\n{}", tail(&p.log));
            }
        }
        match rt.block_on(http_get(url)) {
            Ok((200, _)) => return Ok(()),
            Ok((code, body)) => last = format!("{code}: {}", body.trim()),
            Err(e) => last = e,
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!("{what} was not ready within {STEP_TIMEOUT:?} ({url}: {last}); its log: {log}")
}

/// The last lines of a log.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// Waits until every server workload of the sample application (web, api, catalog) has
/// answered requests through the mesh, as its node proxy counts them.
fn wait_for_traffic(s: &State) -> anyhow::Result<()> {
    let rt = crate::stat::runtime()?;
    let urls: Vec<crate::stat::scrape::AdminUrl> = s
        .proxy_admins()
        .iter()
        .map(|u| crate::stat::scrape::AdminUrl::parse(u))
        .collect::<Result<_, _>>()
        .map_err(anyhow::Error::msg)?;
    let deadline = Instant::now() + STEP_TIMEOUT;
    let mut missing = Vec::new();
    while Instant::now() < deadline {
        term::check()?;
        let (proxies, _) = rt.block_on(crate::stat::scrape::scrape_all(
            &urls,
            Duration::from_secs(5),
        ));
        missing = cluster::SERVICES
            .iter()
            .map(|svc| svc.name)
            .filter(|w| !served(proxies.values().flatten(), w))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    bail!(
        "no requests reached {} within {STEP_TIMEOUT:?}; the apps' and proxies' logs are in {DIR}/logs",
        missing.join(", ")
    )
}

/// Whether the proxies counted an inbound request to workload `w` of the demo.
fn served<'a>(samples: impl Iterator<Item = &'a crate::stat::parse::Sample>, w: &str) -> bool {
    samples.into_iter().any(|s| {
        s.name == "request_total"
            && s.value > 0.0
            && crate::stat::traffic::Traffic::of(s).is_some_and(|t| {
                t.direction == crate::stat::traffic::Direction::Inbound
                    && t.namespace == NAMESPACE
                    && t.workload == w
            })
    })
}
