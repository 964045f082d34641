//! `ambit`: the command-line tool of the Ambit mesh.
//!
//! # Layout
//!
//! - `pki`: create the mesh's trust anchor and issuer (`ambit pki init`).
//! - `check`: what is wrong with a node, the PKI, the control plane or the proxies, and
//!   what to do (`ambit check [--pre | --proxy]`).

mod check;
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
    /// Check a node before installing (`--pre`), the PKI and the control plane, and the
    /// node proxies (`--proxy`): √ / ‼ / × with a hint for each problem; exits non-zero on
    /// any ×, and with `--strict` on any ‼.
    Check(check::CheckArgs),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Pki(cmd) => pki::run(cmd),
        Command::Check(args) => {
            let code = check::run(args)?;
            std::process::exit(code)
        }
    }
}
