//! `ambit demo`: the whole mesh on this machine with one command — two nodes out of
//! network namespaces, the control plane on the local backend, two node proxies, a sample
//! application of meshed pods and a bounded load generator.
//!
//! - `cluster`: the demo's pods, Services and the Kubernetes YAML the control plane reads.
//! - `up` / `down`: build it, and remove everything it made (also after a crash).
//! - `state`: what a running demo is made of (`/run/ambit-demo/state.json`), which
//!   `down`, `ambit stat`, `ambit edges` and `ambit check` read.
//! - `app`: the sample application's programs (`ambit demo app ...`).
//! - `show`: what `up` prints, and `ambit demo`'s refreshing `ambit stat`.
//! - `term`: the signals that end a foreground demo, and writes to a terminal that may be
//!   gone.

pub mod app;
mod cluster;
mod down;
mod show;
pub mod state;
mod term;
mod up;

use anyhow::{bail, Context};

/// `ambit demo` flags.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Without a subcommand: `up`, then `ambit stat deploy -n demo` every few seconds until Ctrl-C
(or SIGTERM, or SIGHUP from a closed terminal — also during `up`), then `down`. Needs root
(network namespaces, cgroups, eBPF); nothing it sends leaves its namespaces, and its eBPF
programs attach only to cgroups it made.")]
pub struct DemoArgs {
    #[command(subcommand)]
    pub command: Option<DemoCommand>,
    #[command(flatten)]
    pub up: up::UpArgs,
}

/// `ambit demo` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum DemoCommand {
    /// Start the demo (a stale one is removed first) and return once traffic flows.
    Up(up::UpArgs),
    /// Remove everything the demo made: processes, namespaces, cgroups, pins, files.
    Down,
    /// Run a command as a process of a demo pod (in its network namespace and its node's
    /// cgroup, so the mesh redirects it), e.g. `ambit demo exec load -- curl -s http://10.96.80.10/`.
    Exec {
        /// The pod: its name, or the short name of its network namespace (load, web, api,
        /// catalog-1, catalog-2).
        pod: String,
        /// The command and its arguments.
        #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// The sample application's programs (started by `up` inside the pods).
    #[command(subcommand, hide = true)]
    App(app::AppCommand),
}

/// `ambit demo ...`.
pub fn run(args: DemoArgs) -> anyhow::Result<i32> {
    match args.command {
        Some(DemoCommand::Up(up)) => {
            let s = up::up(&up)?;
            show::summary(&s);
            Ok(0)
        }
        Some(DemoCommand::Down) => {
            let removed = down::down()?;
            println!("{}", show::removed(&removed));
            Ok(0)
        }
        Some(DemoCommand::Exec { pod, command }) => exec(&pod, &command),
        Some(DemoCommand::App(cmd)) => app::run(cmd).map(|()| 0),
        None => foreground(&args.up),
    }
}

/// `ambit demo`: up, the refreshing stat until a signal, down — and down also when the
/// signal came during `up`, or the terminal is gone (nothing it writes can fail).
fn foreground(args: &up::UpArgs) -> anyhow::Result<i32> {
    let _signals = term::catch_signals()?;
    let watched = up::up(args).and_then(|s| {
        show::summary(&s);
        show::watch(&s)
    });
    let Some(sig) = term::received() else {
        // `up` failed on its own: leave what it made (its logs say why), as `up` does.
        term::err("the demo's logs are in /run/ambit-demo/logs; `ambit demo down` removes it\n");
        return watched.map(|()| 0);
    };
    term::err(&format!(
        "\n{sig}: ending the demo, removing what it made\n"
    ));
    let removed = down::down()?;
    term::err(&format!("{}\n", show::removed(&removed)));
    match watched {
        Ok(()) => Ok(0),
        // Interrupted during `up`: everything is removed, and the exit status says it
        // did not run (128 + the signal, as a shell reports it).
        Err(e) => {
            term::err(&format!("{e:#}\n"));
            Ok(term::exit_status())
        }
    }
}

/// `ambit demo exec POD -- CMD...`: its exit status.
fn exec(pod: &str, command: &[String]) -> anyhow::Result<i32> {
    let s = state::State::load()?.context("no demo is running: start one with `ambit demo up`")?;
    let short = |p: &state::Pod| {
        p.netns
            .rsplit('/')
            .next()
            .and_then(|n| n.strip_prefix(&format!("{}-", state::PREFIX)))
            .unwrap_or_default()
            .to_string()
    };
    let Some(p) = s.pods.iter().find(|p| p.name == pod || short(p) == pod) else {
        let names: Vec<String> = s.pods.iter().map(short).collect();
        bail!("no demo pod {pod:?}; the pods are {}", names.join(", "));
    };
    let node = s
        .nodes
        .iter()
        .find(|n| n.name == p.node)
        .context("the pod's node is not in the demo's state")?;
    let netns = p.netns.rsplit('/').next().unwrap_or_default();
    let status = ambit_topology::pod_command(Some(&node.cgroup), netns, &command[0], &command[1..])
        .status()
        .with_context(|| format!("running {}", command[0]))?;
    Ok(status.code().unwrap_or(1))
}
