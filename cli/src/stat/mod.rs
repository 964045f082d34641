//! `ambit stat`: golden metrics per workload, pod or namespace, from the node proxies'
//! `/metrics`, as `linkerd viz stat` shows them from Prometheus.
//!
//! - `scrape`: where the proxies are ([`scrape::ProxySource`]) and reading their metrics;
//!   `kube`: the proxies' pods through the Kubernetes API server (`--kube`).
//! - `parse`: the text exposition format into samples.
//! - `traffic`: the proxies' traffic series, typed, and who the peer of each was (shared
//!   with `ambit edges`).
//! - `compute`: two scrapes → rows, as PromQL computes rates, ratios and quantiles;
//!   `quantile`: `histogram_quantile`.
//! - `render`: the table and JSON.

pub mod compute;
pub mod kube;
pub mod parse;
mod quantile;
pub mod render;
pub mod scrape;
pub mod traffic;

#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
pub(crate) mod tests;

use anyhow::{bail, Context};
use compute::{Edge, Resource, Selection, Snapshot, Target};
use kube::KubeArgs;
use render::Format;
use scrape::{Finding, Flags, Found, Proxy, ProxySource, ScrapeError};
use std::io::Write;
use std::time::Duration;

/// Where the node proxies are, for `ambit stat` and `ambit edges` (with [`KubeArgs`]).
#[derive(Debug, clap::Args)]
pub struct ProxyArgs {
    /// The node proxies' admin servers, one per node (http://HOST:4191); several may follow
    /// one flag, or repeat it [default: the running demo's proxies, else
    /// http://127.0.0.1:4191; or --kube].
    #[arg(long = "proxy-admin", value_name = "URL", num_args = 1..)]
    pub proxy_admin: Vec<String>,
    /// How long each proxy may take to answer.
    #[arg(long, default_value = "5s", value_parser = ambit_api::duration::parse_duration)]
    pub timeout: Duration,
}

/// `ambit stat` flags.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  ambit stat deploy -n shop --proxy-admin http://10.0.0.1:4191 http://10.0.0.2:4191
  ambit stat deploy/web -t 30s             one workload over 30 seconds
  ambit stat deploy --from deploy/web      what web sends, by destination
  ambit stat pod --to deploy/api -o wide   who calls api, by client pod
  ambit stat ns -o json
  ambit stat deploy --kube                 the proxies through the Kubernetes API server

Without --from/--to a row counts what its pods receive (the servers' view). --from and
--to count what clients send (the outbound side), so they include failures the client saw.
The proxies name a peer only by its identity and the Service asked for: a destination is
the workload its ServiceAccount or its Service is named after, else svc/NAME or sa/NAME.
TCP_CONN and the byte rates count the connections applications open through their proxy,
opaque and HTTP alike (not yet the inbound HTTP streams between proxies); an HTTP
connection's bytes are added after each request, an opaque one's when it closes.")]
pub struct StatArgs {
    /// What to show a row for: deploy, pod or ns; or TYPE/NAME for one of them.
    #[arg(value_name = "TYPE", default_value = "deploy")]
    pub resource: String,
    /// Only the row of this name.
    pub name: Option<String>,
    /// Only rows in this namespace (default: all).
    #[arg(short, long)]
    pub namespace: Option<String>,
    /// Only traffic sent by this resource (deploy/NAME, pod/NAME, ns/NAME), one row per
    /// destination.
    #[arg(long, value_name = "TYPE/NAME", conflicts_with = "to")]
    pub from: Option<String>,
    /// The namespace of --from (default: -n's, else any).
    #[arg(long, value_name = "NAMESPACE")]
    pub from_namespace: Option<String>,
    /// Only traffic sent to this resource (deploy/NAME, ns/NAME), one row per client.
    #[arg(long, value_name = "TYPE/NAME")]
    pub to: Option<String>,
    /// The namespace of --to (default: -n's, else any).
    #[arg(long, value_name = "NAMESPACE")]
    pub to_namespace: Option<String>,
    /// The window the rates are measured over: the proxies are scraped at its start and at
    /// its end.
    #[arg(short = 't', long, default_value = "10s", value_parser = window)]
    pub window: Duration,
    /// Output format.
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: Format,
    #[command(flatten)]
    pub proxies: ProxyArgs,
}

impl ProxyArgs {
    /// The admin URLs to scrape: `--proxy-admin`'s; else the running demo's proxies
    /// (`ambit demo up`); else the node's own proxy on 127.0.0.1:4191.
    pub fn urls(&self) -> Vec<String> {
        if !self.proxy_admin.is_empty() {
            return self.proxy_admin.clone();
        }
        match crate::demo::state::State::load() {
            Ok(Some(demo)) => return demo.proxy_admins(),
            Ok(None) => {}
            Err(e) => eprintln!("ignoring the demo's state: {e:#}"),
        }
        vec!["http://127.0.0.1:4191".into()]
    }
}

/// Where `ambit stat` and `ambit edges` find the node proxies.
#[derive(Debug)]
pub enum Source<'a> {
    /// `--kube`: the pods, through the API server.
    Kube(kube::Pods<'a>),
    /// Admin URLs.
    Urls(Vec<String>),
}

impl<'a> Source<'a> {
    /// The pods with `--kube`, else [`ProxyArgs::urls`].
    pub fn of(proxies: &ProxyArgs, kube: &'a KubeArgs) -> Self {
        if kube.kube {
            Self::Kube(kube::Pods(kube))
        } else {
            Self::Urls(proxies.urls())
        }
    }
}

impl ProxySource for Source<'_> {
    fn find(&self) -> Finding<'_> {
        match self {
            Self::Kube(pods) => pods.find(),
            Self::Urls(urls) => Box::pin(std::future::ready(Flags(urls).found())),
        }
    }

    fn advice(&self) -> String {
        match self {
            Self::Kube(pods) => pods.advice(),
            Self::Urls(urls) => Flags(urls).advice(),
        }
    }
}

fn window(s: &str) -> Result<Duration, String> {
    match ambit_api::duration::parse_duration(s)? {
        d if d.is_zero() => Err("the window must be longer than 0s (e.g. 10s)".into()),
        d => Ok(d),
    }
}

/// `deploy`, `deploy NAME` or `deploy/NAME`.
pub fn resource_and_name(
    resource: &str,
    name: Option<&str>,
) -> Result<(Resource, Option<String>), String> {
    match resource.split_once('/') {
        Some((kind, n)) => {
            if let Some(extra) = name {
                return Err(format!(
                    "{resource:?} already names one resource; drop {extra:?} or write `{kind} {extra}`"
                ));
            }
            if n.is_empty() {
                return Err(format!("{resource:?}: the name after '/' is missing"));
            }
            Ok((Resource::parse(kind)?, Some(n.to_string())))
        }
        None => Ok((Resource::parse(resource)?, name.map(str::to_string))),
    }
}

fn selection(args: &StatArgs) -> Result<Selection, String> {
    let (resource, name) = resource_and_name(&args.resource, args.name.as_deref())?;
    let ns = args.namespace.clone();
    let edge = match (&args.from, &args.to) {
        (Some(f), None) => Edge::From(
            Target::parse(f, args.from_namespace.clone().or(ns.clone()))
                .map_err(|e| format!("--from {e}"))?,
        ),
        (None, Some(t)) => Edge::To(
            Target::parse(t, args.to_namespace.clone().or(ns.clone()))
                .map_err(|e| format!("--to {e}"))?,
        ),
        (None, None) => Edge::All,
        (Some(_), Some(_)) => return Err("give --from or --to, not both".into()),
    };
    let sel = Selection {
        resource,
        name,
        namespace: ns,
        edge,
    };
    sel.check()?;
    Ok(sel)
}

/// Writes each proxy that did not answer to `warn`.
pub fn report(failed: &[ScrapeError], warn: &mut dyn Write) {
    for e in failed {
        let _ = writeln!(warn, "skipping a node proxy: {e}");
    }
}

/// Scrapes `source`'s proxies once (why any was skipped goes to `warn`): the metrics, and
/// the proxies that answered; an error when none did.
pub async fn scrape_once(
    source: &dyn ProxySource,
    timeout: Duration,
    warn: &mut dyn Write,
) -> anyhow::Result<(Snapshot, Vec<Proxy>)> {
    let Found { proxies, skipped } = source.find().await.map_err(anyhow::Error::msg)?;
    report(&skipped, warn);
    let (answered, failed) = scrape::scrape_all(&proxies, timeout).await;
    report(&failed, warn);
    if answered.is_empty() {
        bail!(
            "none of the {} node proxies answered (above: why); {}",
            proxies.len(),
            source.advice()
        );
    }
    let answering = proxies
        .into_iter()
        .filter(|p| answered.contains_key(&p.to_string()))
        .collect();
    Ok((Snapshot { proxies: answered }, answering))
}

/// `ambit stat` against the proxies of `source`: the text to print; why a proxy was
/// skipped goes to `warn`.
pub async fn execute(
    args: &StatArgs,
    source: &dyn ProxySource,
    warn: &mut dyn Write,
) -> anyhow::Result<String> {
    let sel = selection(args).map_err(anyhow::Error::msg)?;
    let start = tokio::time::Instant::now();
    // Only the proxies that answered the first time can give a rate.
    let (before, again) = scrape_once(source, args.proxies.timeout, warn).await?;
    tokio::time::sleep_until(start + args.window).await;
    let end = tokio::time::Instant::now();
    let (proxies, failed) = scrape::scrape_all(&again, args.proxies.timeout).await;
    report(&failed, warn);
    if proxies.is_empty() {
        bail!("no node proxy answered both scrapes (above: why), so there is no rate to show");
    }
    let after = Snapshot { proxies };
    let rows = compute::compute(&before, &after, end - start, &sel);
    if rows.is_empty() && args.output != Format::Json {
        let _ = writeln!(
            warn,
            "No traffic found: the proxies report no {} matching the selection.",
            sel.resource.kind()
        );
    }
    Ok(render::render(&rows, args.output, sel.resource.kind()))
}

/// Prints `text`; a closed pipe (`| head`) is not an error.
pub fn print(text: &str) -> anyhow::Result<()> {
    match std::io::stdout().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// A runtime for one command.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
}

/// `ambit stat`.
pub fn run(args: StatArgs, kube: &KubeArgs) -> anyhow::Result<()> {
    let source = Source::of(&args.proxies, kube);
    let text = runtime()?.block_on(execute(&args, &source, &mut std::io::stderr()))?;
    print(&text)
}
