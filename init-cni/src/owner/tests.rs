use super::*;

const PATH: &str = "/apis/apps/v1/namespaces/ambit/daemonsets/ambit-proxy";

#[test]
fn an_owner_is_namespace_slash_name_of_kubernetes_names() {
    let o: Owner = "ambit/ambit-proxy".parse().unwrap();
    assert_eq!(
        (o.namespace.as_str(), o.name.as_str()),
        ("ambit", "ambit-proxy")
    );
    assert_eq!(o.to_string(), "ambit/ambit-proxy");
    for bad in [
        "ambit",
        "/x",
        "x/",
        "a/b/c",
        "A/b",
        "a/b?watch=1",
        "a/../b c",
    ] {
        let e = bad.parse::<Owner>().unwrap_err();
        assert!(e.contains(bad), "{bad}: {e}");
    }
}

#[test]
fn the_daemonset_there_is_an_update_gone_or_deleting_is_an_uninstall() {
    let ds = br#"{"kind": "DaemonSet", "metadata": {"name": "ambit-proxy"}}"#;
    assert_eq!(judge(PATH, 200, ds).unwrap(), Lifecycle::Present);
    let deleting = br#"{"kind": "DaemonSet", "metadata": {"name": "ambit-proxy",
        "deletionTimestamp": "2026-12-07T06:00:00Z"}}"#;
    assert_eq!(judge(PATH, 200, deleting).unwrap(), Lifecycle::Deleting);
    let not_found = br#"{"kind": "Status", "code": 404, "reason": "NotFound"}"#;
    assert_eq!(judge(PATH, 404, not_found).unwrap(), Lifecycle::Gone);
}

#[test]
fn anything_else_is_no_answer_with_the_api_servers_message() {
    let forbidden = br#"{"kind": "Status", "code": 403, "message": "daemonsets.apps \"ambit-proxy\" is forbidden: User cannot get"}"#;
    let e = judge(PATH, 403, forbidden).unwrap_err().to_string();
    assert!(
        e.contains("403") && e.contains("is forbidden") && e.contains(PATH),
        "{e}"
    );
    let e = judge(PATH, 503, b"upstream down").unwrap_err().to_string();
    assert!(e.contains("503 upstream down"), "{e}");
    // A 200 that is not the DaemonSet (a proxy's page, another kind) is no answer either.
    let e = judge(PATH, 200, b"<html>").unwrap_err().to_string();
    assert!(e.contains("not a DaemonSet"), "{e}");
    let e = judge(PATH, 200, br#"{"kind": "Status"}"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a DaemonSet"), "{e}");
}

#[test]
fn an_answer_is_whole_by_its_length_its_last_chunk_or_the_close() {
    let sized =
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\ncontent-length: 4\r\n\r\nabcdEXTRA";
    assert_eq!(parse(&sized[..60], false).unwrap(), None);
    assert_eq!(parse(sized, false).unwrap(), Some((200, b"abcd".to_vec())));
    let short = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc";
    assert_eq!(parse(short, false).unwrap(), None);
    assert!(parse(short, true).unwrap_err().contains("3 of 10"));

    let chunked = b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
    assert_eq!(
        parse(chunked, false).unwrap(),
        Some((404, b"abcde".to_vec()))
    );
    for cut in [55, 60, 66, 70] {
        assert_eq!(parse(&chunked[..cut], false).unwrap(), None, "cut at {cut}");
        assert!(parse(&chunked[..cut], true).is_err(), "cut at {cut}");
    }
    let bad = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n";
    assert!(parse(bad, false).unwrap_err().contains("hexadecimal"));

    let until_close = b"HTTP/1.0 200 OK\r\n\r\nall of it";
    assert_eq!(parse(until_close, false).unwrap(), None);
    assert_eq!(
        parse(until_close, true).unwrap(),
        Some((200, b"all of it".to_vec()))
    );

    assert_eq!(parse(b"HTTP/1.1 200", false).unwrap(), None);
    assert!(parse(b"HTTP/1.1 200", true).unwrap_err().contains("header"));
    assert!(parse(b"SSH-2.0-OpenSSH\r\n\r\n", false)
        .unwrap_err()
        .contains("status line"));
    assert!(parse(b"HTTP/1.1 abc OK\r\n\r\n", false)
        .unwrap_err()
        .contains("status line"));
    assert!(parse(b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", false).is_err());
}

#[test]
fn credentials_that_are_missing_or_not_certificates_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let e = ApiServer::new("127.0.0.1".into(), 443, dir.path())
        .unwrap_err()
        .to_string();
    assert!(e.contains("ca.crt"), "{e}");
    std::fs::write(dir.path().join("ca.crt"), "not a certificate\n").unwrap();
    let e = ApiServer::new("127.0.0.1".into(), 443, dir.path())
        .unwrap_err()
        .to_string();
    assert!(e.contains("no certificate"), "{e}");
}
