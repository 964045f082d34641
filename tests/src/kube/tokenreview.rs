//! `POST /apis/authentication.k8s.io/v1/tokenreviews`, answered from registered tokens
//! the way the API server's ServiceAccount token authenticator answers: audiences
//! intersected with the requested ones, bound tokens checked against their pod and
//! ServiceAccount, the pod (and node) in the user's extras.

use super::status::Failure;
use super::store::{key, Store};
use serde_json::{json, Value};

/// The audience the API server checks when a review names none (its
/// `--api-audiences`, which default to the ServiceAccount issuer).
pub const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// Extra naming the pod a token is bound to.
pub const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";
/// Extra carrying that pod's UID.
pub const POD_UID_EXTRA: &str = "authentication.kubernetes.io/pod-uid";
/// Extra naming the pod's node (Kubernetes 1.32+).
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
/// Extra identifying the token itself.
pub const CREDENTIAL_ID_EXTRA: &str = "authentication.kubernetes.io/credential-id";

/// What a ServiceAccount token stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenIdentity {
    /// The ServiceAccount's namespace.
    pub namespace: String,
    /// The ServiceAccount's name.
    pub service_account: String,
    /// The ServiceAccount's UID (the user's `uid`).
    pub service_account_uid: String,
    /// The token's audiences (`aud`).
    pub audiences: Vec<String>,
    /// The pod the token is bound to: (name, UID). The review fails once that pod is
    /// gone or has another UID, as on the API server.
    pub pod: Option<(String, String)>,
    /// The pod's node, sent as the `node-name` extra (leave out to act as a server
    /// older than 1.32).
    pub node: Option<String>,
    /// An expired token is refused.
    pub expired: bool,
    /// The token's ID (`jti`), sent as the `credential-id` extra.
    pub id: String,
}

impl TokenIdentity {
    /// A token of ServiceAccount `namespace/name` for `audiences`, bound to no pod.
    pub fn service_account(namespace: &str, name: &str, audiences: &[&str]) -> Self {
        Self {
            namespace: namespace.into(),
            service_account: name.into(),
            service_account_uid: super::store::new_uid(),
            audiences: audiences.iter().map(|a| a.to_string()).collect(),
            pod: None,
            node: None,
            expired: false,
            id: super::store::new_uid(),
        }
    }

    /// The token a kubelet projects into pod `namespace/pod` (which must be in the
    /// store): its ServiceAccount, UID and node.
    pub(crate) fn of_pod(store: &Store, namespace: &str, pod: &str, audiences: &[&str]) -> Self {
        let pods = store.find("", "v1", "pods").unwrap_or(0);
        let object = store
            .get(pods, &key(namespace, pod))
            .unwrap_or_else(|| panic!("fake kube: no pod {namespace}/{pod} to make a token for"));
        let text = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(String::from);
        let account = text(&object["spec"]["serviceAccountName"]).unwrap_or("default".into());
        let mut id = Self::service_account(namespace, &account, audiences);
        let accounts = store.find("", "v1", "serviceaccounts").unwrap_or(0);
        if let Some(uid) = store
            .get(accounts, &key(namespace, &account))
            .and_then(|sa| text(&sa["metadata"]["uid"]))
        {
            id.service_account_uid = uid;
        }
        id.pod = Some((
            pod.to_string(),
            text(&object["metadata"]["uid"]).unwrap_or_default(),
        ));
        id.node = text(&object["spec"]["nodeName"]);
        id
    }
}

/// Answers one review: the TokenReview with its `status` filled in.
pub(crate) fn review(
    store: &Store,
    tokens: &std::collections::HashMap<String, TokenIdentity>,
    body: &[u8],
) -> Result<Value, Failure> {
    let request: Value = serde_json::from_slice(body)
        .map_err(|e| Failure::bad_request(format!("the body is not a TokenReview: {e}")))?;
    let spec = &request["spec"];
    let token = spec["token"].as_str().unwrap_or_default();
    if token.is_empty() {
        return Err(Failure::invalid(
            "TokenReview.authentication.k8s.io \"\" is invalid: spec.token: Required value",
        ));
    }
    let wanted: Vec<String> = match spec["audiences"].as_array() {
        Some(a) if !a.is_empty() => a
            .iter()
            .filter_map(|v| v.as_str().map(String::from))
            .collect(),
        _ => vec![API_AUDIENCE.to_string()],
    };
    let status = match tokens.get(token) {
        None => refused("invalid bearer token"),
        Some(id) => match check(store, id, &wanted) {
            Ok(audiences) => authenticated(id, audiences),
            Err(reason) => refused(&reason),
        },
    };
    Ok(json!({
        "kind": "TokenReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "spec": spec,
        "status": status,
    }))
}

/// The audiences both the token and the review name, if the token is still good.
fn check(store: &Store, id: &TokenIdentity, wanted: &[String]) -> Result<Vec<String>, String> {
    let audiences: Vec<String> = id
        .audiences
        .iter()
        .filter(|a| wanted.contains(a))
        .cloned()
        .collect();
    if audiences.is_empty() {
        return Err(format!(
            "[invalid bearer token, token audiences {:?} is invalid for the target audiences {:?}]",
            id.audiences, wanted
        ));
    }
    if id.expired {
        return Err("[invalid bearer token, service account token has expired]".into());
    }
    let invalidated = "[invalid bearer token, service account token has been invalidated]";
    let accounts = store.find("", "v1", "serviceaccounts").unwrap_or(0);
    let account = store.get(accounts, &key(&id.namespace, &id.service_account));
    if account.is_none() {
        return Err(invalidated.into());
    }
    if let Some((name, uid)) = &id.pod {
        let pods = store.find("", "v1", "pods").unwrap_or(0);
        let Some(pod) = store.get(pods, &key(&id.namespace, name)) else {
            return Err(invalidated.into());
        };
        let actual = pod["metadata"]["uid"].as_str().unwrap_or_default();
        if actual != uid {
            return Err(format!(
                "[invalid bearer token, pod UID ({actual}) does not match claim ({uid})]"
            ));
        }
    }
    Ok(audiences)
}

fn authenticated(id: &TokenIdentity, audiences: Vec<String>) -> Value {
    let mut extra = serde_json::Map::new();
    extra.insert(
        CREDENTIAL_ID_EXTRA.into(),
        json!([format!("JTI={}", id.id)]),
    );
    if let Some((name, uid)) = &id.pod {
        extra.insert(POD_NAME_EXTRA.into(), json!([name]));
        extra.insert(POD_UID_EXTRA.into(), json!([uid]));
    }
    if let Some(node) = &id.node {
        extra.insert(NODE_NAME_EXTRA.into(), json!([node]));
    }
    json!({
        "authenticated": true,
        "user": {
            "username": format!("system:serviceaccount:{}:{}", id.namespace, id.service_account),
            "uid": id.service_account_uid,
            "groups": [
                "system:serviceaccounts",
                format!("system:serviceaccounts:{}", id.namespace),
                "system:authenticated",
            ],
            "extra": extra,
        },
        "audiences": audiences,
    })
}

fn refused(error: &str) -> Value {
    json!({"user": {}, "error": error})
}
