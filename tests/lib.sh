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
