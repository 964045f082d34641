//! `ambit check --pre`: can this node run the node proxy? Kernel and BTF, cgroup v2,
//! bpffs, whether the eBPF programs load (a probe that attaches nothing and leaves
//! nothing), nftables for the fallback, a primary CNI configuration to chain onto, and a
//! synchronised clock.

use super::report::Check;
use std::path::{Path, PathBuf};

/// The oldest kernel the eBPF redirection runs on: `SO_NETNS_COOKIE` (5.14) is the
/// newest feature it needs (`sk_lookup` is 5.9, cgroup `connect` hooks 4.17).
pub const EBPF_KERNEL: (u32, u32) = (5, 14);

/// Where `--pre` looks.
#[derive(Clone, Debug, clap::Args)]
pub struct PreArgs {
    /// The cgroup v2 hierarchy the outbound eBPF programs attach to (the proxy's
    /// `--cgroup-path`) [default: the running demo's node cgroup, else /sys/fs/cgroup].
    #[arg(long)]
    pub cgroup_path: Option<PathBuf>,
    /// Where bpffs is (or will be) mounted.
    #[arg(long, default_value = "/sys/fs/bpf")]
    pub bpffs: PathBuf,
    /// The node's CNI configuration directory [default: /etc/cni/net.d; none for the
    /// running demo, whose pods do not arrive through CNI].
    #[arg(long)]
    pub cni_conf_dir: Option<PathBuf>,
    /// Checking the running demo's nodes (`ambit demo up`), not a cluster's.
    #[arg(skip)]
    pub demo: bool,
}

/// "6.1.0-18-amd64" → (6, 1).
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

fn kernel() -> Check {
    let description = format!(
        "the kernel supports eBPF redirection ({}.{} or later)",
        EBPF_KERNEL.0, EBPF_KERNEL.1
    );
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|r| r.trim().to_string())
        .unwrap_or_default();
    match kernel_version(&release) {
        Some(v) if v >= EBPF_KERNEL => Check::ok(format!("{description}: {release}")),
        Some(_) => Check::warn(
            description,
            format!("kernel {release}"),
            "the proxy will redirect with nftables (--redirect auto); upgrade the kernel for eBPF",
        ),
        None => Check::warn(
            description,
            format!("cannot read the kernel version from {release:?}"),
            "check `uname -r`",
        ),
    }
}

fn btf() -> Check {
    let path = Path::new("/sys/kernel/btf/vmlinux");
    if path.exists() {
        Check::ok("the kernel has BTF (/sys/kernel/btf/vmlinux)")
    } else {
        Check::warn(
            "the kernel has BTF (/sys/kernel/btf/vmlinux)",
            "not found",
            "eBPF programs load without it on this kernel only if they need no relocations; a kernel built with CONFIG_DEBUG_INFO_BTF=y is safer",
        )
    }
}

fn cgroup_v2(path: &Path) -> Check {
    let description = format!("{} is a cgroup v2 hierarchy", path.display());
    match nix::sys::statfs::statfs(path) {
        Ok(fs) if fs.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC => {
            Check::ok(description)
        }
        Ok(_) => {
            let unified = path.join("unified");
            let hint = match nix::sys::statfs::statfs(&unified) {
                Ok(fs) if fs.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC => format!(
                    "a hybrid hierarchy: cgroup v2 is at {}; pass it as the proxy's --cgroup-path (pods' processes must be in it)",
                    unified.display()
                ),
                _ => "boot with cgroup v2 (systemd.unified_cgroup_hierarchy=1); until then the proxy falls back to nftables".into(),
            };
            Check::warn(description, "not cgroup2", hint)
        }
        Err(e) => Check::fail(
            description,
            e.to_string(),
            "pass the node's cgroup v2 mount as --cgroup-path",
        ),
    }
}

fn bpffs(path: &Path) -> Check {
    let description = format!("bpffs is mounted at {}", path.display());
    match nix::sys::statfs::statfs(path) {
        Ok(fs) if fs.filesystem_type() == nix::sys::statfs::BPF_FS_MAGIC => Check::ok(description),
        Ok(_) | Err(_) if path == Path::new("/sys/fs/bpf") => Check::warn(
            description,
            "not mounted",
            "the proxy mounts it at start; mount it on the host (`mount -t bpf bpf /sys/fs/bpf`) so that pinned maps outlive the proxy's container",
        ),
        Ok(_) => Check::fail(description, "not a bpffs", "mount one there: `mount -t bpf bpf <dir>`"),
        Err(e) => Check::fail(description, e.to_string(), "mount one there: `mount -t bpf bpf <dir>`"),
    }
}

fn programs_load(bpffs: &Path) -> Check {
    let description = "the eBPF programs pass the verifier (loaded, not attached)";
    match ambit_ebpf::probe(bpffs) {
        Ok(()) => Check::ok(description),
        Err(e) => Check::warn(
            description,
            e.to_string(),
            "the proxy falls back to nftables (--redirect auto); run as root with CAP_BPF, on a kernel with BTF",
        ),
    }
}

fn nftables() -> Check {
    let description = "nftables is available for the fallback (`nft` with JSON support)";
    match std::process::Command::new("nft").arg("-V").output() {
        Ok(out) if out.status.success() => nft_version(description, &String::from_utf8_lossy(&out.stdout)),
        Ok(out) => Check::warn(
            description,
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
            "install nftables (Debian: `apt-get install nftables`)",
        ),
        Err(e) => Check::warn(
            description,
            format!("cannot run nft: {e}"),
            "install nftables (Debian: `apt-get install nftables`); without eBPF, pods cannot be redirected",
        ),
    }
}

/// Judges `nft -V`'s output: the proxy applies its rules as JSON (`nft -j`).
fn nft_version(description: &str, out: &str) -> Check {
    let version = out.lines().next().unwrap_or_default().trim();
    let json = out.lines().any(|l| {
        let mut words = l.split(':').map(str::trim);
        words.next() == Some("json") && words.next() == Some("yes")
    });
    if json {
        Check::ok(format!("{description}: {version}"))
    } else {
        Check::warn(
            description,
            format!("{version} is built without JSON support (`nft -V` does not say `json: yes`)"),
            "install an nft built with JSON support (Debian's is); the proxy applies its rules with `nft -j`",
        )
    }
}

fn primary_cni(dir: &Path) -> Check {
    let description = format!("a primary CNI configuration is in {}", dir.display());
    let hint = "install the cluster's CNI (Calico, Cilium, flannel, the bridge plugin …) first: ambit-cni chains after it";
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            let mut confs: Vec<String> = entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".conf") || n.ends_with(".conflist"))
                .collect();
            confs.sort();
            match confs.first() {
                Some(first) => Check::ok(format!("{description}: {first}")),
                None => Check::fail(description, "no .conf or .conflist file", hint),
            }
        }
        Err(e) => Check::fail(description, e.to_string(), hint),
    }
}

fn clock() -> Check {
    let description = "the clock is synchronised (certificates are checked against it)";
    // SAFETY: adjtimex with modes 0 only reads the kernel's clock state into `tx`.
    #[allow(unsafe_code)]
    let (state, status) = unsafe {
        let mut tx: libc::timex = std::mem::zeroed();
        let state = libc::adjtimex(&mut tx);
        (state, tx.status)
    };
    if state == -1 {
        return Check::warn(
            description,
            std::io::Error::last_os_error().to_string(),
            "check `timedatectl`",
        );
    }
    if state == libc::TIME_ERROR || status & libc::STA_UNSYNC != 0 {
        return Check::warn(
            description,
            "the kernel says the clock is not synchronised (STA_UNSYNC)",
            "run an NTP client (chrony, systemd-timesyncd): a clock off by minutes makes fresh certificates look not yet valid",
        );
    }
    Check::ok(description)
}

/// Every `--pre` check.
pub fn checks(args: &PreArgs) -> Vec<Check> {
    vec![
        kernel(),
        btf(),
        cgroup_v2(
            args.cgroup_path
                .as_deref()
                .unwrap_or(Path::new("/sys/fs/cgroup")),
        ),
        bpffs(&args.bpffs),
        programs_load(&args.bpffs),
        nftables(),
        match (&args.cni_conf_dir, args.demo) {
            (None, true) => Check::ok(
                "no primary CNI configuration needed: the demo's pods are enrolled by their node proxies, not through CNI",
            ),
            (dir, _) => primary_cni(dir.as_deref().unwrap_or(Path::new("/etc/cni/net.d"))),
        },
        clock(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::report::Status;

    #[test]
    fn kernel_releases_are_read_as_distributions_write_them() {
        assert_eq!(kernel_version("6.1.0-18-amd64"), Some((6, 1)));
        assert_eq!(kernel_version("5.14.0-362.el9.x86_64"), Some((5, 14)));
        assert_eq!(kernel_version("6.18.44-fc-v1098"), Some((6, 18)));
        assert_eq!(kernel_version("garbage"), None);
        assert!(kernel_version("5.10.0").is_some_and(|v| v < EBPF_KERNEL));
    }

    #[test]
    fn a_missing_cni_configuration_fails_with_a_hint_and_one_present_passes() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let c = primary_cni(dir.path());
        assert_eq!(c.result, Status::Error);
        assert!(c.hint.unwrap_or_default().contains("chains after it"));
        std::fs::write(dir.path().join("10-bridge.conflist"), "{}")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(primary_cni(dir.path()).result, Status::Success);
        // A tmpfs is neither cgroup2 nor bpffs.
        assert_ne!(cgroup_v2(dir.path()).result, Status::Success);
        assert_eq!(bpffs(dir.path()).result, Status::Error);
    }

    #[test]
    fn nft_without_json_support_is_a_warning() {
        let with = "nftables v1.0.6 (Lester Gooch #5)\n  cli:\t\teditline\n  json:\t\tyes\n";
        assert_eq!(nft_version("nft", with).result, Status::Success);
        let without = with.replace("yes", "no");
        let c = nft_version("nft", &without);
        assert_eq!(c.result, Status::Warning);
        assert!(c.hint.unwrap_or_default().contains("nft -j"));
    }
}
