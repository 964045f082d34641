//! The orchestrator's side of the load processes ([`crate::load`]): each started as a
//! process of its client pod, its reports read line by line into [`Reports`].

use crate::load::KINDS;
use ambit_e2e::cni::{CniNode, CniPod};
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Per kind: requests served, failed, slow, the slowest in ms, and retried unsent.
pub type KindCounts = [u64; 5];

/// What the load processes have reported.
#[derive(Debug, Default)]
pub struct Reports {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The latest counts of each client, per kind (in [`KINDS`] order).
    counts: BTreeMap<String, Vec<KindCounts>>,
    ready: HashSet<String>,
    done: HashSet<String>,
    /// Failures as reported: (seconds since start, client, kind, error).
    failures: Vec<(f64, String, String, String)>,
    errors: Vec<String>,
}

impl Reports {
    fn line(&self, client: &str, v: &Value, t: f64, log: &mut Option<std::fs::File>) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if v.get("counts").is_some_and(Value::is_object) {
            let counts = &v["counts"];
            let per_kind = KINDS
                .iter()
                .map(|k| {
                    let mut c = [0u64; 5];
                    for (i, slot) in c.iter_mut().enumerate() {
                        *slot = counts[*k][i].as_u64().unwrap_or(0);
                    }
                    c
                })
                .collect();
            inner.counts.insert(client.to_string(), per_kind);
        } else if let Some(kind) = v.get("fail").and_then(Value::as_str) {
            let error = v["error"].as_str().unwrap_or("").to_string();
            if let Some(f) = log {
                let _ = writeln!(f, "{t:.1}\t{client}\t{kind}\t{error}");
            }
            inner.failures.push((t, client.into(), kind.into(), error));
        } else if v.get("ready").is_some() {
            inner.ready.insert(client.into());
        } else if v.get("done").is_some() {
            inner.done.insert(client.into());
        } else if let Some(e) = v.get("error").and_then(Value::as_str) {
            inner.errors.push(e.to_string());
        }
    }

    /// The counts summed over the clients, per kind.
    pub fn totals(&self) -> Vec<KindCounts> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut sum = vec![[0u64; 5]; KINDS.len()];
        for per_kind in inner.counts.values() {
            for (s, c) in sum.iter_mut().zip(per_kind) {
                s[0] += c[0];
                s[1] += c[1];
                s[2] += c[2];
                s[3] = s[3].max(c[3]);
                s[4] += c[4];
            }
        }
        sum
    }

    /// How many clients have said `ready` / `done`.
    pub fn ready_done(&self) -> (usize, usize) {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        (inner.ready.len(), inner.done.len())
    }

    /// The errors a client gave up with (a failed warm-up).
    pub fn errors(&self) -> Vec<String> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.errors.clone()
    }

    /// The failures reported with their error (the first of each kind per client).
    pub fn failures(&self) -> Vec<(f64, String, String, String)> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.failures.clone()
    }
}

/// A load process; killed (by pid) on drop if it has not ended.
#[derive(Debug)]
pub struct LoadProcess {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl LoadProcess {
    /// Starts the load of client pod `pod` (on `node`): this program's `load` command, in
    /// the pod's netns and the node's cgroup; its reports go to `reports`, its stderr to
    /// `<out>/load-<pod>.log`, its failures to `<out>/failures.log` as well.
    pub fn start(
        node: &CniNode,
        pod: &CniPod,
        rate: f64,
        stream_secs: u64,
        out: &Path,
        start: Instant,
        reports: Arc<Reports>,
    ) -> anyhow::Result<Self> {
        let exe = std::env::current_exe()?;
        let rate = rate.to_string();
        let secs = stream_secs.to_string();
        let args = [
            "load",
            "--name",
            &pod.name,
            "--rate",
            &rate,
            "--stream-secs",
            &secs,
        ];
        let mut cmd = ambit_topology::pod_command(Some(&node.cgroup), &pod.netns, exe, args);
        let stderr = std::fs::File::create(out.join(format!("load-{}.log", pod.name)))?;
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()?;
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
        let name = pod.name.clone();
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(out.join("failures.log"))
            .ok();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    reports.line(&name, &v, start.elapsed().as_secs_f64(), &mut log);
                }
            }
        });
        Ok(Self { child, stdin })
    }

    /// Its pid (the pod's process).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Closes its standard input: it stops sending, reports its last counts and exits.
    pub fn stop(&mut self) {
        self.stdin.take();
    }

    /// Whether it has exited.
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }
}

impl Drop for LoadProcess {
    fn drop(&mut self) {
        self.stdin.take();
        if !self.exited() {
            std::thread::sleep(Duration::from_millis(100));
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}
