//! `ambit pki inspect`: what PEM files hold — each certificate's role (trust anchor,
//! issuer, workload), subject, trust domain, SHA-256 fingerprint and validity, and which
//! certificate among the files given signed it (by signature, not by name: during a
//! rotation the old and the new anchor have the same subject).

use anyhow::{bail, Context};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use std::path::PathBuf;
use std::time::SystemTime;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

/// `ambit pki inspect` flags.
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// PEM files (a bundle, an issuer, a workload chain, ...).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Output format: text, or json.
    #[arg(short, long, default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
}

/// What one certificate is.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Described {
    /// The subject, as OpenSSL prints it.
    pub subject: String,
    /// The issuer's name, as written in the certificate.
    pub issuer: String,
    /// basicConstraints cA.
    pub ca: bool,
    /// Signed by its own key.
    pub self_signed: bool,
    /// `trust anchor`, `issuer` or `workload`.
    pub role: &'static str,
    /// The trust domain its `spiffe://` URI SAN names, if it has one.
    pub trust_domain: Option<String>,
    /// A workload's SPIFFE ID (its URI SAN with a path).
    pub spiffe_id: Option<String>,
    /// SHA-256 of the DER certificate, lowercase hex.
    pub sha256: String,
    /// notBefore, as OpenSSL prints it.
    pub not_before: String,
    /// notAfter, as OpenSSL prints it.
    pub not_after: String,
    /// notAfter, seconds since the Unix epoch.
    pub not_after_unix: i64,
    #[serde(skip)]
    der: Vec<u8>,
}

/// Describes every certificate of `pem`.
pub fn describe_pem(pem: &str) -> anyhow::Result<Vec<Described>> {
    let ders = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("not valid PEM: {e}"))?;
    ders.iter()
        .enumerate()
        .map(|(i, d)| describe(d).with_context(|| format!("certificate #{}", i + 1)))
        .collect()
}

fn describe(der: &CertificateDer<'_>) -> anyhow::Result<Described> {
    let (_, c) = X509Certificate::from_der(der).map_err(|e| anyhow::anyhow!("not X.509: {e}"))?;
    let uri = c.subject_alternative_name().ok().flatten().and_then(|san| {
        san.value.general_names.iter().find_map(|n| match n {
            GeneralName::URI(u) => Some(u.to_string()),
            _ => None,
        })
    });
    let spiffe = uri.as_deref().and_then(|u| u.strip_prefix("spiffe://"));
    let trust_domain = spiffe.map(|rest| rest.split('/').next().unwrap_or_default().to_string());
    let spiffe_id = uri
        .clone()
        .filter(|_| spiffe.is_some_and(|r| r.contains('/')));
    let self_signed = c.subject() == c.issuer() && c.verify_signature(Some(c.public_key())).is_ok();
    let ca = c.is_ca();
    Ok(Described {
        subject: c.subject().to_string(),
        issuer: c.issuer().to_string(),
        ca,
        self_signed,
        role: match (ca, self_signed) {
            (true, true) => "trust anchor",
            (true, false) => "issuer",
            (false, _) => "workload",
        },
        trust_domain,
        spiffe_id,
        sha256: ambit_control::pki::sha256_hex(der),
        not_before: c.validity().not_before.to_string(),
        not_after: c.validity().not_after.to_string(),
        not_after_unix: c.validity().not_after.timestamp(),
        der: der.to_vec(),
    })
}

/// Seconds since the Unix epoch.
pub fn unix(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A certificate of the files, and which of them signed it.
#[derive(Debug, serde::Serialize)]
struct Found {
    file: String,
    /// Position in its file, from 1.
    index: usize,
    #[serde(flatten)]
    cert: Described,
    /// `file#index` of the certificate whose key signed it (itself for a root), if among
    /// the files given.
    signed_by: Option<String>,
    /// Days until notAfter (negative: expired).
    days_left: i64,
}

/// Which of `all` signed `cert` (its subject is `cert`'s issuer and its key verifies the
/// signature).
fn signer(cert: &Described, all: &[(String, usize, Described)]) -> Option<String> {
    let (_, c) = X509Certificate::from_der(&cert.der).ok()?;
    all.iter().find_map(|(file, index, candidate)| {
        let (_, k) = X509Certificate::from_der(&candidate.der).ok()?;
        (candidate.ca
            && k.subject() == c.issuer()
            && c.verify_signature(Some(k.public_key())).is_ok())
        .then(|| format!("{file}#{index}"))
    })
}

fn found(files: &[(String, String)], now: SystemTime) -> anyhow::Result<Vec<Found>> {
    let mut all = Vec::new();
    for (name, pem) in files {
        let described = describe_pem(pem).with_context(|| name.clone())?;
        if described.is_empty() {
            bail!("{name}: no CERTIFICATE block found");
        }
        for (i, d) in described.into_iter().enumerate() {
            all.push((name.clone(), i + 1, d));
        }
    }
    Ok(all
        .iter()
        .map(|(file, index, cert)| Found {
            file: file.clone(),
            index: *index,
            signed_by: signer(cert, &all),
            days_left: (cert.not_after_unix - unix(now)).div_euclid(86_400),
            cert: cert.clone(),
        })
        .collect())
}

fn render(found: &[Found]) -> String {
    let mut out = String::new();
    for f in found {
        let c = &f.cert;
        out += &format!("{}#{}  {}\n", f.file, f.index, c.role);
        out += &format!("  subject       {}\n", c.subject);
        if let Some(id) = &c.spiffe_id {
            out += &format!("  identity      {id}\n");
        } else if let Some(td) = &c.trust_domain {
            out += &format!("  trust domain  {td}\n");
        }
        out += &format!("  sha256        {}\n", c.sha256);
        let left = if f.days_left < 0 {
            format!("EXPIRED {} days ago", -f.days_left)
        } else {
            format!("{} days left", f.days_left)
        };
        out += &format!(
            "  valid         {} .. {} ({left})\n",
            c.not_before, c.not_after
        );
        let by = match &f.signed_by {
            Some(s) if s == &format!("{}#{}", f.file, f.index) => "itself".to_string(),
            Some(s) => s.clone(),
            None => format!("{} (not among the files given)", c.issuer),
        };
        out += &format!("  signed by     {by}\n");
    }
    out
}

/// Runs `ambit pki inspect`.
pub fn run(args: &InspectArgs) -> anyhow::Result<()> {
    let mut files = Vec::new();
    for p in &args.files {
        let pem = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        files.push((p.display().to_string(), pem));
    }
    let found = found(&files, SystemTime::now())?;
    if args.output == "json" {
        println!("{}", serde_json::to_string_pretty(&found)?);
    } else {
        print!("{}", render(&found));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use ambit_control::pki::generate::{issuer, trust_anchor, Validity};
    use std::time::Duration;

    fn lasting(days: u64) -> Validity {
        Validity::starting_now(Duration::from_secs(days * 86_400))
    }

    #[test]
    fn tells_which_anchor_signed_which_issuer_though_their_names_are_the_same() {
        let (old, new) = (
            trust_anchor("cluster.local", lasting(3650)).unwrap(),
            trust_anchor("cluster.local", lasting(3650)).unwrap(),
        );
        let iss = issuer(&new, "cluster.local", lasting(365)).unwrap();
        let files = vec![
            (
                "bundle.pem".to_string(),
                format!("{}{}", old.cert_pem, new.cert_pem),
            ),
            ("issuer.crt".to_string(), iss.cert_pem.clone()),
        ];
        let f = found(&files, SystemTime::now()).unwrap();
        assert_eq!(f.len(), 3);
        assert_eq!(f[0].cert.subject, f[1].cert.subject, "same names");
        assert_eq!(
            [f[0].cert.role, f[1].cert.role, f[2].cert.role],
            ["trust anchor", "trust anchor", "issuer"]
        );
        assert_eq!(f[0].signed_by.as_deref(), Some("bundle.pem#1"));
        assert_eq!(
            f[2].signed_by.as_deref(),
            Some("bundle.pem#2"),
            "the new anchor"
        );
        assert_eq!(f[2].cert.trust_domain.as_deref(), Some("cluster.local"));
        assert!((364..=365).contains(&f[2].days_left), "{}", f[2].days_left);
        let text = render(&f);
        assert!(text.contains("issuer.crt#1  issuer\n"), "{text}");
        assert!(text.contains("  signed by     bundle.pem#2\n"), "{text}");
        assert!(text.contains("  signed by     itself\n"), "{text}");
        assert!(text.contains(&f[1].cert.sha256), "{text}");

        // Alone, the issuer's signer is not known.
        let f = found(&files[1..], SystemTime::now()).unwrap();
        assert_eq!(f[0].signed_by, None);
        assert!(render(&f).contains("(not among the files given)"));
    }

    #[test]
    fn a_file_without_certificates_is_an_error_naming_it() {
        let err = found(&[("x.pem".into(), "hello".into())], SystemTime::now()).unwrap_err();
        assert!(
            format!("{err:#}").contains("x.pem: no CERTIFICATE block"),
            "{err:#}"
        );
    }
}
