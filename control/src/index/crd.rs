//! The policy kinds (`policy.ambit.dev/v1alpha1`) as they are written: Server,
//! AuthorizationPolicy, MeshTLSAuthentication and NetworkAuthentication, in the shapes of
//! `helm/ambit-crds/templates/policy-crds.yaml` (Linkerd's `policy.linkerd.io` shapes).
//!
//! Every field is optional here and every value a plain string: what is required and
//! what a value may be is checked by the conversion (`convert/policy/`), which names the
//! object and the field. Deserialization must not fail on a bad value, because a kube-rs
//! watcher that cannot decode one object of a list fails the whole list (and the kind
//! would never be listed); for the same reason unknown fields are not refused here — the
//! local backend finds them by a round trip through these types, as it does for the
//! built-in kinds, and the API server prunes them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::{Deserialize, Serialize};

/// The API group of the policy kinds.
pub const POLICY_GROUP: &str = "policy.ambit.dev";
/// The version of the policy kinds.
pub const POLICY_VERSION: &str = "v1alpha1";
/// `apiVersion` of the policy kinds.
pub const POLICY_API_VERSION: &str = "policy.ambit.dev/v1alpha1";

/// Declares a policy kind: `apiVersion`, `kind`, `metadata` and an optional `spec`.
macro_rules! policy_kind {
    ($(#[$doc:meta])* $name:ident, $spec:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
        #[serde(rename_all = "camelCase")]
        pub struct $name {
            /// `policy.ambit.dev/v1alpha1`.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub api_version: Option<String>,
            /// The kind's name.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub kind: Option<String>,
            /// Standard object metadata.
            #[serde(default)]
            pub metadata: ObjectMeta,
            /// What the object says.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub spec: Option<$spec>,
        }
    };
}

policy_kind!(
    /// A port of a set of pods, which AuthorizationPolicies attach to.
    Server,
    ServerSpec
);
policy_kind!(
    /// Allows traffic to a Server (or every Server of a namespace) when every required
    /// authentication matches.
    AuthorizationPolicy,
    AuthorizationPolicySpec
);
policy_kind!(
    /// Clients that present one of these mesh identities.
    MeshTlsAuthentication,
    MeshTlsAuthenticationSpec
);
policy_kind!(
    /// Clients whose address is in one of these networks.
    NetworkAuthentication,
    NetworkAuthenticationSpec
);

/// `Server.spec`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerSpec {
    /// The pods of the Server's namespace it selects (`matchLabels`, `matchExpressions`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    /// A port number, or the name of a container port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<IntOrString>,
    /// `unknown` (detect; the default), `HTTP/1`, `HTTP/2`, `gRPC`, `opaque`, `TLS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_protocol: Option<String>,
    /// What is allowed when no AuthorizationPolicy allows it: a default policy's name
    /// (`deny`, the default, or `audit`, `all-unauthenticated`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_policy: Option<String>,
}

/// A reference to another object: a target, an authentication, an identity.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRef {
    /// The referent's API group (`policy.ambit.dev`; `""` or `core` for core kinds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The referent's kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The referent's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The referent's namespace; unset, the referring object's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// `AuthorizationPolicy.spec`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthorizationPolicySpec {
    /// What the policy allows traffic to: a Server, a Namespace (all its Servers), or
    /// (later) an HTTPRoute or GRPCRoute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<PolicyRef>,
    /// All of these must match; an empty list allows everyone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required_authentication_refs: Option<Vec<PolicyRef>>,
}

/// `MeshTLSAuthentication.spec`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MeshTlsAuthenticationSpec {
    /// SPIFFE IDs (`*` any meshed client, a trailing `*` a prefix) or Linkerd-style DNS
    /// identities of this mesh (`*.<ns>.serviceaccount.identity.ambit.<trust domain>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identities: Option<Vec<String>>,
    /// ServiceAccounts (their SPIFFE ID) or Namespaces (all their ServiceAccounts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity_refs: Option<Vec<PolicyRef>>,
}

/// `NetworkAuthentication.spec`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkAuthenticationSpec {
    /// The networks clients may come from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub networks: Option<Vec<NetworkSpec>>,
}

/// One network of a NetworkAuthentication.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkSpec {
    /// An IPv4 or IPv6 CIDR.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cidr: Option<String>,
    /// Addresses or CIDRs within it that do not match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub except: Option<Vec<String>>,
}
