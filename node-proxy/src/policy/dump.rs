//! The inbound policy as `/config_dump` shows it (`ambit diagnostics policy`): per pod,
//! each port a Server selects and the default, with who may reach it.

use super::model::{Authorization, MeshTls, PodPolicy, PortPolicy};
use super::IdentityPattern;
use super::PolicyState;
use serde_json::{json, Value};

/// Every pod's policy, the fallback, and the Services with outbound routes.
pub fn dump(state: &PolicyState) -> Value {
    let mut pods: Vec<(&String, Value)> = state.pods().map(|(k, p)| (k, pod(p))).collect();
    pods.sort_by(|a, b| a.0.cmp(b.0));
    json!({
        "synced": state.synced(),
        "pods": pods.into_iter().map(|(k, v)| (k.clone(), v)).collect::<serde_json::Map<_, _>>(),
        // A meshed pod the control plane has sent nothing for is served under it.
        "fallback": pod(state.fallback()),
        "routed_services": state.routed_services(),
    })
}

fn pod(p: &PodPolicy) -> Value {
    let mut ports: Vec<(&u16, &std::sync::Arc<PortPolicy>)> = p.ports.iter().collect();
    ports.sort_by_key(|(port, _)| **port);
    json!({
        "ports": ports
            .into_iter()
            .map(|(port, pp)| (port.to_string(), port_policy(pp)))
            .collect::<serde_json::Map<_, _>>(),
        "default": port_policy(&p.default),
    })
}

fn port_policy(p: &PortPolicy) -> Value {
    json!({
        "server": {"kind": p.kind, "name": p.name},
        "protocol": p.protocol,
        "audit": p.audit,
        "authorizations": p.authorizations.iter().map(authorization).collect::<Vec<_>>(),
        "probe_paths": p.probe_paths,
        "routes": p.routes.iter().map(|r| json!({
            "kind": r.kind,
            "name": r.name,
            "authorizations": r.authorizations.iter().map(authorization).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

fn authorization(a: &Authorization) -> Value {
    let identities = match &a.mesh_tls {
        None => json!(null),
        Some(MeshTls::Any) => json!(["*"]),
        Some(MeshTls::Identities(ids)) => json!(ids
            .iter()
            .map(|i| match i {
                IdentityPattern::Exact(e) => e.clone(),
                IdentityPattern::Prefix(p) => format!("{p}*"),
            })
            .collect::<Vec<_>>()),
    };
    json!({
        "kind": a.kind,
        "name": a.name,
        // null: any client, meshed or not; ["*"]: any mTLS client.
        "identities": identities,
        "networks": a.networks.iter().map(|n| {
            let mut s = n.cidr.to_string();
            for e in &n.except {
                s.push_str(&format!(" except {e}"));
            }
            s
        }).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Cidr;
    use crate::policy::Network;
    use std::collections::HashMap;
    use std::sync::Arc;

    #[test]
    fn a_servers_port_shows_who_may_reach_it_and_the_rest_the_default() {
        let net = Network {
            cidr: Cidr::parse("10.0.0.0/8").unwrap(),
            except: vec![Cidr::parse("10.1.0.0/16").unwrap()],
        };
        let server = PortPolicy {
            kind: "server".into(),
            name: "api".into(),
            protocol: "HTTP/1".into(),
            authorizations: vec![Authorization {
                kind: "authorizationpolicy".into(),
                name: "api-from-web".into(),
                mesh_tls: Some(MeshTls::Identities(vec![
                    IdentityPattern::Exact("spiffe://cluster.local/ns/demo/sa/web".into()),
                    IdentityPattern::Prefix("spiffe://cluster.local/ns/ops/".into()),
                ])),
                networks: vec![net],
            }],
            audit: false,
            probe_paths: vec!["/ready".into()],
            routes: Default::default(),
        };
        let fallback = PortPolicy {
            kind: "default".into(),
            name: "all-unauthenticated".into(),
            protocol: "unknown".into(),
            authorizations: vec![Authorization {
                kind: "default".into(),
                name: "all-unauthenticated".into(),
                mesh_tls: None,
                networks: vec![],
            }],
            audit: false,
            probe_paths: vec![],
            routes: Default::default(),
        };
        let p = PodPolicy {
            ports: HashMap::from([(8080, Arc::new(server))]),
            default: Arc::new(fallback),
        };
        let v = pod(&p);
        let port = &v["ports"]["8080"];
        assert_eq!(port["server"], json!({"kind": "server", "name": "api"}));
        assert_eq!(
            port["authorizations"][0]["identities"],
            json!([
                "spiffe://cluster.local/ns/demo/sa/web",
                "spiffe://cluster.local/ns/ops/*"
            ])
        );
        assert_eq!(
            port["authorizations"][0]["networks"],
            json!(["10.0.0.0/8 except 10.1.0.0/16"])
        );
        assert_eq!(port["probe_paths"], json!(["/ready"]));
        assert_eq!(v["default"]["authorizations"][0]["identities"], json!(null));
    }
}
