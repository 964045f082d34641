#!/usr/bin/env bash
# Ambit's test command: installs what the suite needs on a fresh Debian 12 machine (skipping
# what is already there), then runs every check CI gates on.
#
#   ./scripts/test.sh
#
# Needs root for the package installs (CI and the developer machines run as root).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n==> %s\n' "$*"; }

# --- Debian packages -----------------------------------------------------------------
# protobuf-compiler: tonic/prost code generation; openssl: chain checks in the tests;
# iproute2, nftables, curl: the network-namespace tests (pods as netns, redirection rules,
# a real HTTP client through the mesh); containernetworking-plugins: the real CNI plugins
# (bridge, host-local, loopback) ambit-cni is chained with; python3: test clients.
packages=(protobuf-compiler openssl iproute2 nftables curl containernetworking-plugins python3
    python3-venv)
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

# --- Rust components -----------------------------------------------------------------
for c in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
done

# The eBPF programs: nightly rust-src and bpf-linker (ebpf/build.rs compiles them).
log "eBPF toolchain"
./scripts/install-bpf-toolchain.sh
rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^clippy' \
    || rustup component add clippy --toolchain nightly
rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^rustfmt' \
    || rustup component add rustfmt --toolchain nightly

if [ "$(id -u)" != 0 ]; then
    echo "the network-namespace tests need root (as on the developer machines and in CI)" >&2
    exit 1
fi

# bpffs for the eBPF pins (the loader mounts it too; once here, before tests run in
# parallel).
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf

# --- Checks --------------------------------------------------------------------------
log "cargo fmt --check"
cargo fmt --all -- --check
cargo +nightly fmt --manifest-path ebpf/programs/Cargo.toml -- --check

log "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
log "cargo clippy (eBPF programs, bpfel-unknown-none)"
(cd ebpf/programs && cargo +nightly clippy --locked --release -Z build-std=core \
    --target bpfel-unknown-none -- -D warnings)

# The Helm charts: rendered by the real Helm v4 library, validated against the Kubernetes
# schemas and the CRDs' own; the Rust end-to-end tests find the venv's python through
# AMBIT_PYTHON (tests/tests/chart.rs runs the real binaries with the chart's settings).
log "Helm charts"
AMBIT_PYTHON="$(./scripts/install-python-tools.sh)"
export AMBIT_PYTHON
"$(dirname "$AMBIT_PYTHON")/yamllint" --strict -c helm/.yamllint helm/
(cd tests/helm && "$AMBIT_PYTHON" -m pytest -q -p no:cacheprovider)
./scripts/check-dockerfile.sh

log "cargo test"
cargo test --workspace --locked

log "all checks passed"
