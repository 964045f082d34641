//! Which pod a process belongs to, read from its cgroup paths as the kubelet names them.
//!
//! | driver | a container's cgroup |
//! |---|---|
//! | cgroupfs | `/kubepods/burstable/pod<uid>/<container>` (`besteffort`, or no QoS level for Guaranteed pods) |
//! | systemd | `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope` |
//!
//! Either may sit below a prefix (the kubelet's `--cgroup-root`, a node running inside a
//! container). Read from inside a cgroup namespace (a proxy container on cgroup v2), a
//! path outside the namespace starts with `..` components, so the `kubepods` level may
//! not show: `/../../../besteffort/pod<uid>/<container>`. A process's `/proc/<pid>/cgroup` has one
//! `hierarchy:controllers:path` line per hierarchy: `0::/...` for cgroup v2, and lines
//! such as `12:pids:/kubepods/...` on v1 or hybrid hosts.
//!
//! What lies below a pod's cgroup may be named by the pod itself (a container allowed to
//! manage its cgroup). So only the first component, from the root, that has the shape of
//! a pod cgroup counts, and its UID must be well formed; deeper names are never read.

/// Length of a UID: 32 hex digits and 4 dashes.
const UID_LEN: usize = 36;

/// Whether `uid` is a Kubernetes UID as the kubelet writes it into cgroup names: lowercase
/// hex in groups of 8-4-4-4-12.
pub fn valid_uid(uid: &str) -> bool {
    uid.len() == UID_LEN
        && uid.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
        })
}

/// The pod UIDs named by the content of a `/proc/<pid>/cgroup` file (each once; lines that
/// are not `hierarchy:controllers:/path` are ignored).
pub fn pod_uids(content: &str) -> Vec<String> {
    let mut uids: Vec<String> = Vec::new();
    for uid in content.lines().filter_map(pod_uid_of_line) {
        if !uids.contains(&uid) {
            uids.push(uid);
        }
    }
    uids
}

/// The pod UID in one `/proc/<pid>/cgroup` line, if its path is inside a pod's cgroup.
pub fn pod_uid_of_line(line: &str) -> Option<String> {
    let mut fields = line.splitn(3, ':');
    let (hierarchy, _controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
    if hierarchy.parse::<u32>().is_err() || !path.starts_with('/') {
        return None;
    }
    pod_uid_of_path(path)
}

/// The pod UID in a cgroup path: that of its first component in the shape of a pod's
/// cgroup, in either naming, if that UID is well formed.
pub fn pod_uid_of_path(path: &str) -> Option<String> {
    let parts: Vec<&str> = path.split('/').collect();
    parts.iter().enumerate().find_map(|(i, part)| {
        let uid = cgroupfs_pod(&parts[..i], part).or_else(|| systemd_pod(part))?;
        // The first pod-shaped component decides, even when its UID is malformed.
        Some(valid_uid(&uid).then_some(uid))
    })?
}

/// `pod<uid>` right under `kubepods` or under one of its QoS levels.
fn cgroupfs_pod(parents: &[&str], part: &str) -> Option<String> {
    let uid = part.strip_prefix("pod")?;
    let above_qos = match parents {
        [rest @ .., "burstable" | "besteffort"] => rest,
        all => all,
    };
    (above_qos.last() == Some(&"kubepods") || outside_namespace(above_qos)).then(|| uid.to_string())
}

/// Whether `parents` are only the leading `..` the kernel writes for a cgroup outside the
/// reader's cgroup namespace: read from a container (a private cgroup namespace, the
/// default on cgroup v2), another pod's process shows as `/../../../besteffort/pod<uid>/…`,
/// the `kubepods` level being above what the reader sees. No cgroup can be named `..`,
/// so these components are the kernel's, not a pod's.
fn outside_namespace(parents: &[&str]) -> bool {
    matches!(parents, ["", up @ ..] if !up.is_empty() && up.iter().all(|p| *p == ".."))
}

/// `[<prefix>-]kubepods[-<qos>]-pod<uid_with_underscores>.slice`.
fn systemd_pod(part: &str) -> Option<String> {
    let name = part.strip_suffix(".slice")?;
    let (parent, uid) = name.rsplit_once("-pod")?;
    let kubepods = ["kubepods", "kubepods-burstable", "kubepods-besteffort"]
        .iter()
        .any(|k| parent == *k || parent.strip_suffix(k).is_some_and(|p| p.ends_with('-')));
    kubepods.then(|| uid.replace('_', "-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "4f5a2b1c-9d3e-4a7b-8c6d-0e1f2a3b4c5d";
    const OTHER: &str = "00000000-1111-4222-8333-444444444444";

    fn underscored(uid: &str) -> String {
        uid.replace('-', "_")
    }

    #[test]
    fn uids_are_lowercase_hex_in_the_kubernetes_groups() {
        assert!(valid_uid(UID));
        for bad in [
            "",
            "4F5A2B1C-9D3E-4A7B-8C6D-0E1F2A3B4C5D",
            "4f5a2b1c_9d3e_4a7b_8c6d_0e1f2a3b4c5d",
            "4f5a2b1c-9d3e-4a7b-8c6d-0e1f2a3b4c5",
            "4f5a2b1c-9d3e-4a7b-8c6d-0e1f2a3b4c5dd",
            "4f5a2b1c-9d3e-4a7b-8c6d-0e1f2a3b4c5g",
            "../../../../etc/passwd/aaaaaaaaaaaaaa",
        ] {
            assert!(!valid_uid(bad), "{bad:?}");
        }
    }

    #[test]
    fn both_kubelet_namings_and_every_qos_level_name_the_pod() {
        let u = underscored(UID);
        for path in [
            format!("/kubepods/burstable/pod{UID}/0123abcd"),
            format!("/kubepods/besteffort/pod{UID}/0123abcd"),
            format!("/kubepods/pod{UID}/0123abcd"),
            format!("/kubepods/pod{UID}"),
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-0123.scope"),
            format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/crio-0123.scope"),
            format!("/kubepods.slice/kubepods-pod{u}.slice/cri-containerd-0123.scope"),
            // Below a prefix: a kind node, a test's cgroup, the kubelet's --cgroup-root.
            format!("/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{u}.slice/cri-containerd-1.scope"),
            format!("/docker/abc/kubepods/burstable/pod{UID}/0123"),
            format!("/test-77/node-b/kubepods/besteffort/pod{UID}/ctr-1"),
            // Read from a container in a cgroup namespace of its own.
            format!("/../../../besteffort/pod{UID}/0123"),
            format!("/../../pod{UID}/0123"),
            format!("/../../../kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/crio-1.scope"),
        ] {
            assert_eq!(pod_uid_of_path(&path).as_deref(), Some(UID), "{path}");
        }
    }

    #[test]
    fn paths_outside_pods_and_lookalikes_name_no_pod() {
        for path in [
            "/".to_string(),
            "/user.slice/user-0.slice/session-1.scope".into(),
            "/kubepods".into(),
            "/kubepods/burstable".into(),
            "/kubepods.slice/kubepods-burstable.slice".into(),
            format!("/system.slice/pod{UID}"),
            format!("/kubepods/guaranteed/pod{UID}/x"),
            format!("/other/pod{UID}/x"),
            format!("/../other/pod{UID}/x"),
            format!("/../kubepods/../pod{UID}/x"),
            format!("/pod{UID}/x"),
            format!("/kubepods/burstable/pod{}/x", UID.to_uppercase()),
            format!("/kubepods/burstable/pod{UID}x/x"),
            format!("/system.slice/notkubepods-pod{}.slice", underscored(UID)),
            format!(
                "/kubepods.slice/kubepods-burstable-pod{}.scope",
                underscored(UID)
            ),
        ] {
            assert_eq!(pod_uid_of_path(&path), None, "{path}");
        }
    }

    #[test]
    fn only_the_outermost_pod_cgroup_counts_not_what_a_pod_names_below_it() {
        // A container that manages its own cgroup makes one that looks like another pod.
        let nested = format!("/kubepods/besteffort/pod{UID}/ctr/kubepods/besteffort/pod{OTHER}/x");
        assert_eq!(pod_uid_of_path(&nested).as_deref(), Some(UID));
        let u = underscored(OTHER);
        let nested = format!(
            "/kubepods.slice/kubepods-pod{}.slice/cri-containerd-1.scope/kubepods-pod{u}.slice",
            underscored(UID)
        );
        assert_eq!(pod_uid_of_path(&nested).as_deref(), Some(UID));
        // A malformed outermost UID is not passed over for a well-formed one below it.
        let malformed = format!("/kubepods/besteffort/podNOT-A-UID/kubepods/pod{OTHER}");
        assert_eq!(pod_uid_of_path(&malformed), None);
    }

    #[test]
    fn cgroup_files_of_v1_hybrid_and_v2_hosts_are_read_line_by_line() {
        let hybrid = format!(
            "12:pids:/kubepods/burstable/pod{UID}/abc\n\
             11:cpu,cpuacct:/kubepods/burstable/pod{UID}/abc\n\
             1:name=systemd:/kubepods/burstable/pod{UID}/abc\n\
             0::/\n"
        );
        assert_eq!(pod_uids(&hybrid), [UID]);
        let v2 = format!(
            "0::/kubepods.slice/kubepods-pod{}.slice/cri-containerd-ab.scope\n",
            underscored(UID)
        );
        assert_eq!(pod_uids(&v2), [UID]);
        let garbage = format!(
            "\n\
             garbage\n\
             x:pids:/kubepods/pod{UID}/a\n\
             12:pids:kubepods/pod{UID}/a\n\
             12:pids\n\
             ::::\n\
             0::/kubepods/pod{OTHER}/a:b\n"
        );
        assert_eq!(pod_uids(&garbage), [OTHER]);
        assert!(pod_uids("0::/user.slice\n").is_empty());
    }
}
