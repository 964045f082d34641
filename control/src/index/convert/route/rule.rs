//! A route rule's filters (header modifiers, RequestRedirect, URLRewrite, RequestMirror),
//! backendRefs, timeouts and retry stanza.

use crate::index::convert::{err, port, ConvertError};
use crate::index::gateway::{self, RouteRule as RuleSpec};
use crate::index::route::{
    BackendRef, HeaderModifier, Mirror, PathMatch, PathModifier, Redirect, RequestMatch,
    RetryStanza, Rewrite, RouteKind, RouteRule,
};
use ambit_api::duration::parse_gateway_duration;

/// The namespaces a route's backends may be in without a ReferenceGrant: the route's
/// own and, for a consumer route (GAMMA: a route whose parent is a Service of another
/// namespace), its parent Services' — the producer's Services the consumer already
/// sends to.
pub(super) struct Namespaces<'a> {
    pub(super) route: &'a str,
    pub(super) consumer_of: Vec<&'a str>,
}

/// The rule, its matches already converted.
pub(super) fn rule<M>(
    r: &RuleSpec<M>,
    kind: RouteKind,
    matches: Vec<RequestMatch>,
    namespaces: &Namespaces<'_>,
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
    // A rule without matches matches PathPrefix "/".
    let prefix_only = matches
        .iter()
        .all(|m| matches!(m, RequestMatch::Http(h) if matches!(h.path, PathMatch::Prefix(_))));
    let f = filters(r, kind, prefix_only, namespaces, object, field)?;
    let mut backends = Vec::new();
    for (i, b) in r.backend_refs.iter().flatten().enumerate() {
        backends.push(backend(
            b,
            namespaces,
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
        request_headers: f.request_headers,
        response_headers: f.response_headers,
        redirect: f.redirect,
        rewrite: f.rewrite,
        mirrors: f.mirrors,
        backends,
        request_timeout,
        backend_request_timeout,
        retry,
    })
}

/// A rule's filters, converted.
#[derive(Default)]
struct Filters {
    request_headers: Option<HeaderModifier>,
    response_headers: Option<HeaderModifier>,
    redirect: Option<Redirect>,
    rewrite: Option<Rewrite>,
    mirrors: Vec<Mirror>,
}

fn filters<M>(
    r: &RuleSpec<M>,
    kind: RouteKind,
    prefix_only: bool,
    namespaces: &Namespaces<'_>,
    object: &str,
    field: &str,
) -> Result<Filters, ConvertError> {
    let mut out = Filters::default();
    for (i, f) in r.filters.iter().flatten().enumerate() {
        let at = format!("{field}.filters[{i}]");
        let ty = f.kind.as_deref().unwrap_or_default();
        let required = |key: &str| {
            err(
                object,
                &format!("{at}.{key}"),
                format!("required with type {ty}"),
            )
        };
        let twice = || {
            err(
                object,
                &format!("{at}.type"),
                format!("a second {ty} in one rule; merge them into one"),
            )
        };
        let http_only = matches!(ty, "RequestRedirect" | "URLRewrite");
        if http_only && kind == RouteKind::Grpc {
            return Err(err(
                object,
                &format!("{at}.type"),
                format!("{ty} is an HTTPRoute filter; a GRPCRoute takes RequestHeaderModifier, ResponseHeaderModifier and RequestMirror"),
            ));
        }
        match ty {
            "RequestHeaderModifier" | "ResponseHeaderModifier" => {
                let (slot, spec, key) = if ty == "RequestHeaderModifier" {
                    (&mut out.request_headers, &f.request_header_modifier, "requestHeaderModifier")
                } else {
                    (&mut out.response_headers, &f.response_header_modifier, "responseHeaderModifier")
                };
                let spec = spec.as_ref().ok_or_else(|| required(key))?;
                if slot.is_some() {
                    return Err(twice());
                }
                *slot = Some(modifier(spec, object, &format!("{at}.{key}"))?);
            }
            "RequestRedirect" => {
                let spec = f.request_redirect.as_ref().ok_or_else(|| required("requestRedirect"))?;
                if out.redirect.is_some() {
                    return Err(twice());
                }
                out.redirect = Some(redirect(spec, prefix_only, object, &format!("{at}.requestRedirect"))?);
            }
            "URLRewrite" => {
                let spec = f.url_rewrite.as_ref().ok_or_else(|| required("urlRewrite"))?;
                if out.rewrite.is_some() {
                    return Err(twice());
                }
                let at = format!("{at}.urlRewrite");
                out.rewrite = Some(Rewrite {
                    hostname: spec
                        .hostname
                        .as_deref()
                        .map(|h| hostname(h, object, &format!("{at}.hostname")))
                        .transpose()?,
                    path: spec
                        .path
                        .as_ref()
                        .map(|p| path_modifier(p, prefix_only, object, &format!("{at}.path")))
                        .transpose()?,
                });
            }
            "RequestMirror" => {
                let spec = f.request_mirror.as_ref().ok_or_else(|| required("requestMirror"))?;
                out.mirrors.push(mirror(spec, namespaces, object, &format!("{at}.requestMirror"))?);
            }
            "" => return Err(err(object, &format!("{at}.type"), "required")),
            other => {
                return Err(err(
                    object,
                    &format!("{at}.type"),
                    format!("{other:?} filters are not supported; use RequestHeaderModifier, ResponseHeaderModifier, RequestRedirect, URLRewrite or RequestMirror, or remove the filter"),
                ))
            }
        }
    }
    if out.redirect.is_some() && out.rewrite.is_some() {
        return Err(err(
            object,
            &format!("{field}.filters"),
            "RequestRedirect and URLRewrite cannot be in one rule (a redirected request is not sent); keep one",
        ));
    }
    Ok(out)
}

fn redirect(
    r: &gateway::RequestRedirect,
    prefix_only: bool,
    object: &str,
    field: &str,
) -> Result<Redirect, ConvertError> {
    let scheme = r
        .scheme
        .as_deref()
        .map(|s| match s {
            "http" | "https" => Ok(s.to_string()),
            other => Err(err(
                object,
                &format!("{field}.scheme"),
                format!("{other:?} is not a redirect scheme; use http or https"),
            )),
        })
        .transpose()?;
    let status = match r.status_code {
        // Gateway API's default.
        None => 302,
        Some(c @ (301 | 302 | 303 | 307 | 308)) => c as u16,
        Some(c) => {
            return Err(err(
                object,
                &format!("{field}.statusCode"),
                format!("{c} is not a redirect status; use 301, 302, 303, 307 or 308"),
            ))
        }
    };
    Ok(Redirect {
        scheme,
        hostname: r
            .hostname
            .as_deref()
            .map(|h| hostname(h, object, &format!("{field}.hostname")))
            .transpose()?,
        path: r
            .path
            .as_ref()
            .map(|p| path_modifier(p, prefix_only, object, &format!("{field}.path")))
            .transpose()?,
        port: r
            .port
            .map(|n| {
                port(
                    i32::try_from(n).unwrap_or(0),
                    object,
                    &format!("{field}.port"),
                )
            })
            .transpose()?,
        status,
    })
}

/// A hostname as Gateway API's PreciseHostname: lower-case DNS labels, no wildcard.
fn hostname(h: &str, object: &str, field: &str) -> Result<String, ConvertError> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if h.len() > 253 || !h.split('.').all(label_ok) {
        return Err(err(
            object,
            field,
            format!("{h:?} is not a hostname (lower-case DNS labels separated by dots, no wildcard, no port)"),
        ));
    }
    Ok(h.to_string())
}

fn path_modifier(
    p: &gateway::PathModifier,
    prefix_only: bool,
    object: &str,
    field: &str,
) -> Result<PathModifier, ConvertError> {
    let check = |v: &str, key: &str| {
        let ok = v.is_empty() || v.starts_with('/');
        let clean = !v
            .bytes()
            .any(|b| b.is_ascii_control() || b == b' ' || b == b'?' || b == b'#');
        if ok && clean && v.len() <= 1024 {
            Ok(v.to_string())
        } else {
            Err(err(
                object,
                &format!("{field}.{key}"),
                format!("{v:?} is not a path (it starts with /, and has no spaces, ?, # or control characters)"),
            ))
        }
    };
    match p.kind.as_deref() {
        Some("ReplaceFullPath") => {
            let v = p.replace_full_path.as_deref().ok_or_else(|| {
                err(
                    object,
                    &format!("{field}.replaceFullPath"),
                    "required with type ReplaceFullPath",
                )
            })?;
            let v = check(v, "replaceFullPath")?;
            Ok(PathModifier::Full(if v.is_empty() {
                "/".into()
            } else {
                v
            }))
        }
        Some("ReplacePrefixMatch") => {
            if !prefix_only {
                return Err(err(
                    object,
                    &format!("{field}.type"),
                    "ReplacePrefixMatch needs every match of the rule to be a PathPrefix match; use ReplaceFullPath or PathPrefix matches",
                ));
            }
            let v = p.replace_prefix_match.as_deref().ok_or_else(|| {
                err(
                    object,
                    &format!("{field}.replacePrefixMatch"),
                    "required with type ReplacePrefixMatch",
                )
            })?;
            Ok(PathModifier::Prefix(check(v, "replacePrefixMatch")?))
        }
        Some(other) => Err(err(
            object,
            &format!("{field}.type"),
            format!("{other:?} is not a path modifier; use ReplaceFullPath or ReplacePrefixMatch"),
        )),
        None => Err(err(object, &format!("{field}.type"), "required")),
    }
}

fn mirror(
    m: &gateway::RequestMirror,
    namespaces: &Namespaces<'_>,
    object: &str,
    field: &str,
) -> Result<Mirror, ConvertError> {
    let b = m
        .backend_ref
        .as_ref()
        .ok_or_else(|| err(object, &format!("{field}.backendRef"), "required"))?;
    let at = format!("{field}.backendRef");
    if b.weight.is_some() {
        return Err(err(
            object,
            &format!("{at}.weight"),
            "a mirror has no weight; use percent or fraction",
        ));
    }
    let backend = backend(b, namespaces, object, &at)?;
    let (numerator, denominator) = match (m.percent, &m.fraction) {
        (Some(_), Some(_)) => {
            return Err(err(
                object,
                field,
                "percent and fraction both set; keep one",
            ));
        }
        (Some(p), None) => {
            let p = u32::try_from(p).ok().filter(|p| *p <= 100).ok_or_else(|| {
                err(
                    object,
                    &format!("{field}.percent"),
                    format!("{p} is not a percentage (0 to 100)"),
                )
            })?;
            (p, 100)
        }
        (None, Some(f)) => {
            let d = f.denominator.unwrap_or(100);
            let n = f.numerator.unwrap_or(0);
            let d = u32::try_from(d).ok().filter(|d| *d >= 1).ok_or_else(|| {
                err(
                    object,
                    &format!("{field}.fraction.denominator"),
                    format!("{d} is not a denominator (1 or more)"),
                )
            })?;
            let n = u32::try_from(n).ok().filter(|n| *n <= d).ok_or_else(|| {
                err(
                    object,
                    &format!("{field}.fraction.numerator"),
                    format!("{n} is not a numerator (0 to the denominator, {d})"),
                )
            })?;
            (n, d)
        }
        (None, None) => (1, 1),
    };
    Ok(Mirror {
        backend,
        numerator,
        denominator,
    })
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
    namespaces: &Namespaces<'_>,
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
    let (mut request_headers, mut response_headers) = (None, None);
    for (i, f) in b.filters.iter().flatten().enumerate() {
        let at = format!("{field}.filters[{i}]");
        let ty = f.kind.as_deref().unwrap_or_default();
        let (slot, spec, key) = match ty {
            "RequestHeaderModifier" => (&mut request_headers, &f.request_header_modifier, "requestHeaderModifier"),
            "ResponseHeaderModifier" => (&mut response_headers, &f.response_header_modifier, "responseHeaderModifier"),
            "" => return Err(err(object, &format!("{at}.type"), "required")),
            other => {
                return Err(err(
                    object,
                    &format!("{at}.type"),
                    format!("{other:?} is not supported on a backend; use RequestHeaderModifier or ResponseHeaderModifier, or put the filter on the rule"),
                ))
            }
        };
        let spec = spec.as_ref().ok_or_else(|| {
            err(
                object,
                &format!("{at}.{key}"),
                format!("required with type {ty}"),
            )
        })?;
        if slot.is_some() {
            return Err(err(
                object,
                &format!("{at}.type"),
                format!("a second {ty} on one backend; merge them into one"),
            ));
        }
        *slot = Some(modifier(spec, object, &format!("{at}.{key}"))?);
    }
    let name = b
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| err(object, &format!("{field}.name"), "required"))?;
    let namespace = namespaces.route;
    let ns = b.namespace.clone().unwrap_or_else(|| namespace.to_string());
    if ns != namespace && !namespaces.consumer_of.contains(&ns.as_str()) {
        return Err(err(
            object,
            &format!("{field}.namespace"),
            format!("{ns:?}: backends in another namespace need a ReferenceGrant, which Ambit does not support yet; use a Service of {namespace:?} (or, from a consumer route, of its parent Service's namespace)"),
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
        request_headers,
        response_headers,
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
