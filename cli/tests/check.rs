//! `ambit check` against a real control plane and node proxy (the e2e harness), run as the
//! `ambit` binary: all √ and exit 0 on a healthy mesh; an issuer expiring in 30 days is ‼
//! with exit 0, and non-zero with `--strict`; a wrong trust bundle is × with a hint.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use ambit_control::pki::generate::{issuer, trust_anchor, Validity};
use ambit_e2e::{ControlPlane, NodeProxy, NAMESPACES};
use serde_json::Value;
use std::process::Command;
use std::time::Duration;

const AMBIT: &str = env!("CARGO_BIN_EXE_ambit");

async fn check(
    cp: &ControlPlane,
    proxy: &NodeProxy,
    anchors: &str,
    extra: &[&str],
) -> (i32, Value) {
    let dir = tempfile::tempdir().unwrap();
    let roots = dir.path().join("roots.pem");
    let iss = dir.path().join("issuer.crt");
    std::fs::write(&roots, anchors).unwrap();
    std::fs::write(&iss, &cp.issuer.cert_pem).unwrap();
    let mut args = vec![
        "check".to_string(),
        "--proxy".into(),
        "-o".into(),
        "json".into(),
        "--trust-anchors".into(),
        roots.display().to_string(),
        "--issuer-cert".into(),
        iss.display().to_string(),
        "--identity-url".into(),
        cp.identity_url(),
        "--control-admin".into(),
        format!("http://{}", cp.admin_addr),
        "--proxy-admin".into(),
        format!("http://{}", proxy.admin_addr),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let out =
        tokio::task::spawn_blocking(move || Command::new(AMBIT).args(&args).output().unwrap())
            .await
            .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code().unwrap_or(-1), report)
}

fn results(report: &Value) -> Vec<(String, String)> {
    report["categories"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["checks"].as_array().unwrap().iter())
        .map(|c| {
            (
                c["result"].as_str().unwrap().to_string(),
                c["description"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

const CLUSTER: &str = "---\napiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: shop}\n\
    spec: {nodeName: node-a, serviceAccountName: web, containers: []}\n\
    status: {podIP: 10.99.0.2, phase: Running}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_mesh_is_all_success_and_problems_say_what_to_do() {
    let cp = ControlPlane::start(&format!("{NAMESPACES}{CLUSTER}"), &["node-a"]).await;
    let proxy = NodeProxy::start(&cp, "node-a").await;
    let (code, report) = check(&cp, &proxy, &cp.root.cert_pem, &[]).await;
    let r = results(&report);
    assert_eq!(code, 0, "{r:?}");
    assert!(r.iter().all(|(s, _)| s == "success"), "{r:?}");
    for want in [
        "the issuer chains to a trust anchor",
        "the control plane serves TLS as spiffe://cluster.local/ns/ambit/sa/ambit-control",
        "spiffe://cluster.local/ns/shop/sa/web: its certificate is issued under the current trust anchors",
        "runs the control plane's version",
        "trusts the roots of --trust-anchors",
    ] {
        assert!(r.iter().any(|(_, d)| d.contains(want)), "{want} in {r:?}");
    }
    // Another bundle: the control plane's TLS and the proxy's certificates are refused.
    let other = trust_anchor(
        "cluster.local",
        Validity::starting_now(Duration::from_secs(86400 * 3650)),
    )
    .unwrap();
    let (code, report) = check(&cp, &proxy, &other.cert_pem, &[]).await;
    assert_eq!(code, 1);
    let failed: Vec<_> = report["categories"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["checks"].as_array().unwrap().iter())
        .filter(|c| c["result"] == "error")
        .collect();
    let described: Vec<_> = failed
        .iter()
        .map(|c| c["description"].as_str().unwrap())
        .collect();
    assert!(
        described.contains(&"the issuer chains to a trust anchor"),
        "{described:?}"
    );
    assert!(
        described
            .iter()
            .any(|d| d.starts_with("the control plane serves TLS")),
        "{described:?}"
    );
    assert!(failed
        .iter()
        .all(|c| c["hint"].as_str().is_some_and(|h| !h.is_empty())));
    proxy.stop().await;
    cp.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_issuer_expiring_in_30_days_warns_and_fails_only_with_strict() {
    let root = trust_anchor(
        "cluster.local",
        Validity::starting_now(Duration::from_secs(86400 * 3650)),
    )
    .unwrap();
    let iss = issuer(
        &root,
        "cluster.local",
        Validity::starting_now(Duration::from_secs(86400 * 30)),
    )
    .unwrap();
    let cp = ControlPlane::start_with_pki(
        &format!("{NAMESPACES}{CLUSTER}"),
        &["node-a"],
        "127.0.0.1:0".parse().unwrap(),
        root.clone(),
        iss,
    )
    .await;
    let proxy = NodeProxy::start(&cp, "node-a").await;
    let (code, report) = check(&cp, &proxy, &root.cert_pem, &[]).await;
    let r = results(&report);
    assert_eq!(code, 0, "{r:?}");
    assert_eq!(
        r.iter()
            .filter(|(s, _)| s == "warning")
            .map(|(_, d)| d.as_str())
            .collect::<Vec<_>>(),
        ["the issuer certificate is valid for at least 60 days"]
    );
    let (code, _) = check(&cp, &proxy, &root.cert_pem, &["--strict"]).await;
    assert_eq!(code, 1);
    proxy.stop().await;
    cp.stop().await;
}
