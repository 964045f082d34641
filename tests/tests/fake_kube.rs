//! The fake Kubernetes API server, driven by the real kube-rs client over HTTPS: paged
//! lists, gets, watchers and reflectors through changes, bookmarks, compaction and
//! restarts, TokenReviews, and callers without credentials.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use ambit_e2e::kube::{FakeKube, ResourceType, Settings, TokenIdentity};
use futures::StreamExt;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{ListParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Api, ResourceExt};
use serde_json::json;
use std::time::Duration;
use tokio::sync::mpsc;

fn namespace(name: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
}

fn pod(ns: &str, name: &str, node: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": "web"}},
        "spec": {
            "nodeName": node,
            "serviceAccountName": "web",
            "containers": [{"name": "app", "image": "web:1"}],
        },
    })
}

/// A fake with namespace `demo`, ServiceAccount `demo/web` and `pods` pods `p0`..,
/// alternating between nodes `n1` and `n2`.
async fn cluster(pods: usize, settings: Settings) -> FakeKube {
    let fake = FakeKube::start_with(settings).await;
    fake.apply(namespace("demo"));
    fake.apply(json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "web", "namespace": "demo"},
    }));
    for i in 0..pods {
        fake.apply(pod(
            "demo",
            &format!("p{i}"),
            if i % 2 == 0 { "n1" } else { "n2" },
        ));
    }
    fake
}

fn api_status(err: kube::Error) -> (u16, String) {
    match err {
        kube::Error::Api(s) => (s.code, s.reason),
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn list_pages_of_two_over_five_pods_are_one_consistent_snapshot() {
    let fake = cluster(5, Settings::default()).await;
    let pods: Api<Pod> = Api::all(fake.client().await);

    let first = pods.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(first.items.len(), 2);
    assert_eq!(first.metadata.remaining_item_count, Some(3));
    let rv = first.metadata.resource_version.clone().unwrap();
    // A write between pages is not in the list: every page is at the first one's version.
    fake.apply(pod("demo", "p5", "n1"));

    let mut names: Vec<String> = first.items.iter().map(|p| p.name_any()).collect();
    let mut token = first.metadata.continue_.clone();
    let mut pages = 1;
    while let Some(t) = token.filter(|t| !t.is_empty()) {
        let page = pods
            .list(&ListParams::default().limit(2).continue_token(&t))
            .await
            .unwrap();
        assert_eq!(page.metadata.resource_version.as_deref(), Some(rv.as_str()));
        names.extend(page.items.iter().map(|p| p.name_any()));
        token = page.metadata.continue_.clone();
        pages += 1;
    }
    assert_eq!(pages, 3);
    assert_eq!(names, ["p0", "p1", "p2", "p3", "p4"]);
    assert_eq!(fake.requests("list", "pods"), 3);
    let log = fake.request_log();
    assert!(
        log[0].uri.starts_with("/api/v1/pods?&limit=2"),
        "{}",
        log[0].uri
    );
    assert!(log[1].uri.contains("continue="), "{}", log[1].uri);

    // A fresh list sees the sixth pod.
    assert_eq!(
        pods.list(&ListParams::default()).await.unwrap().items.len(),
        6
    );
}

#[tokio::test]
async fn continue_token_of_a_compacted_version_answers_410_expired() {
    let fake = cluster(5, Settings::default()).await;
    let pods: Api<Pod> = Api::namespaced(fake.client().await, "demo");
    let first = pods.list(&ListParams::default().limit(2)).await.unwrap();
    fake.compact();
    let token = first.metadata.continue_.unwrap();
    let err = pods
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap_err();
    assert_eq!(api_status(err), (410, "Expired".to_string()));
}

#[tokio::test]
async fn get_returns_the_stored_pod_and_404_for_a_missing_one() {
    let fake = cluster(2, Settings::default()).await;
    let pods: Api<Pod> = Api::namespaced(fake.client().await, "demo");
    let p1 = pods.get("p1").await.unwrap();
    let stored: Pod = fake.get_object("demo", "p1").unwrap();
    assert_eq!(p1.uid(), stored.uid());
    assert!(p1.uid().is_some());
    assert_eq!(p1.spec.unwrap().node_name.as_deref(), Some("n2"));
    let err = pods.get("nope").await.unwrap_err();
    assert_eq!(api_status(err), (404, "NotFound".to_string()));
    assert_eq!(fake.requests("get", "pods"), 2);
    // Cluster-scoped kinds too.
    let ns: Api<Namespace> = Api::all(fake.client().await);
    assert_eq!(ns.get("demo").await.unwrap().name_any(), "demo");
}

#[tokio::test]
async fn label_and_field_selectors_select_as_the_api_server_does() {
    let fake = cluster(5, Settings::default()).await;
    let mut other = pod("demo", "db", "n1");
    other["metadata"]["labels"] = json!({"app": "db"});
    fake.apply(other);
    let pods: Api<Pod> = Api::all(fake.client().await);
    let names = |l: kube::core::ObjectList<Pod>| -> Vec<String> {
        l.items.iter().map(|p| p.name_any()).collect()
    };
    let on_n1 = pods
        .list(&ListParams::default().fields("spec.nodeName=n1"))
        .await
        .unwrap();
    assert_eq!(names(on_n1), ["db", "p0", "p2", "p4"]);
    let web_on_n1 = pods
        .list(
            &ListParams::default()
                .fields("spec.nodeName=n1")
                .labels("app=web"),
        )
        .await
        .unwrap();
    assert_eq!(names(web_on_n1), ["p0", "p2", "p4"]);
    let not_web = pods
        .list(&ListParams::default().labels("app notin (web)"))
        .await
        .unwrap();
    assert_eq!(names(not_web), ["db"]);
    let by_name = pods
        .list(&ListParams::default().fields("metadata.name=p3"))
        .await
        .unwrap();
    assert_eq!(names(by_name), ["p3"]);
    let err = pods
        .list(&ListParams::default().fields("spec.nope=x"))
        .await
        .unwrap_err();
    assert_eq!(api_status(err).0, 400);
}

/// The events a watcher stream yields, as short strings, on a channel.
fn spawn_events<S>(stream: S) -> mpsc::UnboundedReceiver<String>
where
    S: futures::Stream<Item = Result<watcher::Event<Pod>, watcher::Error>> + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            let text = match event {
                Ok(watcher::Event::Init) => "Init".to_string(),
                Ok(watcher::Event::InitApply(p)) => format!("InitApply {}", p.name_any()),
                Ok(watcher::Event::InitDone) => "InitDone".to_string(),
                Ok(watcher::Event::Apply(p)) => format!("Apply {}", p.name_any()),
                Ok(watcher::Event::Delete(p)) => format!("Delete {}", p.name_any()),
                Err(e) => format!("Error {e}"),
            };
            if tx.send(text).is_err() {
                return;
            }
        }
    });
    rx
}

/// The next event that is not an error (errors are what a watcher recovers from).
async fn next_event(rx: &mut mpsc::UnboundedReceiver<String>) -> String {
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("no watcher event within 10 s")
            .expect("the watcher ended");
        if !event.starts_with("Error") {
            return event;
        }
    }
}

async fn expect_init(rx: &mut mpsc::UnboundedReceiver<String>, names: &[&str]) {
    assert_eq!(next_event(rx).await, "Init");
    for name in names {
        assert_eq!(next_event(rx).await, format!("InitApply {name}"));
    }
    assert_eq!(next_event(rx).await, "InitDone");
}

#[tokio::test]
async fn watcher_lists_then_sees_added_modified_and_deleted() {
    let fake = cluster(2, Settings::default()).await;
    let pods: Api<Pod> = Api::all(fake.client().await);
    let mut rx = spawn_events(watcher(pods, watcher::Config::default()));
    expect_init(&mut rx, &["p0", "p1"]).await;
    fake.wait_for_watches(1).await;

    fake.apply(pod("demo", "p2", "n1"));
    assert_eq!(next_event(&mut rx).await, "Apply p2");
    let mut changed = pod("demo", "p2", "n1");
    changed["metadata"]["labels"]["version"] = json!("2");
    fake.apply(changed.clone());
    assert_eq!(next_event(&mut rx).await, "Apply p2");
    // An apply that changes nothing is no write: no event.
    fake.apply(changed);
    assert!(fake.delete("Pod", "demo", "p0"));
    assert_eq!(next_event(&mut rx).await, "Delete p0");

    let log = fake.request_log();
    let list = log.iter().find(|r| r.verb == "list").unwrap();
    assert_eq!(list.uri, "/api/v1/pods?&limit=500");
    let watch = log.iter().find(|r| r.verb == "watch").unwrap();
    assert!(
        watch.uri.starts_with(
            "/api/v1/pods?&watch=true&timeoutSeconds=290&allowWatchBookmarks=true&resourceVersion="
        ),
        "{}",
        watch.uri
    );
}

#[tokio::test]
async fn watch_sends_bookmarks_with_the_newest_resource_version() {
    let settings = Settings {
        bookmark_interval: Duration::from_millis(100),
        ..Settings::default()
    };
    let fake = cluster(1, settings).await;
    let pods: Api<Pod> = Api::all(fake.client().await);
    let rv = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version;
    // A write to another kind moves the version a pods bookmark carries.
    fake.apply(namespace("other"));
    let stream = pods
        .watch(&WatchParams::default(), &rv.unwrap())
        .await
        .unwrap();
    let mut stream = std::pin::pin!(stream);
    let event = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    match event {
        WatchEvent::Bookmark(b) => {
            assert_eq!(
                b.metadata.resource_version,
                fake.resource_version().to_string()
            );
            assert_eq!(b.types.kind, "Pod");
        }
        other => panic!("expected a bookmark, got {other:?}"),
    }
    assert!(fake.bookmarks_sent() >= 1);
}

#[tokio::test]
async fn watch_from_a_compacted_version_gets_an_error_event_with_410() {
    let fake = cluster(1, Settings::default()).await;
    let pods: Api<Pod> = Api::all(fake.client().await);
    let rv = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version;
    fake.apply(pod("demo", "p1", "n1"));
    fake.compact();
    let stream = pods
        .watch(&WatchParams::default(), &rv.unwrap())
        .await
        .unwrap();
    let events: Vec<_> = stream.collect().await;
    assert_eq!(events.len(), 1, "one ERROR event, then the end");
    match &events[0] {
        Ok(WatchEvent::Error(e)) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected an ERROR event, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_outage_and_compaction_the_reflector_relists_and_drops_a_deleted_pod() {
    let fake = cluster(3, Settings::default()).await;
    let pods: Api<Pod> = Api::all(fake.client().await);
    let (reader, writer) = reflector::store();
    let stream = reflector(writer, watcher(pods, watcher::Config::default())).default_backoff();
    let mut rx = spawn_events(stream);
    expect_init(&mut rx, &["p0", "p1", "p2"]).await;
    fake.wait_for_watches(1).await;
    assert_eq!(reader.state().len(), 3);

    fake.go_down();
    assert!(fake.delete("Pod", "demo", "p1"));
    fake.compact();
    // The watcher's reconnections fail meanwhile (and it backs off).
    let refused = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await;
    assert!(
        refused
            .as_ref()
            .unwrap()
            .as_ref()
            .unwrap()
            .starts_with("Error"),
        "{refused:?}"
    );
    assert_eq!(fake.open_watches(), 0);
    fake.come_up();

    // The watch resumes from its last version, gets 410, and the watcher lists again.
    expect_init(&mut rx, &["p0", "p2"]).await;
    let mut names: Vec<String> = reader.state().iter().map(|p| p.name_any()).collect();
    names.sort();
    assert_eq!(names, ["p0", "p2"]);
    assert_eq!(fake.requests("list", "pods"), 2);
    assert!(fake.requests("watch", "pods") >= 2);

    // restart(): same story without an outage.
    fake.wait_for_watches(1).await;
    fake.restart();
    expect_init(&mut rx, &["p0", "p2"]).await;
    assert_eq!(fake.requests("list", "pods"), 3);
}

#[tokio::test]
async fn a_watch_that_times_out_resumes_from_its_version_without_a_list() {
    let settings = Settings {
        bookmark_interval: Duration::from_millis(200),
        ..Settings::default()
    };
    let fake = cluster(1, settings).await;
    let pods: Api<Pod> = Api::all(fake.client().await);
    let mut rx = spawn_events(watcher(pods, watcher::Config::default().timeout(1)));
    expect_init(&mut rx, &["p0"]).await;
    for _ in 0..300 {
        if fake.requests("watch", "pods") >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(fake.requests("watch", "pods") >= 3);
    fake.wait_for_watches(1).await;
    fake.apply(pod("demo", "p1", "n1"));
    assert_eq!(next_event(&mut rx).await, "Apply p1");
    assert!(fake.delete_object::<Pod>("demo", "p1"));
    assert_eq!(next_event(&mut rx).await, "Delete p1");
    assert_eq!(fake.requests("list", "pods"), 1);
    let log = fake.request_log();
    assert!(log.iter().any(|r| r.uri.contains("timeoutSeconds=1&")));
}

#[tokio::test]
async fn a_streaming_list_watcher_gets_the_initial_events_and_their_end() {
    let fake = cluster(2, Settings::default()).await;
    let pods: Api<Pod> = Api::all(fake.client().await);
    let mut rx = spawn_events(watcher(pods, watcher::Config::default().streaming_lists()));
    expect_init(&mut rx, &["p0", "p1"]).await;
    fake.apply(pod("demo", "p2", "n1"));
    assert_eq!(next_event(&mut rx).await, "Apply p2");
    assert_eq!(fake.requests("list", "pods"), 0);
}

#[tokio::test]
async fn a_watch_with_a_selector_sees_an_object_leave_it_as_deleted() {
    let fake = cluster(2, Settings::default()).await;
    let pods: Api<Pod> = Api::all(fake.client().await);
    let config = watcher::Config::default().fields("spec.nodeName=n1");
    let mut rx = spawn_events(watcher(pods, config));
    expect_init(&mut rx, &["p0"]).await;
    fake.wait_for_watches(1).await;
    fake.apply(pod("demo", "p0", "n2"));
    assert_eq!(next_event(&mut rx).await, "Delete p0");
    fake.apply(pod("demo", "p1", "n1"));
    assert_eq!(next_event(&mut rx).await, "Apply p1");
}

fn review(token: &str, audiences: &[&str]) -> TokenReview {
    TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.into()),
            audiences: Some(audiences.iter().map(|a| a.to_string()).collect()),
        },
        ..TokenReview::default()
    }
}

#[tokio::test]
async fn token_reviews_accept_refuse_and_check_audiences() {
    let fake = cluster(2, Settings::default()).await;
    let identity = fake.add_pod_token("good", "demo", "p1", &["ambit"]);
    assert_eq!(identity.node.as_deref(), Some("n2"));
    let reviews: Api<TokenReview> = Api::all(fake.client().await);
    let pp = PostParams::default();

    let ok = reviews
        .create(&pp, &review("good", &["ambit"]))
        .await
        .unwrap();
    let status = ok.status.unwrap();
    assert_eq!(status.authenticated, Some(true));
    assert_eq!(status.audiences, Some(vec!["ambit".to_string()]));
    let user = status.user.unwrap();
    assert_eq!(
        user.username.as_deref(),
        Some("system:serviceaccount:demo:web")
    );
    let extra = user.extra.unwrap();
    let p1: Pod = fake.get_object("demo", "p1").unwrap();
    assert_eq!(extra[ambit_e2e::kube::POD_NAME_EXTRA], ["p1"]);
    assert_eq!(extra[ambit_e2e::kube::POD_UID_EXTRA], [p1.uid().unwrap()]);
    assert_eq!(extra[ambit_e2e::kube::NODE_NAME_EXTRA], ["n2"]);

    let unknown = reviews
        .create(&pp, &review("nope", &["ambit"]))
        .await
        .unwrap();
    assert_ne!(unknown.status.unwrap().authenticated, Some(true));

    let wrong_audience = reviews
        .create(&pp, &review("good", &["other"]))
        .await
        .unwrap();
    let status = wrong_audience.status.unwrap();
    assert_ne!(status.authenticated, Some(true));
    assert!(status.error.unwrap().contains("audiences"));

    // A token bound to a pod stops working with the pod.
    fake.delete("Pod", "demo", "p1");
    let gone = reviews
        .create(&pp, &review("good", &["ambit"]))
        .await
        .unwrap();
    assert_ne!(gone.status.unwrap().authenticated, Some(true));

    // A plain ServiceAccount token, reviewed without audiences: the API server's own.
    fake.add_token(
        "api",
        TokenIdentity::service_account("demo", "web", &[ambit_e2e::kube::API_AUDIENCE]),
    );
    let api = reviews.create(&pp, &review("api", &[])).await.unwrap();
    assert_eq!(api.status.unwrap().authenticated, Some(true));

    assert_eq!(fake.token_reviews(), 5);
    assert_eq!(fake.requests("create", "tokenreviews"), 5);
}

#[tokio::test]
async fn requests_without_the_control_plane_token_get_401() {
    let fake = cluster(1, Settings::default()).await;
    for token in [Some("wrong"), None] {
        let file: kube::config::Kubeconfig =
            serde_json::from_value(fake.kubeconfig_value()).unwrap();
        let mut config =
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .unwrap();
        config.auth_info.token = token.map(|t| t.to_string().into());
        let pods: Api<Pod> = Api::all(kube::Client::try_from(config).unwrap());
        let err = pods.list(&ListParams::default()).await.unwrap_err();
        assert_eq!(api_status(err), (401, "Unauthorized".to_string()));
    }
    assert!(fake.request_log().iter().all(|r| r.status == 401));
}

#[tokio::test]
async fn custom_kinds_register_in_one_line_and_list_with_their_kind() {
    let fake = cluster(0, Settings::default()).await;
    fake.register(ResourceType::new(
        "policy.ambit.dev",
        "v1alpha1",
        "Server",
        "servers",
        true,
    ));
    fake.apply(json!({
        "apiVersion": "policy.ambit.dev/v1alpha1", "kind": "Server",
        "metadata": {"name": "web", "namespace": "demo"},
        "spec": {"port": 8080},
    }));
    let resource = kube::discovery::ApiResource {
        group: "policy.ambit.dev".into(),
        version: "v1alpha1".into(),
        api_version: "policy.ambit.dev/v1alpha1".into(),
        kind: "Server".into(),
        plural: "servers".into(),
    };
    let servers: Api<kube::api::DynamicObject> = Api::all_with(fake.client().await, &resource);
    let list = servers.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].data["spec"]["port"], 8080);
    // Deleting the namespace takes its objects with it.
    fake.delete("Namespace", "", "demo");
    assert!(servers
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .is_empty());
}
