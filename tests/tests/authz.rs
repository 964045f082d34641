//! Inbound authorization, end to end with curl in network namespaces. The server's proxy
//! applies its start-up default inbound policy (`--default-inbound-policy`, what a pod gets
//! while no policy has come from the control plane) — deny, all-authenticated,
//! cluster-unauthenticated — to a meshed client (over mTLS, per request: 403, gRPC status
//! 7) and to a client outside the mesh (plaintext, per connection: 403 to HTTP, opaque
//! connections closed), and counts each decision with Linkerd's metric names. Then the
//! control plane's policy service: a namespace's `config.ambit.dev/default-inbound-policy`
//! applies to running pods, the kubelet's probes pass a `deny`, a change ends an open
//! connection it now denies. And Servers with their AuthorizationPolicies: named
//! identities, NetworkAuthentications with `except`, both at once, prefixes, audit.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use ambit_e2e::netns::{PodNet, Topology};
use ambit_e2e::{metric_sum, ControlPlane, NodeProxy, NAMESPACES};
use ambit_proxy::netns::Netns;
use std::path::Path;
use std::process::Command;

fn cluster(t: &Topology) -> String {
    let pod = |name: &str, node: &str, sa: &str, extra: &str| {
        let p = t.pod(name);
        format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: shop, annotations: {{local.ambit.dev/netns: {}{extra}}}}}\nspec: {{nodeName: {node}, serviceAccountName: {sa}, containers: []}}\nstatus: {{podIP: {}, phase: Running}}\n",
            p.path(),
            p.ip
        )
    };
    format!(
        "{NAMESPACES}{}{}{}",
        pod("client", "node-a", "client", ""),
        pod("server", "node-b", "server", ""),
        pod("outside", "node-a", "outside", ", ambit.dev/mesh: disabled"),
    )
}

/// An HTTP/1 and HTTP/2 (h2c) server on 8080 in the pod that answers 200 "hello".
async fn app(netns: &Netns) {
    let listener = netns.bind("0.0.0.0:8080".parse().unwrap()).await.unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(http::Response::new(
                        http_body_util::Full::new(bytes::Bytes::from_static(b"hello\n")),
                    ))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                .await;
            });
        }
    });
}

/// `curl` in `pod`: status line, headers and body (or curl's error).
fn curl(pod: &PodNet, args: &[&str]) -> String {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &pod.name,
            "curl",
            "-sS",
            "--max-time",
            "10",
            "-D",
            "-",
        ])
        .args(args)
        .output()
        .unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

struct Mesh {
    t: Topology,
    cp: ControlPlane,
    a: NodeProxy,
    b: NodeProxy,
}

/// The client's node proxy as usual; the server's with `policy` as its default inbound
/// policy (and the test subnet as the cluster's networks when `in_cluster`), and no policy
/// service to reach (as before the control plane's first policy): its own default holds.
async fn mesh(policy: &str, in_cluster: bool) -> Mesh {
    let t = Topology::new(&["client", "server", "outside"]);
    let cp = ControlPlane::start(&cluster(&t), &["node-a", "node-b"]).await;
    let a = NodeProxy::start(&cp, "node-a").await;
    let mut config = NodeProxy::config(&cp, "node-b");
    config.default_inbound_policy = policy.into();
    config.policy_url = "https://127.0.0.1:1".into();
    config.cluster_networks = if in_cluster {
        "10.77.0.0/24".into()
    } else {
        "192.168.0.0/16".into()
    };
    let b = NodeProxy::start_config(config).await;
    let server = Netns::open(Path::new(&t.pod("server").path())).unwrap();
    app(&server).await;
    std::mem::forget(server);
    Mesh { t, cp, a, b }
}

impl Mesh {
    async fn stop(self) {
        self.a.stop().await;
        self.b.stop().await;
        self.cp.stop().await;
        drop(self.t);
    }

    async fn curl(&self, from: &str, args: &[&'static str]) -> String {
        self.curl_path(from, "/", args).await
    }

    /// `curl` in `from` of `path` on the server's port 8080.
    async fn curl_path(&self, from: &str, path: &str, args: &[&'static str]) -> String {
        let pod = self.t.pod(from).clone();
        let url = format!("http://{}:8080{path}", self.t.pod("server").ip);
        let args: Vec<String> = args.iter().map(|s| s.to_string()).chain([url]).collect();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            curl(&pod, &args)
        })
        .await
        .unwrap()
    }

    /// Raw bytes (not HTTP) from `from` to the server's port 8080: what came back, or the
    /// error.
    async fn raw(&self, from: &str) -> String {
        self.raw_to(from, 8080, 10).await
    }

    /// Raw bytes (not HTTP) from `from` to the server's `port`, reading for at most `secs`.
    async fn raw_to(&self, from: &str, port: u16, secs: u32) -> String {
        let pod = self.t.pod(from).clone();
        let server = self.t.pod("server").ip;
        tokio::task::spawn_blocking(move || {
            let script = format!(
                "exec 3<>/dev/tcp/{server}/{port} && printf '\\x00\\x01binary\\n' >&3 && timeout {secs} cat <&3; echo \"exit=$?\""
            );
            let out = Command::new("ip")
                .args(["netns", "exec", &pod.name, "bash", "-c", &script])
                .output()
                .unwrap();
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .await
        .unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_refuses_meshed_requests_grpc_plaintext_and_opaque_and_counts_them() {
    let m = mesh("deny", true).await;
    // A meshed client: 403 per request, told why (it is another proxy's client).
    let out = m.curl("client", &[]).await;
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    assert!(out.contains("denied by policy"), "{out}");
    assert!(out.contains("ambit-proxy-error: denied"), "{out}");
    // gRPC: PERMISSION_DENIED in a trailers-only response.
    let out = m
        .curl(
            "client",
            &[
                "--http2-prior-knowledge",
                "-H",
                "content-type: application/grpc",
                "-X",
                "POST",
            ],
        )
        .await;
    assert!(out.starts_with("HTTP/2 200"), "{out}");
    assert!(out.contains("grpc-status: 7"), "{out}");
    // From outside the mesh: HTTP is answered 403 without a word about the policy...
    let out = m.curl("outside", &[]).await;
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    assert!(!out.contains("ambit-proxy-error"), "{out}");
    // ... and a connection that is not HTTP is closed with nothing sent back.
    let out = m.raw("outside").await;
    assert!(!out.contains("hello"), "{out}");

    let metrics = m.b.metrics().await;
    let deny = |name: &str| {
        metric_sum(
            &metrics,
            name,
            &[
                "srv_kind=\"default\"",
                "srv_name=\"deny\"",
                "pod=\"server\"",
            ],
        )
    };
    assert!(deny("inbound_http_authz_deny_total") >= 3, "{metrics}");
    assert!(deny("inbound_tcp_authz_deny_total") >= 1, "{metrics}");
    assert_eq!(
        metric_sum(&metrics, "inbound_http_authz_allow_total", &[]),
        0,
        "{metrics}"
    );
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_authenticated_lets_meshed_clients_in_and_keeps_plaintext_out() {
    let m = mesh("all-authenticated", true).await;
    let out = m.curl("client", &[]).await;
    assert!(
        out.starts_with("HTTP/1.1 200") && out.contains("hello"),
        "{out}"
    );
    let out = m.curl("outside", &[]).await;
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    let metrics = m.b.metrics().await;
    let allowed = metric_sum(
        &metrics,
        "inbound_http_authz_allow_total",
        &[
            "authz_kind=\"default\"",
            "authz_name=\"all-authenticated\"",
            "target_port=\"8080\"",
        ],
    );
    assert!(allowed >= 1, "{metrics}");
    assert!(
        metric_sum(
            &metrics,
            "inbound_http_authz_deny_total",
            &["srv_name=\"all-authenticated\""]
        ) >= 1,
        "{metrics}"
    );
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_unauthenticated_judges_plaintext_by_the_clients_network() {
    // The test subnet is the cluster's: plaintext from it is allowed.
    let m = mesh("cluster-unauthenticated", true).await;
    let out = m.curl("outside", &[]).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let metrics = m.b.metrics().await;
    assert!(
        metric_sum(
            &metrics,
            "inbound_tcp_authz_allow_total",
            &["authz_name=\"cluster-unauthenticated\""]
        ) >= 1,
        "{metrics}"
    );
    m.stop().await;
    // It is not: refused, meshed clients included (they come from it too).
    let m = mesh("cluster-unauthenticated", false).await;
    let out = m.curl("outside", &[]).await;
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    let out = m.curl("client", &[]).await;
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    m.stop().await;
}

/// The server pod (probed on 8080 at /healthz) in a namespace whose annotation sets the
/// default inbound policy to `policy`.
fn annotated_cluster(t: &Topology, policy: &str) -> String {
    let p = |name: &str| t.pod(name);
    format!(
        "apiVersion: v1
kind: Namespace
metadata: {{name: shop, annotations: {{ambit.dev/mesh: enabled, config.ambit.dev/default-inbound-policy: {policy}}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: client, namespace: shop, annotations: {{local.ambit.dev/netns: {}, config.ambit.dev/default-inbound-policy: all-unauthenticated}}}}
spec: {{nodeName: node-a, serviceAccountName: client, containers: []}}
status: {{podIP: {}, phase: Running}}
---
apiVersion: v1
kind: Pod
metadata: {{name: server, namespace: shop, annotations: {{local.ambit.dev/netns: {}}}}}
spec:
  nodeName: node-b
  serviceAccountName: server
  containers:
  - name: app
    ports: [{{name: http, containerPort: 8080}}]
    readinessProbe: {{httpGet: {{port: http, path: /healthz}}}}
status: {{podIP: {}, phase: Running}}
---
apiVersion: v1
kind: Pod
metadata: {{name: outside, namespace: shop, annotations: {{local.ambit.dev/netns: {}, ambit.dev/mesh: disabled}}}}
spec: {{nodeName: node-a, serviceAccountName: outside, containers: []}}
status: {{podIP: {}, phase: Running}}
",
        p("client").path(),
        p("client").ip,
        p("server").path(),
        p("server").ip,
        p("outside").path(),
        p("outside").ip,
    )
}

/// A TCP echo server on `port` in the pod.
async fn echo(netns: &Netns, port: u16) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = netns
        .bind(format!("0.0.0.0:{port}").parse().unwrap())
        .await
        .unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
}

/// Retries `curl` until its output starts with `want`, up to a deadline.
async fn until(m: &Mesh, from: &str, args: &[&'static str], want: &str) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let out = m.curl(from, args).await;
        if out.starts_with(want) || std::time::Instant::now() > deadline {
            return out;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_planes_policy_applies_to_running_pods_keeps_probes_and_ends_denied_connections(
) {
    let t = Topology::new(&["client", "server", "outside"]);
    let cp = ControlPlane::start(&annotated_cluster(&t, "deny"), &["node-a", "node-b"]).await;
    // The proxies start with the permissive default; the control plane's policy replaces it.
    let a = NodeProxy::start(&cp, "node-a").await;
    let b = NodeProxy::start(&cp, "node-b").await;
    let server = Netns::open(Path::new(&t.pod("server").path())).unwrap();
    app(&server).await;
    echo(&server, 7000).await;
    std::mem::forget(server);
    let m = Mesh { t, cp, a, b };

    // The namespace's `deny` arrives: meshed and plaintext requests are refused...
    let out = until(&m, "client", &[], "HTTP/1.1 403").await;
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    let out = m.curl("outside", &[]).await;
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    // ... but the kubelet's probe (a plaintext GET of the pod's readiness path) passes.
    let pod = m.t.pod("outside").clone();
    let url = format!("http://{}:8080/healthz", m.t.pod("server").ip);
    let out = tokio::task::spawn_blocking(move || curl(&pod, &[&url]))
        .await
        .unwrap();
    assert!(
        out.starts_with("HTTP/1.1 200") && out.contains("hello"),
        "{out}"
    );
    let metrics = m.b.metrics().await;
    assert!(
        metric_sum(
            &metrics,
            "inbound_http_authz_allow_total",
            &["authz_kind=\"probe\""]
        ) >= 1,
        "{metrics}"
    );
    assert!(
        metric_sum(
            &metrics,
            "inbound_http_authz_deny_total",
            &["srv_name=\"deny\""]
        ) >= 2,
        "{metrics}"
    );

    // The annotation changes on the running namespace: the pods' policy follows.
    m.cp.set_cluster(&annotated_cluster(&m.t, "all-unauthenticated"));
    let out = until(&m, "client", &[], "HTTP/1.1 200").await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");

    // An open opaque connection is ended when a change denies it.
    let pod = m.t.pod("outside").clone();
    let server_ip = m.t.pod("server").ip;
    let held = tokio::task::spawn_blocking(move || {
        let script = format!(
            "exec 3<>/dev/tcp/{server_ip}/7000 && printf 'still-open\\n' >&3 && timeout 60 cat <&3; echo \"exit=$?\""
        );
        let out = Command::new("ip")
            .args(["netns", "exec", &pod.name, "bash", "-c", &script])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    });
    // Wait until the connection is established and counted as allowed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while metric_sum(
        &m.b.metrics().await,
        "inbound_tcp_authz_allow_total",
        &["target_port=\"7000\""],
    ) == 0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the echo connection never opened"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    m.cp.set_cluster(&annotated_cluster(&m.t, "all-authenticated"));
    let out = held.await.unwrap();
    assert!(out.contains("still-open"), "{out}");
    // cat saw the connection end (exit 0), not its own 60 s timeout (exit 124).
    assert!(out.contains("exit=0"), "{out}");
    let metrics = m.b.metrics().await;
    assert!(
        metric_sum(
            &metrics,
            "inbound_tcp_authz_terminate_total",
            &["target_port=\"7000\""]
        ) >= 1,
        "{metrics}"
    );
    m.stop().await;
}

#[tokio::test]
async fn the_policy_stream_is_node_scoped() {
    use ambit_api::proto::policy::inbound_policy_client::InboundPolicyClient;
    use ambit_api::proto::policy::WatchRequest;
    let t = Topology::new(&["client", "server", "outside"]);
    let cp = ControlPlane::start(&annotated_cluster(&t, "deny"), &["node-a", "node-b"]).await;
    let mut client = InboundPolicyClient::new(cp.channel(&cp.policy_url()));
    let watch = |node: &str, token: &str| {
        let mut req = tonic::Request::new(WatchRequest { node: node.into() });
        req.metadata_mut().insert(
            "authorization",
            format!("Bearer {}", ambit_e2e::node_token(token))
                .parse()
                .unwrap(),
        );
        req
    };
    // Another node's name with this node's token: refused, and counted.
    let s = client.watch(watch("node-b", "node-a")).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::PermissionDenied);
    assert!(s.message().contains("belongs to node node-a"), "{s:?}");
    let s = client
        .watch(WatchRequest {
            node: "node-a".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), tonic::Code::Unauthenticated);
    // Its own: a snapshot of its own meshed pods only (the unmeshed `outside` is on node-a
    // too), with the namespace's policy and the pod's own override.
    let mut stream = client
        .watch(watch("node-a", "node-a"))
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert!(first.snapshot && !first.more, "{first:?}");
    let pods: Vec<(&str, &str)> = first
        .pods
        .iter()
        .map(|p| (p.pod.as_str(), p.default.as_ref().unwrap().name.as_str()))
        .collect();
    assert_eq!(pods, [("shop/client", "all-unauthenticated")]);
    let mut stream = client
        .watch(watch("node-b", "node-b"))
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.pods.len(), 1);
    let server = &first.pods[0];
    assert_eq!(server.pod, "shop/server");
    assert_eq!(server.default.as_ref().unwrap().name, "deny");
    assert_eq!(server.ports.len(), 1);
    assert_eq!(
        (server.ports[0].port, server.ports[0].probe_paths.clone()),
        (8080, vec!["/healthz".to_string()])
    );
    assert!(cp
        .metrics()
        .await
        .contains("policy_watches_refused_total 2"));
    cp.stop().await;
    drop(t);
}

/// The server pod (labelled `app: server`, container port `http` 8080, echo on 7000)
/// behind a Server for `http` whose accessPolicy is `access`, and the policy `objects`
/// (YAML documents) beside it; a second meshed client `other` with its own
/// ServiceAccount. The namespace's default stays all-unauthenticated.
fn policy_cluster(t: &Topology, access: &str, objects: &str) -> String {
    let p = |name: &str| t.pod(name);
    format!(
        "{NAMESPACES}---
apiVersion: v1
kind: Pod
metadata: {{name: client, namespace: shop, annotations: {{local.ambit.dev/netns: {}}}}}
spec: {{nodeName: node-a, serviceAccountName: client, containers: []}}
status: {{podIP: {}, phase: Running}}
---
apiVersion: v1
kind: Pod
metadata: {{name: other, namespace: shop, annotations: {{local.ambit.dev/netns: {}}}}}
spec: {{nodeName: node-a, serviceAccountName: other, containers: []}}
status: {{podIP: {}, phase: Running}}
---
apiVersion: v1
kind: Pod
metadata: {{name: outside, namespace: shop, annotations: {{local.ambit.dev/netns: {}, ambit.dev/mesh: disabled}}}}
spec: {{nodeName: node-a, serviceAccountName: outside, containers: []}}
status: {{podIP: {}, phase: Running}}
---
apiVersion: v1
kind: Pod
metadata: {{name: server, namespace: shop, labels: {{app: server}}, annotations: {{local.ambit.dev/netns: {}}}}}
spec:
  nodeName: node-b
  serviceAccountName: server
  containers:
  - name: app
    ports: [{{name: http, containerPort: 8080}}, {{name: echo, containerPort: 7000}}]
status: {{podIP: {}, phase: Running}}
---
apiVersion: policy.ambit.dev/v1alpha1
kind: Server
metadata: {{name: web, namespace: shop}}
spec: {{podSelector: {{matchLabels: {{app: server}}}}, port: http, proxyProtocol: HTTP/1, accessPolicy: {access}}}
{objects}",
        p("client").path(),
        p("client").ip,
        p("other").path(),
        p("other").ip,
        p("outside").path(),
        p("outside").ip,
        p("server").path(),
        p("server").ip,
    )
}

/// The NetworkAuthentication `subnet`: the pods' subnet except `ip`.
fn subnet_except(ip: std::net::Ipv4Addr) -> String {
    format!(
        "---
apiVersion: policy.ambit.dev/v1alpha1
kind: NetworkAuthentication
metadata: {{name: subnet, namespace: shop}}
spec: {{networks: [{{cidr: 10.77.0.0/24, except: ['{ip}/32']}}]}}
"
    )
}

/// An AuthorizationPolicy `name` on the Server `web` requiring `refs` (kind/name pairs).
fn authorization(name: &str, refs: &[(&str, &str)]) -> String {
    let refs: Vec<String> = refs
        .iter()
        .map(|(kind, n)| format!("{{group: policy.ambit.dev, kind: {kind}, name: {n}}}"))
        .collect();
    format!(
        "---
apiVersion: policy.ambit.dev/v1alpha1
kind: AuthorizationPolicy
metadata: {{name: {name}, namespace: shop}}
spec:
  targetRef: {{group: policy.ambit.dev, kind: Server, name: web}}
  requiredAuthenticationRefs: [{}]
",
        refs.join(", ")
    )
}

/// The HTTP status line's code of curl's output ("000" when there is none).
fn status(out: &str) -> &str {
    out.split_whitespace()
        .nth(1)
        .filter(|_| out.starts_with("HTTP/"))
        .unwrap_or("000")
}

/// Retries until each client in `want` gets its status from the server's `http` port,
/// up to a deadline (a change takes a moment to reach the proxy); returns what each got.
async fn until_all(m: &Mesh, want: &[(&str, &str)]) -> Vec<(String, String)> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let mut got = Vec::new();
        for (from, _) in want {
            let out = m.curl(from, &[]).await;
            got.push((from.to_string(), out));
        }
        let ok = got
            .iter()
            .zip(want)
            .all(|((_, out), (_, code))| status(out) == *code);
        if ok || std::time::Instant::now() > deadline {
            return got;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// As [`until_all`], for (client, path, status) triples.
async fn until_paths(m: &Mesh, want: &[(&str, &str, &str)]) -> Vec<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let mut got = Vec::new();
        for (from, path, _) in want {
            got.push(m.curl_path(from, path, &[]).await);
        }
        let ok = got
            .iter()
            .zip(want)
            .all(|(out, (_, _, code))| status(out) == *code);
        if ok || std::time::Instant::now() > deadline {
            for (out, (from, path, code)) in got.iter().zip(want) {
                assert_eq!(status(out), *code, "{from} {path}: {out}");
            }
            return got;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

fn assert_statuses(got: &[(String, String)], want: &[(&str, &str)]) {
    for ((from, out), (_, code)) in got.iter().zip(want) {
        assert_eq!(status(out), *code, "{from}: {out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_and_authorization_policies_allow_named_identities_and_networks_only() {
    let t = Topology::new(&["client", "other", "outside", "server"]);
    let clients = "---
apiVersion: policy.ambit.dev/v1alpha1
kind: MeshTLSAuthentication
metadata: {name: clients, namespace: shop}
spec: {identities: ['spiffe://cluster.local/ns/shop/sa/client']}
";
    let yaml = policy_cluster(
        &t,
        "deny",
        &format!(
            "{clients}{}",
            authorization("client-only", &[("MeshTLSAuthentication", "clients")])
        ),
    );
    let cp = ControlPlane::start(&yaml, &["node-a", "node-b"]).await;
    let a = NodeProxy::start(&cp, "node-a").await;
    let b = NodeProxy::start(&cp, "node-b").await;
    let server = Netns::open(Path::new(&t.pod("server").path())).unwrap();
    app(&server).await;
    echo(&server, 7000).await;
    std::mem::forget(server);
    let m = Mesh { t, cp, a, b };

    // The Server's port admits the identity its AuthorizationPolicy names, and no one
    // else: not another meshed client, not a plaintext one (the Server's accessPolicy is
    // deny).
    let want = [("client", "200"), ("other", "403"), ("outside", "403")];
    assert_statuses(&until_all(&m, &want).await, &want);
    // A port no Server selects keeps the namespace's default (all-unauthenticated).
    let out = m.raw_to("outside", 7000, 2).await;
    assert!(out.contains("binary"), "{out}");
    let metrics = m.b.metrics().await;
    let srv = [
        "srv_kind=\"server\"",
        "srv_name=\"web\"",
        "pod=\"server\",destination_workload_namespace=\"shop\",destination_workload=\"server\",destination_workload_kind=\"Pod\"",
    ];
    let allowed = metric_sum(
        &metrics,
        "inbound_http_authz_allow_total",
        &[
            &srv[..],
            &[
                "authz_kind=\"authorizationpolicy\"",
                "authz_name=\"client-only\"",
            ],
        ]
        .concat(),
    );
    assert!(allowed >= 1, "{metrics}");
    assert!(
        metric_sum(&metrics, "inbound_http_authz_deny_total", &srv) >= 2,
        "{metrics}"
    );

    // A NetworkAuthentication for the pods' subnet except `other`: the plaintext client
    // is admitted by its address, `other` stays out (its address is excepted, its
    // identity not named).
    let subnet = subnet_except(m.t.pod("other").ip);
    m.cp.set_cluster(&policy_cluster(
        &m.t,
        "deny",
        &format!(
            "{clients}{}{subnet}{}",
            authorization("client-only", &[("MeshTLSAuthentication", "clients")]),
            authorization("from-subnet", &[("NetworkAuthentication", "subnet")]),
        ),
    ));
    let want = [("client", "200"), ("other", "403"), ("outside", "200")];
    assert_statuses(&until_all(&m, &want).await, &want);
    // (Plaintext is judged per connection: a TCP decision. A connection accepted just
    // before the change was denied then, and its requests are judged again one by one —
    // so one more, on a connection accepted under the new policy.)
    assert_eq!(status(&m.curl("outside", &[]).await), "200");
    let metrics = m.b.metrics().await;
    assert!(
        metric_sum(
            &metrics,
            "inbound_tcp_authz_allow_total",
            &["authz_name=\"from-subnet\""]
        ) >= 1,
        "{metrics}"
    );

    // Both requirements in one policy must both match: the client's identity from an
    // address outside the NetworkAuthentication is refused.
    let not_client = subnet_except(m.t.pod("client").ip);
    m.cp.set_cluster(&policy_cluster(
        &m.t,
        "deny",
        &format!(
            "{clients}{not_client}{}",
            authorization(
                "client-from-subnet",
                &[
                    ("MeshTLSAuthentication", "clients"),
                    ("NetworkAuthentication", "subnet")
                ]
            ),
        ),
    ));
    let want = [("client", "403"), ("other", "403"), ("outside", "403")];
    assert_statuses(&until_all(&m, &want).await, &want);

    // A trailing-`*` SPIFFE prefix names every ServiceAccount of the namespace, and an
    // audit Server lets the rest through, counted as audit.
    let everyone = "---
apiVersion: policy.ambit.dev/v1alpha1
kind: MeshTLSAuthentication
metadata: {name: clients, namespace: shop}
spec: {identities: ['spiffe://cluster.local/ns/shop/*']}
";
    m.cp.set_cluster(&policy_cluster(
        &m.t,
        "audit",
        &format!(
            "{everyone}{}",
            authorization("shop", &[("MeshTLSAuthentication", "clients")])
        ),
    ));
    let want = [("client", "200"), ("other", "200"), ("outside", "200")];
    // `outside` passes under deny too once audit applies; wait for the meshed one that
    // changed.
    assert_statuses(&until_all(&m, &want).await, &want);
    let metrics = m.b.metrics().await;
    assert!(
        metric_sum(
            &metrics,
            "inbound_http_authz_allow_total",
            &["authz_name=\"shop\""]
        ) >= 2,
        "{metrics}"
    );
    assert!(
        metric_sum(
            &metrics,
            "inbound_tcp_authz_allow_total",
            &["authz_kind=\"audit\"", "srv_name=\"web\""]
        ) >= 1,
        "{metrics}"
    );
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_of_a_server_authorize_per_route_and_unmatched_requests_get_404() {
    let t = Topology::new(&["client", "other", "outside", "server"]);
    // The Server admits `client` everywhere; its HTTPRoute `admin` admits `other` too; a
    // path no route of the Server matches is 404.
    let objects = "---
apiVersion: policy.ambit.dev/v1alpha1
kind: MeshTLSAuthentication
metadata: {name: clients, namespace: shop}
spec: {identities: ['spiffe://cluster.local/ns/shop/sa/client']}
---
apiVersion: policy.ambit.dev/v1alpha1
kind: MeshTLSAuthentication
metadata: {name: others, namespace: shop}
spec: {identities: ['spiffe://cluster.local/ns/shop/sa/other']}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: admin, namespace: shop}
spec:
  parentRefs: [{group: policy.ambit.dev, kind: Server, name: web}]
  rules: [{matches: [{path: {type: PathPrefix, value: /admin}}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: public, namespace: shop}
spec:
  parentRefs: [{group: policy.ambit.dev, kind: Server, name: web}]
  rules: [{matches: [{path: {type: PathPrefix, value: /public}}]}]
---
apiVersion: policy.ambit.dev/v1alpha1
kind: AuthorizationPolicy
metadata: {name: other-admin, namespace: shop}
spec:
  targetRef: {group: gateway.networking.k8s.io, kind: HTTPRoute, name: admin}
  requiredAuthenticationRefs: [{group: policy.ambit.dev, kind: MeshTLSAuthentication, name: others}]
";
    let yaml = policy_cluster(
        &t,
        "deny",
        &format!(
            "{objects}{}",
            authorization("client-only", &[("MeshTLSAuthentication", "clients")])
        ),
    );
    let cp = ControlPlane::start(&yaml, &["node-a", "node-b"]).await;
    let a = NodeProxy::start(&cp, "node-a").await;
    let b = NodeProxy::start(&cp, "node-b").await;
    let server = Netns::open(Path::new(&t.pod("server").path())).unwrap();
    app(&server).await;
    std::mem::forget(server);
    let m = Mesh { t, cp, a, b };
    let got = until_paths(
        &m,
        &[
            ("other", "/admin/users", "200"),
            ("other", "/public", "403"),
            ("client", "/public", "200"),
            ("client", "/admin", "200"),
            ("client", "/orders", "404"),
            // Plaintext: the admin route wants an identity.
            ("outside", "/admin", "403"),
        ],
    )
    .await;
    // The 404 says why to a meshed client.
    assert!(got[4].contains("ambit-proxy-error: no route"), "{}", got[4]);
    let metrics = m.b.metrics().await;
    assert!(
        metric_sum(
            &metrics,
            "inbound_http_authz_allow_total",
            &[
                "authz_name=\"other-admin\"",
                "route_kind=\"HTTPRoute\"",
                "route_name=\"admin\""
            ]
        ) >= 1,
        "{metrics}"
    );
    assert!(
        metric_sum(
            &metrics,
            "inbound_http_authz_deny_total",
            &["route_name=\"public\""]
        ) >= 1,
        "{metrics}"
    );
    m.stop().await;
}
