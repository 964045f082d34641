//! Checks against running parts: the control plane answers (its admin server is ready, it
//! speaks TLS as its own identity, under the trust anchors, with a certificate that is
//! renewed in time) and each node proxy is ready, holds certificates issued under the
//! current anchors, and runs the control plane's version.

use super::report::Check;
use ambit_api::WorkloadIdentity;
use ambit_proxy::tls::{SpiffeServerVerifier, TrustBundle};
use rustls::client::danger::ServerCertVerifier;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use x509_parser::prelude::FromDer;

/// How long one probe may take.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// `GET url` (plain HTTP/1.1, `http://host:port/path`): the status and the body.
pub async fn http_get(url: &str) -> Result<(u16, String), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url:?}: an admin URL is http://host:port"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let get = async {
        let mut s = tokio::net::TcpStream::connect(authority)
            .await
            .map_err(|e| format!("connecting to {authority}: {e}"))?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nhost: {authority}\r\nconnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .map_err(|e| e.to_string())?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("{url}: not an HTTP answer"))?;
        let chunked = head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked");
        Ok((
            status,
            if chunked {
                dechunk(body)
            } else {
                body.to_string()
            },
        ))
    };
    tokio::time::timeout(TIMEOUT, get)
        .await
        .map_err(|_| format!("{url}: no answer in {TIMEOUT:?}"))?
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The control plane: its admin server's `/ready`, and a TLS handshake with the identity
/// service that must prove `control_id` under `bundle`. Returns the checks and the control
/// plane's version (from `/version`).
pub async fn control_plane(
    admin: &str,
    identity_url: &str,
    bundle: &TrustBundle,
    control_id: &WorkloadIdentity,
) -> (Vec<Check>, Option<String>) {
    let mut out = Vec::new();
    let ready = "the control plane is ready";
    out.push(match http_get(&format!("{admin}/ready")).await {
        Ok((200, _)) => Check::ok(ready),
        Ok((status, body)) => Check::fail(
            ready,
            format!("{admin}/ready: {status} {}", body.trim()),
            "it says what it waits for; see its logs (`kubectl -n ambit logs deploy/ambit-control`)",
        ),
        Err(e) => Check::fail(ready, e, "is it running, and is --control-admin its admin address (:9990)?"),
    });
    let version = match http_get(&format!("{admin}/version")).await {
        Ok((200, v)) => Some(v.trim().to_string()),
        _ => None,
    };
    let serving = format!("the control plane serves TLS as {control_id}");
    match handshake(identity_url, bundle, control_id).await {
        Ok(chain) => {
            out.push(Check::ok(serving));
            out.push(svid_renewed("the control plane's certificate", &chain[0], SystemTime::now()));
        }
        Err(e) => out.push(Check::fail(
            serving,
            e,
            "check --identity-url (https://, the identity port 8080), --trust-anchors (the bundle it issues under) and --control-identity",
        )),
    }
    (out, version)
}

/// A TLS handshake with `url` (https://host:port) that must prove `expected`; the chain
/// presented.
async fn handshake(
    url: &str,
    bundle: &TrustBundle,
    expected: &WorkloadIdentity,
) -> Result<Vec<CertificateDer<'static>>, String> {
    let authority = url
        .strip_prefix("https://")
        .ok_or_else(|| format!("{url:?}: the control plane speaks only TLS; use https://"))?
        .trim_end_matches('/');
    let verifier = Arc::new(SpiffeServerVerifier::new(
        bundle.clone(),
        vec![expected.clone()],
    ));
    let config = rustls::ClientConfig::builder_with_provider(ambit_proxy::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    let name = ServerName::try_from(host.trim_matches(['[', ']']).to_string())
        .map_err(|e| format!("{url}: {e}"))?;
    let go = async {
        let tcp = tokio::net::TcpStream::connect(authority)
            .await
            .map_err(|e| format!("connecting to {authority}: {e}"))?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS with {authority}: {e}"))?;
        Ok::<_, String>(
            tls.get_ref()
                .1
                .peer_certificates()
                .unwrap_or_default()
                .iter()
                .map(|c| c.clone().into_owned())
                .collect::<Vec<_>>(),
        )
    };
    let chain = tokio::time::timeout(TIMEOUT, go)
        .await
        .map_err(|_| format!("{url}: no handshake in {TIMEOUT:?}"))??;
    if chain.is_empty() {
        return Err(format!("{url}: no certificate presented"));
    }
    Ok(chain)
}

/// A short-lived certificate is renewed at 70 % of its life: one with less than a quarter
/// left means renewal is failing (‼); expired is ×.
pub fn svid_renewed(what: &str, leaf: &CertificateDer<'_>, now: SystemTime) -> Check {
    let description = format!("{what} is valid and renewed in time");
    let Ok((_, cert)) = x509_parser::certificate::X509Certificate::from_der(leaf) else {
        return Check::fail(description, "not valid X.509", "report this as a bug");
    };
    let now = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    let (nb, na) = (
        cert.validity().not_before.timestamp(),
        cert.validity().not_after.timestamp(),
    );
    if now >= na || now < nb {
        return Check::fail(
            description,
            format!("valid from {} to {}", cert.validity().not_before, cert.validity().not_after),
            "it was not renewed: check the CA (the issuer's validity, the control plane's logs) and the clock",
        );
    }
    if (na - now) * 4 < na - nb {
        return Check::warn(
            description,
            format!("expires on {}, with less than a quarter of its life left", cert.validity().not_after),
            "it is renewed at 70 % of its life: renewals are failing; check the control plane's logs",
        );
    }
    Check::ok(description)
}

/// One node proxy at `admin`: ready, its certificates chain to `bundle` and prove their
/// identities, its version is `version` (the control plane's, when known).
pub async fn proxy(admin: &str, bundle: &TrustBundle, version: Option<&str>) -> Vec<Check> {
    let mut out = Vec::new();
    let ready = format!("the proxy at {admin} is ready");
    out.push(match http_get(&format!("{admin}/ready")).await {
        Ok((200, _)) => Check::ok(ready),
        Ok((status, body)) => Check::fail(
            ready,
            format!("{status} {}", body.trim()),
            "it says what it waits for (discovery, certificates, pods' listeners)",
        ),
        Err(e) => {
            out.push(Check::fail(
                ready,
                e,
                "is it running, and is --proxy-admin its admin address (:4191)?",
            ));
            return out;
        }
    });
    let dump = match http_get(&format!("{admin}/config_dump")).await {
        Ok((200, body)) => {
            serde_json::from_str::<serde_json::Value>(&body).map_err(|e| e.to_string())
        }
        Ok((status, body)) => Err(format!("{status} {}", body.trim())),
        Err(e) => Err(e),
    };
    let dump = match dump {
        Ok(d) => d,
        Err(e) => {
            out.push(Check::fail(
                format!("the proxy at {admin} shows its state (/config_dump)"),
                e,
                "/config_dump answers loopback clients only: run this on the node, or through `kubectl port-forward`",
            ));
            return out;
        }
    };
    out.push(streams(admin).await);
    if let Some(check) = same_bundle(admin, bundle, &dump) {
        out.push(check);
    }
    let verifier_now = UnixTime::now();
    for id in dump["identities"].as_array().into_iter().flatten() {
        let name = id["identity"].as_str().unwrap_or_default();
        let description =
            format!("{name}: its certificate is issued under the current trust anchors");
        let chain: Vec<CertificateDer<'static>> = rustls_pki_types::pem::PemObject::pem_slice_iter(
            id["cert_chain_pem"].as_str().unwrap_or_default().as_bytes(),
        )
        .filter_map(Result::ok)
        .collect();
        let Ok(expected) = name.parse::<WorkloadIdentity>() else {
            out.push(Check::fail(
                description,
                format!("{name:?} is not a SPIFFE ID"),
                "report this as a bug",
            ));
            continue;
        };
        let Some((leaf, intermediates)) = chain.split_first() else {
            out.push(Check::fail(
                description,
                "no valid certificate",
                "the proxy has none for this identity yet: check its logs and the control plane's",
            ));
            continue;
        };
        let verifier = SpiffeServerVerifier::new(bundle.clone(), vec![expected]);
        let any_name = ServerName::try_from("ambit.check").unwrap_or_else(|_| unreachable!());
        out.push(
            match verifier.verify_server_cert(leaf, intermediates, &any_name, &[], verifier_now) {
                Ok(_) => Check::ok(description),
                Err(e) => Check::fail(
                    description,
                    e.to_string(),
                    "after a trust rotation, the proxy renews under the new issuer within its renewal period; a chain to no current anchor means the bundle or the issuer is wrong",
                ),
            },
        );
    }
    let theirs = dump["version"].as_str().unwrap_or_default();
    let description = format!("the proxy at {admin} runs the control plane's version");
    out.push(match version {
        Some(v) if v == theirs => Check::ok(format!("{description} ({v})")),
        Some(v) => Check::warn(
            description,
            format!("proxy {theirs}, control plane {v}"),
            "upgrade the proxies (the DaemonSet rolls them node by node)",
        ),
        None => Check::warn(
            description,
            format!("proxy {theirs}; the control plane's version is unknown"),
            "pass --control-admin to compare",
        ),
    });
    out
}

/// Whether the proxy at `admin` holds its discovery and policy streams open (its
/// `discovery_connected` and `policy_connected` gauges): without the policy stream it
/// applies `--default-inbound-policy` to every pod, not the cluster's Servers and
/// AuthorizationPolicies.
async fn streams(admin: &str) -> Check {
    let description = format!("the proxy at {admin} holds its discovery and policy streams");
    let metrics = match http_get(&format!("{admin}/metrics")).await {
        Ok((200, body)) => body,
        Ok((status, body)) => {
            return Check::fail(
                description,
                format!("/metrics: {status} {}", body.trim()),
                "is --proxy-admin its admin address (:4191)?",
            )
        }
        Err(e) => return Check::fail(description, e, "is it running?"),
    };
    stream_check(description, &metrics)
}

fn stream_check(description: String, metrics: &str) -> Check {
    let gauge = |name: &str| -> Option<f64> {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    };
    let down: Vec<&str> = ["discovery", "policy"]
        .into_iter()
        .filter(|s| gauge(&format!("{s}_connected")) != Some(1.0))
        .collect();
    if down.is_empty() {
        return Check::ok(description);
    }
    Check::fail(
        description,
        format!("not connected: {}", down.join(", ")),
        "it serves from its last state (or, for policy, --default-inbound-policy) meanwhile: check its --discovery-url/--policy-url and its log for the reason",
    )
}

/// Whether the proxy trusts exactly the roots of `bundle` (its `/config_dump`'s
/// `trust_bundle`): between the steps of a rotation, every proxy must have taken the new
/// bundle before the next step. `None` for a proxy that does not say.
fn same_bundle(admin: &str, bundle: &TrustBundle, dump: &serde_json::Value) -> Option<Check> {
    let theirs: std::collections::BTreeSet<&str> = dump["trust_bundle"]["anchors"]
        .as_array()?
        .iter()
        .filter_map(|a| a["sha256"].as_str())
        .collect();
    let anchors = bundle.anchors();
    let ours: Vec<String> = anchors
        .certificates()
        .iter()
        .map(|c| ambit_proxy::tls::sha256_hex(c))
        .collect();
    let ours: std::collections::BTreeSet<&str> = ours.iter().map(String::as_str).collect();
    let description = format!("the proxy at {admin} trusts the roots of --trust-anchors");
    if theirs == ours {
        return Some(Check::ok(description));
    }
    let short = |set: &std::collections::BTreeSet<&str>| {
        set.iter()
            .map(|f| &f[..f.len().min(16)])
            .collect::<Vec<_>>()
            .join(", ")
    };
    let refused = dump["trust_bundle"]["last_error"]
        .as_str()
        .map(|e| format!("; it refused its file: {e}"))
        .unwrap_or_default();
    Some(Check::fail(
        description,
        format!("it trusts {} where the file has {}{refused}", short(&theirs), short(&ours)),
        "a proxy reads its trust anchors file every few seconds, and the kubelet takes up to a minute or so to update a mounted ConfigMap: wait and check again before the next step of a rotation (docs/OPERATIONS.md)",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::report::Status;

    #[test]
    fn a_proxy_without_its_policy_stream_fails_the_check_naming_it() {
        let both = "# HELP x\ndiscovery_connected 1\npolicy_connected 1\n";
        assert_eq!(stream_check("d".into(), both).result, Status::Success);
        let no_policy = "discovery_connected 1\npolicy_connected 0\n";
        let c = stream_check("d".into(), no_policy);
        assert_eq!(c.result, Status::Error);
        assert_eq!(c.error.as_deref(), Some("not connected: policy"));
        // An older proxy without the gauge: not known to be connected.
        let c = stream_check("d".into(), "discovery_connected 1\n");
        assert_eq!(c.error.as_deref(), Some("not connected: policy"));
    }

    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(
            dechunk("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
            "hello world"
        );
        assert_eq!(dechunk("zz\r\n"), "");
    }

    #[tokio::test]
    async fn an_unreachable_proxy_is_an_error_naming_it() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap_or_else(|e| panic!("{e}"));
        let bundle = ambit_proxy::testing::TestCa::new("cluster.local").bundle();
        let checks = proxy(&format!("http://{closed}"), &bundle, None).await;
        assert_eq!(checks.len(), 1);
        assert_eq!(checks[0].result, Status::Error);
        assert!(checks[0]
            .error
            .clone()
            .unwrap_or_default()
            .contains(&closed.to_string()));
    }

    #[test]
    fn a_proxy_on_another_bundle_is_an_error_saying_which_roots_and_why() {
        let (old, new) = (
            ambit_proxy::testing::TestCa::new("cluster.local"),
            ambit_proxy::testing::TestCa::new("cluster.local"),
        );
        let fp = |ca: &ambit_proxy::testing::TestCa| ambit_proxy::tls::sha256_hex(&ca.root_der);
        let dump = |fps: &[String], error: Option<&str>| {
            serde_json::json!({"trust_bundle": {
                "anchors": fps.iter().map(|f| serde_json::json!({"sha256": f})).collect::<Vec<_>>(),
                "last_error": error,
            }})
        };
        let both = ambit_proxy::tls::TrustBundle::from_pem(
            format!("{}{}", old.root_pem, new.root_pem).as_bytes(),
            "cluster.local",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let same = same_bundle("p", &both, &dump(&[fp(&new), fp(&old)], None));
        assert_eq!(same.map(|c| c.result), Some(Status::Success));
        let behind = same_bundle("p", &both, &dump(&[fp(&old)], Some("bad.pem: empty")))
            .unwrap_or_else(|| panic!("a check"));
        assert_eq!(behind.result, Status::Error);
        let error = behind.error.unwrap_or_default();
        assert!(
            error.contains(&fp(&old)[..16]) && error.contains("bad.pem: empty"),
            "{error}"
        );
        assert!(same_bundle("p", &both, &serde_json::json!({})).is_none());
    }
}
