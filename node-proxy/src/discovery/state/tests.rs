use super::*;

fn wl(ns: &str, name: &str, node: &str, ip: &str, meshed: bool) -> pb::Workload {
    pb::Workload {
        namespace: ns.into(),
        name: name.into(),
        node: node.into(),
        ips: vec![ip.into()],
        identity: format!("spiffe://cluster.local/ns/{ns}/sa/{name}"),
        meshed,
        opaque_ports: vec![pb::PortRange {
            first: 3306,
            last: 3306,
        }],
        ..Default::default()
    }
}

fn svc() -> pb::Service {
    pb::Service {
        namespace: "shop".into(),
        name: "web".into(),
        cluster_ips: vec!["10.96.0.10".into()],
        ports: vec![pb::ServicePort {
            name: "http".into(),
            port: 80,
            protocol: "TCP".into(),
        }],
        endpoints: vec![
            pb::Endpoint {
                address: "10.1.0.5".into(),
                ports: [("http".to_string(), 8080)].into(),
                ready: true,
                identity: "spiffe://cluster.local/ns/shop/sa/web".into(),
                node: "node-a".into(),
                meshed: true,
                pod: "shop/web-0".into(),
                opaque_ports: vec![pb::PortRange {
                    first: 5432,
                    last: 5432,
                }],
                workload: "web".into(),
                workload_kind: "Deployment".into(),
            },
            pb::Endpoint {
                address: "10.1.0.6".into(),
                ports: [("http".to_string(), 8080)].into(),
                ready: false,
                ..Default::default()
            },
        ],
    }
}

fn snapshot() -> pb::Update {
    pb::Update {
        snapshot: true,
        workloads: vec![
            wl("shop", "web-0", "node-a", "10.1.0.5", true),
            wl("shop", "db-0", "node-b", "10.2.0.5", true),
            wl("legacy", "app", "node-a", "10.1.0.9", false),
        ],
        services: vec![svc()],
        ..Default::default()
    }
}

#[test]
fn snapshot_then_deltas() {
    let mut s = DiscoveryState::default();
    assert!(!s.synced);
    assert!(s.apply(snapshot()).is_empty());
    assert!(s.synced);
    let local: Vec<_> = s
        .local_workloads("node-a")
        .iter()
        .map(|w| w.key())
        .collect();
    assert_eq!(local, ["shop/web-0"], "only meshed pods of this node");
    assert!(s
        .workload_by_ip("10.1.0.5".parse().unwrap())
        .unwrap()
        .opaque_ports
        .contains(3306));

    s.apply(pb::Update {
        removed_workloads: vec!["shop/web-0".into()],
        ..Default::default()
    });
    assert!(s.local_workloads("node-a").is_empty());
    assert!(
        s.workload_by_ip("10.1.0.5".parse().unwrap()).is_none(),
        "the IP index follows"
    );

    // A new snapshot replaces everything.
    s.apply(pb::Update {
        snapshot: true,
        workloads: vec![wl("shop", "web-1", "node-a", "10.1.0.7", true)],
        ..Default::default()
    });
    assert_eq!(s.workloads().count(), 1);
    assert!(matches!(
        s.resolve("10.96.0.10:80".parse().unwrap()),
        Destination::Unknown(_)
    ));
}

#[test]
fn resolves_services_pods_and_the_unknown() {
    let mut s = DiscoveryState::default();
    s.apply(snapshot());
    match s.resolve("10.96.0.10:80".parse().unwrap()) {
        Destination::Service {
            service,
            port,
            endpoints,
        } => {
            assert_eq!(service.name, "web");
            assert_eq!(port.name, "http");
            assert_eq!(endpoints.len(), 1, "not-ready endpoints are not used");
            assert_eq!(endpoints[0].0, "10.1.0.5:8080".parse().unwrap());
            assert_eq!(
                endpoints[0].1.identity.as_ref().unwrap().to_string(),
                "spiffe://cluster.local/ns/shop/sa/web"
            );
        }
        other => panic!("{other:?}"),
    }
    // A port the Service does not have is not the Service.
    assert!(matches!(
        s.resolve("10.96.0.10:81".parse().unwrap()),
        Destination::Unknown(_)
    ));
    assert!(
        matches!(s.resolve("10.2.0.5:5432".parse().unwrap()), Destination::Pod(w, _) if w.name == "db-0")
    );
    assert!(matches!(
        s.resolve("192.0.2.1:443".parse().unwrap()),
        Destination::Unknown(_)
    ));
}

#[test]
fn an_invalid_resource_is_skipped_and_reported_without_losing_the_rest() {
    let mut s = DiscoveryState::default();
    let mut update = snapshot();
    update.workloads.push(pb::Workload {
        namespace: "x".into(),
        name: "bad".into(),
        ips: vec!["not-an-ip".into()],
        identity: "spiffe://cluster.local/ns/x/sa/y".into(),
        ..Default::default()
    });
    let invalid = s.apply(update);
    assert_eq!(invalid.len(), 1);
    assert!(
        invalid[0].to_string().contains("workload x/bad"),
        "{}",
        invalid[0]
    );
    assert_eq!(s.workloads().count(), 3);
}

#[test]
fn an_endpoint_of_a_meshed_pod_is_meshed_even_when_its_slice_says_nothing() {
    let mut s = DiscoveryState::default();
    let mut svc = svc();
    // The slice lost the identity (and says not meshed); the pod behind it is meshed.
    svc.endpoints[0].identity = String::new();
    svc.endpoints[0].meshed = false;
    // A second ready endpoint that is no pod discovery knows stays plaintext.
    svc.endpoints[1].ready = true;
    s.apply(pb::Update {
        snapshot: true,
        workloads: vec![wl("shop", "web-0", "node-a", "10.1.0.5", true)],
        services: vec![svc],
        ..Default::default()
    });
    let Destination::Service { endpoints, .. } = s.resolve("10.96.0.10:80".parse().unwrap()) else {
        panic!("not a Service")
    };
    let ids: Vec<_> = endpoints
        .iter()
        .map(|(a, e)| (a.to_string(), e.identity.as_ref().map(|i| i.to_string())))
        .collect();
    assert_eq!(
        ids,
        [
            (
                "10.1.0.5:8080".to_string(),
                Some("spiffe://cluster.local/ns/shop/sa/web-0".to_string())
            ),
            ("10.1.0.6:8080".to_string(), None),
        ]
    );
}

#[test]
fn a_state_written_back_as_a_snapshot_gives_the_same_state() {
    let mut s = DiscoveryState::default();
    let mut with_all = snapshot();
    with_all.workloads[0].netns = "/run/netns/web-0".into();
    with_all.workloads[0].skip_inbound_ports = vec![pb::PortRange {
        first: 9000,
        last: 9010,
    }];
    with_all.workloads[0].workload = "web".into();
    with_all.workloads[0].ready = true;
    with_all.resolutions = vec![
        resolution("10.96.0.10", "shop/web", ""),
        resolution("10.2.0.5", "", "shop/db-0"),
        resolution("192.0.2.1", "", ""),
    ];
    with_all.resolutions.push(pb::Resolution {
        target: "198.51.100.1".into(),
        refused: "too many".into(),
        ..Default::default()
    });
    s.apply(with_all);
    let written = s.to_snapshot();
    assert!(written.snapshot && !written.more);

    let mut back = DiscoveryState::default();
    assert!(back.apply(written.clone()).is_empty());
    assert!(back.synced);
    assert_eq!(
        back.to_snapshot(),
        written,
        "a second round trip changes nothing"
    );
    let keys = |s: &DiscoveryState| s.workloads().map(|w| (**w).clone()).collect::<Vec<_>>();
    assert_eq!(keys(&back), keys(&s));
    let web = back.workload("shop/web-0").unwrap();
    assert!(web.skip_inbound_ports.contains(9005) && web.opaque_ports.contains(3306));
    assert_eq!(
        back.resolve("10.96.0.10:80".parse().unwrap()),
        s.resolve("10.96.0.10:80".parse().unwrap()),
        "Services and endpoints (identity, readiness, opaque ports) too"
    );
    assert_eq!(
        back.resolutions(),
        s.resolutions(),
        "and what each target is"
    );
    assert_eq!(back.resolutions().len(), 4);
}

fn resolution(target: &str, service: &str, workload: &str) -> pb::Resolution {
    pb::Resolution {
        target: target.into(),
        service: service.into(),
        workload: workload.into(),
        refused: String::new(),
    }
}

#[test]
fn a_destination_is_pending_until_discovery_says_what_it_is() {
    let mut s = DiscoveryState::default();
    // The node's own pods only, as a node's stream starts.
    s.apply(pb::Update {
        snapshot: true,
        workloads: vec![wl("shop", "web-0", "node-a", "10.1.0.5", true)],
        ..Default::default()
    });
    let local: std::net::SocketAddr = "10.1.0.5:8080".parse().unwrap();
    assert!(matches!(
        s.lookup(local),
        Lookup::Known(Destination::Pod(..))
    ));
    for a in ["10.96.0.10:80", "10.2.0.5:5432", "192.0.2.1:443"] {
        assert_eq!(s.lookup(a.parse().unwrap()), Lookup::Pending, "{a}");
    }
    assert_eq!(s.service("shop", "web", 80), Lookup::Pending);
    // A resolution that names a Service not yet received is still pending.
    s.apply(pb::Update {
        resolutions: vec![resolution("10.96.0.10", "shop/web", "")],
        ..Default::default()
    });
    assert_eq!(s.lookup("10.96.0.10:80".parse().unwrap()), Lookup::Pending);
    // The answers: a Service, a pod of another node, an address outside the cluster, a
    // Service that does not exist, and one the control plane refused.
    s.apply(pb::Update {
        workloads: vec![wl("shop", "db-0", "node-b", "10.2.0.5", true)],
        services: vec![svc()],
        resolutions: vec![
            resolution("10.2.0.5", "", "shop/db-0"),
            resolution("192.0.2.1", "", ""),
            resolution("shop/nope", "", ""),
            pb::Resolution {
                target: "198.51.100.1".into(),
                refused: "no more".into(),
                ..Default::default()
            },
        ],
        ..Default::default()
    });
    match s.lookup("10.96.0.10:80".parse().unwrap()) {
        Lookup::Known(Destination::Service { endpoints, .. }) => {
            assert_eq!(endpoints.len(), 1);
            assert!(
                endpoints[0].1.opaque_ports.contains(5432),
                "the endpoint's opaque ports"
            );
        }
        other => panic!("{other:?}"),
    }
    // The Service's ClusterIP on a port it does not have is not pending forever.
    assert_eq!(
        s.lookup("10.96.0.10:81".parse().unwrap()),
        Lookup::Known(Destination::Unknown("10.96.0.10:81".parse().unwrap()))
    );
    assert!(
        matches!(s.lookup("10.2.0.5:5432".parse().unwrap()), Lookup::Known(Destination::Pod(w, _)) if w.name == "db-0")
    );
    assert_eq!(
        s.lookup("192.0.2.1:443".parse().unwrap()),
        Lookup::Known(Destination::Unknown("192.0.2.1:443".parse().unwrap()))
    );
    assert_eq!(
        s.lookup("198.51.100.1:1".parse().unwrap()),
        Lookup::Known(Destination::Refused("no more".into()))
    );
    assert!(matches!(
        s.service("shop", "web", 80),
        Lookup::Known(Some(_))
    ));
    assert_eq!(s.service("shop", "web", 81), Lookup::Known(None));
    assert_eq!(s.service("shop", "nope", 80), Lookup::Known(None));
    // Unsubscribed: the control plane removes what it sent.
    s.apply(pb::Update {
        removed_workloads: vec!["shop/db-0".into()],
        removed_resolutions: vec!["10.2.0.5".into()],
        ..Default::default()
    });
    assert_eq!(s.lookup("10.2.0.5:5432".parse().unwrap()), Lookup::Pending);
}

#[test]
fn endpoint_deltas_change_one_endpoint_and_keep_the_rest() {
    let mut s = DiscoveryState::default();
    s.apply(pb::Update {
        snapshot: true,
        services: vec![svc()],
        ..Default::default()
    });
    let mut ready = svc().endpoints[1].clone();
    ready.ready = true;
    let added = pb::Endpoint {
        address: "10.1.0.7".into(),
        ports: [("http".to_string(), 8080)].into(),
        ready: true,
        ..Default::default()
    };
    let invalid = s.apply(pb::Update {
        endpoint_deltas: vec![pb::EndpointDelta {
            service: "shop/web".into(),
            upserted: vec![ready, added],
            removed: vec!["10.1.0.5".into()],
        }],
        ..Default::default()
    });
    assert!(invalid.is_empty(), "{invalid:?}");
    let Lookup::Known(Destination::Service { endpoints, .. }) =
        s.lookup("10.96.0.10:80".parse().unwrap())
    else {
        panic!("not a Service")
    };
    let addrs: Vec<String> = endpoints.iter().map(|(a, _)| a.to_string()).collect();
    assert_eq!(addrs, ["10.1.0.6:8080", "10.1.0.7:8080"]);
    // A delta for a Service this proxy was not sent is reported, and changes nothing.
    let invalid = s.apply(pb::Update {
        endpoint_deltas: vec![pb::EndpointDelta {
            service: "shop/other".into(),
            ..Default::default()
        }],
        ..Default::default()
    });
    assert_eq!(invalid.len(), 1);
}
