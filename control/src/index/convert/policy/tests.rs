use crate::index::policy::{AuthenticationRef, IdentityMatch, Operator, PolicyTarget, ServerPort};
use crate::index::{ClusterIndex, ConvertError};
use crate::local::{parse_file, LocalError};

const V: &str = "apiVersion: policy.ambit.dev/v1alpha1";

fn parse(yaml: &str) -> Result<Vec<crate::index::KubeObject>, LocalError> {
    let mut skipped = 0;
    Ok(
        parse_file(std::path::Path::new("policy.yaml"), yaml, &mut skipped)?
            .into_iter()
            .map(|o| o.object)
            .collect(),
    )
}

fn index(yaml: &str) -> Result<ClusterIndex, ConvertError> {
    let objects = parse(yaml).unwrap_or_else(|e| panic!("{e}"));
    ClusterIndex::from_objects("cluster.local", objects).map_err(|(_, e)| e)
}

/// The conversion error of one object: (object, field, message).
fn refused(yaml: &str) -> (String, String, String) {
    let e = index(yaml).expect_err("refused");
    (e.object, e.field, e.message)
}

#[test]
fn a_server_defaults_to_unknown_and_deny_and_may_name_its_port() {
    let idx = index(&format!(
        "{V}\nkind: Server\nmetadata: {{name: web-http, namespace: shop, creationTimestamp: '2026-01-02T03:04:05Z'}}\n\
         spec:\n  podSelector:\n    matchLabels: {{app: web}}\n    matchExpressions: [{{key: tier, operator: NotIn, values: [batch]}}]\n  port: http\n"
    ))
    .unwrap();
    let s = idx.servers_in("shop").next().unwrap();
    assert_eq!(s.port, ServerPort::Name("http".into()));
    assert_eq!(
        (s.protocol.as_str(), s.access_policy.as_str()),
        ("unknown", "deny")
    );
    assert_eq!(s.selector.labels["app"], "web");
    assert_eq!(s.selector.expressions[0].operator, Operator::NotIn);
    assert!(s.created.is_some());
    let idx = index(&format!(
        "{V}\nkind: Server\nmetadata: {{name: db, namespace: shop}}\n\
         spec: {{podSelector: {{}}, port: 5432, proxyProtocol: opaque, accessPolicy: cluster-authenticated}}\n"
    ))
    .unwrap();
    let s = idx.servers_in("shop").next().unwrap();
    assert_eq!(s.port, ServerPort::Number(5432));
    assert_eq!(
        (s.protocol.as_str(), s.access_policy.as_str()),
        ("opaque", "cluster-authenticated")
    );
}

#[test]
fn a_misspelt_field_is_named_by_file_object_and_path() {
    let e = parse(&format!(
        "{V}\nkind: Server\nmetadata: {{name: web, namespace: shop}}\nspec: {{podSelecter: {{}}, port: 80}}\n"
    ))
    .unwrap_err();
    assert_eq!(e.object.as_deref(), Some("Server web"));
    assert_eq!(e.field.as_deref(), Some("spec.podSelecter"));
    let e = parse(&format!(
        "{V}\nkind: AuthorizationPolicy\nmetadata: {{name: a, namespace: shop}}\n\
         spec: {{targetRef: {{kind: Server, name: web}}, requiredAuthenticationRefs: [{{kind: ServiceAccount, nmae: x}}]}}\n"
    ))
    .unwrap_err();
    assert_eq!(
        e.field.as_deref(),
        Some("spec.requiredAuthenticationRefs[0].nmae")
    );
    let e = parse(&format!(
        "{V}\nkind: NetworkAuthentication\nmetadata: {{name: n, namespace: shop}}\nspec: {{networks: [{{cidr: 10.0.0.0/8, expect: []}}]}}\n"
    ))
    .unwrap_err();
    assert_eq!(e.field.as_deref(), Some("spec.networks[0].expect"));
    let e = parse(&format!(
        "{V}\nkind: MeshTLSAuthentication\nmetadata: {{name: m, namespace: shop}}\nspec: {{identites: ['*']}}\n"
    ))
    .unwrap_err();
    assert_eq!(e.field.as_deref(), Some("spec.identites"));
}

#[test]
fn invalid_values_are_refused_by_field() {
    let server = |spec: &str| {
        refused(&format!(
            "{V}\nkind: Server\nmetadata: {{name: web, namespace: shop}}\nspec: {spec}\n"
        ))
    };
    for (spec, field, says) in [
        ("{podSelector: {}, port: 80, proxyProtocol: HTTP/3}", "spec.proxyProtocol", "gRPC"),
        ("{podSelector: {}, port: 80, accessPolicy: allow}", "spec.accessPolicy", "all-unauthenticated"),
        ("{podSelector: {}, port: '8080'}", "spec.port", "without quotes"),
        ("{podSelector: {}, port: Http}", "spec.port", "container port name"),
        ("{podSelector: {}, port: 0}", "spec.port", "1-65535"),
        ("{podSelector: {}}", "spec.port", "required"),
        ("{port: 80}", "spec.podSelector", "required"),
        (
            "{podSelector: {matchExpressions: [{key: app, operator: Inn, values: [a]}]}, port: 80}",
            "spec.podSelector.matchExpressions[0].operator",
            "NotIn",
        ),
        (
            "{podSelector: {matchExpressions: [{key: app, operator: In}]}, port: 80}",
            "spec.podSelector.matchExpressions[0].values",
            "at least one",
        ),
        (
            "{podSelector: {matchExpressions: [{key: app, operator: Exists, values: [a]}]}, port: 80}",
            "spec.podSelector.matchExpressions[0].values",
            "empty",
        ),
    ] {
        let (object, f, message) = server(spec);
        assert_eq!(object, "Server shop/web");
        assert_eq!(f, field, "{spec}: {message}");
        assert!(message.contains(says), "{spec}: {message}");
    }

    let policy = |spec: &str| {
        refused(&format!(
            "{V}\nkind: AuthorizationPolicy\nmetadata: {{name: allow, namespace: shop}}\nspec: {spec}\n"
        ))
    };
    for (spec, field, says) in [
        ("{targetRef: {kind: Server, name: web}}", "spec.requiredAuthenticationRefs", "[]"),
        ("{requiredAuthenticationRefs: []}", "spec.targetRef", "required"),
        ("{targetRef: {kind: Deployment, name: web}, requiredAuthenticationRefs: []}", "spec.targetRef.kind", "Server"),
        ("{targetRef: {kind: Server}, requiredAuthenticationRefs: []}", "spec.targetRef.name", "required"),
        ("{targetRef: {group: policy.linkerd.io, kind: Server, name: web}, requiredAuthenticationRefs: []}", "spec.targetRef.group", "policy.ambit.dev"),
        ("{targetRef: {kind: Namespace, name: other}, requiredAuthenticationRefs: []}", "spec.targetRef.name", "own namespace"),
        ("{targetRef: {kind: Server, name: web, namespace: other}, requiredAuthenticationRefs: []}", "spec.targetRef.namespace", "own namespace"),
        (
            "{targetRef: {kind: Server, name: web}, requiredAuthenticationRefs: [{kind: Secret, name: x}]}",
            "spec.requiredAuthenticationRefs[0].kind",
            "MeshTLSAuthentication",
        ),
        (
            "{targetRef: {kind: Server, name: web}, requiredAuthenticationRefs: [{kind: ServiceAccount, name: Web}]}",
            "spec.requiredAuthenticationRefs[0]",
            "ServiceAccount name",
        ),
    ] {
        let (object, f, message) = policy(spec);
        assert_eq!(object, "AuthorizationPolicy shop/allow");
        assert_eq!(f, field, "{spec}: {message}");
        assert!(message.contains(says), "{spec}: {message}");
    }

    let mtls = |spec: &str| {
        refused(&format!(
            "{V}\nkind: MeshTLSAuthentication\nmetadata: {{name: m, namespace: shop}}\nspec: {spec}\n"
        ))
    };
    for (spec, field, says) in [
        (
            "{identities: ['spiffe://a*b']}",
            "spec.identities[0]",
            "SPIFFE ID",
        ),
        (
            "{identities: ['web']}",
            "spec.identities[0]",
            "serviceaccount.identity.ambit.cluster.local",
        ),
        (
            "{identities: ['*.Shop.serviceaccount.identity.ambit.cluster.local']}",
            "spec.identities[0]",
            "namespace",
        ),
        (
            "{identityRefs: [{kind: Pod, name: web}]}",
            "spec.identityRefs[0].kind",
            "ServiceAccount",
        ),
        (
            "{identityRefs: [{kind: ServiceAccount}]}",
            "spec.identityRefs[0].name",
            "required",
        ),
        ("{}", "spec", "identities"),
    ] {
        let (_, f, message) = mtls(spec);
        assert_eq!(f, field, "{spec}: {message}");
        assert!(message.contains(says), "{spec}: {message}");
    }

    let net = |spec: &str| {
        refused(&format!(
            "{V}\nkind: NetworkAuthentication\nmetadata: {{name: n, namespace: shop}}\nspec: {spec}\n"
        ))
    };
    for (spec, field, says) in [
        ("{networks: []}", "spec.networks", "at least one"),
        (
            "{networks: [{cidr: 10.0.0.0}]}",
            "spec.networks[0].cidr",
            "not a CIDR",
        ),
        (
            "{networks: [{cidr: 10.0.0.0/33}]}",
            "spec.networks[0].cidr",
            "0 to 32",
        ),
        (
            "{networks: [{cidr: 10.0.0.0/8, except: [10.1.0.0/16, bogus]}]}",
            "spec.networks[0].except[1]",
            "not a CIDR",
        ),
    ] {
        let (_, f, message) = net(spec);
        assert_eq!(f, field, "{spec}: {message}");
        assert!(message.contains(says), "{spec}: {message}");
    }
}

#[test]
fn identities_and_identity_refs_become_spiffe_patterns() {
    let idx = index(&format!(
        "{V}\nkind: MeshTLSAuthentication\nmetadata: {{name: m, namespace: shop}}\nspec:\n  identities:\n\
         \x20 - spiffe://cluster.local/ns/shop/sa/web\n\
         \x20 - spiffe://cluster.local/ns/ops/sa/*\n\
         \x20 - api.shop.serviceaccount.identity.ambit.cluster.local\n\
         \x20 - '*.batch.serviceaccount.identity.ambit.cluster.local'\n\
         \x20 - '*'\n\
         \x20 identityRefs:\n\
         \x20 - {{kind: ServiceAccount, name: cli}}\n\
         \x20 - {{kind: ServiceAccount, name: mon, namespace: infra}}\n\
         \x20 - {{kind: Namespace, name: jobs}}\n"
    ))
    .unwrap();
    let m = idx.mesh_tls_authentication("shop", "m").unwrap();
    let exact = |s: &str| IdentityMatch::Exact(format!("spiffe://cluster.local/{s}"));
    let prefix = |s: &str| IdentityMatch::Prefix(format!("spiffe://cluster.local/{s}"));
    let mut want = vec![
        exact("ns/shop/sa/web"),
        prefix("ns/ops/sa/"),
        exact("ns/shop/sa/api"),
        prefix("ns/batch/sa/"),
        IdentityMatch::Any,
        exact("ns/shop/sa/cli"),
        exact("ns/infra/sa/mon"),
        prefix("ns/jobs/sa/"),
    ];
    want.sort();
    assert_eq!(m.identities, want);
}

#[test]
fn policy_targets_and_authentication_refs_default_to_the_policy_namespace() {
    let idx = index(&format!(
        "{V}\nkind: AuthorizationPolicy\nmetadata: {{name: a, namespace: shop}}\n\
         spec:\n  targetRef: {{group: policy.ambit.dev, kind: Server, name: web}}\n  requiredAuthenticationRefs:\n\
         \x20 - {{group: policy.ambit.dev, kind: MeshTLSAuthentication, name: m}}\n\
         \x20 - {{kind: NetworkAuthentication, name: n, namespace: infra}}\n\
         ---\n{V}\nkind: AuthorizationPolicy\nmetadata: {{name: b, namespace: shop}}\n\
         spec: {{targetRef: {{kind: Namespace, name: shop}}, requiredAuthenticationRefs: [{{kind: ServiceAccount, name: cli}}]}}\n\
         ---\n{V}\nkind: AuthorizationPolicy\nmetadata: {{name: c, namespace: shop}}\n\
         spec: {{targetRef: {{group: gateway.networking.k8s.io, kind: HTTPRoute, name: r}}, requiredAuthenticationRefs: []}}\n"
    ))
    .unwrap();
    let p: Vec<_> = idx.authorization_policies_in("shop").collect();
    assert_eq!(p[0].target, PolicyTarget::Server("web".into()));
    assert_eq!(
        p[0].authentications,
        [
            AuthenticationRef::MeshTls("shop".into(), "m".into()),
            AuthenticationRef::Network("infra".into(), "n".into())
        ]
    );
    assert_eq!(p[1].target, PolicyTarget::Namespace);
    assert_eq!(
        p[1].authentications,
        [AuthenticationRef::ServiceAccount(
            "spiffe://cluster.local/ns/shop/sa/cli".into()
        )]
    );
    assert_eq!(
        p[2].target,
        PolicyTarget::Route("HTTPRoute".into(), "r".into())
    );
}

#[test]
fn linkerd_policy_is_refused_with_our_api_version_and_other_groups_are_skipped() {
    let e = parse(
        "apiVersion: policy.linkerd.io/v1beta3\nkind: Server\nmetadata: {name: web, namespace: shop}\nspec: {port: 80}\n",
    )
    .unwrap_err();
    assert_eq!(e.field.as_deref(), Some("apiVersion"));
    assert!(e.message.contains("policy.ambit.dev/v1alpha1"), "{e}");
    let objects = parse(
        "apiVersion: games.example.com/v1\nkind: Server\nmetadata: {name: minecraft}\nspec: {}\n",
    )
    .unwrap();
    assert!(objects.is_empty());
}
