//! The chart's images run as the chart runs them (`tests/tests/images.rs`): what
//! `scripts/images.sh` built, the chart as `tests/helm/render.py` renders it, and a
//! kubelet's share of the work turned into `podman run` flags.
//!
//! - [`run`]: a container of the chart's, its volumes backed by the test's folders and
//!   files, owned and moded as the kubelet makes them.
//! - [`mounts`]: the node's side of hostPath volumes (shared mounts, cgroup parents).
//! - [`files`]: an image's files, read from `podman export`, to check the chart against.

use ambit_proxy::netns::Netns;
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub mod files;
pub mod mounts;
pub mod run;

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// What `scripts/images.sh` built: each image's reference, and the flags podman needs
/// on this machine.
#[derive(Debug)]
pub struct Images {
    /// Each image's reference, by "control", "proxy", "cni".
    pub refs: BTreeMap<String, String>,
    /// The flags `podman run` needs on this machine.
    pub engine: Vec<String>,
}

pub fn images() -> Images {
    let file = root().join("target/images/images.json");
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| {
        panic!(
            "{}: {e}: build the images first with ./scripts/images.sh (./scripts/test.sh does)",
            file.display()
        )
    });
    let v: Value = serde_json::from_str(&text).unwrap();
    let refs = ["control", "proxy", "cni"]
        .iter()
        .map(|k| (k.to_string(), v[k].as_str().unwrap().to_string()))
        .collect();
    let engine = serde_json::from_value(v["engine"].clone()).unwrap();
    Images { refs, engine }
}

/// The chart as render.py prints it: `{"control"|"proxy"|"cni": {args, env, runtime}}`.
pub fn rendered() -> Value {
    let python = std::env::var_os("AMBIT_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/venv/bin/python"));
    let out = Command::new(&python)
        .arg("render.py")
        .current_dir(root().join("tests/helm"))
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}: run ./scripts/install-python-tools.sh",
                python.display()
            )
        });
    assert!(
        out.status.success(),
        "render.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

pub fn podman(args: &[String]) -> Output {
    Command::new("podman").args(args).output().unwrap()
}

/// A container of this test's, removed (by name) when dropped.
#[derive(Debug)]
pub struct Container {
    /// Its name.
    pub name: String,
}

impl Container {
    /// Its output so far.
    pub fn logs(&self) -> String {
        let out = podman(&["logs".into(), self.name.clone()]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// A field of its `.State`.
    pub fn state(&self, field: &str) -> String {
        let out = podman(&[
            "inspect".into(),
            "--format".into(),
            format!("{{{{.State.{field}}}}}"),
            self.name.clone(),
        ]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// `podman stop` (SIGTERM, as the kubelet ends a pod) and the exit code.
    pub fn stop(&self) -> i64 {
        let out = podman(&["stop".into(), "-t".into(), "20".into(), self.name.clone()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.state("ExitCode").parse().unwrap()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman(&[
            "rm".into(),
            "-f".into(),
            "-t".into(),
            "0".into(),
            self.name.clone(),
        ]);
    }
}

/// An HTTP/1.1 GET inside `netns`; the status code, or why there is none.
pub async fn get_in(netns: &Netns, addr: SocketAddr, path: &str) -> Result<u16, String> {
    let mut s = tokio::time::timeout(Duration::from_secs(2), netns.connect(addr, 0))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| e.to_string())?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: ambit\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut answer))
        .await
        .map_err(|_| "no answer".to_string())?
        .map_err(|e| e.to_string())?;
    answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or(format!("not HTTP: {answer:?}"))
}

/// Polls `f` until it is true (at most `within`), else fails with the container's logs.
pub async fn until(
    c: &Container,
    what: &str,
    within: Duration,
    mut f: impl AsyncFnMut() -> Result<bool, String>,
) {
    let deadline = Instant::now() + within;
    loop {
        let last = f().await;
        if last == Ok(true) {
            return;
        }
        assert!(
            c.state("Running") == "true" || last.is_ok(),
            "{what}: the container exited ({}): {last:?}\n{}",
            c.state("ExitCode"),
            c.logs()
        );
        assert!(
            Instant::now() < deadline,
            "{what}: not within {within:?}: {last:?}\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
