//! The inbound policy of every meshed pod on the node, as the last snapshot and deltas
//! left it. A pod the control plane has sent nothing for — before the first snapshot, or
//! while the control plane is away and the pod is new — is served under the default policy
//! the proxy was started with (`--default-inbound-policy`): a meshed pod is never served
//! with no policy.

use super::model::{PodPolicy, PortPolicy};
use ambit_api::proto::policy as pb;
use std::collections::HashMap;
use std::sync::Arc;

/// Every pod's policy, and the start-up default.
#[derive(Clone, Debug)]
pub struct PolicyState {
    pods: HashMap<String, Arc<PodPolicy>>,
    fallback: Arc<PodPolicy>,
    /// Whether a snapshot has arrived.
    synced: bool,
    /// Bumped on every change: connections re-check their verdict when it moves.
    pub generation: u64,
}

impl PolicyState {
    /// An empty state whose pods get `fallback` until the control plane says otherwise.
    pub fn new(fallback: PortPolicy) -> Self {
        Self {
            pods: HashMap::new(),
            fallback: Arc::new(PodPolicy {
                ports: HashMap::new(),
                default: Arc::new(fallback),
            }),
            synced: false,
            generation: 0,
        }
    }

    /// The policy of port `port` of pod `pod` ("<namespace>/<name>").
    pub fn port(&self, pod: &str, port: u16) -> Arc<PortPolicy> {
        self.pods
            .get(pod)
            .unwrap_or(&self.fallback)
            .port(port)
            .clone()
    }

    /// Whether a snapshot has arrived.
    pub fn synced(&self) -> bool {
        self.synced
    }

    /// How many pods have a policy from the control plane.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// Whether no pod has one.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// Applies a whole snapshot or delta; returns why policies were refused (each such
    /// pod keeps the policy it had, or the fallback).
    pub fn apply(&mut self, update: pb::Update) -> Vec<String> {
        let mut refused = Vec::new();
        let mut next = if update.snapshot {
            HashMap::new()
        } else {
            std::mem::take(&mut self.pods)
        };
        for name in &update.removed_pods {
            next.remove(name);
        }
        for p in &update.pods {
            match PodPolicy::from_pb(p) {
                Ok(policy) => {
                    next.insert(p.pod.clone(), Arc::new(policy));
                }
                Err(e) => {
                    // Keep the last good policy of a pod whose new one does not parse
                    // (a snapshot starts empty: carry it over from before).
                    if let Some(old) = self.pods.get(&p.pod) {
                        next.insert(p.pod.clone(), old.clone());
                    }
                    refused.push(e);
                }
            }
        }
        self.pods = next;
        self.synced |= update.snapshot;
        self.generation += 1;
        refused
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::model::Client;

    fn pod(name: &str, port: u32, default: &str) -> pb::PodPolicy {
        let authz = pb::Authorization {
            kind: "authorizationpolicy".into(),
            name: "web-clients".into(),
            mesh_tls: Some(pb::MeshTls {
                any: false,
                identities: vec![pb::IdentityPattern {
                    pattern: Some(pb::identity_pattern::Pattern::Exact(
                        "spiffe://cluster.local/ns/shop/sa/web".into(),
                    )),
                }],
            }),
            networks: vec![],
        };
        pb::PodPolicy {
            pod: name.into(),
            ports: vec![pb::PortPolicy {
                port,
                kind: "server".into(),
                name: "api-http".into(),
                protocol: "HTTP/1".into(),
                authorizations: vec![authz],
                audit: false,
                probe_paths: vec!["/healthz".into()],
            }],
            default: Some(pb::PortPolicy {
                kind: "default".into(),
                name: default.into(),
                authorizations: if default == "deny" {
                    vec![]
                } else {
                    vec![pb::Authorization {
                        kind: "default".into(),
                        name: default.into(),
                        ..Default::default()
                    }]
                },
                ..Default::default()
            }),
        }
    }

    fn client(id: Option<&str>) -> Client<'_> {
        Client {
            identity: id,
            addr: "10.0.0.9".parse().unwrap(),
        }
    }

    const WEB: &str = "spiffe://cluster.local/ns/shop/sa/web";

    #[test]
    fn fallback_until_a_snapshot_then_the_pods_own_then_kept_on_a_bad_update() {
        let deny = PortPolicy::default_policy("deny", &[]).unwrap();
        let mut s = PolicyState::new(deny);
        assert!(!s.synced());
        assert!(!s
            .port("shop/api", 8080)
            .check(&client(None), None)
            .allowed());

        let refused = s.apply(pb::Update {
            snapshot: true,
            pods: vec![pod("shop/api", 8080, "all-unauthenticated")],
            ..Default::default()
        });
        assert!(refused.is_empty() && s.synced() && s.len() == 1);
        // The Server's port: only web, or a probe.
        let p = s.port("shop/api", 8080);
        assert!(p.check(&client(Some(WEB)), None).allowed());
        let other = "spiffe://cluster.local/ns/shop/sa/other";
        assert_eq!(
            p.check(&client(Some(other)), None),
            super::super::Verdict::Deny
        );
        assert!(p.check(&client(None), Some("/healthz?x=1")).allowed());
        assert!(!p.check(&client(Some(other)), Some("/healthz")).allowed());
        // Any other port: the pod's default.
        assert!(s
            .port("shop/api", 9000)
            .check(&client(None), None)
            .allowed());
        // A pod the control plane did not list: the fallback.
        assert!(!s.port("shop/new", 80).check(&client(None), None).allowed());

        // A policy that does not parse is refused; the pod keeps its last good one.
        let mut bad = pod("shop/api", 8080, "deny");
        bad.ports[0].authorizations[0].networks = vec![pb::Network {
            cidr: "10.0.0.0/33".into(),
            except: vec![],
        }];
        let refused = s.apply(pb::Update {
            snapshot: true,
            pods: vec![bad],
            ..Default::default()
        });
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert!(refused[0].contains("shop/api") && refused[0].contains("10.0.0.0/33"));
        assert!(s
            .port("shop/api", 9000)
            .check(&client(None), None)
            .allowed());

        // A delta removes a pod: back to the fallback.
        s.apply(pb::Update {
            removed_pods: vec!["shop/api".into()],
            ..Default::default()
        });
        assert!(!s
            .port("shop/api", 9000)
            .check(&client(None), None)
            .allowed());
    }
}
