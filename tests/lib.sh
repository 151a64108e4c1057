# shellcheck shell=bash
# Sourced by the test scripts: their hang limits and how many jobs they run
# at once.
#
# A limit only catches a hang: it is a generous base, at least ten times
# what the step takes on a quiet 2-core machine in the build it runs (the
# sanitizer builds and checked mode included), multiplied by
# HAKMEM_TEST_TIME_SCALE (default 1) on a machine slower or busier still. The
# C tests read the same variable (tests/timing.h).
HAKMEM_TEST_TIME_SCALE=${HAKMEM_TEST_TIME_SCALE:-1}
if ! [[ $HAKMEM_TEST_TIME_SCALE =~ ^([0-9]+([.][0-9]*)?|[.][0-9]+)$ ]] ||
    ! awk -v s="$HAKMEM_TEST_TIME_SCALE" 'BEGIN { exit !(s > 0) }'; then
    echo "FAIL: HAKMEM_TEST_TIME_SCALE must be a positive number (got '$HAKMEM_TEST_TIME_SCALE')"
    exit 2
fi
export HAKMEM_TEST_TIME_SCALE

# scaled_limit SECONDS: SECONDS times the scale, in whole seconds (at least 1).
scaled_limit() {
    awk -v s="$1" -v k="$HAKMEM_TEST_TIME_SCALE" 'BEGIN { v = int(s * k + 0.5); print v < 1 ? 1 : v }'
}

# Jobs at once where a script runs independent programs side by side (the
# cmocka binaries, fuzz targets, real programs: mostly a thread each).
TEST_JOBS=${TEST_JOBS:-$(nproc)}
if ! [[ $TEST_JOBS =~ ^[1-9][0-9]*$ ]]; then
    echo "FAIL: TEST_JOBS must be a positive whole number (got '$TEST_JOBS')"
    exit 2
fi
export TEST_JOBS

# wait_for_slot: returns once fewer than TEST_JOBS background jobs run.
wait_for_slot() {
    while [ "$(jobs -rp | wc -l)" -ge "$TEST_JOBS" ]; do wait -n || true; done
}

# ---- jobs side by side, reported in order -----------------------------------
# job_start NAME CMD...: runs CMD (a program or a function) in a subshell in
# the background once fewer than TEST_JOBS jobs run, its stdout and stderr
# to a file of its own under JOBS_TMP (the caller's temporary directory;
# JOB_OUT names it in the job). set
# -e holds in it: an unexpected failure ends the job, and its report says so.
# jobs_flush REPORTER [all]: for each job not yet reported, in the order
# started, as long as it has ended (with `all`: waiting for it), runs
# `REPORTER NAME OUT STATUS SECONDS` (REPORTER may carry words of its own).
# job_start flushes what has ended each time, so results come as they can.
job_names=() job_pids=() job_outs=() job_t0=()
job_next=0
job_start() {
    local name=$1 out
    shift
    wait_for_slot
    out=$JOBS_TMP/job.${#job_outs[@]}
    job_names+=("$name")
    job_outs+=("$out")
    job_t0+=("$SECONDS")
    (
        # shellcheck disable=SC2034 # (for a CMD that watches its own output)
        JOB_OUT=$out
        trap 'echo "$SECONDS" >"$out.end"' EXIT
        "$@"
    ) >"$out" 2>&1 &
    job_pids+=($!)
    [ -z "${JOBS_REPORTER:-}" ] || jobs_flush "$JOBS_REPORTER"
}
jobs_flush() {
    local reporter=$1 all=${2:-} st end
    while [ "$job_next" -lt "${#job_pids[@]}" ]; do
        if [ -z "$all" ] && kill -0 "${job_pids[$job_next]}" 2>/dev/null; then return 0; fi
        st=0
        wait "${job_pids[$job_next]}" || st=$?
        end=$SECONDS
        [ ! -s "${job_outs[$job_next]}.end" ] || end=$(cat "${job_outs[$job_next]}.end")
        # shellcheck disable=SC2086 # REPORTER's own words
        $reporter "${job_names[$job_next]}" "${job_outs[$job_next]}" "$st" \
            $((end - ${job_t0[$job_next]}))
        job_next=$((job_next + 1))
    done
}

# report_lines PREFIX NAME OUT STATUS SECONDS: a REPORTER for jobs that print
# their own "PASS PREFIX/..." and "FAIL PREFIX/..." lines (one test each):
# prints the job's output and adds its lines to lines_passed and
# lines_failed. A job that printed none, or ended with a non-zero status and
# no FAIL line (set -e, a signal), fails with a line of its own.
lines_passed=0 lines_failed=0
report_lines() {
    local prefix=$1 name=$2 out=$3 st=$4 p f
    cat "$out"
    p=$(grep -c "^PASS $prefix/" "$out" || true)
    f=$(grep -c "^FAIL $prefix/" "$out" || true)
    if [ $((p + f)) -eq 0 ] || { [ "$st" -ne 0 ] && [ "$f" -eq 0 ]; }; then
        echo "FAIL $prefix/$name: ended with status $st without a FAIL line: $(tail -n 1 "$out")"
        f=$((f + 1))
    fi
    lines_passed=$((lines_passed + p))
    lines_failed=$((lines_failed + f))
}
