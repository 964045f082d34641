use super::*;
use prometheus_client::encoding::text::encode;
use std::os::unix::fs::symlink;

fn header(source: &TokenSource) -> String {
    let value = source.current().bearer().unwrap_or_else(|e| panic!("{e}"));
    value.to_str().unwrap_or_default().to_string()
}

/// Writes `token` the way the kubelet's atomic writer does: a new timestamped directory,
/// then `..data` swapped to it by renaming a fresh symlink over it.
fn project(dir: &Path, version: &str, token: Option<&str>) {
    let data = dir.join(format!("..{version}"));
    std::fs::create_dir(&data).unwrap_or_else(|e| panic!("{e}"));
    if let Some(token) = token {
        std::fs::write(data.join("token"), token).unwrap_or_else(|e| panic!("{e}"));
    }
    let tmp = dir.join("..data_tmp");
    symlink(format!("..{version}"), &tmp).unwrap_or_else(|e| panic!("{e}"));
    std::fs::rename(&tmp, dir.join("..data")).unwrap_or_else(|e| panic!("{e}"));
}

fn metrics_text(registry: &Registry) -> String {
    let mut text = String::new();
    encode(&mut text, registry).unwrap_or_else(|e| panic!("{e}"));
    text
}

#[test]
fn a_rotated_projected_token_is_used_on_the_next_request_and_a_bad_one_is_not() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    project(dir.path(), "2025_01_01_00_00_00.1", Some("first-token\n"));
    symlink("..data/token", dir.path().join("token")).unwrap_or_else(|e| panic!("{e}"));
    let mut registry = Registry::default();
    let metrics = TokenMetrics::register(&mut registry);
    let source =
        TokenSource::file(&dir.path().join("token"), metrics).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(header(&source), "Bearer first-token");
    assert_eq!(header(&source), "Bearer first-token");
    assert!(metrics_text(&registry).contains("token_reloads_total 0"));

    project(dir.path(), "2025_01_01_01_00_00.2", Some("second-token"));
    assert_eq!(header(&source), "Bearer second-token");

    // A projection without the file (the symlink dangles), then an empty one: the last
    // good token stays, and each failure is counted.
    project(dir.path(), "2025_01_01_02_00_00.3", None);
    assert_eq!(header(&source), "Bearer second-token");
    project(dir.path(), "2025_01_01_03_00_00.4", Some("  \n"));
    assert_eq!(header(&source), "Bearer second-token");
    // The empty file is not read again until it changes.
    assert_eq!(header(&source), "Bearer second-token");
    let text = metrics_text(&registry);
    assert!(text.contains("token_reload_failures_total 2"), "{text}");

    project(dir.path(), "2025_01_01_04_00_00.5", Some("third-token"));
    assert_eq!(header(&source), "Bearer third-token");
    assert!(metrics_text(&registry).contains("token_reloads_total 2"));
}

#[test]
fn a_token_is_never_shown_by_debug_and_an_unusable_file_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("token");
    std::fs::write(&path, "secret-value").unwrap_or_else(|e| panic!("{e}"));
    let source =
        TokenSource::file(&path, TokenMetrics::default()).unwrap_or_else(|e| panic!("{e}"));
    for shown in [format!("{source:?}"), format!("{:?}", source.current())] {
        assert!(!shown.contains("secret-value"), "{shown}");
    }
    let fixed = TokenSource::fixed("fixed-secret");
    assert!(!format!("{fixed:?}").contains("fixed-secret"));
    assert_eq!(header(&fixed), "Bearer fixed-secret");

    std::fs::write(&path, "").unwrap_or_else(|e| panic!("{e}"));
    let empty = TokenSource::file(&path, TokenMetrics::default());
    assert!(
        matches!(empty, Err(TokenError::Unusable { .. })),
        "{empty:?}"
    );
    std::fs::write(&path, "bad\u{7f}token").unwrap_or_else(|e| panic!("{e}"));
    assert!(TokenSource::file(&path, TokenMetrics::default()).is_err());
    let missing = TokenSource::file(&dir.path().join("nope"), TokenMetrics::default());
    assert!(matches!(missing, Err(TokenError::Read { .. })));
}
