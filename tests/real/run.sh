#!/bin/bash
# Runs every real-program test; each prints one PASS/FAIL line. Exits
# non-zero if any failed. Usage: tests/real/run.sh [name...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

names=("$@")
[ ${#names[@]} -gt 0 ] || names=(python sqlite git sort cxx redis)

failed=0
for n in "${names[@]}"; do
    rc=0
    # The scripts bound their own commands; this outer limit catches a hang
    # anywhere else in a script.
    out=$(timeout -k 10 300 "tests/real/$n.sh" 2>&1) || rc=$?
    line=$(grep -E "^(PASS|FAIL) real/$n" <<<"$out" | tail -n 1) || true
    if [ "$rc" -eq 0 ] && [ "${line#PASS}" != "$line" ]; then
        echo "$line"
    else
        failed=$((failed + 1))
        if [ "${line#FAIL}" != "$line" ]; then
            echo "$line"
        else
            echo "FAIL real/$n: script exited with status $rc: $(tail -n 1 <<<"$out")"
        fi
    fi
done
[ "$failed" -eq 0 ]
