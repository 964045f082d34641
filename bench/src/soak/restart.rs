//! Hitless restarts, as a DaemonSet's surge update does them: every `--restart-every`, a
//! new `ambit-proxy` is started on a node (the nodes in turn, node-b first) with the same
//! run directory and an admin port of its own; it takes the running one's listeners over.
//! Once the new one's `/ready` is 200 (and the old one's says it handed over), the old one
//! gets SIGTERM and drains; the sampler reaps it ([`reap`]).

use crate::run::{lock, stopped, Draining, Soak, Stats};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How long a new proxy may take to be ready.
const READY_LIMIT: Duration = Duration::from_secs(120);

/// Restarts a node's proxy every period after `load_start` until `stop`; none in the
/// last half-minute before `end` (a hand-over's drain is part of what is measured).
pub async fn run(
    soak: Arc<Soak>,
    load_start: Instant,
    end: Instant,
    mut stop: watch::Receiver<bool>,
) {
    let mut k: u32 = 0;
    loop {
        k += 1;
        let at = load_start + soak.args.restart_every * k;
        if at + Duration::from_secs(30) > end {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(at.into()) => {}
            _ = stopped(&mut stop) => return,
        }
        if *stop.borrow() {
            return;
        }
        let node = if k % 2 == 1 { 1 } else { 0 };
        if let Err(e) = restart(&soak, node).await {
            Stats::bump(&soak.stats.restarts_failed);
            soak.events.log("restart_failed", format!("{e:#}"));
        }
    }
}

/// One hand-over on node `node`.
async fn restart(soak: &Soak, node: usize) -> anyhow::Result<()> {
    let name = soak.cluster.nodes[node].name.clone();
    let (old_pid, generation) = {
        let procs = lock(&soak.proxies);
        (procs[node].pid(), procs[node].generation + 1)
    };
    let mut new = soak
        .launcher
        .spawn(&soak.cp, &soak.cluster.nodes[node], generation)?;
    soak.events.log(
        "restart",
        format!("{name}: pid {} started beside pid {old_pid}", new.pid()),
    );
    // On failure `new` is dropped (killed): the old one serves on.
    let took = new.until_ready(READY_LIMIT).await?;
    let mut old = std::mem::replace(&mut lock(&soak.proxies)[node], new);
    // The old one says why it is no longer ready.
    let mut said = old.ready().await;
    let asked = Instant::now();
    while !said.1.contains("handed over") && asked.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        said = old.ready().await;
    }
    old.sigterm();
    Stats::bump(&soak.stats.restarts);
    soak.events.log(
        "restart_ready",
        format!(
            "{name}: new proxy ready in {:.2} s; old pid {old_pid} /ready {} {:?}, sent SIGTERM",
            took.as_secs_f64(),
            said.0,
            said.1.trim()
        ),
    );
    lock(&soak.draining).push(Draining {
        proxy: old,
        node,
        since: Instant::now(),
    });
    Ok(())
}

/// Reaps the draining proxies that have exited (and logs how long they drained); kills
/// one still running a minute past its grace period.
pub fn reap(soak: &Soak) {
    let grace = ambit_api::duration::parse_duration(&soak.args.grace).unwrap_or_default();
    let mut draining = lock(&soak.draining);
    let mut kept = Vec::new();
    for mut d in draining.drain(..) {
        let name = &soak.cluster.nodes[d.node].name;
        if let Some(status) = d.proxy.child.exited() {
            soak.events.log(
                "old_exited",
                format!(
                    "{name}: pid {} exited {:.1} s after SIGTERM: {status}",
                    d.proxy.pid(),
                    d.since.elapsed().as_secs_f64()
                ),
            );
        } else if d.since.elapsed() > grace + Duration::from_secs(60) {
            soak.events.log(
                "old_killed",
                format!("{name}: pid {} still running: killed", d.proxy.pid()),
            );
        } else {
            kept.push(d);
        }
    }
    *draining = kept;
}
