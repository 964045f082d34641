//! `ambit pki init`, run as a user runs it, checked with openssl.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

fn ambit(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ambit"))
        .args(args)
        .output()
        .unwrap()
}

fn openssl(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn writes_a_trust_anchor_and_an_issuer_that_openssl_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pki");
    let res = ambit(&[
        "pki",
        "init",
        "--out",
        out.to_str().unwrap(),
        "--trust-domain",
        "example.org",
    ]);
    assert!(
        res.status.success(),
        "{}",
        String::from_utf8_lossy(&res.stderr)
    );

    for (name, mode) in [
        ("trust-anchor.crt", 0o644),
        ("trust-anchor.key", 0o600),
        ("issuer.crt", 0o644),
        ("issuer.key", 0o600),
    ] {
        let m = std::fs::metadata(out.join(name))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(m, mode, "{name} mode {m:o}");
    }
    assert_eq!(
        openssl(
            &out,
            &[
                "verify",
                "-x509_strict",
                "-CAfile",
                "trust-anchor.crt",
                "issuer.crt"
            ]
        )
        .trim(),
        "issuer.crt: OK"
    );
    let root = openssl(
        &out,
        &["x509", "-in", "trust-anchor.crt", "-noout", "-text"],
    );
    assert!(
        root.contains("X509v3 Basic Constraints: critical\n                CA:TRUE"),
        "{root}"
    );
    assert!(
        root.contains("X509v3 Key Usage: critical\n                Certificate Sign, CRL Sign"),
        "{root}"
    );
    assert!(
        root.contains("Subject: CN = root.ambit.example.org"),
        "{root}"
    );
    assert!(root.contains("ASN1 OID: prime256v1"), "{root}");
    let issuer = openssl(&out, &["x509", "-in", "issuer.crt", "-noout", "-text"]);
    assert!(issuer.contains("CA:TRUE, pathlen:0"), "{issuer}");
    assert!(
        issuer.contains("Issuer: CN = root.ambit.example.org"),
        "{issuer}"
    );
    // Lifetimes: ~10 years and ~1 year.
    let end = |f: &str| {
        let s = openssl(
            &out,
            &[
                "x509",
                "-in",
                f,
                "-noout",
                "-checkend",
                &(9 * 365 * 86400).to_string(),
            ],
        );
        s.contains("will not expire")
    };
    assert!(end("trust-anchor.crt"));
    let out2 = Command::new("openssl")
        .current_dir(&out)
        .args([
            "x509",
            "-in",
            "issuer.crt",
            "-noout",
            "-checkend",
            &(366 * 86400).to_string(),
        ])
        .output()
        .unwrap();
    assert!(!out2.status.success(), "the issuer lives about a year");
    // The key matches its certificate.
    let pubkey_cert = openssl(&out, &["x509", "-in", "issuer.crt", "-noout", "-pubkey"]);
    let pubkey_key = openssl(&out, &["pkey", "-in", "issuer.key", "-pubout"]);
    assert_eq!(pubkey_cert, pubkey_key);
}

#[test]
fn refuses_to_overwrite_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    assert!(ambit(&["pki", "init", "--out", out]).status.success());
    let before = std::fs::read(dir.path().join("issuer.key")).unwrap();
    let res = ambit(&["pki", "init", "--out", out]);
    assert!(!res.status.success());
    let err = String::from_utf8_lossy(&res.stderr);
    assert!(
        err.contains("refusing to overwrite") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(dir.path().join("issuer.key")).unwrap(),
        before,
        "nothing was touched"
    );
    assert!(ambit(&["pki", "init", "--out", out, "--force"])
        .status
        .success());
    assert_ne!(
        std::fs::read(dir.path().join("issuer.key")).unwrap(),
        before
    );
}

#[test]
fn rejects_an_invalid_trust_domain() {
    let dir = tempfile::tempdir().unwrap();
    let res = ambit(&[
        "pki",
        "init",
        "--out",
        dir.path().to_str().unwrap(),
        "--trust-domain",
        "Bad Domain",
    ]);
    assert!(!res.status.success());
    assert!(String::from_utf8_lossy(&res.stderr).contains("invalid trust domain"));
}
