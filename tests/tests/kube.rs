//! The Kubernetes backend end to end: the real control plane on `--backend kube`, its
//! real kube-rs client watching the fake API server (`ambit_e2e::kube`) over HTTPS, node
//! proxies authenticating with projected-token files checked by TokenReview, and pods
//! wired by the real CNI plugins chained with `ambit-cni`. Run as root.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use ambit_e2e::cni::{Cluster, CniPod};
use ambit_e2e::kube::{FakeKube, ResourceType, Settings, TokenIdentity};
use ambit_e2e::policy::{service_rules, watch_request};
use ambit_e2e::{
    csr, http_get, http_server, metric_sum, node_token, raw_certify, ControlPlane, NodeProxy,
};
use ambit_proxy::netns::Netns;
use ambit_proxy::proxy::Redirect;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const CNI: &str = env!("CARGO_BIN_EXE_ambit-cni-e2e");
const WEB_ID: &str = "spiffe://cluster.local/ns/shop/sa/web";
const CLI_ID: &str = "spiffe://cluster.local/ns/shop/sa/cli";

fn namespace(name: &str, meshed: bool) -> Value {
    let annotations = if meshed {
        json!({"ambit.dev/mesh": "enabled"})
    } else {
        json!({})
    };
    json!({"apiVersion": "v1", "kind": "Namespace",
           "metadata": {"name": name, "annotations": annotations}})
}

fn service_account(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ServiceAccount",
           "metadata": {"name": name, "namespace": ns}})
}

/// A well-formed pod UID of this run for `name` (enrolment matches it in cgroup paths).
fn uid(name: &str) -> String {
    let n = name
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    format!(
        "{:08x}-0000-4000-8000-{:012x}",
        std::process::id(),
        n & 0xffff_ffff_ffff
    )
}

/// A pod on `node` running as `sa`; `ip` once the kubelet has reported it.
fn pod(ns: &str, name: &str, node: &str, sa: &str, ip: Option<&str>) -> Value {
    let status = match ip {
        Some(ip) => json!({"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}),
        None => json!({"phase": "Pending"}),
    };
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": ns, "uid": uid(&format!("{ns}/{name}"))},
           "spec": {"nodeName": node, "serviceAccountName": sa,
                    "containers": [{"name": "app", "image": "app"}]},
           "status": status})
}

/// The control plane's view of the cluster and the node proxies, as a Helm install would
/// leave it: the `ambit` namespace with the proxies' ServiceAccount and one proxy pod per
/// node, whose projected token the proxy reads from its token file.
fn install(fake: &FakeKube, nodes: &[&str]) {
    fake.apply(namespace("ambit", false));
    fake.apply(service_account("ambit", "ambit-proxy"));
    for node in nodes {
        let name = format!("ambit-proxy-{node}");
        fake.apply(pod("ambit", &name, node, "ambit-proxy", Some("192.0.2.1")));
        fake.add_pod_token(&node_token(node), "ambit", &name, &["ambit"]);
    }
}

fn app(fake: &FakeKube) {
    fake.apply(namespace("shop", true));
    fake.apply(namespace("legacy", false));
    for sa in ["web", "cli", "batch", "late"] {
        fake.apply(service_account("shop", sa));
    }
    fake.apply(pod("shop", "cli", "node-a", "cli", Some("10.78.1.10")));
    fake.apply(pod("shop", "web", "node-b", "web", None));
    fake.apply(pod("shop", "batch", "node-a", "batch", Some("10.78.1.30")));
    fake.apply(pod(
        "legacy",
        "old",
        "node-a",
        "default",
        Some("10.78.1.20"),
    ));
    fake.apply(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
                 "ports": [{"name": "http", "port": 80}]}}));
    fake.apply(
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-1", "namespace": "shop",
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080}],
        "endpoints": [{"addresses": ["10.78.2.10"],
                       "targetRef": {"kind": "Pod", "name": "web", "namespace": "shop"}}]}),
    );
}

async fn kube_control_plane(fake: &FakeKube, extra: &[&str]) -> (ControlPlane, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    fake.kubeconfig(&kubeconfig);
    (ControlPlane::start_kube(&kubeconfig, extra).await, dir)
}

fn metric(metrics: &str, name_and_labels: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name_and_labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Waits until `f` holds, up to 10 s.
async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..200 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for: {what}");
}

async fn certify_code(cp: &ControlPlane, node: &str, ns: &str, sa: &str) -> tonic::Code {
    match raw_certify(cp, Some(&node_token(node)), ns, sa, csr()).await {
        Ok(_) => tonic::Code::Ok,
        Err(s) => s.code(),
    }
}

/// Curls `url` from `pod` until it answers through the mesh (client proxy `a` counts an
/// mTLS response from web).
async fn curl_through_mesh(c: &Arc<Cluster>, a: &NodeProxy, pod: &CniPod, url: &str) {
    let mesh = |m: &str| {
        metric_sum(
            m,
            "response_total",
            &[
                &format!("server_id=\"{WEB_ID}\""),
                "tls=\"true\"",
                "status_code=\"200\"",
            ],
        )
    };
    let mut got = Err(String::new());
    for _ in 0..100 {
        let before = mesh(&a.metrics().await);
        got = c.curl_async(pod, url).await;
        if matches!(&got, Ok((200, _))) && mesh(&a.metrics().await) > before {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{url}: never through the mesh: {got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_pods_meshed_running_ones_by_annotation_and_watches_survive_an_api_restart() {
    ambit_e2e::init_test_logging();
    let fake = FakeKube::start().await;
    install(&fake, &["node-a", "node-b"]);
    app(&fake);
    let (cp, _kubeconfig) = kube_control_plane(&fake, &[]).await;
    let m = cp.metrics().await;
    assert_eq!(metric(&m, "kube_objects{kind=\"Pod\"}"), 6, "{m}");

    let c = Arc::new(Cluster::new(
        "kube-e2e",
        &["node-a", "node-b"],
        Path::new(CNI),
    ));
    let a = NodeProxy::start_config(c.node("node-a").proxy_config(&cp, Redirect::Ebpf)).await;
    let b = NodeProxy::start_config(c.node("node-b").proxy_config(&cp, Redirect::Ebpf)).await;
    let web = c.add("node-b", "shop", "web", 10).await;
    let cli = c.add("node-a", "shop", "cli", 10).await;
    // The kubelet reports web's address.
    fake.apply(pod("shop", "web", "node-b", "web", Some("10.78.2.10")));
    let web_ns = Netns::open(Path::new(&web.path())).unwrap();
    http_server(&web_ns, 8080, "hello from web").await;

    // Certificates came from TokenReview-authenticated proxies; traffic is mTLS.
    curl_through_mesh(&c, &a, &cli, "http://10.96.0.10/").await;
    let mb = b.metrics().await;
    let inbound = [
        "direction=\"inbound\"",
        "pod=\"web\"",
        &format!("client_id=\"{CLI_ID}\""),
        "tls=\"true\"",
    ];
    assert!(metric_sum(&mb, "request_total", &inbound) >= 1, "{mb}");

    // A pod that runs before its namespace is annotated is meshed when it is, without a
    // restart or a CNI ADD (the proxy finds its netns from /proc), and un-meshed when the
    // annotation goes.
    let old = c.add("node-a", "legacy", "old", 20).await;
    let _container = c.start_container(&old, &uid("legacy/old"));
    assert!(!c.listeners(&old).contains(":4140"));
    fake.apply(namespace("legacy", true));
    eventually("old enrolled", || async {
        a.metrics()
            .await
            .contains("pod_enrolments_total{result=\"enrolled\"} 1")
    })
    .await;
    curl_through_mesh(&c, &a, &old, "http://10.96.0.10/").await;
    let mb = b.metrics().await;
    let from_old = [
        "pod=\"web\"",
        "client_id=\"spiffe://cluster.local/ns/legacy/sa/default\"",
        "tls=\"true\"",
    ];
    assert!(metric_sum(&mb, "request_total", &from_old) >= 1, "{mb}");
    fake.apply(namespace("legacy", false));
    eventually("old un-meshed", || async {
        a.metrics().await.contains("pod_enrolment_releases_total 1")
            && !c.listeners(&old).contains(":4140")
    })
    .await;

    // Renewals do not hammer the API server: a recent review is reused.
    assert_eq!(
        certify_code(&cp, "node-a", "shop", "batch").await,
        tonic::Code::Ok
    );
    let reviews = fake.token_reviews();
    for _ in 0..5 {
        assert_eq!(
            certify_code(&cp, "node-a", "shop", "batch").await,
            tonic::Code::Ok
        );
    }
    assert_eq!(fake.token_reviews(), reviews, "answers are cached");
    assert!(
        metric(
            &cp.metrics().await,
            "kube_token_reviews_total{result=\"cached\"}"
        ) >= 5
    );

    // A deleted pod is dropped: its node may no longer obtain its identity.
    fake.delete("Pod", "shop", "batch");
    eventually("batch's identity revoked", || async {
        certify_code(&cp, "node-a", "shop", "batch").await == tonic::Code::PermissionDenied
    })
    .await;

    // The API server goes away; meanwhile a pod is created and one deleted, and the
    // history is compacted, so the watches' resourceVersions are 410 Gone on return.
    let lists_before = fake.requests("list", "pods");
    fake.go_down();
    fake.apply(pod("shop", "late", "node-a", "late", Some("10.78.1.40")));
    fake.delete("Pod", "shop", "cli");
    fake.compact();
    tokio::time::sleep(Duration::from_millis(500)).await;
    fake.come_up();
    eventually("a re-list after 410 Gone", || async {
        metric(
            &cp.metrics().await,
            "kube_watch_restarts_total{kind=\"Pod\"}",
        ) >= 1
    })
    .await;
    assert!(fake.requests("list", "pods") > lists_before);
    eventually("the new pod's identity allowed", || async {
        certify_code(&cp, "node-a", "shop", "late").await == tonic::Code::Ok
    })
    .await;
    // cli was deleted while the watch was down: the re-list drops it.
    assert_eq!(
        certify_code(&cp, "node-a", "shop", "cli").await,
        tonic::Code::PermissionDenied
    );
    let m = cp.metrics().await;
    assert_eq!(metric(&m, "kube_objects{kind=\"Pod\"}"), 5, "{m}");

    // Meshed traffic still flows once cli is back in the API.
    fake.apply(pod("shop", "cli", "node-a", "cli", Some("10.78.1.10")));
    curl_through_mesh(&c, &a, &cli, "http://10.78.2.10:8080/").await;

    a.stop().await;
    b.stop().await;
    cp.stop().await;
}

#[tokio::test]
async fn token_review_refusals_are_precise_grpc_statuses_and_are_counted() {
    ambit_e2e::init_test_logging();
    let fake = FakeKube::start().await;
    install(&fake, &["node-a", "node-b"]);
    app(&fake);
    let (cp, _kubeconfig) = kube_control_plane(&fake, &[]).await;
    let certify = |token: String, sa: &'static str| {
        let cp = &cp;
        async move { raw_certify(cp, Some(&token), "shop", sa, csr()).await }
    };

    // The right token: the proxy's pod on node-a may get node-a's identities. A proxy
    // starting up asks for many at once: one TokenReview answers them all.
    let before = fake.token_reviews();
    let burst = (0..10).map(|_| certify(node_token("node-a"), "cli"));
    for answer in futures::future::join_all(burst).await {
        assert!(answer.is_ok(), "{answer:?}");
    }
    assert_eq!(
        fake.token_reviews(),
        before + 1,
        "concurrent checks share one review"
    );
    // node-b's proxy may not get an identity only node-a runs.
    let err = certify(node_token("node-b"), "cli").await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("node node-b runs no pod"), "{err:?}");

    // The control plane's own identity is never issued, even to the node it runs on.
    fake.apply(service_account("ambit", "ambit-control"));
    fake.apply(pod(
        "ambit",
        "ambit-control-0",
        "node-a",
        "ambit-control",
        Some("192.0.2.5"),
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let err = raw_certify(
        &cp,
        Some(&node_token("node-a")),
        "ambit",
        "ambit-control",
        csr(),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    assert!(
        err.message().contains("control plane's own identity"),
        "{err:?}"
    );

    // A token for another audience.
    fake.add_pod_token(
        "aud-token-0123456789",
        "ambit",
        "ambit-proxy-node-a",
        &["vault"],
    );
    let err = certify("aud-token-0123456789".into(), "cli")
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");

    // A workload's own token (another ServiceAccount), bound to its pod.
    fake.add_pod_token("cli-token-0123456789", "shop", "cli", &["ambit"]);
    let err = certify("cli-token-0123456789".into(), "cli")
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    assert!(
        err.message().contains("shop/cli is not the node proxies'"),
        "{err:?}"
    );

    // The proxies' ServiceAccount, but a token bound to no pod.
    fake.add_token(
        "unbound-0123456789",
        TokenIdentity::service_account("ambit", "ambit-proxy", &["ambit"]),
    );
    let err = certify("unbound-0123456789".into(), "cli")
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");

    // A token whose review names another node than its pod's.
    let mut liar = fake.add_pod_token("liar-0123456789", "ambit", "ambit-proxy-node-a", &["ambit"]);
    liar.node = Some("node-b".into());
    fake.add_token("liar-0123456789", liar);
    let err = certify("liar-0123456789".into(), "cli").await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("names node node-b"), "{err:?}");

    // A token the API server does not know.
    let err = certify("nobody-0123456789".into(), "cli")
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");

    // Discovery: a proxy may only watch its own node.
    let mut client = ambit_api::proto::discovery::discovery_client::DiscoveryClient::new(
        cp.channel(&cp.discovery_url()),
    );
    let (req, _requests) = ambit_e2e::discovery::watch_request("node-a", Some("node-b"), &[]);
    let err = client.watch(req).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");

    let m = cp.metrics().await;
    for reason in [
        "token_rejected",
        "wrong_service_account",
        "not_bound_to_pod",
        "node_mismatch",
    ] {
        assert!(
            metric(
                &m,
                &format!("node_authentication_refused_total{{reason=\"{reason}\"}}")
            ) >= 1,
            "{reason} not counted:\n{m}"
        );
    }
    assert!(
        metric(
            &m,
            "identity_requests_refused_total{reason=\"permission_denied\"}"
        ) >= 5,
        "{m}"
    );
    assert_eq!(http_get(cp.admin_addr, "/ready").await.0, 200);
    cp.stop().await;
}

#[tokio::test]
async fn the_control_plane_is_ready_only_once_every_kind_has_listed() {
    let fake = FakeKube::start().await;
    install(&fake, &["node-a"]);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    fake.kubeconfig(&kubeconfig);
    // The API server is down at start: the control plane serves, but is not ready, and
    // says what it waits for.
    fake.go_down();
    let start = tokio::spawn(async move { ControlPlane::start_kube(&kubeconfig, &[]).await });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!start.is_finished(), "ready without the API server");
    fake.come_up();
    let cp = start.await.unwrap();
    let m = cp.metrics().await;
    assert!(metric(&m, "kube_watch_errors_total") >= 1, "{m}");
    assert_eq!(metric(&m, "kube_objects{kind=\"Pod\"}"), 1, "{m}");
    cp.stop().await;
}

type PolicyStream = tonic::Streaming<ambit_api::proto::policy::Update>;

/// The next policy update, within 10 s.
async fn next_policy(stream: &mut PolicyStream) -> ambit_api::proto::policy::Update {
    next_policy_within(stream, Duration::from_secs(10)).await
}

async fn next_policy_within(
    stream: &mut PolicyStream,
    limit: Duration,
) -> ambit_api::proto::policy::Update {
    tokio::time::timeout(limit, stream.message())
        .await
        .unwrap_or_else(|_| panic!("a policy update within {limit:?}"))
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn a_server_applied_to_the_api_server_reaches_the_policy_stream() {
    use ambit_api::proto::policy::inbound_policy_client::InboundPolicyClient;
    ambit_e2e::init_test_logging();
    let fake = FakeKube::start().await;
    install(&fake, &["node-a", "node-b"]);
    app(&fake);
    let (cp, _kubeconfig) = kube_control_plane(&fake, &[]).await;
    let mut client = InboundPolicyClient::new(cp.channel(&cp.policy_url()));
    let mut stream = client
        .watch(watch_request("node-a", "node-a"))
        .await
        .unwrap()
        .into_inner();
    let snapshot = next_policy(&mut stream).await;
    let pods: Vec<&str> = snapshot.pods.iter().map(|p| p.pod.as_str()).collect();
    assert_eq!(pods, ["shop/batch", "shop/cli"], "node-a's meshed pods");
    assert!(snapshot.pods.iter().all(|p| p.ports.is_empty()));

    // A Server and the policy allowing cli, through the watchers.
    fake.apply(
        json!({"apiVersion": "policy.ambit.dev/v1alpha1", "kind": "Server",
        "metadata": {"name": "all-8080", "namespace": "shop"},
        "spec": {"podSelector": {}, "port": 8080, "proxyProtocol": "opaque"}}),
    );
    fake.apply(
        json!({"apiVersion": "policy.ambit.dev/v1alpha1", "kind": "AuthorizationPolicy",
        "metadata": {"name": "from-cli", "namespace": "shop"},
        "spec": {"targetRef": {"kind": "Namespace", "name": "shop"},
                 "requiredAuthenticationRefs": [{"kind": "ServiceAccount", "name": "cli"}]}}),
    );
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let delta = next_policy(&mut stream).await;
        assert!(!delta.snapshot);
        for p in delta.pods {
            let port = &p.ports[0];
            assert_eq!(
                (
                    port.port,
                    port.kind.as_str(),
                    port.name.as_str(),
                    port.protocol.as_str()
                ),
                (8080, "server", "all-8080", "opaque")
            );
            if port.authorizations.len() == 1 {
                seen.retain(|s| *s != p.pod);
                seen.push(p.pod);
            }
        }
    }
    let m = cp.metrics().await;
    assert_eq!(metric(&m, "kube_objects{kind=\"Server\"}"), 1, "{m}");
    assert_eq!(
        metric(&m, "kube_objects{kind=\"AuthorizationPolicy\"}"),
        1,
        "{m}"
    );

    // Deleted: the pods' ports fall back to the default.
    fake.delete("servers.policy.ambit.dev", "shop", "all-8080");
    let mut cleared = 0;
    while cleared < 2 {
        let delta = next_policy(&mut stream).await;
        cleared += delta.pods.iter().filter(|p| p.ports.is_empty()).count();
    }
    cp.stop().await;
}

/// An HTTPRoute splitting web's port 80 between web-v1 and web-v2, retrying 503s.
fn web_split(v1: u32, v2: u32) -> Value {
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
    "metadata": {"name": "web-split", "namespace": "shop"},
    "spec": {
        "parentRefs": [{"group": "core", "kind": "Service", "name": "web", "port": 80}],
        "rules": [{
            "backendRefs": [{"name": "web-v1", "port": 80, "weight": v1},
                            {"name": "web-v2", "port": 80, "weight": v2}],
            "retry": {"codes": [503], "attempts": 2, "backoff": "50ms"},
        }],
    }})
}

/// The statuses of the fake's answers to lists of `plural`, in order.
fn lists(fake: &FakeKube, plural: &str) -> Vec<u16> {
    fake.request_log()
        .iter()
        .filter(|r| r.verb == "list" && r.resource == plural)
        .map(|r| r.status)
        .collect()
}

/// A node's policy stream, after its snapshot.
async fn policy_stream(cp: &ControlPlane, node: &str) -> (PolicyStream, Vec<String>) {
    use ambit_api::proto::policy::inbound_policy_client::InboundPolicyClient;
    let mut client = InboundPolicyClient::new(cp.channel(&cp.policy_url()));
    let mut stream = client
        .watch(watch_request(node, node))
        .await
        .unwrap()
        .into_inner();
    let snapshot = next_policy(&mut stream).await;
    assert!(snapshot.snapshot && !snapshot.more, "{snapshot:?}");
    let services = snapshot
        .services
        .iter()
        .map(|s| s.service.clone())
        .collect();
    (stream, services)
}

const WEB_SPLIT_90_10: &str =
    "80 HTTPRoute/web-split [] [shop/web-v1:80@90,shop/web-v2:80@10] retry 2x 503-503 50ms t0";

#[tokio::test]
async fn routes_applied_to_the_api_server_reach_the_policy_stream_change_by_delta_and_leave_on_delete(
) {
    ambit_e2e::init_test_logging();
    let fake = FakeKube::start().await;
    install(&fake, &["node-a", "node-b"]);
    app(&fake);
    fake.apply(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "rpc", "namespace": "shop"},
        "spec": {"clusterIP": "10.96.0.12", "clusterIPs": ["10.96.0.12"],
                 "ports": [{"name": "grpc", "port": 9090}]}}));
    let (cp, _kubeconfig) = kube_control_plane(&fake, &[]).await;

    // With Gateway API served, /ready came from the routes' first lists, not from a 404.
    assert_eq!(http_get(cp.admin_addr, "/ready").await.0, 200);
    assert_eq!(lists(&fake, "httproutes"), [200]);
    assert_eq!(lists(&fake, "grpcroutes"), [200]);
    let m = cp.metrics().await;
    assert_eq!(metric(&m, "kube_watch_errors_total"), 0, "{m}");

    let (mut stream, services) = policy_stream(&cp, "node-a").await;
    assert!(services.is_empty(), "no routes yet: {services:?}");

    // Through the watchers to every node: no client of web runs on node-a.
    fake.apply(web_split(90, 10));
    let delta = next_policy(&mut stream).await;
    assert!(!delta.snapshot && delta.pods.is_empty(), "{delta:?}");
    assert_eq!(service_rules(&delta, "shop/web"), [WEB_SPLIT_90_10]);
    fake.apply(
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GRPCRoute",
        "metadata": {"name": "rpc-canary", "namespace": "shop"},
        "spec": {
            "parentRefs": [{"group": "core", "kind": "Service", "name": "rpc", "port": 9090}],
            "rules": [{"matches": [{"method": {"service": "shop.Cart"}}],
                       "backendRefs": [{"name": "rpc-v2", "port": 9090}]}],
        }}),
    );
    let delta = next_policy(&mut stream).await;
    let names: Vec<&str> = delta.services.iter().map(|s| s.service.as_str()).collect();
    assert_eq!(names, ["shop/rpc"], "{delta:?}");
    assert_eq!(
        service_rules(&delta, "shop/rpc"),
        ["9090 GRPCRoute/rpc-canary [] [shop/rpc-v2:9090@1]  t0"]
    );

    // Changed: a delta with web only.
    fake.apply(web_split(50, 50));
    let delta = next_policy(&mut stream).await;
    let names: Vec<&str> = delta.services.iter().map(|s| s.service.as_str()).collect();
    assert_eq!(names, ["shop/web"], "{delta:?}");
    assert_eq!(
        service_rules(&delta, "shop/web"),
        [WEB_SPLIT_90_10.replace("@90", "@50").replace("@10", "@50")]
    );

    // Deleted: web has no route left and is removed; rpc stays.
    assert!(fake.delete("HTTPRoute", "shop", "web-split"));
    let delta = next_policy(&mut stream).await;
    assert!(delta.services.is_empty(), "{delta:?}");
    assert_eq!(delta.removed_services, ["shop/web"]);
    let m = cp.metrics().await;
    assert_eq!(metric(&m, "kube_objects{kind=\"HTTPRoute\"}"), 0, "{m}");
    assert_eq!(metric(&m, "kube_objects{kind=\"GRPCRoute\"}"), 1, "{m}");
    assert_eq!(metric(&m, "policy_routed_services"), 1, "{m}");
    assert_eq!(metric(&m, "kube_watch_errors_total"), 0, "{m}");
    cp.stop().await;
}

#[tokio::test]
async fn without_gateway_apis_crds_the_control_plane_is_ready_and_routes_come_once_they_are_installed(
) {
    ambit_e2e::init_test_logging();
    let fake = FakeKube::start_with(Settings {
        gateway_api: false,
        ..Settings::default()
    })
    .await;
    install(&fake, &["node-a", "node-b"]);
    app(&fake);
    // Ready although every list of the routes answered 404: they count as empty.
    let (cp, _kubeconfig) = kube_control_plane(&fake, &[]).await;
    for plural in ["httproutes", "grpcroutes"] {
        let statuses = lists(&fake, plural);
        assert!(
            !statuses.is_empty() && statuses.iter().all(|s| *s == 404),
            "{plural}: {statuses:?}"
        );
    }
    let m = cp.metrics().await;
    assert!(
        metric(&m, "kube_watch_errors_total{kind=\"HTTPRoute\"}") >= 1,
        "{m}"
    );
    assert_eq!(metric(&m, "kube_objects{kind=\"HTTPRoute\"}"), 0, "{m}");
    let (mut stream, services) = policy_stream(&cp, "node-a").await;
    assert!(services.is_empty(), "{services:?}");

    // The CRDs installed and a route applied: kube-rs's backoff retries the list (0.8 s,
    // doubling), so it arrives without a restart.
    for ty in ResourceType::gateway() {
        fake.register(ty);
    }
    fake.apply(web_split(90, 10));
    let delta = next_policy_within(&mut stream, Duration::from_secs(30)).await;
    assert_eq!(service_rules(&delta, "shop/web"), [WEB_SPLIT_90_10]);
    assert_eq!(lists(&fake, "httproutes").last(), Some(&200));
    let m = cp.metrics().await;
    assert_eq!(metric(&m, "kube_objects{kind=\"HTTPRoute\"}"), 1, "{m}");
    assert_eq!(http_get(cp.admin_addr, "/ready").await.0, 200);
    cp.stop().await;
}

#[tokio::test]
async fn a_served_route_kind_the_control_plane_may_not_list_holds_ready_unlike_a_missing_crd() {
    ambit_e2e::init_test_logging();
    let fake = FakeKube::start().await;
    install(&fake, &["node-a"]);
    // The CRDs are installed but the control plane's ClusterRole lacks the routes: a 403
    // is waited out as for any kind, not taken for "no CRD".
    fake.forbid("httproutes");
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    fake.kubeconfig(&kubeconfig);
    let start = tokio::spawn(async move { ControlPlane::start_kube(&kubeconfig, &[]).await });
    eventually("a list of the routes refused", || async {
        lists(&fake, "httproutes").contains(&403)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!start.is_finished(), "ready without the routes' first list");
    assert!(lists(&fake, "grpcroutes").contains(&200));
    // The rule granted: kube-rs's next try lists them and the control plane is ready.
    fake.allow("httproutes");
    let cp = start.await.unwrap();
    assert_eq!(lists(&fake, "httproutes").last(), Some(&200));
    let m = cp.metrics().await;
    assert!(
        metric(&m, "kube_watch_errors_total{kind=\"HTTPRoute\"}") >= 1,
        "{m}"
    );
    cp.stop().await;
}
