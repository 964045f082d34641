//! The kinds of Kubernetes object the index holds.

use std::fmt;

/// A kind the index holds. Adding one is a variant here, its conversion in `convert/`,
/// its map in [`super::ClusterIndex`], and one line in each backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Kind {
    /// core/v1 Namespace.
    Namespace,
    /// core/v1 Pod.
    Pod,
    /// core/v1 ServiceAccount.
    ServiceAccount,
    /// core/v1 Service.
    Service,
    /// discovery.k8s.io/v1 EndpointSlice.
    EndpointSlice,
    /// policy.ambit.dev/v1alpha1 Server.
    Server,
    /// policy.ambit.dev/v1alpha1 AuthorizationPolicy.
    AuthorizationPolicy,
    /// policy.ambit.dev/v1alpha1 MeshTLSAuthentication.
    MeshTlsAuthentication,
    /// policy.ambit.dev/v1alpha1 NetworkAuthentication.
    NetworkAuthentication,
    /// gateway.networking.k8s.io/v1 HTTPRoute.
    HttpRoute,
    /// gateway.networking.k8s.io/v1 GRPCRoute.
    GrpcRoute,
}

impl Kind {
    /// Every kind, in the order a backend lists them.
    pub const ALL: [Kind; 11] = [
        Kind::Namespace,
        Kind::Pod,
        Kind::ServiceAccount,
        Kind::Service,
        Kind::EndpointSlice,
        Kind::Server,
        Kind::AuthorizationPolicy,
        Kind::MeshTlsAuthentication,
        Kind::NetworkAuthentication,
        Kind::HttpRoute,
        Kind::GrpcRoute,
    ];

    /// The kind's name, as in `kind:`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Namespace => "Namespace",
            Kind::Pod => "Pod",
            Kind::ServiceAccount => "ServiceAccount",
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Server => "Server",
            Kind::AuthorizationPolicy => "AuthorizationPolicy",
            Kind::MeshTlsAuthentication => "MeshTLSAuthentication",
            Kind::NetworkAuthentication => "NetworkAuthentication",
            Kind::HttpRoute => "HTTPRoute",
            Kind::GrpcRoute => "GRPCRoute",
        }
    }

    /// The `apiVersion` objects of this kind carry.
    pub fn api_version(self) -> &'static str {
        match self {
            Kind::EndpointSlice => "discovery.k8s.io/v1",
            k if k.is_policy() => super::crd::POLICY_API_VERSION,
            k if k.is_gateway() => super::gateway::GATEWAY_API_VERSION,
            _ => "v1",
        }
    }

    /// Whether this is one of the policy kinds (`policy.ambit.dev`).
    pub fn is_policy(self) -> bool {
        matches!(
            self,
            Kind::Server
                | Kind::AuthorizationPolicy
                | Kind::MeshTlsAuthentication
                | Kind::NetworkAuthentication
        )
    }

    /// Whether this is one of Gateway API's route kinds (`gateway.networking.k8s.io`),
    /// whose CRDs a cluster may not have.
    pub fn is_gateway(self) -> bool {
        matches!(self, Kind::HttpRoute | Kind::GrpcRoute)
    }

    /// Whether objects of this kind live in a namespace.
    pub fn is_namespaced(self) -> bool {
        !matches!(self, Kind::Namespace)
    }

    /// The kind named `name`, if the index holds it.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
