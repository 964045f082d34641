//! A small parser of the Prometheus / OpenMetrics text exposition format: enough for what
//! the node proxies serve (`prometheus-client`'s encoder) and for any well-formed
//! exposition. `#` lines (`# HELP`, `# TYPE`, `# UNIT`, `# EOF`) are skipped; a sample line
//! is `name{label="value",...} value [timestamp] [# exemplar]`, label values escaping `\\`,
//! `\"` and `\n`.

use std::collections::BTreeMap;
use std::fmt;

/// A series' labels, by name.
pub type Labels = BTreeMap<String, String>;

/// One sample: a series and its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The metric name as exposed (`request_total`, `response_latency_ms_bucket`, …).
    pub name: String,
    /// Its labels.
    pub labels: Labels,
    /// Its value.
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, "" when absent (as PromQL sees a missing label).
    pub fn label(&self, name: &str) -> &str {
        self.labels.get(name).map_or("", String::as_str)
    }
}

/// Why a line could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// What was wrong.
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for ParseError {}

/// Parses an exposition into its samples, in order.
pub fn parse(text: &str) -> Result<Vec<Sample>, ParseError> {
    let mut samples = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let sample = parse_line(line).map_err(|message| ParseError {
            line: i + 1,
            message,
        })?;
        samples.push(sample);
    }
    Ok(samples)
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

fn parse_line(line: &str) -> Result<Sample, String> {
    let name_end = line.find(|c: char| !is_name_char(c)).unwrap_or(line.len());
    let name = &line[..name_end];
    if !name.starts_with(is_name_start) {
        return Err(format!("expected a metric name at the start of {line:?}"));
    }
    let mut rest = &line[name_end..];
    let mut labels = Labels::new();
    if let Some(after) = rest.strip_prefix('{') {
        rest = parse_labels(after, &mut labels)?;
    }
    let mut fields = rest.split_ascii_whitespace();
    if rest.trim().is_empty() {
        return Err(format!("{name} has no value"));
    }
    if !rest.starts_with([' ', '\t']) {
        return Err(format!(
            "expected a space and a value after {name}{}",
            if labels.is_empty() { "" } else { "{…}" }
        ));
    }
    let value = fields
        .next()
        .ok_or_else(|| format!("{name} has no value"))?;
    let value = parse_value(value).ok_or_else(|| format!("{name}: {value:?} is not a number"))?;
    // An optional timestamp, then an optional exemplar (` # {…} value`), both ignored.
    match fields.next() {
        None | Some("#") => {}
        Some(ts) => {
            if ts.parse::<f64>().is_err() {
                return Err(format!("{name}: {ts:?} is not a timestamp"));
            }
            match fields.next() {
                None | Some("#") => {}
                Some(extra) => return Err(format!("{name}: unexpected {extra:?} after the value")),
            }
        }
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// `+Inf`, `-Inf`, `NaN` and Go/Rust float syntax.
pub(crate) fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ if s
            .bytes()
            .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b)) =>
        {
            s.parse().ok()
        }
        _ => None,
    }
}

/// Reads `k="v",…}` into `labels`; returns what follows the `}`.
fn parse_labels<'a>(mut s: &'a str, labels: &mut Labels) -> Result<&'a str, String> {
    loop {
        s = s.trim_start();
        if let Some(rest) = s.strip_prefix('}') {
            return Ok(rest);
        }
        let end = s.find(|c: char| !is_name_char(c)).unwrap_or(s.len());
        let key = &s[..end];
        if !key.starts_with(is_name_start) {
            return Err(format!("expected a label name or '}}' at {:?}", head(s)));
        }
        s = s[end..].trim_start();
        s = s
            .strip_prefix('=')
            .ok_or_else(|| format!("expected '=' after label {key}"))?
            .trim_start();
        s = s
            .strip_prefix('"')
            .ok_or_else(|| format!("expected '\"' to open the value of label {key}"))?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let close = loop {
            match chars.next() {
                None => return Err(format!("the value of label {key} is not closed")),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => {
                        return Err(format!(
                            "label {key}: unknown escape \\{c} (only \\\\, \\\" and \\n)"
                        ))
                    }
                    None => return Err(format!("the value of label {key} is not closed")),
                },
                Some((_, c)) => value.push(c),
            }
        };
        if labels.insert(key.to_string(), value).is_some() {
            return Err(format!("label {key} appears twice"));
        }
        s = s[close + 1..].trim_start();
        if let Some(rest) = s.strip_prefix(',') {
            s = rest;
        } else if !s.starts_with('}') {
            return Err(format!(
                "expected ',' or '}}' after label {key} at {:?}",
                head(s)
            ));
        }
    }
}

/// The start of `s`, for messages.
fn head(s: &str) -> &str {
    match s.char_indices().nth(20) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn reads_what_prometheus_client_writes() {
        // The shape of the node proxy's /metrics (prometheus-client 0.24): HELP/TYPE lines,
        // counters with `_total`, a histogram with `le` first, `# EOF`.
        let text = "# HELP request HTTP requests.\n\
# TYPE request counter\n\
request_total{direction=\"inbound\",namespace=\"shop\",pod=\"web-0\",workload=\"web\",client_id=\"\",server_id=\"\",dst_service=\"\",tls=\"no_identity\"} 3\n\
# HELP response_latency_ms Time to response headers, in milliseconds.\n\
# TYPE response_latency_ms histogram\n\
response_latency_ms_sum{direction=\"inbound\"} 9.5\n\
response_latency_ms_count{direction=\"inbound\"} 3\n\
response_latency_ms_bucket{le=\"1.0\",direction=\"inbound\"} 0\n\
response_latency_ms_bucket{le=\"+Inf\",direction=\"inbound\"} 3\n\
# EOF\n";
        let s = parse(text).unwrap();
        assert_eq!(s.len(), 5);
        assert_eq!(s[0].name, "request_total");
        assert_eq!(s[0].value, 3.0);
        assert_eq!(s[0].label("pod"), "web-0");
        assert_eq!(s[0].label("client_id"), "");
        assert_eq!(s[0].label("absent"), "");
        assert_eq!(s[1].value, 9.5);
        assert_eq!(
            s[3].labels,
            labels(&[("le", "1.0"), ("direction", "inbound")])
        );
        assert_eq!(s[4].label("le"), "+Inf");
    }

    #[test]
    fn escapes_timestamps_exemplars_and_special_values() {
        let text = "a{v=\"x\\\\y\\\"z\\nw\",} 1 1700000000000\n\
b +Inf\n\
c{ k = \"v\" , j=\"a,b}c\" } -Inf\n\
d NaN\n\
e{le=\"2.0\"} 2 # {trace_id=\"42\"} 1.5\n\
f 1.5e3\n";
        let s = parse(text).unwrap();
        assert_eq!(s[0].labels, labels(&[("v", "x\\y\"z\nw")]));
        assert_eq!(s[0].value, 1.0);
        assert_eq!(s[1].value, f64::INFINITY);
        assert_eq!(s[2].labels, labels(&[("k", "v"), ("j", "a,b}c")]));
        assert_eq!(s[2].value, f64::NEG_INFINITY);
        assert!(s[3].value.is_nan());
        assert_eq!(s[4].value, 2.0);
        assert_eq!(s[5].value, 1500.0);
    }

    #[test]
    fn errors_name_the_line_and_what_is_wrong() {
        let cases = [
            ("ok 1\n{x=\"y\"} 1\n", 2, "metric name"),
            ("a{x=\"y} 1\n", 1, "not closed"),
            ("# HELP a\n\na{x=y} 1\n", 3, "to open the value of label x"),
            ("a{x=\"y\" z=\"w\"} 1\n", 1, "expected ',' or '}'"),
            ("a{x=\"\\t\"} 1\n", 1, "unknown escape"),
            ("a 1 2 3\n", 1, "unexpected"),
            ("a one\n", 1, "not a number"),
            ("a\n", 1, "no value"),
            ("a{x=\"1\"}1\n", 1, "expected a space"),
            ("a{x=\"1\",x=\"2\"} 1\n", 1, "twice"),
            ("a 1 later\n", 1, "not a timestamp"),
        ];
        for (text, line, what) in cases {
            let e = parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.message.contains(what), "{text:?}: {e}");
            assert!(e.to_string().starts_with(&format!("line {line}: ")));
        }
    }
}
