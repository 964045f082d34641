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

use super::metrics::KubeMetrics;
use crate::auth::{token_digest, AuthFuture, NodeAuthenticator, Refusal};
use crate::index::SharedIndex;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::Api;
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;
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

/// A review's answer and until when it is reused.
type CachedAnswer = (Instant, Result<String, Refusal>);

/// Who node proxies are and how to ask the API server.
pub struct TokenReviewAuth {
    client: kube::Client,
    audience: String,
    /// The node proxies' ServiceAccount, (namespace, name).
    proxy_account: (String, String),
    index: SharedIndex,
    ttl: Duration,
    cache: Mutex<HashMap<[u8; 32], CachedAnswer>>,
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
            cache: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    async fn check(&self, token: &str) -> Result<String, Refusal> {
        let key = token_digest(token);
        if let Some(answer) = self.cached(&key) {
            self.metrics.token_review("cached");
            return answer;
        }
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
        cache
            .get(key)
            .filter(|(expires, _)| *expires > Instant::now())
            .map(|(_, answer)| answer.clone())
    }

    fn remember(&self, key: [u8; 32], ttl: Duration, answer: Result<String, Refusal>) {
        let now = Instant::now();
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.len() >= CACHE_CAPACITY {
            cache.retain(|_, (expires, _)| *expires > now);
        }
        if cache.len() >= CACHE_CAPACITY {
            if let Some(oldest) = cache.iter().min_by_key(|(_, (e, _))| *e).map(|(k, _)| *k) {
                cache.remove(&oldest);
            }
        }
        cache.insert(key, (now + ttl, answer));
    }

    async fn review(&self, token: &str) -> Result<String, Refusal> {
        let status = self.ask(token).await?;
        let (ns, sa) = self.proxy_account_of(&status)?;
        let extra = |key: &str| {
            status
                .user
                .as_ref()
                .and_then(|u| u.extra.as_ref())
                .and_then(|e| e.get(key))
                .and_then(|v| v.first())
                .cloned()
                .filter(|v| !v.is_empty())
        };
        let (Some(pod_name), Some(pod_uid)) = (extra(POD_NAME_EXTRA), extra(POD_UID_EXTRA)) else {
            return Err(Refusal::denied(
                "not_bound_to_pod",
                format!("the token of {ns}/{sa} is not bound to a pod; mount a projected ServiceAccount token (audience {:?}) in the node proxy", self.audience),
            ));
        };
        let (uid, node) = self.pod(&ns, &pod_name).await?;
        if uid.as_deref() != Some(pod_uid.as_str()) {
            return Err(Refusal::denied(
                "pod_uid_mismatch",
                format!("the token was issued to an earlier pod named {ns}/{pod_name} (UID {pod_uid}); the proxy must re-read its token"),
            ));
        }
        let Some(node) = node else {
            return Err(Refusal::denied(
                "pod_not_scheduled",
                format!("pod {ns}/{pod_name} is not scheduled on a node"),
            ));
        };
        if let Some(claimed) = extra(NODE_NAME_EXTRA) {
            if claimed != node {
                return Err(Refusal::denied(
                    "node_mismatch",
                    format!(
                        "the token names node {claimed} but pod {ns}/{pod_name} runs on {node}"
                    ),
                ));
            }
        }
        Ok(node)
    }

    /// Asks the API server; `Unavailable` when it cannot answer, `Unauthenticated` when
    /// it does not vouch for the token for our audience.
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
        let status = answer.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            let why = status.error.unwrap_or_else(|| "no reason given".into());
            return Err(Refusal::unauthenticated(
                "token_rejected",
                format!(
                    "the API server does not accept the node token for audience {:?}: {why}",
                    self.audience
                ),
            ));
        }
        let audiences = status.audiences.as_deref().unwrap_or_default();
        if !audiences.is_empty() && !audiences.contains(&self.audience) {
            return Err(Refusal::unauthenticated(
                "wrong_audience",
                format!("the node token is not for audience {:?}", self.audience),
            ));
        }
        Ok(status)
    }

    /// The reviewed user as (namespace, ServiceAccount), if it is the node proxies'.
    fn proxy_account_of(&self, status: &TokenReviewStatus) -> Result<(String, String), Refusal> {
        let username = status
            .user
            .as_ref()
            .and_then(|u| u.username.as_deref())
            .unwrap_or_default();
        let Some((ns, sa)) = username
            .strip_prefix("system:serviceaccount:")
            .and_then(|rest| rest.split_once(':'))
        else {
            return Err(Refusal::denied(
                "not_a_service_account",
                format!(
                    "{username:?} is not a ServiceAccount; node proxies authenticate as {}/{}",
                    self.proxy_account.0, self.proxy_account.1
                ),
            ));
        };
        if (ns, sa) != (self.proxy_account.0.as_str(), self.proxy_account.1.as_str()) {
            return Err(Refusal::denied(
                "wrong_service_account",
                format!("ServiceAccount {ns}/{sa} is not the node proxies' ({}/{}); only node proxies may ask for certificates", self.proxy_account.0, self.proxy_account.1),
            ));
        }
        Ok((ns.to_string(), sa.to_string()))
    }

    /// The pod's UID and node: from the index, else (a proxy pod newer than the watch)
    /// from the API server.
    async fn pod(&self, ns: &str, name: &str) -> Result<(Option<String>, Option<String>), Refusal> {
        if let Some(w) = self.index.read().workload_by_name(ns, name) {
            return Ok((w.pod.uid, w.pod.node_name));
        }
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
