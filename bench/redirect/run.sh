#!/usr/bin/env bash
# Ambit redirection benchmark: eBPF vs nftables redirection vs direct, side by side, in
# one run.
#
#   sudo bench/redirect/run.sh [ROUNDS]      (default 3 rounds; ~3 minutes)
#
# Topology (network namespaces on one bridge, nothing leaves this machine):
#   cli-e -> srv-e   meshed pods whose proxies (nodes ae, be) redirect with eBPF
#   cli-n -> srv-n   meshed pods whose proxies (nodes an, bn) redirect with nftables
#   dir   -> srv-d   unmeshed pods: the direct path, no proxy
# Each server pod runs nginx (1 worker, access log off, 1 KiB file) and iperf3 -s. Every
# client runs in the cgroup that node-ae's proxy attached its connect/sockops programs to
# (a cgroup made for this run, never the machine's root); only cli-e's netns is meshed
# with eBPF, so the programs leave the others alone.
# Each round, for direct, ebpf, nftables in turn: oha with a new connection per request
# (what redirection costs is paid per connection), oha keep-alive, iperf3 single stream.
# Results: bench/redirect/results/<timestamp>/ and a summary on stdout.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-3}
ROOT=$PWD
. bench/lib.sh
DURATION=${DURATION:-10}

prepare   # tools present, release binaries built: sets OHA and BIN

P=ambr$$
WORK=$(scratch_dir ambit-rbench)
OUT=$ROOT/bench/redirect/results/$(date -u +%Y%m%dT%H%M%SZ)
CG_ROOT=$(awk '$3 == "cgroup2" {print $2; exit}' /proc/mounts)
CG_A=$CG_ROOT/$P-a CG_B=$CG_ROOT/$P-b
PINS=/sys/fs/bpf/$P
mkdir -p "$OUT"
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    remove_pods "$P"
    # Removing the pins detaches the programs.
    rm -rf "$PINS-ae" "$PINS-be"
    rmdir "$CG_A" "$CG_B" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
mkdir "$CG_A" "$CG_B"

# --- topology ----------------------------------------------------------------------------
pods_on_bridge "$P" cli-e cli-n dir srv-e srv-n srv-d   # 10.78.0.2 … .7
declare -A IP=([cli-e]=10.78.0.2 [cli-n]=10.78.0.3 [dir]=10.78.0.4 [srv-e]=10.78.0.5 [srv-n]=10.78.0.6 [srv-d]=10.78.0.7)

# --- control plane and proxies ------------------------------------------------------------
"$BIN/ambit" pki init --out "$WORK/pki" >/dev/null
mkdir -p "$WORK/cluster"
pod() { # name node meshed(yes|no)
    local ann="{local.ambit.dev/netns: /run/netns/$P-$1}"
    [ "$3" = no ] && ann="{ambit.dev/mesh: disabled}"
    printf -- '---\napiVersion: v1\nkind: Pod\nmetadata: {name: %s, namespace: bench, annotations: %s}\nspec: {nodeName: %s, serviceAccountName: %s, containers: []}\nstatus: {podIP: %s, phase: Running}\n' \
        "$1" "$ann" "$2" "${1%-*}" "${IP[$1]}"
}
{
    printf 'apiVersion: v1\nkind: Namespace\nmetadata: {name: bench, annotations: {ambit.dev/mesh: enabled}}\n'
    pod cli-e node-ae yes; pod srv-e node-be yes
    pod cli-n node-an yes; pod srv-n node-bn yes
    pod dir node-ae no; pod srv-d node-be no
} > "$WORK/cluster/bench.yaml"
{
    echo "nodes:"
    for node in ae be an bn; do echo "  node-$node: $(openssl rand -hex 16)"; done
} > "$WORK/tokens.yaml"
"$BIN/ambit-control" --trust-anchors "$WORK/pki/trust-anchor.crt" --issuer-cert "$WORK/pki/issuer.crt" \
    --issuer-key "$WORK/pki/issuer.key" --local-dir "$WORK/cluster" --node-tokens "$WORK/tokens.yaml" \
    --identity-addr 127.0.0.1:18180 --discovery-addr 127.0.0.1:18186 --admin-addr 127.0.0.1:19991 \
    --log warn 2>"$OUT/control.log" &
PIDS+=($!)
declare -A PROXY ADMIN=([ae]=14291 [be]=14292 [an]=14293 [bn]=14294)
for node in ae be an bn; do
    grep "node-$node" "$WORK/tokens.yaml" | awk '{print $2}' > "$WORK/node-$node.token"
    case $node in
        ae) mode=(--redirect ebpf --cgroup-path "$CG_A" --bpf-pin-dir "$PINS-ae") ;;
        be) mode=(--redirect ebpf --cgroup-path "$CG_B" --bpf-pin-dir "$PINS-be") ;;
        *) mode=(--redirect nftables) ;;
    esac
    "$BIN/ambit-proxy" --node-name "node-$node" --identity-url https://127.0.0.1:18180 \
        --discovery-url https://127.0.0.1:18186 --token-file "$WORK/node-$node.token" \
        --trust-anchors "$WORK/pki/trust-anchor.crt" --admin-addr "127.0.0.1:${ADMIN[$node]}" --log warn \
        --cni-socket '' --run-dir "$WORK/run-$node" "${mode[@]}" 2>"$OUT/proxy-$node.log" &
    PIDS+=($!)
    PROXY[$node]=$!
done
for node in ae be an bn; do
    for _ in $(seq 1 100); do curl -sf "127.0.0.1:${ADMIN[$node]}/ready" >/dev/null && break; sleep 0.1; done
    curl -sf "127.0.0.1:${ADMIN[$node]}/ready" >/dev/null || { echo "proxy node-$node not ready" >&2; cat "$OUT/proxy-$node.log" >&2; exit 1; }
done

# --- server applications -------------------------------------------------------------------
for srv in srv-e srv-n srv-d; do
    start_servers "$P-$srv" "$srv"
done
sleep 1

# A client process: in node-a's cgroup, in the client pod's netns.
client() { local ns=$1; shift; in_pod "$CG_A" "$P-$ns" "$@"; }
TICK=$(getconf CLK_TCK)
declare -A CLI=([direct]=dir [ebpf]=cli-e [nftables]=cli-n) SRV=([direct]=srv-d [ebpf]=srv-e [nftables]=srv-n)
declare -A NODES=([direct]="ae be" [ebpf]="ae be" [nftables]="an bn")
proxy_cpu() { local t=0; for n in ${NODES[$1]}; do t=$((t + $(cpu "${PROXY[$n]}"))); done; echo $t; }

# Sanity: every path answers, and the meshed ones go through their proxies.
for path in direct ebpf nftables; do
    client "${CLI[$path]}" curl -sf -o /dev/null "http://${IP[${SRV[$path]}]}:8080/1k" \
        || { echo "$path path does not answer" >&2; cat "$WORK"/nginx-*-error.log >&2; exit 1; }
done

for round in $(seq 1 "$ROUNDS"); do
    for path in direct ebpf nftables; do
        url="http://${IP[${SRV[$path]}]}:8080/1k"
        for ka in no yes; do
            extra=()
            [ $ka = no ] && extra=(--disable-keepalive)
            c0=$(proxy_cpu $path)
            client "${CLI[$path]}" "$OHA" -z "${DURATION}s" -q 1000 -c 16 --latency-correction --no-tui \
                --output-format json "${extra[@]}" "$url" > "$OUT/oha-$path-ka$ka-$round.json"
            echo $(( $(proxy_cpu $path) - c0 )) > "$OUT/cpu-$path-ka$ka-$round.ticks"
        done
        client "${CLI[$path]}" iperf3 -c "${IP[${SRV[$path]}]}" -p 5201 -t "$DURATION" -J > "$OUT/iperf-$path-$round.json"
    done
done
python3 "$ROOT/bench/redirect/summarize.py" "$OUT" "$ROUNDS" "$TICK" | tee "$OUT/summary.md"
