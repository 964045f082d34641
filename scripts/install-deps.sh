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
#
# Needs root for the package installs (CI and the developer machines run as root).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n==> %s\n' "$*"; }

# protobuf-compiler: tonic/prost code generation; iproute2, nftables: pods as network
# namespaces and the redirection fallback; curl: a real HTTP client in a pod.
packages=(protobuf-compiler iproute2 nftables curl)
if [ "${1:-}" = --tests ]; then
    # openssl: chain checks; containernetworking-plugins: the real CNI plugins (bridge,
    # host-local, loopback) ambit-cni is chained with; python3: test clients and the Helm
    # chart checks; prometheus: scrapes the demo's node proxies in cli/tests/demo.rs;
    # qemu-system-x86, busybox-static, kmod: the guest with Debian's kernel that the kernel
    # TLS tests run in (scripts/vm/run.sh, which fetches the kernel itself).
    packages+=(openssl containernetworking-plugins python3 python3-venv prometheus
        qemu-system-x86 busybox-static kmod)
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

if [ "${1:-}" = --tests ]; then
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

# bpffs for the eBPF pins (the proxy mounts it too; once here, before tests run in
# parallel).
if [ "$(id -u)" = 0 ]; then
    mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
fi
