//! `ambit check`: what is wrong, and what to do about it — as `linkerd check`, with √ / ‼
//! / × lines grouped by section, a hint under each failure, `-o json`, a non-zero exit on
//! any ×, and with `--strict` on any ‼ too (Linkerd exits 0 on an expiring certificate,
//! which has caused outages).
//!
//! - `report`: the result model and its renderings.
//! - `pre` (`--pre`): can this node run the node proxy?
//! - `trust`: the PKI files (anchors and issuer: validity, chain).
//! - `live`: the control plane and (`--proxy`) the node proxies, as they run.

pub(crate) mod live;
mod pre;
mod report;
mod trust;

use ambit_api::WorkloadIdentity;
use anyhow::Context;
use report::Report;
use std::path::PathBuf;

/// How `ambit check` shows what it found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// √ / ‼ / × lines by section.
    #[default]
    Table,
    /// `{"success": …, "categories": [{"categoryName", "checks": [{"description", "result",
    /// "error", "hint"}]}]}`.
    Json,
}

/// `ambit check` flags.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// Check this node before installing: kernel and BTF, cgroup v2, bpffs, that the eBPF
    /// programs load, nftables, a primary CNI configuration, the clock.
    #[arg(long)]
    pub pre: bool,
    /// Also check the node proxies (`--proxy-admin`): ready, certificates under the current
    /// anchors, the control plane's version.
    #[arg(long)]
    pub proxy: bool,
    /// Exit non-zero on warnings (‼) too, not only on errors (×).
    #[arg(long)]
    pub strict: bool,
    /// Output format.
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: Output,
    #[command(flatten)]
    pub node: pre::PreArgs,
    /// The trust anchors (PEM bundle) the mesh uses.
    #[arg(long)]
    pub trust_anchors: Option<PathBuf>,
    /// The issuer certificate the control plane signs with (PEM; its certificate first).
    #[arg(long)]
    pub issuer_cert: Option<PathBuf>,
    /// The mesh's trust domain.
    #[arg(long, default_value = ambit_api::DEFAULT_TRUST_DOMAIN)]
    pub trust_domain: String,
    /// The control plane's identity service (it speaks only TLS) [default: the running
    /// demo's, else https://127.0.0.1:8080].
    #[arg(long)]
    pub identity_url: Option<String>,
    /// The control plane's admin server (`/ready`, `/version`) [default: the running
    /// demo's, else http://127.0.0.1:9990].
    #[arg(long)]
    pub control_admin: Option<String>,
    /// The identity the control plane must prove (default
    /// `spiffe://<trust domain>/ns/ambit/sa/ambit-control`).
    #[arg(long)]
    pub control_identity: Option<String>,
    /// The node proxies' admin servers (`--proxy`) [default: the running demo's, else
    /// http://127.0.0.1:4191].
    #[arg(long = "proxy-admin", num_args = 1..)]
    pub proxy_admin: Vec<String>,
}

impl CheckArgs {
    /// What was not given, from the running demo (`ambit demo up`) if there is one, else
    /// the defaults of a node of a cluster.
    fn with_defaults(mut self) -> Self {
        let demo = match crate::demo::state::State::load() {
            Ok(s) => s,
            Err(e) => {
                eprintln!("ignoring the demo's state: {e:#}");
                None
            }
        };
        if let Some(d) = demo.as_ref().filter(|_| self.pre) {
            eprintln!("(the running demo's nodes, unless flags say otherwise)");
            self.node.demo = true;
            if let Some(node) = d.nodes.first() {
                self.node.cgroup_path.get_or_insert(node.cgroup.clone());
            }
        }
        if let Some(d) = demo.filter(|_| !self.pre) {
            eprintln!(
                "(the running demo's PKI, control plane and proxies, unless flags say otherwise)"
            );
            self.trust_anchors
                .get_or_insert(d.control.trust_anchors.clone());
            self.issuer_cert
                .get_or_insert(d.control.issuer_cert.clone());
            self.identity_url
                .get_or_insert(d.control.identity_url.clone());
            self.control_admin
                .get_or_insert(d.control.admin_url.clone());
            if self.proxy_admin.is_empty() {
                self.proxy_admin = d.proxy_admins();
            }
        }
        self.identity_url
            .get_or_insert_with(|| "https://127.0.0.1:8080".into());
        self.control_admin
            .get_or_insert_with(|| "http://127.0.0.1:9990".into());
        if self.proxy_admin.is_empty() {
            self.proxy_admin = vec!["http://127.0.0.1:4191".into()];
        }
        self
    }
}

/// Runs the checks; prints the report; returns the exit status.
pub fn run(args: CheckArgs) -> anyhow::Result<i32> {
    let args = args.with_defaults();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let mut report = rt.block_on(collect(&args))?;
    let code = report.finish(args.strict);
    let text = match args.output {
        Output::Table => report.text(),
        Output::Json => format!("{}\n", serde_json::to_string_pretty(&report)?),
    };
    // A closed pipe (`| head`) is not an error of the checks.
    use std::io::Write;
    match std::io::stdout().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => return Err(e.into()),
        _ => {}
    }
    Ok(code)
}

async fn collect(args: &CheckArgs) -> anyhow::Result<Report> {
    let mut report = Report::default();
    if args.pre {
        report.add("ambit-node", pre::checks(&args.node));
        return Ok(report);
    }
    let anchors_path = args.trust_anchors.clone().context(
        "--trust-anchors is required: the PEM bundle the mesh trusts (`ambit pki init` wrote trust-anchor.crt)",
    )?;
    let anchors = std::fs::read(&anchors_path)
        .with_context(|| format!("--trust-anchors {}", anchors_path.display()))?;
    let issuer = match &args.issuer_cert {
        Some(p) => Some((
            p.clone(),
            std::fs::read(p).with_context(|| format!("--issuer-cert {}", p.display()))?,
        )),
        None => None,
    };
    report.add(
        "ambit-pki",
        trust::checks(
            (&anchors_path, &anchors),
            issuer.as_ref().map(|(p, b)| (p.as_path(), b.as_slice())),
            std::time::SystemTime::now(),
        ),
    );
    let bundle = ambit_proxy::tls::TrustBundle::from_pem(&anchors, &args.trust_domain)
        .map_err(|e| anyhow::anyhow!("--trust-anchors {}: {e}", anchors_path.display()))?;
    let control_id: WorkloadIdentity = match &args.control_identity {
        Some(id) => id.parse().context("--control-identity")?,
        None => WorkloadIdentity::new(
            &args.trust_domain,
            ambit_api::CONTROL_PLANE_NAMESPACE,
            ambit_api::CONTROL_PLANE_SERVICE_ACCOUNT,
        )
        .context("--trust-domain")?,
    };
    let (checks, version) = live::control_plane(
        args.control_admin.as_deref().unwrap_or_default(),
        args.identity_url.as_deref().unwrap_or_default(),
        &bundle,
        &control_id,
    )
    .await;
    report.add("ambit-control-plane", checks);
    if args.proxy {
        let mut checks = Vec::new();
        for admin in &args.proxy_admin {
            checks.extend(live::proxy(admin, &bundle, version.as_deref()).await);
        }
        report.add("ambit-proxy", checks);
    }
    Ok(report)
}
