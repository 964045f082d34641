//! HTTP and gRPC through the mesh with real clients (curl, a tonic gRPC client), in network
//! namespaces: HTTP/1 rides the tunnel as HTTP/2 and arrives as HTTP/1; gRPC streams and
//! trailers pass; metrics count requests with their labels; bad requests get precise errors.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure

use ambit_api::proto::discovery::discovery_server::{Discovery, DiscoveryServer};
use ambit_api::proto::discovery::{Update, WatchRequest};
use ambit_e2e::netns::{PodNet, Topology};
use ambit_e2e::{ControlPlane, NodeProxy, NAMESPACES};
use ambit_proxy::netns::Netns;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn cluster(t: &Topology) -> String {
    let (client, server) = (t.pod("client"), t.pod("server"));
    format!(
        r#"{NAMESPACES}---
apiVersion: v1
kind: Pod
metadata: {{name: client-5d4f8-x2, namespace: shop, annotations: {{local.ambit.dev/netns: {}}}, labels: {{pod-template-hash: 5d4f8}},
  ownerReferences: [{{apiVersion: apps/v1, kind: ReplicaSet, name: client-5d4f8, uid: u1, controller: true}}]}}
spec: {{nodeName: node-a, serviceAccountName: client, containers: []}}
status: {{podIP: {}, phase: Running}}
---
apiVersion: v1
kind: Pod
metadata: {{name: server, namespace: shop, annotations: {{local.ambit.dev/netns: {}}},
  ownerReferences: [{{apiVersion: apps/v1, kind: StatefulSet, name: web-db, uid: u2, controller: true}}]}}
spec: {{nodeName: node-b, serviceAccountName: server, containers: []}}
status: {{podIP: {}, phase: Running}}
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: shop}}
spec: {{clusterIP: 10.96.0.8, ports: [{{name: http, port: 80}}, {{name: grpc, port: 9090}}, {{name: closed, port: 81}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: web-1, namespace: shop, labels: {{kubernetes.io/service-name: web}}}}
addressType: IPv4
ports: [{{name: http, port: 8080}}, {{name: grpc, port: 9090}}, {{name: closed, port: 8081}}]
endpoints: [{{addresses: [{}], targetRef: {{kind: Pod, name: server, namespace: shop}}}}]
---
apiVersion: v1
kind: Service
metadata: {{name: empty, namespace: shop}}
spec: {{clusterIP: 10.96.0.9, ports: [{{name: http, port: 80}}]}}
"#,
        client.path(),
        client.ip,
        server.path(),
        server.ip,
        server.ip
    )
}

/// An HTTP server in the pod that answers with what it received, and accepts an
/// `Upgrade: echo` by switching to echoing raw bytes.
async fn http_app(netns: &Netns) {
    let listener = netns.bind("0.0.0.0:8080".parse().unwrap()).await.unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    |mut req: http::Request<hyper::body::Incoming>| async move {
                        if req.headers().get("upgrade").is_some_and(|u| u == "echo") {
                            let on = hyper::upgrade::on(&mut req);
                            tokio::spawn(async move {
                                let mut io = hyper_util::rt::TokioIo::new(on.await.unwrap());
                                let mut buf = [0u8; 1024];
                                loop {
                                    let n = io.read(&mut buf).await.unwrap_or(0);
                                    if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                                        break;
                                    }
                                }
                            });
                            let resp = http::Response::builder()
                                .status(101)
                                .header("connection", "upgrade")
                                .header("upgrade", "echo")
                                .body(http_body_util::Full::new(bytes::Bytes::new()))
                                .unwrap();
                            return Ok::<_, std::convert::Infallible>(resp);
                        }
                        let host = req
                            .headers()
                            .get("host")
                            .and_then(|h| h.to_str().ok())
                            .unwrap_or("-")
                            .to_string();
                        let leaked = req
                            .headers()
                            .keys()
                            .any(|k| k.as_str().starts_with("ambit-"));
                        let body = format!(
                            "{} {} {:?} host={host} leaked={leaked}\n",
                            req.method(),
                            req.uri(),
                            req.version()
                        );
                        Ok(http::Response::new(http_body_util::Full::new(
                            bytes::Bytes::from(body),
                        )))
                    },
                );
                let io = hyper_util::rt::TokioIo::new(s);
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection_with_upgrades(io, svc)
                .await;
            });
        }
    });
}

/// A gRPC bidirectional-streaming service: reads the first request, answers three
/// updates, then a PermissionDenied status.
struct Streamer;

#[tonic::async_trait]
impl Discovery for Streamer {
    type WatchStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<Update, tonic::Status>> + Send>>;
    async fn watch(
        &self,
        req: tonic::Request<tonic::Streaming<WatchRequest>>,
    ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
        let node = req
            .into_inner()
            .message()
            .await?
            .map(|r| r.node)
            .unwrap_or_default();
        let mut items: Vec<Result<Update, tonic::Status>> = (0..3)
            .map(|i| {
                Ok(Update {
                    removed_workloads: vec![format!("{node}-{i}")],
                    ..Default::default()
                })
            })
            .collect();
        items.push(Err(tonic::Status::permission_denied("the end")));
        Ok(tonic::Response::new(Box::pin(tokio_stream::iter(items))))
    }
}

async fn grpc_app(netns: &Netns) {
    let listener = netns.bind("0.0.0.0:9090".parse().unwrap()).await.unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(DiscoveryServer::new(Streamer))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
}

fn curl(pod: &PodNet, args: &[&str]) -> String {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &pod.name,
            "curl",
            "-sS",
            "--max-time",
            "20",
            "-D",
            "-",
        ])
        .args(args)
        .output()
        .expect("curl must be installed");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn metric<'a>(metrics: &'a str, name: &str, labels: &[&str]) -> Option<&'a str> {
    metrics
        .lines()
        .find(|l| l.starts_with(name) && labels.iter().all(|w| l.contains(w)))
}

struct Mesh {
    t: Topology,
    cp: ControlPlane,
    a: NodeProxy,
    b: NodeProxy,
    client: Arc<Netns>,
}

async fn mesh() -> Mesh {
    let t = Topology::new(&["client", "server"]);
    let cp = ControlPlane::start(&cluster(&t), &["node-a", "node-b"]).await;
    let (a, b) = (
        NodeProxy::start(&cp, "node-a").await,
        NodeProxy::start(&cp, "node-b").await,
    );
    let server = Netns::open(Path::new(&t.pod("server").path())).unwrap();
    http_app(&server).await;
    grpc_app(&server).await;
    std::mem::forget(server); // its thread ends with the process; the apps hold their sockets
    let client = Arc::new(Netns::open(Path::new(&t.pod("client").path())).unwrap());
    Mesh {
        t,
        cp,
        a,
        b,
        client,
    }
}

impl Mesh {
    async fn stop(self) {
        self.a.stop().await;
        self.b.stop().await;
        self.cp.stop().await;
        drop(self.t);
    }
}

/// A keep-alive HTTP connection's bytes count while it is open (as Linkerd's do), not
/// only when it closes: a connection that lives for hours shows its traffic as it goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_connection_counts_its_bytes_while_it_is_open() {
    let m = mesh().await;
    let mut s = m
        .client
        .connect("10.96.0.8:80".parse().unwrap(), 0)
        .await
        .unwrap();
    let request = b"GET /hello HTTP/1.1\r\nHost: web\r\n\r\n";
    let http_conn = ["direction=\"outbound\"", "dst_service=\"web\""];
    let value = |ma: &str, name: &str| -> u64 {
        metric(ma, name, &http_conn)
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("{name}: {ma}"))
    };
    let mut read_before = 0;
    for round in 1..=2u64 {
        s.write_all(request).await.unwrap();
        let response = read_response(&mut s).await;
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        let ma = m.a.metrics().await;
        assert_eq!(value(&ma, "tcp_open_connections"), 1, "{ma}");
        let read = value(&ma, "tcp_read_bytes_total");
        assert!(
            read >= round * request.len() as u64 && read > read_before,
            "round {round}: {read} bytes read, {read_before} before: {ma}"
        );
        read_before = read;
        // The first response has been written by the time the second request is read.
        if round == 2 {
            assert!(value(&ma, "tcp_write_bytes_total") > 0, "{ma}");
        }
    }
    drop(s);
    m.stop().await;
}

/// One HTTP/1.1 response with a `content-length`, read from `s`.
async fn read_response(s: &mut tokio::net::TcpStream) -> String {
    let mut got = Vec::new();
    let mut b = [0u8; 1024];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut b))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&b[..n]);
        let text = String::from_utf8_lossy(&got).to_string();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .expect("a content-length");
            if body.len() >= len {
                return text;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_over_http1_and_http2_through_the_mesh() {
    let m = mesh().await;
    let client = m.t.pod("client").clone();
    let out = tokio::task::spawn_blocking(move || curl(&client, &["http://10.96.0.8/hello?x=1"]))
        .await
        .unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(
        out.contains("GET /hello?x=1 HTTP/1.1 host=10.96.0.8 leaked=false"),
        "HTTP/1 restored at the destination: {out}"
    );

    let client = m.t.pod("client").clone();
    let out = tokio::task::spawn_blocking(move || {
        curl(&client, &["--http2-prior-knowledge", "http://10.96.0.8/h2"])
    })
    .await
    .unwrap();
    assert!(out.starts_with("HTTP/2 200"), "{out}");
    assert!(out.contains("GET http://10.96.0.8/h2 HTTP/2.0"), "{out}");

    // An HTTP/1.1 upgrade (as WebSocket uses) switches the connection to raw bytes.
    let mut s = m
        .client
        .connect("10.96.0.8:80".parse().unwrap(), 0)
        .await
        .unwrap();
    s.write_all(b"GET /ws HTTP/1.1\r\nHost: web\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
        .await
        .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut b))
            .await
            .unwrap()
            .unwrap();
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    for msg in [&b"ping"[..], b"a longer frame of raw bytes"] {
        s.write_all(msg).await.unwrap();
        let mut back = vec![0u8; msg.len()];
        tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut back))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(back, msg);
    }
    drop(s);

    let ma = m.a.metrics().await;
    let out_req = metric(
        &ma,
        "request_total",
        &[
            "direction=\"outbound\"",
            // Linkerd's names: the client by its Deployment, the endpoint and its
            // workload; then ztunnel's, which a scrape cannot rename.
            "namespace=\"shop\",pod=\"client-5d4f8-x2\",deployment=\"client\"",
            "server_id=\"spiffe://cluster.local/ns/shop/sa/server\"",
            "dst_namespace=\"shop\",dst_service=\"web\",dst_pod=\"server\",dst_statefulset=\"web-db\"",
            "tls=\"true\"",
            "source_workload_namespace=\"shop\",source_workload=\"client\",source_workload_kind=\"Deployment\"",
            "destination_workload_namespace=\"shop\",destination_workload=\"web-db\",destination_workload_kind=\"StatefulSet\"",
            "destination_service_namespace=\"shop\",destination_service_name=\"web\"",
        ],
    );
    assert!(out_req.is_some_and(|l| l.ends_with(" 3")), "{ma}");
    // The HTTP connections count in the TCP metrics as any connection does.
    let http_conn = ["direction=\"outbound\"", "dst_service=\"web\""];
    let opened = metric(&ma, "tcp_close_total", &http_conn);
    assert!(opened.is_some_and(|l| !l.ends_with(" 0")), "{ma}");
    let read = metric(&ma, "tcp_read_bytes_total", &http_conn)
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok());
    assert!(read.is_some_and(|n| n > 100), "the requests' bytes: {ma}");
    assert!(
        metric(
            &ma,
            "response_total",
            &[
                "direction=\"outbound\"",
                "status_code=\"200\"",
                "classification=\"success\""
            ]
        )
        .is_some_and(|l| l.ends_with(" 2")),
        "{ma}"
    );
    assert!(
        metric(
            &ma,
            "response_latency_ms_count",
            &["direction=\"outbound\"", "dst_service=\"web\""]
        )
        .is_some(),
        "{ma}"
    );
    assert!(
        metric(
            &ma,
            "response_total",
            &["direction=\"outbound\"", "status_code=\"101\""]
        )
        .is_some(),
        "{ma}"
    );
    let mb = m.b.metrics().await;
    assert!(
        metric(
            &mb,
            "request_total",
            &[
                "direction=\"inbound\"",
                "pod=\"server\",statefulset=\"web-db\"",
                "client_id=\"spiffe://cluster.local/ns/shop/sa/client\"",
                "destination_workload=\"web-db\",destination_workload_kind=\"StatefulSet\"",
                "source_workload_namespace=\"shop\",source_principal=\"spiffe://cluster.local/ns/shop/sa/client\""
            ]
        )
        .is_some_and(|l| l.ends_with(" 2")),
        "{mb}"
    );
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_streaming_and_status_in_trailers_pass_through() {
    let m = mesh().await;
    let netns = m.client.clone();
    let channel = tonic::transport::Endpoint::from_static("http://10.96.0.8:9090")
        .connect_with_connector(tower::service_fn(move |uri: http::Uri| {
            let netns = netns.clone();
            async move {
                let addr: SocketAddr =
                    format!("{}:{}", uri.host().unwrap(), uri.port_u16().unwrap())
                        .parse()
                        .unwrap();
                // An unmodified application socket: no mark, so nftables redirects it.
                let s = netns.connect(addr, 0).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        }))
        .await
        .unwrap();
    let mut client = ambit_api::proto::discovery::discovery_client::DiscoveryClient::new(channel);
    let mut stream = client
        .watch(tokio_stream::once(WatchRequest {
            node: "n".into(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    let mut got = Vec::new();
    let end = loop {
        match stream.message().await {
            Ok(Some(u)) => got.push(u.removed_workloads[0].clone()),
            Ok(None) => panic!("stream ended without the status"),
            Err(s) => break s,
        }
    };
    assert_eq!(got, ["n-0", "n-1", "n-2"]);
    assert_eq!(end.code(), tonic::Code::PermissionDenied);
    assert_eq!(end.message(), "the end");
    let ma = m.a.metrics().await;
    assert!(
        metric(
            &ma,
            "response_total",
            &[
                "direction=\"outbound\"",
                "grpc_status=\"7\"",
                "classification=\"failure\""
            ]
        )
        .is_some(),
        "{ma}"
    );
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_and_failing_endpoints_get_precise_errors() {
    let m = mesh().await;
    // The endpoint refuses (nothing listens on 8081): 502 naming the cause.
    let client = m.t.pod("client").clone();
    let out = tokio::task::spawn_blocking(move || curl(&client, &["http://10.96.0.8:81/"]))
        .await
        .unwrap();
    assert!(out.starts_with("HTTP/1.1 502"), "{out}");
    assert!(
        out.to_lowercase().contains("ambit-proxy-error:") && out.contains("Connection refused"),
        "{out}"
    );

    // A Service without ready endpoints: 503.
    let client = m.t.pod("client").clone();
    let out = tokio::task::spawn_blocking(move || curl(&client, &["http://10.96.0.9/"]))
        .await
        .unwrap();
    assert!(out.starts_with("HTTP/1.1 503"), "{out}");
    assert!(
        out.contains("no ready endpoints for Service shop/empty"),
        "{out}"
    );

    // Malformed HTTP/1 from the application: 400 from the proxy, nothing forwarded.
    let mut s = m
        .client
        .connect("10.96.0.8:80".parse().unwrap(), 0)
        .await
        .unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nthis is not a header\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&buf).starts_with("HTTP/1.1 400"),
        "{}",
        String::from_utf8_lossy(&buf)
    );

    // Oversized headers: 431.
    let mut s = m
        .client
        .connect("10.96.0.8:80".parse().unwrap(), 0)
        .await
        .unwrap();
    let big = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(100 * 1024)
    );
    let _ = s.write_all(big.as_bytes()).await;
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf))
        .await
        .unwrap();
    assert!(
        String::from_utf8_lossy(&buf).starts_with("HTTP/1.1 431"),
        "{}",
        String::from_utf8_lossy(&buf)
    );

    // A client that sends half a request head and stalls (slowloris) is cut off once the
    // header read timeout (10 s) passes, instead of holding the connection forever.
    let mut s = m
        .client
        .connect("10.96.0.8:80".parse().unwrap(), 0)
        .await
        .unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let mut buf = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut buf)).await;
    assert!(closed.is_ok(), "a stalled request head kept its connection");

    // After all that, the proxy still serves.
    let client = m.t.pod("client").clone();
    let out = tokio::task::spawn_blocking(move || curl(&client, &["http://10.96.0.8/ok"]))
        .await
        .unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let ma = m.a.metrics().await;
    assert!(
        metric(
            &ma,
            "response_total",
            &[
                "direction=\"outbound\"",
                "status_code=\"502\"",
                "classification=\"failure\""
            ]
        )
        .is_some(),
        "{ma}"
    );
    m.stop().await;
}
