//! `proxy_build_info`: which build a node proxy is, as Linkerd's proxy exposes it (a gauge
//! of 1 whose labels are the version, the git commit, the build profile and the vendor),
//! so that dashboards and `ambit version` / `ambit check` see every node's version.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The build's labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// The crate's version (the chart's appVersion).
    pub version: String,
    /// The commit built (`AMBIT_GIT_SHA` at build time; `unknown` without it).
    pub git_sha: String,
    /// `release` or `debug`.
    pub profile: String,
    /// `ambit`.
    pub vendor: String,
}

/// This build's labels.
pub fn labels() -> BuildLabels {
    BuildLabels {
        version: env!("CARGO_PKG_VERSION").into(),
        git_sha: option_env!("AMBIT_GIT_SHA").unwrap_or("unknown").into(),
        profile: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
        .into(),
        vendor: "ambit".into(),
    }
}

/// Registers `proxy_build_info` (1, with [`labels`]).
pub fn register(registry: &mut Registry) {
    let family = Family::<BuildLabels, Gauge>::default();
    family.get_or_create(&labels()).set(1);
    registry.register(
        "proxy_build_info",
        "The proxy's build: version, git commit, profile and vendor (always 1)",
        family,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_is_one_series_of_one_with_the_crates_version() {
        let mut r = Registry::default();
        register(&mut r);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with("proxy_build_info{"))
            .unwrap_or_else(|| panic!("{text}"));
        let version = env!("CARGO_PKG_VERSION");
        assert!(line.contains(&format!("version=\"{version}\"")), "{line}");
        assert!(
            line.contains("vendor=\"ambit\"") && line.contains("profile=\""),
            "{line}"
        );
        assert!(line.ends_with(" 1"), "{line}");
        assert!(text.contains("# TYPE proxy_build_info gauge"), "{text}");
    }
}
