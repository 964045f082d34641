//! A route rule's filters, backendRefs, timeouts and retry stanza.

use crate::index::convert::{err, port, ConvertError};
use crate::index::gateway::{self, RouteRule as RuleSpec};
use crate::index::route::{BackendRef, HeaderModifier, RequestMatch, RetryStanza, RouteRule};
use ambit_api::duration::parse_gateway_duration;

/// The rule, its matches already converted.
pub(super) fn rule<M>(
    r: &RuleSpec<M>,
    matches: Vec<RequestMatch>,
    namespace: &str,
    object: &str,
    field: &str,
) -> Result<RouteRule, ConvertError> {
    if r.session_persistence.is_some() {
        return Err(err(
            object,
            &format!("{field}.sessionPersistence"),
            "session persistence is not supported; remove it (requests are balanced by latency)",
        ));
    }
    let (request_headers, response_headers) = filters(r, object, field)?;
    let mut backends = Vec::new();
    for (i, b) in r.backend_refs.iter().flatten().enumerate() {
        backends.push(backend(
            b,
            namespace,
            object,
            &format!("{field}.backendRefs[{i}]"),
        )?);
    }
    let timeouts = r.timeouts.clone().unwrap_or_default();
    let duration = |v: &Option<String>, name: &str| {
        v.as_deref()
            .map(|v| {
                parse_gateway_duration(v)
                    .map_err(|e| err(object, &format!("{field}.timeouts.{name}"), e))
            })
            .transpose()
    };
    let request_timeout = duration(&timeouts.request, "request")?;
    let backend_request_timeout = duration(&timeouts.backend_request, "backendRequest")?;
    if let (Some(req), Some(try_)) = (request_timeout, backend_request_timeout) {
        // Gateway API: backendRequest must not be longer than request (0 = none).
        if !req.is_zero() && try_ > req {
            return Err(err(
                object,
                &format!("{field}.timeouts.backendRequest"),
                format!("{try_:?} is longer than timeouts.request ({req:?}); make it at most that"),
            ));
        }
    }
    let retry = r
        .retry
        .as_ref()
        .map(|s| retry(s, object, &format!("{field}.retry")))
        .transpose()?;
    Ok(RouteRule {
        matches,
        request_headers,
        response_headers,
        backends,
        request_timeout,
        backend_request_timeout,
        retry,
    })
}

type Modifiers = (Option<HeaderModifier>, Option<HeaderModifier>);

fn filters<M>(r: &RuleSpec<M>, object: &str, field: &str) -> Result<Modifiers, ConvertError> {
    let (mut request, mut response) = (None, None);
    for (i, f) in r.filters.iter().flatten().enumerate() {
        let at = format!("{field}.filters[{i}]");
        let kind = f.kind.as_deref().unwrap_or_default();
        let (slot, spec, key) = match kind {
            "RequestHeaderModifier" => (&mut request, &f.request_header_modifier, "requestHeaderModifier"),
            "ResponseHeaderModifier" => (&mut response, &f.response_header_modifier, "responseHeaderModifier"),
            "" => return Err(err(object, &format!("{at}.type"), "required")),
            other => {
                return Err(err(
                    object,
                    &format!("{at}.type"),
                    format!("{other:?} filters are not supported (as in Linkerd); use RequestHeaderModifier or ResponseHeaderModifier, or remove the filter"),
                ))
            }
        };
        let spec = spec.as_ref().ok_or_else(|| {
            err(
                object,
                &format!("{at}.{key}"),
                format!("required with type {kind}"),
            )
        })?;
        if slot.is_some() {
            return Err(err(
                object,
                &format!("{at}.type"),
                format!("a second {kind} in one rule; merge them into one"),
            ));
        }
        *slot = Some(modifier(spec, object, &format!("{at}.{key}"))?);
    }
    Ok((request, response))
}

fn modifier(
    m: &gateway::HeaderModifier,
    object: &str,
    field: &str,
) -> Result<HeaderModifier, ConvertError> {
    let pairs = |list: &Option<Vec<gateway::HeaderValue>>, key: &str| {
        let mut out = Vec::new();
        for (i, h) in list.iter().flatten().enumerate() {
            let at = format!("{field}.{key}[{i}]");
            let name = header_name(h.name.as_deref(), object, &format!("{at}.name"))?;
            let value = h.value.clone().unwrap_or_default();
            if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
                return Err(err(
                    object,
                    &format!("{at}.value"),
                    "a header value cannot hold CR, LF or NUL",
                ));
            }
            out.push((name, value));
        }
        Ok::<_, ConvertError>(out)
    };
    let mut remove = Vec::new();
    for (i, n) in m.remove.iter().flatten().enumerate() {
        remove.push(header_name(
            Some(n),
            object,
            &format!("{field}.remove[{i}]"),
        )?);
    }
    Ok(HeaderModifier {
        set: pairs(&m.set, "set")?,
        add: pairs(&m.add, "add")?,
        remove,
    })
}

/// A header name (an HTTP token), lower-cased.
pub(super) fn header_name(
    n: Option<&str>,
    object: &str,
    field: &str,
) -> Result<String, ConvertError> {
    let n = n
        .filter(|n| !n.is_empty())
        .ok_or_else(|| err(object, field, "required"))?;
    let token = n
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if !token {
        return Err(err(object, field, format!("{n:?} is not a header name")));
    }
    Ok(n.to_ascii_lowercase())
}

fn backend(
    b: &gateway::BackendRef,
    namespace: &str,
    object: &str,
    field: &str,
) -> Result<BackendRef, ConvertError> {
    let group = b.group.as_deref().unwrap_or_default();
    let kind = b.kind.as_deref().unwrap_or("Service");
    if !matches!(group, "" | "core") || kind != "Service" {
        return Err(err(
            object,
            &format!("{field}.kind"),
            format!("{group}/{kind}: only Services are supported as backends (group \"\" or core)"),
        ));
    }
    if b.filters.as_ref().is_some_and(|f| !f.is_null()) {
        return Err(err(
            object,
            &format!("{field}.filters"),
            "per-backend filters are not supported; put them on the rule",
        ));
    }
    let name = b
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| err(object, &format!("{field}.name"), "required"))?;
    let ns = b.namespace.clone().unwrap_or_else(|| namespace.to_string());
    if ns != namespace {
        return Err(err(
            object,
            &format!("{field}.namespace"),
            format!("{ns:?}: backends in another namespace need a ReferenceGrant, which Ambit does not support yet; use a Service of {namespace:?}"),
        ));
    }
    let port = match b.port {
        Some(n) => port(
            i32::try_from(n).unwrap_or(0),
            object,
            &format!("{field}.port"),
        )?,
        None => {
            return Err(err(
                object,
                &format!("{field}.port"),
                "required for a Service backend",
            ))
        }
    };
    let weight = match b.weight {
        None => 1,
        Some(w) => u32::try_from(w)
            .ok()
            .filter(|w| *w <= 1_000_000)
            .ok_or_else(|| {
                err(
                    object,
                    &format!("{field}.weight"),
                    format!("{w} is not a weight (0 to 1000000)"),
                )
            })?,
    };
    Ok(BackendRef {
        namespace: ns,
        name,
        port,
        weight,
    })
}

fn retry(s: &gateway::RouteRetry, object: &str, field: &str) -> Result<RetryStanza, ConvertError> {
    let codes = s
        .codes
        .as_ref()
        .map(|codes| {
            codes
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    u16::try_from(*c)
                        .ok()
                        .filter(|c| (400..=599).contains(c))
                        .ok_or_else(|| {
                            err(
                                object,
                                &format!("{field}.codes[{i}]"),
                                format!("{c} is not a retryable HTTP status (400-599)"),
                            )
                        })
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    let attempts = s
        .attempts
        .map(|a| {
            u32::try_from(a).map_err(|_| {
                err(
                    object,
                    &format!("{field}.attempts"),
                    format!("{a} is not a number of retries (0 or more)"),
                )
            })
        })
        .transpose()?;
    let backoff = s
        .backoff
        .as_deref()
        .map(|b| parse_gateway_duration(b).map_err(|e| err(object, &format!("{field}.backoff"), e)))
        .transpose()?;
    Ok(RetryStanza {
        codes,
        attempts,
        backoff,
    })
}
