# Shared by the benchmark scripts (sourced). Each caller sets WORK (a scratch directory)
# and PIDS (an array of the pids it must end), and runs as root.

# Checks the tools the benchmarks run (all of them, so that one install fixes every one
# missing) and builds the release binaries; sets OHA and BIN.
prepare() {
    OHA=${OHA:-$(command -v oha || echo "$HOME/.cargo/bin/oha")}
    local missing=() tool
    for tool in nginx iperf3 nft socat ip perf python3 "$OHA"; do
        command -v "$tool" >/dev/null || [ -x "$tool" ] || missing+=("${tool##*/}")
    done
    if ((${#missing[@]})); then
        echo "the benchmarks need ${missing[*]}: install them with ./scripts/install-deps.sh --bench" >&2
        exit 1
    fi
    cargo build --release -q -p ambit-control -p ambit-proxy -p ambit-cli
    cargo build --release -q -p ambit-bench --bin ambit-topology --bin crypto-floor
    BIN=$PWD/target/release
}

# A scratch directory that nginx's workers (www-data) can read.
scratch_dir() { # prefix
    local dir
    dir=$(mktemp -d "/tmp/$1.XXXXXX")
    chmod 755 "$dir"
    echo "$dir"
}

# Pods as network namespaces <prefix>-<name> on a bridge in <prefix>-br, addressed
# 10.78.0.2, .3, ... in the order given: the topology crate the tests and `ambit demo` use
# (bench/src/topology.rs). The caller removes them with `remove_pods <prefix>` (its cleanup
# trap).
pods_on_bridge() { # prefix name...
    local p=$1
    shift
    "$BIN/ambit-topology" up --prefix "$p" "$@"
}
remove_pods() { # prefix
    "$BIN/ambit-topology" down --prefix "$1" 2>/dev/null || true
}

# The server pod's applications: nginx (1 worker, access log off, a 1 KiB file) on 8080
# and iperf3 -s on 5201, inside netns $1; their pids are added to PIDS.
start_servers() { # netns name
    local ns=$1 name=$2
    mkdir -p "$WORK/www"
    [ -f "$WORK/www/1k" ] || head -c 1024 /dev/zero | tr '\0' 'a' > "$WORK/www/1k"
    cat > "$WORK/nginx-$name.conf" <<CONF
worker_processes 1;
daemon off;
pid $WORK/nginx-$name.pid;
error_log $WORK/nginx-$name-error.log;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 1000000;
    server { listen 8080; listen 8081; root $WORK/www; }
}
CONF
    ip netns exec "$ns" nginx -c "$WORK/nginx-$name.conf" &
    PIDS+=($!)
    ip netns exec "$ns" iperf3 -s -p 5201 >/dev/null 2>&1 &
    PIDS+=($!)
}

# Runs a client process of a pod: in cgroup $1 (where the eBPF programs are attached) and
# in netns $2. Into the cgroup first: `ip netns exec` mounts a sysfs of the netns, which
# hides the cgroup tree.
in_pod() { # cgroup netns cmd...
    sh -c 'cg=$0; ns=$1; shift; echo $$ > "$cg/cgroup.procs" && exec ip netns exec "$ns" "$@"' "$@"
}

# utime + stime of a process, in clock ticks.
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
