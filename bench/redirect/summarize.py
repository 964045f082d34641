"""Summarizes a bench/redirect/run.sh result directory: medians with min-max, per path."""
import json
import pathlib
import statistics
import sys

out = pathlib.Path(sys.argv[1])
rounds = int(sys.argv[2])
tick = int(sys.argv[3])
PATHS = ("direct", "ebpf", "nftables")
R = range(1, rounds + 1)


def oha(path, ka, r):
    d = json.loads((out / f"oha-{path}-ka{ka}-{r}.json").read_text())
    pct = d["latencyPercentiles"]
    return {
        "p50": pct["p50"] * 1000,
        "p99": pct["p99"] * 1000,
        "ok": d["summary"]["successRate"],
        "n": sum(d.get("statusCodeDistribution", {}).values()),
    }


def gbps(path, r):
    d = json.loads((out / f"iperf-{path}-{r}.json").read_text())
    return d["end"]["sum_received"]["bits_per_second"] / 1e9


def cpu_per_k(path, ka, r):
    ticks = int((out / f"cpu-{path}-ka{ka}-{r}.ticks").read_text()) / tick
    return ticks / max(oha(path, ka, r)["n"], 1) * 1000


def fmt(xs, digits=3):
    return f"{statistics.median(xs):.{digits}f} ({min(xs):.{digits}f}–{max(xs):.{digits}f})"


print(f"# Redirection: direct vs eBPF vs nftables, {rounds} rounds (median, min–max)\n")
print("| measurement | direct | eBPF | nftables |")
print("|---|---|---|---|")
for ka, label in (("no", "new connection per request"), ("yes", "keep-alive")):
    for q in ("p50", "p99"):
        cells = [fmt([oha(p, ka, r)[q] for r in R]) for p in PATHS]
        print(f"| {label} {q} latency (ms) | " + " | ".join(cells) + " |")
    cells = [fmt([oha(p, ka, r)["ok"] for r in R], 4) for p in PATHS]
    print(f"| {label} success rate | " + " | ".join(cells) + " |")
    cells = ["—"] + [fmt([cpu_per_k(p, ka, r) for r in R], 4) for p in PATHS[1:]]
    print(f"| {label}: proxies' CPU-s per 1000 requests | " + " | ".join(cells) + " |")
cells = [fmt([gbps(p, r) for r in R], 2) for p in PATHS]
print("| iperf3 single stream (Gbit/s) | " + " | ".join(cells) + " |")
