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

if [ "$(id -u)" != 0 ]; then
    echo "the network-namespace tests need root (as on the developer machines and in CI)" >&2
    exit 1
fi

# --- What the suite needs: Debian packages, the eBPF toolchain, rustfmt and clippy ---------
./scripts/install-deps.sh --tests

# --- Checks --------------------------------------------------------------------------
log "cargo fmt --check"
cargo fmt --all -- --check
cargo +nightly fmt --manifest-path ebpf/programs/Cargo.toml -- --check
cargo fmt --manifest-path fuzz/Cargo.toml -- --check

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
# The binaries the demo's end-to-end test (cli/tests/demo.rs) runs beside `ambit`.
cargo build --locked -p ambit-control -p ambit-proxy
# The chart's images, from these debug binaries (stripped), for tests/tests/images.rs;
# a release build's sizes are in BENCHMARKS.md.
./scripts/images.sh --profile debug
cargo test --workspace --locked
# The whole end-to-end suite again with sockmap on the in-pod hops (eBPF redirection,
# --sockmap on for every proxy: tests/src/sockmap.rs); about 5 minutes.
log "end-to-end suite with sockmap (AMBIT_TEST_SOCKMAP=on)"
AMBIT_TEST_SOCKMAP=on cargo test --locked -p ambit-e2e

# And with kernel TLS for opaque streams: this kernel has no TLS, so the suites that carry
# opaque streams run again in a guest booting Debian's own kernel, where every proxy must
# use it (scripts/ktls-tests.sh; ~3 minutes, emulated).
log "kernel TLS: suites in a guest with Debian's kernel (AMBIT_KERNEL_TLS=on)"
./scripts/ktls-tests.sh

# Every fuzz target for a short bounded time from the committed corpus (docs/FUZZING.md);
# a longer run by hand is `./scripts/fuzz.sh 300`.
log "fuzzing (20 s a target)"
./scripts/fuzz.sh 20

log "all checks passed"
