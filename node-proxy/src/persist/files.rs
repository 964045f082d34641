//! The state directory on disk: created mode 0700, every file written whole (a temporary
//! file, fsync, rename, fsync of the directory) with mode 0600, and read back only when
//! nobody but its owner could have written it.
//!
//! Discovery and policy are kept as an envelope: a magic line, one line of JSON saying
//! what it is, for which node and trust domain, when it was written, and the length and
//! SHA-256 of the payload (a protobuf snapshot) that follows.

use super::Rejected;
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// First line of an envelope.
const MAGIC: &[u8] = b"ambit-proxy state v1\n";
/// Suffix of a file being written (left over only by a crash mid-write; removed at start).
pub(super) const TMP_SUFFIX: &str = ".tmp";

/// What an envelope says about its payload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Header {
    /// `discovery` or `policy`.
    pub kind: String,
    /// The node whose proxy wrote it.
    pub node: String,
    /// The trust domain the proxy was in.
    pub trust_domain: String,
    /// When it was written, seconds since the Unix epoch.
    pub saved_unix: u64,
    /// Payload length in bytes.
    pub len: usize,
    /// Payload SHA-256, hex.
    pub sha256: String,
}

impl Header {
    /// How long ago it was written (zero if the clock says the future).
    pub fn age(&self) -> Duration {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH + Duration::from_secs(self.saved_unix))
            .unwrap_or_default()
    }
}

/// Whom an envelope must be for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Owner {
    /// This proxy's node.
    pub node: String,
    /// This proxy's trust domain.
    pub trust_domain: String,
}

fn sha256_hex(data: &[u8]) -> String {
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, data)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// An envelope of `kind` around `payload`, for `owner`.
pub(super) fn seal(kind: &str, owner: &Owner, payload: &[u8]) -> Vec<u8> {
    let header = Header {
        kind: kind.into(),
        node: owner.node.clone(),
        trust_domain: owner.trust_domain.clone(),
        saved_unix: unix_now(),
        len: payload.len(),
        sha256: sha256_hex(payload),
    };
    let mut out = MAGIC.to_vec();
    // A struct of strings and integers always serializes.
    out.extend(serde_json::to_vec(&header).unwrap_or_default());
    out.push(b'\n');
    out.extend_from_slice(payload);
    out
}

/// The header and payload of an envelope of `kind` for `owner`, or why it is refused.
pub(super) fn open<'a>(
    kind: &str,
    owner: &Owner,
    bytes: &'a [u8],
) -> Result<(Header, &'a [u8]), Rejected> {
    let rest = bytes
        .strip_prefix(MAGIC)
        .ok_or_else(|| Rejected::Format("no ambit-proxy state header".into()))?;
    let nl = rest
        .iter()
        .position(|b| *b == b'\n')
        .ok_or_else(|| Rejected::Corrupt("the header line is cut short".into()))?;
    let header: Header = serde_json::from_slice(&rest[..nl])
        .map_err(|e| Rejected::Corrupt(format!("the header does not parse: {e}")))?;
    let payload = &rest[nl + 1..];
    if header.kind != kind {
        return Err(Rejected::Format(format!(
            "it holds {} state, not {kind}",
            header.kind
        )));
    }
    if payload.len() != header.len || sha256_hex(payload) != header.sha256 {
        return Err(Rejected::Corrupt(format!(
            "{} bytes whose SHA-256 does not match its header ({} bytes announced)",
            payload.len(),
            header.len
        )));
    }
    if header.node != owner.node {
        return Err(Rejected::OtherNode {
            got: header.node,
            want: owner.node.clone(),
        });
    }
    if header.trust_domain != owner.trust_domain {
        return Err(Rejected::OtherTrustDomain {
            got: header.trust_domain,
            want: owner.trust_domain.clone(),
        });
    }
    Ok((header, payload))
}

/// Creates `dir` (and its parents) and makes it 0700.
pub(super) fn ensure_dir(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// Writes `bytes` to `path` whole, mode 0600: readers find the old file or the new one,
/// never a part.
pub(super) fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(TMP_SUFFIX);
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let written = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Reads `path`, refusing a file that anyone but its owner may write, or whose owner is
/// not this process's user (or, for a secret, that anyone but its owner may read).
/// `Ok(None)` when there is no such file.
pub(super) fn read_checked(path: &Path, secret: bool) -> Result<Option<Vec<u8>>, Rejected> {
    use std::os::unix::fs::MetadataExt;
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Rejected::Io(e.to_string())),
    };
    if !meta.file_type().is_file() {
        return Err(Rejected::Format("not a regular file".into()));
    }
    let mode = meta.mode() & 0o777;
    let loose = if secret { 0o077 } else { 0o022 };
    // The owner of /proc/self is this process's effective user.
    let uid = std::fs::metadata("/proc/self")
        .map_err(|e| Rejected::Io(format!("/proc/self: {e}")))?
        .uid();
    if mode & loose != 0 || meta.uid() != uid {
        return Err(Rejected::Mode {
            mode,
            owner: meta.uid(),
        });
    }
    std::fs::read(path)
        .map(Some)
        .map_err(|e| Rejected::Io(e.to_string()))
}

/// Removes the temporary files a crash mid-write may have left in `dir`.
pub(super) fn remove_leftovers(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().ends_with(TMP_SUFFIX) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}
