//! Configuration of `ambit-proxy`: every flag has an environment variable, every value is
//! checked before start-up, and all problems are reported at once.

use ambit_api::DEFAULT_TRUST_DOMAIN;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Environment variable names, in one place.
pub mod env {
    /// The node this proxy serves (the DaemonSet sets it from `spec.nodeName`).
    pub const NODE_NAME: &str = "AMBIT_NODE_NAME";
    /// Identity service URL.
    pub const IDENTITY_URL: &str = "AMBIT_IDENTITY_URL";
    /// Discovery service URL.
    pub const DISCOVERY_URL: &str = "AMBIT_DISCOVERY_URL";
    /// File holding the node credential.
    pub const TOKEN_FILE: &str = "AMBIT_TOKEN_FILE";
    /// PEM bundle of trust anchors.
    pub const TRUST_ANCHORS: &str = "AMBIT_TRUST_ANCHORS";
    /// How often the trust anchors file is read for a new bundle.
    pub const TRUST_ANCHORS_POLL_INTERVAL: &str = "AMBIT_TRUST_ANCHORS_POLL_INTERVAL";
    /// Trust domain.
    pub const TRUST_DOMAIN: &str = "AMBIT_TRUST_DOMAIN";
    /// Admin listen address.
    pub const ADMIN_ADDR: &str = "AMBIT_ADMIN_ADDR";
    /// Log filter.
    pub const LOG: &str = "AMBIT_LOG";
    /// Log line format.
    pub const LOG_FORMAT: &str = "AMBIT_LOG_FORMAT";
    /// How long protocol detection waits for a client's first bytes.
    pub const DETECT_TIMEOUT: &str = "AMBIT_DETECT_TIMEOUT";
    /// How long a first connection to a destination discovery does not know waits for
    /// the control plane's answer.
    pub const DISCOVERY_LOOKUP_TIMEOUT: &str = "AMBIT_DISCOVERY_LOOKUP_TIMEOUT";
    /// How long an unused destination stays subscribed.
    pub const DISCOVERY_IDLE_TIMEOUT: &str = "AMBIT_DISCOVERY_IDLE_TIMEOUT";
    /// Runtime worker threads.
    pub const WORKER_THREADS: &str = "AMBIT_WORKER_THREADS";
    /// How pod traffic is redirected to the proxy.
    pub const REDIRECT: &str = "AMBIT_REDIRECT";
    /// Whether the in-pod hops skip the loopback TCP stack (sk_msg).
    pub const SOCKMAP: &str = "AMBIT_SOCKMAP";
    /// Whether opaque streams between node proxies take kernel TLS.
    pub const KERNEL_TLS: &str = "AMBIT_KERNEL_TLS";
    /// The identity the control plane must prove.
    pub const CONTROL_IDENTITY: &str = "AMBIT_CONTROL_IDENTITY";
    /// Where the eBPF maps and links are pinned.
    pub const BPF_PIN_DIR: &str = "AMBIT_BPF_PIN_DIR";
    /// The cgroup (v2) the outbound eBPF programs attach to.
    pub const CGROUP_PATH: &str = "AMBIT_CGROUP_PATH";
    /// The unix socket the CNI plugin talks to.
    pub const CNI_SOCKET: &str = "AMBIT_CNI_SOCKET";
    /// Where the proxy keeps the pods the CNI plugin handed over.
    pub const RUN_DIR: &str = "AMBIT_RUN_DIR";
    /// How long a CNI ADD may wait for the pod's listeners.
    pub const CNI_ADD_TIMEOUT: &str = "AMBIT_CNI_ADD_TIMEOUT";
    /// The host's `/proc`, where running pods' network namespaces are found.
    pub const PROC_ROOT: &str = "AMBIT_PROC_ROOT";
    /// The CNI plugin's executable, the only program the CNI socket serves (empty: any
    /// root process).
    pub const CNI_PLUGIN_BINARY: &str = "AMBIT_CNI_PLUGIN_BINARY";
    /// Connections the proxy admits at once across all pods (0: from the descriptor limit).
    pub const MAX_CONNECTIONS: &str = "AMBIT_MAX_CONNECTIONS";
    /// Connections one pod's listeners admit at once.
    pub const MAX_CONNECTIONS_PER_POD: &str = "AMBIT_MAX_CONNECTIONS_PER_POD";
    /// How long an HTTP connection from an application may stay silent before it is closed.
    pub const HTTP_IDLE_TIMEOUT: &str = "AMBIT_HTTP_IDLE_TIMEOUT";
    /// What happens to connections to addresses discovery does not know.
    pub const OUTBOUND_UNKNOWN: &str = "AMBIT_OUTBOUND_UNKNOWN";
    /// The only directory whose network namespaces discovery may name (local mode).
    pub const LOCAL_NETNS_DIR: &str = "AMBIT_LOCAL_NETNS_DIR";
    /// The control plane's policy service.
    pub const POLICY_URL: &str = "AMBIT_POLICY_URL";
    /// The inbound policy of pods the control plane has sent none for.
    pub const DEFAULT_INBOUND_POLICY: &str = "AMBIT_DEFAULT_INBOUND_POLICY";
    /// The cluster's pod and node networks (the cluster-* default policies).
    pub const CLUSTER_NETWORKS: &str = "AMBIT_CLUSTER_NETWORKS";
    /// `--shutdown-grace-period`.
    pub const SHUTDOWN_GRACE_PERIOD: &str = "AMBIT_SHUTDOWN_GRACE_PERIOD";
}

/// Defaults, as the DaemonSet runs the proxy.
pub mod defaults {
    /// eBPF pin directory.
    pub const BPF_PIN_DIR: &str = ambit_ebpf::DEFAULT_PIN_DIR;
    /// The root cgroup: the programs filter by netns cookie, so only meshed pods are
    /// affected.
    pub const CGROUP_PATH: &str = "/sys/fs/cgroup";
    /// The CNI socket.
    pub const CNI_SOCKET: &str = ambit_api::cni::DEFAULT_SOCKET;
    /// The run directory.
    pub const RUN_DIR: &str = "/var/run/ambit";
    /// The proc filesystem (the chart mounts the host's at `/host/proc`).
    pub const PROC_ROOT: &str = "/proc";
    /// Where `ip netns add` puts network namespaces.
    pub const LOCAL_NETNS_DIR: &str = "/run/netns";
}

/// `ambit-proxy` configuration.
#[derive(Clone, Debug, clap::Parser, serde::Serialize)]
#[command(name = "ambit-proxy", version, about = "Ambit node proxy")]
pub struct Config {
    /// The node this proxy serves.
    #[arg(long, env = env::NODE_NAME)]
    pub node_name: String,
    /// URL of the control plane's identity service.
    #[arg(long, env = env::IDENTITY_URL, default_value = "https://ambit-control.ambit.svc:8080")]
    pub identity_url: String,
    /// URL of the control plane's discovery service.
    #[arg(long, env = env::DISCOVERY_URL, default_value = "https://ambit-control.ambit.svc:8086")]
    pub discovery_url: String,
    /// URL of the control plane's inbound policy service.
    #[arg(long, env = env::POLICY_URL, default_value = "https://ambit-control.ambit.svc:8090")]
    pub policy_url: String,
    /// The inbound policy of a meshed pod until the control plane sends its own (at start,
    /// or for a pod new while the control plane is away): all-unauthenticated,
    /// all-authenticated, cluster-unauthenticated, cluster-authenticated, deny or audit.
    #[arg(long, env = env::DEFAULT_INBOUND_POLICY, default_value = "all-unauthenticated")]
    pub default_inbound_policy: String,
    /// The cluster's networks, for the cluster-* default policies (comma-separated CIDRs).
    #[arg(
        long,
        env = env::CLUSTER_NETWORKS,
        default_value = "10.0.0.0/8,100.64.0.0/10,172.16.0.0/12,192.168.0.0/16,fd00::/8"
    )]
    pub cluster_networks: String,
    /// File holding the node credential (its content is never logged or dumped).
    #[arg(long, env = env::TOKEN_FILE, default_value = "/var/run/secrets/ambit/token")]
    pub token_file: PathBuf,
    /// PEM file of trust anchors (one or more roots). Read again when it changes (a
    /// rotation: docs/OPERATIONS.md); a file that does not parse is refused and the bundle
    /// in use stays.
    #[arg(long, env = env::TRUST_ANCHORS)]
    pub trust_anchors: PathBuf,
    /// How often the trust anchors file is checked for a new content.
    #[arg(long, env = env::TRUST_ANCHORS_POLL_INTERVAL, default_value = "5s", value_parser = ambit_api::duration::parse_duration)]
    #[serde(serialize_with = "ser_duration")]
    pub trust_anchors_poll_interval: std::time::Duration,
    /// Trust domain of the mesh.
    #[arg(long, env = env::TRUST_DOMAIN, default_value = DEFAULT_TRUST_DOMAIN)]
    pub trust_domain: String,
    /// Listen address of the admin server (/metrics, /ready, /live; admin views answer
    /// loopback clients only).
    #[arg(long, env = env::ADMIN_ADDR, default_value = "0.0.0.0:4191")]
    pub admin_addr: SocketAddr,
    /// How long protocol detection waits for a client's first bytes before treating the
    /// connection as opaque (server-speaks-first protocols).
    #[arg(long, env = env::DETECT_TIMEOUT, default_value = "10s", value_parser = ambit_api::duration::parse_duration)]
    #[serde(serialize_with = "ser_duration")]
    pub detect_timeout: std::time::Duration,
    /// How long the first connection to a destination discovery has not described yet
    /// waits for the control plane's answer; then it is refused (never sent around the
    /// mesh or in plaintext).
    #[arg(long, env = env::DISCOVERY_LOOKUP_TIMEOUT, default_value = "3s", value_parser = ambit_api::duration::parse_duration)]
    #[serde(serialize_with = "ser_duration")]
    pub discovery_lookup_timeout: std::time::Duration,
    /// How long a destination no pod of the node used stays subscribed on the discovery
    /// stream.
    #[arg(long, env = env::DISCOVERY_IDLE_TIMEOUT, default_value = "5m", value_parser = ambit_api::duration::parse_duration)]
    #[serde(serialize_with = "ser_duration")]
    pub discovery_idle_timeout: std::time::Duration,
    /// The SPIFFE ID the control plane must prove on its TLS ports (default
    /// `spiffe://<trust domain>/ns/ambit/sa/ambit-control`).
    #[arg(long, env = env::CONTROL_IDENTITY)]
    pub control_identity: Option<String>,
    /// How pod traffic reaches the proxy: `ebpf` (connect4/6, sockops and sk_lookup
    /// programs), `nftables` (linkerd-init's rules in each pod's netns), `auto` (eBPF when
    /// the kernel takes the programs, else nftables), or `none` (something else
    /// redirects).
    #[arg(long, env = env::REDIRECT, value_enum, default_value = "auto")]
    pub redirect: crate::proxy::Redirect,
    /// With eBPF redirection, move the bytes of the in-pod hops (application ↔ proxy)
    /// between the two sockets with sk_msg, past the loopback TCP stack, for the first
    /// 4 MiB each way of a connection. Off by default: `splice(2)` cannot read such a hop
    /// (docs/ARCHITECTURE.md, "Redirection").
    #[arg(long, env = env::SOCKMAP, value_enum, default_value = "off")]
    pub sockmap: crate::proxy::redirect::Sockmap,
    /// Opaque TCP between node proxies on an mTLS connection of its own per stream,
    /// handed to kernel TLS after the handshake and relayed with `splice(2)`: `auto` (when
    /// the kernel has TLS — `CONFIG_TLS`, the `tls` module loaded — and sockmap is off;
    /// HTTP/2 CONNECT streams on the pooled tunnel otherwise), `on` (required: no start
    /// without it), `off`. `/config_dump` says which and why. Off by default: measured
    /// so far only in an emulated guest, where it was level with CONNECT streams in bulk
    /// and cost 4x their CPU per new connection (BENCHMARKS.md, "Kernel TLS").
    #[arg(long, env = env::KERNEL_TLS, value_enum, default_value = "off")]
    pub kernel_tls: crate::ktls::Mode,
    /// Where the eBPF maps and links are pinned (on bpffs); they outlive the proxy, so a
    /// meshed pod stays redirected (and fails closed) while it restarts.
    #[arg(long, env = env::BPF_PIN_DIR, default_value = defaults::BPF_PIN_DIR)]
    pub bpf_pin_dir: PathBuf,
    /// The cgroup v2 directory the outbound programs attach to.
    #[arg(long, env = env::CGROUP_PATH, default_value = defaults::CGROUP_PATH)]
    pub cgroup_path: PathBuf,
    /// The unix socket the CNI plugin hands pods over on (empty: no CNI socket; pods
    /// then name their netns with the `local.ambit.dev/netns` annotation).
    #[arg(long, env = env::CNI_SOCKET, default_value = defaults::CNI_SOCKET, value_parser = path_or_empty)]
    pub cni_socket: PathBuf,
    /// Where the pods handed over are kept (records and netns handles), so that a
    /// restarted proxy serves them again.
    #[arg(long, env = env::RUN_DIR, default_value = defaults::RUN_DIR)]
    pub run_dir: PathBuf,
    /// How long a CNI ADD waits for discovery to list the pod and for its listeners.
    #[arg(long, env = env::CNI_ADD_TIMEOUT, default_value = "30s", value_parser = ambit_api::duration::parse_duration)]
    #[serde(serialize_with = "ser_duration")]
    pub cni_add_timeout: std::time::Duration,
    /// The host's proc filesystem: pods meshed while they run (no CNI ADD) are found here,
    /// by the pod UID in a process's cgroup (empty: no such enrolment).
    #[arg(long, env = env::PROC_ROOT, default_value = defaults::PROC_ROOT, value_parser = path_or_empty)]
    pub proc_root: PathBuf,
    /// The CNI plugin's executable on this node (e.g. `/opt/cni/bin/ambit-cni` as the proxy
    /// sees it): the CNI socket then serves only processes running this very file (same
    /// device and inode, looked up at each request) through `<proc-root>/<pid>/exe`, which
    /// takes the proxy in the host's pid namespace. Empty: any root process (the socket
    /// always refuses peers that are not root).
    #[arg(long, env = env::CNI_PLUGIN_BINARY, default_value = "", value_parser = path_or_empty)]
    pub cni_plugin_binary: PathBuf,
    /// Connections the proxy admits at once, across every pod and listener; beyond it a new
    /// connection is closed on accept and counted in `tcp_connections_refused_total`
    /// (0: derived from the descriptor limit, which the proxy raises to its hard limit).
    #[arg(long, env = env::MAX_CONNECTIONS, default_value_t = 0)]
    pub max_connections: usize,
    /// Connections one pod's listeners (4140, 4143, 4144 together) admit at once, so that
    /// one pod's flood leaves the others their share.
    #[arg(long, env = env::MAX_CONNECTIONS_PER_POD, default_value_t = 10_000)]
    pub max_connections_per_pod: usize,
    /// How long an application's HTTP connection to the proxy may go without a byte either
    /// way before the proxy closes it (gracefully: a request in flight finishes).
    #[arg(long, env = env::HTTP_IDLE_TIMEOUT, default_value = "10m", value_parser = ambit_api::duration::parse_duration)]
    #[serde(serialize_with = "ser_duration")]
    pub http_idle_timeout: std::time::Duration,
    /// Connections of meshed pods to addresses discovery does not know (neither a Service
    /// nor a pod): `allow` connects as asked, in plaintext; `deny` refuses them (HTTP 403,
    /// TCP closed), also while discovery has not delivered its first snapshot.
    #[arg(long, env = env::OUTBOUND_UNKNOWN, value_enum, default_value = "allow")]
    pub outbound_unknown: crate::proxy::OutboundUnknown,
    /// Network namespaces named by discovery (`local.ambit.dev/netns`, local mode only) are
    /// honoured only under this directory; never the proxy's own namespace.
    #[arg(long, env = env::LOCAL_NETNS_DIR, default_value = defaults::LOCAL_NETNS_DIR)]
    pub local_netns_dir: PathBuf,
    /// How long a stopping proxy (SIGTERM, or handed over to a new one) lets its open
    /// connections finish — requests in flight, HTTP/2 peers told GOAWAY, opaque streams —
    /// before it closes what is left (as Linkerd's `shutdown-grace-period`).
    #[arg(long, env = env::SHUTDOWN_GRACE_PERIOD, default_value = "30s", value_parser = ambit_api::duration::parse_duration)]
    #[serde(serialize_with = "ser_duration")]
    pub shutdown_grace_period: std::time::Duration,
    /// Worker threads of the proxy's runtime (1: a single-threaded runtime).
    #[arg(long, env = env::WORKER_THREADS, default_value_t = 1)]
    pub worker_threads: usize,
    /// Log filter, e.g. `info` or `ambit_proxy=debug`; changeable at run time with
    /// `PUT /log-level`.
    #[arg(long, env = env::LOG, default_value = "info")]
    pub log: String,
    /// Log line format: `plain`, or `json` (one object per line, with the connection's
    /// span: pod, direction, peer, destination).
    #[arg(long, env = env::LOG_FORMAT, value_enum, default_value = "plain")]
    pub log_format: crate::logging::LogFormat,
}

impl Config {
    /// Checks the values; returns every problem found, each naming its flag.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let mut errors = Vec::new();
        if self.node_name.trim().is_empty() {
            errors.push("--node-name: required (the DaemonSet sets it from spec.nodeName)".into());
        }
        for (flag, url) in [
            ("--identity-url", &self.identity_url),
            ("--discovery-url", &self.discovery_url),
            ("--policy-url", &self.policy_url),
        ] {
            if let Some(rest) = url.strip_prefix("http://") {
                errors.push(format!(
                    "{flag}: {url:?}: the control plane speaks only TLS; use https://{rest}"
                ));
            } else if !url.starts_with("https://") {
                errors.push(format!("{flag}: {url:?} is not an https:// URL"));
            }
        }
        if let Err(e) = self.fallback_policy() {
            errors.push(e);
        }
        if let Err(e) = ambit_api::WorkloadIdentity::new(&self.trust_domain, "ns", "sa") {
            errors.push(format!("--trust-domain: {e}"));
        }
        if !self.token_file.is_file() {
            errors.push(format!(
                "--token-file: {} is not a readable file",
                self.token_file.display()
            ));
        }
        if !self.trust_anchors.is_file() {
            errors.push(format!(
                "--trust-anchors: {} is not a readable file",
                self.trust_anchors.display()
            ));
        }
        if self.trust_anchors_poll_interval.is_zero() {
            errors.push("--trust-anchors-poll-interval: must be more than 0".into());
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }
}

impl Config {
    /// The inbound policy of pods the control plane has sent none for
    /// (`--default-inbound-policy` over `--cluster-networks`).
    pub fn fallback_policy(&self) -> Result<crate::policy::PortPolicy, String> {
        let networks = crate::policy::parse_networks(&self.cluster_networks)
            .map_err(|e| format!("--cluster-networks: {e}"))?;
        crate::policy::PortPolicy::default_policy(&self.default_inbound_policy, &networks)
            .map_err(|e| format!("--default-inbound-policy: {e}"))
    }
}

/// A path, where the empty string is allowed (and means "none").
fn path_or_empty(s: &str) -> Result<PathBuf, std::convert::Infallible> {
    Ok(PathBuf::from(s))
}

fn ser_duration<S: serde::Serializer>(d: &std::time::Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&ambit_api::duration::format_duration(*d))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn an_empty_cni_socket_turns_it_off_and_redirection_defaults_to_auto() {
        let parse = |extra: &[&str]| {
            let mut args = vec!["ambit-proxy", "--node-name", "n", "--trust-anchors", "/x"];
            args.extend_from_slice(extra);
            Config::try_parse_from(args)
        };
        let c = parse(&["--cni-socket", ""]).unwrap_or_else(|e| panic!("{e}"));
        assert!(c.cni_socket.as_os_str().is_empty());
        assert_eq!(c.redirect, crate::proxy::Redirect::Auto);
        let c = parse(&[]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.cni_socket, PathBuf::from("/var/run/ambit/cni.sock"));
        assert_eq!(c.cgroup_path, PathBuf::from("/sys/fs/cgroup"));
        assert_eq!(c.proc_root, PathBuf::from("/proc"));
        let c = parse(&["--proc-root", "/host/proc"]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.proc_root, PathBuf::from("/host/proc"));
        assert!(c.cni_plugin_binary.as_os_str().is_empty());
        let c = parse(&["--cni-plugin-binary", "/host/opt/cni/bin/ambit-cni"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            c.cni_plugin_binary,
            PathBuf::from("/host/opt/cni/bin/ambit-cni")
        );
        assert!(parse(&["--redirect", "iptables"]).is_err());
    }

    #[test]
    fn a_plaintext_control_plane_url_is_refused_with_a_hint() {
        let mut c = Config::try_parse_from([
            "ambit-proxy",
            "--node-name",
            "n",
            "--trust-anchors",
            "/x",
            "--identity-url",
            "http://ambit-control.ambit.svc:8080",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        c.token_file = PathBuf::from("/proc/self/status");
        c.trust_anchors = PathBuf::from("/proc/self/status");
        let errors = c.validate().unwrap_err();
        assert_eq!(
            errors,
            ["--identity-url: \"http://ambit-control.ambit.svc:8080\": the control plane speaks only TLS; use https://ambit-control.ambit.svc:8080"]
        );
        assert!(crate::control::channel(
            "http://127.0.0.1:8080",
            &crate::testing::TestCa::new("cluster.local").bundle(),
            crate::control::default_identity("cluster.local").unwrap_or_else(|e| panic!("{e}")),
            std::time::Duration::from_secs(1),
        )
        .is_err_and(|e| e.to_string().contains("use https://127.0.0.1:8080")));
    }
}
