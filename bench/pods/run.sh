#!/usr/bin/env bash
# Ambit node proxy at rest with many meshed pods on its node: memory, descriptors, threads,
# and the time from its start until it serves them all.
#
#   sudo bench/pods/run.sh                  1,000 pods, 100 identities, eBPF redirection
#   PODS=1 sudo bench/pods/run.sh           the same proxy with one pod (the baseline)
#   SAS=1000 sudo bench/pods/run.sh         one ServiceAccount (identity) per pod
#   REDIRECT=nftables sudo bench/pods/run.sh   (or none)
#   SETTLE=30                               seconds at rest before the figures are read
#   BIN=/some/dir                           ambit, ambit-control, ambit-proxy from there
#
# Each pod is a network namespace <prefix>-<i> whose loopback holds its address (one of
# 10.81.0.0/16; nothing is sent to it: the proxy's cost at rest is what is measured). The
# control plane (local backend) lists them as meshed pods of node-a in 10 namespaces, pod i with ServiceAccount
# sa-<i mod SAS>, each naming its netns (local.ambit.dev/netns). One release ambit-proxy
# serves node-a: listeners in every pod, sk_lookup attached to every pod's netns, the
# cgroup programs attached to a cgroup made for the run (never the machine's root), its
# maps and links pinned under a bpffs directory of its own. Everything is removed on exit,
# also on failure: processes by pid, the pins (which detaches the programs), the cgroup,
# the namespaces.
#
# Results: bench/pods/results/<timestamp>/ (summary.md, status and smaps of the proxy).
# Targets (issue 14): VmHWM of a proxy with one pod under 15 MB, VmRSS at rest with 1,000
# pods under 25 MB (10^6 bytes; /proc's kB are KiB) — said met or not, not enforced.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
missing=()
for tool in ip curl openssl bc python3; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if ((${#missing[@]})); then
    echo "this benchmark needs ${missing[*]}: install them with ./scripts/install-deps.sh --bench" >&2
    exit 1
fi
PODS=${PODS:-1000}
SAS=${SAS:-100}
NAMESPACES=${NAMESPACES:-10}
SETTLE=${SETTLE:-30}
REDIRECT=${REDIRECT:-ebpf}
READY_TIMEOUT=${READY_TIMEOUT:-600}
# Loopback ports of this run's control plane and proxy admin server.
PORT=${PORT_BASE:-27000}
[ "$PODS" -le 60000 ] || { echo "at most 60000 pods fit 10.81.0.0/16 as numbered here" >&2; exit 1; }

# BIN=<dir> runs binaries built elsewhere (a before/after comparison) instead of building.
if [ -z "${BIN:-}" ]; then
    cargo build --release -q -p ambit-control -p ambit-proxy -p ambit-cli
    BIN=$ROOT/target/release
fi

P=ambp$$
WORK=$(mktemp -d /tmp/ambit-pods.XXXXXX)
CG_ROOT=$(awk '$3 == "cgroup2" {print $2; exit}' /proc/mounts)
CG=$CG_ROOT/$P
PIN=/sys/fs/bpf/$P
OUT=$ROOT/bench/pods/results/$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    # Removing the pins detaches the programs (the links' last references).
    rm -rf "$PIN"
    rmdir "$CG" 2>/dev/null || true
    find /run/netns -maxdepth 1 -name "$P-*" -printf 'netns del %f\n' 2>/dev/null | ip -force -batch - 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
mkdir "$CG"

pod_ip() { echo "10.81.$(( $1 / 250 )).$(( $1 % 250 + 2 ))"; }

# --- pods -----------------------------------------------------------------------------------
t0=$(date +%s.%N)
for i in $(seq 0 $((PODS - 1))); do echo "netns add $P-$i"; done | ip -batch -
for i in $(seq 0 $((PODS - 1))); do
    ip -n "$P-$i" -batch - <<EOF
addr add $(pod_ip "$i")/32 dev lo
link set lo up
EOF
done
echo "$PODS pod namespaces in $(echo "$(date +%s.%N) - $t0" | bc) s"

# --- control plane ------------------------------------------------------------------------
"$BIN/ambit" pki init --out "$WORK/pki" >/dev/null
mkdir -p "$WORK/cluster"
{
    for n in $(seq 0 $((NAMESPACES - 1))); do
        printf -- '---\napiVersion: v1\nkind: Namespace\nmetadata: {name: pods-%s, annotations: {ambit.dev/mesh: enabled}}\n' "$n"
    done
    for i in $(seq 0 $((PODS - 1))); do
        printf -- '---\napiVersion: v1\nkind: Pod\nmetadata: {name: p%s, namespace: pods-%s, annotations: {local.ambit.dev/netns: /run/netns/%s}}\nspec: {nodeName: node-a, serviceAccountName: sa-%s, containers: []}\nstatus: {podIP: %s, phase: Running}\n' \
            "$i" "$(( i % NAMESPACES ))" "$P-$i" "$(( i % SAS ))" "$(pod_ip "$i")"
    done
} > "$WORK/cluster/pods.yaml"
printf 'nodes:\n  node-a: %s\n' "$(openssl rand -hex 16)" > "$WORK/tokens.yaml"
awk '/node-a/ {print $2}' "$WORK/tokens.yaml" > "$WORK/node-a.token"

"$BIN/ambit-control" --trust-anchors "$WORK/pki/trust-anchor.crt" --issuer-cert "$WORK/pki/issuer.crt" \
    --issuer-key "$WORK/pki/issuer.key" --local-dir "$WORK/cluster" --node-tokens "$WORK/tokens.yaml" \
    --identity-addr "127.0.0.1:$((PORT + 80))" --discovery-addr "127.0.0.1:$((PORT + 86))" \
    --policy-addr "127.0.0.1:$((PORT + 90))" --admin-addr "127.0.0.1:$((PORT + 99))" \
    --log warn 2>"$OUT/control.log" &
PIDS+=($!)
CONTROL=$!
for _ in $(seq 1 300); do curl -sf "127.0.0.1:$((PORT + 99))/ready" >/dev/null && break; sleep 0.1; done
curl -sf "127.0.0.1:$((PORT + 99))/ready" >/dev/null || { echo "control plane not ready" >&2; exit 1; }

# --- the node proxy -------------------------------------------------------------------------
ADMIN=127.0.0.1:$((PORT + 191))
t0=$(date +%s.%N)
"$BIN/ambit-proxy" --node-name node-a --identity-url "https://127.0.0.1:$((PORT + 80))" \
    --discovery-url "https://127.0.0.1:$((PORT + 86))" --policy-url "https://127.0.0.1:$((PORT + 90))" \
    --token-file "$WORK/node-a.token" --trust-anchors "$WORK/pki/trust-anchor.crt" \
    --admin-addr "$ADMIN" --log warn \
    --redirect "$REDIRECT" --cgroup-path "$CG" --bpf-pin-dir "$PIN" \
    --cni-socket '' --run-dir "$WORK/run" \
    2>"$OUT/proxy.log" &
PIDS+=($!)
PROXY=$!
ready=
for _ in $(seq 1 $((READY_TIMEOUT * 10))); do
    if curl -sf "$ADMIN/ready" >/dev/null; then ready=$(echo "$(date +%s.%N) - $t0" | bc); break; fi
    kill -0 "$PROXY" 2>/dev/null || { echo "the proxy exited; see $OUT/proxy.log" >&2; exit 1; }
    sleep 0.1
done
[ -n "$ready" ] || { curl -s "$ADMIN/ready" | head -c 500 >&2; echo; echo "proxy not ready after $READY_TIMEOUT s" >&2; exit 1; }
status_of() { grep -E '^(VmRSS|VmHWM|RssAnon|RssFile|RssShmem|Threads):' "/proc/$1/status"; }
status_of "$PROXY" > "$OUT/status-ready.txt"
echo "ready after $ready s; settling $SETTLE s"
sleep "$SETTLE"

# --- at rest --------------------------------------------------------------------------------
status_of "$PROXY" > "$OUT/status-rest.txt"
fds=$(find "/proc/$PROXY/fd" -mindepth 1 | wc -l)
awk '/^[0-9a-f]+-[0-9a-f]+ / {name=$6} /^Rss:/ {rss[name]+=$2} END {for (n in rss) print rss[n] " kB " (n == "" ? "[anon]" : n)}' \
    "/proc/$PROXY/smaps" | sort -rn | head -15 > "$OUT/smaps-proxy.txt"
served=$(curl -s "$ADMIN/config_dump" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(len(d["pods"]), len(d["identities"]))')
links=$( [ -d "$PIN/links" ] && find "$PIN/links" -name 'pod-*' | wc -l || echo 0)
control_rss=$(awk '/^VmRSS/ {print $2}' "/proc/$CONTROL/status")
kb() { awk -v k="$1:" '$1 == k {print $2}' "$2"; }
{
    echo "| pods | identities | redirect | ready after (s) | VmRSS at rest | RssAnon | RssFile | VmHWM | VmRSS at ready | threads | descriptors | pods in /config_dump, identities | sk_lookup links pinned | control plane VmRSS |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    echo "| $PODS | $(( SAS < PODS ? SAS : PODS )) | $REDIRECT | $ready | $(kb VmRSS "$OUT/status-rest.txt") kB | $(kb RssAnon "$OUT/status-rest.txt") kB | $(kb RssFile "$OUT/status-rest.txt") kB | $(kb VmHWM "$OUT/status-rest.txt") kB | $(kb VmRSS "$OUT/status-ready.txt") kB | $(kb Threads "$OUT/status-rest.txt") | $fds | $served | $links | $control_rss kB |"
    echo
    rest=$(kb VmRSS "$OUT/status-rest.txt") hwm=$(kb VmHWM "$OUT/status-rest.txt")
    if [ "$PODS" -ge 1000 ]; then
        echo "target VmRSS at rest < 25 MB (24414 kB) with 1,000 pods: $([ "$rest" -lt 24414 ] && echo met || echo NOT met) ($rest kB)"
    fi
    if [ "$PODS" -le 1 ]; then
        echo "target VmHWM < 15 MB (14648 kB): $([ "$hwm" -lt 14648 ] && echo met || echo NOT met) ($hwm kB)"
    fi
    echo
    echo "RSS by mapping at rest:"
    echo
    sed 's/^/    /' "$OUT/smaps-proxy.txt"
} | tee "$OUT/summary.md"
