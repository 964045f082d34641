//! `ambit stat`'s output: a table as `linkerd viz stat` prints it (`-o wide` adds byte rates
//! and the mTLS share), or a JSON array of [`Row`]s.

use super::compute::Row;

/// Output formats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// NAMESPACE NAME MESHED SUCCESS RPS LATENCY_P50 LATENCY_P95 LATENCY_P99 TCP_CONN.
    #[default]
    Table,
    /// The table, with READ_BYTES/SEC, WRITE_BYTES/SEC and TLS.
    Wide,
    /// A JSON array of objects with `linkerd viz stat -o json`'s keys: namespace, kind,
    /// name, meshed ("2/2"), success, rps, latency_ms_p50/p95/p99, tcp_open_connections,
    /// tcp_read_bytes_rate, tcp_write_bytes_rate; then resource (deploy, pod, ...),
    /// meshed_pods, pods, requests, tls_share (null when there is nothing to measure).
    Json,
}

/// Left-aligned columns three spaces apart, as Linkerd's tabwriter.
pub fn columns(rows: &[Vec<String>]) -> String {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            line.push_str(c);
            if i + 1 < r.len() {
                let pad = widths[i] - c.chars().count() + 3;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The name a table shows: a row of another kind than asked for (a destination that is a
/// Service or an identity) is prefixed with its kind.
pub fn display_name(r: &Row, kind: &str) -> String {
    match r.resource {
        k if k == kind => r.name.clone(),
        "svc" | "sa" | "deploy" | "pod" | "ns" => format!("{}/{}", r.resource, r.name),
        _ => format!("({})", r.name),
    }
}

fn ms(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(v) if v >= 100.0 => format!("{v:.0}ms"),
        Some(v) if v >= 10.0 => format!("{v:.1}ms"),
        Some(v) => format!("{v:.2}ms"),
    }
}

fn rate(v: f64, unit: &str) -> String {
    if v >= 1.0 || v == 0.0 {
        format!("{v:.1}{unit}")
    } else {
        format!("{v:.2}{unit}")
    }
}

fn percent(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{:.2}%", v * 100.0))
}

/// Renders `rows` of `kind` (`deploy`, `pod`, `ns`).
pub fn render(rows: &[Row], format: Format, kind: &str) -> String {
    if format == Format::Json {
        return serde_json::to_string_pretty(rows).map_or_else(|e| format!("{e}\n"), |s| s + "\n");
    }
    let wide = format == Format::Wide;
    let with_ns = kind != "ns";
    let mut head: Vec<&str> = Vec::new();
    if with_ns {
        head.push("NAMESPACE");
    }
    head.extend([
        "NAME",
        "MESHED",
        "SUCCESS",
        "RPS",
        "LATENCY_P50",
        "LATENCY_P95",
        "LATENCY_P99",
        "TCP_CONN",
    ]);
    if wide {
        head.extend(["READ_BYTES/SEC", "WRITE_BYTES/SEC", "TLS"]);
    }
    let mut table = vec![head.into_iter().map(String::from).collect::<Vec<_>>()];
    for r in rows {
        let mut line = Vec::new();
        if with_ns {
            line.push(if r.namespace.is_empty() {
                "-".into()
            } else {
                r.namespace.clone()
            });
        }
        line.push(display_name(r, kind));
        line.push(match (r.meshed_pods, r.pods) {
            (Some(m), Some(p)) => format!("{m}/{p}"),
            _ => "-".into(),
        });
        line.push(percent(r.success_rate));
        line.push(rate(r.rps, "rps"));
        line.push(ms(r.latency_ms_p50));
        line.push(ms(r.latency_ms_p95));
        line.push(ms(r.latency_ms_p99));
        line.push(format!("{}", r.tcp_connections));
        if wide {
            line.push(rate(r.read_bytes_per_sec, "B/s"));
            line.push(rate(r.write_bytes_per_sec, "B/s"));
            line.push(
                r.tls_share
                    .map_or("-".into(), |v| format!("{:.0}%", v * 100.0)),
            );
        }
        table.push(line);
    }
    columns(&table)
}
