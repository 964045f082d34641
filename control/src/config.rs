//! Configuration of `ambit-control`: every flag has an environment variable, every value is
//! checked before start-up, and all problems are reported at once.

use ambit_api::duration::parse_duration;
use ambit_api::DEFAULT_TRUST_DOMAIN;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Environment variable names, in one place.
pub mod env {
    /// Trust domain of issued identities.
    pub const TRUST_DOMAIN: &str = "AMBIT_TRUST_DOMAIN";
    /// PEM bundle of trust anchors.
    pub const TRUST_ANCHORS: &str = "AMBIT_TRUST_ANCHORS";
    /// PEM issuer certificate.
    pub const ISSUER_CERT: &str = "AMBIT_ISSUER_CERT";
    /// PEM issuer key.
    pub const ISSUER_KEY: &str = "AMBIT_ISSUER_KEY";
    /// How often the trust anchors and issuer files are checked for a change.
    pub const PKI_POLL_INTERVAL: &str = "AMBIT_PKI_POLL_INTERVAL";
    /// Workload certificate lifetime.
    pub const CERT_LIFETIME: &str = "AMBIT_CERT_LIFETIME";
    /// Backdating of notBefore.
    pub const CLOCK_SKEW_ALLOWANCE: &str = "AMBIT_CLOCK_SKEW_ALLOWANCE";
    /// Where cluster state comes from.
    pub const BACKEND: &str = "AMBIT_BACKEND";
    /// Directory of YAML objects (local backend).
    pub const LOCAL_DIR: &str = "AMBIT_LOCAL_DIR";
    /// How often the directory is checked for changes.
    pub const LOCAL_POLL_INTERVAL: &str = "AMBIT_LOCAL_POLL_INTERVAL";
    /// Node credentials file (local backend).
    pub const NODE_TOKENS: &str = "AMBIT_NODE_TOKENS";
    /// Identity gRPC listen address.
    pub const IDENTITY_ADDR: &str = "AMBIT_IDENTITY_ADDR";
    /// Discovery gRPC listen address.
    pub const DISCOVERY_ADDR: &str = "AMBIT_DISCOVERY_ADDR";
    /// Policy gRPC listen address.
    pub const POLICY_ADDR: &str = "AMBIT_POLICY_ADDR";
    /// The cluster's default inbound policy.
    pub const DEFAULT_INBOUND_POLICY: &str = "AMBIT_DEFAULT_INBOUND_POLICY";
    /// The cluster's pod and node networks.
    pub const CLUSTER_NETWORKS: &str = "AMBIT_CLUSTER_NETWORKS";
    /// Admin HTTP listen address.
    pub const ADMIN_ADDR: &str = "AMBIT_ADMIN_ADDR";
    /// Open connections per gRPC listener.
    pub const MAX_CONNECTIONS: &str = "AMBIT_MAX_CONNECTIONS";
    /// Log filter.
    pub const LOG: &str = "AMBIT_LOG";
    /// Log line format.
    pub const LOG_FORMAT: &str = "AMBIT_LOG_FORMAT";
    /// Namespace of the control plane (its own identity).
    pub const CONTROL_NAMESPACE: &str = "AMBIT_CONTROL_NAMESPACE";
    /// ServiceAccount of the control plane (its own identity).
    pub const CONTROL_SERVICE_ACCOUNT: &str = "AMBIT_CONTROL_SERVICE_ACCOUNT";
    /// kubeconfig file (Kubernetes backend, outside a cluster), as kubectl reads it.
    pub const KUBECONFIG: &str = "KUBECONFIG";
    /// The audience node proxies' tokens must be issued for.
    pub const TOKEN_AUDIENCE: &str = "AMBIT_TOKEN_AUDIENCE";
    /// `<namespace>/<name>` of the node proxies' ServiceAccount.
    pub const PROXY_SERVICE_ACCOUNT: &str = "AMBIT_PROXY_SERVICE_ACCOUNT";
    /// How long a TokenReview's answer is reused.
    pub const TOKEN_REVIEW_CACHE_TTL: &str = "AMBIT_TOKEN_REVIEW_CACHE_TTL";
}

/// Longest a TokenReview answer may be reused.
pub const MAX_TOKEN_REVIEW_CACHE_TTL: Duration = Duration::from_secs(600);

/// Shortest workload certificate lifetime accepted.
pub const MIN_CERT_LIFETIME: Duration = Duration::from_secs(60);

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Plain,
    /// One JSON object per line.
    Json,
}

/// Where the control plane reads cluster state from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Kubernetes objects as YAML files in a directory (`--local-dir`).
    Local,
    /// The Kubernetes API server (in-cluster config, or `--kubeconfig`).
    Kube,
}

/// `ambit-control` configuration.
#[derive(Clone, Debug, clap::Parser, serde::Serialize)]
#[command(
    name = "ambit-control",
    version,
    about = "Ambit control plane: CA, discovery and policy"
)]
pub struct Config {
    /// Trust domain of issued SPIFFE IDs.
    #[arg(long, env = env::TRUST_DOMAIN, default_value = DEFAULT_TRUST_DOMAIN)]
    pub trust_domain: String,
    /// PEM file of trust anchors (one or more roots).
    #[arg(long, env = env::TRUST_ANCHORS)]
    pub trust_anchors: PathBuf,
    /// PEM file of the issuer certificate (optionally followed by further intermediates).
    #[arg(long, env = env::ISSUER_CERT)]
    pub issuer_cert: PathBuf,
    /// PEM file of the issuer private key.
    #[arg(long, env = env::ISSUER_KEY)]
    pub issuer_key: PathBuf,
    /// How often the trust anchors, issuer certificate and key files are checked for a
    /// change; a change is taken without a restart (a rotation: docs/OPERATIONS.md), or
    /// refused with an error if the files do not make a CA.
    #[arg(long, env = env::PKI_POLL_INTERVAL, default_value = "5s", value_parser = parse_duration)]
    #[serde(serialize_with = "ser_duration")]
    pub pki_poll_interval: Duration,
    /// Lifetime of workload certificates.
    #[arg(long, env = env::CERT_LIFETIME, default_value = "24h", value_parser = parse_duration)]
    #[serde(serialize_with = "ser_duration")]
    pub cert_lifetime: Duration,
    /// How far workload certificates' notBefore is backdated, for clock skew.
    #[arg(long, env = env::CLOCK_SKEW_ALLOWANCE, default_value = "20s", value_parser = parse_duration)]
    #[serde(serialize_with = "ser_duration")]
    pub clock_skew_allowance: Duration,
    /// Where cluster state comes from.
    #[arg(long, env = env::BACKEND, value_enum, default_value = "local")]
    pub backend: Backend,
    /// Directory of Kubernetes objects as YAML (local backend).
    #[arg(long, env = env::LOCAL_DIR)]
    pub local_dir: Option<PathBuf>,
    /// How often the local directory is checked for changes.
    #[arg(long, env = env::LOCAL_POLL_INTERVAL, default_value = "1s", value_parser = parse_duration)]
    #[serde(serialize_with = "ser_duration")]
    pub local_poll_interval: Duration,
    /// YAML file of node credentials, `nodes: {<node>: <token>}` (local backend).
    #[arg(long, env = env::NODE_TOKENS)]
    pub node_tokens: Option<PathBuf>,
    /// kubeconfig file (Kubernetes backend); unset, the in-cluster configuration (or
    /// `~/.kube/config`) is used.
    #[arg(long, env = env::KUBECONFIG)]
    pub kubeconfig: Option<PathBuf>,
    /// The audience node proxies' projected ServiceAccount tokens must carry (Kubernetes
    /// backend; checked by TokenReview).
    #[arg(long, env = env::TOKEN_AUDIENCE, default_value = "ambit")]
    pub token_audience: String,
    /// The ServiceAccount node proxies run as, `<namespace>/<name>` (Kubernetes backend):
    /// tokens of any other account are refused.
    #[arg(long, env = env::PROXY_SERVICE_ACCOUNT, default_value = "ambit/ambit-proxy")]
    pub proxy_service_account: String,
    /// How long a TokenReview's answer is reused for the same token (Kubernetes backend),
    /// so that certificate renewals do not each cost an API call.
    #[arg(long, env = env::TOKEN_REVIEW_CACHE_TTL, default_value = "1m", value_parser = parse_duration)]
    #[serde(serialize_with = "ser_duration")]
    pub token_review_cache_ttl: Duration,
    /// Listen address of the identity service (gRPC).
    #[arg(long, env = env::IDENTITY_ADDR, default_value = "0.0.0.0:8080")]
    pub identity_addr: SocketAddr,
    /// Listen address of the discovery service (gRPC).
    #[arg(long, env = env::DISCOVERY_ADDR, default_value = "0.0.0.0:8086")]
    pub discovery_addr: SocketAddr,
    /// Listen address of the inbound policy service (gRPC).
    #[arg(long, env = env::POLICY_ADDR, default_value = "0.0.0.0:8090")]
    pub policy_addr: SocketAddr,
    /// The inbound policy of meshed pods whose namespace or own annotation
    /// (`config.ambit.dev/default-inbound-policy`) names none: all-unauthenticated,
    /// all-authenticated, cluster-unauthenticated, cluster-authenticated, deny or audit.
    #[arg(long, env = env::DEFAULT_INBOUND_POLICY, default_value = "all-unauthenticated")]
    pub default_inbound_policy: String,
    /// The cluster's pod and node networks (comma-separated CIDRs), for the cluster-*
    /// default policies.
    #[arg(long, env = env::CLUSTER_NETWORKS, default_value = ambit_api::policy::DEFAULT_CLUSTER_NETWORKS)]
    pub cluster_networks: String,
    /// Listen address of the admin server (/metrics, /ready, /live).
    #[arg(long, env = env::ADMIN_ADDR, default_value = "0.0.0.0:9990")]
    pub admin_addr: SocketAddr,
    /// Connections open at once on each gRPC listener (identity, discovery and policy each); one
    /// more is closed at once and counted in `control_connections_refused_total`. Each
    /// node proxy holds one on each.
    #[arg(long, env = env::MAX_CONNECTIONS, default_value_t = crate::limits::DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Namespace part of the identity the control plane's gRPC servers prove
    /// (`spiffe://<td>/ns/<this>/sa/<service account>`).
    #[arg(long, env = env::CONTROL_NAMESPACE, default_value = ambit_api::CONTROL_PLANE_NAMESPACE)]
    pub control_namespace: String,
    /// ServiceAccount part of the control plane's identity.
    #[arg(long, env = env::CONTROL_SERVICE_ACCOUNT, default_value = ambit_api::CONTROL_PLANE_SERVICE_ACCOUNT)]
    pub control_service_account: String,
    /// Log filter, e.g. `info` or `ambit_control=debug`.
    #[arg(long, env = env::LOG, default_value = "info")]
    pub log: String,
    /// Log line format: `plain`, or `json` (one object per line, for log pipelines).
    #[arg(long, env = env::LOG_FORMAT, value_enum, default_value = "plain")]
    pub log_format: LogFormat,
}

fn ser_duration<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&ambit_api::duration::format_duration(*d))
}

impl Config {
    /// `--proxy-service-account` as (namespace, name), if well formed.
    pub fn proxy_service_account(&self) -> Option<(String, String)> {
        let (ns, name) = self.proxy_service_account.split_once('/')?;
        let ok = |s: &str| {
            !s.is_empty()
                && s.len() <= 253
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        };
        (ok(ns) && ok(name)).then(|| (ns.to_string(), name.to_string()))
    }

    /// Checks the values together; returns every problem found, each naming its flag.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let mut errors = Vec::new();
        if let Err(e) = ambit_api::WorkloadIdentity::new(&self.trust_domain, "ns", "sa") {
            errors.push(format!("--trust-domain: {e}"));
        }
        if !ambit_api::policy::DEFAULT_POLICIES.contains(&self.default_inbound_policy.as_str()) {
            errors.push(format!(
                "--default-inbound-policy: {}",
                ambit_api::policy::unknown_policy(&self.default_inbound_policy)
            ));
        }
        for cidr in ambit_api::policy::split_networks(&self.cluster_networks) {
            let (addr, bits) = cidr.split_once('/').unwrap_or((&cidr, "x"));
            let max = if addr.contains(':') { 128 } else { 32 };
            let ok = addr.parse::<std::net::IpAddr>().is_ok()
                && bits.parse::<u8>().is_ok_and(|b| b <= max);
            if !ok {
                errors.push(format!(
                    "--cluster-networks: {cidr:?} is not a CIDR (e.g. 10.0.0.0/8)"
                ));
            }
        }
        if self.cert_lifetime < MIN_CERT_LIFETIME {
            errors.push(format!(
                "--cert-lifetime: {} is too short; use at least 1m (default 24h)",
                ambit_api::duration::format_duration(self.cert_lifetime)
            ));
        }
        if self.clock_skew_allowance >= self.cert_lifetime {
            errors.push("--clock-skew-allowance: must be shorter than --cert-lifetime".into());
        }
        if !(1..=crate::limits::MAX_MAX_CONNECTIONS).contains(&self.max_connections) {
            errors.push(format!(
                "--max-connections: {} is out of range; use 1 to {} (default {}; each node proxy holds one connection per gRPC listener)",
                self.max_connections,
                crate::limits::MAX_MAX_CONNECTIONS,
                crate::limits::DEFAULT_MAX_CONNECTIONS
            ));
        }
        if self.local_poll_interval.is_zero() {
            errors.push("--local-poll-interval: must be more than 0".into());
        }
        if self.pki_poll_interval.is_zero() {
            errors.push("--pki-poll-interval: must be more than 0".into());
        }
        match self.backend {
            Backend::Local => {
                match &self.local_dir {
                    None => errors.push("--local-dir: required with --backend local".into()),
                    Some(d) if !d.is_dir() => {
                        errors.push(format!("--local-dir: {} is not a directory", d.display()))
                    }
                    Some(_) => {}
                }
                if self.node_tokens.is_none() {
                    errors.push(
                        "--node-tokens: required with --backend local (node credentials)".into(),
                    );
                }
            }
            Backend::Kube => {
                for (flag, set) in [
                    ("--local-dir", self.local_dir.is_some()),
                    ("--node-tokens", self.node_tokens.is_some()),
                ] {
                    if set {
                        errors.push(format!(
                            "{flag}: only for --backend local; with --backend kube the cluster comes from the API server and node proxies authenticate by TokenReview"
                        ));
                    }
                }
                if let Some(k) = &self.kubeconfig {
                    if !k.is_file() {
                        errors.push(format!(
                            "--kubeconfig: {} is not a readable file",
                            k.display()
                        ));
                    }
                }
                if self.token_review_cache_ttl > MAX_TOKEN_REVIEW_CACHE_TTL {
                    errors.push(format!(
                        "--token-review-cache-ttl: {} is too long: a revoked proxy token would be honoured that long; use at most 10m",
                        ambit_api::duration::format_duration(self.token_review_cache_ttl)
                    ));
                }
                if self.token_audience.trim().is_empty() {
                    errors.push("--token-audience: must not be empty".into());
                }
                if self.proxy_service_account().is_none() {
                    errors.push(format!(
                        "--proxy-service-account: {:?} is not `<namespace>/<name>`",
                        self.proxy_service_account
                    ));
                }
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn kube(extra: &[&str]) -> Config {
        let mut args = vec![
            "ambit-control",
            "--trust-anchors",
            "/a",
            "--issuer-cert",
            "/c",
            "--issuer-key",
            "/k",
            "--backend",
            "kube",
        ];
        args.extend_from_slice(extra);
        Config::try_parse_from(args).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_kube_backend_refuses_local_flags_and_bad_values_naming_each() {
        assert!(kube(&[]).validate().is_ok());
        let errors = kube(&[
            "--max-connections",
            "0",
            "--node-tokens",
            "/t",
            "--proxy-service-account",
            "ambit-proxy",
            "--token-review-cache-ttl",
            "1h",
            "--token-audience",
            " ",
        ])
        .validate()
        .unwrap_err();
        let flags: Vec<&str> = errors.iter().filter_map(|e| e.split(':').next()).collect();
        assert_eq!(
            flags,
            [
                "--max-connections",
                "--node-tokens",
                "--token-review-cache-ttl",
                "--token-audience",
                "--proxy-service-account"
            ],
            "{errors:?}"
        );
        assert_eq!(
            kube(&[]).max_connections,
            crate::limits::DEFAULT_MAX_CONNECTIONS
        );
        assert_eq!(kube(&["--max-connections", "50"]).max_connections, 50);
        assert_eq!(
            kube(&[]).proxy_service_account(),
            Some(("ambit".into(), "ambit-proxy".into()))
        );
    }
}
