//! One kind's watch: a kube-rs watcher (list, then watch; a re-list after a 410 Gone or a
//! lost connection, with kube-rs's default backoff) feeding the index.
//!
//! The initial list and every re-list replace that kind in the index at once
//! ([`SharedIndex::reset`]), so objects deleted while the watch was down disappear and
//! other kinds are untouched. An object the mesh cannot use is skipped, logged with its
//! kind, namespace, name and field, and counted; it never stops the watch. An update that
//! does not convert leaves the object's last good version in place.
//!
//! Gateway API's CRDs are optional (`installGatewayAPI` in the ambit-crds chart): while
//! the API server answers 404 for a route kind, the kind is empty and counts as listed
//! for `/ready`, which is logged once; kube-rs's backoff keeps retrying the list (every
//! 30 s at most), so routes appear without a restart once the CRDs are installed.

use super::metrics::KubeMetrics;
use crate::index::{Kind, KubeObject, SharedIndex};
use crate::ready::Readiness;
use futures::{Stream, StreamExt, TryStreamExt};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use std::fmt::Debug;

/// What every kind's watch shares.
#[derive(Clone, Debug)]
pub(super) struct WatchContext {
    pub(super) index: SharedIndex,
    pub(super) metrics: KubeMetrics,
    pub(super) ready: Readiness,
}

/// A watch error, and whether it says the kind is not served at all (404: no CRD).
pub(super) trait WatchError: std::fmt::Display {
    /// The API server does not serve the kind.
    fn not_served(&self) -> bool {
        false
    }
}

impl WatchError for String {}

impl WatchError for watcher::Error {
    fn not_served(&self) -> bool {
        match self {
            watcher::Error::InitialListFailed(kube::Error::Api(s))
            | watcher::Error::WatchStartFailed(kube::Error::Api(s)) => s.code == 404,
            _ => false,
        }
    }
}

/// What `/ready` waits for until `kind` has been listed once.
pub(super) fn pending_label(kind: Kind) -> String {
    if kind.is_gateway() {
        // Optional: a 404 marks it done (see the module's doc); other errors (RBAC) wait.
        format!(
            "initial list of {kind} from the API server (Gateway API's CRD, optional: ambit-crds installGatewayAPI)"
        )
    } else if kind.is_policy() {
        // Listing fails (404) until the CRDs are installed: say where they come from.
        format!(
            "initial list of {kind} from the API server (its CRD comes with the ambit-crds chart)"
        )
    } else {
        format!("initial list of {kind} from the API server")
    }
}

/// Watches `api` until the stream ends (it does not: errors are retried with backoff).
pub(super) async fn watch<K>(api: Api<K>, kind: Kind, wrap: fn(K) -> KubeObject, cx: WatchContext)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let events = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .map_ok(move |event| match event {
            Event::Apply(o) => Event::Apply(wrap(o)),
            Event::Delete(o) => Event::Delete(wrap(o)),
            Event::Init => Event::Init,
            Event::InitApply(o) => Event::InitApply(wrap(o)),
            Event::InitDone => Event::InitDone,
        });
    follow(events, kind, &cx).await;
}

/// Applies one kind's watch events to the index until they end.
pub(super) async fn follow<E: WatchError>(
    events: impl Stream<Item = Result<Event<KubeObject>, E>>,
    kind: Kind,
    cx: &WatchContext,
) {
    futures::pin_mut!(events);
    let mut listed_once = false;
    let mut buffer: Vec<KubeObject> = Vec::new();
    // An optional kind whose CRD is not installed (logged once, until it is).
    let mut not_served = false;
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Init) => buffer.clear(),
            Ok(Event::InitApply(obj)) => buffer.push(obj),
            Ok(Event::InitDone) => {
                let objects = std::mem::take(&mut buffer);
                let n = objects.len();
                for e in cx.index.reset(kind, objects) {
                    skipped(cx, kind, &e);
                }
                if listed_once {
                    tracing::info!(%kind, objects = n, "re-listed");
                    cx.metrics.restarted(kind);
                } else {
                    tracing::info!(%kind, objects = n, "listed");
                }
                listed_once = true;
                not_served = false;
                cx.ready.done(&pending_label(kind));
            }
            Ok(Event::Apply(obj)) => {
                if let Err(e) = cx.index.apply(obj) {
                    skipped(cx, kind, &e);
                }
            }
            Ok(Event::Delete(obj)) => cx.index.delete(&obj.object_ref()),
            Err(error) if kind.is_gateway() && error.not_served() => {
                if !not_served {
                    tracing::warn!(%kind, %error, "Gateway API's CRD is not installed: no {kind} is served until it is (the list is retried); install it with the ambit-crds chart (installGatewayAPI=true) or Gateway API's release");
                    not_served = true;
                    cx.index.reset(kind, []);
                    cx.ready.done(&pending_label(kind));
                }
                cx.metrics.error(kind);
            }
            Err(error) => {
                // kube-rs retries with backoff; a 410 Gone starts a re-list (Event::Init).
                tracing::warn!(%kind, %error, "watch error; retrying");
                cx.metrics.error(kind);
            }
        }
        cx.metrics.set_objects(kind, cx.index.read().count(kind));
    }
}

fn skipped(cx: &WatchContext, kind: Kind, e: &crate::index::ConvertError) {
    tracing::warn!(%kind, object = %e.object, field = %e.field, message = %e.message, "skipping an object the mesh cannot use");
    cx.metrics.invalid(kind);
}

#[cfg(test)]
mod tests;
