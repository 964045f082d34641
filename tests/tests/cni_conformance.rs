//! `ambit-cni` against the CNI spec: every command in every supported version, and each
//! kind of bad input answered with the spec's error code — the real binary, run the way a
//! runtime runs it, talking to a real node proxy. Run as root (pods are network
//! namespaces).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use ambit_e2e::netns::Topology;
use ambit_e2e::{ControlPlane, NodeProxy, NAMESPACES};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

const CNI: &str = env!("CARGO_BIN_EXE_ambit-cni-e2e");
const VERSIONS: [&str; 3] = ["0.4.0", "1.0.0", "1.1.0"];

fn cluster(t: &Topology) -> String {
    format!(
        r#"{NAMESPACES}---
apiVersion: v1
kind: Pod
metadata: {{name: web, namespace: shop}}
spec: {{nodeName: node-a, serviceAccountName: web, containers: []}}
status: {{podIP: {}, phase: Running}}
---
apiVersion: v1
kind: Pod
metadata: {{name: away, namespace: shop}}
spec: {{nodeName: node-b, serviceAccountName: web, containers: []}}
status: {{podIP: 10.77.9.9, phase: Running}}
---
apiVersion: v1
kind: Pod
metadata: {{name: old, namespace: legacy}}
spec: {{nodeName: node-a, containers: []}}
status: {{podIP: {}, phase: Running}}
"#,
        t.pod("web").ip,
        t.pod("old").ip
    )
}

/// One invocation's outcome.
#[derive(Debug)]
struct Run {
    status: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }

    /// The error code of a failed run (checking the spec's error shape).
    fn error_code(&self) -> u64 {
        assert_ne!(self.status, 0, "expected a failure: {self:?}");
        let e = self.json();
        for field in ["cniVersion", "msg", "details"] {
            assert!(e[field].is_string(), "error without {field}: {self:?}");
        }
        e["code"].as_u64().unwrap()
    }
}

fn cni(env: &[(&str, &str)], stdin: &str) -> Run {
    let mut cmd = Command::new(CNI);
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = ambit_e2e::cni::run_with_stdin(&mut cmd, stdin.as_bytes());
    Run {
        status: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// What the primary plugin returned, in `version`'s shape.
fn prev_result(version: &str, ip: std::net::Ipv4Addr, netns: &str) -> Value {
    let mut addr = json!({"address": format!("{ip}/24"), "gateway": "10.77.0.1", "interface": 0});
    if version == "0.4.0" {
        addr["version"] = json!("4");
    }
    json!({
        "cniVersion": version,
        "interfaces": [{"name": "eth0", "mac": "0a:58:0a:4d:00:02", "sandbox": netns}],
        "ips": [addr],
        "dns": {},
    })
}

struct Pod<'a> {
    namespace: &'a str,
    name: &'a str,
    netns: String,
    ip: std::net::Ipv4Addr,
}

fn conf(version: &str, socket: &Path, pod: &Pod<'_>, with_prev: bool) -> String {
    let mut c = json!({
        "cniVersion": version,
        "name": "podnet",
        "type": "ambit-cni",
        "socket": socket,
        "timeout": "10s",
    });
    if with_prev {
        c["prevResult"] = prev_result(version, pod.ip, &pod.netns);
    }
    c.to_string()
}

fn env<'a>(
    command: &'a str,
    pod: &'a Pod<'a>,
    cid: &'a str,
    args: &'a str,
) -> Vec<(&'a str, &'a str)> {
    vec![
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", cid),
        ("CNI_NETNS", pod.netns.as_str()),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/usr/lib/cni"),
        ("CNI_ARGS", args),
    ]
}

fn k8s_args(pod: &Pod<'_>) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID=x",
        pod.namespace, pod.name
    )
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_in_every_version_against_a_real_proxy() {
    let t = Topology::new(&["web", "old"]);
    let cp = ControlPlane::start(&cluster(&t), &["node-a"]).await;
    let mut config = NodeProxy::config(&cp, "node-a");
    let socket = cp.dir.path().join("cni.sock");
    config.cni_socket = socket.clone();
    config.cni_add_timeout = std::time::Duration::from_secs(1);
    let _handles = ambit_e2e::NetnsHandles(config.run_dir.clone());
    let proxy = NodeProxy::start_config(config).await;
    let web = Pod {
        namespace: "shop",
        name: "web",
        netns: t.pod("web").path(),
        ip: t.pod("web").ip,
    };
    let old = Pod {
        namespace: "legacy",
        name: "old",
        netns: t.pod("old").path(),
        ip: t.pod("old").ip,
    };
    let (web_args, old_args) = (k8s_args(&web), k8s_args(&old));

    for version in VERSIONS {
        let (socket, web_args, old_args) = (socket.clone(), web_args.clone(), old_args.clone());
        let web = Pod {
            netns: web.netns.clone(),
            ..web
        };
        let old = Pod {
            netns: old.netns.clone(),
            ..old
        };
        blocking(move || {
            let cid = format!("sandbox-{version}");
            // VERSION echoes the asked version and lists the supported ones.
            let v = cni(
                &[("CNI_COMMAND", "VERSION")],
                &json!({"cniVersion": version}).to_string(),
            );
            assert_eq!(v.status, 0, "{v:?}");
            assert_eq!(
                v.json(),
                json!({"cniVersion": version, "supportedVersions": VERSIONS})
            );

            // ADD passes prevResult through unchanged, meshed pod or not.
            for (pod, args) in [(&web, &web_args), (&old, &old_args)] {
                let add = cni(
                    &env("ADD", pod, &cid, args),
                    &conf(version, &socket, pod, true),
                );
                assert_eq!(add.status, 0, "ADD {} in {version}: {add:?}", pod.name);
                assert_eq!(
                    add.json(),
                    prev_result(version, pod.ip, &pod.netns),
                    "{version}"
                );
            }
            // CHECK: the meshed pod is redirected.
            let check = cni(
                &env("CHECK", &web, &cid, &web_args),
                &conf(version, &socket, &web, true),
            );
            assert_eq!((check.status, check.stdout.as_str()), (0, ""), "{check:?}");
            // STATUS and GC exist from 1.1.0 on.
            let status = cni(
                &env("STATUS", &web, &cid, ""),
                &conf(version, &socket, &web, false),
            );
            let gc_conf = {
                let mut c: Value =
                    serde_json::from_str(&conf(version, &socket, &web, false)).unwrap();
                c["cni.dev/valid-attachments"] = json!([{"containerID": cid, "ifname": "eth0"}]);
                c.to_string()
            };
            let gc = cni(&env("GC", &web, &cid, ""), &gc_conf);
            if version == "1.1.0" {
                assert_eq!(
                    (status.status, status.stdout.as_str()),
                    (0, ""),
                    "{status:?}"
                );
                assert_eq!((gc.status, gc.stdout.as_str()), (0, ""), "{gc:?}");
                // The sandbox GC kept is still redirected.
                let check = cni(
                    &env("CHECK", &web, &cid, &web_args),
                    &conf(version, &socket, &web, true),
                );
                assert_eq!(check.status, 0, "{check:?}");
            } else {
                assert_eq!(status.error_code(), 1, "{status:?}");
                assert_eq!(gc.error_code(), 1, "{gc:?}");
            }
            // DEL, twice: idempotent, no output.
            for _ in 0..2 {
                let del = cni(
                    &env("DEL", &web, &cid, &web_args),
                    &conf(version, &socket, &web, true),
                );
                assert_eq!((del.status, del.stdout.as_str()), (0, ""), "{del:?}");
            }
            // Once deleted, CHECK reports the meshed pod as not redirected.
            let check = cni(
                &env("CHECK", &web, &cid, &web_args),
                &conf(version, &socket, &web, true),
            );
            assert_eq!(check.error_code(), 101, "{check:?}");
        })
        .await;
    }

    // GC drops sandboxes the runtime no longer has.
    {
        let (socket, web_args) = (socket.clone(), web_args.clone());
        let web = Pod {
            netns: web.netns.clone(),
            ..web
        };
        blocking(move || {
            let add = cni(
                &env("ADD", &web, "stale", &web_args),
                &conf("1.1.0", &socket, &web, true),
            );
            assert_eq!(add.status, 0, "{add:?}");
            let mut c: Value = serde_json::from_str(&conf("1.1.0", &socket, &web, false)).unwrap();
            // A GC without the list, or with an empty one, drops nothing: the pod stays
            // redirected.
            let gc = cni(&env("GC", &web, "", ""), &c.to_string());
            assert_eq!(gc.error_code(), 7, "{gc:?}");
            c["cni.dev/valid-attachments"] = json!([]);
            let gc = cni(&env("GC", &web, "", ""), &c.to_string());
            assert_eq!(gc.error_code(), 7, "{gc:?}");
            c["cni.dev/valid-attachments"] = json!([{"ifname": "eth0"}]);
            let gc = cni(&env("GC", &web, "", ""), &c.to_string());
            assert_eq!(gc.error_code(), 7, "{gc:?}");
            let check = cni(
                &env("CHECK", &web, "stale", &web_args),
                &conf("1.1.0", &socket, &web, true),
            );
            assert_eq!(check.status, 0, "{check:?}");
            // A GC that lists the sandboxes still there drops the others.
            c["cni.dev/valid-attachments"] = json!([{"containerID": "other", "ifname": "eth0"}]);
            assert_eq!(cni(&env("GC", &web, "", ""), &c.to_string()).status, 0);
            let check = cni(
                &env("CHECK", &web, "stale", &web_args),
                &conf("1.1.0", &socket, &web, true),
            );
            assert_eq!(check.error_code(), 101, "{check:?}");
        })
        .await;
    }

    // A pod the control plane places on another node, or does not know: refused, with
    // the reason.
    {
        let socket = socket.clone();
        let netns = web.netns.clone();
        blocking(move || {
            for (name, code) in [("away", 101), ("ghost", 11)] {
                let pod = Pod {
                    namespace: "shop",
                    name,
                    netns: netns.clone(),
                    ip: [10, 77, 9, 9].into(),
                };
                let mut c: Value =
                    serde_json::from_str(&conf("1.0.0", &socket, &pod, true)).unwrap();
                c["timeout"] = json!("15s");
                let r = cni(&env("ADD", &pod, "c", &k8s_args(&pod)), &c.to_string());
                assert_eq!(r.error_code(), code, "{name}: {r:?}");
            }
        })
        .await;
    }

    // A client that sends half a request and stalls is cut off after 5 s; meanwhile the
    // socket serves everyone else.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut slow = tokio::net::UnixStream::connect(&socket).await.unwrap();
    slow.write_all(&[0, 0, 0, 200, b'{']).await.unwrap();
    let status = {
        let (socket, web) = (
            socket.clone(),
            Pod {
                netns: web.netns.clone(),
                ..web
            },
        );
        blocking(move || {
            cni(
                &env("STATUS", &web, "", ""),
                &conf("1.1.0", &socket, &web, false),
            )
        })
        .await
    };
    assert_eq!(status.status, 0, "{status:?}");
    let mut answer = Vec::new();
    let cut_off = tokio::time::timeout(
        std::time::Duration::from_secs(15),
        slow.read_to_end(&mut answer),
    )
    .await;
    assert!(cut_off.is_ok(), "the stalled client was not cut off");
    let answer: Value = serde_json::from_slice(&answer[4..]).unwrap();
    assert_eq!(answer["code"], 6);
    assert!(
        answer["msg"].as_str().unwrap().contains("incomplete"),
        "{answer}"
    );

    // Garbage on the socket is answered with a decode error and counted; the proxy goes
    // on serving.
    let mut raw = tokio::net::UnixStream::connect(&socket).await.unwrap();
    raw.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let mut answer = Vec::new();
    raw.read_to_end(&mut answer).await.unwrap();
    let answer: Value = serde_json::from_slice(&answer[4..]).unwrap();
    assert_eq!(answer["result"], "error");
    assert_eq!(answer["code"], 6);
    let m = proxy.metrics().await;
    assert!(
        m.contains("cni_requests_total{command=\"invalid\",result=\"error\"} 2"),
        "{m}"
    );
    // A pod reference that would escape the run directory is refused before anything.
    for (namespace, name, container_id) in [
        ("shop", "../../../etc/cron.d/x", "c1"),
        ("shop", "web", "../escape"),
        ("shop", "web", ""),
    ] {
        let request = ambit_api::cni::Request::Del(ambit_api::cni::PodRef {
            namespace: namespace.into(),
            name: name.into(),
            container_id: container_id.into(),
        });
        let mut raw = tokio::net::UnixStream::connect(&socket).await.unwrap();
        raw.write_all(&ambit_api::cni::encode(&request).unwrap())
            .await
            .unwrap();
        let mut answer = Vec::new();
        raw.read_to_end(&mut answer).await.unwrap();
        let answer: Value = serde_json::from_slice(&answer[4..]).unwrap();
        assert_eq!(answer["code"], 4, "{name} {container_id}: {answer}");
    }
    let web2 = Pod {
        netns: web.netns.clone(),
        ..web
    };
    let (s2, a2) = (socket.clone(), web_args.clone());
    let add = blocking(move || {
        cni(
            &env("ADD", &web2, "after-garbage", &a2),
            &conf("1.0.0", &s2, &web2, true),
        )
    })
    .await;
    assert_eq!(add.status, 0, "{add:?}");
    proxy.stop().await;
    cp.stop().await;
}

#[test]
fn bad_input_gets_the_spec_error_codes() {
    let socket = PathBuf::from("/nonexistent/ambit/cni.sock");
    let pod = Pod {
        namespace: "shop",
        name: "web",
        netns: "/proc/self/ns/net".into(),
        ip: [10, 77, 0, 9].into(),
    };
    let args = k8s_args(&pod);
    let good = conf("1.0.0", &socket, &pod, true);

    // Malformed stdin: 6. Not an object: 6.
    assert_eq!(
        cni(&env("ADD", &pod, "c", &args), "{\"cniVersion\": ").error_code(),
        6
    );
    assert_eq!(cni(&env("ADD", &pod, "c", &args), "[1,2]").error_code(), 6);
    // Unknown versions: 1.
    for version in ["0.3.1", "2.0.0", "banana"] {
        let r = cni(
            &env("ADD", &pod, "c", &args),
            &conf(version, &socket, &pod, true),
        );
        assert_eq!(r.error_code(), 1, "{version}: {r:?}");
        assert!(
            r.json()["details"].as_str().unwrap().contains("1.1.0"),
            "{r:?}"
        );
    }
    // No cniVersion, a wrong field type, a bad timeout, no prevResult for a chained
    // plugin: 7.
    assert_eq!(
        cni(
            &env("ADD", &pod, "c", &args),
            r#"{"name":"x","type":"ambit-cni"}"#
        )
        .error_code(),
        7
    );
    let mut bad: Value = serde_json::from_str(&good).unwrap();
    bad["socket"] = json!(42);
    assert_eq!(
        cni(&env("ADD", &pod, "c", &args), &bad.to_string()).error_code(),
        7
    );
    bad["socket"] = json!("/x");
    bad["timeout"] = json!("soon");
    let r = cni(&env("ADD", &pod, "c", &args), &bad.to_string());
    assert_eq!(r.error_code(), 7);
    assert!(
        r.json()["msg"].as_str().unwrap().contains("timeout"),
        "{r:?}"
    );
    assert_eq!(
        cni(
            &env("ADD", &pod, "c", &args),
            &conf("1.0.0", &socket, &pod, false)
        )
        .error_code(),
        7
    );
    assert_eq!(
        cni(
            &env("CHECK", &pod, "c", &args),
            &conf("1.0.0", &socket, &pod, false)
        )
        .error_code(),
        7
    );

    // Missing environment: 4, naming each variable.
    let r = cni(&[("CNI_COMMAND", "ADD"), ("CNI_ARGS", &args)], &good);
    assert_eq!(r.error_code(), 4);
    let msg = r.json()["msg"].as_str().unwrap().to_string();
    for var in ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"] {
        assert!(msg.contains(var), "{msg}");
    }
    assert_eq!(cni(&[], &good).error_code(), 4);
    assert_eq!(cni(&[("CNI_COMMAND", "FROB")], &good).error_code(), 4);
    // The error is reported in the configuration's version.
    assert_eq!(
        cni(
            &[("CNI_COMMAND", "FROB")],
            &conf("0.4.0", &socket, &pod, true)
        )
        .json()["cniVersion"],
        "0.4.0"
    );

    // No node proxy: ADD of a Kubernetes pod fails (100: never start unprotected), DEL
    // succeeds (nothing to undo), STATUS says the plugin is not available (50).
    let r = cni(&env("ADD", &pod, "c", &args), &good);
    assert_eq!(r.error_code(), 100, "{r:?}");
    assert!(r.stderr.contains("ambit-cni:"), "logs go to stderr: {r:?}");
    let del = cni(&env("DEL", &pod, "c", &args), &good);
    assert_eq!((del.status, del.stdout.as_str()), (0, ""), "{del:?}");
    assert_eq!(
        cni(
            &env("STATUS", &pod, "c", ""),
            &conf("1.1.0", &socket, &pod, false)
        )
        .error_code(),
        50
    );
    // Not a Kubernetes pod, or an excluded namespace: passed through untouched.
    let plain = cni(&env("ADD", &pod, "c", ""), &good);
    assert_eq!(plain.status, 0, "{plain:?}");
    let system = Pod {
        namespace: "kube-system",
        ..pod
    };
    let r = cni(
        &env("ADD", &system, "c", &k8s_args(&system)),
        &conf("1.0.0", &socket, &system, true),
    );
    assert_eq!(r.status, 0, "{r:?}");
    assert_eq!(r.json(), prev_result("1.0.0", system.ip, &system.netns));
}
