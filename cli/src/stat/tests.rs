//! `ambit stat` on recorded metrics (`fixtures`: two node proxies scraped 10 s apart), with
//! every number worked out by hand the way PromQL computes it from the same samples; then
//! the command itself against an in-process HTTP server serving those scrapes.

use super::compute::{compute, increase, Edge, Resource, Row, Selection, Snapshot, Target};
use super::fixtures::{snapshots, A1, A2, B1, B2};
use super::parse::parse;
use super::render::{render, Format};
use super::scrape::Flags;
use super::{execute, StatArgs};
use std::time::Duration;

const WINDOW: Duration = Duration::from_secs(10);

fn sel(resource: Resource) -> Selection {
    Selection {
        resource,
        name: None,
        namespace: None,
        edge: Edge::All,
    }
}

fn target(s: &str) -> Target {
    Target::parse(s, None).unwrap()
}

fn rows(s: &Selection) -> Vec<Row> {
    let (before, after) = snapshots();
    compute(&before, &after, WINDOW, s)
}

fn row<'a>(rows: &'a [Row], name: &str) -> &'a Row {
    rows.iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("no row {name} in {rows:#?}"))
}

/// Equal to within float rounding (the same arithmetic as Prometheus, not always the same
/// last bit as a decimal literal).
#[track_caller]
fn near(got: Option<f64>, want: f64) {
    let g = got.unwrap_or_else(|| panic!("expected {want}, got None"));
    assert!((g - want).abs() < 1e-9, "expected {want}, got {g}");
}

#[test]
fn deployments_from_the_servers_side() {
    let r = rows(&sel(Resource::Deploy));
    let names: Vec<(&str, &str, &str)> = r
        .iter()
        .map(|r| (r.resource, r.namespace.as_str(), r.name.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("deploy", "shop", "api"),
            ("deploy", "shop", "load"),
            ("deploy", "shop", "web")
        ]
    );

    // api: inbound of api-0 (node a) and api-1 (node b).
    let api = row(&r, "api");
    assert_eq!((api.meshed_pods, api.pods), (Some(2), Some(2)));
    // request_total: api-0 3000 → 3300, api-1 1000 → 1100: 400 in 10 s.
    assert_eq!(api.requests, 400.0);
    assert_eq!(api.rps, 40.0);
    // response_total: success +297 +99, failure +3 +1: 396/400.
    near(api.success_rate, 0.99);
    // sum by (le) of the bucket increases: api-0 le=1: 1000→1000 (0), le=2: 3000→3300
    // (300), above: 300; api-1 le≤2: 0, le=3 and above: 1000→1100 (100). Summed:
    // le=1: 0, le=2: 300, le=3…+Inf: 400.
    // p50: rank 0.5 × 400 = 200 → le=2 (300 ≥ 200), from 1 (le=1 holds 0):
    //   1 + (2 − 1) × (200 − 0)/(300 − 0) = 1.6667.
    near(api.latency_ms_p50, 1.0 + 200.0 / 300.0);
    // p95: rank 380 → le=3 (400): 2 + 1 × (380 − 300)/(400 − 300) = 2.8.
    near(api.latency_ms_p95, 2.8);
    // p99: rank 396 → 2 + (396 − 300)/100 = 2.96.
    near(api.latency_ms_p99, 2.96);
    // The plaintext TCP into api-0: 3 open now; bytes 100 → 300 read, 1000 → 5000
    // written.
    assert_eq!(api.tcp_connections, 3.0);
    assert_eq!(api.read_bytes_per_sec, 20.0);
    assert_eq!(api.write_bytes_per_sec, 400.0);
    // Every request came over mTLS.
    assert_eq!(api.tls_share, Some(1.0));

    // web: inbound of web-0 from load.
    let web = row(&r, "web");
    assert_eq!((web.requests, web.rps), (200.0, 20.0));
    near(web.success_rate, 0.95);
    // Bucket increases: le=5: 500→560 (60), le=10: 900→1040 (140), le=20: 1000→1190
    // (190), le=30…+Inf: 1000→1200 (200).
    // p50: rank 100 → le=10 (140): 5 + 5 × (100 − 60)/(140 − 60) = 7.5.
    near(web.latency_ms_p50, 7.5);
    // p95: rank 190 → le=20 (190 ≥ 190): 10 + 10 × (190 − 140)/(190 − 140) = 20.
    near(web.latency_ms_p95, 20.0);
    // p99: rank 198 → le=30 (200): 20 + 10 × (198 − 190)/(200 − 190) = 28.
    near(web.latency_ms_p99, 28.0);
    // The totals since start would say otherwise (p50 of le=5: 560, le=10: 1040 of 1200
    // is 5.42): the window's increases are what count.
    assert_eq!(web.tcp_connections, 0.0);

    // load receives nothing: a row all the same, with nothing to measure.
    let load = row(&r, "load");
    assert_eq!((load.requests, load.rps), (0.0, 0.0));
    assert_eq!(load.success_rate, None);
    assert_eq!(load.latency_ms_p50, None);
    assert_eq!(load.tls_share, None);
    assert_eq!(load.meshed_pods, Some(1));
}

#[test]
fn pods_and_namespaces() {
    let r = rows(&sel(Resource::Pod));
    let names: Vec<&str> = r.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["api-0", "api-1", "load-0", "web-0"]);
    let api0 = row(&r, "api-0");
    assert_eq!((api0.requests, api0.rps), (300.0, 30.0));
    // le=2: +300 of 300: p50 rank 150: 1 + 150/300 = 1.5; p95: 1 + 285/300; p99: 1 + 297/300.
    near(api0.latency_ms_p50, 1.5);
    near(api0.latency_ms_p95, 1.95);
    near(api0.latency_ms_p99, 1.99);
    assert_eq!((api0.meshed_pods, api0.tcp_connections), (Some(1), 3.0));
    let api1 = row(&r, "api-1");
    assert_eq!((api1.requests, api1.rps), (100.0, 10.0));
    // le=3: +100 of 100: p50 rank 50: 2 + 50/100 = 2.5.
    near(api1.latency_ms_p50, 2.5);
    near(api1.latency_ms_p99, 2.99);

    let r = rows(&sel(Resource::Namespace));
    assert_eq!(r.len(), 1);
    let shop = &r[0];
    assert_eq!(
        (shop.resource, shop.namespace.as_str(), shop.name.as_str()),
        ("ns", "shop", "shop")
    );
    assert_eq!(
        (shop.meshed_pods, shop.requests, shop.rps),
        (Some(4), 600.0, 60.0)
    );
    // (190 + 396) / 600.
    near(shop.success_rate, 586.0 / 600.0);
    // web's and api's buckets summed: le=1: 0, le=2: 300, le=3: 400, le=4: 400,
    // le=5: 460, le=10: 540, le=20: 590, le=30…: 600.
    // p50: rank 300 → le=2 (300): 1 + 1 × 300/300 = 2.
    near(shop.latency_ms_p50, 2.0);
    // p95: rank 570 → le=20 (590): 10 + 10 × (570 − 540)/(590 − 540) = 16.
    near(shop.latency_ms_p95, 16.0);
    // p99: rank 594 → le=30 (600): 20 + 10 × (594 − 590)/(600 − 590) = 24.
    near(shop.latency_ms_p99, 24.0);
}

#[test]
fn from_a_workload_by_destination() {
    let mut s = sel(Resource::Deploy);
    s.edge = Edge::From(target("deploy/web"));
    let r = rows(&s);
    let names: Vec<(&str, &str, &str)> = r
        .iter()
        .map(|r| (r.resource, r.namespace.as_str(), r.name.as_str()))
        .collect();
    // api by its server identity (sa/api); db.data is a Service outside the mesh.
    assert_eq!(names, [("svc", "data", "db"), ("deploy", "shop", "api")]);
    // web-0's outbound to api: the client's view.
    let api = row(&r, "api");
    assert_eq!((api.requests, api.rps), (400.0, 40.0));
    near(api.success_rate, 0.99);
    // Buckets: le=1: 0, le=2: 200, le=3…: 400. p50: rank 200 → le=2: 1 + 200/200 = 2;
    // p95: rank 380 → le=3: 2 + 180/200 = 2.9; p99: 2 + 196/200 = 2.98.
    near(api.latency_ms_p50, 2.0);
    near(api.latency_ms_p95, 2.9);
    near(api.latency_ms_p99, 2.98);
    assert_eq!(api.meshed_pods, Some(2));
    // The TCP to db: 1 open, 9000 → 11000 bytes read, 900 → 1100 written, none over mTLS.
    let db = row(&r, "db");
    assert_eq!(db.meshed_pods, None);
    assert_eq!((db.requests, db.success_rate), (0.0, None));
    assert_eq!(db.tcp_connections, 1.0);
    assert_eq!(
        (db.read_bytes_per_sec, db.write_bytes_per_sec),
        (200.0, 20.0)
    );
    assert_eq!(db.tls_share, Some(0.0));

    // -n keeps the rows (and, by default, --from) in one namespace.
    s.namespace = Some("shop".into());
    let names: Vec<String> = rows(&s).into_iter().map(|r| r.name).collect();
    assert_eq!(names, ["api"]);

    // By namespace.
    let mut s = sel(Resource::Namespace);
    s.edge = Edge::From(target("deploy/web"));
    let names: Vec<(String, f64)> = rows(&s).into_iter().map(|r| (r.name, r.requests)).collect();
    assert_eq!(
        names,
        [("data".to_string(), 0.0), ("shop".to_string(), 400.0)]
    );

    // From a pod, from a namespace.
    for from in ["pod/web-0", "ns/shop"] {
        let mut s = sel(Resource::Deploy);
        s.edge = Edge::From(target(from));
        let r = rows(&s);
        assert_eq!(row(&r, "api").requests, 400.0, "{from}");
        if from == "ns/shop" {
            // load-0 sends to web too.
            assert_eq!(row(&r, "web").requests, 200.0);
        }
    }
}

#[test]
fn to_a_workload_by_client() {
    let mut s = sel(Resource::Deploy);
    s.edge = Edge::To(target("deploy/web"));
    let r = rows(&s);
    assert_eq!(r.len(), 1);
    let load = &r[0];
    assert_eq!(
        (load.name.as_str(), load.requests, load.rps),
        ("load", 200.0, 20.0)
    );
    near(load.success_rate, 0.95);
    // load-0's outbound buckets: le=10: 100, le=20: 180, le=30…: 200.
    // p50: rank 100 → le=10: 5 + 5 × 100/100 = 10.
    near(load.latency_ms_p50, 10.0);
    // p95: rank 190 → le=30: 20 + 10 × (190 − 180)/(200 − 180) = 25.
    near(load.latency_ms_p95, 25.0);
    // p99: rank 198 → 20 + 10 × 18/20 = 29.
    near(load.latency_ms_p99, 29.0);

    let mut s = sel(Resource::Pod);
    s.edge = Edge::To(target("deploy/api"));
    let r = rows(&s);
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].name.as_str(), r[0].requests), ("web-0", 400.0));

    // To a namespace: web-0 → db.data.
    let mut s = sel(Resource::Deploy);
    s.edge = Edge::To(target("ns/data"));
    let r = rows(&s);
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].name.as_str(), r[0].tcp_connections), ("web", 1.0));
    // A namespace given to --to.
    let mut s = sel(Resource::Deploy);
    s.edge = Edge::To(Target::parse("deploy/web", Some("elsewhere".into())).unwrap());
    assert!(rows(&s).is_empty());
}

#[test]
fn name_and_namespace_filters() {
    let mut s = sel(Resource::Deploy);
    s.name = Some("api".into());
    let r = rows(&s);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].name, "api");
    s.namespace = Some("shop".into());
    assert_eq!(rows(&s).len(), 1);
    s.namespace = Some("other".into());
    assert!(rows(&s).is_empty());
    let mut s = sel(Resource::Namespace);
    s.namespace = Some("shop".into());
    assert_eq!(rows(&s).len(), 1);
}

#[test]
fn what_the_metrics_cannot_answer_is_refused() {
    let mut s = sel(Resource::Pod);
    s.edge = Edge::From(target("deploy/web"));
    assert!(s.check().unwrap_err().contains("use `stat deploy --from"));
    let mut s = sel(Resource::Deploy);
    s.edge = Edge::To(target("pod/api-0"));
    assert!(s.check().unwrap_err().contains("use `--to deploy/NAME`"));
    assert!(Target::parse("web", None)
        .unwrap_err()
        .contains("TYPE/NAME"));
    assert!(Target::parse("svc/web", None)
        .unwrap_err()
        .contains("use deploy, pod or ns"));
    assert_eq!(
        super::resource_and_name("deploy/web", None).unwrap(),
        (Resource::Deploy, Some("web".into()))
    );
    assert!(super::resource_and_name("deploy/web", Some("api")).is_err());
    assert_eq!(
        super::resource_and_name("po", Some("web-0")).unwrap(),
        (Resource::Pod, Some("web-0".into()))
    );
}

#[test]
fn counter_resets_count_as_prometheus_rate_does() {
    let l = r#"direction="inbound",namespace="shop",pod="api-1",workload="api",client_id="spiffe://cluster.local/ns/shop/sa/web",server_id="",dst_service="",tls="true""#;
    let before = format!(
        "request_total{{{l}}} 1000
response_total{{{l},status_code=\"200\",classification=\"success\",grpc_status=\"\"}} 999
response_total{{{l},status_code=\"503\",classification=\"failure\",grpc_status=\"\"}} 1
response_latency_ms_bucket{{le=\"1.0\",{l}}} 0
response_latency_ms_bucket{{le=\"2.0\",{l}}} 1000
response_latency_ms_bucket{{le=\"3.0\",{l}}} 1000
response_latency_ms_bucket{{le=\"+Inf\",{l}}} 1000
# EOF
"
    );
    // The proxy restarted during the window and served 60 requests since.
    let after = format!(
        "request_total{{{l}}} 60
response_total{{{l},status_code=\"200\",classification=\"success\",grpc_status=\"\"}} 57
response_total{{{l},status_code=\"503\",classification=\"failure\",grpc_status=\"\"}} 2
response_total{{{l},status_code=\"504\",classification=\"failure\",grpc_status=\"\"}} 1
response_latency_ms_bucket{{le=\"1.0\",{l}}} 0
response_latency_ms_bucket{{le=\"2.0\",{l}}} 0
response_latency_ms_bucket{{le=\"3.0\",{l}}} 60
response_latency_ms_bucket{{le=\"+Inf\",{l}}} 60
# EOF
"
    );
    let snap = |t: &str| Snapshot {
        proxies: [("http://b:4191".to_string(), parse(t).unwrap())].into(),
    };
    let r = compute(
        &snap(&before),
        &snap(&after),
        WINDOW,
        &sel(Resource::Deploy),
    );
    assert_eq!(r.len(), 1);
    let api = &r[0];
    // 1000 → 60 is a decrease: a reset, and all 60 are new (not −940).
    assert_eq!((api.requests, api.rps), (60.0, 6.0));
    // Success 999 → 57: reset, +57. Failure 503: 1 → 2 did not decrease, so Prometheus
    // (and we) cannot tell it was reset: +1. Failure 504 is a new series: +1 from 0 (a
    // series the proxy creates at its first response). 57 / (57 + 1 + 1).
    near(api.success_rate, 57.0 / 59.0);
    // Buckets: le=1: 0 → 0 (0); le=2: 1000 → 0 (reset: 0); le=3: 1000 → 60 (reset: 60);
    // +Inf: 60. p50: rank 30 → le=3: 2 + 1 × (30 − 0)/(60 − 0) = 2.5.
    near(api.latency_ms_p50, 2.5);
    // p99: rank 59.4 → 2 + 59.4/60 = 2.99.
    near(api.latency_ms_p99, 2.99);

    assert_eq!(increase(Some(5.0), 7.0), 2.0);
    assert_eq!(increase(Some(5.0), 5.0), 0.0);
    assert_eq!(increase(Some(5.0), 3.0), 3.0);
    assert_eq!(increase(None, 4.0), 4.0);
}

#[test]
fn a_proxy_that_answered_once_is_left_out() {
    // Node b answered only the second scrape: its counters would all look new.
    let (mut before, after) = snapshots();
    before.proxies.remove("http://b:4191");
    let r = compute(&before, &after, WINDOW, &sel(Resource::Deploy));
    let names: Vec<&str> = r.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["api", "web"], "load-0 is on node b");
    assert_eq!(row(&r, "api").requests, 300.0, "api-0 only");
    assert_eq!(row(&r, "api").meshed_pods, Some(1));
}

#[test]
fn table_wide_and_json() {
    let r = rows(&sel(Resource::Deploy));
    assert_eq!(
        render(&r, Format::Table, "deploy"),
        "\
NAMESPACE   NAME   MESHED   SUCCESS   RPS       LATENCY_P50   LATENCY_P95   LATENCY_P99   TCP_CONN
shop        api    2/2      99.00%    40.0rps   1.67ms        2.80ms        2.96ms        3
shop        load   1/1      -         0.0rps    -             -             -             0
shop        web    1/1      95.00%    20.0rps   7.50ms        20.0ms        28.0ms        0
"
    );
    let mut s = sel(Resource::Deploy);
    s.edge = Edge::From(target("deploy/web"));
    assert_eq!(
        render(&rows(&s), Format::Wide, "deploy"),
        "\
NAMESPACE   NAME     MESHED   SUCCESS   RPS       LATENCY_P50   LATENCY_P95   LATENCY_P99   TCP_CONN   READ_BYTES/SEC   WRITE_BYTES/SEC   TLS
data        svc/db   -        -         0.0rps    -             -             -             1          200.0B/s         20.0B/s           0%
shop        api      2/2      99.00%    40.0rps   2.00ms        2.90ms        2.98ms        0          0.0B/s           0.0B/s            100%
"
    );
    assert_eq!(
        render(&rows(&sel(Resource::Namespace)), Format::Table, "ns"),
        "\
NAME   MESHED   SUCCESS   RPS       LATENCY_P50   LATENCY_P95   LATENCY_P99   TCP_CONN
shop   4/4      97.67%    60.0rps   2.00ms        16.0ms        24.0ms        3
"
    );

    let text = render(&r, Format::Json, "deploy");
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let rows = json.as_array().unwrap();
    assert_eq!(rows.len(), 3);
    let api = &rows[0];
    // Every object has the same keys, in this order.
    let first = &text[..text.find('}').unwrap()];
    let keys: Vec<&str> = first
        .lines()
        .filter_map(|l| l.trim().strip_prefix('"')?.split('"').next())
        .collect();
    assert_eq!(
        keys,
        [
            // Linkerd's keys, in its order: a jq script written for it works.
            "namespace",
            "kind",
            "name",
            "meshed",
            "success",
            "rps",
            "latency_ms_p50",
            "latency_ms_p95",
            "latency_ms_p99",
            "tcp_open_connections",
            "tcp_read_bytes_rate",
            "tcp_write_bytes_rate",
            "resource",
            "meshed_pods",
            "pods",
            "requests",
            "tls_share"
        ]
    );
    assert_eq!(api["name"], "api");
    assert_eq!(api["requests"], 400.0);
    assert_eq!(api["success"], 0.99);
    assert_eq!(api["rps"], 40.0);
    assert!(api["latency_ms_p99"].is_f64());
    assert_eq!(api["meshed_pods"], 2);
    assert_eq!(api["meshed"], "2/2");
    assert_eq!(api["kind"], "deployment");
    // Nothing to measure: null, not "-" or 0.
    let load = &rows[1];
    assert!(load["success"].is_null());
    assert!(load["latency_ms_p50"].is_null());
    assert!(load["tls_share"].is_null());
    assert_eq!(load["rps"], 0.0);
    assert_eq!(render(&[], Format::Json, "deploy"), "[]\n");
}

// The command, end to end, against in-process "node proxies".

/// A node proxy's admin server that answers its n-th request with `answers[n]` (status,
/// body), then closes; the URL.
pub(crate) async fn serve(answers: Vec<(u16, String)>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        for (status, body) in answers {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).await.unwrap();
                assert!(n > 0, "the request ended early");
                req.extend_from_slice(&buf[..n]);
            }
            assert!(req.starts_with(b"GET /metrics HTTP/1.1\r\n"));
            let head = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            s.write_all(head.as_bytes()).await.unwrap();
            s.write_all(body.as_bytes()).await.unwrap();
            s.shutdown().await.unwrap();
        }
    });
    format!("http://{addr}")
}

/// A URL where nothing listens.
pub(crate) async fn closed() -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    drop(l);
    url
}

fn stat_args(cmd: &[&str], urls: &[String]) -> StatArgs {
    use clap::Parser;
    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        stat: StatArgs,
    }
    let mut argv = vec!["stat".to_string()];
    argv.extend(cmd.iter().map(|s| s.to_string()));
    argv.push("--proxy-admin".into());
    argv.extend(urls.iter().cloned());
    Cli::try_parse_from(argv).unwrap().stat
}

#[tokio::test]
async fn stat_scrapes_twice_and_skips_a_proxy_that_does_not_answer() {
    let a = serve(vec![(200, A1.into()), (200, A2.into())]).await;
    let b = serve(vec![(200, B1.into()), (200, B2.into())]).await;
    let down = closed().await;
    let urls = [a, b, down.clone()];
    let args = stat_args(&["deploy", "-o", "json", "-t", "300ms"], &urls);
    assert_eq!(args.window, Duration::from_millis(300));
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
    assert!(warn.contains("is the node proxy running"), "{warn}");
    let rows: serde_json::Value = serde_json::from_str(&out).unwrap();
    let api = &rows[0];
    assert_eq!(api["name"], "api");
    assert_eq!(api["requests"], 400.0);
    assert_eq!(api["success"], 0.99);
    // The window is the time between the two scrapes, measured: 300 ms and a little.
    let secs = 400.0 / api["rps"].as_f64().unwrap();
    assert!((0.3..1.5).contains(&secs), "{secs}");
}

#[tokio::test]
async fn stat_fails_when_no_proxy_answers_and_says_why() {
    let down = closed().await;
    let not_found = serve(vec![(404, "no such page\n".into())]).await;
    let garbage = serve(vec![(200, "# HELP x\nx 1\nthis is not metrics\n".into())]).await;
    let urls = [down.clone(), not_found.clone(), garbage.clone()];
    let args = stat_args(&["deploy", "-t", "50ms"], &urls);
    let mut warn = Vec::new();
    let e = execute(&args, &Flags(&args.proxies.proxy_admin), &mut warn)
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("none of the 3 node proxies answered"),
        "{e}"
    );
    let warn = String::from_utf8(warn).unwrap();
    assert!(
        warn.contains(&format!(
            "{not_found}/metrics: answered 404 Not Found: no such page; is this a node proxy's admin server"
        )),
        "{warn}"
    );
    assert!(
        warn.contains(&format!("{garbage}/metrics: line 3: ")),
        "{warn}"
    );
    assert!(warn.contains("not Prometheus text metrics"), "{warn}");

    // A proxy that answers the first scrape only: no rate.
    let once = serve(vec![(200, A1.into())]).await;
    let args = stat_args(&["deploy", "-t", "50ms"], &[once]);
    let e = execute(&args, &Flags(&args.proxies.proxy_admin), &mut Vec::new())
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("no node proxy answered both scrapes"),
        "{e}"
    );
}

#[tokio::test]
async fn stat_refuses_bad_urls_and_selections_before_scraping() {
    for (cmd, urls, says) in [
        (
            vec!["deploy"],
            vec!["https://127.0.0.1:4191"],
            "speaks plain HTTP",
        ),
        (
            vec!["svc"],
            vec!["http://127.0.0.1:1"],
            "use deploy, pod or ns",
        ),
        (
            vec!["pod", "--from", "deploy/web"],
            vec!["http://127.0.0.1:1"],
            "use `stat deploy --from",
        ),
        (
            vec!["deploy", "--to", "web"],
            vec!["http://127.0.0.1:1"],
            "--to \"web\": expected TYPE/NAME",
        ),
    ] {
        let urls: Vec<String> = urls.into_iter().map(String::from).collect();
        let args = stat_args(&cmd, &urls);
        let e = execute(&args, &Flags(&args.proxies.proxy_admin), &mut Vec::new())
            .await
            .unwrap_err();
        assert!(e.to_string().contains(says), "{cmd:?}: {e}");
    }
    // Where clap itself refuses.
    use clap::Parser;
    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        stat: StatArgs,
    }
    let e = Cli::try_parse_from(["stat", "-t", "0s"]).unwrap_err();
    assert!(e.to_string().contains("longer than 0s"), "{e}");
    let e = Cli::try_parse_from(["stat", "--from", "deploy/a", "--to", "deploy/b"]).unwrap_err();
    assert!(e.to_string().contains("cannot be used with"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_node_proxys_metrics_are_read() {
    // A node proxy of this repository (in process): its admin server, its content type,
    // every family it registers (identity, discovery, limits, CNI, …) go through the
    // scraper and the parser. Its one pod has no netns here, so no traffic: no rows.
    let cluster = "---\napiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: shop}\n\
        spec: {nodeName: node-a, serviceAccountName: web, containers: []}\n\
        status: {podIP: 10.99.0.2, phase: Running}\n";
    let cp =
        ambit_e2e::ControlPlane::start(&format!("{}{cluster}", ambit_e2e::NAMESPACES), &["node-a"])
            .await;
    let proxy = ambit_e2e::NodeProxy::start(&cp, "node-a").await;
    let url = format!("http://{}", proxy.admin_addr);
    let samples = super::scrape::scrape(
        &super::scrape::AdminUrl::parse(&url).unwrap().into(),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    assert!(
        samples
            .iter()
            .any(|s| s.name == "identity_cert_expiration_timestamp_seconds"
                && s.label("identity") == "spiffe://cluster.local/ns/shop/sa/web"),
        "{samples:?}"
    );
    let args = stat_args(
        &["deploy", "-o", "json", "-t", "100ms"],
        std::slice::from_ref(&url),
    );
    let mut warn = Vec::new();
    let out = execute(&args, &Flags(&args.proxies.proxy_admin), &mut warn)
        .await
        .unwrap();
    assert_eq!(out, "[]\n", "{}", String::from_utf8_lossy(&warn));
    assert!(warn.is_empty(), "{}", String::from_utf8_lossy(&warn));
    // A path that is not /metrics: the admin server's 404, named.
    let args = stat_args(&["deploy", "-t", "10ms"], &[format!("{url}/nope")]);
    let mut warn = Vec::new();
    assert!(execute(&args, &Flags(&args.proxies.proxy_admin), &mut warn)
        .await
        .is_err());
    let warn = String::from_utf8(warn).unwrap();
    assert!(warn.contains("/nope: answered 404 Not Found"), "{warn}");
    proxy.stop().await;
    cp.stop().await;
}

/// The demo's catalog (issue 24): two replicas on one node, one failing 20 % of its calls.
/// The deployment's success rate is the replicas' responses summed (PromQL's
/// `sum(increase(response_total{classification="success"})) / sum(increase(response_total))`),
/// so it moves with how the balancer splits the calls: 90 % for an even split, 82 % when the
/// failing replica took 90 % of them — never the mean of the two rates.
#[test]
fn a_deployment_success_rate_weighs_its_pods_by_their_responses() {
    let series = |pod: &str, ok: u32, failed: u32| {
        let l = format!(
            r#"direction="inbound",namespace="demo",pod="{pod}",workload="catalog",client_id="spiffe://cluster.local/ns/demo/sa/web",server_id="",dst_service="",tls="true""#
        );
        format!(
            "request_total{{{l}}} {}
response_total{{{l},status_code=\"200\",classification=\"success\",grpc_status=\"0\"}} {ok}
response_total{{{l},status_code=\"200\",classification=\"failure\",grpc_status=\"13\"}} {failed}
",
            ok + failed
        )
    };
    let snap = |a: (u32, u32), b: (u32, u32)| Snapshot {
        proxies: [(
            "http://node-b:4191".to_string(),
            parse(&format!(
                "{}{}# EOF\n",
                series("catalog-a1b2c", a.0, a.1),
                series("catalog-h5j6k", b.0, b.1)
            ))
            .unwrap(),
        )]
        .into(),
    };
    let before = snap((1000, 0), (800, 200));
    for ((healthy, failing), want) in [
        // An even split: 100 + 80 of 200.
        ((100, (80, 20)), 0.9),
        // The balancer sent the failing replica 90 %: 20 + 144 of 200.
        ((20, (144, 36)), 164.0 / 200.0),
        // Nearly all to the healthy one: 190 + 8 of 200.
        ((190, (8, 2)), 198.0 / 200.0),
    ] {
        let after = snap((1000 + healthy, 0), (800 + failing.0, 200 + failing.1));
        let rows = compute(&before, &after, WINDOW, &sel(Resource::Deploy));
        assert_eq!(rows.len(), 1, "{rows:#?}");
        let catalog = &rows[0];
        assert_eq!(
            (catalog.name.as_str(), catalog.meshed_pods),
            ("catalog", Some(2))
        );
        assert_eq!(catalog.requests, 200.0);
        near(catalog.success_rate, want);
        // Per pod: each replica's own rate, whatever the split.
        let pods = compute(&before, &after, WINDOW, &sel(Resource::Pod));
        let rate = |name: &str| {
            pods.iter()
                .find(|r| r.name == name)
                .and_then(|r| r.success_rate)
        };
        assert_eq!(rate("catalog-a1b2c"), Some(1.0));
        near(rate("catalog-h5j6k"), 0.8);
    }
}
