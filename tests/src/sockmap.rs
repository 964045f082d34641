//! `AMBIT_TEST_SOCKMAP=on`: the whole end-to-end suite runs again with sockmap on the
//! in-pod hops (`scripts/test.sh` does), to show that nothing an application sees changes.
//!
//! Sockmap needs eBPF redirection, and `sockops` must run for both ends of each hop: the
//! test's in-process applications and the in-process proxies. So in this mode this test
//! process moves, at the first proxy configured, into a cgroup of its own
//! (`ambit-e2e-sm-<pid>` under the cgroup v2 mount — never the machine's root), and every
//! proxy of the process attaches its programs there, with a pin directory per control
//! plane (tests run in parallel, each with its own). The proxies' mark keeps their own
//! sockets out of the redirection, as on a node. On exit the process goes back to the
//! cgroup it came from and the cgroup and pins are removed; what a killed run left is
//! removed by the next one.

use ambit_proxy::config::Config;
use ambit_proxy::proxy::redirect::Sockmap;
use ambit_proxy::proxy::Redirect;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The variable that turns the mode on (`on`).
pub const ENV: &str = "AMBIT_TEST_SOCKMAP";

/// Whether this run is in sockmap mode.
pub fn on() -> bool {
    std::env::var(ENV).is_ok_and(|v| v == "on")
}

const PREFIX: &str = "ambit-e2e-sm-";

/// What [`apply`] changes in a proxy's configuration, in sockmap mode: eBPF redirection
/// with sockmap on, the programs attached to this process's cgroup, pinned per control
/// plane (the directory of its token file) and node.
pub fn apply(config: &mut Config) {
    if on() {
        apply_always(config);
    }
}

/// [`apply`] whatever [`ENV`] says (a test of sockmap itself).
pub fn apply_always(config: &mut Config) {
    let cgroup = process_cgroup();
    let run = config
        .token_file
        .parent()
        .and_then(Path::file_name)
        // bpffs takes no '.' in a name (a tempdir's is `.tmpXXXX`).
        .map(|n| n.to_string_lossy().replace('.', ""))
        .unwrap_or_default();
    config.redirect = Redirect::Ebpf;
    config.sockmap = Sockmap::On;
    // Sockmap's hops cannot be spliced: kernel TLS steps aside (even when the run asks for
    // it with AMBIT_KERNEL_TLS=on, as the emulated guest's pass does).
    config.kernel_tls = ambit_proxy::ktls::Mode::Auto;
    config.cgroup_path = cgroup.to_path_buf();
    config.bpf_pin_dir = PathBuf::from(format!(
        "/sys/fs/bpf/{PREFIX}{}-{run}-{}",
        std::process::id(),
        config.node_name
    ));
}

/// `--redirect`, `--sockmap` and `--kernel-tls` for the real binary, as [`apply`] set them.
pub fn binary_args(config: &Config) -> [&'static str; 6] {
    let redirect = match config.redirect {
        Redirect::Ebpf => "ebpf",
        _ => "nftables",
    };
    let sockmap = match config.sockmap {
        Sockmap::On => "on",
        Sockmap::Off => "off",
    };
    let kernel_tls = match config.kernel_tls {
        ambit_proxy::ktls::Mode::Auto => "auto",
        ambit_proxy::ktls::Mode::On => "on",
        ambit_proxy::ktls::Mode::Off => "off",
    };
    [
        "--redirect",
        redirect,
        "--sockmap",
        sockmap,
        "--kernel-tls",
        kernel_tls,
    ]
}

/// This process's cgroup in sockmap mode: made, and the process moved in, once.
fn process_cgroup() -> &'static Path {
    static CGROUP: OnceLock<PathBuf> = OnceLock::new();
    CGROUP.get_or_init(|| {
        sweep_leftovers();
        let home = ambit_ebpf::sys::own_cgroup_dir().expect("this process's cgroup v2");
        let dir = ambit_ebpf::sys::cgroup2_mount().join(format!("{PREFIX}{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string())
            .unwrap_or_else(|e| panic!("moving into {}: {e}", dir.display()));
        let _ = HOME.set(home);
        at_exit();
        dir
    })
}

static HOME: OnceLock<PathBuf> = OnceLock::new();

#[allow(unsafe_code)]
mod c {
    extern "C" {
        /// The C library's `atexit(3)` (the tests link it anyway; no `libc` crate needed).
        pub fn atexit(f: extern "C" fn()) -> i32;
    }
}

#[allow(unsafe_code)]
fn at_exit() {
    extern "C" fn leave() {
        if let Some(home) = HOME.get() {
            let _ = std::fs::write(home.join("cgroup.procs"), std::process::id().to_string());
        }
        remove(std::process::id());
    }
    // SAFETY: `leave` is a plain function that neither unwinds (it ignores every error)
    // nor calls exit.
    unsafe {
        c::atexit(leave);
    }
}

/// Removes the pins (which detaches the programs) and the cgroup of process `pid`'s run.
fn remove(pid: u32) {
    let own = format!("{PREFIX}{pid}-");
    if let Ok(entries) = std::fs::read_dir("/sys/fs/bpf") {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(&own) {
                let _ = ambit_ebpf::remove_pinned(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(ambit_ebpf::sys::cgroup2_mount().join(format!("{PREFIX}{pid}")));
}

/// What runs of processes that are gone (killed) left behind.
fn sweep_leftovers() {
    let Ok(entries) = std::fs::read_dir(ambit_ebpf::sys::cgroup2_mount()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            remove(pid);
        }
    }
}
