//! Matching: identities, networks with `except`, every default policy, probes, audit.

use super::model::InboundRoutes;
use super::routes::RequestParts;
use super::*;
use ambit_api::proto::policy as pb;

const TD: &str = "spiffe://cluster.local";

fn client<'a>(id: Option<&'a str>, addr: &str) -> Client<'a> {
    Client {
        identity: id,
        addr: addr.parse().unwrap(),
    }
}

#[test]
fn cidrs_contain_what_they_should() {
    let c = Cidr::parse("10.1.0.0/16").unwrap();
    assert!(c.contains("10.1.255.3".parse().unwrap()));
    assert!(!c.contains("10.2.0.1".parse().unwrap()));
    assert!(!c.contains("fd00::1".parse().unwrap()));
    // An IPv4-mapped IPv6 client is its IPv4 address.
    assert!(c.contains("::ffff:10.1.0.1".parse().unwrap()));
    let odd = Cidr::parse("192.168.0.0/23").unwrap();
    assert!(odd.contains("192.168.1.9".parse().unwrap()));
    assert!(!odd.contains("192.168.2.0".parse().unwrap()));
    assert!(Cidr::parse("0.0.0.0/0")
        .unwrap()
        .contains("8.8.8.8".parse().unwrap()));
    let v6 = Cidr::parse("fd00::/8").unwrap();
    assert!(v6.contains("fd80::6".parse().unwrap()));
    assert_eq!(Cidr::parse("10.0.0.7").unwrap().to_string(), "10.0.0.7/32");
    for bad in [
        "10.0.0.0/33",
        "fd00::/129",
        "10.0.0/8",
        "x/1",
        "10.0.0.0/-1",
    ] {
        assert!(Cidr::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn networks_with_except() {
    let n = Network {
        cidr: Cidr::parse("10.0.0.0/8").unwrap(),
        except: vec![Cidr::parse("10.9.0.0/16").unwrap()],
    };
    assert!(n.contains("10.1.2.3".parse().unwrap()));
    assert!(!n.contains("10.9.2.3".parse().unwrap()));
    assert!(!n.contains("11.0.0.1".parse().unwrap()));
}

#[test]
fn identities_exact_prefix_and_any() {
    let web = format!("{TD}/ns/shop/sa/web");
    let api = format!("{TD}/ns/shop/sa/api");
    let other = format!("{TD}/ns/other/sa/web");
    let a = Authorization {
        kind: "authorizationpolicy".into(),
        name: "a".into(),
        mesh_tls: Some(MeshTls::Identities(vec![
            IdentityPattern::Exact(web.clone()),
            IdentityPattern::Prefix(format!("{TD}/ns/billing/sa/")),
        ])),
        networks: vec![],
    };
    assert!(a.matches(&client(Some(&web), "10.0.0.1")));
    assert!(!a.matches(&client(Some(&api), "10.0.0.1")));
    assert!(!a.matches(&client(Some(&other), "10.0.0.1")));
    assert!(a.matches(&client(Some(&format!("{TD}/ns/billing/sa/x")), "10.0.0.1")));
    assert!(
        !a.matches(&client(None, "10.0.0.1")),
        "plaintext has no identity"
    );
    let any = Authorization {
        mesh_tls: Some(MeshTls::Any),
        ..a.clone()
    };
    assert!(any.matches(&client(Some(&other), "10.0.0.1")));
    assert!(!any.matches(&client(None, "10.0.0.1")));
    // Every condition must hold: identity and network.
    let both = Authorization {
        networks: vec![Network {
            cidr: Cidr::parse("10.0.0.0/24").unwrap(),
            except: vec![],
        }],
        ..a
    };
    assert!(both.matches(&client(Some(&web), "10.0.0.1")));
    assert!(!both.matches(&client(Some(&web), "10.0.1.1")));
}

#[test]
fn every_default_policy() {
    let cluster = parse_networks("10.0.0.0/8, fd00::/8").unwrap();
    let meshed = format!("{TD}/ns/shop/sa/web");
    let cases = [
        // (policy, meshed in cluster, plaintext in cluster, plaintext outside)
        ("all-unauthenticated", true, true, true),
        ("all-authenticated", true, false, false),
        ("cluster-unauthenticated", true, true, false),
        ("cluster-authenticated", true, false, false),
        ("deny", false, false, false),
    ];
    for (name, m, p_in, p_out) in cases {
        let p = PortPolicy::default_policy(name, &cluster).unwrap();
        assert_eq!(
            p.check(&client(Some(&meshed), "10.1.0.1"), None).allowed(),
            m,
            "{name}"
        );
        assert_eq!(
            p.check(&client(None, "10.1.0.1"), None).allowed(),
            p_in,
            "{name}"
        );
        assert_eq!(
            p.check(&client(None, "192.0.2.1"), None).allowed(),
            p_out,
            "{name}"
        );
        if m {
            assert_eq!(
                p.check(&client(Some(&meshed), "10.1.0.1"), None),
                Verdict::Allow {
                    kind: "default".into(),
                    name: name.into()
                }
            );
        }
    }
    // cluster-authenticated: a meshed client from outside the cluster networks is denied.
    let p = PortPolicy::default_policy("cluster-authenticated", &cluster).unwrap();
    assert!(!p.check(&client(Some(&meshed), "192.0.2.1"), None).allowed());
    // audit: nothing matches, everything goes on, as an audit.
    let p = PortPolicy::default_policy("audit", &cluster).unwrap();
    assert_eq!(p.check(&client(None, "192.0.2.1"), None), Verdict::Audit);
    assert!(Verdict::Audit.allowed());
    let e = PortPolicy::default_policy("allow-all", &cluster).unwrap_err();
    assert!(e.contains("all-unauthenticated"), "{e}");
}

#[test]
fn probes_pass_a_deny_policy_only_as_plaintext_gets_of_their_paths() {
    let mut p = PortPolicy::default_policy("deny", &[]).unwrap();
    p.probe_paths = vec!["/ready".into()];
    assert_eq!(
        p.check(&client(None, "10.0.0.1"), Some("/ready")),
        Verdict::Allow {
            kind: "probe".into(),
            name: "probe".into()
        }
    );
    assert!(p
        .check(&client(None, "10.0.0.1"), Some("/ready?full=1"))
        .allowed());
    assert_eq!(
        p.check(&client(None, "10.0.0.1"), Some("/admin")),
        Verdict::Deny
    );
    assert_eq!(p.check(&client(None, "10.0.0.1"), None), Verdict::Deny);
}

/// A Server port's policy allowing `web` everywhere, with two routes: `/admin` (allowed to
/// `ops` as well) and `/` (nothing more); `/healthz` probed.
fn routed_port() -> PortPolicy {
    let exact = |id: &str| pb::Authorization {
        kind: "authorizationpolicy".into(),
        name: id.into(),
        mesh_tls: Some(pb::MeshTls {
            any: false,
            identities: vec![pb::IdentityPattern {
                pattern: Some(pb::identity_pattern::Pattern::Exact(format!(
                    "{TD}/ns/shop/sa/{id}"
                ))),
            }],
        }),
        networks: vec![],
    };
    let route = |name: &str, prefix: &str, authz: Vec<pb::Authorization>| pb::InboundRoute {
        kind: "HTTPRoute".into(),
        name: name.into(),
        r#match: Some(pb::RequestMatch {
            path: Some(pb::PathMatch {
                kind: Some(pb::path_match::Kind::Prefix(prefix.into())),
            }),
            method: if prefix == "/" {
                String::new()
            } else {
                "GET".into()
            },
            ..Default::default()
        }),
        authorizations: authz,
    };
    let pod = pb::PodPolicy {
        pod: "shop/api".into(),
        ports: vec![pb::PortPolicy {
            port: 8080,
            kind: "server".into(),
            name: "api".into(),
            authorizations: vec![exact("web")],
            probe_paths: vec!["/healthz".into()],
            routes: vec![
                route("admin", "/admin", vec![exact("ops")]),
                route("rest", "/", vec![]),
            ],
            ..Default::default()
        }],
        default: Some(pb::PortPolicy {
            kind: "default".into(),
            name: "deny".into(),
            ..Default::default()
        }),
    };
    let p = PodPolicy::from_pb(&pod).unwrap();
    (**p.port(8080)).clone()
}

fn req(method: &str, path: &str) -> http::Request<()> {
    http::Request::builder()
        .method(method)
        .uri(path)
        .body(())
        .unwrap()
}

#[test]
fn a_route_allows_its_own_clients_beside_the_servers_and_no_route_is_404() {
    let p = routed_port();
    let web = format!("{TD}/ns/shop/sa/web");
    let ops = format!("{TD}/ns/shop/sa/ops");
    let check = |id: &str, method: &str, path: &str| {
        let (v, route) = p.check_request(
            &client(Some(id), "10.0.0.1"),
            &RequestParts::of(&req(method, path)),
            None,
        );
        (v, route.map(|(_, n)| n.to_string()))
    };
    // ops: only on the admin route.
    let (v, route) = check(&ops, "GET", "/admin/users");
    assert_eq!(
        v,
        Verdict::Allow {
            kind: "authorizationpolicy".into(),
            name: "ops".into()
        }
    );
    assert_eq!(route.as_deref(), Some("admin"));
    assert_eq!(check(&ops, "GET", "/orders").0, Verdict::Deny);
    // POST /admin is not the admin route (GET only): the catch-all, where ops is not let in.
    let (v, route) = check(&ops, "POST", "/admin");
    assert_eq!((v, route.as_deref()), (Verdict::Deny, Some("rest")));
    // web: the Server's authorization, on every route.
    assert!(check(&web, "GET", "/admin").0.allowed());
    assert!(check(&web, "POST", "/orders").0.allowed());
    // A connection (not a request) is judged by the Server's authorizations alone.
    assert_eq!(
        p.check(&client(Some(&ops), "10.0.0.1"), None),
        Verdict::Deny
    );
}

#[test]
fn without_a_matching_route_a_request_is_no_route_but_probes_pass() {
    let mut p = routed_port();
    // Only the admin route left.
    let pod = |routes: Vec<pb::InboundRoute>| pb::PortPolicy {
        port: 8080,
        kind: "server".into(),
        name: "api".into(),
        probe_paths: vec!["/healthz".into()],
        routes,
        ..Default::default()
    };
    let admin = p.routes.source[0].clone();
    p.routes = InboundRoutes::from_pb(&pod(vec![admin]).routes).unwrap();
    let web = format!("{TD}/ns/shop/sa/web");
    let (v, route) = p.check_request(
        &client(Some(&web), "10.0.0.1"),
        &RequestParts::of(&req("GET", "/orders")),
        None,
    );
    assert_eq!((v, route), (Verdict::NoRoute, None));
    assert!(!Verdict::NoRoute.allowed());
    // The kubelet's probe passes.
    let (v, _) = p.check_request(
        &client(None, "10.0.0.9"),
        &RequestParts::of(&req("GET", "/healthz")),
        Some("/healthz"),
    );
    assert!(v.allowed(), "{v:?}");
    // A route whose match does not parse refuses the port's policy, by route.
    let mut bad = p.routes.source[0].clone();
    bad.r#match = Some(pb::RequestMatch {
        path: Some(pb::PathMatch {
            kind: Some(pb::path_match::Kind::Regex("(".into())),
        }),
        ..Default::default()
    });
    let e = InboundRoutes::from_pb(&[bad]).unwrap_err();
    assert!(
        e.contains("HTTPRoute admin") && e.contains("regular expression"),
        "{e}"
    );
}
