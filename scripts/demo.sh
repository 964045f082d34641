#!/usr/bin/env bash
# See Ambit run on this machine with one command: installs what it needs (the same steps
# the tests use), builds the release binaries, and runs `ambit demo` — two nodes, the
# control plane, two node proxies and a sample application with load, all in network
# namespaces; `ambit stat` refreshes until Ctrl-C, which removes everything again.
#
#   sudo ./scripts/demo.sh          (or: sudo ./scripts/demo.sh up, then ambit ... , then down)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "the demo makes network namespaces, cgroups and eBPF programs: run it as root (sudo)" >&2
    exit 1
fi
./scripts/install-deps.sh
printf '\n==> %s\n' "building the release binaries (a few minutes the first time)"
cargo build --release --locked -p ambit-control -p ambit-proxy -p ambit-cli
printf '\n==> %s\n' "target/release/ambit demo $*"
exec target/release/ambit demo "$@"
