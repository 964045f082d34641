//! Network namespaces as pods, created for one test and removed when it ends (also when
//! it fails: the topology cleans up on drop): the shared `ambit-topology` crate, which the
//! benchmarks and `ambit demo` build their pods with too.

use std::process::Command;

pub use ambit_topology::{PodNet, Topology};

/// Runs a command; panics with its stderr if it fails.
pub(crate) fn run(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
