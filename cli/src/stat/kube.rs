//! The node proxies through the Kubernetes API server (`--kube`): the Running pods of the
//! chart's DaemonSet, each scraped through the API server's pod proxy
//! (`GET /api/v1/namespaces/NS/pods/POD:PORT/proxy/metrics`). So nothing but the
//! kubeconfig's access is needed — no route to the nodes, no port-forward: `list` on pods
//! and `get` on pods/proxy in Ambit's namespace.

use super::scrape::{Finding, Found, ProxySource, ScrapeError, ACCEPT, MAX_BODY};
use http_body_util::{BodyExt, Limited};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use std::fmt;
use std::path::PathBuf;

/// The label the chart puts on the node proxies' pods (helm/ambit/templates/proxy.yaml).
pub const PROXY_SELECTOR: &str = "app.kubernetes.io/name=ambit-proxy";
/// The name of the node proxy container's admin port in the chart.
pub const ADMIN_PORT_NAME: &str = "admin-http";
/// The admin port when a pod names none.
pub const DEFAULT_ADMIN_PORT: u16 = 4191;
/// The namespace the README installs Ambit in.
pub const DEFAULT_NAMESPACE: &str = "ambit";

/// Finding the node proxies through the Kubernetes API server.
#[derive(Debug, Clone, clap::Args)]
pub struct KubeArgs {
    /// Find the node proxies through the Kubernetes API server: the Running pods of the
    /// ambit-proxy DaemonSet, each scraped through the API server's pod proxy (needs list
    /// on pods and get on pods/proxy).
    #[arg(long, conflicts_with = "proxy_admin")]
    pub kube: bool,
    /// The kubeconfig for --kube [default: KUBECONFIG, else ~/.kube/config, else the
    /// in-cluster service account].
    #[arg(long, value_name = "PATH", requires = "kube")]
    pub kubeconfig: Option<PathBuf>,
    /// The namespace Ambit is installed in, for --kube.
    #[arg(long, value_name = "NAMESPACE", default_value = DEFAULT_NAMESPACE, requires = "kube")]
    pub proxy_namespace: String,
}

/// The node proxy pods of `--proxy-namespace`, through the API server.
#[derive(Debug)]
pub struct Pods<'a>(pub &'a KubeArgs);

impl ProxySource for Pods<'_> {
    fn find(&self) -> Finding<'_> {
        Box::pin(async move {
            let (client, server) = connect(self.0).await?;
            let ns = &self.0.proxy_namespace;
            let pods = Api::<Pod>::namespaced(client.clone(), ns)
                .list(&ListParams::default().labels(PROXY_SELECTOR))
                .await
                .map_err(|e| list_error(&e, &server, ns))?;
            let (admins, skipped) = select(&pods.items);
            if admins.is_empty() {
                return Err(none_running(ns, &skipped));
            }
            Ok(Found {
                proxies: admins
                    .into_iter()
                    .map(|admin| {
                        super::scrape::Proxy::Pod(PodProxy {
                            client: client.clone(),
                            admin,
                        })
                    })
                    .collect(),
                skipped: skipped.into_iter().map(ScrapeError).collect(),
            })
        })
    }

    fn advice(&self) -> String {
        format!(
            "check that the node proxies are ready (kubectl -n {} get pods -l {PROXY_SELECTOR})",
            self.0.proxy_namespace
        )
    }
}

/// A client from `--kubeconfig`, else as kubectl finds one; and the API server's URL.
async fn connect(args: &KubeArgs) -> Result<(kube::Client, String), String> {
    let mut config = match &args.kubeconfig {
        Some(path) => {
            let at = |e: &dyn std::error::Error| {
                format!("--kubeconfig {}: {}", path.display(), chain(e))
            };
            let file = kube::config::Kubeconfig::read_from(path).map_err(|e| at(&e))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| at(&e))?
        }
        None => kube::Config::infer().await.map_err(|e| {
            format!(
                "no Kubernetes configuration: {}; give --kubeconfig PATH or set KUBECONFIG (or run in a pod)",
                chain(&e)
            )
        })?,
    };
    // kube-rs retries a 503 for minutes; the API server answers 503 for a pod it cannot
    // reach, which is to be reported at once, not waited out until --timeout.
    config.default_retry = false;
    let server = config
        .cluster_url
        .to_string()
        .trim_end_matches('/')
        .to_string();
    let client = kube::Client::try_from(config)
        .map_err(|e| format!("a client for the API server at {server}: {}", chain(&e)))?;
    Ok((client, server))
}

/// Why listing the pods failed, and what to do.
fn list_error(e: &kube::Error, server: &str, ns: &str) -> String {
    let what = format!("listing the node proxy pods in namespace {ns} at {server}");
    match e {
        kube::Error::Api(s) if s.code == 401 => format!(
            "{what}: the API server refused the credentials (401 {}); check the kubeconfig's user and token (kubectl auth whoami), or log in again",
            s.message
        ),
        kube::Error::Api(s) if s.code == 403 => format!(
            "{what}: forbidden ({}); --kube needs list on pods and get on pods/proxy in {ns} (kubectl auth can-i list pods -n {ns})",
            s.message
        ),
        kube::Error::Api(s) => format!("{what}: {} {}: {}", s.code, s.reason, s.message),
        e => format!(
            "{what}: {}; is the API server up and the kubeconfig's server right (kubectl cluster-info)?",
            chain(e)
        ),
    }
}

/// The error when no node proxy pod runs: the ones that exist, or where to look.
fn none_running(ns: &str, skipped: &[String]) -> String {
    if skipped.is_empty() {
        return format!(
            "no pod labelled {PROXY_SELECTOR} in namespace {ns}; is Ambit installed there (helm install ambit helm/ambit --namespace {ns}), or in another namespace (--proxy-namespace)?"
        );
    }
    format!(
        "no node proxy pod is Running in namespace {ns}: {}",
        skipped.join("; ")
    )
}

/// `e` and its sources, as one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = cause.source();
    }
    text
}

/// A node proxy pod: where it runs, and its admin port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodAdmin {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// Its node ("" while unscheduled).
    pub node: String,
    /// The admin server's container port.
    pub port: u16,
}

/// The pods to scrape — those Running, at their admin port — and, for each other one,
/// why not and what to do; both sorted by node.
pub fn select(pods: &[Pod]) -> (Vec<PodAdmin>, Vec<String>) {
    let mut admins: Vec<PodAdmin> = Vec::new();
    let mut skipped = Vec::new();
    for pod in pods {
        let spec = pod.spec.as_ref();
        let admin = PodAdmin {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            node: spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
            port: spec
                .into_iter()
                .flat_map(|s| &s.containers)
                .flat_map(|c| c.ports.iter().flatten())
                .find(|p| p.name.as_deref() == Some(ADMIN_PORT_NAME))
                .and_then(|p| u16::try_from(p.container_port).ok())
                .unwrap_or(DEFAULT_ADMIN_PORT),
        };
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        match phase {
            Some("Running") => admins.push(admin),
            other => skipped.push((
                admin.node.clone(),
                format!(
                    "pod {}/{}{} is {}, not Running; why: kubectl -n {} describe pod {}",
                    admin.namespace,
                    admin.name,
                    on_node(&admin.node),
                    other.unwrap_or("without a phase"),
                    admin.namespace,
                    admin.name
                ),
            )),
        }
    }
    admins.sort_by(|a, b| (&a.node, &a.name).cmp(&(&b.node, &b.name)));
    skipped.sort();
    (admins, skipped.into_iter().map(|(_, why)| why).collect())
}

fn on_node(node: &str) -> String {
    if node.is_empty() {
        " (no node yet)".into()
    } else {
        format!(" on {node}")
    }
}

/// A node proxy pod, read through the API server's pod proxy.
#[derive(Clone)]
pub struct PodProxy {
    client: kube::Client,
    admin: PodAdmin,
}

impl fmt::Debug for PodProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PodProxy")
            .field("admin", &self.admin)
            .finish_non_exhaustive()
    }
}

/// `pod NAMESPACE/NAME on NODE`.
impl fmt::Display for PodProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = &self.admin;
        write!(f, "pod {}/{}{}", a.namespace, a.name, on_node(&a.node))
    }
}

impl PodProxy {
    /// The admin port.
    pub fn port(&self) -> u16 {
        self.admin.port
    }

    /// `kubectl -n NAMESPACE VERB NAME`.
    pub fn kubectl(&self, verb: &str) -> String {
        format!(
            "kubectl -n {} {verb} {}",
            self.admin.namespace, self.admin.name
        )
    }

    /// The pod proxy path of the pod's `/metrics`.
    fn path(&self) -> String {
        let a = &self.admin;
        format!(
            "/api/v1/namespaces/{}/pods/{}:{}/proxy/metrics",
            a.namespace, a.name, a.port
        )
    }

    /// `GET` its metrics through the API server: the text, or what went wrong and what to
    /// do.
    pub async fn get(&self) -> Result<String, ScrapeError> {
        let fail = |what: String| ScrapeError(format!("{self}: {what}"));
        let request = hyper::Request::get(self.path())
            .header(hyper::header::ACCEPT, ACCEPT)
            .body(kube::client::Body::empty())
            .map_err(|e| fail(e.to_string()))?;
        let response = self.client.send(request).await.map_err(|e| {
            fail(format!(
                "cannot reach the API server: {}; is it up (kubectl cluster-info)?",
                chain(&e)
            ))
        })?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| {
                fail(format!(
                    "reading the body (at most {} MiB): {e}",
                    MAX_BODY >> 20
                ))
            })?
            .to_bytes();
        let text = String::from_utf8_lossy(&body);
        if status.is_success() {
            return Ok(text.into_owned());
        }
        let said = said(&text);
        Err(fail(match status.as_u16() {
            401 => format!(
                "the API server refused the credentials (401 {said}); check the kubeconfig's user (kubectl auth whoami)"
            ),
            403 => format!(
                "forbidden ({said}); --kube needs get on pods/proxy in {} (kubectl auth can-i get pods/proxy -n {})",
                self.admin.namespace, self.admin.namespace
            ),
            502..=504 => format!(
                "the API server could not reach the pod's admin port {} ({status}: {said}); is the node proxy running and ready ({})?",
                self.admin.port,
                self.kubectl("logs -c ambit-proxy")
            ),
            _ => format!(
                "answered {status}{}{said}; is port {} of the pod the node proxy's admin server?",
                if said.is_empty() { "" } else { ": " },
                self.admin.port
            ),
        }))
    }
}

/// What an error body says: a `kind: Status`'s message, else its first line.
fn said(body: &str) -> String {
    match serde_json::from_str::<kube::core::Status>(body) {
        Ok(status) if !status.message.is_empty() => status.message,
        _ => body.lines().next().unwrap_or("").trim().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, node: &str, phase: Option<&str>, ports: serde_json::Value) -> Pod {
        let mut pod = json!({
            "metadata": {"name": name, "namespace": "ambit"},
            "spec": {"nodeName": node, "containers": [
                {"name": "ambit-cni", "image": "cni"},
                {"name": "ambit-proxy", "image": "proxy", "ports": ports},
            ]},
            "status": {},
        });
        if let Some(phase) = phase {
            pod["status"]["phase"] = json!(phase);
        }
        serde_json::from_value(pod).unwrap()
    }

    fn admin(name: &str, node: &str, port: u16) -> PodAdmin {
        PodAdmin {
            namespace: "ambit".into(),
            name: name.into(),
            node: node.into(),
            port,
        }
    }

    #[test]
    fn only_running_pods_are_scraped_and_the_others_are_named() {
        let chart_port = json!([{"name": "admin-http", "containerPort": 4191}]);
        let (admins, skipped) = select(&[
            pod(
                "ambit-proxy-c",
                "node-c",
                Some("Running"),
                chart_port.clone(),
            ),
            pod("ambit-proxy-p", "", Some("Pending"), chart_port.clone()),
            pod(
                "ambit-proxy-a",
                "node-a",
                Some("Running"),
                chart_port.clone(),
            ),
            pod(
                "ambit-proxy-f",
                "node-f",
                Some("Failed"),
                chart_port.clone(),
            ),
            pod("ambit-proxy-u", "node-u", None, chart_port),
        ]);
        assert_eq!(
            admins,
            [
                admin("ambit-proxy-a", "node-a", 4191),
                admin("ambit-proxy-c", "node-c", 4191)
            ]
        );
        assert_eq!(
            skipped,
            [
                "pod ambit/ambit-proxy-p (no node yet) is Pending, not Running; why: kubectl -n ambit describe pod ambit-proxy-p",
                "pod ambit/ambit-proxy-f on node-f is Failed, not Running; why: kubectl -n ambit describe pod ambit-proxy-f",
                "pod ambit/ambit-proxy-u on node-u is without a phase, not Running; why: kubectl -n ambit describe pod ambit-proxy-u",
            ]
        );
    }

    #[test]
    fn the_admin_port_is_the_container_port_named_as_in_the_chart() {
        let (admins, _) = select(&[
            // Another port first: the named one counts, not the first.
            pod(
                "moved",
                "a",
                Some("Running"),
                json!([{"name": "other", "containerPort": 9},
                       {"name": "admin-http", "containerPort": 14191}]),
            ),
            // No port named admin-http: the default.
            pod(
                "unnamed",
                "b",
                Some("Running"),
                json!([{"containerPort": 9}]),
            ),
            pod("none", "c", Some("Running"), json!([])),
        ]);
        let ports: Vec<(&str, u16)> = admins.iter().map(|a| (a.name.as_str(), a.port)).collect();
        assert_eq!(ports, [("moved", 14191), ("unnamed", 4191), ("none", 4191)]);
    }

    #[test]
    fn no_running_pod_says_where_to_look() {
        let e = none_running("ambit", &[]);
        assert!(
            e.contains("no pod labelled app.kubernetes.io/name=ambit-proxy in namespace ambit"),
            "{e}"
        );
        assert!(e.contains("--proxy-namespace"), "{e}");
        let (_, skipped) = select(&[pod("p", "n", Some("Pending"), json!([]))]);
        let e = none_running("ambit", &skipped);
        assert!(
            e.contains(
                "no node proxy pod is Running in namespace ambit: pod ambit/p on n is Pending"
            ),
            "{e}"
        );
    }

    #[test]
    fn error_bodies_are_read_as_the_api_server_words_them() {
        let status = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"error trying to reach service: dial tcp 10.0.0.1:4191: connect: connection refused","reason":"ServiceUnavailable","code":503}"#;
        assert_eq!(
            said(status),
            "error trying to reach service: dial tcp 10.0.0.1:4191: connect: connection refused"
        );
        assert_eq!(said("not found\nmore"), "not found");
        assert_eq!(said(""), "");
    }

    #[test]
    fn kube_flags() {
        use clap::Parser;
        #[derive(Debug, Parser)]
        struct Cli {
            #[command(flatten)]
            proxies: super::super::ProxyArgs,
            #[command(flatten)]
            kube: KubeArgs,
        }
        let cli = Cli::try_parse_from(["stat", "--kube"]).unwrap();
        assert!(cli.kube.kube);
        assert_eq!(cli.kube.proxy_namespace, "ambit");
        let cli = Cli::try_parse_from([
            "stat",
            "--kube",
            "--kubeconfig",
            "k",
            "--proxy-namespace",
            "m",
        ])
        .unwrap();
        assert_eq!(
            (cli.kube.kubeconfig, cli.kube.proxy_namespace.as_str()),
            (Some(PathBuf::from("k")), "m")
        );
        for without in [["--kubeconfig", "k"], ["--proxy-namespace", "m"]] {
            let e = Cli::try_parse_from(["stat", without[0], without[1]]).unwrap_err();
            assert!(e.to_string().contains("--kube"), "{e}");
        }
        assert!(!Cli::try_parse_from(["stat"]).unwrap().kube.kube);
        let e = Cli::try_parse_from(["stat", "--kube", "--proxy-admin", "http://a:1"]).unwrap_err();
        assert!(e.to_string().contains("cannot be used with"), "{e}");
    }
}
