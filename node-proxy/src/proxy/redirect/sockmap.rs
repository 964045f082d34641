//! `--sockmap`: sk_msg redirection between an application's socket and the proxy's socket
//! at the other end of the same in-pod hop (the application's redirected connection to
//! 4140; the proxy delivering to the application at the pod's own address), so that their
//! bytes skip the loopback TCP stack. eBPF redirection only: nftables rewrites addresses,
//! and the two ends of a hop could not be paired. The programs and their kernel tests are
//! in `ebpf/` (`ebpf/tests/sockmap`).
//!
//! Off by default: on Linux 6.18 `splice(2)` cannot read redirected bytes (an application
//! that splices from its socket would stall), and a redirected hop has no backpressure —
//! bounded by a budget of 4 MiB per socket, after which it goes back to TCP, so a
//! connection is only sped up for its first 4 MiB each way. docs/ARCHITECTURE.md
//! ("Redirection") and BENCHMARKS.md say what it buys.

use ambit_ebpf::sockmap::ProxyCoverage;
use ambit_ebpf::Redirection;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::path::{Path, PathBuf};

/// `--sockmap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Sockmap {
    /// Pair the in-pod hops' sockets (eBPF redirection only).
    On,
    /// Every byte takes TCP.
    Off,
}

/// What `--sockmap` amounts to on this start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SockmapState {
    /// Off, as asked.
    Off,
    /// On; `own_cgroup` when `sockops` was attached to the proxy's cgroup too (it runs
    /// outside the cgroup the programs are attached to).
    On {
        /// The proxy's own cgroup, when the programs' cgroup does not hold it.
        own_cgroup: Option<PathBuf>,
    },
    /// Asked for, not in effect, and why.
    Unavailable(String),
}

impl SockmapState {
    /// Whether new in-pod hops are paired.
    pub fn enabled(&self) -> bool {
        matches!(self, Self::On { .. })
    }
}

impl std::fmt::Display for SockmapState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Off => write!(f, "off"),
            Self::On { own_cgroup: None } => write!(f, "on"),
            Self::On {
                own_cgroup: Some(dir),
            } => write!(
                f,
                "on (sockops also on the proxy's cgroup {})",
                dir.display()
            ),
            Self::Unavailable(why) => write!(f, "unavailable: {why}"),
        }
    }
}

/// Applies `asked` to the loaded programs (`cgroup`: where they are attached). Off also
/// clears a switch an earlier run left on (the maps are pinned).
pub(super) fn apply(r: &mut Redirection, asked: Sockmap, cgroup: &Path) -> SockmapState {
    let state = match asked {
        Sockmap::Off => match r.disable_sockmap() {
            Ok(()) => SockmapState::Off,
            Err(e) => SockmapState::Unavailable(format!("could not turn it off: {e}")),
        },
        Sockmap::On => match r.enable_sockmap(cgroup) {
            Ok(ProxyCoverage::Covered) => SockmapState::On { own_cgroup: None },
            Ok(ProxyCoverage::OwnCgroup(dir)) => SockmapState::On {
                own_cgroup: Some(dir),
            },
            Err(e) => SockmapState::Unavailable(e.to_string()),
        },
    };
    log(&state);
    state
}

/// `asked` where redirection is not eBPF.
pub(super) fn without_ebpf(asked: Sockmap) -> SockmapState {
    let state = match asked {
        Sockmap::Off => SockmapState::Off,
        Sockmap::On => SockmapState::Unavailable(
            "needs eBPF redirection (--redirect ebpf, or auto on a kernel that takes it)".into(),
        ),
    };
    log(&state);
    state
}

fn log(state: &SockmapState) {
    match state {
        SockmapState::Unavailable(why) => {
            tracing::warn!(%why, "--sockmap on is not in effect; every byte takes TCP")
        }
        SockmapState::On { .. } => tracing::info!(sockmap = %state, "in-pod hops skip TCP"),
        SockmapState::Off => {}
    }
}

/// `sockmap_enabled`: 1 when new in-pod hops are paired.
pub(super) fn register(registry: &mut Registry, state: &SockmapState) {
    let gauge = Gauge::<i64>::default();
    gauge.set(i64::from(state.enabled()));
    registry.register(
        "sockmap_enabled",
        "Whether the in-pod hops (application to proxy) skip the loopback TCP stack (--sockmap on, in effect)",
        gauge,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn sockmap_is_off_unless_asked_for() {
        let parse = |extra: &[&str]| {
            let mut args = vec!["ambit-proxy", "--node-name", "n", "--trust-anchors", "/x"];
            args.extend_from_slice(extra);
            crate::config::Config::try_parse_from(args).unwrap_or_else(|e| panic!("{e}"))
        };
        assert_eq!(parse(&[]).sockmap, Sockmap::Off);
        assert_eq!(parse(&["--sockmap", "on"]).sockmap, Sockmap::On);
        assert!(crate::config::Config::try_parse_from([
            "ambit-proxy",
            "--node-name",
            "n",
            "--trust-anchors",
            "/x",
            "--sockmap",
            "yes"
        ])
        .is_err());
    }

    #[test]
    fn sockmap_asked_for_without_ebpf_says_why_it_is_not_on() {
        assert_eq!(without_ebpf(Sockmap::Off), SockmapState::Off);
        let state = without_ebpf(Sockmap::On);
        assert!(!state.enabled());
        assert!(state.to_string().contains("needs eBPF"), "{state}");
        let mut registry = Registry::default();
        register(&mut registry, &state);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(text.contains("sockmap_enabled 0"), "{text}");
    }
}
