//! Outbound routing of one HTTP request to a Service with routes (HTTPRoute, GRPCRoute,
//! or the Service's own annotations): the first rule that matches, then for each try one
//! of its backends by weight and an endpoint by the balancer; the rule's timeouts,
//! retries within the route's budget, header modifiers and route metrics. A Service
//! without routes is served as before: every request, once, to its endpoints.

use super::body::{self, Body};
use super::http::{error_response, try_once};
use super::http_metrics::ConnectionSeries;
use super::resolve::{Resolved, ServicePort};
use super::retry::{backoff, retryable, NotReplayable, Replay};
use super::route_metrics::{NotRetried, RouteCache, RouteLabels};
use super::{PodContext, ProxyError, Shared};
use crate::policy::routes::{select, Backend, RequestParts, Rule};
use http::request::Parts;
use http::{Request, Response};
use std::borrow::Cow;
use std::sync::Arc;

/// The rule of `original`'s Service port that matches `req`: None when the destination is
/// not a Service or its port has no routes; an error (404) when it has and none matches.
pub(super) fn rule<B>(
    req: &Request<B>,
    original: &Resolved,
    shared: &Shared,
) -> Result<Option<Arc<Rule>>, ProxyError> {
    let Some(svc) = &original.service else {
        return Ok(None);
    };
    let routes = shared.policy.borrow().routes(&svc.namespace, &svc.name);
    let Some(rules) = routes.as_ref().and_then(|r| r.port(svc.port)) else {
        return Ok(None);
    };
    let rule = select(rules, &RequestParts::of(req)).ok_or_else(|| {
        ProxyError::NoRoute(format!(
            "no route of Service {}/{} port {} matches {} {}",
            svc.namespace,
            svc.name,
            svc.port,
            req.method(),
            req.uri().path()
        ))
    })?;
    Ok(Some(rule.clone()))
}

/// Where one try goes: a backend of `rule` by weight (None: the parent Service,
/// `original`), resolved to its endpoints — the parent's own resolution when the backend
/// is the parent.
pub(super) async fn backend<'a>(
    rule: Option<&Rule>,
    original: &'a Resolved,
    shared: &Shared,
) -> Result<(Option<Backend>, Cow<'a, Resolved>), ProxyError> {
    let Some(rule) = rule else {
        return Ok((None, Cow::Borrowed(original)));
    };
    if rule.has_no_usable_backend() {
        return Err(ProxyError::BadRoute(format!(
            "every backend of {} {}/{} has weight 0",
            rule.route_kind, rule.route_namespace, rule.route_name
        )));
    }
    let Some(b) = rule.backend(fastrand::f64()) else {
        return Ok((None, Cow::Borrowed(original)));
    };
    let parent = original
        .service
        .as_ref()
        .is_some_and(|s| s.namespace == b.namespace && s.name == b.name && s.port == b.port);
    if parent {
        return Ok((Some(b.clone()), Cow::Borrowed(original)));
    }
    let resolved = Resolved::service(&b.namespace, &b.name, b.port, shared)
        .await?
        .ok_or_else(|| {
            // Gateway API: a request drawn to an invalid backend gets 500.
            ProxyError::BadRoute(format!(
                "backend Service {}/{} port {} of {} {}/{} does not exist",
                b.namespace, b.name, b.port, rule.route_kind, rule.route_namespace, rule.route_name
            ))
        })?;
    Ok((Some(b.clone()), Cow::Owned(resolved)))
}

/// A request on its way through a route.
pub(super) struct Trying<'a> {
    pub rule: Arc<Rule>,
    pub original: &'a Resolved,
    pub dst_service: &'a super::metrics::DstService,
    pub pod: &'a PodContext,
    pub shared: &'a Shared,
    pub conn_series: &'a ConnectionSeries,
    /// The route metrics' handles this connection has used.
    pub cache: &'a RouteCache,
}

impl Trying<'_> {
    /// Sends the request (its request header modifier already applied) as the rule says
    /// and returns the response to give the application.
    pub async fn serve(self, parts: Parts, body: Body) -> Response<Body> {
        let Some(parent) = self.original.service.clone() else {
            // Only a Service has routes.
            return error_response(&ProxyError::Internal("a route without a Service".into()));
        };
        let rule = self.rule.clone();
        // A GRPCRoute's requests, or gRPC on a Service's default rule (its content-type).
        let grpc = rule.grpc || super::classify::is_grpc(&parts.headers);
        let metrics = self
            .cache
            .get(&self.shared.routes, &rule, grpc, || {
                RouteLabels::new(&self.pod.workload, &parent, &rule)
            })
            .request();
        let tries = self.tries(&parent, &metrics, parts, body);
        let started = tokio::time::Instant::now();
        let (mut resp, error, retried) = match rule.timeouts.request {
            None => tries.await,
            Some(d) => tokio::time::timeout(d, tries).await.unwrap_or_else(|_| {
                let e = ProxyError::Timeout(format!(
                    "the request did not complete within the route's timeout of {d:?}"
                ));
                (error_response(&e), Some(e.kind()), false)
            }),
        };
        rule.response_headers.apply(resp.headers_mut());
        if let Some(idle) = rule.timeouts.idle {
            resp = resp.map(|b| body::idle_timeout(b, idle));
        }
        // The request timeout covers the response's body too.
        if let Some(d) = rule.timeouts.request {
            resp = resp.map(|b| body::deadline(b, started + d));
        }
        metrics.finish(resp, error, retried)
    }

    /// Each try in turn, until one is not retried: the response, the error kind when no
    /// upstream response came, and whether it came from a retry.
    async fn tries(
        &self,
        parent: &ServicePort,
        metrics: &super::route_metrics::RouteRequest,
        parts: Parts,
        body: Body,
    ) -> (Response<Body>, Option<&'static str>, bool) {
        let rule = &self.rule;
        let retry = rule.retry.as_ref().filter(|r| r.limit > 0);
        let budget = retry.map(|_| self.shared.budgets.get(parent, rule, &self.pod.workload));
        let (body, replay) = match retry {
            Some(_) => {
                let (b, r) = Replay::record(body);
                (b, Some(r))
            }
            None => (body, None),
        };
        if let Some(b) = &budget {
            b.deposit();
        }
        let mut body = Some(body);
        // The first try sends the request's own head (with its extensions), later ones a
        // copy.
        let template = copy(&parts);
        let mut first = Some(parts);
        let mut n = 0u32;
        loop {
            let (backend, resolved) = match backend(Some(rule), self.original, self.shared).await {
                Ok(b) => b,
                Err(e) => return (error_response(&e), Some(e.kind()), n > 0),
            };
            metrics.backend(backend.as_ref(), parent);
            let head = first.take().unwrap_or_else(|| copy(&template));
            let req = Request::from_parts(head, body.take().unwrap_or_else(body::empty));
            let (resp, error) = try_once(
                req,
                &resolved,
                rule.timeouts.per_try(),
                self.pod,
                self.shared,
                self.conn_series,
                self.dst_service,
            )
            .await;
            let (Some(retry), Some(replay), Some(budget)) = (retry, &replay, &budget) else {
                return (resp, error, false);
            };
            // What the proxy answered itself (no endpoint, an identity it cannot prove, a
            // route that cannot send) is not the upstream's failure: another try would
            // meet the same.
            let upstream = error.is_none_or(|k| matches!(k, "upstream" | "timeout"));
            if !upstream || !retryable(retry, resp.status(), resp.headers()) {
                return (resp, error, n > 0);
            }
            if n >= retry.limit {
                metrics.not_retried(NotRetried::Limit);
                return (resp, error, n > 0);
            }
            let again = match replay.replay() {
                Ok(b) => b,
                Err(NotReplayable::Failed) => return (resp, error, n > 0),
                Err(NotReplayable::TooBig | NotReplayable::Streaming) => {
                    metrics.not_retried(NotRetried::Overflow);
                    return (resp, error, n > 0);
                }
            };
            if !budget.withdraw() {
                metrics.not_retried(NotRetried::Budget);
                return (resp, error, n > 0);
            }
            drop(resp);
            n += 1;
            tokio::time::sleep(backoff(retry.backoff, n, fastrand::f64())).await;
            metrics.retry();
            body = Some(again);
        }
    }
}

/// The request's head again, for another try (extensions are not carried: nothing in a
/// retried request needs them).
fn copy(p: &Parts) -> Parts {
    let mut r = Request::new(());
    *r.method_mut() = p.method.clone();
    *r.uri_mut() = p.uri.clone();
    *r.version_mut() = p.version;
    *r.headers_mut() = p.headers.clone();
    r.into_parts().0
}
