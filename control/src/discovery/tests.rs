use super::*;
use crate::index::{ClusterIndex, KubeObject};
use std::collections::BTreeSet;
use std::sync::Arc;

fn pod(i: usize) -> KubeObject {
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: p{i}, namespace: shop}}\nspec: {{nodeName: node-a, containers: []}}\nstatus: {{podIP: 10.1.{}.{}}}\n",
        i / 250,
        i % 250 + 1
    );
    let mut skipped = 0;
    let mut objs = crate::local::parse_file(std::path::Path::new("t.yaml"), &yaml, &mut skipped)
        .unwrap_or_else(|e| panic!("{e}"));
    objs.remove(0).object
}

fn index() -> SharedIndex {
    SharedIndex::new(ClusterIndex::new("cluster.local"))
}

#[tokio::test]
async fn one_change_is_rendered_once_and_shared_by_every_stream() {
    let index = index();
    let publisher = Publisher::new(&index);
    let mut streams: Vec<_> = (0..100).map(|_| publisher.subscribe()).collect();
    index.apply(pod(1)).unwrap_or_else(|e| panic!("{e}"));
    publisher.publish(&index);
    let (version, first) = streams[0].recv().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(version, 1);
    assert_eq!(first.len(), 1, "a small delta is one message");
    assert_eq!(first[0].workloads.len(), 1);
    for s in &mut streams[1..] {
        let (v, delta) = s.recv().await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v, 1);
        assert!(
            Arc::ptr_eq(&first, &delta),
            "every stream shares one rendering"
        );
    }
    assert_eq!(publisher.latest().version, 1);
    // An index change that changes nothing discovery sends publishes nothing.
    publisher.publish(&index);
    assert!(streams[0].try_recv().is_err());
    assert_eq!(publisher.latest().version, 1);
}

/// What a proxy holds: its state and a snapshot being received.
#[derive(Default)]
struct Receiver {
    state: BTreeSet<String>,
    pending: Option<BTreeSet<String>>,
}

impl Receiver {
    /// Applies what a proxy receives, as the proxy does: a snapshot once complete.
    fn apply(&mut self, u: &Update) {
        if u.snapshot {
            self.pending = Some(BTreeSet::new());
        }
        let into = self.pending.as_mut().unwrap_or(&mut self.state);
        for w in &u.workloads {
            into.insert(format!("{}/{}", w.namespace, w.name));
        }
        for r in &u.removed_workloads {
            into.remove(r);
        }
        if !u.more {
            if let Some(done) = self.pending.take() {
                self.state = done;
            }
        }
    }
}

#[tokio::test]
async fn a_stream_that_falls_behind_gets_a_snapshot_and_ends_up_current() {
    let index = index();
    let publisher = Publisher::new(&index);
    publisher.start(&index);
    let metrics = DiscoveryMetrics::default();
    // A client that reads nothing for now: the stream blocks on its first send.
    let (tx, mut rx) = mpsc::channel(1);
    let stream = {
        let publisher = publisher.clone();
        let metrics = metrics.clone();
        tokio::spawn(async move { stream_updates(&publisher, "node-a", &tx, &metrics).await })
    };
    tokio::task::yield_now().await;
    for i in 0..(publish::DELTA_BUFFER + 50) {
        index.apply(pod(i)).unwrap_or_else(|e| panic!("{e}"));
        publisher.publish(&index);
    }
    index.delete(&pod(0).object_ref());
    publisher.publish(&index);
    let want: BTreeSet<String> = publisher.latest().view.workloads.keys().cloned().collect();
    let mut got = Receiver::default();
    let mut snapshots = 0;
    while got.state != want {
        let u = tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv())
            .await
            .unwrap_or_else(|_| panic!("stream stalled with {} of {}", got.state.len(), want.len()))
            .unwrap_or_else(|| panic!("stream ended"))
            .unwrap_or_else(|e| panic!("{e}"));
        snapshots += usize::from(u.snapshot);
        got.apply(&u);
    }
    assert!(
        snapshots >= 2,
        "the first message and the resync are snapshots"
    );
    assert!(!got.state.contains("shop/p0"));
    stream.abort();
}

#[test]
fn a_snapshot_goes_in_bounded_chunks_that_add_up_to_the_cluster() {
    let index = index();
    for i in 0..10 {
        index.apply(pod(i)).unwrap_or_else(|e| panic!("{e}"));
    }
    let view = snapshot(&index.read());
    let chunks: Vec<Update> = view.snapshot_chunks(4, usize::MAX).collect();
    assert_eq!(chunks.len(), 3);
    assert!(chunks[0].snapshot && !chunks[1].snapshot && !chunks[2].snapshot);
    assert!(chunks[0].more && chunks[1].more && !chunks[2].more);
    assert!(chunks.iter().all(|c| c.workloads.len() <= 4));
    let mut r = Receiver::default();
    r.state.insert("stale/pod".into());
    for c in &chunks[..2] {
        r.apply(c);
        assert!(
            r.state.contains("stale/pod"),
            "a partial snapshot is never applied"
        );
    }
    r.apply(&chunks[2]);
    assert_eq!(r.state.len(), 10);
    // An empty cluster is one empty snapshot.
    let empty = snapshot(&ClusterIndex::new("cluster.local"));
    let chunks: Vec<Update> = empty.snapshot_chunks(4, usize::MAX).collect();
    assert_eq!(chunks.len(), 1);
    assert!(chunks[0].snapshot && !chunks[0].more);
    // Bounded in bytes too: one resource a chunk when each is over the budget.
    let chunks: Vec<Update> = view.snapshot_chunks(256, 1).collect();
    assert_eq!(chunks.len(), 10);
    assert!(chunks.iter().all(|c| c.workloads.len() == 1));
    assert!(chunks[0].snapshot && chunks[8].more && !chunks[9].more);
}

#[test]
fn a_delta_goes_in_chunks_bounded_by_count_and_bytes_that_add_up_to_it() {
    use crate::discovery::state::delta_chunks;
    use prost::Message;
    let index = index();
    for i in 0..10 {
        index.apply(pod(i)).unwrap_or_else(|e| panic!("{e}"));
    }
    let mut delta = snapshot(&index.read()).to_update(false);
    delta.removed_workloads = vec!["gone/a".into(), "gone/b".into()];
    delta.removed_services = vec!["gone/svc".into()];
    let whole = delta.clone();
    // By count: 13 items, 4 a chunk.
    let chunks = delta_chunks(delta.clone(), 4, usize::MAX);
    assert_eq!(chunks.len(), 4);
    assert!(chunks[..3].iter().all(|c| c.more) && !chunks[3].more);
    assert!(chunks.iter().all(|c| !c.snapshot));
    let mut joined = Update::default();
    for c in &chunks {
        let n = c.workloads.len()
            + c.services.len()
            + c.removed_workloads.len()
            + c.removed_services.len();
        assert!(n <= 4, "{c:?}");
        joined.workloads.extend(c.workloads.iter().cloned());
        joined
            .removed_workloads
            .extend(c.removed_workloads.iter().cloned());
        joined
            .removed_services
            .extend(c.removed_services.iter().cloned());
    }
    assert_eq!(joined.workloads, whole.workloads);
    assert_eq!(joined.removed_workloads, whole.removed_workloads);
    assert_eq!(joined.removed_services, whole.removed_services);
    // By bytes: no chunk past the budget but for a single resource larger than it.
    let budget = whole.workloads[0].encoded_len() * 3;
    let chunks = delta_chunks(delta.clone(), 256, budget);
    assert!(chunks.len() > 3, "{}", chunks.len());
    assert!(
        chunks.iter().all(|c| c.encoded_len() <= budget + 16),
        "{chunks:?}"
    );
    let tiny = delta_chunks(delta.clone(), 256, 1);
    assert_eq!(
        tiny.len(),
        13,
        "one resource a chunk when each is over the budget"
    );
    // A small delta is one chunk, as it was.
    assert_eq!(delta_chunks(delta, 256, 1 << 20).len(), 1);
}

#[tokio::test]
async fn nothing_is_streamed_until_the_backend_has_loaded_the_cluster() {
    let index = index();
    let publisher = Publisher::new(&index);
    let ready = crate::ready::Readiness::default();
    ready.pending("initial list of Namespace");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(publisher.clone().run(index.clone(), ready.clone(), async {
        let _ = stopped.await;
    }));
    let (tx, mut rx) = mpsc::channel(16);
    let stream = {
        let publisher = publisher.clone();
        tokio::spawn(async move {
            stream_updates(&publisher, "node-a", &tx, &DiscoveryMetrics::default()).await
        })
    };
    // Pods listed, Namespaces not yet: a proxy would see its pods as not meshed.
    index.apply(pod(1)).unwrap_or_else(|e| panic!("{e}"));
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(
        rx.try_recv().is_err(),
        "a snapshot of a half-listed cluster was sent"
    );
    ready.done("initial list of Namespace");
    let first = tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv())
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("stream ended"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(first.snapshot && first.workloads.len() == 1);
    // Later changes arrive as deltas.
    index.apply(pod(2)).unwrap_or_else(|e| panic!("{e}"));
    let next = tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv())
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("stream ended"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!next.snapshot && next.workloads.len() == 1);
    let _ = stop.send(());
    let _ = run.await;
    stream.abort();
}
