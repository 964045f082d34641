//! Inbound policy names and the default policies, as the control plane renders them and
//! as a node proxy applies them on its own (before the control plane's first snapshot):
//! one definition for both.

use crate::proto::policy as pb;

/// Namespace or pod annotation that overrides the cluster's default inbound policy.
pub const DEFAULT_INBOUND_POLICY_ANNOTATION: &str = "config.ambit.dev/default-inbound-policy";

/// The default inbound policies, as Linkerd names them.
pub const DEFAULT_POLICIES: [&str; 6] = [
    "all-unauthenticated",
    "all-authenticated",
    "cluster-unauthenticated",
    "cluster-authenticated",
    "deny",
    "audit",
];

/// Linkerd's default cluster networks.
pub const DEFAULT_CLUSTER_NETWORKS: &str =
    "10.0.0.0/8,100.64.0.0/10,172.16.0.0/12,192.168.0.0/16,fd00::/8";

/// Why a name is not a default policy, with the names that are.
pub fn unknown_policy(name: &str) -> String {
    format!(
        "{name:?} is not a default inbound policy: {}",
        DEFAULT_POLICIES.join(", ")
    )
}

/// The port policy of default policy `name` (for `port`; 0 for every port no Server
/// selects): `all-unauthenticated` lets anyone in, `all-authenticated` any mTLS client,
/// the `cluster-*` ones only from `cluster_networks` (CIDRs, not checked here), `deny`
/// nobody, `audit` everybody while counting them as denials that did not happen.
pub fn default_port_policy(
    name: &str,
    port: u32,
    cluster_networks: &[String],
) -> Result<pb::PortPolicy, String> {
    let authz = |tls: bool, cluster: bool| pb::Authorization {
        kind: "default".into(),
        name: name.into(),
        mesh_tls: tls.then(|| pb::MeshTls {
            any: true,
            identities: vec![],
        }),
        networks: if cluster {
            cluster_networks
                .iter()
                .map(|c| pb::Network {
                    cidr: c.clone(),
                    except: vec![],
                })
                .collect()
        } else {
            vec![]
        },
    };
    let (authorizations, audit) = match name {
        "all-unauthenticated" => (vec![authz(false, false)], false),
        "all-authenticated" => (vec![authz(true, false)], false),
        "cluster-unauthenticated" => (vec![authz(false, true)], false),
        "cluster-authenticated" => (vec![authz(true, true)], false),
        "deny" => (vec![], false),
        "audit" => (vec![], true),
        other => return Err(unknown_policy(other)),
    };
    Ok(pb::PortPolicy {
        port,
        kind: "default".into(),
        name: name.into(),
        protocol: "unknown".into(),
        authorizations,
        audit,
        probe_paths: vec![],
        routes: vec![],
    })
}

/// Splits a comma-separated list of CIDRs (`--cluster-networks`).
pub fn split_networks(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_policy_renders_and_others_are_named() {
        let nets = split_networks(" 10.0.0.0/8, fd00::/8 ,");
        assert_eq!(nets, ["10.0.0.0/8", "fd00::/8"]);
        for name in DEFAULT_POLICIES {
            let p = default_port_policy(name, 0, &nets).unwrap();
            assert_eq!((p.kind.as_str(), p.name.as_str()), ("default", name));
            assert_eq!(p.audit, name == "audit");
        }
        let p = default_port_policy("cluster-authenticated", 0, &nets).unwrap();
        assert!(p.authorizations[0].mesh_tls.as_ref().unwrap().any);
        assert_eq!(p.authorizations[0].networks.len(), 2);
        assert!(default_port_policy("deny", 0, &nets)
            .unwrap()
            .authorizations
            .is_empty());
        let e = default_port_policy("allow", 0, &nets).unwrap_err();
        assert!(
            e.contains("all-unauthenticated") && e.contains("\"allow\""),
            "{e}"
        );
    }
}
