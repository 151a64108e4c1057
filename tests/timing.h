/* How long a test may wait: its hang limits, scaled to the build and to the
 * machine (issue 29: two ThreadSanitizer tests killed as hung after a fixed
 * 10 s on a slower machine; the child was slow, not hung).
 *
 * A limit that is there only to catch a hang (a child killed, an alarm, a
 * wait for something to happen "eventually") is a base, generous for the
 * debug build on this project's 2-core CI machine (at least ten times what
 * the thing it bounds takes there), times the test time scale:
 *
 *  - the build's factor: how many times slower this build runs the same
 *    tests. Measured (issue 29, 2 shared cores), the children of the death
 *    and fork tests and the fault sweeps' workload runs, against the debug
 *    build: ThreadSanitizer 3 to 17 times (8.7 on the slowest child, the
 *    sampled small mappings of test_large: 1.2 s, 10.2 s under TSan), UBSan
 *    0.5 to 2.3 times, ASan with UBSan (the fuzzers) 3 to 10 times on
 *    children of a few milliseconds. Known from the compiler's sanitizer
 *    macros (gcc has none for UBSan: its UBSan builds count as debug ones);
 *  - HAKMEM_TEST_TIME_SCALE, a positive number (default 1), for a slower or
 *    busier machine: 3 makes every limit three times longer (the test
 *    scripts are to stretch their own limits by the same variable). A
 *    value that is not a positive number stops the program at start-up
 *    with a line saying so: no test runs with a limit nobody asked for.
 *
 * Waits that are part of a test's logic (an age to pass, a window that an
 * assertion needs) are not stretched this way: each test says why its
 * timing holds. Messages on a timeout name the limit and how to raise it.
 *
 * Needs _GNU_SOURCE (the Makefile's -D_GNU_SOURCE):
 * program_invocation_short_name. */
#ifndef HAK_TEST_TIMING_H
#define HAK_TEST_TIMING_H

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define HAK_TEST_BUILD_TSAN 1
#endif
#if __has_feature(address_sanitizer)
#define HAK_TEST_BUILD_ASAN 1
#endif
#if __has_feature(undefined_behavior_sanitizer)
#define HAK_TEST_BUILD_UBSAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__) && !defined(HAK_TEST_BUILD_TSAN)
#define HAK_TEST_BUILD_TSAN 1
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(HAK_TEST_BUILD_ASAN)
#define HAK_TEST_BUILD_ASAN 1
#endif

/* How many times slower than the debug build this build runs (see above). */
#if defined(HAK_TEST_BUILD_TSAN)
#define HAK_TEST_BUILD_FACTOR 10.0
#define HAK_TEST_BUILD_NAME   "ThreadSanitizer"
#elif defined(HAK_TEST_BUILD_ASAN)
#define HAK_TEST_BUILD_FACTOR 3.0
#define HAK_TEST_BUILD_NAME   "AddressSanitizer"
#elif defined(HAK_TEST_BUILD_UBSAN)
#define HAK_TEST_BUILD_FACTOR 2.0
#define HAK_TEST_BUILD_NAME   "UBSan"
#else
#define HAK_TEST_BUILD_FACTOR 1.0
#define HAK_TEST_BUILD_NAME   "debug"
#endif

#define HAK_TEST_SCALE_ENV "HAKMEM_TEST_TIME_SCALE"

/* HAKMEM_TEST_TIME_SCALE: 1 when unset, -1 when it is not a positive
 * number (at most a million). */
static inline double hak_test_env_scale(void) {
    const char *s = getenv(HAK_TEST_SCALE_ENV);
    if (s == NULL || *s == '\0') return 1.0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !(v > 0) || v > 1e6) return -1.0;
    return v;
}

/* At start-up, before any test: a bad value stops the program (exit 2). */
__attribute__((constructor)) static void hak_test_check_scale(void) {
    if (hak_test_env_scale() > 0) return;
    fprintf(stderr,
            "%s: %s='%s' is not a positive number (at most 1000000); it multiplies every "
            "hang limit of the tests: e.g. 3 on a slow or busy machine\n",
            program_invocation_short_name, HAK_TEST_SCALE_ENV, getenv(HAK_TEST_SCALE_ENV));
    _exit(2);
}

/* The factor every hang limit is multiplied by: build times machine. */
static inline double hak_test_time_scale(void) {
    double env = hak_test_env_scale();
    return HAK_TEST_BUILD_FACTOR * (env > 0 ? env : 1.0);
}

/* A hang limit: base_ms (for the debug build on the CI machine) scaled. */
static inline int64_t hak_test_limit_ms(int64_t base_ms) {
    double ms = (double)base_ms * hak_test_time_scale();
    if (ms >= (double)INT32_MAX) return INT32_MAX; /* (poll's int; 24 days) */
    int64_t r = (int64_t)ms;
    return r < ms ? r + 1 : r;
}

/* How the limit for base_ms came about, and how to raise it, for a
 * message: "60000 ms (30000 ms x 2 for the UBSan build x
 * HAKMEM_TEST_TIME_SCALE=1; raise HAKMEM_TEST_TIME_SCALE if the machine is
 * only slow or busy)". */
static inline const char *hak_test_limit_text(char *buf, size_t n, int64_t base_ms) {
    double env = hak_test_env_scale();
    snprintf(buf, n,
             "%lld ms (%lld ms x %g for the %s build x %s=%g; raise %s if the machine is "
             "only slow or busy)",
             (long long)hak_test_limit_ms(base_ms), (long long)base_ms, HAK_TEST_BUILD_FACTOR,
             HAK_TEST_BUILD_NAME, HAK_TEST_SCALE_ENV, env > 0 ? env : 1.0, HAK_TEST_SCALE_ENV);
    return buf;
}

/* Milliseconds on the monotonic clock. */
static inline int64_t hak_test_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- alarms ---------------------------------------------------------------------------
 * hak_test_alarm(base_ms, what): if this process is still inside `what`
 * after the scaled limit, it says so on stderr (the limit, how to raise it)
 * and dies of SIGALRM, as a plain alarm() would have killed it. Cancelled
 * with alarm(0). One alarm at a time per process. */

static char hak_test_alarm_msg[512];
static size_t hak_test_alarm_len;

static inline void hak_test_on_alarm(int sig) {
    (void)!write(2, hak_test_alarm_msg, hak_test_alarm_len);
    signal(sig, SIG_DFL);
    raise(sig);
}

static inline void hak_test_alarm(int64_t base_ms, const char *what) {
    char limit[256];
    int n = snprintf(hak_test_alarm_msg, sizeof hak_test_alarm_msg,
                     "%s: %s still running after %s: hung?\n", program_invocation_short_name, what,
                     hak_test_limit_text(limit, sizeof limit, base_ms));
    hak_test_alarm_len = n < 0                                   ? 0
                         : (size_t)n < sizeof hak_test_alarm_msg ? (size_t)n
                                                                 : sizeof hak_test_alarm_msg - 1;
    signal(SIGALRM, hak_test_on_alarm);
    int64_t ms = hak_test_limit_ms(base_ms);
    struct itimerval it = {{0, 0}, {(time_t)(ms / 1000), (suseconds_t)(ms % 1000 * 1000)}};
    setitimer(ITIMER_REAL, &it, NULL); /* (alarm's timer: alarm(0) cancels it) */
}

/* A cmocka teardown for the tests that arm an alarm: a failed assertion
 * leaves the test at once (a longjmp), past its alarm(0), and the alarm
 * would fire in a later test, as a hang of that one. */
static inline int hak_test_alarm_off(void **state) {
    (void)state;
    alarm(0);
    return 0;
}

#endif
