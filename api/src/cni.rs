//! The node proxy's CNI socket: what `ambit-cni` asks, what the proxy answers.
//!
//! One request per connection on a unix stream socket (`/var/run/ambit/cni.sock`): a
//! 4-byte big-endian length, then that many bytes of JSON. An `add` carries the pod's
//! network namespace as an open file descriptor (`SCM_RIGHTS`) with its first bytes, so
//! that the proxy never depends on a path that the runtime may remove. The answer is
//! framed the same way.

use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// Where the node proxy listens for the CNI plugin.
pub const DEFAULT_SOCKET: &str = "/var/run/ambit/cni.sock";
/// The largest message either side accepts.
pub const MAX_MESSAGE: usize = 64 * 1024;

/// CNI error codes used in answers (the spec's, and plugin-specific from 100).
pub mod code {
    /// Incompatible CNI version.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// Invalid necessary environment variables.
    pub const INVALID_ENV: u32 = 4;
    /// I/O failure.
    pub const IO_FAILURE: u32 = 5;
    /// Failed to decode content.
    pub const DECODE: u32 = 6;
    /// Invalid network config.
    pub const INVALID_CONFIG: u32 = 7;
    /// Try again later.
    pub const TRY_AGAIN: u32 = 11;
    /// The plugin is not available (STATUS).
    pub const NOT_AVAILABLE: u32 = 50;
    /// The node proxy could not be reached or did not answer in time.
    pub const PROXY_UNREACHABLE: u32 = 100;
    /// The node proxy could not redirect the pod.
    pub const NOT_REDIRECTED: u32 = 101;
    /// The node proxy refused the caller (not root, or not the plugin's executable).
    pub const PEER_REFUSED: u32 = 102;
}

/// A pod, as the CNI runtime names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    /// `K8S_POD_NAMESPACE`.
    pub namespace: String,
    /// `K8S_POD_NAME`.
    pub name: String,
    /// `CNI_CONTAINERID`: the sandbox.
    pub container_id: String,
}

impl PodRef {
    /// Checks that the names can safely become file names (the proxy keeps a record and a
    /// netns handle per pod under its run directory): a namespace is a DNS-1123 label, a
    /// name a DNS-1123 subdomain, a sandbox id letters, digits, `_`, `.` and `-` (not
    /// empty, not `.` or `..`).
    pub fn validate(&self) -> Result<(), String> {
        let dns = |s: &str, max: usize, dots: bool| {
            !s.is_empty()
                && s.len() <= max
                && s.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || (dots && b == b'.')
                })
                && s.starts_with(|c: char| c.is_ascii_alphanumeric())
                && s.ends_with(|c: char| c.is_ascii_alphanumeric())
        };
        if !dns(&self.namespace, 63, false) {
            return Err(format!(
                "K8S_POD_NAMESPACE {:?} is not a Kubernetes namespace name",
                self.namespace
            ));
        }
        if !dns(&self.name, 253, true) {
            return Err(format!(
                "K8S_POD_NAME {:?} is not a Kubernetes pod name",
                self.name
            ));
        }
        let id = &self.container_id;
        let id_ok = !id.is_empty()
            && id.len() <= 256
            && id != "."
            && id != ".."
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !id_ok {
            return Err(format!(
                "CNI_CONTAINERID {id:?} is not a sandbox id (letters, digits, '_', '.', '-')"
            ));
        }
        Ok(())
    }
}

/// A pod whose network is up (`ADD`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodAdd {
    /// Which pod.
    #[serde(flatten)]
    pub pod: PodRef,
    /// `K8S_POD_UID`, when the runtime gives it.
    #[serde(default)]
    pub uid: String,
    /// `CNI_NETNS`, for the logs (the proxy uses the descriptor).
    pub netns_path: String,
    /// The addresses the previous plugins gave the pod.
    pub ips: Vec<IpAddr>,
}

/// What the plugin asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum Request {
    /// Redirect this pod if it is meshed; the netns descriptor rides along.
    Add(PodAdd),
    /// The pod is going away: stop serving it (idempotent).
    Del(PodRef),
    /// Is the pod still redirected?
    Check(PodRef),
    /// Is the proxy ready to take pods?
    Status,
    /// Forget every pod whose sandbox is not in this list.
    Gc {
        /// `CNI_CONTAINERID`s that are still valid.
        valid_container_ids: Vec<String>,
    },
}

/// What the proxy answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Response {
    /// The pod is meshed; its listeners and redirection are in place.
    Redirected,
    /// The pod is not meshed; nothing was done.
    NotMeshed,
    /// Done.
    Ok,
    /// It failed, in the CNI spec's terms.
    Error {
        /// A CNI error code ([`code`]).
        code: u32,
        /// What went wrong.
        msg: String,
        /// More detail, or what to do about it.
        details: String,
    },
}

/// Why a message could not be framed or read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// Longer than [`MAX_MESSAGE`].
    #[error("message of {0} bytes is over the {MAX_MESSAGE}-byte limit")]
    TooLong(usize),
    /// Not the JSON expected.
    #[error("malformed message: {0}")]
    Json(#[from] serde_json::Error),
}

/// `msg` framed: length, then JSON.
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    let json = serde_json::to_vec(msg)?;
    if json.len() > MAX_MESSAGE {
        return Err(FrameError::TooLong(json.len()));
    }
    let mut out = (json.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&json);
    Ok(out)
}

/// The message at the start of `buf`, once it holds a whole one (`Ok(None)` until then).
pub fn decode<T: for<'de> Deserialize<'de>>(buf: &[u8]) -> Result<Option<T>, FrameError> {
    let Some(header) = buf.get(..4) else {
        return Ok(None);
    };
    let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
    if len > MAX_MESSAGE {
        return Err(FrameError::TooLong(len));
    }
    match buf.get(4..4 + len) {
        Some(json) => Ok(Some(serde_json::from_slice(json)?)),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn requests_round_trip_and_partial_frames_wait() {
        let req = Request::Add(PodAdd {
            pod: PodRef {
                namespace: "shop".into(),
                name: "web-0".into(),
                container_id: "abc".into(),
            },
            uid: "u-1".into(),
            netns_path: "/var/run/netns/cni-1".into(),
            ips: vec!["10.1.0.5".parse().unwrap()],
        });
        let bytes = encode(&req).unwrap();
        assert_eq!(decode::<Request>(&bytes[..bytes.len() - 1]).unwrap(), None);
        assert_eq!(decode::<Request>(&bytes).unwrap(), Some(req));
        let json = String::from_utf8_lossy(&bytes[4..]).into_owned();
        assert!(json.contains(r#""command":"add""#), "{json}");
    }

    #[test]
    fn oversized_and_malformed_frames_are_refused() {
        let mut big = (MAX_MESSAGE as u32 + 1).to_be_bytes().to_vec();
        big.push(b'{');
        assert!(matches!(
            decode::<Request>(&big),
            Err(FrameError::TooLong(_))
        ));
        let mut bad = 3u32.to_be_bytes().to_vec();
        bad.extend_from_slice(b"{x}");
        assert!(matches!(decode::<Request>(&bad), Err(FrameError::Json(_))));
    }
}

#[cfg(test)]
mod pod_ref_tests {
    use super::PodRef;

    fn pod(namespace: &str, name: &str, container_id: &str) -> PodRef {
        PodRef {
            namespace: namespace.into(),
            name: name.into(),
            container_id: container_id.into(),
        }
    }

    #[test]
    fn names_that_would_escape_the_run_directory_are_refused() {
        assert!(pod("shop", "web-7d9f.x", "0123abcd_e.f-9")
            .validate()
            .is_ok());
        for bad in [
            pod("../etc", "web", "c1"),
            pod("shop", "../../etc/passwd", "c1"),
            pod("shop", "web", "../x"),
            pod("shop", "web", ".."),
            pod("shop", "web", ""),
            pod("shop", "Web", "c1"),
            pod("", "web", "c1"),
            pod("shop", "web", "a/b"),
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
