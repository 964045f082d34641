//! Writes the seed inputs of every fuzz target into `<dir>/<target>/seed-<n>`: real
//! messages and files, several rendered by the control plane itself, from which the
//! fuzzer mutates. docs/FUZZING.md says how the committed corpus is made from them
//! (a run, then `cargo fuzz cmin`).
//!
//!     cargo +nightly run --manifest-path fuzz/Cargo.toml --example seeds -- /tmp/seeds
#![allow(clippy::unwrap_used, clippy::expect_used)]

use ambit_api::cni::{encode, PodAdd, PodRef, Request, Response};
use ambit_control::discovery as cdisc;
use ambit_control::index::ClusterIndex;
use ambit_control::local::parse_file;
use ambit_control::policy::{
    render_nodes, render_routes, snapshot_chunks, Defaults, ServiceRoutesMap,
};
use ambit_fuzz::cluster::{base_objects, BASE, NODE, TRUST_DOMAIN};
use prost::Message;
use std::path::{Path, PathBuf};

/// Policy objects for the base cluster: a Server with routes and policies, a Service's
/// HTTPRoute with weights, filters, timeouts and a retry, a GRPCRoute.
const POLICY: &str = r#"apiVersion: policy.ambit.dev/v1alpha1
kind: Server
metadata: {name: web-http, namespace: shop}
spec: {podSelector: {matchLabels: {app: web}}, port: http, proxyProtocol: HTTP/1, accessPolicy: deny}
---
apiVersion: policy.ambit.dev/v1alpha1
kind: Server
metadata: {name: grpc, namespace: shop}
spec:
  podSelector:
    matchExpressions: [{key: app, operator: In, values: [grpc]}]
  port: 9090
  proxyProtocol: gRPC
  accessPolicy: audit
---
apiVersion: policy.ambit.dev/v1alpha1
kind: MeshTLSAuthentication
metadata: {name: clients, namespace: shop}
spec: {identities: ["spiffe://cluster.local/ns/shop/sa/client", "*.other.serviceaccount.identity.ambit.cluster.local"]}
---
apiVersion: policy.ambit.dev/v1alpha1
kind: NetworkAuthentication
metadata: {name: cluster, namespace: shop}
spec: {networks: [{cidr: 10.0.0.0/8, except: [10.9.0.0/16]}, {cidr: "fd00::/8"}]}
---
apiVersion: policy.ambit.dev/v1alpha1
kind: AuthorizationPolicy
metadata: {name: web-clients, namespace: shop}
spec:
  targetRef: {group: policy.ambit.dev, kind: Server, name: web-http}
  requiredAuthenticationRefs:
  - {group: policy.ambit.dev, kind: MeshTLSAuthentication, name: clients}
  - {group: policy.ambit.dev, kind: NetworkAuthentication, name: cluster}
---
apiVersion: policy.ambit.dev/v1alpha1
kind: AuthorizationPolicy
metadata: {name: ns-wide, namespace: shop}
spec:
  targetRef: {kind: Namespace, name: shop}
  requiredAuthenticationRefs: [{kind: ServiceAccount, name: client}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: login, namespace: shop}
spec:
  parentRefs: [{group: policy.ambit.dev, kind: Server, name: web-http}]
  rules:
  - matches: [{path: {type: Exact, value: /login}, method: POST}]
  - matches: [{path: {type: RegularExpression, value: '/u/[0-9]+'}, headers: [{name: x-user, type: RegularExpression, value: '[a-z]+'}]}]
---
apiVersion: policy.ambit.dev/v1alpha1
kind: AuthorizationPolicy
metadata: {name: on-login, namespace: shop}
spec:
  targetRef: {group: gateway.networking.k8s.io, kind: HTTPRoute, name: login}
  requiredAuthenticationRefs: [{group: policy.ambit.dev, kind: NetworkAuthentication, name: cluster}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: split
  namespace: shop
  annotations: {retry.ambit.dev/http: 5xx, retry.ambit.dev/limit: "2", timeout.ambit.dev/request: 2s}
spec:
  parentRefs: [{group: core, kind: Service, name: web, port: 80}]
  rules:
  - matches:
    - path: {type: PathPrefix, value: /api}
      headers: [{name: x-canary, value: "1"}]
      queryParams: [{name: v, type: RegularExpression, value: '2|3'}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {set: [{name: x-route, value: split}], add: [{name: x-a, value: b}], remove: [x-drop]}
    backendRefs: [{name: web, port: 80, weight: 9}, {name: grpc, port: 9090, weight: 1}]
    timeouts: {request: 10s, backendRequest: 1s}
  - backendRefs: [{name: web, port: 80}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: g, namespace: shop}
spec:
  parentRefs: [{group: core, kind: Service, name: grpc}]
  rules:
  - matches: [{method: {service: shop.Catalog, method: List}}, {method: {service: shop.Cart}}]
  - {}
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: shop
  annotations: {balancer.ambit.dev/failure-accrual: consecutive, balancer.ambit.dev/failure-accrual-consecutive-max-failures: "3"}
spec:
  clusterIP: 10.96.0.10
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: http}]
"#;

/// A token file of the local backend.
const TOKENS: &str = "nodes:\n  node-a: 0123456789abcdef0123456789abcdef\n  node-b: fedcba9876543210fedcba9876543210\n";

struct Seeds {
    root: PathBuf,
}

impl Seeds {
    fn write(&self, target: &str, seeds: impl IntoIterator<Item = Vec<u8>>) {
        let dir = self.root.join(target);
        std::fs::create_dir_all(&dir).unwrap();
        for (i, s) in seeds.into_iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i:02}")), s).unwrap();
        }
    }
}

/// `schedule` as the leading count and bytes, then `body`.
fn scheduled(schedule: &[u8], body: &[u8]) -> Vec<u8> {
    let mut out = vec![schedule.len() as u8];
    out.extend_from_slice(schedule);
    out.extend_from_slice(body);
    out
}

/// Messages, each length-delimited, one after the other.
fn delimited<M: Message>(messages: &[M]) -> Vec<u8> {
    let mut out = Vec::new();
    for m in messages {
        m.encode_length_delimited(&mut out).unwrap();
    }
    out
}

fn index(yaml: &str) -> ClusterIndex {
    let mut skipped = 0;
    let mut objects = base_objects();
    objects.extend(
        parse_file(Path::new("policy.yaml"), yaml, &mut skipped)
            .unwrap()
            .into_iter()
            .map(|o| o.object),
    );
    let mut index = ClusterIndex::new(TRUST_DOMAIN).with_local_netns();
    for o in objects {
        index.apply(o).unwrap();
    }
    index
}

fn detect(s: &Seeds) {
    let tls = [
        0x16, 0x03, 0x01, 0x00, 0xa5, 0x01, 0x00, 0x00, 0xa1, 0x03, 0x03,
    ];
    s.write(
        "detect",
        [
            scheduled(&[], b"GET / HTTP/1.1\r\nHost: web\r\n\r\n"),
            scheduled(&[2, 0, 7], b"POST /api/v1/items?x=1 HTTP/1.0\n\n"),
            scheduled(
                &[0, 0, 0, 0],
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04",
            ),
            scheduled(&[5], b"PRI * HTTP/1.1\r\n"),
            scheduled(&[], &tls),
            scheduled(&[], b"\x00\x00\x00\x08garbage"),
            scheduled(&[3], b"GET / SPDY/3\r\n"),
            scheduled(&[], b"OPTIONS * HTTP/1.1\r\n"),
            scheduled(&[], b""),
        ],
    );
}

fn cni_message(s: &Seeds) {
    let pod = PodRef {
        namespace: "shop".into(),
        name: "web-0".into(),
        container_id: "0123abcd".into(),
    };
    let requests = [
        Request::Add(PodAdd {
            pod: pod.clone(),
            uid: "u-1".into(),
            netns_path: "/var/run/netns/cni-1".into(),
            ips: vec!["10.1.0.5".parse().unwrap(), "fd00::5".parse().unwrap()],
        }),
        Request::Del(pod.clone()),
        Request::Check(pod),
        Request::Status,
        Request::Gc {
            valid_container_ids: vec!["a".into(), "b".into()],
        },
    ];
    let responses = [
        Response::Redirected,
        Response::NotMeshed,
        Response::Ok,
        Response::Error {
            code: 101,
            msg: "not redirected".into(),
            details: "see the proxy's log".into(),
        },
    ];
    let mut seeds: Vec<Vec<u8>> = requests
        .iter()
        .map(|r| scheduled(&[3, 10], &encode(r).unwrap()))
        .collect();
    seeds.extend(
        responses
            .iter()
            .map(|r| scheduled(&[], &encode(r).unwrap())),
    );
    seeds.push(scheduled(&[], &[0xff, 0xff, 0xff, 0xff]));
    s.write("cni_message", seeds);
}

fn cni_conf(s: &Seeds) {
    let prev = r#"{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","mac":"aa:bb:cc:dd:ee:ff","sandbox":"/var/run/netns/x"}],"ips":[{"address":"10.1.0.5/24","gateway":"10.1.0.1","interface":0},{"address":"fd00::5/64"}],"routes":[{"dst":"0.0.0.0/0"}],"dns":{}}"#;
    s.write(
        "cni_conf",
        [
            format!(r#"{{"cniVersion":"1.0.0","name":"k8s","type":"ambit-cni","socket":"/var/run/ambit/cni.sock","timeout":"30s","prevResult":{prev}}}"#),
            format!(r#"{{"cniVersion":"0.4.0","name":"k8s","type":"ambit-cni","exclude_namespaces":["kube-system"],"prevResult":{prev}}}"#),
            r#"{"cniVersion":"1.1.0","name":"k8s","type":"ambit-cni","cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"}]}"#.into(),
            r#"{"cniVersion":"0.3.1","name":"k8s"}"#.into(),
            r#"{"cniVersion":"1.1.0","timeout":"1h30m","prevResult":[1,2.5e3,null,true]}"#.into(),
            "[]".into(),
        ]
        .map(String::into_bytes),
    );
}

fn yaml(s: &Seeds) {
    let list = "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Namespace, metadata: {name: a}}\n- {apiVersion: apps/v1, kind: Deployment, metadata: {name: d}}\n";
    s.write(
        "local_yaml",
        [
            BASE.to_string(),
            format!("{BASE}---\n{POLICY}"),
            list.into(),
            TOKENS.into(),
        ]
        .map(String::into_bytes),
    );
    let parts: Vec<Vec<u8>> = POLICY
        .split("---\n")
        .map(|p| p.as_bytes().to_vec())
        .collect();
    s.write(
        "policy_objects",
        std::iter::once(POLICY.as_bytes().to_vec()).chain(parts),
    );
}

fn syntax(s: &Seeds) {
    s.write(
        "port_set",
        [
            "25,587,3306,4000-4100",
            ambit_api::ports::DEFAULT_OPAQUE_PORTS,
            " 80 , 443",
            "1-65535",
            "",
            "8080-8081,10",
        ]
        .map(|t| t.as_bytes().to_vec()),
    );
    s.write(
        "duration",
        [
            "24h",
            "1h30m",
            "500ms",
            "7d",
            "0s",
            "99999h",
            "1h1m1s1ms",
            " 90s ",
        ]
        .map(|t| t.as_bytes().to_vec()),
    );
}

fn updates(s: &Seeds) {
    let base = index("");
    let full = index(POLICY);
    let (before, after) = (cdisc::snapshot(&base), cdisc::snapshot(&full));
    let mut delta = cdisc::diff(&before, &after).unwrap_or_default();
    delta.removed_workloads.push("shop/gone".into());
    s.write(
        "discovery_update",
        [
            delimited(&after.snapshot_chunks(2, 1024).collect::<Vec<_>>()),
            delimited(&[before.to_update(true), delta]),
        ],
    );
    let d = Defaults {
        policy: "all-unauthenticated".into(),
        cluster_networks: vec!["10.0.0.0/8".into()],
    };
    let nodes = render_nodes(&full, &d, |n| n == NODE).nodes;
    let policies = nodes.get(NODE).cloned().unwrap_or_default();
    let routes = render_routes(&full, &ServiceRoutesMap::new()).services;
    let whole = snapshot_chunks(&policies, &routes, 1000, 1 << 20);
    let chunked = snapshot_chunks(&policies, &routes, 2, 1024);
    s.write("policy_update", [delimited(&whole), delimited(&chunked)]);
}

fn main() {
    let root = std::env::args().nth(1).expect("usage: seeds <directory>");
    let s = Seeds { root: root.into() };
    detect(&s);
    cni_message(&s);
    cni_conf(&s);
    yaml(&s);
    syntax(&s);
    updates(&s);
}
