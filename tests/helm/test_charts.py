"""The Helm charts, rendered by the real Helm v4 library and checked against the
Kubernetes schemas (kubernetes-validate --strict) and the CRDs' own schemas."""

import copy
import json

import helm_python
import jsonschema
import kubernetes_validate
import pytest

import chartlib
from chartlib import AMBIT, CRDS, find, render, sample_values

NEWEST_KNOWN = kubernetes_validate.latest_version()
VERSIONS = [chartlib.OLDEST_SUPPORTED, NEWEST_KNOWN]


@pytest.fixture(scope="module")
def pki():
    return chartlib.sample_pki()


@pytest.mark.parametrize("chart", [AMBIT, CRDS], ids=["ambit", "ambit-crds"])
def test_lint_is_clean(chart):
    result = helm_python.lint(str(chart))
    assert result["errors"] == [], result
    # Severity 1 is INFO ("icon is recommended"); nothing at WARNING or above.
    assert [m for m in result["messages"] if m["severity"] > 1] == [], result


@pytest.mark.parametrize(
    "missing, named",
    [
        ("identityTrustAnchorsPEM", "identityTrustAnchorsPEM is required"),
        ("crtPEM", "identity.issuer.tls.crtPEM is required"),
        ("keyPEM", "identity.issuer.tls.keyPEM is required"),
    ],
)
def test_rendering_without_a_required_value_fails_naming_it_and_how_to_make_it(pki, missing, named):
    values = sample_values(pki)
    if missing == "identityTrustAnchorsPEM":
        del values[missing]
    else:
        del values["identity"]["issuer"]["tls"][missing]
    with pytest.raises(helm_python.HelmRenderError) as e:
        render(AMBIT, values)
    assert named in str(e.value)
    assert "ambit pki init" in str(e.value)


def validate_strict(obj, version):
    if obj["kind"] == "PodMonitor":
        # The Prometheus operator's CRD is not among the Kubernetes schemas: its shape is
        # checked by test_pod_monitor_is_optional_and_selects_both_admin_ports.
        return
    kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("replicas", [1, 3])
def test_every_object_passes_strict_validation(pki, version, replicas):
    objects = render(AMBIT, sample_values(pki, controller={"replicas": replicas}, podMonitor={"enabled": True}))
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "DaemonSet", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
            "ConfigMap", "Secret"} <= kinds
    for obj in objects:
        validate_strict(obj, version)


@pytest.mark.parametrize("version", VERSIONS)
def test_crds_pass_strict_validation_with_and_without_gateway_api(version):
    for install in (False, True):
        objects = render(CRDS, {"installGatewayAPI": install})
        names = {o["metadata"]["name"] for o in objects}
        assert "servers.policy.ambit.dev" in names
        assert ("httproutes.gateway.networking.k8s.io" in names) == install
        assert ("grpcroutes.gateway.networking.k8s.io" in names) == install
        for obj in objects:
            kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize(
    "values",
    [
        {"podMonitr": {"enabled": True}},
        {"proxy": {"redirct": "ebpf"}},
        {"proxy": {"redirect": "iptables"}},
        {"controller": {"replicas": 0}},
        {"identity": {"certLifetime": "a day"}},
        {"proxy": {"outboundUnknown": "block"}},
        {"proxy": {"maxConnectionsPerPod": 0}},
        {"proxy": {"httpIdleTimeout": "ten minutes"}},
        {"image": {"digests": {"proxy": "sha256:abc"}}},
        {"image": {"digests": {"prox": "sha256:" + "0" * 64}}},
    ],
    ids=[
        "misspelt-top-level",
        "misspelt-nested",
        "bad-enum",
        "bad-number",
        "bad-duration",
        "bad-outbound-unknown",
        "no-connections",
        "bad-idle-timeout",
        "short-digest",
        "misspelt-digest-name",
    ],
)
def test_a_misspelt_or_invalid_value_is_refused_by_the_schema(values):
    chart = helm_python.Chart.load(str(AMBIT))
    try:
        with pytest.raises(helm_python.HelmValuesError):
            chart.validate_schema(values)
        chart.validate_schema({"proxy": {"redirect": "ebpf"}})
    finally:
        chart.close()


def test_crds_schema_refuses_a_misspelt_value():
    chart = helm_python.Chart.load(str(CRDS))
    try:
        with pytest.raises(helm_python.HelmValuesError):
            chart.validate_schema({"installGatewayApi": True})
    finally:
        chart.close()


def test_more_than_one_replica_gets_a_disruption_budget_and_anti_affinity(pki):
    one = render(AMBIT, sample_values(pki))
    assert not [o for o in one if o["kind"] == "PodDisruptionBudget"]
    assert "affinity" not in find(one, "Deployment", "ambit-control")["spec"]["template"]["spec"]
    two = render(AMBIT, sample_values(pki, controller={"replicas": 2}))
    pdb = find(two, "PodDisruptionBudget", "ambit-control")
    deploy = find(two, "Deployment", "ambit-control")
    assert pdb["spec"]["selector"]["matchLabels"] == deploy["spec"]["selector"]["matchLabels"]
    anti = deploy["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert anti["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"] == "kubernetes.io/hostname"


def test_an_image_pinned_by_digest_is_pulled_by_it_and_the_others_by_tag(pki):
    digest = "sha256:" + "ab" * 32
    objects = render(AMBIT, sample_values(pki, image={"tag": "9.9.9", "digests": {"proxy": digest}}))
    images = {
        c["name"]: c["image"]
        for kind, name in [("DaemonSet", "ambit-proxy"), ("Deployment", "ambit-control")]
        for c in find(objects, kind, name)["spec"]["template"]["spec"]["containers"]
    }
    assert images == {
        "ambit-proxy": f"ghcr.io/ambit-mesh/ambit-proxy@{digest}",
        "ambit-cni": "ghcr.io/ambit-mesh/ambit-cni:9.9.9",
        "ambit-control": "ghcr.io/ambit-mesh/ambit-control:9.9.9",
    }, images


def test_external_ca_leaves_the_issuer_secret_to_the_operator(pki):
    values = sample_values(pki, identity={"externalCA": True})
    del values["identity"]["issuer"]
    objects = render(AMBIT, values)
    assert not [o for o in objects if o["kind"] == "Secret"]
    volumes = find(objects, "Deployment", "ambit-control")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "issuer", "secret": {"secretName": "ambit-identity-issuer", "defaultMode": 0o440}} in volumes


def test_the_node_proxy_daemonset_is_what_a_node_needs(pki):
    objects = render(AMBIT, sample_values(pki))
    ds = find(objects, "DaemonSet", "ambit-proxy")
    spec = ds["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["tolerations"] == [{"operator": "Exists"}]
    # Hitless: the new proxy starts beside the old one and takes its sockets over.
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    # ... which takes a proxy pod without host ports (the surge pod would not schedule)
    # and a grace period above the proxy's own drain.
    assert all("hostPort" not in p for c in spec["containers"] for p in c.get("ports", []))
    assert not spec.get("hostNetwork")
    assert spec["terminationGracePeriodSeconds"] == 40
    env = {e["name"]: e.get("value") for e in chartlib.container(objects, "DaemonSet", "ambit-proxy", "ambit-proxy")["env"]}
    assert env["AMBIT_SHUTDOWN_GRACE_PERIOD"] == "30s"
    proxy = chartlib.container(objects, "DaemonSet", "ambit-proxy", "ambit-proxy")
    assert proxy["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "admin-http"}
    assert proxy["livenessProbe"]["httpGet"] == {"path": "/live", "port": "admin-http"}
    assert {"name": "admin-http", "containerPort": 4191} in proxy["ports"]
    annotations = ds["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == "4191"
    # The projected token the control plane's TokenReview expects.
    token = next(v for v in spec["volumes"] if v["name"] == "token")
    source = token["projected"]["sources"][0]["serviceAccountToken"]
    assert source["audience"] == "ambit" and source["path"] == "token"
    env = chartlib.invocation(proxy)["env"]
    assert env["AMBIT_TOKEN_FILE"] == "/var/run/secrets/ambit/token"
    hostpaths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert hostpaths == {"run": "/var/run/ambit", "bpffs": "/sys/fs/bpf", "cgroup": "/sys/fs/cgroup",
                         "host-proc": "/proc", "cni-bin": "/opt/cni/bin", "cni-conf": "/etc/cni/net.d"}
    mounts = {m["name"]: m for m in proxy["volumeMounts"]}
    assert mounts["host-proc"]["readOnly"] is True
    # Nothing of ours is mounted inside the host run directory's mount (it propagates).
    assert not [m for m in proxy["volumeMounts"] if m["name"] != "run" and m["mountPath"].startswith("/var/run/ambit/")]


def test_rbac_is_list_and_watch_of_what_is_indexed_and_token_reviews(pki):
    role = find(render(AMBIT, sample_values(pki)), "ClusterRole", "ambit-control")
    verbs = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                verbs[(group, resource)] = set(rule["verbs"])
    assert verbs[("authentication.k8s.io", "tokenreviews")] == {"create"}
    for resource in ["namespaces", "pods", "serviceaccounts", "services"]:
        assert verbs[("", resource)] == {"get", "list", "watch"}
    assert verbs[("discovery.k8s.io", "endpointslices")] == {"list", "watch"}
    writes = {"create", "update", "patch", "delete", "deletecollection"}
    assert all(not (v & writes) for k, v in verbs.items() if k[1] != "tokenreviews")


def test_uninstall_on_delete_gives_the_cni_installer_alone_a_token_to_get_its_daemonset(pki):
    objects = render(AMBIT, sample_values(pki))
    spec = find(objects, "DaemonSet", "ambit-proxy")["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False
    cni = chartlib.container(objects, "DaemonSet", "ambit-proxy", "ambit-cni")
    args = cni["args"]
    assert args[args.index("--owner-daemonset") + 1] == "ambit/ambit-proxy"
    sa_dir = "/var/run/secrets/kubernetes.io/serviceaccount"
    assert {"name": "kube-api-access", "mountPath": sa_dir, "readOnly": True} in cni["volumeMounts"]
    # The proxy itself gets no API token.
    proxy = chartlib.container(objects, "DaemonSet", "ambit-proxy", "ambit-proxy")
    assert not [m for m in proxy["volumeMounts"] if m["name"] == "kube-api-access"]
    volume = next(v for v in spec["volumes"] if v["name"] == "kube-api-access")
    sources = volume["projected"]["sources"]
    assert sources[0]["serviceAccountToken"]["path"] == "token"
    assert "audience" not in sources[0]["serviceAccountToken"]  # the API server's own
    assert sources[1]["configMap"] == {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    role = find(objects, "Role", "ambit-cni")
    assert role["metadata"]["namespace"] == "ambit"
    assert role["rules"] == [{"apiGroups": ["apps"], "resources": ["daemonsets"],
                              "resourceNames": ["ambit-proxy"], "verbs": ["get"]}]
    binding = find(objects, "RoleBinding", "ambit-cni")
    assert binding["roleRef"]["name"] == "ambit-cni"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "ambit-proxy", "namespace": "ambit"}]

    off = render(AMBIT, sample_values(pki, cni={"uninstallOnDelete": False}))
    assert not [o for o in off if o["kind"] in ("Role", "RoleBinding")]
    cni = chartlib.container(off, "DaemonSet", "ambit-proxy", "ambit-cni")
    assert "--owner-daemonset" not in cni["args"]
    assert not [m for m in cni["volumeMounts"] if m["name"] == "kube-api-access"]
    spec = find(off, "DaemonSet", "ambit-proxy")["spec"]["template"]["spec"]
    assert not [v for v in spec["volumes"] if v["name"] == "kube-api-access"]


def test_pod_monitor_is_optional_and_selects_both_admin_ports(pki):
    assert not [o for o in render(AMBIT, sample_values(pki)) if o["kind"] == "PodMonitor"]
    objects = render(AMBIT, sample_values(pki, podMonitor={"enabled": True, "labels": {"release": "prom"}}))
    pm = find(objects, "PodMonitor", "ambit")
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    assert pm["metadata"]["labels"]["release"] == "prom"
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "admin-http"
    # The proxy's namespace/pod labels name the pods whose traffic it reports.
    assert pm["spec"]["podMetricsEndpoints"][0]["honorLabels"] is True
    selected = set(pm["spec"]["selector"]["matchExpressions"][0]["values"])
    assert selected == {"ambit-proxy", "ambit-control"}
    for kind, name in [("DaemonSet", "ambit-proxy"), ("Deployment", "ambit-control")]:
        labels = find(objects, kind, name)["spec"]["template"]["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] in selected


def test_grafana_dashboards_are_optional_configmaps_for_the_sidecar_holding_each_file(pki):
    assert not [o for o in render(AMBIT, sample_values(pki)) if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")]
    values = sample_values(pki, grafana={"dashboards": {"enabled": True, "namespace": "monitoring", "annotations": {"grafana_folder": "Ambit"}}})
    maps = [o for o in render(AMBIT, values) if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")]
    files = sorted((AMBIT / "dashboards").glob("*.json"))
    assert len(files) >= 5
    assert sorted(m["metadata"]["name"] for m in maps) == sorted(f.stem + "-dashboard" for f in files)
    for m in maps:
        assert m["metadata"]["namespace"] == "monitoring"
        assert m["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert m["metadata"]["annotations"] == {"grafana_folder": "Ambit"}
        (key, text), = m["data"].items()
        dashboard = json.loads(text)
        assert dashboard == json.loads((AMBIT / "dashboards" / key).read_text())
        # Grafana imports it anywhere: the data source is a variable, and uids are unique.
        assert dashboard["templating"]["list"][0]["type"] == "datasource"
        ids = [p["id"] for p in dashboard["panels"]]
        assert len(ids) == len(set(ids))
        for p in dashboard["panels"]:
            assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
            if p["type"] != "row":
                assert p["datasource"]["uid"] == "${datasource}"
    uids = [json.loads(next(iter(m["data"].values())))["uid"] for m in maps]
    assert len(uids) == len(set(uids))


def test_log_format_reaches_every_container(pki):
    objects = render(AMBIT, sample_values(pki, logFormat="json"))
    containers = []
    for kind, name in [("DaemonSet", "ambit-proxy"), ("Deployment", "ambit-control")]:
        spec = find(objects, kind, name)["spec"]["template"]["spec"]
        containers += spec["containers"] + spec.get("initContainers", [])
    assert len(containers) >= 3
    for c in containers:
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        assert env.get("AMBIT_LOG_FORMAT") == "json", c["name"]


def crd_schemas():
    schemas = {}
    for crd in render(CRDS, {"installGatewayAPI": True}):
        kind = crd["spec"]["names"]["kind"]
        schemas[kind] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schemas


def check(schema, obj):
    # Structural schemas use x-kubernetes-int-or-string with anyOf; plain JSON Schema
    # reads the anyOf, which is what the API server enforces too.
    jsonschema.validate(obj, schema)


GOOD = {
    "Server": {"spec": {"podSelector": {"matchLabels": {"app": "web"}}, "port": "http", "proxyProtocol": "HTTP/1"}},
    "AuthorizationPolicy": {"spec": {"targetRef": {"group": "policy.ambit.dev", "kind": "Server", "name": "web-http"},
                                     "requiredAuthenticationRefs": [{"group": "policy.ambit.dev", "kind": "MeshTLSAuthentication", "name": "frontends"}]}},
    "MeshTLSAuthentication": {"spec": {"identities": ["spiffe://cluster.local/ns/shop/sa/frontend", "spiffe://cluster.local/ns/batch/*",
                                                   "*.shop.serviceaccount.identity.ambit.cluster.local"]}},
    "NetworkAuthentication": {"spec": {"networks": [{"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}]}},
    "HTTPRoute": {"spec": {"parentRefs": [{"kind": "Service", "group": "core", "name": "web", "port": 80}],
                           "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/api"}, "method": "GET"}],
                                      "backendRefs": [{"name": "web-v1", "port": 80, "weight": 90}, {"name": "web-v2", "port": 80, "weight": 10}],
                                      "timeouts": {"request": "10s", "backendRequest": "2s"},
                                      "retry": {"codes": [503], "attempts": 3, "backoff": "100ms"}}]}},
    "GRPCRoute": {"spec": {"parentRefs": [{"kind": "Service", "group": "core", "name": "greeter", "port": 50051}],
                           "rules": [{"matches": [{"method": {"service": "helloworld.Greeter", "method": "SayHello"}}]}]}},
}

BAD = {
    "Server": {"spec": {"podSelector": {}, "port": 70000}},
    "AuthorizationPolicy": {"spec": {"targetRef": {"kind": "Deployment", "name": "web"}, "requiredAuthenticationRefs": []}},
    "MeshTLSAuthentication": {"spec": {"identities": ["spiffe://a*b", "*spiffe://a/*"]}},
    "NetworkAuthentication": {"spec": {"networks": [{"cidr": "ten.zero"}]}},
    "HTTPRoute": {"spec": {"rules": [{"backendRefs": [{"name": "web", "weight": -1}]}]}},
    "GRPCRoute": {"spec": {"rules": [{"timeouts": {"request": "soon"}}]}},
}


@pytest.mark.parametrize("kind", sorted(GOOD))
def test_sample_policy_objects_validate_against_the_crds_and_wrong_ones_do_not(kind):
    schema = crd_schemas()[kind]
    good = copy.deepcopy(GOOD[kind])
    good.update({"apiVersion": "x/v1", "kind": kind, "metadata": {"name": "sample", "namespace": "shop"}})
    check(schema, good)
    bad = copy.deepcopy(BAD[kind])
    bad.update({"apiVersion": "x/v1", "kind": kind, "metadata": {"name": "sample", "namespace": "shop"}})
    with pytest.raises(jsonschema.ValidationError):
        check(schema, bad)


def test_the_default_inbound_policy_reaches_the_control_plane_and_every_proxy(pki):
    values = sample_values(pki)
    values["defaultInboundPolicy"] = "all-authenticated"
    values["clusterNetworks"] = "10.0.0.0/8,fd00::/8"
    objects = render(AMBIT, values)
    control = chartlib.container(objects, "Deployment", "ambit-control", "ambit-control")
    proxy = chartlib.container(objects, "DaemonSet", "ambit-proxy", "ambit-proxy")
    for c in (control, proxy):
        env = chartlib.invocation(c)["env"]
        assert env["AMBIT_DEFAULT_INBOUND_POLICY"] == "all-authenticated"
        assert env["AMBIT_CLUSTER_NETWORKS"] == "10.0.0.0/8,fd00::/8"
    assert chartlib.invocation(proxy)["env"]["AMBIT_POLICY_URL"] == "https://ambit-control.ambit.svc:8090"
    assert {"name": "policy-grpc", "containerPort": 8090} in control["ports"]
    service = find(objects, "Service", "ambit-control")
    assert {"name": "policy-grpc", "port": 8090, "targetPort": "policy-grpc", "appProtocol": "grpc"} in service["spec"]["ports"]
    for bad in ({"defaultInboundPolicy": "allow-all"}, {"clusterNetworks": "everything"}):
        chart = helm_python.Chart.load(str(AMBIT))
        try:
            with pytest.raises(helm_python.HelmValuesError):
                chart.validate_schema(bad)
        finally:
            chart.close()
