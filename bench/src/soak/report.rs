//! The summary: requests and failures per kind, what the churn and the restarts did, and
//! each proxy process's memory, descriptors and CPU from its first sample to its last
//! (with the least-squares slope of RSS and descriptors) — printed and written to
//! `summary.md`.

use crate::load::KINDS;
use crate::run::{lock, Soak};
use crate::sample::Sample;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;

/// The least-squares slope of `ys` over `xs` (per unit of x); 0 with fewer than 2 points.
fn slope(xs: &[f64], ys: &[f64]) -> f64 {
    let n = xs.len() as f64;
    if xs.len() < 2 {
        return 0.0;
    }
    let (mx, my) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
    let cov: f64 = xs.iter().zip(ys).map(|(x, y)| (x - mx) * (y - my)).sum();
    let var: f64 = xs.iter().map(|x| (x - mx) * (x - mx)).sum();
    if var == 0.0 {
        0.0
    } else {
        cov / var
    }
}

/// One proxy process's samples, summarized as a table row.
fn process_row(node: &str, samples: &[&Sample], i: usize) -> String {
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        return String::new();
    };
    let n = |s: &Sample| s.nodes[i];
    let mins: Vec<f64> = samples.iter().map(|s| s.t / 60.0).collect();
    let rss: Vec<f64> = samples.iter().map(|s| n(s).usage.rss_kib as f64).collect();
    let fds: Vec<f64> = samples.iter().map(|s| n(s).usage.fds as f64).collect();
    // The trend once warm: a new process's first minute (its heap and pools filling) would
    // dominate a slope over a few minutes' life.
    let warm = mins
        .iter()
        .position(|m| *m >= mins[0] + 1.0)
        .unwrap_or(mins.len());
    let trend = |v: &[f64]| slope(&mins[warm..], &v[warm..]);
    let max = |v: &[f64]| v.iter().cloned().fold(0.0, f64::max);
    let secs = last.t - first.t;
    let cpu = if secs > 0.0 {
        (n(last).usage.cpu_s - n(first).usage.cpu_s) / secs * 100.0
    } else {
        0.0
    };
    let mib = |k: f64| k / 1024.0;
    format!(
        "| {node} | {} (pid {}) | {:.1}–{:.1} | {} | {:.1} → {:.1} | {:.1} | {:+.1} | {} → {} | {} | {:+.2} | {cpu:.1} |\n",
        n(first).generation,
        n(first).pid,
        first.t / 60.0,
        last.t / 60.0,
        samples.len(),
        mib(rss[0]),
        mib(rss[rss.len() - 1]),
        mib(max(&rss)),
        trend(&rss),
        fds[0],
        fds[fds.len() - 1],
        max(&fds),
        trend(&fds),
    )
}

/// The summary as Markdown.
pub fn summary(soak: &Soak) -> String {
    let a = &soak.args;
    let mut s = format!(
        "# Soak: {} min of load, a restart every {:?}, a churn pod every {:?}, a change every {:?}, {} req/s per kind per client\n\n",
        a.minutes, a.restart_every, a.churn_every, a.change_every, a.rate
    );
    let totals = soak.reports.totals();
    s += "| traffic | served | failed | retried unsent | slow (≥ 1 s) | slowest (ms) |\n";
    s += "|---|---:|---:|---:|---:|---:|\n";
    let (mut ok, mut failed) = (0, 0);
    for (k, c) in KINDS.iter().zip(&totals) {
        ok += c[0];
        failed += c[1];
        let slowest = if *k == "tcp_stream" {
            "–".to_string()
        } else {
            c[3].to_string()
        };
        let _ = writeln!(
            s,
            "| {k} | {} | {} | {} | {} | {slowest} |",
            c[0], c[1], c[4], c[2]
        );
    }
    let _ = writeln!(s, "| **all** | **{ok}** | **{failed}** | | | |\n");
    let st = &soak.stats;
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let _ = writeln!(
        s,
        "Churn: {} pods added, {} deleted through the CNI chain (ADD failed {}, DEL failed {}); {} policy and Service changes.\n\
         Restarts: {} hitless hand-overs ({} failed).\n",
        get(&st.pods_added),
        get(&st.pods_deleted),
        get(&st.cni_add_failed),
        get(&st.cni_del_failed),
        get(&st.changes),
        get(&st.restarts),
        get(&st.restarts_failed),
    );
    s += "| node | proxy (generation) | minutes | samples | RSS MiB first → last | RSS max | RSS slope KiB/min¹ | fds first → last | fds max | fds slope /min¹ | CPU % |\n";
    s += "|---|---|---|---:|---|---:|---:|---|---:|---:|---:|\n";
    let samples = lock(&soak.samples).clone();
    for (i, node) in ["node-a", "node-b"].iter().enumerate() {
        let mut generations: Vec<u32> = samples.iter().map(|x| x.nodes[i].generation).collect();
        generations.dedup();
        for g in generations {
            let of: Vec<&Sample> = samples
                .iter()
                .filter(|x| x.nodes[i].generation == g && x.nodes[i].usage.rss_kib > 0)
                .collect();
            s += &process_row(node, &of, i);
        }
    }
    s += "\n¹ Least squares over the process's samples after its first minute.\n";
    if let (Some(f), Some(l)) = (samples.first(), samples.last()) {
        let secs = (l.t - f.t).max(1.0);
        let _ = writeln!(
            s,
            "\nThe orchestrator (control plane, servers, churn): RSS {:.1} → {:.1} MiB, {:.1} % CPU; the clients {:.1} % CPU.",
            f.harness.rss_kib as f64 / 1024.0,
            l.harness.rss_kib as f64 / 1024.0,
            (l.harness.cpu_s - f.harness.cpu_s) / secs * 100.0,
            (l.clients_cpu_s - f.clients_cpu_s) / secs * 100.0,
        );
    }
    s += "\nEvents:\n\n";
    for (t, what, detail) in lock(&soak.events.list).iter() {
        if matches!(
            what.as_str(),
            "restart" | "restart_ready" | "restart_failed" | "old_exited" | "old_killed"
        ) || what.contains("failed")
            || what == "error"
        {
            let _ = writeln!(s, "- {t:.1} s {what}: {detail}");
        }
    }
    let failures = soak.reports.failures();
    if !failures.is_empty() {
        s += "\nFailures (the first of each kind per client; all in failures.log):\n\n";
        for (t, client, kind, error) in failures.iter().take(40) {
            let _ = writeln!(s, "- {t:.1} s {client} {kind}: {error}");
        }
    }
    s
}

/// Prints the summary and writes it to `summary.md`.
pub fn write(soak: &Soak) -> anyhow::Result<()> {
    let s = summary(soak);
    println!("{s}");
    std::fs::write(soak.args.out.join("summary.md"), s)?;
    Ok(())
}
