use super::stream::updates;
use super::*;
use crate::index::{ClusterIndex, KubeObject};
use ambit_api::proto::discovery as pb;
use std::time::Duration;

fn objects(yaml: &str) -> Vec<KubeObject> {
    let mut skipped = 0;
    crate::local::parse_file(std::path::Path::new("t.yaml"), yaml, &mut skipped)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .map(|o| o.object)
        .collect()
}

fn pod(name: &str, node: &str, ip: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: shop}}\nspec: {{nodeName: {node}, serviceAccountName: {name}, containers: []}}\nstatus: {{podIP: {ip}, phase: Running}}\n"
    )
}

/// Namespace `shop` (meshed); pods a-0 (node-a), b-0 and b-1 (node-b); Service `web`
/// (10.96.0.10) with endpoints b-0 and b-1, Service `db` (10.96.0.11) with none.
fn cluster() -> String {
    let mut y = String::from(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop, annotations: {ambit.dev/mesh: enabled}}\n",
    );
    y += &pod("a-0", "node-a", "10.1.0.1");
    y += &pod("b-0", "node-b", "10.2.0.1");
    y += &pod("b-1", "node-b", "10.2.0.2");
    y += "---\napiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 80}]}\n";
    y += "---\napiVersion: v1\nkind: Service\nmetadata: {name: db, namespace: shop}\nspec: {clusterIP: 10.96.0.11, ports: [{port: 5432}]}\n";
    y += &slice(&["b-0", "b-1"]);
    y
}

fn slice(pods: &[&str]) -> String {
    let eps: Vec<String> = pods
        .iter()
        .map(|p| {
            let ip = if *p == "b-0" { "10.2.0.1" } else { "10.2.0.2" };
            format!("{{addresses: [{ip}], targetRef: {{kind: Pod, name: {p}, namespace: shop}}}}")
        })
        .collect();
    format!(
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: web-1, namespace: shop, labels: {{kubernetes.io/service-name: web}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints: [{}]\n",
        eps.join(", ")
    )
}

fn hub(yaml: &str) -> (Hub, SharedIndex) {
    let index = SharedIndex::new(
        ClusterIndex::from_objects("cluster.local", objects(yaml))
            .unwrap_or_else(|(_, e)| panic!("{e}")),
    );
    let hub = Hub::new(DiscoveryMetrics::default());
    hub.start(&index);
    (hub, index)
}

/// A registered stream, as `stream.rs` keeps it.
struct Watch {
    id: u64,
    rx: tokio::sync::mpsc::Receiver<Out>,
    behind: Arc<std::sync::atomic::AtomicBool>,
}

fn open(hub: &Hub, node: &str, targets: &[&str]) -> (Watch, pb::Update) {
    let mut core = hub.lock();
    let Core { catalog, streams } = &mut *core;
    let reg = streams.register(node);
    let mut w = Watch {
        id: reg.id,
        rx: reg.rx,
        behind: reg.behind,
    };
    let t = targets.iter().map(|t| canonical(t).unwrap()).collect();
    streams.subscribe(catalog, w.id, t);
    let snap = streams.snapshot(catalog, w.id, &mut w.rx);
    let mut u = updates(snap, true, 1 << 20, 1 << 30);
    assert_eq!(u.len(), 1);
    (w, u.remove(0))
}

fn subscribe(hub: &Hub, w: &Watch, targets: &[&str]) {
    let mut core = hub.lock();
    let Core { catalog, streams } = &mut *core;
    let t = targets.iter().map(|t| canonical(t).unwrap()).collect();
    streams.subscribe(catalog, w.id, t);
}

/// What is queued for `w`, as one delta per piece.
fn drain(w: &mut Watch) -> Vec<Out> {
    let mut out = Vec::new();
    while let Ok(o) = w.rx.try_recv() {
        out.push(o);
    }
    out
}

/// What a snapshot holds: pods, Services, resolutions, each sorted (a snapshot's order
/// matters only in that resolutions come after what they name, which `apply` ensures).
fn names(u: &pb::Update) -> Vec<String> {
    let mut w: Vec<String> = u
        .workloads
        .iter()
        .map(|w| format!("{}/{}", w.namespace, w.name))
        .collect();
    let mut s: Vec<String> = u
        .services
        .iter()
        .map(|s| format!("svc {}/{}", s.namespace, s.name))
        .collect();
    let mut r: Vec<String> = u
        .resolutions
        .iter()
        .map(|r| format!("{} -> {}{}", r.target, r.service, r.workload))
        .collect();
    w.sort();
    s.sort();
    r.sort();
    w.into_iter().chain(s).chain(r).collect()
}

fn piece_names(out: &[Out]) -> Vec<String> {
    out.iter()
        .map(|o| match o {
            Out::Workload(w) => format!("{}/{}", w.namespace, w.name),
            Out::RemoveWorkload(k) => format!("-{k}"),
            Out::Service(s) => format!(
                "svc {}/{} ({} endpoints)",
                s.namespace,
                s.name,
                s.endpoints.len()
            ),
            Out::RemoveService(k) => format!("-svc {k}"),
            Out::Endpoints(d) => format!(
                "endpoints {} +{:?} -{:?}",
                d.service,
                d.upserted
                    .iter()
                    .map(|e| e.address.clone())
                    .collect::<Vec<_>>(),
                d.removed
            ),
            Out::Resolution(r) => {
                format!("{} -> {}{}{}", r.target, r.service, r.workload, r.refused)
            }
            Out::RemoveResolution(t) => format!("-{t}"),
        })
        .collect()
}

#[test]
fn a_node_is_sent_its_own_pods_and_only_the_destinations_it_subscribes_to() {
    let (hub, _index) = hub(&cluster());
    let (_a, snap) = open(&hub, "node-a", &[]);
    assert_eq!(
        names(&snap),
        ["shop/a-0"],
        "node-a's pods, nothing of node-b's"
    );
    let (_b, snap) = open(
        &hub,
        "node-b",
        &["10.96.0.10", "10.1.0.1", "192.0.2.7", "shop/db"],
    );
    assert_eq!(
        names(&snap),
        [
            "shop/a-0",
            "shop/b-0",
            "shop/b-1",
            "svc shop/db",
            "svc shop/web",
            "10.1.0.1 -> shop/a-0",
            "10.96.0.10 -> shop/web",
            "192.0.2.7 -> ",
            "shop/db -> shop/db",
        ]
    );
    let web = snap.services.iter().find(|s| s.name == "web").unwrap();
    let ids: Vec<_> = web
        .endpoints
        .iter()
        .map(|e| (e.address.as_str(), e.identity.as_str(), e.node.as_str()))
        .collect();
    assert_eq!(
        ids,
        [
            (
                "10.2.0.1",
                "spiffe://cluster.local/ns/shop/sa/b-0",
                "node-b"
            ),
            (
                "10.2.0.2",
                "spiffe://cluster.local/ns/shop/sa/b-1",
                "node-b"
            ),
        ]
    );
    assert!(
        web.endpoints[0]
            .opaque_ports
            .iter()
            .any(|r| r.first <= 3306 && 3306 <= r.last),
        "an endpoint carries its pod's opaque ports (Linkerd's defaults here)"
    );
}

#[test]
fn a_change_goes_to_the_streams_that_hold_it_and_to_no_other() {
    let (hub, index) = hub(&cluster());
    let (mut a, _) = open(&hub, "node-a", &["10.96.0.10"]);
    let (mut other, _) = open(&hub, "node-c", &["10.96.0.11"]);
    // b-1 becomes not ready in its slice: one endpoint changes.
    let yaml = cluster().replace(
        "{addresses: [10.2.0.2], targetRef",
        "{addresses: [10.2.0.2], conditions: {ready: false}, targetRef",
    );
    index.replace(ClusterIndex::from_objects("cluster.local", objects(&yaml)).unwrap());
    hub.publish(&index);
    assert_eq!(
        piece_names(&drain(&mut a)),
        ["endpoints shop/web +[\"10.2.0.2\"] -[]"]
    );
    assert!(
        drain(&mut other).is_empty(),
        "a stream that does not hold web is sent nothing"
    );
    // A pod of node-b changes: node-a's stream holds it only through web's endpoint,
    // which does not change.
    index
        .apply(
            objects(&pod("b-0", "node-b", "10.2.0.1").replace(
                "phase: Running",
                "phase: Running, conditions: [{type: Ready, status: 'True'}]",
            ))
            .remove(0),
        )
        .unwrap();
    hub.publish(&index);
    assert!(drain(&mut a).is_empty());
    assert!(drain(&mut other).is_empty());
    // A new pod on node-c reaches node-c alone.
    index
        .apply(objects(&pod("c-0", "node-c", "10.3.0.1")).remove(0))
        .unwrap();
    hub.publish(&index);
    assert_eq!(piece_names(&drain(&mut other)), ["shop/c-0"]);
    assert!(drain(&mut a).is_empty());
}

#[test]
fn a_target_follows_what_it_resolves_to() {
    let (hub, index) = hub(&cluster());
    let (mut a, snap) = open(&hub, "node-a", &["10.9.9.9", "shop/api"]);
    assert_eq!(names(&snap), ["shop/a-0", "10.9.9.9 -> ", "shop/api -> "]);
    // A pod gets the address: it is sent, then the resolution that names it.
    index
        .apply(objects(&pod("late", "node-b", "10.9.9.9")).remove(0))
        .unwrap();
    // The Service by name is created.
    for o in objects("apiVersion: v1\nkind: Service\nmetadata: {name: api, namespace: shop}\nspec: {clusterIP: 10.96.0.12, ports: [{port: 80}]}\n") {
        index.apply(o).unwrap();
    }
    hub.publish(&index);
    assert_eq!(
        piece_names(&drain(&mut a)),
        [
            "shop/late",
            "10.9.9.9 -> shop/late",
            "svc shop/api (0 endpoints)",
            "shop/api -> shop/api",
        ]
    );
    // The pod goes: removed, and the address is outside the cluster again.
    index.delete(&crate::index::ObjectRef {
        kind: crate::index::Kind::Pod,
        namespace: Some("shop".into()),
        name: "late".into(),
    });
    hub.publish(&index);
    assert_eq!(piece_names(&drain(&mut a)), ["-shop/late", "10.9.9.9 -> "]);
    // Unsubscribed: the Service and its resolution are removed.
    {
        let mut core = hub.lock();
        let Core { catalog, streams } = &mut *core;
        streams.unsubscribe(catalog, a.id, vec![canonical("shop/api").unwrap()]);
    }
    assert_eq!(piece_names(&drain(&mut a)), ["-shop/api", "-svc shop/api"]);
}

#[test]
fn a_pod_held_twice_stays_until_both_let_go() {
    let (hub, _index) = hub(&cluster());
    // Its own pod a-0, also subscribed by address.
    let (mut a, snap) = open(&hub, "node-a", &["10.1.0.1"]);
    assert_eq!(names(&snap), ["shop/a-0", "10.1.0.1 -> shop/a-0"]);
    let mut core = hub.lock();
    let Core { catalog, streams } = &mut *core;
    streams.unsubscribe(catalog, a.id, vec![canonical("10.1.0.1").unwrap()]);
    drop(core);
    assert_eq!(
        piece_names(&drain(&mut a)),
        ["-10.1.0.1"],
        "the pod stays: it is the node's"
    );
}

#[test]
fn targets_are_checked_and_bounded() {
    assert_eq!(canonical("10.0.0.1").unwrap().as_ref(), "10.0.0.1");
    assert_eq!(canonical("fd00:0::1").unwrap().as_ref(), "fd00::1");
    assert_eq!(canonical("shop/web").unwrap().as_ref(), "shop/web");
    for bad in [
        "",
        "web",
        "shop/",
        "/web",
        "Shop/web",
        "shop/web/x",
        "a b/c",
    ] {
        assert!(canonical(bad).is_err(), "{bad:?}");
    }
    let (hub, _index) = hub(&cluster());
    let (mut a, _) = open(&hub, "node-a", &[]);
    let many: Vec<String> = (0..MAX_TARGETS + 2)
        .map(|i| format!("10.200.{}.{}", i / 250, i % 250))
        .collect();
    let refs: Vec<&str> = many.iter().map(String::as_str).collect();
    subscribe(&hub, &a, &refs);
    assert!(
        a.behind.load(std::sync::atomic::Ordering::Relaxed),
        "more than the queue holds"
    );
    let mut core = hub.lock();
    let Core { catalog, streams } = &mut *core;
    let snap = streams.snapshot(catalog, a.id, &mut a.rx);
    assert_eq!(
        streams.targets(),
        MAX_TARGETS,
        "no more than the bound is kept"
    );
    drop(core);
    let resolutions = snap
        .iter()
        .filter(|o| matches!(o, Out::Resolution(_)))
        .count();
    assert_eq!(resolutions, MAX_TARGETS);
    assert!(
        !a.behind.load(std::sync::atomic::Ordering::Relaxed),
        "the snapshot caught it up"
    );
}

#[test]
fn one_change_is_rendered_once_whatever_the_number_of_streams() {
    let (hub, index) = hub(&cluster());
    let mut watches: Vec<Watch> = (0..50)
        .map(|_| open(&hub, "node-x", &["10.96.0.10"]).0)
        .collect();
    let yaml = cluster().replace(&slice(&["b-0", "b-1"]), &slice(&["b-0"]));
    index.replace(ClusterIndex::from_objects("cluster.local", objects(&yaml)).unwrap());
    let changes = index.take_changes();
    assert_eq!(changes.services.len(), 1, "{changes:?}");
    assert!(changes.pods.is_empty() && !changes.all);
    let mut core = hub.lock();
    let Core { catalog, streams } = &mut *core;
    let changed = catalog.update(&index.read(), &changes);
    assert_eq!(changed.len(), 1, "one Service rendered: {changed:?}");
    streams.apply(catalog, &changed);
    drop(core);
    let first = drain(&mut watches[0]);
    let Out::Endpoints(d) = &first[0] else {
        panic!("{first:?}")
    };
    assert_eq!(d.removed, ["10.2.0.2"]);
    for w in &mut watches[1..] {
        let got = drain(w);
        let Out::Endpoints(e) = &got[0] else {
            panic!("{got:?}")
        };
        assert!(Arc::ptr_eq(d, e), "every stream shares the one rendering");
    }
}

#[test]
fn updates_are_bounded_and_never_hold_a_resource_twice() {
    let w = |n: &str| {
        Out::Workload(Arc::new(pb::Workload {
            namespace: "shop".into(),
            name: n.into(),
            ..Default::default()
        }))
    };
    // Sent then removed: two updates, in that order (removals apply first within one).
    let u = updates(
        vec![w("a"), w("b"), Out::RemoveWorkload("shop/a".into())],
        false,
        256,
        1 << 20,
    );
    assert_eq!(u.len(), 2);
    assert_eq!(u[0].workloads.len(), 2);
    assert_eq!(u[1].removed_workloads, ["shop/a"]);
    assert!(u.iter().all(|u| !u.more && !u.snapshot));
    // A snapshot in chunks: the first marked, all but the last `more`.
    let pieces: Vec<Out> = (0..600).map(|i| w(&format!("p{i}"))).collect();
    let u = updates(pieces, true, 256, 1 << 20);
    assert_eq!(
        u.iter().map(|u| u.workloads.len()).collect::<Vec<_>>(),
        [256, 256, 88]
    );
    assert!(u[0].snapshot && !u[1].snapshot);
    assert_eq!(
        u.iter().map(|u| u.more).collect::<Vec<_>>(),
        [true, true, false]
    );
    // An empty snapshot is one update.
    let u = updates(Vec::new(), true, 256, 1 << 20);
    assert_eq!(u.len(), 1);
    assert!(u[0].snapshot && !u[0].more);
}

#[tokio::test]
async fn nothing_is_streamed_until_the_backend_has_loaded_the_cluster() {
    let index = SharedIndex::new(ClusterIndex::new("cluster.local"));
    let hub = Hub::new(DiscoveryMetrics::default());
    let ready = crate::ready::Readiness::default();
    ready.pending("initial list of Namespace");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(hub.clone().run(index.clone(), ready.clone(), async {
        let _ = stopped.await;
    }));
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let stream = stream::Stream {
        hub: hub.clone(),
        node: "node-a".into(),
        metrics: DiscoveryMetrics::default(),
        tx,
    };
    let first = pb::WatchRequest {
        node: "node-a".into(),
        by_need: true,
        ..Default::default()
    };
    let serving = tokio::spawn(async move { stream.serve(first, tokio_stream::pending()).await });
    // Pods listed, Namespaces not yet: a proxy would see its pods as not meshed.
    for o in objects(&pod("a-0", "node-a", "10.1.0.1")) {
        index.apply(o).unwrap();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        rx.try_recv().is_err(),
        "a snapshot of a half-listed cluster was sent"
    );
    ready.done("initial list of Namespace");
    let first = next(&mut rx).await;
    assert!(first.snapshot && first.workloads.len() == 1, "{first:?}");
    // Later changes arrive as deltas.
    for o in objects(&pod("a-1", "node-a", "10.1.0.2")) {
        index.apply(o).unwrap();
    }
    let next = next(&mut rx).await;
    assert!(!next.snapshot && next.workloads.len() == 1, "{next:?}");
    let _ = stop.send(());
    let _ = run.await;
    serving.abort();
}

async fn next(
    rx: &mut tokio::sync::mpsc::Receiver<Result<pb::Update, tonic::Status>>,
) -> pb::Update {
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("stream ended"))
        .unwrap_or_else(|e| panic!("{e}"))
}
