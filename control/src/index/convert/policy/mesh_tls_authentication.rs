//! MeshTLSAuthentication: client identities as SPIFFE ID patterns of the trust domain.
//!
//! `identities` are SPIFFE IDs (`*` alone: any meshed client; a trailing `*`: a prefix,
//! e.g. `spiffe://cluster.local/ns/shop/sa/*`), or, for manifests written for Linkerd,
//! this mesh's DNS identities: `<sa>.<ns>.serviceaccount.identity.ambit.<trust domain>`
//! (that ServiceAccount) and `*.<ns>.serviceaccount.identity.ambit.<trust domain>` (every
//! ServiceAccount of the namespace), which are what the proxy can match: it sees SPIFFE
//! IDs. `identityRefs` name a ServiceAccount (its SPIFFE ID) or a Namespace (the prefix
//! `spiffe://<td>/ns/<ns>/sa/`).

use super::{ref_group, ref_kind, ref_name, spec};
use crate::index::convert::{err, namespaced_name, ConvertError};
use crate::index::crd::MeshTlsAuthentication;
use crate::index::policy::{IdentityMatch, MeshTlsInfo};
use ambit_api::WorkloadIdentity;

/// The MeshTLSAuthentication's identities in `trust_domain`.
pub(crate) fn mesh_tls_authentication(
    m: &MeshTlsAuthentication,
    trust_domain: &str,
) -> Result<((String, String), MeshTlsInfo), ConvertError> {
    let key = namespaced_name(&m.metadata, "MeshTLSAuthentication")?;
    let object = format!("MeshTLSAuthentication {}/{}", key.0, key.1);
    let spec = spec(&m.spec, &object)?;
    if spec.identities.is_none() && spec.identity_refs.is_none() {
        return Err(err(
            &object,
            "spec",
            "name the clients: identities, identityRefs or both",
        ));
    }
    let mut identities = Vec::new();
    for (i, id) in spec.identities.iter().flatten().enumerate() {
        identities.push(
            identity(id, trust_domain)
                .map_err(|m| err(&object, &format!("spec.identities[{i}]"), m))?,
        );
    }
    for (i, r) in spec.identity_refs.iter().flatten().enumerate() {
        let field = format!("spec.identityRefs[{i}]");
        let kind = ref_kind(r, &["ServiceAccount", "Namespace"], &object, &field)?;
        ref_group(r, kind, &object, &field)?;
        let name = ref_name(r, &object, &field)?;
        let bad = |e: ambit_api::identity::IdentityError| err(&object, &field, e.to_string());
        identities.push(if kind == "Namespace" {
            // The namespace checked as an identity's would be.
            let id = WorkloadIdentity::new(trust_domain, name, "sa").map_err(bad)?;
            namespace_prefix(&id)
        } else {
            let ns = r.namespace.as_deref().unwrap_or(&key.0);
            IdentityMatch::Exact(
                WorkloadIdentity::new(trust_domain, ns, name)
                    .map_err(bad)?
                    .spiffe_id(),
            )
        });
    }
    identities.sort();
    identities.dedup();
    Ok((key, MeshTlsInfo { identities }))
}

/// Every ServiceAccount of `id`'s namespace.
fn namespace_prefix(id: &WorkloadIdentity) -> IdentityMatch {
    IdentityMatch::Prefix(format!(
        "spiffe://{}/ns/{}/sa/",
        id.trust_domain(),
        id.namespace()
    ))
}

/// One entry of `spec.identities`.
fn identity(s: &str, trust_domain: &str) -> Result<IdentityMatch, String> {
    if s == "*" {
        return Ok(IdentityMatch::Any);
    }
    let help = || {
        format!(
            "{s:?} is not an identity: use a SPIFFE ID (spiffe://{trust_domain}/ns/<ns>/sa/<sa>, \
             a trailing * for a prefix), * for any meshed client, or \
             [*|<sa>].<ns>.serviceaccount.identity.ambit.{trust_domain}"
        )
    };
    if let Some(rest) = s.strip_prefix("spiffe://") {
        let stem = s.strip_suffix('*');
        if rest.is_empty() || stem.unwrap_or(s).contains('*') {
            return Err(help());
        }
        return Ok(match stem {
            Some(prefix) => IdentityMatch::Prefix(prefix.to_string()),
            None => IdentityMatch::Exact(s.to_string()),
        });
    }
    let suffix = format!(".serviceaccount.identity.ambit.{trust_domain}");
    let (sa, ns) = s
        .strip_suffix(&suffix)
        .and_then(|rest| rest.rsplit_once('.'))
        .ok_or_else(help)?;
    if sa == "*" {
        let id = WorkloadIdentity::new(trust_domain, ns, "sa").map_err(|e| e.to_string())?;
        return Ok(namespace_prefix(&id));
    }
    WorkloadIdentity::new(trust_domain, ns, sa)
        .map(|id| IdentityMatch::Exact(id.spiffe_id()))
        .map_err(|e| format!("{s:?}: {e}"))
}
