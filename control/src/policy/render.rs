//! What each meshed pod on a node may be reached by, rendered into the one shape the node
//! proxy matches (`ambit.policy.v1`).
//!
//! Today: the default inbound policy — the pod's own `config.ambit.dev/default-inbound-policy`
//! annotation, else its namespace's, else the cluster's (`--default-inbound-policy`) — for
//! every port, and for each port the kubelet probes, the same policy plus the probe paths
//! (a GET of one stays authorized, so that a `deny` default does not make the pod unready).
//! Servers and AuthorizationPolicies (issue 12) add PortPolicies per selected port.

use crate::index::ClusterIndex;
use ambit_api::policy::{default_port_policy, DEFAULT_INBOUND_POLICY_ANNOTATION};
use ambit_api::proto::policy as pb;
use std::collections::BTreeMap;

/// The cluster-wide settings rendering needs.
#[derive(Clone, Debug)]
pub struct Defaults {
    /// The cluster's default inbound policy (validated).
    pub policy: String,
    /// The cluster's networks, for the cluster-* policies.
    pub cluster_networks: Vec<String>,
}

/// Every meshed pod on `node`: `<namespace>/<name>` → its policy.
pub fn render(index: &ClusterIndex, node: &str, d: &Defaults) -> BTreeMap<String, pb::PodPolicy> {
    let mut out = BTreeMap::new();
    for w in index.meshed_workloads_on_node(node) {
        let pod = &w.pod;
        // Annotation values were checked when the objects were read.
        let name = pod
            .annotations
            .get(DEFAULT_INBOUND_POLICY_ANNOTATION)
            .or_else(|| {
                index
                    .namespace(&pod.namespace)
                    .and_then(|ns| ns.annotations.get(DEFAULT_INBOUND_POLICY_ANNOTATION))
            })
            .unwrap_or(&d.policy);
        let Ok(default) = default_port_policy(name, 0, &d.cluster_networks) else {
            continue;
        };
        let ports = pod
            .probes
            .iter()
            .map(|(port, paths)| pb::PortPolicy {
                port: u32::from(*port),
                probe_paths: paths.clone(),
                ..default.clone()
            })
            .collect();
        let key = format!("{}/{}", pod.namespace, pod.name);
        out.insert(
            key.clone(),
            pb::PodPolicy {
                pod: key,
                ports,
                default: Some(default),
            },
        );
    }
    out
}

/// The delta from `before` to `after`: changed or new pods, and those gone.
pub fn diff(
    before: &BTreeMap<String, pb::PodPolicy>,
    after: &BTreeMap<String, pb::PodPolicy>,
) -> pb::Update {
    pb::Update {
        snapshot: false,
        pods: after
            .iter()
            .filter(|(k, v)| before.get(*k) != Some(v))
            .map(|(_, v)| v.clone())
            .collect(),
        removed_pods: before
            .keys()
            .filter(|k| !after.contains_key(*k))
            .cloned()
            .collect(),
        more: false,
    }
}

/// `policies` as a snapshot, in chunks of at most `per_chunk` pods.
pub fn snapshot_chunks(
    policies: &BTreeMap<String, pb::PodPolicy>,
    per_chunk: usize,
) -> Vec<pb::Update> {
    let pods: Vec<pb::PodPolicy> = policies.values().cloned().collect();
    let mut chunks: Vec<pb::Update> = pods
        .chunks(per_chunk.max(1))
        .map(|c| pb::Update {
            snapshot: false,
            pods: c.to_vec(),
            removed_pods: vec![],
            more: true,
        })
        .collect();
    if chunks.is_empty() {
        chunks.push(pb::Update::default());
    }
    chunks[0].snapshot = true;
    if let Some(last) = chunks.last_mut() {
        last.more = false;
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::KubeObject;

    fn index(yaml: &str) -> ClusterIndex {
        let objects: Vec<KubeObject> = serde_yaml::Deserializer::from_str(yaml)
            .map(|doc| {
                let v = serde_yaml::Value::deserialize(doc).unwrap();
                let kind = v["kind"].as_str().unwrap().to_string();
                let json = serde_json::to_value(v).unwrap();
                match kind.as_str() {
                    "Namespace" => KubeObject::Namespace(serde_json::from_value(json).unwrap()),
                    "Pod" => KubeObject::Pod(serde_json::from_value(json).unwrap()),
                    other => panic!("{other}"),
                }
            })
            .collect();
        ClusterIndex::from_objects("cluster.local", objects).unwrap()
    }

    use serde::Deserialize;

    const CLUSTER: &str = "
apiVersion: v1
kind: Namespace
metadata: {name: shop, annotations: {ambit.dev/mesh: enabled, config.ambit.dev/default-inbound-policy: all-authenticated}}
---
apiVersion: v1
kind: Namespace
metadata: {name: open, annotations: {ambit.dev/mesh: enabled}}
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: shop}
spec:
  nodeName: node-a
  containers:
  - name: web
    ports: [{name: admin, containerPort: 9901}]
    readinessProbe: {httpGet: {port: admin, path: /ready}}
    livenessProbe: {httpGet: {port: 8080}}
status: {podIP: 10.1.0.5}
---
apiVersion: v1
kind: Pod
metadata: {name: locked, namespace: shop, annotations: {config.ambit.dev/default-inbound-policy: deny}}
spec: {nodeName: node-a, containers: []}
status: {podIP: 10.1.0.6}
---
apiVersion: v1
kind: Pod
metadata: {name: anyone, namespace: open}
spec: {nodeName: node-a, containers: []}
status: {podIP: 10.1.0.7}
---
apiVersion: v1
kind: Pod
metadata: {name: elsewhere, namespace: open}
spec: {nodeName: node-b, containers: []}
status: {podIP: 10.1.0.8}
";

    #[test]
    fn pod_over_namespace_over_cluster_and_probes_per_port() {
        let d = Defaults {
            policy: "cluster-unauthenticated".into(),
            cluster_networks: vec!["10.0.0.0/8".into()],
        };
        let r = render(&index(CLUSTER), "node-a", &d);
        assert_eq!(
            r.keys().collect::<Vec<_>>(),
            ["open/anyone", "shop/locked", "shop/web"]
        );
        let name = |k: &str| r[k].default.as_ref().unwrap().name.clone();
        assert_eq!(name("shop/web"), "all-authenticated", "the namespace's");
        assert_eq!(name("shop/locked"), "deny", "the pod's own");
        assert_eq!(
            name("open/anyone"),
            "cluster-unauthenticated",
            "the cluster's"
        );
        let web = &r["shop/web"];
        let probes: Vec<(u32, Vec<String>)> = web
            .ports
            .iter()
            .map(|p| (p.port, p.probe_paths.clone()))
            .collect();
        assert_eq!(
            probes,
            [(8080, vec!["/".to_string()]), (9901, vec!["/ready".into()])]
        );
        assert_eq!(web.ports[0].name, "all-authenticated");
        assert!(render(&index(CLUSTER), "node-c", &d).is_empty());
    }

    #[test]
    fn deltas_and_chunked_snapshots() {
        let d = Defaults {
            policy: "all-unauthenticated".into(),
            cluster_networks: vec![],
        };
        let before = render(&index(CLUSTER), "node-a", &d);
        let changed = CLUSTER.replace(
            "default-inbound-policy: deny}",
            "default-inbound-policy: audit}",
        );
        let after = render(&index(&changed), "node-a", &d);
        let delta = diff(&before, &after);
        assert_eq!(delta.pods.len(), 1);
        assert_eq!(delta.pods[0].pod, "shop/locked");
        assert!(delta.pods[0].default.as_ref().unwrap().audit);
        let gone = diff(&after, &BTreeMap::new());
        assert_eq!(gone.removed_pods.len(), 3);
        let chunks = snapshot_chunks(&after, 2);
        assert_eq!(chunks.len(), 2);
        assert!(chunks[0].snapshot && chunks[0].more && !chunks[1].snapshot && !chunks[1].more);
        let empty = snapshot_chunks(&BTreeMap::new(), 2);
        assert!(empty.len() == 1 && empty[0].snapshot && !empty[0].more);
    }

    #[test]
    fn a_policy_annotation_typo_is_refused_by_field() {
        let bad = CLUSTER.replace(
            "default-inbound-policy: deny}",
            "default-inbound-policy: dney}",
        );
        let objects: Vec<KubeObject> = serde_yaml::Deserializer::from_str(&bad)
            .map(|doc| {
                let v = serde_yaml::Value::deserialize(doc).unwrap();
                let json = serde_json::to_value(&v).unwrap();
                match v["kind"].as_str().unwrap() {
                    "Namespace" => KubeObject::Namespace(serde_json::from_value(json).unwrap()),
                    _ => KubeObject::Pod(serde_json::from_value(json).unwrap()),
                }
            })
            .collect();
        let (_, e) = ClusterIndex::from_objects("cluster.local", objects).unwrap_err();
        assert!(e.object.contains("shop/locked"), "{e}");
        assert!(
            e.field.contains("config.ambit.dev/default-inbound-policy"),
            "{e}"
        );
        assert!(
            e.message.contains("\"dney\"") && e.message.contains("all-unauthenticated"),
            "{e}"
        );
    }
}
