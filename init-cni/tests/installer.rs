//! The installer as the DaemonSet runs it: the real binary, `install --watch` keeping the
//! plugin chained while the primary CNI rewrites its file, then `uninstall`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ambit-cni");
const PRIMARY: &str = r#"{"cniVersion":"1.0.0","name":"podnet","plugins":[{"type":"bridge","bridge":"cni0","ipam":{"type":"host-local","subnet":"10.88.0.0/16"}}]}"#;

/// Ends the watcher (by pid) even when the test fails.
struct Watcher(Child);

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn types(path: &Path) -> Vec<String> {
    let Ok(bytes) = std::fs::read(path) else {
        return Vec::new();
    };
    let Ok(v) = serde_json::from_slice::<Value>(&bytes) else {
        return Vec::new();
    };
    v["plugins"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .filter_map(|p| p["type"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn wait_for(what: &str, ok: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn install_watch_keeps_the_plugin_chained_and_uninstall_takes_it_out() {
    let dir = tempfile::tempdir().unwrap();
    let (bin, conf) = (dir.path().join("bin"), dir.path().join("net.d"));
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&conf).unwrap();
    let list = conf.join("10-podnet.conflist");
    let watcher = Watcher(
        Command::new(BIN)
            .arg("install")
            .arg("--cni-bin-dir")
            .arg(&bin)
            .arg("--cni-conf-dir")
            .arg(&conf)
            .args(["--watch", "--watch-interval", "50ms"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // The binary is in place at once; the primary CNI's file comes later (node boot).
    wait_for("the binary", || bin.join("ambit-cni").exists());
    assert_eq!(
        std::fs::read(bin.join("ambit-cni")).unwrap(),
        std::fs::read(BIN).unwrap()
    );
    std::fs::write(&list, PRIMARY).unwrap();
    wait_for("the plugin to be chained", || {
        types(&list) == ["bridge", "ambit-cni"]
    });
    // The primary CNI rewrites its configuration: the entry comes back.
    std::fs::write(&list, PRIMARY).unwrap();
    wait_for("the entry to be restored", || {
        types(&list) == ["bridge", "ambit-cni"]
    });
    drop(watcher);
    // Stopping the installer leaves the plugin in place (fail closed)...
    assert_eq!(types(&list), ["bridge", "ambit-cni"]);
    // ...uninstall takes it out, and the binary.
    let out = Command::new(BIN)
        .arg("uninstall")
        .arg("--cni-bin-dir")
        .arg(&bin)
        .arg("--cni-conf-dir")
        .arg(&conf)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(types(&list), ["bridge"]);
    assert!(!bin.join("ambit-cni").exists());
}

#[test]
fn install_without_a_primary_configuration_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .arg("install")
        .arg("--cni-bin-dir")
        .arg(dir.path())
        .arg("--cni-conf-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("install the cluster's network plugin first"),
        "{err}"
    );
}
