#!/usr/bin/env python3
"""Renders the ambit chart and prints how it runs each binary, as JSON:

    {"control": {"args": [...], "env": {"NAME": "value" or null}, "runtime": {...}},
     "proxy": {...}, "cni": {...}}

("runtime": user, securityContext, ports and mounts, as chartlib.runtime says.)

(null: the value comes from the cluster, e.g. the node name). The Rust end-to-end tests
feed these to the real binaries, so that the chart and the binaries cannot drift.

    render.py [--set key=value ...]     (with a generated sample PKI)
"""

import argparse
import json

import chartlib


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--set", action="append", default=[], help="a value, as helm --set (dotted keys, strings)")
    p.add_argument("--namespace", default="ambit")
    args = p.parse_args()
    extra = {}
    for kv in args.set:
        key, _, value = kv.partition("=")
        node = extra
        *path, last = key.split(".")
        for k in path:
            node = node.setdefault(k, {})
        node[last] = value
    objects = chartlib.render(chartlib.AMBIT, chartlib.sample_values(chartlib.sample_pki(), **extra), args.namespace)
    out = {}
    for key, kind, name, container in (
        ("control", "Deployment", "ambit-control", "ambit-control"),
        ("proxy", "DaemonSet", "ambit-proxy", "ambit-proxy"),
        ("cni", "DaemonSet", "ambit-proxy", "ambit-cni"),
    ):
        out[key] = chartlib.invocation(chartlib.container(objects, kind, name, container))
        out[key]["runtime"] = chartlib.runtime(objects, kind, name, container)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
