//! `ambit demo` end to end (issue 11's proof), with the real binaries as a user runs them:
//! `ambit demo up`; `ambit stat -o json` shows requests for every workload and the failing
//! catalog replica's success rate as it injects failures; `ambit check --pre` and `ambit
//! check --proxy` find nothing wrong (no ×); a Prometheus server (Debian's `prometheus`)
//! scrapes both node proxies as the chart's scrape annotations say and its PromQL agrees
//! with `ambit stat`; `ambit demo down` leaves nothing behind.
//!
//! And the foreground `ambit demo` as `./scripts/demo.sh | tee demo.log` runs it: Ctrl-C
//! (SIGINT) with the pipe's reader gone removes everything (issue 24).
//!
//! The demo's names and ports are fixed (one demo per machine), so the tests that start it
//! take turns ([`ONE_DEMO`]). Needs root, and ambit-control and ambit-proxy built beside `ambit`
//! (scripts/test.sh builds them).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

#[path = "demo/prometheus.rs"]
mod prometheus;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn ambit() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ambit"))
}

fn run(args: &[&str]) -> Output {
    Command::new(ambit())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("ambit {args:?}: {e}"))
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// One demo at a time: the tests of this file run in parallel threads.
static ONE_DEMO: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_demo() -> std::sync::MutexGuard<'static, ()> {
    ONE_DEMO.lock().unwrap_or_else(|e| e.into_inner())
}

/// Takes the demo down when the test ends, also when it fails.
struct Down;

impl Drop for Down {
    fn drop(&mut self) {
        let _ = run(&["demo", "down"]);
    }
}

/// The processes of the demo's state file.
fn demo_pids() -> Vec<(u32, u64)> {
    let state: Value =
        serde_json::from_slice(&std::fs::read("/run/ambit-demo/state.json").unwrap()).unwrap();
    state["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["pid"].as_u64().unwrap() as u32,
                p["start_time"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// `ambit stat pod -n demo -o json` over `window`: the rows by pod name.
fn stat_pods(window: &str) -> Vec<Value> {
    let out = run(&["stat", "pod", "-n", "demo", "-t", window, "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice::<Value>(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", text(&out)))
        .as_array()
        .unwrap()
        .clone()
}

fn row<'a>(rows: &'a [Value], pod_prefix: &str) -> Option<&'a Value> {
    rows.iter()
        .find(|r| r["name"].as_str().unwrap_or("").starts_with(pod_prefix))
}

const FAILING: &str = "catalog-84d7b6c9f-h5j6k";

#[test]
fn demo_up_stat_check_prometheus_down() {
    let bin_dir = ambit().parent().unwrap().to_path_buf();
    for bin in ["ambit-control", "ambit-proxy"] {
        assert!(
            bin_dir.join(bin).is_file(),
            "{bin} must be built beside ambit: cargo build -p ambit-control -p ambit-proxy"
        );
    }
    let _one = one_demo();
    let _down = Down;
    let out = run(&["demo", "up", "--bin-dir", bin_dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("The Ambit demo runs"), "{said}");
    assert!(said.contains("/run/ambit-demo/cluster/demo.yaml"), "{said}");
    let first = demo_pids();
    assert_eq!(
        first.len(),
        8,
        "control plane, two proxies, five pods: {first:?}"
    );
    // `up` over a running (or crashed) demo removes it first, by its state file.
    let out = run(&["demo", "up", "--bin-dir", bin_dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("removed a stale demo first"),
        "{}",
        text(&out)
    );
    assert_nothing_left_of(&first);
    let pids = demo_pids();

    // Every workload serves requests; the failing replica's success rate is what it
    // injects (20 % failures, exactly 20 of any 100 in a row), the other's is 100 %.
    let deadline = Instant::now() + Duration::from_secs(120);
    let rows = loop {
        let rows = stat_pods("10s");
        let served = ["load-", "web-", "api-", "catalog-84d7b6c9f-a1b2c", FAILING]
            .iter()
            .all(|p| {
                row(&rows, p).is_some_and(|r| {
                    // The load generator only sends: its row counts what it receives.
                    *p == "load-" || r["requests"].as_f64().unwrap_or(0.0) >= 20.0
                })
            });
        if served {
            break rows;
        }
        assert!(
            Instant::now() < deadline,
            "not every workload served: {rows:#?}"
        );
    };
    let failing = row(&rows, FAILING).unwrap();
    let rate = failing["success"].as_f64().unwrap();
    assert!(
        (rate - 0.8).abs() <= 0.06,
        "the failing replica: {failing:#}"
    );
    let healthy = row(&rows, "catalog-84d7b6c9f-a1b2c").unwrap();
    assert_eq!(healthy["success"].as_f64(), Some(1.0), "{healthy:#}");
    assert_eq!(
        failing["tls_share"].as_f64(),
        Some(1.0),
        "mTLS: {failing:#}"
    );
    let out = run(&["stat", "deploy", "-n", "demo", "-t", "5s", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    let deploys: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    for w in ["web", "api", "catalog"] {
        let r = deploys.iter().find(|r| r["name"] == w);
        assert!(
            r.is_some_and(
                |r| r["meshed_pods"].as_u64() >= Some(1) && r["requests"].as_f64() > Some(0.0)
            ),
            "deploy/{w}: {deploys:#?}"
        );
    }
    let out = run(&["edges", "deploy", "-n", "demo", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));

    // Checks: nothing is wrong (a ‼ is this machine's: cgroup v1 hybrid, an unsynced clock).
    for args in [&["check", "--pre"][..], &["check", "--proxy"][..]] {
        let out = run(args);
        let t = text(&out);
        assert!(out.status.success(), "ambit {args:?}: {t}");
        assert!(!t.contains('×'), "ambit {args:?}: {t}");
    }
    let out = run(&["check", "--proxy", "-o", "json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let proxies = report["categories"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["categoryName"] == "ambit-proxy")
        .unwrap_or_else(|| panic!("{report:#}"));
    let passed = proxies["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["result"] == "success")
        .count();
    assert!(passed >= 2, "both proxies checked: {proxies:#}");

    // The demo's policy: only web may call api; from the load generator, 403 (and the
    // authorization metrics count the denial).
    let out = run(&[
        "demo",
        "exec",
        "load",
        "--",
        "curl",
        "-sS",
        "-m",
        "10",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "http://10.96.80.11/",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "403",
        "{}",
        text(&out)
    );

    // What the proxies hold: the Server and its policy on api, catalog's two endpoints,
    // every pod's certificate.
    let out = run(&["diagnostics", "policy", "-n", "demo", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    let policy: Value = serde_json::from_slice(&out.stdout).unwrap();
    let api = policy
        .as_array()
        .unwrap()
        .iter()
        .find_map(|p| {
            p["pods"]
                .as_object()?
                .iter()
                .find(|(k, _)| k.starts_with("demo/api-"))
        })
        .unwrap_or_else(|| panic!("{policy:#}"))
        .1;
    assert_eq!(api["from"], "control plane", "{api:#}");
    let port = &api["policy"]["ports"]["8080"];
    assert_eq!(port["server"]["name"], "api", "{api:#}");
    assert_eq!(
        port["authorizations"][0]["identities"],
        serde_json::json!(["spiffe://cluster.local/ns/demo/sa/web"]),
        "{api:#}"
    );
    let out = run(&["diagnostics", "endpoints", "catalog", "-n", "demo"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert_eq!(t.matches("demo/catalog-84d7b6c9f-").count(), 2, "{t}");
    let out = run(&["diagnostics", "certificates", "-n", "demo"]);
    let t = text(&out);
    assert!(
        out.status.success() && !t.contains("no certificate yet"),
        "{t}"
    );
    for sa in ["load", "web", "api", "catalog"] {
        assert!(
            t.contains(&format!("spiffe://cluster.local/ns/demo/sa/{sa}")),
            "{t}"
        );
    }

    prometheus::agrees_with_stat_and_fills_the_dashboards();

    // A command run as a demo pod's process goes through the mesh.
    let out = run(&[
        "demo",
        "exec",
        "load",
        "--",
        "curl",
        "-sS",
        "-m",
        "10",
        "http://10.96.80.10/",
    ]);
    assert!(out.status.success(), "{}", text(&out));

    // A crash that lost the state file: `down` finds everything by name (the processes
    // through the demo's cgroups).
    std::fs::remove_file("/run/ambit-demo/state.json").unwrap();
    let out = run(&["demo", "down"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("removed the demo"));
    assert_nothing_left(&pids);
    // Down again: nothing to do, and it says so.
    let out = run(&["demo", "down"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("no demo to remove"));
}

/// `ambit demo` in the foreground, its stdout on a pipe: once it runs, the pipe's reader
/// goes (as `tee` does on the same Ctrl-C), the demo's next refresh writes into the broken
/// pipe, then SIGINT: the demo still removes everything, says so on stderr and exits 0.
#[test]
fn foreground_demo_ends_on_sigint_with_its_stdout_gone() {
    use std::io::{BufRead, Read};
    use std::process::Stdio;
    let bin_dir = ambit().parent().unwrap().to_path_buf();
    let _one = one_demo();
    let _down = Down;
    let mut demo = Command::new(ambit())
        .args(["demo", "--bin-dir", bin_dir.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = demo.stderr.take().unwrap();
    let said = std::thread::spawn(move || {
        let mut t = String::new();
        let _ = stderr.read_to_string(&mut t);
        t
    });
    // The reader: until the demo says it runs, then it goes (its end of the pipe closes).
    let stdout = demo.stdout.take().unwrap();
    let (runs_tx, runs) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = std::io::BufReader::new(stdout).lines();
        let runs = lines.any(|l| l.is_ok_and(|l| l.contains("The Ambit demo runs")));
        let _ = runs_tx.send(runs);
    });
    let up = runs.recv_timeout(Duration::from_secs(180));
    assert_eq!(up, Ok(true), "the demo did not start: {}", {
        let _ = demo.kill();
        said.join().unwrap()
    });
    let pids = demo_pids();
    assert_eq!(pids.len(), 8, "the demo's processes: {pids:?}");
    // Two refreshes (every 5 s) into the broken pipe: `print!` would have panicked here.
    std::thread::sleep(Duration::from_secs(11));
    assert!(
        demo.try_wait().unwrap().is_none(),
        "the demo ended on its own: {}",
        said.join().unwrap()
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(demo.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = demo.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = demo.kill();
            panic!("the demo did not end within 60 s of SIGINT");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let said = said.join().unwrap();
    assert!(status.success(), "{status:?}: {said}");
    assert!(said.contains("SIGINT: ending the demo"), "{said}");
    assert!(said.contains("removed the demo: 8 processes"), "{said}");
    assert_nothing_left(&pids);
}

/// None of these processes (pid and start time) runs any more.
fn assert_nothing_left_of(pids: &[(u32, u64)]) {
    for (pid, start) in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Not running: gone, or a zombie nobody reaped (the state after the name).
        let alive = stat.rsplit_once(')').is_some_and(|(_, r)| {
            let f: Vec<&str> = r.split_whitespace().collect();
            f.first() != Some(&"Z") && f.get(19).and_then(|t| t.parse::<u64>().ok()) == Some(*start)
        });
        assert!(!alive, "process {pid} left");
    }
}

/// Nothing of the demo is left: network namespaces, cgroups, pins, its directory, its
/// processes.
fn assert_nothing_left(pids: &[(u32, u64)]) {
    let netns: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with("ambit-demo-"))
                .collect()
        })
        .unwrap_or_default();
    assert!(netns.is_empty(), "network namespaces left: {netns:?}");
    let cg = ambit_ebpf::sys::cgroup2_mount().join("ambit-demo");
    assert!(!cg.exists(), "cgroup left: {}", cg.display());
    for node in ["node-a", "node-b"] {
        let pins = format!("/sys/fs/bpf/ambit-demo-{node}");
        assert!(!Path::new(&pins).exists(), "pins left: {pins}");
    }
    assert!(!Path::new("/run/ambit-demo").exists(), "directory left");
    assert_nothing_left_of(pids);
}
