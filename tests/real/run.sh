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

# one N: runs test N (name or name:check) and prints its one line, with the
# mark and its time, or a FAIL line saying how it ended.
one() {
    local n=${1%:check} out=$TMP/$1.out rc=0 line mark='' envs=() t0=$SECONDS
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
    fi
}

for n in "${names[@]}"; do
    [ -f "tests/real/${n%:check}.sh" ] || {
        echo "FAIL real/$n: no tests/real/${n%:check}.sh"
        exit 1
    }
done
# Side by side, their lines in the order given (tests/lib.sh's jobs).
JOBS_TMP=$TMP
JOBS_REPORTER="report_lines real"
for n in "${names[@]}"; do
    job_start "$n" one "$n"
done
jobs_flush "$JOBS_REPORTER" all
[ "$lines_failed" -eq 0 ]
