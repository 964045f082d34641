//! How a served pod's service ends: with its redirection removed (an explicit end), or
//! with its redirection kept and its traffic refused (fail closed) until one comes.

use crate::cni::CniPods;
use crate::discovery::DiscoveryState;

/// What happens to a pod the proxy no longer serves as it was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ending {
    /// An explicit end: its redirection goes, and its traffic flows as a pod outside the
    /// mesh's does.
    End(String),
    /// No explicit end: its redirection stays and its traffic is refused, until discovery
    /// lists it again (served again) or an explicit end comes.
    Hold(String),
}

/// What is known of a pod that is no longer served as it was.
#[derive(Clone, Copy, Debug)]
pub struct Leaving<'a> {
    /// `<namespace>/<name>`.
    pub key: &'a str,
    /// It was handed over by the CNI plugin or enrolment (else discovery named its netns).
    pub from_cni: bool,
    /// Discovery wants it served again, with another sandbox or other addresses.
    pub replaced: bool,
    /// Its network namespace is gone (a discovery-named path that no longer leads to it).
    pub netns_gone: bool,
}

/// Only an explicit end removes a pod's redirection: its sandbox replaced, a CNI DEL (or
/// enrolment releasing it), its network namespace gone, or discovery listing it on this
/// node as not meshed. A pod that merely disappears from discovery — a partial reload, a
/// control-plane bug, a force-deleted pod whose DEL has not come yet — is held.
pub fn ending(pod: Leaving<'_>, state: &DiscoveryState, cni: &CniPods, node: &str) -> Ending {
    if pod.replaced {
        return Ending::End("its sandbox or addresses changed".into());
    }
    if pod.from_cni && !cni.contains_key(pod.key) {
        return Ending::End("its sandbox was deleted (CNI DEL) or released".into());
    }
    if pod.netns_gone {
        return Ending::End("its network namespace is gone".into());
    }
    match state.workload(pod.key) {
        Some(w) if w.node == node && !w.meshed => {
            Ending::End("no longer meshed (its annotation or its namespace's)".into())
        }
        Some(w) if w.node == node && !pod.from_cni && w.netns.is_none() => {
            Ending::End("discovery no longer names its network namespace".into())
        }
        Some(w) if w.node != node => Ending::Hold(format!(
            "discovery has it on node {:?}, while its sandbox is still here",
            w.node
        )),
        Some(_) => Ending::Hold("discovery lists it, but not as this sandbox".into()),
        None => Ending::Hold("not in discovery".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::{CniPod, PodSource};
    use ambit_api::proto::discovery as pb;

    fn state(pods: &[(&str, &str, bool)]) -> DiscoveryState {
        let mut s = DiscoveryState::default();
        let workloads = pods
            .iter()
            .map(|(name, node, meshed)| pb::Workload {
                namespace: "shop".into(),
                name: (*name).into(),
                node: (*node).into(),
                ips: vec!["10.1.0.9".into()],
                identity: format!("spiffe://cluster.local/ns/shop/sa/{name}"),
                meshed: *meshed,
                ..Default::default()
            })
            .collect();
        let invalid = s.apply(pb::Update {
            snapshot: true,
            workloads,
            ..Default::default()
        });
        assert!(invalid.is_empty(), "{invalid:?}");
        s
    }

    fn cni(keys: &[&str]) -> CniPods {
        std::sync::Arc::new(
            keys.iter()
                .map(|k| {
                    (
                        (*k).to_string(),
                        CniPod {
                            namespace: "shop".into(),
                            name: k.trim_start_matches("shop/").into(),
                            uid: String::new(),
                            container_id: "c1".into(),
                            ips: vec![],
                            netns: "/run/ambit/netns/c1".into(),
                            source: PodSource::Cni,
                        },
                    )
                })
                .collect(),
        )
    }

    fn leaving(key: &str) -> Leaving<'_> {
        Leaving {
            key,
            from_cni: true,
            replaced: false,
            netns_gone: false,
        }
    }

    #[test]
    fn only_an_explicit_end_removes_redirection() {
        let node = "node-a";
        let s = state(&[
            ("web", node, false),
            ("api", "node-b", true),
            ("db", node, true),
        ]);
        let held = cni(&["shop/web", "shop/api", "shop/db", "shop/gone"]);
        // Explicit ends.
        assert!(matches!(
            ending(leaving("shop/web"), &s, &held, node),
            Ending::End(why) if why.contains("no longer meshed")
        ));
        assert!(matches!(
            ending(leaving("shop/deleted"), &s, &held, node),
            Ending::End(why) if why.contains("CNI DEL")
        ));
        let replaced = Leaving {
            replaced: true,
            ..leaving("shop/db")
        };
        assert!(matches!(ending(replaced, &s, &held, node), Ending::End(_)));
        let gone = Leaving {
            from_cni: false,
            netns_gone: true,
            ..leaving("shop/gone")
        };
        assert!(matches!(ending(gone, &s, &held, node), Ending::End(_)));
        // No explicit end: held, failing closed.
        assert_eq!(
            ending(leaving("shop/gone"), &s, &held, node),
            Ending::Hold("not in discovery".into())
        );
        assert!(matches!(
            ending(leaving("shop/api"), &s, &held, node),
            Ending::Hold(why) if why.contains("node-b")
        ));
        // A discovery that lost everything (a partial reload) holds every pod.
        let empty = DiscoveryState::default();
        for key in ["shop/web", "shop/api", "shop/db"] {
            assert!(matches!(
                ending(leaving(key), &empty, &held, node),
                Ending::Hold(_)
            ));
        }
    }
}
