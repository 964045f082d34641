//! `ambit diagnostics`: what each node proxy holds, as `linkerd diagnostics` and
//! `istioctl ztunnel-config` show it — its raw metrics, the pods it serves, its
//! certificates, the Services and endpoints it knows, the inbound policy of its pods.
//! Everything but the metrics comes from the proxy's `/config_dump`, which answers
//! loopback clients only: run it on the node, against the demo, or through `kubectl
//! port-forward`.

mod views;

use crate::stat::kube::KubeArgs;
use crate::stat::scrape::ProxySource;
use crate::stat::{ProxyArgs, Source};
use serde_json::Value;

/// `ambit diagnostics` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Diagnostics {
    /// Each node proxy's /metrics, as it serves them (also with --kube).
    ProxyMetrics {
        #[command(flatten)]
        proxies: ProxyArgs,
        #[command(flatten)]
        kube: KubeArgs,
    },
    /// The pods each node proxy serves: addresses, identity, workload, how they came.
    Pods(View),
    /// The workload certificates each node proxy holds: identity, pods, expiry, issuer.
    Certificates(View),
    /// The Services each node proxy knows (those its pods use) and their endpoints.
    Endpoints {
        /// One Service: NAME (with -n), NAMESPACE/NAME or NAME.NAMESPACE.
        service: Option<String>,
        #[command(flatten)]
        view: View,
    },
    /// The inbound policy of each pod: per port, its Server and who may reach it.
    Policy {
        /// One pod: NAME (with -n) or NAMESPACE/NAME.
        pod: Option<String>,
        #[command(flatten)]
        view: View,
    },
}

/// What every `/config_dump` view takes.
#[derive(Debug, clap::Args)]
pub struct View {
    /// Only this namespace.
    #[arg(short, long)]
    pub namespace: Option<String>,
    /// Output format.
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: Output,
    #[command(flatten)]
    pub proxies: ProxyArgs,
}

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Columns.
    Table,
    /// JSON, one object per proxy.
    Json,
}

/// `ambit diagnostics`.
pub fn run(cmd: Diagnostics) -> anyhow::Result<()> {
    let rt = crate::stat::runtime()?;
    let text = match cmd {
        Diagnostics::ProxyMetrics { proxies, kube } => {
            rt.block_on(proxy_metrics(&proxies, &kube))?
        }
        Diagnostics::Pods(view) => {
            let dumps = rt.block_on(dumps(&view.proxies))?;
            views::pods(&dumps, view.namespace.as_deref(), view.output)
        }
        Diagnostics::Certificates(view) => {
            let dumps = rt.block_on(dumps(&view.proxies))?;
            views::certificates(&dumps, view.namespace.as_deref(), view.output, now())
        }
        Diagnostics::Endpoints { service, view } => {
            let dumps = rt.block_on(dumps(&view.proxies))?;
            let one = service
                .map(|s| one_name(&s, view.namespace.as_deref(), true))
                .transpose()?;
            views::endpoints(
                &dumps,
                view.namespace.as_deref(),
                one.as_deref(),
                view.output,
            )?
        }
        Diagnostics::Policy { pod, view } => {
            let dumps = rt.block_on(dumps(&view.proxies))?;
            let one = pod
                .map(|p| one_name(&p, view.namespace.as_deref(), false))
                .transpose()?;
            views::policy(
                &dumps,
                view.namespace.as_deref(),
                one.as_deref(),
                view.output,
            )?
        }
    };
    crate::stat::print(&text)
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// "NAMESPACE/NAME" of a Service or pod named NAME (with `-n`), NAMESPACE/NAME, or (a
/// Service) NAME.NAMESPACE.
pub fn one_name(s: &str, namespace: Option<&str>, dotted: bool) -> anyhow::Result<String> {
    if let Some((ns, name)) = s.split_once('/') {
        if ns.is_empty() || name.is_empty() || name.contains('/') {
            anyhow::bail!("{s:?}: expected NAMESPACE/NAME");
        }
        return Ok(s.to_string());
    }
    if dotted {
        if let Some((name, ns)) = s.split_once('.') {
            return Ok(format!("{ns}/{name}"));
        }
    }
    match namespace {
        Some(ns) => Ok(format!("{ns}/{s}")),
        None => anyhow::bail!("{s:?}: which namespace? pass -n NAMESPACE or write NAMESPACE/{s}"),
    }
}

/// Each proxy's raw metrics, each after a comment line naming it.
async fn proxy_metrics(proxies: &ProxyArgs, kube: &KubeArgs) -> anyhow::Result<String> {
    let source = Source::of(proxies, kube);
    let found = source.find().await.map_err(anyhow::Error::msg)?;
    let mut out = String::new();
    let mut failed = Vec::new();
    for skipped in &found.skipped {
        failed.push(skipped.0.clone());
    }
    for proxy in &found.proxies {
        match tokio::time::timeout(proxies.timeout, proxy.text()).await {
            Ok(Ok(text)) => {
                out.push_str(&format!("# ambit-proxy {proxy}\n"));
                out.push_str(&text);
                if !text.ends_with('\n') {
                    out.push('\n');
                }
            }
            Ok(Err(e)) => failed.push(e.0),
            Err(_) => failed.push(format!("{proxy}: no answer within {:?}", proxies.timeout)),
        }
    }
    for f in &failed {
        eprintln!("{f}");
    }
    if found.proxies.is_empty() || out.is_empty() {
        anyhow::bail!("no node proxy answered; {}", source.advice());
    }
    Ok(out)
}

/// Each proxy's `/config_dump`, by admin URL.
/// (`/config_dump` answers loopback clients only, so not through the API server's pod
/// proxy: `kubectl -n ambit port-forward pod/<ambit-proxy pod> 4191` and `--proxy-admin
/// http://127.0.0.1:4191`, or run it on the node.)
async fn dumps(proxies: &ProxyArgs) -> anyhow::Result<Vec<(String, Value)>> {
    let mut out = Vec::new();
    let mut failed = Vec::new();
    for url in proxies.urls() {
        let url = url
            .trim_end_matches('/')
            .trim_end_matches("/metrics")
            .to_string();
        match crate::check::live::http_get(&format!("{url}/config_dump")).await {
            Ok((200, body)) => match serde_json::from_str(&body) {
                Ok(v) => out.push((url, v)),
                Err(e) => failed.push(format!("{url}/config_dump: not JSON ({e}); is this a node proxy's admin server?")),
            },
            Ok((status, body)) => failed.push(format!(
                "{url}/config_dump: {status} {}; it answers loopback clients only (on the node, or through kubectl port-forward)",
                body.trim()
            )),
            Err(e) => failed.push(format!("{url}: {e}; is the node proxy running, with its admin server there?")),
        }
    }
    for f in &failed {
        eprintln!("{f}");
    }
    if out.is_empty() {
        anyhow::bail!("no node proxy answered (--proxy-admin http://HOST:4191)");
    }
    Ok(out)
}
