//! The policy objects (Server, AuthorizationPolicy, MeshTLSAuthentication,
//! NetworkAuthentication, HTTPRoute, GRPCRoute — and any other kind the index reads) as the
//! control plane converts them into its model and renders them for the node proxies, and
//! what the node proxy makes of that rendering.
//!
//! Input: YAML objects, added one by one (each refused one skipped, as a watch event
//! would be) to a small cluster of meshed pods and Services (`ambit_fuzz::cluster`).
//!
//! Invariants: no panic; the node proxy accepts everything the control plane renders
//! (policies, routes, discovery: nothing refused or invalid), in chunks as they are
//! streamed; every regular expression rendered stands on its own; a delta from the
//! rendering without the objects to the rendering with them leaves the proxy where the
//! snapshot with them does.
#![no_main]

use ambit_api::proto::{discovery as dpb, policy as ppb};
use ambit_control::discovery::{self as cdisc, Core, DiscoveryMetrics, Hub};
use ambit_control::index::{ClusterIndex, SharedIndex};
use ambit_control::local::{parse_file, DEFAULT_NAMESPACE};
use ambit_control::policy::{
    delta_chunks, diff, diff_services, policy_problems, render_nodes, render_routes,
    snapshot_chunks, Defaults, NodePolicies, ServiceRoutesMap,
};
use ambit_fuzz::cluster::{base_index, NODE, OTHER_NODE};
use ambit_fuzz::regexes::{of_pod, of_service, stands_alone};
use ambit_proxy::discovery::DiscoveryState;
use ambit_proxy::policy::{PolicyState, PortPolicy};
use ambit_proxy::stream::{Chunked, Chunks};
use libfuzzer_sys::fuzz_target;
use std::path::Path;
use std::sync::OnceLock;

/// Small chunks, so that every rendering is streamed in several.
const PER_CHUNK: usize = 2;
const CHUNK_BYTES: usize = 512;

/// The cluster-wide defaults the control plane renders with.
fn defaults() -> Defaults {
    Defaults {
        policy: "all-unauthenticated".into(),
        cluster_networks: vec!["10.0.0.0/8".into()],
    }
}

/// What the control plane renders for the proxies from one index.
struct Rendering {
    nodes: std::collections::BTreeMap<String, NodePolicies>,
    routes: ServiceRoutesMap,
}

fn render(index: &ClusterIndex) -> Rendering {
    let d = defaults();
    let _ = policy_problems(index, &d);
    Rendering {
        nodes: render_nodes(index, &d, |_| true).nodes,
        routes: render_routes(index, &ServiceRoutesMap::new()).services,
    }
}

/// The base cluster's rendering, made once.
fn base() -> &'static (ClusterIndex, Rendering) {
    static BASE: OnceLock<(ClusterIndex, Rendering)> = OnceLock::new();
    BASE.get_or_init(|| {
        let index = base_index();
        let rendering = render(&index);
        (index, rendering)
    })
}

/// Feeds `chunks` through the proxy's chunk gatherer and applies each whole update.
fn stream<U: Chunked>(chunks: Vec<U>, mut apply: impl FnMut(U)) {
    let mut gather = Chunks::default();
    for c in chunks {
        if let Some(whole) = gather.push(c) {
            apply(whole);
        }
    }
}

/// A node proxy's policy state with `policies` and `routes` streamed to it as a snapshot.
fn policy_state(policies: &NodePolicies, routes: &ServiceRoutesMap) -> PolicyState {
    let fallback = PortPolicy::default_policy("all-unauthenticated", &[]).expect("a default");
    let mut state = PolicyState::new(fallback);
    stream(
        snapshot_chunks(policies, routes, PER_CHUNK, CHUNK_BYTES),
        |u: ppb::Update| {
            let refused = state.apply(u);
            assert!(
                refused.is_empty(),
                "the proxy refused the control plane's policy: {refused:?}"
            );
        },
    );
    state
}

/// Checks that two proxy states agree on every pod and Service of both renderings.
fn same_policy(a: &PolicyState, b: &PolicyState, pods: &[&ppb::PodPolicy], routes: &[&String]) {
    for p in pods {
        let ports = p.ports.iter().filter_map(|pp| u16::try_from(pp.port).ok());
        for port in ports.chain([0, 1, 8080, 9090]) {
            assert_eq!(
                a.port(&p.pod, port),
                b.port(&p.pod, port),
                "pod {} port {port}",
                p.pod
            );
        }
    }
    for key in routes {
        let (ns, name) = key.split_once('/').expect("<namespace>/<name>");
        assert_eq!(
            a.routes(ns, name).is_some(),
            b.routes(ns, name).is_some(),
            "Service {key}"
        );
    }
}

fn check_policy(base: &Rendering, full: &Rendering) {
    for s in full.routes.values() {
        for pattern in of_service(s) {
            assert!(
                stands_alone(&pattern),
                "Service {}: rendered regex {pattern:?}",
                s.service
            );
        }
    }
    let empty = NodePolicies::new();
    for node in [NODE, OTHER_NODE] {
        let before = base.nodes.get(node).unwrap_or(&empty);
        let after = full.nodes.get(node).unwrap_or(&empty);
        for p in after.values() {
            for pattern in of_pod(p) {
                assert!(
                    stands_alone(&pattern),
                    "pod {}: rendered regex {pattern:?}",
                    p.pod
                );
            }
        }
        let snapshot = policy_state(after, &full.routes);
        let mut delta_state = policy_state(before, &base.routes);
        let mut delta = diff(before, after);
        diff_services(&base.routes, &full.routes, &mut delta);
        stream(delta_chunks(delta, PER_CHUNK, CHUNK_BYTES), |u| {
            let refused = delta_state.apply(u);
            assert!(refused.is_empty(), "the proxy refused a delta: {refused:?}");
        });
        let pods: Vec<&ppb::PodPolicy> = before.values().chain(after.values()).collect();
        let routes: Vec<&String> = base.routes.keys().chain(full.routes.keys()).collect();
        same_policy(&snapshot, &delta_state, &pods, &routes);
    }
}

/// Every target a proxy of the cluster could subscribe to: each Service by name and
/// ClusterIP, each pod by address.
fn targets(index: &ClusterIndex) -> Vec<String> {
    let mut t: Vec<String> = index
        .services()
        .flat_map(|s| {
            let name = format!("{}/{}", s.namespace, s.name);
            std::iter::once(name).chain(s.cluster_ips.iter().map(ToString::to_string))
        })
        .collect();
    t.extend(
        index
            .workloads()
            .iter()
            .flat_map(|w| w.pod.ips.iter().map(ToString::to_string)),
    );
    t.sort();
    t.dedup();
    t
}

/// Opens a stream of `node` on `hub` subscribed to `targets`; its snapshot streamed in
/// small chunks to a fresh proxy state.
fn open(hub: &Hub, node: &str, targets: &[String]) -> (DiscoveryState, cdisc::Registered) {
    let mut core = hub.lock();
    let Core { catalog, streams } = &mut *core;
    let mut reg = streams.register(node);
    let t = targets
        .iter()
        .filter_map(|t| cdisc::canonical(t).ok())
        .collect();
    streams.subscribe(catalog, reg.id, t);
    let snapshot = streams.snapshot(catalog, reg.id, &mut reg.rx);
    drop(core);
    let mut state = DiscoveryState::default();
    stream(
        cdisc::updates(snapshot, true, PER_CHUNK, CHUNK_BYTES),
        |u: dpb::Update| {
            let invalid = state.apply(u);
            assert!(
                invalid.is_empty(),
                "the proxy ignored discovery resources: {invalid:?}"
            );
        },
    );
    (state, reg)
}

/// What the proxy resolves, compared between two states: workloads and every Service port.
fn same_discovery(a: &DiscoveryState, b: &DiscoveryState, index: &ClusterIndex) {
    let wa: Vec<_> = a.workloads().collect();
    let wb: Vec<_> = b.workloads().collect();
    assert_eq!(wa, wb, "a delta and a snapshot left different workloads");
    assert_eq!(
        a.resolutions(),
        b.resolutions(),
        "and different resolutions"
    );
    for s in index.services() {
        for port in s.ports.iter().map(|p| p.port) {
            assert_eq!(
                a.service(&s.namespace, &s.name, port),
                b.service(&s.namespace, &s.name, port),
                "Service {}/{} port {port}",
                s.namespace,
                s.name
            );
        }
    }
}

/// The discovery stream of a node subscribed to everything in either index: opened on
/// the base cluster then sent the change to `full` as deltas, it must end where a stream
/// opened on `full` starts.
fn check_discovery(base: &ClusterIndex, full: &ClusterIndex) {
    let mut all = targets(base);
    all.extend(targets(full));
    all.sort();
    all.dedup();
    let targets = all;
    for node in [NODE, OTHER_NODE] {
        let shared = SharedIndex::new(base.clone());
        let hub = Hub::new(DiscoveryMetrics::default());
        hub.start(&shared);
        let (mut delta_state, mut reg) = open(&hub, node, &targets);
        shared.replace(full.clone());
        hub.publish(&shared);
        let mut pieces = Vec::new();
        while let Ok(o) = reg.rx.try_recv() {
            pieces.push(o);
        }
        assert!(!reg.behind.load(std::sync::atomic::Ordering::Relaxed));
        for u in cdisc::updates(pieces, false, PER_CHUNK, CHUNK_BYTES) {
            let invalid = delta_state.apply(u);
            assert!(
                invalid.is_empty(),
                "the proxy ignored a discovery delta: {invalid:?}"
            );
        }
        let (snapshot, _) = open(&hub, node, &targets);
        same_discovery(&snapshot, &delta_state, full);
        let mut local: Vec<String> = snapshot
            .workloads()
            .filter(|w| w.node == node)
            .map(|w| w.key())
            .collect();
        let mut want: Vec<String> = full
            .workloads_on_node(node)
            .iter()
            .map(|w| format!("{}/{}", w.pod.namespace, w.pod.name))
            .collect();
        local.sort();
        want.sort();
        assert_eq!(local, want, "the node's own pods");
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut skipped = 0;
    let Ok(objects) = parse_file(Path::new("objects.yaml"), text, &mut skipped) else {
        return;
    };
    let (base_index, base_rendering) = base();
    let mut index = base_index.clone();
    for mut o in objects {
        o.object.default_namespace(DEFAULT_NAMESPACE);
        let _ = index.apply(o.object);
    }
    let full = render(&index);
    check_policy(base_rendering, &full);
    check_discovery(base_index, &index);
});
