//! NetworkAuthentication: CIDRs, each with the CIDRs within it that do not match.

use super::{check_cidr, spec};
use crate::index::convert::{err, namespaced_name, ConvertError};
use crate::index::crd::NetworkAuthentication;
use crate::index::policy::{NetworkAuthInfo, NetworkInfo};

/// The NetworkAuthentication's networks, each CIDR checked.
pub(crate) fn network_authentication(
    n: &NetworkAuthentication,
) -> Result<((String, String), NetworkAuthInfo), ConvertError> {
    let key = namespaced_name(&n.metadata, "NetworkAuthentication")?;
    let object = format!("NetworkAuthentication {}/{}", key.0, key.1);
    let spec = spec(&n.spec, &object)?;
    let listed = spec.networks.as_deref().unwrap_or_default();
    if listed.is_empty() {
        return Err(err(
            &object,
            "spec.networks",
            "required: at least one network, e.g. {cidr: 10.0.0.0/8}",
        ));
    }
    let mut networks = Vec::new();
    for (i, net) in listed.iter().enumerate() {
        let cidr = net
            .cidr
            .clone()
            .ok_or_else(|| err(&object, &format!("spec.networks[{i}].cidr"), "required"))?;
        check_cidr(&cidr, false)
            .map_err(|m| err(&object, &format!("spec.networks[{i}].cidr"), m))?;
        let except = net.except.clone().unwrap_or_default();
        for (j, e) in except.iter().enumerate() {
            check_cidr(e, true)
                .map_err(|m| err(&object, &format!("spec.networks[{i}].except[{j}]"), m))?;
        }
        networks.push(NetworkInfo { cidr, except });
    }
    Ok((key, NetworkAuthInfo { networks }))
}
