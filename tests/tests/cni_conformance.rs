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
    cni_at(Path::new(CNI), env, stdin)
}

/// As [`cni`], running the plugin binary at `bin`.
fn cni_at(bin: &Path, env: &[(&str, &str)], stdin: &str) -> Run {
    let mut cmd = Command::new(bin);
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

    // A pod the control plane places on another node (a node's discovery holds its own
    // pods only, so this node never hears of it), or does not know: refused, to be tried
    // again, with the reason.
    {
        let socket = socket.clone();
        let netns = web.netns.clone();
        blocking(move || {
            for (name, code) in [("away", 11), ("ghost", 11)] {
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
                assert!(
                    format!("{r:?}").contains("as a pod of node"),
                    "{name}: {r:?}"
                );
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

// The CNI socket's refusals: who may talk to it, what it takes as a netns, and what it
// never does to a sandbox it holds. Each refusal leaves the pod handed over as it was.

use ambit_api::cni::{PodAdd, PodRef, Request, Response};
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

/// `web` and `api`, meshed on node-a; `other` is a netns no pod has.
fn meshed_cluster(t: &Topology) -> String {
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
metadata: {{name: api, namespace: shop}}
spec: {{nodeName: node-a, serviceAccountName: api, containers: []}}
status: {{podIP: {}, phase: Running}}
"#,
        t.pod("web").ip,
        t.pod("api").ip
    )
}

/// A node-a proxy with a CNI socket of its own directory, and pod `web` handed over by
/// the plugin as sandbox `s1`.
struct Node {
    /// The plugin binary this node's runtime runs.
    bin: PathBuf,
    proxy: NodeProxy,
    cp: ControlPlane,
    socket: PathBuf,
    run_dir: PathBuf,
    sock_dir: tempfile::TempDir,
    // Dropped in this order: the proxy's netns handles, then the namespaces.
    handles: ambit_e2e::NetnsHandles,
    t: Topology,
}

impl Node {
    async fn start(configure: impl FnOnce(&mut ambit_proxy::config::Config)) -> Self {
        Self::start_with(Path::new(CNI), configure).await
    }

    /// As [`Self::start`], the runtime running the plugin at `bin`.
    async fn start_with(
        bin: &Path,
        configure: impl FnOnce(&mut ambit_proxy::config::Config),
    ) -> Self {
        let t = Topology::new(&["web", "api", "other"]);
        let cp = ControlPlane::start(&meshed_cluster(&t), &["node-a"]).await;
        let sock_dir = tempfile::tempdir().unwrap();
        let mut config = NodeProxy::config(&cp, "node-a");
        config.cni_socket = sock_dir.path().join("cni.sock");
        config.cni_add_timeout = Duration::from_secs(3);
        configure(&mut config);
        let handles = ambit_e2e::NetnsHandles(config.run_dir.clone());
        let (socket, run_dir) = (config.cni_socket.clone(), config.run_dir.clone());
        let proxy = NodeProxy::start_config(config).await;
        let node = Self {
            bin: bin.to_path_buf(),
            proxy,
            cp,
            socket,
            run_dir,
            sock_dir,
            handles,
            t,
        };
        let add = node.plugin(&node.bin, "ADD", "web", "s1").await;
        assert_eq!(add.status, 0, "{add:?}");
        node
    }

    fn pod(&self, name: &'static str) -> Pod<'static> {
        Pod {
            namespace: "shop",
            name,
            netns: self.t.pod(name).path(),
            ip: self.t.pod(name).ip,
        }
    }

    /// Runs the plugin binary `bin` for `command` of pod `name`, sandbox `cid`.
    async fn plugin(&self, bin: &Path, command: &str, name: &'static str, cid: &str) -> Run {
        let (bin, pod, socket) = (bin.to_path_buf(), self.pod(name), self.socket.clone());
        let (command, cid) = (command.to_string(), cid.to_string());
        blocking(move || {
            let args = k8s_args(&pod);
            cni_at(
                &bin,
                &env(&command, &pod, &cid, &args),
                &conf("1.0.0", &socket, &pod, true),
            )
        })
        .await
    }

    /// `web`'s record in the run directory (what the proxy restores on restart).
    fn web_record(&self) -> Value {
        let file = self.run_dir.join("pods/shop_web.json");
        serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap()
    }

    /// `web` is still handed over as sandbox `s1` in its own netns, and redirected.
    async fn web_unchanged(&self, before: &Value) {
        assert_eq!(&self.web_record(), before);
        let held = before["netns"].as_str().unwrap();
        assert_eq!(netns_inode(held), netns_inode(&self.t.pod("web").path()));
        let check = self.plugin(&self.bin, "CHECK", "web", "s1").await;
        assert_eq!((check.status, check.stdout.as_str()), (0, ""), "{check:?}");
    }

    async fn metric(&self, name: &str, labels: &[&str]) -> u64 {
        ambit_e2e::metric_sum(&self.proxy.metrics().await, name, labels)
    }

    async fn stop(self) {
        self.proxy.stop().await;
        self.cp.stop().await;
        drop(self.handles);
        drop(self.t);
    }
}

fn netns_inode(path: &str) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    (m.dev(), m.ino())
}

/// Sends `request` on the socket from this process (root), `fd` riding along.
async fn ask(socket: &Path, request: Request, fd: Option<OwnedFd>) -> Response {
    let socket = socket.to_path_buf();
    blocking(move || {
        ambit_cni::client::ask(
            &socket,
            &request,
            fd.as_ref().map(AsFd::as_fd),
            Duration::from_secs(20),
        )
        .unwrap()
    })
    .await
}

/// The code, message and details of an error answer.
fn refused(r: &Response) -> (u32, String, String) {
    match r {
        Response::Error { code, msg, details } => (*code, msg.clone(), details.clone()),
        other => panic!("expected an error, got {other:?}"),
    }
}

fn add_web(cid: &str, netns_path: &str) -> Request {
    Request::Add(PodAdd {
        pod: PodRef {
            namespace: "shop".into(),
            name: "web".into(),
            container_id: cid.into(),
        },
        uid: String::new(),
        netns_path: netns_path.into(),
        ips: Vec::new(),
    })
}

fn open(path: impl AsRef<Path>) -> OwnedFd {
    std::fs::File::open(path.as_ref())
        .unwrap_or_else(|e| panic!("{}: {e}", path.as_ref().display()))
        .into()
}

/// A client run as `nobody` (uid 65534): sends `request` and prints the answer's JSON,
/// or exits 3 if it cannot connect.
const NOBODY_CLIENT: &str = r#"
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print(e, file=sys.stderr)
    sys.exit(3)
s.sendall(bytes.fromhex(sys.argv[2]))
answer = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    answer += chunk
sys.stdout.write(answer[4:].decode())
"#;

fn as_nobody(socket: &Path, request: &Request) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    let hex: String = ambit_api::cni::encode(request)
        .unwrap()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Command::new("/usr/bin/python3")
        .args(["-I", "-c", NOBODY_CLIENT])
        .arg(socket)
        .arg(hex)
        .uid(65534)
        .gid(65534)
        .env_clear()
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_is_not_root_is_refused_before_its_request_is_read() {
    use std::os::unix::fs::PermissionsExt;
    let node = Node::start(|_| {}).await;
    let before = node.web_record();
    let del = Request::Del(PodRef {
        namespace: "shop".into(),
        name: "web".into(),
        container_id: "s1".into(),
    });
    // The socket is root's alone: nobody cannot even connect.
    let mode = std::fs::metadata(&node.socket)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let out = blocking({
        let (socket, del) = (node.socket.clone(), del.clone());
        move || as_nobody(&socket, &del)
    })
    .await;
    assert_eq!(out.status.code(), Some(3), "{out:?}");

    // Made reachable (a wrong mode, a careless mount): the proxy still refuses, and says
    // why, before reading a byte of the request.
    std::fs::set_permissions(node.sock_dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&node.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = blocking({
        let (socket, del) = (node.socket.clone(), del.clone());
        move || as_nobody(&socket, &del)
    })
    .await;
    assert!(out.status.success(), "{out:?}");
    let answer: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    assert_eq!(answer["result"], "error", "{answer}");
    assert_eq!(answer["code"], ambit_proxy::cni::PEER_REFUSED, "{answer}");
    let msg = answer["msg"].as_str().unwrap();
    assert!(
        msg.contains("root only") && msg.contains("uid 65534"),
        "{answer}"
    );
    let details = answer["details"].as_str().unwrap();
    assert!(
        details.contains("nothing was done") && details.contains("0600"),
        "{answer}"
    );

    // Nothing changed: web is still handed over and redirected; the refusal is counted,
    // and no DEL was.
    node.web_unchanged(&before).await;
    assert_eq!(
        node.metric("cni_peers_refused_total", &["reason=\"uid\""])
            .await,
        1
    );
    assert_eq!(
        node.metric(
            "cni_requests_total",
            &["command=\"invalid\"", "result=\"error\""]
        )
        .await,
        1
    );
    assert_eq!(
        node.metric("cni_requests_total", &["command=\"del\""])
            .await,
        0
    );
    // Root is still served.
    let status = ask(&node.socket, Request::Status, None).await;
    assert_eq!(status, Response::Ok);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_with_a_descriptor_that_is_not_a_network_namespace_is_refused() {
    let node = Node::start(|_| {}).await;
    let before = node.web_record();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("netns");
    std::fs::write(&file, b"").unwrap();
    let (pipe, _writer) = nix::unistd::pipe().unwrap();
    // A new sandbox of web (which would replace s1) and the same sandbox, each with a
    // descriptor that is not a network namespace.
    let cases = [
        ("s2", open(&file), "a regular file"),
        ("s2", pipe, "a pipe"),
        ("s2", open("/proc/self/ns/mnt"), "a mount namespace"),
        ("s1", open("/proc/self/ns/uts"), "a UTS namespace"),
    ];
    let n = cases.len() as u64;
    for (cid, fd, what) in cases {
        let r = ask(&node.socket, add_web(cid, "/var/run/netns/x"), Some(fd)).await;
        let (code, msg, details) = refused(&r);
        assert_eq!(code, 4, "{what}: {r:?}");
        assert!(
            msg.contains(&format!("is {what}, not a network namespace")),
            "{what}: {msg}"
        );
        assert!(details.contains("nothing was done"), "{details}");
    }
    node.web_unchanged(&before).await;
    assert_eq!(
        node.metric(
            "cni_requests_total",
            &["command=\"add\"", "result=\"error\""]
        )
        .await,
        n
    );
    assert_eq!(
        node.metric(
            "cni_requests_total",
            &["command=\"add\"", "result=\"redirected\""]
        )
        .await,
        1
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_sandbox_is_not_moved_to_another_netns_nor_given_to_another_pod() {
    let node = Node::start(|_| {}).await;
    let before = node.web_record();
    let other = node.t.pod("other").path();

    // s1 again, in another netns: refused.
    let r = ask(&node.socket, add_web("s1", &other), Some(open(&other))).await;
    let (code, msg, details) = refused(&r);
    assert_eq!(code, 4, "{r:?}");
    assert!(
        msg.contains("sandbox s1 of pod shop/web is already attached to another network namespace"),
        "{msg}"
    );
    assert!(details.contains("DEL it first"), "{details}");
    node.web_unchanged(&before).await;

    // s1 again, in its own netns reached by another path (the proxy's own handle; the
    // namespace is compared, not the path): idempotent.
    let held = before["netns"].as_str().unwrap().to_string();
    let r = ask(&node.socket, add_web("s1", &held), Some(open(&held))).await;
    assert_eq!(r, Response::Redirected);
    node.web_unchanged(&before).await;

    // s1 claimed by another pod: refused; api is not handed over.
    let api = node.plugin(Path::new(CNI), "ADD", "api", "s1").await;
    assert_eq!(api.error_code(), 4, "{api:?}");
    let msg = api.json()["msg"].as_str().unwrap().to_string();
    assert!(msg.contains("sandbox s1 is pod shop/web's"), "{msg}");
    let details = api.json()["details"].as_str().unwrap().to_string();
    assert!(details.contains("belongs to one pod"), "{details}");
    assert!(!node.run_dir.join("pods/shop_api.json").exists());
    node.web_unchanged(&before).await;

    assert_eq!(
        node.metric(
            "cni_requests_total",
            &["command=\"add\"", "result=\"error\""]
        )
        .await,
        2
    );
    assert_eq!(
        node.metric(
            "cni_requests_total",
            &["command=\"add\"", "result=\"redirected\""]
        )
        .await,
        2
    );
    // A new sandbox of web in the other netns is the runtime setting the pod up again:
    // it replaces s1.
    let r = ask(&node.socket, add_web("s2", &other), Some(open(&other))).await;
    assert_eq!(r, Response::Redirected);
    let now = node.web_record();
    assert_eq!(now["container_id"], "s2");
    assert_eq!(
        netns_inode(now["netns"].as_str().unwrap()),
        netns_inode(&other)
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn del_and_check_match_only_the_sandbox_they_name_never_an_empty_one() {
    let node = Node::start(|_| {}).await;
    let before = node.web_record();
    let web = |cid: &str| PodRef {
        namespace: "shop".into(),
        name: "web".into(),
        container_id: cid.into(),
    };
    // An empty sandbox id names nothing: refused, for DEL and CHECK.
    for request in [Request::Del(web("")), Request::Check(web(""))] {
        let r = ask(&node.socket, request.clone(), None).await;
        let (code, msg, _) = refused(&r);
        assert_eq!(code, 4, "{request:?}: {r:?}");
        assert!(msg.contains("invalid pod reference"), "{msg}");
    }
    node.web_unchanged(&before).await;
    // Another sandbox: DEL has nothing to do (and succeeds, DEL is idempotent), CHECK
    // says that sandbox was never handed over.
    assert_eq!(
        ask(&node.socket, Request::Del(web("s0")), None).await,
        Response::Ok
    );
    node.web_unchanged(&before).await;
    let r = ask(&node.socket, Request::Check(web("s0")), None).await;
    let (code, msg, details) = refused(&r);
    assert_eq!(code, 101, "{r:?}");
    assert!(
        msg.contains("sandbox \"s0\" of pod shop/web was never handed"),
        "{msg}"
    );
    assert!(details.contains("\"s1\""), "{details}");
    node.web_unchanged(&before).await;
    assert_eq!(
        node.metric(
            "cni_requests_total",
            &["command=\"del\"", "result=\"error\""]
        )
        .await,
        1
    );
    assert_eq!(
        node.metric(
            "cni_requests_total",
            &["command=\"check\"", "result=\"error\""]
        )
        .await,
        2
    );
    // The sandbox it names: gone.
    assert_eq!(
        ask(&node.socket, Request::Del(web("s1")), None).await,
        Response::Ok
    );
    assert!(!node.run_dir.join("pods/shop_web.json").exists());
    node.stop().await;
}

/// Copies the plugin to `to` (a file of its own: another inode), ready to run.
fn install_plugin(to: &Path) {
    let tmp = to.with_extension("new");
    std::fs::copy(CNI, &tmp).unwrap();
    // Atomically, as `ambit-cni install` does.
    std::fs::rename(&tmp, to).unwrap();
    // Until no process holds the new file open for writing (a fork elsewhere in this
    // test process may have inherited the descriptor for an instant): ETXTBSY.
    for _ in 0..100 {
        match Command::new(to).output() {
            Err(e) if e.raw_os_error() == Some(26) => {
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => return,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_plugin_binary_only_that_file_is_served_and_an_upgrade_is_seen_at_once() {
    let bin_dir = tempfile::tempdir().unwrap();
    let installed = bin_dir.path().join("ambit-cni");
    install_plugin(&installed);
    // The installed plugin hands web over.
    let plugin_binary = installed.clone();
    let node = Node::start_with(&installed, move |c| c.cni_plugin_binary = plugin_binary).await;
    let before = node.web_record();

    // The same program from another file (the build's), and this test process: refused,
    // saying which program the peer runs, before reading the request (the DEL did
    // nothing).
    let check = node.plugin(Path::new(CNI), "CHECK", "web", "s1").await;
    assert_eq!(
        check.error_code(),
        u64::from(ambit_proxy::cni::PEER_REFUSED),
        "{check:?}"
    );
    let msg = check.json()["msg"].as_str().unwrap().to_string();
    assert!(
        msg.contains(&format!("serves the plugin {} only", installed.display()))
            && msg.contains(CNI),
        "{msg}"
    );
    let del = Request::Del(PodRef {
        namespace: "shop".into(),
        name: "web".into(),
        container_id: "s1".into(),
    });
    let r = ask(&node.socket, del, None).await;
    let (code, msg, details) = refused(&r);
    assert_eq!(code, ambit_proxy::cni::PEER_REFUSED, "{r:?}");
    let me = std::env::current_exe().unwrap();
    assert!(msg.contains(&me.display().to_string()), "{msg}");
    assert!(details.contains("--cni-plugin-binary"), "{details}");
    node.web_unchanged(&before).await;
    assert_eq!(
        node.metric("cni_peers_refused_total", &["reason=\"binary\""])
            .await,
        2
    );

    // Upgraded by an atomic rename (a new inode at the path): served at once.
    install_plugin(&installed);
    node.web_unchanged(&before).await;
    assert_eq!(node.metric("cni_peers_refused_total", &[]).await, 2);

    // The plugin gone from its path: nothing can be checked, so nothing is served.
    std::fs::remove_file(&installed).unwrap();
    let r = ask(&node.socket, Request::Status, None).await;
    let (code, msg, _) = refused(&r);
    assert_eq!(code, ambit_proxy::cni::PEER_REFUSED, "{r:?}");
    assert!(msg.contains("--cni-plugin-binary"), "{msg}");
    assert_eq!(
        node.metric("cni_peers_refused_total", &["reason=\"unverifiable\""])
            .await,
        1
    );
    assert_eq!(
        node.metric(
            "cni_requests_total",
            &["command=\"invalid\"", "result=\"error\""]
        )
        .await,
        3
    );
    assert_eq!(before, node.web_record());
    node.stop().await;
}

/// A flood of connections that send nothing holds at most MAX_CONNECTIONS requests: one
/// more is answered "try again later" (code 11) at once, counted; the plugin's pods are
/// untouched, and once the silent ones time out the socket serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_silent_connections_gets_try_again_and_the_socket_recovers() {
    let node = Node::start(|_| {}).await;
    let before = node.web_record();
    let mut silent = Vec::new();
    for _ in 0..ambit_proxy::cni::MAX_CONNECTIONS {
        silent.push(tokio::net::UnixStream::connect(&node.socket).await.unwrap());
    }
    // Give the proxy time to accept them all (each now waits for its request).
    let mut answer = Vec::new();
    for _ in 0..100 {
        use tokio::io::AsyncReadExt;
        let mut extra = tokio::net::UnixStream::connect(&node.socket).await.unwrap();
        answer.clear();
        let read = tokio::time::timeout(Duration::from_secs(2), extra.read_to_end(&mut answer));
        if read.await.is_ok() && answer.len() > 4 {
            let v: Value = serde_json::from_slice(&answer[4..]).unwrap();
            if v["code"] == 11 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let v: Value = serde_json::from_slice(&answer[4..]).unwrap();
    assert_eq!(v["code"], 11, "{v}");
    assert!(v["msg"].as_str().unwrap().contains("busy"), "{v}");
    assert!(
        node.metric("cni_requests_total", &["command=\"busy\""])
            .await
            >= 1,
        "{}",
        node.proxy.metrics().await
    );
    // The silent ones are answered (incomplete request) within the read timeout; then the
    // socket serves a real request again.
    drop(silent);
    let mut served = false;
    for _ in 0..100 {
        let check = node.plugin(&node.bin, "CHECK", "web", "s1").await;
        if check.status == 0 {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served);
    node.web_unchanged(&before).await;
    node.stop().await;
}

/// A pod whose addresses nobody knows yet (no IPs in the CNI result, no podIP in
/// discovery) is not reported redirected: ADD fails with 101 and /ready names it; once
/// discovery has its address it is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_without_known_addresses_is_not_reported_redirected() {
    let node = Node::start(|_| {}).await;
    let without_ip = format!(
        "{}---\napiVersion: v1\nkind: Pod\nmetadata: {{name: other, namespace: shop}}\n\
         spec: {{nodeName: node-a, serviceAccountName: other, containers: []}}\n\
         status: {{phase: Pending}}\n",
        meshed_cluster(&node.t)
    );
    node.cp.set_cluster(&without_ip);
    let other = node.t.pod("other").path();
    let add = Request::Add(PodAdd {
        pod: PodRef {
            namespace: "shop".into(),
            name: "other".into(),
            container_id: "s9".into(),
        },
        uid: String::new(),
        netns_path: other.clone(),
        ips: Vec::new(),
    });
    let r = ask(&node.socket, add.clone(), Some(open(&other))).await;
    let (code, msg, _) = refused(&r);
    assert_eq!(code, 101, "{r:?}");
    assert!(msg.contains("could not redirect pod shop/other"), "{msg}");
    let (status, ready) = ambit_e2e::http_get(node.proxy.admin_addr, "/ready").await;
    assert_eq!(status, 503, "{ready}");
    assert!(ready.contains("shop/other"), "{ready}");
    // The kubelet reports its address: served, and the runtime's retried ADD succeeds.
    let with_ip = without_ip.replace(
        "status: {phase: Pending}",
        &format!(
            "status: {{podIP: {}, phase: Running}}",
            node.t.pod("other").ip
        ),
    );
    node.cp.set_cluster(&with_ip);
    let r = ask(&node.socket, add, Some(open(&other))).await;
    assert_eq!(r, Response::Redirected, "{r:?}");
    node.stop().await;
}
