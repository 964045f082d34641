//! The Helm chart and the binaries cannot drift: the `ambit` chart is rendered by the
//! real Helm v4 library (`tests/helm/render.py`), and what it sets — every environment
//! variable and argument of the control plane, the node proxy and the CNI installer — is
//! given to the real binaries' own argument parsers and then run: the control plane on
//! `--backend kube` against the fake API server, a node proxy that authenticates with the
//! chart's token audience and trusts the chart's control-plane identity, and the real
//! installer chaining the plugin into a CNI configuration directory. Run as root, after
//! `scripts/install-python-tools.sh` (`scripts/test.sh` does both).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use ambit_e2e::cni::Cluster;
use ambit_e2e::kube::FakeKube;
use ambit_e2e::{http_get, node_token, ControlPlane, NodeProxy};
use ambit_proxy::proxy::Redirect;
use clap::CommandFactory;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

const CNI: &str = env!("CARGO_BIN_EXE_ambit-cni-e2e");

/// The venv's python, as `scripts/install-python-tools.sh` made it.
fn python() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let p = std::env::var_os("AMBIT_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/venv/bin/python"));
    assert!(
        p.is_file(),
        "{} not found: run ./scripts/install-python-tools.sh (./scripts/test.sh does), or set AMBIT_PYTHON",
        p.display()
    );
    p
}

/// How the chart runs each binary: `{"control"|"proxy"|"cni": {"args", "env"}}`.
fn rendered(sets: &[&str]) -> Value {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("helm");
    let mut cmd = Command::new(python());
    cmd.arg("render.py").current_dir(&dir);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "render.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The chart's environment for one binary as flags of `cmd`, by each flag's `env =`
/// name: an environment variable the binary does not read fails the test. Variables
/// whose value comes from the cluster (`valueFrom`) are left out.
fn env_as_flags(cmd: &clap::Command, env: &Value) -> Vec<String> {
    let by_env: BTreeMap<String, String> = cmd
        .get_arguments()
        .filter_map(|a| {
            let env = a.get_env()?.to_string_lossy().into_owned();
            Some((env, a.get_long()?.to_string()))
        })
        .collect();
    let mut flags = Vec::new();
    for (name, value) in env.as_object().unwrap() {
        let long = by_env.get(name).unwrap_or_else(|| {
            panic!(
                "the chart sets {name}, which {} does not read",
                cmd.get_name()
            )
        });
        if let Some(v) = value.as_str() {
            flags.push(format!("--{long}"));
            flags.push(v.to_string());
        }
    }
    flags
}

/// Flags without the ones named (the test supplies its own for those).
fn without(flags: Vec<String>, drop: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = flags.into_iter();
    while let Some(flag) = it.next() {
        let value = it.next().unwrap();
        if !drop.contains(&flag.as_str()) {
            out.push(flag);
            out.push(value);
        }
    }
    out
}

fn install(fake: &FakeKube) {
    fake.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ambit"}}));
    fake.apply(json!({"apiVersion": "v1", "kind": "ServiceAccount",
                      "metadata": {"name": "ambit-proxy", "namespace": "ambit"}}));
    fake.apply(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "ambit-proxy-x1", "namespace": "ambit", "uid": "9d3c1c52-0000-4000-8000-000000000001"},
        "spec": {"nodeName": "node-a", "serviceAccountName": "ambit-proxy",
                 "containers": [{"name": "ambit-proxy", "image": "ambit-proxy"}]},
        "status": {"phase": "Running", "podIP": "192.0.2.10"}}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binaries_run_with_what_the_chart_renders() {
    ambit_e2e::init_test_logging();
    let chart = rendered(&[]);

    // The control plane, configured by the chart's Deployment; the in-cluster paths of
    // its PKI and the API server are this test's.
    let control_cmd = ambit_control::config::Config::command();
    assert_eq!(chart["control"]["args"], json!([]));
    let control_flags = env_as_flags(&control_cmd, &chart["control"]["env"]);
    let control_flags = without(
        control_flags,
        &[
            "--backend",
            "--trust-anchors",
            "--issuer-cert",
            "--issuer-key",
            "--identity-addr",
            "--discovery-addr",
            "--admin-addr",
        ],
    );
    let fake = FakeKube::start().await;
    install(&fake);
    // The token the kubelet projects for the chart's audience.
    let audience = chart["proxy"]["env"]["AMBIT_TOKEN_AUDIENCE"]
        .as_str()
        .or(chart["control"]["env"]["AMBIT_TOKEN_AUDIENCE"].as_str())
        .unwrap()
        .to_string();
    fake.add_pod_token(
        &node_token("node-a"),
        "ambit",
        "ambit-proxy-x1",
        &[&audience],
    );
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    fake.kubeconfig(&kubeconfig);
    let flags: Vec<&str> = control_flags.iter().map(String::as_str).collect();
    let cp = ControlPlane::start_kube(&kubeconfig, &flags).await;

    // A node proxy, configured by the chart's DaemonSet; node-specific paths and the
    // control plane's address are this test's.
    let proxy_cmd = ambit_proxy::config::Config::command();
    assert_eq!(chart["proxy"]["args"], json!([]));
    let mut argv = vec!["ambit-proxy".to_string()];
    argv.extend(env_as_flags(&proxy_cmd, &chart["proxy"]["env"]));
    argv.extend(["--node-name".into(), "node-a".into()]);
    let from_chart = <ambit_proxy::config::Config as clap::Parser>::try_parse_from(&argv)
        .unwrap_or_else(|e| panic!("ambit-proxy {argv:?}: {e}"));
    assert_eq!(from_chart.redirect, Redirect::Auto);
    assert_eq!(
        from_chart.token_file,
        PathBuf::from("/var/run/secrets/ambit/token")
    );
    let c = Arc::new(Cluster::new(
        "chart-e2e",
        &["node-a", "node-b"],
        Path::new(CNI),
    ));
    let node = c.node("node-a").proxy_config(&cp, Redirect::Ebpf);
    let config = ambit_proxy::config::Config {
        node_name: node.node_name,
        identity_url: node.identity_url,
        discovery_url: node.discovery_url,
        token_file: node.token_file,
        trust_anchors: node.trust_anchors,
        admin_addr: node.admin_addr,
        bpf_pin_dir: node.bpf_pin_dir,
        cgroup_path: node.cgroup_path,
        run_dir: node.run_dir,
        cni_socket: node.cni_socket,
        // The chart's value, /host/proc, is the host's /proc mounted into the pod.
        proc_root: PathBuf::from("/proc"),
        ..from_chart
    };
    let proxy = NodeProxy::start_config(config).await;
    // Ready: discovery streamed (TokenReview accepted the chart's audience and the
    // proxies' ServiceAccount) and the control plane proved the identity the chart pins.
    let mut ready = (0, String::new());
    for _ in 0..200 {
        ready = http_get(proxy.admin_addr, "/ready").await;
        if ready.0 == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(ready.0, 200, "{}", ready.1);
    let m = cp.metrics().await;
    assert!(!m.contains("node_authentication_refused_total{"), "{m}");

    // The real installer with the chart's arguments and environment, into this test's
    // CNI directories (the chart mounts the host's at /host/...).
    let cni = &chart["cni"];
    let bin_dir = dir.path().join("cni-bin");
    let conf_dir = dir.path().join("cni-conf");
    std::fs::create_dir_all(&bin_dir).unwrap();
    std::fs::create_dir_all(&conf_dir).unwrap();
    std::fs::write(
        conf_dir.join("10-bridge.conflist"),
        r#"{"cniVersion": "1.0.0", "name": "k8s", "plugins": [{"type": "bridge"}]}"#,
    )
    .unwrap();
    let args: Vec<String> = serde_json::from_value(cni["args"].clone()).unwrap();
    assert_eq!(args[..2], ["install".to_string(), "--watch".to_string()]);
    // Once, not watching: without --watch, --owner-daemonset (what the installer does when
    // it stops, tests/images.rs) goes too.
    let owner = args.iter().position(|a| a == "--owner-daemonset").unwrap();
    assert_eq!(args[owner + 1], "ambit/ambit-proxy", "{args:?}");
    let mut installer = Command::new(CNI);
    installer.args(
        args.iter()
            .enumerate()
            .filter(|(i, a)| *a != "--watch" && *i != owner && *i != owner + 1)
            .map(|(_, a)| a),
    );
    for (name, value) in cni["env"].as_object().unwrap() {
        let value = value.as_str().unwrap();
        let local = match name.as_str() {
            "AMBIT_CNI_BIN_DIR" => bin_dir.to_string_lossy().into_owned(),
            "AMBIT_CNI_CONF_DIR" => conf_dir.to_string_lossy().into_owned(),
            _ => value.to_string(),
        };
        assert!(
            value.starts_with("/host/") || !name.ends_with("_DIR"),
            "{name}={value}"
        );
        installer.env(name, local);
    }
    let out = installer.output().unwrap();
    assert!(
        out.status.success(),
        "ambit-cni {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: Value = serde_json::from_str(
        &std::fs::read_to_string(conf_dir.join("10-bridge.conflist")).unwrap(),
    )
    .unwrap();
    let ours = &list["plugins"][1];
    assert_eq!(ours["type"], "ambit-cni", "{list}");
    assert_eq!(ours["socket"], "/var/run/ambit/cni.sock", "{list}");
    let excluded: Vec<String> = serde_json::from_value(ours["exclude_namespaces"].clone()).unwrap();
    assert!(excluded.contains(&"ambit".to_string()), "{list}");
    assert!(bin_dir.join("ambit-cni").is_file());

    proxy.stop().await;
    cp.stop().await;
}
