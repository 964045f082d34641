//! Conversion of Kubernetes objects into the index's domain types, with errors that name
//! the object and the field.

mod annotations;
mod endpoint_slice;
mod namespace;
mod pod;
mod policy;
mod route;
mod service;

pub use annotations::{
    FAILURE_ACCRUAL, FA_JITTER_RATIO, FA_MAX_FAILURES, FA_MAX_PENALTY, FA_MIN_PENALTY, RETRY_GRPC,
    RETRY_HTTP, RETRY_LIMIT, RETRY_TIMEOUT, TIMEOUT_IDLE, TIMEOUT_REQUEST, TIMEOUT_RESPONSE,
};

pub(super) use endpoint_slice::endpoint_slice;
pub(super) use namespace::namespace;
pub(super) use pod::pod;
pub(super) use policy::{
    authorization_policy, mesh_tls_authentication, network_authentication, server,
};
pub(super) use route::{grpc_route, http_route};
pub(super) use service::service;

use super::crd::{AuthorizationPolicy, MeshTlsAuthentication, NetworkAuthentication, Server};
use super::gateway::{GrpcRoute, HttpRoute};
use super::kind::Kind;
use super::MESH_ANNOTATION;
use ambit_api::ports::PortSet;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::fmt;
use std::net::IpAddr;

/// The kinds the index holds.
#[derive(Clone, Debug)]
#[allow(clippy::large_enum_variant)]
pub enum KubeObject {
    /// core/v1 Namespace.
    Namespace(Namespace),
    /// core/v1 Pod.
    Pod(Pod),
    /// core/v1 ServiceAccount.
    ServiceAccount(ServiceAccount),
    /// core/v1 Service.
    Service(Service),
    /// discovery.k8s.io/v1 EndpointSlice.
    EndpointSlice(EndpointSlice),
    /// policy.ambit.dev/v1alpha1 Server.
    Server(Server),
    /// policy.ambit.dev/v1alpha1 AuthorizationPolicy.
    AuthorizationPolicy(AuthorizationPolicy),
    /// policy.ambit.dev/v1alpha1 MeshTLSAuthentication.
    MeshTlsAuthentication(MeshTlsAuthentication),
    /// policy.ambit.dev/v1alpha1 NetworkAuthentication.
    NetworkAuthentication(NetworkAuthentication),
    /// gateway.networking.k8s.io/v1 HTTPRoute.
    HttpRoute(HttpRoute),
    /// gateway.networking.k8s.io/v1 GRPCRoute.
    GrpcRoute(GrpcRoute),
}

/// Kind, namespace and name of an object, for deletes and messages.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectRef {
    /// The kind.
    pub kind: Kind,
    /// The namespace, for namespaced kinds.
    pub namespace: Option<String>,
    /// The name.
    pub name: String,
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {}/{}", self.kind, ns, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// A field of an object that the mesh cannot use.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{object}: {field}: {message}")]
pub struct ConvertError {
    /// The object, as far as it could be named.
    pub object: String,
    /// The field path, e.g. `status.podIP`.
    pub field: String,
    /// What is wrong and what is expected.
    pub message: String,
}

impl KubeObject {
    /// The object's kind, namespace and name.
    pub fn object_ref(&self) -> ObjectRef {
        let meta = self.metadata();
        ObjectRef {
            kind: self.kind(),
            namespace: meta.namespace.clone(),
            name: meta.name.clone().unwrap_or_default(),
        }
    }

    /// The object's kind.
    pub fn kind(&self) -> Kind {
        match self {
            KubeObject::Namespace(_) => Kind::Namespace,
            KubeObject::Pod(_) => Kind::Pod,
            KubeObject::ServiceAccount(_) => Kind::ServiceAccount,
            KubeObject::Service(_) => Kind::Service,
            KubeObject::EndpointSlice(_) => Kind::EndpointSlice,
            KubeObject::Server(_) => Kind::Server,
            KubeObject::AuthorizationPolicy(_) => Kind::AuthorizationPolicy,
            KubeObject::MeshTlsAuthentication(_) => Kind::MeshTlsAuthentication,
            KubeObject::NetworkAuthentication(_) => Kind::NetworkAuthentication,
            KubeObject::HttpRoute(_) => Kind::HttpRoute,
            KubeObject::GrpcRoute(_) => Kind::GrpcRoute,
        }
    }

    /// The object's metadata.
    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            KubeObject::Namespace(o) => &o.metadata,
            KubeObject::Pod(o) => &o.metadata,
            KubeObject::ServiceAccount(o) => &o.metadata,
            KubeObject::Service(o) => &o.metadata,
            KubeObject::EndpointSlice(o) => &o.metadata,
            KubeObject::Server(o) => &o.metadata,
            KubeObject::AuthorizationPolicy(o) => &o.metadata,
            KubeObject::MeshTlsAuthentication(o) => &o.metadata,
            KubeObject::NetworkAuthentication(o) => &o.metadata,
            KubeObject::HttpRoute(o) => &o.metadata,
            KubeObject::GrpcRoute(o) => &o.metadata,
        }
    }

    /// Sets `metadata.namespace` to `ns` where a namespaced object has none, as
    /// `kubectl apply` does.
    pub fn default_namespace(&mut self, ns: &str) {
        let meta = match self {
            KubeObject::Namespace(_) => return,
            KubeObject::Pod(o) => &mut o.metadata,
            KubeObject::ServiceAccount(o) => &mut o.metadata,
            KubeObject::Service(o) => &mut o.metadata,
            KubeObject::EndpointSlice(o) => &mut o.metadata,
            KubeObject::Server(o) => &mut o.metadata,
            KubeObject::AuthorizationPolicy(o) => &mut o.metadata,
            KubeObject::MeshTlsAuthentication(o) => &mut o.metadata,
            KubeObject::NetworkAuthentication(o) => &mut o.metadata,
            KubeObject::HttpRoute(o) => &mut o.metadata,
            KubeObject::GrpcRoute(o) => &mut o.metadata,
        };
        meta.namespace.get_or_insert_with(|| ns.to_string());
    }
}

pub(super) fn err(
    object: impl fmt::Display,
    field: &str,
    message: impl Into<String>,
) -> ConvertError {
    ConvertError {
        object: object.to_string(),
        field: field.to_string(),
        message: message.into(),
    }
}

pub(super) fn namespaced_name(
    meta: &ObjectMeta,
    kind: &str,
) -> Result<(String, String), ConvertError> {
    let name = meta
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| err(kind, "metadata.name", "required"))?;
    let ns = meta
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| err(format!("{kind} {name}"), "metadata.namespace", "required"))?;
    Ok((ns, name))
}

/// `enabled` → true, `disabled` → false, absent → None; anything else is an error.
pub(super) fn mesh_annotation(
    meta: &ObjectMeta,
    object: &str,
) -> Result<Option<bool>, ConvertError> {
    match meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(MESH_ANNOTATION))
        .map(String::as_str)
    {
        None => Ok(None),
        Some("enabled") => Ok(Some(true)),
        Some("disabled") => Ok(Some(false)),
        Some(other) => Err(err(
            object,
            &format!("metadata.annotations[\"{MESH_ANNOTATION}\"]"),
            format!("{other:?} is not a valid value; use \"enabled\" or \"disabled\""),
        )),
    }
}

/// Annotation naming ports proxied as opaque TCP.
pub const OPAQUE_PORTS_ANNOTATION: &str = "config.ambit.dev/opaque-ports";
/// Annotation naming inbound ports that bypass the proxy.
pub const SKIP_INBOUND_PORTS_ANNOTATION: &str = "config.ambit.dev/skip-inbound-ports";
/// Annotation naming outbound ports that bypass the proxy.
pub const SKIP_OUTBOUND_PORTS_ANNOTATION: &str = "config.ambit.dev/skip-outbound-ports";
/// Local mode: the pod's network namespace path.
pub const NETNS_ANNOTATION: &str = "local.ambit.dev/netns";

/// Checks the per-port annotations of an object parse.
pub(super) fn check_port_annotations(meta: &ObjectMeta, object: &str) -> Result<(), ConvertError> {
    let Some(a) = meta.annotations.as_ref() else {
        return Ok(());
    };
    for key in [
        OPAQUE_PORTS_ANNOTATION,
        SKIP_INBOUND_PORTS_ANNOTATION,
        SKIP_OUTBOUND_PORTS_ANNOTATION,
    ] {
        if let Some(v) = a.get(key) {
            v.parse::<PortSet>().map_err(|e| {
                err(
                    object,
                    &format!("metadata.annotations[\"{key}\"]"),
                    format!(
                        "{e}; use comma-separated ports and ranges, e.g. \"25,3306,4000-4100\""
                    ),
                )
            })?;
        }
    }
    Ok(())
}

/// A default inbound policy annotation must name one (a typo would otherwise fall back to
/// a more permissive policy unnoticed).
pub(super) fn check_policy_annotation(meta: &ObjectMeta, object: &str) -> Result<(), ConvertError> {
    let key = ambit_api::policy::DEFAULT_INBOUND_POLICY_ANNOTATION;
    match meta.annotations.as_ref().and_then(|a| a.get(key)) {
        Some(v) if !ambit_api::policy::DEFAULT_POLICIES.contains(&v.as_str()) => Err(err(
            object,
            &format!("metadata.annotations[\"{key}\"]"),
            ambit_api::policy::unknown_policy(v),
        )),
        _ => Ok(()),
    }
}

pub(super) fn parse_ip(s: &str, object: &str, field: &str) -> Result<IpAddr, ConvertError> {
    s.parse()
        .map_err(|_| err(object, field, format!("{s:?} is not an IP address")))
}

pub(super) fn port(n: i32, object: &str, field: &str) -> Result<u16, ConvertError> {
    u16::try_from(n)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| err(object, field, format!("{n} is not a port number (1-65535)")))
}
