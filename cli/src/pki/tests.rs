#![allow(clippy::unwrap_used)]
use super::*;

fn pem(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap()
}

#[test]
fn a_new_issuer_is_signed_by_the_anchor_given_and_refused_with_a_foreign_key() {
    let d = tempfile::tempdir().unwrap();
    let (a, b, iss) = (d.path().join("a"), d.path().join("b"), d.path().join("iss"));
    anchor_new(&a, "cluster.local", DEFAULT_ANCHOR_LIFETIME, false).unwrap();
    anchor_new(&b, "cluster.local", DEFAULT_ANCHOR_LIFETIME, false).unwrap();
    let err = anchor_new(&a, "cluster.local", DEFAULT_ANCHOR_LIFETIME, false).unwrap_err();
    assert!(err.to_string().contains("--force"), "{err}");

    let cert = a.join(TRUST_ANCHOR_CERT);
    issuer_new(
        (&cert, &a.join(TRUST_ANCHOR_KEY)),
        &iss,
        "cluster.local",
        DEFAULT_ISSUER_LIFETIME,
        false,
    )
    .unwrap();
    let all = inspect::describe_pem(&format!(
        "{}{}",
        pem(&a, TRUST_ANCHOR_CERT),
        pem(&iss, ISSUER_CERT)
    ))
    .unwrap();
    assert_eq!(all[1].role, "issuer");
    assert_eq!(all[1].issuer, all[0].subject);

    // The anchor's certificate with another anchor's key: refused, nothing written.
    let err = issuer_new(
        (&cert, &b.join(TRUST_ANCHOR_KEY)),
        &d.path().join("bad"),
        "cluster.local",
        DEFAULT_ISSUER_LIFETIME,
        false,
    )
    .unwrap_err();
    assert!(format!("{err:#}").contains("public keys differ"), "{err:#}");
    assert!(!d.path().join("bad").join(ISSUER_CERT).exists());

    // Longer than the anchor, or of another trust domain: refused.
    let err = issuer_new(
        (&cert, &a.join(TRUST_ANCHOR_KEY)),
        &iss,
        "cluster.local",
        Duration::from_secs(4000 * 86_400),
        true,
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("outlive its trust anchor"),
        "{err}"
    );
    let err = issuer_new(
        (&cert, &a.join(TRUST_ANCHOR_KEY)),
        &iss,
        "example.org",
        DEFAULT_ISSUER_LIFETIME,
        true,
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("is a root of trust domain cluster.local"),
        "{err}"
    );
}
