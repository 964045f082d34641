#!/usr/bin/env bash
# The opaque transport with kernel TLS, proven where the kernel has TLS: the kernels of
# these machines are built without it (CONFIG_TLS unset), so the tests that carry opaque
# streams run again in a guest booting Debian's own kernel (scripts/vm/run.sh), with
# AMBIT_KERNEL_TLS=on: every proxy must use kernel TLS (none may fall back), and the
# kTLS unit tests must take their kernel branch. The guest is emulated here (no hardware
# KVM), so the set is what exercises the transport, not the whole suite:
#   - node-proxy: kTLS against a rustls peer, splice with half-close, the transport's
#     client against a peer with and without it;
#   - datapath: opaque streams pod to pod (IPv4 and IPv6, server-speaks-first) through two
#     proxies, counted as kernel_tls on both;
#   - handover: opaque streams across a hitless hand-over and a drain;
#   - adversarial: the transport's listener against bad frames and targets.
# The whole e2e suite (all but scale.rs) also passed in the guest by hand on 4 December
# 2026 (~17 min), but not reliably: in a CI run the redirection suite's first pod-to-pod
# connection took over the proxy's 3-s connect timeout, emulated. So CI runs this set.
#
#   ./scripts/ktls-tests.sh        (root; ~5 min; scripts/test.sh runs it)
set -euo pipefail
cd "$(dirname "$0")/.."

list=target/vm/tests.list
mkdir -p target/vm
# The test binaries (built on the host; the guest only runs them), with their filters.
binaries() { # cargo test selection...
    cargo test --locked --no-run --message-format=json "$@" 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    j = json.loads(line)
    if j.get("reason") == "compiler-artifact" and j.get("executable") and j["profile"]["test"]:
        print(j["executable"])'
}
cargo build --locked -q -p ambit-control -p ambit-proxy
{
    echo "$(binaries -p ambit-proxy --lib) ktls:: proxy::transport::"
    echo "$(binaries -p ambit-e2e --test datapath) --test-threads=2"
    echo "$(binaries -p ambit-e2e --test handover) --test-threads=1"
    echo "$(binaries -p ambit-e2e --test adversarial) opaque_transport"
} > "$list"
cat "$list"
# The guest panics on a soft lockup (scripts/vm/run.sh: softlockup_panic=1) and prints the
# stuck CPU's trace. A CI run once had both emulated CPUs stuck in the kernel at the start
# of the hand-over suite for 25 minutes, which never happened here in many runs: a lockup
# of the emulated kernel is not a test's verdict, so the set runs once more after one,
# with the trace kept in the log. A test that fails fails at once.
console=target/vm/console.log
run() {
    AMBIT_KERNEL_TLS=on AMBIT_VM_TIMEOUT=${AMBIT_VM_TIMEOUT:-1500} RUST_BACKTRACE=0 \
        scripts/vm/run.sh -- scripts/vm/tests.sh "$list" 2>&1 | tee "$console"
    return "${PIPESTATUS[0]}"
}
rc=0
run || rc=$?
if [ "$rc" != 0 ] && grep -q "BUG: soft lockup" "$console"; then
    echo "ktls-tests: the guest's kernel locked up (trace above), not a test; once more" >&2
    rc=0
    run || rc=$?
fi
exit "$rc"
