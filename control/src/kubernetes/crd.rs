//! The policy kinds and Gateway API's routes as kube-rs resources, so that each is
//! watched as the built-in kinds are (`Api::<Server>::all`). The types are the index's own
//! (`index::crd`, `index::gateway`); only the API's coordinates are said here.

use crate::index::crd::{
    AuthorizationPolicy, MeshTlsAuthentication, NetworkAuthentication, Server, POLICY_GROUP,
    POLICY_VERSION,
};
use crate::index::gateway::{GrpcRoute, HttpRoute, GATEWAY_GROUP, GATEWAY_VERSION};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::NamespaceResourceScope;
use std::borrow::Cow;

macro_rules! resource {
    ($ty:ty, $kind:literal, $plural:literal) => {
        resource!($ty, $kind, $plural, POLICY_GROUP, POLICY_VERSION);
    };
    ($ty:ty, $kind:literal, $plural:literal, $group:expr, $version:expr) => {
        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = NamespaceResourceScope;

            fn kind(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($kind)
            }

            fn group(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($group)
            }

            fn version(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($version)
            }

            fn plural(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($plural)
            }

            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }

            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

resource!(Server, "Server", "servers");
resource!(
    AuthorizationPolicy,
    "AuthorizationPolicy",
    "authorizationpolicies"
);
resource!(
    MeshTlsAuthentication,
    "MeshTLSAuthentication",
    "meshtlsauthentications"
);
resource!(
    NetworkAuthentication,
    "NetworkAuthentication",
    "networkauthentications"
);

resource!(
    HttpRoute,
    "HTTPRoute",
    "httproutes",
    GATEWAY_GROUP,
    GATEWAY_VERSION
);
resource!(
    GrpcRoute,
    "GRPCRoute",
    "grpcroutes",
    GATEWAY_GROUP,
    GATEWAY_VERSION
);

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

    #[test]
    fn the_policy_kinds_are_served_where_the_crds_say() {
        assert_eq!(Server::api_version(&()), "policy.ambit.dev/v1alpha1");
        assert_eq!(
            Server::url_path(&(), Some("shop")),
            "/apis/policy.ambit.dev/v1alpha1/namespaces/shop/servers"
        );
        assert_eq!(MeshTlsAuthentication::kind(&()), "MeshTLSAuthentication");
        assert_eq!(AuthorizationPolicy::plural(&()), "authorizationpolicies");
        assert_eq!(NetworkAuthentication::plural(&()), "networkauthentications");
        assert_eq!(
            HttpRoute::url_path(&(), Some("shop")),
            "/apis/gateway.networking.k8s.io/v1/namespaces/shop/httproutes"
        );
        assert_eq!(GrpcRoute::kind(&()), "GRPCRoute");
    }
}
