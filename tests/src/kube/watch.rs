//! Watch streams as the API server sends them: chunked JSON, one event per line, from a
//! resourceVersion onwards; BOOKMARKs with only `metadata.resourceVersion`; an ERROR
//! event with a 410 Status (and the end of the stream) for a version compacted away.

use super::resource::ResourceType;
use super::select::Filter;
use super::status::Failure;
use super::store::{Change, EventType};
use super::Shared;
use bytes::Bytes;
use futures::Stream;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, watch};
use tokio::time::{Instant, Interval, Sleep};

/// What a watch request asked for.
#[derive(Debug)]
pub(crate) struct WatchRequest {
    pub kind: usize,
    pub filter: Filter,
    /// `resourceVersion`: `None` or `"0"` start with the current objects.
    pub rv: Option<String>,
    /// `allowWatchBookmarks=true`.
    pub bookmarks: bool,
    /// `sendInitialEvents=true`: the current objects, then a bookmark that says so.
    pub initial_events: bool,
    /// `timeoutSeconds` (the API server picks 30 to 60 minutes when it is absent).
    pub timeout: Duration,
}

/// The lines of an open watch, until it times out, falls behind, or is dropped.
pub(crate) fn start(
    shared: &Arc<Shared>,
    req: WatchRequest,
) -> Result<impl Stream<Item = Bytes> + Send + 'static, Failure> {
    let store = shared.lock_store();
    let ty = store.ty(req.kind).clone();
    let mut backlog = VecDeque::new();
    let mut done = false;
    match req.rv.as_deref().filter(|rv| !rv.is_empty() && *rv != "0") {
        None => {
            let objects = store.objects_at(req.kind, store.rv())?;
            for object in objects.values().filter(|o| req.filter.matches(o)) {
                backlog.push_back(line("ADDED", object));
            }
            if req.initial_events {
                let mut mark = bookmark(&ty, store.rv());
                mark["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
                backlog.push_back(line("BOOKMARK", &mark));
            }
        }
        Some(rv) => {
            let rv: u64 = rv
                .parse()
                .map_err(|_| Failure::bad_request(format!("invalid resource version: {rv}")))?;
            if rv > store.rv() {
                return Err(Failure::too_large(rv, store.rv()));
            }
            if rv < store.compacted() {
                let status = Failure::too_old(rv, store.compacted()).to_status();
                backlog.push_back(line("ERROR", &status));
                done = true;
            } else {
                for change in store.changes_since(req.kind, rv) {
                    backlog.extend(render(&req.filter, &change));
                }
            }
        }
    }
    let state = Watch {
        shared: shared.clone(),
        kind: req.kind,
        ty,
        filter: req.filter,
        backlog,
        done,
        seen: store.rv(),
        changes: store.subscribe(),
        dropped: shared.drop_watches.subscribe(),
        bookmarks: req.bookmarks.then(|| {
            let every = shared.settings.bookmark_interval;
            tokio::time::interval_at(Instant::now() + every, every)
        }),
        bookmarks_wanted: req.bookmarks,
        deadline: Box::pin(tokio::time::sleep(req.timeout)),
        _open: OpenWatch::new(shared),
    };
    drop(store);
    Ok(futures::stream::unfold(state, next))
}

/// One open watch.
struct Watch {
    shared: Arc<Shared>,
    kind: usize,
    ty: ResourceType,
    filter: Filter,
    backlog: VecDeque<Bytes>,
    /// Nothing more after the backlog.
    done: bool,
    /// Every change up to this version has been taken from `changes`.
    seen: u64,
    changes: broadcast::Receiver<Arc<Change>>,
    dropped: watch::Receiver<u64>,
    bookmarks: Option<Interval>,
    bookmarks_wanted: bool,
    deadline: Pin<Box<Sleep>>,
    _open: OpenWatch,
}

async fn next(mut w: Watch) -> Option<(Bytes, Watch)> {
    loop {
        if let Some(line) = w.backlog.pop_front() {
            return Some((line, w));
        }
        if w.done {
            return None;
        }
        tokio::select! {
            biased;
            _ = w.dropped.changed() => return None,
            change = w.changes.recv() => match change {
                Ok(change) => {
                    w.seen = change.rv;
                    if change.kind == w.kind {
                        w.backlog.extend(render(&w.filter, &change));
                    }
                }
                // Fallen behind (or the server is gone): end the watch, as the API server
                // ends a watcher that cannot keep up; the client resumes from its version.
                Err(_) => return None,
            },
            _ = &mut w.deadline => {
                // The API server sends a last bookmark as a watch times out.
                w.done = true;
                if w.bookmarks_wanted {
                    w.push_bookmark();
                }
            }
            _ = tick(&mut w.bookmarks) => w.push_bookmark(),
        }
    }
}

impl Watch {
    /// A bookmark at the newest version whose changes this watch has all passed on.
    fn push_bookmark(&mut self) {
        let store = self.shared.lock_store();
        // Under the store's lock nothing is being written: with nothing left to take
        // from `changes`, every change up to the store's version has been seen (this is
        // also how a bookmark moves past a compaction, as etcd's progress notifications
        // do).
        if self.dropped.has_changed().unwrap_or(true) {
            self.done = true;
            self.backlog.clear();
            return;
        }
        let rv = if self.changes.is_empty() {
            store.rv()
        } else {
            self.seen
        };
        drop(store);
        self.shared.bookmarks.fetch_add(1, Ordering::Relaxed);
        self.backlog
            .push_back(line("BOOKMARK", &bookmark(&self.ty, rv)));
    }
}

async fn tick(interval: &mut Option<Interval>) {
    match interval {
        Some(i) => {
            i.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// The event a change makes for a watch with `filter`: an object that stops matching
/// is DELETED for it, one that starts matching is ADDED, as the API server does.
fn render(filter: &Filter, change: &Change) -> Option<Bytes> {
    let now = filter.matches(&change.object);
    let before = change.prev.as_ref().is_some_and(|p| filter.matches(p));
    let event = match (change.event, before, now) {
        (EventType::Added, _, true) => "ADDED",
        (EventType::Modified, true, true) => "MODIFIED",
        (EventType::Modified, false, true) => "ADDED",
        (EventType::Modified, true, false) => "DELETED",
        (EventType::Deleted, _, true) => "DELETED",
        _ => return None,
    };
    Some(line(event, &change.object))
}

/// `{"type": ..., "object": ...}` and a newline.
fn line(event: &str, object: &Value) -> Bytes {
    let mut bytes =
        serde_json::to_vec(&json!({"type": event, "object": object})).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// A bookmark object: the kind, and a resourceVersion.
fn bookmark(ty: &ResourceType, rv: u64) -> Value {
    json!({
        "kind": ty.kind,
        "apiVersion": ty.api_version(),
        "metadata": {"resourceVersion": rv.to_string(), "creationTimestamp": null},
    })
}

/// Counts a watch as open for as long as its stream lives.
struct OpenWatch(Arc<Shared>);

impl OpenWatch {
    fn new(shared: &Arc<Shared>) -> Self {
        shared.open_watches.fetch_add(1, Ordering::SeqCst);
        Self(shared.clone())
    }
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.0.open_watches.fetch_sub(1, Ordering::SeqCst);
    }
}
