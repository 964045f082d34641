//! What changed in the index since discovery last looked: the objects it must render
//! again. A change to one pod costs discovery one pod's rendering (and the Services it is
//! an endpoint of), not the cluster's.

use super::ClusterIndex;
use std::collections::BTreeSet;

/// Objects changed since the last [`crate::index::SharedIndex::take_changes`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Everything may have changed (a re-list of a kind): render it all and compare.
    pub all: bool,
    /// Pods by (namespace, name).
    pub pods: BTreeSet<(String, String)>,
    /// Namespaces whose every pod may render differently: the namespace's annotations, or
    /// a Server of it (a Server marking a port opaque changes its pods' opaque ports).
    pub namespaces: BTreeSet<String>,
    /// Services by (namespace, name): the Service or one of its EndpointSlices.
    pub services: BTreeSet<(String, String)>,
}

impl Changes {
    /// Nothing changed.
    pub fn is_empty(&self) -> bool {
        !self.all && self.pods.is_empty() && self.namespaces.is_empty() && self.services.is_empty()
    }

    /// Adds `other` to these.
    pub fn merge(&mut self, mut other: Changes) {
        self.all |= other.all;
        self.pods.append(&mut other.pods);
        self.namespaces.append(&mut other.namespaces);
        self.services.append(&mut other.services);
    }

    /// What differs between two indexes (a backend that replaces the whole index: the
    /// local backend's reload). Comparing the objects is cheap beside rendering them.
    pub fn between(old: &ClusterIndex, new: &ClusterIndex) -> Changes {
        fn keys<K: Ord + Clone, V: PartialEq>(
            old: &std::collections::BTreeMap<K, V>,
            new: &std::collections::BTreeMap<K, V>,
        ) -> BTreeSet<K> {
            let changed = new
                .iter()
                .filter(|(k, v)| old.get(*k) != Some(*v))
                .map(|(k, _)| k.clone());
            let gone = old.keys().filter(|k| !new.contains_key(*k)).cloned();
            changed.chain(gone).collect()
        }
        let mut namespaces = keys(&old.namespaces, &new.namespaces);
        namespaces.extend(
            keys(&old.servers, &new.servers)
                .into_iter()
                .map(|(ns, _)| ns),
        );
        let mut services = keys(&old.services, &new.services);
        // A slice names its Service: the one it had and the one it has both change.
        for key in keys(&old.endpoint_slices, &new.endpoint_slices) {
            for index in [old, new] {
                if let Some((svc, _)) = index.endpoint_slices.get(&key) {
                    services.insert((key.0.clone(), svc.clone()));
                }
            }
        }
        Changes {
            all: old.trust_domain != new.trust_domain || old.local_netns != new.local_netns,
            pods: keys(&old.pods, &new.pods),
            namespaces,
            services,
        }
    }
}
