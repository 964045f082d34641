//! Discovery end to end: the real control plane streams to the node proxy's discovery
//! client what its node needs — its own pods, and the destinations it subscribes to —
//! snapshot, deltas, outage, reconnection.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use ambit_api::proto::discovery::discovery_client::DiscoveryClient as PbClient;
use ambit_api::proto::discovery::WatchRequest;
use ambit_e2e::discovery::watch_request;
use ambit_e2e::{node_token, ControlPlane};
use ambit_proxy::discovery::{
    Destination, DiscoveryClient, DiscoveryMetrics, DiscoveryState, Lookup, Subscriptions, Target,
    WaitError,
};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, watch};

const CLUSTER: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: shop, annotations: {ambit.dev/mesh: enabled, config.ambit.dev/opaque-ports: "5432"}}
---
apiVersion: v1
kind: Pod
metadata:
  name: web-0
  namespace: shop
  annotations: {local.ambit.dev/netns: /run/netns/web-0, config.ambit.dev/skip-outbound-ports: "9000-9010"}
  labels: {pod-template-hash: 5d9f}
  ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: web-5d9f, uid: u1, controller: true}]
spec: {nodeName: node-a, serviceAccountName: web, containers: [{name: app, image: web}]}
status: {podIP: 10.1.0.5, phase: Running, conditions: [{type: Ready, status: "True"}]}
---
apiVersion: v1
kind: Pod
metadata: {name: db-0, namespace: shop}
spec: {nodeName: node-b, serviceAccountName: db, containers: [{name: app, image: db}]}
status: {podIP: 10.2.0.5, phase: Running}
---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: shop}
spec: {clusterIP: 10.96.0.20, ports: [{name: pg, port: 5432}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: db-1, namespace: shop, labels: {kubernetes.io/service-name: db}}
addressType: IPv4
ports: [{name: pg, port: 5432}]
endpoints: [{addresses: [10.2.0.5], nodeName: node-b, targetRef: {kind: Pod, name: db-0, namespace: shop}}]
"#;

struct Proxy {
    state: watch::Receiver<Arc<DiscoveryState>>,
    subs: Subscriptions,
    stop: Option<oneshot::Sender<()>>,
    registry: prometheus_client::registry::Registry,
}

fn start_client(channel: tonic::transport::Channel, node: &str) -> Proxy {
    let (tx, rx) = watch::channel(Arc::new(DiscoveryState::default()));
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = DiscoveryMetrics::register(&mut registry);
    let subs = Subscriptions::new(ambit_proxy::discovery::SubscriptionMetrics::register(
        &mut registry,
        metrics.connected_gauge(),
    ));
    let (stop, stopped) = oneshot::channel::<()>();
    let client = DiscoveryClient::new(channel, node_token(node), node.to_string())
        .with_subscriptions(subs.clone());
    tokio::spawn(client.run(tx, metrics, async move {
        let _ = stopped.await;
    }));
    Proxy {
        state: rx,
        subs,
        stop: Some(stop),
        registry,
    }
}

impl Proxy {
    /// What the data path does for a new destination: subscribe, wait for the answer.
    async fn connect_to(&self, addr: &str) -> Result<Destination, WaitError> {
        let addr: std::net::SocketAddr = addr.parse().unwrap();
        self.subs
            .wait(
                &self.state,
                &Target::Addr(addr.ip()),
                Duration::from_secs(3),
                |s| s.lookup(addr),
            )
            .await
    }

    fn metrics(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        text
    }
}

async fn until(p: &mut Proxy, what: &str, f: impl Fn(&DiscoveryState) -> bool) {
    tokio::time::timeout(Duration::from_secs(15), p.state.wait_for(|s| f(s)))
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for: {what}"))
        .unwrap();
}

#[tokio::test]
async fn snapshot_then_deltas_reach_the_proxy() {
    let cp = ControlPlane::start(CLUSTER, &["node-a", "node-b"]).await;
    let mut p = start_client(cp.channel(&cp.discovery_url()), "node-a");
    until(&mut p, "snapshot", |s| s.synced).await;
    {
        let s = p.state.borrow().clone();
        let local = s.local_workloads("node-a");
        assert_eq!(local.len(), 1);
        let web = &local[0];
        assert_eq!(
            web.identity.to_string(),
            "spiffe://cluster.local/ns/shop/sa/web"
        );
        assert_eq!(
            web.netns.as_deref(),
            Some(std::path::Path::new("/run/netns/web-0"))
        );
        assert_eq!(
            web.workload, "web",
            "a ReplicaSet's pod belongs to its Deployment"
        );
        assert!(
            web.opaque_ports.contains(5432),
            "namespace opaque-ports apply"
        );
        assert!(!web.opaque_ports.contains(3306), "and replace the defaults");
        assert!(web.skip_outbound_ports.contains(9005));
        // Nothing of node-b: not its pod, not the Service no pod of node-a used yet.
        assert_eq!(s.workloads().count(), 1, "{s:?}");
        assert_eq!(s.services().count(), 0, "{s:?}");
        assert_eq!(
            s.lookup("10.96.0.20:5432".parse().unwrap()),
            Lookup::Pending
        );
        assert_eq!(s.lookup("10.2.0.5:5432".parse().unwrap()), Lookup::Pending);
    }
    // A pod of node-a connects to the Service: subscribed, answered.
    match p.connect_to("10.96.0.20:5432").await.unwrap() {
        Destination::Service { endpoints, .. } => {
            assert_eq!(endpoints.len(), 1);
            let ep = &endpoints[0].1;
            assert_eq!(
                ep.identity.as_ref().unwrap().to_string(),
                "spiffe://cluster.local/ns/shop/sa/db"
            );
            assert_eq!(ep.node, "node-b");
            assert!(
                ep.opaque_ports.contains(5432),
                "the endpoint's opaque ports"
            );
        }
        other => panic!("{other:?}"),
    }
    // And to db-0's own address, and to one outside the cluster.
    assert!(
        matches!(p.connect_to("10.2.0.5:5432").await.unwrap(), Destination::Pod(w, _) if w.name == "db-0")
    );
    assert_eq!(
        p.connect_to("192.0.2.1:443").await.unwrap(),
        Destination::Unknown("192.0.2.1:443".parse().unwrap())
    );
    assert!(
        p.metrics()
            .contains("discovery_lookup_waits_total{result=\"resolved\"} 3"),
        "{}",
        p.metrics()
    );

    // A new pod on node-a arrives as a delta.
    let more = format!("{CLUSTER}---\napiVersion: v1\nkind: Pod\nmetadata: {{name: web-1, namespace: shop}}\nspec: {{nodeName: node-a, serviceAccountName: web, containers: []}}\nstatus: {{podIP: 10.1.0.6}}\n");
    cp.set_cluster(&more);
    until(&mut p, "web-1 delta", |s| {
        s.local_workloads("node-a").len() == 2
    })
    .await;
    // And its removal.
    cp.set_cluster(CLUSTER);
    until(&mut p, "web-1 removal", |s| {
        s.local_workloads("node-a").len() == 1
    })
    .await;
    // An endpoint's change reaches the subscriber as a delta of that endpoint.
    let unready = CLUSTER.replace(
        "endpoints: [{addresses: [10.2.0.5], nodeName",
        "endpoints: [{addresses: [10.2.0.5], conditions: {ready: false}, nodeName",
    );
    cp.set_cluster(&unready);
    until(&mut p, "the endpoint's readiness", |s| {
        matches!(s.lookup("10.96.0.20:5432".parse().unwrap()), Lookup::Known(Destination::Service { endpoints, .. }) if endpoints.is_empty())
    })
    .await;
    // Unused destinations are dropped: the control plane removes what it sent.
    p.subs.expire(Duration::ZERO);
    until(&mut p, "unsubscribed", |s| {
        s.services().count() == 0 && s.resolutions().is_empty() && s.workloads().count() == 1
    })
    .await;
    let m = cp.metrics().await;
    assert!(m.contains("discovery_streams 1"), "{m}");
    assert!(m.contains("discovery_targets 0"), "{m}");
    p.stop.take().unwrap().send(()).unwrap();
    cp.stop().await;
}

#[tokio::test]
async fn the_proxy_keeps_its_state_while_the_control_plane_is_away_and_resyncs_after() {
    let cp = ControlPlane::start(CLUSTER, &["node-a"]).await;
    let addr = cp.discovery_addr;
    let (root, issuer) = (cp.root.clone(), cp.issuer.clone());
    let mut p = start_client(cp.channel(&cp.discovery_url()), "node-a");
    until(&mut p, "snapshot", |s| s.synced).await;
    p.connect_to("10.96.0.20:5432").await.unwrap();
    cp.stop().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        p.state.borrow().local_workloads("node-a").len(),
        1,
        "state kept during the outage"
    );
    // A destination known before keeps resolving; one first used now fails closed.
    assert!(matches!(
        p.connect_to("10.96.0.20:5432").await.unwrap(),
        Destination::Service { .. }
    ));
    let err = p.connect_to("10.2.0.5:5432").await.unwrap_err();
    assert!(
        err.to_string().contains("the control plane is unreachable"),
        "{err}"
    );
    assert!(
        p.metrics()
            .contains("discovery_lookup_waits_total{result=\"timeout\"} 1"),
        "{}",
        p.metrics()
    );

    // A control plane comes back (same address) with web-0 gone: the snapshot replaces all.
    let without_web = CLUSTER.replace("nodeName: node-a", "nodeName: node-c");
    let cp = ControlPlane::start_with_pki(&without_web, &["node-a"], addr, root, issuer).await;
    until(&mut p, "resync", |s| s.local_workloads("node-a").is_empty()).await;
    // What it subscribed to is subscribed again: the Service, and the address first
    // used during the outage.
    until(&mut p, "subscriptions again", |s| {
        matches!(
            s.lookup("10.96.0.20:5432".parse().unwrap()),
            Lookup::Known(Destination::Service { .. })
        ) && matches!(
            s.lookup("10.2.0.5:5432".parse().unwrap()),
            Lookup::Known(Destination::Pod(..))
        )
    })
    .await;
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &p.registry).unwrap();
    assert!(!text.contains("discovery_reconnects_total 0"), "{text}");
    p.stop.take().unwrap().send(()).unwrap();
    cp.stop().await;
}

#[tokio::test]
async fn a_proxy_may_only_watch_its_own_node() {
    let cp = ControlPlane::start(CLUSTER, &["node-a", "node-b"]).await;
    let mut client = PbClient::new(cp.channel(&cp.discovery_url()));
    let (req, _requests) = watch_request("node-b", Some("node-a"), &[]);
    let s = client.watch(req).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::PermissionDenied);
    assert!(s.message().contains("belongs to node node-a"), "{s:?}");
    let (req, _requests) = watch_request("node-a", None, &[]);
    let s = client.watch(req).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::Unauthenticated);
    // A proxy of an earlier version, which expects the whole cluster and does not
    // subscribe, is told to upgrade (it keeps serving from its last state meanwhile).
    let (req, requests) = watch_request("node-a", Some("node-a"), &[]);
    let _ = requests;
    let mut old = req;
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.try_send(WatchRequest {
        node: "node-a".into(),
        ..WatchRequest::default()
    })
    .unwrap();
    *old.get_mut() = tokio_stream::wrappers::ReceiverStream::new(rx);
    let s = client.watch(old).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::FailedPrecondition);
    assert!(s.message().contains("upgrade the node proxy"), "{s:?}");
    assert!(cp
        .metrics()
        .await
        .contains("discovery_watches_refused_total 3"));
    cp.stop().await;
}
