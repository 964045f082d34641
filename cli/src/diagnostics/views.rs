//! The `/config_dump` views of `ambit diagnostics`: rows from each proxy's dump, as
//! columns or JSON.

use super::Output;
use crate::stat::render::columns;
use anyhow::bail;
use serde_json::{json, Value};

type Dumps = [(String, Value)];

/// The node a dump is from (its `--node-name`), else its admin URL.
fn node(url: &str, dump: &Value) -> String {
    dump["config"]["node_name"]
        .as_str()
        .map_or_else(|| url.to_string(), String::from)
}

fn str_of(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) if s.is_empty() => "-".into(),
        Value::String(s) => s.clone(),
        Value::Array(a) => {
            let parts: Vec<String> = a.iter().map(str_of).collect();
            if parts.is_empty() {
                "-".into()
            } else {
                parts.join(",")
            }
        }
        other => other.to_string(),
    }
}

fn in_namespace(key: &str, namespace: Option<&str>) -> bool {
    namespace.is_none_or(|ns| key.split('/').next() == Some(ns))
}

/// `value` for `-o json`, one object per proxy; or the table of `rows` under `header`.
fn output(format: Output, header: &[&str], rows: Vec<Vec<String>>, json: Vec<Value>) -> String {
    match format {
        Output::Json => serde_json::to_string_pretty(&json).unwrap_or_default() + "\n",
        Output::Table => {
            let mut all = vec![header.iter().map(|h| h.to_string()).collect()];
            all.extend(rows);
            columns(&all)
        }
    }
}

/// The pods each proxy serves.
pub fn pods(dumps: &Dumps, namespace: Option<&str>, format: Output) -> String {
    let (mut rows, mut json) = (Vec::new(), Vec::new());
    for (url, d) in dumps {
        let node = node(url, d);
        let pods: Vec<&Value> = d["pods"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| in_namespace(p["pod"].as_str().unwrap_or_default(), namespace))
            .collect();
        for p in &pods {
            rows.push(vec![
                node.clone(),
                str_of(&p["pod"]),
                str_of(&p["ips"]),
                str_of(&p["identity"]),
                str_of(&p["workload"]),
                str_of(&p["source"]),
                str_of(&p["opaque_ports"]),
            ]);
        }
        json.push(json!({"node": node, "admin": url, "pods": pods}));
    }
    output(
        format,
        &[
            "NODE",
            "POD",
            "IPS",
            "IDENTITY",
            "WORKLOAD",
            "SOURCE",
            "OPAQUE_PORTS",
        ],
        rows,
        json,
    )
}

/// "1d2h", "3h4m", "5m6s", "7s"; "expired 5m ago" for a past moment.
pub fn left(secs: i64) -> String {
    if secs < 0 {
        return format!("expired {} ago", left(-secs));
    }
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m{s}s"),
        (0, _, _) => format!("{h}h{m}m"),
        _ => format!("{d}d{h}h"),
    }
}

/// The subject and issuer of the first certificate of a PEM chain.
fn leaf_names(pem: &str) -> Option<(String, String)> {
    use x509_parser::prelude::FromDer;
    let der = rustls_pki_types::pem::PemObject::pem_slice_iter(pem.as_bytes())
        .filter_map(Result::<rustls_pki_types::CertificateDer<'static>, _>::ok)
        .next()?;
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(&der).ok()?;
    Some((cert.subject().to_string(), cert.issuer().to_string()))
}

/// The certificates each proxy holds, with their time left at `now`.
pub fn certificates(dumps: &Dumps, namespace: Option<&str>, format: Output, now: u64) -> String {
    let (mut rows, mut json) = (Vec::new(), Vec::new());
    for (url, d) in dumps {
        let node = node(url, d);
        let mut certs = Vec::new();
        for id in d["identities"].as_array().into_iter().flatten() {
            let identity = id["identity"].as_str().unwrap_or_default();
            let ns = identity
                .split("/ns/")
                .nth(1)
                .and_then(|r| r.split('/').next());
            if namespace.is_some_and(|want| ns != Some(want)) {
                continue;
            }
            let not_after = id["cert_not_after_unix"].as_i64();
            let issuer = id["cert_chain_pem"]
                .as_str()
                .and_then(leaf_names)
                .map(|(_, issuer)| issuer);
            let pods = id["pods"].as_array().map_or(0, Vec::len);
            let expires_in = not_after.map(|t| left(t - now as i64));
            rows.push(vec![
                node.clone(),
                identity.to_string(),
                pods.to_string(),
                expires_in
                    .clone()
                    .unwrap_or_else(|| "no certificate yet".into()),
                issuer.clone().unwrap_or_else(|| "-".into()),
            ]);
            certs.push(json!({
                "identity": identity,
                "pods": id["pods"],
                "not_after_unix": not_after,
                "expires_in": expires_in,
                "issuer": issuer,
            }));
        }
        let anchors: Vec<Value> = d["trust_bundle"]["anchors"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        json.push(
            json!({"node": node, "admin": url, "certificates": certs, "trust_anchors": anchors}),
        );
    }
    output(
        format,
        &["NODE", "IDENTITY", "PODS", "EXPIRES_IN", "ISSUER"],
        rows,
        json,
    )
}

/// The Services each proxy knows and their endpoints; `one` ("ns/name") alone, when given.
pub fn endpoints(
    dumps: &Dumps,
    namespace: Option<&str>,
    one: Option<&str>,
    format: Output,
) -> anyhow::Result<String> {
    let (mut rows, mut json) = (Vec::new(), Vec::new());
    let mut seen = false;
    for (url, d) in dumps {
        let node = node(url, d);
        let mut services = serde_json::Map::new();
        for (key, svc) in d["discovery"]["endpoints"]
            .as_object()
            .into_iter()
            .flatten()
        {
            if !in_namespace(key, namespace) || one.is_some_and(|o| o != key) {
                continue;
            }
            seen = true;
            let ports: Vec<String> = svc["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| str_of(&p["port"]))
                .collect();
            let endpoints = svc["endpoints"].as_array().cloned().unwrap_or_default();
            if endpoints.is_empty() {
                rows.push(vec![
                    node.clone(),
                    key.clone(),
                    str_of(&svc["cluster_ips"]),
                    ports.join(","),
                    "(no endpoints)".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                ]);
            }
            for e in &endpoints {
                let target: Vec<String> = e["ports"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(_, p)| p.to_string())
                    .collect();
                rows.push(vec![
                    node.clone(),
                    key.clone(),
                    str_of(&svc["cluster_ips"]),
                    ports.join(","),
                    format!("{}:{}", str_of(&e["address"]), target.join(",")),
                    if e["ready"] == true { "true" } else { "false" }.into(),
                    str_of(&e["pod"]),
                    str_of(&e["node"]),
                    str_of(&e["identity"]),
                ]);
            }
            services.insert(key.clone(), svc.clone());
        }
        json.push(json!({"node": node, "admin": url, "services": services}));
    }
    if let (Some(one), false) = (one, seen) {
        bail!(
            "no node proxy knows the Service {one}: a proxy holds the Services its pods have \
             used (discovery by need), so call it from a meshed pod first, and check its \
             name and namespace"
        );
    }
    Ok(output(
        format,
        &[
            "NODE",
            "SERVICE",
            "CLUSTER_IPS",
            "PORTS",
            "ENDPOINT",
            "READY",
            "POD",
            "POD_NODE",
            "IDENTITY",
        ],
        rows,
        json,
    ))
}

/// Who an authorization admits, in a few words.
fn admits(a: &Value) -> String {
    let who = match &a["identities"] {
        Value::Null => "any client".to_string(),
        ids => {
            let ids = str_of(ids);
            if ids == "*" {
                "any mTLS client".into()
            } else {
                ids
            }
        }
    };
    let nets = str_of(&a["networks"]);
    let by = format!("{}/{}", str_of(&a["kind"]), str_of(&a["name"]));
    if nets == "-" {
        format!("{by}: {who}")
    } else {
        format!("{by}: {who} from {nets}")
    }
}

/// The inbound policy of each pod; `one` ("ns/name") alone, when given.
pub fn policy(
    dumps: &Dumps,
    namespace: Option<&str>,
    one: Option<&str>,
    format: Output,
) -> anyhow::Result<String> {
    let (mut rows, mut json) = (Vec::new(), Vec::new());
    let mut seen = false;
    for (url, d) in dumps {
        let node = node(url, d);
        let served: Vec<String> = d["pods"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["pod"].as_str().map(String::from))
            .collect();
        let mut pods = serde_json::Map::new();
        for key in served {
            if !in_namespace(&key, namespace) || one.is_some_and(|o| o != key) {
                continue;
            }
            seen = true;
            // A pod the control plane has sent nothing for is served under the fallback.
            let (policy, from) = match d["policy"]["pods"].get(&key) {
                Some(p) => (p.clone(), "control plane"),
                None => (
                    d["policy"]["fallback"].clone(),
                    "fallback (--default-inbound-policy)",
                ),
            };
            let mut ports: Vec<(String, &Value)> = policy["ports"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v))
                .collect();
            ports.push(("*".into(), &policy["default"]));
            for (port, pp) in ports {
                let auths: Vec<String> = pp["authorizations"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(admits)
                    .collect();
                let routes: Vec<String> = pp["routes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|r| format!("{}/{}", str_of(&r["kind"]), str_of(&r["name"])))
                    .collect();
                rows.push(vec![
                    node.clone(),
                    key.clone(),
                    port,
                    format!(
                        "{}/{}",
                        str_of(&pp["server"]["kind"]),
                        str_of(&pp["server"]["name"])
                    ),
                    str_of(&pp["protocol"]),
                    if auths.is_empty() {
                        "nobody (deny)".into()
                    } else {
                        auths.join("; ")
                    } + if pp["audit"] == true {
                        " (audit: denials allowed)"
                    } else {
                        ""
                    },
                    if routes.is_empty() {
                        "-".into()
                    } else {
                        routes.join(",")
                    },
                ]);
            }
            pods.insert(key.clone(), json!({"from": from, "policy": policy}));
        }
        json.push(
            json!({"node": node, "admin": url, "synced": d["policy"]["synced"], "pods": pods}),
        );
    }
    if let (Some(one), false) = (one, seen) {
        bail!("no node proxy serves the pod {one}: check its name and namespace (`ambit diagnostics pods`)");
    }
    Ok(output(
        format,
        &[
            "NODE",
            "POD",
            "PORT",
            "SERVER",
            "PROTOCOL",
            "AUTHORIZED",
            "ROUTES",
        ],
        rows,
        json,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dump() -> Vec<(String, Value)> {
        vec![(
            "http://127.0.0.1:4191".into(),
            json!({
                "config": {"node_name": "node-b"},
                "pods": [
                    {"pod": "demo/api-1", "ips": ["10.0.0.4"], "identity": "spiffe://cluster.local/ns/demo/sa/api", "workload": "api", "source": null, "opaque_ports": ""},
                    {"pod": "other/x", "ips": ["10.0.0.9"], "identity": "spiffe://cluster.local/ns/other/sa/x", "workload": "x", "source": "Cni", "opaque_ports": "5432"}
                ],
                "identities": [
                    {"identity": "spiffe://cluster.local/ns/demo/sa/api", "pods": ["demo/api-1"], "cert_not_after_unix": 1_000_000 + 90_061, "cert_chain_pem": ""},
                    {"identity": "spiffe://cluster.local/ns/other/sa/x", "pods": ["other/x"], "cert_not_after_unix": null, "cert_chain_pem": ""}
                ],
                "discovery": {"endpoints": {
                    "demo/api": {"cluster_ips": ["10.96.80.11"], "ports": [{"name": "http", "port": 80}],
                        "endpoints": [{"address": "10.0.0.4", "ports": {"http": 8080}, "ready": true, "pod": "demo/api-1", "node": "node-b", "identity": "spiffe://cluster.local/ns/demo/sa/api"}]},
                    "demo/empty": {"cluster_ips": ["10.96.80.99"], "ports": [{"name": "", "port": 80}], "endpoints": []}
                }},
                "policy": {"synced": true, "pods": {
                    "demo/api-1": {"ports": {"8080": {"server": {"kind": "server", "name": "api"}, "protocol": "unknown", "audit": false,
                        "authorizations": [{"kind": "authorizationpolicy", "name": "api-from-web", "identities": ["spiffe://cluster.local/ns/demo/sa/web"], "networks": []}], "routes": []}},
                        "default": {"server": {"kind": "default", "name": "all-unauthenticated"}, "protocol": "unknown", "audit": false,
                        "authorizations": [{"kind": "default", "name": "all-unauthenticated", "identities": null, "networks": ["0.0.0.0/0"]}], "routes": []}}},
                    "fallback": {"ports": {}, "default": {"server": {"kind": "default", "name": "deny"}, "protocol": "unknown", "audit": false, "authorizations": [], "routes": []}}}
            }),
        )]
    }

    #[test]
    fn pods_and_certificates_by_namespace_with_their_time_left() {
        let t = pods(&dump(), Some("demo"), Output::Table);
        assert!(t.starts_with("NODE"), "{t}");
        assert!(
            t.contains("node-b") && t.contains("demo/api-1") && t.contains("10.0.0.4"),
            "{t}"
        );
        assert!(!t.contains("other/x"), "{t}");
        let t = certificates(&dump(), None, Output::Table, 1_000_000);
        assert!(
            t.contains("spiffe://cluster.local/ns/demo/sa/api") && t.contains("1d1h"),
            "{t}"
        );
        assert!(t.contains("no certificate yet"), "{t}");
        let j: Value = serde_json::from_str(&certificates(
            &dump(),
            Some("demo"),
            Output::Json,
            1_000_000,
        ))
        .unwrap();
        assert_eq!(j[0]["certificates"].as_array().unwrap().len(), 1, "{j:#}");
        assert_eq!(j[0]["certificates"][0]["expires_in"], "1d1h");
    }

    #[test]
    fn time_left_reads_as_a_person_would() {
        assert_eq!(left(7), "7s");
        assert_eq!(left(306), "5m6s");
        assert_eq!(left(3 * 3600 + 240), "3h4m");
        assert_eq!(left(-300), "expired 5m0s ago");
    }

    #[test]
    fn endpoints_of_one_service_or_a_clear_error_for_an_unknown_one() {
        let t = endpoints(&dump(), None, Some("demo/api"), Output::Table).unwrap();
        assert!(
            t.contains("10.0.0.4:8080") && t.contains("demo/api-1") && t.contains("true"),
            "{t}"
        );
        assert!(!t.contains("demo/empty"), "{t}");
        let t = endpoints(&dump(), Some("demo"), None, Output::Table).unwrap();
        assert!(t.contains("(no endpoints)"), "{t}");
        let e = endpoints(&dump(), None, Some("demo/nope"), Output::Table).unwrap_err();
        assert!(
            e.to_string()
                .contains("no node proxy knows the Service demo/nope"),
            "{e}"
        );
    }

    #[test]
    fn policy_shows_each_port_and_who_may_reach_it_and_the_fallback_for_a_pod_without_one() {
        let t = policy(&dump(), None, Some("demo/api-1"), Output::Table).unwrap();
        assert!(
            t.contains("server/api")
                && t.contains(
                    "authorizationpolicy/api-from-web: spiffe://cluster.local/ns/demo/sa/web"
                ),
            "{t}"
        );
        assert!(
            t.contains("default/all-unauthenticated: any client from 0.0.0.0/0"),
            "{t}"
        );
        // other/x has no policy from the control plane: the fallback, which denies.
        let j: Value =
            serde_json::from_str(&policy(&dump(), Some("other"), None, Output::Json).unwrap())
                .unwrap();
        assert_eq!(
            j[0]["pods"]["other/x"]["from"],
            "fallback (--default-inbound-policy)"
        );
        let t = policy(&dump(), Some("other"), None, Output::Table).unwrap();
        assert!(t.contains("nobody (deny)"), "{t}");
        assert!(policy(&dump(), None, Some("demo/nope"), Output::Table).is_err());
    }

    #[test]
    fn a_name_is_namespace_slash_name_or_needs_a_namespace() {
        assert_eq!(
            super::super::one_name("api", Some("demo"), true).unwrap(),
            "demo/api"
        );
        assert_eq!(
            super::super::one_name("api.demo", None, true).unwrap(),
            "demo/api"
        );
        assert_eq!(
            super::super::one_name("demo/api", None, false).unwrap(),
            "demo/api"
        );
        assert!(super::super::one_name("api", None, true).is_err());
        assert!(super::super::one_name("a/b/c", None, true).is_err());
    }
}
