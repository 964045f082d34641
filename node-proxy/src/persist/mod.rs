//! What the node proxy keeps on disk so that a restart while the control plane is away
//! serves its pods from the last state it had, not from nothing: the discovery snapshot,
//! the inbound policies and routes, and each identity's key and certificate.
//!
//! # Layout
//!
//! - [`files`]: the state directory (`<run dir>/state`, 0700), files written whole
//!   (temporary file + rename, 0600), and the envelope of discovery and policy (node,
//!   trust domain, time written, length and SHA-256 of the payload).
//! - [`discovery`], [`policy`]: each state as one protobuf snapshot, and back.
//! - [`identities`]: one PEM file per identity (chain, then key), checked against the
//!   current trust anchors when read.
//! - [`writer`]: follows the states and writes what changed, at most once a second (and
//!   a tenth of the time), off the runtime's threads (never on the data path).
//! - [`status`]: where the state in use came from (`/config_dump`) and the metrics.
//!
//! At start-up, [`load`] reads the files before the control plane is asked anything: a
//! file that is damaged, of another node or trust domain, whose certificate does not
//! chain to the current anchors, has expired, or is of an identity no pod on the node has
//! (per the discovery state read with it) is ignored with a warning naming the file and
//! why, and counted in `persisted_state_rejected_total{kind}` — never trusted blindly.
//! What is read is marked as synced, so the pods are served at once; the control plane's
//! first snapshot replaces it when it answers.

mod discovery;
mod files;
mod identities;
mod policy;
mod status;
mod writer;

pub use status::PersistMetrics;

use crate::admin::ConfigDump;
use crate::config::Config;
use crate::discovery::DiscoveryState;
use crate::identity::IdentityManager;
use crate::policy::{PolicyState, PortPolicy};
use crate::tls::TrustBundle;
use ambit_api::WorkloadIdentity;
use files::Owner;
use prometheus_client::registry::Registry;
use serde_json::json;
use status::{Kind, Origin, Status};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The subdirectory of the run directory that holds the state.
pub const STATE_DIR: &str = "state";

/// Why a state file was not used.
#[derive(Debug, thiserror::Error)]
pub enum Rejected {
    /// It could not be read.
    #[error("cannot read it: {0}")]
    Io(String),
    /// Someone other than its owner could have written it (or read it, for a key).
    #[error("its mode is {mode:o} and its owner uid {owner}: only a file of this user that no one else can write (or read, for a key) is trusted; remove it")]
    Mode {
        /// Permission bits.
        mode: u32,
        /// Owner uid.
        owner: u32,
    },
    /// It is not a state file of this kind.
    #[error("not a state file the proxy wrote: {0}")]
    Format(String),
    /// It is damaged (cut short, altered, or not decoding).
    #[error("damaged: {0}")]
    Corrupt(String),
    /// It was written by the proxy of another node.
    #[error("written for node {got:?}, this is {want:?}")]
    OtherNode {
        /// The node in the file.
        got: String,
        /// This node.
        want: String,
    },
    /// It was written in another trust domain.
    #[error("written in trust domain {got:?}, this proxy is in {want:?}")]
    OtherTrustDomain {
        /// The trust domain in the file.
        got: String,
        /// This proxy's.
        want: String,
    },
    /// Its certificate does not verify against the trust anchors the proxy has now.
    #[error("its certificate does not verify against the current trust anchors: {0}")]
    Untrusted(String),
    /// Its certificate has expired.
    #[error("its certificate has expired")]
    Expired,
    /// No pod on this node runs as its identity.
    #[error("no pod on this node runs as {0} (per the discovery state on disk)")]
    NotWanted(WorkloadIdentity),
}

/// What the proxy writes its state for, and where.
#[derive(Clone, Debug)]
pub struct Persister {
    dir: PathBuf,
    owner: Owner,
    identities: IdentityManager,
    metrics: PersistMetrics,
    status: Status,
    /// The identity files read at start-up (not written again until they change).
    loaded: identities::Written,
}

/// The state read at start-up, to start the proxy with.
#[derive(Debug)]
pub struct Loaded {
    /// Discovery: from disk (synced), or empty.
    pub discovery: Arc<DiscoveryState>,
    /// Policy: from disk over the start-up default, or the default alone.
    pub policy: Arc<PolicyState>,
    /// Writes the state from now on ([`Persister::run`]) and shows where it came from
    /// ([`Persister::config_dump`]).
    pub persister: Persister,
}

/// Reads the state kept in `config.run_dir`: discovery and policy to start with, and the
/// certificates handed to `identities` ([`IdentityManager::restore`]). Never fails: what
/// cannot be used is logged, counted and left out.
pub fn load(
    config: &Config,
    bundle: &TrustBundle,
    fallback: PortPolicy,
    identities: &IdentityManager,
    registry: &mut Registry,
) -> Loaded {
    let metrics = PersistMetrics::register(registry);
    let dir = config.run_dir.join(STATE_DIR);
    let owner = Owner {
        node: config.node_name.clone(),
        trust_domain: config.trust_domain.clone(),
    };
    load_from(&dir, owner, bundle, fallback, identities, metrics)
}

fn load_from(
    dir: &Path,
    owner: Owner,
    bundle: &TrustBundle,
    fallback: PortPolicy,
    identities: &IdentityManager,
    metrics: PersistMetrics,
) -> Loaded {
    let status = Status::default();
    let made = files::ensure_dir(dir).and_then(|()| files::ensure_dir(&dir.join(identities::DIR)));
    if let Err(error) = made {
        tracing::error!(dir = %dir.display(), %error, "cannot make the state directory; the proxy runs without keeping its state (a restart while the control plane is away starts from nothing)");
    }
    files::remove_leftovers(dir);
    files::remove_leftovers(&dir.join(identities::DIR));
    let reject = |kind: Kind, path: &Path, why: &Rejected| {
        metrics.rejected(kind);
        tracing::warn!(file = %path.display(), kind = kind.name(), reason = %why, "ignoring a persisted state file");
    };

    let path = dir.join(discovery::FILE);
    let discovery = read(&path, |b| discovery::decode(b, &owner))
        .map_err(|why| reject(Kind::Discovery, &path, &why))
        .ok()
        .flatten();
    let discovery = match discovery {
        Some((header, state)) => {
            tracing::info!(file = %path.display(), age_s = header.age().as_secs(), workloads = state.workloads().count(), "serving from the discovery state kept on disk until the control plane answers");
            restored(&metrics, &status, Kind::Discovery, header.saved_unix);
            state
        }
        None => DiscoveryState::default(),
    };

    let path = dir.join(policy::FILE);
    let policy = read(&path, |b| policy::decode(b, &owner, fallback.clone()))
        .map_err(|why| reject(Kind::Policy, &path, &why))
        .ok()
        .flatten();
    let policy = match policy {
        Some((header, state)) => {
            tracing::info!(file = %path.display(), age_s = header.age().as_secs(), pods = state.len(), "serving the inbound policy kept on disk until the control plane answers");
            restored(&metrics, &status, Kind::Policy, header.saved_unix);
            state
        }
        None => PolicyState::new(fallback),
    };

    let wanted: BTreeSet<WorkloadIdentity> = discovery
        .local_workloads(&owner.node)
        .iter()
        .map(|w| w.identity.clone())
        .collect();
    let certs = identities::load_all(&dir.join(identities::DIR), bundle, &wanted, |p, why| {
        reject(Kind::Identity, p, &why)
    });
    let mut loaded = identities::Written::new();
    for r in &certs {
        let id = r.cert.identity();
        tracing::info!(identity = %id, not_after = ?r.cert.not_after(), "a certificate kept on disk is still valid; serving with it until it is renewed");
        if let Some(leaf) = r.cert.certified_key().cert.first() {
            loaded.insert(identities::file_name(id), identities::leaf_digest(leaf));
        }
    }
    metrics.set_from_disk(Kind::Identity, certs.len() as i64);
    identities.restore(certs);

    Loaded {
        discovery: Arc::new(discovery),
        policy: Arc::new(policy),
        persister: Persister {
            dir: dir.to_path_buf(),
            owner,
            identities: identities.clone(),
            metrics,
            status,
            loaded,
        },
    }
}

/// Reads and decodes `path`; `Ok(None)` when there is none.
fn read<T>(
    path: &Path,
    decode: impl FnOnce(&[u8]) -> Result<T, Rejected>,
) -> Result<Option<T>, Rejected> {
    match files::read_checked(path, false)? {
        Some(bytes) => decode(&bytes).map(Some),
        None => Ok(None),
    }
}

fn restored(metrics: &PersistMetrics, status: &Status, kind: Kind, saved_unix: u64) {
    metrics.set_from_disk(kind, 1);
    metrics.set_saved(kind, saved_unix);
    status.set(kind, Origin::Disk { saved_unix });
}

impl Persister {
    /// `inner` with `persisted_state` added: the state directory, where discovery and
    /// policy in use came from (`disk` with its age, or `control-plane` since when), and
    /// each identity's certificate's (never a key).
    pub fn config_dump(&self, inner: ConfigDump) -> ConfigDump {
        let this = self.clone();
        Arc::new(move || {
            let mut dump = inner();
            let (discovery, policy, last_write) = this.status.dump();
            let ids: Vec<_> = this
                .identities
                .certificates()
                .iter()
                .map(|c| {
                    json!({
                        "identity": c.identity().to_string(),
                        "source": if c.restored() { "disk" } else { "control-plane" },
                    })
                })
                .collect();
            if let Some(map) = dump.as_object_mut() {
                map.insert(
                    "persisted_state".into(),
                    json!({
                        "dir": this.dir,
                        "discovery": discovery,
                        "policy": policy,
                        "identities": ids,
                        "last_write_unix": last_write,
                    }),
                );
            }
            dump
        })
    }
}

#[cfg(test)]
mod tests;
