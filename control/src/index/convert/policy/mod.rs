//! Conversion of the policy kinds (`policy.ambit.dev/v1alpha1`), one module per kind.
//! Each checks what one object alone can be checked for — required fields, enum values,
//! CIDRs, identities, the groups and kinds of references — and reports it by object and
//! field, as the built-in kinds' conversions do. References to other objects are resolved
//! when policy is rendered (`crate::policy`), since the referent may come later.

mod authorization_policy;
mod mesh_tls_authentication;
mod network_authentication;
mod server;

pub(crate) use authorization_policy::authorization_policy;
pub(crate) use mesh_tls_authentication::mesh_tls_authentication;
pub(crate) use network_authentication::network_authentication;
pub(crate) use server::server;

use super::{err, ConvertError};
use crate::index::crd::{PolicyRef, POLICY_GROUP};

/// `spec`, which every policy kind requires.
fn spec<'a, S>(spec: &'a Option<S>, object: &str) -> Result<&'a S, ConvertError> {
    spec.as_ref().ok_or_else(|| err(object, "spec", "required"))
}

/// A reference's kind, which must be one of `kinds`.
fn ref_kind<'a>(
    r: &'a PolicyRef,
    kinds: &[&str],
    object: &str,
    field: &str,
) -> Result<&'a str, ConvertError> {
    match r.kind.as_deref() {
        Some(k) if kinds.contains(&k) => Ok(k),
        Some(k) => Err(err(
            object,
            &format!("{field}.kind"),
            format!(
                "{k:?} is not supported here; use one of {}",
                kinds.join(", ")
            ),
        )),
        None => Err(err(
            object,
            &format!("{field}.kind"),
            format!("required: one of {}", kinds.join(", ")),
        )),
    }
}

/// A reference's name, which is required.
fn ref_name<'a>(r: &'a PolicyRef, object: &str, field: &str) -> Result<&'a str, ConvertError> {
    r.name
        .as_deref()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| err(object, &format!("{field}.name"), "required"))
}

/// Checks a reference's group: the policy group for the policy kinds, the core group
/// (`""` or `core`) for Namespace and ServiceAccount. Unset means the kind's own.
fn ref_group(r: &PolicyRef, kind: &str, object: &str, field: &str) -> Result<(), ConvertError> {
    let want: &[&str] = match kind {
        "Namespace" | "ServiceAccount" => &["", "core"],
        "HTTPRoute" | "GRPCRoute" => &["gateway.networking.k8s.io", POLICY_GROUP],
        _ => &["", POLICY_GROUP],
    };
    match r.group.as_deref() {
        None => Ok(()),
        Some(g) if want.contains(&g) => Ok(()),
        Some(g) => Err(err(
            object,
            &format!("{field}.group"),
            format!(
                "{g:?} is not the group of {kind}; use {:?} or leave it out",
                want[want.len() - 1]
            ),
        )),
    }
}

/// Checks that `s` is a CIDR (`10.0.0.0/8`, `fd00::/8`) or, with `bare`, an address.
fn check_cidr(s: &str, bare: bool) -> Result<(), String> {
    let (addr, bits) = match s.split_once('/') {
        Some((a, b)) => (a, Some(b)),
        None if bare => (s, None),
        None => return Err(format!("{s:?} is not a CIDR (e.g. 10.0.0.0/8)")),
    };
    let addr: std::net::IpAddr = addr
        .parse()
        .map_err(|_| format!("{s:?} is not a CIDR (e.g. 10.0.0.0/8)"))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    match bits {
        Some(b) if !b.parse::<u8>().is_ok_and(|b| b <= max) => {
            Err(format!("{s:?}: the prefix length must be 0 to {max}"))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests;
