#!/bin/bash
# Runs real-program tests side by side (TEST_JOBS at a time, default one per
# core, tests/lib.sh); each prints one PASS/FAIL line, here in the order given. Exits
# non-zero if any failed.
# Usage: tests/real/run.sh [name[:check]...] (default: every program once);
# name:check runs it with HAKMEM_CHECK=1 (checked mode), its line marked so.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=tests/lib.sh
source tests/lib.sh

names=("$@")
[ ${#names[@]} -gt 0 ] || names=(redis python sqlite git sort cxx)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/hakmem-real.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# one N OUT: runs test N (name or name:check), its output to OUT, and its
# one line, or a FAIL line saying how it ended, to OUT.line.
one() {
    local n=${1%:check} out=$2 rc=0 line mark='' envs=() t0=$SECONDS
    if [ "$1" != "$n" ]; then
        mark=" (HAKMEM_CHECK=1)"
        envs=(HAKMEM_CHECK=1)
    fi
    # The scripts bound their own commands; this outer limit catches a hang
    # anywhere else in a script.
    timeout -k 10 "$(scaled_limit 3600)" env "${envs[@]}" "tests/real/$n.sh" >"$out" 2>&1 || rc=$?
    line=$(grep -E "^(PASS|FAIL) real/$n" "$out" | tail -n 1) || true
    if [ "$rc" -eq 0 ] && [ "${line#PASS}" != "$line" ]; then
        echo "$line (${mark:+HAKMEM_CHECK=1, }$((SECONDS - t0)) s)"
    elif [ "${line#FAIL}" != "$line" ]; then
        echo "FAIL real/$n$mark:${line#FAIL real/"$n":}"
    else
        echo "FAIL real/$n$mark: script exited with status $rc: $(tail -n 1 "$out")"
    fi >"$out.line"
}

for i in "${!names[@]}"; do
    n=${names[$i]%:check}
    [ -f "tests/real/$n.sh" ] || {
        echo "FAIL real/$n: no tests/real/$n.sh"
        exit 1
    }
    wait_for_slot
    one "${names[$i]}" "$TMP/$i.out" &
done
wait
failed=0
for i in "${!names[@]}"; do
    cat "$TMP/$i.out.line"
    grep -q '^PASS' "$TMP/$i.out.line" || failed=$((failed + 1))
done
[ "$failed" -eq 0 ]
