"""Summarizes a bench/mesh/run.sh result directory: medians with min-max, added latency,
ratios, CPU per request and per GB, memory."""
import json
import pathlib
import statistics
import sys

args = sys.argv[1:]
BULK_ONLY = bool(args) and args[0] == "--bulk"   # ONLY=iperf: the bulk rows alone
if BULK_ONLY:
    args = args[1:]
out = pathlib.Path(args[0])
rounds = range(1, int(args[1]) + 1)
PATHS = ("direct", "relay", "mesh")


def oha(path, ka, r):
    f = out / f"oha-{path}-ka{ka}-{r}.json"
    if not f.exists():
        return None
    d = json.loads(f.read_text())
    pct = d["latencyPercentiles"]
    return {
        "p50": pct["p50"] * 1000,
        "p90": pct["p90"] * 1000,
        "p99": pct["p99"] * 1000,
        "ok": d["summary"]["successRate"],
        "n": sum(d.get("statusCodeDistribution", {}).values()),
    }


def iperf(path, r):
    d = json.loads((out / f"iperf-{path}-{r}.json").read_text())
    s = d["end"]["sum_received"]
    return {"gbps": s["bits_per_second"] / 1e9, "bytes": s["bytes"]}


def seconds(name):
    return int((out / f"cpu-{name}.usec").read_text()) / 1e6


def fmt(xs, digits=3):
    if not xs:
        return "–"
    return f"{statistics.median(xs):.{digits}f} ({min(xs):.{digits}f}–{max(xs):.{digits}f})"


def added(xs, base):
    if not xs:
        return "–"
    return f"{statistics.median(xs) - statistics.median(base):+.3f}"


def series(path, ka, q):
    runs = [oha(path, ka, r) for r in rounds]
    return [x[q] for x in runs if x is not None]


def per_1000(path, ka, who=""):
    xs = []
    for r in rounds:
        o = oha(path, ka, r)
        if o is not None:
            xs.append(seconds(f"{who}{path}-ka{ka}-{r}") / max(o["n"], 1) * 1000)
    return xs


def crypto(r):
    f = out / f"crypto-{r}.json"
    if not f.exists():
        return None
    d = json.loads(f.read_text())
    return d["seal_cpu_s_per_gb"] + d["open_cpu_s_per_gb"]


def machine(path, r):
    f = out / f"cpu-machine-iperf-{path}-{r}.usec"
    return int(f.read_text()) / 1e6 if f.exists() else None


def crypto_floor():
    """Bulk against "relays + seal + open", per round (each round's own relay run and
    crypto measurement), then the median of each ratio."""
    rows = {k: [] for k in ("crypto", "floor", "mesh", "cpu_ratio", "floor_gbps", "gbps_ratio")}
    for r in rounds:
        c = crypto(r)
        if c is None:
            continue
        rel, mesh = iperf("relay", r), iperf("mesh", r)
        rel_gb, mesh_gb = rel["bytes"] / 1e9, mesh["bytes"] / 1e9
        rel_cpu = seconds(f"iperf-relay-{r}") / rel_gb
        mesh_cpu = seconds(f"iperf-mesh-{r}") / mesh_gb
        floor = rel_cpu + c
        rows["crypto"].append(c)
        rows["floor"].append(floor)
        rows["mesh"].append(mesh_cpu)
        rows["cpu_ratio"].append(mesh_cpu / floor)
        # On the same cores: the relay run's whole-machine CPU per GB (the endpoints and the
        # kernel besides the relays), with seal and open added, at the same machine load.
        busy = machine("relay", r)
        if busy is not None:
            per_gb = busy / rel_gb
            fl = rel["gbps"] * per_gb / (per_gb + c)
            rows["floor_gbps"].append(fl)
            rows["gbps_ratio"].append(mesh["gbps"] / fl)
    if not rows["crypto"]:
        return
    print("\n## Bulk against the floor that includes the cryptography\n")
    print("Floor: the two plain relays' CPU per GB of the same round plus one AES-128-GCM seal and")
    print("one open per byte, timed by `crypto-floor` (the proxies' cipher, aws-lc-rs, 16 KiB")
    print("records) in that round. Throughput the floor allows: the relays' throughput, scaled by")
    print("the whole machine's CPU per GB in the relay run against that plus the crypto.\n")
    print("| measurement | value (median, min–max) |")
    print("|---|---|")
    print(f"| AES-128-GCM seal + open, CPU-seconds per GB | {fmt(rows['crypto'], 4)} |")
    print(f"| floor: relays + seal + open, CPU-seconds per GB | {fmt(rows['floor'])} |")
    print(f"| the mesh's two proxies, CPU-seconds per GB | {fmt(rows['mesh'])} |")
    print(f"| mesh CPU per GB / floor (goal ≤ 1.05) | {fmt(rows['cpu_ratio'], 2)} |")
    if rows["floor_gbps"]:
        print(f"| throughput the floor allows (Gbit/s) | {fmt(rows['floor_gbps'], 2)} |")
        print(f"| mesh throughput / what the floor allows (goal ≥ 0.95) | {fmt(rows['gbps_ratio'], 2)} |")
    ka = []
    for r in rounds:
        c, rel, mesh = crypto(r), oha("relay", "yes", r), oha("mesh", "yes", r)
        if c is None or rel is None or mesh is None:
            continue
        d = json.loads((out / f"oha-mesh-kayes-{r}.json").read_text())
        # Bytes sealed and opened per request: the response body oha counted plus 512 bytes
        # of request and response headers (an over-estimate: HPACK sends fewer).
        body = d["summary"].get("sizePerRequest") or 1024
        crypto_per_1000 = c * (body + 512) * 1000 / 1e9
        rel_1000 = seconds(f"relay-kayes-{r}") / max(rel["n"], 1) * 1000
        mesh_1000 = seconds(f"mesh-kayes-{r}") / max(mesh["n"], 1) * 1000
        ka.append(mesh_1000 / (rel_1000 + crypto_per_1000))
    if ka:
        print(f"| keep-alive CPU per 1000 requests / (relays + crypto share) (goal ≤ 1.1) | {fmt(ka, 2)} |")


if BULK_ONLY:
    print(f"# Bulk: one iperf3 stream, {len(rounds)} rounds (median, min–max)\n")
    print("| measurement | direct | two plain relays (socat) | through the mesh |")
    print("|---|---|---|---|")
    d, r, m = ([iperf(p, x)["gbps"] for x in rounds] for p in PATHS)
    print(f"| iperf3 single stream (Gbit/s) | {fmt(d, 2)} | {fmt(r, 2)} | {fmt(m, 2)} |")
    gb = {p: [seconds(f"iperf-{p}-{x}") / max(iperf(p, x)["bytes"] / 1e9, 1e-9) for x in rounds] for p in ("relay", "mesh")}
    print(f"| CPU-seconds per GB, relays / proxies | – | {fmt(gb['relay'])} | {fmt(gb['mesh'])} |")
    crypto_floor()
    sys.exit(0)

print(f"# Direct, two plain relays, and the mesh: {len(rounds)} rounds (median, min–max)\n")
print("| measurement | direct | two plain relays (socat) | through the mesh | added by the relays | added by the mesh |")
print("|---|---|---|---|---|---|")
for ka, label in (("yes", "keep-alive"), ("no", "new connection per request")):
    for q in ("p50", "p90", "p99"):
        d, r, m = (series(p, ka, q) for p in PATHS)
        print(f"| {label} {q} latency (ms) | {fmt(d)} | {fmt(r)} | {fmt(m)} | {added(r, d)} ms | {added(m, d)} ms |")
    d, r, m = (series(p, ka, "ok") for p in PATHS)
    print(f"| {label} success rate | {fmt(d, 4)} | {fmt(r, 4)} | {fmt(m, 4)} | | |")
d, r, m = ([iperf(p, x)["gbps"] for x in rounds] for p in PATHS)
print(
    f"| iperf3 single stream (Gbit/s) | {fmt(d, 2)} | {fmt(r, 2)} | {fmt(m, 2)} "
    f"| ratio {statistics.median(r) / statistics.median(d):.2f} | ratio {statistics.median(m) / statistics.median(d):.2f} |"
)

print("\n## CPU of what is in the path (both proxies; both relays)\n")
print("| measurement | two plain relays | the mesh's two proxies |")
print("|---|---|---|")
for ka, label in (("yes", "keep-alive"), ("no", "new connection per request")):
    print(f"| CPU-seconds per 1000 requests, {label} | {fmt(per_1000('relay', ka), 4)} | {fmt(per_1000('mesh', ka), 4)} |")
per_gb = {}
for p in ("relay", "mesh"):
    per_gb[p] = [seconds(f"iperf-{p}-{x}") / max(iperf(p, x)["bytes"] / 1e9, 1e-9) for x in rounds]
print(f"| CPU-seconds per GB (iperf3) | {fmt(per_gb['relay'])} | {fmt(per_gb['mesh'])} |")
crypto_floor()
print("\nFor scale, the server application (nginx's one worker), CPU-seconds per 1000 requests:\n")
print("| measurement | direct | two plain relays | through the mesh |")
print("|---|---|---|---|")
for ka, label in (("yes", "keep-alive"), ("no", "new connection per request")):
    print(f"| nginx, {label} | " + " | ".join(fmt(per_1000(p, ka, "nginx-"), 4) for p in PATHS) + " |")

if oha("policy", "yes", 1) is not None:
    print("\n## Policy: one HTTPRoute and one AuthorizationPolicy in place, against none\n")
    print("The same mesh; `policy` goes to a Service whose HTTPRoute has one rule, to a pod whose")
    print("port a Server selects with an AuthorizationPolicy for the client's identity.\n")
    print("| measurement | mesh, no policy | mesh, route + authorization | added by policy |")
    print("|---|---|---|---|")
    for ka, label in (("yes", "keep-alive"), ("no", "new connection per request")):
        for q in ("p50", "p99"):
            m, p = series("mesh", ka, q), series("policy", ka, q)
            print(f"| {label} {q} latency (ms) | {fmt(m)} | {fmt(p)} | {added(p, m)} ms |")
        m, p = per_1000("mesh", ka), per_1000("policy", ka)
        ratio = statistics.median(p) / statistics.median(m) - 1 if m and p else float("nan")
        print(f"| CPU-seconds per 1000 requests, {label} | {fmt(m, 4)} | {fmt(p, 4)} | {ratio:+.1%} |")
        print(f"| {label} success rate | {fmt(series('mesh', ka, 'ok'), 4)} | {fmt(series('policy', ka, 'ok'), 4)} | |")

if oha("sockmap", "yes", 1) is not None:
    print("\n## Sockmap on the in-pod hops: the mesh with --sockmap on, against off\n")
    print("Two more proxies (node-c, node-d) with --sockmap on, between cli3 and srv3; `mesh`")
    print("is node-a and node-b with it off. Each path's CPU is its two proxies'.\n")
    print("| measurement | mesh, sockmap off | mesh, sockmap on | change | two plain relays |")
    print("|---|---|---|---|---|")
    for ka, label in (("yes", "keep-alive"), ("no", "new connection per request")):
        for q in ("p50", "p99"):
            m, k, r = series("mesh", ka, q), series("sockmap", ka, q), series("relay", ka, q)
            print(f"| {label} {q} latency (ms) | {fmt(m)} | {fmt(k)} | {added(k, m)} ms | {fmt(r)} |")
        m, k, r = per_1000("mesh", ka), per_1000("sockmap", ka), per_1000("relay", ka)
        ratio = statistics.median(k) / statistics.median(m) - 1 if m and k else float("nan")
        print(f"| CPU-seconds per 1000 requests, {label} | {fmt(m, 4)} | {fmt(k, 4)} | {ratio:+.1%} | {fmt(r, 4)} |")
        print(f"| {label} success rate | {fmt(series('mesh', ka, 'ok'), 4)} | {fmt(series('sockmap', ka, 'ok'), 4)} | | |")
    m, k, r = ([iperf(p, x)["gbps"] for x in rounds] for p in ("mesh", "sockmap", "relay"))
    print(f"| iperf3 single stream (Gbit/s) | {fmt(m, 2)} | {fmt(k, 2)} | {statistics.median(k) / statistics.median(m) - 1:+.1%} | {fmt(r, 2)} |")
    gb = {p: [seconds(f"iperf-{p}-{x}") / max(iperf(p, x)["bytes"] / 1e9, 1e-9) for x in rounds] for p in ("mesh", "sockmap", "relay")}
    change = statistics.median(gb["sockmap"]) / statistics.median(gb["mesh"]) - 1
    print(f"| CPU-seconds per GB (iperf3) | {fmt(gb['mesh'])} | {fmt(gb['sockmap'])} | {change:+.1%} | {fmt(gb['relay'])} |")

print("\n## Memory of each proxy: right after the last run, at rest 12 s later, peak\n")
for node in ("A", "B"):
    mem = dict(line.split(":") for line in (out / f"mem-proxy-{node}.txt").read_text().splitlines())
    start = out / f"mem-start-proxy-{node}.txt"
    if start.exists():
        mem.update(line.split(":") for line in start.read_text().splitlines())
    print(
        f"- node-{node.lower()}: VmRSS {mem['VmRSSBusy'].strip()} after the run, "
        f"{mem['VmRSS'].strip()} at rest; VmHWM {mem['VmHWM'].strip()} "
        f"(start-up alone reached {mem.get('VmHWMStart', '?').strip()})"
    )

if oha("connect", "yes", 1) is not None:
    print("\n## Kernel TLS: opaque streams on a kTLS connection of their own, against CONNECT streams\n")
    print("`mesh`: node-a and node-b with kernel TLS (an opaque stream gets its own mTLS")
    print("connection, handed to the kernel and spliced); `connect`: node-c and node-d with")
    print("--kernel-tls off (a CONNECT stream on the pooled HTTP/2 tunnel). HTTP rides the")
    print("tunnel either way. Each path's CPU is its two proxies'.\n")
    print("| measurement | direct | two plain relays | mesh, kernel TLS | mesh, CONNECT streams |")
    print("|---|---|---|---|---|")
    g = {p: [iperf(p, x)["gbps"] for x in rounds] for p in ("direct", "relay", "mesh", "connect")}
    print("| iperf3 single stream (Gbit/s) | " + " | ".join(fmt(g[p], 2) for p in ("direct", "relay", "mesh", "connect")) + " |")
    gb = {p: [seconds(f"iperf-{p}-{x}") / max(iperf(p, x)["bytes"] / 1e9, 1e-9) for x in rounds] for p in ("relay", "mesh", "connect")}
    print("| CPU-seconds per GB (iperf3) | – | " + " | ".join(fmt(gb[p]) for p in ("relay", "mesh", "connect")) + " |")
    for q in ("p50", "p99"):
        print(f"| opaque, new connection per request, {q} (ms) | " + " | ".join(
            fmt(series(p, "opaque", q)) for p in ("direct",)) + " | – | " + " | ".join(
            fmt(series(p, "opaque", q)) for p in ("mesh", "connect")) + " |")
    print("| opaque, new connection per request, success rate | " + fmt(series("direct", "opaque", "ok"), 4)
          + " | – | " + " | ".join(fmt(series(p, "opaque", "ok"), 4) for p in ("mesh", "connect")) + " |")
    print("| opaque, new connection per request, CPU-seconds per 1000 | – | – | "
          + " | ".join(fmt(per_1000(p, "opaque"), 4) for p in ("mesh", "connect")) + " |")
    for ka, label in (("yes", "keep-alive"), ("no", "new connection per request")):
        print(f"| HTTP {label}, CPU-seconds per 1000 | – | {fmt(per_1000('relay', ka), 4) if ka == 'yes' else '–'} | "
              + " | ".join(fmt(per_1000(p, ka), 4) for p in ("mesh", "connect")) + " |")
