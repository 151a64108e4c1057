/* Lock box: the spin lock (hak_spin) excludes, hands over to a waiter that
 * has gone past spinning (asleep, and not cancelled there), and steps aside
 * inside the fork window as the mutex wrappers do. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "box/lock.h"
#include "proc.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "timing.h"

#define THREADS 4
#define ROUNDS  200000

static hak_spin counted = HAK_SPIN_INIT;
static uint64_t count; /* plain: only the lock keeps increments apart */

static void *bump(void *arg) {
    (void)arg;
    for (int i = 0; i < ROUNDS; i++) {
        hak_spin_lock(&counted);
        uint64_t c = count;
        if ((i & 1023) == 0) sched_yield(); /* a holder that loses its CPU */
        count = c + 1;
        hak_spin_unlock(&counted);
    }
    return NULL;
}

static void test_excludes(void **state) {
    (void)state;
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, bump, NULL), 0);
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    assert_int_equal(count, (uint64_t)THREADS * ROUNDS);
}

static hak_spin slow = HAK_SPIN_INIT;
static _Atomic int waiter_stage; /* 1: about to lock; 2: has it */
static _Atomic pid_t waiter_tid;

static int written;     /* by the holder, under the lock */
static uint64_t cpu_ns; /* the waiter's CPU time in hak_spin_lock */

static uint64_t clock_ns(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Context switches of thread tid so far: voluntary (it blocked: for a
 * waiter, its naps) and involuntary (a yield that gave the CPU away, or a
 * preemption); false once it has ended. */
struct switches {
    long naps, given;
};
static long status_field(const char *buf, const char *name) {
    const char *v = strstr(buf, name);
    return v ? strtol(v + strlen(name), NULL, 10) : -1;
}
static bool switches_of(pid_t tid, struct switches *sw) {
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/self/task/%d/status", (int)tid);
    if (proc_read(path, buf, sizeof buf) <= 0) return false;
    sw->naps = status_field(buf, "\nvoluntary_ctxt_switches:");
    sw->given = status_field(buf, "\nnonvoluntary_ctxt_switches:");
    return sw->naps >= 0 && sw->given >= 0;
}

/* A waiter spins 64 times, yields 4096 times (box/lock.h), then naps. The
 * yields take a few ms on an idle machine, but each one gives the CPU to
 * whatever else is runnable there: on a busy machine they take seconds (17 s
 * with three busy loops on its CPU, 4 ms a yield), using little CPU. A
 * holder waits for the naps to begin, the lock held, as long as the waiter
 * makes progress towards them: it spins or yields for ever if it gives its
 * CPU away more than twice its yields' worth, or uses a second of CPU
 * (scaled: tests/timing.h; its spins and yields take a few ms), without a
 * nap. A waiter that does neither for a hang limit is not running at all. */
#define YIELDS_MAX          (2 * 4096)
#define CPU_LIMIT_BASE_MS   1000
#define STALL_LIMIT_BASE_MS 10000

/* The CPU thread t has used, ns; false once it has ended. */
static bool cpu_of(pthread_t t, uint64_t *ns) {
    clockid_t c;
    struct timespec ts;
    if (pthread_getcpuclockid(t, &c) != 0 || clock_gettime(c, &ts) != 0) return false;
    *ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    return true;
}

/* Waits, the lock held, until thread t (tid) has napped since `before` or
 * ended: NULL. When it makes no progress towards a nap (see above), why
 * not (the caller gives the lock back, then fails). */
static const char *wait_for_naps(pthread_t t, pid_t tid, struct switches before) {
    static char why[400];
    char text[256];
    struct switches sw, last = before;
    uint64_t cpu0, cpu, last_cpu;
    if (!cpu_of(t, &cpu0)) return NULL;
    last_cpu = cpu0;
    int64_t progress = hak_test_now_ms(), stall = hak_test_limit_ms(STALL_LIMIT_BASE_MS);
    uint64_t cpu_limit = (uint64_t)hak_test_limit_ms(CPU_LIMIT_BASE_MS) * 1000000u;
    for (;;) {
        if (!switches_of(tid, &sw) || !cpu_of(t, &cpu)) return NULL;
        if (sw.naps > before.naps) return NULL;
        if (sw.given - before.given > YIELDS_MAX) {
            snprintf(why, sizeof why,
                     "the waiter gave its CPU away %ld times without a nap: it yields for ever",
                     sw.given - before.given);
            return why;
        }
        if (cpu - cpu0 > cpu_limit) {
            snprintf(why, sizeof why,
                     "the waiter used %s of CPU without a nap: it spins or yields for ever",
                     hak_test_limit_text(text, sizeof text, CPU_LIMIT_BASE_MS));
            return why;
        }
        if (sw.given != last.given || cpu != last_cpu) progress = hak_test_now_ms();
        last = sw;
        last_cpu = cpu;
        if (hak_test_now_ms() - progress >= stall) {
            snprintf(why, sizeof why, "the waiter did not run for %s",
                     hak_test_limit_text(text, sizeof text, STALL_LIMIT_BASE_MS));
            return why;
        }
        struct timespec nap = {0, 1000000};
        nanosleep(&nap, NULL);
    }
}

/* CPU per second of a thread napping as the lock's waiters do (50 us raw
 * naps), here and now: what the waiter's naps may cost. */
static void *nap_like_a_waiter(void *arg) {
    double *rate = arg;
    uint64_t c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID), t0 = clock_ns(CLOCK_MONOTONIC), t;
    while ((t = clock_ns(CLOCK_MONOTONIC)) - t0 < 100000000u) {
        struct timespec nap = {0, 50000};
        syscall(SYS_nanosleep, &nap, NULL);
    }
    *rate = (double)(clock_ns(CLOCK_THREAD_CPUTIME_ID) - c0) / (double)(t - t0);
    return NULL;
}

static void *wait_for_it(void *arg) {
    (void)arg;
    atomic_store(&waiter_tid, gettid());
    atomic_store(&waiter_stage, 1);
    uint64_t cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    hak_spin_lock(&slow);
    cpu_ns = clock_ns(CLOCK_THREAD_CPUTIME_ID) - cpu;
    int seen = written;
    atomic_store(&waiter_stage, 2);
    hak_spin_unlock(&slow);
    return (void *)(intptr_t)seen;
}

/* A holder that keeps the lock 200 ms, asleep (a profile dump writing a
 * file): the waiter gets the lock once it is given back, and not before (it
 * sees what was written under it), and meanwhile sleeps: it does not spin or
 * yield the whole time, which would use the 200 ms of CPU.
 *
 * On a slow or busy machine: the holder keeps the lock past the 200 ms
 * until the waiter has napped (wait_for_naps: its yields may take seconds
 * there); and the CPU the waiter may use is half the time held plus what
 * naps cost on this machine, measured (37 ms of 200 here: a slower kernel
 * pays more per nap). A waiter that never sleeps fails either way. */
static void test_waiter_past_spinning_gets_it(void **state) {
    (void)state;
    double nap_rate;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, nap_like_a_waiter, &nap_rate), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    hak_spin_lock(&slow);
    assert_int_equal(pthread_create(&t, NULL, wait_for_it, NULL), 0);
    while (atomic_load(&waiter_stage) < 1) /* (< : a lock that lets it pass fails below) */
        sched_yield();
    pid_t tid = atomic_load(&waiter_tid);
    struct switches before;
    assert_true(switches_of(tid, &before));
    uint64_t start = clock_ns(CLOCK_MONOTONIC);
    while (clock_ns(CLOCK_MONOTONIC) - start < 200000000u) {
        assert_int_equal(atomic_load(&waiter_stage), 1); /* still waiting */
        struct timespec nap = {0, 1000000};
        nanosleep(&nap, NULL);
    }
    const char *why = wait_for_naps(t, tid, before);
    assert_int_equal(atomic_load(&waiter_stage), 1);
    uint64_t held = clock_ns(CLOCK_MONOTONIC) - start;
    written = 42;
    hak_spin_unlock(&slow);
    void *seen;
    assert_int_equal(pthread_join(t, &seen), 0);
    if (why) fail_msg("%s", why);
    assert_int_equal(atomic_load(&waiter_stage), 2);
    assert_int_equal((intptr_t)seen, 42);
    /* Spins and yields take a few ms; the rest is asleep. */
    double allowed = (0.5 + nap_rate) * (double)held;
    if ((double)cpu_ns > allowed)
        fail_msg("the waiter used %llu ms of CPU in %llu ms (naps cost %.0f%% of a CPU here: "
                 "%llu ms allowed)",
                 (unsigned long long)(cpu_ns / 1000000), (unsigned long long)(held / 1000000),
                 nap_rate * 100, (unsigned long long)(allowed / 1e6));
    /* And it was given back: taking it again does not block. */
    hak_spin_lock(&slow);
    hak_spin_unlock(&slow);
}

static hak_spin cancel_lock = HAK_SPIN_INIT;
static _Atomic int cancel_stage; /* 1: cancel pending, about to lock; 2: got it */
static _Atomic pid_t cancel_tid;

static void *wait_cancelled(void *arg) {
    (void)arg;
    int old;
    pthread_setcanceltype(PTHREAD_CANCEL_DEFERRED, &old);
    atomic_store(&cancel_tid, gettid());
    while (atomic_load(&cancel_stage) < 1) /* the cancel is sent meanwhile */
        sched_yield();
    hak_spin_lock(&cancel_lock);
    atomic_store(&cancel_stage, 2);
    hak_spin_unlock(&cancel_lock);
    pthread_testcancel();
    return NULL;
}

/* A thread with a cancel pending that waits for the lock (a free in a
 * thread being cancelled while a dump holds the records) gets it: the wait
 * is no cancellation point (libc's nanosleep is one: the thread ended inside
 * the allocator, with the block neither freed nor forgotten). */
static void test_wait_is_no_cancellation_point(void **state) {
    (void)state;
    hak_spin_lock(&cancel_lock);
    atomic_store(&cancel_tid, 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, wait_cancelled, NULL), 0);
    pid_t tid;
    while ((tid = atomic_load(&cancel_tid)) == 0)
        sched_yield();
    struct switches before; /* (it only yields until stage 1) */
    assert_true(switches_of(tid, &before));
    assert_int_equal(pthread_cancel(t), 0);
    atomic_store(&cancel_stage, 1);
    /* Past spinning and yielding (50 ms here; seconds on a busy machine):
     * until it has napped, or ended there (the bug). */
    const char *why = wait_for_naps(t, tid, before);
    hak_spin_unlock(&cancel_lock);
    void *ret;
    assert_int_equal(pthread_join(t, &ret), 0);
    if (why) fail_msg("%s", why);
    assert_ptr_equal(ret, PTHREAD_CANCELED); /* (at pthread_testcancel) */
    assert_int_equal(atomic_load(&cancel_stage), 2);
}

/* In the fork window the forking thread holds every lock already (taken by
 * the prepare handler); lock sites then neither take nor give back. */
static void test_fork_window_skips_it(void **state) {
    (void)state;
    static hak_spin held = HAK_SPIN_INIT;
    hak_spin_lock(&held);
    hak_in_fork = true;
    hak_spin_lock(&held); /* would never return outside the window */
    hak_spin_unlock(&held);
    hak_in_fork = false;
    assert_true(atomic_load(&held.held)); /* the prepare handler's hold stands */
    hak_spin_unlock(&held);
    assert_false(atomic_load(&held.held));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_excludes),
        cmocka_unit_test(test_waiter_past_spinning_gets_it),
        cmocka_unit_test(test_wait_is_no_cancellation_point),
        cmocka_unit_test(test_fork_window_skips_it),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
