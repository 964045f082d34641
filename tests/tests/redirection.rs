//! Redirection end to end, with no change to the applications: pods wired by the real CNI
//! plugins (`bridge`, `host-local`, `loopback`) chained with `ambit-cni`, as a runtime
//! runs them, on two nodes; one node proxy per node serving its CNI socket; unmodified
//! clients (curl, run as processes of the pod: in its netns and its node's cgroup). The
//! same scenario runs with eBPF and with nftables redirection. Run as root.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use ambit_e2e::cni::Cluster;
use ambit_e2e::{http_server, metric_sum, ControlPlane, NodeProxy, NAMESPACES};
use ambit_proxy::netns::Netns;
use ambit_proxy::proxy::Redirect;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const CNI: &str = env!("CARGO_BIN_EXE_ambit-cni-e2e");
const WEB_ID: &str = "spiffe://cluster.local/ns/shop/sa/web";
const CLI_ID: &str = "spiffe://cluster.local/ns/shop/sa/cli";

/// The cluster as the API server has it. `web_ip` is `None` until the kubelet reports
/// it (after CNI ADD).
fn cluster_yaml(web_ip: Option<&str>) -> String {
    let web_status = web_ip
        .map(|ip| format!("status: {{podIP: {ip}, phase: Running}}"))
        .unwrap_or_else(|| "status: {phase: Pending}".into());
    format!(
        r#"{NAMESPACES}---
apiVersion: v1
kind: Pod
metadata: {{name: cli, namespace: shop, annotations: {{config.ambit.dev/skip-outbound-ports: "5432"}}}}
spec: {{nodeName: node-a, serviceAccountName: cli, containers: []}}
status: {{podIP: 10.78.1.10, phase: Running}}
---
apiVersion: v1
kind: Pod
metadata: {{name: web, namespace: shop, annotations: {{config.ambit.dev/skip-inbound-ports: "9090"}}}}
spec: {{nodeName: node-b, serviceAccountName: web, containers: []}}
{web_status}
---
apiVersion: v1
kind: Pod
metadata: {{name: old, namespace: legacy}}
spec: {{nodeName: node-a, containers: []}}
status: {{podIP: 10.78.1.20, phase: Running}}
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: shop}}
spec: {{clusterIP: 10.96.0.10, ports: [{{name: http, port: 80}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: web-1, namespace: shop, labels: {{kubernetes.io/service-name: web}}}}
addressType: IPv4
ports: [{{name: http, port: 8080}}]
endpoints: [{{addresses: [10.78.2.10], targetRef: {{kind: Pod, name: web, namespace: shop}}}}]
"#
    )
}

async fn scenario(test: &str, redirect: Redirect) {
    let c = Arc::new(Cluster::new(test, &["node-a", "node-b"], Path::new(CNI)));
    // The installer chained ambit-cni after the bridge (.conf became .conflist).
    let list = c.conflist(c.node("node-a"));
    let types: Vec<_> = list["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(types, ["bridge", "ambit-cni"]);

    let cp = ControlPlane::start(&cluster_yaml(None), &["node-a", "node-b"]).await;
    let config_a = c.node("node-a").proxy_config(&cp, redirect);
    let config_b = c.node("node-b").proxy_config(&cp, redirect);
    let a = NodeProxy::start_config(config_a.clone()).await;
    let b = NodeProxy::start_config(config_b.clone()).await;

    // ADD returns only once the proxy has the pod (listeners and redirection in place);
    // each plugin's result goes through ambit-cni unchanged.
    let web = c.add("node-b", "shop", "web", 10).await;
    let cli = c.add("node-a", "shop", "cli", 10).await;
    let old = c.add("node-a", "legacy", "old", 20).await;
    for pod in [&web, &cli, &old] {
        assert_eq!(pod.results.len(), 2);
        assert_eq!(
            pod.results[1], pod.results[0],
            "ambit-cni changed prevResult"
        );
    }
    // The kubelet reports web's address, and the control plane serves it.
    cp.set_cluster(&cluster_yaml(Some("10.78.2.10")));

    let web_ns = Netns::open(Path::new(&web.path())).unwrap();
    let seen = http_server(&web_ns, 8080, "hello from web").await;
    let skipped = http_server(&web_ns, 9090, "direct to web").await;
    let old_ns = Netns::open(Path::new(&old.path())).unwrap();
    let db = http_server(&old_ns, 5432, "db").await;
    let web_ip = IpAddr::from([10, 78, 2, 10]);

    // An unmodified client reaches the Service and the pod IP, through both proxies.
    // Until discovery brings web's address, traffic to the pod IP is not known to be
    // meshed (it goes in plaintext to web's inbound proxy): wait for the mesh route.
    let mesh_requests = |m: &str| {
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
    for url in ["http://10.96.0.10/", "http://10.78.2.10:8080/"] {
        let mut got = Err(String::new());
        for _ in 0..100 {
            let before = mesh_requests(&a.metrics().await);
            got = c.curl_async(&cli, url).await;
            if matches!(&got, Ok((200, _))) && mesh_requests(&a.metrics().await) > before {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(got, Ok((200, "hello from web".into())), "{url}");
    }
    // The application saw its own proxy (inside its pod), never the client directly.
    assert!(
        seen.lock().unwrap().iter().all(|p| p.ip() == web_ip),
        "{seen:?}"
    );
    // mTLS with the expected identities on both ends.
    let (ma, mb) = (a.metrics().await, b.metrics().await);
    let out = [
        "direction=\"outbound\"",
        "pod=\"cli\"",
        &format!("server_id=\"{WEB_ID}\""),
        "tls=\"true\"",
    ];
    assert!(
        metric_sum(&ma, "request_total", &out) >= 2,
        "client side:\n{ma}"
    );
    let inb = [
        "direction=\"inbound\"",
        "pod=\"web\"",
        &format!("client_id=\"{CLI_ID}\""),
        "tls=\"true\"",
    ];
    assert!(
        metric_sum(&mb, "request_total", &inb) >= 2,
        "server side:\n{mb}"
    );
    assert!(
        mb.contains("cni_requests_total{command=\"add\",result=\"redirected\"} 1"),
        "{mb}"
    );
    let dump: serde_json::Value =
        serde_json::from_str(&ambit_e2e::http_get(b.admin_addr, "/config_dump").await.1).unwrap();
    let mode = if redirect == Redirect::Ebpf {
        "ebpf"
    } else {
        "nftables"
    };
    assert_eq!(dump["redirect_mode"], mode, "{dump}");
    assert_eq!(
        dump["pods"][0]["cni_sandbox"],
        web.container_id.as_str(),
        "{dump}"
    );

    // The unmeshed pod is untouched: no listeners, no rules; it reaches web in plaintext
    // through web's inbound proxy.
    let old_listeners = c.listeners(&old);
    assert!(!old_listeners.contains(":4140"), "{old_listeners}");
    assert!(!c.listeners(&cli).is_empty());
    assert_eq!(
        c.curl_async(&old, "http://10.78.2.10:8080/").await,
        Ok((200, "hello from web".into()))
    );
    assert!(
        ma.contains("cni_requests_total{command=\"add\",result=\"not_meshed\"} 1"),
        "{ma}"
    );

    // Skip ports: web's 9090 takes clients directly; cli's 5432 goes out directly.
    assert_eq!(
        c.curl_async(&old, "http://10.78.2.10:9090/").await,
        Ok((200, "direct to web".into()))
    );
    assert_eq!(
        skipped.lock().unwrap().last().map(|p| p.ip()),
        Some(IpAddr::from([10, 78, 1, 20]))
    );
    let before = metric_sum(
        &a.metrics().await,
        "tcp_open_total",
        &["direction=\"outbound\"", "pod=\"cli\""],
    );
    assert_eq!(
        c.curl_async(&cli, "http://10.78.1.20:5432/").await,
        Ok((200, "db".into()))
    );
    assert_eq!(
        db.lock().unwrap().last().map(|p| p.ip()),
        Some(IpAddr::from([10, 78, 1, 10]))
    );
    let after = metric_sum(
        &a.metrics().await,
        "tcp_open_total",
        &["direction=\"outbound\"", "pod=\"cli\""],
    );
    assert_eq!(before, after, "a skip-outbound port went through the proxy");

    // CHECK agrees.
    let check = {
        let (c2, web2) = (c.clone(), web.clone());
        tokio::task::spawn_blocking(move || c2.ambit_cni(&web2, "CHECK", serde_json::json!({})))
            .await
            .unwrap()
    };
    assert_eq!(check, Ok(String::new()));

    // Stopping web's proxy: new connections to web fail, and nothing reaches web in
    // plaintext — neither from the mesh nor from the unmeshed pod.
    b.stop().await;
    let reached = seen.lock().unwrap().len();
    let via_mesh = c.curl_async(&cli, "http://10.78.2.10:8080/").await;
    assert!(!matches!(via_mesh, Ok((200, _))), "{via_mesh:?}");
    let plain = c.curl_async(&old, "http://10.78.2.10:8080/").await;
    assert!(plain.is_err(), "{plain:?}");
    assert_eq!(
        seen.lock().unwrap().len(),
        reached,
        "web was reached around its proxy"
    );

    // Restarted, it serves web again without a new ADD.
    let b = NodeProxy::start_config(config_b.clone()).await;
    assert_eq!(
        c.curl_async(&cli, "http://10.78.2.10:8080/").await,
        Ok((200, "hello from web".into()))
    );
    assert!(!b
        .metrics()
        .await
        .contains("cni_requests_total{command=\"add\""));

    // Stopping the client's proxy: its pod cannot connect at all (no bypass).
    a.stop().await;
    let reached = seen.lock().unwrap().len();
    let out = c.curl_async(&cli, "http://10.78.2.10:8080/").await;
    assert!(out.is_err(), "{out:?}");
    assert_eq!(seen.lock().unwrap().len(), reached);
    let a = NodeProxy::start_config(config_a.clone()).await;
    assert_eq!(
        c.curl_async(&cli, "http://10.96.0.10/").await,
        Ok((200, "hello from web".into()))
    );

    // The pod's sandbox is replaced: DEL, a new netns, ADD again.
    {
        let (c2, web2) = (c.clone(), web.clone());
        tokio::task::spawn_blocking(move || c2.del_pod(&web2))
            .await
            .unwrap()
            .unwrap();
    }
    c.remove_netns(&web);
    let web2 = c.add("node-b", "shop", "web", 10).await;
    assert_ne!(web2.container_id, web.container_id);
    let web2_ns = Netns::open(Path::new(&web2.path())).unwrap();
    let seen2 = http_server(&web2_ns, 8080, "hello from web2").await;
    assert_eq!(
        c.curl_async(&cli, "http://10.96.0.10/").await,
        Ok((200, "hello from web2".into()))
    );
    assert!(seen2.lock().unwrap().iter().all(|p| p.ip() == web_ip));

    a.stop().await;
    b.stop().await;
    c.del_all(&[&web2, &cli, &old]).await;
    cp.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cni_pods_are_redirected_with_ebpf_and_fail_closed() {
    scenario("ebpf", Redirect::Ebpf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cni_pods_are_redirected_with_nftables_and_fail_closed() {
    scenario("nft", Redirect::Nftables).await;
}
