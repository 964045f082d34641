//! Matching: identities, networks with `except`, every default policy, probes, audit.

use super::*;

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
