#!/bin/bash
# Runs the whole suite from the repo root: every cmocka binary out/tests/test_*
# and the same tests built with UBSan (out/ubsan/tests) and TSan
# (out/tsan/tests) (each of their tests counts), the project checks (OS
# boundary, install, static analysis), the heap-bug gate, the fuzzers, the out-of-memory
# programs and the real-program tests (one each). Last line: "tests: N passed, M failed". Exits non-zero if
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

# run_bins DIR: every cmocka binary DIR/test_* (each of its tests counts).
run_bins() {
    local dir=$1 b out rc p f summary why
    local bins=()
    shopt -s nullglob
    for b in "$dir"/test_*; do
        [ -f "$b" ] && [ -x "$b" ] && bins+=("$b")
    done
    if [ ${#bins[@]} -eq 0 ]; then
        echo "FAIL no test binaries in $dir (run make tests)"
        failed=$((failed + 1))
    fi
    for b in "${bins[@]}"; do
        out=$log/$(echo "$b" | tr / _).out
        rc=0
        timeout -k 10 600 "$b" >"$out" 2>&1 || rc=$?
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
        # A sanitizer's report fails the binary even if its tests passed.
        if grep -qE 'WARNING: ThreadSanitizer|runtime error:|ERROR: AddressSanitizer' "$out"; then
            why="${why:+$why; }sanitizer report"
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
            grep -E '^\[  (FAILED  |ERROR   )\]|^ERROR|WARNING: ThreadSanitizer|runtime error:' "$out" |
                head -n 40 | sed 's/^/    /' || true
            if [ -n "$why" ]; then
                echo "    last output:"
                tail -n 8 "$out" | sed 's/^/    | /'
            fi
        fi
    done
}

# run_script NAME CMD...: a script printing "PASS <prefix>/..." and
# "FAIL <prefix>/..." lines, one test each.
run_script() {
    local name=$1 rp rf
    shift
    local rc=0
    "$@" 2>&1 | tee "$log/$name.out" || rc=$?
    rp=$(count "^PASS $name/" "$log/$name.out")
    rf=$(count "^FAIL $name/" "$log/$name.out")
    if [ "$rp" -eq 0 ] && [ "$rf" -eq 0 ]; then
        echo "FAIL $* reported nothing"
        rf=1
    elif [ "$rc" -ne 0 ] && [ "$rf" -eq 0 ]; then
        # It stopped early (the fuzz script once died on a report it did not
        # parse, after one PASS line): what it did not run did not pass.
        echo "FAIL $* exited with status $rc without saying why"
        rf=1
    fi
    passed=$((passed + rp))
    failed=$((failed + rf))
}

# The cmocka suite against the debug build, then against the checked builds
# (docs/RELIABILITY.md): UBSan stops at the first report; TSan reports every
# race (exit status 66). TSan's lock-order detector is off: it cannot track
# the 300-odd allocator locks fork's prepare handler holds (a CHECK in its
# runtime fails past 64), and children of threaded tests start threads.
run_bins out/tests
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 run_bins out/ubsan/tests
TSAN_OPTIONS=halt_on_error=0:exitcode=66:detect_deadlocks=0:die_after_fork=0 run_bins out/tsan/tests
# The suites of the API itself once more in checked mode (HAKMEM_CHECK=1):
# correct use runs clean there too, bad pointers are still reported. (The
# tiers' own suites look inside the tiers, which checked mode bypasses.)
checked_bins=$log/checked
mkdir -p "$checked_bins"
for b in test_badptr test_fork test_config; do
    ln -s "$PWD/out/tests/$b" "$checked_bins/$b"
done
HAKMEM_CHECK=1 run_bins "$checked_bins"

# Project checks, one test each: OS calls only in the OS boundary; boxes
# include no tier or front header; make install + pkg-config produce a
# working shared and static link; the hakmem command runs programs on the
# library; the heap profiler's profiles read by google-pprof; its stack
# walker after a library is unloaded and another loaded in its place; the bench
# report's ratios and chart (bench/chart.py) from synthetic results.
for check in tests/check_os_boundary.sh tests/check_layers.sh tests/check_install.sh \
    tests/check_command.sh tests/check_prof.sh tests/check_unwind.sh tests/check_bench_report.sh; do
    if "$check"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
    fi
done

# Static analysis of core/: zero findings.
if tests/check_analyzer.sh; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
fi

# The heap-bug programs (tests/heapbugs): every case must_catch lists is
# caught by hakmem (and by HAKMEM_CHECK=1). One test.
if HEAPBUGS_GATE=tests/heapbugs/must_catch tests/heapbugs/run.sh; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
fi

# The API fuzzers, a bounded run each (FUZZ_SECONDS, default 60).
run_script fuzz tests/fuzz/run.sh
# Out of memory for real: programs under ulimit -v.
run_script oom tests/oom/run.sh
# Real programs: one test each, as reported by their PASS/FAIL lines.
run_script real tests/real/run.sh
# And those that make no point of speed in checked mode: correct programs run
# clean under every check.
echo "real programs with HAKMEM_CHECK=1:"
HAKMEM_CHECK=1 run_script real tests/real/run.sh python sqlite git sort cxx

echo "tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$crashed" -eq 0 ]
