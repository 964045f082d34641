//! `ambit edges`: who talks to whom, with the identities the proxies proved and whether the
//! hop was mTLS — as `linkerd viz edges`, from one scrape of the node proxies' `/metrics`.
//!
//! A client's proxy records each destination by the identity the server proved
//! (`server_id`), the Service asked for (`dst_service`) and, today, the workload that
//! served (`destination_workload`); a server's proxy records each client by the identity
//! it proved (`client_id`). Pods are paired per workload edge, not by `dst_pod` yet. An edge
//! joins the two: the outbound series of a source pod (its workload) with the inbound
//! series of the destination workload's pods whose client identity can be the source's
//! (same namespace; the ServiceAccount named after the source, or after no workload the
//! proxies report). What only one side saw is shown as that side saw it: a destination as
//! `svc/NAME` or `sa/NAME` when no workload the proxies report has that name (a node not
//! scraped, a Service outside the mesh), a plaintext client as `(unmeshed)`.

use crate::stat::kube::KubeArgs;
use crate::stat::parse::Sample;
use crate::stat::render::columns;
use crate::stat::scrape::ProxySource;
use crate::stat::traffic::{Direction, Directory, Peer, Traffic};
use crate::stat::{compute::Snapshot, ProxyArgs, Source};
use ambit_api::WorkloadIdentity;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;

/// Output formats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// SRC DST SRC_NS DST_NS CLIENT_ID SERVER_ID SECURED.
    #[default]
    Table,
    /// A JSON array of objects: src, src_namespace, src_resource, dst, dst_namespace,
    /// dst_resource, client_id, server_id, secured.
    Json,
}

/// `ambit edges` flags.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  ambit edges deploy -n shop --proxy-admin http://10.0.0.1:4191 http://10.0.0.2:4191
  ambit edges pod -o json
  ambit edges deploy --kube --kubeconfig ~/.kube/prod   the proxies through the API server

SECURED is √ when the hop was mTLS as each proxy that saw it says (tls=\"true\"). CLIENT_ID
is the identity the server's proxy saw, SERVER_ID the one the client's proxy required. The
proxies name a peer only by identity and Service: a destination is the workload its
ServiceAccount or Service is named after, else svc/NAME or sa/NAME; a client outside the
mesh is (unmeshed). Pod rows pair the pods of each workload edge (the proxies do not record
which pod answered which).")]
pub struct EdgesArgs {
    /// deploy or pod.
    #[arg(value_name = "TYPE", default_value = "deploy")]
    pub resource: String,
    /// Only edges from or to this namespace (default: all).
    #[arg(short, long)]
    pub namespace: Option<String>,
    /// Output format.
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: Format,
    #[command(flatten)]
    pub proxies: ProxyArgs,
}

/// One end of an edge.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct End {
    namespace: String,
    name: String,
    /// `deploy`, `pod`, `svc`, `sa`, `unmeshed`, `unknown`.
    kind: &'static str,
}

impl End {
    fn peer(p: &Peer) -> Self {
        Self {
            namespace: p.namespace().into(),
            name: p.name().into(),
            kind: p.kind(),
        }
    }

    fn local(t: &Traffic, pods: bool) -> Self {
        Self {
            namespace: t.namespace.clone(),
            name: if pods { &t.pod } else { &t.workload }.clone(),
            kind: if pods { "pod" } else { "deploy" },
        }
    }
}

/// One edge; `-o json` prints these as they are.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EdgeRow {
    /// The client: a workload or pod, or `unmeshed`, or an identity's ServiceAccount.
    pub src: String,
    /// Its namespace ("" when unknown).
    pub src_namespace: String,
    /// `deploy`, `pod`, `sa`, `unmeshed`.
    pub src_resource: String,
    /// The server: a workload or pod, or a Service, or an identity's ServiceAccount.
    pub dst: String,
    /// Its namespace ("" when unknown).
    pub dst_namespace: String,
    /// `deploy`, `pod`, `svc`, `sa`, `unknown`.
    pub dst_resource: String,
    /// The identity the server's proxy saw ("" when none or not seen; several joined by
    /// ",").
    pub client_id: String,
    /// The identity the client's proxy required ("" when none or not seen).
    pub server_id: String,
    /// Whether every proxy that saw the hop saw mTLS.
    pub secured: bool,
}

#[derive(Debug, Default)]
struct Acc {
    client_ids: BTreeSet<String>,
    server_ids: BTreeSet<String>,
    secured: bool,
    seen: bool,
}

impl Acc {
    fn add(&mut self, client_id: &str, server_id: &str, secured: bool) {
        if !client_id.is_empty() {
            self.client_ids.insert(client_id.into());
        }
        if !server_id.is_empty() {
            self.server_ids.insert(server_id.into());
        }
        self.secured = secured && (self.secured || !self.seen);
        self.seen = true;
    }
}

/// Whether client identity `id` can be workload `src`'s: the same namespace, and a
/// ServiceAccount named after it or after no workload the proxies report.
fn may_be(id: &str, src: &Traffic, dir: &Directory) -> bool {
    let Ok(id) = id.parse::<WorkloadIdentity>() else {
        return false;
    };
    id.namespace() == src.namespace
        && (id.service_account() == src.workload
            || !dir.has_workload(id.namespace(), id.service_account()))
}

/// The edges in `samples` (every proxy's, one scrape), by pod or by workload.
pub fn edges(samples: &[&Sample], pods: bool, namespace: Option<&str>) -> Vec<EdgeRow> {
    let dir = Directory::of(samples.iter().copied());
    let mut records: BTreeSet<Traffic> = BTreeSet::new();
    for s in samples {
        // An application's HTTP connection counts in tcp_open_total without `tls` (each
        // request's hop has its own): its requests say where they went and how.
        let http_connection = s.name == "tcp_open_total" && s.label("tls").is_empty();
        if matches!(s.name.as_str(), "request_total" | "tcp_open_total") && !http_connection {
            records.extend(Traffic::of(s));
        }
    }
    let (outbound, inbound): (Vec<&Traffic>, Vec<&Traffic>) = records
        .iter()
        .partition(|t| t.direction == Direction::Outbound);
    let mut rows: BTreeMap<(End, End), Acc> = BTreeMap::new();
    let mut joined: BTreeSet<&Traffic> = BTreeSet::new();
    for o in &outbound {
        let dst = dir.server(o);
        let src = End::local(o, pods);
        let matches: Vec<&&Traffic> = match &dst {
            Peer::Workload { namespace, name } if o.tls => inbound
                .iter()
                .filter(|i| {
                    i.namespace == *namespace
                        && i.workload == *name
                        && !i.peer_id.is_empty()
                        && may_be(&i.peer_id, o, &dir)
                })
                .collect(),
            _ => Vec::new(),
        };
        if matches.is_empty() {
            rows.entry((src.clone(), End::peer(&dst)))
                .or_default()
                .add("", &o.peer_id, o.tls);
        }
        for i in matches {
            joined.insert(i);
            rows.entry((src.clone(), End::local(i, pods)))
                .or_default()
                .add(&i.peer_id, &o.peer_id, o.tls && i.tls);
        }
    }
    for i in inbound.iter().filter(|i| !joined.contains(**i)) {
        rows.entry((End::peer(&dir.client(i)), End::local(i, pods)))
            .or_default()
            .add(&i.peer_id, "", i.tls);
    }
    rows.into_iter()
        .filter(|((s, d), _)| namespace.is_none_or(|n| s.namespace == n || d.namespace == n))
        .map(|((s, d), acc)| EdgeRow {
            src: s.name.clone(),
            src_namespace: s.namespace.clone(),
            src_resource: s.kind.into(),
            dst: d.name.clone(),
            dst_namespace: d.namespace.clone(),
            dst_resource: d.kind.into(),
            client_id: acc.client_ids.into_iter().collect::<Vec<_>>().join(","),
            server_id: acc.server_ids.into_iter().collect::<Vec<_>>().join(","),
            secured: acc.secured,
        })
        .collect()
}

/// The table or JSON of `rows` of `kind` (`deploy`, `pod`).
pub fn render(rows: &[EdgeRow], format: Format, kind: &str) -> String {
    if format == Format::Json {
        return serde_json::to_string_pretty(rows).map_or_else(|e| format!("{e}\n"), |s| s + "\n");
    }
    let dash = |s: &str| {
        if s.is_empty() {
            "-".to_string()
        } else {
            s.to_string()
        }
    };
    // Bare when of the kind asked for, else `kind/name`, or `(unmeshed)`.
    let end = |name: &str, resource: &str| match resource {
        r if r == kind => name.to_string(),
        "unmeshed" | "unknown" => format!("({name})"),
        r => format!("{r}/{name}"),
    };
    let mut table = vec![[
        "SRC",
        "DST",
        "SRC_NS",
        "DST_NS",
        "CLIENT_ID",
        "SERVER_ID",
        "SECURED",
    ]
    .map(String::from)
    .to_vec()];
    for r in rows {
        table.push(vec![
            end(&r.src, &r.src_resource),
            end(&r.dst, &r.dst_resource),
            dash(&r.src_namespace),
            dash(&r.dst_namespace),
            dash(&r.client_id),
            dash(&r.server_id),
            if r.secured { "√" } else { "×" }.into(),
        ]);
    }
    columns(&table)
}

/// `ambit edges` against the proxies of `source`: the text to print; why a proxy was
/// skipped goes to `warn`.
pub async fn execute(
    args: &EdgesArgs,
    source: &dyn ProxySource,
    warn: &mut dyn Write,
) -> anyhow::Result<String> {
    let pods = match args.resource.as_str() {
        "deploy" | "deployment" | "deployments" | "workload" | "workloads" => false,
        "pod" | "po" | "pods" => true,
        other => anyhow::bail!("{other:?}: `ambit edges` shows deploy or pod edges"),
    };
    let (Snapshot { proxies }, _) =
        crate::stat::scrape_once(source, args.proxies.timeout, warn).await?;
    let samples: Vec<&Sample> = proxies.values().flatten().collect();
    let rows = edges(&samples, pods, args.namespace.as_deref());
    if rows.is_empty() && args.output != Format::Json {
        let _ = writeln!(warn, "No edges found: the proxies report no traffic yet.");
    }
    Ok(render(
        &rows,
        args.output,
        if pods { "pod" } else { "deploy" },
    ))
}

/// `ambit edges`.
pub fn run(args: EdgesArgs, kube: &KubeArgs) -> anyhow::Result<()> {
    let source = Source::of(&args.proxies, kube);
    let text = crate::stat::runtime()?.block_on(execute(&args, &source, &mut std::io::stderr()))?;
    crate::stat::print(&text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stat::fixtures::{A2, B2};
    use crate::stat::parse::parse;
    use crate::stat::scrape::Flags;

    fn edges_of(texts: &[&str], pods: bool, namespace: Option<&str>) -> Vec<EdgeRow> {
        let samples: Vec<Sample> = texts.iter().flat_map(|t| parse(t).unwrap()).collect();
        let refs: Vec<&Sample> = samples.iter().collect();
        edges(&refs, pods, namespace)
    }

    type Brief = (String, String, String, String, bool);

    /// (src, dst, client_id, server_id, secured), other kinds than deploy and pod
    /// prefixed, identities without `spiffe://cluster.local/ns/`.
    fn brief(rows: &[EdgeRow]) -> Vec<Brief> {
        let short = |id: &str| id.replace("spiffe://cluster.local/ns/", "");
        let name = |n: &str, r: &str| match r {
            "deploy" | "pod" => n.to_string(),
            r => format!("{r}/{n}"),
        };
        rows.iter()
            .map(|r| {
                (
                    name(&r.src, &r.src_resource),
                    name(&r.dst, &r.dst_resource),
                    short(&r.client_id),
                    short(&r.server_id),
                    r.secured,
                )
            })
            .collect()
    }

    fn e(src: &str, dst: &str, client: &str, server: &str, secured: bool) -> Brief {
        (
            src.into(),
            dst.into(),
            client.into(),
            server.into(),
            secured,
        )
    }

    #[test]
    fn workload_edges_join_the_clients_and_the_servers_side() {
        let rows = edges_of(&[A2, B2], false, None);
        assert_eq!(
            brief(&rows),
            [
                // api-0's plaintext TCP from outside the mesh: only the server saw it.
                e("unmeshed/unmeshed", "api", "", "", false),
                // load-0 (node b) → web-0 (node a): both sides, mTLS on both.
                e("load", "web", "shop/sa/load", "shop/sa/web", true),
                // Opaque TCP to a Service outside the mesh.
                e("web", "svc/db", "", "", false),
                // web-0 → api-0 (node a) and api-1 (node b): one workload edge.
                e("web", "api", "shop/sa/web", "shop/sa/api", true),
            ]
        );
        assert_eq!(
            (
                rows[2].src_namespace.as_str(),
                rows[2].dst_namespace.as_str()
            ),
            ("shop", "data")
        );
        // -n: edges from or to the namespace.
        assert_eq!(edges_of(&[A2, B2], false, Some("data")).len(), 1);
        assert_eq!(edges_of(&[A2, B2], false, Some("shop")).len(), 4);
        assert!(edges_of(&[A2, B2], false, Some("other")).is_empty());
    }

    #[test]
    fn pod_edges_pair_the_pods_of_each_workload_edge() {
        assert_eq!(
            brief(&edges_of(&[A2, B2], true, None)),
            [
                e("unmeshed/unmeshed", "api-0", "", "", false),
                e("load-0", "web-0", "shop/sa/load", "shop/sa/web", true),
                e("web-0", "svc/db", "", "", false),
                e("web-0", "api-0", "shop/sa/web", "shop/sa/api", true),
                e("web-0", "api-1", "shop/sa/web", "shop/sa/api", true),
            ]
        );
    }

    #[test]
    fn what_one_side_saw_is_shown_as_it_saw_it() {
        // Only node a scraped: load-0's proxy (node b) is not, so web-0's client is known
        // by its identity only; api-1's inbound is missing, api-0's joins web's outbound.
        assert_eq!(
            brief(&edges_of(&[A2], false, None)),
            [
                e("unmeshed/unmeshed", "api", "", "", false),
                e("sa/load", "web", "shop/sa/load", "", true),
                e("web", "svc/db", "", "", false),
                e("web", "api", "shop/sa/web", "shop/sa/api", true),
            ]
        );
    }

    #[test]
    fn shared_service_accounts_join_by_namespace_and_service() {
        // ServiceAccounts not named after workloads (`default`): the destination is the
        // workload named after the Service, the client identity one of the source's
        // namespace that names no other workload. A client from a node not scraped stays
        // an identity.
        let text = r#"request_total{direction="outbound",namespace="books",pod="frontend-0",workload="frontend",client_id="",server_id="spiffe://cluster.local/ns/books/sa/default",dst_service="catalog.books",tls="true"} 5
request_total{direction="inbound",namespace="books",pod="catalog-0",workload="catalog",client_id="spiffe://cluster.local/ns/books/sa/default",server_id="",dst_service="",tls="true"} 5
request_total{direction="inbound",namespace="books",pod="catalog-0",workload="catalog",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true"} 2
request_total{direction="inbound",namespace="books",pod="catalog-0",workload="catalog",client_id="spiffe://cluster.local/ns/books/sa/catalog",server_id="",dst_service="",tls="true"} 1
# EOF
"#;
        assert_eq!(
            brief(&edges_of(&[text], false, None)),
            [
                // Named after a workload that is not frontend: not frontend's traffic.
                e("catalog", "catalog", "books/sa/catalog", "", true),
                e(
                    "frontend",
                    "catalog",
                    "books/sa/default",
                    "books/sa/default",
                    true
                ),
                e("sa/web", "catalog", "shop/sa/web", "", true),
            ]
        );
    }

    #[test]
    fn table_and_json() {
        let rows = edges_of(&[A2, B2], false, None);
        assert_eq!(
            render(&rows, Format::Table, "deploy"),
            "\
SRC          DST      SRC_NS   DST_NS   CLIENT_ID                                SERVER_ID                               SECURED
(unmeshed)   api      -        shop     -                                        -                                       ×
load         web      shop     shop     spiffe://cluster.local/ns/shop/sa/load   spiffe://cluster.local/ns/shop/sa/web   √
web          svc/db   shop     data     -                                        -                                       ×
web          api      shop     shop     spiffe://cluster.local/ns/shop/sa/web    spiffe://cluster.local/ns/shop/sa/api   √
"
        );
        let json: serde_json::Value =
            serde_json::from_str(&render(&rows, Format::Json, "deploy")).unwrap();
        assert_eq!(
            json[3],
            serde_json::json!({
                "src": "web", "src_namespace": "shop", "src_resource": "deploy",
                "dst": "api", "dst_namespace": "shop", "dst_resource": "deploy",
                "client_id": "spiffe://cluster.local/ns/shop/sa/web",
                "server_id": "spiffe://cluster.local/ns/shop/sa/api",
                "secured": true
            })
        );
        assert_eq!(json[0]["secured"], false);
    }

    #[tokio::test]
    async fn edges_from_one_scrape_of_the_proxies() {
        use clap::Parser;
        #[derive(Debug, Parser)]
        struct Cli {
            #[command(flatten)]
            edges: EdgesArgs,
        }
        let a = crate::stat::tests::serve(vec![(200, A2.into())]).await;
        let b = crate::stat::tests::serve(vec![(200, B2.into())]).await;
        let down = crate::stat::tests::closed().await;
        let args =
            Cli::try_parse_from(["edges", "pod", "-o", "json", "--proxy-admin", &a, &b, &down])
                .unwrap()
                .edges;
        let mut warn = Vec::new();
        let out = execute(&args, &Flags(&args.proxies.proxy_admin), &mut warn)
            .await
            .unwrap();
        let warn = String::from_utf8(warn).unwrap();
        assert!(
            warn.contains(&format!(
                "skipping a node proxy: {down}/metrics: cannot connect"
            )),
            "{warn}"
        );
        let rows: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(rows.as_array().unwrap().len(), 5, "{out}");
        assert_eq!(rows[4]["dst"], "api-1");

        let args = Cli::try_parse_from(["edges", "ns", "--proxy-admin", &a])
            .unwrap()
            .edges;
        let e = execute(&args, &Flags(&args.proxies.proxy_admin), &mut Vec::new())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("deploy or pod"), "{e}");
        let args = Cli::try_parse_from(["edges", "--proxy-admin", &down])
            .unwrap()
            .edges;
        let e = execute(&args, &Flags(&args.proxies.proxy_admin), &mut Vec::new())
            .await
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("none of the 1 node proxies answered"),
            "{e}"
        );
    }

    #[test]
    fn an_http_connection_without_tls_of_its_own_leaves_its_mtls_edge_secured() {
        // Today's labels: the outbound HTTP connection counts in tcp_open_total without
        // `tls`; its requests went over mTLS.
        let text = r#"request_total{direction="outbound",namespace="shop",pod="web-0",deployment="web",server_id="spiffe://cluster.local/ns/shop/sa/api",dst_namespace="shop",dst_service="api",dst_pod="api-0",dst_deployment="api",tls="true",source_workload_namespace="shop",source_workload="web",destination_workload_namespace="shop",destination_workload="api"} 5
tcp_open_total{direction="outbound",namespace="shop",pod="web-0",deployment="web",dst_namespace="shop",dst_service="api",source_workload_namespace="shop",source_workload="web",destination_service_namespace="shop",destination_service_name="api"} 2
request_total{direction="inbound",namespace="shop",pod="api-0",deployment="api",client_id="spiffe://cluster.local/ns/shop/sa/web",tls="true",destination_workload_namespace="shop",destination_workload="api",source_principal="spiffe://cluster.local/ns/shop/sa/web"} 5
# EOF
"#;
        assert_eq!(
            brief(&edges_of(&[text], false, None)),
            [e("web", "api", "shop/sa/web", "shop/sa/api", true)]
        );
    }
}
