#!/bin/bash
# Runs the whole suite from the repo root: every cmocka binary out/tests/test_*
# (each of its tests counts), the OS-boundary check, and the real-program
# tests (one each). Last line: "tests: N passed, M failed". Exits non-zero if
# anything failed or any binary crashed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CMOCKA_MESSAGE_OUTPUT=stdout

passed=0
failed=0
crashed=0
log=$(mktemp -d "${TMPDIR:-/tmp}/hakmem-tests.XXXXXX")
trap 'rm -rf "$log"' EXIT

count() { grep -cE "$1" "$2" || true; }

shopt -s nullglob
bins=()
for b in out/tests/test_*; do
    [ -f "$b" ] && [ -x "$b" ] && bins+=("$b")
done
if [ ${#bins[@]} -eq 0 ]; then
    echo "FAIL no test binaries in out/tests (run make tests)"
    failed=$((failed + 1))
fi

for b in "${bins[@]}"; do
    out=$log/$(basename "$b").out
    rc=0
    timeout -k 10 300 "$b" >"$out" 2>&1 || rc=$?
    # Summary lines: "[  PASSED  ] N test(s)." and "[  FAILED  ] N test(s), ..."
    p=$(grep -oE '\[  PASSED  \] [0-9]+ test' "$out" | grep -oE '[0-9]+' | tail -n 1) || true
    f=$(grep -oE '\[  FAILED  \] [0-9]+ test' "$out" | grep -oE '[0-9]+' | tail -n 1) || true
    summary=1
    if [ -z "$p" ] && [ -z "$f" ]; then
        # No summary (crash or hang): count the tests that reported.
        summary=0
        p=$(count '^\[       OK \]' "$out")
        f=$(count '^\[  FAILED  \] [^0-9]' "$out")
    fi
    p=${p:-0}
    f=${f:-0}
    why=
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        why="timed out"
    elif [ "$rc" -gt 128 ]; then
        why="crashed with signal $((rc - 128))"
    elif [ "$summary" -eq 0 ]; then
        why="exited $rc without a cmocka summary"
    elif [ "$rc" -ne "$f" ]; then
        why="exit status $rc but $f failure(s) reported"
    fi
    if [ -n "$why" ]; then
        crashed=$((crashed + 1))
        f=$((f + 1))
    fi
    passed=$((passed + p))
    failed=$((failed + f))
    if [ "$f" -eq 0 ]; then
        echo "PASS $b ($p tests)"
    else
        echo "FAIL $b: $p passed, $f failed${why:+ ($why)}"
        # The failing tests and their messages, and for a crash the tail.
        grep -E '^\[  (FAILED  |ERROR   )\]|^ERROR' "$out" | head -n 40 | sed 's/^/    /' || true
        if [ -n "$why" ]; then
            echo "    last output:"
            tail -n 8 "$out" | sed 's/^/    | /'
        fi
    fi
done

# Project checks, one test each: OS calls only in the OS boundary; make
# install + pkg-config produce a working shared and static link.
for check in tests/check_os_boundary.sh tests/check_install.sh; do
    if "$check"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
    fi
done

# Real programs: one test each, as reported by their PASS/FAIL lines.
tests/real/run.sh | tee "$log/real.out" || true
rp=$(count '^PASS real/' "$log/real.out")
rf=$(count '^FAIL real/' "$log/real.out")
if [ "$rp" -eq 0 ] && [ "$rf" -eq 0 ]; then
    echo "FAIL tests/real/run.sh reported nothing"
    rf=1
fi
passed=$((passed + rp))
failed=$((failed + rf))

echo "tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$crashed" -eq 0 ]
