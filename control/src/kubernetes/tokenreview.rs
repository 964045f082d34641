//! Node authentication by TokenReview, as istiod authenticates ztunnel.
//!
//! A node proxy sends its projected ServiceAccount token (audience `ambit`). The control
//! plane asks the API server to review it for that audience, requires the node proxies'
//! own ServiceAccount, takes the pod the token is bound to from the review's
//! `authentication.kubernetes.io/pod-name` / `pod-uid` extras, looks that pod up, checks
//! its UID, and takes the node from its `spec.nodeName`. Where the review also names a
//! node (`authentication.kubernetes.io/node-name`, Kubernetes 1.32+), it must agree.
//!
//! Answers are cached for a short while, keyed by the SHA-256 of the token (the token
//! itself is never kept), in a bounded map, so that certificate renewals do not each cost
//! an API call. "The API server could not be asked" is never cached.

use super::cache::ReviewCache;
use super::metrics::KubeMetrics;
use crate::auth::{token_digest, AuthFuture, NodeAuthenticator, Refusal};
use crate::index::SharedIndex;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::Api;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::OnceCell;
use tokio::time::Instant;

/// Extra of a bound token: the pod's name.
pub const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";
/// Extra of a bound token: the pod's UID.
pub const POD_UID_EXTRA: &str = "authentication.kubernetes.io/pod-uid";
/// Extra of a bound token: the node the pod runs on (Kubernetes 1.32+).
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// The most answers kept; beyond, expired ones go first, then the oldest.
const CACHE_CAPACITY: usize = 4096;
/// The longest a refusal is reused (a fixed token should work again soon).
const REFUSAL_TTL: Duration = Duration::from_secs(5);

/// A review in progress; every check of the same token waits for its answer.
type Flight = OnceCell<Result<String, Refusal>>;

/// Who node proxies are and how to ask the API server.
pub struct TokenReviewAuth {
    client: kube::Client,
    audience: String,
    /// The node proxies' ServiceAccount, (namespace, name).
    proxy_account: (String, String),
    index: SharedIndex,
    ttl: Duration,
    cache: Mutex<ReviewCache>,
    /// Reviews in progress, by token digest, which concurrent checks of the same token
    /// wait for instead of asking again.
    inflight: Mutex<HashMap<[u8; 32], Arc<Flight>>>,
    metrics: KubeMetrics,
}

impl TokenReviewAuth {
    /// Reviews tokens for `audience`, accepting only `proxy_account`'s.
    pub fn new(
        client: kube::Client,
        audience: String,
        proxy_account: (String, String),
        index: SharedIndex,
        ttl: Duration,
        metrics: KubeMetrics,
    ) -> Self {
        Self {
            client,
            audience,
            proxy_account,
            index,
            ttl,
            cache: Mutex::new(ReviewCache::new(CACHE_CAPACITY)),
            inflight: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    async fn check(&self, token: &str) -> Result<String, Refusal> {
        let key = token_digest(token);
        if let Some(answer) = self.cached(&key) {
            self.metrics.token_review("cached");
            return answer;
        }
        // One review per token at a time: a proxy starting up sends its discovery watch
        // and a certificate request per identity at once, all with the same token.
        let flight = {
            let mut inflight = self.inflight.lock().unwrap_or_else(PoisonError::into_inner);
            inflight.entry(key).or_default().clone()
        };
        let mut reviewed_here = false;
        let answer = flight
            .get_or_init(|| {
                reviewed_here = true;
                self.review_and_remember(token, key)
            })
            .await
            .clone();
        let mut inflight = self.inflight.lock().unwrap_or_else(PoisonError::into_inner);
        if inflight.get(&key).is_some_and(|f| Arc::ptr_eq(f, &flight)) {
            inflight.remove(&key);
        }
        if !reviewed_here {
            self.metrics.token_review("shared");
        }
        answer
    }

    /// Reviews `token` and keeps the answer (not "could not ask": that is retried).
    async fn review_and_remember(&self, token: &str, key: [u8; 32]) -> Result<String, Refusal> {
        let answer = self.review(token).await;
        if matches!(&answer, Err(r) if r.code == tonic::Code::Unavailable) {
            self.metrics.token_review("failed");
            return answer;
        }
        self.metrics.token_review("reviewed");
        let ttl = if answer.is_ok() {
            self.ttl
        } else {
            self.ttl.min(REFUSAL_TTL)
        };
        self.remember(key, ttl, answer.clone());
        answer
    }

    fn cached(&self, key: &[u8; 32]) -> Option<Result<String, Refusal>> {
        let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        cache.get(key, Instant::now())
    }

    fn remember(&self, key: [u8; 32], ttl: Duration, answer: Result<String, Refusal>) {
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        cache.put(key, answer, ttl, Instant::now());
    }

    async fn review(&self, token: &str) -> Result<String, Refusal> {
        let status = self.ask(token).await?;
        let claim = judge(&status, &self.audience, &self.proxy_account)?;
        let (uid, node) = self.pod(&claim).await?;
        bind(&claim, uid.as_deref(), node)
    }

    /// Asks the API server; `Unavailable` when it cannot answer.
    async fn ask(&self, token: &str) -> Result<TokenReviewStatus, Refusal> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: Some(vec![self.audience.clone()]),
            },
            ..TokenReview::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "TokenReview failed");
                Refusal::unavailable(
                    "token_review_failed",
                    format!("cannot check the node token with the API server now ({e}); retry"),
                )
            })?;
        Ok(answer.status.unwrap_or_default())
    }

    /// The UID and node of the claim's pod: from the index when it agrees with the
    /// token, else (a pod newer than the watch, or an index that is behind) from the API
    /// server, so that a stale index never refuses a good token.
    async fn pod(&self, claim: &Claim) -> Result<(Option<String>, Option<String>), Refusal> {
        let indexed = self
            .index
            .read()
            .workload_by_name(&claim.namespace, &claim.pod_name)
            .map(|w| (w.pod.uid, w.pod.node_name));
        if let Some((Some(uid), Some(node))) = &indexed {
            if *uid == claim.pod_uid {
                return Ok((Some(uid.clone()), Some(node.clone())));
            }
        }
        let (ns, name) = (&claim.namespace, &claim.pod_name);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        match api.get_opt(name).await {
            Ok(Some(pod)) => Ok((
                pod.metadata.uid,
                pod.spec.and_then(|s| s.node_name).filter(|n| !n.is_empty()),
            )),
            Ok(None) => Err(Refusal::denied(
                "pod_not_found",
                format!("the token's pod {ns}/{name} does not exist"),
            )),
            Err(e) => Err(Refusal::unavailable(
                "pod_lookup_failed",
                format!("cannot look up pod {ns}/{name} now ({e}); retry"),
            )),
        }
    }
}

/// What a reviewed token claims: the proxies' ServiceAccount, bound to a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Claim {
    namespace: String,
    pod_name: String,
    pod_uid: String,
    /// The `node-name` extra (Kubernetes 1.32+), if the review carries it.
    node: Option<String>,
}

/// Judges a review: authenticated for `audience` (listed explicitly: an empty list means
/// the API server's own audience), the proxies' ServiceAccount, bound to a pod.
fn judge(
    status: &TokenReviewStatus,
    audience: &str,
    proxy_account: &(String, String),
) -> Result<Claim, Refusal> {
    if status.authenticated != Some(true) {
        let why = status.error.as_deref().unwrap_or("no reason given");
        return Err(Refusal::unauthenticated(
            "token_rejected",
            format!(
                "the API server does not accept the node token for audience {audience:?}: {why}"
            ),
        ));
    }
    if !status.audiences.iter().flatten().any(|a| a == audience) {
        return Err(Refusal::unauthenticated(
            "wrong_audience",
            format!("the node token is not for audience {audience:?}; project the proxy's token with `audience: {audience}`"),
        ));
    }
    let user = status.user.as_ref();
    let username = user.and_then(|u| u.username.as_deref()).unwrap_or_default();
    let (want_ns, want_sa) = proxy_account;
    let Some((ns, sa)) = username
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
    else {
        return Err(Refusal::denied(
            "not_a_service_account",
            format!("{username:?} is not a ServiceAccount; node proxies authenticate as {want_ns}/{want_sa}"),
        ));
    };
    if (ns, sa) != (want_ns.as_str(), want_sa.as_str()) {
        return Err(Refusal::denied(
            "wrong_service_account",
            format!("ServiceAccount {ns}/{sa} is not the node proxies' ({want_ns}/{want_sa}); only node proxies may ask for certificates"),
        ));
    }
    let extra = |key: &str| {
        user.and_then(|u| u.extra.as_ref())
            .and_then(|e| e.get(key))
            .and_then(|v| v.first())
            .filter(|v| !v.is_empty())
            .cloned()
    };
    let (Some(pod_name), Some(pod_uid)) = (extra(POD_NAME_EXTRA), extra(POD_UID_EXTRA)) else {
        return Err(Refusal::denied(
            "not_bound_to_pod",
            format!("the token of {ns}/{sa} is not bound to a pod; mount a projected ServiceAccount token (audience {audience:?}) in the node proxy"),
        ));
    };
    Ok(Claim {
        namespace: ns.to_string(),
        pod_name,
        pod_uid,
        node: extra(NODE_NAME_EXTRA),
    })
}

/// The node of the claim's pod, given the pod's current UID and node.
fn bind(claim: &Claim, uid: Option<&str>, node: Option<String>) -> Result<String, Refusal> {
    let (ns, pod) = (&claim.namespace, &claim.pod_name);
    if uid != Some(claim.pod_uid.as_str()) {
        return Err(Refusal::denied(
            "pod_uid_mismatch",
            format!("the token was issued to an earlier pod named {ns}/{pod} (UID {}); the proxy must re-read its token", claim.pod_uid),
        ));
    }
    let Some(node) = node else {
        return Err(Refusal::denied(
            "pod_not_scheduled",
            format!("pod {ns}/{pod} is not scheduled on a node"),
        ));
    };
    if let Some(claimed) = &claim.node {
        if *claimed != node {
            return Err(Refusal::denied(
                "node_mismatch",
                format!("the token names node {claimed} but pod {ns}/{pod} runs on {node}"),
            ));
        }
    }
    Ok(node)
}

impl std::fmt::Debug for TokenReviewAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReviewAuth")
            .field("audience", &self.audience)
            .field("proxy_account", &self.proxy_account)
            .finish_non_exhaustive()
    }
}

impl NodeAuthenticator for TokenReviewAuth {
    fn authenticate<'a>(&'a self, token: &'a str) -> AuthFuture<'a> {
        Box::pin(self.check(token))
    }
}

#[cfg(test)]
mod tests;
