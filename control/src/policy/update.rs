//! What a policy stream sends: deltas between two renderings of a node, and snapshots and
//! deltas cut into chunks of bounded size (as discovery's).

use super::render::NodePolicies;
use ambit_api::proto::policy as pb;
use prost::Message;

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

/// `policies` as a snapshot, in chunks (see [`chunks`]).
pub fn snapshot_chunks(
    policies: &NodePolicies,
    per_chunk: usize,
    max_bytes: usize,
) -> Vec<pb::Update> {
    chunks(
        policies.values().cloned().collect(),
        vec![],
        true,
        per_chunk,
        max_bytes,
    )
}

/// `delta` in chunks (see [`chunks`]).
pub fn delta_chunks(delta: pb::Update, per_chunk: usize, max_bytes: usize) -> Vec<pb::Update> {
    chunks(delta.pods, delta.removed_pods, false, per_chunk, max_bytes)
}

/// `pods` and then `removed` (in the last chunk) as chunks of at most `per_chunk` pods and,
/// past a chunk's first pod, `max_bytes` encoded: the first has `snapshot` (when one), all
/// but the last `more`. Nothing at all is one empty chunk.
pub fn chunks(
    pods: Vec<pb::PodPolicy>,
    removed: Vec<String>,
    snapshot: bool,
    per_chunk: usize,
    max_bytes: usize,
) -> Vec<pb::Update> {
    let per_chunk = per_chunk.max(1);
    let mut out = vec![pb::Update {
        snapshot,
        ..pb::Update::default()
    }];
    let mut bytes = 0;
    for pod in pods {
        let len = pod.encoded_len();
        let last = out.len() - 1;
        let full = !out[last].pods.is_empty()
            && (out[last].pods.len() >= per_chunk || bytes + len > max_bytes);
        if full {
            out.push(pb::Update::default());
            bytes = 0;
        }
        bytes += len;
        let last = out.len() - 1;
        out[last].pods.push(pod);
    }
    let n = out.len();
    for (i, chunk) in out.iter_mut().enumerate() {
        chunk.more = i + 1 < n;
    }
    out[n - 1].removed_pods = removed;
    out
}
