//! `ambit-soak`: a two-node mesh under mixed load for a long time — HTTP/1.1 (keep-alive
//! and a new connection per request), HTTP/2, gRPC, opaque TCP connections and a long
//! opaque stream, at fixed rates — while pods are added and deleted every few seconds
//! through the real CNI chain, a Service and the policy change, and a node proxy is
//! restarted hitlessly every few minutes. It counts failed requests (the target is zero)
//! and samples each proxy's RSS, descriptors and CPU. Run it with `bench/soak/run.sh`
//! (root; see bench/soak/README.md).
//!
//! # Layout
//!
//! - [`run`]: the orchestrator — nodes (ambit-e2e's CNI runtime), control plane (local
//!   backend, in this process), the real `ambit-proxy` per node, pods, load, teardown.
//! - [`cluster`]: the cluster's YAML, rewritten at each change.
//! - [`servers`]: the server pods' and churn pods' applications (in this process).
//! - [`load`]: the `load` command, one process per client pod; [`clients`]: its reports.
//! - [`churn`], [`restart`], [`sample`]: what runs beside the load; [`report`]: the summary.

mod churn;
mod clients;
mod cluster;
mod load;
mod proxy;
mod report;
mod restart;
mod run;
mod sample;
mod servers;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(about = "Ambit soak: mixed load through the mesh under churn and restarts")]
enum Command {
    /// Runs the soak (as root).
    Run(run::RunArgs),
    /// A client pod's load (started by `run` inside the pod).
    #[command(hide = true)]
    Load(load::LoadArgs),
}

fn main() -> anyhow::Result<()> {
    match Command::parse() {
        Command::Load(args) => load::main(args),
        Command::Run(args) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?
            .block_on(run::main(args)),
    }
}
