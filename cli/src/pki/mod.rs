//! `ambit pki`: the mesh's PKI as files — a new mesh (`init`), and the steps of a rotation
//! (docs/OPERATIONS.md): a new trust anchor (`anchor new`), the bundle with it added or the
//! old one removed (`bundle add`, `bundle remove`), a new issuer signed by it (`issuer
//! new`), and what a file holds (`inspect`).
//!
//! - `files`: the file names the control plane and the chart expect, written safely.
//! - `bundle`: adding and removing roots of a PEM bundle.
//! - `inspect`: what certificates are, and which signed which.

mod bundle;
mod files;
mod inspect;

pub use files::{ISSUER_CERT, ISSUER_KEY, TRUST_ANCHOR_CERT, TRUST_ANCHOR_KEY};

use ambit_api::duration::parse_duration;
use ambit_control::pki::generate::{self, CaMaterial, Validity};
use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

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
    /// Trust anchors (root CAs).
    #[command(subcommand)]
    Anchor(AnchorCommand),
    /// Issuers (the intermediate CA the control plane signs workload certificates with).
    #[command(subcommand)]
    Issuer(IssuerCommand),
    /// The trust bundle: the PEM file of every root the mesh trusts (the chart's
    /// `identityTrustAnchorsPEM`, `--trust-anchors` of the proxies and the control plane).
    #[command(subcommand)]
    Bundle(bundle::BundleCommand),
    /// What PEM files hold: each certificate's role, subject, trust domain, SHA-256
    /// fingerprint and validity, and which certificate of the files given signed it.
    Inspect(inspect::InspectArgs),
}

/// `ambit pki anchor`.
#[derive(Debug, clap::Subcommand)]
pub enum AnchorCommand {
    /// Create a new trust anchor: `trust-anchor.crt` and its key `trust-anchor.key` (keep
    /// the key offline once the issuer is signed).
    New {
        /// Directory to write the files to (created if missing).
        #[arg(long)]
        out: PathBuf,
        /// Trust domain of the mesh.
        #[arg(long, default_value = ambit_api::DEFAULT_TRUST_DOMAIN)]
        trust_domain: String,
        /// Lifetime of the trust anchor.
        #[arg(long, default_value = "3650d", value_parser = parse_duration)]
        lifetime: Duration,
        /// Replace existing files.
        #[arg(long)]
        force: bool,
    },
}

/// `ambit pki issuer`.
#[derive(Debug, clap::Subcommand)]
pub enum IssuerCommand {
    /// Create a new issuer signed by a trust anchor: `issuer.crt` and `issuer.key`.
    New {
        /// The trust anchor certificate that signs it (PEM).
        #[arg(long)]
        anchor_cert: PathBuf,
        /// The trust anchor's private key (PEM).
        #[arg(long)]
        anchor_key: PathBuf,
        /// Directory to write the files to (created if missing).
        #[arg(long)]
        out: PathBuf,
        /// Trust domain of the mesh.
        #[arg(long, default_value = ambit_api::DEFAULT_TRUST_DOMAIN)]
        trust_domain: String,
        /// Lifetime of the issuer (at most what the anchor has left).
        #[arg(long, default_value = "365d", value_parser = parse_duration)]
        lifetime: Duration,
        /// Replace existing files.
        #[arg(long)]
        force: bool,
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
        PkiCommand::Anchor(AnchorCommand::New {
            out,
            trust_domain,
            lifetime,
            force,
        }) => {
            anchor_new(&out, &trust_domain, lifetime, force)?;
            println!(
                "wrote {} (trust domain {trust_domain}):\n  {TRUST_ANCHOR_CERT}  the new trust anchor: add it to the bundle (`ambit pki bundle add`)\n  {TRUST_ANCHOR_KEY}  its key: sign the new issuer with it (`ambit pki issuer new`), then keep it offline",
                out.display()
            );
            Ok(())
        }
        PkiCommand::Issuer(IssuerCommand::New {
            anchor_cert,
            anchor_key,
            out,
            trust_domain,
            lifetime,
            force,
        }) => {
            issuer_new(
                (&anchor_cert, &anchor_key),
                &out,
                &trust_domain,
                lifetime,
                force,
            )?;
            println!(
                "wrote {} (trust domain {trust_domain}), signed by {}:\n  {ISSUER_CERT}, {ISSUER_KEY}  the new issuer: ambit-control --issuer-cert / --issuer-key (the chart's identity.issuer.tls.crtPEM / keyPEM); its anchor must be in the bundle first",
                out.display(),
                anchor_cert.display()
            );
            Ok(())
        }
        PkiCommand::Bundle(cmd) => bundle::run(cmd),
        PkiCommand::Inspect(args) => inspect::run(&args),
    }
}

/// Checks the trust domain as the mesh will.
fn check_trust_domain(trust_domain: &str) -> anyhow::Result<()> {
    ambit_api::WorkloadIdentity::new(trust_domain, "ns", "sa").context("--trust-domain")?;
    Ok(())
}

fn generate_into(
    out: &Path,
    trust_domain: &str,
    force: bool,
    anchor_lifetime: Duration,
    issuer_lifetime: Duration,
) -> anyhow::Result<()> {
    check_trust_domain(trust_domain)?;
    if issuer_lifetime > anchor_lifetime {
        bail!("--issuer-lifetime must not be longer than --trust-anchor-lifetime");
    }
    files::refuse_overwrite(
        out,
        &[TRUST_ANCHOR_CERT, TRUST_ANCHOR_KEY, ISSUER_CERT, ISSUER_KEY],
        force,
    )?;
    let anchor = generate::trust_anchor(trust_domain, Validity::starting_now(anchor_lifetime))?;
    let issuer = generate::issuer(
        &anchor,
        trust_domain,
        Validity::starting_now(issuer_lifetime),
    )?;
    files::write_pair(out, (TRUST_ANCHOR_CERT, TRUST_ANCHOR_KEY), &anchor)?;
    files::write_pair(out, (ISSUER_CERT, ISSUER_KEY), &issuer)?;
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

/// `ambit pki anchor new`.
fn anchor_new(
    out: &Path,
    trust_domain: &str,
    lifetime: Duration,
    force: bool,
) -> anyhow::Result<()> {
    check_trust_domain(trust_domain)?;
    files::refuse_overwrite(out, &[TRUST_ANCHOR_CERT, TRUST_ANCHOR_KEY], force)?;
    let anchor = generate::trust_anchor(trust_domain, Validity::starting_now(lifetime))?;
    files::write_pair(out, (TRUST_ANCHOR_CERT, TRUST_ANCHOR_KEY), &anchor)
}

/// `ambit pki issuer new`.
fn issuer_new(
    (anchor_cert, anchor_key): (&Path, &Path),
    out: &Path,
    trust_domain: &str,
    lifetime: Duration,
    force: bool,
) -> anyhow::Result<()> {
    check_trust_domain(trust_domain)?;
    let read = |flag: &str, p: &Path| {
        std::fs::read_to_string(p).with_context(|| format!("{flag} {}", p.display()))
    };
    let anchor = CaMaterial {
        cert_pem: read("--anchor-cert", anchor_cert)?,
        key_pem: read("--anchor-key", anchor_key)?,
    };
    let described = inspect::describe_pem(&anchor.cert_pem)
        .with_context(|| format!("--anchor-cert {}", anchor_cert.display()))?;
    let Some(root) = described.first() else {
        bail!(
            "--anchor-cert {}: no certificate in it",
            anchor_cert.display()
        );
    };
    if !root.ca {
        bail!(
            "--anchor-cert {}: {} is not a CA certificate; pass a trust anchor (`ambit pki anchor new` makes one)",
            anchor_cert.display(),
            root.subject
        );
    }
    if let Some(td) = root
        .trust_domain
        .as_deref()
        .filter(|td| *td != trust_domain)
    {
        bail!(
            "--anchor-cert {} is a root of trust domain {td}, not {trust_domain} (--trust-domain)",
            anchor_cert.display()
        );
    }
    let ends = SystemTime::now() + lifetime;
    if inspect::unix(ends) > root.not_after_unix {
        bail!(
            "--lifetime: the issuer would outlive its trust anchor {} (notAfter {}); give it a shorter --lifetime, or rotate the anchor first",
            anchor_cert.display(),
            root.not_after
        );
    }
    files::refuse_overwrite(out, &[ISSUER_CERT, ISSUER_KEY], force)?;
    let issuer = generate::issuer(&anchor, trust_domain, Validity::starting_now(lifetime))
        .with_context(|| {
            format!(
                "signing with --anchor-cert {} and --anchor-key {}",
                anchor_cert.display(),
                anchor_key.display()
            )
        })?;
    files::write_pair(out, (ISSUER_CERT, ISSUER_KEY), &issuer)
}

#[cfg(test)]
mod tests;
