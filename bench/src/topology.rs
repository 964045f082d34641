//! `ambit-topology`: the benchmarks' pods, from the topology crate the tests and `ambit
//! demo` use (bench/lib.sh calls it).
//!
//!   ambit-topology up --prefix P NAME...   netns P-br with a bridge; P-NAME at 10.78.0.2, .3, …
//!   ambit-topology down --prefix P         deletes every netns P-*

use ambit_topology::{net, Addressing, Topology};
use clap::{Parser, Subcommand};

/// The benchmarks' subnet (10.78.0.0/24, fd78::/64), only inside their namespaces.
const BENCH: Addressing = Addressing {
    v4: std::net::Ipv4Addr::new(10, 78, 0, 0),
    v6: std::net::Ipv6Addr::new(0xfd78, 0, 0, 0, 0, 0, 0, 0),
};

#[derive(Debug, Parser)]
#[command(
    name = "ambit-topology",
    about = "Pods as network namespaces on a bridge"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create netns PREFIX-br with a bridge and one netns PREFIX-NAME per pod on it, in
    /// order at 10.78.0.2, .3, …; they stay until `down`.
    Up {
        #[arg(long)]
        prefix: String,
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Delete every netns named PREFIX-*.
    Down {
        #[arg(long)]
        prefix: String,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Up { prefix, names } => {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            Topology::create(&prefix, BENCH, &names)?.keep();
        }
        Command::Down { prefix } => {
            net::remove_netns(&prefix)?;
        }
    }
    Ok(())
}
