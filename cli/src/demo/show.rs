//! What the demo prints: what runs where, which files to edit and what to try next; what
//! `down` removed; and `ambit demo`'s refreshing `ambit stat`.

use super::cluster::{service, CATALOG_FAIL_PERCENT, LOAD_RPS, NAMESPACE, SERVICES};
use super::down::Removed;
use super::state::State;
use super::term;
use crate::stat::{self, render::Format, ProxyArgs, StatArgs};
use std::fmt::Write;
use std::time::Duration;

/// Prints what runs where and what to try.
pub fn summary(s: &State) {
    term::out(&summary_text(s));
}

fn summary_text(s: &State) -> String {
    let redirect = match s.redirect.as_str() {
        "ebpf" => "eBPF (cgroup connect4/6 + sk_lookup)",
        "nftables" => "nftables (the kernel refused the eBPF programs)",
        other => other,
    };
    let mut t = format!("\nThe Ambit demo runs. Redirection: {redirect}.\n\n");
    for node in &s.nodes {
        let _ = writeln!(t, "  {}   node proxy admin {}", node.name, node.admin_url);
        for p in s.pods.iter().filter(|p| p.node == node.name) {
            let note = if p.name.ends_with("h5j6k") {
                format!("   fails {CATALOG_FAIL_PERCENT} % of its requests")
            } else if p.workload == "load" {
                format!("   {LOAD_RPS} requests/s to web")
            } else {
                String::new()
            };
            let _ = writeln!(t, "    pod {:<26} {:<10}{note}", p.name, p.ip);
        }
    }
    let _ = writeln!(
        t,
        "  control plane   {} (identity)  {} (discovery)  {} (admin)\n",
        s.control.identity_url, s.control.discovery_url, s.control.admin_url
    );
    t.push_str("  Services:");
    for svc in &SERVICES {
        let _ = write!(
            t,
            "  {} {}:{} ({})",
            svc.name, svc.cluster_ip, svc.port, svc.protocol
        );
    }
    // What a user watching `stat deploy` sees move (issue 24): not a wrong sum, the split.
    let _ = write!(
        t,
        "\n\ndeploy/catalog's success rate moves between {} % and 100 %: the balancer (peak EWMA \
         over two choices, as Linkerd's)\nsends most calls to whichever replica answered faster \
         lately, switching every few seconds; `stat pod` shows each replica's own rate.",
        100 - CATALOG_FAIL_PERCENT
    );
    let _ = write!(
        t,
        "\n\nEdit the cluster while it runs (the control plane reloads it):\n  {}/demo.yaml\nLogs: {}/logs/\n\n",
        s.control.cluster_dir.display(),
        s.dir.display()
    );
    let (web, api) = (service("web").cluster_ip, service("api").cluster_ip);
    // As the user ran it (target/release/ambit until it is on the PATH).
    let ambit = std::env::args().next().unwrap_or_else(|| "ambit".into());
    let tries = [
        (
            format!("stat deploy -n {NAMESPACE}"),
            "golden metrics per deployment",
        ),
        (
            format!("stat pod -n {NAMESPACE} -o wide"),
            "per pod: the failing catalog replica",
        ),
        (
            format!("stat deploy -n {NAMESPACE} --from deploy/web"),
            "what web sends, by destination",
        ),
        (
            format!("edges -n {NAMESPACE}"),
            "who talks to whom, and over mTLS",
        ),
        (
            "check --proxy".to_string(),
            "the PKI, the control plane, the proxies",
        ),
        (
            format!("demo exec load -- curl -s http://{web}/"),
            "a request from a meshed pod",
        ),
        (
            format!("demo exec load -- curl -s http://{api}/"),
            "403: only web may call api",
        ),
        ("demo down".to_string(), "remove everything"),
    ];
    let width = tries.iter().map(|(c, _)| c.len()).max().unwrap_or(0);
    t.push_str("Try:\n");
    for (cmd, what) in tries {
        let _ = writeln!(t, "  {ambit} {cmd:<width$}   {what}");
    }
    t
}

/// What `down` removed, as one line.
pub fn removed(r: &Removed) -> String {
    if !r.anything() {
        return "no demo to remove".into();
    }
    format!(
        "removed the demo: {} processes, {} network namespaces, {}{} bpffs pin directories, {}",
        r.processes,
        r.netns.len(),
        if r.cgroups { "its cgroups, " } else { "" },
        r.pins.len(),
        if r.dir {
            "its directory"
        } else {
            "no directory"
        }
    )
}

/// `ambit stat deploy -n demo` every few seconds, until Ctrl-C (or SIGTERM / SIGHUP).
pub fn watch(s: &State) -> anyhow::Result<()> {
    let args = StatArgs {
        resource: "deploy".into(),
        name: None,
        namespace: Some(NAMESPACE.into()),
        from: None,
        from_namespace: None,
        to: None,
        to_namespace: None,
        window: Duration::from_secs(5),
        output: Format::Table,
        proxies: ProxyArgs {
            proxy_admin: s.proxy_admins(),
            timeout: Duration::from_secs(5),
        },
    };
    let source = stat::scrape::Flags(&args.proxies.proxy_admin);
    let rt = stat::runtime()?;
    rt.block_on(async {
        term::out(&format!(
            "\nambit stat deploy -n {NAMESPACE}, every 5 s (Ctrl-C ends the demo):\n"
        ));
        loop {
            let mut warn = Vec::new();
            tokio::select! {
                r = stat::execute(&args, &source, &mut warn) => {
                    // Clear the screen, then the table (and why a proxy was skipped).
                    let table = match r {
                        Ok(table) => table,
                        Err(e) => format!("{e:#}\n"),
                    };
                    term::out(&format!(
                        "\x1b[2J\x1b[H{table}{}\n(Ctrl-C ends the demo and removes it)\n",
                        String::from_utf8_lossy(&warn)
                    ));
                }
                _ = term::ended() => return Ok(()),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removed_says_what_was_there() {
        assert_eq!(removed(&Removed::default()), "no demo to remove");
        let r = Removed {
            processes: 8,
            netns: vec!["ambit-demo-br".into()],
            cgroups: true,
            pins: vec![],
            dir: true,
        };
        assert_eq!(
            removed(&r),
            "removed the demo: 8 processes, 1 network namespaces, its cgroups, 0 bpffs pin directories, its directory"
        );
    }
}
