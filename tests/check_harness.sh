#!/bin/bash
# The test harness itself (tests/run.sh, tests/lib.sh) reports what happened:
# programs it runs side by side that pass, fail, crash, hang (with a child of
# their own), or end without a word are each counted as such, in the order
# started, and a hung one is killed with its children. Prints "PASS
# check_harness" or "FAIL check_harness: ..." and exits 1.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hakmem-harness.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() {
    echo "FAIL check_harness: $*"
    exit 1
}
expect_line() { # OUTPUT REGEX WHAT
    grep -qE "$2" <<<"$1" || fail "$3; output was:"$'\n'"$1"
}

# ---- tests/run.sh --bins: cmocka binaries --------------------------------------
# Stand-ins for cmocka binaries: the lines run.sh reads, and an ending each.
mkdir -p "$tmp/bins"
cat >"$tmp/prog.c" <<'C'
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
    const char *how = strrchr(argv[0], '_') + 1;
    (void)argc;
    printf("[==========] Running 1 test(s).\n[ RUN      ] %s\n", how);
    fflush(stdout);
    if (!strcmp(how, "hang")) {
        if (fork() == 0) { /* a death test's child, hung too */
            FILE *f = fopen(getenv("CHILD_PIDFILE"), "w");
            fprintf(f, "%d\n", (int)getpid());
            fclose(f);
            pause();
        }
        pause();
    }
    if (!strcmp(how, "crash")) abort();
    if (!strcmp(how, "fail")) {
        printf("[  FAILED  ] %s\n[==========] 1 test(s) run.\n[  PASSED  ] 0 test(s).\n"
               "[  FAILED  ] 1 test(s), listed below:\n", how);
        return 1;
    }
    if (!strcmp(how, "mute")) return 3; /* no summary */
    printf("[       OK ] %s\n[==========] 1 test(s) run.\n[  PASSED  ] 1 test(s).\n", how);
    return strcmp(how, "liar") == 0; /* passed, but a failing status */
}
C
cc -O1 "$tmp/prog.c" -o "$tmp/prog" || fail "cannot build the stand-in"
for how in a_pass b_hang c_crash d_fail e_mute f_liar g_pass; do
    cp "$tmp/prog" "$tmp/bins/test_$how"
done
rc=0
# A hang limit of 600 s x 0.005: 3 s without output.
out=$(CHILD_PIDFILE=$tmp/child HAKMEM_TEST_TIME_SCALE=0.005 TEST_JOBS=2 \
    tests/run.sh --bins "$tmp/bins:HAK_HARNESS=1" 2>&1) || rc=$?
[ "$rc" -ne 0 ] || fail "run.sh --bins exited 0 with failing binaries"
expect_line "$out" "^PASS $tmp/bins/test_a_pass \\(1 tests" "a passing binary"
expect_line "$out" "^FAIL $tmp/bins/test_b_hang: .*hung: no output for 3 s.*killed during hang" \
    "a hung binary"
expect_line "$out" "^FAIL $tmp/bins/test_c_crash: .*crashed with signal 6" "a crash"
expect_line "$out" "^FAIL $tmp/bins/test_d_fail: 0 passed, 1 failed" "a failed test"
expect_line "$out" "^FAIL $tmp/bins/test_e_mute: .*without a cmocka summary" "no summary"
expect_line "$out" "^FAIL $tmp/bins/test_f_liar: .*exit status 1 but 0 failure" "a status that lies"
expect_line "$out" "^tests: 3 passed, 5 failed$" "the counts" # (the liar's test passed)
order=$(grep -oE '^(PASS|FAIL) [^ :]*' <<<"$out" | sed 's/.*test_//' | tr '\n' ' ')
[ "$order" = "a_pass b_hang c_crash d_fail e_mute f_liar g_pass " ] ||
    fail "results out of order: $order"
child=$(cat "$tmp/child" 2>/dev/null) || fail "the hung binary's child never started"
# Killed, it is gone once its new parent (init) has reaped it: a zombie
# (state Z) meanwhile.
alive() { [ -r "/proc/$1/stat" ] && [ "$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
t0=$SECONDS
while alive "$child" && [ $((SECONDS - t0)) -lt 5 ]; do sleep 0.1; done
if alive "$child"; then
    kill -KILL "$child"
    fail "the hung binary's child $child was left running"
fi

# ---- tests/lib.sh: jobs reporting their own lines -------------------------------
# shellcheck source=tests/lib.sh
out=$(
    set -e # (a command substitution does not inherit it; the scripts run with it)
    TEST_JOBS=2
    source tests/lib.sh
    JOBS_TMP=$tmp
    JOBS_REPORTER="report_lines x"
    slow() { sleep 1; echo "PASS x/slow"; }
    quick() { echo "PASS x/quick"; }
    stops() { # set -e ends it before its line
        false
        echo "PASS x/stops"
    }
    killed() { kill -KILL "$BASHPID"; }
    says() { echo "FAIL x/says: because"; }
    job_start slow slow
    job_start quick quick
    job_start stops stops
    job_start killed killed
    job_start says says
    job_start mute true
    jobs_flush "$JOBS_REPORTER" all
    echo "counted $lines_passed $lines_failed"
) 2>/dev/null
want='PASS x/slow
PASS x/quick
FAIL x/stops: ended with status 1 without a FAIL line: 
FAIL x/killed: ended with status 137 without a FAIL line: 
FAIL x/says: because
FAIL x/mute: ended with status 0 without a FAIL line: 
counted 2 4'
[ "$out" = "$want" ] || fail "jobs reported"$'\n'"$out"$'\n'"instead of"$'\n'"$want"
echo "PASS check_harness"
