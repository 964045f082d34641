//! `ambit pki init`: write a trust anchor and an issuer as PEM files.

use ambit_api::duration::parse_duration;
use ambit_control::pki::generate::{self, Validity};
use anyhow::{bail, Context};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// File names written by `pki init`, as `ambit-control` and the Helm chart expect them.
pub const TRUST_ANCHOR_CERT: &str = "trust-anchor.crt";
/// The trust anchor's key: keep it offline once the issuer exists.
pub const TRUST_ANCHOR_KEY: &str = "trust-anchor.key";
/// The issuer certificate.
pub const ISSUER_CERT: &str = "issuer.crt";
/// The issuer key.
pub const ISSUER_KEY: &str = "issuer.key";
/// The trust anchor's default lifetime (10 years).
const DEFAULT_ANCHOR_LIFETIME: Duration = Duration::from_secs(3650 * 86_400);
/// The issuer's default lifetime (1 year).
const DEFAULT_ISSUER_LIFETIME: Duration = Duration::from_secs(365 * 86_400);

#[derive(Debug, clap::Subcommand)]
pub enum PkiCommand {
    /// Create a trust anchor (root CA, 10 years) and an issuer (intermediate CA, 1 year).
    Init {
        /// Directory to write the PEM files to (created if missing).
        #[arg(long)]
        out: PathBuf,
        /// Trust domain of the mesh.
        #[arg(long, default_value = ambit_api::DEFAULT_TRUST_DOMAIN)]
        trust_domain: String,
        /// Replace existing files.
        #[arg(long)]
        force: bool,
        /// Lifetime of the trust anchor.
        #[arg(long, default_value = "3650d", value_parser = parse_duration)]
        trust_anchor_lifetime: Duration,
        /// Lifetime of the issuer.
        #[arg(long, default_value = "365d", value_parser = parse_duration)]
        issuer_lifetime: Duration,
    },
}

pub fn run(cmd: PkiCommand) -> anyhow::Result<()> {
    match cmd {
        PkiCommand::Init {
            out,
            trust_domain,
            force,
            trust_anchor_lifetime,
            issuer_lifetime,
        } => init(
            &out,
            &trust_domain,
            force,
            trust_anchor_lifetime,
            issuer_lifetime,
        ),
    }
}

fn generate_into(
    out: &Path,
    trust_domain: &str,
    force: bool,
    anchor_lifetime: Duration,
    issuer_lifetime: Duration,
) -> anyhow::Result<()> {
    ambit_api::WorkloadIdentity::new(trust_domain, "ns", "sa").context("--trust-domain")?;
    if issuer_lifetime > anchor_lifetime {
        bail!("--issuer-lifetime must not be longer than --trust-anchor-lifetime");
    }
    let names = [TRUST_ANCHOR_CERT, TRUST_ANCHOR_KEY, ISSUER_CERT, ISSUER_KEY];
    let existing: Vec<_> = names.iter().filter(|n| out.join(n).exists()).collect();
    if !existing.is_empty() && !force {
        bail!(
            "{} already holds {}; refusing to overwrite a PKI (pass --force to replace it)",
            out.display(),
            existing
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;

    let anchor = generate::trust_anchor(trust_domain, Validity::starting_now(anchor_lifetime))?;
    let issuer = generate::issuer(
        &anchor,
        trust_domain,
        Validity::starting_now(issuer_lifetime),
    )?;
    write(&out.join(TRUST_ANCHOR_CERT), &anchor.cert_pem, 0o644)?;
    write(&out.join(TRUST_ANCHOR_KEY), &anchor.key_pem, 0o600)?;
    write(&out.join(ISSUER_CERT), &issuer.cert_pem, 0o644)?;
    write(&out.join(ISSUER_KEY), &issuer.key_pem, 0o600)?;
    Ok(())
}

/// A new PKI in `out` with the default trust domain and lifetimes, printing nothing (for
/// `ambit demo`).
pub fn init_quiet(out: &Path) -> anyhow::Result<()> {
    generate_into(
        out,
        ambit_api::DEFAULT_TRUST_DOMAIN,
        true,
        DEFAULT_ANCHOR_LIFETIME,
        DEFAULT_ISSUER_LIFETIME,
    )
}

fn init(
    out: &Path,
    trust_domain: &str,
    force: bool,
    anchor_lifetime: Duration,
    issuer_lifetime: Duration,
) -> anyhow::Result<()> {
    generate_into(out, trust_domain, force, anchor_lifetime, issuer_lifetime)?;
    println!(
        "wrote {} (trust domain {trust_domain}):\n  {TRUST_ANCHOR_CERT}  trust anchor: give it to every proxy and to ambit-control as --trust-anchors\n  {TRUST_ANCHOR_KEY}  its key: keep it offline\n  {ISSUER_CERT}, {ISSUER_KEY}  issuer: ambit-control --issuer-cert / --issuer-key",
        out.display()
    );
    Ok(())
}

/// Writes through a temporary file and renames, so a file is never half-written, and
/// creates it with `mode` from the start (a key is never world-readable, even briefly).
fn write(path: &Path, contents: &str, mode: u32) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(contents.as_bytes())
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}
