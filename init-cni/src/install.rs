//! The installer the DaemonSet runs on each node: copies `ambit-cni` into the host's CNI
//! binary directory (atomically: a temporary file renamed into place) and chains the
//! plugin into the primary network's configuration — the first `.conflist`/`.conf` in
//! the configuration directory, as the runtime picks it. A `.conf` becomes a
//! `.conflist`. With `--watch` it keeps checking, and chains the plugin again when the
//! primary CNI rewrites its file. `uninstall` takes the entry and the binary out.
//!
//! When it stops, the installer takes the plugin out only if its DaemonSet
//! (`--owner-daemonset`) is gone or being deleted — `helm uninstall` — so that the node
//! keeps starting pods without Ambit ([`crate::owner`]). An update, a restart or an
//! answer it cannot get leave the plugin chained: new meshed pods on a node whose proxy
//! is away then fail to start rather than start unprotected (fail closed).
//! `ambit-cni uninstall` takes it out by hand.

use crate::log::{say, Level};
use crate::owner::{self, Lifecycle, Owner};
use serde_json::{json, Map, Value};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The plugin's `type`, and its binary's name.
pub const PLUGIN_TYPE: &str = "ambit-cni";

/// Environment variables of the installer's flags.
pub mod env {
    /// Host CNI binary directory.
    pub const CNI_BIN_DIR: &str = "AMBIT_CNI_BIN_DIR";
    /// Host CNI configuration directory.
    pub const CNI_CONF_DIR: &str = "AMBIT_CNI_CONF_DIR";
    /// The node proxy's socket, written into the plugin's entry.
    pub const CNI_SOCKET: &str = "AMBIT_CNI_SOCKET";
    /// The DaemonSet that runs the installer, `NAMESPACE/NAME`.
    pub const OWNER_DAEMONSET: &str = "AMBIT_CNI_OWNER_DAEMONSET";
    /// Where the in-cluster ServiceAccount token and CA are.
    pub const KUBE_CREDENTIALS: &str = "AMBIT_CNI_KUBE_CREDENTIALS";
}

/// Why installing failed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// No primary network configuration to chain into.
    #[error("no CNI network configuration (*.conflist, *.conf, *.json) in {0}: install the cluster's network plugin first")]
    NoPrimary(PathBuf),
    /// A configuration file is not valid JSON, or not a network configuration.
    #[error("{path}: {detail}")]
    BadConf {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A file could not be read or written.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: io::Error,
    },
}

fn io_err(what: String) -> impl FnOnce(io::Error) -> InstallError {
    move |source| InstallError::Io { what, source }
}

/// What a pass changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Nothing to do.
    Unchanged,
    /// This file was written.
    Written(PathBuf),
}

/// The plugin's entry in the list.
pub fn plugin_entry(socket: &str, timeout: &str, exclude_namespaces: &[String]) -> Value {
    json!({
        "type": PLUGIN_TYPE,
        "socket": socket,
        "timeout": timeout,
        "exclude_namespaces": exclude_namespaces,
    })
}

/// Copies `binary` to `<bin_dir>/ambit-cni` atomically, mode 0755.
pub fn install_binary(binary: &Path, bin_dir: &Path) -> Result<PathBuf, InstallError> {
    use std::os::unix::fs::PermissionsExt;
    let target = bin_dir.join(PLUGIN_TYPE);
    let tmp = bin_dir.join(format!(".{PLUGIN_TYPE}.tmp"));
    std::fs::copy(binary, &tmp).map_err(io_err(format!(
        "copying {} to {}",
        binary.display(),
        tmp.display()
    )))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
        .map_err(io_err(format!("chmod {}", tmp.display())))?;
    std::fs::rename(&tmp, &target).map_err(io_err(format!(
        "renaming {} to {}",
        tmp.display(),
        target.display()
    )))?;
    Ok(target)
}

/// The configuration the runtime uses: the first by name among `*.conflist`, `*.conf`
/// and `*.json` (hidden files ignored).
pub fn primary_conf(conf_dir: &Path) -> Result<Option<PathBuf>, InstallError> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(conf_dir)
        .map_err(io_err(format!("reading {}", conf_dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            !name.starts_with('.')
                && matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("conflist" | "conf" | "json")
                )
        })
        .collect();
    files.sort();
    Ok(files.into_iter().next())
}

fn read_conf(path: &Path) -> Result<Map<String, Value>, InstallError> {
    let bytes = std::fs::read(path).map_err(io_err(format!("reading {}", path.display())))?;
    match serde_json::from_slice(&bytes) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(InstallError::BadConf {
            path: path.into(),
            detail: "not a JSON object".into(),
        }),
        Err(e) => Err(InstallError::BadConf {
            path: path.into(),
            detail: format!("not valid JSON: {e}"),
        }),
    }
}

fn write_atomic(path: &Path, value: &Value) -> Result<(), InstallError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.ambit-tmp"));
    let text = serde_json::to_string_pretty(value).map_err(|e| InstallError::BadConf {
        path: path.into(),
        detail: e.to_string(),
    })?;
    std::fs::write(&tmp, text + "\n").map_err(io_err(format!("writing {}", tmp.display())))?;
    std::fs::rename(&tmp, path).map_err(io_err(format!(
        "renaming {} to {}",
        tmp.display(),
        path.display()
    )))
}

fn is_ours(plugin: &Value) -> bool {
    plugin.get("type").and_then(Value::as_str) == Some(PLUGIN_TYPE)
}

/// Chains `entry` as the last plugin of the primary configuration; turns a `.conf` into
/// a `.conflist`. Idempotent: a configuration that already ends with this entry is left
/// alone.
pub fn chain(conf_dir: &Path, entry: &Value) -> Result<Change, InstallError> {
    let path = primary_conf(conf_dir)?.ok_or_else(|| InstallError::NoPrimary(conf_dir.into()))?;
    let conf = read_conf(&path)?;
    let (list_path, mut list) = if conf.contains_key("plugins") {
        (path.clone(), conf)
    } else {
        // A single plugin's configuration: the same network as a list of one.
        let mut plugin = conf.clone();
        let version = plugin
            .remove("cniVersion")
            .unwrap_or(Value::String("1.0.0".into()));
        let name = plugin.remove("name").ok_or_else(|| InstallError::BadConf {
            path: path.clone(),
            detail: "no \"name\"".into(),
        })?;
        let mut list = Map::new();
        list.insert("cniVersion".into(), version);
        list.insert("name".into(), name);
        list.insert("plugins".into(), Value::Array(vec![Value::Object(plugin)]));
        (path.with_extension("conflist"), list)
    };
    let Some(Value::Array(plugins)) = list.get_mut("plugins") else {
        return Err(InstallError::BadConf {
            path,
            detail: "\"plugins\" is not a list".into(),
        });
    };
    if plugins.last() == Some(entry)
        && plugins.iter().filter(|p| is_ours(p)).count() == 1
        && list_path == path
    {
        return Ok(Change::Unchanged);
    }
    plugins.retain(|p| !is_ours(p));
    plugins.push(entry.clone());
    write_atomic(&list_path, &Value::Object(list))?;
    if list_path != path {
        std::fs::remove_file(&path).map_err(io_err(format!("removing {}", path.display())))?;
    }
    Ok(Change::Written(list_path))
}

/// Takes the plugin out of the primary configuration (the list stays a list).
pub fn unchain(conf_dir: &Path) -> Result<Change, InstallError> {
    let Some(path) = primary_conf(conf_dir)? else {
        return Ok(Change::Unchanged);
    };
    let mut conf = read_conf(&path)?;
    let Some(Value::Array(plugins)) = conf.get_mut("plugins") else {
        return Ok(Change::Unchanged);
    };
    let before = plugins.len();
    plugins.retain(|p| !is_ours(p));
    if plugins.len() == before {
        return Ok(Change::Unchanged);
    }
    write_atomic(&path, &Value::Object(conf))?;
    Ok(Change::Written(path))
}

#[derive(Debug, clap::Parser)]
#[command(
    name = "ambit-cni",
    version,
    about = "Ambit's chained CNI plugin: installer"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Args)]
struct Dirs {
    /// The host's CNI binary directory.
    #[arg(long, env = env::CNI_BIN_DIR, default_value = "/opt/cni/bin")]
    cni_bin_dir: PathBuf,
    /// The host's CNI configuration directory.
    #[arg(long, env = env::CNI_CONF_DIR, default_value = "/etc/cni/net.d")]
    cni_conf_dir: PathBuf,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Copy the binary and chain the plugin into the primary network configuration.
    Install {
        #[command(flatten)]
        dirs: Dirs,
        /// The node proxy's CNI socket.
        #[arg(long, env = env::CNI_SOCKET, default_value = ambit_api::cni::DEFAULT_SOCKET)]
        socket: String,
        /// How long ADD waits for the proxy.
        #[arg(long, default_value = "35s")]
        timeout: String,
        /// Namespaces whose pods the plugin leaves alone.
        #[arg(long, value_delimiter = ',', default_value = "kube-system,ambit")]
        exclude_namespaces: Vec<String>,
        /// Keep running and chain the plugin again whenever the primary CNI rewrites its
        /// configuration.
        #[arg(long)]
        watch: bool,
        /// How often `--watch` looks.
        #[arg(long, default_value = "2s", value_parser = ambit_api::duration::parse_duration)]
        watch_interval: Duration,
        /// The DaemonSet that runs this installer (NAMESPACE/NAME). When `--watch` stops,
        /// the API server is asked: the DaemonSet gone or being deleted (`helm
        /// uninstall`) takes the plugin out as `uninstall` does; still there (an update, a
        /// restart) or no answer leaves it chained. Without it, it always stays.
        #[arg(long, env = env::OWNER_DAEMONSET)]
        owner_daemonset: Option<Owner>,
        /// Where the in-cluster ServiceAccount `token` and `ca.crt` are.
        #[arg(long, env = env::KUBE_CREDENTIALS, default_value = owner::CREDENTIALS_DIR)]
        kube_credentials: PathBuf,
    },
    /// Take the plugin out of the network configuration and remove the binary.
    Uninstall {
        #[command(flatten)]
        dirs: Dirs,
    },
}

/// The installer's entry point; returns the exit status.
pub fn main() -> i32 {
    use clap::Parser;
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Install {
            dirs,
            socket,
            timeout,
            exclude_namespaces,
            watch,
            watch_interval,
            owner_daemonset,
            kube_credentials,
        } => {
            if let Err(e) = ambit_api::duration::parse_duration(&timeout) {
                say(
                    Level::Error,
                    "ambit-cni install",
                    format_args!("--timeout {timeout:?}: {e}"),
                );
                return 2;
            }
            if owner_daemonset.is_some() && !watch {
                say(
                    Level::Error,
                    "ambit-cni install",
                    format_args!(
                        "--owner-daemonset needs --watch (it acts when the installer stops)"
                    ),
                );
                return 2;
            }
            let entry = plugin_entry(&socket, &timeout, &exclude_namespaces);
            let owner = owner_daemonset.map(|o| (o, kube_credentials));
            install(&dirs, &entry, watch, watch_interval, owner.as_ref())
        }
        Command::Uninstall { dirs } => uninstall(&dirs),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            say(Level::Error, "ambit-cni", format_args!("{e}"));
            1
        }
    }
}

fn install(
    dirs: &Dirs,
    entry: &Value,
    watch: bool,
    interval: Duration,
    owner: Option<&(Owner, PathBuf)>,
) -> Result<(), InstallError> {
    let stop = if watch { Some(stop_signals()?) } else { None };
    let me = std::env::current_exe().map_err(io_err("finding this executable".into()))?;
    let bin = install_binary(&me, &dirs.cni_bin_dir)?;
    say(
        Level::Info,
        "ambit-cni",
        format_args!("installed {}", bin.display()),
    );
    loop {
        match chain(&dirs.cni_conf_dir, entry) {
            Ok(Change::Written(path)) => say(
                Level::Info,
                "ambit-cni",
                format_args!("chained into {}", path.display()),
            ),
            Ok(Change::Unchanged) => {}
            // Waiting for the primary CNI to write its configuration is normal at boot; a
            // file caught half-written is read again on the next pass.
            Err(e) if watch => say(
                Level::Warn,
                "ambit-cni",
                format_args!("{e}; trying again in {interval:?}"),
            ),
            Err(e) => return Err(e),
        }
        let Some(stop) = &stop else {
            return Ok(());
        };
        if stop.recv_timeout(interval).is_ok() {
            return stopping(dirs, owner);
        }
    }
}

/// Ends `--watch` on SIGTERM (the kubelet stopping the container) or SIGINT: the channel
/// receives once either arrives. The installer runs as its container's PID 1, for which a
/// signal without a handler does nothing — the pod would wait out its whole grace period
/// and then be killed. The signals are blocked in every thread and taken by one that
/// waits for them (sigwait; no handler, no unsafe code).
fn stop_signals() -> Result<std::sync::mpsc::Receiver<()>, InstallError> {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    set.thread_block().map_err(|e| {
        io_err("blocking SIGTERM and SIGINT to wait for them".into())(std::io::Error::from(e))
    })?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if set.wait().is_ok() {
                let _ = tx.send(());
            }
        })
        .map_err(io_err("starting the signal thread".into()))?;
    Ok(rx)
}

/// How long the API server has to answer when the installer stops (twice, within the
/// pod's grace period).
const OWNER_TIMEOUT: Duration = Duration::from_secs(5);

/// The installer is stopping: uninstalls if its DaemonSet is gone or being deleted.
fn stopping(dirs: &Dirs, owner: Option<&(Owner, PathBuf)>) -> Result<(), InstallError> {
    let stays = "the plugin stays chained; `ambit-cni uninstall` removes it";
    let Some((owner, credentials)) = owner else {
        say(Level::Info, "ambit-cni", format_args!("stopping ({stays})"));
        return Ok(());
    };
    let ask = || {
        let api = owner::ApiServer::in_cluster(credentials)?;
        owner::lifecycle(&api, owner, OWNER_TIMEOUT)
    };
    // One retry: an API server restarting, a connection cut.
    let answer = ask().or_else(|e| {
        say(
            Level::Warn,
            "ambit-cni",
            format_args!("asking for DaemonSet {owner}: {e}; asking again"),
        );
        std::thread::sleep(Duration::from_secs(1));
        ask()
    });
    match answer {
        Ok(Lifecycle::Present) => {
            say(
                Level::Info,
                "ambit-cni",
                format_args!(
                    "stopping; DaemonSet {owner} is still there (an update or a restart): {stays}"
                ),
            );
            Ok(())
        }
        Ok(gone @ (Lifecycle::Gone | Lifecycle::Deleting)) => {
            let how = if gone == Lifecycle::Gone {
                "gone"
            } else {
                "being deleted"
            };
            say(
                Level::Info,
                "ambit-cni",
                format_args!(
                    "stopping; DaemonSet {owner} is {how} (an uninstall): taking the plugin out"
                ),
            );
            uninstall(dirs)
        }
        Err(e) => {
            say(Level::Warn, "ambit-cni", format_args!("stopping; cannot tell an uninstall from an update ({e}): {stays} (fail closed)"));
            Ok(())
        }
    }
}

fn uninstall(dirs: &Dirs) -> Result<(), InstallError> {
    if let Change::Written(path) = unchain(&dirs.cni_conf_dir)? {
        say(
            Level::Info,
            "ambit-cni",
            format_args!("removed from {}", path.display()),
        );
    }
    let bin = dirs.cni_bin_dir.join(PLUGIN_TYPE);
    match std::fs::remove_file(&bin) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(InstallError::Io {
            what: format!("removing {}", bin.display()),
            source: e,
        }),
        Err(_) => Ok(()),
        Ok(()) => {
            say(
                Level::Info,
                "ambit-cni",
                format_args!("removed {}", bin.display()),
            );
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests;
