use super::*;

fn path(kind: pb::path_match::Kind) -> Option<pb::PathMatch> {
    Some(pb::PathMatch { kind: Some(kind) })
}

fn rule(name: &str, m: Option<pb::RequestMatch>, backends: &[(&str, u32)]) -> pb::Rule {
    pb::Rule {
        route_kind: "HTTPRoute".into(),
        route_namespace: "shop".into(),
        route_name: name.into(),
        r#match: m,
        backends: backends
            .iter()
            .map(|(s, w)| pb::Backend {
                service: (*s).into(),
                port: 80,
                weight: *w,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

fn routes(rules: Vec<pb::Rule>) -> Result<ServiceRoutes, String> {
    ServiceRoutes::from_pb(&pb::ServiceRoutes {
        service: "shop/web".into(),
        ports: vec![pb::PortRoutes { port: 80, rules }],
        failure_accrual: None,
        consumers: vec![],
    })
}

fn request(method: &str, uri: &str, headers: &[(&str, &str)]) -> http::Request<()> {
    let mut b = http::Request::builder().method(method).uri(uri);
    for (n, v) in headers {
        b = b.header(*n, *v);
    }
    b.body(()).unwrap()
}

/// The name of the rule `req` selects, or "404".
fn selected(r: &ServiceRoutes, req: &http::Request<()>) -> String {
    select(r.port("shop", 80).unwrap(), &RequestParts::of(req))
        .map_or("404".into(), |r| r.route_name.clone())
}

#[test]
fn the_first_matching_rule_wins_and_none_is_a_404() {
    use pb::path_match::Kind;
    let r = routes(vec![
        rule(
            "exact",
            Some(pb::RequestMatch {
                path: path(Kind::Exact("/api/v1/login".into())),
                ..Default::default()
            }),
            &[],
        ),
        rule(
            "prefix-header",
            Some(pb::RequestMatch {
                path: path(Kind::Prefix("/api/".into())),
                headers: vec![pb::ValueMatch {
                    name: "x-canary".into(),
                    value: Some(pb::value_match::Value::Exact("yes".into())),
                }],
                ..Default::default()
            }),
            &[],
        ),
        rule(
            "prefix-get",
            Some(pb::RequestMatch {
                path: path(Kind::Prefix("/api".into())),
                method: "GET".into(),
                ..Default::default()
            }),
            &[],
        ),
        rule(
            "regex-query",
            Some(pb::RequestMatch {
                path: path(Kind::Regex("/items/[0-9]+".into())),
                query_params: vec![pb::ValueMatch {
                    name: "view".into(),
                    value: Some(pb::value_match::Value::Regex("full|short".into())),
                }],
                ..Default::default()
            }),
            &[],
        ),
    ])
    .unwrap();
    let cases = [
        (request("POST", "/api/v1/login", &[]), "exact"),
        (
            request("POST", "/api/v1/login/x", &[("x-canary", "yes")]),
            "prefix-header",
        ),
        (request("GET", "/api", &[]), "prefix-get"),
        (
            request("GET", "/api/x", &[("x-canary", "no")]),
            "prefix-get",
        ),
        // Element-wise prefixes: /apix is not under /api.
        (request("GET", "/apix", &[]), "404"),
        (request("POST", "/api/x", &[]), "404"),
        (request("GET", "/items/42?view=full", &[]), "regex-query"),
        (
            request("GET", "/items/42?a=b&view=short", &[]),
            "regex-query",
        ),
        // The regexes match whole values.
        (request("GET", "/items/42x?view=full", &[]), "404"),
        (request("GET", "/items/42?view=fuller", &[]), "404"),
        (request("GET", "/items/42", &[]), "404"),
        // Names and values are matched decoded (%XX, + for a space); a bad escape is
        // kept as sent.
        (
            request("GET", "/items/42?v%69ew=f%75ll", &[]),
            "regex-query",
        ),
        (request("GET", "/items/42?view=full%", &[]), "404"),
        (request("GET", "/items/42?view=fu%zzll", &[]), "404"),
    ];
    for (req, want) in cases {
        assert_eq!(selected(&r, &req), want, "{} {}", req.method(), req.uri());
    }
    assert!(r.port("shop", 81).is_none());
}

#[test]
fn a_rule_without_a_match_takes_everything_and_grpc_methods_match_by_part() {
    let r = routes(vec![
        rule(
            "say-hello",
            Some(pb::RequestMatch {
                grpc: Some(pb::GrpcMethod {
                    service: "helloworld.Greeter".into(),
                    method: "SayHello".into(),
                }),
                ..Default::default()
            }),
            &[],
        ),
        rule(
            "greeter",
            Some(pb::RequestMatch {
                grpc: Some(pb::GrpcMethod {
                    service: "helloworld.Greeter".into(),
                    method: String::new(),
                }),
                ..Default::default()
            }),
            &[],
        ),
        rule("rest", None, &[]),
    ])
    .unwrap();
    for (path, want) in [
        ("/helloworld.Greeter/SayHello", "say-hello"),
        ("/helloworld.Greeter/SayGoodbye", "greeter"),
        ("/other.Service/SayHello", "rest"),
        ("/", "rest"),
    ] {
        assert_eq!(selected(&r, &request("POST", path, &[])), want, "{path}");
    }
}

#[test]
fn backends_are_chosen_by_weight_and_weight_zero_never() {
    let r = routes(vec![rule(
        "split",
        None,
        &[("shop/v1", 90), ("shop/v2", 10), ("shop/off", 0)],
    )])
    .unwrap();
    let split = &r.port("shop", 80).unwrap()[0];
    let mut counts: HashMap<String, u32> = HashMap::new();
    // Every roll in 1000 even steps: exactly the weights.
    for i in 0..1000 {
        let b = split.backend(f64::from(i) / 1000.0).unwrap();
        *counts.entry(b.name.clone()).or_default() += 1;
    }
    assert_eq!(counts.get("v1"), Some(&900));
    assert_eq!(counts.get("v2"), Some(&100));
    assert_eq!(counts.get("off"), None);
    // No backends: the parent itself. Only weight 0: none usable (Gateway API: 500).
    let r = routes(vec![rule("parent", None, &[])]).unwrap();
    assert!(r.port("shop", 80).unwrap()[0].backend(0.5).is_none());
    assert!(!r.port("shop", 80).unwrap()[0].has_no_usable_backend());
    let r = routes(vec![rule("zero", None, &[("shop/off", 0)])]).unwrap();
    assert!(r.port("shop", 80).unwrap()[0].has_no_usable_backend());
}

#[test]
fn header_modifiers_set_add_and_remove_in_that_order() {
    let m = HeaderModifier::from_pb(Some(&pb::HeaderModifier {
        set: vec![pb::Header {
            name: "x-env".into(),
            value: "canary".into(),
        }],
        add: vec![pb::Header {
            name: "x-tag".into(),
            value: "b".into(),
        }],
        remove: vec!["x-secret".into()],
    }))
    .unwrap();
    let mut h = HeaderMap::new();
    h.insert("x-env", HeaderValue::from_static("prod"));
    h.insert("x-tag", HeaderValue::from_static("a"));
    h.insert("x-secret", HeaderValue::from_static("s"));
    m.apply(&mut h);
    assert_eq!(h["x-env"], "canary");
    let tags: Vec<_> = h.get_all("x-tag").iter().collect();
    assert_eq!(tags, ["a", "b"]);
    assert!(h.get("x-secret").is_none());
}

#[test]
fn anything_that_does_not_parse_refuses_the_whole_service_with_where() {
    use pb::path_match::Kind;
    let bad = [
        (
            rule(
                "r",
                Some(pb::RequestMatch {
                    path: path(Kind::Regex("(".into())),
                    ..Default::default()
                }),
                &[],
            ),
            "regular expression",
        ),
        (
            // Not a regex on its own: inside `^(?:…)$` it would close the group and match
            // every path (found by the policy_update fuzz target's invariant).
            rule(
                "r",
                Some(pb::RequestMatch {
                    path: path(Kind::Regex("/public)|(.*".into())),
                    ..Default::default()
                }),
                &[],
            ),
            "regular expression",
        ),
        (
            rule(
                "r",
                Some(pb::RequestMatch {
                    path: path(Kind::Prefix("api".into())),
                    ..Default::default()
                }),
                &[],
            ),
            "does not start with /",
        ),
        (
            rule(
                "r",
                Some(pb::RequestMatch {
                    method: "GE T".into(),
                    ..Default::default()
                }),
                &[],
            ),
            "not a method",
        ),
        (
            rule("r", None, &[("no-namespace", 1)]),
            "<namespace>/<name>",
        ),
        (
            pb::Rule {
                request_headers: Some(pb::HeaderModifier {
                    set: vec![pb::Header {
                        name: "bad name".into(),
                        value: "v".into(),
                    }],
                    ..Default::default()
                }),
                ..rule("r", None, &[])
            },
            "request header modifier",
        ),
        (
            pb::Rule {
                retry: Some(pb::Retry {
                    http_statuses: vec![pb::StatusRange { min: 504, max: 500 }],
                    ..Default::default()
                }),
                ..rule("r", None, &[])
            },
            "504-500",
        ),
        (
            pb::Rule {
                retry: Some(pb::Retry {
                    grpc_codes: vec![17],
                    ..Default::default()
                }),
                ..rule("r", None, &[])
            },
            "gRPC code 17",
        ),
    ];
    for (r, want) in bad {
        let e = routes(vec![rule("good", None, &[]), r]).unwrap_err();
        assert!(
            e.contains("Service shop/web port 80 rule 1") && e.contains(want),
            "{e}"
        );
    }
}

#[test]
fn a_try_is_bounded_by_the_tighter_of_its_limits_and_zero_is_none() {
    let t = Timeouts::from_pb(&pb::Timeouts {
        request_ms: 5000,
        backend_request_ms: 1000,
        response_ms: 800,
        idle_ms: 0,
    });
    assert_eq!(t.per_try(), Some(Duration::from_millis(800)));
    assert_eq!(t.request, Some(Duration::from_secs(5)));
    assert_eq!(t.idle, None);
    let t = Timeouts::from_pb(&pb::Timeouts {
        request_ms: 5000,
        ..Default::default()
    });
    assert_eq!(t.per_try(), None);
}

#[test]
fn a_host_match_reads_the_authority_of_an_http2_request() {
    let r = routes(vec![rule(
        "by-host",
        Some(pb::RequestMatch {
            headers: vec![pb::ValueMatch {
                name: "host".into(),
                value: Some(pb::value_match::Value::Exact("web.shop".into())),
            }],
            ..Default::default()
        }),
        &[],
    )])
    .unwrap();
    // HTTP/1: the Host header.
    assert_eq!(
        selected(&r, &request("GET", "/", &[("host", "web.shop")])),
        "by-host"
    );
    // HTTP/2: the :authority, in the URI.
    let h2 = http::Request::builder()
        .version(http::Version::HTTP_2)
        .uri("http://web.shop/x")
        .body(())
        .unwrap();
    assert_eq!(selected(&r, &h2), "by-host");
    assert_eq!(
        selected(&r, &request("GET", "/", &[("host", "api.shop")])),
        "404"
    );
}

#[test]
fn a_clients_namespace_takes_its_consumer_routes_on_their_ports_only() {
    let named = |name: &str| pb::Rule {
        route_kind: "HTTPRoute".into(),
        route_name: name.into(),
        ..Default::default()
    };
    let r = ServiceRoutes::from_pb(&pb::ServiceRoutes {
        service: "shop/web".into(),
        ports: vec![
            pb::PortRoutes {
                port: 80,
                rules: vec![named("producer")],
            },
            pb::PortRoutes {
                port: 81,
                rules: vec![named("producer-81")],
            },
        ],
        failure_accrual: None,
        consumers: vec![pb::ConsumerRoutes {
            namespace: "client".into(),
            ports: vec![pb::PortRoutes {
                port: 80,
                rules: vec![named("consumer")],
            }],
        }],
    })
    .unwrap();
    let get = request("GET", "/", &[]);
    let name = |ns: &str, port: u16| {
        select(r.port(ns, port).unwrap(), &RequestParts::of(&get))
            .unwrap()
            .route_name
            .clone()
    };
    assert_eq!(name("client", 80), "consumer");
    assert_eq!(
        name("client", 81),
        "producer-81",
        "a port its routes do not name"
    );
    assert_eq!(name("shop", 80), "producer", "the Service's own namespace");
    assert_eq!(name("other", 80), "producer");
    let twice = ServiceRoutes::from_pb(&pb::ServiceRoutes {
        service: "shop/web".into(),
        consumers: vec![
            pb::ConsumerRoutes {
                namespace: "c".into(),
                ports: vec![],
            },
            pb::ConsumerRoutes {
                namespace: "c".into(),
                ports: vec![],
            },
        ],
        ..Default::default()
    });
    assert!(twice.unwrap_err().contains("twice"));
}

#[test]
fn query_parameters_are_decoded_as_a_form_encodes_them() {
    use super::decode_query;
    assert_eq!(decode_query("a%20b"), "a b");
    assert_eq!(decode_query("a+b"), "a b");
    assert_eq!(decode_query("%e2%9c%93"), "✓");
    assert_eq!(decode_query("100%"), "100%");
    assert_eq!(decode_query("%4"), "%4");
    assert_eq!(decode_query("%zz%41"), "%zzA");
    assert_eq!(decode_query("plain"), "plain");
    // Not UTF-8: replaced, so that it matches no value a route can write.
    assert_eq!(decode_query("%ff"), "\u{fffd}");
}
