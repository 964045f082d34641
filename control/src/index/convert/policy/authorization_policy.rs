//! AuthorizationPolicy: a target in the policy's namespace and the authentications that
//! must all match.

use super::{ref_group, ref_kind, ref_name, spec};
use crate::index::convert::{err, namespaced_name, ConvertError};
use crate::index::crd::AuthorizationPolicy;
use crate::index::policy::{AuthenticationRef, AuthorizationPolicyInfo, PolicyTarget};
use ambit_api::WorkloadIdentity;

/// The AuthorizationPolicy as policy sees it; ServiceAccount references become SPIFFE IDs
/// of `trust_domain`.
pub(crate) fn authorization_policy(
    p: &AuthorizationPolicy,
    trust_domain: &str,
) -> Result<AuthorizationPolicyInfo, ConvertError> {
    let (namespace, name) = namespaced_name(&p.metadata, "AuthorizationPolicy")?;
    let object = format!("AuthorizationPolicy {namespace}/{name}");
    let spec = spec(&p.spec, &object)?;

    let field = "spec.targetRef";
    let target = spec
        .target_ref
        .as_ref()
        .ok_or_else(|| err(&object, field, "required"))?;
    let kind = ref_kind(
        target,
        &["Server", "Namespace", "HTTPRoute", "GRPCRoute"],
        &object,
        field,
    )?;
    ref_group(target, kind, &object, field)?;
    let target_name = ref_name(target, &object, field)?;
    if target
        .namespace
        .as_deref()
        .is_some_and(|ns| ns != namespace)
    {
        return Err(err(
            &object,
            &format!("{field}.namespace"),
            "an AuthorizationPolicy applies to its own namespace only; leave it out or move the policy",
        ));
    }
    let target = match kind {
        "Server" => PolicyTarget::Server(target_name.to_string()),
        "Namespace" if target_name == namespace => PolicyTarget::Namespace,
        "Namespace" => {
            return Err(err(
                &object,
                &format!("{field}.name"),
                format!("{target_name:?}: a Namespace target must be the policy's own namespace, {namespace:?}"),
            ))
        }
        route => PolicyTarget::Route(route.to_string(), target_name.to_string()),
    };

    let refs = spec.required_authentication_refs.as_ref().ok_or_else(|| {
        err(
            &object,
            "spec.requiredAuthenticationRefs",
            "required; an empty list ([]) allows every client",
        )
    })?;
    let mut authentications = Vec::new();
    for (i, r) in refs.iter().enumerate() {
        let field = format!("spec.requiredAuthenticationRefs[{i}]");
        let kind = ref_kind(
            r,
            &[
                "MeshTLSAuthentication",
                "NetworkAuthentication",
                "ServiceAccount",
            ],
            &object,
            &field,
        )?;
        ref_group(r, kind, &object, &field)?;
        let ref_name = ref_name(r, &object, &field)?.to_string();
        let ref_ns = r.namespace.clone().unwrap_or_else(|| namespace.clone());
        authentications.push(match kind {
            "MeshTLSAuthentication" => AuthenticationRef::MeshTls(ref_ns, ref_name),
            "NetworkAuthentication" => AuthenticationRef::Network(ref_ns, ref_name),
            _ => {
                let id = WorkloadIdentity::new(trust_domain, ref_ns, ref_name)
                    .map_err(|e| err(&object, &field, e.to_string()))?;
                AuthenticationRef::ServiceAccount(id.spiffe_id())
            }
        });
    }
    Ok(AuthorizationPolicyInfo {
        namespace,
        name,
        target,
        authentications,
    })
}
