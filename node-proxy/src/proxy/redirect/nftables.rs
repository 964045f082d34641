//! Redirection by nftables in the pod's network namespace — the rules linkerd-init
//! writes, installed by the proxy when it takes a pod on. The pod's outbound TCP goes to
//! 4140 (except the proxy's own marked sockets, loopback and skip-outbound ports); inbound
//! TCP other than the mesh port goes to 4144 (except skip-inbound ports).
//!
//! The rules stay when the proxy stops: a meshed pod's connections then meet closed ports
//! and fail, rather than leave in the clear (fail closed). eBPF redirection replaces this
//! where the kernel has the hooks (the redirection issue).

use crate::discovery::Workload;
use crate::netns::Netns;
use crate::proxy::{INBOUND_PLAIN_PORT, MESH_PORT, OUTBOUND_PORT, PROXY_MARK};
use ambit_api::ports::PortSet;
use std::io::{self, Write};
use std::process::{Command, Stdio};

/// The table Ambit owns in each pod netns.
pub const TABLE: &str = "ambit";

fn port_set(ports: &PortSet) -> Option<String> {
    if ports.is_empty() {
        return None;
    }
    let items: Vec<String> = ports
        .ranges()
        .iter()
        .map(|(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect();
    Some(format!("{{ {} }}", items.join(", ")))
}

/// The nft script for `w`: replaces the IPv4 and IPv6 tables atomically (one
/// transaction).
pub fn rules(w: &Workload) -> String {
    let skip_out = port_set(&w.skip_outbound_ports)
        .map(|s| format!("    tcp dport {s} return\n"))
        .unwrap_or_default();
    let skip_in = port_set(&w.skip_inbound_ports)
        .map(|s| format!("    tcp dport {s} return\n"))
        .unwrap_or_default();
    let mut script = String::new();
    for (family, loopback) in [("ip", "ip daddr 127.0.0.0/8"), ("ip6", "ip6 daddr ::1")] {
        script.push_str(&table(family, loopback, &skip_out, &skip_in));
    }
    script
}

/// Matches a connection's first packet (a SYN alone). A nat chain sees only the first
/// packet of each conntrack entry; for a connection that predates the rules (a pod
/// enrolled while it runs: conntrack picks the flow up mid-stream) that packet is not a
/// SYN, so the connection keeps its way instead of being reset at a proxy port.
const NEW_CONNECTION: &str = "tcp flags & (fin | syn | rst | ack) == syn";

fn table(family: &str, loopback: &str, skip_out: &str, skip_in: &str) -> String {
    format!(
        "table {family} {TABLE} {{}}\n\
         delete table {family} {TABLE}\n\
         table {family} {TABLE} {{\n\
         \x20 chain output {{\n\
         \x20   type nat hook output priority -100; policy accept;\n\
         \x20   meta mark {PROXY_MARK:#010x} return\n\
         \x20   oifname \"lo\" return\n\
         \x20   {loopback} return\n\
         {skip_out}\
         \x20   {NEW_CONNECTION} redirect to :{OUTBOUND_PORT}\n\
         \x20 }}\n\
         \x20 chain prerouting {{\n\
         \x20   type nat hook prerouting priority -100; policy accept;\n\
         \x20   tcp dport {MESH_PORT} return\n\
         {skip_in}\
         \x20   {NEW_CONNECTION} redirect to :{INBOUND_PLAIN_PORT}\n\
         \x20 }}\n\
         }}\n"
    )
}

fn nft(script: &str) -> io::Result<()> {
    // Runs on the netns helper thread: the child process starts in the pod's netns.
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("running nft (Debian package nftables): {e}"),
            )
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "nft refused the rules: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Installs (or replaces) the pod's redirection rules.
pub async fn install(netns: &Netns, w: &Workload) -> io::Result<()> {
    let script = rules(w);
    netns.run(move || nft(&script)).await?
}

/// Removes the pod's rules (a pod that left; its netns may already be gone).
pub async fn remove(netns: &Netns) -> io::Result<()> {
    let script = ["ip", "ip6"]
        .map(|f| format!("table {f} {TABLE} {{}}\ndelete table {f} {TABLE}\n"))
        .concat();
    netns.run(move || nft(&script)).await?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_skip_the_proxy_loopback_and_skip_ports() {
        let w = Workload {
            namespace: "shop".into(),
            name: "web-0".into(),
            uid: String::new(),
            node: "node-a".into(),
            ips: vec![],
            identity: ambit_api::WorkloadIdentity::new("cluster.local", "shop", "web").unwrap(),
            meshed: true,
            netns: None,
            opaque_ports: PortSet::empty(),
            skip_inbound_ports: "22,9000-9010".parse().unwrap(),
            skip_outbound_ports: "5432".parse().unwrap(),
            workload: "web".into(),
            ready: true,
        };
        let r = rules(&w);
        assert!(r.contains("meta mark 0x0a3b0000 return"), "{r}");
        assert!(
            r.contains("tcp dport { 5432 } return\n    tcp flags & (fin | syn | rst | ack) == syn redirect to :4140"),
            "{r}"
        );
        assert!(r.contains("tcp dport 4143 return\n    tcp dport { 22, 9000-9010 } return\n    tcp flags & (fin | syn | rst | ack) == syn redirect to :4144"), "{r}");
    }
}
