//! A fake Kubernetes API server, in process, that kube-rs talks to over real HTTPS.
//!
//! There is no kube-apiserver on these machines; this is the closest stand-in: the
//! real kube-rs client (`Api::list`, `Api::get`, `watcher`, reflectors,
//! `Api::<TokenReview>::create`) runs against it over TLS with a bearer token, and it
//! answers as the API server does where kube-rs can tell the difference.
//!
//! # Layout
//! - `store`: objects as etcd keeps them: one resourceVersion counter for all kinds,
//!   per-kind history, compaction; `resource`: the kinds ([`ResourceType`] registers one).
//! - `list`: consistent paged lists (`limit`, `continue`, 410 for an expired token).
//! - `watch`: chunked watch streams, bookmarks, ERROR 410 for a compacted version.
//! - `select`: label and field selectors.
//! - `tokenreview`: TokenReview answers from registered tokens ([`TokenIdentity`]).
//! - `proxy`: the pods/proxy subresource, forwarded to the pod's `podIP` and port.
//! - `server`: TLS, the caller's bearer token, routing; `tls`: the test CA.
//!
//! What it does not do: writes over HTTP other than TokenReviews (tests write through
//! [`FakeKube::apply`] and [`FakeKube::delete`]), subresources other than a `GET` through
//! pods/proxy, protobuf, discovery
//! (`/api`, `/apis`), finalizers and graceful deletion, RBAC (one caller token is
//! allowed everything, but for the resources a test forbids), admission defaults.

mod list;
mod proxy;
mod resource;
mod select;
mod server;
mod status;
mod store;
mod tls;
mod tokenreview;
mod watch;

pub use resource::ResourceType;
pub use status::Failure;
pub use tokenreview::{
    TokenIdentity, API_AUDIENCE, CREDENTIAL_ID_EXTRA, NODE_NAME_EXTRA, POD_NAME_EXTRA,
    POD_UID_EXTRA,
};

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use store::Store;
use tokio::task::JoinHandle;

/// How a fake API server behaves.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How often an open watch that allows bookmarks gets one (the API server: about a
    /// minute).
    pub bookmark_interval: Duration,
    /// The bearer token every caller must present.
    pub control_token: String,
    /// Whether Gateway API's route CRDs are installed ([`ResourceType::gateway`]); without
    /// them their paths answer 404, as on a cluster without them, until
    /// [`FakeKube::register`] installs them.
    pub gateway_api: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            bookmark_interval: Duration::from_secs(1),
            control_token: "fake-kube-control-plane-token".into(),
            gateway_api: true,
        }
    }
}

/// One request the fake answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The path and query, as sent.
    pub uri: String,
    /// The API server's verb: `get`, `list`, `watch`, `create`, ...
    pub verb: String,
    /// The resource's plural (`pods`, `tokenreviews`).
    pub resource: String,
    /// The answer's status code.
    pub status: u16,
}

/// What the server's tasks share with the handle.
#[derive(Debug)]
pub(crate) struct Shared {
    store: Mutex<Store>,
    tokens: Mutex<HashMap<String, TokenIdentity>>,
    /// Resources (plurals) every request for is answered 403, as RBAC would.
    forbidden: Mutex<HashSet<String>>,
    requests: Mutex<Vec<RequestRecord>>,
    token_reviews: AtomicUsize,
    bookmarks: AtomicUsize,
    open_watches: AtomicUsize,
    /// Bumped to end every open watch stream.
    drop_watches: tokio::sync::watch::Sender<u64>,
    /// Bumped to close every connection.
    sever: tokio::sync::watch::Sender<u64>,
    /// While set, connections are closed as soon as they are accepted.
    down: AtomicBool,
    settings: Settings,
}

impl Shared {
    fn lock_store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is_forbidden(&self, resource: &str) -> bool {
        self.forbidden
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(resource)
    }

    fn record(&self, request: RequestRecord) {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(request);
    }
}

/// A fake API server on a loopback port; it stops when dropped.
#[derive(Debug)]
pub struct FakeKube {
    shared: Arc<Shared>,
    addr: SocketAddr,
    ca_pem: String,
    accept: JoinHandle<()>,
}

impl FakeKube {
    /// Starts a fake with the default [`Settings`].
    pub async fn start() -> Self {
        Self::start_with(Settings::default()).await
    }

    /// Starts a fake that behaves as `settings` say.
    pub async fn start_with(settings: Settings) -> Self {
        let (ca_pem, tls) = tls::server_config();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut store = Store::new();
        if settings.gateway_api {
            for ty in ResourceType::gateway() {
                store.register(ty);
            }
        }
        let shared = Arc::new(Shared {
            store: Mutex::new(store),
            tokens: Mutex::default(),
            forbidden: Mutex::default(),
            requests: Mutex::default(),
            token_reviews: AtomicUsize::new(0),
            bookmarks: AtomicUsize::new(0),
            open_watches: AtomicUsize::new(0),
            drop_watches: tokio::sync::watch::channel(0).0,
            sever: tokio::sync::watch::channel(0).0,
            down: AtomicBool::new(false),
            settings,
        });
        let accept = tokio::spawn(server::serve(
            listener,
            tokio_rustls::TlsAcceptor::from(tls),
            shared.clone(),
        ));
        Self {
            shared,
            addr,
            ca_pem,
            accept,
        }
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The CA that signed the server's certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The bearer token callers must present.
    pub fn control_token(&self) -> &str {
        &self.shared.settings.control_token
    }

    /// A kubeconfig (server, CA, token) for this fake, as a JSON value.
    pub fn kubeconfig_value(&self) -> Value {
        let ca = serde_json::to_value(k8s_openapi::ByteString(self.ca_pem.clone().into_bytes()))
            .unwrap();
        json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {
                "server": self.url(),
                "certificate-authority-data": ca,
            }}],
            "users": [{"name": "fake", "user": {"token": self.control_token()}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
            "current-context": "fake",
        })
    }

    /// Writes the kubeconfig to `path` (JSON, which is YAML) for a control plane to use.
    pub fn kubeconfig(&self, path: &Path) {
        std::fs::write(path, self.kubeconfig_value().to_string()).unwrap();
    }

    /// A kube-rs client configured from the kubeconfig, as `--kubeconfig` would be.
    pub async fn client(&self) -> ::kube::Client {
        let file: ::kube::config::Kubeconfig =
            serde_json::from_value(self.kubeconfig_value()).unwrap();
        let config = ::kube::Config::from_custom_kubeconfig(
            file,
            &::kube::config::KubeConfigOptions::default(),
        )
        .await
        .unwrap();
        ::kube::Client::try_from(config).unwrap()
    }

    /// Serves one more kind, as installing its CRD does (clients that got 404 for it find
    /// it on their next request).
    pub fn register(&self, ty: ResourceType) {
        self.shared.lock_store().register(ty);
    }

    /// Creates or updates `object` (an ADDED or MODIFIED event at a new resourceVersion;
    /// nothing when it would not change); returns it as stored, with `uid`,
    /// `resourceVersion`, `creationTimestamp` and `generation`. A namespaced object
    /// needs its Namespace applied first, as on the API server.
    pub fn apply(&self, object: Value) -> Value {
        self.shared.lock_store().apply(object)
    }

    /// [`Self::apply`] for a typed object (k8s-openapi's, or a kube `CustomResource`).
    pub fn apply_object<K: Serialize + DeserializeOwned>(&self, object: &K) -> K {
        serde_json::from_value(self.apply(serde_json::to_value(object).unwrap())).unwrap()
    }

    /// Deletes `kind` (`Pod`, `pods` or `pods.` plus group) `namespace/name` (namespace
    /// `""` for cluster-scoped kinds): a DELETED event; a Namespace takes its objects
    /// with it. Whether it was there.
    pub fn delete(&self, kind: &str, namespace: &str, name: &str) -> bool {
        let mut store = self.shared.lock_store();
        let kind = store.find_named(kind);
        store.delete(kind, &store::key(namespace, name))
    }

    /// The stored object, if any.
    pub fn get(&self, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let store = self.shared.lock_store();
        let kind = store.find_named(kind);
        store.get(kind, &store::key(namespace, name)).cloned()
    }

    /// [`Self::get`] for a typed object.
    pub fn get_object<K>(&self, namespace: &str, name: &str) -> Option<K>
    where
        K: ::kube::Resource<DynamicType = ()> + DeserializeOwned,
    {
        self.get(&typed_name::<K>(), namespace, name)
            .map(|o| serde_json::from_value(o).unwrap())
    }

    /// [`Self::delete`] for a typed kind.
    pub fn delete_object<K: ::kube::Resource<DynamicType = ()>>(
        &self,
        namespace: &str,
        name: &str,
    ) -> bool {
        self.delete(&typed_name::<K>(), namespace, name)
    }

    /// The newest resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock_store().rv()
    }

    /// Compacts history, as etcd does: advances the resourceVersion (as a real
    /// cluster's Lease and Event writes always would) and forgets every change, so that
    /// every version handed out so far — in a list, an event, a bookmark, a continue
    /// token — answers 410 Gone. Open watches carry on.
    pub fn compact(&self) {
        self.shared.lock_store().compact();
    }

    /// Ends every open watch stream cleanly (as their `timeoutSeconds` would).
    pub fn drop_watches(&self) {
        // Under the store's lock, so that no watch sends a bookmark after this.
        let _store = self.shared.lock_store();
        self.shared.drop_watches.send_modify(|n| *n += 1);
    }

    /// An API server restart: every connection is cut (watches with them) and history
    /// is compacted (the new watch cache starts at the current version), so every
    /// watcher's next watch gets 410 and re-lists.
    pub fn restart(&self) {
        let mut store = self.shared.lock_store();
        store.compact();
        self.shared.drop_watches.send_modify(|n| *n += 1);
        self.shared.sever.send_modify(|n| *n += 1);
    }

    /// Starts an outage: every connection is cut and new ones are closed as soon as
    /// they are accepted, until [`Self::come_up`]. Writes through the handle still work
    /// (they happen "in etcd" meanwhile).
    pub fn go_down(&self) {
        self.shared.down.store(true, Ordering::SeqCst);
        let _store = self.shared.lock_store();
        self.shared.drop_watches.send_modify(|n| *n += 1);
        self.shared.sever.send_modify(|n| *n += 1);
    }

    /// Ends an outage (call [`Self::compact`] first to make it a restart that lost the
    /// watch cache's history).
    pub fn come_up(&self) {
        self.shared.down.store(false, Ordering::SeqCst);
    }

    /// Registers `token` as standing for `identity` in TokenReviews.
    pub fn add_token(&self, token: &str, identity: TokenIdentity) {
        self.shared
            .tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(token.into(), identity);
    }

    /// Registers `token` as the token a kubelet projects into pod `namespace/pod` (which
    /// must be stored) for `audiences`: its ServiceAccount, bound to the pod's name and
    /// UID, with its node. Returns the identity.
    pub fn add_pod_token(
        &self,
        token: &str,
        namespace: &str,
        pod: &str,
        audiences: &[&str],
    ) -> TokenIdentity {
        let identity = TokenIdentity::of_pod(&self.shared.lock_store(), namespace, pod, audiences);
        self.add_token(token, identity.clone());
        identity
    }

    /// Answers every request for `resource` (a plural: `httproutes`) 403 Forbidden, as a
    /// caller's missing RBAC rule would, until [`Self::allow`].
    pub fn forbid(&self, resource: &str) {
        self.shared
            .forbidden
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(resource.into());
    }

    /// Serves `resource` again after [`Self::forbid`].
    pub fn allow(&self, resource: &str) {
        self.shared
            .forbidden
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(resource);
    }

    /// Forgets `token` (reviews of it fail from now on).
    pub fn remove_token(&self, token: &str) {
        self.shared
            .tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(token);
    }

    /// How many TokenReviews were answered.
    pub fn token_reviews(&self) -> usize {
        self.shared.token_reviews.load(Ordering::SeqCst)
    }

    /// How many requests had `verb` (`list`, `watch`, `get`, `create`) on `resource`
    /// (`pods`, `tokenreviews`).
    pub fn requests(&self, verb: &str, resource: &str) -> usize {
        self.request_log()
            .iter()
            .filter(|r| r.verb == verb && r.resource == resource)
            .count()
    }

    /// Every request answered so far, in order.
    pub fn request_log(&self) -> Vec<RequestRecord> {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// How many bookmarks were sent.
    pub fn bookmarks_sent(&self) -> usize {
        self.shared.bookmarks.load(Ordering::SeqCst)
    }

    /// How many watch streams are open now.
    pub fn open_watches(&self) -> usize {
        self.shared.open_watches.load(Ordering::SeqCst)
    }

    /// Waits until at least `n` watch streams are open (at most 10 s).
    pub async fn wait_for_watches(&self, n: usize) {
        for _ in 0..1000 {
            if self.open_watches() >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "fake kube: {} watches open, {n} expected",
            self.open_watches()
        );
    }
}

/// `plural.group`, or `plural` for the core group.
fn typed_name<K: ::kube::Resource<DynamicType = ()>>() -> String {
    let group = K::group(&());
    if group.is_empty() {
        K::plural(&()).into_owned()
    } else {
        format!("{}.{group}", K::plural(&()))
    }
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        self.accept.abort();
        self.shared.drop_watches.send_modify(|n| *n += 1);
        self.shared.sever.send_modify(|n| *n += 1);
    }
}
