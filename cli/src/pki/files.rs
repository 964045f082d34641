//! The PKI's files: the names `ambit-control`, the chart and the docs use, written so that
//! a file is never half-written and a key never readable by others, even briefly.

use ambit_control::pki::generate::CaMaterial;
use anyhow::{bail, Context};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The trust anchor certificate.
pub const TRUST_ANCHOR_CERT: &str = "trust-anchor.crt";
/// The trust anchor's key: keep it offline once the issuer exists.
pub const TRUST_ANCHOR_KEY: &str = "trust-anchor.key";
/// The issuer certificate.
pub const ISSUER_CERT: &str = "issuer.crt";
/// The issuer key.
pub const ISSUER_KEY: &str = "issuer.key";

/// Fails, naming them, if any of `names` exists in `out` and `force` is not set.
pub fn refuse_overwrite(out: &Path, names: &[&str], force: bool) -> anyhow::Result<()> {
    let existing: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| out.join(n).exists())
        .collect();
    if !existing.is_empty() && !force {
        bail!(
            "{} already holds {}; refusing to overwrite a PKI (pass --force to replace it)",
            out.display(),
            existing.join(", ")
        );
    }
    Ok(())
}

/// Writes a certificate (0644) and its key (0600) into `out`, created if missing.
pub fn write_pair(out: &Path, (cert, key): (&str, &str), m: &CaMaterial) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    write(&out.join(cert), &m.cert_pem, 0o644)?;
    write(&out.join(key), &m.key_pem, 0o600)
}

/// Writes through a temporary file and renames, so a file is never half-written, and
/// creates it with `mode` from the start (a key is never world-readable, even briefly).
/// The rename is also what a process watching the file sees as one change.
pub fn write(path: &Path, contents: &str, mode: u32) -> anyhow::Result<()> {
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
