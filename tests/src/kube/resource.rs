//! The kinds a fake serves: group, version, kind, plural, scope, field selectors.

/// A kind of object the fake serves: where its API lives and how it is selected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceType {
    /// API group, `""` for the core group.
    pub group: String,
    /// API version (`v1`, `v1beta1`, ...).
    pub version: String,
    /// The object's `kind`.
    pub kind: String,
    /// The lower-case plural of the URL path (`pods`).
    pub plural: String,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
    /// Field selectors served beyond `metadata.name` and `metadata.namespace`.
    pub fields: Vec<String>,
    /// Built-in kinds are listed without `apiVersion`/`kind` on each item, as the API
    /// server encodes typed lists; custom resources keep them.
    pub builtin: bool,
}

impl ResourceType {
    /// A custom resource (a CRD's kind): `ResourceType::new("policy.ambit.dev", "v1alpha1",
    /// "Server", "servers", true)`.
    pub fn new(group: &str, version: &str, kind: &str, plural: &str, namespaced: bool) -> Self {
        Self {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            namespaced,
            fields: Vec::new(),
            builtin: false,
        }
    }

    /// With field selectors on `fields` (for CRDs, their `selectableFields`).
    pub fn with_fields(mut self, fields: &[&str]) -> Self {
        self.fields = fields.iter().map(|f| f.to_string()).collect();
        self
    }

    fn builtin(group: &str, kind: &str, plural: &str, namespaced: bool, fields: &[&str]) -> Self {
        Self {
            builtin: true,
            ..Self::new(group, "v1", kind, plural, namespaced).with_fields(fields)
        }
    }

    /// The kinds every fake serves: the built-in ones the control plane reads, with the
    /// field selectors the API server has for them, and [`Self::policy`]. Gateway API's
    /// routes ([`Self::gateway`]) are optional: `Settings::gateway_api`.
    pub fn defaults() -> Vec<Self> {
        vec![
            Self::builtin("", "Namespace", "namespaces", false, &["status.phase"]),
            Self::builtin("", "Node", "nodes", false, &["spec.unschedulable"]),
            Self::builtin(
                "",
                "Pod",
                "pods",
                true,
                &[
                    "spec.nodeName",
                    "spec.restartPolicy",
                    "spec.schedulerName",
                    "spec.serviceAccountName",
                    "spec.hostNetwork",
                    "status.phase",
                    "status.podIP",
                    "status.nominatedNodeName",
                ],
            ),
            Self::builtin("", "ServiceAccount", "serviceaccounts", true, &[]),
            Self::builtin(
                "",
                "Service",
                "services",
                true,
                &["spec.clusterIP", "spec.type"],
            ),
            Self::builtin(
                "discovery.k8s.io",
                "EndpointSlice",
                "endpointslices",
                true,
                &["addressType"],
            ),
        ]
        .into_iter()
        .chain(Self::policy())
        .collect()
    }

    /// Ambit's policy kinds (`policy.ambit.dev/v1alpha1`, as the ambit-crds chart installs
    /// them): every fake serves them, as a cluster with the chart installed does.
    pub fn policy() -> Vec<Self> {
        [
            ("Server", "servers"),
            ("AuthorizationPolicy", "authorizationpolicies"),
            ("MeshTLSAuthentication", "meshtlsauthentications"),
            ("NetworkAuthentication", "networkauthentications"),
        ]
        .into_iter()
        .map(|(kind, plural)| Self::new("policy.ambit.dev", "v1alpha1", kind, plural, true))
        .collect()
    }

    /// Gateway API's route kinds (`gateway.networking.k8s.io/v1`, as its standard channel
    /// or the ambit-crds chart's `installGatewayAPI` installs them): the ones the control
    /// plane reads. A cluster may not have them, so a fake may leave them out.
    pub fn gateway() -> Vec<Self> {
        [("HTTPRoute", "httproutes"), ("GRPCRoute", "grpcroutes")]
            .into_iter()
            .map(|(kind, plural)| Self::new("gateway.networking.k8s.io", "v1", kind, plural, true))
            .collect()
    }

    /// `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}
