"""Rendering Ambit's charts with the real Helm v4 library (PyPI helm-python-sdk), shared
by the chart tests and render.py."""

import pathlib
import subprocess
import tempfile

import helm_python
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
AMBIT = ROOT / "helm" / "ambit"
CRDS = ROOT / "helm" / "ambit-crds"

# The Kubernetes versions the charts support (Chart.yaml kubeVersion: >=1.29): the oldest,
# and the newest kubernetes-validate knows.
OLDEST_SUPPORTED = "1.29.0"


def sample_pki() -> dict:
    """A real trust anchor and issuer (ECDSA P-256), made with openssl."""
    with tempfile.TemporaryDirectory() as d:
        p = pathlib.Path(d)

        def run(*args):
            subprocess.run(args, check=True, capture_output=True, cwd=d)

        run("openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "anchor.key")
        run("openssl", "req", "-x509", "-new", "-key", "anchor.key", "-subj", "/CN=root.ambit",
            "-days", "3650", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-out", "anchor.crt")
        run("openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "issuer.key")
        run("openssl", "req", "-new", "-key", "issuer.key", "-subj", "/CN=issuer.ambit", "-out", "issuer.csr")
        (p / "ext").write_text("basicConstraints=critical,CA:TRUE,pathlen:0\nkeyUsage=critical,keyCertSign,cRLSign\n")
        run("openssl", "x509", "-req", "-in", "issuer.csr", "-CA", "anchor.crt", "-CAkey", "anchor.key",
            "-CAcreateserial", "-days", "365", "-extfile", "ext", "-out", "issuer.crt")
        return {
            "anchor": (p / "anchor.crt").read_text(),
            "issuer_crt": (p / "issuer.crt").read_text(),
            "issuer_key": (p / "issuer.key").read_text(),
        }


def sample_values(pki: dict, **extra) -> dict:
    """The values an operator passes: the PKI, plus `extra`."""
    values = {
        "identityTrustAnchorsPEM": pki["anchor"],
        "identity": {"issuer": {"tls": {"crtPEM": pki["issuer_crt"], "keyPEM": pki["issuer_key"]}}},
    }
    return merge(values, extra)


def merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def render(chart_dir: pathlib.Path, values: dict, namespace: str = "ambit") -> list:
    """Every object the chart renders, in order."""
    chart = helm_python.Chart.load(str(chart_dir))
    try:
        files = chart.render(values, name=chart_dir.name, namespace=namespace)
    finally:
        chart.close()
    objects = []
    for name, text in sorted(files.items()):
        if not name.endswith(".yaml"):
            continue
        objects.extend(d for d in yaml.safe_load_all(text) if d)
    return objects


def find(objects: list, kind: str, name: str) -> dict:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind} {name}: {len(matches)} rendered"
    return matches[0]


def container(objects: list, kind: str, name: str, container_name: str) -> dict:
    spec = find(objects, kind, name)["spec"]["template"]["spec"]
    return next(c for c in spec["containers"] if c["name"] == container_name)


def invocation(c: dict) -> dict:
    """A container's command line and environment; env from valueFrom is None."""
    return {
        "args": list(c.get("command", [])[1:]) + list(c.get("args", [])),
        "env": {e["name"]: e.get("value") for e in c.get("env", [])},
    }


def runtime(objects: list, kind: str, name: str, container_name: str) -> dict:
    """How the kubelet runs a container, beside its command line: the user, group and
    fsGroup, the container's securityContext (over the pod's), its ports, and each mount
    with the volume behind it ({"configMap"|"secret"|"projected"|"hostPath"|"emptyDir": ...,
    "defaultMode"}) — what tests/tests/images.rs turns into `podman run` flags."""
    spec = find(objects, kind, name)["spec"]["template"]["spec"]
    c = next(c for c in spec["containers"] + spec.get("initContainers", []) if c["name"] == container_name)
    pod_sc = spec.get("securityContext", {})
    sc = {**pod_sc, **c.get("securityContext", {})}
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = []
    for m in c.get("volumeMounts", []):
        v = volumes[m["name"]]
        source = next(k for k in v if k != "name")
        mounts.append({
            "name": m["name"],
            "mountPath": m["mountPath"],
            "readOnly": bool(m.get("readOnly", False)),
            "propagation": m.get("mountPropagation"),
            "source": source,
            "hostPath": v.get("hostPath", {}).get("path"),
            "defaultMode": v[source].get("defaultMode", 0o644) if source in ("configMap", "secret", "projected") else None,
        })
    caps = sc.get("capabilities", {})
    return {
        "command": c.get("command"),
        "user": sc.get("runAsUser"),
        "group": sc.get("runAsGroup"),
        "fsGroup": pod_sc.get("fsGroup"),
        "runAsNonRoot": bool(sc.get("runAsNonRoot", False)),
        "privileged": bool(sc.get("privileged", False)),
        "allowPrivilegeEscalation": sc.get("allowPrivilegeEscalation", True),
        "readOnlyRootFilesystem": bool(sc.get("readOnlyRootFilesystem", False)),
        "capabilities": {"add": caps.get("add", []), "drop": caps.get("drop", [])},
        "ports": [p["containerPort"] for p in c.get("ports", [])],
        "mounts": mounts,
        "hostNetwork": bool(spec.get("hostNetwork", False)),
    }
