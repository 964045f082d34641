//! Each identity's key and certificate on disk: `identities/<namespace>.<service
//! account>.pem`, the chain (leaf first) then the PKCS#8 key, mode 0600. The key is a
//! secret: whoever reads the file can act as the workload until the certificate expires
//! (docs/SECURITY.md).
//!
//! A file is read back only if its chain verifies against the trust anchors the proxy
//! has now (so a rotated-away anchor, another cluster's CA or a tampered certificate is
//! refused), it has not expired, its key is the certificate's, and a pod on this node
//! still runs as its identity.

use super::files::{read_checked, write_atomic};
use super::Rejected;
use crate::identity::{Restored, WorkloadCertificate};
use crate::tls::TrustBundle;
use ambit_api::WorkloadIdentity;
use rustls_pki_types::{CertificateDer, UnixTime};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The subdirectory of the state directory.
pub(super) const DIR: &str = "identities";

/// `<namespace>.<service account>.pem`: a namespace name has no dot, so the name is
/// unique per identity; both names are DNS labels or subdomains, so it stays in the
/// directory.
pub(super) fn file_name(id: &WorkloadIdentity) -> String {
    format!("{}.{}.pem", id.namespace(), id.service_account())
}

/// The file's contents: the chain, then the key.
pub(super) fn encode(cert: &WorkloadCertificate) -> Vec<u8> {
    let mut out = String::new();
    for c in &cert.certified_key().cert {
        out.push_str(&pem::encode(&pem::Pem::new("CERTIFICATE", c.to_vec())));
    }
    out.push_str(&pem::encode(&pem::Pem::new(
        "PRIVATE KEY",
        cert.key_pkcs8_der().to_vec(),
    )));
    out.into_bytes()
}

/// The key and certificate a file holds, if it is to be trusted (see the module's doc).
pub(super) fn decode(
    bytes: &[u8],
    bundle: &TrustBundle,
    wanted: &BTreeSet<WorkloadIdentity>,
) -> Result<Restored, Rejected> {
    let blocks = pem::parse_many(bytes).map_err(|e| Rejected::Corrupt(format!("not PEM: {e}")))?;
    let mut chain = Vec::new();
    let mut key = None;
    for b in blocks {
        match (b.tag(), &key) {
            ("CERTIFICATE", None) => chain.push(CertificateDer::from(b.into_contents())),
            ("PRIVATE KEY", None) => key = Some(b.into_contents()),
            (tag, _) => {
                return Err(Rejected::Format(format!(
                    "unexpected PEM block {tag:?} (certificates, then one PRIVATE KEY)"
                )))
            }
        }
    }
    let key = key.ok_or_else(|| Rejected::Format("no PRIVATE KEY block".into()))?;
    let id = crate::tls::verify_own_svid(bundle, &chain, UnixTime::now()).map_err(|e| {
        use rustls::{CertificateError as C, Error as E};
        match e {
            E::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => Rejected::Expired,
            e => Rejected::Untrusted(e.to_string()),
        }
    })?;
    if !wanted.contains(&id) {
        return Err(Rejected::NotWanted(id));
    }
    let key = rcgen::KeyPair::try_from(key.as_slice())
        .map_err(|e| Rejected::Corrupt(format!("the key does not parse: {e}")))?;
    let cert = WorkloadCertificate::restore(&id, &key, chain)
        .map_err(|e| Rejected::Corrupt(e.to_string()))?;
    Ok(Restored {
        key,
        cert: Arc::new(cert),
    })
}

/// Every file of `dir` that can be trusted; each other one is handed to `rejected` with
/// its reason.
pub(super) fn load_all(
    dir: &Path,
    bundle: &TrustBundle,
    wanted: &BTreeSet<WorkloadIdentity>,
    mut rejected: impl FnMut(&Path, Rejected),
) -> Vec<Restored> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "pem"))
        .collect();
    paths.sort();
    let mut restored = Vec::new();
    for path in paths {
        let read = read_checked(&path, true)
            .and_then(|b| b.ok_or_else(|| Rejected::Io("removed while being read".into())));
        match read.and_then(|bytes| decode(&bytes, bundle, wanted)) {
            Ok(r) => restored.push(r),
            Err(why) => rejected(&path, why),
        }
    }
    restored
}

/// What is on disk now: file name → the SHA-256 of the leaf it holds (a digest, not the
/// leaf: with an identity per pod, a node's thousand leaves would be kept twice).
pub(super) type Written = BTreeMap<String, LeafDigest>;

/// The SHA-256 of a leaf certificate's DER.
pub(super) type LeafDigest = [u8; 32];

/// [`LeafDigest`] of `der`.
pub(super) fn leaf_digest(der: &[u8]) -> LeafDigest {
    let mut out = [0u8; 32];
    out.copy_from_slice(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, der).as_ref());
    out
}

/// What [`sync`] did.
#[derive(Debug, Default)]
pub(super) struct Synced {
    /// Files written.
    pub written: u64,
    /// Files that could not be written or removed, with why.
    pub failed: Vec<(PathBuf, io::Error)>,
}

/// Makes `dir` hold exactly `certs`: writes each whose leaf is not on disk yet and
/// removes the files of identities the proxy no longer holds.
pub(super) fn sync(
    dir: &Path,
    certs: &[Arc<WorkloadCertificate>],
    written: &mut Written,
) -> Synced {
    let mut done = Synced::default();
    let failed = &mut done.failed;
    let mut keep = BTreeSet::new();
    for cert in certs {
        let name = file_name(cert.identity());
        let leaf = leaf_digest(
            cert.certified_key()
                .cert
                .first()
                .map(|c| c.as_ref())
                .unwrap_or_default(),
        );
        keep.insert(name.clone());
        if written.get(&name) == Some(&leaf) {
            continue;
        }
        let path = dir.join(&name);
        match write_atomic(&path, &encode(cert)) {
            Ok(()) => {
                written.insert(name, leaf);
                done.written += 1;
            }
            Err(e) => failed.push((path, e)),
        }
    }
    let on_disk = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
        .unwrap_or_default();
    for name in on_disk {
        let name = name.to_string_lossy().into_owned();
        if name.ends_with(".pem") && !keep.contains(&name) {
            let path = dir.join(&name);
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    written.remove(&name);
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    written.remove(&name);
                }
                Err(e) => failed.push((path, e)),
            }
        }
    }
    done
}
