//! `ambit demo down`: removes everything the demo made — its processes (by pid, checked
//! against their start time so that a reused pid is never hit, then whatever is left in its
//! cgroups), its cgroups, network namespaces, bpffs pins and directory. It works from the
//! names alone when the state file is gone or half-written (a crash, a killed terminal),
//! and does nothing when there is nothing to remove.

use super::state::{self, State, CGROUP, DIR, PREFIX};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// What was removed.
#[derive(Debug, Default)]
pub struct Removed {
    /// Processes ended.
    pub processes: usize,
    /// Network namespaces deleted.
    pub netns: Vec<String>,
    /// Whether the cgroups were removed.
    pub cgroups: bool,
    /// bpffs pin directories removed.
    pub pins: Vec<PathBuf>,
    /// Whether the demo's directory was removed.
    pub dir: bool,
}

impl Removed {
    /// Whether anything was there.
    pub fn anything(&self) -> bool {
        self.processes > 0
            || !self.netns.is_empty()
            || self.cgroups
            || !self.pins.is_empty()
            || self.dir
    }
}

/// Removes the demo; an error names what could not be removed (everything else still is).
pub fn down() -> anyhow::Result<Removed> {
    let mut removed = Removed::default();
    let mut errors = Vec::new();
    // The processes first: the proxies go with SIGTERM (they end their connections), and
    // nothing holds a netns or a pin while it is removed.
    if let Ok(Some(s)) = State::load() {
        removed.processes += stop_processes(&s);
    }
    if let Some(cg) = ambit_topology::Cgroup::open(CGROUP) {
        removed.processes += cg.pids().len();
        match cg.remove() {
            Ok(()) => removed.cgroups = true,
            Err(e) => errors.push(format!("cgroup: {e}")),
        }
    }
    match ambit_topology::net::remove_netns(PREFIX) {
        Ok(names) => removed.netns = names,
        Err(e) => errors.push(format!("network namespaces: {e}")),
    }
    // Removing a pin directory detaches the programs pinned in it.
    for node in super::cluster::NODES {
        let dir = state::pin_dir(node);
        if dir.exists() {
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => removed.pins.push(dir),
                Err(e) => errors.push(format!("{}: {e}", dir.display())),
            }
        }
    }
    if std::path::Path::new(DIR).exists() {
        match std::fs::remove_dir_all(DIR) {
            Ok(()) => removed.dir = true,
            Err(e) => errors.push(format!("{DIR}: {e}")),
        }
    }
    if errors.is_empty() {
        Ok(removed)
    } else {
        anyhow::bail!(
            "the demo is not fully removed: {}; run `ambit demo down` again (as root)",
            errors.join("; ")
        )
    }
}

/// SIGTERM to each process of the state that is still the one started (same start time),
/// in reverse start order; SIGKILL to any left after 5 s. Returns how many there were.
fn stop_processes(s: &State) -> usize {
    let alive = |p: &state::Process| state::start_time(p.pid) == Some(p.start_time);
    let running: Vec<&state::Process> = s.processes.iter().rev().filter(|p| alive(p)).collect();
    for p in &running {
        signal(p.pid, nix::sys::signal::Signal::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while running.iter().any(|p| alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    for p in running.iter().filter(|p| alive(p)) {
        signal(p.pid, nix::sys::signal::Signal::SIGKILL);
    }
    running.len()
}

fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
    }
}
