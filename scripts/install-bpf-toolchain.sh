#!/usr/bin/env bash
# Installs what building the eBPF programs needs, skipping what is already there:
# the nightly toolchain's rust-src (for -Z build-std=core) and bpf-linker, linked against
# the nightly's own libLLVM (Debian 12 has no LLVM 21-23; see shared/notes/environment.md).
#
#   ./scripts/install-bpf-toolchain.sh
set -euo pipefail

BPF_LINKER_VERSION="${BPF_LINKER_VERSION:-0.13.0}"

rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
rustup component list --toolchain nightly --installed | grep -q '^rust-src' \
    || rustup component add rust-src --toolchain nightly

if command -v bpf-linker >/dev/null 2>&1; then
    exit 0
fi

llvm_dir="$(rustc +nightly --print sysroot)/lib"
llvm_so="$(ls "$llvm_dir"/libLLVM-*-rust-*.so | head -n1)"
llvm_lib="$(basename "$llvm_so" .so)"            # libLLVM-22-rust-1.97.0-nightly
llvm_major="$(echo "$llvm_lib" | sed -E 's/^libLLVM-([0-9]+)-.*/\1/')"
echo "installing bpf-linker ${BPF_LINKER_VERSION} against ${llvm_lib}" >&2
RUSTFLAGS="-C link-arg=-L$llvm_dir -C link-arg=-l${llvm_lib#lib} -C link-arg=-Wl,-rpath,$llvm_dir" \
    cargo +nightly install bpf-linker --locked --version "$BPF_LINKER_VERSION" \
    --no-default-features --features "llvm-${llvm_major},no-llvm-linking"
