//! `ambit-cni`: the chained CNI plugin that hands each new meshed pod to the node proxy,
//! and the installer that puts it in place on a node.
//!
//! # Layout
//!
//! - [`conf`]: the network configuration (stdin) and the `CNI_*` environment.
//! - [`plugin`]: the commands (ADD, DEL, CHECK, STATUS, GC, VERSION) and their outputs.
//! - [`client`]: the node proxy's unix socket, with the pod's netns passed as a
//!   descriptor.
//! - [`install`]: copying the binary and chaining the plugin into the primary network's
//!   configuration, keeping it there, and taking it out again.
//! - [`owner`]: whether the installer's DaemonSet is being deleted (`helm uninstall`)
//!   or not (an update), asked of the API server when the installer stops.
//!
//! The plugin stays thin: whether a pod is meshed is the node proxy's answer (it has the
//! control plane's view); ADD returns only once the proxy has the pod's listeners and
//! redirection in place, and fails if the proxy does not answer — a meshed pod never
//! starts unprotected.

pub mod client;
pub mod conf;
pub mod install;
pub mod log;
pub mod owner;
pub mod plugin;

use serde::Serialize;

/// A CNI error: the spec's JSON on stdout and a non-zero exit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("{msg}: {details}")]
pub struct CniError {
    /// `cniVersion` of the error (the configuration's when it could be read).
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    /// The spec's error code.
    pub code: u32,
    /// What went wrong.
    pub msg: String,
    /// More detail, or what to do.
    pub details: String,
}

impl CniError {
    /// An error in the newest version (replaced by the configuration's when known).
    pub fn new(code: u32, msg: impl Into<String>, details: impl Into<String>) -> Self {
        Self {
            cni_version: String::new(),
            code,
            msg: msg.into(),
            details: details.into(),
        }
    }

    /// The same error, reported in `version`.
    pub fn with_version(mut self, version: &str) -> Self {
        self.cni_version = version.into();
        self
    }
}

/// The binary's entry point: the installer when given arguments, the plugin otherwise.
/// Returns the exit status.
pub fn main() -> i32 {
    use std::io::{Read, Write};
    if std::env::args_os().len() > 1 {
        return install::main();
    }
    let env = conf::Env::from_process();
    let mut stdin = Vec::new();
    // VERSION may come with nothing on stdin; a read error is the same as empty input.
    let _ = std::io::stdin().read_to_end(&mut stdin);
    let outcome = plugin::run(&env, &stdin);
    let mut out = std::io::stdout();
    let _ = out.write_all(outcome.stdout.as_bytes());
    let _ = out.flush();
    outcome.status
}
