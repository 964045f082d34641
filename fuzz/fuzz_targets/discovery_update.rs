//! Discovery updates applied to the node proxy's view of the cluster
//! (`ambit_proxy::discovery::DiscoveryState::apply`), gathered from chunks as the
//! discovery client gathers them (`ambit_proxy::stream::Chunks`).
//!
//! Input: up to 8 `ambit.discovery.v1.Update` messages, each length-delimited (a varint
//! length, then the message).
//!
//! Invariants: no panic; exactly the invalid resources (an address or identity that does
//! not parse, an endpoint delta for a Service not held) are skipped and reported; a valid workload the update adds is there
//! afterwards, one it removes and does not add is gone, a snapshot leaves only its own; the address indexes agree with the workloads and
//! Services (every pod IP leads back to a pod that has it, every Service address and port
//! resolves to that Service with only ready endpoints); a node's local workloads are its
//! meshed pods; a snapshot marks the state synced.
#![no_main]

use ambit_api::proto::discovery as pb;
use ambit_api::WorkloadIdentity;
use ambit_fuzz::messages;
use ambit_proxy::discovery::{Destination, DiscoveryState};
use ambit_proxy::stream::Chunks;
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

/// Whether every one of `ips` is an IP address.
fn ips_ok(ips: &[String]) -> bool {
    ips.iter().all(|ip| ip.parse::<IpAddr>().is_ok())
}

/// Whether the proxy should take `w`: its IPs and identity parse.
fn workload_ok(w: &pb::Workload) -> bool {
    ips_ok(&w.ips) && w.identity.parse::<WorkloadIdentity>().is_ok()
}

/// Whether the proxy should take `s`: its addresses parse, and the identities of its
/// meshed endpoints.
fn service_ok(s: &pb::Service) -> bool {
    ips_ok(&s.cluster_ips)
        && s.endpoints.iter().all(|e| {
            e.address.parse::<IpAddr>().is_ok()
                && (!e.meshed
                    || e.identity.is_empty()
                    || e.identity.parse::<WorkloadIdentity>().is_ok())
        })
}

/// Whether the proxy should take endpoint delta `d`, given the Services it holds: one of
/// them, and its endpoints valid.
fn delta_ok(d: &pb::EndpointDelta, held: &BTreeSet<String>) -> bool {
    held.contains(&d.service)
        && d.upserted.iter().all(|e| {
            e.address.parse::<IpAddr>().is_ok()
                && (!e.meshed
                    || e.identity.is_empty()
                    || e.identity.parse::<WorkloadIdentity>().is_ok())
        })
}

/// The Services held once `update` applied the Services it removes and adds (endpoint
/// deltas apply after both), starting from `before`.
fn held_after(before: &BTreeSet<String>, update: &pb::Update) -> BTreeSet<String> {
    let mut held = if update.snapshot {
        BTreeSet::new()
    } else {
        before.clone()
    };
    for k in &update.removed_services {
        held.remove(k);
    }
    for s in update.services.iter().filter(|s| service_ok(s)) {
        held.insert(format!("{}/{}", s.namespace, s.name));
    }
    held
}

/// Checks what `update` should have done to `state`; `invalid` is how many resources
/// apply reported; `held` the Services held before it.
fn check_applied(
    state: &DiscoveryState,
    update: &pb::Update,
    invalid: usize,
    held: &BTreeSet<String>,
) {
    let held = held_after(held, update);
    let bad = update.workloads.iter().filter(|w| !workload_ok(w)).count()
        + update.services.iter().filter(|s| !service_ok(s)).count()
        + update
            .endpoint_deltas
            .iter()
            .filter(|d| !delta_ok(d, &held))
            .count();
    assert_eq!(invalid, bad, "invalid resources reported");
    let key = |w: &pb::Workload| format!("{}/{}", w.namespace, w.name);
    let added: BTreeSet<String> = update.workloads.iter().map(key).collect();
    for w in update.workloads.iter().filter(|w| workload_ok(w)) {
        assert!(
            state.workload(&key(w)).is_some(),
            "workload {} was not added",
            key(w)
        );
    }
    for k in &update.removed_workloads {
        if !added.contains(k) {
            assert!(state.workload(k).is_none(), "workload {k} was not removed");
        }
    }
    if update.snapshot {
        assert!(state.synced);
        for w in state.workloads() {
            assert!(added.contains(&w.key()), "{} survived a snapshot", w.key());
        }
    }
}

/// Checks that the state's indexes agree with its contents.
fn check_indexes(state: &DiscoveryState, update: &pb::Update) {
    let known = state.known_ips();
    for w in state.workloads() {
        for ip in &w.ips {
            assert!(known.contains(ip));
            let found = state.workload_by_ip(*ip).expect("a pod IP finds its pod");
            assert!(found.ips.contains(ip), "{ip} led to {}", found.key());
        }
    }
    let nodes: BTreeSet<&str> = state.workloads().map(|w| w.node.as_str()).collect();
    for node in nodes {
        for w in state.local_workloads(node) {
            assert!(w.meshed && w.node == node);
        }
    }
    for s in &update.services {
        for p in &s.ports {
            let Ok(port) = u16::try_from(p.port) else {
                continue;
            };
            let _ = state.service(&s.namespace, &s.name, port);
            for ip in s.cluster_ips.iter().filter_map(|ip| ip.parse().ok()) {
                if let Destination::Service {
                    service,
                    port: sp,
                    endpoints,
                } = state.resolve(SocketAddr::new(ip, port))
                {
                    assert!(service.cluster_ips.contains(&ip));
                    assert_eq!(sp.port, port);
                    assert!(endpoints.iter().all(|(_, e)| e.ready));
                }
            }
        }
        for e in &s.endpoints {
            if let Ok(ip) = e.address.parse() {
                let _ = state.resolve(SocketAddr::new(ip, 8080));
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut state = DiscoveryState::default();
    let mut chunks = Chunks::default();
    for chunk in messages::<pb::Update>(data, 8) {
        let Some(update) = chunks.push(chunk) else {
            continue;
        };
        let held: BTreeSet<String> = state
            .services()
            .map(|s| format!("{}/{}", s.namespace, s.name))
            .collect();
        let invalid = state.apply(update.clone()).len();
        check_applied(&state, &update, invalid, &held);
        check_indexes(&state, &update);
    }
});
