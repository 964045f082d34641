//! Harness for Ambit's end-to-end tests: a real `ambit-control` on loopback with the local
//! backend, fed from a temporary directory of Kubernetes YAML.
//!
//! # Layout
//!
//! - [`ControlPlane`]: PKI, cluster directory, node tokens, and the running control plane.
//! - [`http_get`]: a minimal HTTP/1.1 GET for the admin endpoints.
//! - [`cni`]: a CNI runtime's side: nodes, their CNI directories, pods wired by the real
//!   plugins chained with `ambit-cni`.
//! - [`images`]: the chart's images run as the chart runs them (podman).
//! - [`netns`]: pods as network namespaces on a bridge, removed on drop; redirect rules.
//! - [`policy`]: the policy stream read as a node proxy reads it, and its rules compared.

#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod binary;
pub mod cni;
pub mod discovery;
pub mod echo;
pub mod images;
pub mod kube;
pub mod load;
pub mod netns;
pub mod policy;
pub mod sockmap;
pub mod testapp;

use ambit_control::config::Config;
use ambit_control::pki::generate::{issuer, trust_anchor, CaMaterial, Validity};
use ambit_control::{Control, Listeners};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The Namespaces the tests use, as the first documents of a cluster's YAML: `shop`,
/// meshed by its annotation, and `legacy`, not meshed.
pub const NAMESPACES: &str = "apiVersion: v1
kind: Namespace
metadata: {name: shop, annotations: {ambit.dev/mesh: enabled}}
---
apiVersion: v1
kind: Namespace
metadata: {name: legacy}
";

/// Token of each test node, as the proxy would read it from its ServiceAccount.
pub fn node_token(node: &str) -> String {
    format!("token-for-{node}-0123456789")
}

/// A fresh ECDSA P-256 CSR, as a node proxy sends for a workload.
pub fn csr() -> Vec<u8> {
    let key = rcgen::KeyPair::generate().unwrap();
    rcgen::CertificateParams::default()
        .serialize_request(&key)
        .unwrap()
        .der()
        .to_vec()
}

/// Asks `cp`'s identity service for a certificate of `ns/sa`, with `token` as the node
/// credential (none: no `authorization` header).
pub async fn raw_certify(
    cp: &ControlPlane,
    token: Option<&str>,
    ns: &str,
    sa: &str,
    csr_der: Vec<u8>,
) -> Result<ambit_api::proto::identity::CertifyResponse, tonic::Status> {
    use ambit_api::proto::identity::identity_client::IdentityClient;
    let mut client = IdentityClient::new(cp.channel(&cp.identity_url()));
    let mut req = tonic::Request::new(ambit_api::proto::identity::CertifyRequest {
        namespace: ns.into(),
        service_account: sa.into(),
        csr_der,
    });
    if let Some(t) = token {
        req.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    client.certify(req).await.map(tonic::Response::into_inner)
}

/// A path as a command-line argument.
fn path_arg(p: &std::path::Path) -> String {
    p.to_string_lossy().into_owned()
}

/// A fresh trust anchor and issuer for `cluster.local`.
pub fn test_pki() -> (CaMaterial, CaMaterial) {
    let root = trust_anchor(
        "cluster.local",
        Validity::starting_now(Duration::from_secs(86400 * 3650)),
    )
    .unwrap();
    let iss = issuer(
        &root,
        "cluster.local",
        Validity::starting_now(Duration::from_secs(86400 * 365)),
    )
    .unwrap();
    (root, iss)
}

/// A control plane running on loopback ports.
#[derive(Debug)]
pub struct ControlPlane {
    /// Holds PKI, cluster YAML and tokens.
    pub dir: tempfile::TempDir,
    /// The trust anchor.
    pub root: CaMaterial,
    /// The issuer.
    pub issuer: CaMaterial,
    /// Identity gRPC address.
    pub identity_addr: SocketAddr,
    /// Discovery gRPC address.
    pub discovery_addr: SocketAddr,
    /// The policy service's address.
    pub policy_addr: SocketAddr,
    /// Admin address.
    pub admin_addr: SocketAddr,
    /// The control plane's index, to change the cluster without a backend (benchmarks).
    pub index: ambit_control::index::SharedIndex,
    /// The command line it runs with (for [`Self::resume`]).
    args: Vec<String>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl ControlPlane {
    /// Starts a control plane whose cluster directory holds `cluster_yaml`, with node
    /// tokens for `nodes`.
    pub async fn start(cluster_yaml: &str, nodes: &[&str]) -> Self {
        Self::start_at(cluster_yaml, nodes, "127.0.0.1:0".parse().unwrap()).await
    }

    /// As [`Self::start`], with the discovery service on `discovery_addr` (to restart a
    /// control plane where proxies expect it).
    pub async fn start_at(cluster_yaml: &str, nodes: &[&str], discovery_addr: SocketAddr) -> Self {
        let (root, iss) = test_pki();
        Self::start_with_pki(cluster_yaml, nodes, discovery_addr, root, iss).await
    }

    /// As [`Self::start_at`], with a given trust anchor and issuer (a control plane that
    /// comes back with the PKI it had).
    pub async fn start_with_pki(
        cluster_yaml: &str,
        nodes: &[&str],
        discovery_addr: SocketAddr,
        root: CaMaterial,
        iss: CaMaterial,
    ) -> Self {
        Self::start_local(cluster_yaml, nodes, discovery_addr, (root, iss), &[]).await
    }

    /// As [`Self::start`], with further flags (e.g. `--cert-lifetime 1m`).
    pub async fn start_with_flags(cluster_yaml: &str, nodes: &[&str], extra: &[&str]) -> Self {
        let addr = "127.0.0.1:0".parse().unwrap();
        Self::start_local(cluster_yaml, nodes, addr, test_pki(), extra).await
    }

    async fn start_local(
        cluster_yaml: &str,
        nodes: &[&str],
        discovery_addr: SocketAddr,
        (root, iss): (CaMaterial, CaMaterial),
        extra: &[&str],
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let p = |n: &str| dir.path().join(n);
        std::fs::create_dir(p("cluster")).unwrap();
        std::fs::write(p("cluster/cluster.yaml"), cluster_yaml).unwrap();
        let tokens: String = nodes
            .iter()
            .map(|n| format!("  {n}: {}\n", node_token(n)))
            .collect();
        std::fs::write(p("tokens.yaml"), format!("nodes:\n{tokens}")).unwrap();
        let mut backend = vec![
            "--backend".to_string(),
            "local".into(),
            "--local-dir".into(),
            path_arg(&p("cluster")),
            "--node-tokens".into(),
            path_arg(&p("tokens.yaml")),
            "--local-poll-interval".into(),
            "50ms".into(),
        ];
        backend.extend(extra.iter().map(|s| s.to_string()));
        Self::launch(dir, root, iss, discovery_addr, &backend).await
    }

    /// A control plane on the Kubernetes backend, reading the API server that
    /// `kubeconfig` names; `extra` are further flags (e.g. `--token-audience`).
    pub async fn start_kube(kubeconfig: &std::path::Path, extra: &[&str]) -> Self {
        let (root, iss) = test_pki();
        let dir = tempfile::tempdir().unwrap();
        let mut backend = vec![
            "--backend".to_string(),
            "kube".into(),
            "--kubeconfig".into(),
            path_arg(kubeconfig),
        ];
        backend.extend(extra.iter().map(|s| s.to_string()));
        Self::launch(dir, root, iss, "127.0.0.1:0".parse().unwrap(), &backend).await
    }

    /// Writes the PKI into `dir`, parses the flags as the binary does, and serves.
    async fn launch(
        dir: tempfile::TempDir,
        root: CaMaterial,
        iss: CaMaterial,
        discovery_addr: SocketAddr,
        backend: &[String],
    ) -> Self {
        let p = |n: &str| dir.path().join(n);
        std::fs::write(p("root.crt"), &root.cert_pem).unwrap();
        std::fs::write(p("issuer.crt"), &iss.cert_pem).unwrap();
        std::fs::write(p("issuer.key"), &iss.key_pem).unwrap();
        let mut args = vec![
            "ambit-control".to_string(),
            "--trust-anchors".into(),
            path_arg(&p("root.crt")),
            "--issuer-cert".into(),
            path_arg(&p("issuer.crt")),
            "--issuer-key".into(),
            path_arg(&p("issuer.key")),
        ];
        args.extend(backend.iter().cloned());
        let identity = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let discovery = tokio::net::TcpListener::bind(discovery_addr).await.unwrap();
        let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let policy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = |l: &tokio::net::TcpListener| l.local_addr().unwrap();
        let (identity_addr, discovery_addr, policy_addr, admin_addr) = (
            addr(&identity),
            addr(&discovery),
            addr(&policy),
            addr(&admin),
        );
        let (index, stop, task) = Self::serve(
            &args,
            Listeners {
                identity,
                discovery,
                policy,
                admin,
            },
        )
        .await;
        let cp = Self {
            dir,
            root,
            issuer: iss,
            identity_addr,
            discovery_addr,
            policy_addr,
            admin_addr,
            index,
            args,
            stop: Some(stop),
            task: Some(task),
        };
        cp.until_ready().await;
        cp
    }

    /// Parses `args` as the binary does and serves on `listeners`.
    async fn serve(
        args: &[String],
        listeners: Listeners,
    ) -> (
        ambit_control::index::SharedIndex,
        oneshot::Sender<()>,
        JoinHandle<()>,
    ) {
        let config = <Config as clap::Parser>::try_parse_from(args)
            .unwrap_or_else(|e| panic!("ambit-control {args:?}: {e}"));
        let control = Control::build(config).await.unwrap();
        let index = control.index();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            control
                .serve(listeners, async move {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        (index, stop, task)
    }

    async fn until_ready(&self) {
        for _ in 0..1000 {
            if http_get(self.admin_addr, "/ready").await.0 == 200 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "control plane did not become ready: {}",
            http_get(self.admin_addr, "/ready").await.1
        );
    }

    /// Stops the control plane (every listener closed, every stream ended) and keeps its
    /// directory — PKI, cluster YAML, the node tokens — for [`Self::resume`].
    pub async fn pause(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.unwrap();
        }
    }

    /// Starts the paused control plane again on the same addresses, with the same PKI and
    /// flags, reading the cluster YAML as it is now.
    pub async fn resume(&mut self) {
        assert!(self.task.is_none(), "not paused");
        let bind = |addr: SocketAddr| async move {
            for _ in 0..100 {
                match tokio::net::TcpListener::bind(addr).await {
                    Ok(l) => return l,
                    Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                        tokio::time::sleep(Duration::from_millis(50)).await
                    }
                    Err(e) => panic!("binding {addr} again: {e}"),
                }
            }
            panic!("{addr} still in use");
        };
        let listeners = Listeners {
            identity: bind(self.identity_addr).await,
            discovery: bind(self.discovery_addr).await,
            policy: bind(self.policy_addr).await,
            admin: bind(self.admin_addr).await,
        };
        let (index, stop, task) = Self::serve(&self.args, listeners).await;
        self.index = index;
        self.stop = Some(stop);
        self.task = Some(task);
        self.until_ready().await;
    }

    /// The identity service's URL.
    pub fn identity_url(&self) -> String {
        format!("https://{}", self.identity_addr)
    }

    /// A TLS channel to `url` that requires the control plane's identity.
    pub fn channel(&self, url: &str) -> tonic::transport::Channel {
        let bundle =
            ambit_proxy::tls::TrustBundle::from_pem(self.root.cert_pem.as_bytes(), "cluster.local")
                .unwrap();
        let id = ambit_proxy::control::default_identity("cluster.local").unwrap();
        ambit_proxy::control::channel(url, &bundle, id, Duration::from_secs(5)).unwrap()
    }

    /// The discovery service's URL.
    pub fn discovery_url(&self) -> String {
        format!("https://{}", self.discovery_addr)
    }

    /// The inbound policy service's URL.
    pub fn policy_url(&self) -> String {
        format!("https://{}", self.policy_addr)
    }

    /// Rewrites the cluster directory's YAML, whole at once (written beside the directory
    /// and renamed in: the backend never reads a file half written).
    pub fn set_cluster(&self, yaml: &str) {
        let tmp = self.dir.path().join("cluster.yaml.new");
        std::fs::write(&tmp, yaml).unwrap();
        std::fs::rename(&tmp, self.cluster_file()).unwrap();
    }

    /// The cluster YAML file.
    pub fn cluster_file(&self) -> PathBuf {
        self.dir.path().join("cluster/cluster.yaml")
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        http_get(self.admin_addr, "/metrics").await.1
    }

    /// Stops the control plane and waits for it to drain.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.unwrap();
        }
    }
}

/// GETs `path` from `addr`; returns the status code and the body.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return (0, String::new());
    };
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let code = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

/// Logs to stderr when `AMBIT_TEST_LOG` is set (e.g. `AMBIT_TEST_LOG=ambit_proxy=debug`).
pub fn init_test_logging() {
    if let Ok(filter) = std::env::var("AMBIT_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_test_writer()
            .try_init();
    }
}

/// A running Pod as cluster YAML (a document of its own): `namespace/name` on `node` with
/// address `ip`, running as the ServiceAccount of its own name.
pub fn running_pod(name: &str, namespace: &str, node: &str, ip: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {namespace}}}\n\
         spec: {{nodeName: {node}, serviceAccountName: {name}, containers: []}}\n\
         status: {{podIP: {ip}, phase: Running}}\n"
    )
}

/// A proxy configuration with the defaults `ambit-proxy` has, for `node`.
pub fn proxy_config(
    node: &str,
    identity_url: String,
    discovery_url: String,
    token_file: PathBuf,
    trust_anchors: PathBuf,
) -> ambit_proxy::config::Config {
    // The binary's own defaults (clap's), so that a new flag needs no change here; then
    // what the tests need.
    let mut config = <ambit_proxy::config::Config as clap::Parser>::try_parse_from([
        "ambit-proxy",
        "--node-name",
        node,
        "--trust-anchors",
        "/nonexistent",
    ])
    .expect("the proxy's defaults parse");
    config.identity_url = identity_url;
    config.discovery_url = discovery_url;
    config.trust_anchors = trust_anchors;
    config.trust_domain = "cluster.local".into();
    config.admin_addr = "127.0.0.1:0".parse().unwrap();
    config.redirect = ambit_proxy::proxy::Redirect::Nftables;
    // No CNI socket: these pods name their netns (local.ambit.dev/netns). The CNI tests
    // set their own.
    config.cni_socket = PathBuf::new();
    // Beside the token file, so that it goes with the test's temporary directory.
    config.run_dir = token_file.with_extension("run");
    config.token_file = token_file;
    config.bpf_pin_dir = PathBuf::from(format!(
        "/sys/fs/bpf/ambit-e2e-{}-{node}",
        std::process::id()
    ));
    // Never the machine's root cgroup: tests that use eBPF set a cgroup of their own.
    config.cgroup_path = PathBuf::from("/nonexistent-cgroup");
    config.cni_add_timeout = Duration::from_secs(10);
    // The real /proc: running pods are enrolled from it (tests/tests/enrol.rs).
    config.proc_root = PathBuf::from("/proc");
    // AMBIT_TEST_SOCKMAP=on: eBPF redirection with sockmap (tests/src/sockmap.rs).
    sockmap::apply(&mut config);
    config
}

/// Releases, on drop, the netns handles a proxy keeps under its run directory (bind
/// mounts that would otherwise keep a test's namespaces alive after the test). A test
/// that restarts a proxy keeps the guard for the whole test: the handles are what the
/// restarted proxy finds its pods by.
#[derive(Debug)]
pub struct NetnsHandles(pub PathBuf);

impl Drop for NetnsHandles {
    fn drop(&mut self) {
        if let Ok(entries) = std::fs::read_dir(self.0.join("netns")) {
            for e in entries.flatten() {
                let _ = nix::mount::umount2(&e.path(), nix::mount::MntFlags::MNT_DETACH);
            }
        }
    }
}

/// A node proxy running in this process.
#[derive(Debug)]
pub struct NodeProxy {
    /// Its admin address.
    pub admin_addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    /// Resolves once the proxy's runtime is gone (its thread ended).
    exited: Option<oneshot::Receiver<Result<(), String>>>,
}

impl NodeProxy {
    /// Starts the proxy of `node` against `cp` and waits for it to be ready.
    pub async fn start(cp: &ControlPlane, node: &str) -> Self {
        Self::start_with(cp, node, Duration::from_secs(10)).await
    }

    /// As [`Self::start`], with a protocol detection timeout.
    pub async fn start_with(cp: &ControlPlane, node: &str, detect_timeout: Duration) -> Self {
        let mut config = Self::config(cp, node);
        config.detect_timeout = detect_timeout;
        Self::start_config(config).await
    }

    /// Starts a proxy with `config` and waits for it to be ready.
    pub async fn start_config(config: ambit_proxy::config::Config) -> Self {
        let node = config.node_name.clone();
        let p = Self::launch(config);
        p.wait_ready(&node).await;
        p
    }

    /// As [`Self::start`], without waiting for `/ready`.
    pub async fn spawn(cp: &ControlPlane, node: &str) -> Self {
        Self::launch(Self::config(cp, node))
    }

    /// As [`Self::start_config`], without waiting for `/ready`.
    pub fn spawn_config(config: ambit_proxy::config::Config) -> Self {
        Self::launch(config)
    }

    /// Runs the proxy as its own process would: on a thread of its own with its own
    /// single-threaded runtime, so that stopping it ends every task and closes every
    /// socket it had, as the process's exit does.
    fn launch(config: ambit_proxy::config::Config) -> Self {
        init_test_logging();
        let admin = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        admin.set_nonblocking(true).unwrap();
        let admin_addr = admin.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let (exit_tx, exited) = oneshot::channel();
        std::thread::Builder::new()
            .name(format!("proxy-{}", config.node_name))
            .spawn(move || {
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    let outcome = rt.block_on(async move {
                        let admin = tokio::net::TcpListener::from_std(admin).unwrap();
                        let (_, log_level) = ambit_proxy::logging::subscriber(
                            "info",
                            ambit_proxy::logging::LogFormat::Plain,
                        )
                        .unwrap();
                        ambit_proxy::app::run(config, admin, log_level, async move {
                            let _ = stopped.await;
                        })
                        .await
                        .map_err(|e| e.to_string())
                    });
                    drop(rt);
                    outcome
                }));
                let _ = exit_tx.send(result.unwrap_or_else(|_| Err("the proxy panicked".into())));
            })
            .unwrap();
        Self {
            admin_addr,
            stop: Some(stop),
            exited: Some(exited),
        }
    }

    /// Waits until `/ready` answers 200 (certificates, discovery and listeners in place).
    pub async fn wait_ready(&self, node: &str) {
        for _ in 0..1000 {
            if http_get(self.admin_addr, "/ready").await.0 == 200 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "proxy of {node} not ready: {:?}",
            http_get(self.admin_addr, "/ready").await
        );
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        http_get(self.admin_addr, "/metrics").await.1
    }

    /// The configuration of `node`'s proxy against `cp` (writes its token file).
    pub fn config(cp: &ControlPlane, node: &str) -> ambit_proxy::config::Config {
        let token_file = cp.dir.path().join(format!("{node}.token"));
        std::fs::write(&token_file, node_token(node)).unwrap();
        let mut config = proxy_config(
            node,
            cp.identity_url(),
            cp.discovery_url(),
            token_file,
            cp.dir.path().join("root.crt"),
        );
        config.policy_url = cp.policy_url();
        config
    }

    /// Waits for the proxy to end on its own (a start that fails); how it ended.
    pub async fn exit(mut self) -> Result<(), String> {
        let exited = self.exited.take().expect("not stopped yet");
        let result = exited.await.unwrap();
        self.stop.take();
        result
    }

    /// Stops the proxy, waits for it to drain and for its runtime to be gone.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(exited) = self.exited.take() {
            exited.await.unwrap().unwrap();
        }
    }
}

impl cni::CniNode {
    /// The configuration of this node's proxy against `cp`: the CNI socket, run
    /// directory, cgroup and pin directory of the node, and `redirect`.
    pub fn proxy_config(
        &self,
        cp: &ControlPlane,
        redirect: ambit_proxy::proxy::Redirect,
    ) -> ambit_proxy::config::Config {
        let mut config = NodeProxy::config(cp, &self.name);
        config.redirect = redirect;
        config.cni_socket = self.socket.clone();
        config.run_dir = self.run_dir.clone();
        config.cgroup_path = self.cgroup.clone();
        config.bpf_pin_dir = self.pin_dir.clone();
        config
    }
}

/// The sum of the samples of metric `name` whose labels contain each of `labels` (as
/// `key="value"` text).
pub fn metric_sum(metrics: &str, name: &str, labels: &[&str]) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// The addresses a test server saw its clients connect from.
pub type Peers = std::sync::Arc<std::sync::Mutex<Vec<SocketAddr>>>;

/// A tiny HTTP/1.1 server inside `netns` on `port` answering `body` to every request;
/// records each client's address.
pub async fn http_server(
    netns: &ambit_proxy::netns::Netns,
    port: u16,
    body: &'static str,
) -> Peers {
    let listener = netns
        .bind(SocketAddr::from(([0, 0, 0, 0], port)))
        .await
        .unwrap();
    let seen = Peers::default();
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, peer)) = listener.accept().await {
            record.lock().unwrap().push(peer);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut head = Vec::new();
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let reply = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(reply.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    seen
}
