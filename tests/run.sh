#!/bin/bash
# Runs the whole suite from the repo root: every cmocka binary out/tests/test_*
# and the same tests built with UBSan (out/ubsan/tests) and TSan
# (out/tsan/tests) (each of their tests counts), the project checks (OS
# boundary, install, static analysis), the heap-bug gate, the fuzzers, the out-of-memory
# programs and the real-program tests (one each). Last line: "tests: N passed, M failed". Exits non-zero if
# anything failed or any binary crashed. `tests/run.sh --bins DIR[:VAR=VAL,...]
# ...` runs those cmocka binaries only (tests/check_harness.sh uses it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CMOCKA_MESSAGE_OUTPUT=stdout

passed=0
failed=0
crashed=0
log=$(mktemp -d "${TMPDIR:-/tmp}/hakmem-tests.XXXXXX")
trap 'rm -rf "$log"' EXIT

count() { grep -cE "$1" "$2" || true; }

# Where the time goes: each step's wall time, printed at the end.
step_t0=$SECONDS
steps=()
step_done() {
    steps+=("$(printf '%6ds  %s' $((SECONDS - step_t0)) "$1")")
    step_t0=$SECONDS
}

# Hang limits, each a generous base times HAKMEM_TEST_TIME_SCALE, and
# TEST_JOBS, the programs run side by side (default: one per core).
# shellcheck source=tests/lib.sh
source tests/lib.sh
# A cmocka binary prints a line as each test starts and ends: one silent for
# this long is hung (the slowest single test, ThreadSanitizer's fork-heavy
# ones, takes well under a minute on a quiet 2-core machine). A limit on
# progress, not on the binary's total time, which grows with the suite.
STALL=$(scaled_limit 600)

# And one still printing after this long loops (a diagnostic over and over).
TOTAL=$(scaled_limit 3600)
JOBS_TMP=$log
JOBS_REPORTER=report_bin

# watch_bin B [VAR=VAL...]: a job (job_start) running cmocka binary B in its
# environment plus VAR=VAL, its output the job's; killed with every process
# it started (its own process group) once that output has not grown for STALL
# seconds or it has run TOTAL: status 124. Else B's status.
watch_bin() {
    local b=$1 t0=$SECONDS size last=-1 quiet_from=$SECONDS nap=0.05 rc=0 hung=0
    shift
    setsid env "$@" "$b" </dev/null &
    local pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        sleep "$nap"
        [ "$nap" = 0.5 ] || nap=$([ "$nap" = 0.05 ] && echo 0.2 || echo 0.5)
        size=$(stat -c %s "$JOB_OUT" 2>/dev/null) || size=0
        if [ "$size" != "$last" ]; then
            last=$size
            quiet_from=$SECONDS
        fi
        if [ "$hung" -eq 0 ] && { [ $((SECONDS - quiet_from)) -ge "$STALL" ] ||
            [ $((SECONDS - t0)) -ge "$TOTAL" ]; }; then
            hung=1
            kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    wait "$pid" 2>/dev/null || rc=$?
    [ "$hung" -eq 0 ] || rc=124
    return "$rc"
}

# report_bin B OUT STATUS SECONDS: a REPORTER (jobs_flush) for watch_bin:
# counts and prints B's result, and adds SECONDS to its directory's time.
declare -A dir_secs=()
report_bin() {
    local b=$1 out=$2 rc=$3 secs=$4 p f summary why d
    d=$(dirname "$b")
    dir_secs[$d]=$((${dir_secs[$d]:-0} + secs))
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
    if [ "$rc" -eq 124 ]; then
        why="hung: no output for $STALL s or running for $TOTAL s, killed during $(grep -E \
            '^\[ RUN      \]' "$out" | tail -n 1 | sed 's/^\[ RUN      \] //')"
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
        echo "PASS $b ($p tests, $secs s)"
    else
        echo "FAIL $b: $p passed, $f failed${why:+ ($why)}, $secs s"
        # The failing tests and their messages, and for a crash the tail.
        grep -E '^\[  (FAILED  |ERROR   )\]|^ERROR|WARNING: ThreadSanitizer|runtime error:' "$out" |
            head -n 40 | sed 's/^/    /' || true
        if [ -n "$why" ]; then
            echo "    last output:"
            tail -n 8 "$out" | sed 's/^/    | /'
        fi
    fi
}

# run_bins DIR:VAR=VAL,... ...: every cmocka binary DIR/test_* of each DIR,
# in the environment after its colon, TEST_JOBS at a time; the results in a
# fixed order, each printed as soon as it and those before it are done; at
# the end each DIR's binaries' times added up (where the time goes).
run_bins() {
    local spec dir b found
    shopt -s nullglob
    for spec in "$@"; do
        dir=${spec%%:*}
        found=0
        for b in "$dir"/test_*; do
            if [ ! -f "$b" ] || [ ! -x "$b" ]; then continue; fi
            local envs=${spec#*:}
            # shellcheck disable=SC2086 # VAR=VAL words
            job_start "$b" watch_bin "$b" ${envs//,/ }
            found=1
        done
        if [ "$found" -eq 0 ]; then
            echo "FAIL no test binaries in $dir (run make tests)"
            failed=$((failed + 1))
        fi
    done
    jobs_flush report_bin all
    for spec in "$@"; do
        dir=${spec%%:*}
        echo "    ${dir_secs[$dir]:-0} s in the binaries of ${dir#"$log"/}"
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

# `tests/run.sh --bins DIR:VAR=VAL,... ...`: those cmocka binaries only.
if [ "${1:-}" = --bins ]; then
    shift
    run_bins "$@"
    echo "tests: $passed passed, $failed failed"
    [ "$failed" -eq 0 ] && [ "$crashed" -eq 0 ]
    exit
fi

# The cmocka suite against the debug build, then against the checked builds
# (docs/RELIABILITY.md): UBSan stops at the first report; TSan reports every
# race (exit status 66). TSan's lock-order detector is off: it cannot track
# the 300-odd allocator locks fork's prepare handler holds (a CHECK in its
# runtime fails past 64), and children of threaded tests start threads.
# The suites of the API itself once more in checked mode (HAKMEM_CHECK=1):
# correct use runs clean there too, bad pointers are still reported. (The
# tiers' own suites look inside the tiers, which checked mode bypasses.)
checked_bins=$log/checked
mkdir -p "$checked_bins"
for b in test_badptr test_fork test_config; do
    ln -s "$PWD/out/tests/$b" "$checked_bins/$b"
done
run_bins out/tests: \
    out/ubsan/tests:UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    out/tsan/tests:TSAN_OPTIONS=halt_on_error=0:exitcode=66:detect_deadlocks=0:die_after_fork=0 \
    "$checked_bins:HAKMEM_CHECK=1"
step_done "cmocka suites (debug, ubsan, tsan, checked mode; $TEST_JOBS at a time)"

# Project checks, one test each: OS calls only in the OS boundary; calls go
# one way through the layers (and the check catches one that does not); make
# install + pkg-config produce a working shared and static link; the hakmem
# command runs programs on the library; the heap profiler's profiles read by
# google-pprof; its stack walker after a library is unloaded and another
# loaded in its place; the bench report's ratios and chart (bench/chart.py)
# from synthetic results; the harness itself (a hung, crashed or silent
# program is counted so); the many-core costs (atomics, locks, shared cache
# lines per op, counted by the count build) within tests/scale/budgets; the
# exported memory operations' results, linked dynamically, statically and
# in checked mode; glibc's __libc_* names mixed with the standard ones
# under LD_PRELOAD; the Debian packages built, lintian-clean, installed,
# used and removed without a trace.
for check in tests/check_os_boundary.sh tests/check_layers.sh tests/check_install.sh \
    tests/check_command.sh tests/check_prof.sh tests/check_unwind.sh tests/check_bench_report.sh \
    tests/check_harness.sh tests/scale/scale.py tests/check_memops.sh tests/check_libc_names.sh \
    tests/check_deb.sh; do
    if "$check"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
    fi
    step_done "$check"
done

# Static analysis of core/: zero findings.
if tests/check_analyzer.sh; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
fi
step_done "static analysis"

# The heap-bug programs (tests/heapbugs): every case must_catch lists is
# caught by hakmem (and by HAKMEM_CHECK=1). One test.
if HEAPBUGS_GATE=tests/heapbugs/must_catch tests/heapbugs/run.sh; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
fi
step_done "heap-bug programs"

# The API fuzzers, a bounded run each (FUZZ_SECONDS, default 60).
run_script fuzz tests/fuzz/run.sh
step_done "fuzzers"
# Out of memory for real: programs under ulimit -v.
run_script oom tests/oom/run.sh
step_done "out of memory"
# Real programs: one test each, as reported by their PASS/FAIL lines. Those
# that make no point of speed in checked mode once more there (name:check):
# correct programs run clean under every check. The longest first.
run_script real tests/real/run.sh redis python:check sort:check python sort git sqlite cxx \
    git:check sqlite:check cxx:check
step_done "real programs (and in checked mode)"

echo "time by step:"
printf '%s\n' "${steps[@]}"
echo "$(printf '%6ds' "$SECONDS")  in all"

echo "tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$crashed" -eq 0 ]
