//! The node's credential for the control plane, read from a file and re-read when the
//! kubelet rotates it.
//!
//! On Kubernetes the token is a projected ServiceAccount token (audience `ambit`) that the
//! kubelet refreshes well before it expires, by writing a new timestamped directory and
//! swapping the `..data` symlink to it (the atomic writer of every projected volume). The
//! identity and discovery clients ask [`TokenSource::current`] on each request or
//! reconnect; it `stat`s the path (following the symlinks) and re-reads the file only when
//! what it points at changed — device, inode, size or modification time. A swap always
//! changes the inode, so a rotation is seen on the very next request, and a request costs
//! one `stat` (requests are a certificate renewal or a stream reconnect, not a connection).
//! Polling on a timer instead would either lag a rotation or read the file for nothing.
//!
//! A read that fails (a missing file mid-swap, an empty or unusable one) keeps the last
//! good token, is logged and counted in `token_reload_failures_total`. The token itself is
//! never logged, dumped or `Debug`-printed.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;
use tonic::metadata::AsciiMetadataValue;

/// The most a token file may hold (a projected token is a JWT of one or two KiB).
const MAX_TOKEN_BYTES: u64 = 64 * 1024;

/// Why a token cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The token file.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// The file holds nothing usable (empty, too large, or not a header value).
    #[error("{path}: {reason}")]
    Unusable {
        /// The token file.
        path: PathBuf,
        /// What is wrong with it (never the content).
        reason: &'static str,
    },
    /// The token has characters an `authorization` header cannot carry.
    #[error("the node token has characters not allowed in a header")]
    NotAHeader,
}

/// A credential; its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Arc<str>);

impl Token {
    /// `Bearer <token>` as gRPC metadata, marked sensitive (so it is not logged by tonic
    /// or hyper either).
    pub fn bearer(&self) -> Result<AsciiMetadataValue, TokenError> {
        let mut value: AsciiMetadataValue = format!("Bearer {}", self.0)
            .parse()
            .map_err(|_| TokenError::NotAHeader)?;
        value.set_sensitive(true);
        Ok(value)
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// Reloads of the token file.
#[derive(Clone, Debug, Default)]
pub struct TokenMetrics {
    reloads: Counter,
    failures: Counter,
}

impl TokenMetrics {
    /// Registers `token_reloads_total` and `token_reload_failures_total`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "token_reloads",
            "Times the node token file changed and was read again",
            m.reloads.clone(),
        );
        registry.register(
            "token_reload_failures",
            "Times the node token file could not be read again (the last good token stays)",
            m.failures.clone(),
        );
        m
    }
}

/// What identifies the file's content without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fingerprint {
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<SystemTime>,
}

fn fingerprint(path: &Path) -> std::io::Result<Fingerprint> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    Ok(Fingerprint {
        dev: m.dev(),
        ino: m.ino(),
        len: m.len(),
        modified: m.modified().ok(),
    })
}

#[derive(Debug)]
struct FileState {
    token: Token,
    /// What the file was when last read (successfully or not): unchanged, not read again.
    seen: Option<Fingerprint>,
}

#[derive(Debug)]
struct TokenFile {
    path: PathBuf,
    state: Mutex<FileState>,
    metrics: TokenMetrics,
}

#[derive(Debug)]
enum Kind {
    Fixed(Token),
    File(TokenFile),
}

/// Where the identity and discovery clients get the node token: a fixed value (tests), or
/// a file re-read when it changes.
#[derive(Clone, Debug)]
pub struct TokenSource(Arc<Kind>);

impl From<String> for TokenSource {
    fn from(token: String) -> Self {
        Self::fixed(token)
    }
}

impl TokenSource {
    /// A token that never changes.
    pub fn fixed(token: impl Into<String>) -> Self {
        Self(Arc::new(Kind::Fixed(Token(token.into().into()))))
    }

    /// The token in `path`, read now (an error if it is unusable: the proxy cannot start
    /// without one) and again whenever the file changes.
    pub fn file(path: &Path, metrics: TokenMetrics) -> Result<Self, TokenError> {
        let seen = fingerprint(path).ok();
        let token = read(path)?;
        Ok(Self(Arc::new(Kind::File(TokenFile {
            path: path.to_path_buf(),
            state: Mutex::new(FileState { token, seen }),
            metrics,
        }))))
    }

    /// The token to send now.
    pub fn current(&self) -> Token {
        match &*self.0 {
            Kind::Fixed(token) => token.clone(),
            Kind::File(file) => file.current(),
        }
    }
}

impl TokenFile {
    fn current(&self) -> Token {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let now = fingerprint(&self.path);
        if let Ok(now) = &now {
            if state.seen == Some(*now) {
                return state.token.clone();
            }
        }
        let before = now.as_ref().ok().copied();
        let read = now
            .map_err(|source| TokenError::Read {
                path: self.path.clone(),
                source,
            })
            .and_then(|seen| read(&self.path).map(|token| (seen, token)));
        match read {
            Ok((seen, token)) => {
                if token != state.token {
                    tracing::info!(file = %self.path.display(), "node token rotated; using the new one");
                }
                self.metrics.reloads.inc();
                state.token = token;
                state.seen = Some(seen);
            }
            Err(error) => {
                // Content that is unusable is not read again until the file changes; a
                // file that could not be read (mid-swap) is tried again next time.
                // The fingerprint is the one taken before the read: a file swapped in
                // since is new, and is read next time.
                if matches!(error, TokenError::Unusable { .. }) {
                    state.seen = before;
                }
                self.metrics.failures.inc();
                tracing::warn!(%error, "node token file unusable; keeping the last good token");
            }
        }
        state.token.clone()
    }
}

fn read(path: &Path) -> Result<Token, TokenError> {
    let unusable = |reason| TokenError::Unusable {
        path: path.to_path_buf(),
        reason,
    };
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_TOKEN_BYTES + 1).read_to_string(&mut text))
        .map_err(|source| TokenError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    if text.len() as u64 > MAX_TOKEN_BYTES {
        return Err(unusable("the file is larger than 64 KiB"));
    }
    let token = Token(text.trim().into());
    if token.0.is_empty() {
        return Err(unusable("the file is empty"));
    }
    token
        .bearer()
        .map_err(|_| unusable("the token has characters not allowed in a header"))?;
    Ok(token)
}

#[cfg(test)]
mod tests;
