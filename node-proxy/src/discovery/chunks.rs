//! Snapshots arrive in chunks (`more` set on all but the last); the state must only ever
//! see a whole one. A partial snapshot applied as if complete would make every pod in
//! the later chunks disappear for a moment — and a pod that disappears from discovery
//! loses its listeners.

use ambit_api::proto::discovery as pb;

/// Gathers a snapshot's chunks; passes deltas through.
#[derive(Debug, Default)]
pub(super) struct Chunks {
    pending: Option<pb::Update>,
}

impl Chunks {
    /// The update to apply once `update` has arrived, if any: a delta at once, a snapshot
    /// when its last chunk is in. A stream that ends mid-snapshot leaves nothing applied
    /// (the next stream starts with a new snapshot).
    pub(super) fn push(&mut self, mut update: pb::Update) -> Option<pb::Update> {
        if update.snapshot {
            self.pending = None;
        }
        let whole = match self.pending.take() {
            Some(mut snapshot) => {
                snapshot.workloads.append(&mut update.workloads);
                snapshot.services.append(&mut update.services);
                snapshot
                    .removed_workloads
                    .append(&mut update.removed_workloads);
                snapshot
                    .removed_services
                    .append(&mut update.removed_services);
                snapshot.more = update.more;
                snapshot
            }
            None => update,
        };
        if whole.more {
            self.pending = Some(whole);
            None
        } else {
            Some(whole)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(snapshot: bool, more: bool, names: &[&str]) -> pb::Update {
        pb::Update {
            snapshot,
            more,
            workloads: names
                .iter()
                .map(|n| pb::Workload {
                    name: (*n).into(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn names(u: &pb::Update) -> Vec<&str> {
        u.workloads.iter().map(|w| w.name.as_str()).collect()
    }

    #[test]
    fn a_snapshot_is_applied_whole_and_deltas_pass_through() {
        let mut c = Chunks::default();
        assert_eq!(names(&c.push(chunk(false, false, &["d"])).unwrap()), ["d"]);
        assert!(c.push(chunk(true, true, &["a"])).is_none());
        assert!(c.push(chunk(false, true, &["b"])).is_none());
        let whole = c.push(chunk(false, false, &["c"])).unwrap();
        assert!(whole.snapshot && !whole.more);
        assert_eq!(names(&whole), ["a", "b", "c"]);
        // A new snapshot that starts before the last one ended replaces it.
        assert!(c.push(chunk(true, true, &["x"])).is_none());
        let whole = c.push(chunk(true, false, &["y"])).unwrap();
        assert_eq!(names(&whole), ["y"]);
        // A delta in chunks (a big change) is applied whole too.
        assert!(c.push(chunk(false, true, &["d1"])).is_none());
        assert!(c.push(chunk(false, true, &["d2"])).is_none());
        let whole = c.push(chunk(false, false, &["d3"])).unwrap();
        assert!(!whole.snapshot && !whole.more);
        assert_eq!(names(&whole), ["d1", "d2", "d3"]);
    }
}
