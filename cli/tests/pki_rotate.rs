//! The `ambit pki` commands of a rotation, run as a user runs them (docs/OPERATIONS.md),
//! checked with openssl: a new anchor, the bundle with both, a new issuer signed by the new
//! anchor, the bundle without the old one; `inspect` says which anchor signed which issuer.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use std::path::Path;
use std::process::{Command, Output};

fn ambit(dir: &Path, args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_ambit"))
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ambit {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `openssl verify` of `cert` against `bundle`: whether it verifies.
fn verifies(dir: &Path, bundle: &str, cert: &str) -> bool {
    Command::new("openssl")
        .current_dir(dir)
        .args(["verify", "-x509_strict", "-CAfile", bundle, cert])
        .output()
        .unwrap()
        .status
        .success()
}

fn inspect(dir: &Path, files: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec!["pki", "inspect", "-o", "json"];
    args.extend_from_slice(files);
    let out = ambit(dir, &args);
    serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn the_rotation_steps_make_files_openssl_verifies_at_each_step() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    ambit(dir, &["pki", "init", "--out", "old"]);
    std::fs::copy(dir.join("old/trust-anchor.crt"), dir.join("ca-bundle.crt")).unwrap();

    // 1. A new anchor, added to the bundle (twice: the second changes nothing).
    ambit(dir, &["pki", "anchor", "new", "--out", "new"]);
    for _ in 0..2 {
        ambit(
            dir,
            &[
                "pki",
                "bundle",
                "add",
                "--bundle",
                "ca-bundle.crt",
                "new/trust-anchor.crt",
            ],
        );
    }
    let roots = inspect(dir, &["ca-bundle.crt"]);
    assert_eq!(roots.len(), 2);
    assert!(verifies(dir, "ca-bundle.crt", "old/issuer.crt"));

    // 2. A new issuer signed by the new anchor.
    ambit(
        dir,
        &[
            "pki",
            "issuer",
            "new",
            "--anchor-cert",
            "new/trust-anchor.crt",
            "--anchor-key",
            "new/trust-anchor.key",
            "--out",
            "new",
        ],
    );
    assert!(verifies(dir, "ca-bundle.crt", "new/issuer.crt"));
    assert!(verifies(dir, "new/trust-anchor.crt", "new/issuer.crt"));
    assert!(!verifies(dir, "old/trust-anchor.crt", "new/issuer.crt"));
    let seen = inspect(dir, &["ca-bundle.crt", "new/issuer.crt", "old/issuer.crt"]);
    let by = |file: &str| {
        seen.iter()
            .find(|c| c["file"] == file)
            .and_then(|c| c["signed_by"].as_str())
            .unwrap()
            .to_string()
    };
    assert_eq!(by("new/issuer.crt"), "ca-bundle.crt#2");
    assert_eq!(by("old/issuer.crt"), "ca-bundle.crt#1");
    assert_eq!(seen[0]["trust_domain"], "cluster.local");

    // 3. The old anchor removed (by its file; by fingerprint works too, to stdout).
    let old_fp = inspect(dir, &["old/trust-anchor.crt"])[0]["sha256"]
        .as_str()
        .unwrap()
        .to_string();
    let out = ambit(
        dir,
        &[
            "pki",
            "bundle",
            "remove",
            "--bundle",
            "ca-bundle.crt",
            "--sha256",
            &old_fp[..16],
            "--out",
            "-",
        ],
    );
    let printed = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        printed,
        std::fs::read_to_string(dir.join("new/trust-anchor.crt")).unwrap()
    );
    assert_eq!(
        inspect(dir, &["ca-bundle.crt"]).len(),
        2,
        "--out -: the file is untouched"
    );
    ambit(
        dir,
        &[
            "pki",
            "bundle",
            "remove",
            "--bundle",
            "ca-bundle.crt",
            "old/trust-anchor.crt",
        ],
    );
    assert_eq!(inspect(dir, &["ca-bundle.crt"]).len(), 1);
    assert!(verifies(dir, "ca-bundle.crt", "new/issuer.crt"));
    assert!(!verifies(dir, "ca-bundle.crt", "old/issuer.crt"));

    // Never to an empty bundle.
    let out = Command::new(env!("CARGO_BIN_EXE_ambit"))
        .current_dir(dir)
        .args([
            "pki",
            "bundle",
            "remove",
            "--bundle",
            "ca-bundle.crt",
            "new/trust-anchor.crt",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("empty"));
    assert_eq!(inspect(dir, &["ca-bundle.crt"]).len(), 1);
}
