//! Redirection by nftables in the pod's network namespace — the rules linkerd-init
//! writes, installed by the proxy when it takes a pod on. The pod's outbound TCP goes to
//! 4140 (except the proxy's own marked sockets, loopback and skip-outbound ports); inbound
//! TCP other than the mesh port goes to 4144 (except skip-inbound ports).
//!
//! The rules are typed values of the `nftables` crate (libnftables' JSON schema), not
//! text: [`rules`] builds one batch, and `nft -j -f -`, started on the pod's netns
//! thread so that it runs in the pod's netns, applies it as one transaction. Per family
//! (`ip`, `ip6`) the table is:
//!
//! ```text
//! table ip ambit {
//!   chain output {      type nat hook output priority -100; policy accept;
//!     meta mark 0x0a3b0000 return          # the proxy's own sockets
//!     oifname "lo" return
//!     ip daddr 127.0.0.0/8 return          # ip6 daddr ::1 in the ip6 table
//!     tcp dport <skip-outbound> return     # when there are any
//!     tcp flags & (fin | syn | rst | ack) == syn redirect to :4140
//!   }
//!   chain prerouting {  type nat hook prerouting priority -100; policy accept;
//!     tcp dport 4143 return                # the mesh tunnel reaches the proxy as it is
//!     tcp dport <skip-inbound> return      # when there are any
//!     tcp flags & (fin | syn | rst | ack) == syn redirect to :4144
//!   }
//! }
//! ```
//!
//! The rules stay when the proxy stops: a meshed pod's connections then meet closed ports
//! and fail, rather than leave in the clear (fail closed). eBPF redirection replaces this
//! where the kernel has the hooks (the redirection issue).

use crate::discovery::Workload;
use crate::netns::Netns;
use crate::proxy::{INBOUND_PLAIN_PORT, MESH_PORT, OUTBOUND_PORT, PROXY_MARK};
use ::nftables::batch::Batch;
use ::nftables::expr::{
    BinaryOperation, Expression, Meta, MetaKey, NamedExpression, Payload, PayloadField, Prefix,
    Range, SetItem,
};
use ::nftables::schema::{Chain, NfListObject, Nftables, Rule, Table};
use ::nftables::stmt::{Match, Operator, Statement, NAT};
use ::nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};
use ambit_api::ports::PortSet;
use std::borrow::Cow;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

/// The table Ambit owns in each pod netns.
pub const TABLE: &str = "ambit";

/// The chain redirecting the pod's own connections (to 4140).
pub const OUTPUT_CHAIN: &str = "output";

/// The chain redirecting connections to the pod (to 4144).
pub const PREROUTING_CHAIN: &str = "prerouting";

/// Both chains sit at dstnat priority, where linkerd-init's (iptables) REDIRECT sits.
const PRIORITY: i32 = -100;

/// The families Ambit's table is made in: each with its address protocol and the
/// loopback destinations left alone.
fn families() -> [(NfFamily, &'static str, Expression<'static>); 2] {
    let ip4_loopback = Expression::Named(NamedExpression::Prefix(Prefix {
        addr: Box::new(string("127.0.0.0")),
        len: 8,
    }));
    [
        (NfFamily::IP, "ip", ip4_loopback),
        (NfFamily::IP6, "ip6", string("::1")),
    ]
}

/// `w`'s rules, as one batch that replaces the IPv4 and IPv6 tables atomically: each
/// table is added (so that it exists), deleted and added again with its chains and rules,
/// all in one transaction — there is no moment without rules.
pub fn rules(w: &Workload) -> Nftables<'static> {
    let mut batch = Batch::new();
    for (family, protocol, loopback) in families() {
        let table = table(family);
        batch.add(NfListObject::Table(table.clone()));
        batch.delete(NfListObject::Table(table.clone()));
        batch.add(NfListObject::Table(table));
        // What each chain leaves alone (`return`), in order; then its redirect.
        let mut output = vec![
            matches(meta(MetaKey::Mark), number(PROXY_MARK)),
            matches(meta(MetaKey::Oifname), string("lo")),
            matches(payload(protocol, "daddr"), loopback),
        ];
        output.extend(ports(&w.skip_outbound_ports).map(|p| matches(tcp_dport(), p)));
        let mut prerouting = vec![matches(tcp_dport(), number(MESH_PORT.into()))];
        prerouting.extend(ports(&w.skip_inbound_ports).map(|p| matches(tcp_dport(), p)));
        for (name, hook, skips, port) in [
            (OUTPUT_CHAIN, NfHook::Output, output, OUTBOUND_PORT),
            (
                PREROUTING_CHAIN,
                NfHook::Prerouting,
                prerouting,
                INBOUND_PLAIN_PORT,
            ),
        ] {
            batch.add(NfListObject::Chain(chain(family, name, hook)));
            for skip in skips {
                let expr = vec![skip, Statement::Return(None)];
                batch.add(NfListObject::Rule(rule(family, name, expr)));
            }
            let expr = vec![new_connection(), redirect_to(port)];
            batch.add(NfListObject::Rule(rule(family, name, expr)));
        }
    }
    batch.to_nftables()
}

/// A batch that removes the tables if they are there: adding an existing table is no
/// error, so the delete always finds one (nft 1.0.6 has no `destroy`).
pub fn removal() -> Nftables<'static> {
    let mut batch = Batch::new();
    for (family, _, _) in families() {
        batch.add(NfListObject::Table(table(family)));
        batch.delete(NfListObject::Table(table(family)));
    }
    batch.to_nftables()
}

fn table(family: NfFamily) -> Table<'static> {
    Table {
        family,
        name: Cow::Borrowed(TABLE),
        handle: None,
    }
}

fn chain(family: NfFamily, name: &'static str, hook: NfHook) -> Chain<'static> {
    Chain {
        family,
        table: Cow::Borrowed(TABLE),
        name: Cow::Borrowed(name),
        _type: Some(NfChainType::NAT),
        hook: Some(hook),
        prio: Some(PRIORITY),
        policy: Some(NfChainPolicy::Accept),
        ..Chain::default()
    }
}

fn rule(family: NfFamily, chain: &'static str, expr: Vec<Statement<'static>>) -> Rule<'static> {
    Rule {
        family,
        table: Cow::Borrowed(TABLE),
        chain: Cow::Borrowed(chain),
        expr: Cow::Owned(expr),
        ..Rule::default()
    }
}

fn matches(left: Expression<'static>, right: Expression<'static>) -> Statement<'static> {
    Statement::Match(Match {
        left,
        right,
        op: Operator::EQ,
    })
}

fn number(n: u32) -> Expression<'static> {
    Expression::Number(n)
}

fn string(s: &'static str) -> Expression<'static> {
    Expression::String(Cow::Borrowed(s))
}

fn meta(key: MetaKey) -> Expression<'static> {
    Expression::Named(NamedExpression::Meta(Meta { key }))
}

fn payload(protocol: &'static str, field: &'static str) -> Expression<'static> {
    Expression::Named(NamedExpression::Payload(Payload::PayloadField(
        PayloadField {
            protocol: Cow::Borrowed(protocol),
            field: Cow::Borrowed(field),
        },
    )))
}

fn tcp_dport() -> Expression<'static> {
    payload("tcp", "dport")
}

/// `ports` as nft matches them: one port as itself (which is how nft lists a set of one),
/// several as an anonymous set of ports and ranges; `None` when there are none.
fn ports(ports: &PortSet) -> Option<Expression<'static>> {
    let item = |&(a, b): &(u16, u16)| {
        if a == b {
            number(a.into())
        } else {
            Expression::Range(Box::new(Range {
                range: [number(a.into()), number(b.into())],
            }))
        }
    };
    match ports.ranges() {
        [] => None,
        [(a, b)] if a == b => Some(number((*a).into())),
        ranges => Some(Expression::Named(NamedExpression::Set(
            ranges.iter().map(|r| SetItem::Element(item(r))).collect(),
        ))),
    }
}

/// `tcp flags & (fin | syn | rst | ack) == syn`: a connection's first packet (a SYN
/// alone). A nat chain sees only the first packet of each conntrack entry; for a
/// connection that predates the rules (a pod enrolled while it runs: conntrack picks the
/// flow up mid-stream) that packet is not a SYN, so the connection keeps its way instead
/// of being reset at a proxy port.
fn new_connection() -> Statement<'static> {
    let flags = ["fin", "syn", "rst", "ack"].map(string).to_vec();
    matches(
        Expression::BinaryOperation(Box::new(BinaryOperation::AND(
            payload("tcp", "flags"),
            Expression::List(flags),
        ))),
        string("syn"),
    )
}

fn redirect_to(port: u16) -> Statement<'static> {
    Statement::Redirect(Some(NAT {
        addr: None,
        family: None,
        port: Some(number(port.into())),
        flags: None,
    }))
}

/// Why `nft` did not apply a batch.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    /// The batch could not be turned into JSON (a bug of ours).
    #[error("{what} in netns {netns}: the rules do not serialize to JSON: {source}")]
    Serialize {
        /// What was being done.
        what: String,
        /// The pod's netns.
        netns: PathBuf,
        /// serde_json's error.
        source: serde_json::Error,
    },
    /// `nft` could not be started or fed.
    #[error("{what} in netns {netns}: running `nft -j -f -`: {source}; the nftables redirection needs the nft binary (Debian package nftables) on the proxy's PATH — install it, or use --redirect ebpf")]
    Run {
        /// What was being done.
        what: String,
        /// The pod's netns.
        netns: PathBuf,
        /// The error starting, feeding or waiting for nft.
        source: io::Error,
    },
    /// `nft` refused the batch; nothing of it was applied (one transaction).
    #[error("{what} in netns {netns}: `nft -j -f -` refused the rules ({status}), nothing changed: {stderr}; this needs an nft built with JSON support (`nft -V` says `json: yes`) and a kernel with nf_tables NAT and REDIRECT (modules nf_tables, nft_nat, nft_redir) — or use --redirect ebpf")]
    Refused {
        /// What was being done.
        what: String,
        /// The pod's netns.
        netns: PathBuf,
        /// nft's exit status.
        status: ExitStatus,
        /// What nft said.
        stderr: String,
    },
}

impl From<NftError> for io::Error {
    fn from(e: NftError) -> Self {
        let kind = match &e {
            NftError::Run { source, .. } => source.kind(),
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}

/// Applies `batch` with `nft -j -f -` as one transaction, in the netns of the calling
/// thread (the child process starts in it). `what` and `netns` name the work in errors.
///
/// This is `nftables::helper::apply_ruleset` but for nft's stderr, which the crate's
/// helper leaves to the proxy's own: an operator gets nft's reason in the error.
pub fn apply(batch: &Nftables<'_>, what: &str, netns: &Path) -> Result<(), NftError> {
    let run = |source| NftError::Run {
        what: what.to_string(),
        netns: netns.to_path_buf(),
        source,
    };
    let json = serde_json::to_vec(batch).map_err(|source| NftError::Serialize {
        what: what.to_string(),
        netns: netns.to_path_buf(),
        source,
    })?;
    let mut child = Command::new("nft")
        .args(["-j", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(run)?;
    // A write nft cut short (it exits on a parse error) is reported by its status below.
    let written = match child.stdin.take() {
        Some(mut stdin) => stdin.write_all(&json),
        None => Err(io::Error::other("nft's stdin was not piped")),
    };
    let out = child.wait_with_output().map_err(run)?;
    if !out.status.success() {
        return Err(NftError::Refused {
            what: what.to_string(),
            netns: netns.to_path_buf(),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    written.map_err(run)
}

/// Installs (or replaces) the pod's redirection rules.
pub async fn install(netns: &Netns, w: &Workload) -> io::Result<()> {
    let batch = rules(w);
    let what = format!("installing the redirection rules of pod {}", w.key());
    let path = netns.path().to_path_buf();
    // On the netns helper thread: nft starts in the pod's netns.
    Ok(netns.run(move || apply(&batch, &what, &path)).await??)
}

/// Removes the pod's rules (a pod that left; its netns may already be gone). Removing
/// rules that are not there is no error.
pub async fn remove(netns: &Netns) -> io::Result<()> {
    let path = netns.path().to_path_buf();
    let what = "removing the redirection rules";
    Ok(netns.run(move || apply(&removal(), what, &path)).await??)
}

#[cfg(test)]
mod tests;
