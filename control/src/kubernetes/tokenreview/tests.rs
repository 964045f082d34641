use super::*;
use k8s_openapi::api::authentication::v1::UserInfo;
use std::collections::BTreeMap;

fn proxies() -> (String, String) {
    ("ambit".into(), "ambit-proxy".into())
}

/// A review of a token of `user`, bound to pod `ambit/proxy-a`, for `audiences`.
fn status(user: &str, audiences: &[&str], node: Option<&str>) -> TokenReviewStatus {
    let mut extra = BTreeMap::new();
    extra.insert(POD_NAME_EXTRA.to_string(), vec!["proxy-a".to_string()]);
    extra.insert(POD_UID_EXTRA.to_string(), vec!["uid-1".to_string()]);
    if let Some(n) = node {
        extra.insert(NODE_NAME_EXTRA.to_string(), vec![n.to_string()]);
    }
    TokenReviewStatus {
        authenticated: Some(true),
        audiences: Some(audiences.iter().map(|a| a.to_string()).collect()),
        user: Some(UserInfo {
            username: Some(user.into()),
            extra: Some(extra),
            ..UserInfo::default()
        }),
        error: None,
    }
}

const PROXY: &str = "system:serviceaccount:ambit:ambit-proxy";

fn reason(r: Result<Claim, Refusal>) -> &'static str {
    r.err().map_or("accepted", |r| r.reason)
}

#[test]
fn a_review_is_accepted_only_for_our_audience_our_account_and_a_pod() {
    let claim = judge(
        &status(PROXY, &["ambit"], Some("node-a")),
        "ambit",
        &proxies(),
    )
    .unwrap_or_else(|r| panic!("{r:?}"));
    assert_eq!(claim.pod_name, "proxy-a");
    assert_eq!(claim.node.as_deref(), Some("node-a"));
    // An empty audience list means the API server's own audience, not ours.
    assert_eq!(
        reason(judge(&status(PROXY, &[], None), "ambit", &proxies())),
        "wrong_audience"
    );
    assert_eq!(
        reason(judge(&status(PROXY, &["vault"], None), "ambit", &proxies())),
        "wrong_audience"
    );
    let mut rejected = status(PROXY, &["ambit"], None);
    rejected.authenticated = None;
    assert_eq!(
        reason(judge(&rejected, "ambit", &proxies())),
        "token_rejected"
    );
    assert_eq!(
        reason(judge(
            &status("system:serviceaccount:shop:web", &["ambit"], None),
            "ambit",
            &proxies()
        )),
        "wrong_service_account"
    );
    assert_eq!(
        reason(judge(
            &status("jane@example.com", &["ambit"], None),
            "ambit",
            &proxies()
        )),
        "not_a_service_account"
    );
    let mut unbound = status(PROXY, &["ambit"], None);
    if let Some(u) = unbound.user.as_mut() {
        u.extra = None;
    }
    assert_eq!(
        reason(judge(&unbound, "ambit", &proxies())),
        "not_bound_to_pod"
    );
}

#[test]
fn the_node_is_the_bound_pods_and_must_agree_with_the_review() {
    let claim = |node: Option<&str>| Claim {
        namespace: "ambit".into(),
        pod_name: "proxy-a".into(),
        pod_uid: "uid-1".into(),
        node: node.map(String::from),
    };
    assert_eq!(
        bind(&claim(None), Some("uid-1"), Some("node-a".into())),
        Ok("node-a".into())
    );
    assert_eq!(
        bind(&claim(Some("node-a")), Some("uid-1"), Some("node-a".into())),
        Ok("node-a".into())
    );
    let refused = |r: Result<String, Refusal>| r.err().map(|r| r.reason);
    assert_eq!(
        refused(bind(
            &claim(Some("node-b")),
            Some("uid-1"),
            Some("node-a".into())
        )),
        Some("node_mismatch")
    );
    assert_eq!(
        refused(bind(&claim(None), Some("uid-2"), Some("node-a".into()))),
        Some("pod_uid_mismatch")
    );
    assert_eq!(
        refused(bind(&claim(None), Some("uid-1"), None)),
        Some("pod_not_scheduled")
    );
}
