//! The inbound policy of every meshed pod on the node, as the last snapshot and deltas
//! left it. A pod the control plane has sent nothing for — before the first snapshot, or
//! while the control plane is away and the pod is new — is served under the default policy
//! the proxy was started with (`--default-inbound-policy`): a meshed pod is never served
//! with no policy. And the outbound routes of every Service that has some.

use super::model::{PodPolicy, PortPolicy};
use super::routes::ServiceRoutes;
use ambit_api::proto::policy as pb;
use std::collections::HashMap;
use std::sync::Arc;

/// Every pod's policy, and the start-up default.
#[derive(Clone, Debug)]
pub struct PolicyState {
    pods: HashMap<String, Arc<PodPolicy>>,
    fallback: Arc<PodPolicy>,
    /// A Service's namespace → its name → its routes (looked up per request without
    /// building a key).
    services: HashMap<String, HashMap<String, Arc<ServiceRoutes>>>,
    /// Whether a snapshot has arrived.
    synced: bool,
    /// What each policy in use was made from, to write it back as a snapshot
    /// ([`PolicyState::to_snapshot`]; the proxy keeps it on disk for a restart while the
    /// control plane is away).
    sources: Sources,
    /// Bumped on every change: connections re-check their verdict when it moves.
    pub generation: u64,
}

/// The messages the pods' policies and the Services' routes in use were made from (the
/// last good ones: a refused update leaves its old source in place).
#[derive(Clone, Debug, Default)]
struct Sources {
    pods: HashMap<String, Arc<pb::PodPolicy>>,
    services: HashMap<String, Arc<pb::ServiceRoutes>>,
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
            services: HashMap::new(),
            synced: false,
            sources: Sources::default(),
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

    /// The routes of Service `namespace`/`name`, if it has any.
    pub fn routes(&self, namespace: &str, name: &str) -> Option<Arc<ServiceRoutes>> {
        self.services.get(namespace)?.get(name).cloned()
    }

    /// Every pod's policy from the control plane, by "<namespace>/<name>".
    pub fn pods(&self) -> impl Iterator<Item = (&String, &Arc<PodPolicy>)> {
        self.pods.iter()
    }

    /// The policy of a pod the control plane has sent none for.
    pub fn fallback(&self) -> &Arc<PodPolicy> {
        &self.fallback
    }

    /// The Services with outbound routes, as "<namespace>/<name>".
    pub fn routed_services(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .services
            .iter()
            .flat_map(|(ns, names)| names.keys().map(move |n| format!("{ns}/{n}")))
            .collect();
        out.sort();
        out
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
        let (mut next, mut sources) = if update.snapshot {
            (HashMap::new(), HashMap::new())
        } else {
            (
                std::mem::take(&mut self.pods),
                std::mem::take(&mut self.sources.pods),
            )
        };
        for name in &update.removed_pods {
            next.remove(name);
            sources.remove(name);
        }
        for p in &update.pods {
            match PodPolicy::from_pb(p) {
                Ok(policy) => {
                    next.insert(p.pod.clone(), Arc::new(policy));
                    sources.insert(p.pod.clone(), Arc::new(p.clone()));
                }
                Err(e) => {
                    // Keep the last good policy of a pod whose new one does not parse
                    // (a snapshot starts empty: carry it over from before).
                    if let Some(old) = self.pods.get(&p.pod) {
                        next.insert(p.pod.clone(), old.clone());
                    }
                    if let Some(old) = self.sources.pods.get(&p.pod) {
                        sources.insert(p.pod.clone(), old.clone());
                    }
                    refused.push(e);
                }
            }
        }
        self.pods = next;
        self.sources.pods = sources;
        self.apply_routes(&update, &mut refused);
        self.synced |= update.snapshot;
        self.generation += 1;
        refused
    }

    /// The Services' routes of `update`: a Service whose routes do not parse keeps its
    /// last good ones (never half of them).
    fn apply_routes(&mut self, update: &pb::Update, refused: &mut Vec<String>) {
        let mut next = if update.snapshot {
            HashMap::new()
        } else {
            std::mem::take(&mut self.services)
        };
        let mut sources = if update.snapshot {
            HashMap::new()
        } else {
            std::mem::take(&mut self.sources.services)
        };
        for key in &update.removed_services {
            sources.remove(key);
            if let Some((ns, name)) = key.split_once('/') {
                if let Some(by_name) = next.get_mut(ns) {
                    by_name.remove(name);
                    if by_name.is_empty() {
                        next.remove(ns);
                    }
                }
            }
        }
        for s in &update.services {
            let Some((ns, name)) = s.service.split_once('/') else {
                refused.push(format!(
                    "Service routes for {:?}: not <namespace>/<name>",
                    s.service
                ));
                continue;
            };
            let parsed = match ServiceRoutes::from_pb(s) {
                Ok(routes) => {
                    sources.insert(s.service.clone(), Arc::new(s.clone()));
                    Arc::new(routes)
                }
                Err(e) => {
                    refused.push(e);
                    if let Some(old) = self.sources.services.get(&s.service) {
                        sources.insert(s.service.clone(), old.clone());
                    }
                    match self.services.get(ns).and_then(|m| m.get(name)) {
                        Some(old) => old.clone(),
                        None => continue,
                    }
                }
            };
            next.entry(ns.to_string())
                .or_default()
                .insert(name.to_string(), parsed);
        }
        self.services = next;
        self.sources.services = sources;
    }

    /// The policies and routes in use as one snapshot update, each as the control plane
    /// sent it (applied to a fresh state, it gives this one again).
    pub fn to_snapshot(&self) -> pb::Update {
        let mut pods: Vec<_> = self.sources.pods.values().map(|p| (**p).clone()).collect();
        pods.sort_by(|a, b| a.pod.cmp(&b.pod));
        let mut services: Vec<_> = self
            .sources
            .services
            .values()
            .map(|s| (**s).clone())
            .collect();
        services.sort_by(|a, b| a.service.cmp(&b.service));
        pb::Update {
            snapshot: true,
            pods,
            services,
            ..Default::default()
        }
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
                routes: vec![],
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

    #[test]
    fn the_policies_in_use_written_back_as_a_snapshot_give_the_same_state() {
        let deny = || PortPolicy::default_policy("deny", &[]).unwrap();
        let mut s = PolicyState::new(deny());
        s.apply(pb::Update {
            snapshot: true,
            pods: vec![
                pod("shop/api", 8080, "all-unauthenticated"),
                pod("shop/db", 5432, "deny"),
            ],
            services: vec![service("shop/web", "web-v1", "/.*")],
            ..Default::default()
        });
        // A refused update leaves the last good policy, and its source, in use.
        let mut bad = pod("shop/api", 8080, "deny");
        bad.ports[0].authorizations[0].networks = vec![pb::Network {
            cidr: "10.0.0.0/33".into(),
            except: vec![],
        }];
        assert_eq!(
            s.apply(pb::Update {
                pods: vec![bad],
                services: vec![service("shop/web", "web-v2", "(")],
                removed_pods: vec!["shop/db".into()],
                ..Default::default()
            })
            .len(),
            2
        );
        let written = s.to_snapshot();
        assert_eq!(
            written.pods,
            vec![pod("shop/api", 8080, "all-unauthenticated")]
        );
        assert_eq!(written.services, vec![service("shop/web", "web-v1", "/.*")]);

        let mut back = PolicyState::new(deny());
        assert!(back.apply(written.clone()).is_empty());
        assert!(back.synced());
        assert_eq!(back.to_snapshot(), written);
        for port in [8080, 9000] {
            assert_eq!(back.port("shop/api", port), s.port("shop/api", port));
        }
        assert_eq!(route_name(&back, "shop/web").as_deref(), Some("web-v1"));
    }

    fn service(name: &str, route: &str, regex: &str) -> pb::ServiceRoutes {
        pb::ServiceRoutes {
            service: name.into(),
            ports: vec![pb::PortRoutes {
                port: 80,
                rules: vec![pb::Rule {
                    route_kind: "HTTPRoute".into(),
                    route_namespace: "shop".into(),
                    route_name: route.into(),
                    r#match: Some(pb::RequestMatch {
                        path: Some(pb::PathMatch {
                            kind: Some(pb::path_match::Kind::Regex(regex.into())),
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
            }],
            failure_accrual: None,
            consumers: vec![],
        }
    }

    fn route_name(s: &PolicyState, svc: &str) -> Option<String> {
        let (ns, name) = svc.split_once('/').unwrap();
        let routes = s.routes(ns, name)?;
        Some(routes.port("shop", 80)?[0].route_name.clone())
    }

    #[test]
    fn services_routes_follow_snapshots_and_deltas_and_keep_the_last_good_ones() {
        let mut s = PolicyState::new(PortPolicy::default_policy("deny", &[]).unwrap());
        let refused = s.apply(pb::Update {
            snapshot: true,
            services: vec![
                service("shop/web", "web-v1", "/.*"),
                service("shop/api", "api", "/.*"),
            ],
            ..Default::default()
        });
        assert!(refused.is_empty(), "{refused:?}");
        assert_eq!(route_name(&s, "shop/web").as_deref(), Some("web-v1"));
        // A delta that does not parse: refused, the Service keeps what it had.
        let refused = s.apply(pb::Update {
            services: vec![service("shop/web", "web-v2", "(")],
            ..Default::default()
        });
        assert_eq!(refused.len(), 1);
        assert!(refused[0].contains("shop/web"), "{refused:?}");
        assert_eq!(route_name(&s, "shop/web").as_deref(), Some("web-v1"));
        // A good one replaces it; a removal drops a Service's routes.
        s.apply(pb::Update {
            services: vec![service("shop/web", "web-v2", "/.*")],
            removed_services: vec!["shop/api".into()],
            ..Default::default()
        });
        assert_eq!(route_name(&s, "shop/web").as_deref(), Some("web-v2"));
        assert_eq!(route_name(&s, "shop/api"), None);
        // A snapshot replaces them all.
        s.apply(pb::Update {
            snapshot: true,
            services: vec![service("shop/api", "api", "/.*")],
            ..Default::default()
        });
        assert_eq!(route_name(&s, "shop/web"), None);
        assert_eq!(route_name(&s, "shop/api").as_deref(), Some("api"));
    }
}
