//! What a policy stream sends: deltas between two renderings (a node's pods, every
//! Service's routes), and snapshots and deltas cut into chunks of bounded size (as
//! discovery's).

use super::render::NodePolicies;
use super::routes::ServiceRoutesMap;
use ambit_api::proto::policy as pb;
use prost::Message;
use std::sync::Arc;

/// The delta from `before` to `after`: changed or new pods, and those gone.
pub fn diff(before: &NodePolicies, after: &NodePolicies) -> pb::Update {
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
        ..pb::Update::default()
    }
}

/// Adds to `delta` the Services whose routes changed from `before` to `after`, and those
/// gone. A Service the rendering did not change is the same `Arc`: compared by pointer
/// first, so an unchanged cluster of many Services costs each stream no message compare.
pub fn diff_services(before: &ServiceRoutesMap, after: &ServiceRoutesMap, delta: &mut pb::Update) {
    delta.services.extend(
        after
            .iter()
            .filter(|(k, v)| !before.get(*k).is_some_and(|b| Arc::ptr_eq(b, v) || b == *v))
            .map(|(_, v)| (**v).clone()),
    );
    delta
        .removed_services
        .extend(before.keys().filter(|k| !after.contains_key(*k)).cloned());
}

/// Whether `delta` says nothing.
pub fn is_empty(delta: &pb::Update) -> bool {
    delta.pods.is_empty()
        && delta.removed_pods.is_empty()
        && delta.services.is_empty()
        && delta.removed_services.is_empty()
}

/// `policies` and `services` as a snapshot, in chunks (see [`split`]).
pub fn snapshot_chunks(
    policies: &NodePolicies,
    services: &ServiceRoutesMap,
    per_chunk: usize,
    max_bytes: usize,
) -> Vec<pb::Update> {
    split(
        pb::Update {
            snapshot: true,
            pods: policies.values().cloned().collect(),
            services: services.values().map(|s| (**s).clone()).collect(),
            ..pb::Update::default()
        },
        per_chunk,
        max_bytes,
    )
}

/// `delta` in chunks (see [`split`]).
pub fn delta_chunks(delta: pb::Update, per_chunk: usize, max_bytes: usize) -> Vec<pb::Update> {
    split(delta, per_chunk, max_bytes)
}

/// `pods` and then `removed` (in the last chunk) as chunks (see [`split`]).
pub fn chunks(
    pods: Vec<pb::PodPolicy>,
    removed: Vec<String>,
    snapshot: bool,
    per_chunk: usize,
    max_bytes: usize,
) -> Vec<pb::Update> {
    split(
        pb::Update {
            snapshot,
            pods,
            removed_pods: removed,
            ..pb::Update::default()
        },
        per_chunk,
        max_bytes,
    )
}

/// `whole`'s pods, then its Services, as chunks of at most `per_chunk` of them together
/// and, past a chunk's first, `max_bytes` encoded; the removals in the last chunk. The
/// first has `snapshot` (when `whole` has), all but the last `more`. Nothing at all is
/// one empty chunk.
pub fn split(whole: pb::Update, per_chunk: usize, max_bytes: usize) -> Vec<pb::Update> {
    enum Item {
        Pod(pb::PodPolicy),
        Service(pb::ServiceRoutes),
    }
    let per_chunk = per_chunk.max(1);
    let mut out = vec![pb::Update {
        snapshot: whole.snapshot,
        ..pb::Update::default()
    }];
    let (mut bytes, mut count) = (0, 0);
    let items = whole
        .pods
        .into_iter()
        .map(Item::Pod)
        .chain(whole.services.into_iter().map(Item::Service));
    for item in items {
        let len = match &item {
            Item::Pod(p) => p.encoded_len(),
            Item::Service(s) => s.encoded_len(),
        };
        if count > 0 && (count >= per_chunk || bytes + len > max_bytes) {
            out.push(pb::Update::default());
            (bytes, count) = (0, 0);
        }
        bytes += len;
        count += 1;
        let last = out.len() - 1;
        match item {
            Item::Pod(p) => out[last].pods.push(p),
            Item::Service(s) => out[last].services.push(s),
        }
    }
    let n = out.len();
    for (i, chunk) in out.iter_mut().enumerate() {
        chunk.more = i + 1 < n;
    }
    out[n - 1].removed_pods = whole.removed_pods;
    out[n - 1].removed_services = whole.removed_services;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(name: &str) -> Arc<pb::ServiceRoutes> {
        Arc::new(pb::ServiceRoutes {
            service: format!("shop/{name}"),
            ports: vec![pb::PortRoutes {
                port: 80,
                rules: vec![pb::Rule::default()],
            }],
            failure_accrual: None,
            consumers: vec![],
        })
    }

    #[test]
    fn services_ride_the_same_bounded_chunks_after_the_pods() {
        let pods: NodePolicies = (0..3)
            .map(|i| {
                (
                    format!("shop/p{i}"),
                    pb::PodPolicy {
                        pod: format!("shop/p{i}"),
                        ..Default::default()
                    },
                )
            })
            .collect();
        let services: ServiceRoutesMap = ["a", "b", "c"]
            .iter()
            .map(|n| (format!("shop/{n}"), service(n)))
            .collect();
        let chunks = snapshot_chunks(&pods, &services, 2, 1 << 20);
        let shape: Vec<(bool, usize, usize, bool)> = chunks
            .iter()
            .map(|c| (c.snapshot, c.pods.len(), c.services.len(), c.more))
            .collect();
        assert_eq!(
            shape,
            [
                (true, 2, 0, true),
                (false, 1, 1, true),
                (false, 0, 2, false)
            ]
        );
        // Bytes bound a chunk past its first item.
        let one = services["shop/a"].encoded_len();
        let chunks = snapshot_chunks(&NodePolicies::new(), &services, 100, one + 1);
        assert!(
            chunks.iter().all(|c| c.services.len() == 1),
            "one Service a chunk"
        );
    }

    #[test]
    fn a_delta_holds_only_the_services_that_changed_and_those_gone() {
        let before: ServiceRoutesMap = ["a", "b", "c"]
            .iter()
            .map(|n| (format!("shop/{n}"), service(n)))
            .collect();
        let mut after = before.clone();
        let mut b = (*after["shop/b"]).clone();
        b.ports[0].port = 81;
        after.insert("shop/b".into(), Arc::new(b));
        after.remove("shop/c");
        after.insert("shop/d".into(), service("d"));
        // An equal rendering in a new Arc is not a change either.
        after.insert("shop/a".into(), service("a"));
        let mut delta = pb::Update::default();
        diff_services(&before, &after, &mut delta);
        let changed: Vec<&str> = delta.services.iter().map(|s| s.service.as_str()).collect();
        assert_eq!(changed, ["shop/b", "shop/d"]);
        assert_eq!(delta.removed_services, ["shop/c"]);
        let chunks = delta_chunks(delta, 1, 1 << 20);
        assert_eq!(chunks.len(), 2);
        assert_eq!(
            chunks[1].removed_services,
            ["shop/c"],
            "removals in the last chunk"
        );
        let mut none = pb::Update::default();
        diff_services(&before, &before, &mut none);
        assert!(is_empty(&none));
    }
}
