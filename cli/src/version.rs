//! `ambit version`: this client's version and each node proxy's (its `proxy_build_info`),
//! as `linkerd version` prints the client's and the control plane's. A proxy that does not
//! answer is named with why, and one on another version than the client is marked
//! (`ambit check --proxy` compares each proxy with the control plane's version).

use crate::stat::kube::KubeArgs;
use crate::stat::parse::Sample;
use crate::stat::scrape::{self, ProxySource};
use crate::stat::{ProxyArgs, Source};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;

/// `ambit version` flags.
#[derive(Debug, clap::Args)]
pub struct VersionArgs {
    /// Only this client's version; do not ask the proxies.
    #[arg(long)]
    pub client: bool,
    /// Output format.
    #[arg(short, long, value_enum, default_value = "text")]
    pub output: Output,
    #[command(flatten)]
    pub proxies: ProxyArgs,
}

/// How `ambit version` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// `Client version: …` and one line per proxy.
    Text,
    /// `{"client": {...}, "proxies": {NAME: {...} or {"error": ...}}}`.
    Json,
}

/// One build, as `proxy_build_info` labels it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Build {
    /// The version.
    pub version: String,
    /// The git commit, `unknown` when the build did not record it.
    #[serde(rename = "gitSha")]
    pub git_sha: String,
}

/// What a proxy answered: its build, or why there is none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum ProxyVersion {
    /// Its `proxy_build_info`.
    Build(Build),
    /// No answer, or no `proxy_build_info` (a proxy older than it).
    Error {
        /// Why.
        error: String,
    },
}

/// This client's build.
pub fn client() -> Build {
    Build {
        version: env!("CARGO_PKG_VERSION").into(),
        git_sha: option_env!("AMBIT_GIT_SHA").unwrap_or("unknown").into(),
    }
}

/// A proxy's build out of its metrics.
pub fn proxy_build(samples: &[Sample]) -> ProxyVersion {
    match samples.iter().find(|s| s.name == "proxy_build_info") {
        Some(s) => ProxyVersion::Build(Build {
            version: s.label("version").into(),
            git_sha: s.label("git_sha").into(),
        }),
        None => ProxyVersion::Error {
            error: "no proxy_build_info in its metrics (a proxy older than 0.1.0?)".into(),
        },
    }
}

/// The text or JSON to print.
pub fn render(client: &Build, proxies: &BTreeMap<String, ProxyVersion>, output: Output) -> String {
    match output {
        Output::Json => {
            let v = serde_json::json!({"client": client, "proxies": proxies});
            format!("{}\n", serde_json::to_string_pretty(&v).unwrap_or_default())
        }
        Output::Text => {
            let mut out = format!("Client version: {}\n", client.version);
            for (name, v) in proxies {
                match v {
                    ProxyVersion::Build(b) => {
                        let note = if b.version == client.version {
                            ""
                        } else {
                            " (not the client's)"
                        };
                        out += &format!("Proxy version: {} {name}{note}\n", b.version);
                    }
                    ProxyVersion::Error { error } => {
                        out += &format!("Proxy version: unavailable {name}: {error}\n");
                    }
                }
            }
            out
        }
    }
}

/// Each proxy's version, or why it has none.
pub async fn proxies(
    source: &dyn ProxySource,
    timeout: std::time::Duration,
) -> BTreeMap<String, ProxyVersion> {
    let mut out = BTreeMap::new();
    let found = match source.find().await {
        Ok(found) => found,
        Err(e) => {
            out.insert("(none)".into(), ProxyVersion::Error { error: e });
            return out;
        }
    };
    for skipped in found.skipped {
        out.insert(skipped.0.clone(), ProxyVersion::Error { error: skipped.0 });
    }
    let (answered, failed) = scrape::scrape_all(&found.proxies, timeout).await;
    for (name, samples) in answered {
        out.insert(name, proxy_build(&samples));
    }
    for e in failed {
        let name = e.0.split(": ").next().unwrap_or_default().to_string();
        out.insert(name, ProxyVersion::Error { error: e.0 });
    }
    out
}

/// `ambit version`.
pub fn run(args: VersionArgs, kube: &KubeArgs) -> anyhow::Result<()> {
    let proxies = if args.client {
        BTreeMap::new()
    } else {
        let source = Source::of(&args.proxies, kube);
        crate::stat::runtime()?.block_on(proxies(&source, args.proxies.timeout))
    };
    let text = render(&client(), &proxies, args.output);
    let mut out = std::io::stdout();
    match out.write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stat::parse::parse;

    #[test]
    fn a_proxys_version_is_its_build_info_and_a_mismatch_is_said() {
        let text = "# TYPE proxy_build_info gauge\n\
            proxy_build_info{version=\"0.0.9\",git_sha=\"abc123\",profile=\"release\",vendor=\"ambit\"} 1\n";
        let old = proxy_build(&parse(text).unwrap());
        let build = Build {
            version: "0.0.9".into(),
            git_sha: "abc123".into(),
        };
        assert_eq!(old, ProxyVersion::Build(build));
        let none = proxy_build(&parse("process_max_fds 4096\n").unwrap());
        assert!(
            matches!(&none, ProxyVersion::Error { error } if error.contains("no proxy_build_info"))
        );
        let me = client();
        let same = ProxyVersion::Build(me.clone());
        let proxies = BTreeMap::from([
            ("http://10.0.0.1:4191/metrics".to_string(), same),
            ("http://10.0.0.2:4191/metrics".to_string(), old),
            ("http://10.0.0.3:4191/metrics".to_string(), none),
        ]);
        let text = render(&me, &proxies, Output::Text);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], format!("Client version: {}", me.version));
        assert_eq!(
            lines[1],
            format!("Proxy version: {} http://10.0.0.1:4191/metrics", me.version)
        );
        assert_eq!(
            lines[2],
            "Proxy version: 0.0.9 http://10.0.0.2:4191/metrics (not the client's)"
        );
        assert!(
            lines[3].starts_with(
                "Proxy version: unavailable http://10.0.0.3:4191/metrics: no proxy_build_info"
            ),
            "{text}"
        );
        let json: serde_json::Value =
            serde_json::from_str(&render(&me, &proxies, Output::Json)).unwrap();
        assert_eq!(json["client"]["version"], me.version);
        assert_eq!(
            json["proxies"]["http://10.0.0.2:4191/metrics"]["gitSha"],
            "abc123"
        );
        assert!(json["proxies"]["http://10.0.0.3:4191/metrics"]["error"].is_string());
    }
}
