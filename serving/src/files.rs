//! Files replaced while a process runs — a PEM bundle in a ConfigMap, an issuer's
//! certificate and key in a Secret — polled by content: a Kubernetes symlink swap
//! (`..data`), a rename over the file and an edit in place are all seen, where an mtime
//! or an inotify watch on the file misses some of them. A change is handed over once the
//! files have read the same on two polls in a row, so that files written one after the
//! other (a certificate, then its key) are taken together, not half-way.

use std::path::PathBuf;
use std::time::Duration;

/// The contents of the watched files, in order, or why one could not be read.
pub type Snapshot = Result<Vec<Vec<u8>>, String>;

/// Watches a few small files for a change of content.
#[derive(Debug)]
pub struct FilePoller {
    paths: Vec<PathBuf>,
    /// What was handed over last (or read at start-up).
    delivered: Snapshot,
    /// What the previous poll read.
    seen: Option<Snapshot>,
}

impl FilePoller {
    /// Watches `paths`, whose contents the caller read and uses now (`current`).
    pub fn new(paths: Vec<PathBuf>, current: Vec<Vec<u8>>) -> Self {
        Self {
            paths,
            delivered: Ok(current),
            seen: None,
        }
    }

    /// The files' contents now.
    pub fn read(&self) -> Snapshot {
        self.paths
            .iter()
            .map(|p| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display())))
            .collect()
    }

    /// Reads the files; returns what they hold when it differs from what was handed over
    /// last and the previous poll read the same.
    pub fn poll(&mut self) -> Option<Snapshot> {
        let now = self.read();
        let settled = self.seen.as_ref() == Some(&now);
        self.seen = Some(now.clone());
        if settled && now != self.delivered {
            self.delivered = now.clone();
            return Some(now);
        }
        None
    }

    /// Polls every `every` until [`Self::poll`] hands something over.
    pub async fn changed(&mut self, every: Duration) -> Snapshot {
        loop {
            tokio::time::sleep(every).await;
            if let Some(s) = self.poll() {
                return s;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A directory of the test's own, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn path(&self) -> &std::path::Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn tempdir() -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("ambit-files-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir(&p).unwrap();
        TempDir(p)
    }

    fn dir() -> (TempDir, PathBuf, PathBuf) {
        let d = tempdir();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        std::fs::write(&a, "a1").unwrap();
        std::fs::write(&b, "b1").unwrap();
        (d, a, b)
    }

    #[test]
    fn nothing_is_handed_over_while_the_files_stay_as_they_were() {
        let (_d, a, b) = dir();
        let mut p = FilePoller::new(vec![a, b], vec![b"a1".to_vec(), b"b1".to_vec()]);
        for _ in 0..3 {
            assert_eq!(p.poll(), None);
        }
    }

    #[test]
    fn a_change_is_handed_over_once_it_reads_the_same_twice() {
        let (_d, a, b) = dir();
        let mut p = FilePoller::new(
            vec![a.clone(), b.clone()],
            vec![b"a1".to_vec(), b"b1".to_vec()],
        );
        std::fs::write(&a, "a2").unwrap();
        assert_eq!(p.poll(), None, "first sight of a change: wait for its pair");
        std::fs::write(&b, "b2").unwrap();
        assert_eq!(p.poll(), None, "changed again: not settled");
        assert_eq!(p.poll(), Some(Ok(vec![b"a2".to_vec(), b"b2".to_vec()])));
        assert_eq!(p.poll(), None, "handed over once");
    }

    #[test]
    fn a_symlink_swap_is_seen() {
        // How the kubelet updates a mounted ConfigMap: a new directory, then `..data`
        // swapped to it; the file is a symlink through `..data`.
        let d = tempdir();
        let (v1, v2) = (d.path().join("v1"), d.path().join("v2"));
        std::fs::create_dir(&v1).unwrap();
        std::fs::create_dir(&v2).unwrap();
        std::fs::write(v1.join("ca.crt"), "one").unwrap();
        std::fs::write(v2.join("ca.crt"), "two").unwrap();
        let data = d.path().join("..data");
        std::os::unix::fs::symlink(&v1, &data).unwrap();
        let file = d.path().join("ca.crt");
        std::os::unix::fs::symlink(data.join("ca.crt"), &file).unwrap();
        let mut p = FilePoller::new(vec![file], vec![b"one".to_vec()]);
        let tmp = d.path().join("..data_tmp");
        std::os::unix::fs::symlink(&v2, &tmp).unwrap();
        std::fs::rename(&tmp, &data).unwrap();
        assert_eq!(p.poll(), None);
        assert_eq!(p.poll(), Some(Ok(vec![b"two".to_vec()])));
    }

    #[test]
    fn a_missing_file_is_handed_over_once_as_an_error_and_its_return_as_a_change() {
        let (_d, a, b) = dir();
        let mut p = FilePoller::new(vec![a.clone(), b], vec![b"a1".to_vec(), b"b1".to_vec()]);
        std::fs::remove_file(&a).unwrap();
        assert_eq!(p.poll(), None);
        let err = p.poll().unwrap().unwrap_err();
        assert!(err.contains(&a.display().to_string()), "{err}");
        assert_eq!(p.poll(), None);
        std::fs::write(&a, "a1").unwrap();
        assert_eq!(p.poll(), None);
        assert_eq!(p.poll(), Some(Ok(vec![b"a1".to_vec(), b"b1".to_vec()])));
    }
}
