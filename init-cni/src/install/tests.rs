#![allow(clippy::unwrap_used)]

use super::*;

const BRIDGE_CONF: &str = r#"{
  "cniVersion": "1.0.0",
  "name": "podnet",
  "type": "bridge",
  "bridge": "cni0",
  "isGateway": true,
  "ipam": {"type": "host-local", "subnet": "10.88.0.0/16"}
}"#;

fn entry() -> Value {
    plugin_entry(
        "/var/run/ambit/cni.sock",
        "35s",
        &["kube-system".to_string()],
    )
}

fn read(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn a_single_conf_becomes_a_conflist_ending_with_the_plugin() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("10-bridge.conf"), BRIDGE_CONF).unwrap();
    let change = chain(dir.path(), &entry()).unwrap();
    let list = dir.path().join("10-bridge.conflist");
    assert_eq!(change, Change::Written(list.clone()));
    assert!(
        !dir.path().join("10-bridge.conf").exists(),
        "the .conf is replaced"
    );
    let v = read(&list);
    assert_eq!(v["cniVersion"], "1.0.0");
    assert_eq!(v["name"], "podnet");
    let plugins = v["plugins"].as_array().unwrap();
    assert_eq!(plugins.len(), 2);
    assert_eq!(plugins[0]["type"], "bridge");
    assert_eq!(plugins[0]["ipam"]["subnet"], "10.88.0.0/16");
    assert!(plugins[0].get("name").is_none() && plugins[0].get("cniVersion").is_none());
    assert_eq!(plugins[1], entry());
}

#[test]
fn chaining_is_idempotent_and_restores_the_entry_after_a_rewrite() {
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("05-cilium.conflist");
    let primary = r#"{"cniVersion":"1.0.0","name":"cilium","plugins":[{"type":"cilium-cni"},{"type":"portmap"}]}"#;
    std::fs::write(&list, primary).unwrap();
    assert_eq!(
        chain(dir.path(), &entry()).unwrap(),
        Change::Written(list.clone())
    );
    assert_eq!(chain(dir.path(), &entry()).unwrap(), Change::Unchanged);
    // The primary CNI writes its file again, without us.
    std::fs::write(&list, primary).unwrap();
    assert_eq!(
        chain(dir.path(), &entry()).unwrap(),
        Change::Written(list.clone())
    );
    let v = read(&list);
    let types: Vec<_> = v["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(types, ["cilium-cni", "portmap", "ambit-cni"]);
    // New settings replace the old entry rather than add a second one.
    let other = plugin_entry("/run/other.sock", "10s", &[]);
    chain(dir.path(), &other).unwrap();
    let v = read(&list);
    let ours: Vec<_> = v["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] == "ambit-cni")
        .collect();
    assert_eq!(ours, [&other]);
}

#[test]
fn the_primary_is_the_first_file_by_name_and_others_are_untouched() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("20-other.conflist"),
        r#"{"cniVersion":"1.0.0","name":"b","plugins":[{"type":"x"}]}"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("10-first.conflist"),
        r#"{"cniVersion":"1.0.0","name":"a","plugins":[{"type":"y"}]}"#,
    )
    .unwrap();
    std::fs::write(dir.path().join(".hidden.conflist"), "{}").unwrap();
    std::fs::write(dir.path().join("README"), "not a conf").unwrap();
    chain(dir.path(), &entry()).unwrap();
    assert_eq!(
        read(&dir.path().join("10-first.conflist"))["plugins"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        read(&dir.path().join("20-other.conflist"))["plugins"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn missing_or_broken_configuration_is_reported_with_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let e = chain(dir.path(), &entry()).unwrap_err();
    assert!(matches!(e, InstallError::NoPrimary(_)), "{e}");
    assert!(
        e.to_string()
            .contains("install the cluster's network plugin first"),
        "{e}"
    );
    std::fs::write(dir.path().join("10-bad.conflist"), "{\"plugins\": [").unwrap();
    let e = chain(dir.path(), &entry()).unwrap_err();
    assert!(
        e.to_string().contains("10-bad.conflist") && e.to_string().contains("not valid JSON"),
        "{e}"
    );
    std::fs::write(dir.path().join("10-bad.conflist"), r#"{"plugins": 3}"#).unwrap();
    let e = chain(dir.path(), &entry()).unwrap_err();
    assert!(e.to_string().contains("\"plugins\" is not a list"), "{e}");
}

#[test]
fn uninstall_takes_the_entry_out_and_the_binary_copy_is_atomic_and_executable() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("10-bridge.conf"), BRIDGE_CONF).unwrap();
    chain(dir.path(), &entry()).unwrap();
    let list = dir.path().join("10-bridge.conflist");
    assert_eq!(unchain(dir.path()).unwrap(), Change::Written(list.clone()));
    let plugins = read(&list)["plugins"].as_array().unwrap().clone();
    assert_eq!(plugins.len(), 1);
    assert_eq!(plugins[0]["type"], "bridge");
    assert_eq!(unchain(dir.path()).unwrap(), Change::Unchanged);

    let bin = tempfile::tempdir().unwrap();
    let src = dir.path().join("src-binary");
    std::fs::write(&src, b"\x7fELF pretend").unwrap();
    let target = install_binary(&src, bin.path()).unwrap();
    assert_eq!(std::fs::read(&target).unwrap(), b"\x7fELF pretend");
    assert_eq!(
        std::fs::metadata(&target).unwrap().permissions().mode() & 0o777,
        0o755
    );
    let names: Vec<_> = std::fs::read_dir(bin.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names,
        [std::ffi::OsString::from("ambit-cni")],
        "no temporary file left behind"
    );
}
