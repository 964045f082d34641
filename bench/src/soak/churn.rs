//! Pods coming and going, and the cluster's objects changing, under the load.
//!
//! Every `--churn-every`: the pods taken out of the `churn` Service a period ago are
//! deleted (their server stopped, CNI DEL, the Pod object removed, the netns deleted); a
//! new pod is added (the Pod object, Pending; CNI ADD through the node's chain; its server;
//! Running with its address and in the Service's endpoints); and the oldest pod beyond
//! [`CHURN_KEPT`] leaves the Service's endpoints — a Deployment's rolling update, with the
//! endpoint removed before the pod goes as Kubernetes does. Pods alternate between the
//! nodes and among three ServiceAccounts.
//!
//! Every `--change-every`: the AuthorizationPolicy on the servers' HTTP port is replaced
//! by the other one (both allow the clients), and in turn the `churn` Service's
//! HTTPRoute or the `extra` Service comes or goes.

use crate::cluster::Pod;
use crate::run::{cni_add, cni_del, stopped, Soak, Stats, CHURN_KEPT};
use crate::servers::{self, Servers};
use ambit_e2e::cni::CniPod;
use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;

/// A churn pod and its server.
#[derive(Debug)]
struct ChurnPod {
    pod: CniPod,
    _servers: Servers,
}

/// The churn pods alive.
#[derive(Debug, Default)]
pub struct Churn {
    /// In the Service's endpoints, oldest first.
    live: VecDeque<ChurnPod>,
    /// Out of the endpoints since then, to be deleted.
    leaving: Vec<(ChurnPod, Instant)>,
    next: u32,
}

/// Churns until `stop`; the pods left, for the teardown.
pub async fn run(soak: Arc<Soak>, mut churn: Churn, mut stop: watch::Receiver<bool>) -> Churn {
    let mut tick = tokio::time::interval(soak.args.churn_every);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let every = soak.args.change_every;
    let mut change = tokio::time::interval_at((Instant::now() + every).into(), every);
    change.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut k = 0u32;
    loop {
        tokio::select! {
            _ = tick.tick() => churn.step(&soak).await,
            _ = change.tick() => {
                k += 1;
                churn.change(&soak, k).await;
            }
            _ = stopped(&mut stop) => break,
        }
    }
    churn
}

impl Churn {
    /// One period: the leaving pods deleted, a pod added, the oldest beyond
    /// [`CHURN_KEPT`] out of the endpoints.
    async fn step(&mut self, soak: &Soak) {
        let period = soak
            .args
            .churn_every
            .saturating_sub(Duration::from_millis(500));
        let (due, wait): (Vec<_>, Vec<_>) = std::mem::take(&mut self.leaving)
            .into_iter()
            .partition(|(_, since)| since.elapsed() >= period);
        self.leaving = wait;
        for (p, _) in due {
            self.delete(soak, p).await;
        }
        self.add(soak).await;
        while self.live.len() > CHURN_KEPT {
            let Some(oldest) = self.live.pop_front() else {
                break;
            };
            let mut objects = soak.objects.lock().await;
            objects.churn_endpoints.retain(|n| *n != oldest.pod.name);
            if let Err(e) = objects.write().await {
                soak.events.log("write_failed", e);
            }
            drop(objects);
            self.leaving.push((oldest, Instant::now()));
        }
    }

    /// Adds the next churn pod: its Pod object (Pending), CNI ADD, its server, then
    /// Running with its address and in the `churn` Service.
    pub async fn add(&mut self, soak: &Soak) {
        let n = self.next;
        self.next += 1;
        let idx = (n % 2) as usize;
        let node = soak.cluster.nodes[idx].name.clone();
        let host = 100 + (n / 2 % 150) as u8;
        let name = format!("churn-{n}");
        let pod = Pod {
            name: name.clone(),
            node: node.clone(),
            ip: Ipv4Addr::new(10, 78, soak.cluster.nodes[idx].subnet, host),
            sa: format!("churn-{}", n % 3),
            app: "churn",
            running: false,
        };
        {
            let mut objects = soak.objects.lock().await;
            objects.pods.push(pod);
            if let Err(e) = objects.write().await {
                soak.events.log("write_failed", e);
            }
        }
        let started = Instant::now();
        let added = cni_add(soak, &node, &name, host).await;
        let served = match added {
            Ok(pod) => {
                match servers::start(std::path::Path::new(&pod.path()), &name, false).await {
                    Ok(s) => Ok((pod, s)),
                    Err(e) => {
                        let _ = cni_del(soak, &pod).await;
                        Err(format!("its server: {e}"))
                    }
                }
            }
            Err(e) => Err(e),
        };
        let mut objects = soak.objects.lock().await;
        match served {
            Ok((pod, s)) => {
                Stats::bump(&soak.stats.pods_added);
                if started.elapsed() > Duration::from_secs(2) {
                    soak.events.log(
                        "cni_add_slow",
                        format!("{name} on {node}: {:.2?}", started.elapsed()),
                    );
                }
                if let Some(p) = objects.pod_mut(&name) {
                    p.running = true;
                }
                objects.churn_endpoints.push(name);
                self.live.push_back(ChurnPod { pod, _servers: s });
            }
            Err(e) => {
                Stats::bump(&soak.stats.cni_add_failed);
                soak.events
                    .log("cni_add_failed", format!("{name} on {node}: {e}"));
                objects.pods.retain(|p| p.name != name);
            }
        }
        if let Err(e) = objects.write().await {
            soak.events.log("write_failed", e);
        }
    }

    /// Deletes a pod out of the endpoints: its server stopped, CNI DEL and the netns
    /// removed, then its Pod object.
    async fn delete(&mut self, soak: &Soak, p: ChurnPod) {
        let ChurnPod { pod, _servers } = p;
        drop(_servers);
        match cni_del(soak, &pod).await {
            Ok(()) => Stats::bump(&soak.stats.pods_deleted),
            Err(e) => {
                Stats::bump(&soak.stats.cni_del_failed);
                soak.events
                    .log("cni_del_failed", format!("{}: {e}", pod.name));
            }
        }
        let mut objects = soak.objects.lock().await;
        objects.pods.retain(|o| o.name != pod.name);
        objects.churn_endpoints.retain(|n| *n != pod.name);
        if let Err(e) = objects.write().await {
            soak.events.log("write_failed", e);
        }
    }

    /// Change `k`: the other AuthorizationPolicy, and the HTTPRoute (odd `k`) or the
    /// `extra` Service (even `k`) toggled.
    async fn change(&mut self, soak: &Soak, k: u32) {
        let mut objects = soak.objects.lock().await;
        objects.policy = if objects.policy == 1 { 2 } else { 1 };
        let what = if k % 2 == 1 {
            objects.route = !objects.route;
            format!(
                "churn HTTPRoute {}",
                if objects.route { "added" } else { "removed" }
            )
        } else {
            objects.extra = !objects.extra;
            format!(
                "Service extra {}",
                if objects.extra { "added" } else { "removed" }
            )
        };
        match objects.write().await {
            Ok(()) => {
                Stats::bump(&soak.stats.changes);
                soak.events.log(
                    "change",
                    format!("AuthorizationPolicy {}, {what}", objects.policy_name()),
                );
            }
            Err(e) => soak.events.log("write_failed", e),
        }
    }

    /// Every churn pod deleted (the teardown).
    pub async fn delete_all(mut self, soak: &Soak) {
        let pods: Vec<ChurnPod> = self
            .leaving
            .drain(..)
            .map(|(p, _)| p)
            .chain(self.live.drain(..))
            .collect();
        for p in pods {
            self.delete(soak, p).await;
        }
    }
}
