//! The objects, kept as etcd and the API server keep them: one resourceVersion counter
//! for every kind, each write bumping it; per kind, the history of changes that watches
//! replay from and that older lists are rebuilt from; compaction, after which earlier
//! resourceVersions answer 410.

use super::resource::ResourceType;
use super::status::Failure;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::broadcast;

/// How many changes an open watch may fall behind before it is ended (the API server
/// also ends watches that cannot keep up; the client resumes from its last version).
const WATCH_BUFFER: usize = 4096;

/// What a change did, as a watch event names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One write: the object after it (for a deletion, the last state at the deletion's
/// resourceVersion) and before it.
#[derive(Debug)]
pub(crate) struct Change {
    pub rv: u64,
    /// Index of the kind in the store.
    pub kind: usize,
    pub event: EventType,
    pub object: Value,
    pub prev: Option<Value>,
}

#[derive(Debug)]
struct KindState {
    ty: ResourceType,
    /// Keyed `namespace/name` (or `name`), in etcd's key order.
    objects: BTreeMap<String, Value>,
    /// Every change after the store's compaction point, oldest first.
    history: Vec<Arc<Change>>,
}

/// Every object of every kind, and their history.
#[derive(Debug)]
pub(crate) struct Store {
    rv: u64,
    /// History is complete after this version: older ones answer 410.
    compacted: u64,
    kinds: Vec<KindState>,
    events: broadcast::Sender<Arc<Change>>,
}

impl Store {
    pub(crate) fn new() -> Self {
        let mut store = Self {
            rv: 1,
            compacted: 1,
            kinds: Vec::new(),
            events: broadcast::channel(WATCH_BUFFER).0,
        };
        for ty in ResourceType::defaults() {
            store.register(ty);
        }
        store
    }

    /// Adds a kind; registering one already there changes nothing.
    pub(crate) fn register(&mut self, ty: ResourceType) {
        if self.find(&ty.group, &ty.version, &ty.plural).is_none() {
            self.kinds.push(KindState {
                ty,
                objects: BTreeMap::new(),
                history: Vec::new(),
            });
        }
    }

    /// The kind served at `group/version/plural`.
    pub(crate) fn find(&self, group: &str, version: &str, plural: &str) -> Option<usize> {
        self.kinds
            .iter()
            .position(|k| k.ty.group == group && k.ty.version == version && k.ty.plural == plural)
    }

    /// The kind named by `name`: its `kind`, its plural, or `plural.group`.
    pub(crate) fn find_named(&self, name: &str) -> usize {
        let found: Vec<usize> = (0..self.kinds.len())
            .filter(|&i| {
                let t = &self.kinds[i].ty;
                t.kind == name || t.plural == name || format!("{}.{}", t.plural, t.group) == name
            })
            .collect();
        match found[..] {
            [one] => one,
            [] => panic!("fake kube: no kind {name:?} is registered"),
            _ => panic!("fake kube: {name:?} names several kinds; say plural.group"),
        }
    }

    pub(crate) fn ty(&self, kind: usize) -> &ResourceType {
        &self.kinds[kind].ty
    }

    pub(crate) fn rv(&self) -> u64 {
        self.rv
    }

    pub(crate) fn compacted(&self) -> u64 {
        self.compacted
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        self.events.subscribe()
    }

    /// One object by key.
    pub(crate) fn get(&self, kind: usize, key: &str) -> Option<&Value> {
        self.kinds[kind].objects.get(key)
    }

    /// Changes to `kind` after `rv` (which must be at or after the compaction point).
    pub(crate) fn changes_since(&self, kind: usize, rv: u64) -> Vec<Arc<Change>> {
        let history = &self.kinds[kind].history;
        let first = history.partition_point(|c| c.rv <= rv);
        history[first..].to_vec()
    }

    /// The objects of `kind` as they were at `rv`, rebuilt by undoing later changes.
    pub(crate) fn objects_at(
        &self,
        kind: usize,
        rv: u64,
    ) -> Result<BTreeMap<String, Value>, Failure> {
        if rv < self.compacted {
            return Err(Failure::too_old(rv, self.compacted));
        }
        if rv > self.rv {
            return Err(Failure::too_large(rv, self.rv));
        }
        let state = &self.kinds[kind];
        let mut objects = state.objects.clone();
        for change in state.history.iter().rev().take_while(|c| c.rv > rv) {
            let key = key_of(&change.object);
            match (&change.event, &change.prev) {
                (EventType::Added, _) => {
                    objects.remove(&key);
                }
                (_, Some(prev)) => {
                    objects.insert(key, prev.clone());
                }
                (_, None) => {}
            }
        }
        Ok(objects)
    }

    /// Creates or updates `object`; returns it as stored. An update that changes nothing
    /// is no write at all (no new resourceVersion, no event), as on the API server.
    pub(crate) fn apply(&mut self, mut object: Value) -> Value {
        let kind = self.kind_of(&object);
        let ty = self.kinds[kind].ty.clone();
        let meta = metadata(&mut object);
        if ty.namespaced {
            let ns = meta.get("namespace").and_then(Value::as_str).unwrap_or("");
            if ns.is_empty() {
                meta.insert("namespace".into(), json!("default"));
            }
        } else {
            meta.remove("namespace");
        }
        meta.remove("resourceVersion");
        let key = key_of(&object);
        assert!(
            !key.ends_with('/') && !key.is_empty(),
            "fake kube: {} without metadata.name",
            ty.kind
        );
        if let Some((ns, _)) = key.split_once('/') {
            let namespaces = self.find("", "v1", "namespaces").unwrap_or(0);
            assert!(
                self.kinds[namespaces].objects.contains_key(ns),
                "fake kube: namespaces \"{ns}\" not found (apply the Namespace before its {})",
                ty.kind
            );
        }
        let prev = self.kinds[kind].objects.get(&key).cloned();
        let event = match &prev {
            Some(prev) => {
                if same_object(prev, &object) {
                    return prev.clone();
                }
                carry_over(prev, &mut object);
                EventType::Modified
            }
            None => {
                let meta = metadata(&mut object);
                meta.entry("uid").or_insert_with(|| json!(new_uid()));
                meta.entry("creationTimestamp")
                    .or_insert_with(|| json!(now()));
                meta.insert("generation".into(), json!(1));
                EventType::Added
            }
        };
        self.write(kind, event, object, prev)
    }

    /// Deletes the object at `key`; a namespace takes its objects with it (the namespace
    /// controller's work, done at once). Whether there was one.
    pub(crate) fn delete(&mut self, kind: usize, key: &str) -> bool {
        let Some(prev) = self.kinds[kind].objects.get(key).cloned() else {
            return false;
        };
        if self.kinds[kind].ty.kind == "Namespace" && self.kinds[kind].ty.group.is_empty() {
            let prefix = format!("{key}/");
            for k in 0..self.kinds.len() {
                let inside: Vec<String> = self.kinds[k]
                    .objects
                    .range(prefix.clone()..)
                    .take_while(|(o, _)| o.starts_with(&prefix))
                    .map(|(o, _)| o.clone())
                    .collect();
                for o in inside {
                    self.delete(k, &o);
                }
            }
        }
        self.write(kind, EventType::Deleted, prev.clone(), Some(prev));
        true
    }

    /// Advances the version past every one handed out so far (as a real cluster's Lease
    /// and Event writes always do) and forgets all history: every version handed out
    /// before answers 410 from now on.
    pub(crate) fn compact(&mut self) {
        self.rv += 1;
        self.compacted = self.rv;
        for k in &mut self.kinds {
            k.history.clear();
        }
    }

    fn write(
        &mut self,
        kind: usize,
        event: EventType,
        mut object: Value,
        prev: Option<Value>,
    ) -> Value {
        self.rv += 1;
        metadata(&mut object).insert("resourceVersion".into(), json!(self.rv.to_string()));
        let key = key_of(&object);
        let state = &mut self.kinds[kind];
        if event == EventType::Deleted {
            state.objects.remove(&key);
        } else {
            state.objects.insert(key, object.clone());
        }
        let change = Arc::new(Change {
            rv: self.rv,
            kind,
            event,
            object: object.clone(),
            prev,
        });
        state.history.push(change.clone());
        // No receiver is no error: nobody watches.
        let _ = self.events.send(change);
        object
    }

    fn kind_of(&self, object: &Value) -> usize {
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        let kind = object["kind"].as_str().unwrap_or_default();
        self.kinds
            .iter()
            .position(|k| k.ty.api_version() == api_version && k.ty.kind == kind)
            .unwrap_or_else(|| {
                panic!("fake kube: kind {kind:?} of {api_version:?} is not registered")
            })
    }
}

/// `namespace/name`, or `name` for cluster-scoped objects: etcd's key order.
pub(crate) fn key_of(object: &Value) -> String {
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    match object["metadata"]["namespace"].as_str() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    }
}

/// The key of `name` in `namespace` (`""` for cluster-scoped kinds).
pub(crate) fn key(namespace: &str, name: &str) -> String {
    if namespace.is_empty() {
        name.to_string()
    } else {
        format!("{namespace}/{name}")
    }
}

fn metadata(object: &mut Value) -> &mut serde_json::Map<String, Value> {
    if !object["metadata"].is_object() {
        object["metadata"] = json!({});
    }
    match object.get_mut("metadata") {
        Some(Value::Object(meta)) => meta,
        _ => unreachable!("metadata was just made an object"),
    }
}

/// Equal but for what the server sets itself.
fn same_object(stored: &Value, new: &Value) -> bool {
    let mut stored = stored.clone();
    let mut new = new.clone();
    carry_over(&stored.clone(), &mut new);
    metadata(&mut stored).remove("resourceVersion");
    stored == new
}

/// An update keeps what the server set at creation; `generation` moves with the spec.
fn carry_over(prev: &Value, object: &mut Value) {
    let spec_changed = prev.get("spec") != object.get("spec");
    let meta = metadata(object);
    for field in ["uid", "creationTimestamp"] {
        if let Some(v) = prev["metadata"].get(field) {
            meta.insert(field.into(), v.clone());
        }
    }
    let generation = prev["metadata"]["generation"].as_u64().unwrap_or(1);
    meta.insert(
        "generation".into(),
        json!(generation + u64::from(spec_changed)),
    );
}

/// A random version-4 UUID.
pub(crate) fn new_uid() -> String {
    use std::hash::{BuildHasher, RandomState};
    let a = RandomState::new().hash_one(0u8);
    let b = RandomState::new().hash_one(1u8);
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        0x8000 | ((b >> 48) & 0x3fff),
        b & 0xffff_ffff_ffff
    )
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}
