use super::*;
use crate::index::{ClusterIndex, SharedIndex};
use prometheus_client::registry::Registry;

fn pod(name: &str, annotation: &str) -> KubeObject {
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: shop, annotations: {{ambit.dev/mesh: {annotation}}}}}\nspec: {{nodeName: node-a, containers: []}}\n"
    );
    let mut skipped = 0;
    crate::local::parse_file(std::path::Path::new("t.yaml"), &yaml, &mut skipped)
        .unwrap_or_else(|e| panic!("{e}"))
        .remove(0)
        .object
}

type Ev = Result<Event<KubeObject>, String>;

fn context() -> (WatchContext, Registry) {
    let mut registry = Registry::default();
    let cx = WatchContext {
        index: SharedIndex::new(ClusterIndex::new("cluster.local")),
        metrics: KubeMetrics::register(&mut registry),
        ready: Readiness::default(),
    };
    cx.ready.pending(pending_label(Kind::Pod));
    (cx, registry)
}

fn metrics(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).unwrap_or_else(|e| panic!("{e}"));
    out
}

async fn run(cx: &WatchContext, events: Vec<Ev>) {
    follow(futures::stream::iter(events), Kind::Pod, cx).await;
}

#[tokio::test]
async fn ready_only_once_listed_and_a_relist_drops_what_was_deleted_meanwhile() {
    let (cx, registry) = context();
    // A list that fails half way (page 2) is not applied and does not make us ready.
    run(
        &cx,
        vec![
            Ok(Event::Init),
            Ok(Event::InitApply(pod("a", "enabled"))),
            Err("page 2: connection reset".into()),
        ],
    )
    .await;
    assert_eq!(cx.index.read().count(Kind::Pod), 0);
    assert!(cx.ready.check().is_err());
    // The retry lists in full; a bad object is skipped and counted, the rest applies.
    run(
        &cx,
        vec![
            Ok(Event::Init),
            Ok(Event::InitApply(pod("a", "enabled"))),
            Ok(Event::InitApply(pod("b", "enabled"))),
            Ok(Event::InitApply(pod("bad", "maybe"))),
            Ok(Event::InitDone),
            Ok(Event::Apply(pod("c", "enabled"))),
        ],
    )
    .await;
    assert_eq!(cx.index.read().count(Kind::Pod), 3);
    assert!(cx.ready.check().is_ok());
    let m = metrics(&registry);
    assert!(
        m.contains("kube_objects_invalid_total{kind=\"Pod\"} 1"),
        "{m}"
    );
    assert!(m.contains("kube_watch_errors_total{kind=\"Pod\"} 1"), "{m}");
    assert!(
        !m.contains("kube_watch_restarts_total{kind=\"Pod\"}"),
        "{m}"
    );
}

#[tokio::test]
async fn a_relist_replaces_the_kind_and_counts_a_restart() {
    let (cx, registry) = context();
    run(
        &cx,
        vec![
            Ok(Event::Init),
            Ok(Event::InitApply(pod("a", "enabled"))),
            Ok(Event::InitApply(pod("b", "enabled"))),
            Ok(Event::InitDone),
            // 410 Gone: kube-rs re-lists; b was deleted while the watch was down, and a's
            // new version does not convert (it keeps its last good one).
            Err("410 Gone".into()),
            Ok(Event::Init),
            Ok(Event::InitApply(pod("a", "maybe"))),
            Ok(Event::InitDone),
            Ok(Event::Delete(pod("nothing-there", "enabled"))),
        ],
    )
    .await;
    let idx = cx.index.read();
    assert_eq!(idx.count(Kind::Pod), 1);
    assert!(idx.workload_by_name("shop", "a").is_some_and(|w| w.meshed));
    drop(idx);
    let m = metrics(&registry);
    assert!(
        m.contains("kube_watch_restarts_total{kind=\"Pod\"} 1"),
        "{m}"
    );
    assert!(m.contains("kube_objects{kind=\"Pod\"} 1"), "{m}");
}

/// A 404 from the API server: the kind's CRD is not installed.
struct NotServed;

impl std::fmt::Display for NotServed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("404 Not Found")
    }
}

impl WatchError for NotServed {
    fn not_served(&self) -> bool {
        true
    }
}

fn route(name: &str) -> KubeObject {
    let yaml = format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: shop}}\nspec: {{parentRefs: [{{group: core, kind: Service, name: web}}]}}\n"
    );
    let mut skipped = 0;
    crate::local::parse_file(std::path::Path::new("t.yaml"), &yaml, &mut skipped)
        .unwrap_or_else(|e| panic!("{e}"))
        .remove(0)
        .object
}

#[tokio::test]
async fn a_route_kind_without_its_crd_is_empty_and_ready_until_the_crd_comes() {
    let (cx, registry) = context();
    let label = pending_label(Kind::HttpRoute);
    cx.ready.pending(label.clone());
    cx.index.update(|i| drop(i.apply(route("stale"))));
    let events: Vec<Result<Event<KubeObject>, NotServed>> = vec![Err(NotServed), Err(NotServed)];
    follow(futures::stream::iter(events), Kind::HttpRoute, &cx).await;
    assert_eq!(
        cx.index.read().count(Kind::HttpRoute),
        0,
        "no CRD: no routes"
    );
    assert!(
        cx.ready.check().err().is_none_or(|p| !p.contains(&label)),
        "a missing optional CRD does not hold /ready"
    );
    assert!(metrics(&registry).contains("kube_watch_errors_total{kind=\"HTTPRoute\"} 2"));
    // The CRD is installed: the retried list brings the routes.
    let events: Vec<Result<Event<KubeObject>, NotServed>> = vec![
        Ok(Event::Init),
        Ok(Event::InitApply(route("web"))),
        Ok(Event::InitDone),
    ];
    follow(futures::stream::iter(events), Kind::HttpRoute, &cx).await;
    assert_eq!(cx.index.read().count(Kind::HttpRoute), 1);
    // A built-in kind's 404 is an error like any other: /ready keeps waiting.
    let events: Vec<Result<Event<KubeObject>, NotServed>> = vec![Err(NotServed)];
    follow(futures::stream::iter(events), Kind::Pod, &cx).await;
    assert!(cx.ready.check().is_err());
}
