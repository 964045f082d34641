//! A rule's matches: paths, headers, query parameters and methods (HTTPRoute), services
//! and methods (GRPCRoute). Regular expressions are compiled here (RE2 syntax, as the
//! proxy's `regex` crate reads them), so that a bad one is refused with the object.

use super::rule::header_name;
use crate::index::convert::{err, ConvertError};
use crate::index::gateway::{self, GrpcRouteMatch, HttpRouteMatch};
use crate::index::route::{GrpcMatch, HttpMatch, MatchValue, PathMatch, ValueMatch};

/// The methods Gateway API allows.
const METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

/// Bytes of a compiled regular expression at most: a pattern that compiles to more is
/// refused rather than served (1 MiB; `regex`'s default is 10 MiB per pattern).
const REGEX_SIZE_LIMIT: usize = 1 << 20;

pub(super) fn http(
    m: &HttpRouteMatch,
    object: &str,
    field: &str,
) -> Result<HttpMatch, ConvertError> {
    let path = path(m.path.as_ref(), object, &format!("{field}.path"))?;
    let headers = values(&m.headers, true, object, &format!("{field}.headers"))?;
    let query_params = values(
        &m.query_params,
        false,
        object,
        &format!("{field}.queryParams"),
    )?;
    let method = match m.method.as_deref() {
        None => None,
        Some(x) if METHODS.contains(&x) => Some(x.to_string()),
        Some(x) => {
            return Err(err(
                object,
                &format!("{field}.method"),
                format!(
                    "{x:?} is not a method Gateway API matches; use one of {}",
                    METHODS.join(", ")
                ),
            ))
        }
    };
    Ok(HttpMatch {
        path,
        headers,
        query_params,
        method,
    })
}

pub(super) fn grpc(
    m: &GrpcRouteMatch,
    object: &str,
    field: &str,
) -> Result<GrpcMatch, ConvertError> {
    let headers = values(&m.headers, true, object, &format!("{field}.headers"))?;
    let (service, method) = match &m.method {
        None => (None, None),
        Some(g) => {
            let at = format!("{field}.method");
            match g.kind.as_deref().unwrap_or("Exact") {
                "Exact" => {}
                "RegularExpression" => {
                    return Err(err(
                        object,
                        &format!("{at}.type"),
                        "RegularExpression is not supported for gRPC methods yet; use Exact (an unset service or method matches any)",
                    ))
                }
                other => {
                    return Err(err(object, &format!("{at}.type"), format!("{other:?} is not a match type; use Exact")))
                }
            }
            let part = |v: &Option<String>, name: &str| -> Result<Option<String>, ConvertError> {
                match v.as_deref() {
                    None | Some("") => Ok(None),
                    Some(s) if s.contains('/') || s.chars().any(char::is_whitespace) => Err(err(
                        object,
                        &format!("{at}.{name}"),
                        format!("{s:?}: a gRPC {name} name has no '/' or space (e.g. service shop.Catalog, method List)"),
                    )),
                    Some(s) => Ok(Some(s.to_string())),
                }
            };
            let service = part(&g.service, "service")?;
            let method = part(&g.method, "method")?;
            if service.is_none() && method.is_none() {
                return Err(err(
                    object,
                    &at,
                    "give a service, a method or both (or leave method out)",
                ));
            }
            (service, method)
        }
    };
    Ok(GrpcMatch {
        service,
        method,
        headers,
    })
}

fn path(
    p: Option<&gateway::PathMatch>,
    object: &str,
    field: &str,
) -> Result<PathMatch, ConvertError> {
    let Some(p) = p else {
        return Ok(PathMatch::Prefix("/".into()));
    };
    let value = p.value.clone().unwrap_or_else(|| "/".into());
    let kind = p.kind.as_deref().unwrap_or("PathPrefix");
    let absolute = || {
        if value.starts_with('/')
            && !value.contains("//")
            && !value
                .bytes()
                .any(|b| b == b'?' || b == b'#' || b.is_ascii_whitespace())
        {
            Ok(())
        } else {
            Err(err(
                object,
                &format!("{field}.value"),
                format!("{value:?} is not a path: it must start with '/', without '//', '?', '#' or spaces"),
            ))
        }
    };
    match kind {
        "Exact" => absolute().map(|()| PathMatch::Exact(value)),
        "PathPrefix" => absolute().map(|()| PathMatch::Prefix(value)),
        "RegularExpression" => {
            regex(&value, object, &format!("{field}.value")).map(|()| PathMatch::Regex(value))
        }
        other => Err(err(
            object,
            &format!("{field}.type"),
            format!(
                "{other:?} is not a path match type; use Exact, PathPrefix or RegularExpression"
            ),
        )),
    }
}

fn values(
    list: &Option<Vec<gateway::ValueMatch>>,
    header: bool,
    object: &str,
    field: &str,
) -> Result<Vec<ValueMatch>, ConvertError> {
    let mut out: Vec<ValueMatch> = Vec::new();
    for (i, v) in list.iter().flatten().enumerate() {
        let at = format!("{field}[{i}]");
        let name = if header {
            header_name(v.name.as_deref(), object, &format!("{at}.name"))?
        } else {
            v.name
                .clone()
                .filter(|n| !n.is_empty())
                .ok_or_else(|| err(object, &format!("{at}.name"), "required"))?
        };
        if out.iter().any(|o| o.name == name) {
            // Gateway API: only the first match of a name counts; a second is surely a mistake.
            return Err(err(
                object,
                &format!("{at}.name"),
                format!("{name:?} is matched twice in one match"),
            ));
        }
        let value = v
            .value
            .clone()
            .ok_or_else(|| err(object, &format!("{at}.value"), "required"))?;
        let value = match v.kind.as_deref().unwrap_or("Exact") {
            "Exact" => MatchValue::Exact(value),
            "RegularExpression" => {
                regex(&value, object, &format!("{at}.value"))?;
                MatchValue::Regex(value)
            }
            other => {
                return Err(err(
                    object,
                    &format!("{at}.type"),
                    format!("{other:?} is not a match type; use Exact or RegularExpression"),
                ))
            }
        };
        out.push(ValueMatch { name, value });
    }
    Ok(out)
}

/// Compiles `pattern` (anchored, as the proxy matches it) to refuse a bad one. It must be
/// a regex on its own too: one that only parses inside the anchoring group (`a)|(.*`)
/// would close it early and match far more than it says.
fn regex(pattern: &str, object: &str, field: &str) -> Result<(), ConvertError> {
    let build = |p: &str| {
        regex::RegexBuilder::new(p)
            .size_limit(REGEX_SIZE_LIMIT)
            .build()
            .map(drop)
    };
    build(pattern)
        .and_then(|()| build(&format!("^(?:{pattern})$")))
        .map_err(|e| {
            let first = e.to_string();
            let first = first.lines().last().unwrap_or("invalid").trim().to_string();
            err(
                object,
                field,
                format!("{pattern:?} is not a regular expression (RE2 syntax): {first}"),
            )
        })
}
