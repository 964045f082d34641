//! `ambit`: the command-line tool of the Ambit mesh.
//!
//! # Layout
//!
//! - `pki`: the mesh PKI as files: a new one (`ambit pki init`), and the steps of a
//!   rotation (`anchor new`, `bundle add|remove`, `issuer new`, `inspect`).
//! - `check`: what is wrong with a node, the PKI, the control plane or the proxies, and
//!   what to do (`ambit check [--pre | --proxy]`).
//! - `stat`: golden metrics per workload, pod or namespace from the node proxies'
//!   `/metrics` (`ambit stat`).
//! - `edges`: who talks to whom, with the identities and whether the hop was mTLS
//!   (`ambit edges`).
//! - `demo`: the whole mesh on this machine, with a sample application (`ambit demo`).
//! - `version`: this client's version and the node proxies' (`ambit version`);
//!   `ambit completion SHELL` prints a shell completion script.

mod check;
mod demo;
mod diagnostics;
mod edges;
mod pki;
mod stat;
mod version;

use clap::{CommandFactory, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "ambit",
    version,
    about = "Ambit service mesh command-line tool"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Manage the mesh PKI.
    #[command(subcommand)]
    Pki(pki::PkiCommand),
    /// Check a node before installing (`--pre`), the PKI and the control plane, and the
    /// node proxies (`--proxy`): √ / ‼ / × with a hint for each problem; exits non-zero on
    /// any ×, and with `--strict` on any ‼.
    Check(check::CheckArgs),
    /// Golden metrics per deployment, pod or namespace, as `linkerd viz stat`.
    ///
    /// MESHED, SUCCESS, RPS, LATENCY_P50/P95/P99 and TCP_CONN over a window (`-t`): the
    /// node proxies' `/metrics` (`--proxy-admin`) scraped at its start and end, rates and
    /// quantiles as PromQL's `rate` and `histogram_quantile` compute them. `--from` /
    /// `--to` for one edge; `-o wide` adds byte rates and the mTLS share; `-o json`. With
    /// `--kube`, the proxies are the API server's node proxy pods, read through its pod
    /// proxy.
    Stat {
        #[command(flatten)]
        args: stat::StatArgs,
        #[command(flatten)]
        kube: stat::kube::KubeArgs,
    },
    /// Who talks to whom, and whether it is encrypted, as `linkerd viz edges`.
    ///
    /// One row per (source, destination) workload or pod seen in one scrape of the node
    /// proxies' `/metrics`: the identity the server saw (CLIENT_ID), the one the client
    /// required (SERVER_ID), and SECURED √ when the hop was mTLS.
    Edges {
        #[command(flatten)]
        args: edges::EdgesArgs,
        #[command(flatten)]
        kube: stat::kube::KubeArgs,
    },
    /// Run the whole mesh on this machine: two nodes, the control plane, two node proxies
    /// and a sample application with load (`up`, `down`, `exec`); alone, `up`, a refreshing
    /// `ambit stat` until Ctrl-C, then `down`.
    Demo(demo::DemoArgs),
    /// This client's version and each node proxy's (its `proxy_build_info`), as `linkerd
    /// version`; `--client` for this client's alone.
    Version {
        #[command(flatten)]
        args: version::VersionArgs,
        #[command(flatten)]
        kube: stat::kube::KubeArgs,
    },
    /// What each node proxy holds, as `linkerd diagnostics`: its raw metrics, the pods it
    /// serves, its certificates, the Services and endpoints it knows, its pods' inbound
    /// policy.
    #[command(subcommand)]
    Diagnostics(diagnostics::Diagnostics),
    /// Print a completion script: `source <(ambit completion bash)`, or save it where the
    /// shell loads completions (bash: /etc/bash_completion.d/ambit; zsh: a `_ambit` file
    /// on $fpath; fish: ~/.config/fish/completions/ambit.fish).
    Completion {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Pki(cmd) => pki::run(cmd),
        Command::Check(args) => {
            let code = check::run(args)?;
            std::process::exit(code)
        }
        Command::Stat { args, kube } => stat::run(args, &kube),
        Command::Edges { args, kube } => edges::run(args, &kube),
        Command::Version { args, kube } => version::run(args, &kube),
        Command::Diagnostics(cmd) => diagnostics::run(cmd),
        Command::Completion { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "ambit", &mut std::io::stdout());
            Ok(())
        }
        Command::Demo(args) => {
            let code = demo::run(args)?;
            std::process::exit(code)
        }
    }
}
