//! Workload identity: `spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>`.

use std::fmt;
use std::str::FromStr;

/// The trust domain used when none is configured, as in Kubernetes' cluster domain.
pub const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";
/// Namespace of the control plane; with [`CONTROL_PLANE_SERVICE_ACCOUNT`], the identity its
/// gRPC servers prove to node proxies.
pub const CONTROL_PLANE_NAMESPACE: &str = "ambit";
/// ServiceAccount of the control plane.
pub const CONTROL_PLANE_SERVICE_ACCOUNT: &str = "ambit-control";

/// A workload's identity: a ServiceAccount in a namespace, within a trust domain.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkloadIdentity {
    trust_domain: String,
    namespace: String,
    service_account: String,
}

/// Why a string is not a valid workload identity.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdentityError {
    /// The trust domain has characters SPIFFE does not allow.
    #[error("invalid trust domain {0:?}: use lowercase letters, digits, '.', '-' and '_'")]
    TrustDomain(String),
    /// The namespace is not a DNS-1123 label.
    #[error("invalid namespace {0:?}: must be a DNS-1123 label (lowercase letters, digits, '-', at most 63)")]
    Namespace(String),
    /// The ServiceAccount name is not a DNS-1123 subdomain.
    #[error("invalid ServiceAccount name {0:?}: must be a DNS-1123 subdomain (lowercase letters, digits, '-', '.', at most 253)")]
    ServiceAccount(String),
    /// The URI is not of the form `spiffe://TD/ns/NS/sa/SA`.
    #[error("{0:?} is not a workload SPIFFE ID of the form spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>")]
    SpiffeId(String),
}

impl WorkloadIdentity {
    /// Builds an identity, validating each part.
    pub fn new(
        trust_domain: impl Into<String>,
        namespace: impl Into<String>,
        service_account: impl Into<String>,
    ) -> Result<Self, IdentityError> {
        let (trust_domain, namespace, service_account) = (
            trust_domain.into(),
            namespace.into(),
            service_account.into(),
        );
        if !is_trust_domain(&trust_domain) {
            return Err(IdentityError::TrustDomain(trust_domain));
        }
        if !is_dns_label(&namespace) {
            return Err(IdentityError::Namespace(namespace));
        }
        if !is_dns_subdomain(&service_account) {
            return Err(IdentityError::ServiceAccount(service_account));
        }
        Ok(Self {
            trust_domain,
            namespace,
            service_account,
        })
    }

    /// The trust domain.
    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    /// The Kubernetes namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The ServiceAccount name.
    pub fn service_account(&self) -> &str {
        &self.service_account
    }

    /// The SPIFFE ID, `spiffe://TD/ns/NS/sa/SA`: the single URI SAN of the workload's SVID.
    pub fn spiffe_id(&self) -> String {
        self.to_string()
    }

    /// The DNS SAN, `SA.NS.serviceaccount.identity.ambit.TD`.
    pub fn dns_name(&self) -> String {
        format!(
            "{}.{}.serviceaccount.identity.ambit.{}",
            self.service_account, self.namespace, self.trust_domain
        )
    }
}

impl fmt::Display for WorkloadIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "spiffe://{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

impl FromStr for WorkloadIdentity {
    type Err = IdentityError;

    /// Parses `spiffe://TD/ns/NS/sa/SA`, and nothing looser.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || IdentityError::SpiffeId(s.to_string());
        let rest = s.strip_prefix("spiffe://").ok_or_else(bad)?;
        let mut parts = rest.split('/');
        let (Some(td), Some("ns"), Some(ns), Some("sa"), Some(sa), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(bad());
        };
        Self::new(td, ns, sa)
    }
}

fn is_trust_domain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && s.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'_')
        })
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spiffe_id_round_trips() {
        let id = WorkloadIdentity::new("cluster.local", "emojivoto", "web").unwrap();
        assert_eq!(id.spiffe_id(), "spiffe://cluster.local/ns/emojivoto/sa/web");
        assert_eq!(
            id.dns_name(),
            "web.emojivoto.serviceaccount.identity.ambit.cluster.local"
        );
        assert_eq!(id.spiffe_id().parse::<WorkloadIdentity>().unwrap(), id);
    }

    #[test]
    fn malformed_spiffe_ids_are_rejected() {
        for bad in [
            "spiffe://cluster.local/ns/a/sa/b/extra",
            "spiffe://cluster.local/ns/a",
            "https://cluster.local/ns/a/sa/b",
            "spiffe://Cluster/ns/a/sa/b",
            "spiffe://cluster.local/ns/A/sa/b",
            "spiffe://cluster.local/sa/a/ns/b",
            "spiffe://cluster.local/ns//sa/b",
        ] {
            assert!(bad.parse::<WorkloadIdentity>().is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn names_are_validated() {
        assert!(matches!(
            WorkloadIdentity::new("td", "-ns", "sa"),
            Err(IdentityError::Namespace(_))
        ));
        assert!(matches!(
            WorkloadIdentity::new("td", "ns", "a..b"),
            Err(IdentityError::ServiceAccount(_))
        ));
        assert!(WorkloadIdentity::new("td", "ns", "build.robot").is_ok());
    }
}
