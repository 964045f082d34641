//! The local backend: the cluster's objects as YAML files in a directory.
//!
//! Every `*.yaml`, `*.yml` and `*.json` file under the directory (recursively; names
//! starting with `.` are skipped, which also skips the `..data` folders of a mounted
//! ConfigMap; symlinks are followed, each directory read once, so a symlink cycle cannot
//! loop) is read as Kubernetes objects, multi-document files and `kind: List` included.
//! The directory is polled for changes; a change reloads everything, and an invalid file
//! leaves the last good state in place.
//!
//! Polling rather than inotify: it sees changes behind symlinks (ConfigMap volumes swap a
//! symlink), on any filesystem, and costs a few `stat`s per second.

mod backend;
mod metrics;
mod parse;
mod tokens;

pub use backend::LocalBackend;
pub use metrics::LocalMetrics;
pub use parse::{parse_file, LoadedObject, LocalError};
pub use tokens::NodeTokens;

use crate::index::{ClusterIndex, SharedIndex};
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The namespace of objects that name none, as `kubectl apply` assumes.
pub const DEFAULT_NAMESPACE: &str = "default";

/// What the directory holds, to notice changes: each file's size and mtime.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fingerprint(BTreeMap<PathBuf, (u64, Option<SystemTime>)>);

/// The YAML files under `dir`, sorted.
///
/// Symlinks are followed (a ConfigMap volume is made of them: `file -> ..data/file`), but
/// each directory is read once, however many paths lead to it: a symlink to a parent or to
/// a directory already read is skipped, so a cycle cannot loop and no file is read twice.
/// Likewise a file reached by two paths (two symlinks to one ConfigMap) is read once.
/// Real subdirectories are read before symlinked ones, so a file reachable both ways is
/// named by its real path; within that, names are taken in order, so the same tree gives
/// the same paths on every poll.
fn files(dir: &Path) -> Result<Vec<PathBuf>, LocalError> {
    let cannot_read = |d: &Path, e: std::io::Error| LocalError {
        file: d.to_path_buf(),
        document: None,
        object: None,
        field: None,
        message: format!("cannot read directory: {e}"),
    };
    let mut out = Vec::new();
    let mut visited = HashSet::new();
    let mut read = HashSet::new();
    let mut stack = vec![dir.to_path_buf()];
    let mut symlinked = VecDeque::new();
    while let Some(d) = stack.pop().or_else(|| symlinked.pop_front()) {
        let canonical = std::fs::canonicalize(&d).map_err(|e| cannot_read(&d, e))?;
        if !visited.insert(canonical) {
            continue;
        }
        let mut entries: Vec<_> = std::fs::read_dir(&d)
            .map_err(|e| cannot_read(&d, e))?
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .collect();
        entries.sort_by_key(|e| e.file_name());
        let mut subdirs = Vec::new();
        for entry in entries {
            let path = entry.path();
            if path.is_dir() {
                if entry.file_type().is_ok_and(|t| t.is_symlink()) {
                    symlinked.push_back(path);
                } else {
                    subdirs.push(path);
                }
            } else if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml" | "json")
            ) {
                // A dangling symlink stays in the list, so that reading it says why.
                let first = std::fs::canonicalize(&path).map_or(true, |c| read.insert(c));
                if first {
                    out.push(path);
                }
            }
        }
        // Popped in name order.
        stack.extend(subdirs.into_iter().rev());
    }
    out.sort();
    Ok(out)
}

/// Size and mtime of every file, following symlinks.
pub fn fingerprint(dir: &Path) -> Fingerprint {
    let mut map = BTreeMap::new();
    for f in files(dir).unwrap_or_default() {
        let meta = std::fs::metadata(&f).ok();
        map.insert(
            f,
            (
                meta.as_ref().map_or(0, |m| m.len()),
                meta.and_then(|m| m.modified().ok()),
            ),
        );
    }
    Fingerprint(map)
}

/// Reads every object under `dir`. Also returns the number of objects of kinds the mesh
/// does not read.
pub fn load_objects(dir: &Path) -> Result<(Vec<LoadedObject>, usize), LocalError> {
    let mut objects: Vec<LoadedObject> = Vec::new();
    let mut skipped = 0;
    for file in files(dir)? {
        let text = std::fs::read_to_string(&file).map_err(|e| LocalError {
            file: file.clone(),
            document: None,
            object: None,
            field: None,
            message: format!("cannot read file: {e}"),
        })?;
        for mut o in parse_file(&file, &text, &mut skipped)? {
            o.object.default_namespace(DEFAULT_NAMESPACE);
            objects.push(o);
        }
    }
    // The same object twice is almost always a copy-paste slip; say where both are.
    let mut seen = BTreeMap::new();
    for o in &objects {
        let r = o.object.object_ref();
        if let Some((file, doc)) = seen.insert(r.clone(), (o.file.clone(), o.document)) {
            return Err(LocalError {
                file: o.file.clone(),
                document: Some(o.document),
                object: Some(r.to_string()),
                field: Some("metadata.name".into()),
                message: format!(
                    "defined twice; first in {} (document {doc}); rename or remove one",
                    file.display()
                ),
            });
        }
    }
    Ok((objects, skipped))
}

/// Reads `dir` into a new index, validating every object.
pub fn load_index(dir: &Path, trust_domain: &str) -> Result<ClusterIndex, LocalError> {
    let (objects, skipped) = load_objects(dir)?;
    let places: Vec<_> = objects
        .iter()
        .map(|o| (o.file.clone(), o.document))
        .collect();
    let index = ClusterIndex::new(trust_domain)
        .with_local_netns()
        .with_objects(objects.into_iter().map(|o| o.object))
        .map_err(|(i, e)| LocalError {
            file: places[i].0.clone(),
            document: Some(places[i].1),
            object: Some(e.object),
            field: Some(e.field),
            message: e.message,
        })?;
    tracing::info!(dir = %dir.display(), counts = ?index.counts(), skipped, "loaded local cluster state");
    Ok(index)
}

/// Watches `dir` and replaces `index` whenever its files change and load cleanly. Runs
/// until `shutdown` resolves. `loaded` is the fingerprint taken before `index` was last
/// loaded, so that a change made while loading is not missed.
pub async fn watch(
    loaded: Fingerprint,
    dir: PathBuf,
    trust_domain: String,
    index: SharedIndex,
    interval: Duration,
    metrics: LocalMetrics,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut last = loaded;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = ticker.tick() => {}
        }
        // Reading and parsing the directory, and diffing what it holds against the index,
        // run off the async workers: at 100,000 pods they take seconds.
        let (scan_dir, seen) = (dir.clone(), last.clone());
        let Some(now) = crate::blocking::run(move || {
            let now = fingerprint(&scan_dir);
            (now != seen).then_some(now)
        })
        .await
        else {
            continue;
        };
        last = now;
        let (load_dir, domain) = (dir.clone(), trust_domain.clone());
        match crate::blocking::run(move || load_index(&load_dir, &domain)).await {
            Ok(new) => {
                let index = index.clone();
                let metrics = metrics.clone();
                crate::blocking::run(move || {
                    index.replace(new);
                    // Counted once served, so that a reader of the gauges finds them.
                    metrics.record_success(&index.read());
                })
                .await;
            }
            Err(error) => {
                // Keep serving the last good state; the operator sees why in the log and
                // in `local_reloads_total{result="failure"}`.
                tracing::error!(%error, "local cluster state not reloaded; keeping the last good state");
                metrics.record_failure();
            }
        }
    }
}

#[cfg(test)]
mod tests;
