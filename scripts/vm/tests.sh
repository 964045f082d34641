#!/usr/bin/env bash
# Runs in the guest (scripts/ktls-tests.sh starts it): each line of the list is a test
# binary and its arguments; every one runs, and the script fails if any failed.
set -uo pipefail
list=$1
failed=()
while read -r bin args; do
    [ -n "$bin" ] || continue
    echo "--- $(basename "$bin") $args"
    start=$(date +%s)
    # shellcheck disable=SC2086 # the arguments are words
    if ! "$bin" $args; then
        failed+=("$(basename "$bin") $args")
    fi
    echo "--- $(basename "$bin"): $(( $(date +%s) - start )) s"
done < "$list"
if [ ${#failed[@]} -gt 0 ]; then
    printf 'failed in the guest: %s\n' "${failed[@]}"
    exit 1
fi
