#!/usr/bin/env bash
# Installs what building and running Ambit needs on a fresh Debian 12 machine, skipping what
# is already there; shared by the demo (scripts/demo.sh) and the tests (scripts/test.sh).
#
#   ./scripts/install-deps.sh           build and run: protoc, iproute2, nftables, curl,
#                                       the eBPF toolchain (nightly rust-src, bpf-linker)
#   ./scripts/install-deps.sh --tests   and what only the test suite needs: openssl, the
#                                       real CNI plugins, python3 with venv, Prometheus,
#                                       rustfmt and clippy, cargo-fuzz, qemu (the
#                                       kernel TLS guest)
#   ./scripts/install-deps.sh --bench   and what the benchmarks (bench/*/run.sh) run:
#                                       nginx-light, iperf3, socat, perf, python3, the
#                                       real CNI plugins, openssl, bc, and
#                                       oha from crates.io at the version pinned below
#                                       (OHA_VERSION; its build takes a few minutes)
#
# --tests and --bench go together. Needs root for the package installs (CI and the developer machines run as root).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n==> %s\n' "$*"; }

tests= bench=
for arg in "$@"; do
    case $arg in
        --tests) tests=1 ;;
        --bench) bench=1 ;;
        *) echo "install-deps.sh: unknown option $arg (use --tests, --bench or none)" >&2; exit 2 ;;
    esac
done
# The HTTP load generator of the benchmarks, pinned so that runs compare.
OHA_VERSION=${OHA_VERSION:-1.16.0}

# protobuf-compiler: tonic/prost code generation; iproute2, nftables: pods as network
# namespaces and the redirection fallback; curl: a real HTTP client in a pod.
packages=(protobuf-compiler iproute2 nftables curl)
if [ -n "$tests" ]; then
    # openssl: chain checks; containernetworking-plugins: the real CNI plugins (bridge,
    # host-local, loopback) ambit-cni is chained with; python3: test clients and the Helm
    # chart checks; prometheus: scrapes the demo's node proxies in cli/tests/demo.rs;
    # qemu-system-x86, busybox-static, kmod: the guest with Debian's kernel that the kernel
    # TLS tests run in (scripts/vm/run.sh, which fetches the kernel itself); podman, runc
    # (crun refuses these machines' hybrid cgroups), binutils (objcopy): the images that
    # scripts/images.sh builds and tests/tests/images.rs runs.
    packages+=(openssl containernetworking-plugins python3 python3-venv prometheus
        qemu-system-x86 busybox-static kmod podman runc binutils)
fi
if [ -n "$bench" ]; then
    # nginx-light: the upstream every benchmark serves; iperf3: bulk throughput; socat: the
    # two plain relays bench/mesh compares with; linux-perf: its system-call counts and
    # profiles; python3: the summaries.
    # containernetworking-plugins: the soak's pods; openssl, bc: bench/pods.
    packages+=(nginx-light iperf3 socat linux-perf python3 containernetworking-plugins openssl bc)
fi
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    log "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The eBPF programs: nightly rust-src and bpf-linker (ebpf/build.rs compiles them).
log "eBPF toolchain"
./scripts/install-bpf-toolchain.sh

if [ -n "$tests" ]; then
    for c in rustfmt clippy; do
        rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
        rustup component list --toolchain nightly --installed 2>/dev/null | grep -q "^$c" \
            || rustup component add "$c" --toolchain nightly
    done
    # cargo-fuzz (runs on the nightly toolchain installed above): scripts/fuzz.sh.
    if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
        log "installing cargo-fuzz ${CARGO_FUZZ_VERSION:-0.13.2}"
        cargo install cargo-fuzz --locked --version "${CARGO_FUZZ_VERSION:-0.13.2}"
    fi
fi

if [ -n "$bench" ]; then
    oha=$(command -v oha || echo "$HOME/.cargo/bin/oha")
    if [ "$("$oha" --version 2>/dev/null)" != "oha $OHA_VERSION" ]; then
        log "installing oha $OHA_VERSION (a few minutes)"
        cargo install oha --locked --version "$OHA_VERSION"
    fi
fi

# bpffs for the eBPF pins (the proxy mounts it too; once here, before tests run in
# parallel).
if [ "$(id -u)" = 0 ]; then
    mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
fi
