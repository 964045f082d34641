//! An image's files, read from `podman export`.

use super::{podman, Images};
use serde_json::Value;
use std::process::Command;

/// An image's files (paths without a leading `/`, directories with a trailing one) and one
/// file's text, read from `podman export` of a container made (not started) from it.
#[derive(Debug)]
pub struct ImageFiles {
    /// Its paths, without a leading `/`.
    pub files: Vec<String>,
    /// Its `/etc/passwd`.
    pub passwd: String,
    /// Its PATH, in order.
    pub path: Vec<String>,
    /// Its ENTRYPOINT.
    pub entrypoint: Vec<String>,
}

pub fn image_files(images: &Images, image: &str) -> ImageFiles {
    let reference = &images.refs[image];
    let mut create = vec!["create".to_string()];
    create.extend(images.engine.iter().cloned());
    create.push(reference.clone());
    let out = podman(&create);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("image.tar");
    let exported = podman(&[
        "export".into(),
        "-o".into(),
        archive.display().to_string(),
        id.clone(),
    ]);
    let _ = podman(&["rm".into(), "-f".into(), id]);
    assert!(
        exported.status.success(),
        "{}",
        String::from_utf8_lossy(&exported.stderr)
    );
    let tar = |args: &[&str]| {
        let out = Command::new("tar")
            .args(args)
            .arg("-f")
            .arg(&archive)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let files = tar(&["-t"])
        .lines()
        .map(|l| l.trim_start_matches("./").to_string())
        .collect();
    let passwd = tar(&["-xO", "etc/passwd"]);
    let inspect = podman(&[
        "image".into(),
        "inspect".into(),
        "--format".into(),
        "{{json .Config}}".into(),
        reference.clone(),
    ]);
    let config: Value = serde_json::from_slice(&inspect.stdout).unwrap();
    let path = config["Env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e.as_str()?.strip_prefix("PATH="))
        .flat_map(|p| p.split(':').map(str::to_string))
        .collect();
    let entrypoint = serde_json::from_value(config["Entrypoint"].clone()).unwrap();
    ImageFiles {
        files,
        passwd,
        path,
        entrypoint,
    }
}

impl ImageFiles {
    /// Whether it holds `path`.
    pub fn has(&self, path: &str) -> bool {
        let p = path.trim_start_matches('/');
        self.files.iter().any(|f| f == p)
    }

    /// Where `name` resolves: itself when absolute, else the first match on the image's PATH.
    pub fn which(&self, name: &str) -> Option<String> {
        if name.starts_with('/') {
            return self.has(name).then(|| name.to_string());
        }
        self.path
            .iter()
            .map(|dir| format!("{}/{name}", dir.trim_end_matches('/')))
            .find(|p| self.has(p))
    }
}
