//! `ambit version` against a real node proxy (its `proxy_build_info`), and `ambit
//! completion` as bash runs it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use ambit_e2e::{ControlPlane, NodeProxy, NAMESPACES};
use serde_json::Value;
use std::process::Command;

const AMBIT: &str = env!("CARGO_BIN_EXE_ambit");
const VERSION: &str = env!("CARGO_PKG_VERSION");

fn ambit(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(AMBIT).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_prints_the_clients_and_each_proxys_and_names_one_that_does_not_answer() {
    let cp = ControlPlane::start(NAMESPACES, &["node-a"]).await;
    let proxy = NodeProxy::start(&cp, "node-a").await;
    let admin = format!("http://{}", proxy.admin_addr);
    // A loopback port nothing listens on: the second "node".
    let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gone_url = format!("http://{}", gone.local_addr().unwrap());
    drop(gone);
    let (ok, out, err) = ambit(&["version", "--proxy-admin", &admin, &gone_url]);
    assert!(ok, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], format!("Client version: {VERSION}"), "{out}");
    assert!(
        lines.contains(&format!("Proxy version: {VERSION} {admin}/metrics").as_str()),
        "{out}"
    );
    let unavailable = format!("Proxy version: unavailable {gone_url}/metrics: ");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with(&unavailable) && l.contains("cannot connect")),
        "{out}"
    );

    let (ok, out, err) = ambit(&["version", "-o", "json", "--proxy-admin", &admin]);
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["client"]["version"], VERSION, "{v}");
    assert_eq!(
        v["proxies"][format!("{admin}/metrics")]["version"],
        VERSION,
        "{v}"
    );

    let (ok, out, _) = ambit(&["version", "--client"]);
    assert!(ok);
    assert_eq!(out, format!("Client version: {VERSION}\n"));
    proxy.stop().await;
    cp.stop().await;
}

/// The bash script is what bash loads, and completes subcommands and flags.
#[test]
fn completion_scripts_complete_commands_in_bash() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let (ok, out, err) = ambit(&["completion", shell]);
        assert!(
            ok && out.contains("version") && out.contains("stat"),
            "{shell}: {err}"
        );
    }
    let (_, script, _) = ambit(&["completion", "bash"]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ambit.bash");
    std::fs::write(&file, &script).unwrap();
    let complete =
        |line: &str| {
            let words: Vec<&str> = line.split(' ').collect();
            let program =
                format!(
            "source {}; COMP_WORDS=({}); COMP_CWORD={}; COMP_LINE='{line}'; COMP_POINT={}; \
             _ambit ambit '{}' '{}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            file.display(),
            words.iter().map(|w| format!("'{w}'")).collect::<Vec<_>>().join(" "),
            words.len() - 1,
            line.len(),
            words[words.len() - 1],
            words[words.len() - 2],
        );
            let out = Command::new("bash")
                .args(["-c", &program])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
    let subcommands = complete("ambit ver");
    assert_eq!(subcommands.trim(), "version", "{subcommands}");
    let flags = complete("ambit version --cl");
    assert_eq!(flags.trim(), "--client", "{flags}");
    let all = complete("ambit st");
    assert!(all.lines().any(|l| l == "stat"), "{all}");
}
