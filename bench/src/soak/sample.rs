//! Every `--sample-every`: each node's current proxy's RSS, descriptors and CPU (the pid
//! followed across restarts), the orchestrator's and the clients' own, what the churn has
//! done, and the clients' counts so far — a row of `samples.csv`.

use crate::clients::KindCounts;
use crate::load::KINDS;
use crate::proxy::{usage, Usage};
use crate::restart::reap;
use crate::run::{lock, stopped, Soak};
use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;

/// One node's proxy at a sample.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeSample {
    pub pid: u32,
    pub generation: u32,
    pub usage: Usage,
}

/// One row.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Seconds since the soak started.
    pub t: f64,
    pub nodes: [NodeSample; 2],
    /// The orchestrator (control plane, servers, churn, sampling).
    pub harness: Usage,
    /// The client processes' CPU, seconds.
    pub clients_cpu_s: f64,
    pub pods_added: u64,
    pub pods_deleted: u64,
    pub restarts: u64,
    /// Per kind, summed over the clients.
    pub totals: Vec<KindCounts>,
}

/// The header of `samples.csv`.
fn header() -> String {
    let mut h = String::from("t_s");
    for n in ["a", "b"] {
        for c in ["pid", "generation", "rss_kib", "fds", "cpu_s"] {
            h += &format!(",{n}_{c}");
        }
    }
    h +=
        ",harness_rss_kib,harness_fds,harness_cpu_s,clients_cpu_s,pods_added,pods_deleted,restarts";
    for k in KINDS {
        h += &format!(",{k}_ok,{k}_failed,{k}_retried");
    }
    h
}

fn row(s: &Sample) -> String {
    let mut r = format!("{:.1}", s.t);
    for n in &s.nodes {
        let u = n.usage;
        r += &format!(
            ",{},{},{},{},{:.2}",
            n.pid, n.generation, u.rss_kib, u.fds, u.cpu_s
        );
    }
    let h = s.harness;
    r += &format!(
        ",{},{},{:.2},{:.2},{},{},{}",
        h.rss_kib, h.fds, h.cpu_s, s.clients_cpu_s, s.pods_added, s.pods_deleted, s.restarts
    );
    for c in &s.totals {
        r += &format!(",{},{},{}", c[0], c[1], c[4]);
    }
    r
}

/// Takes a sample now, appends it to `samples.csv` and keeps it.
pub fn take(soak: &Soak) {
    reap(soak);
    let mut nodes = [NodeSample::default(); 2];
    for (slot, p) in nodes.iter_mut().zip(lock(&soak.proxies).iter()) {
        *slot = NodeSample {
            pid: p.pid(),
            generation: p.generation,
            usage: usage(p.pid(), soak.ticks).unwrap_or_default(),
        };
    }
    let clients_cpu_s = lock(&soak.loads)
        .iter()
        .filter_map(|l| usage(l.pid(), soak.ticks))
        .map(|u| u.cpu_s)
        .sum();
    let s = Sample {
        t: soak.start.elapsed().as_secs_f64(),
        nodes,
        harness: usage(std::process::id(), soak.ticks).unwrap_or_default(),
        clients_cpu_s,
        pods_added: soak.stats.pods_added.load(Ordering::Relaxed),
        pods_deleted: soak.stats.pods_deleted.load(Ordering::Relaxed),
        restarts: soak.stats.restarts.load(Ordering::Relaxed),
        totals: soak.reports.totals(),
    };
    let path = soak.args.out.join("samples.csv");
    let new = !path.exists();
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
    {
        if new {
            let _ = writeln!(f, "{}", header());
        }
        let _ = writeln!(f, "{}", row(&s));
    }
    lock(&soak.samples).push(s);
}

/// Samples every period until `stop`.
pub async fn run(soak: Arc<Soak>, mut stop: watch::Receiver<bool>) {
    let mut every = tokio::time::interval(soak.args.sample_every);
    every.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => take(&soak),
            _ = stopped(&mut stop) => return,
        }
    }
}
