use super::*;
use crate::testing::TestNetns;
use serde_json::{json, Value};

fn workload(skip_inbound: &str, skip_outbound: &str) -> Workload {
    let ports = |s: &str| -> PortSet {
        if s.is_empty() {
            PortSet::empty()
        } else {
            s.parse().unwrap_or_else(|e| panic!("{s}: {e:?}"))
        }
    };
    Workload {
        namespace: "shop".into(),
        name: "web-0".into(),
        uid: String::new(),
        node: "node-a".into(),
        ips: vec![],
        identity: ambit_api::WorkloadIdentity::new("cluster.local", "shop", "web")
            .unwrap_or_else(|e| panic!("{e}")),
        meshed: true,
        netns: None,
        opaque_ports: PortSet::empty(),
        skip_inbound_ports: ports(skip_inbound),
        skip_outbound_ports: ports(skip_outbound),
        workload: "web".into(),
        workload_kind: "Deployment".into(),
        ready: true,
    }
}

fn to_json(batch: &Nftables<'_>) -> Value {
    serde_json::to_value(batch).unwrap_or_else(|e| panic!("{e}"))
}

/// The `expr` of every rule of `family`'s `chain` in `doc`, in order: a batch's `add`
/// commands and `nft -j list`'s bare objects alike.
fn rules_of(doc: &Value, family: &str, chain: &str) -> Vec<Value> {
    let objects = doc["nftables"].as_array().cloned().unwrap_or_default();
    objects
        .iter()
        .map(|o| o.get("add").unwrap_or(o))
        .filter_map(|o| o.get("rule"))
        .filter(|r| r["family"] == family && r["chain"] == chain)
        .map(|r| r["expr"].clone())
        .collect()
}

/// `family`'s chains in `doc`, by name.
fn chains_of(doc: &Value, family: &str) -> Vec<Value> {
    let objects = doc["nftables"].as_array().cloned().unwrap_or_default();
    objects
        .iter()
        .map(|o| o.get("add").unwrap_or(o))
        .filter_map(|o| o.get("chain"))
        .filter(|c| c["family"] == family)
        .cloned()
        .collect()
}

fn tcp_dport_is(right: Value) -> Value {
    json!([
        {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": right}},
        {"return": null}
    ])
}

fn syn_redirect_to(port: u16) -> Value {
    json!([
        {"match": {
            "op": "==",
            "left": {"&": [{"payload": {"protocol": "tcp", "field": "flags"}}, ["fin", "syn", "rst", "ack"]]},
            "right": "syn"
        }},
        {"redirect": {"port": port}}
    ])
}

#[test]
fn rules_skip_the_proxy_loopback_and_skip_ports_then_redirect_first_packets_only() {
    let doc = to_json(&rules(&workload("22,9000-9010", "5432")));
    for (family, loopback) in [
        (
            "ip",
            json!({"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": {"prefix": {"addr": "127.0.0.0", "len": 8}}}}),
        ),
        (
            "ip6",
            json!({"match": {"op": "==", "left": {"payload": {"protocol": "ip6", "field": "daddr"}}, "right": "::1"}}),
        ),
    ] {
        let output = rules_of(&doc, family, "output");
        assert_eq!(
            output,
            [
                json!([{"match": {"op": "==", "left": {"meta": {"key": "mark"}}, "right": 0x0a3b_0000}}, {"return": null}]),
                json!([{"match": {"op": "==", "left": {"meta": {"key": "oifname"}}, "right": "lo"}}, {"return": null}]),
                json!([loopback, {"return": null}]),
                tcp_dport_is(json!(5432)),
                syn_redirect_to(4140),
            ],
            "{family}: {doc:#}"
        );
        let prerouting = rules_of(&doc, family, "prerouting");
        assert_eq!(
            prerouting,
            [
                tcp_dport_is(json!(4143)),
                tcp_dport_is(json!({"set": [22, {"range": [9000, 9010]}]})),
                syn_redirect_to(4144),
            ],
            "{family}: {doc:#}"
        );
        for (chain, hook) in [("output", "output"), ("prerouting", "prerouting")] {
            let chains = chains_of(&doc, family);
            let c = chains.iter().find(|c| c["name"] == chain);
            let c = c.unwrap_or_else(|| panic!("{family} {chain}: {doc:#}"));
            assert_eq!(
                (
                    &c["table"],
                    &c["type"],
                    &c["hook"],
                    &c["prio"],
                    &c["policy"]
                ),
                (
                    &json!("ambit"),
                    &json!("nat"),
                    &json!(hook),
                    &json!(-100),
                    &json!("accept")
                ),
                "{c}"
            );
        }
    }
}

#[test]
fn rules_replace_each_table_in_the_same_batch_and_removal_tolerates_a_missing_table() {
    let doc = to_json(&rules(&workload("", "")));
    let commands = doc["nftables"].as_array().cloned().unwrap_or_default();
    let tables: Vec<(String, Value)> = commands
        .iter()
        .filter_map(|c| {
            let (verb, object) = c.as_object()?.iter().next()?;
            Some((verb.clone(), object.get("table")?.clone()))
        })
        .collect();
    let ip = json!({"family": "ip", "name": "ambit"});
    let ip6 = json!({"family": "ip6", "name": "ambit"});
    let verbs = |t: &Value| -> Vec<&str> {
        tables
            .iter()
            .filter(|(_, x)| x == t)
            .map(|(v, _)| v.as_str())
            .collect()
    };
    // add (so that delete finds it), delete, add again: one transaction, no gap.
    assert_eq!(verbs(&ip), ["add", "delete", "add"], "{doc:#}");
    assert_eq!(verbs(&ip6), ["add", "delete", "add"], "{doc:#}");
    // Without skip ports, no skip rules.
    assert_eq!(rules_of(&doc, "ip", "output").len(), 4, "{doc:#}");
    assert_eq!(rules_of(&doc, "ip", "prerouting").len(), 2, "{doc:#}");

    let removal = to_json(&removal());
    assert_eq!(
        removal,
        json!({"nftables": [
            {"add": {"table": ip}}, {"delete": {"table": ip}},
            {"add": {"table": ip6}}, {"delete": {"table": ip6}},
        ]})
    );
}

/// `nft -j list table <family> ambit` in `ns`; `None` when there is no such table.
fn listed(ns: &TestNetns, family: &str) -> Option<Value> {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns.name(), "nft", "-j", "list", "table"])
        .args([family, TABLE])
        .output()
        .unwrap_or_else(|e| panic!("ip netns exec nft: {e}"));
    if !out.status.success() {
        return None;
    }
    Some(serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("nft -j: {e}")))
}

/// What the kernel holds is what was built, rule for rule, in both families.
fn assert_listed_as_built(ns: &TestNetns, built: &Value) {
    for family in ["ip", "ip6"] {
        let listed = listed(ns, family).unwrap_or_else(|| panic!("no table {family} ambit"));
        for chain in ["output", "prerouting"] {
            assert_eq!(
                rules_of(&listed, family, chain),
                rules_of(built, family, chain),
                "{family} {chain}: {listed:#}"
            );
        }
        assert_eq!(chains_of(&listed, family).len(), 2, "{listed:#}");
    }
}

/// Runs as root (here and in CI): the real `nft`, in a netns of the test's own.
#[tokio::test]
async fn rules_applied_in_a_pod_netns_read_back_as_built_reapply_in_place_and_remove_twice() {
    let ns = TestNetns::new("nft");
    let netns = Netns::open(&ns.path()).unwrap_or_else(|e| panic!("{e}"));
    let w = workload("22,9000-9010", "5432,6000-6001");
    let built = to_json(&rules(&w));

    install(&netns, &w).await.unwrap_or_else(|e| panic!("{e}"));
    assert_listed_as_built(&ns, &built);
    // Again (a proxy restarted, a pod's hints changed): replaced, not appended to.
    install(&netns, &w).await.unwrap_or_else(|e| panic!("{e}"));
    assert_listed_as_built(&ns, &built);
    let fewer = workload("", "");
    install(&netns, &fewer)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_listed_as_built(&ns, &to_json(&rules(&fewer)));

    remove(&netns).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(listed(&ns, "ip").is_none() && listed(&ns, "ip6").is_none());
    // A pod removed twice (CNI DEL repeated, a restart after the removal): no error.
    remove(&netns).await.unwrap_or_else(|e| panic!("{e}"));
}

/// Runs as root: a batch nft refuses leaves the installed rules as they were (one
/// transaction: its table delete is not applied either), and the error says where, why
/// and what to do.
#[tokio::test]
async fn a_refused_batch_changes_nothing_and_the_error_names_the_netns_and_nfts_reason() {
    let ns = TestNetns::new("nftbad");
    let netns = Netns::open(&ns.path()).unwrap_or_else(|e| panic!("{e}"));
    let w = workload("", "5432");
    let built = to_json(&rules(&w));
    install(&netns, &w).await.unwrap_or_else(|e| panic!("{e}"));

    // The good batch, then a rule in a chain that does not exist.
    let mut bad = Batch::new();
    bad.add_all(rules(&workload("", "")).objects.iter().cloned());
    bad.add(NfListObject::Rule(rule(
        NfFamily::IP,
        "nowhere",
        vec![Statement::Return(None)],
    )));
    let bad = bad.to_nftables();
    let path = ns.path();
    let err = netns
        .run(move || apply(&bad, "testing a refused batch", &path))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let err = match err {
        Err(e @ NftError::Refused { .. }) => e.to_string(),
        other => panic!("expected nft to refuse the batch: {other:?}"),
    };
    assert!(err.contains(&ns.path().display().to_string()), "{err}");
    assert!(err.contains("No such file or directory"), "{err}");
    assert!(err.contains("--redirect ebpf"), "{err}");
    assert_listed_as_built(&ns, &built);
}
