/* Lock box: the spin lock (hak_spin) excludes, hands over to a waiter that
 * has gone past spinning (asleep, and not cancelled there), and steps aside
 * inside the fork window as the mutex wrappers do. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "box/lock.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

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

static int written;     /* by the holder, under the lock */
static uint64_t cpu_ns; /* the waiter's CPU time in hak_spin_lock */

static uint64_t clock_ns(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *wait_for_it(void *arg) {
    (void)arg;
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
 * yield the whole time, which would use the 200 ms of CPU. */
static void test_waiter_past_spinning_gets_it(void **state) {
    (void)state;
    hak_spin_lock(&slow);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, wait_for_it, NULL), 0);
    while (atomic_load(&waiter_stage) < 1) /* (< : a lock that lets it pass fails below) */
        sched_yield();
    uint64_t start = clock_ns(CLOCK_MONOTONIC);
    while (clock_ns(CLOCK_MONOTONIC) - start < 200000000u) {
        assert_int_equal(atomic_load(&waiter_stage), 1); /* still waiting */
        struct timespec nap = {0, 1000000};
        nanosleep(&nap, NULL);
    }
    written = 42;
    hak_spin_unlock(&slow);
    void *seen;
    assert_int_equal(pthread_join(t, &seen), 0);
    assert_int_equal(atomic_load(&waiter_stage), 2);
    assert_int_equal((intptr_t)seen, 42);
    /* Spins and yields take a few ms; the rest is asleep. */
    if (cpu_ns > 100000000u)
        fail_msg("the waiter used %llu ms of CPU", (unsigned long long)(cpu_ns / 1000000));
    /* And it was given back: taking it again does not block. */
    hak_spin_lock(&slow);
    hak_spin_unlock(&slow);
}

static hak_spin cancel_lock = HAK_SPIN_INIT;
static _Atomic int cancel_stage; /* 1: cancel pending, about to lock; 2: got it */

static void *wait_cancelled(void *arg) {
    (void)arg;
    int old;
    pthread_setcanceltype(PTHREAD_CANCEL_DEFERRED, &old);
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
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, wait_cancelled, NULL), 0);
    assert_int_equal(pthread_cancel(t), 0);
    atomic_store(&cancel_stage, 1);
    struct timespec nap = {0, 50000000}; /* past spinning and yielding */
    nanosleep(&nap, NULL);
    hak_spin_unlock(&cancel_lock);
    void *ret;
    assert_int_equal(pthread_join(t, &ret), 0);
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
