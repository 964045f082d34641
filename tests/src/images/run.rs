//! A container of the chart's, as a kubelet would start it.

use super::{podman, Container, Images};
use serde_json::Value;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// What a volume mount is backed by in this test: a folder of its own, with files in it
/// for a ConfigMap or Secret (written with the volume's mode), or a host folder.
#[derive(Debug)]
pub enum Source {
    /// Files (name, content) of a ConfigMap or Secret.
    Files(Vec<(&'static str, String)>),
    /// A folder of the test's, in place of a hostPath.
    Dir(PathBuf),
}

/// Starts `image` as the chart runs `chart` (one of render.py's entries): its mounts
/// backed by `sources` (by volume name; every mount must have one), with `env` over the
/// chart's, `extra` flags (network, further mounts) and `args` after the chart's.
pub fn run_as_chart(
    images: &Images,
    image: &str,
    chart: &Value,
    sources: BTreeMap<&str, Source>,
    scratch: &Path,
    env: &[(&str, String)],
    extra: &[String],
) -> Container {
    let rt = &chart["runtime"];
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let name = format!("ambit-test-{}-{image}-{n}", std::process::id());
    let _ = podman(&["rm".into(), "-f".into(), name.clone()]);
    let mut flags: Vec<String> = vec!["run".into(), "-d".into(), "--name".into(), name.clone()];
    flags.extend(images.engine.iter().cloned());
    let uid = rt["user"].as_u64();
    let gid = rt["group"].as_u64().or(uid.map(|_| 0));
    if let Some(uid) = uid {
        flags.extend(["--user".into(), format!("{uid}:{}", gid.unwrap())]);
    }
    if let Some(fs_group) = rt["fsGroup"].as_u64() {
        flags.extend(["--group-add".into(), fs_group.to_string()]);
    }
    if rt["readOnlyRootFilesystem"] == true {
        flags.push("--read-only".into());
    }
    if rt["privileged"] == true {
        flags.push("--privileged".into());
    }
    if rt["allowPrivilegeEscalation"] == false {
        flags.extend(["--security-opt".into(), "no-new-privileges".into()]);
    }
    for cap in rt["capabilities"]["drop"].as_array().unwrap() {
        flags.extend(["--cap-drop".into(), cap.as_str().unwrap().into()]);
    }
    for cap in rt["capabilities"]["add"].as_array().unwrap() {
        flags.extend(["--cap-add".into(), cap.as_str().unwrap().into()]);
    }
    let mut sources = sources;
    for m in rt["mounts"].as_array().unwrap() {
        let volume = m["name"].as_str().unwrap();
        let source = sources.remove(volume).unwrap_or_else(|| {
            panic!("the chart mounts volume {volume}: the test has no source for it")
        });
        let host = match source {
            Source::Dir(d) => d,
            Source::Files(files) => kubelet_volume(scratch, volume, m, rt, &files),
        };
        let mut opts = Vec::new();
        if m["readOnly"] == true {
            opts.push("ro");
        }
        if m["propagation"] == "Bidirectional" {
            opts.push("rshared");
        }
        let opts = if opts.is_empty() {
            String::new()
        } else {
            format!(":{}", opts.join(","))
        };
        flags.extend([
            "-v".into(),
            format!(
                "{}:{}{opts}",
                host.display(),
                m["mountPath"].as_str().unwrap()
            ),
        ]);
    }
    assert!(
        sources.is_empty(),
        "volumes the chart does not mount: {:?}",
        sources.keys().collect::<Vec<_>>()
    );
    let mut vars: BTreeMap<String, String> = chart["env"]
        .as_object()
        .unwrap()
        .iter()
        .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
        .collect();
    vars.extend(env.iter().map(|(k, v)| (k.to_string(), v.clone())));
    for (k, v) in vars {
        flags.extend(["-e".into(), format!("{k}={v}")]);
    }
    flags.extend(extra.iter().cloned());
    // Kubernetes' `command` replaces the image's ENTRYPOINT; `args` follow it.
    if let Some(command) = rt["command"].as_array() {
        let command: Vec<&str> = command.iter().map(|c| c.as_str().unwrap()).collect();
        flags.extend([
            "--entrypoint".into(),
            serde_json::to_string(&command).unwrap(),
        ]);
    }
    flags.push(images.refs[image].clone());
    let args: Vec<String> = serde_json::from_value(chart["args"].clone()).unwrap();
    flags.extend(args);
    let out = podman(&flags);
    assert!(
        out.status.success(),
        "podman {flags:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Container { name }
}

/// A ConfigMap or Secret volume as the kubelet writes it: files owned by root, with the
/// volume's `defaultMode`; with the pod's `fsGroup`, group-owned by it and group-readable.
pub fn kubelet_volume(
    scratch: &Path,
    volume: &str,
    mount: &Value,
    rt: &Value,
    files: &[(&str, String)],
) -> PathBuf {
    let dir = scratch.join(format!("volume-{volume}"));
    std::fs::create_dir_all(&dir).unwrap();
    let fs_group = rt["fsGroup"].as_u64().map(|g| g as u32);
    let mut mode = mount["defaultMode"].as_u64().unwrap_or(0o644) as u32;
    if fs_group.is_some() {
        mode |= 0o440;
    }
    for (name, content) in files {
        let path = dir.join(name);
        std::fs::write(&path, content).unwrap();
        std::os::unix::fs::chown(&path, Some(0), Some(fs_group.unwrap_or(0))).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    std::os::unix::fs::chown(&dir, Some(0), Some(fs_group.unwrap_or(0))).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}
