//! `ambit`: the command-line tool of the Ambit mesh.
//!
//! # Layout
//!
//! - `pki`: create the mesh's trust anchor and issuer (`ambit pki init`).

mod pki;

use clap::{Parser, Subcommand};

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
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Pki(cmd) => pki::run(cmd),
    }
}
