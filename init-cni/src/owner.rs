//! Whether the installer's DaemonSet is being deleted, asked of the API server when the
//! installer stops: `helm uninstall` deletes the DaemonSet before its pods are stopped, so
//! that the installer then takes the plugin out of the node's chain and the node keeps
//! starting pods; a rolling update, a restart or a node shutting down leaves the
//! DaemonSet in place, and the plugin stays chained (new meshed pods wait for the next
//! proxy rather than start unprotected). Anything short of a clear answer keeps it
//! chained too (fail closed), with a message that says how to take it out by hand.
//!
//! The in-cluster credentials, as every Kubernetes client uses them:
//! `KUBERNETES_SERVICE_HOST`/`_PORT` and the ServiceAccount's `token` and `ca.crt`
//! (the chart mounts them in this container only). One `GET` of the DaemonSet over
//! HTTPS/1.1: the binary is also the plugin the runtime runs on every pod start, and
//! stays small and synchronous.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Where a pod's ServiceAccount credentials are mounted.
pub const CREDENTIALS_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The most of an answer read (a DaemonSet is a few KiB).
const MAX_RESPONSE: usize = 1 << 20;

/// The DaemonSet that runs this installer, `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl std::str::FromStr for Owner {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (namespace, name) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?}: expected NAMESPACE/NAME of a DaemonSet"))?;
        for (what, v) in [("namespace", namespace), ("name", name)] {
            let ok = !v.is_empty()
                && v.len() <= 253
                && v.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.'
                });
            if !ok {
                return Err(format!(
                    "{s:?}: the {what} {v:?} is not a Kubernetes name (lowercase letters, digits, '-', '.')"
                ));
            }
        }
        Ok(Self {
            namespace: namespace.into(),
            name: name.into(),
        })
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Where the DaemonSet stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    /// There and not being deleted: an update, a restart, a node going down.
    Present,
    /// Being deleted (`deletionTimestamp` set: a foreground deletion).
    Deleting,
    /// Gone (404: deleted, the default background deletion of `helm uninstall`).
    Gone,
}

/// Why the question had no answer.
#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    /// The in-cluster credentials are missing or unreadable.
    #[error("in-cluster credentials: {0}")]
    Credentials(String),
    /// The API server could not be reached or spoke no HTTP.
    #[error("the API server at {addr}: {detail}")]
    Transport {
        /// `host:port`.
        addr: String,
        /// What failed.
        detail: String,
    },
    /// The API server answered something other than the DaemonSet or 404.
    #[error("GET {path}: {status} {message}")]
    Refused {
        /// The path asked.
        path: String,
        /// The answer's status.
        status: u16,
        /// The `Status` object's message, or the body.
        message: String,
    },
}

/// The API server and how to authenticate to it.
#[derive(Debug, Clone)]
pub struct ApiServer {
    host: String,
    port: u16,
    token_file: PathBuf,
    tls: Arc<rustls::ClientConfig>,
}

impl ApiServer {
    /// The in-cluster API server: `KUBERNETES_SERVICE_HOST`/`_PORT`, and `ca.crt` and
    /// `token` in `credentials` (the token is read again on each request).
    pub fn in_cluster(credentials: &Path) -> Result<Self, OwnerError> {
        let var = |name: &str| {
            std::env::var(name).map_err(|_| {
                OwnerError::Credentials(format!("{name} is not set (not running in a pod?)"))
            })
        };
        let host = var("KUBERNETES_SERVICE_HOST")?;
        let port = var("KUBERNETES_SERVICE_PORT")?;
        let port = port.parse().map_err(|_| {
            OwnerError::Credentials(format!("KUBERNETES_SERVICE_PORT={port:?} is not a port"))
        })?;
        Self::new(host, port, credentials)
    }

    /// The API server at `host:port`, trusting `ca.crt` in `credentials`.
    pub fn new(host: String, port: u16, credentials: &Path) -> Result<Self, OwnerError> {
        let ca = credentials.join("ca.crt");
        let pem = std::fs::read(&ca)
            .map_err(|e| OwnerError::Credentials(format!("reading {}: {e}", ca.display())))?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|e| {
                OwnerError::Credentials(format!("{}: not PEM certificates: {e}", ca.display()))
            })?;
            roots.add(cert).map_err(|e| {
                OwnerError::Credentials(format!(
                    "{}: a certificate rustls refuses: {e}",
                    ca.display()
                ))
            })?;
        }
        if roots.is_empty() {
            return Err(OwnerError::Credentials(format!(
                "{}: no certificate",
                ca.display()
            )));
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| OwnerError::Credentials(format!("TLS: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            host,
            port,
            token_file: credentials.join("token"),
            tls: Arc::new(tls),
        })
    }

    fn addr(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// `GET path`: the answer's status and body.
    fn get(&self, path: &str, timeout: Duration) -> Result<(u16, Vec<u8>), OwnerError> {
        let token = std::fs::read_to_string(&self.token_file).map_err(|e| {
            OwnerError::Credentials(format!("reading {}: {e}", self.token_file.display()))
        })?;
        let token = token.trim();
        let addr = self.addr();
        let transport = |detail: String| OwnerError::Transport {
            addr: addr.clone(),
            detail,
        };
        let sock = addr
            .to_socket_addrs()
            .map_err(|e| transport(format!("resolving: {e}")))?
            .next()
            .ok_or_else(|| transport("resolves to no address".into()))?;
        let tcp = TcpStream::connect_timeout(&sock, timeout)
            .map_err(|e| transport(format!("connecting: {e}")))?;
        tcp.set_read_timeout(Some(timeout))
            .and_then(|()| tcp.set_write_timeout(Some(timeout)))
            .map_err(|e| transport(format!("setting timeouts: {e}")))?;
        let name = ServerName::try_from(self.host.clone())
            .map_err(|e| transport(format!("{:?} is not a server name: {e}", self.host)))?;
        let conn = rustls::ClientConnection::new(self.tls.clone(), name)
            .map_err(|e| transport(format!("TLS: {e}")))?;
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
             Accept: application/json\r\nUser-Agent: ambit-cni/{}\r\nConnection: close\r\n\r\n",
            env!("CARGO_PKG_VERSION")
        );
        tls.write_all(request.as_bytes())
            .and_then(|()| tls.flush())
            .map_err(|e| transport(format!("sending the request: {e}")))?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 16 * 1024];
        loop {
            if let Some(answer) = parse(&buf, false).map_err(&transport)? {
                return Ok(answer);
            }
            let n = match tls.read(&mut chunk) {
                Ok(n) => n,
                // A peer that closes without close_notify: what arrived is the answer.
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => 0,
                Err(e) => return Err(transport(format!("reading the answer: {e}"))),
            };
            if n == 0 {
                return parse(&buf, true)
                    .map_err(&transport)?
                    .ok_or_else(|| transport("closed before a whole answer".into()));
            }
            buf.extend_from_slice(&chunk[..n]);
            if buf.len() > MAX_RESPONSE {
                return Err(transport(format!("an answer over {MAX_RESPONSE} bytes")));
            }
        }
    }
}

/// Asks the API server where `owner` stands.
pub fn lifecycle(
    api: &ApiServer,
    owner: &Owner,
    timeout: Duration,
) -> Result<Lifecycle, OwnerError> {
    let path = format!(
        "/apis/apps/v1/namespaces/{}/daemonsets/{}",
        owner.namespace, owner.name
    );
    let (status, body) = api.get(&path, timeout)?;
    judge(&path, status, &body)
}

/// What an answer to `GET path` says.
pub fn judge(path: &str, status: u16, body: &[u8]) -> Result<Lifecycle, OwnerError> {
    let json: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    match status {
        200 => {
            let Some(object) = json.filter(|j| j["kind"] == "DaemonSet") else {
                return Err(OwnerError::Refused {
                    path: path.into(),
                    status,
                    message: "the answer is not a DaemonSet".into(),
                });
            };
            if object["metadata"]["deletionTimestamp"].is_string() {
                Ok(Lifecycle::Deleting)
            } else {
                Ok(Lifecycle::Present)
            }
        }
        404 => Ok(Lifecycle::Gone),
        _ => {
            let message = json
                .as_ref()
                .and_then(|j| j["message"].as_str())
                .map(str::to_string)
                .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into());
            Err(OwnerError::Refused {
                path: path.into(),
                status,
                message,
            })
        }
    }
}

/// An HTTP/1.1 answer in `buf`: its status and body once whole (`eof`: nothing more
/// comes), `None` while more is needed.
pub fn parse(buf: &[u8], eof: bool) -> Result<Option<(u16, Vec<u8>)>, String> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if eof {
            Err("closed inside the answer's header".into())
        } else {
            Ok(None)
        };
    };
    let head = std::str::from_utf8(&buf[..end]).map_err(|_| "a header that is not text")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = match status_line.split(' ').collect::<Vec<_>>()[..] {
        [version, code, ..] if version.starts_with("HTTP/1.") => code.parse::<u16>().ok(),
        _ => None,
    }
    .ok_or_else(|| format!("not an HTTP/1.1 status line: {status_line:?}"))?;
    let (mut length, mut chunked) = (None, false);
    for line in lines {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v = v.trim();
        if k.eq_ignore_ascii_case("content-length") {
            length = Some(
                v.parse::<usize>()
                    .map_err(|_| format!("Content-Length {v:?}"))?,
            );
        } else if k.eq_ignore_ascii_case("transfer-encoding") {
            chunked = v.to_ascii_lowercase().contains("chunked");
        }
    }
    let body = &buf[end + 4..];
    if chunked {
        return dechunk(body, eof).map(|b| b.map(|b| (status, b)));
    }
    match length {
        Some(n) if body.len() >= n => Ok(Some((status, body[..n].to_vec()))),
        Some(n) if eof => Err(format!("closed after {} of {n} bytes", body.len())),
        Some(_) => Ok(None),
        None if eof => Ok(Some((status, body.to_vec()))),
        None => Ok(None),
    }
}

/// A chunked body, once its last chunk arrived.
fn dechunk(mut body: &[u8], eof: bool) -> Result<Option<Vec<u8>>, String> {
    let mut out = Vec::new();
    let more = |what: &str| {
        if eof {
            Err(format!("closed inside a chunked body ({what})"))
        } else {
            Ok(None)
        }
    };
    loop {
        let Some(eol) = body.windows(2).position(|w| w == b"\r\n") else {
            return more("a chunk size");
        };
        let size = std::str::from_utf8(&body[..eol])
            .ok()
            .map(|s| s.split(';').next().unwrap_or_default().trim())
            .and_then(|s| usize::from_str_radix(s, 16).ok())
            .ok_or("a chunk size that is not hexadecimal")?;
        body = &body[eol + 2..];
        if size == 0 {
            return Ok(Some(out));
        }
        if body.len() < size + 2 {
            return more("a chunk");
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

#[cfg(test)]
mod tests;
