//! `ambit-control` refuses to start, with a message that says what to do, when its CA
//! material or configuration is unusable.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use ambit_control::pki::generate::{issuer, trust_anchor, Validity};
use std::process::Command;
use std::time::Duration;

struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("cluster")).unwrap();
        std::fs::write(
            dir.path().join("tokens.yaml"),
            "nodes:\n  node-a: 0123456789abcdef0123\n",
        )
        .unwrap();
        Self { dir }
    }

    fn write(&self, name: &str, text: &str) {
        std::fs::write(self.dir.path().join(name), text).unwrap();
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// Runs the binary; it must exit (with an error) rather than serve.
    fn run(&self, extra: &[&str]) -> (bool, String) {
        let out = self.command(extra).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// The binary with this setup's files and loopback ports, then `extra`.
    fn command(&self, extra: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ambit-control"));
        c.args([
            "--trust-anchors",
            &self.path("root.crt"),
            "--issuer-cert",
            &self.path("issuer.crt"),
            "--issuer-key",
            &self.path("issuer.key"),
        ])
        .args([
            "--local-dir",
            &self.path("cluster"),
            "--node-tokens",
            &self.path("tokens.yaml"),
        ])
        .args([
            "--identity-addr",
            "127.0.0.1:0",
            "--discovery-addr",
            "127.0.0.1:0",
            "--policy-addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
        ])
        .args(extra);
        c
    }
}

fn good_pki(s: &Setup) {
    let root = trust_anchor(
        "cluster.local",
        Validity::starting_now(Duration::from_secs(86400 * 3650)),
    )
    .unwrap();
    let iss = issuer(
        &root,
        "cluster.local",
        Validity::starting_now(Duration::from_secs(86400 * 365)),
    )
    .unwrap();
    s.write("root.crt", &root.cert_pem);
    s.write("issuer.crt", &iss.cert_pem);
    s.write("issuer.key", &iss.key_pem);
}

#[test]
fn expired_issuer_stops_start_up() {
    let s = Setup::new();
    let root = trust_anchor(
        "cluster.local",
        Validity::starting_now(Duration::from_secs(86400 * 3650)),
    )
    .unwrap();
    let now = time::OffsetDateTime::now_utc();
    let iss = issuer(
        &root,
        "cluster.local",
        Validity {
            not_before: now - time::Duration::days(30),
            not_after: now - time::Duration::hours(1),
        },
    )
    .unwrap();
    s.write("root.crt", &root.cert_pem);
    s.write("issuer.crt", &iss.cert_pem);
    s.write("issuer.key", &iss.key_pem);
    let (ok, err) = s.run(&[]);
    assert!(!ok);
    assert!(
        err.contains("issuer certificate")
            && err.contains("expired at")
            && err.contains("ambit pki init"),
        "{err}"
    );
}

#[test]
fn mismatched_issuer_key_stops_start_up() {
    let s = Setup::new();
    good_pki(&s);
    let root = trust_anchor(
        "cluster.local",
        Validity::starting_now(Duration::from_secs(86400)),
    )
    .unwrap();
    let other = issuer(
        &root,
        "cluster.local",
        Validity::starting_now(Duration::from_secs(3600)),
    )
    .unwrap();
    s.write("issuer.key", &other.key_pem);
    let (ok, err) = s.run(&[]);
    assert!(!ok);
    assert!(err.contains("does not match issuer certificate"), "{err}");
}

#[test]
fn issuer_outside_the_bundle_stops_start_up() {
    let s = Setup::new();
    good_pki(&s);
    let other_root = trust_anchor(
        "cluster.local",
        Validity::starting_now(Duration::from_secs(86400)),
    )
    .unwrap();
    s.write("root.crt", &other_root.cert_pem);
    let (ok, err) = s.run(&[]);
    assert!(!ok);
    assert!(
        err.contains("does not chain to any root in trust bundle"),
        "{err}"
    );
}

#[test]
fn every_configuration_problem_is_reported_at_once() {
    let s = Setup::new();
    good_pki(&s);
    std::fs::remove_dir(s.dir.path().join("cluster")).unwrap();
    let (ok, err) = s.run(&["--cert-lifetime", "10s", "--trust-domain", "Bad Domain"]);
    assert!(!ok);
    for want in ["--cert-lifetime", "--trust-domain", "is not a directory"] {
        assert!(err.contains(want), "missing {want:?} in {err}");
    }
    let (ok, err) = s.run(&["--cert-lifetime", "24 hours"]);
    assert!(!ok);
    assert!(err.contains("not a duration"), "{err}");
}

#[test]
fn invalid_local_state_stops_start_up_naming_the_file() {
    let s = Setup::new();
    good_pki(&s);
    s.write(
        "cluster/pods.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec: {nodename: a, containers: []}\n",
    );
    let (ok, err) = s.run(&[]);
    assert!(!ok);
    assert!(
        err.contains("pods.yaml (document 1): Pod web: field `spec.nodename`: unknown field"),
        "{err}"
    );
}

/// `--log-format json` (the chart's `logFormat`): every log line is one JSON object, and
/// no terminal escape codes reach a pod's log.
#[test]
fn json_logs_are_one_object_per_line() {
    use std::io::BufRead;
    let s = Setup::new();
    good_pki(&s);
    let (_, err) = s.run(&["--log-format", "yaml"]);
    assert!(
        err.contains("invalid value 'yaml' for '--log-format"),
        "{err}"
    );
    // A good configuration: it serves, logging as it starts; read its first lines, then
    // stop it (by its pid).
    let mut child = s
        .command(&["--log-format", "json"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stderr = child.stderr.take().unwrap();
    let _kill = Kill(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            if tx.send(line.unwrap_or_default()).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(20)) {
        let loaded = line.contains("loaded local cluster state");
        lines.push(line);
        if loaded {
            break;
        }
    }
    assert!(
        lines
            .iter()
            .any(|l| l.contains("loaded local cluster state")),
        "{lines:#?}"
    );
    for l in &lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
        assert!(
            v["level"].is_string() && v["fields"]["message"].is_string(),
            "{l}"
        );
        assert!(!l.contains('\u{1b}'), "escape codes: {l:?}");
    }
}
