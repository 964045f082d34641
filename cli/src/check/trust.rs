//! The mesh's PKI as files: the trust anchors are valid for at least 60 days (‼ below,
//! × expired), the issuer too, and the issuer chains to one of the anchors.

use super::report::Check;
use ambit_control::pki::parse_certificates;
use std::path::Path;
use std::time::{Duration, SystemTime};
use x509_parser::certificate::X509Certificate;
use x509_parser::prelude::FromDer;

/// Below this, a certificate's remaining life is a warning (Linkerd's threshold).
pub const WARN_WITHIN: Duration = Duration::from_secs(60 * 24 * 3600);

/// What is wrong with `cert`'s validity at `now`, as a check named `what`.
pub fn validity(what: &str, cert: &X509Certificate<'_>, now: SystemTime) -> Check {
    let secs = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
            .unwrap_or(0)
    };
    let (now, not_before, not_after) = (
        secs(now),
        cert.validity().not_before.timestamp(),
        cert.validity().not_after.timestamp(),
    );
    let description = format!("{what} is valid for at least 60 days");
    let days = |s: i64| s / 86_400;
    if now < not_before {
        return Check::fail(
            description,
            format!(
                "not valid before {} ({} days from now)",
                cert.validity().not_before,
                days(not_before - now)
            ),
            "check the clock of this machine; or reissue the certificate",
        );
    }
    if now >= not_after {
        return Check::fail(
            description,
            format!("expired on {} ({} days ago)", cert.validity().not_after, days(now - not_after)),
            "the mesh refuses every certificate under it: rotate it now (docs/OPERATIONS.md, `ambit pki`)",
        );
    }
    let left = not_after - now;
    if left < i64::try_from(WARN_WITHIN.as_secs()).unwrap_or(i64::MAX) {
        return Check::warn(
            description,
            format!(
                "expires on {} (in {} days)",
                cert.validity().not_after,
                days(left)
            ),
            "rotate it before it expires (docs/OPERATIONS.md, `ambit pki`)",
        );
    }
    Check::ok(description)
}

/// The checks of the trust anchors (`anchors_pem`) and, when given, the issuer
/// (`issuer_pem`, its certificate first) at `now`.
pub fn checks(
    anchors: (&Path, &[u8]),
    issuer: Option<(&Path, &[u8])>,
    now: SystemTime,
) -> Vec<Check> {
    let mut out = Vec::new();
    let roots = match parse_certificates(anchors.0, anchors.1, "trust anchors") {
        Ok(r) => r,
        Err(e) => {
            out.push(Check::fail(
                "the trust anchors can be read",
                e,
                "pass the trust bundle the mesh uses (--trust-anchors; the chart's identityTrustAnchorsPEM)",
            ));
            return out;
        }
    };
    let mut parsed = Vec::new();
    for (i, der) in roots.iter().enumerate() {
        match X509Certificate::from_der(der) {
            Ok((_, c)) => parsed.push(c),
            Err(e) => out.push(Check::fail(
                "the trust anchors can be read",
                format!(
                    "{}: certificate {} is not valid X.509: {e}",
                    anchors.0.display(),
                    i + 1
                ),
                "the bundle must hold PEM-encoded X.509 certificates",
            )),
        }
    }
    if parsed.is_empty() {
        return out;
    }
    out.push(Check::ok(format!(
        "the trust anchors can be read ({} in {})",
        parsed.len(),
        anchors.0.display()
    )));
    for (i, root) in parsed.iter().enumerate() {
        let name = format!("trust anchor {} ({})", i + 1, root.subject());
        if !root.is_ca() {
            out.push(Check::fail(
                format!("{name} is a CA"),
                "its basicConstraints do not say CA",
                "a trust anchor must be a CA certificate (`ambit pki init` makes one)",
            ));
        }
        out.push(validity(&name, root, now));
    }
    let Some((path, pem)) = issuer else {
        return out;
    };
    let chain = match parse_certificates(path, pem, "issuer certificate") {
        Ok(c) => c,
        Err(e) => {
            out.push(Check::fail(
                "the issuer certificate can be read",
                e,
                "pass the issuer the control plane signs with (--issuer-cert; the chart's identity.issuer)",
            ));
            return out;
        }
    };
    let issuer = match X509Certificate::from_der(&chain[0]) {
        Ok((_, c)) => c,
        Err(e) => {
            out.push(Check::fail(
                "the issuer certificate can be read",
                format!("{}: not valid X.509: {e}", path.display()),
                "the issuer file must hold a PEM-encoded X.509 certificate",
            ));
            return out;
        }
    };
    out.push(Check::ok(format!(
        "the issuer certificate can be read ({})",
        issuer.subject()
    )));
    if !issuer.is_ca() {
        out.push(Check::fail(
            "the issuer is a CA",
            "its basicConstraints do not say CA",
            "the issuer signs workload certificates and must be an intermediate CA",
        ));
    }
    out.push(validity("the issuer certificate", &issuer, now));
    let signer = parsed.iter().find(|root| {
        root.subject() == issuer.issuer()
            && issuer.verify_signature(Some(root.public_key())).is_ok()
    });
    out.push(match signer {
        Some(root) => Check::ok(format!("the issuer chains to a trust anchor ({})", root.subject())),
        None => Check::fail(
            "the issuer chains to a trust anchor",
            format!(
                "the issuer was signed by {:?}, which is none of the {} anchor(s), or the signature does not verify",
                issuer.issuer().to_string(),
                parsed.len()
            ),
            "every workload certificate would be refused: add the issuer's anchor to the bundle, or issue a new issuer from one of the anchors",
        ),
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::report::Status;
    use ambit_control::pki::generate::{issuer, trust_anchor, Validity};
    use time::OffsetDateTime;

    fn lasting(days: i64) -> Validity {
        let now = OffsetDateTime::now_utc();
        Validity {
            not_before: now - time::Duration::days(400),
            not_after: now + time::Duration::days(days),
        }
    }

    fn results(checks: &[Check]) -> Vec<(Status, String)> {
        checks
            .iter()
            .map(|c| (c.result, c.description.clone()))
            .collect()
    }

    fn run(anchor_days: i64, issuer_days: i64, other_anchor: bool) -> Vec<Check> {
        let root =
            trust_anchor("cluster.local", lasting(anchor_days)).unwrap_or_else(|e| panic!("{e}"));
        let signer = if other_anchor {
            trust_anchor("cluster.local", lasting(3650)).unwrap_or_else(|e| panic!("{e}"))
        } else {
            root.clone()
        };
        let iss = issuer(&signer, "cluster.local", lasting(issuer_days))
            .unwrap_or_else(|e| panic!("{e}"));
        checks(
            (Path::new("roots.pem"), root.cert_pem.as_bytes()),
            Some((Path::new("issuer.crt"), iss.cert_pem.as_bytes())),
            SystemTime::now(),
        )
    }

    #[test]
    fn a_healthy_pki_is_all_success() {
        let c = run(3650, 365, false);
        assert!(
            c.iter().all(|c| c.result == Status::Success),
            "{:?}",
            results(&c)
        );
        assert!(c.iter().any(|c| c
            .description
            .starts_with("the issuer chains to a trust anchor")));
    }

    #[test]
    fn an_issuer_expiring_in_30_days_is_a_warning() {
        let c = run(3650, 30, false);
        let warned: Vec<_> = c.iter().filter(|c| c.result == Status::Warning).collect();
        assert_eq!(warned.len(), 1, "{:?}", results(&c));
        assert_eq!(
            warned[0].description,
            "the issuer certificate is valid for at least 60 days"
        );
        let error = warned[0].error.clone().unwrap_or_default();
        assert!(
            error.contains("in 29 days") || error.contains("in 30 days"),
            "{error}"
        );
        assert!(!c.iter().any(|c| c.result == Status::Error));
    }

    #[test]
    fn an_expired_issuer_is_an_error_with_a_hint() {
        let c = run(3650, -2, false);
        let failed: Vec<_> = c.iter().filter(|c| c.result == Status::Error).collect();
        assert_eq!(failed.len(), 1, "{:?}", results(&c));
        assert!(failed[0]
            .error
            .clone()
            .unwrap_or_default()
            .contains("expired on"));
        assert!(failed[0]
            .hint
            .clone()
            .unwrap_or_default()
            .contains("rotate it now"));
    }

    #[test]
    fn an_issuer_from_another_anchor_is_an_error() {
        let c = run(3650, 365, true);
        let failed: Vec<_> = c.iter().filter(|c| c.result == Status::Error).collect();
        assert_eq!(failed.len(), 1, "{:?}", results(&c));
        assert_eq!(failed[0].description, "the issuer chains to a trust anchor");
    }

    #[test]
    fn an_expired_anchor_and_a_not_yet_valid_one_are_errors() {
        let c = run(-1, -2, false);
        assert!(c
            .iter()
            .any(|c| c.result == Status::Error && c.description.starts_with("trust anchor 1")));
        let future = trust_anchor(
            "cluster.local",
            Validity {
                not_before: OffsetDateTime::now_utc() + time::Duration::days(3),
                not_after: OffsetDateTime::now_utc() + time::Duration::days(3000),
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let c = checks(
            (Path::new("r.pem"), future.cert_pem.as_bytes()),
            None,
            SystemTime::now(),
        );
        let err = c
            .iter()
            .find(|c| c.result == Status::Error)
            .map(|c| c.error.clone());
        assert!(
            matches!(&err, Some(Some(e)) if e.contains("not valid before")),
            "{err:?}"
        );
        // Unreadable input is an error naming the file, not a panic.
        let c = checks((Path::new("junk.pem"), b"junk"), None, SystemTime::now());
        assert_eq!(c.len(), 1);
        assert!(c[0].error.clone().unwrap_or_default().contains("junk.pem"));
    }
}
