//! Renders policy once per change and hands each node's share to the streams of that node.
//!
//! Policy is per node (a proxy gets only its own pods), so unlike discovery there is no
//! one rendering every stream shares. The [`PolicyPublisher`] keeps one `watch` channel
//! per node that has a stream; on every index change it renders the pods of those nodes
//! once — one pass over the cluster's meshed pods, whatever the number of streams — and
//! sends each node's pods on its channel only when they changed, so a change wakes only
//! the streams of the nodes it touches, each of which diffs its own node's pods against
//! what it sent. A stream for a node not rendered yet asks for it and waits.
//!
//! Routes are not per node: every Service's are rendered once per change, into one
//! channel every stream shares (a Service whose rendering did not change keeps its
//! `Arc`, and the map is only sent when one did), so their cost does not grow with the
//! number of streams either.

use super::metrics::PolicyMetrics;
use super::render::{policy_problems, render_nodes, Defaults, NodePolicies, Problems};
use super::routes::{render_routes, RouteProblems, ServiceRoutesMap};
use crate::discovery::Hub;
use crate::index::SharedIndex;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::{watch, Notify};

/// A node's pods as last rendered; `None` until the node's first rendering.
pub type NodeChannel = watch::Receiver<Option<Arc<NodePolicies>>>;

/// Every Service's routes as last rendered; `None` until the first rendering.
pub type RoutesChannel = watch::Receiver<Option<Arc<ServiceRoutesMap>>>;

/// Node → the sending side of its [`NodeChannel`].
type Channels = HashMap<String, watch::Sender<Option<Arc<NodePolicies>>>>;

/// The per-node channels and the task that renders into them.
#[derive(Clone, Debug)]
pub struct PolicyPublisher {
    nodes: Arc<Mutex<Channels>>,
    /// Woken when a stream subscribes to a node not rendered yet.
    wanted: Arc<Notify>,
    defaults: Defaults,
    metrics: PolicyMetrics,
    /// What was reported as left out last time (to log each problem once).
    reported: Arc<Mutex<Problems>>,
    /// Every Service's routes, for every stream.
    routes: Arc<watch::Sender<Option<Arc<ServiceRoutesMap>>>>,
    /// The route problems reported last time.
    reported_routes: Arc<Mutex<RouteProblems>>,
}

impl PolicyPublisher {
    /// A publisher rendering with `defaults`.
    pub fn new(defaults: Defaults, metrics: PolicyMetrics) -> Self {
        Self {
            nodes: Arc::default(),
            wanted: Arc::default(),
            defaults,
            metrics,
            reported: Arc::default(),
            routes: Arc::new(watch::Sender::new(None)),
            reported_routes: Arc::default(),
        }
    }

    /// The channel of every Service's routes (rendered by [`Self::run`]).
    pub fn subscribe_routes(&self) -> RoutesChannel {
        self.routes.subscribe()
    }

    /// The channel of `node`'s pods (rendered by [`Self::run`] if it was not yet).
    pub fn subscribe(&self, node: &str) -> NodeChannel {
        let mut nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(tx) = nodes.get(node) {
            return tx.subscribe();
        }
        let (tx, rx) = watch::channel(None);
        nodes.insert(node.to_string(), tx);
        self.wanted.notify_one();
        rx
    }

    /// Once `started` has (the backend has loaded everything once), renders the nodes
    /// that have streams after every change, until `shutdown` resolves.
    pub async fn run(self, index: SharedIndex, started: Hub, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        tokio::select! {
            _ = &mut shutdown => return,
            _ = started.started() => {}
        }
        let mut changes = index.subscribe();
        changes.mark_unchanged();
        let mut all = true;
        loop {
            // Rendering runs off the async workers (a whole cluster's change takes seconds).
            let (publisher, at) = (self.clone(), index.clone());
            crate::blocking::run(move || publisher.publish(&at, !all)).await;
            all = tokio::select! {
                _ = &mut shutdown => return,
                changed = changes.changed() => if changed.is_err() { return } else { true },
                _ = self.wanted.notified() => false,
            };
        }
    }

    /// Renders the nodes with streams (only those never rendered with `only_new`) and sends
    /// each its pods if they changed. Nodes without streams are forgotten. A full rendering
    /// (not `only_new`) also reports what it left out, even with no stream at all: the
    /// AuthorizationPolicies are resolved cluster-wide, conflicts on the nodes rendered.
    pub fn publish(&self, index: &SharedIndex, only_new: bool) {
        if !only_new || self.routes.borrow().is_none() {
            self.publish_routes(index);
        }
        let targets: HashSet<String> = {
            let mut nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
            nodes.retain(|_, tx| tx.receiver_count() > 0);
            nodes
                .iter()
                .filter(|(_, tx)| !only_new || tx.borrow().is_none())
                .map(|(n, _)| n.clone())
                .collect()
        };
        if targets.is_empty() {
            // No stream: no pod to render, only the policies to check.
            if !only_new {
                self.report(&policy_problems(&index.read(), &self.defaults));
            }
            return;
        }
        // The index's lock is not held together with ours (a subscriber holds ours only).
        let mut rendered = render_nodes(&index.read(), &self.defaults, |n| targets.contains(n));
        self.metrics.renders.inc();
        if !only_new {
            self.report(&rendered.problems);
        }
        let nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
        for node in &targets {
            let Some(tx) = nodes.get(node) else { continue };
            let pods = rendered.nodes.remove(node).unwrap_or_default();
            tx.send_if_modified(|current| {
                if current.as_deref() == Some(&pods) {
                    return false;
                }
                *current = Some(Arc::new(pods));
                true
            });
        }
    }

    /// Renders every Service's routes and sends them if any changed.
    fn publish_routes(&self, index: &SharedIndex) {
        let previous = self.routes.borrow().clone().unwrap_or_default();
        let rendered = render_routes(&index.read(), &previous);
        self.metrics.route_renders.inc();
        self.report_routes(&rendered.problems);
        self.metrics
            .routed_services
            .set(i64::try_from(rendered.services.len()).unwrap_or(i64::MAX));
        let unchanged = self.routes.borrow().is_some()
            && previous.len() == rendered.services.len()
            && previous
                .iter()
                .zip(&rendered.services)
                .all(|((ka, a), (kb, b))| ka == kb && Arc::ptr_eq(a, b));
        if !unchanged {
            self.routes.send_replace(Some(Arc::new(rendered.services)));
        }
    }

    /// Logs the routes newly left out (and those no longer), and sets the gauge.
    fn report_routes(&self, now: &RouteProblems) {
        let mut reported = self
            .reported_routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (route, why) in now {
            if reported.get(route) != Some(why) {
                tracing::warn!(%route, reason = %why, "route not rendered");
            }
        }
        for route in reported.keys().filter(|k| !now.contains_key(*k)) {
            tracing::info!(%route, "route no longer left out");
        }
        self.metrics
            .routes_unsupported
            .set(i64::try_from(now.len()).unwrap_or(i64::MAX));
        *reported = now.clone();
    }

    /// Logs what is newly left out (and what is no longer), and sets the gauges.
    fn report(&self, now: &Problems) {
        let mut reported = self.reported.lock().unwrap_or_else(PoisonError::into_inner);
        for (key, why) in &now.unresolved {
            if reported.unresolved.get(key) != Some(why) {
                tracing::warn!(policy = %key, reason = %why, "AuthorizationPolicy skipped: it allows nothing until this is fixed");
            }
        }
        for key in reported
            .unresolved
            .keys()
            .filter(|k| !now.unresolved.contains_key(*k))
        {
            tracing::info!(policy = %key, "AuthorizationPolicy no longer skipped");
        }
        for (key, why) in &now.conflicts {
            if reported.conflicts.get(key) != Some(why) {
                tracing::warn!(server = %key, reason = %why, "Server ignored on a pod port");
            }
        }
        self.metrics
            .unresolved
            .set(i64::try_from(now.unresolved.len()).unwrap_or(i64::MAX));
        self.metrics
            .conflicts
            .set(i64::try_from(now.conflicts.len()).unwrap_or(i64::MAX));
        *reported = now.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::ClusterIndex;

    const CLUSTER: &str = "
apiVersion: v1
kind: Namespace
metadata: {name: shop, annotations: {ambit.dev/mesh: enabled}}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: shop}
spec: {nodeName: node-a, containers: []}
---
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: shop}
spec: {nodeName: node-b, containers: []}
";

    fn shared(yaml: &str) -> SharedIndex {
        let mut skipped = 0;
        let objects = crate::local::parse_file(std::path::Path::new("t.yaml"), yaml, &mut skipped)
            .unwrap_or_else(|e| panic!("{e}"))
            .into_iter()
            .map(|o| o.object);
        SharedIndex::new(
            ClusterIndex::from_objects("cluster.local", objects)
                .unwrap_or_else(|(_, e)| panic!("{e}")),
        )
    }

    #[test]
    fn one_rendering_per_change_whatever_the_streams_and_only_changed_nodes_wake() {
        let index = shared(CLUSTER);
        let publisher = PolicyPublisher::new(
            Defaults {
                policy: "all-unauthenticated".into(),
                cluster_networks: vec![],
            },
            PolicyMetrics::default(),
        );
        let mut a: Vec<NodeChannel> = (0..50).map(|_| publisher.subscribe("node-a")).collect();
        let mut b = publisher.subscribe("node-b");
        let mut c = publisher.subscribe("node-c");
        assert!(
            a[0].borrow().is_none(),
            "nothing before the first rendering"
        );
        publisher.publish(&index, true);
        assert_eq!(
            publisher.metrics.renders.get(),
            1,
            "one rendering for 52 streams"
        );
        for rx in &mut a {
            assert_eq!(rx.borrow_and_update().as_ref().map(|p| p.len()), Some(1));
        }
        assert_eq!(b.borrow_and_update().as_ref().map(|p| p.len()), Some(1));
        assert_eq!(
            c.borrow_and_update().as_ref().map(|p| p.len()),
            Some(0),
            "a node with no pods"
        );

        // A change on node-b: one rendering; node-a's streams are not woken.
        let changed = CLUSTER.replace("name: b, namespace: shop}", "name: b, namespace: shop, annotations: {config.ambit.dev/default-inbound-policy: deny}}");
        index.replace(shared(&changed).read().clone());
        publisher.publish(&index, false);
        assert_eq!(publisher.metrics.renders.get(), 2);
        assert!(a.iter_mut().all(|rx| !rx.has_changed().unwrap_or(true)));
        assert!(b.has_changed().unwrap_or(false));
        let b_now = b.borrow_and_update().clone().unwrap_or_default();
        assert_eq!(
            b_now["shop/b"].default.as_ref().map(|d| d.name.as_str()),
            Some("deny")
        );
        assert!(!c.has_changed().unwrap_or(true));

        // Nodes whose streams are gone are no longer rendered.
        drop(a);
        drop(c);
        publisher.publish(&index, false);
        let nodes = publisher
            .nodes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        assert_eq!(nodes.keys().collect::<Vec<_>>(), ["node-b"]);
    }

    #[test]
    fn routes_render_once_per_change_for_every_stream_and_wake_them_only_when_they_change() {
        let with_route = format!(
            "{CLUSTER}---\napiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: shop, annotations: {{retry.ambit.dev/limit: '2'}}}}\nspec: {{ports: [{{port: 80}}]}}\n"
        );
        let index = shared(&with_route);
        let publisher = PolicyPublisher::new(
            Defaults {
                policy: "all-unauthenticated".into(),
                cluster_networks: vec![],
            },
            PolicyMetrics::default(),
        );
        let mut streams: Vec<RoutesChannel> =
            (0..20).map(|_| publisher.subscribe_routes()).collect();
        publisher.publish(&index, false);
        assert_eq!(
            publisher.metrics.route_renders.get(),
            1,
            "one rendering for 20 streams"
        );
        let first = streams[0].borrow_and_update().clone().unwrap_or_default();
        assert_eq!(first.keys().collect::<Vec<_>>(), ["shop/web"]);
        for rx in &mut streams[1..] {
            rx.mark_unchanged();
        }
        // A change that touches no route: rendered, not sent.
        let pods_only = with_route.replace(
            "name: a, namespace: shop}",
            "name: a, namespace: shop, labels: {x: y}}",
        );
        index.replace(shared(&pods_only).read().clone());
        publisher.publish(&index, false);
        assert_eq!(publisher.metrics.route_renders.get(), 2);
        assert!(streams.iter().all(|rx| !rx.has_changed().unwrap_or(true)));
        // A route change wakes every stream once.
        index.replace(
            shared(&pods_only.replace("limit: '2'", "limit: '3'"))
                .read()
                .clone(),
        );
        publisher.publish(&index, false);
        assert!(streams.iter().all(|rx| rx.has_changed().unwrap_or(false)));
        let now = streams[0].borrow_and_update().clone().unwrap_or_default();
        assert_eq!(
            now["shop/web"].ports[0].rules[0]
                .retry
                .as_ref()
                .map(|r| r.limit),
            Some(3)
        );
    }

    #[test]
    fn a_change_to_a_servers_route_or_its_policy_wakes_only_the_node_of_the_pods_it_selects() {
        use ambit_api::proto::policy::path_match::Kind;
        let yaml = format!(
            "{}---
apiVersion: policy.ambit.dev/v1alpha1
kind: Server
metadata: {{name: a-http, namespace: shop}}
spec: {{podSelector: {{matchLabels: {{app: a}}}}, port: 8080}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: api, namespace: shop}}
spec:
  parentRefs: [{{group: policy.ambit.dev, kind: Server, name: a-http}}]
  rules: [{{matches: [{{path: {{value: /api}}}}]}}]
---
apiVersion: policy.ambit.dev/v1alpha1
kind: AuthorizationPolicy
metadata: {{name: api-from-cli, namespace: shop}}
spec:
  targetRef: {{group: gateway.networking.k8s.io, kind: HTTPRoute, name: api}}
  requiredAuthenticationRefs: [{{kind: ServiceAccount, name: cli}}]
",
            CLUSTER.replace(
                "name: a, namespace: shop}",
                "name: a, namespace: shop, labels: {app: a}}"
            )
        );
        let index = shared(&yaml);
        let publisher = PolicyPublisher::new(
            Defaults {
                policy: "deny".into(),
                cluster_networks: vec![],
            },
            PolicyMetrics::default(),
        );
        let mut a = publisher.subscribe("node-a");
        let mut b = publisher.subscribe("node-b");
        publisher.publish(&index, false);
        a.mark_unchanged();
        b.mark_unchanged();
        let route = |rx: &mut NodeChannel| {
            let pods = rx.borrow_and_update().clone().unwrap_or_default();
            let r = pods["shop/a"].ports[0].routes[0].clone();
            let path = r.r#match.and_then(|m| m.path).and_then(|p| p.kind);
            (path, r.authorizations[0].name.clone())
        };
        index.replace(
            shared(&yaml.replace("value: /api", "value: /v2"))
                .read()
                .clone(),
        );
        publisher.publish(&index, false);
        assert!(a.has_changed().unwrap_or(false), "the route changed");
        assert!(
            !b.has_changed().unwrap_or(true),
            "node-b has no pod it selects"
        );
        assert_eq!(
            route(&mut a),
            (Some(Kind::Prefix("/v2".into())), "api-from-cli".into())
        );

        let renamed = yaml
            .replace("value: /api", "value: /v2")
            .replace("name: api-from-cli", "name: api-from-batch");
        index.replace(shared(&renamed).read().clone());
        publisher.publish(&index, false);
        assert!(
            a.has_changed().unwrap_or(false),
            "the route's policy changed"
        );
        assert!(!b.has_changed().unwrap_or(true));
        assert_eq!(route(&mut a).1, "api-from-batch");
    }
}
