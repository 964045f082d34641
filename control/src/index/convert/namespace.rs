//! Namespace: whether it is meshed, and the annotations its pods inherit.

use super::{check_policy_annotation, check_port_annotations, err, mesh_annotation, ConvertError};
use crate::index::model::NamespaceInfo;
use k8s_openapi::api::core::v1::Namespace;

/// The namespace's name and mesh settings.
pub(crate) fn namespace(ns: &Namespace) -> Result<(String, NamespaceInfo), ConvertError> {
    let name = ns
        .metadata
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| err("Namespace", "metadata.name", "required"))?;
    let object = format!("Namespace {name}");
    let meshed = mesh_annotation(&ns.metadata, &object)?;
    check_port_annotations(&ns.metadata, &object)?;
    check_policy_annotation(&ns.metadata, &object)?;
    Ok((
        name,
        NamespaceInfo {
            meshed: meshed.unwrap_or(false),
            annotations: ns.metadata.annotations.clone().unwrap_or_default(),
        },
    ))
}
