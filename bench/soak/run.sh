#!/usr/bin/env bash
# Ambit soak: mixed traffic through a two-node mesh for a long time, while pods come and go
# through the CNI chain, a Service and the policy change, and a node proxy is restarted
# hitlessly every few minutes. Failed requests (the target is zero) and each proxy's RSS,
# descriptors and CPU over time.
#
#   sudo bench/soak/run.sh [MINUTES]          (default 30)
#   RESTART_EVERY=1m sudo bench/soak/run.sh 3 (a smoke run: a restart a minute)
#   RATE=20 CHURN_EVERY=4s CHANGE_EVERY=30s   (the defaults)
#
# Everything runs on this machine inside network namespaces, cgroups and eBPF pin
# directories made for the run, removed on exit (also on failure or SIGINT/SIGTERM).
# Results: bench/soak/results/<timestamp>/ — samples.csv, events.csv, failures.log,
# summary.md, soak.svg, each proxy process's log. See bench/soak/README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
MINUTES=${1:-30}
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
OUT=$PWD/bench/soak/results/$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT/bin"

command -v ip >/dev/null || { echo "missing ip: install it with ./scripts/install-deps.sh --bench" >&2; exit 1; }
[ -x /usr/lib/cni/bridge ] || { echo "missing the CNI plugins: install them with ./scripts/install-deps.sh --bench" >&2; exit 1; }
grep -q ' /sys/fs/bpf bpf ' /proc/mounts || mount -t bpf bpf /sys/fs/bpf

# The node proxy and the CNI plugin in release, as shipped: their memory and CPU are what
# the soak measures. The orchestrator in debug: it is not measured, and builds quickly
# next to the test suite's debug artifacts.
cargo build --release -q -p ambit-proxy -p ambit-cni
cargo build -q -p ambit-bench --bin ambit-soak
# Copies: a rebuild during the run must not change what the next restart starts.
cp "$TARGET/release/ambit-proxy" "$TARGET/release/ambit-cni" "$OUT/bin/"
{ git rev-parse HEAD; git status --short; } > "$OUT/tree.txt"

echo "results: $OUT"
RUST_BACKTRACE=1 "$TARGET/debug/ambit-soak" run --minutes "$MINUTES" \
    --restart-every "${RESTART_EVERY:-5m}" --churn-every "${CHURN_EVERY:-4s}" \
    --change-every "${CHANGE_EVERY:-30s}" --rate "${RATE:-20}" \
    --out "$OUT" --proxy-bin "$OUT/bin/ambit-proxy" --cni-bin "$OUT/bin/ambit-cni" \
    2> >(tee "$OUT/soak.log" >&2)
python3 bench/soak/plot.py "$OUT/samples.csv" "$OUT/events.csv" > "$OUT/soak.svg"
echo "plot: $OUT/soak.svg"
