//! The policy kinds as kube-rs resources, so that each is watched as the built-in kinds
//! are (`Api::<Server>::all`). The types are the index's own (`index::crd`); only the
//! API's coordinates are said here.

use crate::index::crd::{
    AuthorizationPolicy, MeshTlsAuthentication, NetworkAuthentication, Server, POLICY_GROUP,
    POLICY_VERSION,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::NamespaceResourceScope;
use std::borrow::Cow;

macro_rules! policy_resource {
    ($ty:ty, $kind:literal, $plural:literal) => {
        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = NamespaceResourceScope;

            fn kind(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($kind)
            }

            fn group(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(POLICY_GROUP)
            }

            fn version(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(POLICY_VERSION)
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

policy_resource!(Server, "Server", "servers");
policy_resource!(
    AuthorizationPolicy,
    "AuthorizationPolicy",
    "authorizationpolicies"
);
policy_resource!(
    MeshTlsAuthentication,
    "MeshTLSAuthentication",
    "meshtlsauthentications"
);
policy_resource!(
    NetworkAuthentication,
    "NetworkAuthentication",
    "networkauthentications"
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
    }
}
