#!/usr/bin/env bash
# Builds the cargo-fuzz targets (fuzz/, docs/FUZZING.md) and runs each for a bounded time,
# starting from the minimized corpus committed in fuzz/corpus/<target>/, as many at once as
# there are cores. Fails if a target finds a crash, a hang or an input that blows up
# memory; that input is left in fuzz/artifacts/<target>/.
#
#   ./scripts/fuzz.sh                        every target, 20 s each
#   ./scripts/fuzz.sh 300                    every target, 5 minutes each
#   ./scripts/fuzz.sh 600 local_yaml detect  these targets, 10 minutes each
#
# What a run finds that is new goes to fuzz/target/corpus/<target>/ (git-ignored), which the
# next run starts from too; the committed corpus changes only by hand (docs/FUZZING.md).
#
# AMBIT_FUZZ_SANITIZER=address builds with AddressSanitizer instead of none.
# AMBIT_FUZZ_JOBS: targets run at once (default: the number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-20}"
shift || true
sanitizer="${AMBIT_FUZZ_SANITIZER:-none}"
jobs="${AMBIT_FUZZ_JOBS:-$(nproc)}"

log() { printf '\n==> %s\n' "$*"; }

if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    ./scripts/install-deps.sh --tests
fi

# The fuzz targets never load the eBPF programs: ambit-ebpf embeds an empty object instead
# of building them (which needs bpf-linker and a nightly build of its own).
mkdir -p fuzz/target
: >fuzz/target/empty-ebpf.o
export AMBIT_EBPF_OBJECT="$PWD/fuzz/target/empty-ebpf.o"

# Release with debug assertions (cargo-fuzz's default; the profile is fuzz/Cargo.toml's),
# 16 codegen units rather than cargo-fuzz's one: the build is what CI pays for most.
build=(-s "$sanitizer" --codegen-units 16)
bin="fuzz/target/x86_64-unknown-linux-gnu/release"

if (($#)); then
    targets=("$@")
else
    mapfile -t targets < <(cargo +nightly fuzz list)
fi

log "building ${#targets[@]} fuzz targets (sanitizer: $sanitizer)"
start=$(date +%s)
cargo +nightly fuzz build "${build[@]}"
echo "built in $(($(date +%s) - start)) s"

# Runs one target; its log goes to fuzz/target/logs/<target>.log. The binaries are run
# directly rather than through `cargo fuzz run`, which would build again first.
run() {
    local t="$1" out="fuzz/target/logs/$1.log"
    mkdir -p "fuzz/target/corpus/$t" "fuzz/corpus/$t" "fuzz/artifacts/$t"
    # -timeout: one input taking 10 s is a hang; -rss_limit_mb: an input blowing up memory
    # is a finding too. The first corpus directory takes what the run finds.
    if ! "$bin/$t" "fuzz/target/corpus/$t" "fuzz/corpus/$t" \
        -artifact_prefix="fuzz/artifacts/$t/" -max_total_time="$seconds" -timeout=10 \
        -rss_limit_mb=2048 -print_final_stats=1 >"$out" 2>&1; then
        tail -n 60 "$out"
        echo "fuzz target $t failed; the input is in fuzz/artifacts/$t/, the log in $out" >&2
        echo "reproduce: $bin/$t fuzz/artifacts/$t/<file>" >&2
        return 1
    fi
    local runs cov files
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out" | tail -n1)
    cov=$(grep -o 'cov: [0-9]*' "$out" | tail -n1 | cut -d' ' -f2)
    files=$(find "fuzz/target/corpus/$t" "fuzz/corpus/$t" -type f | wc -l)
    printf '%-18s %10s runs in %ss, coverage %s, corpus %s files\n' \
        "$t" "${runs:-?}" "$seconds" "${cov:-?}" "$files"
}

log "running each for $seconds s, $jobs at a time"
mkdir -p fuzz/target/logs
failed=0
running=0
for t in "${targets[@]}"; do
    if ((running >= jobs)); then
        wait -n || failed=1
        running=$((running - 1))
    fi
    run "$t" &
    running=$((running + 1))
done
while ((running > 0)); do
    wait -n || failed=1
    running=$((running - 1))
done
echo "fuzzing done in $(($(date +%s) - start)) s"
exit "$failed"
