//! The local backend's YAML loader (`ambit_control::local`): a file of Kubernetes objects
//! (multi-document, `kind: List`, any kind) read from a directory into the index, as the
//! control plane does at start and on every reload; and the per-node token file.
//!
//! Input: the file's text.
//!
//! Invariants: no panic, no hang; an object knows its document (1..=the file's count);
//! a file that does not parse does not load, with the same error; a file that loads
//! loads the same way twice; the token file's parser does not panic either.
#![no_main]

use ambit_control::local::{load_index, parse_file, NodeTokens};
use libfuzzer_sys::fuzz_target;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A directory of this process's own, on tmpfs when there is one.
fn dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = Path::new("/dev/shm");
        let base = if base.is_dir() {
            base.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!("ambit-fuzz-local-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return; // the loader reads files as UTF-8 and says so otherwise
    };
    let file = dir().join("objects.yaml");
    let mut skipped = 0;
    let parsed = parse_file(&file, text, &mut skipped);
    if let Ok(objects) = &parsed {
        // An upper bound: every document but the first starts with `---` or follows `...`.
        let documents = text.matches("---").count() + text.matches("...").count() + 1;
        for o in objects {
            assert!(
                (1..=documents).contains(&o.document),
                "document {}",
                o.document
            );
            assert_eq!(o.file, file);
        }
    }

    std::fs::write(&file, text).expect("writing the scratch file");
    let loaded = load_index(dir(), "cluster.local");
    match (&parsed, &loaded) {
        (Err(p), Err(l)) => assert_eq!(p, l),
        (Err(p), Ok(_)) => panic!("loaded a file that does not parse: {p}"),
        (Ok(_), _) => {}
    }
    if let Ok(index) = &loaded {
        let again = load_index(dir(), "cluster.local").expect("loaded once");
        assert_eq!(index.counts(), again.counts());
        let _ = index.workloads();
    }

    if let Ok(tokens) = NodeTokens::parse(text) {
        let _ = format!("{tokens:?}");
    }
});
