"""Summarizes a bench/mesh/run.sh result directory: medians with min-max, ratios."""
import json
import pathlib
import statistics
import sys

out = pathlib.Path(sys.argv[1])
rounds = int(sys.argv[2])
tick = int(sys.argv[3])


def oha(path, ka, r):
    d = json.loads((out / f"oha-{path}-ka{ka}-{r}.json").read_text())
    pct = d["latencyPercentiles"]
    return {
        "p50": pct["p50"] * 1000,
        "p90": pct["p90"] * 1000,
        "p99": pct["p99"] * 1000,
        "rps": d["summary"]["requestsPerSec"],
        "ok": d["summary"]["successRate"],
        "n": sum(d.get("statusCodeDistribution", {}).values()),
    }


def iperf(path, r):
    d = json.loads((out / f"iperf-{path}-{r}.json").read_text())
    s = d["end"]["sum_received"]
    return {"gbps": s["bits_per_second"] / 1e9, "bytes": s["bytes"]}


def ticks(name):
    return int((out / f"cpu-{name}.ticks").read_text()) / tick


def fmt(xs, unit="", digits=3):
    return f"{statistics.median(xs):.{digits}f}{unit} ({min(xs):.{digits}f}–{max(xs):.{digits}f})"


print(f"# Mesh vs direct, {rounds} rounds (median, min–max)\n")
print("| measurement | direct | through the mesh | added (median) |")
print("|---|---|---|---|")
for ka, label in (("yes", "keep-alive"), ("no", "new connection per request")):
    for q in ("p50", "p90", "p99"):
        d = [oha("direct", ka, r)[q] for r in range(1, rounds + 1)]
        m = [oha("mesh", ka, r)[q] for r in range(1, rounds + 1)]
        print(f"| {label} {q} latency (ms) | {fmt(d)} | {fmt(m)} | {statistics.median(m) - statistics.median(d):+.3f} ms |")
    d = [oha("direct", ka, r)["ok"] for r in range(1, rounds + 1)]
    m = [oha("mesh", ka, r)["ok"] for r in range(1, rounds + 1)]
    print(f"| {label} success rate | {fmt(d, '', 4)} | {fmt(m, '', 4)} | |")
d = [iperf("direct", r)["gbps"] for r in range(1, rounds + 1)]
m = [iperf("mesh", r)["gbps"] for r in range(1, rounds + 1)]
print(f"| iperf3 single stream (Gbit/s) | {fmt(d, '', 2)} | {fmt(m, '', 2)} | ratio {statistics.median(m) / statistics.median(d):.2f} |")

print("\n## Proxy cost (both proxies together)\n")
print("| measurement | median (min–max) |")
print("|---|---|")
for ka, label in (("yes", "keep-alive"), ("no", "new connection per request")):
    per_k = []
    for r in range(1, rounds + 1):
        n = oha("mesh", ka, r)["n"]
        per_k.append(ticks(f"mesh-ka{ka}-{r}") / max(n, 1) * 1000)
    print(f"| CPU-seconds per 1000 requests, {label} | {fmt(per_k, '', 4)} |")
per_gb = []
for r in range(1, rounds + 1):
    gb = iperf("mesh", r)["bytes"] / 1e9
    per_gb.append(ticks(f"iperf-mesh-{r}") / max(gb, 1e-9))
print(f"| CPU-seconds per GB (iperf3) | {fmt(per_gb, '', 3)} |")
for node in ("A", "B"):
    mem = dict(line.split(":") for line in (out / f"mem-proxy-{node}.txt").read_text().splitlines())
    print(f"| proxy node-{node.lower()} VmRSS / VmHWM | {mem['VmRSS'].strip()} / {mem['VmHWM'].strip()} |")
