//! `ambit pki bundle add|remove`: the trust bundle is a PEM file of root certificates;
//! adding the new root before the issuer changes, and removing the old one once every
//! workload certificate comes from the new issuer, are the first and last steps of a
//! rotation. Each certificate's PEM text is kept as it was; roots are told apart by their
//! SHA-256 fingerprint.

use super::files;
use super::inspect::{describe_pem, Described};
use anyhow::{bail, Context};
use std::path::{Path, PathBuf};

/// `ambit pki bundle`.
#[derive(Debug, clap::Subcommand)]
pub enum BundleCommand {
    /// Add roots to a bundle (created if missing); a root already in it is not added
    /// twice. Step 1 of a rotation: the bundle with the old and the new root.
    Add {
        /// The bundle (PEM).
        #[arg(long)]
        bundle: PathBuf,
        /// PEM files of the roots to add.
        #[arg(required = true)]
        certs: Vec<PathBuf>,
        /// Write the result here instead of over --bundle (`-`: standard output).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Remove roots from a bundle, given as PEM files or by SHA-256 fingerprint (as
    /// `ambit pki inspect` prints it; a unique prefix of 8 or more digits will do). Refuses
    /// to leave the bundle empty. Step 3 of a rotation: the old root gone.
    Remove {
        /// The bundle (PEM).
        #[arg(long)]
        bundle: PathBuf,
        /// PEM files of the roots to remove.
        certs: Vec<PathBuf>,
        /// Fingerprints of the roots to remove.
        #[arg(long = "sha256")]
        fingerprints: Vec<String>,
        /// Write the result here instead of over --bundle (`-`: standard output).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// One root of a bundle: its PEM text as found, and what it is.
#[derive(Clone, Debug)]
struct Root {
    pem: String,
    what: Described,
}

/// The `CERTIFICATE` blocks of `pem`, each with what it is. `name` is the file, for errors.
fn roots(name: &str, pem: &str) -> anyhow::Result<Vec<Root>> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let described = describe_pem(pem).with_context(|| name.to_string())?;
    let mut blocks = Vec::new();
    let mut rest = pem;
    while let Some(start) = rest.find(BEGIN) {
        let Some(len) = rest[start..].find(END) else {
            bail!("{name}: a certificate block has no END line");
        };
        let end = start + len + END.len();
        blocks.push(format!("{}\n", &rest[start..end]));
        rest = &rest[end..];
    }
    if blocks.len() != described.len() {
        bail!(
            "{name}: {} certificate blocks but {} certificates read; is the file PEM?",
            blocks.len(),
            described.len()
        );
    }
    Ok(blocks
        .into_iter()
        .zip(described)
        .map(|(pem, what)| Root { pem, what })
        .collect())
}

/// Refuses what cannot be a root of one mesh's bundle.
fn check_roots(name: &str, roots: &[Root]) -> anyhow::Result<()> {
    for r in roots {
        if !r.what.ca {
            bail!(
                "{name}: {} (sha256 {}) is not a CA certificate; a trust bundle holds trust anchors (`ambit pki anchor new` makes one)",
                r.what.subject,
                r.what.sha256
            );
        }
    }
    let domains: std::collections::BTreeSet<&str> = roots
        .iter()
        .filter_map(|r| r.what.trust_domain.as_deref())
        .collect();
    if domains.len() > 1 {
        bail!(
            "{name}: roots of several trust domains ({}); a bundle is one mesh's",
            domains.into_iter().collect::<Vec<_>>().join(", ")
        );
    }
    Ok(())
}

/// `bundle` with `added` appended (those not in it yet); the roots added.
fn add(bundle: Vec<Root>, added: Vec<Root>) -> (Vec<Root>, Vec<Root>) {
    let mut out = bundle;
    let mut new = Vec::new();
    for r in added {
        if !out.iter().any(|o| o.what.sha256 == r.what.sha256) {
            out.push(r.clone());
            new.push(r);
        }
    }
    (out, new)
}

/// `bundle` without the roots whose fingerprints are in `gone` (full, or a unique prefix
/// of 8 or more hex digits); the roots removed.
fn remove(bundle: Vec<Root>, gone: &[String]) -> anyhow::Result<(Vec<Root>, Vec<Root>)> {
    let mut remove = std::collections::BTreeSet::new();
    for fp in gone {
        let fp = fp.to_ascii_lowercase().replace(':', "");
        if fp.len() < 8 {
            bail!("--sha256 {fp}: give at least 8 hex digits of the fingerprint");
        }
        let matching: Vec<&Root> = bundle
            .iter()
            .filter(|r| r.what.sha256.starts_with(&fp))
            .collect();
        match matching.as_slice() {
            [one] => {
                remove.insert(one.what.sha256.clone());
            }
            [] => bail!(
                "no root of the bundle has the fingerprint {fp}; `ambit pki inspect` lists them"
            ),
            _ => bail!("{fp} is the start of several roots' fingerprints; give more digits"),
        }
    }
    let (removed, kept): (Vec<Root>, Vec<Root>) = bundle
        .into_iter()
        .partition(|r| remove.contains(&r.what.sha256));
    if kept.is_empty() {
        bail!("that would leave the bundle empty: the mesh would trust nothing; add the new root first (`ambit pki bundle add`)");
    }
    Ok((kept, removed))
}

fn read(p: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
}

/// Writes the bundle to `out` (or over `bundle`), and says what it holds on stderr.
fn save(
    bundle: &Path,
    out: Option<&Path>,
    roots: &[Root],
    changed: (&str, &[Root]),
) -> anyhow::Result<()> {
    let pem: String = roots.iter().map(|r| r.pem.as_str()).collect();
    let target = out.unwrap_or(bundle);
    if target == Path::new("-") {
        print!("{pem}");
    } else {
        files::write(target, &pem, 0o644)?;
    }
    let (verb, which) = changed;
    let shown = if target == Path::new("-") {
        "standard output".to_string()
    } else {
        target.display().to_string()
    };
    eprintln!("{shown}: {} root(s):", roots.len());
    for r in roots {
        eprintln!(
            "  {}  {}  notAfter {}",
            r.what.sha256, r.what.subject, r.what.not_after
        );
    }
    for r in which {
        eprintln!("{verb} {}  {}", r.what.sha256, r.what.subject);
    }
    for r in roots.iter().filter(|r| !r.what.self_signed) {
        eprintln!(
            "warning: {} is not self-signed (an issuer?); it is trusted as a root all the same. A bundle normally holds trust anchors (`trust-anchor.crt`)",
            r.what.subject
        );
    }
    Ok(())
}

/// Runs `ambit pki bundle …`.
pub fn run(cmd: BundleCommand) -> anyhow::Result<()> {
    match cmd {
        BundleCommand::Add { bundle, certs, out } => {
            let current = if bundle.exists() {
                roots(&bundle.display().to_string(), &read(&bundle)?)?
            } else {
                Vec::new()
            };
            let mut added = Vec::new();
            for c in &certs {
                added.extend(roots(&c.display().to_string(), &read(c)?)?);
            }
            let (all, new) = add(current, added);
            check_roots(&bundle.display().to_string(), &all)?;
            save(&bundle, out.as_deref(), &all, ("added", &new))
        }
        BundleCommand::Remove {
            bundle,
            certs,
            mut fingerprints,
            out,
        } => {
            if certs.is_empty() && fingerprints.is_empty() {
                bail!("name the roots to remove: PEM files, or --sha256 <fingerprint>");
            }
            for c in &certs {
                for r in roots(&c.display().to_string(), &read(c)?)? {
                    fingerprints.push(r.what.sha256);
                }
            }
            let current = roots(&bundle.display().to_string(), &read(&bundle)?)?;
            let (kept, removed) = remove(current, &fingerprints)
                .with_context(|| format!("removing from {}", bundle.display()))?;
            save(&bundle, out.as_deref(), &kept, ("removed", &removed))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use ambit_control::pki::generate::{issuer, trust_anchor, Validity};
    use std::time::Duration;

    fn root(td: &str) -> String {
        trust_anchor(td, Validity::starting_now(Duration::from_secs(86_400)))
            .unwrap()
            .cert_pem
    }

    fn fps(roots: &[Root]) -> Vec<String> {
        roots.iter().map(|r| r.what.sha256.clone()).collect()
    }

    #[test]
    fn add_appends_new_roots_once_and_keeps_the_text_of_those_there() {
        let (old, new) = (root("cluster.local"), root("cluster.local"));
        let bundle = roots("b", &format!("# a comment\n{old}")).unwrap();
        let (all, added) = add(bundle, roots("n", &format!("{new}{old}")).unwrap());
        assert_eq!(all.len(), 2);
        assert_eq!(fps(&added), fps(&roots("n", &new).unwrap()));
        let text: String = all.iter().map(|r| r.pem.as_str()).collect();
        assert_eq!(text, format!("{}{}", old, new));
        let (again, added) = add(all, roots("n", &new).unwrap());
        assert_eq!(again.len(), 2);
        assert!(added.is_empty());
    }

    #[test]
    fn remove_by_file_or_fingerprint_prefix_and_never_to_empty() {
        let (old, new) = (root("cluster.local"), root("cluster.local"));
        let both = roots("b", &format!("{old}{new}")).unwrap();
        let old_fp = fps(&roots("o", &old).unwrap()).remove(0);
        let (kept, removed) = remove(both.clone(), &[old_fp[..12].to_uppercase()]).unwrap();
        assert_eq!(fps(&removed), [old_fp]);
        assert_eq!(fps(&kept), fps(&roots("n", &new).unwrap()));
        let err = remove(kept, &fps(&roots("n", &new).unwrap())).unwrap_err();
        assert!(err.to_string().contains("leave the bundle empty"), "{err}");
        let err = remove(both.clone(), &["abc".into()]).unwrap_err();
        assert!(err.to_string().contains("at least 8"), "{err}");
        let err = remove(both, &["00000000".into()]).unwrap_err();
        assert!(err.to_string().contains("no root of the bundle"), "{err}");
    }

    #[test]
    fn an_issuer_or_a_root_of_another_mesh_is_no_root_of_this_bundle() {
        let anchor = trust_anchor(
            "cluster.local",
            Validity::starting_now(Duration::from_secs(86_400)),
        )
        .unwrap();
        let iss = issuer(
            &anchor,
            "cluster.local",
            Validity::starting_now(Duration::from_secs(3600)),
        )
        .unwrap();
        // An issuer is a CA too: a bundle may hold one (trusted as a root, with a
        // warning); roots of two trust domains may not be mixed.
        let mixed = roots(
            "b",
            &format!("{}{}", anchor.cert_pem, root("other.example")),
        )
        .unwrap();
        let err = check_roots("b", &mixed).unwrap_err();
        assert!(err.to_string().contains("several trust domains"), "{err}");
        assert!(check_roots("b", &roots("i", &iss.cert_pem).unwrap()).is_ok());
    }
}
