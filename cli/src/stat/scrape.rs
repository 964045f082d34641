//! Finding the node proxies and reading their `/metrics`.
//!
//! A [`ProxySource`] says which node proxies there are, each a [`Proxy`] that knows how it
//! is reached: its admin server directly ([`AdminUrl`]: `--proxy-admin`, [`Flags`]; the
//! running demo's), or through the Kubernetes API server's pod proxy (`--kube`,
//! [`super::kube`]). [`scrape_all`] reads every proxy at once, with a timeout each, and
//! reports the ones that did not answer instead of failing the command. The commands do
//! not see which way a proxy was reached.

use super::kube::PodProxy;
use super::parse::{parse, Sample};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// The largest `/metrics` body read (a node with many pods serves a few MiB).
pub(super) const MAX_BODY: usize = 64 << 20;

/// What a scraper accepts: OpenMetrics, else the Prometheus text format.
pub(super) const ACCEPT: &str =
    "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5";

/// A node proxy's admin server, parsed from `http://HOST:PORT[/PATH]`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct AdminUrl {
    /// `HOST:PORT`.
    authority: String,
    /// The metrics path (`/metrics` unless the URL names one).
    path: String,
}

impl AdminUrl {
    /// Parses `s`; the error says what is expected.
    pub fn parse(s: &str) -> Result<Self, String> {
        let expected =
            "give a node proxy's admin server as http://HOST:PORT, e.g. http://127.0.0.1:4191";
        let Some(rest) = s.strip_prefix("http://") else {
            return Err(if s.starts_with("https://") {
                format!("{s:?}: the node proxy's admin server speaks plain HTTP; {expected}")
            } else if s.contains("://") {
                format!("{s:?}: not an http:// URL; {expected}")
            } else {
                format!(
                    "{s:?} is not a URL; {expected} (--proxy-admin takes every value that follows it: put the resource and its name before it)"
                )
            });
        };
        let (authority, path) = match rest.find(['/', '?', '#']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let uri: hyper::Uri = format!("http://{authority}/")
            .parse()
            .map_err(|e| format!("{s:?}: {e}; {expected}"))?;
        if authority.contains('@') || uri.host().is_none_or(str::is_empty) {
            return Err(format!("{s:?}: no host; {expected}"));
        }
        if uri.port_u16().is_none() {
            return Err(format!(
                "{s:?}: no port; the admin server listens on 4191 by default: http://{authority}:4191"
            ));
        }
        let path = match path {
            "" | "/" => "/metrics".to_string(),
            p if p.starts_with('/') => p.to_string(),
            p => return Err(format!("{s:?}: {p:?} is not a path; {expected}")),
        };
        Ok(Self {
            authority: authority.to_string(),
            path,
        })
    }
}

impl fmt::Display for AdminUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}{}", self.authority, self.path)
    }
}

/// One node proxy to scrape, and how it is reached.
#[derive(Clone, Debug)]
pub enum Proxy {
    /// Its admin server, directly.
    Admin(AdminUrl),
    /// Its pod, through the Kubernetes API server's pod proxy.
    Pod(PodProxy),
}

impl Proxy {
    /// The text of its `/metrics`; an error says what happened and what to do.
    pub async fn text(&self) -> Result<String, ScrapeError> {
        self.fetch().await
    }

    async fn fetch(&self) -> Result<String, ScrapeError> {
        match self {
            Self::Admin(url) => get(url).await,
            Self::Pod(pod) => pod.get().await,
        }
    }

    /// What to ask when it answers, but not with metrics.
    fn is_it(&self) -> String {
        match self {
            Self::Admin(_) => {
                "is this a node proxy's admin server (port 4191, path /metrics)?".into()
            }
            Self::Pod(pod) => format!(
                "is port {} of the pod the node proxy's admin server?",
                pod.port()
            ),
        }
    }

    /// What to ask when it does not answer in time.
    fn slow(&self) -> String {
        match self {
            Self::Admin(_) => {
                "is this the node proxy's admin port (4191), and is the proxy running?".into()
            }
            Self::Pod(pod) => format!(
                "are the API server and the pod up ({})?",
                pod.kubectl("get pod")
            ),
        }
    }
}

impl From<AdminUrl> for Proxy {
    fn from(url: AdminUrl) -> Self {
        Self::Admin(url)
    }
}

/// Names the proxy in messages and in a [`super::compute::Snapshot`] (stable across
/// scrapes).
impl fmt::Display for Proxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Admin(url) => url.fmt(f),
            Self::Pod(pod) => pod.fmt(f),
        }
    }
}

/// What a [`ProxySource`] found.
#[derive(Debug, Default)]
pub struct Found {
    /// The proxies to scrape.
    pub proxies: Vec<Proxy>,
    /// Those it knows of but that cannot be scraped (a pod not running): why, and what to
    /// do.
    pub skipped: Vec<ScrapeError>,
}

/// What [`ProxySource::find`] answers with.
pub type Finding<'a> = Pin<Box<dyn Future<Output = Result<Found, String>> + 'a>>;

/// Where the node proxies are.
pub trait ProxySource {
    /// The proxies to scrape; an error says what is wrong with the source and what to do.
    fn find(&self) -> Finding<'_>;

    /// What to check when none of the proxies answers.
    fn advice(&self) -> String;
}

/// `--proxy-admin URL...`.
#[derive(Debug)]
pub struct Flags<'a>(pub &'a [String]);

impl Flags<'_> {
    /// The URLs, parsed, without duplicates.
    pub fn urls(&self) -> Result<Vec<AdminUrl>, String> {
        let mut urls: Vec<AdminUrl> = self
            .0
            .iter()
            .map(|s| AdminUrl::parse(s).map_err(|e| format!("--proxy-admin {e}")))
            .collect::<Result<_, _>>()?;
        urls.sort();
        urls.dedup();
        if urls.is_empty() {
            return Err("no node proxy to ask: give --proxy-admin http://HOST:4191".into());
        }
        Ok(urls)
    }

    /// The proxies at the URLs.
    pub fn found(&self) -> Result<Found, String> {
        Ok(Found {
            proxies: self.urls()?.into_iter().map(Proxy::Admin).collect(),
            skipped: Vec::new(),
        })
    }
}

impl ProxySource for Flags<'_> {
    fn find(&self) -> Finding<'_> {
        Box::pin(std::future::ready(self.found()))
    }

    fn advice(&self) -> String {
        "check the --proxy-admin URLs (http://HOST:4191) and that the proxies run".into()
    }
}

/// Why a proxy's metrics could not be read: each says what happened, where, and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScrapeError(pub String);

impl fmt::Display for ScrapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ScrapeError {}

/// Reads the metrics of one proxy and parses them.
pub async fn scrape(proxy: &Proxy, timeout: Duration) -> Result<Vec<Sample>, ScrapeError> {
    let text = tokio::time::timeout(timeout, proxy.fetch())
        .await
        .map_err(|_| {
            ScrapeError(format!(
                "{proxy}: no answer within {timeout:?}; {} (--timeout to wait longer)",
                proxy.slow()
            ))
        })??;
    parse(&text).map_err(|e| {
        ScrapeError(format!(
            "{proxy}: {e}: not Prometheus text metrics; {}",
            proxy.is_it()
        ))
    })
}

async fn get(url: &AdminUrl) -> Result<String, ScrapeError> {
    let fail = |what: String| ScrapeError(format!("{url}: {what}"));
    let tcp = tokio::net::TcpStream::connect(&url.authority)
        .await
        .map_err(|e| {
            fail(format!(
                "cannot connect: {e}; is the node proxy running, and its admin server on this address (--admin-addr, 0.0.0.0:4191 by default)?"
            ))
        })?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(hyper_util::rt::TokioIo::new(tcp))
            .await
            .map_err(|e| fail(format!("HTTP handshake: {e}")))?;
    let conn = tokio::spawn(conn);
    let req = hyper::Request::get(&url.path)
        .header(hyper::header::HOST, &url.authority)
        .header(hyper::header::ACCEPT, ACCEPT)
        .body(Empty::new())
        .map_err(|e| fail(e.to_string()))?;
    let result = async {
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| fail(format!("no HTTP answer: {e}; is this a node proxy's admin port?")))?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| fail(format!("reading the body (at most {} MiB): {e}", MAX_BODY >> 20)))?
            .to_bytes();
        let text = String::from_utf8_lossy(&body);
        if !status.is_success() {
            let first = text.lines().next().unwrap_or("").trim();
            return Err(fail(format!(
                "answered {status}{}{first}; is this a node proxy's admin server, and the path /metrics?",
                if first.is_empty() { "" } else { ": " }
            )));
        }
        Ok(text.into_owned())
    }
    .await;
    conn.abort();
    result
}

/// Scrapes every proxy at once (a [`Proxy`], or an [`AdminUrl`]): the metrics of those
/// that answered, by [`Proxy`]'s name, and the errors of those that did not.
pub async fn scrape_all<P: Clone + Into<Proxy>>(
    proxies: &[P],
    timeout: Duration,
) -> (BTreeMap<String, Vec<Sample>>, Vec<ScrapeError>) {
    let mut tasks = tokio::task::JoinSet::new();
    for proxy in proxies {
        let proxy: Proxy = proxy.clone().into();
        tasks.spawn(async move { (proxy.to_string(), scrape(&proxy, timeout).await) });
    }
    let (mut ok, mut failed) = (BTreeMap::new(), Vec::new());
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok((url, Ok(samples))) => {
                ok.insert(url, samples);
            }
            Ok((_, Err(e))) => failed.push(e),
            Err(e) => failed.push(ScrapeError(format!("a scrape failed: {e}"))),
        }
    }
    failed.sort_by(|a, b| a.0.cmp(&b.0));
    (ok, failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_urls() {
        let u = AdminUrl::parse("http://127.0.0.1:4191").unwrap();
        assert_eq!(u.to_string(), "http://127.0.0.1:4191/metrics");
        assert_eq!(
            AdminUrl::parse("http://node-a:4191/").unwrap().to_string(),
            "http://node-a:4191/metrics"
        );
        assert_eq!(
            AdminUrl::parse("http://[::1]:9/m").unwrap().to_string(),
            "http://[::1]:9/m"
        );
        for (bad, says) in [
            ("https://127.0.0.1:4191", "plain HTTP"),
            ("ftp://x:1", "not an http:// URL"),
            ("127.0.0.1:4191", "is not a URL"),
            ("deploy", "put the resource and its name before it"),
            (
                "http://127.0.0.1",
                "no port; the admin server listens on 4191",
            ),
            ("http://:4191", "no host"),
            ("http://a b:1", "http://HOST:PORT"),
            ("http://u@h:1", "no host"),
            ("http://h:1?x", "is not a path"),
        ] {
            let e = AdminUrl::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
            assert!(e.contains("http://"), "{bad}: {e}");
        }
        let e = Flags(&["http://a:1".into(), "nope".into()])
            .urls()
            .unwrap_err();
        assert!(e.starts_with("--proxy-admin \"nope\""), "{e}");
        assert_eq!(
            Flags(&["http://a:1".into(), "http://a:1/".into()])
                .urls()
                .unwrap()
                .len(),
            1
        );
    }
}
