//! Where the state in use came from, for `/config_dump` and `/metrics`: the control
//! plane, or the disk (with the age of what was read).

use super::files::unix_now;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex, PoisonError};

/// One kind of persisted state.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub(super) enum Kind {
    Discovery,
    Policy,
    Identity,
}

impl Kind {
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Discovery => "discovery",
            Kind::Policy => "policy",
            Kind::Identity => "identity",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

fn labels(kind: Kind) -> KindLabels {
    KindLabels { kind: kind.name() }
}

/// Files written, failures, files refused at start-up, and what is in use from disk.
#[derive(Clone, Debug, Default)]
pub struct PersistMetrics {
    writes: Family<KindLabels, Counter>,
    write_failures: Family<KindLabels, Counter>,
    rejected: Family<KindLabels, Counter>,
    from_disk: Family<KindLabels, Gauge>,
    saved: Family<KindLabels, Gauge>,
}

impl PersistMetrics {
    /// Creates the metrics and registers them.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "persisted_state_writes",
            "State files written to the run directory, by kind (discovery, policy, identity)",
            m.writes.clone(),
        );
        registry.register(
            "persisted_state_write_failures",
            "State files that could not be written or removed, by kind",
            m.write_failures.clone(),
        );
        registry.register(
            "persisted_state_rejected",
            "State files ignored at start-up (corrupt, of another node or trust domain, not chaining to the trust anchors, expired, or of an identity no longer on the node), by kind",
            m.rejected.clone(),
        );
        registry.register(
            "persisted_state_from_disk",
            "1 while the discovery or policy state in use is the one read from disk (the control plane has not answered since the start); for identity, how many certificates in use were read from disk",
            m.from_disk.clone(),
        );
        registry.register(
            "persisted_state_saved_timestamp_seconds",
            "When the state read from disk at start-up had been written, seconds since the Unix epoch",
            m.saved.clone(),
        );
        m
    }

    pub(super) fn written(&self, kind: Kind, files: u64) {
        self.writes.get_or_create(&labels(kind)).inc_by(files);
    }

    pub(super) fn write_failed(&self, kind: Kind) {
        self.write_failures.get_or_create(&labels(kind)).inc();
    }

    pub(super) fn rejected(&self, kind: Kind) {
        self.rejected.get_or_create(&labels(kind)).inc();
    }

    #[cfg(test)]
    pub(super) fn rejected_count(&self, kind: Kind) -> u64 {
        self.rejected.get_or_create(&labels(kind)).get()
    }

    pub(super) fn set_from_disk(&self, kind: Kind, n: i64) {
        self.from_disk.get_or_create(&labels(kind)).set(n);
    }

    pub(super) fn set_saved(&self, kind: Kind, unix: u64) {
        self.saved
            .get_or_create(&labels(kind))
            .set(i64::try_from(unix).unwrap_or(i64::MAX));
    }
}

/// Where one kind of state in use came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Origin {
    /// Nothing yet: no usable file, and the control plane has not answered.
    #[default]
    None,
    /// Read from disk at start-up; written then.
    Disk { saved_unix: u64 },
    /// From the control plane, since then.
    ControlPlane { since_unix: u64 },
}

impl Origin {
    fn dump(self) -> Value {
        match self {
            Origin::None => json!({ "source": "none" }),
            Origin::Disk { saved_unix } => json!({
                "source": "disk",
                "saved_unix": saved_unix,
                "age_seconds": unix_now().saturating_sub(saved_unix),
            }),
            Origin::ControlPlane { since_unix } => json!({
                "source": "control-plane",
                "since_unix": since_unix,
            }),
        }
    }
}

#[derive(Debug, Default)]
struct Sources {
    discovery: Origin,
    policy: Origin,
    last_write_unix: Option<u64>,
}

/// The origins of discovery and policy, shared by the writer and the admin views.
#[derive(Clone, Debug, Default)]
pub(super) struct Status {
    inner: Arc<Mutex<Sources>>,
}

impl Status {
    fn lock(&self) -> std::sync::MutexGuard<'_, Sources> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records where `kind` (discovery or policy) now comes from.
    pub(super) fn set(&self, kind: Kind, origin: Origin) {
        let mut s = self.lock();
        match kind {
            Kind::Discovery => s.discovery = origin,
            Kind::Policy => s.policy = origin,
            Kind::Identity => {}
        }
    }

    /// The control plane has sent `kind`: from now on it is the source. Returns whether
    /// that is news.
    pub(super) fn heard(&self, kind: Kind) -> bool {
        let mut s = self.lock();
        let origin = match kind {
            Kind::Discovery => &mut s.discovery,
            Kind::Policy => &mut s.policy,
            Kind::Identity => return false,
        };
        if matches!(origin, Origin::ControlPlane { .. }) {
            return false;
        }
        *origin = Origin::ControlPlane {
            since_unix: unix_now(),
        };
        true
    }

    pub(super) fn wrote(&self) {
        self.lock().last_write_unix = Some(unix_now());
    }

    /// Discovery's and policy's origins and the last write, as `/config_dump` shows them.
    pub(super) fn dump(&self) -> (Value, Value, Option<u64>) {
        let s = self.lock();
        (s.discovery.dump(), s.policy.dump(), s.last_write_unix)
    }
}
