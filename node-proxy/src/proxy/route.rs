//! Outbound routing of one HTTP request to a Service with routes (HTTPRoute, GRPCRoute,
//! or the Service's own annotations): the first rule that matches (of the client's
//! namespace's consumer routes, else the Service's own), then for each try one of its
//! backends by weight and an endpoint by the balancer; the rule's timeouts, retries
//! within the route's budget, filters (header modifiers, a redirect answered here, a
//! rewrite, mirrors sent beside the request and never waited for) and route metrics. A
//! Service without routes is served as before: every request, once, to its endpoints.

use super::body::{self, Body};
use super::http::{error_response, try_once};
use super::http_metrics::ConnectionSeries;
use super::resolve::{Resolved, ServicePort};
use super::retry::{backoff, retryable, NotReplayable, Replay};
use super::route_metrics::{Mirrored, NotRetried, RouteCache, RouteLabels, RouteRequest};
use super::{PodContext, ProxyError, Shared};
use crate::policy::routes::{select, Backend, Mirror, RequestParts, Rule};
use http::request::Parts;
use http::{Request, Response};
use http_body_util::BodyExt;
use std::borrow::Cow;
use std::sync::Arc;

/// The rule of `original`'s Service port that matches `req`: None when the destination is
/// not a Service or its port has no routes; an error (404) when it has and none matches.
pub(super) fn rule<B>(
    req: &Request<B>,
    original: &Resolved,
    client_namespace: &str,
    shared: &Shared,
) -> Result<Option<Arc<Rule>>, ProxyError> {
    let Some(svc) = &original.service else {
        return Ok(None);
    };
    let routes = shared.policy.borrow().routes(&svc.namespace, &svc.name);
    let Some(rules) = routes
        .as_ref()
        .and_then(|r| r.port(client_namespace, svc.port))
    else {
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

/// The rule's request filters that change what is sent: the request header modifier,
/// then the URL rewrite.
pub(super) fn rewrite(rule: &Rule, parts: &mut Parts) {
    rule.request_headers.apply(&mut parts.headers);
    if let Some(rw) = &rule.rewrite {
        rw.apply(parts, rule.matched_prefix());
    }
}

/// Mirrored copies in flight at once, over every pod of the node; beyond, copies are
/// dropped (and counted): a mirror slower than its traffic must not pile up requests.
const MAX_MIRRORS_IN_FLIGHT: usize = 512;
/// How long a mirrored copy may take to its response's headers.
const MIRROR_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
static MIRRORS_IN_FLIGHT: tokio::sync::Semaphore =
    tokio::sync::Semaphore::const_new(MAX_MIRRORS_IN_FLIGHT);

/// A request on its way through a route.
pub(super) struct Trying<'a> {
    pub rule: Arc<Rule>,
    pub original: &'a Resolved,
    pub dst_service: &'a super::metrics::DstService,
    pub pod: &'a Arc<PodContext>,
    pub shared: &'a Arc<Shared>,
    pub conn_series: &'a Arc<ConnectionSeries>,
    /// The route metrics' handles this connection has used.
    pub cache: &'a RouteCache,
}

impl Trying<'_> {
    /// Sends the request (its header modifier and rewrite already applied) as the rule
    /// says — or answers its redirect — and returns the response to give the
    /// application.
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
        if let Some(r) = &rule.redirect {
            let host = parts
                .uri
                .authority()
                .map(|a| a.as_str().to_string())
                .or_else(|| {
                    parts
                        .headers
                        .get(http::header::HOST)
                        .and_then(|h| h.to_str().ok())
                        .map(str::to_string)
                })
                .unwrap_or_else(|| parent.name.clone());
            let location = r.location(
                &host,
                parent.port,
                parts.uri.path(),
                parts.uri.query(),
                rule.matched_prefix(),
            );
            let resp = Response::builder()
                .status(r.status)
                .header(http::header::LOCATION, location)
                .body(body::empty())
                .unwrap_or_else(|e| {
                    error_response(&ProxyError::Internal(format!("redirect: {e}")))
                });
            return metrics.finish(resp, None, false);
        }
        // Mirrors first: a copy without a body goes now, beside the request; one with a
        // body once the request's body has been sent whole (it is recorded, as for a
        // retry), or not at all.
        let mirrors: Vec<_> = rule
            .mirrors
            .iter()
            .filter(|m| m.takes(fastrand::f64()))
            .cloned()
            .collect();
        let bodiless = http_body::Body::is_end_stream(&body);
        let (body, recorded) = if !mirrors.is_empty() && !bodiless && rule.retry.is_none() {
            let (b, r) = Replay::record(body);
            (b, Some(r))
        } else {
            (body, None)
        };
        let heads: Vec<Parts> = mirrors.iter().map(|_| copy(&parts)).collect();
        if bodiless {
            for (m, head) in mirrors.iter().zip(heads.iter()) {
                self.mirror(m, copy(head), body::empty(), &metrics);
            }
        }
        let tries = self.tries(&parent, &metrics, parts, body, recorded.clone());
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
        if !bodiless {
            for (m, head) in mirrors.iter().zip(heads) {
                match recorded.as_ref().map(Replay::replay) {
                    Some(Ok(b)) => self.mirror(m, head, b, &metrics),
                    _ => metrics.mirrored(&m.backend, Mirrored::Dropped),
                }
            }
        }
        metrics.finish(resp, error, retried)
    }

    /// Sends a copy to mirror `m` in a task of its own, its answer read and dropped.
    fn mirror(&self, m: &Mirror, head: Parts, body: Body, metrics: &RouteRequest) {
        let Ok(permit) = MIRRORS_IN_FLIGHT.try_acquire() else {
            metrics.mirrored(&m.backend, Mirrored::Dropped);
            return;
        };
        let (pod, shared, series) = (
            self.pod.clone(),
            self.shared.clone(),
            self.conn_series.clone(),
        );
        let (m, metrics) = (m.clone(), metrics.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let b = &m.backend;
            let sent = async {
                let resolved = Resolved::service(&b.namespace, &b.name, b.port, &shared)
                    .await
                    .ok()
                    .flatten()?;
                let dst = resolved.dst_service();
                let req = Request::from_parts(head, body);
                let (resp, error) = try_once(
                    req,
                    &resolved,
                    Some(MIRROR_TIMEOUT),
                    &pod,
                    &shared,
                    &series,
                    &dst,
                )
                .await;
                if error.is_some() {
                    return None;
                }
                // Read the answer to its end (so that the connection is reused), within the
                // same time.
                let _ = tokio::time::timeout(MIRROR_TIMEOUT, resp.into_body().collect()).await;
                Some(())
            };
            let result = match sent.await {
                Some(()) => Mirrored::Sent,
                None => Mirrored::Failed,
            };
            metrics.mirrored(b, result);
        });
    }

    /// Each try in turn, until one is not retried: the response, the error kind when no
    /// upstream response came, and whether it came from a retry.
    async fn tries(
        &self,
        parent: &ServicePort,
        metrics: &super::route_metrics::RouteRequest,
        parts: Parts,
        body: Body,
        recorded: Option<Replay>,
    ) -> (Response<Body>, Option<&'static str>, bool) {
        let rule = &self.rule;
        let retry = rule.retry.as_ref().filter(|r| r.limit > 0);
        let budget = retry.map(|_| self.shared.budgets.get(parent, rule, &self.pod.workload));
        let (body, replay) = match (retry, recorded) {
            (_, Some(r)) => (body, Some(r)),
            (Some(_), None) => {
                let (b, r) = Replay::record(body);
                (b, Some(r))
            }
            (None, None) => (body, None),
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
            let mut head = first.take().unwrap_or_else(|| copy(&template));
            if let Some(b) = &backend {
                b.request_headers.apply(&mut head.headers);
            }
            let req = Request::from_parts(head, body.take().unwrap_or_else(body::empty));
            let (mut resp, error) = try_once(
                req,
                &resolved,
                rule.timeouts.per_try(),
                self.pod,
                self.shared,
                self.conn_series,
                self.dst_service,
            )
            .await;
            if let Some(b) = &backend {
                b.response_headers.apply(resp.headers_mut());
            }
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
