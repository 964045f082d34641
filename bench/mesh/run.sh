#!/usr/bin/env bash
# Ambit data-path benchmark: through the mesh vs direct, side by side, in one run.
#
#   sudo bench/mesh/run.sh [ROUNDS]        (default 3 rounds; ~8 minutes)
#   REDIRECT=nftables sudo bench/mesh/run.sh   (default: ebpf)
#   SOCKMAP=1 sudo bench/mesh/run.sh       (a fifth path: the mesh with --sockmap on)
#   SOCKMAP=1 SOCKMAP_FLAG=off ...          (the same fifth path with it off: a control)
#   KTLS=1 sudo bench/mesh/run.sh          (a fifth path: the mesh with --kernel-tls off,
#                                           beside `mesh` with kernel TLS; needs a kernel
#                                           with TLS, e.g. in scripts/vm/run.sh)
#   KTLS=1 PROFILE=iperf-syscalls ...      (system calls per GB of both, then stop)
#
# Topology (network namespaces on a bridge, nothing leaves this machine):
#   cli   meshed client pod on node-a  (redirected by its proxy: eBPF or nftables)
#   dir   unmeshed client pod on node-a
#   srv   meshed server pod on node-b: nginx (1 worker, access log off, 1 KiB file) and
#         iperf3 -s
#   sdir  unmeshed server pod on node-b, the same servers
# Three paths, each round in turn:
#   direct  dir -> sdir: no proxy at all (a meshed server's pod IP would be captured by
#           its proxy's plaintext inbound listener, so the direct path has its own server)
#   relay   dir -> socat in dir -> socat in sdir -> sdir: the same three hops as the mesh
#           through two plain TCP relays that do nothing but copy (the floor of any design
#           with a process in the path at each end; keep-alive and iperf3 only)
#   mesh    cli -> proxy node-a -> mTLS/HTTP/2 -> proxy node-b -> srv
#   policy  the mesh with policy in place: cli -> Service web (one HTTPRoute, one rule) ->
#           proxy node-a -> proxy node-b -> srv2, whose port a Server selects and an
#           AuthorizationPolicy (the client's identity) authorizes (HTTP only)
#   sockmap (SOCKMAP=1) the mesh again through two more proxies (node-c, node-d) started
#           with --sockmap on: cli3 -> proxy node-c -> proxy node-d -> srv3, the in-pod
#           hops (client to its proxy, proxy to nginx/iperf3) by sk_msg instead of loopback
#           TCP. Every proxy then runs in a cgroup below its node's (as on a node, where the
#           programs hang off the root cgroup), so that sockops pairs their sockets too and
#           the two mesh paths differ by the flag alone.
#   connect (KTLS=1) the mesh through node-c and node-d started with --kernel-tls off:
#           cli3 -> proxy node-c -> CONNECT stream on the pooled tunnel -> proxy node-d ->
#           srv3, while `mesh` takes a kernel TLS connection of its own per opaque stream
# Each path runs oha keep-alive, oha new connection per request (not relay: socat forks per
# connection) and iperf3 single stream; with KTLS=1 also oha new connection per request to
# a port the server pods mark opaque (8081: nginx again), the case kernel TLS costs a
# handshake for. Results: bench/mesh/results/<timestamp>/ and a
# summary on stdout. With eBPF, the programs attach to cgroups made for the run (never the
# machine's root), and every client process runs in node-a's.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-3}
ROOT=$PWD
. bench/lib.sh

prepare   # tools present, release binaries built: sets OHA and BIN

P=ambb$$
REDIRECT=${REDIRECT:-ebpf}
WORK=$(scratch_dir ambit-bench)
CG_ROOT=$(awk '$3 == "cgroup2" {print $2; exit}' /proc/mounts)
CG_A=$CG_ROOT/$P-a CG_B=$CG_ROOT/$P-b CG_R=$CG_ROOT/$P-relay
CG_C=$CG_ROOT/$P-c CG_D=$CG_ROOT/$P-d
SOCKMAP=${SOCKMAP:-}
KTLS=${KTLS:-}
[ -n "$SOCKMAP" ] && [ -n "$KTLS" ] && { echo "SOCKMAP=1 and KTLS=1: one at a time" >&2; exit 2; }
# The fifth path through node-c and node-d, if any.
SECOND=${SOCKMAP:+sockmap}${KTLS:+connect}
OUT=$ROOT/bench/mesh/results/$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    [ -d "$CG_R" ] && echo 1 > "$CG_R/cgroup.kill" && sleep 0.2
    remove_pods "$P"
    # Removing the pins detaches the programs.
    rm -rf "/sys/fs/bpf/$P-a" "/sys/fs/bpf/$P-b" "/sys/fs/bpf/$P-c" "/sys/fs/bpf/$P-d"
    rmdir "$CG_A/proxy" "$CG_B/proxy" "$CG_C/proxy" "$CG_D/proxy" 2>/dev/null || true
    rmdir "$CG_A" "$CG_B" "$CG_R" "$CG_C" "$CG_D" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
mkdir "$CG_A" "$CG_B" "$CG_R"
# A client process: in its node's cgroup (node-a's; node-c's for the sockmap path), in the
# client pod's netns.
declare -A CG=([direct]=$CG_A [relay]=$CG_A [mesh]=$CG_A [policy]=$CG_A [sockmap]=$CG_C [connect]=$CG_C)
client() { local ns=$1; shift; in_pod "$CG_A" "$ns" "$@"; }

# --- topology ----------------------------------------------------------------------------
pods_on_bridge "$P" cli dir srv sdir srv2 cli3 srv3   # 10.78.0.2, .3, .4, .5, .6, .7, .8
CLI=10.78.0.2 DIR=10.78.0.3 SRV=10.78.0.4 SDIR=10.78.0.5 SRV2=10.78.0.6 WEB=10.96.0.50
CLI3=10.78.0.7 SRV3=10.78.0.8

# --- control plane and proxies ------------------------------------------------------------
"$BIN/ambit" pki init --out "$WORK/pki" >/dev/null
mkdir -p "$WORK/cluster"
cat > "$WORK/cluster/bench.yaml" <<YAML
apiVersion: v1
kind: Namespace
metadata: {name: bench, annotations: {ambit.dev/mesh: enabled}}
---
apiVersion: v1
kind: Pod
metadata: {name: cli, namespace: bench, annotations: {local.ambit.dev/netns: /run/netns/$P-cli}}
spec: {nodeName: node-a, serviceAccountName: client, containers: []}
status: {podIP: $CLI, phase: Running}
---
apiVersion: v1
kind: Pod
metadata: {name: dir, namespace: bench, annotations: {ambit.dev/mesh: disabled}}
spec: {nodeName: node-a, serviceAccountName: direct, containers: []}
status: {podIP: $DIR, phase: Running}
---
apiVersion: v1
kind: Pod
metadata: {name: srv, namespace: bench, annotations: {local.ambit.dev/netns: /run/netns/$P-srv, config.ambit.dev/opaque-ports: "8081"}}
spec: {nodeName: node-b, serviceAccountName: server, containers: []}
status: {podIP: $SRV, phase: Running}
---
apiVersion: v1
kind: Pod
metadata: {name: sdir, namespace: bench, annotations: {ambit.dev/mesh: disabled}}
spec: {nodeName: node-b, serviceAccountName: direct-server, containers: []}
status: {podIP: $SDIR, phase: Running}
---
apiVersion: v1
kind: Pod
metadata: {name: srv2, namespace: bench, labels: {app: srv2}, annotations: {local.ambit.dev/netns: /run/netns/$P-srv2}}
spec: {nodeName: node-b, serviceAccountName: server, containers: [{name: nginx, ports: [{name: http, containerPort: 8080}]}]}
status: {podIP: $SRV2, phase: Running}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: bench}
spec: {clusterIP: $WEB, ports: [{name: http, port: 8080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: bench, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: ['$SRV2'], targetRef: {kind: Pod, name: srv2, namespace: bench}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web, namespace: bench}
spec:
  parentRefs: [{group: core, kind: Service, name: web, port: 8080}]
  rules: [{matches: [{path: {type: PathPrefix, value: /}}], backendRefs: [{name: web, port: 8080}]}]
---
apiVersion: policy.ambit.dev/v1alpha1
kind: Server
metadata: {name: srv2-http, namespace: bench}
spec: {podSelector: {matchLabels: {app: srv2}}, port: http, proxyProtocol: HTTP/1}
---
apiVersion: policy.ambit.dev/v1alpha1
kind: MeshTLSAuthentication
metadata: {name: client, namespace: bench}
spec: {identities: ['spiffe://cluster.local/ns/bench/sa/client']}
---
apiVersion: policy.ambit.dev/v1alpha1
kind: AuthorizationPolicy
metadata: {name: client-only, namespace: bench}
spec:
  targetRef: {group: policy.ambit.dev, kind: Server, name: srv2-http}
  requiredAuthenticationRefs: [{group: policy.ambit.dev, kind: MeshTLSAuthentication, name: client}]
---
apiVersion: v1
kind: Pod
metadata: {name: cli3, namespace: bench, annotations: {local.ambit.dev/netns: /run/netns/$P-cli3}}
spec: {nodeName: node-c, serviceAccountName: client, containers: []}
status: {podIP: $CLI3, phase: Running}
---
apiVersion: v1
kind: Pod
metadata: {name: srv3, namespace: bench, annotations: {local.ambit.dev/netns: /run/netns/$P-srv3, config.ambit.dev/opaque-ports: "8081"}}
spec: {nodeName: node-d, serviceAccountName: server, containers: []}
status: {podIP: $SRV3, phase: Running}
YAML
printf 'nodes:\n' > "$WORK/tokens.yaml"
for node in a b c d; do
    printf '  node-%s: %s\n' $node "$(openssl rand -hex 16)" >> "$WORK/tokens.yaml"
    grep "node-$node" "$WORK/tokens.yaml" | awk '{print $2}' > "$WORK/node-$node.token"
done

"$BIN/ambit-control" --trust-anchors "$WORK/pki/trust-anchor.crt" --issuer-cert "$WORK/pki/issuer.crt" \
    --issuer-key "$WORK/pki/issuer.key" --local-dir "$WORK/cluster" --node-tokens "$WORK/tokens.yaml" \
    --identity-addr 127.0.0.1:18080 --discovery-addr 127.0.0.1:18086 --policy-addr 127.0.0.1:18090 \
    --admin-addr 127.0.0.1:19990 \
    --log warn 2>"$OUT/control.log" &
PIDS+=($!)
# With SOCKMAP=1 every proxy runs in a cgroup below its node's, as on a node (where the
# programs hang off the root cgroup, so they run for the proxy's own sockets too): the two
# mesh paths then differ by --sockmap alone. (Outside it, as by default, the proxies'
# sockets skip the cgroup programs.)
in_node_cgroup() { # node cmd...
    local node=$1
    shift
    # exec: run in the background, the proxy keeps the pid `$!` names.
    if [ -n "$SOCKMAP" ]; then
        mkdir -p "$CG_ROOT/$P-$node/proxy"
        exec sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$CG_ROOT/$P-$node/proxy" "$@"
    else
        exec "$@"
    fi
}
for node in a b; do
    port=$([ $node = a ] && echo 14191 || echo 14192)
    in_node_cgroup $node "$BIN/ambit-proxy" --node-name "node-$node" --identity-url https://127.0.0.1:18080 \
        --discovery-url https://127.0.0.1:18086 --policy-url https://127.0.0.1:18090 \
        --token-file "$WORK/node-$node.token" \
        --trust-anchors "$WORK/pki/trust-anchor.crt" --admin-addr "127.0.0.1:$port" --log warn \
        --redirect "$REDIRECT" --cgroup-path "$CG_ROOT/$P-$node" --bpf-pin-dir "/sys/fs/bpf/$P-$node" \
        --cni-socket '' --run-dir "$WORK/run-$node" ${KTLS:+--kernel-tls on} \
        2>"$OUT/proxy-$node.log" &
    PIDS+=($!)
    eval "PROXY_${node^^}=$!"
done
PORTS=(14191 14192)
if [ -n "$SECOND" ]; then
    # node-c and node-d: the same proxies with --sockmap on, each in a cgroup below its
    # node's, where its programs are attached (a node's root cgroup holds its proxy too);
    # or with --kernel-tls off.
    mkdir "$CG_C" "$CG_D"
    if [ -n "$SOCKMAP" ]; then
        flags=(--redirect ebpf --sockmap "${SOCKMAP_FLAG:-on}")
    else
        flags=(--redirect "$REDIRECT" --kernel-tls off)
    fi
    for node in c d; do
        port=$([ $node = c ] && echo 14193 || echo 14194)
        in_node_cgroup $node "$BIN/ambit-proxy" --node-name "node-$node" --identity-url https://127.0.0.1:18080 \
            --discovery-url https://127.0.0.1:18086 --policy-url https://127.0.0.1:18090 \
            --token-file "$WORK/node-$node.token" \
            --trust-anchors "$WORK/pki/trust-anchor.crt" --admin-addr "127.0.0.1:$port" --log warn \
            "${flags[@]}" --cgroup-path "$CG_ROOT/$P-$node" --bpf-pin-dir "/sys/fs/bpf/$P-$node" \
            --cni-socket '' --run-dir "$WORK/run-$node" \
            2>"$OUT/proxy-$node.log" &
        PIDS+=($!)
        eval "PROXY_${node^^}=$!"
        PORTS+=("$port")
    done
fi
for port in "${PORTS[@]}"; do
    for _ in $(seq 1 100); do curl -sf "127.0.0.1:$port/ready" >/dev/null && break; sleep 0.1; done
    curl -sf "127.0.0.1:$port/ready" >/dev/null || { echo "proxy on $port not ready" >&2; exit 1; }
done
if [ -n "$SOCKMAP" ]; then
    for port in 14193 14194; do
        said=$(curl -s "127.0.0.1:$port/config_dump" | grep -Eo '"sockmap": *"[^"]*"' | sed -n 1p)
        case $said in
            *"\"${SOCKMAP_FLAG:-on}"*) ;;
            *) echo "sockmap not ${SOCKMAP_FLAG:-on} for the proxy on $port: $said" >&2; exit 1 ;;
        esac
    done
fi
if [ -n "$KTLS" ]; then
    # Kernel TLS on node-a and node-b, off on node-c and node-d: the two mesh paths differ
    # by the flag alone.
    for port in 14191 14192 14193 14194; do
        want=$([ "$port" -le 14192 ] && echo true || echo false)
        said=$(curl -s "127.0.0.1:$port/config_dump" | python3 -c 'import json,sys; k=json.load(sys.stdin)["kernel_tls"]; print(str(k["enabled"]).lower(), k["why"])')
        [ "${said%% *}" = "$want" ] || { echo "kernel TLS on the proxy on $port: $said (wanted enabled=$want)" >&2; exit 1; }
    done
fi

# Each proxy redirects its meshed pods ($REDIRECT).
# Peak memory of start-up alone, before any traffic.
grep VmHWM "/proc/$PROXY_A/status" | sed 's/VmHWM/VmHWMStart/' > "$OUT/mem-start-proxy-A.txt"
grep VmHWM "/proc/$PROXY_B/status" | sed 's/VmHWM/VmHWMStart/' > "$OUT/mem-start-proxy-B.txt"

# --- server applications -------------------------------------------------------------------
start_servers "$P-srv" srv
NGINX_SRV=${PIDS[-2]}
start_servers "$P-sdir" sdir
NGINX_SDIR=${PIDS[-2]}
start_servers "$P-srv2" srv2
NGINX_SRV2=${PIDS[-2]}
if [ -n "$SECOND" ]; then
    start_servers "$P-srv3" srv3
    NGINX_SRV3=${PIDS[-2]}
fi
# Two plain TCP relays per service (64 KiB buffers, as the proxies' copies), in a cgroup of
# their own so that their CPU (every forked child included) is read from cpu.stat.
relay() { # netns listen-addr listen-port target-addr target-port
    in_pod "$CG_R" "$1" socat -b 65536 "TCP-LISTEN:$3,bind=$2,reuseaddr,fork,nodelay" "TCP:$4:$5,nodelay" 2>>"$OUT/relay.log" &
    PIDS+=($!)
}
relay "$P-dir" 127.0.0.1 18080 "$SDIR" 18081
relay "$P-sdir" "$SDIR" 18081 127.0.0.1 8080
relay "$P-dir" 127.0.0.1 15201 "$SDIR" 15202
relay "$P-sdir" "$SDIR" 15202 127.0.0.1 5201
sleep 1
# nginx's one worker in each server pod: what one process in the path costs per request.
NGINX_WORKER_SRV=$(pgrep -P "$NGINX_SRV")
NGINX_WORKER_SDIR=$(pgrep -P "$NGINX_SDIR")
NGINX_WORKER_SRV2=$(pgrep -P "$NGINX_SRV2")
NGINX_WORKER_SRV3=$([ -n "$SECOND" ] && pgrep -P "$NGINX_SRV3" || echo "")
# The policy path's route and authorization reached the proxies: the route's metrics count
# a request, and the Server's policy allowed it.
for _ in $(seq 1 100); do
    client "$P-cli" curl -sf "http://$WEB:8080/1k" -o /dev/null \
        && curl -s 127.0.0.1:14191/metrics | grep -q '^outbound_http_route_request_statuses_total.*route_name="web"' \
        && curl -s 127.0.0.1:14192/metrics | grep -q '^inbound_http_authz_allow_total.*authz_name="client-only"' \
        && break
    sleep 0.2
done
curl -s 127.0.0.1:14191/metrics | grep -q 'route_name="web"' || { echo "the policy path's route never arrived" >&2; exit 1; }

TICK=$(getconf CLK_TCK)

declare -A CLIENT=([direct]=$P-dir [relay]=$P-dir [mesh]=$P-cli [policy]=$P-cli [sockmap]=$P-cli3 [connect]=$P-cli3)
declare -A HTTP=([direct]=$SDIR:8080 [relay]=127.0.0.1:18080 [mesh]=$SRV:8080 [policy]=$WEB:8080 [sockmap]=$SRV3:8080 [connect]=$SRV3:8080)
declare -A IPERF=([direct]="$SDIR -p 5201" [relay]="127.0.0.1 -p 15201" [mesh]="$SRV -p 5201" [sockmap]="$SRV3 -p 5201" [connect]="$SRV3 -p 5201")
declare -A NGINX_WORKER=([direct]=$NGINX_WORKER_SDIR [relay]=$NGINX_WORKER_SDIR [mesh]=$NGINX_WORKER_SRV [policy]=$NGINX_WORKER_SRV2 [sockmap]=$NGINX_WORKER_SRV3 [connect]=$NGINX_WORKER_SRV3)

run_oha() { # path keepalive(yes|no|opaque: new connections to the opaque port) file
    local extra=() url=${HTTP[$1]}
    [ "$2" != yes ] && extra=(--disable-keepalive)
    [ "$2" = opaque ] && url=${url%:8080}:8081
    in_pod "${CG[$1]}" "${CLIENT[$1]}" "$OHA" -z 15s -q 1000 -c 16 --latency-correction --no-tui --output-format json \
        "${extra[@]}" "http://$url/1k" > "$3"
}

# CPU of what is in the path besides the client and server, in microseconds: both proxies
# (utime + stime) for the mesh, the relays' cgroup for relay, nothing for direct.
path_cpu() { # path
    case $1 in
        mesh|policy) echo $(( ($(cpu "$PROXY_A") + $(cpu "$PROXY_B")) * 1000000 / TICK )) ;;
        sockmap|connect) echo $(( ($(cpu "$PROXY_C") + $(cpu "$PROXY_D")) * 1000000 / TICK )) ;;
        relay) awk '$1 == "usage_usec" {print $2}' "$CG_R/cpu.stat" ;;
        *) echo 0 ;;
    esac
}

if [ "${PROFILE:-}" = syscalls ]; then
    # System calls of each proxy per request under keep-alive load through the mesh
    # (PROFILE_KA=no: a new connection per request), counted by the kernel's tracepoints
    # over the whole oha run; then stop.
    events=writev,write,sendmsg,sendto,read,readv,recvfrom,recvmsg,epoll_wait,epoll_ctl,futex,accept4,connect,close
    events=$(printf 'syscalls:sys_enter_%s,' ${events//,/ }); events=${events%,}
    perf stat -x, -e "$events" -p "$PROXY_A" -o "$OUT/syscalls-a.csv" &
    stat_a=$!
    perf stat -x, -e "$events" -p "$PROXY_B" -o "$OUT/syscalls-b.csv" &
    stat_b=$!
    sleep 0.5
    run_oha mesh "${PROFILE_KA:-yes}" "$OUT/oha-syscalls.json"
    kill -INT "$stat_a" "$stat_b"; wait "$stat_a" "$stat_b" || true
    python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
n = sum(json.load(open(f"{out}/oha-syscalls.json"))["statusCodeDistribution"].values())
print(f"{n} requests; system calls per request")
print(f"{'':12} {'node-a':>8} {'node-b':>8}")
rows = {}
for side in "ab":
    for line in open(f"{out}/syscalls-{side}.csv"):
        f = line.strip().split(",")
        if len(f) > 2 and f[2].startswith("syscalls:sys_enter_") and f[0].isdigit():
            rows.setdefault(f[2].removeprefix("syscalls:sys_enter_"), {})[side] = int(f[0])
for name, v in rows.items():
    a, b = v.get("a", 0) / n, v.get("b", 0) / n
    if a or b:
        print(f"{name:12} {a:8.2f} {b:8.2f}")
PY
    exit 0
fi

if [ "${PROFILE:-}" = iperf-syscalls ]; then
    # System calls of the two proxies of the mesh path (and, with KTLS=1, of the connect
    # path) per GB of one iperf3 stream, by the kernel's tracepoints; then stop. A count
    # that does not depend on how fast the machine is: what kernel TLS and splice change.
    events=writev,write,sendmsg,sendto,read,readv,recvfrom,recvmsg,splice,epoll_wait,futex,brk,mmap,munmap,madvise
    events=$(printf 'syscalls:sys_enter_%s,' ${events//,/ }); events=${events%,}
    for path in mesh ${KTLS:+connect}; do
        pids=$([ "$path" = mesh ] && echo "$PROXY_A,$PROXY_B" || echo "$PROXY_C,$PROXY_D")
        perf stat -x, -e "$events" -p "$pids" -o "$OUT/syscalls-iperf-$path.csv" &
        stat=$!
        sleep 0.5
        # shellcheck disable=SC2086 # host and port are two words
        in_pod "${CG[$path]}" "${CLIENT[$path]}" iperf3 -c ${IPERF[$path]} -t 10 -J > "$OUT/iperf-syscalls-$path.json"
        kill -INT "$stat"; wait "$stat" || true
    done
    python3 - "$OUT" ${KTLS:+connect} <<'PY'
import json, sys
out, paths = sys.argv[1], ["mesh"] + sys.argv[2:]
rows, gb = {}, {}
for p in paths:
    gb[p] = json.load(open(f"{out}/iperf-syscalls-{p}.json"))["end"]["sum_received"]["bytes"] / 1e9
    for line in open(f"{out}/syscalls-iperf-{p}.csv"):
        f = line.strip().split(",")
        if len(f) > 2 and f[2].startswith("syscalls:sys_enter_") and f[0].isdigit():
            rows.setdefault(f[2].removeprefix("syscalls:sys_enter_"), {})[p] = int(f[0]) / gb[p]
print("system calls of both proxies per GB of one iperf3 stream ("
      + ", ".join(f"{p}: {gb[p]:.2f} GB" for p in paths) + ")")
print(f"{'':12}" + "".join(f"{p:>12}" for p in paths))
for name, v in rows.items():
    if any(v.values()):
        print(f"{name:12}" + "".join(f"{v.get(p, 0):12.0f}" for p in paths))
print(f"{'total':12}" + "".join(f"{sum(v.get(p, 0) for v in rows.values()):12.0f}" for p in paths))
PY
    exit 0
fi

if [ -n "${PROFILE:-}" ]; then
    # Profile both proxies under load through the mesh (PROFILE=iperf: one iperf3 stream;
    # otherwise oha, keep-alive unless PROFILE_KA=no), then stop.
    perf record -F 999 -e cpu-clock --call-graph "${CALL_GRAPH:-fp}" -p "$PROXY_A,$PROXY_B" -o "$OUT/perf.data" -- sleep 8 2>/dev/null &
    perf_pid=$!
    if [ "$PROFILE" = iperf ]; then
        client "$P-cli" iperf3 -c "$SRV" -p 5201 -t 10 -J > "$OUT/iperf-profile.json"
    else
        run_oha mesh "${PROFILE_KA:-yes}" "$OUT/oha-profile.json"
    fi
    wait "$perf_pid" || true
    perf report -i "$OUT/perf.data" --no-children --percent-limit 1.5 --stdio 2>/dev/null | grep -v '^$' | head -150 > "$OUT/perf.txt"
    echo "profile: $OUT/perf.txt"
    exit 0
fi

# The whole machine's busy CPU (user, nice, system, irq, softirq), in microseconds: what
# the bulk path's endpoints and kernel cost besides the relays or proxies.
machine_busy() { awk -v t="$TICK" '$1 == "cpu" {printf "%.0f\n", ($2 + $3 + $4 + $7 + $8) * 1000000 / t}' /proc/stat; }

for round in $(seq 1 "$ROUNDS"); do
    # The cryptographic floor in this round: AES-128-GCM seal and open per GB, as the
    # proxies' rustls/aws-lc does them (bench/src/crypto_floor.rs).
    "$BIN/crypto-floor" --gb 2 > "$OUT/crypto-$round.json"
    # The sockmap path right after the mesh path, so that the two are side by side in time.
    for path in direct relay mesh $SECOND policy; do
        for ka in yes no ${KTLS:+opaque}; do
            [ "${ONLY:-}" = iperf ] && continue
            [ "$path" = relay ] && [ "$ka" != yes ] && continue
            [ "$path" = policy ] && [ "$ka" = opaque ] && continue
            c0=$(path_cpu $path); n0=$(cpu "${NGINX_WORKER[$path]}")
            # Halfway through, what TCP carried on the client's in-pod hop (ss): next to
            # nothing where sockmap moves the bytes.
            (sleep 7; ip netns exec "${CLIENT[$path]}" ss -tinH state established '( dport = :4140 )' \
                > "$OUT/ss-$path-ka$ka-$round.txt" 2>&1) &
            run_oha "$path" "$ka" "$OUT/oha-$path-ka$ka-$round.json"
            c1=$(path_cpu $path); n1=$(cpu "${NGINX_WORKER[$path]}")
            echo "$(( c1 - c0 ))" > "$OUT/cpu-$path-ka$ka-$round.usec"
            echo "$(( (n1 - n0) * 1000000 / TICK ))" > "$OUT/cpu-nginx-$path-ka$ka-$round.usec"
        done
        [ "$path" = policy ] && continue   # HTTP only: a route is per request
        c0=$(path_cpu $path); m0=$(machine_busy)
        # shellcheck disable=SC2086 # host and port are two words
        in_pod "${CG[$path]}" "${CLIENT[$path]}" iperf3 -c ${IPERF[$path]} -t 10 -J > "$OUT/iperf-$path-$round.json"
        c1=$(path_cpu $path); m1=$(machine_busy)
        echo "$(( c1 - c0 ))" > "$OUT/cpu-iperf-$path-$round.usec"
        echo "$(( m1 - m0 ))" > "$OUT/cpu-machine-iperf-$path-$round.usec"
    done
done
# Each proxy's memory right after the last run, then at rest (after 12 s idle: the proxy
# returns its free heap pages every 10 s), with where the resident memory is by mapping.
for node in A B; do
    pid_var=PROXY_$node
    grep -E 'VmRSS' "/proc/${!pid_var}/status" | sed 's/VmRSS/VmRSSBusy/' > "$OUT/mem-proxy-$node.txt"
done
sleep 12
for node in A B; do
    pid_var=PROXY_$node
    grep -E 'VmRSS|VmHWM' "/proc/${!pid_var}/status" >> "$OUT/mem-proxy-$node.txt"
    awk '/^[0-9a-f]+-[0-9a-f]+ / {name=$6} /^Rss:/ {rss[name]+=$2} END {for (n in rss) print rss[n] " kB " (n == "" ? "[anon]" : n)}' \
        "/proc/${!pid_var}/smaps" | sort -rn | head -15 > "$OUT/smaps-proxy-$node.txt"
done

[ "${ONLY:-}" = iperf ] && { python3 "$ROOT/bench/mesh/summarize.py" --bulk "$OUT" "$ROUNDS" | tee "$OUT/summary.md"; exit 0; }
{ echo "Redirection: $REDIRECT${SOCKMAP:+ (and a sockmap path)}${KTLS:+ (and a path with --kernel-tls off)}"; python3 "$ROOT/bench/mesh/summarize.py" "$OUT" "$ROUNDS"; } | tee "$OUT/summary.md"
