//! The demo under a real Prometheus (Debian's `prometheus`): PromQL agrees with `ambit
//! stat`, Linkerd's queries and the scrape-proof labels give the same counts, and every
//! panel of the chart's Grafana dashboards (`helm/ambit/dashboards/`) shows data.

use super::{row, stat_pods};
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Prometheus scrapes both node proxies, configured as the chart's annotations say (path
/// /metrics); every target is up with no scrape error, and PromQL's success rate, RPS and
/// p99 of the front end over a window agree with `ambit stat` over the same window.
pub fn agrees_with_stat_and_fills_the_dashboards() {
    let state: Value =
        serde_json::from_slice(&std::fs::read("/run/ambit-demo/state.json").unwrap()).unwrap();
    let targets: Vec<String> = state["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            n["admin_url"]
                .as_str()
                .unwrap()
                .trim_start_matches("http://")
                .to_string()
        })
        .collect();
    let chart = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../helm/ambit/templates/proxy.yaml"),
    )
    .unwrap();
    let path = chart
        .lines()
        .find_map(|l| l.trim().strip_prefix("prometheus.io/path:"))
        .expect("the chart's scrape path annotation")
        .trim()
        .to_string();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("prometheus.yml");
    // Two scrapes of the same proxies, each giving them the target labels a pod of
    // namespace `ambit` gets: as the chart's PodMonitor (honorLabels: the proxy's
    // `namespace`/`pod` win), and as a PodMonitor without honorLabels or an annotation
    // scrape (Prometheus renames the proxy's to `exported_namespace`/`exported_pod`).
    let mut scrape = String::new();
    for (job, honor) in [("ambit-proxy", true), ("ambit-proxy-no-honor", false)] {
        scrape.push_str(&format!(
            "- job_name: {job}\n  honor_labels: {honor}\n  metrics_path: {path}\n  \
             static_configs:\n"
        ));
        for (i, t) in targets.iter().enumerate() {
            scrape.push_str(&format!(
                "  - {{targets: [{t:?}], labels: {{namespace: ambit, pod: ambit-proxy-{i}}}}}\n"
            ));
        }
    }
    std::fs::write(
        &config,
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
             scrape_configs:\n{scrape}"
        ),
    )
    .unwrap();
    let listen = "127.0.0.1:19099";
    let mut prom = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address={listen}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("prometheus.log")).unwrap())
        .spawn()
        .expect("prometheus (Debian's prometheus package) must be installed");
    struct Kill<'a>(&'a mut std::process::Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _kill = Kill(&mut prom);
    let query = |q: &str, time: Option<f64>| -> Value {
        let mut args = vec![
            "-sS".to_string(),
            "-m".into(),
            "10".into(),
            "-G".into(),
            format!("http://{listen}/api/v1/query"),
            "--data-urlencode".into(),
            format!("query={q}"),
        ];
        if let Some(t) = time {
            args.extend(["--data-urlencode".into(), format!("time={t}")]);
        }
        let out = Command::new("curl").args(&args).output().unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    };
    // Every target up, scraped without an error, with 30 s of samples.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let out = Command::new("curl")
            .args([
                "-sS",
                "-m",
                "10",
                &format!("http://{listen}/api/v1/targets"),
            ])
            .output()
            .unwrap();
        let t: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let active = t["data"]["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let up = active.len() == 2 * targets.len()
            && active
                .iter()
                .all(|a| a["health"] == "up" && a["lastError"] == "");
        if up {
            let samples = query("count_over_time(up[40s])", None);
            let full = samples["data"]["result"].as_array().is_some_and(|r| {
                r.len() == 2 * targets.len()
                    && r.iter().all(|s| {
                        s["value"][1].as_str().and_then(|v| v.parse::<f64>().ok()) >= Some(30.0)
                    })
            });
            if full {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "prometheus targets: {t:#}\n{}",
            std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    // The same window: `ambit stat -t 30s`, then PromQL's increase over the 30 s before
    // the moment it ended.
    let rows = stat_pods("30s");
    let end = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    // The front end: steady traffic (20 requests/s) whose failures are the failing
    // catalog replica's, in the share the balancer sends it.
    let web = row(&rows, "web-").unwrap();
    // Linkerd's query, through the scrape that honours the proxy's labels.
    let sel = "job=\"ambit-proxy\",direction=\"inbound\",namespace=\"demo\",deployment=\"web\"";
    let success = query(
        &format!(
            "sum(increase(response_total{{{sel},classification=\"success\"}}[30s])) / sum(increase(response_total{{{sel}}}[30s]))"
        ),
        Some(end),
    );
    let rps = query(
        &format!("sum(rate(request_total{{{sel}}}[30s]))"),
        Some(end),
    );
    let p99 = query(
        &format!(
            "histogram_quantile(0.99, sum by (le) (increase(response_latency_ms_bucket{{{sel}}}[30s])))"
        ),
        Some(end),
    );
    let value = |v: &Value| -> f64 {
        v["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no PromQL result: {v:#}"))
    };
    let (p_success, p_rps, p_p99) = (value(&success), value(&rps), value(&p99));
    let (s_success, s_rps, s_p99) = (
        web["success"].as_f64().unwrap(),
        web["rps"].as_f64().unwrap(),
        web["latency_ms_p99"].as_f64().unwrap(),
    );
    // Interpolating in the same buckets over nearly the same samples: close to each other.
    assert!(
        (p_p99 - s_p99).abs() <= (0.25 * s_p99).max(1.0),
        "p99: PromQL {p_p99} ms, ambit stat {s_p99} ms"
    );
    assert!(
        (p_success - s_success).abs() <= 0.05,
        "success rate: PromQL {p_success}, ambit stat {s_success}"
    );
    assert!(
        (p_rps - s_rps).abs() <= 0.25 * s_rps.max(p_rps),
        "RPS: PromQL {p_rps}, ambit stat {s_rps}"
    );
    // The scrape that does not honour them: `namespace` is the proxy pod's, the app's
    // moved to `exported_namespace`, and the `destination_*` labels still say whose
    // requests they are — the same count as Linkerd's query through the other scrape.
    let count = |job: &str, sel: &str| {
        let q = format!(
            "sum(increase(request_total{{job=\"{job}\",direction=\"inbound\",{sel}}}[30s]))"
        );
        query(&q, Some(end))
    };
    let renamed = count("ambit-proxy-no-honor", "namespace=\"demo\"");
    assert_eq!(
        renamed["data"]["result"],
        serde_json::json!([]),
        "{renamed:#}"
    );
    let exported = count(
        "ambit-proxy-no-honor",
        "exported_namespace=\"demo\",deployment=\"web\"",
    );
    let scrape_proof = count(
        "ambit-proxy-no-honor",
        "destination_workload_namespace=\"demo\",destination_workload=\"web\",destination_workload_kind=\"Deployment\"",
    );
    let linkerd = count("ambit-proxy", "namespace=\"demo\",deployment=\"web\"");
    let (exported, scrape_proof, linkerd) =
        (value(&exported), value(&scrape_proof), value(&linkerd));
    assert!(linkerd > 0.0, "{linkerd}");
    assert!(
        (scrape_proof - linkerd).abs() <= 0.15 * linkerd && (exported - linkerd).abs() <= 0.15 * linkerd,
        "requests to web: {linkerd} by Linkerd's labels (honorLabels), {scrape_proof} by destination_* and {exported} by exported_namespace (no honorLabels)"
    );
    dashboards_have_data(&query, end);
}

/// Every panel of every dashboard in `helm/ambit/dashboards/` shows data from the demo, as
/// Grafana would query it: each query variable (`label_values(selector, label)`) has
/// values, and for some of its values (all combinations, a few each) each panel's queries
/// evaluate without an error and at least one returns series. A misspelt metric, label or
/// variable, or a panel of a metric the proxies do not emit, fails here.
fn dashboards_have_data(query: &dyn Fn(&str, Option<f64>) -> Value, end: f64) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../helm/ambit/dashboards");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "the dashboards: {files:?}");
    let eval = |q: &str| -> Vec<Value> {
        let r = query(q, Some(end));
        assert_eq!(r["status"], "success", "{q}: {r:#}");
        r["data"]["result"].as_array().cloned().unwrap_or_default()
    };
    for file in files {
        let d: Value = serde_json::from_slice(&std::fs::read(&file).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let uid = d["uid"]
            .as_str()
            .unwrap_or_else(|| panic!("{file:?}: no uid"));
        // Grafana's $__rate_interval is at least four scrape intervals; 30 s here.
        let mut assignments = vec![vec![("__rate_interval".to_string(), "30s".to_string())]];
        for v in d["templating"]["list"].as_array().unwrap() {
            if v["type"] != "query" {
                continue;
            }
            let name = v["name"].as_str().unwrap().to_string();
            let q = v["query"]["query"].as_str().unwrap();
            let (selector, label) = q
                .strip_prefix("label_values(")
                .and_then(|q| q.strip_suffix(')'))
                .and_then(|q| q.rsplit_once(','))
                .unwrap_or_else(|| panic!("{uid}: variable {name}: {q}"));
            let label = label.trim();
            let mut next = Vec::new();
            for a in &assignments {
                let values: Vec<String> =
                    eval(&substitute(&format!("count by ({label}) ({selector})"), a))
                        .iter()
                        .filter_map(|s| s["metric"][label].as_str().map(String::from))
                        .take(6)
                        .collect();
                assert!(
                    !values.is_empty(),
                    "{uid}: variable {name} ({q}) has no values"
                );
                for value in values {
                    let mut a = a.clone();
                    a.push((name.clone(), value));
                    next.push(a);
                }
            }
            assignments = next;
        }
        let panels: Vec<&Value> = d["panels"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|p| std::iter::once(p).chain(p["panels"].as_array().into_iter().flatten()))
            .filter(|p| p["type"] != "row")
            .collect();
        assert!(!panels.is_empty(), "{uid}: no panels");
        for p in panels {
            let title = p["title"].as_str().unwrap_or_default();
            let exprs: Vec<&str> = p["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t["expr"].as_str())
                .collect();
            assert!(!exprs.is_empty(), "{uid}: panel {title:?} has no query");
            let mut data = false;
            for e in &exprs {
                for a in &assignments {
                    data |= !eval(&substitute(e, a)).is_empty();
                }
            }
            assert!(data, "{uid}: panel {title:?} shows no data: {exprs:#?}");
        }
    }
}

/// `q` with Grafana's variables (`$name`, `${name}`) replaced, the longest names first.
fn substitute(q: &str, vars: &[(String, String)]) -> String {
    let mut vars: Vec<_> = vars.iter().collect();
    vars.sort_by_key(|(n, _)| std::cmp::Reverse(n.len()));
    let mut q = q.to_string();
    for (name, value) in vars {
        q = q
            .replace(&format!("${{{name}}}"), value)
            .replace(&format!("${name}"), value);
    }
    q
}
