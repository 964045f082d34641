//! Server: a port (number or container port name) of the pods its selector picks.

use super::spec;
use crate::index::convert::{err, namespaced_name, port, ConvertError};
use crate::index::crd::Server;
use crate::index::policy::{Operator, Requirement, Selector, ServerInfo, ServerPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// `spec.proxyProtocol` values, as Linkerd's.
pub const PROTOCOLS: [&str; 6] = ["unknown", "HTTP/1", "HTTP/2", "gRPC", "opaque", "TLS"];

/// The Server as policy sees it.
pub(crate) fn server(s: &Server) -> Result<ServerInfo, ConvertError> {
    let (namespace, name) = namespaced_name(&s.metadata, "Server")?;
    let object = format!("Server {namespace}/{name}");
    let spec = spec(&s.spec, &object)?;
    let selector = spec
        .pod_selector
        .as_ref()
        .ok_or_else(|| {
            err(
                &object,
                "spec.podSelector",
                "required ({} selects every pod of the namespace)",
            )
        })
        .and_then(|s| selector(s, &object, "spec.podSelector"))?;
    let port = match &spec.port {
        None => {
            return Err(err(
                &object,
                "spec.port",
                "required: a port number or a container port's name",
            ))
        }
        Some(IntOrString::Int(n)) => ServerPort::Number(port(*n, &object, "spec.port")?),
        Some(IntOrString::String(s)) => ServerPort::Name(port_name(s, &object)?),
    };
    let protocol = match spec.proxy_protocol.as_deref() {
        None => "unknown".to_string(),
        Some(p) if PROTOCOLS.contains(&p) => p.to_string(),
        Some(p) => {
            return Err(err(
                &object,
                "spec.proxyProtocol",
                format!(
                    "{p:?} is not a protocol; use one of {}",
                    PROTOCOLS.join(", ")
                ),
            ))
        }
    };
    let access_policy = match spec.access_policy.as_deref() {
        None => "deny".to_string(),
        Some(p) if ambit_api::policy::DEFAULT_POLICIES.contains(&p) => p.to_string(),
        Some(p) => {
            return Err(err(
                &object,
                "spec.accessPolicy",
                ambit_api::policy::unknown_policy(p),
            ))
        }
    };
    Ok(ServerInfo {
        created: s.metadata.creation_timestamp.clone(),
        namespace,
        name,
        selector,
        port,
        protocol,
        access_policy,
    })
}

/// A container port's name: an IANA service name, as Kubernetes requires of it (at most
/// 15 lowercase letters, digits and inner `-`, at least one letter).
fn port_name(s: &str, object: &str) -> Result<String, ConvertError> {
    let ok = !s.is_empty()
        && s.len() <= 15
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
        && !s.contains("--")
        && s.bytes().any(|b| b.is_ascii_lowercase());
    if ok {
        Ok(s.to_string())
    } else if s.parse::<u16>().is_ok() {
        Err(err(
            object,
            "spec.port",
            format!("{s:?} is a string; write the port number without quotes"),
        ))
    } else {
        Err(err(
            object,
            "spec.port",
            format!(
                "{s:?} is not a container port name (at most 15 lowercase letters, digits and '-')"
            ),
        ))
    }
}

/// A label selector, its operators and values checked as the API server checks them.
pub(crate) fn selector(
    s: &LabelSelector,
    object: &str,
    field: &str,
) -> Result<Selector, ConvertError> {
    let mut expressions = Vec::new();
    for (i, e) in s.match_expressions.iter().flatten().enumerate() {
        let at = format!("{field}.matchExpressions[{i}]");
        let operator = match e.operator.as_str() {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            other => {
                return Err(err(
                    object,
                    &format!("{at}.operator"),
                    format!("{other:?} is not an operator; use In, NotIn, Exists or DoesNotExist"),
                ))
            }
        };
        let values = e.values.clone().unwrap_or_default();
        let wants_values = matches!(operator, Operator::In | Operator::NotIn);
        if wants_values == values.is_empty() {
            let message = if wants_values {
                "required (at least one) with In and NotIn"
            } else {
                "must be empty with Exists and DoesNotExist"
            };
            return Err(err(object, &format!("{at}.values"), message));
        }
        if e.key.is_empty() {
            return Err(err(object, &format!("{at}.key"), "required"));
        }
        expressions.push(Requirement {
            key: e.key.clone(),
            operator,
            values,
        });
    }
    Ok(Selector {
        labels: s.match_labels.clone().unwrap_or_default(),
        expressions,
    })
}
