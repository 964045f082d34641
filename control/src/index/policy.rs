//! Domain types of the policy kinds: what inbound policy needs to know of each Server,
//! AuthorizationPolicy, MeshTLSAuthentication and NetworkAuthentication, checked and
//! resolved as far as one object alone allows (references to other objects are resolved
//! when policy is rendered).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::BTreeMap;

/// A Server: a port of the pods its selector picks in its namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerInfo {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// metadata.creationTimestamp: of two Servers on one pod port the older wins.
    pub created: Option<Time>,
    /// spec.podSelector.
    pub selector: Selector,
    /// spec.port.
    pub port: ServerPort,
    /// spec.proxyProtocol (`unknown` when unset).
    pub protocol: String,
    /// spec.accessPolicy, a default policy's name (`deny` when unset).
    pub access_policy: String,
}

/// A Server's port: a number, or a container port's name (resolved per pod).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerPort {
    /// This port.
    Number(u16),
    /// The container port of this name, in each pod that has one.
    Name(String),
}

/// A label selector: every label and every expression must match; an empty selector
/// matches every pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    /// matchLabels.
    pub labels: BTreeMap<String, String>,
    /// matchExpressions.
    pub expressions: Vec<Requirement>,
}

/// One of a selector's matchExpressions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    /// The label.
    pub key: String,
    /// How its value is compared.
    pub operator: Operator,
    /// The values of `In` and `NotIn`.
    pub values: Vec<String>,
}

/// A matchExpression's operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operator {
    /// The label is one of the values.
    In,
    /// The label is absent or none of the values.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

impl Selector {
    /// Whether `labels` satisfy the selector, as Kubernetes decides.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.expressions.iter().all(|r| {
                let value = labels.get(&r.key);
                match r.operator {
                    Operator::In => value.is_some_and(|v| r.values.contains(v)),
                    Operator::NotIn => value.is_none_or(|v| !r.values.contains(v)),
                    Operator::Exists => value.is_some(),
                    Operator::DoesNotExist => value.is_none(),
                }
            })
    }
}

/// An AuthorizationPolicy: who may reach its target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthorizationPolicyInfo {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// spec.targetRef.
    pub target: PolicyTarget,
    /// spec.requiredAuthenticationRefs: all must match (none: everyone).
    pub authentications: Vec<AuthenticationRef>,
}

/// What an AuthorizationPolicy applies to (always in its own namespace).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyTarget {
    /// The Server of this name.
    Server(String),
    /// Every Server of the policy's namespace.
    Namespace,
    /// An HTTPRoute or GRPCRoute (kind, name) of the policy's namespace: per-route
    /// authorization, where the route is attached to a Server.
    Route(String, String),
}

/// A required authentication of an AuthorizationPolicy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthenticationRef {
    /// The MeshTLSAuthentication (namespace, name).
    MeshTls(String, String),
    /// The NetworkAuthentication (namespace, name).
    Network(String, String),
    /// A client running as this ServiceAccount: its SPIFFE ID.
    ServiceAccount(String),
}

/// A client identity a MeshTLSAuthentication accepts.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum IdentityMatch {
    /// Any identity of the trust domain (`*`).
    Any,
    /// This SPIFFE ID.
    Exact(String),
    /// Any SPIFFE ID starting with this.
    Prefix(String),
}

/// A MeshTLSAuthentication: its identities and identityRefs, as SPIFFE ID patterns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeshTlsInfo {
    /// Every identity it accepts (empty: nobody).
    pub identities: Vec<IdentityMatch>,
}

/// A network a NetworkAuthentication accepts: a CIDR minus its exceptions (checked).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkInfo {
    /// The CIDR.
    pub cidr: String,
    /// CIDRs (or addresses) within it that do not match.
    pub except: Vec<String>,
}

/// A NetworkAuthentication.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkAuthInfo {
    /// The networks (at least one).
    pub networks: Vec<NetworkInfo>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn req(key: &str, operator: Operator, values: &[&str]) -> Requirement {
        Requirement {
            key: key.into(),
            operator,
            values: values.iter().map(|v| v.to_string()).collect(),
        }
    }

    #[test]
    fn match_expressions_select_as_kubernetes_does() {
        let web = labels(&[("app", "web"), ("tier", "front")]);
        let batch = labels(&[("app", "batch")]);
        let none = labels(&[]);
        let sel = |expressions: Vec<Requirement>| Selector {
            labels: BTreeMap::new(),
            expressions,
        };
        assert!(sel(vec![]).matches(&none), "empty selects everything");
        let in_ = sel(vec![req("app", Operator::In, &["web", "api"])]);
        assert!(in_.matches(&web) && !in_.matches(&batch) && !in_.matches(&none));
        let not_in = sel(vec![req("app", Operator::NotIn, &["web"])]);
        assert!(!not_in.matches(&web) && not_in.matches(&batch));
        assert!(
            not_in.matches(&none),
            "NotIn holds for a pod without the label"
        );
        let exists = sel(vec![req("tier", Operator::Exists, &[])]);
        assert!(exists.matches(&web) && !exists.matches(&batch));
        let absent = sel(vec![req("tier", Operator::DoesNotExist, &[])]);
        assert!(!absent.matches(&web) && absent.matches(&batch));
        // Labels and expressions together: all must hold.
        let both = Selector {
            labels: labels(&[("app", "web")]),
            expressions: vec![req("tier", Operator::In, &["back"])],
        };
        assert!(!both.matches(&web));
    }
}
