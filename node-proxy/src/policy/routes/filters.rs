//! A rule's filters beyond the header modifiers: RequestRedirect (the proxy answers),
//! URLRewrite (the host and path the backend sees) and RequestMirror (copies to other
//! Services), as Gateway API defines them. Parsing checks everything (the control plane
//! checked it too), so that applying a filter to a request cannot fail.

use super::Backend;
use ambit_api::proto::policy as pb;
use http::header::{HeaderValue, HOST};
use http::uri::{Authority, PathAndQuery, Uri};
use http::StatusCode;

/// How a redirect or a rewrite changes the path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathModifier {
    /// ReplaceFullPath.
    Full(String),
    /// ReplacePrefixMatch: the matched prefix replaced by this.
    Prefix(String),
}

impl PathModifier {
    fn from_pb(p: Option<&pb::PathModifier>) -> Result<Option<Self>, String> {
        let check = |v: &str| {
            let ok = (v.is_empty() || (v.starts_with('/') && PathAndQuery::try_from(v).is_ok()))
                && !v.contains('?');
            if ok {
                Ok(v.to_string())
            } else {
                Err(format!("{v:?} is not a path"))
            }
        };
        match p.and_then(|p| p.kind.as_ref()) {
            None => Ok(None),
            Some(pb::path_modifier::Kind::Full(v)) => {
                let v = check(v)?;
                Ok(Some(PathModifier::Full(if v.is_empty() {
                    "/".into()
                } else {
                    v
                })))
            }
            Some(pb::path_modifier::Kind::Prefix(v)) => Ok(Some(PathModifier::Prefix(check(v)?))),
        }
    }

    /// `path` changed, the rule having matched the path prefix `prefix` (trailing `/`
    /// trimmed, as the matcher keeps it; None: no prefix match, which the control plane
    /// does not allow with ReplacePrefixMatch — the whole path is then replaced).
    ///
    /// ReplacePrefixMatch follows Gateway API's table: `/foo/bar` matched by `/foo` with
    /// `/xyz` or `/xyz/` is `/xyz/bar`; with `` or `/`, `/bar`; `/foo` with `` is `/`.
    pub fn apply(&self, path: &str, prefix: Option<&str>) -> String {
        match self {
            PathModifier::Full(p) => p.clone(),
            PathModifier::Prefix(with) => {
                let rest = prefix.and_then(|p| path.strip_prefix(p)).unwrap_or("");
                let out = format!("{}{rest}", with.trim_end_matches('/'));
                if out.is_empty() {
                    "/".into()
                } else if out.starts_with('/') {
                    out
                } else {
                    format!("/{out}")
                }
            }
        }
    }
}

/// A RequestRedirect filter; unset parts are the request's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Redirect {
    scheme: Option<String>,
    hostname: Option<String>,
    path: Option<PathModifier>,
    port: Option<u16>,
    /// 301, 302, 303, 307 or 308.
    pub status: StatusCode,
}

impl Redirect {
    pub(super) fn from_pb(r: &pb::Redirect) -> Result<Self, String> {
        let scheme = match r.scheme.as_str() {
            "" => None,
            s @ ("http" | "https") => Some(s.to_string()),
            s => return Err(format!("redirect scheme {s:?} is not http or https")),
        };
        let hostname = (!r.hostname.is_empty())
            .then(|| {
                Authority::try_from(r.hostname.as_str())
                    .ok()
                    .filter(|a| a.port().is_none() && !r.hostname.contains('@'))
                    .map(|_| r.hostname.clone())
                    .ok_or_else(|| format!("redirect hostname {:?} is not one", r.hostname))
            })
            .transpose()?;
        let port = match r.port {
            0 => None,
            p => Some(u16::try_from(p).map_err(|_| format!("redirect port {p} is not a port"))?),
        };
        let status = match r.status {
            s @ (301 | 302 | 303 | 307 | 308) => StatusCode::from_u16(s as u16)
                .map_err(|_| format!("redirect status {s} is not one"))?,
            s => {
                return Err(format!(
                    "redirect status {s} is not 301, 302, 303, 307 or 308"
                ))
            }
        };
        Ok(Self {
            scheme,
            hostname,
            path: PathModifier::from_pb(r.path.as_ref())?,
            port,
            status,
        })
    }

    /// The `Location` for a request to `host` (its Host or authority, a port in it
    /// ignored) on Service port `service_port`, with `path` and `query`, the rule having
    /// matched `prefix`. The scheme is the redirect's or `http` (what the application
    /// sent the proxy); the port the redirect's, else the redirect scheme's well-known
    /// one, else the port the request was sent to — and left out when it is the
    /// scheme's own (80 for http, 443 for https), as Gateway API says.
    pub fn location(
        &self,
        host: &str,
        service_port: u16,
        path: &str,
        query: Option<&str>,
        prefix: Option<&str>,
    ) -> String {
        let scheme = self.scheme.as_deref().unwrap_or("http");
        let host = self
            .hostname
            .as_deref()
            .unwrap_or_else(|| without_port(host));
        let port = self.port.unwrap_or(match self.scheme.as_deref() {
            Some("https") => 443,
            Some(_) => 80,
            None => service_port,
        });
        let default = matches!((scheme, port), ("http", 80) | ("https", 443));
        let port = if default {
            String::new()
        } else {
            format!(":{port}")
        };
        let path = match &self.path {
            Some(m) => m.apply(path, prefix),
            None => path.to_string(),
        };
        let query = query.map(|q| format!("?{q}")).unwrap_or_default();
        format!("{scheme}://{host}{port}{path}{query}")
    }
}

/// `host` without a `:port` (an IPv6 literal keeps its brackets).
fn without_port(host: &str) -> &str {
    if let Some(end) = host.strip_prefix('[').and_then(|h| h.find(']')) {
        return &host[..end + 2];
    }
    match host.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    }
}

/// A URLRewrite filter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rewrite {
    hostname: Option<HeaderValue>,
    path: Option<PathModifier>,
}

impl Rewrite {
    pub(super) fn from_pb(r: &pb::Rewrite) -> Result<Self, String> {
        let hostname = (!r.hostname.is_empty())
            .then(|| {
                Authority::try_from(r.hostname.as_str())
                    .ok()
                    .and_then(|_| HeaderValue::from_str(&r.hostname).ok())
                    .ok_or_else(|| format!("rewrite hostname {:?} is not one", r.hostname))
            })
            .transpose()?;
        Ok(Self {
            hostname,
            path: PathModifier::from_pb(r.path.as_ref())?,
        })
    }

    /// Rewrites the request's host (its Host header and, when the URI has one, its
    /// authority) and path (the query kept), the rule having matched `prefix`.
    pub fn apply(&self, parts: &mut http::request::Parts, prefix: Option<&str>) {
        let mut uri = parts.uri.clone().into_parts();
        if let Some(host) = &self.hostname {
            if uri.authority.is_some() {
                uri.authority = host.to_str().ok().and_then(|h| Authority::try_from(h).ok());
            }
            if uri.authority.is_none() || parts.headers.contains_key(HOST) {
                parts.headers.insert(HOST, host.clone());
            }
        }
        if let Some(m) = &self.path {
            let old = uri.path_and_query.as_ref();
            let path = m.apply(old.map_or("/", |p| p.path()), prefix);
            let with_query = match old.and_then(|p| p.query()) {
                Some(q) => format!("{path}?{q}"),
                None => path,
            };
            uri.path_and_query = PathAndQuery::try_from(with_query)
                .ok()
                .or(uri.path_and_query);
        }
        if let Ok(u) = Uri::from_parts(uri) {
            parts.uri = u;
        }
    }
}

/// A RequestMirror filter: `numerator / denominator` of the requests are copied to a
/// Service port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mirror {
    /// The Service port (weight unused).
    pub backend: Backend,
    numerator: u32,
    denominator: u32,
}

impl Mirror {
    pub(super) fn from_pb(m: &pb::Mirror) -> Result<Self, String> {
        let backend = Backend::from_pb(&pb::Backend {
            service: m.service.clone(),
            port: m.port,
            weight: 1,
            ..Default::default()
        })
        .map_err(|e| format!("mirror {e}"))?;
        if m.denominator == 0 || m.numerator > m.denominator {
            return Err(format!(
                "mirror {}: {}/{} is not a share of requests",
                m.service, m.numerator, m.denominator
            ));
        }
        Ok(Self {
            backend,
            numerator: m.numerator,
            denominator: m.denominator,
        })
    }

    /// Whether this request is mirrored (`roll` uniform in 0..1).
    pub fn takes(&self, roll: f64) -> bool {
        roll * f64::from(self.denominator) < f64::from(self.numerator)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replace_prefix_match_follows_gateway_apis_table() {
        let cases = [
            ("/foo/bar", "/foo", "/xyz", "/xyz/bar"),
            ("/foo/bar", "/foo", "/xyz/", "/xyz/bar"),
            ("/foo/bar", "/foo/", "/xyz", "/xyz/bar"),
            ("/foo/bar", "/foo/", "/xyz/", "/xyz/bar"),
            ("/foo", "/foo", "/xyz", "/xyz"),
            ("/foo/", "/foo", "/xyz", "/xyz/"),
            ("/foo/bar", "/foo", "", "/bar"),
            ("/foo/", "/foo", "", "/"),
            ("/foo", "/foo", "", "/"),
            ("/foo/", "/foo", "/", "/"),
            ("/foo", "/foo", "/", "/"),
            ("/anything", "/", "/prefix", "/prefix/anything"),
        ];
        for (path, prefix, with, want) in cases {
            // The matcher keeps prefixes without their trailing slash.
            let prefix = prefix.trim_end_matches('/');
            let got = PathModifier::Prefix(with.into()).apply(path, Some(prefix));
            assert_eq!(
                got, want,
                "{path} matched by {prefix:?} replaced by {with:?}"
            );
        }
        assert_eq!(
            PathModifier::Full("/one".into()).apply("/foo/bar", Some("/foo")),
            "/one"
        );
    }

    fn redirect(
        scheme: &str,
        hostname: &str,
        port: u32,
        path: Option<pb::path_modifier::Kind>,
    ) -> Redirect {
        Redirect::from_pb(&pb::Redirect {
            scheme: scheme.into(),
            hostname: hostname.into(),
            path: path.map(|k| pb::PathModifier { kind: Some(k) }),
            port,
            status: 302,
        })
        .unwrap()
    }

    #[test]
    fn a_redirects_location_takes_the_requests_parts_it_does_not_set() {
        let at = |r: &Redirect, host: &str, port: u16| {
            r.location(host, port, "/a/b", Some("q=1"), Some("/a"))
        };
        assert_eq!(
            at(&redirect("", "", 0, None), "echo", 80),
            "http://echo/a/b?q=1"
        );
        assert_eq!(
            at(&redirect("", "", 0, None), "echo:8080", 8080),
            "http://echo:8080/a/b?q=1",
            "the Service port"
        );
        assert_eq!(
            at(&redirect("https", "", 0, None), "echo:8080", 8080),
            "https://echo/a/b?q=1",
            "https's own port left out"
        );
        assert_eq!(
            at(&redirect("https", "", 8443, None), "echo", 80),
            "https://echo:8443/a/b?q=1"
        );
        assert_eq!(
            at(&redirect("http", "example.org", 0, None), "echo", 8080),
            "http://example.org/a/b?q=1",
            "http's well-known port"
        );
        assert_eq!(
            at(&redirect("", "", 80, None), "echo:8080", 8080),
            "http://echo/a/b?q=1"
        );
        let full = redirect("", "", 0, Some(pb::path_modifier::Kind::Full("/x".into())));
        assert_eq!(at(&full, "[fd00::1]:80", 80), "http://[fd00::1]/x?q=1");
        let prefix = redirect(
            "",
            "",
            0,
            Some(pb::path_modifier::Kind::Prefix("/z".into())),
        );
        assert_eq!(at(&prefix, "echo", 80), "http://echo/z/b?q=1");
    }

    #[test]
    fn bad_filters_are_refused() {
        let bad = |r: pb::Redirect| Redirect::from_pb(&r).unwrap_err();
        assert!(bad(pb::Redirect {
            status: 200,
            ..Default::default()
        })
        .contains("301"));
        assert!(bad(pb::Redirect {
            status: 301,
            scheme: "ftp".into(),
            ..Default::default()
        })
        .contains("scheme"));
        assert!(bad(pb::Redirect {
            status: 301,
            hostname: "a b".into(),
            ..Default::default()
        })
        .contains("hostname"));
        assert!(bad(pb::Redirect {
            status: 301,
            port: 70_000,
            ..Default::default()
        })
        .contains("port"));
        let m = |n, d| {
            Mirror::from_pb(&pb::Mirror {
                service: "shop/m".into(),
                port: 80,
                numerator: n,
                denominator: d,
            })
        };
        assert!(m(2, 1).is_err());
        assert!(m(1, 0).is_err());
        assert!(Mirror::from_pb(&pb::Mirror {
            service: "m".into(),
            port: 80,
            numerator: 1,
            denominator: 1
        })
        .is_err());
        let every = m(1, 1).unwrap();
        let none = m(0, 5).unwrap();
        let third = m(1, 3).unwrap();
        assert!(every.takes(0.999) && !none.takes(0.0));
        assert!(third.takes(0.3) && !third.takes(0.34));
    }

    #[test]
    fn a_rewrite_changes_host_and_path_and_keeps_the_query() {
        let rw = Rewrite::from_pb(&pb::Rewrite {
            hostname: "api.internal".into(),
            path: Some(pb::PathModifier {
                kind: Some(pb::path_modifier::Kind::Prefix("/v2".into())),
            }),
        })
        .unwrap();
        let (mut h1, ()) = http::Request::get("/api/users?page=2")
            .header(HOST, "web")
            .body(())
            .unwrap()
            .into_parts();
        rw.apply(&mut h1, Some("/api"));
        assert_eq!(h1.uri, "/v2/users?page=2");
        assert_eq!(h1.headers[HOST], "api.internal");
        let (mut h2, ()) = http::Request::get("http://web:80/api")
            .body(())
            .unwrap()
            .into_parts();
        rw.apply(&mut h2, Some("/api"));
        assert_eq!(
            h2.uri, "http://api.internal/v2",
            "an HTTP/2 authority rewritten"
        );
        assert!(
            !h2.headers.contains_key(HOST),
            "no Host added beside an authority"
        );
    }
}
